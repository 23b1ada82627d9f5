"""The compile-time fusion of a per-channel scale, shift and ReLU into the 1x1 ConvBias
reading them (``fuse_preactivation``, ConvBiasPreact: DenseNet's pre-activation BatchNorm
and ReLU): the fused function computes what the unfused one does and what float64 does,
with a residual ``z``, and for a Convolution without bias; the fusion happens where it
should (and only there); graph files never see it; an NCHW one computes its source first."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from test_conv_bias_gated import (
    _compiled,
    _optimized,
    assert_dumped_unfused_and_refused,
    assert_not_fused_in_nchw_or_training,
)

import megbrain as mgb
from megbrain.graph import OperatorNodeConfig
from megbrain.opr.basic_arith import elemwise
from megbrain.opr.dnn import convolution
from megbrain.opr.dnn_conv_bias import ConvBiasParam, ConvBiasPreact
from megbrain.opr.tensor_manip import concat

CN = "cpu0"
F32 = np.float32


def _net(n, ic, oc, hw, k=1, with_z=False, seed=0, bias=True):
    """h = x concatenated with a 1x1 convolution of x (NCHW88 after use_nchw88: a DenseNet
    block's input), a = relu(h s + t) -> convolution k x k + bias [+ r], ReLU: the graph,
    the output, a feed, the float64 result and a."""
    rng = np.random.default_rng(seed)
    g = mgb.comp_graph(check_env_var=False)
    g.set_option("log_level", 0)
    x = mgb.make_arg(CN, g, name="x", shape=(n, ic // 2, hw, hw))
    w0v = (rng.standard_normal((ic // 2, ic // 2, 1, 1)) / np.sqrt(ic)).astype(F32)
    wv = (rng.standard_normal((oc, ic, k, k)) / np.sqrt(ic)).astype(F32)
    bv = rng.standard_normal((1, oc, 1, 1)).astype(F32)
    sv = rng.uniform(0.5, 2, (1, ic, 1, 1)).astype(F32)
    tv = rng.uniform(-1, 1, (1, ic, 1, 1)).astype(F32)
    w0, w, b, s, t = (mgb.make_shared(CN, value=v, comp_graph=g, name=nm)
                      for v, nm in ((w0v, "w0"), (wv, "w"), (bv, "b"), (sv, "s"), (tv, "t")))
    x1 = convolution(x, w0)
    act = elemwise(concat([convolution(x1, w0), x1], axis=1) * s + t, mode="RELU")
    y = convolution(act, w, pad_h=k // 2, pad_w=k // 2)
    if not bias:  # a DenseNet transition: a Convolution, then pooling
        conv = y
        y = mgb.opr.pooling(y, mode="AVERAGE", window_h=1, window_w=1, stride_h=1,
                            stride_w=1)  # fmt: skip
    feed = {"x": rng.standard_normal((n, ic // 2, hw, hw)).astype(F32)}
    h = np.einsum("oi,nihw->nohw", w0v[:, :, 0, 0].astype(np.float64), feed["x"])
    h = np.concatenate([np.einsum("oi,nihw->nohw", w0v[:, :, 0, 0], h), h], axis=1)
    xs = np.maximum(h * sv + tv, 0)
    xs = np.pad(xs, [(0, 0), (0, 0)] + [(k // 2, k // 2)] * 2)
    ref = np.zeros((n, oc, hw, hw))
    for i in range(k):
        for j in range(k):
            ref += np.einsum("oi,nihw->nohw", wv[:, :, i, j], xs[:, :, i:i + hw, j:j + hw])
    if not bias:
        return g, y, feed, ref, conv
    y, ref = y + b, ref + bv
    if with_z:
        r = mgb.make_arg(CN, g, name="r", shape=(n, oc, hw, hw))
        y = y + r
        feed["r"] = rng.standard_normal((n, oc, hw, hw)).astype(F32)
        ref = ref + feed["r"]
    return g, elemwise(y, mode="RELU"), feed, np.maximum(ref, 0), act


def _preact(seq):
    return [o for o in seq if o.type_name == "ConvBiasPreact"]


@settings(max_examples=5, deadline=None)
@given(n=st.integers(1, 2), ic=st.sampled_from([16, 32, 80]), oc=st.sampled_from([16, 24]),
       hw=st.integers(2, 9), with_z=st.booleans())  # fmt: skip
def test_the_fused_preactivation_matches_the_unfused_graph_and_float64(n, ic, oc, hw, with_z):
    g, out, feed, ref, _ = _net(n, ic, oc, hw, with_z=with_z)
    outs = _optimized(out)
    f0, seq0 = _compiled(g, outs, 0)
    unfused = f0(**feed)[0]  # only the last function compiled on a graph runs
    f1, seq1 = _compiled(g, outs, 1)
    fused = f1(**feed)[0]
    assert not _preact(seq0)
    (opr,) = _preact(seq1)
    assert opr.chosen_algorithm == "POINTWISE_NCHW88" and "relu" in opr.name
    assert not [o for o in seq1 if o.type_name in ("Elemwise", "JITExecutor")]
    np.testing.assert_allclose(fused, ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fused, unfused, rtol=1e-5, atol=1e-5)


def test_a_convolution_without_bias_is_fused_with_zeros_for_its_bias():
    g, out, feed, ref, conv = _net(1, 32, 24, 6, bias=False)
    f, seq = _compiled(g, _optimized(out), 1)
    np.testing.assert_allclose(f(**feed)[0], ref, rtol=1e-4, atol=1e-5)
    (opr,) = _preact(seq)
    assert opr.chosen_algorithm == "POINTWISE_NCHW88" and opr.param.nonlineMode == "IDENTITY"
    assert not [o for o in seq if o.type_name in ("Elemwise", "JITExecutor")]


def test_an_activation_read_elsewhere_or_by_another_convolution_is_not_fused():
    g, out, feed, ref, act = _net(1, 32, 16, 5)
    _, seq = _compiled(g, _optimized(out, mgb.opr.elem.exp(act)), 1)
    assert not _preact(seq)
    g, out, feed, ref, _ = _net(1, 32, 16, 5, k=3)
    f, seq = _compiled(g, _optimized(out), 1)
    assert not _preact(seq)
    np.testing.assert_allclose(f(**feed)[0], ref, rtol=1e-4, atol=1e-5)


def test_nchw_and_training_graphs_are_not_fused():
    g, out, feed, ref, _ = _net(1, 32, 16, 5)
    assert_not_fused_in_nchw_or_training(g, out, "ConvBiasPreact")


def test_the_optimized_graph_dumps_reference_operators_and_a_fused_one_is_refused(tmp_path):
    g, out, feed, ref, _ = _net(1, 32, 24, 7)
    assert_dumped_unfused_and_refused(out, feed, ref, tmp_path, "ConvBiasPreact")


def test_an_nchw_preactivated_conv_bias_reads_its_activated_source_from_its_workspace():
    # the class is correct outside the pass's NCHW88 case too: NCHW, 3x3, padded
    rng = np.random.default_rng(3)
    g = mgb.comp_graph(check_env_var=False)
    x = mgb.make_arg(CN, g, name="x", shape=(2, 8, 6, 6))
    wv = (rng.standard_normal((16, 8, 3, 3)) / 8).astype(F32)
    bv, sv, tv = (rng.standard_normal((1, c, 1, 1)).astype(F32) for c in (16, 8, 8))
    ins = [x.node] + [mgb.make_shared(CN, value=v, comp_graph=g).node for v in (wv, bv, sv, tv)]
    param = ConvBiasParam(pad_h=1, pad_w=1, nonlineMode="RELU")
    y = g.insert_opr(ConvBiasPreact(ins, param, OperatorNodeConfig(comp_node=x.node.comp_node)))
    f = g.compile(None, [mgb.copy_output(mgb.SymbolVar(y[0]))])
    xv = rng.standard_normal((2, 8, 6, 6)).astype(F32)
    xs = np.pad(np.maximum(xv.astype(np.float64) * sv + tv, 0), [(0, 0), (0, 0), (1, 1), (1, 1)])
    ref = np.zeros((2, 16, 6, 6)) + bv
    for i in range(3):
        for j in range(3):
            ref += np.einsum("oi,nihw->nohw", wv[:, :, i, j], xs[:, :, i:i + 6, j:j + 6])
    np.testing.assert_allclose(f(x=xv)[0], np.maximum(ref, 0), rtol=1e-4, atol=1e-5)
