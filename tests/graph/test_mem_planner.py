"""The scalable parts of memory planning: the sweep allocator and the overlap count against
brute-force references, the portfolio's switch to the sweep on large plans, the forwarding
groups' in-place bookkeeping, and the in-place writers' ordering of the comp seq."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import megbrain as mgb
from megbrain.errors import GraphError
from megbrain.graph import mem_plan
from megbrain.graph.mem_plan import (
    StaticAllocator,
    interval_lower_bound,
    overlap_pairs,
    sweep_best_fit,
)

CN = "cpu0"

intervals = st.lists(
    st.tuples(st.integers(0, 30), st.integers(1, 10), st.integers(0, 4096)),
    min_size=0,
    max_size=60,
)


def _unpack(spec):
    b = [x[0] for x in spec]
    e = [x[0] + x[1] for x in spec]
    s = [x[2] for x in spec]
    return b, e, s


def _assert_no_collision(b, e, s, offs):
    """Brute force: no two chunks alive at one step share a byte."""
    for i in range(len(s)):
        assert offs[i] >= 0
        for j in range(i):
            if b[i] < e[j] and b[j] < e[i] and s[i] and s[j]:
                assert offs[i] + s[i] <= offs[j] or offs[j] + s[j] <= offs[i], (i, j)


@settings(max_examples=150, deadline=None)
@given(intervals)
def test_sweep_never_overlaps_live_chunks(spec):
    b, e, s = _unpack(spec)
    offs = sweep_best_fit(b, e, s)
    _assert_no_collision(b, e, s, offs)
    tot = max((o + z for o, z in zip(offs, s)), default=0)
    assert interval_lower_bound(b, e, s) <= tot <= sum(s)


@settings(max_examples=150, deadline=None)
@given(intervals)
def test_overlap_pairs_counts_intersecting_lifetimes(spec):
    b, e, _ = _unpack(spec)
    brute = sum(1 for i in range(len(b)) for j in range(i) if b[i] < e[j] and b[j] < e[i])
    assert overlap_pairs(b, e) == brute
    assert sum(len(c) for c in mem_plan.overlaps(b, e)) == 2 * brute


@settings(max_examples=60, deadline=None)
@given(intervals)
def test_best_on_a_large_plan_runs_the_sweep(spec):
    """Above PORTFOLIO_PAIRS the default solver is the sweep alone: still a valid plan."""
    b, e, s = _unpack(spec)
    saved = mem_plan.PORTFOLIO_PAIRS
    mem_plan.PORTFOLIO_PAIRS = -1
    try:
        offs = mem_plan.SOLVERS["best"](b, e, s)
    finally:
        mem_plan.PORTFOLIO_PAIRS = saved
    assert offs == sweep_best_fit(b, e, s)
    _assert_no_collision(b, e, s, offs)


def _training_chunks(n):
    """Forward activations live until their mirrored backward step, each gradient briefly;
    sizes vary by layer."""
    chunks = []
    for i in range(n):
        chunks.append((i, 2 * n - i, 4096 * (1 + i % 3), f"act{i}"))
        chunks.append((2 * n - i - 1, 2 * n - i + 1, 8192, f"grad{i}"))
    return chunks


@pytest.mark.parametrize("n", [12, 3000])
def test_training_shape_at_lower_bound_small_and_large(n):
    """The portfolio (small) and the sweep (large: millions of overlapping pairs) both reach
    the bound on a training step's nested lifetimes."""
    alloc = StaticAllocator(64)
    chunks = _training_chunks(n)
    for c in chunks:
        alloc.add(*c)
    b = [c[0] for c in chunks]
    e = [c[1] for c in chunks]
    assert (overlap_pairs(b, e) > mem_plan.PORTFOLIO_PAIRS) == (n > 12)
    assert alloc.tot_alloc() == alloc.tot_alloc_lower_bound()


def _residual_step(blocks, width=16, batch=4):
    g = mgb.comp_graph()
    g.set_option("log_level", 0)
    x = mgb.make_arg(CN, g, name="x", shape=(batch, width))
    params, h = [], x
    for _ in range(blocks):
        w = mgb.make_shared(CN, value=np.zeros((width, width), np.float32), comp_graph=g)
        b = mgb.make_shared(CN, value=np.zeros((1, width), np.float32), comp_graph=g)
        params += [w, b]
        h = h + mgb.opr.elem.relu(mgb.opr.matrix_mul(h, w) + b)
    loss = (h * h).mean()
    grads = mgb.grad(loss, params)
    ups = [mgb.opr.add_update(p, gr, beta=-1e-3) for p, gr in zip(params, grads)]
    f = g.compile(None, [mgb.copy_output(loss)] + ups)
    return f, {"x": np.ones((batch, width), np.float32)}


def test_big_training_graph_plan_at_lower_bound(monkeypatch):
    """A residual MLP large enough for the sweep alone: its arena is the lower bound, as
    the portfolio's was, and it runs."""
    calls = []
    sweep = mem_plan.sweep_best_fit
    monkeypatch.setattr(mem_plan, "sweep_best_fit", lambda *a: calls.append(1) or sweep(*a))
    f, feed = _residual_step(250)
    core = f._func
    (arena,) = f.update_static_alloc_plan_and_get_size().values()
    (bound,) = core.static_alloc_lower_bound().values()
    assert calls, "the plan was small enough for the portfolio"
    assert arena == bound
    f(**feed)


# ---- forwarding groups: in-place allowed and refused --------------------------------------
def _inplace_case(view_read_late: bool):
    g = mgb.comp_graph()
    g.set_option("graph_opt_level", 0)
    x = mgb.make_arg(CN, g, name="x", shape=(4, 6))
    a = mgb.opr.elem.exp(x)
    v = a.reshape((24,))  # a forwarded view: joins a's group
    if view_read_late:
        c = mgb.opr.elem.sin(a)  # would overwrite a while v is still to be read
        out = c.reshape((24,)) + v
    else:
        early = v + 1.0  # the view's only reader runs first
        c = mgb.opr.elem.sin(a) * early.reshape((4, 6))
        out = c
    f = g.compile(None, [mgb.copy_output(out)])
    xv = np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6)
    (got,) = f(x=xv)
    plan = f._func._plan
    sin_out = next(o for o in f._func.seq if "SIN" in o.name).outputs[0]
    return plan.decisions[sin_out][0], got, xv


def test_inplace_refused_while_a_view_of_the_input_is_read_later():
    kind, got, xv = _inplace_case(True)
    assert kind == "alloc"
    ea = np.exp(xv)
    np.testing.assert_allclose(got, (np.sin(ea) + ea).reshape(24), rtol=1e-6)


def test_inplace_allowed_once_every_view_was_read():
    kind, got, xv = _inplace_case(False)
    ea = np.exp(xv)
    assert kind == "inplace"
    np.testing.assert_allclose(got, np.sin(ea) * (ea + 1), rtol=1e-6)


# ---- in-place writers: readers first ------------------------------------------------------
def test_every_reader_runs_before_the_update_of_its_var():
    g = mgb.comp_graph()
    ws = [
        mgb.make_shared(CN, value=np.full(3, i, np.float32), comp_graph=g, name=f"w{i}")
        for i in range(20)
    ]
    reads = [w * 2.0 for w in ws]
    ups = [mgb.opr.add_update(w, np.ones(3, np.float32)) for w in ws]
    f = g.compile(None, [mgb.copy_output(r) for r in reads] + ups)
    outs = f()
    for i, r in enumerate(outs):
        np.testing.assert_array_equal(r, np.full(3, 2 * i, np.float32))  # the old values
    seq = f._func.seq
    pos = {o: k for k, o in enumerate(seq)}
    for r, u in zip(reads, ups):
        assert pos[r.node.owner] < pos[u.node.owner]


def test_a_reader_of_both_values_is_still_refused():
    g = mgb.comp_graph()
    w = mgb.make_shared(CN, value=np.ones(3, np.float32), comp_graph=g, name="w")
    up = mgb.opr.add_update(w, np.ones(3, np.float32))
    both = w + up  # reads the old value and, through up, the new one
    with pytest.raises(GraphError, match="reads both the old value"):
        g.compile(None, [mgb.copy_output(both)])
