"""The compile-time fusion of a squeeze-and-excitation multiply into the 1x1 ConvBias reading
it (``fuse_se_gate``, ConvBiasGated): the fused function computes what the unfused one does
and what float64 does, with the sigmoid and the hard-sigmoid gates of EfficientNet and
MobileNetV3 and a residual ``z``; the fusion happens where it should (and only there); graph
files never see it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_conv_bias_tail import dumped_loaded_compiled

import megbrain as mgb
from megbrain.errors import SerializationError
from megbrain.graph.static_infer import static_shape
from megbrain.opr.basic_arith import elemwise
from megbrain.opr.dnn import convolution

CN = "cpu0"
F32 = np.float32


def _hard_sigmoid(v):  # as the ONNX import's HardSigmoid: MUL, ADD, MAX, MIN
    return elemwise(elemwise(v * 0.2 + 0.5, 0.0, mode="MAX"), 1.0, mode="MIN")


_GATES = {"SIGMOID": lambda v: elemwise(v, mode="SIGMOID"), "HARD_SIGMOID": _hard_sigmoid}
_REF = {
    "SIGMOID": lambda a: 1 / (1 + np.exp(-a)),
    "HARD_SIGMOID": lambda a: np.clip(a * 0.2 + 0.5, 0, 1),
}


def _net(gate, n, ic, oc, hw, k=1, with_z=False, seed=0):
    """h = a 1x1 convolution of x (NCHW88 after use_nchw88), h * gate(s) -> convolution k x
    k + bias [+ r]: the graph, the output, a feed, the float64 result and the product's
    var."""
    rng = np.random.default_rng(seed)
    g = mgb.comp_graph(check_env_var=False)
    g.set_option("log_level", 0)
    x = mgb.make_arg(CN, g, name="x", shape=(n, ic, hw, hw))
    s = mgb.make_arg(CN, g, name="s", shape=(n, ic, 1, 1))
    w0v = (rng.standard_normal((ic, ic, 1, 1)) / np.sqrt(ic)).astype(F32)
    wv = (rng.standard_normal((oc, ic, k, k)) / np.sqrt(ic)).astype(F32)
    bv = rng.standard_normal((1, oc, 1, 1)).astype(F32)
    w0 = mgb.make_shared(CN, value=w0v, comp_graph=g, name="w0")
    w = mgb.make_shared(CN, value=wv, comp_graph=g, name="w")
    b = mgb.make_shared(CN, value=bv, comp_graph=g, name="b")
    prod = convolution(x, w0) * _GATES[gate](s)
    y = convolution(prod, w, pad_h=k // 2, pad_w=k // 2) + b
    feed = {
        "x": rng.standard_normal((n, ic, hw, hw)).astype(F32),
        "s": (rng.standard_normal((n, ic, 1, 1)) * 4).astype(F32),
    }
    h = np.einsum("oi,nihw->nohw", w0v[:, :, 0, 0].astype(np.float64), feed["x"])
    xs = h * _REF[gate](feed["s"].astype(np.float64))
    xs = np.pad(xs, [(0, 0), (0, 0)] + [(k // 2, k // 2)] * 2)
    ref = np.zeros((n, oc, hw, hw)) + bv
    for i in range(k):
        for j in range(k):
            ref += np.einsum("oi,nihw->nohw", wv[:, :, i, j], xs[:, :, i:i + hw, j:j + hw])
    if with_z:
        r = mgb.make_arg(CN, g, name="r", shape=(n, oc, hw, hw))
        y = y + r
        feed["r"] = rng.standard_normal((n, oc, hw, hw)).astype(F32)
        ref = ref + feed["r"]
    return g, y, feed, ref, prod


def _optimized(*outs):
    return mgb.optimize_for_inference(list(outs), fuse_conv_bias_nonlinearity=True,
                                      fuse_conv_bias_with_z=True, use_nchw88=True)  # fmt: skip


def _compiled(g, outs, jit):
    g.set_option("graph_opt.jit", jit)
    f = g.compile(None, [mgb.copy_output(v) for v in outs])
    return f, list(f._func.iter_opr_seq())


def _gated(seq):
    return [o for o in seq if o.type_name == "ConvBiasGated"]


@settings(max_examples=8, deadline=None)
@given(gate=st.sampled_from(sorted(_GATES)), n=st.integers(1, 2),
       ic=st.sampled_from([8, 16, 40]), oc=st.sampled_from([16, 24]), hw=st.integers(2, 9),
       with_z=st.booleans())  # fmt: skip
def test_the_fused_gate_matches_the_unfused_graph_and_float64(gate, n, ic, oc, hw, with_z):
    g, out, feed, ref, _ = _net(gate, n, ic, oc, hw, with_z=with_z)
    outs = _optimized(out)
    f0, seq0 = _compiled(g, outs, 0)
    unfused = f0(**feed)[0]  # only the last function compiled on a graph runs
    f1, seq1 = _compiled(g, outs, 1)
    fused = f1(**feed)[0]
    assert not _gated(seq0)
    (opr,) = _gated(seq1)
    assert opr.chosen_algorithm == "POINTWISE_NCHW88" and "gate" in opr.name
    # no multiply of the plane is left: the gate's own chain runs on (N, C/8, 1, 1, 8)
    for o in seq1:
        if o.type_name in ("Elemwise", "JITExecutor"):
            assert static_shape(o.outputs[0])[2:4] == (1, 1)
    np.testing.assert_allclose(fused, ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fused, unfused, rtol=1e-5, atol=1e-5)


def test_a_product_read_elsewhere_or_by_another_convolution_is_not_fused():
    g, out, feed, ref, prod = _net("SIGMOID", 1, 16, 16, 5)
    _, seq = _compiled(g, _optimized(out, mgb.opr.elem.exp(prod)), 1)
    assert not _gated(seq)
    g, out, feed, ref, _ = _net("SIGMOID", 1, 16, 16, 5, k=3)
    f, seq = _compiled(g, _optimized(out), 1)
    assert not _gated(seq)
    np.testing.assert_allclose(f(**feed)[0], ref, rtol=1e-4, atol=1e-5)


def assert_not_fused_in_nchw_or_training(g, out, type_name: str) -> None:
    """Neither an NCHW graph (no use_nchw88) nor one with the gradient of ``out`` (by its
    shared weight ``w``) has a ``type_name`` operator."""
    outs = mgb.optimize_for_inference([out], fuse_conv_bias_nonlinearity=True)
    f, seq = _compiled(g, outs, 1)
    assert not [o for o in seq if o.type_name == type_name]
    w = next(v for v in mgb.cgtools.get_dep_vars(out, "SharedDeviceTensor") if v.name == "w")
    f, seq = _compiled(g, [out, mgb.grad(out.sum(), w)], 1)
    assert not [o for o in seq if o.type_name == type_name]


def assert_dumped_unfused_and_refused(out, feed, ref, tmp_path, type_name: str) -> None:
    """``out``'s optimized graph dumps without a ``type_name`` operator, loads, is fused
    again when compiled and computes ``ref``; the fused operator's dump is refused."""
    f, seq = dumped_loaded_compiled(_optimized(out), tmp_path, type_name)
    (fused,) = [o for o in seq if o.type_name == type_name]  # fused again when compiled
    np.testing.assert_allclose(f(**feed)[0], ref, rtol=1e-4, atol=1e-5)
    with pytest.raises(SerializationError, match=rf"{type_name}.*before compile-time fusion"):
        mgb.serialize_comp_graph_to_file(str(tmp_path / "f.mgb"), [mgb.SymbolVar(fused.outputs[0])])


def test_nchw_and_training_graphs_are_not_fused():
    g, out, feed, ref, _ = _net("SIGMOID", 1, 16, 16, 5)
    assert_not_fused_in_nchw_or_training(g, out, "ConvBiasGated")


def test_the_optimized_graph_dumps_reference_operators_and_a_fused_one_is_refused(tmp_path):
    g, out, feed, ref, _ = _net("SIGMOID", 1, 16, 24, 7)  # a gate of one Elemwise: no JIT
    assert_dumped_unfused_and_refused(out, feed, ref, tmp_path, "ConvBiasGated")
