"""Convolution, deconvolution, ConvBias, Convolution3D and pooling operators: forward against
naive NumPy references, static shapes, gradients by finite differences, and bad inputs."""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from opr_harness import check_grad, check_opr, inputs, make_graph, run

from megbrain.errors import MegBrainError
from megbrain.kernels.conv import common as conv_common
from megbrain.kernels.pool import binds as dnn_pool
from megbrain.opr import make_immutable
from megbrain.opr.base import create_opr
from megbrain.opr.dnn import (
    ConvolutionParam,
    convolution,
    convolution3d,
    deconvolution,
    deconvolution3d,
)
from megbrain.opr.dnn_conv_bias import conv_bias_activation
from megbrain.opr.dnn_pool import PoolingParam, pooling


# ---- naive references (float64, slicing per filter offset) ---------------------------------
def _grouped(w, groups):
    """A dense (OC, IC, *F) filter as (1, OC, IC, *F); a grouped one unchanged."""
    return w if groups else w[None]


def _out_size(s, f, stride, pad, dil):
    return (s + 2 * pad - dil * (f - 1) - 1) // stride + 1


def _offset_index(f, dil, stride, oshape):
    return tuple(
        slice(fi * d, fi * d + s * (o - 1) + 1, s) for fi, d, s, o in zip(f, dil, stride, oshape)
    )


def ref_conv(x, w, stride, pad, dil, group=False, flip=False):
    """out[n, o, *p] = sum_{c, f} xpad[n, c, *(p * stride + f * dil)] * w[o, c, *f]."""
    x, w = np.asarray(x, np.float64), _grouped(np.asarray(w, np.float64), group)
    nsp = x.ndim - 2
    if flip:
        w = w[(..., *([slice(None, None, -1)] * nsp))]
    g, ocg, icg = w.shape[:3]
    fshape = w.shape[3:]
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in pad])
    oshape = [_out_size(*a) for a in zip(x.shape[2:], fshape, stride, pad, dil)]
    out = np.zeros((x.shape[0], g * ocg, *oshape))
    for gi in range(g):
        for f in np.ndindex(*fshape):
            patch = xp[
                (
                    slice(None),
                    slice(gi * icg, (gi + 1) * icg),
                    *_offset_index(f, dil, stride, oshape),
                )
            ]
            wf = w[(gi, slice(None), slice(None), *f)]
            out[:, gi * ocg : (gi + 1) * ocg] += np.einsum("oc,nc...->no...", wf, patch)
    return out


def ref_deconv(dy, w, stride, pad, dil, group=False, out_spatial=None):
    """The adjoint of ref_conv: scatter every output's contribution back to the input."""
    dy, w = np.asarray(dy, np.float64), _grouped(np.asarray(w, np.float64), group)
    g, ocg, icg = w.shape[:3]
    fshape = w.shape[3:]
    oshape = dy.shape[2:]
    if out_spatial is None:
        out_spatial = [
            (o - 1) * s + d * (f - 1) + 1 - 2 * p
            for o, f, s, p, d in zip(oshape, fshape, stride, pad, dil)
        ]
    xp = np.zeros((dy.shape[0], g * icg, *[s + 2 * p for s, p in zip(out_spatial, pad)]))
    for gi in range(g):
        for f in np.ndindex(*fshape):
            idx = (
                slice(None),
                slice(gi * icg, (gi + 1) * icg),
                *_offset_index(f, dil, stride, oshape),
            )
            wf = w[(gi, slice(None), slice(None), *f)]
            xp[idx] += np.einsum("oc,no...->nc...", wf, dy[:, gi * ocg : (gi + 1) * ocg])
    return xp[(slice(None), slice(None), *[slice(p, p + s) for p, s in zip(pad, out_spatial)])]


def ref_pool(x, mode, window, stride, pad):
    """Direct loops over output positions; windows clipped to the input."""
    n, c, h, w = x.shape
    oh, ow = [(s + 2 * p - f) // t + 1 for s, p, f, t in zip((h, w), pad, window, stride)]
    out = np.empty((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            h0, w0 = i * stride[0] - pad[0], j * stride[1] - pad[1]
            win = x[:, :, max(h0, 0) : h0 + window[0], max(w0, 0) : w0 + window[1]]
            if mode == "MAX":
                out[:, :, i, j] = win.max(axis=(2, 3))
            elif mode == "AVERAGE":
                out[:, :, i, j] = win.sum(axis=(2, 3)) / (window[0] * window[1])
            else:
                out[:, :, i, j] = win.mean(axis=(2, 3))
    return out


def _rand(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def test_reference_conv_is_the_definition():
    # the slicing reference against the textbook loops, on one grouped dilated strided case
    rng = np.random.default_rng(20)
    x, w = rng.standard_normal((2, 4, 6, 5)), rng.standard_normal((2, 3, 2, 2, 3))
    stride, pad, dil = (2, 1), (1, 2), (2, 1)
    want = np.zeros((2, 6, 3, 7))
    for n, o, i, j, c, fh, fw in np.ndindex(2, 6, 3, 7, 2, 2, 3):
        g, h, v = o // 3, i * stride[0] - pad[0] + fh * dil[0], j * stride[1] - pad[1] + fw * dil[1]
        if 0 <= h < 6 and 0 <= v < 5:
            want[n, o, i, j] += x[n, g * 2 + c, h, v] * w[g, o % 3, c, 1 - fh, 2 - fw]
    np.testing.assert_allclose(ref_conv(x, w, stride, pad, dil, True, flip=True), want)


# ---- convolution forward ---------------------------------------------------------------------
@st.composite
def conv_cases(draw):
    groups = draw(st.integers(1, 2))
    case = dict(
        n=draw(st.integers(1, 2)),
        groups=groups,
        group=groups > 1 or draw(st.booleans()),
        icg=draw(st.integers(1, 3)),
        ocg=draw(st.integers(1, 3)),
        fshape=(draw(st.integers(1, 3)), draw(st.integers(1, 3))),
        stride=(draw(st.integers(1, 2)), draw(st.integers(1, 3))),
        pad=(draw(st.integers(0, 2)), draw(st.integers(0, 1))),
        dil=(draw(st.integers(1, 2)), draw(st.integers(1, 2))),
        sshape=(draw(st.integers(1, 8)), draw(st.integers(1, 8))),
        mode=draw(st.sampled_from(["CROSS_CORRELATION", "CONVOLUTION"])),
    )
    oshape = [
        _out_size(*a)
        for a in zip(case["sshape"], case["fshape"], case["stride"], case["pad"], case["dil"])
    ]
    assume(min(oshape) > 0)
    return case


def _conv_kw(c):
    return dict(
        mode=c["mode"],
        pad_h=c["pad"][0],
        pad_w=c["pad"][1],
        stride_h=c["stride"][0],
        stride_w=c["stride"][1],
        dilate_h=c["dil"][0],
        dilate_w=c["dil"][1],
        sparse="GROUP" if c["group"] else "DENSE",
    )


def _filter_shape(c):
    dense = (c["groups"] * c["ocg"], c["icg"], *c["fshape"])
    return (c["groups"], c["ocg"], c["icg"], *c["fshape"]) if c["group"] else dense


@settings(max_examples=40, deadline=None, derandomize=True)
@given(c=conv_cases())
def test_convolution_matches_reference(c):
    rng = np.random.default_rng(0)
    x = _rand(rng, c["n"], c["groups"] * c["icg"], *c["sshape"])
    w = _rand(rng, *_filter_shape(c))
    kw = _conv_kw(c)
    (got,) = check_opr(
        lambda a, b: convolution(a, b, **kw),
        lambda a, b: ref_conv(
            a, b, c["stride"], c["pad"], c["dil"], c["group"], c["mode"] == "CONVOLUTION"
        ),
        [x, w],
        rtol=1e-4,
        atol=1e-5,
    )
    assert got.dtype == np.float32


@settings(max_examples=20, deadline=None, derandomize=True)
@given(c=conv_cases())
def test_deconvolution_matches_reference(c):
    rng = np.random.default_rng(1)
    oshape = [_out_size(*a) for a in zip(c["sshape"], c["fshape"], c["stride"], c["pad"], c["dil"])]
    dy = _rand(rng, c["n"], c["groups"] * c["ocg"], *oshape)
    w = _rand(rng, *_filter_shape(c))
    deduced = [
        (o - 1) * s + d * (f - 1) + 1 - 2 * p
        for o, f, s, p, d in zip(oshape, c["fshape"], c["stride"], c["pad"], c["dil"])
    ]
    assume(min(deduced) > 0)
    kw = _conv_kw(c)
    flip = (..., slice(None, None, -1), slice(None, None, -1))
    check_opr(
        lambda a, b: deconvolution(a, b, **kw),
        lambda a, b: ref_deconv(
            a,
            b[flip] if c["mode"] == "CONVOLUTION" else b,
            c["stride"],
            c["pad"],
            c["dil"],
            c["group"],
        ),
        [dy, w],
        rtol=1e-4,
        atol=1e-5,
    )


def test_deconvolution_with_output_shape_input():
    # stride 2 maps input widths 7 and 8 to the same output: the third input picks 8
    rng = np.random.default_rng(2)
    x = _rand(rng, 2, 3, 8, 8)
    w = _rand(rng, 4, 3, 3, 3)
    dy = _rand(rng, 2, 4, 3, 3)
    param = ConvolutionParam(stride_h=2, stride_w=2)

    def build(d, f, src):
        return create_opr("ConvolutionBackwardData", [f.node, d.node, src.node], param, None)[0]

    (got,) = check_opr(
        build,
        lambda d, f, s: ref_deconv(d, f, (2, 2), (0, 0), (1, 1), out_spatial=(8, 8)),
        [dy, w, x],
    )
    assert got.shape == (2, 3, 8, 8)
    # without it the deduced width is 7
    g = make_graph()
    (d, f), _ = inputs(g, dy, w)
    assert deconvolution(d, f, stride_h=2, stride_w=2).imm_shape == (2, 3, 7, 7)


def test_convolution_float16_computes_in_float32():
    rng = np.random.default_rng(3)
    x, w = _rand(rng, 2, 4, 6, 6, dtype=np.float16), _rand(rng, 3, 4, 3, 3, dtype=np.float16)
    (got,) = check_opr(
        lambda a, b: convolution(a, b, pad_h=1),
        lambda a, b: ref_conv(a, b, (1, 1), (1, 0), (1, 1)),
        [x, w],
        rtol=1e-2,
        atol=1e-2,
    )
    assert got.dtype == np.float16


def test_convolution_reads_strided_inputs_and_enum_by_index():
    rng = np.random.default_rng(4)
    x, w = _rand(rng, 2, 3, 5, 7), _rand(rng, 4, 3, 2, 3)
    # a transposed (non-contiguous) src and filter; mode=1 is CONVOLUTION
    (got,) = check_opr(
        lambda a, b: convolution(
            a.dimshuffle(0, 1, 3, 2), b.dimshuffle(0, 1, 3, 2), mode=1, stride_w=2
        ),
        lambda a, b: ref_conv(
            a.transpose(0, 1, 3, 2), b.transpose(0, 1, 3, 2), (1, 2), (0, 0), (1, 1), flip=True
        ),
        [x, w],
        rtol=1e-4,
        atol=1e-5,
    )
    assert got.shape == (2, 4, 5, 2)


def test_convolution_batch_chunks(monkeypatch):
    # a column buffer limit below one sample forces one chunk per sample in all three kernels
    monkeypatch.setattr(conv_common, "COL_BUFFER_LIMIT", 1)
    rng = np.random.default_rng(5)
    x, w = _rand(rng, 3, 4, 6, 6), _rand(rng, 2, 2, 2, 3, 3)
    kw = dict(pad_h=1, pad_w=1, sparse="GROUP")
    check_opr(
        lambda a, b: convolution(a, b, **kw),
        lambda a, b: ref_conv(a, b, (1, 1), (1, 1), (1, 1), True),
        [x, w],
        rtol=1e-4,
        atol=1e-5,
    )
    check_grad(lambda a, b: convolution(a, b, **kw), [x[:, :, :4, :4], w])


@pytest.mark.parametrize("mode", ["IDENTITY", "RELU", "SIGMOID", "H_SWISH"])
@pytest.mark.parametrize("full_bias", [False, True])
def test_conv_bias_activation(mode, full_bias):
    rng = np.random.default_rng(6)
    x, w = _rand(rng, 2, 3, 6, 5), _rand(rng, 4, 3, 3, 3)
    b = _rand(rng, *((2, 4, 2, 3) if full_bias else (1, 4, 1, 1)))
    act = {
        "IDENTITY": lambda v: v,
        "RELU": lambda v: np.maximum(v, 0),
        "SIGMOID": lambda v: 1 / (1 + np.exp(-v)),
        "H_SWISH": lambda v: v * np.clip(v + 3, 0, 6) / 6,
    }[mode]
    check_opr(
        lambda a, f, c: conv_bias_activation(a, f, c, nonlineMode=mode, stride_h=2),
        lambda a, f, c: act(ref_conv(a, f, (2, 1), (0, 0), (1, 1)) + c),
        [x, w, b],
        rtol=1e-4,
        atol=1e-5,
    )


@pytest.mark.parametrize("group", [False, True])
def test_convolution3d_matches_reference(group):
    rng = np.random.default_rng(7)
    x = _rand(rng, 2, 4, 5, 6, 4)
    w = _rand(rng, *((2, 3, 2, 2, 3, 2) if group else (3, 4, 2, 3, 2)))
    kw = dict(pad_d=1, stride_h=2, dilate_w=2, sparse="GROUP" if group else "DENSE")
    check_opr(
        lambda a, b: convolution3d(a, b, **kw),
        lambda a, b: ref_conv(a, b, (1, 2, 1), (1, 0, 0), (1, 1, 2), group),
        [x, w],
        rtol=1e-4,
        atol=1e-5,
    )
    dy = _rand(rng, 2, 6 if group else 3, 6, 2, 2)
    check_opr(
        lambda d, b: deconvolution3d(d, b, **kw),
        lambda d, b: ref_deconv(d, b, (1, 2, 1), (1, 0, 0), (1, 1, 2), group, (5, 5, 4)),
        [dy, w],
        rtol=1e-4,
        atol=1e-5,
    )


# ---- pooling ---------------------------------------------------------------------------------
@st.composite
def pool_cases(draw):
    window = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    case = dict(
        mode=draw(st.sampled_from(list(dnn_pool.POOLING_MODES))),
        window=window,
        stride=(draw(st.integers(1, 3)), draw(st.integers(1, 2))),
        pad=(draw(st.integers(0, window[0] - 1)), draw(st.integers(0, window[1] - 1))),
        shape=(
            draw(st.integers(1, 2)),
            draw(st.integers(1, 3)),
            draw(st.integers(1, 7)),
            draw(st.integers(1, 7)),
        ),
    )
    assume(all(s + 2 * p >= f for s, p, f in zip(case["shape"][2:], case["pad"], window)))
    return case


def _pool_kw(c):
    (wh, ww), (sh, sw), (ph, pw) = c["window"], c["stride"], c["pad"]
    return dict(
        mode=c["mode"], window_h=wh, window_w=ww, stride_h=sh, stride_w=sw, pad_h=ph, pad_w=pw
    )


@settings(max_examples=40, deadline=None, derandomize=True)
@given(c=pool_cases())
def test_pooling_matches_reference(c):
    x = _rand(np.random.default_rng(8), *c["shape"])
    kw = _pool_kw(c)
    check_opr(
        lambda a: pooling(a, **kw),
        lambda a: ref_pool(a.astype(np.float64), c["mode"], c["window"], c["stride"], c["pad"]),
        [x],
    )


def test_pooling_defaults_and_float16():
    x = _rand(np.random.default_rng(9), 1, 2, 5, 4, dtype=np.float16)
    (got,) = check_opr(
        pooling, lambda a: ref_pool(a.astype(np.float64), "MAX", (2, 2), (2, 2), (0, 0)), [x]
    )
    assert got.shape == (1, 2, 2, 2) and got.dtype == np.float16


def test_max_pooling_gradient_goes_to_every_tied_maximum():
    x = np.array([[[[1.0, 3.0, 3.0], [0.0, 3.0, 2.0]]]], np.float32)

    def build(a):
        y = pooling(a, window_h=2, window_w=2, stride_h=1, stride_w=1)
        return y, _grad_of_sum(y, a)

    _, gx = check_opr(build, lambda a: ([[[[3.0, 3.0]]]], [[[[0, 2, 1], [0, 2, 0]]]]), [x])
    assert gx.dtype == np.float32


def _grad_of_sum(y, x):
    from megbrain.opr.grad import grad, sv

    return sv(grad(y.sum(), [x], warn_mid_wrt=False)[0])


# ---- gradients (float64, finite differences) -----------------------------------------------
@pytest.mark.parametrize(
    "kw, xshape, wshape",
    [
        (dict(pad_h=1, stride_w=2), (2, 2, 5, 5), (3, 2, 3, 3)),
        (dict(mode="CONVOLUTION", dilate_h=2, pad_w=1), (1, 2, 6, 4), (2, 2, 2, 3)),
        (dict(sparse="GROUP", stride_h=2, pad_h=1, pad_w=1), (1, 4, 5, 5), (2, 2, 2, 3, 2)),
        (dict(), (2, 3, 3, 4), (2, 3, 1, 1)),  # pointwise: no im2col
    ],
)
def test_convolution_grad(kw, xshape, wshape):
    rng = np.random.default_rng(10)
    check_grad(
        lambda a, b: convolution(a, b, **kw),
        [rng.standard_normal(xshape), rng.standard_normal(wshape)],
    )


@pytest.mark.parametrize("mode", ["IDENTITY", "RELU", "SIGMOID", "H_SWISH"])
def test_conv_bias_grad(mode):
    rng = np.random.default_rng(11)
    arrays = [
        rng.standard_normal((1, 2, 4, 4)),
        rng.standard_normal((3, 2, 3, 3)),
        rng.standard_normal((1, 3, 1, 1)),
    ]
    check_grad(lambda a, b, c: conv_bias_activation(a, b, c, nonlineMode=mode, pad_h=1), arrays)


def test_deconvolution_grad():
    rng = np.random.default_rng(12)
    arrays = [rng.standard_normal((1, 3, 3, 4)), rng.standard_normal((3, 2, 2, 3))]
    check_grad(lambda d, w: deconvolution(d, w, stride_h=2, pad_w=1, mode="CONVOLUTION"), arrays)


def test_backward_filter_grad_is_second_order():
    # the gradients of ConvolutionBackwardFilter are a deconvolution and a convolution
    rng = np.random.default_rng(13)
    x, dy, w = (
        rng.standard_normal((2, 2, 4, 4)),
        rng.standard_normal((2, 3, 2, 4)),
        np.zeros((3, 2, 3, 3)),
    )
    param = ConvolutionParam(pad_w=1)

    def build(a, d):
        wv = make_immutable("cpu0", a.node.graph, w, dtype=np.float64)
        return create_opr("ConvolutionBackwardFilter", [a.node, d.node, wv.node], param, None)[0]

    check_grad(build, [x, dy])


def test_convolution3d_grad():
    rng = np.random.default_rng(14)
    arrays = [rng.standard_normal((1, 2, 3, 4, 3)), rng.standard_normal((2, 2, 2, 2, 2))]
    check_grad(lambda a, b: convolution3d(a, b, pad_w=1, stride_h=2), arrays)


@pytest.mark.parametrize("mode", dnn_pool.POOLING_MODES)
def test_pooling_grad(mode):
    x = np.random.default_rng(15).standard_normal((1, 2, 5, 5))
    check_grad(lambda a: pooling(a, mode=mode, window_h=3, window_w=2, pad_h=1, stride_w=1), [x])


# ---- static shapes and bad inputs -----------------------------------------------------------
def test_static_shapes_before_running():
    g = make_graph()
    (x, w), _ = inputs(
        g, np.zeros((4, 6, 17, 9), np.float32), np.zeros((3, 4, 2, 3, 3), np.float32)
    )
    y = convolution(x, w, sparse="GROUP", stride_h=3, pad_w=2, dilate_w=2)
    assert y.imm_shape == (4, 12, 5, 9)
    assert pooling(y, mode="AVERAGE", window_h=3, pad_h=1).imm_shape == (4, 12, 3, 4)
    assert deconvolution(y, w, sparse="GROUP", stride_h=3, pad_w=2, dilate_w=2).imm_shape == (
        4,
        6,
        15,
        9,
    )
    assert y.owner_opr.name.startswith("conv(")
    (got,) = run([y], g)
    assert got.shape == (4, 12, 5, 9)


def _vars(*shapes, dtype=np.float32):
    g = make_graph()
    vs, _ = inputs(g, *[np.zeros(s, dtype) for s in shapes])
    return vs


@pytest.mark.parametrize(
    "build, shapes, message",
    [
        (
            lambda x, w: convolution(x, w),
            [(2, 3, 5, 5), (4, 2, 3, 3)],
            "channel mismatch: src {2,3,5,5} has 3 channels",
        ),
        (
            lambda x, w: convolution(x, w, format="NHWC"),
            [(2, 3, 5, 5), (4, 3, 3, 3)],
            "format NHWC is not supported",
        ),
        (
            lambda x, w: convolution(x, w, sparse="GROUP"),
            [(2, 3, 5, 5), (4, 3, 3, 3)],
            "needs a 5-d grouped",
        ),
        (
            lambda x, w: convolution(x, w, dilate_h=3),
            [(2, 3, 5, 5), (4, 3, 3, 3)],
            "smaller than the dilated filter",
        ),
        (
            lambda d, w: deconvolution(d, w),
            [(2, 5, 3, 3), (4, 3, 3, 3)],
            "channel mismatch: diff {2,5,3,3}",
        ),
        (
            lambda x, d, w: create_opr(
                "ConvolutionBackwardFilter", [x.node, d.node, w.node], ConvolutionParam(), None
            ),
            [(2, 3, 5, 5), (2, 4, 2, 3), (4, 3, 3, 3)],
            "not the diff shape {2,4,2,3}",
        ),
        (
            lambda x, w, b: conv_bias_activation(x, w, b),
            [(2, 3, 5, 5), (4, 3, 3, 3), (1, 3, 1, 1)],
            "bias {1,3,1,1} must be {1,4,1,1}",
        ),
        (
            lambda x, w: convolution3d(x, w),
            [(2, 3, 5, 5), (4, 3, 3, 3, 3)],
            "src must be 5-d (NCDHW)",
        ),
        (
            lambda x: pooling(x, pad_h=2),
            [(2, 3, 5, 5)],
            "padding (2, 0) must be smaller than the window",
        ),
        (
            lambda x, y, d: create_opr(
                "PoolingBackward", [x.node, y.node, d.node], PoolingParam(), None
            ),
            [(2, 3, 5, 5), (2, 3, 2, 2), (2, 3, 3, 2)],
            "must have the pooled shape {2,3,2,2}",
        ),
    ],
)
def test_bad_inputs_name_the_operator_and_shapes(build, shapes, message):
    with pytest.raises(MegBrainError) as info:
        build(*_vars(*shapes))
    assert message in str(info.value)
    assert "input 0: x" in str(info.value)


def test_bad_params_and_dtypes():
    x, w = _vars((1, 1, 3, 3), (1, 1, 2, 2))
    with pytest.raises(TypeError, match="convolution.*'stride'"):
        convolution(x, w, stride=2)
    with pytest.raises(MegBrainError, match="stride_h must be an int >= 1"):
        convolution(x, w, stride_h=0)
    with pytest.raises(MegBrainError, match="invalid mode"):
        pooling(x, mode="MIN")
    xi, wi = _vars((1, 1, 3, 3), (1, 1, 2, 2), dtype=np.int32)
    with pytest.raises(MegBrainError, match="only floating point"):
        convolution(xi, wi)
    with pytest.raises(MegBrainError, match="unsupported output dtype"):
        convolution(x, w, dtype="float16")
