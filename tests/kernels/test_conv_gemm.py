"""The GEMM convolutions' compiled loops (megbrain.kernels.conv_gemm_loops) and the
algorithms built on them, against NumPy and float64 references."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_conv_algos import (
    ATOL,
    RTOL,
    _arrays,
    _carved,
    assert_allocates_nothing,
    conv_cases,
    ref_backward_data,
    ref_backward_filter,
    ref_forward,
)

from megbrain.kernels import parallel
from megbrain.kernels.conv import binds as conv_binds
from megbrain.kernels.conv import bwd_data as conv_bwd_data
from megbrain.kernels.conv import common as conv_common
from megbrain.kernels.conv import im2col as conv_im2col
from megbrain.kernels.conv import registry as conv_algos
from megbrain.kernels.conv.loops import im2col as conv_gemm_loops

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "opr"))
from opr_harness import check_grad  # noqa: E402


@st.composite
def geometries(draw):
    fshape = tuple(draw(st.lists(st.integers(1, 4), min_size=2, max_size=2)))
    stride = tuple(draw(st.lists(st.integers(1, 3), min_size=2, max_size=2)))
    dilate = tuple(draw(st.lists(st.integers(1, 2), min_size=2, max_size=2)))
    pad = tuple(draw(st.integers(0, f)) for f in fshape)
    sshape = tuple(
        draw(st.integers(max(1, d * (f - 1) + 1 - 2 * p), 9))
        for f, d, p in zip(fshape, dilate, pad)
    )
    n = draw(st.integers(1, 4))
    n0 = draw(st.integers(0, n - 1))
    n1 = draw(st.integers(n0 + 1, n))
    return dict(n=n, c=draw(st.integers(1, 3)), fshape=fshape, stride=stride, pad=pad,
                dilate=dilate, sshape=sshape, n0=n0, n1=n1,
                seed=draw(st.integers(0, 2**16)))  # fmt: skip


@st.composite
def same_width_geometries(draw):
    """Stride 1 with the output as wide as the source (im2col's one-run rows)."""
    fh, fw = draw(st.integers(1, 5)), draw(st.sampled_from([1, 3, 5]))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    pw = dw * (fw - 1) // 2
    ph = draw(st.integers(0, fh))
    h = draw(st.integers(max(1, dh * (fh - 1) + 1 - 2 * ph), 9))
    w = draw(st.integers(max(1, dw * (fw - 1) + 1 - 2 * pw), 9))
    n = draw(st.integers(1, 3))
    n0 = draw(st.integers(0, n - 1))
    return dict(n=n, c=draw(st.integers(1, 3)), fshape=(fh, fw), stride=(1, 1), pad=(ph, pw),
                dilate=(dh, dw), sshape=(h, w), n0=n0, n1=draw(st.integers(n0 + 1, n)),
                seed=draw(st.integers(0, 2**16)))  # fmt: skip


def _oshape(g):
    return tuple(
        conv_common.conv_out_size(*a)
        for a in zip(g["sshape"], g["fshape"], g["stride"], g["pad"], g["dilate"])
    )


def _ref_cols(g, x):
    """The (C * FH * FW, k * OH * OW) columns of samples [n0, n1), by NumPy slicing."""
    (fh, fw), (sh, sw), (dh, dw) = g["fshape"], g["stride"], g["dilate"]
    oh, ow = _oshape(g)
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in g["pad"]])
    ref = np.zeros((x.shape[1], fh, fw, g["n1"] - g["n0"], oh, ow), x.dtype)
    for a in range(fh):
        for b in range(fw):
            win = xp[g["n0"] : g["n1"], :, a * dh : a * dh + sh * (oh - 1) + 1 : sh,
                     b * dw : b * dw + sw * (ow - 1) + 1 : sw]  # fmt: skip
            ref[:, a, b] = win.transpose(1, 0, 2, 3)
    return ref.reshape(x.shape[1] * fh * fw, -1)


def _args(g):
    return g["stride"], g["pad"], g["dilate"], g["fshape"]


#: any geometry, or stride 1 with the output as wide as the source (copied as one run per
#: sample and plane, the padding between rows zeroed after it)
ANY_GEOMETRY = st.one_of(geometries(), same_width_geometries())


@settings(max_examples=80, deadline=None)
@given(g=ANY_GEOMETRY, dtype=st.sampled_from([np.float32, np.float64]))
def test_im2col_matches_numpy(g, dtype):
    rng = np.random.default_rng(g["seed"])
    x = rng.uniform(-1, 1, (g["n"], g["c"], *g["sshape"])).astype(dtype)
    ref = _ref_cols(g, x)
    cols = np.full(ref.shape, np.nan, dtype)
    rows = ref.shape[0]
    mid = rows // 2  # two row ranges, as two threads would write them
    conv_gemm_loops.im2col(x, cols, g["n0"], g["n1"], *_args(g), 0, mid)
    conv_gemm_loops.im2col(x, cols, g["n0"], g["n1"], *_args(g), mid, rows)
    np.testing.assert_array_equal(cols, ref)


@settings(max_examples=60, deadline=None)
@given(g=ANY_GEOMETRY, data=st.data())
def test_im2col_of_output_rows_matches_numpy(g, data):
    # a block of output rows [i0, i1) of each sample (a cache-sized piece of a large sample),
    # the rows from r0 on written into a buffer of their own (row_base)
    rng = np.random.default_rng(g["seed"])
    x = rng.uniform(-1, 1, (g["n"], g["c"], *g["sshape"])).astype(np.float32)
    oh, ow = _oshape(g)
    i0 = data.draw(st.integers(0, oh - 1))
    i1 = data.draw(st.integers(i0 + 1, oh))
    k = g["n1"] - g["n0"]
    ref = _ref_cols(g, x).reshape(-1, k, oh, ow)[:, :, i0:i1].reshape(-1, k * (i1 - i0) * ow)
    cols = np.full(ref.shape, np.nan, np.float32)
    conv_gemm_loops.im2col(x, cols, g["n0"], g["n1"], *_args(g), 0, ref.shape[0], (i0, i1))
    np.testing.assert_array_equal(cols, ref)
    r0 = data.draw(st.integers(0, ref.shape[0] - 1))
    band = np.full(ref[r0:].shape, np.nan, np.float32)
    conv_gemm_loops.im2col(x, band, g["n0"], g["n1"], *_args(g), r0, ref.shape[0], (i0, i1), r0)
    np.testing.assert_array_equal(band, ref[r0:])


@settings(max_examples=80, deadline=None)
@given(g=geometries())
def test_col2im_is_the_adjoint_of_im2col(g):
    # <im2col(x), cols> == <x, col2im(cols)> on the chunk's samples, others untouched
    rng = np.random.default_rng(g["seed"])
    x = rng.uniform(-1, 1, (g["n"], g["c"], *g["sshape"]))
    ref = _ref_cols(g, x)
    cols = rng.uniform(-1, 1, ref.shape)
    got = np.full_like(x, np.nan)
    mid = g["c"] // 2
    conv_gemm_loops.col2im(cols, got, g["n0"], g["n1"], *_args(g), 0, mid)
    conv_gemm_loops.col2im(cols, got, g["n0"], g["n1"], *_args(g), mid, g["c"])
    chunk = got[g["n0"] : g["n1"]]
    assert np.isnan(got[: g["n0"]]).all() and np.isnan(got[g["n1"] :]).all()
    assert np.isclose(np.sum(ref * cols), np.sum(x[g["n0"] : g["n1"]] * chunk))
    # and exactly the scatter-add of each column value to where im2col read it
    idx = np.arange(x[g["n0"] : g["n1"]].size, dtype=np.float64).reshape(chunk.shape)
    full = np.zeros_like(x)
    full[g["n0"] : g["n1"]] = idx + 1  # 0 marks padding in the index columns
    where = _ref_cols(g, full).astype(np.int64) - 1
    want = np.zeros(chunk.size)
    np.add.at(want, where[where >= 0], cols[where >= 0])
    np.testing.assert_allclose(chunk.reshape(-1), want, rtol=1e-12, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(g=geometries(), data=st.data())
def test_a_band_of_rows_goes_to_a_buffer_of_its_own(g, data):
    # im2col of rows [r0, r1) into a buffer holding rows from ``row_base`` on, and col2im
    # of a band of channels reading such a buffer
    rng = np.random.default_rng(g["seed"])
    x = rng.uniform(-1, 1, (g["n"], g["c"], *g["sshape"]))
    ref = _ref_cols(g, x)
    per = ref.shape[0] // g["c"]
    c0 = data.draw(st.integers(0, g["c"] - 1))
    c1 = data.draw(st.integers(c0 + 1, g["c"]))
    r0, r1 = c0 * per, c1 * per
    cols = np.full((r1 - r0, ref.shape[1]), np.nan)
    conv_gemm_loops.im2col(x, cols, g["n0"], g["n1"], *_args(g), r0, r1, None, r0)
    np.testing.assert_array_equal(cols, ref[r0:r1])
    band = rng.uniform(-1, 1, cols.shape)
    whole = np.zeros(ref.shape)
    whole[r0:r1] = band
    want, got = np.full_like(x, np.nan), np.full_like(x, np.nan)
    conv_gemm_loops.col2im(whole, want, g["n0"], g["n1"], *_args(g), c0, c1)
    conv_gemm_loops.col2im(band, got, g["n0"], g["n1"], *_args(g), c0, c1, r0)
    np.testing.assert_array_equal(got, want)


# ---- the algorithms on the compiled loops --------------------------------------------------
_ALGOS = [
    ("forward", "IM2COL_GEMM"),
    ("forward", "IM2COL_GEMM_PER_SAMPLE"),
    ("backward_data", "GEMM_COL2IM"),
    ("backward_data", "AS_FORWARD_CONV"),
]


def _algo(kind, name):
    return {a.name: a for a in conv_algos.algorithms(kind)}[name]


def _bind(kind, name, c, x, w, dy, out):
    args = (x, w, out) if kind == "forward" else (w, dy, out)
    geom = (c["stride"], c["pad"], c["dilate"], c["flip"])
    algo = _algo(kind, name)
    if not algo.usable(*args, *geom):
        return None
    return algo.bind(*args, *geom)


def _ref(kind, c, x, w, dy):
    return ref_forward(c, x, w) if kind == "forward" else ref_backward_data(c, w, dy)


def _tol(dtype):
    return dict(rtol=RTOL, atol=ATOL) if dtype != np.float16 else dict(rtol=2e-3, atol=2e-2)


@settings(max_examples=40, deadline=None)
@given(
    c=conv_cases(nsp=2),
    algo=st.sampled_from(_ALGOS),
    n=st.integers(0, 7),
    threads=st.integers(1, 3),
    chunk=st.sampled_from([1, 2000, 1 << 20]),
    dtype=st.sampled_from([np.float32, np.float32, np.float64, np.float16]),
    sgemm_on=st.booleans(),
)
def test_algorithms_match_float64(c, algo, n, threads, chunk, dtype, sgemm_on):
    # thread pipelines (n >= threads) or one shared chunk loop, one or several chunks per
    # thread (a short last one), float16 staged through float32; the forward pipelines'
    # products in sgemm or NumPy's matmul
    kind, name = algo
    c = dict(c, n=n)
    x, w, dy = _arrays(c, dtype)
    out = np.full((x if kind == "backward_data" else dy).shape, np.nan, dtype)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv_im2col, "SGEMM", sgemm_on)
        mp.setattr(parallel, "num_threads", lambda: threads)
        mp.setattr(conv_common, "CACHE_CHUNK_BYTES", chunk)
        mp.setattr(conv_bwd_data, "BAND_MAX_POSITIONS", 0)
        fn = _bind(kind, name, c, x, w, dy, out)
        if fn is None:
            return
        fn()
    np.testing.assert_allclose(out, _ref(kind, c, x, w, dy), **_tol(dtype))


@pytest.mark.parametrize("kind,name", _ALGOS)
def test_non_contiguous_operands(kind, name):
    c = dict(n=4, g=2, icg=3, ocg=2, fshape=(3, 2), stride=(1, 1), pad=(1, 1), dilate=(1, 2),
             sshape=(7, 6), flip=True, seed=5)  # fmt: skip
    c["oshape"] = _oshape(c)
    x, w, dy = _arrays(c)

    def strided(a):  # every other element of a twice-wider array
        big = np.full(a.shape[:-1] + (2 * a.shape[-1],), np.nan, a.dtype)
        big[..., ::2] = a
        return big[..., ::2]

    out_base = np.full((x if kind == "backward_data" else dy).shape[:-1] + (99,), 7.0, np.float32)
    out = out_base[..., 1 : 1 + (x if kind == "backward_data" else dy).shape[-1]]
    fn = _bind(kind, name, c, strided(x), strided(w), strided(dy), out)
    if fn is None:
        pytest.skip(f"{name} does not apply")
    fn()
    np.testing.assert_allclose(out, _ref(kind, c, x, w, dy), rtol=RTOL, atol=ATOL)
    assert (out_base[..., 0] == 7).all() and (out_base[..., 1 + out.shape[-1] :] == 7).all()


@pytest.mark.parametrize("kind,name", _ALGOS)
@pytest.mark.parametrize("n", [1, 5])
def test_workspace_is_written_before_read_and_nothing_is_allocated(kind, name, n):
    c = dict(n=n, g=2, icg=2, ocg=3, fshape=(3, 3), stride=(1, 1), pad=(1, 1), dilate=(1, 1),
             sshape=(6, 5), flip=False, seed=11)  # fmt: skip
    c["oshape"] = _oshape(c)
    x, w, dy = _arrays(c)
    out = np.empty((x if kind == "backward_data" else dy).shape, np.float32)
    want = _ref(kind, c, x, w, dy)
    for threads in (2, 1):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(parallel, "num_threads", lambda threads=threads: threads)
            mp.setattr(conv_common, "CACHE_CHUNK_BYTES", 2000)  # several chunks per thread
            fn, buf = _carved(lambda: _bind(kind, name, c, x, w, dy, out))
        assert buf.nbytes > 1  # the columns are workspace
        for _ in range(2):
            buf[:] = 0xFF  # NaN as float32
            fn()
            np.testing.assert_allclose(out, want, rtol=RTOL, atol=ATOL)
    # on one thread (no pool hand-over objects), NumPy's allocations are traced: none
    assert_allocates_nothing(fn)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("threads", [1, 2])
def test_forward_in_blocks_of_output_rows_matches_float64(dtype, threads):
    # one sample's columns over the cache limit: blocks of 2 output rows (a short last one)
    c = dict(n=2, g=2, icg=2, ocg=3, fshape=(3, 3), stride=(1, 2), pad=(1, 1), dilate=(1, 1),
             sshape=(9, 12), flip=True, seed=3)  # fmt: skip
    c["oshape"] = _oshape(c)
    x, w, dy = _arrays(c, dtype)
    per_row = 2 * 2 * 9 * c["oshape"][1] * 4
    y = np.full(dy.shape, np.nan, dtype)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(parallel, "num_threads", lambda: threads)
        mp.setattr(conv_common, "CACHE_CHUNK_BYTES", 2 * per_row)
        geo = conv_common._geometry("forward", x, w, y, *_geometry_of(c))
        units, _ = conv_im2col._forward_units(geo, np.dtype(np.float32))
        assert len(units) == 2 * 5 and units[4] == (0, 1, 8, 9)
        _bind("forward", "IM2COL_GEMM", c, x, w, dy, y)()
    np.testing.assert_allclose(y, ref_forward(c, x, w), **_tol(dtype))


def _geometry_of(c):
    return c["stride"], c["pad"], c["dilate"]


def test_runs_are_bitwise_reproducible_over_threads():
    # each chunk's GEMM runs on one thread with a chunk size fixed at bind time
    c = dict(n=6, g=1, icg=4, ocg=5, fshape=(3, 3), stride=(1, 1), pad=(1, 1), dilate=(1, 1),
             sshape=(8, 8), flip=False, seed=2)  # fmt: skip
    c["oshape"] = _oshape(c)
    x, w, dy = _arrays(c)
    got = []
    for threads in (2, 3, 3):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(parallel, "num_threads", lambda threads=threads: threads)
            mp.setattr(conv_common, "CACHE_CHUNK_BYTES", 1)  # one sample per chunk
            mp.setattr(conv_bwd_data, "BAND_MAX_POSITIONS", 0)
            y, gx = np.empty(dy.shape, np.float32), np.empty(x.shape, np.float32)
            _bind("forward", "IM2COL_GEMM", c, x, w, dy, y)()
            _bind("backward_data", "GEMM_COL2IM", c, x, w, dy, gx)()
        got.append((y, gx))
    for y, gx in got[1:]:
        assert np.array_equal(y, got[0][0]) and np.array_equal(gx, got[0][1])


@settings(max_examples=30, deadline=None)
@given(
    c=conv_cases(nsp=2),
    n=st.integers(1, 7),
    threads=st.integers(1, 3),
    band=st.sampled_from([1, 3000, 1 << 20]),
    dtype=st.sampled_from([np.float32, np.float64, np.float16]),
)
def test_col2im_bands_match_float64(c, n, threads, band, dtype):
    # a channel a band, a few, or all of them; the bands split over the threads; several
    # groups still run the chunk pipelines
    c = dict(c, n=n)
    x, w, dy = _arrays(c, dtype)
    gx = np.full(x.shape, np.nan, dtype)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(parallel, "num_threads", lambda: threads)
        mp.setattr(conv_bwd_data, "BAND_MAX_POSITIONS", 1 << 30)
        mp.setattr(conv_bwd_data, "BAND_BYTES", band)
        fn = _bind("backward_data", "GEMM_COL2IM", c, x, w, dy, gx)
        fn()
    np.testing.assert_allclose(gx, ref_backward_data(c, w, dy), **_tol(dtype))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_col2im_bands_write_their_workspace_before_reading_it(threads):
    c = dict(n=3, g=1, icg=5, ocg=4, fshape=(3, 3), stride=(2, 1), pad=(1, 1), dilate=(1, 1),
             sshape=(6, 5), flip=True, seed=12)  # fmt: skip
    c["oshape"] = _oshape(c)
    x, w, dy = _arrays(c)
    gx = np.empty(x.shape, np.float32)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(parallel, "num_threads", lambda: threads)
        mp.setattr(conv_bwd_data, "BAND_BYTES", 500)  # a channel or two a band
        fn, buf = _carved(lambda: _bind("backward_data", "GEMM_COL2IM", c, x, w, dy, gx))
    assert buf.nbytes > 1
    for _ in range(2):
        buf[:] = 0xFF  # NaN as float32
        fn()
        np.testing.assert_allclose(gx, ref_backward_data(c, w, dy), rtol=RTOL, atol=ATOL)
        first = gx.copy()
        fn()
        assert np.array_equal(gx, first)  # reproducible
    if threads == 1:  # no pool hand-over objects: NumPy's allocations are traced, none
        assert_allocates_nothing(fn)


def test_heuristic_prefers_col2im_to_the_forward_route_for_small_planes():
    def as_forward(n, c, h, oc, f, p):
        o = h + 2 * p - f + 1
        w = np.zeros((1, oc, c, f, f), np.float32)
        dy, x = np.zeros((n, oc, o, o), np.float32), np.zeros((n, c, h, h), np.float32)
        return conv_bwd_data.bwd_data_as_forward_preferred(w, dy, x, (1, 1), (p, p), (1, 1))

    assert not as_forward(128, 16, 14, 32, 3, 1)  # the CNN's second layer
    assert not as_forward(1, 256, 14, 256, 3, 1)  # 1.8 MB of columns
    assert as_forward(1, 64, 56, 64, 3, 1)  # 7.2 MB of columns


def test_gradients_through_the_operators_match_finite_differences():
    import megbrain.opr as O

    rng = np.random.default_rng(4)
    x = rng.uniform(-1, 1, (3, 4, 5, 6))
    w = rng.uniform(-1, 1, (3, 4, 3, 3))
    check_grad(lambda a, b: O.convolution(a, b, pad_h=1, pad_w=0, dilate_w=2), [x, w])
    check_grad(lambda a, b: O.convolution(a, b, stride_h=2, pad_h=2, pad_w=1), [x, w])
    grouped = rng.uniform(-1, 1, (2, 2, 2, 2, 2))
    check_grad(lambda a, b: O.convolution(a, b, sparse="GROUP", pad_w=1), [x, grouped])


def test_training_shapes_match_float64():
    # the CNN's second layer, at a reduced batch: forward, backward data and filter
    c = dict(n=6, g=1, icg=16, ocg=32, fshape=(3, 3), stride=(1, 1), pad=(1, 1), dilate=(1, 1),
             sshape=(14, 14), flip=False, seed=9)  # fmt: skip
    c["oshape"] = _oshape(c)
    x, w, dy = _arrays(c)
    geom = (c["stride"], c["pad"], c["dilate"])
    y, gx, gw = (np.empty(a.shape, np.float32) for a in (dy, x, w))
    _bind("forward", "IM2COL_GEMM", c, x, w, dy, y)()
    _bind("backward_data", "GEMM_COL2IM", c, x, w, dy, gx)()
    conv_binds.bind_conv_backward_filter(x, dy, gw, *geom)()
    np.testing.assert_allclose(y, ref_forward(c, x, w), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(gx, ref_backward_data(c, w, dy), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(gw, ref_backward_filter(c, x, dy, w.shape), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_filter_matrix_larger_than_the_cache_chunk_takes_a_share_of_the_batch(threads):
    # the deep layers' shape (many channels, few positions): one GEMM per thread's share of
    # the batch rather than one per cache-sized chunk, forward and backward data alike
    c = dict(n=7, g=1, icg=32, ocg=64, fshape=(3, 3), stride=(1, 1), pad=(1, 1), dilate=(1, 1),
             sshape=(4, 4), flip=False, seed=13)  # fmt: skip
    c["oshape"] = _oshape(c)
    x, w, dy = _arrays(c)
    y, gx = np.full(dy.shape, np.nan, np.float32), np.full(x.shape, np.nan, np.float32)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(parallel, "num_threads", lambda: threads)
        mp.setattr(conv_common, "CACHE_CHUNK_BYTES", 4096)  # the filter matrix is 72 KB
        mp.setattr(conv_bwd_data, "BAND_MAX_POSITIONS", 0)
        geo = conv_common._geometry("forward", x, w, y, *_geometry_of(c))
        share = -(-7 // threads) * 32 * 9 * 16 * 4  # a thread's samples' columns
        assert geo.pipeline_chunk_bytes(np.dtype(np.float32)) == min(64 * 32 * 9 * 4, share)
        _bind("forward", "IM2COL_GEMM", c, x, w, dy, y)()
        _bind("backward_data", "GEMM_COL2IM", c, x, w, dy, gx)()
    np.testing.assert_allclose(y, ref_forward(c, x, w), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(gx, ref_backward_data(c, w, dy), rtol=RTOL, atol=ATOL)
