"""``megbrain.onnx.load_inference``: the inference passes on by default (ConvBias fusion, the
NCHW88 layout), the same values as onnxruntime and as the unoptimized graph, and the calling
convention (positional or named inputs, unused inputs, 0-d outputs)."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
from test_inference_graph import _bottleneck_model  # noqa: E402

import megbrain as mgb  # noqa: E402
from megbrain.onnx import InferenceFunction, load, load_inference  # noqa: E402


def _tiny_model(path) -> str:
    """y = relu(2 x), n = ReduceSum(y) (0-d); an input u that no output reads."""
    x, u = (helper.make_tensor_value_info(k, TensorProto.FLOAT, [2, 3]) for k in "xu")
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    n = helper.make_tensor_value_info("n", TensorProto.FLOAT, [])
    nodes = [
        helper.make_node("Add", ["x", "x"], ["h"]),
        helper.make_node("Relu", ["h"], ["y"]),
        helper.make_node("ReduceSum", ["y"], ["n"], keepdims=0),
    ]
    g = helper.make_graph(nodes, "tiny", [x, u], [y, n])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


def test_cnn_runs_fused_blocked_convolutions_and_matches():
    rng = np.random.default_rng(0)
    model = _bottleneck_model(rng)
    f = load_inference(model.SerializeToString())
    assert isinstance(f, InferenceFunction)
    assert f.input_names == ["x"] and f.output_names == ["y"]
    oprs = list(f.function._func.iter_opr_seq())
    formats = [o.param.format for o in oprs if o.type_name == "ConvBiasForward"]
    assert len(formats) == 3 and "NCHW88" in formats  # bias and ReLU fused, blocked layout
    assert not any(o.type_name == "BatchNormForward" for o in oprs)
    x = rng.uniform(-1, 1, (1, 3, 12, 12)).astype(np.float32)
    (y,) = f(x)
    res = load(model)
    plain = res.graph.compile([res.inputs["x"]], [mgb.copy_output(res.outputs["y"])])
    want = np.asarray(plain(x)[0])
    assert y.shape == want.shape == (1, 5)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(y, sess.run(None, {"x": x})[0], rtol=1e-3, atol=1e-4)


def test_calling_convention(tmp_path):
    f = load_inference(_tiny_model(tmp_path / "tiny.onnx"))
    assert f.input_names == ["x", "u"] and f.output_names == ["y", "n"]
    x = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    u = np.zeros((2, 3), np.float32)
    want = np.maximum(2 * x, 0)
    for y, n in (f(x, u), f(x=x, u=u), f(x, u=u)):
        np.testing.assert_allclose(y, want, rtol=1e-6)
        assert n.shape == () and np.isclose(n, want.sum(), rtol=1e-5)
    with pytest.raises(TypeError, match="missing input"):
        f(x)
    with pytest.raises(TypeError, match="unknown input 'z'"):
        f(x, u, z=x)
    with pytest.raises(TypeError, match="given twice"):
        f(x, x=x, u=u)
    with pytest.raises(TypeError, match="takes 2 input"):
        f(x, u, x)
    assert "InferenceFunction(inputs=['x', 'u'], outputs=['y', 'n'])" == repr(f)


def test_builds_into_the_given_graph():
    from megbrain.plugin import CompGraphProfiler

    graph = mgb.comp_graph()
    prof = CompGraphProfiler(graph)
    f = load_inference(_bottleneck_model(np.random.default_rng(2)), graph=graph)
    assert f.graph is graph
    f(np.zeros((1, 3, 12, 12), np.float32))
    assert any(e[0].type_name == "ConvBiasForward" for e in prof._observer.events)


def test_refused_model_raises_conversion_error():
    from megbrain.onnx import ONNXConversionError

    node = helper.make_node("Unique", ["x"], ["y"])
    g = helper.make_graph(
        [node],
        "bad",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ONNXConversionError, match="Unique"):
        load_inference(model)
