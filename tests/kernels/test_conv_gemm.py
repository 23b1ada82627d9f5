"""The GEMM convolutions' compiled loops (megbrain.kernels.conv_gemm_loops) and the
algorithms built on them, against NumPy and float64 references."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from megbrain.kernels import conv_gemm_loops, dnn_conv


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


def _oshape(g):
    return tuple(
        dnn_conv.conv_out_size(*a)
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


@settings(max_examples=80, deadline=None)
@given(g=geometries(), dtype=st.sampled_from([np.float32, np.float64]))
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
