"""The compile-time fusion of an NCHW88 depthwise ConvBias and the 1x1 ConvBias reading it
(``fuse_depthwise_pointwise``, SeparableConvBias): the fused network computes what the
unfused one does (bit for bit) and what float64 does, with ReLU, ReLU6 (a ConvBiasTail)
and SiLU depthwise activations, strides, a residual ``z``; the fusion happens where it
should (and only there); graph files never see it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_dnn_conv import ref_conv

import megbrain as mgb
from megbrain.errors import SerializationError
from megbrain.gopt import framework
from megbrain.opr.basic_arith import elemwise
from megbrain.opr.dnn import convolution

CN = "cpu0"
F32 = np.float32
_ACTS = {
    "RELU": (mgb.opr.elem.relu, lambda a: np.maximum(a, 0)),
    "RELU6": (lambda v: elemwise(elemwise(v, 0.0, mode="MAX"), 6.0, mode="MIN"),
              lambda a: np.clip(a, 0, 6)),
    "SILU": (lambda v: v * elemwise(v, mode="SIGMOID"), lambda a: a / (1 + np.exp(-a))),
    "NONE": (lambda v: v, lambda a: a),
}  # fmt: skip


def _net(act, n, c, mid, oc, hw, k, stride, residual, seed=0):
    """An inverted residual block: 1x1 c->mid + ReLU, depthwise k x k / stride + ``act``,
    1x1 mid->oc [+ x]: the graph, the output, the feed, the float64 result and the depthwise
    layer's output."""
    rng = np.random.default_rng(seed)
    g = mgb.comp_graph(check_env_var=False)
    g.set_option("log_level", 0)
    x = mgb.make_arg(CN, g, name="x", shape=(n, c, hw, hw))
    w1 = (rng.standard_normal((mid, c, 1, 1)) / np.sqrt(c)).astype(F32)
    wd = rng.standard_normal((mid, 1, 1, k, k)).astype(F32) / k
    w2 = (rng.standard_normal((oc, mid, 1, 1)) / np.sqrt(mid)).astype(F32)
    b1, bd, b2 = (rng.standard_normal((1, m, 1, 1)).astype(F32) for m in (mid, mid, oc))

    def shared(v, name):
        return mgb.make_shared(CN, value=v, comp_graph=g, name=name)

    h = mgb.opr.elem.relu(convolution(x, shared(w1, "w1")) + shared(b1, "b1"))
    d = convolution(h, shared(wd, "wd"), pad_h=k // 2, pad_w=k // 2, stride_h=stride,
                    stride_w=stride, sparse="GROUP") + shared(bd, "bd")  # fmt: skip
    d = _ACTS[act][0](d)
    y = convolution(d, shared(w2, "w2")) + shared(b2, "b2")
    if residual:
        y = y + x
    xv = rng.standard_normal((n, c, hw, hw)).astype(F32)
    hv = np.maximum(ref_conv(xv, w1, (1, 1), (0, 0), (1, 1), False) + b1, 0)
    dv = ref_conv(hv, wd, (stride,) * 2, (k // 2,) * 2, (1, 1), True) + bd
    ref = ref_conv(_ACTS[act][1](dv), w2, (1, 1), (0, 0), (1, 1), False) + b2
    return g, y, {"x": xv}, ref + xv if residual else ref, d


def _optimized(*outs):
    return mgb.optimize_for_inference(list(outs), fuse_conv_bias_nonlinearity=True,
                                      fuse_conv_bias_with_z=True, use_nchw88=True)  # fmt: skip


def _compiled(g, outs):
    g.set_option("graph_opt.jit", 1)
    f = g.compile(None, [mgb.copy_output(v) for v in outs])
    return f, list(f._func.iter_opr_seq())


def _fused(seq):
    return [o for o in seq if o.type_name == "SeparableConvBias"]


@settings(max_examples=8, deadline=None)
@given(act=st.sampled_from(sorted(_ACTS)), n=st.integers(1, 2), c=st.sampled_from([8, 16]),
       mid=st.sampled_from([16, 48]), hw=st.integers(3, 15), k=st.sampled_from([3, 5]),
       stride=st.sampled_from([1, 2]), residual=st.booleans())  # fmt: skip
def test_the_fused_block_matches_the_unfused_one_and_float64(act, n, c, mid, hw, k, stride,
                                                             residual):  # fmt: skip
    residual = residual and stride == 1
    g, out, feed, ref, _ = _net(act, n, c, mid, c, hw, k, stride, residual)
    outs = _optimized(out)
    f1, seq1 = _compiled(g, outs)
    fused = f1(**feed)[0]
    (opr,) = _fused(seq1)
    assert opr.chosen_algorithm == "DEPTHWISE_POINTWISE_NCHW88"
    assert not any(o.param.sparse == "GROUP" for o in seq1 if o.type_name.startswith("ConvBias"))
    at = framework.PRESET.index("fuse_depthwise_pointwise")
    del framework.PRESET[at]  # the list the compiler reads
    try:
        f0, seq0 = _compiled(g, outs)
        unfused = f0(**feed)[0]  # only the last function compiled on a graph runs
    finally:
        framework.PRESET.insert(at, "fuse_depthwise_pointwise")
    assert not _fused(seq0)
    np.testing.assert_allclose(fused, ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(fused, unfused)


def test_a_depthwise_output_read_elsewhere_is_not_fused():
    g, out, feed, ref, d = _net("RELU", 1, 8, 16, 8, 7, 3, 1, False)
    other = mgb.opr.elem.exp(d)
    f, seq = _compiled(g, _optimized(out, other))
    assert not _fused(seq)
    np.testing.assert_allclose(f(**feed)[0], ref, rtol=1e-4, atol=1e-4)


def test_graph_files_never_see_the_fused_operator(tmp_path):
    g, out, feed, ref, _ = _net("RELU6", 1, 8, 16, 8, 9, 3, 2, False)
    outs = _optimized(out)
    path = str(tmp_path / "g.mgb")
    mgb.serialize_comp_graph_to_file(path, outs)
    _, _, loaded = mgb.load_comp_graph_from_file(path)
    assert "SeparableConvBias" not in {o.type for o in mgb.cgtools.get_oprs_seq(loaded)}
    f, seq = _compiled(loaded[0].owner_graph, loaded)
    assert _fused(seq)  # fused again when compiled
    np.testing.assert_allclose(f(x=feed["x"])[0], ref, rtol=1e-4, atol=1e-4)
    fused = _fused(seq)[0]
    with pytest.raises(SerializationError, match="SeparableConvBias"):
        mgb.serialize_comp_graph_to_file(str(tmp_path / "f.mgb"),
                                         [mgb.SymbolVar(fused.outputs[0])])  # fmt: skip
