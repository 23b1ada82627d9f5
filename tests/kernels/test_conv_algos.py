"""The convolution kernels' algorithms against a float64 reference.

Every GEMM algorithm of megbrain.kernels.conv (batch-inner im2col + one GEMM per chunk or one
GEMM per sample for the forward pass; backward data as a forward convolution or as GEMM +
col2im; backward filter as columns @ channel-last diff) and pooling backward is checked on
drawn shapes, strides, paddings, dilations, groups and modes, within rtol 1e-4 / atol 1e-5 of
float64 with inputs in [-1, 1]; batch chunking and the workspace contract (every workspace
byte written before it is read) are checked too.
"""

from __future__ import annotations

import itertools
import math
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megbrain.kernels import workspace
from megbrain.kernels.conv import binds as conv_binds
from megbrain.kernels.conv import bwd_data as conv_bwd_data
from megbrain.kernels.conv import common as conv_common
from megbrain.kernels.conv import im2col as conv_im2col
from megbrain.kernels.pool import binds as dnn_pool

RTOL, ATOL = 1e-4, 1e-5


# ---- float64 reference ---------------------------------------------------------------------
def _taps(c):
    """(filter offset f, source slices) per filter offset: the slices take, for every output
    position at once, the source element that offset multiplies."""
    for f in itertools.product(*(range(k) for k in c["fshape"])):
        yield f, tuple(
            slice(fi * d, fi * d + (o - 1) * t + 1, t)
            for fi, d, o, t in zip(f, c["dilate"], c["oshape"], c["stride"])
        )


def _grouped(a, g):
    """(N, g * k, *plane) -> (N, g, k, *plane)."""
    return a.reshape(a.shape[0], g, a.shape[1] // g, *a.shape[2:])


def _ref_filter(c, w):
    w = w.astype(np.float64)
    return w[(..., *([slice(None, None, -1)] * len(c["fshape"])))] if c["flip"] else w


def assert_allocates_nothing(fn) -> None:
    """One more call of ``fn`` (already run once: compiled, caches filled) allocates no
    memory that NumPy traces (on one thread: the pool's hand-over objects would count)."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        fn()
        assert tracemalloc.get_traced_memory()[1] - before < 4096
    finally:
        tracemalloc.stop()


def ref_forward(c, x, w):
    g = w.shape[0]
    wr = _ref_filter(c, w)
    xp = _grouped(np.pad(x.astype(np.float64), [(0, 0), (0, 0)] + [(p, p) for p in c["pad"]]), g)
    out = np.zeros((x.shape[0], g, w.shape[1], *c["oshape"]))
    for f, s in _taps(c):
        out += np.einsum("ngc...,goc->ngo...", xp[(..., *s)], wr[(..., *f)])
    return out.reshape(x.shape[0], g * w.shape[1], *c["oshape"])


def ref_backward_data(c, w, dy):
    g, _, icg = w.shape[:3]
    wr = _ref_filter(c, w)
    spad = [s + 2 * p for s, p in zip(c["sshape"], c["pad"])]
    gp = np.zeros((dy.shape[0], g, icg, *spad))
    d = _grouped(dy.astype(np.float64), g)
    for f, s in _taps(c):
        gp[(..., *s)] += np.einsum("ngo...,goc->ngc...", d, wr[(..., *f)])
    gp = gp.reshape(dy.shape[0], g * icg, *spad)
    return gp[(slice(None), slice(None), *(slice(p, p + s) for p, s in zip(c["pad"], c["sshape"])))]


def ref_backward_filter(c, x, dy, wshape):
    g = wshape[0]
    xp = _grouped(np.pad(x.astype(np.float64), [(0, 0), (0, 0)] + [(p, p) for p in c["pad"]]), g)
    d = _grouped(dy.astype(np.float64), g)
    d = d.reshape(*d.shape[:3], math.prod(d.shape[3:]))
    gw = np.zeros(wshape)
    for f, s in _taps(c):
        xs = xp[(..., *s)]
        gw[(..., *f)] = np.einsum("ngop,ngcp->goc", d, xs.reshape(*xs.shape[:3], d.shape[3]))
    return _ref_filter(c, gw) if c["flip"] else gw


def test_reference_is_the_adjoint():
    # <conv(x, w), dy> = <x, bwd_data(w, dy)> = <w, bwd_filter(x, dy)>
    rng = np.random.default_rng(3)
    c = dict(fshape=(2, 3), stride=(2, 1), pad=(1, 0), dilate=(1, 2), flip=True, sshape=(5, 7))
    c["oshape"] = tuple(
        conv_common.conv_out_size(*a) for a in zip(c["sshape"], c["fshape"], c["stride"],
                                                c["pad"], c["dilate"])
    )  # fmt: skip
    x = rng.uniform(-1, 1, (2, 4, *c["sshape"]))
    w = rng.uniform(-1, 1, (2, 3, 2, *c["fshape"]))
    dy = rng.uniform(-1, 1, (2, 6, *c["oshape"]))
    lhs = np.sum(ref_forward(c, x, w) * dy)
    assert np.isclose(lhs, np.sum(x * ref_backward_data(c, w, dy)))
    assert np.isclose(lhs, np.sum(w * ref_backward_filter(c, x, dy, w.shape)))


# ---- cases ---------------------------------------------------------------------------------
@st.composite
def conv_cases(draw, nsp=None):
    nsp = draw(st.sampled_from([1, 2, 2, 3])) if nsp is None else nsp
    fshape = tuple(draw(st.lists(st.integers(1, 3), min_size=nsp, max_size=nsp)))
    stride = tuple(draw(st.lists(st.integers(1, 2), min_size=nsp, max_size=nsp)))
    dilate = tuple(draw(st.lists(st.integers(1, 2), min_size=nsp, max_size=nsp)))
    pad = tuple(draw(st.integers(0, f)) for f in fshape)
    sshape = tuple(
        draw(st.integers(max(1, d * (f - 1) + 1 - 2 * p), 6))
        for f, d, p in zip(fshape, dilate, pad)
    )
    oshape = tuple(
        conv_common.conv_out_size(*a) for a in zip(sshape, fshape, stride, pad, dilate)
    )
    return dict(
        n=draw(st.integers(1, 3)),
        g=draw(st.integers(1, 3)),
        icg=draw(st.integers(1, 3)),
        ocg=draw(st.integers(1, 3)),
        fshape=fshape,
        stride=stride,
        pad=pad,
        dilate=dilate,
        sshape=sshape,
        oshape=oshape,
        flip=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
    )


def _arrays(c, dtype=np.float32):
    rng = np.random.default_rng(c["seed"])
    x = rng.uniform(-1, 1, (c["n"], c["g"] * c["icg"], *c["sshape"])).astype(dtype)
    w = rng.uniform(-1, 1, (c["g"], c["ocg"], c["icg"], *c["fshape"])).astype(dtype)
    dy = rng.uniform(-1, 1, (c["n"], c["g"] * c["ocg"], *c["oshape"])).astype(dtype)
    return x, w, dy


def _geometry(c):
    return c["stride"], c["pad"], c["dilate"], c["flip"]


def _run_all(c, x, w, dy):
    y = np.full(dy.shape, np.nan, dy.dtype)
    gx = np.full(x.shape, np.nan, x.dtype)
    gw = np.full(w.shape, np.nan, w.dtype)
    conv_binds.bind_convolution(x, w, y, *_geometry(c))()
    conv_binds.bind_conv_backward_data(w, dy, gx, *_geometry(c))()
    conv_binds.bind_conv_backward_filter(x, dy, gw, *_geometry(c))()
    return y, gx, gw


def _check_all(c, x, w, dy, got):
    y, gx, gw = got
    np.testing.assert_allclose(y, ref_forward(c, x, w), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(gx, ref_backward_data(c, w, dy), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(gw, ref_backward_filter(c, x, dy, w.shape), rtol=RTOL, atol=ATOL)


# ---- tests ---------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(c=conv_cases())
def test_forward_and_gradients_match_float64(c):
    x, w, dy = _arrays(c)
    _check_all(c, x, w, dy, _run_all(c, x, w, dy))


@settings(max_examples=30, deadline=None)
@given(c=conv_cases(nsp=2), as_forward=st.booleans())
def test_both_backward_data_algorithms_match_float64(c, as_forward):
    # AS_FORWARD_MAX_GROWTH decides between the forward-convolution and the col2im algorithm
    x, w, dy = _arrays(c)
    gx = np.full(x.shape, np.nan, x.dtype)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv_bwd_data, "AS_FORWARD_MAX_GROWTH", math.inf if as_forward else 0.0)
        conv_binds.bind_conv_backward_data(w, dy, gx, *_geometry(c))()
    np.testing.assert_allclose(gx, ref_backward_data(c, w, dy), rtol=RTOL, atol=ATOL)


@settings(max_examples=30, deadline=None)
@given(c=conv_cases(), per_sample=st.booleans())
def test_both_forward_algorithms_match_float64(c, per_sample):
    # PER_SAMPLE_MAX_K decides between per-sample GEMMs and one GEMM per batch chunk
    x, w, dy = _arrays(c)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv_im2col, "PER_SAMPLE_MAX_K", math.inf if per_sample else 0)
        got = _run_all(c, x, w, dy)
    _check_all(c, x, w, dy, got)


def test_as_forward_choice():
    def geo(sshape, fshape, stride, pad):
        oshape = tuple(
            conv_common.conv_out_size(s, f, t, p, 1)
            for s, f, t, p in zip(sshape, fshape, stride, pad)
        )
        return conv_common._Conv(
            "t", (1, 1, *sshape), (1, 1, 1, *fshape), (1, 1, *oshape), stride, pad, (1, 1)
        )

    assert conv_bwd_data._as_forward(geo((8, 8), (3, 3), (1, 1), (1, 1))) == (1, 1)  # "same"
    assert conv_bwd_data._as_forward(geo((12, 12), (5, 5), (1, 1), (0, 0))) is None  # "valid"
    assert conv_bwd_data._as_forward(geo((8, 8), (3, 3), (2, 2), (1, 1))) is None  # strided
    assert conv_bwd_data._as_forward(geo((4, 4), (1, 1), (1, 1), (1, 1))) is None  # pad > F - 1


@settings(max_examples=15, deadline=None)
@given(c=conv_cases(nsp=2), seed=st.integers(0, 100))
def test_batch_chunks_match_float64(c, seed):
    c = dict(c, n=2 + seed % 4)
    x, w, dy = _arrays(c)
    per_sample = c["g"] * c["icg"] * math.prod(c["fshape"]) * math.prod(c["oshape"]) * 4
    with pytest.MonkeyPatch.context() as mp:
        # one or two samples per chunk, so that a short last chunk occurs
        mp.setattr(conv_common, "COL_BUFFER_LIMIT", per_sample * (1 + seed % 2))
        got = _run_all(c, x, w, dy)
    _check_all(c, x, w, dy, got)


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_other_dtypes(dtype):
    c = dict(n=2, g=2, icg=3, ocg=2, fshape=(3, 3), stride=(1, 2), pad=(1, 1), dilate=(1, 1),
             sshape=(5, 6), flip=False, seed=7)  # fmt: skip
    c["oshape"] = tuple(
        conv_common.conv_out_size(*a)
        for a in zip(c["sshape"], c["fshape"], c["stride"], c["pad"], c["dilate"])
    )
    x, w, dy = _arrays(c, dtype)
    y, gx, gw = _run_all(c, x, w, dy)
    tol = dict(rtol=RTOL, atol=ATOL) if dtype == np.float64 else dict(rtol=2e-3, atol=2e-2)
    np.testing.assert_allclose(y, ref_forward(c, x, w), **tol)
    np.testing.assert_allclose(gx, ref_backward_data(c, w, dy), **tol)
    np.testing.assert_allclose(gw, ref_backward_filter(c, x, dy, w.shape), **tol)


def _carved(bind):
    """Bind with the workspace carved from one buffer (as the executor does); returns the
    callable and the buffer, so that a test can overwrite it between runs."""
    rec = workspace.Recorder()
    with workspace.allocating(rec):
        bind()
    buf = np.empty(max(rec.nbytes, 1), np.uint8)
    with workspace.allocating(workspace.Carver(buf)):
        fn = bind()
    return fn, buf


@pytest.mark.parametrize("pad,stride", [((1, 1), (1, 1)), ((0, 2), (2, 1))])
def test_workspace_is_written_before_read(pad, stride):
    # poisoning the workspace between runs must not change any result
    c = dict(n=3, g=2, icg=2, ocg=3, fshape=(3, 3), stride=stride, pad=pad, dilate=(1, 1),
             sshape=(6, 5), flip=True, seed=11)  # fmt: skip
    c["oshape"] = tuple(
        conv_common.conv_out_size(*a)
        for a in zip(c["sshape"], c["fshape"], c["stride"], c["pad"], c["dilate"])
    )
    x, w, dy = _arrays(c)
    y, gx, gw = (np.empty(a.shape, np.float32) for a in (dy, x, w))
    binds = [
        lambda: conv_binds.bind_convolution(x, w, y, *_geometry(c)),
        lambda: conv_binds.bind_conv_backward_data(w, dy, gx, *_geometry(c)),
        lambda: conv_binds.bind_conv_backward_filter(x, dy, gw, *_geometry(c)),
    ]
    carved = [_carved(b) for b in binds]
    assert all(buf.nbytes > 1 for _, buf in carved)  # each declares a workspace
    for _ in range(2):
        for fn, buf in carved:
            buf[:] = 0xFF  # NaN as float32
            fn()
        _check_all(c, x, w, dy, (y, gx, gw))


def test_empty_batch_gives_zero_filter_gradient():
    x = np.zeros((0, 2, 4, 4), np.float32)
    dy = np.zeros((0, 3, 4, 4), np.float32)
    gw = np.full((1, 3, 2, 3, 3), np.nan, np.float32)
    conv_binds.bind_conv_backward_filter(x, dy, gw, (1, 1), (1, 1), (1, 1))()
    assert not gw.any()


# ---- pooling backward ----------------------------------------------------------------------
def ref_pooling_backward(x, y, dy, mode, window, stride, pad):
    """Per window: MAX sends dy to every element equal to the maximum; the average modes
    spread dy / divisor (the window size, or its non-padding count)."""
    gx = np.zeros(x.shape)
    for o in itertools.product(*(range(k) for k in dy.shape[2:])):
        lo = [oi * t - p for oi, t, p in zip(o, stride, pad)]
        sl = tuple(
            slice(max(lo_, 0), min(lo_ + w, s)) for lo_, w, s in zip(lo, window, x.shape[2:])
        )
        idx = (slice(None), slice(None), *sl)
        d = dy[(slice(None), slice(None), *o)].astype(np.float64)
        if mode == "MAX":
            hit = x[idx] == y[(slice(None), slice(None), *o)][(...,) + (None,) * len(o)]
            gx[idx] += hit * d[(...,) + (None,) * len(o)]
        else:
            count = math.prod(window) if mode == "AVERAGE" else math.prod(
                s.stop - s.start for s in sl
            )
            gx[idx] += (d / count)[(...,) + (None,) * len(o)]
    return gx


@settings(max_examples=40, deadline=None)
@given(
    nsp=st.integers(1, 3),
    data=st.data(),
    mode=st.sampled_from(dnn_pool.POOLING_MODES),
    tiled=st.booleans(),
)
def test_pooling_backward_matches_float64(nsp, data, mode, tiled):
    window = tuple(data.draw(st.lists(st.integers(1, 3), min_size=nsp, max_size=nsp)))
    if tiled:  # non-overlapping windows, each source element in at most one
        stride, pad = window, (0,) * nsp
    else:
        stride = tuple(data.draw(st.lists(st.integers(1, 3), min_size=nsp, max_size=nsp)))
        pad = tuple(data.draw(st.integers(0, w - 1)) for w in window)
    sshape = tuple(data.draw(st.integers(max(1, w - 2 * p), 7)) for w, p in zip(window, pad))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    # few distinct values, so that MAX windows have ties
    x = rng.integers(-2, 3, (2, 3, *sshape)).astype(np.float32) / 2
    y = np.empty((2, 3, *(dnn_pool.pool_out_size(*a) for a in zip(sshape, window, stride, pad))),
                 np.float32)  # fmt: skip
    dnn_pool.bind_pooling(x, y, mode, window, stride, pad)()
    dy = rng.uniform(-1, 1, y.shape).astype(np.float32)
    gx = np.full(x.shape, np.nan, np.float32)
    dnn_pool.bind_pooling_backward(x, y, dy, gx, mode, window, stride, pad)()
    want = ref_pooling_backward(x, y, dy, mode, window, stride, pad)
    np.testing.assert_allclose(gx, want, rtol=RTOL, atol=ATOL)


def test_pooling_backward_into_strided_grad():
    # a non-contiguous gradient and an uncovered border (7 = 3 * 2 + 1)
    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, (2, 3, 7, 6)).astype(np.float32)
    y = np.empty((2, 3, 3, 3), np.float32)
    dnn_pool.bind_pooling(x, y, "MAX", (2, 2), (2, 2), (0, 0))()
    dy = rng.uniform(-1, 1, y.shape).astype(np.float32)
    base = np.full((2, 6, 7, 6), np.nan, np.float32)
    gx = base[:, ::2]
    dnn_pool.bind_pooling_backward(x, y, dy, gx, "MAX", (2, 2), (2, 2), (0, 0))()
    want = ref_pooling_backward(x, y, dy, "MAX", (2, 2), (2, 2), (0, 0))
    np.testing.assert_allclose(gx, want, rtol=RTOL, atol=ATOL)
    assert np.isnan(base[:, 1::2]).all()
