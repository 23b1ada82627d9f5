"""megbrain's float32 GEMM (megbrain.kernels.sgemm): against the float64 reference over drawn
shapes (1, non-multiples of the tile, past the cache blocks), transposes, strides, F-ordered
outputs and accumulation; the same bits at 1 and 2 threads; nothing allocated at run time;
the exception path; the fallback of product_step; the transposing loops (a batch of planes
transposed, planes packed as a batch-inner operand)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_conv_algos import assert_allocates_nothing

from megbrain.kernels import sgemm, sgemm_loops

RTOL, ATOL = 1e-4, 1e-5
_dims = st.one_of(st.sampled_from([1, 5, 6, 7, 16, 17, 63, 64, 65]), st.integers(1, 90))


def _operand(rng, rows, cols, order: str) -> np.ndarray:
    """A (rows, cols) float32 matrix: C-ordered, transposed (F), or a strided slice."""
    if order == "T":
        return rng.uniform(-1, 1, (cols, rows)).astype(np.float32).T
    if order == "strided":
        return rng.uniform(-1, 1, (rows, 2 * cols + 1)).astype(np.float32)[:, 1::2]
    return rng.uniform(-1, 1, (rows, cols)).astype(np.float32)


def _assert_product(a, b, out, start=None):
    k = a.shape[1]
    want = a.astype(np.float64) @ b.astype(np.float64)
    if start is not None:
        want += start
    np.testing.assert_allclose(out, want, rtol=RTOL, atol=ATOL * max(1, k))


@settings(max_examples=15, deadline=None)
@given(m=_dims, n=_dims, k=_dims, oa=st.sampled_from(["C", "T", "strided"]),
       ob=st.sampled_from(["C", "T", "strided"]), fout=st.booleans(),
       acc=st.booleans(), seed=st.integers(0, 99))  # fmt: skip
def test_against_float64(m, n, k, oa, ob, fout, acc, seed):
    rng = np.random.default_rng(seed)
    a, b = _operand(rng, m, k, oa), _operand(rng, k, n, ob)
    out = np.asfortranarray(rng.uniform(-1, 1, (m, n)).astype(np.float32)) if fout \
        else rng.uniform(-1, 1, (m, n)).astype(np.float32)  # fmt: skip
    start = out.astype(np.float64) if acc else None
    sgemm.bind_sgemm(a, b, out, accumulate=acc)()
    _assert_product(a, b, out, start)


@pytest.mark.parametrize("m,n,k", [(250, 70, 530), (13, 4100, 40), (7, 9, 2048)])
def test_past_the_cache_blocks(m, n, k):
    """Several ``K`` blocks (the adds after the first), ``M`` and ``N`` blocks, rows of ``a``
    with a stride of a multiple of 4 KB (packed, not read in place)."""
    rng = np.random.default_rng(0)
    a, b = _operand(rng, m, k, "C"), _operand(rng, k, n, "T")
    out = sgemm.sgemm(a, b)
    _assert_product(a, b, out)


def test_threads_give_the_same_bits():
    rng = np.random.default_rng(1)
    a, b = _operand(rng, 200, 300, "C"), _operand(rng, 300, 150, "T")
    one, two = (np.empty((200, 150), np.float32) for _ in range(2))
    sgemm.bind_sgemm(a, b, one, threads=1)()
    sgemm.bind_sgemm(a, b, two, threads=2)()
    np.testing.assert_array_equal(one, two)
    _assert_product(a, b, one)


def test_allocates_nothing():
    rng = np.random.default_rng(2)
    a, b = _operand(rng, 50, 70, "T"), _operand(rng, 70, 90, "C")
    out = np.empty((50, 90), np.float32)
    step = sgemm.bind_sgemm(a, b, out, threads=1)
    step()
    assert_allocates_nothing(step)


def test_bad_shapes_name_the_operands():
    a, b = np.zeros((2, 3), np.float32), np.zeros((4, 5), np.float32)
    with pytest.raises(ValueError, match=r"a \(2, 3\) @ b \(4, 5\).*out \(2, 5\)"):
        sgemm.bind_sgemm(a, b, np.zeros((2, 5), np.float32))
    with pytest.raises(ValueError, match=r"out \(3, 3\)"):
        sgemm.bind_sgemm(a, a.T, np.zeros((3, 3), np.float32))
    with pytest.raises(TypeError, match="float64"):
        sgemm.bind_sgemm(a, a.T.astype(np.float64), np.zeros((2, 2), np.float32))
    with pytest.raises(ValueError, match="not overlapping"):
        x = np.zeros((4, 4), np.float32)
        sgemm.bind_sgemm(x, x, x)
    assert not sgemm.usable_sgemm(a[:, ::-1], a.T, np.zeros((2, 2), np.float32))


def test_empty_and_zero_k():
    a, b = np.zeros((3, 0), np.float32), np.zeros((0, 4), np.float32)
    out = np.ones((3, 4), np.float32)
    sgemm.bind_sgemm(a, b, out)()
    np.testing.assert_array_equal(out, 0)
    out[:] = 1
    sgemm.bind_sgemm(a, b, out, accumulate=True)()
    np.testing.assert_array_equal(out, 1)
    sgemm.bind_sgemm(np.zeros((0, 5), np.float32), np.zeros((5, 4), np.float32),
                     np.zeros((0, 4), np.float32))()  # fmt: skip


@pytest.mark.parametrize("enabled", [True, False])
def test_product_step(enabled, monkeypatch):
    """product_step binds the GEMM where usable (and enabled), else NumPy's matmul (float64,
    a reversed stride); split or not."""
    monkeypatch.setattr(sgemm, "ENABLED", enabled)
    rng = np.random.default_rng(3)
    for a, b in [(_operand(rng, 40, 30, "C"), _operand(rng, 30, 50, "T")),
                 (rng.uniform(-1, 1, (40, 30)), rng.uniform(-1, 1, (30, 50))),
                 (_operand(rng, 40, 30, "C")[::-1], _operand(rng, 30, 50, "C"))]:  # fmt: skip
        for split in (False, True):
            out = np.empty((40, 50), a.dtype)
            sgemm.product_step(a, b, out, split)()
            _assert_product(a, b, out)
    outs = np.empty((2, 40, 50), np.float32)
    a3, b3 = _operand(rng, 80, 30, "C").reshape(2, 40, 30), _operand(rng, 60, 50, "C")
    for s in sgemm.group_products(a3, b3.reshape(2, 30, 50), outs):
        s()
    for g in range(2):
        _assert_product(a3[g], b3.reshape(2, 30, 50)[g], outs[g])


# ---- bind_sgemm_sum: a batch of products summed -------------------------------------------
@settings(max_examples=15, deadline=None)
@given(nb=st.integers(1, 5), m=_dims, n=_dims, k=_dims, oa=st.sampled_from(["C", "T"]),
       ob=st.sampled_from(["C", "T"]), threads=st.integers(1, 3),
       seed=st.integers(0, 99))  # fmt: skip
def test_sum_against_float64(nb, m, n, k, oa, ob, threads, seed):
    rng = np.random.default_rng(seed)
    a = np.stack([_operand(rng, m, k, oa) for _ in range(nb)])
    b = np.stack([_operand(rng, k, n, ob) for _ in range(nb)])
    if oa == "T":
        a = np.ascontiguousarray(a.transpose(0, 2, 1)).transpose(0, 2, 1)
    if ob == "T":
        b = np.ascontiguousarray(b.transpose(0, 2, 1)).transpose(0, 2, 1)
    out = np.full((m, n), np.nan, np.float32)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sgemm, "SPLIT_MIN_FLOPS", 1)
        sgemm.bind_sgemm_sum(a, b, out, threads=threads)()
    want = np.einsum("imk,ikn->mn", a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(out, want, rtol=RTOL, atol=ATOL * max(1, k * nb))


def test_sum_same_bits_at_any_threads_allocates_nothing_and_refuses():
    rng = np.random.default_rng(3)
    a = rng.uniform(-1, 1, (4, 70, 50)).astype(np.float32)
    b = rng.uniform(-1, 1, (4, 90, 50)).astype(np.float32).transpose(0, 2, 1)
    one, two = (np.empty((70, 90), np.float32) for _ in range(2))
    step = sgemm.bind_sgemm_sum(a, b, one, threads=1)
    step()
    sgemm.bind_sgemm_sum(a, b, two, threads=2)()
    np.testing.assert_array_equal(one, two)
    assert_allocates_nothing(step)
    with pytest.raises(ValueError, match="batches"):
        sgemm.bind_sgemm_sum(a, b[:3], one)
    with pytest.raises(ValueError, match="rows contiguous"):
        sgemm.bind_sgemm_sum(a, b, np.empty((90, 70), np.float32).T)


@settings(max_examples=15, deadline=None)
@given(m=_dims, n=_dims, k=_dims, oa=st.sampled_from(["C", "T", "strided"]),
       ob=st.sampled_from(["C", "T", "strided"]), acc=st.booleans(),
       seed=st.integers(0, 99))  # fmt: skip
def test_packed_operand_against_float64(m, n, k, oa, ob, acc, seed):
    # ``b`` packed once into whole panels, then multiplied as it is (several K blocks past
    # 128, a partial last panel), ``a`` read in place or packed
    rng = np.random.default_rng(seed)
    a, b = _operand(rng, m, k, oa), _operand(rng, k, n, ob)
    panels = np.full(sgemm.packed_size(k, n) + 3, np.nan, np.float32)
    sgemm.bind_pack(b, panels)()
    out = rng.uniform(-1, 1, (m, n)).astype(np.float32)
    start = out.astype(np.float64) if acc else None
    ap = np.full(sgemm.product_buffer_size(m, k), np.nan, np.float32)
    sgemm.bind_packed_product(a, panels, n, out, acc, ap)()
    _assert_product(a, b, out, start)


@settings(max_examples=15, deadline=None)
@given(m=_dims, n=_dims, k=_dims, extra=st.integers(0, 300), seed=st.integers(0, 99))
def test_packed_operand_row_ranges_against_float64(m, n, k, extra, seed):
    # a range of rows [first, first + k) of a taller packed matrix (the filter gradient's
    # taps): the panels' rows apart by the packed matrix's rows, not the product's k
    rng = np.random.default_rng(seed)
    first = int(rng.integers(0, extra + 1))
    tall = _operand(rng, k + extra, n, "C")
    panels = np.full(sgemm.packed_size(k + extra, n), np.nan, np.float32)
    sgemm.bind_pack(tall, panels)()
    a = _operand(rng, m, k, "C")
    out = np.full((m, n), np.nan, np.float32)
    ap = np.full(sgemm.product_buffer_size(m, k), np.nan, np.float32)
    sgemm.bind_packed_product(a, panels, n, out, False, ap, rows=k + extra, first=first)()
    _assert_product(a, tall[first : first + k], out, None)
    with pytest.raises(ValueError, match="rows"):
        sgemm.bind_packed_product(a, panels, n, out, False, ap, rows=k + extra,
                                  first=extra + 1)  # fmt: skip


def test_packed_operand_refuses_bad_buffers():
    a, b = np.ones((5, 4), np.float32), np.ones((4, 3), np.float32)
    small = np.empty(sgemm.packed_size(4, 3) - 1, np.float32)
    with pytest.raises(ValueError, match="cannot pack"):
        sgemm.bind_pack(b, small)
    panels = np.empty(sgemm.packed_size(4, 3), np.float32)
    ap = np.empty(sgemm.product_buffer_size(5, 4), np.float32)
    with pytest.raises(ValueError, match="do not multiply"):
        sgemm.bind_packed_product(a, panels, 3, np.empty((5, 4), np.float32), False, ap)


def _readonly(a):
    v = a.reshape(-1)
    v.flags.writeable = False
    return v


@settings(max_examples=20, deadline=None)
@given(b=st.integers(1, 4), m=_dims, k=_dims, pad=st.integers(0, 3), seed=st.integers(0, 99))
def test_transpose_batches_of_matrices(b, m, k, pad, seed):
    # 16-row blocks through the registers, the rows past them one by one; rows of the
    # source and the result longer than the matrices (their tails untouched)
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (b, m, k + pad)).astype(np.float32)
    dst = np.full((b, k, m + pad), 7.0, np.float32)
    sgemm_loops.compiled_transpose()(_readonly(x), 0, k + pad, m, k, dst.reshape(-1), 0,
                                     m + pad, 0, b, m * (k + pad), k * (m + pad))  # fmt: skip
    np.testing.assert_array_equal(dst[:, :, :m], x[:, :, :k].swapaxes(1, 2))
    assert (dst[:, :, m:] == 7).all()


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 5), m=_dims, k=_dims, seed=st.integers(0, 99))
def test_pack_planes_as_the_batch_inner_operand(n, m, k, seed):
    # (n, m, k) planes as the (k n, m) matrix of rows (kk, i), packed: the same panels
    # bind_pack writes from that matrix, whatever share of the planes each call takes
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (n, m, k)).astype(np.float32)
    want = np.full(sgemm.packed_size(k * n, m), np.nan, np.float32)
    sgemm.bind_pack(np.ascontiguousarray(x.transpose(2, 0, 1).reshape(k * n, m)), want)()
    got = np.full_like(want, np.nan)
    run = sgemm_loops.compiled_pack_planes(sgemm.TILE[1])
    half = n // 2
    run(_readonly(x), n, m, k, got, 0, half)
    run(_readonly(x), n, m, k, got, half, n)
    np.testing.assert_array_equal(got, want)
