"""The compile-time fusion of a ConvBias and its ReLU6 or SiLU tail (``fuse_conv_bias_tail``,
ConvBiasTail): the fused function computes what the unfused one does and what float64 does,
the fusion happens where it should (and only there), graph files never see it, and an
algorithm not registered for a tail never gets it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_dnn_conv import ref_conv

import megbrain as mgb
from megbrain.errors import SerializationError
from megbrain.gopt.jit import _tail_of
from megbrain.kernels.conv import registry as conv_algos
from megbrain.kernels.conv.epilogue import TAIL_EXPRS, Epilogue, accepts
from megbrain.opr.basic_arith import elemwise
from megbrain.opr.dnn import convolution
from megbrain.opr.jit import JITExecutorParam

CN = "cpu0"
F32 = np.float32


def _relu6(v):
    return elemwise(elemwise(v, 0.0, mode="MAX"), 6.0, mode="MIN")


def _silu(v):
    return v * elemwise(v, mode="SIGMOID")


_TAILS = {"RELU6": _relu6, "SILU": _silu}
_REF = {
    "RELU6": lambda a: np.clip(a, 0, 6),
    "SILU": lambda a: a / (1 + np.exp(-a)),
}


def _net(tail, n, ic, oc, hw, k, stride, groups, relu_first, seed=0):
    """x -> convolution + bias [-> ReLU] -> tail: the graph, the tail's var, a feed, the
    float64 result and the var before the tail."""
    rng = np.random.default_rng(seed)
    g = mgb.comp_graph(check_env_var=False)
    g.set_option("log_level", 0)
    x = mgb.make_arg(CN, g, name="x", shape=(n, ic, hw, hw))
    wv = (rng.standard_normal((oc, ic // groups, k, k)) * 2).astype(F32)
    bv = rng.standard_normal((1, oc, 1, 1)).astype(F32)
    w = mgb.make_shared(CN, value=wv, comp_graph=g, name="w")
    b = mgb.make_shared(CN, value=bv, comp_graph=g, name="b")
    if groups > 1:
        wg = wv.reshape(groups, oc // groups, ic // groups, k, k)
        w = mgb.make_shared(CN, value=wg, comp_graph=g, name="w")
    y = convolution(x, w, pad_h=k // 2, pad_w=k // 2, stride_h=stride, stride_w=stride,
                    sparse="GROUP" if groups > 1 else "DENSE") + b  # fmt: skip
    if relu_first:
        y = mgb.opr.elem.relu(y)
    out = _TAILS[tail](y)
    xv = (rng.standard_normal((n, ic, hw, hw)) * 2).astype(F32)
    wr = wv.reshape(groups, oc // groups, ic // groups, k, k) if groups > 1 else wv
    ref = ref_conv(xv, wr, (stride,) * 2, (k // 2,) * 2, (1, 1), groups > 1) + bv
    if relu_first:
        ref = np.maximum(ref, 0)
    return g, out, xv, _REF[tail](ref), y


def _compiled(g, outs, jit):
    g.set_option("graph_opt.jit", jit)
    f = g.compile(None, [mgb.copy_output(v) for v in outs])
    return f, list(f._func.iter_opr_seq())


def _check(tail, n, ic, oc, hw, k, stride, groups, relu_first, nchw88):
    g, out, xv, ref, _ = _net(tail, n, ic, oc, hw, k, stride, groups, relu_first)
    outs = mgb.optimize_for_inference([out], fuse_conv_bias_nonlinearity=True,
                                      use_nchw88=nchw88)  # fmt: skip
    f0, seq0 = _compiled(g, outs, 0)
    unfused = f0(x=xv)[0]  # only the last function compiled on a graph runs
    f1, seq1 = _compiled(g, outs, 1)
    fused = f1(x=xv)[0]
    assert not any(o.type_name == "ConvBiasTail" for o in seq0)
    tails = [o for o in seq1 if o.type_name == "ConvBiasTail"]
    assert len(tails) == 1 and tails[0].param.tail == tail
    assert not any(o.type_name in ("JITExecutor", "Elemwise") for o in seq1)
    assert tail in tails[0].name
    np.testing.assert_allclose(fused, ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fused, unfused, rtol=1e-5, atol=1e-6)
    return tails[0]


# (ic, oc, k, stride, groups): the mobile nets' kinds of layer
_LAYERS = [
    (16, 24, 1, 1, 1),  # pointwise: POINTWISE_NCHW88 (a block of 16 and a half block)
    (8, 32, 3, 2, 1),  # dense 3x3 strided: DIRECT_NCHW88 from packed phase planes
    (16, 16, 3, 1, 16),  # depthwise: CHANNELWISE_NCHW88
    (24, 24, 5, 2, 24),  # depthwise 5x5 strided
    (3, 16, 3, 2, 1),  # the first layer: DIRECT_NCHW_NCHW88
    (16, 16, 3, 1, 2),  # grouped
]


@settings(max_examples=12, deadline=None)
@given(
    layer=st.sampled_from(_LAYERS),
    tail=st.sampled_from(["RELU6", "SILU"]),
    n=st.integers(1, 2),
    hw=st.integers(1, 13),
    relu_first=st.booleans(),
    nchw88=st.booleans(),
)
def test_fused_tail_matches_the_unfused_graph_and_float64(layer, tail, n, hw, relu_first,
                                                          nchw88):  # fmt: skip
    ic, oc, k, stride, groups = layer
    if tail == "SILU" and relu_first:
        relu_first = False  # SiLU is fused after IDENTITY only (a RELU before stays unfused)
    _check(tail, n, ic, oc, hw, k, stride, groups, relu_first, nchw88)


@pytest.mark.parametrize("tail", ["RELU6", "SILU"])
@pytest.mark.parametrize(
    "layer, nchw88, algo",
    [
        ((16, 24, 1, 1, 1), True, "POINTWISE_NCHW88"),
        ((8, 24, 3, 1, 1), True, "DIRECT_NCHW88"),
        ((16, 16, 3, 1, 16), True, "CHANNELWISE_NCHW88"),
        ((3, 16, 3, 2, 1), True, "DIRECT_NCHW_NCHW88"),  # the tail after the kernel
        ((16, 24, 1, 1, 1), False, "DIRECT_POINTWISE"),  # SiLU: after the kernel
        ((16, 16, 3, 1, 16), False, "CHANNELWISE_NCHW"),
    ],
)
def test_each_kernel_applies_the_tail(tail, layer, nchw88, algo):
    ic, oc, k, stride, groups = layer
    opr = _check(tail, 1, ic, oc, 11, k, stride, groups, tail == "RELU6", nchw88)
    assert opr.chosen_algorithm.split(":")[0] == algo


def test_silu_after_relu_is_not_fused():
    g, out, xv, ref, _ = _net("SILU", 1, 8, 8, 6, 1, 1, 1, True)
    outs = mgb.optimize_for_inference([out], fuse_conv_bias_nonlinearity=True)
    f, seq = _compiled(g, outs, 1)
    assert not any(o.type_name == "ConvBiasTail" for o in seq)
    np.testing.assert_allclose(f(x=xv)[0], ref, rtol=1e-4, atol=1e-5)


def test_a_conv_output_read_elsewhere_is_not_fused():
    g, out, _, _, conv_out = _net("RELU6", 1, 8, 8, 6, 1, 1, 1, False)
    outs = mgb.optimize_for_inference([out, mgb.opr.elem.exp(conv_out)],
                                      fuse_conv_bias_nonlinearity=True)  # fmt: skip
    _, seq = _compiled(g, outs, 1)
    assert not any(o.type_name == "ConvBiasTail" for o in seq)


def test_the_tail_forms_recognized():
    def tail(expr):
        return _tail_of(JITExecutorParam(tuple(expr), None))

    assert tail(TAIL_EXPRS["RELU6"]) == "RELU6"
    assert tail(TAIL_EXPRS["SILU"]) == "SILU"
    # the other orders of operands and of the clip, and a RELU first
    assert tail([("MAX", (("i", 0), ("c", 0.0))), ("MIN", (("t", 0), ("c", 6.0)))]) == "RELU6"
    assert tail([("MIN", (("i", 0), ("c", 6.0))), ("MAX", (("t", 0), ("c", 0.0)))]) == "RELU6"
    assert tail([("RELU", (("i", 0),)), ("MIN", (("t", 0), ("c", 6.0)))]) == "RELU6"
    assert tail([("SIGMOID", (("i", 0),)), ("MUL", (("t", 0), ("i", 0)))]) == "SILU"
    # not these
    assert tail([("MAX", (("i", 0), ("c", 0.0))), ("MIN", (("t", 0), ("c", 1.0)))]) is None
    assert tail([("MAX", (("i", 0), ("c", -1.0))), ("MIN", (("t", 0), ("c", 6.0)))]) is None
    assert tail([("SIGMOID", (("i", 0),)), ("MUL", (("t", 0), ("t", 0)))]) is None
    assert tail([("MAX", (("i", 0), ("c", 0.0))), ("ADD", (("t", 0), ("c", 6.0)))]) is None


def dumped_loaded_compiled(outs, tmp_path, fused_type):
    """``outs`` dumped, loaded (checked to hold ConvBias, no ``fused_type``) and compiled
    with JIT: the function and its operators."""
    path = str(tmp_path / "g.mgb")
    mgb.serialize_comp_graph_to_file(path, outs)
    _, _, loaded = mgb.load_comp_graph_from_file(path)
    types = {o.type for o in mgb.cgtools.get_oprs_seq(loaded)}
    assert fused_type not in types and "ConvBiasForward" in types
    return _compiled(loaded[0].owner_graph, loaded, 1)


def test_the_optimized_graph_dumps_reference_operators_and_a_fused_one_is_refused(tmp_path):
    g, out, xv, ref, _ = _net("RELU6", 1, 16, 16, 7, 3, 1, 16, False)
    outs = mgb.optimize_for_inference([out], fuse_conv_bias_nonlinearity=True, use_nchw88=True)
    f, seq = dumped_loaded_compiled(outs, tmp_path, "ConvBiasTail")
    assert any(o.type_name == "ConvBiasTail" for o in seq)  # fused again when compiled
    np.testing.assert_allclose(f(x=xv)[0], ref, rtol=1e-4, atol=1e-5)
    fused = next(o for o in seq if o.type_name == "ConvBiasTail")
    with pytest.raises(SerializationError, match=r"ConvBiasTail.*before compile-time fusion"):
        mgb.serialize_comp_graph_to_file(str(tmp_path / "f.mgb"), [mgb.SymbolVar(fused.outputs[0])])


def test_an_algorithm_without_the_tail_gets_the_unfused_tail():
    seen = []
    base = next(a for a in conv_algos.algorithms("forward") if a.name == "DIRECT_POINTWISE")

    def bind(*args, epilogue=None):
        seen.append(epilogue)
        return base.bind(*args, epilogue=epilogue)

    algo = conv_algos.ConvAlgorithm(
        "TEST_NO_TAIL", "forward", bind, base.usable, priority=10**6, epilogue=True,
        hswish=True,
    )  # fmt: skip
    relu6 = Epilogue(np.zeros(4, F32), False, relu6=True)
    silu = Epilogue(np.zeros(4, F32), False, silu=True)
    assert not accepts(algo, relu6) and accepts(base, relu6)
    assert not accepts(algo, silu) and not accepts(base, silu)  # no SiLU in DIRECT_POINTWISE
    conv_algos.register(algo)
    try:
        for tail in ("RELU6", "SILU"):
            seen.clear()
            g, out, xv, ref, _ = _net(tail, 1, 8, 16, 6, 1, 1, 1, False)
            outs = mgb.optimize_for_inference([out], fuse_conv_bias_nonlinearity=True)
            f, seq = _compiled(g, outs, 1)
            np.testing.assert_allclose(f(x=xv)[0], ref, rtol=1e-4, atol=1e-5)
            (opr,) = [o for o in seq if o.type_name == "ConvBiasTail"]
            assert opr.chosen_algorithm == "TEST_NO_TAIL"
            assert seen and all(e is None for e in seen)  # the tail never reached it
    finally:
        conv_algos.unregister("forward", "TEST_NO_TAIL")


def test_a_training_graph_differentiates_the_unfused_tail():
    g, out, xv, ref, _ = _net("RELU6", 1, 8, 8, 5, 1, 1, 1, False)
    w = next(v for v in mgb.cgtools.get_dep_vars(out, "SharedDeviceTensor") if v.name == "w")
    loss = out.sum()
    gw = mgb.grad(loss, w)
    f, seq = _compiled(g, [out, gw], 1)
    assert not any(o.type_name == "ConvBiasTail" for o in seq)  # the backward reads y
    got, _ = f(x=xv)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
