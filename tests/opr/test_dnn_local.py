"""GroupLocal and Local (locally connected convolution): forward against a NumPy loop, static
shapes, gradients (first and second order) by finite differences, the reference's param
forms, and bad inputs."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opr_harness import check_grad, check_opr, inputs, make_graph, run

from megbrain.errors import MegBrainError
from megbrain.graph import infer_shape
from megbrain.opr import group_local, local, make_immutable
from megbrain.opr import param_defs as pdefs
from megbrain.opr.base import create_opr
from megbrain.opr.dnn import ConvolutionParam


def ref_group_local(src, filt, stride=(1, 1), pad=(0, 0)):
    """The definition, one output element at a time (float64)."""
    n, ic, ih, iw = src.shape
    g, oh, ow, icg, fh, fw, ocg = filt.shape
    out = np.zeros((n, g * ocg, oh, ow))
    for b in range(n):
        for gi in range(g):
            for o in range(ocg):
                for y in range(oh):
                    for x in range(ow):
                        acc = 0.0
                        for i in range(icg):
                            for a in range(fh):
                                for c in range(fw):
                                    yy = y * stride[0] - pad[0] + a
                                    xx = x * stride[1] - pad[1] + c
                                    if 0 <= yy < ih and 0 <= xx < iw:
                                        acc += (
                                            float(src[b, gi * icg + i, yy, xx])
                                            * filt[gi, y, x, i, a, c, o]
                                        )
                        out[b, gi * ocg + o, y, x] = acc
    return out


def _out(s, f, st, p):
    return (s + 2 * p - f) // st + 1


def _case(rng, n, g, icg, ocg, ih, iw, fh, fw, stride, pad, dtype=np.float32):
    oh, ow = _out(ih, fh, stride[0], pad[0]), _out(iw, fw, stride[1], pad[1])
    src = rng.standard_normal((n, g * icg, ih, iw)).astype(dtype)
    filt = rng.standard_normal((g, oh, ow, icg, fh, fw, ocg)).astype(dtype)
    return src, filt


def _kw(stride, pad):
    return {"stride_h": stride[0], "stride_w": stride[1], "pad_h": pad[0], "pad_w": pad[1]}


@settings(max_examples=20, deadline=None, derandomize=True)
@given(
    n=st.integers(1, 2),
    g=st.integers(1, 3),
    icg=st.integers(1, 3),
    ocg=st.integers(1, 3),
    ih=st.integers(3, 6),
    iw=st.integers(3, 6),
    fh=st.integers(1, 3),
    fw=st.integers(1, 3),
    stride=st.tuples(st.integers(1, 2), st.integers(1, 2)),
    pad=st.tuples(st.integers(0, 1), st.integers(0, 2)),
)
def test_group_local_matches_loop_reference(n, g, icg, ocg, ih, iw, fh, fw, stride, pad):
    rng = np.random.default_rng(n + 10 * g + 100 * ih + 1000 * iw)
    src, filt = _case(rng, n, g, icg, ocg, ih, iw, fh, fw, stride, pad)
    check_opr(
        lambda s, f: group_local(s, f, **_kw(stride, pad)),
        lambda s, f: ref_group_local(s, f, stride, pad),
        [src, filt],
        rtol=1e-5,
        atol=1e-5,
    )


def test_local_is_group_local_with_one_group():
    rng = np.random.default_rng(1)
    src, filt = _case(rng, 2, 1, 3, 4, 5, 4, 3, 2, (1, 2), (1, 0))
    check_opr(
        lambda s, f: local(s, f, stride_w=2, pad_h=1),
        lambda s, f: ref_group_local(s, f[None], (1, 2), (1, 0)),
        [src, filt[0]],
        rtol=1e-5,
        atol=1e-5,
    )


def test_group_local_float16_and_strided_input():
    rng = np.random.default_rng(2)
    wide = rng.standard_normal((2, 8, 5, 5)).astype(np.float16)
    filt = rng.standard_normal((2, 3, 3, 2, 3, 3, 2)).astype(np.float16)
    g = make_graph()
    (wv, fv), _ = inputs(g, wide, filt)
    out = group_local(wv[:, ::2], fv, pad_h=0, pad_w=0)  # a strided view of the input
    (got,) = run([out], g)
    assert got.dtype == np.float16
    want = ref_group_local(wide[:, ::2].astype(np.float64), filt.astype(np.float64))
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-2, atol=2e-2)


def test_static_shape_and_reference_param_forms():
    g = make_graph()
    (s, f), _ = inputs(
        g, np.ones((3, 4, 8, 5), np.float32), np.ones((2, 4, 3, 2, 3, 3, 5), np.float32)
    )
    out = group_local(s, f, stride_h=2, pad_h=1, name="lc")
    assert infer_shape(out.node) == (3, 10, 4, 3)
    assert out.node.owner.type_name == "GroupLocalForward" and out.node.owner.name == "lc"
    # a param-def object of the reference, and the enum member for the mode
    p = pdefs.Convolution(stride_h=2, pad_h=1, mode=pdefs.Convolution.Mode.CROSS_CORRELATION)
    same = group_local(s, f, param=p)
    assert same.node is out.node  # deduplicated: the same operator
    (lf,), _ = inputs(g, np.ones((4, 3, 4, 3, 3, 5), np.float32))
    assert infer_shape(local(s, lf, stride_h=2, pad_h=1).node) == (3, 5, 4, 3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'strategy'"):
        group_local(s, f, strategy="PROFILE")


@pytest.mark.parametrize("stride,pad", [((1, 1), (0, 0)), ((2, 1), (1, 2))])
def test_group_local_grad(stride, pad):
    rng = np.random.default_rng(3)
    src, filt = _case(rng, 2, 2, 2, 2, 4, 5, 2, 3, stride, pad, np.float64)
    check_grad(lambda s, f: group_local(s, f, **_kw(stride, pad)), [src, filt])


def test_local_grad():
    rng = np.random.default_rng(4)
    src, filt = _case(rng, 2, 1, 2, 3, 4, 4, 3, 2, (1, 1), (1, 0), np.float64)
    check_grad(lambda s, f: local(s, f, pad_h=1), [src, filt[0]])


@pytest.mark.parametrize("which", ["GroupLocalBackwardData", "GroupLocalBackwardFilter"])
def test_backward_operators_have_gradients(which):
    # second order: the gradients of the backward operators are forward/backward operators
    rng = np.random.default_rng(5)
    src, filt = _case(rng, 2, 2, 2, 1, 4, 4, 2, 2, (2, 1), (0, 1), np.float64)
    param = ConvolutionParam(stride_h=2, pad_w=1)
    diff = rng.standard_normal((2, 2, filt.shape[1], filt.shape[2]))

    if which == "GroupLocalBackwardData":

        def build(f, d):
            shp = make_immutable("cpu0", f.node.graph, src, dtype=np.float64)
            return create_opr(which, [f.node, d.node, shp.node], param, None)[0]

        arrays = [filt, diff]
    else:

        def build(s, d):
            shp = make_immutable("cpu0", s.node.graph, filt, dtype=np.float64)
            return create_opr(which, [s.node, d.node, shp.node], param, None)[0]

        arrays = [src, diff]
    check_grad(build, arrays)


@pytest.mark.parametrize(
    ("src", "filt", "kw", "message"),
    [
        ((2, 3, 5, 5), (1, 5, 5, 2, 1, 1, 4), {}, "channel mismatch: src {2,3,5,5} has 3"),
        ((2, 4, 5, 5), (2, 4, 4, 2, 3, 3, 1), {}, r"weights for 4x4 output positions.*3x3"),
        ((2, 4, 5, 5), (2, 5, 5, 2, 1, 1), {}, r"filter must be 7-d \(G, OH, OW"),
        ((2, 4, 5), (1, 3, 3, 4, 3, 3, 1), {}, "src must be 4-d"),
        ((1, 1, 2, 2), (1, 1, 1, 1, 3, 3, 1), {}, "smaller than the filter window 3x3"),
        ((2, 4, 5, 5), (1, 5, 5, 4, 1, 1, 1), {"mode": "CONVOLUTION"}, "CROSS_CORRELATION"),
        ((2, 4, 5, 5), (1, 3, 3, 4, 1, 1, 1), {"dilate_h": 2}, "dilation is not supported"),
        ((2, 4, 5, 5), (1, 5, 5, 4, 1, 1, 1), {"sparse": "GROUP"}, "sparse=GROUP"),
        ((2, 4, 5, 5), (1, 5, 5, 4, 1, 1, 1), {"format": "NHWC"}, "format NHWC"),
    ],
)
def test_bad_inputs_name_the_operator(src, filt, kw, message):
    g = make_graph()
    vs, _ = inputs(g, np.ones(src, np.float32), np.ones(filt, np.float32))
    with pytest.raises(MegBrainError, match=rf"GroupLocalForward 'lc'.*{message}"):
        group_local(*vs, name="lc", **kw)


def test_bad_dtypes():
    g = make_graph()
    (s, f, fi), _ = inputs(
        g,
        np.ones((1, 2, 3, 3), np.float32),
        np.ones((1, 3, 3, 2, 1, 1, 1), np.float16),
        np.ones((1, 3, 3, 2, 1, 1, 1), np.int32),
    )
    with pytest.raises(MegBrainError, match="inputs must share one dtype"):
        group_local(s, f)
    (si,), _ = inputs(g, np.ones((1, 2, 3, 3), np.int32))
    with pytest.raises(MegBrainError, match="only floating point"):
        group_local(si, fi)
    (f7,), _ = inputs(g, np.ones((1, 3, 3, 2, 1, 1, 1), np.float32))
    with pytest.raises(MegBrainError, match=r"LocalForward 'l'.*filter must be 6-d \(OH, OW, IC"):
        local(s, f7, name="l")
