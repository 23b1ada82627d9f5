"""The static allocator on its own: random interval sets against
the lower bound, overwrite specs, alignment and errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megbrain.graph.mem_plan import SOLVERS, StaticAllocator, align_up, interval_lower_bound


def _check_valid(alloc: StaticAllocator, chunks):
    """No two chunks live at one step share a byte; all inside the arena."""
    roots = list(chunks)
    tot = alloc.tot_alloc()
    for _, _, s, k in roots:
        off = alloc.offset(k)
        assert off % alloc.align == 0
        assert 0 <= off and off + align_up(s, alloc.align) <= tot
    for i, (b1, e1, s1, k1) in enumerate(roots):
        o1 = alloc.offset(k1)
        for b2, e2, s2, k2 in roots[i + 1 :]:
            if b1 < e2 and b2 < e1 and s1 and s2:
                o2 = alloc.offset(k2)
                a1, a2 = align_up(s1, alloc.align), align_up(s2, alloc.align)
                assert o1 + a1 <= o2 or o2 + a2 <= o1, (k1, k2)


def _random_chunks(rng, n, steps, long_frac):
    out = []
    for k in range(n):
        b = int(rng.integers(0, steps))
        if rng.random() < long_frac:
            length = int(rng.integers(1, steps // 2 + 2))
        else:
            length = int(rng.geometric(0.3))
        size = int(2 ** rng.uniform(4, 18))
        out.append((b, min(b + length, steps + 1), size, k))
    return out


def _solve(chunks, align=64, solver="best"):
    alloc = StaticAllocator(align, solver)
    for b, e, s, k in chunks:
        alloc.add(b, e, s, k)
    alloc.solve()
    return alloc


# ---- placement ---------------------------------------------------------------------------
def test_disjoint_lifetimes_share_memory():
    alloc = _solve([(0, 2, 100, "a"), (2, 4, 100, "b"), (4, 5, 64, "c")])
    assert alloc.offset("a") == alloc.offset("b") == alloc.offset("c") == 0
    assert alloc.tot_alloc() == alloc.tot_alloc_lower_bound() == 128


def test_overlapping_lifetimes_get_disjoint_memory():
    chunks = [(0, 3, 100, "a"), (1, 4, 200, "b"), (2, 5, 64, "c")]
    alloc = _solve(chunks)
    _check_valid(alloc, chunks)
    assert alloc.tot_alloc() == alloc.tot_alloc_lower_bound() == 128 + 256 + 64


def test_half_open_lifetimes_touching_ends_do_not_overlap():
    alloc = _solve([(0, 1, 64, "a"), (1, 2, 64, "b")])
    assert alloc.tot_alloc() == 64


def test_lower_bound_is_peak_live_bytes():
    # live bytes per step: 0: 64, 1: 64+128, 2: 128+256, 3: 256
    chunks = [(0, 2, 64, "a"), (1, 3, 128, "b"), (2, 4, 256, "c")]
    assert _solve(chunks).tot_alloc_lower_bound() == 384
    assert interval_lower_bound([0, 1, 2], [2, 3, 4], [64, 128, 256]) == 384


def test_empty_allocator():
    alloc = StaticAllocator()
    alloc.solve()
    assert alloc.tot_alloc() == alloc.tot_alloc_lower_bound() == 0


def test_zero_size_chunks():
    alloc = _solve([(0, 3, 0, "z"), (0, 3, 10, "a")])
    assert alloc.tot_alloc() == 64
    assert alloc.offset("z") >= 0


def test_tot_alloc_solves_lazily_and_add_invalidates():
    alloc = StaticAllocator(64)
    alloc.add(0, 2, 64, "a")
    assert alloc.tot_alloc() == 64
    alloc.add(1, 3, 64, "b")
    assert alloc.tot_alloc() == 128
    assert alloc.offset("a") != alloc.offset("b")


# ---- alignment ---------------------------------------------------------------------------
@pytest.mark.parametrize("align", [1, 16, 64, 256, 4096])
def test_offsets_and_sizes_aligned(align):
    rng = np.random.default_rng(align)
    chunks = _random_chunks(rng, 60, 40, 0.2)
    alloc = _solve(chunks, align)
    _check_valid(alloc, chunks)
    assert alloc.tot_alloc() % align == 0


def test_sizes_rounded_up_to_alignment():
    alloc = _solve([(0, 2, 1, "a"), (0, 2, 65, "b")], align=64)
    assert alloc.tot_alloc() == 64 + 128
    assert alloc.tot_alloc_lower_bound() == 192


# ---- random interval sets against the lower bound ---------------------------------------
@pytest.mark.parametrize("solver", sorted(SOLVERS))
@pytest.mark.parametrize("long_frac", [0.0, 0.3])
def test_random_sets_valid_for_every_solver(solver, long_frac):
    rng = np.random.default_rng(7)
    for _ in range(5):
        chunks = _random_chunks(rng, 80, 60, long_frac)
        alloc = _solve(chunks, 64, solver)
        _check_valid(alloc, chunks)
        assert alloc.tot_alloc() >= alloc.tot_alloc_lower_bound()


def test_random_sets_near_lower_bound():
    rng = np.random.default_rng(2024)
    ratios = []
    for trial in range(40):
        chunks = _random_chunks(rng, 150, 150, 0.1 if trial % 2 else 0.0)
        alloc = _solve(chunks)
        ratios.append(alloc.tot_alloc() / alloc.tot_alloc_lower_bound())
    assert np.mean(ratios) <= 1.03
    assert max(ratios) <= 1.15


def test_best_is_no_worse_than_any_solver():
    rng = np.random.default_rng(5)
    for _ in range(10):
        chunks = _random_chunks(rng, 100, 50, 0.3)
        best = _solve(chunks).tot_alloc()
        for name in SOLVERS:
            assert best <= _solve(chunks, solver=name).tot_alloc()


def test_training_step_shape_reaches_lower_bound():
    # a forward/backward pattern: activations live from their step to their mirrored
    # backward step, gradients briefly; the bound is reachable
    n = 12
    chunks = []
    for i in range(n):
        chunks.append((i, 2 * n - i, 4096 * (1 + i % 3), f"act{i}"))
        chunks.append((2 * n - i - 1, 2 * n - i + 1, 8192, f"grad{i}"))
    alloc = _solve(chunks)
    _check_valid(alloc, chunks)
    assert alloc.tot_alloc() == alloc.tot_alloc_lower_bound()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 20), st.integers(1, 8), st.integers(0, 5000)),
        min_size=0,
        max_size=40,
    ),
    st.sampled_from(sorted(SOLVERS)),
)
def test_any_interval_set_gives_valid_plan(spec, solver):
    chunks = [(b, b + length, size, k) for k, (b, length, size) in enumerate(spec)]
    alloc = _solve(chunks, 32, solver)
    _check_valid(alloc, chunks)
    assert alloc.tot_alloc_lower_bound() <= alloc.tot_alloc()
    assert alloc.tot_alloc() <= sum(align_up(c[2], 32) for c in chunks)


# ---- overwrite specs ---------------------------------------------------------------------
def test_overwrite_places_dst_inside_src():
    alloc = StaticAllocator(64)
    alloc.add(0, 3, 256, "src")
    alloc.add(2, 5, 128, "dst")  # written by src's last reader (step 2)
    alloc.add(1, 4, 64, "other")
    alloc.add_overwrite_spec("src", "dst", 128)
    alloc.solve()
    assert alloc.offset("dst") == alloc.offset("src") + 128
    # src's memory stays reserved until dst dies
    assert not (
        alloc.offset("other") < alloc.offset("src") + 256
        and alloc.offset("src") < alloc.offset("other") + 64
    )
    assert alloc.tot_alloc_lower_bound() == 256 + 64
    assert alloc.tot_alloc() == 320


def test_overwrite_chain_offsets_accumulate():
    alloc = StaticAllocator(1)
    alloc.add(0, 2, 100, "a")
    alloc.add(1, 3, 60, "b")
    alloc.add(2, 4, 20, "c")
    alloc.add(0, 1, 500, "early")
    alloc.add_overwrite_spec("a", "b", 30)
    alloc.add_overwrite_spec("b", "c", 10)
    alloc.solve()
    assert alloc.offset("b") == alloc.offset("a") + 30
    assert alloc.offset("c") == alloc.offset("a") + 40
    assert alloc.tot_alloc() == 600 and alloc.tot_alloc_lower_bound() == 600


def test_overwrite_frees_memory_compared_to_separate_chunks():
    def plan(overwrite):
        alloc = StaticAllocator(64)
        alloc.add(0, 2, 1024, "x")
        alloc.add(1, 3, 1024, "y")
        if overwrite:
            alloc.add_overwrite_spec("x", "y", 0)
        return alloc.tot_alloc()

    assert plan(True) == 1024 and plan(False) == 2048


@pytest.mark.parametrize(
    "src, dst, offset, match",
    [
        ((0, 2, 128), (1, 3, 128), 64, "does not fit"),
        ((0, 2, 128), (1, 3, 64), -64, "does not fit"),
        ((0, 4, 128), (1, 5, 64), 0, "starts before"),
    ],
)
def test_bad_overwrite_specs(src, dst, offset, match):
    alloc = StaticAllocator(64)
    alloc.add(*src, "s")
    alloc.add(*dst, "d")
    with pytest.raises(ValueError, match=match):
        alloc.add_overwrite_spec("s", "d", offset)


def test_overwrite_twice_or_cycle_rejected():
    alloc = StaticAllocator(64)
    alloc.add(0, 2, 64, "a")
    alloc.add(1, 3, 64, "b")
    alloc.add(1, 3, 64, "c")
    alloc.add_overwrite_spec("a", "b", 0)
    with pytest.raises(ValueError, match="already"):
        alloc.add_overwrite_spec("c", "b", 0)
    alloc2 = StaticAllocator(64)
    alloc2.add(1, 2, 64, "a")
    alloc2.add(1, 2, 64, "b")
    alloc2.add_overwrite_spec("a", "b", 0)
    with pytest.raises(ValueError, match="cycle"):
        alloc2.add_overwrite_spec("b", "a", 0)


# ---- errors ------------------------------------------------------------------------------
def test_bad_chunks_rejected():
    alloc = StaticAllocator()
    with pytest.raises(ValueError, match="empty lifetime"):
        alloc.add(3, 3, 10, "a")
    with pytest.raises(ValueError, match="negative size"):
        alloc.add(0, 1, -1, "a")
    alloc.add(0, 1, 1, "a")
    with pytest.raises(ValueError, match="twice"):
        alloc.add(0, 1, 1, "a")
    with pytest.raises(ValueError, match="unknown solver"):
        StaticAllocator(64, "nope")
    with pytest.raises(ValueError, match="alignment"):
        StaticAllocator(0)
