"""The compile-time fusion of the importer's layer normalization (``fuse_layer_norm``,
LayerNormLast): ONNX's LayerNormalization after a Transpose, as ConvNeXt has it, computes
what float64 does as one operator; it fuses only where nothing else reads the parts, and
graph files never see it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import megbrain as mgb
import megbrain.onnx as mo
from megbrain.errors import SerializationError

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _model(shape, eps, transpose, with_bias, mean_out, seed=0):
    """x -> [Transpose to channels-last] -> LayerNormalization(axis -1): the model, a feed
    and the float64 result."""
    rng = np.random.default_rng(seed)
    c = shape[1] if transpose else shape[-1]
    scale = rng.uniform(-2, 2, c).astype(np.float32)
    bias = rng.uniform(-1, 1, c).astype(np.float32)
    inits = [numpy_helper.from_array(scale, "scale")]
    ins = ["t" if transpose else "x", "scale"]
    if with_bias:
        inits.append(numpy_helper.from_array(bias, "bias"))
        ins.append("bias")
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1])] if transpose else []
    outs = ["y", "mean"] if mean_out else ["y"]
    nodes.append(helper.make_node("LayerNormalization", ins, outs, axis=-1, epsilon=eps))
    xv = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    t = np.moveaxis(xv, 1, -1) if transpose else xv
    infos = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs]
    g = helper.make_graph(nodes, "ln", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                      list(shape))],
                          infos, inits)  # fmt: skip
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    t64 = t.astype(np.float64)
    m = t64.mean(-1, keepdims=True)
    v = ((t64 - m) ** 2).mean(-1, keepdims=True)
    want = (t64 - m) / np.sqrt(v + np.float32(eps)) * scale + (bias if with_bias else 0)
    return model, xv, want


def _types(f):
    return [o.type_name for o in f.function._func.iter_opr_seq()]


@settings(max_examples=10, deadline=None)
@given(hw=st.integers(1, 9), c=st.sampled_from([1, 8, 24, 96]), transpose=st.booleans(),
       with_bias=st.booleans(), eps=st.sampled_from([1e-6, 1e-5, 0.01]))  # fmt: skip
def test_the_importers_layer_norm_is_one_operator_and_matches_float64(hw, c, transpose,
                                                                      with_bias, eps):  # fmt: skip
    shape = (1, c, hw, hw + 1) if transpose else (2, hw, c)
    model, xv, want = _model(shape, eps, transpose, with_bias, False)
    f = mo.load_inference(model)
    types = _types(f)
    assert types.count("LayerNormLast") == 1
    assert not {"Reduce", "JITExecutor", "Elemwise"} & set(types)
    np.testing.assert_allclose(f(xv)[0], want, rtol=1e-4, atol=1e-5)


def test_a_statistic_read_elsewhere_is_not_fused():
    model, xv, want = _model((1, 8, 3, 3), 1e-5, True, True, True)
    f = mo.load_inference(model)
    assert "LayerNormLast" not in _types(f)
    np.testing.assert_allclose(f(xv)[0], want, rtol=1e-4, atol=1e-5)


def test_graph_files_never_hold_it(tmp_path):
    model, xv, want = _model((1, 8, 3, 3), 1e-5, True, True, False)
    f = mo.load_inference(model)
    fused = next(o for o in f.function._func.iter_opr_seq() if o.type_name == "LayerNormLast")
    with pytest.raises(SerializationError, match=r"LayerNormLast.*before compile-time"):
        mgb.serialize_comp_graph_to_file(str(tmp_path / "f.mgb"),
                                         [mgb.SymbolVar(fused.outputs[0])])  # fmt: skip


def test_bad_operands_are_refused():
    from megbrain.graph import OperatorNodeConfig
    from megbrain.opr.dnn_norm import LayerNormLast, LayerNormLastParam

    g = mgb.comp_graph(check_env_var=False)
    x = mgb.make_arg("cpu0", g, name="x", shape=(2, 3, 8))
    s = mgb.make_shared("cpu0", value=np.ones(4, np.float32), comp_graph=g)
    with pytest.raises(mgb.MegBrainError, match=r"scale \{4\} must be \(8,\)"):
        g.insert_opr(LayerNormLast([x.node, s.node], LayerNormLastParam(1e-5),
                                   OperatorNodeConfig(comp_node="cpu0")))  # fmt: skip
    with pytest.raises(mgb.MegBrainError, match=r"must be an NCHW88 tensor \(N, C/8, H, W, 8\)"):
        g.insert_opr(LayerNormLast([x.node, s.node], LayerNormLastParam(1e-5, nchw88=True),
                                   OperatorNodeConfig(comp_node="cpu0")))  # fmt: skip


def test_fused_at_jit_level_2_too():
    # where the JIT closes a subgraph by a Reduce (the squares and their MEAN)
    model, xv, want = _model((1, 24, 5, 6), 1e-6, True, True, False)
    res = mo.load(model)
    outs = mgb.optimize_for_inference(list(res.outputs.values()))
    res.graph.set_option("graph_opt.jit", 2)
    f = res.graph.compile(list(res.inputs.values()), [mgb.copy_output(o) for o in outs])
    types = [o.type_name for o in f._func.iter_opr_seq()]
    assert "LayerNormLast" in types and "Reduce" not in types
    np.testing.assert_allclose(f(xv)[0], want, rtol=1e-4, atol=1e-5)


@settings(max_examples=6, deadline=None)
@given(cb=st.integers(1, 4), hw=st.integers(1, 9), with_bias=st.booleans())
def test_after_an_nchw88_convolution_it_reads_the_blocks_in_place(cb, hw, with_bias):
    # ConvNeXt's depthwise convolution (NCHW88 under load_inference), Transpose, LayerNorm:
    # no RelayoutFormat back to NCHW between them
    rng = np.random.default_rng(cb * 10 + hw)
    c = cb * 8
    wv = rng.uniform(-1, 1, (c, 1, 3, 3)).astype(np.float32)
    model, _, _ = _model((1, c, hw, hw + 1), 1e-6, True, with_bias, False, seed=hw)
    g = model.graph
    g.initializer.append(numpy_helper.from_array(wv, "w"))
    g.node.insert(0, helper.make_node("Conv", ["x", "w"], ["d"], group=c, kernel_shape=[3, 3],
                                      pads=[1, 1, 1, 1]))  # fmt: skip
    g.node[1].input[0] = "d"  # the Transpose reads the convolution
    xv = rng.standard_normal((1, c, hw, hw + 1)).astype(np.float32)
    f = mo.load_inference(model)
    seq = list(f.function._func.iter_opr_seq())
    (ln,) = [o for o in seq if o.type_name == "LayerNormLast"]
    assert ln.param.nchw88
    assert [o.param.mode for o in seq if o.type_name == "RelayoutFormat"] == ["NCHW_NCHW88"]
    pad = np.pad(xv.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    d = sum(pad[:, :, i:i + hw, j:j + hw + 1] * wv[None, :, 0, i, j, None, None]
            for i in range(3) for j in range(3))  # fmt: skip
    t = np.moveaxis(d, 1, -1)
    m, v = t.mean(-1, keepdims=True), t.var(-1, keepdims=True)
    scale = numpy_helper.to_array(g.initializer[0])
    bias = numpy_helper.to_array(g.initializer[1]) if with_bias else 0
    want = (t - m) / np.sqrt(v + np.float32(1e-6)) * scale + bias
    np.testing.assert_allclose(f(xv)[0], want, rtol=1e-4, atol=1e-5)
