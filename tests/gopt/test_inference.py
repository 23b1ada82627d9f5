"""optimize_for_inference: each inference pass rewrites what it should and
keeps the results; the flags; ``compile(optimize_for_inference=True)``."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import megbrain as mgb
from megbrain import nn
from megbrain.gopt.inference import INFERENCE_PASSES, INFERENCE_PRESET, InferenceOptions
from megbrain.opr.dnn import convolution
from megbrain.opr.dnn_conv_bias import conv_bias_activation

CN = "cpu0"
F32 = np.float32


def _rng(seed=0):
    return np.random.default_rng(seed)


def _shared(g, value, name):
    return mgb.make_shared(CN, value=np.asarray(value, F32), comp_graph=g, name=name)


def _run(y, feed):
    """Compute ``y`` (a var or list) with ``feed`` ({name: value}); returns arrays."""
    ys = y if isinstance(y, list) else [y]
    g = ys[0].owner_graph
    f = g.compile(None, [mgb.copy_output(v) for v in ys])
    names = {v.name for v in f.inputs}
    return f(**{k: v for k, v in feed.items() if k in names}), f


def _types(f):
    return [o.type_name for o in f._func.iter_opr_seq()]


def _check_same(before, after, feed, rtol=1e-5, atol=1e-5):
    """Results of ``before`` and ``after`` vars on ``feed`` agree; returns the after seq."""
    r0, _ = _run(before, feed)
    r1, f = _run(after, feed)
    for a, b in zip(r0, r1):
        assert b.dtype == a.dtype and b.shape == a.shape
        np.testing.assert_allclose(b, a, rtol=rtol, atol=atol)
    return _types(f)


def _conv_net(bn="layers", act=True, bias=True, groups=1, seed=0):
    """(graph, x, y, feed): conv(+bias) -> batch norm -> relu, with random parameters.

    ``bn``: "layers" (nn.BatchNorm2d in eval mode, elementwise), "opr" (BatchNorm INFERENCE)
    or None.
    """
    rng = _rng(seed)
    g = mgb.comp_graph(check_env_var=False)
    g.set_option("log_level", 0)
    x = mgb.make_arg(CN, g, name="x", shape=(2, 4, 9, 9))
    oc = 6
    if groups > 1:
        w = _shared(g, rng.standard_normal((groups, oc // groups, 4 // groups, 3, 3)), "w")
        y = convolution(x, w, pad_h=1, pad_w=1, sparse="GROUP")
    else:
        w = _shared(g, rng.standard_normal((oc, 4, 3, 3)), "w")
        y = convolution(x, w, pad_h=1, pad_w=1, stride_h=2, stride_w=2)
    if bias:
        y = y + _shared(g, rng.standard_normal((1, oc, 1, 1)), "b")
    if bn == "layers":
        layer = nn.BatchNorm2d(oc)
        layer.running_mean.set_value(rng.standard_normal(oc).astype(F32))
        layer.running_var.set_value(rng.uniform(0.5, 2, oc).astype(F32))
        layer.weight.set_value(rng.standard_normal(oc).astype(F32))
        layer.bias.set_value(rng.standard_normal(oc).astype(F32))
        layer.training = False
        y = layer(y)
    elif bn == "opr":
        p = [_shared(g, v, n) for v, n in (
            (rng.standard_normal((1, oc, 1, 1)), "scale"),
            (rng.standard_normal((1, oc, 1, 1)), "bn_bias"),
            (rng.standard_normal((1, oc, 1, 1)), "mean"),
            (rng.uniform(0.5, 2, (1, oc, 1, 1)), "var"),
        )]  # fmt: skip
        y = mgb.opr.batch_norm(y, *p, param_dim="DIM_1C11", fwd_mode="INFERENCE", epsilon=1e-3)[-1]
    if act:
        y = mgb.opr.elem.relu(y)
    feed = {"x": rng.standard_normal((2, 4, 9, 9)).astype(F32)}
    return g, x, y, feed


def test_preset_order_and_flags():
    assert INFERENCE_PRESET == [
        "expand_batch_norm",
        "remove_non_computing",
        "expand_fused_arith",
        "normalize_affine_chain",
        "fold_conv_scale",
        "param_fuse",
        "reorder_arith_chain",
        "arith_fuse",
        "reorder_arith_chain",
        "remove_redundant_typecvt",
        "param_fuse",
        "fuse_conv_bias_nonlinearity",
        "fuse_conv_bias_with_z",
        "use_nchw88",
        "use_nchw4",
        "convert_f16_io",
        "param_fuse",
        "param_merge",
    ]
    assert set(INFERENCE_PRESET) <= set(INFERENCE_PASSES)


# ---- whole networks ----------------------------------------------------------------------
@pytest.mark.parametrize("bn", ["layers", "opr"])
def test_conv_bn_relu_folded_into_one_conv_bias(bn):
    g, x, y, feed = _conv_net(bn)
    (y2,) = mgb.optimize_for_inference([y], fuse_conv_bias_nonlinearity=True)
    types = _check_same(y, y2, feed)
    # the parameters are merged into one holder, as the reference's ParamMerge does
    assert types == ["Host2DeviceCopy", "MultipleDeviceTensorHolder", "ConvBiasForward"]
    assert y2.node.owner.param.nonlineMode == "RELU"


@pytest.mark.parametrize("bn", ["layers", "opr"])
def test_bn_folded_without_fusion(bn):
    g, x, y, feed = _conv_net(bn)
    (y2,) = mgb.optimize_for_inference([y])
    types = _check_same(y, y2, feed)
    assert "BatchNormForward" not in types
    # bias + relu fused into FUSE_ADD_RELU(bias, conv) by ArithFuse
    assert types.count("ConvolutionForward") == 1 and types.count("Elemwise") == 1


def test_group_convolution_bn_folded():
    g, x, y, feed = _conv_net("layers", groups=2)
    (y2,) = mgb.optimize_for_inference([y], fuse_conv_bias_nonlinearity=True)
    types = _check_same(y, y2, feed)
    assert types[-1] == "ConvBiasForward" and types.count("Elemwise") == 0


def test_compile_with_optimize_for_inference():
    g, x, y, feed = _conv_net("layers")
    (ref,), _ = _run(y, feed)
    f = g.compile([x], mgb.copy_output(y), optimize_for_inference=True)
    got = f(feed["x"])
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    types = _types(f)
    assert "Reduce" not in types and types.count("Elemwise") <= 2
    assert f.outputs == (y,)  # outputs keyed by the user's var
    assert f.inputs == (x,)


def test_compile_copy_and_optimize_for_inference():
    g, x, y, feed = _conv_net("opr")
    (ref,), _ = _run(y, feed)
    f = g.compile([x], mgb.copy_output(y), copy=True, optimize_for_inference=True)
    np.testing.assert_allclose(f(feed["x"]), ref, rtol=1e-5, atol=1e-5)
    assert "BatchNormForward" not in _types(f)


def test_replaced_var_answers_for_outputs():
    g, x, y, feed = _conv_net("layers")
    (y2,) = mgb.optimize_for_inference([y], fuse_conv_bias_nonlinearity=True)
    assert mgb.get_graph_optimizer_replaced_var(y) == y2


def test_single_var_and_empty_list():
    g, x, y, feed = _conv_net(None)
    out = mgb.optimize_for_inference(y)
    assert isinstance(out, list) and len(out) == 1
    assert mgb.optimize_for_inference([]) == []


def test_outputs_of_two_graphs_refused():
    _, _, y1, _ = _conv_net(None)
    _, _, y2, _ = _conv_net(None)
    with pytest.raises(mgb.MegBrainError, match="another graph"):
        mgb.optimize_for_inference([y1, y2])


# ---- each pass ---------------------------------------------------------------------------
def _pass(name, y, **opts):
    """Apply one inference pass to ``y``; returns the new var (``y`` if unchanged)."""
    varmap = INFERENCE_PASSES[name](y.node.graph, [y.node], InferenceOptions(**opts))
    return mgb.SymbolVar(varmap.get(y.node, y.node))


def test_expand_batch_norm_pass():
    g, x, y, feed = _conv_net("opr", act=False, bias=False)
    y2 = _pass("expand_batch_norm", y)
    assert y.node.owner.type_name == "BatchNormForward"
    assert y2.node.owner.type_name == "Elemwise" and y2.node.owner.param.mode == "ADD"
    _check_same(y, y2, feed)


def test_expand_batch_norm_keeps_training_mode():
    g = mgb.comp_graph(check_env_var=False)
    x = mgb.make_arg(CN, g, name="x", shape=(2, 3, 4, 4))
    p = [_shared(g, np.ones((1, 3, 1, 1)), f"p{i}") for i in range(4)]
    y = mgb.opr.batch_norm(x, *p, param_dim="DIM_1C11", fwd_mode="TRAINING")[-1]
    assert _pass("expand_batch_norm", y).node is y.node


def test_normalize_affine_chain_pass():
    g = mgb.comp_graph(check_env_var=False)
    x = mgb.make_arg(CN, g, name="x", shape=(2, 3))
    p = [_shared(g, v, f"p{i}") for i, v in enumerate(_rng(1).uniform(1, 2, (4, 3)))]
    y = -((x - p[0]) / p[1] * p[2] + p[3])
    y = 5.0 - y
    y2 = _pass("normalize_affine_chain", y)
    # x * K + B: one MUL reading x and one ADD, whatever the chain was
    assert y2.node.owner.param.mode == "ADD"
    mul = y2.node.owner.inputs[0].owner
    assert mul.param.mode == "MUL" and mul.inputs[0] is x.node
    _check_same(y, y2, {"x": _rng(2).standard_normal((2, 3)).astype(F32)})


def test_normalize_affine_chain_stops_at_shared_intermediates():
    g = mgb.comp_graph(check_env_var=False)
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    p = _shared(g, [1.0, 2.0, 3.0], "p")
    a = x - p
    y = (a * p) * a  # a is read twice: the chain ends there
    y2 = _pass("normalize_affine_chain", y)
    _check_same(y, y2, {"x": np.arange(3, dtype=F32)})
    assert y2.node.owner.param.mode == "MUL"


def test_fold_conv_scale_pass():
    g, x, y, feed = _conv_net(None, act=False, bias=False)
    k = _shared(g, _rng(3).standard_normal((1, 6, 1, 1)), "k")
    z = y * k
    z2 = _pass("fold_conv_scale", z)
    assert z2.node.owner.type_name == "ConvolutionForward"
    assert z2.node.owner.inputs[1] is not y.node.owner.inputs[1]
    _check_same(z, z2, feed)


def test_fold_conv_scale_needs_a_per_channel_parameter():
    g, x, y, feed = _conv_net(None, act=False, bias=False)
    per_pixel = _shared(g, np.ones((1, 1, 5, 5)), "k")
    assert _pass("fold_conv_scale", y * per_pixel).node.owner.type_name == "Elemwise"
    z = mgb.make_arg(CN, g, name="z", shape=(1, 6, 1, 1))  # not a parameter
    assert _pass("fold_conv_scale", y * z).node.owner.type_name == "Elemwise"


def test_param_fuse_pass():
    g = mgb.comp_graph(check_env_var=False)
    x = mgb.make_arg(CN, g, name="x", shape=(2, 3))
    w = _shared(g, _rng(4).standard_normal((3, 3)), "w")
    s = mgb.SharedScalar(2.0)
    sv = s._as_sym_var(g, mgb.comp_node(CN))
    wt = (w * sv + 1.0).dimshuffle(1, 0)
    y = mgb.opr.matrix_mul(x, wt)
    y2 = _pass("param_fuse", y)
    src = y2.node.owner.inputs[1].owner
    assert src.type_name == "SharedDeviceTensor" and src.name.startswith("fuse(")
    feed = {"x": _rng(5).standard_normal((2, 3)).astype(F32)}
    (ref,), _ = _run(y, feed)
    _check_same(y, y2, feed)
    # the folded value is a snapshot: updating the parameter changes only the original
    w.set_value(np.zeros((3, 3), F32))
    (after,), _ = _run(y2, feed)
    np.testing.assert_allclose(after, ref, rtol=1e-6)


def test_param_fuse_constants_become_immutable():
    g = mgb.comp_graph(check_env_var=False)
    g.set_option("graph_opt_level", 0)  # nothing folded at insertion
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    c = mgb.make_immutable(CN, g, np.arange(3, dtype=F32))
    y = x + mgb.opr.elem.exp(c)
    y2 = _pass("param_fuse", y)
    assert y2.node.owner.inputs[1].owner.type_name == "ImmutableTensor"
    _check_same(y, y2, {"x": np.ones(3, F32)})


def test_param_fuse_leaves_inputs_and_volatile_tensors():
    g = mgb.comp_graph(check_env_var=False)
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    v = mgb.make_shared(CN, value=np.ones(3, F32), comp_graph=g, name="v", volatile=True)
    y = mgb.opr.elem.exp(x) + mgb.opr.elem.exp(v)
    assert _pass("param_fuse", y).node is y.node


@pytest.mark.parametrize(
    "act, mode", [(None, "IDENTITY"), ("relu", "RELU"), ("sigmoid", "SIGMOID"),
                  ("h_swish", "H_SWISH")],
)  # fmt: skip
def test_fuse_conv_bias_nonlinearity_pass(act, mode):
    g, x, y, feed = _conv_net(None, act=False)
    if act is not None:
        y = getattr(mgb.opr.elem, act)(y)
    y2 = _pass("fuse_conv_bias_nonlinearity", y, fuse_conv_bias_nonlinearity=True)
    assert y2.node.owner.type_name == "ConvBiasForward" and y2.node.owner.param.nonlineMode == mode
    _check_same(y, y2, feed)


def test_fuse_conv_nonlinearity_without_bias_and_fuse_add_relu():
    g, x, y, feed = _conv_net(None, act=True, bias=False)
    y2 = _pass("fuse_conv_bias_nonlinearity", y, fuse_conv_bias_nonlinearity=True)
    assert y2.node.owner.type_name == "ConvBiasForward"
    _check_same(y, y2, feed)
    conv = mgb.SymbolVar(y.node.owner.inputs[0])
    b = _shared(g, _rng(6).standard_normal(6).reshape(6, 1, 1), "b3")  # (OC, 1, 1)
    z = mgb.opr.elemwise(conv, b, mode="FUSE_ADD_RELU")
    z2 = _pass("fuse_conv_bias_nonlinearity", z, fuse_conv_bias_nonlinearity=True)
    o = z2.node.owner
    assert o.type_name == "ConvBiasForward" and o.param.nonlineMode == "RELU"
    _check_same(z, z2, feed)


def test_user_conv_bias_gets_the_nonlinearity():
    g, x, y, feed = _conv_net(None, act=False, bias=False)
    conv = y.node.owner
    b = _shared(g, _rng(8).standard_normal((1, 6, 1, 1)), "cb_bias")
    cb = conv_bias_activation(x, mgb.SymbolVar(conv.inputs[1]), b, pad_h=1, pad_w=1,
                              stride_h=2, stride_w=2)  # fmt: skip
    z = mgb.opr.elem.sigmoid(cb)
    z2 = _pass("fuse_conv_bias_nonlinearity", z, fuse_conv_bias_nonlinearity=True)
    o = z2.node.owner
    assert o.type_name == "ConvBiasForward" and o.param.nonlineMode == "SIGMOID"
    _check_same(z, z2, feed)


def test_fuse_conv_bias_leaves_a_conv_read_twice():
    g, x, y, feed = _conv_net(None, act=False, bias=False)
    z = mgb.opr.elem.relu(y + 1.0) + y
    z2 = _pass("fuse_conv_bias_nonlinearity", z, fuse_conv_bias_nonlinearity=True)
    assert z2.node is z.node


def test_fuse_conv_bias_with_z_pass():
    g, x, y, feed = _conv_net(None, act=False, bias=False)
    z = mgb.make_arg(CN, g, name="z", shape=(2, 6, 5, 5))
    out = mgb.opr.elem.relu(y + z)
    feed["z"] = _rng(7).standard_normal((2, 6, 5, 5)).astype(F32)
    out2 = mgb.optimize_for_inference([out], fuse_conv_bias_with_z=True)[0]
    types = _check_same(out, out2, feed)
    assert "ConvBiasForward" in types and "ConvolutionForward" not in types
    plain = mgb.optimize_for_inference([out])[0]
    assert "ConvolutionForward" in _check_same(out, plain, feed)


@pytest.mark.parametrize("flag", ["f16_io_comp", "f16_io_f32_comp"])
def test_float16_io(flag):
    g, x, y, feed = _conv_net("layers")
    (y2,) = mgb.optimize_for_inference([y], fuse_conv_bias_nonlinearity=True, **{flag: True})
    assert y2.dtype == np.float32
    types = _check_same(y, y2, feed, rtol=2e-2, atol=2e-2)
    assert types == ["Host2DeviceCopy", "TypeCvt", "MultipleDeviceTensorHolder", "ConvBiasForward",
                     "TypeCvt"]  # fmt: skip
    cb = y2.node.owner.inputs[0].owner
    assert cb.outputs[0].dtype == np.float16 and cb.inputs[1].dtype == np.float16
    assert cb.param.compute_mode == ("FLOAT32" if flag == "f16_io_f32_comp" else "DEFAULT")


def test_float16_keeps_integer_vars_and_converts_typecvt():
    g = mgb.comp_graph(check_env_var=False)
    x = mgb.make_arg(CN, g, name="x", shape=(4,))
    i = mgb.make_arg(CN, g, name="i", shape=(4,), dtype=np.int32)
    y = mgb.opr.elem.exp(x) * i.astype(np.float32)
    (y2,) = mgb.optimize_for_inference([y], f16_io_comp=True)
    feed = {"x": np.linspace(-1, 1, 4).astype(F32), "i": np.arange(4, dtype=np.int32)}
    _check_same(y, y2, feed, rtol=1e-2, atol=1e-2)
    mul = y2.node.owner.inputs[0].owner
    assert mul.outputs[0].dtype == np.float16


# ---- flags -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "flag",
    ["use_nhwcd4", "use_nchw32", "use_nchw44", "use_nchw44_dot", "use_chwn4"],
)  # fmt: skip
def test_layout_flags_not_implemented(flag):
    _, _, y, _ = _conv_net(None)
    with pytest.raises(mgb.MegBrainError, match=flag):
        mgb.optimize_for_inference([y], **{flag: True})


def test_at_most_one_layout_flag():
    _, _, y, _ = _conv_net(None)
    with pytest.raises(mgb.MegBrainError, match="at most one layout flag"):
        mgb.optimize_for_inference([y], use_nchw4=True, use_nchw88=True)


def test_f16_flags_exclusive():
    _, _, y, _ = _conv_net(None)
    with pytest.raises(mgb.MegBrainError, match="mutually exclusive"):
        mgb.optimize_for_inference([y], f16_io_comp=True, f16_io_f32_comp=True)


def test_log_level_2_logs_inference_replacements(caplog):
    g, x, y, feed = _conv_net("layers")
    g.set_option("log_level", 2)
    with caplog.at_level(logging.INFO, logger="megbrain"):
        mgb.optimize_for_inference([y], fuse_conv_bias_nonlinearity=True)
    msgs = " ".join(r.getMessage() for r in caplog.records if r.name == "megbrain")
    for name in ("normalize_affine_chain", "fold_conv_scale", "param_fuse",
                 "fuse_conv_bias_nonlinearity"):  # fmt: skip
        assert name in msgs
