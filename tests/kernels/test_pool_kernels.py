"""Pooling kernels (megbrain.kernels.pool) against a float64 NumPy reference: every mode,
forward and backward, 2-d (the compiled loops, including the 2x2/s2 and 3x3/s2/p1 special
cases) and 3-d (the NumPy formulation), float32/float64/float16, non-contiguous arrays, ties
in MAX, the split over threads, and the workspace contract (every workspace byte written
before it is read)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.lib.stride_tricks import sliding_window_view
from test_conv_algos import _carved

from megbrain.kernels import parallel, workspace
from megbrain.kernels.pool import binds as dnn_pool
from megbrain.kernels.pool import loops as pool_loops

MODES = dnn_pool.POOLING_MODES
RTOL, ATOL = 1e-4, 1e-5


# ---- float64 reference ---------------------------------------------------------------------
def _padded(a, pad, fill):
    return np.pad(a, [(0, 0), (0, 0)] + [(p, p) for p in pad], constant_values=fill)


def _windows(a, window, stride):
    """``(N, C, *O, *W)`` windows of an already padded ``a``."""
    nsp = len(window)
    v = sliding_window_view(a, window, axis=tuple(range(2, 2 + nsp)))
    return v[(slice(None), slice(None), *(slice(None, None, s) for s in stride))]


def ref_forward(x, mode, window, stride, pad):
    x = x.astype(np.float64)
    nsp = len(window)
    axes = tuple(range(-nsp, 0))
    if mode == "MAX":
        return _windows(_padded(x, pad, -np.inf), window, stride).max(axis=axes)
    total = _windows(_padded(x, pad, 0.0), window, stride).sum(axis=axes)
    if mode == "AVERAGE":
        return total / np.prod(window)
    ones = _padded(np.ones((1, 1) + x.shape[2:]), pad, 0.0)
    return total / _windows(ones, window, stride).sum(axis=axes)


def ref_backward(x, y, dy, mode, window, stride, pad):
    """Loop over output positions: each window's diff goes to the elements equal to its max
    (ties share it), or is spread over the window divided by the divisor."""
    x, y, dy = (a.astype(np.float64) for a in (x, y, dy))
    nsp = len(window)
    xp = _padded(x, pad, -np.inf)
    gp = np.zeros(xp.shape)
    ones = np.pad(np.ones(x.shape[2:]), [(p, p) for p in pad])
    for o in np.ndindex(*dy.shape[2:]):
        idx = tuple(slice(oi * s, oi * s + w) for oi, s, w in zip(o, stride, window))
        full = (slice(None), slice(None), *idx)
        dv = dy[(slice(None), slice(None), *o)].reshape(dy.shape[:2] + (1,) * nsp)
        if mode == "MAX":
            m = y[(slice(None), slice(None), *o)].reshape(dv.shape)
            gp[full] += (xp[full] == m) * dv
        else:
            div = np.prod(window) if mode == "AVERAGE" else ones[idx].sum()
            gp[full] += dv / div
    return gp[(slice(None), slice(None), *(slice(p, p + s) for p, s in zip(pad, x.shape[2:])))]


# ---- drawing cases -------------------------------------------------------------------------
@st.composite
def geometries(draw, nsp):
    """(window, stride, pad, spatial) with at least one output per dim."""
    window, stride, pad, size = [], [], [], []
    special = draw(st.sampled_from([None, (2, 2, 0), (3, 2, 1)]))
    for _ in range(nsp):
        if special:
            w, s, p = special
        else:
            w = draw(st.integers(1, 4))
            s = draw(st.integers(1, 3))
            p = draw(st.integers(0, w - 1))
        lo = max(1, w - 2 * p)
        size.append(draw(st.integers(lo, lo + (9 if nsp == 2 else 4))))
        window.append(w)
        stride.append(s)
        pad.append(p)
    return tuple(window), tuple(stride), tuple(pad), tuple(size)


def _out_shape(nc, window, stride, pad, size):
    return nc + tuple(dnn_pool.pool_out_size(*a) for a in zip(size, window, stride, pad))


def _values(rng, shape, dtype, ties):
    if ties:  # few distinct values: windows with several maxima
        return (rng.integers(-2, 3, shape) / 2).astype(dtype)
    return rng.uniform(-1, 1, shape).astype(dtype)


def _maybe_strided(a, strided):
    """``a`` itself, or a non-contiguous array with its values (every other element of a
    larger buffer along the last dim)."""
    if not strided:
        return a
    big = np.full(a.shape[:-1] + (2 * a.shape[-1],), np.nan, a.dtype)
    view = big[..., ::2]
    view[...] = a
    return view


def _tol(dtype):
    return dict(rtol=RTOL, atol=ATOL) if dtype != np.float16 else dict(rtol=2e-3, atol=2e-3)


def _check(mode, window, stride, pad, size, nc, dtype, ties, strided, seed):
    rng = np.random.default_rng(seed)
    x = _values(rng, nc + size, dtype, ties)
    oshape = _out_shape(nc, window, stride, pad, size)
    dy = _values(rng, oshape, dtype, False)
    want_y = ref_forward(x, mode, window, stride, pad)

    y = _maybe_strided(np.full(oshape, np.nan, dtype), strided)
    dnn_pool.bind_pooling(_maybe_strided(x, strided), y, mode, window, stride, pad)()
    np.testing.assert_allclose(y.astype(np.float64), want_y, **_tol(dtype))

    gx = _maybe_strided(np.full(x.shape, np.nan, dtype), strided)
    xs, ys, ds = (_maybe_strided(a, strided) for a in (x, np.ascontiguousarray(y), dy))
    dnn_pool.bind_pooling_backward(xs, ys, ds, gx, mode, window, stride, pad)()
    want_gx = ref_backward(x, y, dy, mode, window, stride, pad)
    np.testing.assert_allclose(gx.astype(np.float64), want_gx, **_tol(dtype))


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    nsp=st.sampled_from([2, 2, 3]),
    mode=st.sampled_from(MODES),
    dtype=st.sampled_from([np.float32, np.float64, np.float16]),
    ties=st.booleans(),
    strided=st.booleans(),
)
def test_matches_float64_reference(data, nsp, mode, dtype, ties, strided):
    window, stride, pad, size = data.draw(geometries(nsp))
    nc = (data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3)))
    _check(mode, window, stride, pad, size, nc, dtype, ties, strided, seed=7)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("geometry", [(2, 2, 0), (3, 2, 1), (3, 1, 1), (2, 1, 0), (3, 3, 0)])
@pytest.mark.parametrize("size", [(7, 9), (8, 6), (1, 5)])
def test_compiled_loops_odd_and_even_sizes(mode, geometry, size):
    # the special loops' last columns / rows (odd sizes leave source rows no window reads)
    w, s, p = geometry
    if any(n + 2 * p < w for n in size):
        pytest.skip("no output")
    _check(mode, (w, w), (s, s), (p, p), size, (2, 3), np.float32, True, False, seed=3)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("ow", [1, 3, 4, 5, 7, 8, 9, 14, 16, 17])
def test_2x2_vector_chunks(mode, dtype, ow):
    # the 2x2 loops' vector chunks: 8 outputs (a last chunk overlapping the one before when
    # ow % 8), 4 outputs twice for 4 <= ow < 8, scalar below; an odd last row / column
    for size in [(4, 2 * ow), (5, 2 * ow + 1)]:
        _check(mode, (2, 2), (2, 2), (0, 0), size, (2, 3), dtype, True, False, seed=ow)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("size", [(1, 1), (1, 2), (2, 1), (5, 1), (3, 33), (4, 34), (6, 17)])
def test_3x3_s2_p1_edges(mode, size):
    # the 3x3/s2/p1 loops' first / last rows and columns (padding on one or both sides, a
    # last output whose third column is padding), and rows long enough to vectorise
    _check(mode, (3, 3), (2, 2), (1, 1), size, (2, 3), np.float32, True, False, seed=6)
    _check(mode, (3, 3), (2, 2), (1, 1), size, (1, 2), np.float64, False, True, seed=6)


@pytest.mark.parametrize("ow", [2, 5, 8, 11])
def test_2x2_max_propagates_nan_in_every_lane(ow):
    rng = np.random.default_rng(ow)
    x = rng.uniform(-1, 1, (1, 2, 4, 2 * ow)).astype(np.float32)
    x[0, 0, 1, ::3] = np.nan  # a NaN in every third window of row 0
    y = np.empty((1, 2, 2, ow), np.float32)
    dnn_pool.bind_pooling(x, y, "MAX", (2, 2), (2, 2), (0, 0))()
    want = ref_forward(x, "MAX", (2, 2), (2, 2), (0, 0))
    np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
    np.testing.assert_allclose(y[~np.isnan(y)], want[~np.isnan(want)], rtol=0)
    # a NaN maximum gives its window no gradient (src == dst is false), the others do
    gx = np.full_like(x, 7.0)
    dy = np.ones_like(y)
    dnn_pool.bind_pooling_backward(x, y, dy, gx, "MAX", (2, 2), (2, 2), (0, 0))()
    want_gx = ref_backward(x, y, dy, "MAX", (2, 2), (2, 2), (0, 0))
    assert not want_gx[0, 0, :2, ::6].any() and want_gx[0, 1].any()
    np.testing.assert_array_equal(gx, want_gx)


def test_max_ties_share_the_diff():
    x = np.ones((1, 1, 4, 4), np.float32)
    y = np.empty((1, 1, 2, 2), np.float32)
    dnn_pool.bind_pooling(x, y, "MAX", (2, 2), (2, 2), (0, 0))()
    dy = np.arange(1, 5, dtype=np.float32).reshape(y.shape)
    gx = np.empty_like(x)
    dnn_pool.bind_pooling_backward(x, y, dy, gx, "MAX", (2, 2), (2, 2), (0, 0))()
    np.testing.assert_array_equal(gx[0, 0], np.kron(dy[0, 0], np.ones((2, 2))))
    # overlapping windows (3x3 s2 p1): an element in two windows gets both diffs
    gx = np.empty_like(x)
    dnn_pool.bind_pooling(x, y, "MAX", (3, 3), (2, 2), (1, 1))()
    dnn_pool.bind_pooling_backward(x, y, dy, gx, "MAX", (3, 3), (2, 2), (1, 1))()
    np.testing.assert_array_equal(gx, ref_backward(x, y, dy, "MAX", (3, 3), (2, 2), (1, 1)))
    assert gx[0, 0, 1, 1] == dy.sum()


def test_max_propagates_nan():
    x = np.zeros((1, 1, 4, 4), np.float32)
    x[0, 0, 1, 0] = np.nan
    for geometry in [((2, 2), (2, 2), (0, 0)), ((3, 3), (2, 2), (1, 1))]:
        y = np.empty((1, 1) + (2, 2), np.float32)
        dnn_pool.bind_pooling(x, y, "MAX", *geometry)()
        assert np.isnan(y[0, 0, 0, 0]) and not np.isnan(y[0, 0, 1, 1])


@pytest.mark.parametrize("mode", MODES)
def test_split_over_threads_matches(monkeypatch, mode):
    monkeypatch.setattr(dnn_pool, "SPLIT_MIN_ELEMS", 1)
    monkeypatch.setattr(parallel, "num_threads", lambda: 3)
    for window, stride, pad in [((2, 2), (2, 2), (0, 0)), ((3, 3), (2, 2), (1, 1))]:
        _check(mode, window, stride, pad, (9, 8), (2, 5), np.float32, True, False, seed=5)


@pytest.mark.parametrize("mode", ["MAX", "AVERAGE"])
def test_large_poolings_split_by_default(monkeypatch, mode):
    # SPLIT_MIN_ELEMS (on by default) splits the planes of a large pooling in two parts,
    # forward and backward, and a small one not at all
    monkeypatch.setattr(parallel, "num_threads", lambda: 2)
    parts = []
    real = parallel.split

    def spy(fn, n, min_items):
        parts.append(len(parallel.ranges(n, 2, min_items)))
        return real(fn, n, min_items)

    monkeypatch.setattr(parallel, "split", spy)
    size = (16, 16)  # 256 elements a plane
    big = (2, dnn_pool.SPLIT_MIN_ELEMS // 256)
    _check(mode, (2, 2), (2, 2), (0, 0), size, big, np.float32, True, False, seed=4)
    _check(mode, (3, 3), (2, 2), (1, 1), size, big, np.float32, True, False, seed=4)
    assert parts == [2, 2, 2, 2]
    parts.clear()
    _check(mode, (2, 2), (2, 2), (0, 0), size, (1, 3), np.float32, True, False, seed=4)
    assert parts == [1, 1]


def test_planes_are_split_in_ranges(monkeypatch):
    calls = []
    monkeypatch.setattr(parallel, "num_threads", lambda: 3)
    parallel.split(lambda lo, hi: calls.append((lo, hi)), 10, 2)()
    assert sorted(calls) == [(0, 3), (3, 6), (6, 10)]
    calls.clear()
    parallel.split(lambda lo, hi: calls.append((lo, hi)), 10, 6)()  # too few for two parts
    assert calls == [(0, 10)]


def test_split_reraises_a_part_error(monkeypatch):
    monkeypatch.setattr(parallel, "num_threads", lambda: 2)

    def fn(lo, hi):
        if lo:
            raise RuntimeError("part failed")

    with pytest.raises(RuntimeError, match="part failed"):
        parallel.split(fn, 4, 1)()


# ---- workspace -----------------------------------------------------------------------------
CASES = list(
    itertools.product(
        MODES,
        [((2, 2), (2, 2), (0, 0)), ((3, 3), (2, 2), (1, 1)), ((3, 2), (1, 2), (1, 0))],
    )
) + [(m, ((2, 2, 2), (1, 2, 2), (1, 0, 1))) for m in MODES]


@pytest.mark.parametrize("mode,geometry", CASES)
@pytest.mark.parametrize("dtype,strided", [(np.float16, False), (np.float32, True)])
def test_workspace_is_written_before_read(mode, geometry, dtype, strided):
    # staging copies (float16, strided arrays) and the NumPy formulation's temporaries live in
    # the workspace: poisoning it between runs must not change any result
    window, stride, pad = geometry
    size = (7, 6, 5)[: len(window)]
    rng = np.random.default_rng(2)
    x = _maybe_strided(_values(rng, (2, 3) + size, dtype, True), strided)
    oshape = _out_shape((2, 3), window, stride, pad, size)
    dy = _maybe_strided(_values(rng, oshape, dtype, False), strided)
    y = _maybe_strided(np.empty(oshape, dtype), strided)
    gx = _maybe_strided(np.empty(x.shape, dtype), strided)
    fwd, fbuf = _carved(lambda: dnn_pool.bind_pooling(x, y, mode, window, stride, pad))
    bwd, bbuf = _carved(
        lambda: dnn_pool.bind_pooling_backward(x, y, dy, gx, mode, window, stride, pad)
    )
    # each declares a workspace (but the NumPy forward of arrays in the compute dtype)
    assert bbuf.nbytes > 1 and (fbuf.nbytes > 1 or (len(window) == 3 and dtype == np.float32))
    want_y = ref_forward(x, mode, window, stride, pad)
    for _ in range(2):
        fbuf[:] = 0xFF  # NaN as float16 / float32
        fwd()
        np.testing.assert_allclose(y.astype(np.float64), want_y, **_tol(dtype))
        bbuf[:] = 0xFF
        bwd()
        want_gx = ref_backward(x, y, dy, mode, window, stride, pad)
        np.testing.assert_allclose(gx.astype(np.float64), want_gx, **_tol(dtype))


def test_contiguous_float32_needs_no_workspace():
    x = np.zeros((2, 3, 8, 8), np.float32)
    y = np.empty((2, 3, 4, 4), np.float32)
    rec = workspace.Recorder()
    with workspace.allocating(rec):
        dnn_pool.bind_pooling(x, y, "MAX", (2, 2), (2, 2), (0, 0))
        dnn_pool.bind_pooling_backward(x, y, y, x.copy(), "MAX", (2, 2), (2, 2), (0, 0))
    assert rec.nbytes == 0


# ---- bad input -----------------------------------------------------------------------------
def test_bad_geometry_raises_naming_the_shapes():
    x = np.zeros((1, 2, 5, 5), np.float32)
    with pytest.raises(ValueError, match=r"Pooling: src \(1, 2, 5, 5\).*\(1, 2, 3, 3\)"):
        dnn_pool.bind_pooling(x, np.empty((1, 2, 3, 3), np.float32), "MAX", (2, 2), (2, 2), (0, 0))
    with pytest.raises(ValueError, match="padding"):
        dnn_pool.bind_pooling(x, np.empty((1, 2, 5, 5), np.float32), "MAX", (2, 2), (1, 1), (2, 2))
    with pytest.raises(ValueError, match="unknown mode"):
        dnn_pool.bind_pooling(x, np.empty((1, 2, 2, 2), np.float32), "MIN", (2, 2), (2, 2), (0, 0))
    with pytest.raises(ValueError, match="floating point"):
        dnn_pool.bind_pooling(x.astype(np.int32), np.empty((1, 2, 2, 2), np.int32), "MAX",
                              (2, 2), (2, 2), (0, 0))  # fmt: skip
    with pytest.raises(ValueError, match="PoolingBackward: src"):
        y = np.empty((1, 2, 2, 2), np.float32)
        dnn_pool.bind_pooling_backward(x[:, :1], y, y, x, "MAX", (2, 2), (2, 2), (0, 0))


# ---- global average ------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["AVERAGE", "AVERAGE_COUNT_EXCLUDE_PADDING"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("size,stride", [((7, 7), (1, 1)), ((3, 5), (2, 3)), ((1, 1), (1, 1))])
def test_global_average_rounds_as_the_compiled_loops(mode, dtype, size, stride):
    # the whole-plane average skips the compiled loops (their compilation, on a cold cache,
    # outweighed a classifier's head); it must give their bits, negative zeros included
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 4) + size).astype(dtype)
    x[0, 0] = -0.0
    dy = rng.standard_normal((3, 4, 1, 1)).astype(dtype)
    dy[0, 1] = -0.0
    y, gx = np.empty(dy.shape, dtype), np.empty(x.shape, dtype)
    fwd, _ = _carved(lambda: dnn_pool.bind_pooling(x, y, mode, size, stride, (0, 0)))
    bwd, _ = _carved(
        lambda: dnn_pool.bind_pooling_backward(x, y, dy, gx, mode, size, stride, (0, 0))
    )
    fwd()
    bwd()
    k = pool_loops.kernels()
    inv = dtype(1.0 / np.prod(size))
    exclude = mode == "AVERAGE_COUNT_EXCLUDE_PADDING"
    geometry = (*size, *stride, 0, 0)
    want_y, want_gx = np.empty_like(y), np.empty_like(gx)
    planes = (12, 1, 1)
    k.fwd_avg(x.reshape(12, *size), want_y.reshape(planes), *geometry, exclude, inv, 0, 12)
    k.bwd_avg(dy.reshape(planes), want_gx.reshape(12, *size), *geometry, exclude, inv, 0, 12)
    np.testing.assert_array_equal(np.signbit(y), np.signbit(want_y))
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(np.signbit(gx), np.signbit(want_gx))
    np.testing.assert_array_equal(gx, want_gx)
