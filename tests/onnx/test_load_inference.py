"""``megbrain.onnx.load_inference``: the inference passes on by default (ConvBias fusion, the
NCHW88 layout), the same values as onnxruntime and as the unoptimized graph, and the calling
convention (positional or named inputs, unused inputs, 0-d outputs)."""

from __future__ import annotations

import warnings

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


def _plan_and_fast(f):
    """The compiled function's memory plan and its bound common call."""
    return f.function._func._plan, f.function._fast


def test_warm_up_plans_and_binds_at_load_and_changes_no_result():
    rng = np.random.default_rng(3)
    model = _bottleneck_model(rng)
    f = load_inference(model)
    plan, fast = _plan_and_fast(f)
    assert plan is not None and fast is not None  # planned, bound and run at load
    cold = load_inference(model, warm_up=False)
    assert _plan_and_fast(cold) == (None, None)
    for _ in range(2):
        x = rng.uniform(-1, 1, (1, 3, 12, 12)).astype(np.float32)
        (y,) = f(x)
        assert _plan_and_fast(f) == (plan, fast)  # the first call neither re-plans nor re-binds
        np.testing.assert_array_equal(y, cold(x)[0])


def _reshape_model() -> onnx.ModelProto:
    """y = Reshape(x, s): the shape s is an input."""
    g = helper.make_graph(
        [helper.make_node("Reshape", ["x", "s"], ["y"])],
        "reshape",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("s", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_warm_up_runs_static_inputs_on_their_values():
    f = load_inference(_reshape_model(), static_inputs={"s": np.array([3, 2])})
    assert _plan_and_fast(f)[0] is not None  # zeros for s would not reshape: its value was fed
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (y,) = f(x, np.array([3, 2]))
    np.testing.assert_array_equal(y, x.reshape(3, 2))


def test_a_warm_up_the_zeros_fail_leaves_the_function_usable():
    """y = Gather(d, int(1 / x)): zeros index out of range (1 / 0 is inf)."""
    g = helper.make_graph(
        [
            helper.make_node("Reciprocal", ["x"], ["r"]),
            helper.make_node("Cast", ["r"], ["i"], to=TensorProto.INT64),
            helper.make_node("Gather", ["d", "i"], ["y"]),
        ],
        "gather",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        initializer=[onnx.numpy_helper.from_array(np.array([5, 6, 7], np.float32), "d")],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the warm-up's errors and warnings are not the user's
        f = load_inference(model)
    (y,) = f(np.array([1, 0.5], np.float32))
    np.testing.assert_array_equal(y, [6, 7])
    with pytest.raises(IndexError, match="out of range"), np.errstate(all="ignore"):
        f(np.zeros(2, np.float32))


def test_no_warm_up_of_a_model_drawing_random_numbers():
    """Dropout in training mode: a run would advance its generator."""
    g = helper.make_graph(
        [helper.make_node("Dropout", ["x", "r", "t"], ["y"])],
        "dropout",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64])],
        initializer=[
            onnx.numpy_helper.from_array(np.array(0.5, np.float32), "r"),
            onnx.numpy_helper.from_array(np.array(True), "t"),
        ],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    f, cold = load_inference(model), load_inference(model, warm_up=False)
    assert _plan_and_fast(f) == (None, None)
    x = np.ones(64, np.float32)
    np.testing.assert_array_equal(f(x)[0], cold(x)[0])


def test_no_warm_up_of_a_model_whose_input_shape_is_not_known():
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
    )
    f = load_inference(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    assert _plan_and_fast(f) == (None, None)
    x = np.array([[-1, 2, 3], [4, -5, 6]], np.float32)
    np.testing.assert_array_equal(f(x)[0], np.maximum(x, 0))


def _linear_model(rng) -> onnx.ModelProto:
    """ConvNeXt's channels-last Linear layers (an N-d MatMul by a constant matrix, an Add of
    the bias), then a classifier's Gemm (transB, bias) over the flattened rows."""
    from onnx import numpy_helper

    w1 = rng.uniform(-0.3, 0.3, (24, 40)).astype(np.float32)
    b1 = rng.uniform(-1, 1, 40).astype(np.float32)
    w2 = rng.uniform(-0.3, 0.3, (10, 7 * 5 * 40)).astype(np.float32)
    b2 = rng.uniform(-1, 1, 10).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["r"]),
        helper.make_node("Flatten", ["r"], ["f"]),
        helper.make_node("Gemm", ["f", "w2", "b2"], ["y"], transB=1),
    ]
    inits = [numpy_helper.from_array(v, k) for k, v in (("w1", w1), ("b1", b1), ("w2", w2),
                                                        ("b2", b2))]  # fmt: skip
    g = helper.make_graph(nodes, "linear",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 7, 5, 24])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
                          inits)  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_products_by_constant_weights_are_packed_and_match_onnxruntime(monkeypatch):
    from megbrain.kernels import packed_gemm

    taken = []
    bind = packed_gemm.bind_packed_matmul
    monkeypatch.setattr(packed_gemm, "bind_packed_matmul",
                        lambda a, b, *r, **kw: taken.append(b.shape) or bind(a, b, *r, **kw))
    rng = np.random.default_rng(2)
    model = _linear_model(rng)
    f = load_inference(model.SerializeToString())
    x = rng.uniform(-1, 1, (1, 7, 5, 24)).astype(np.float32)
    (y,) = f(x)
    assert sorted(taken) == [(24, 40), (1400, 10)]  # the MatMul's rows, the Gemm's transB
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(y, sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape", [(5, 17), (2, 3, 17), (1, 4, 6, 17)])
def test_an_n_d_matmul_by_a_constant_matrix_matches_float64(shape):
    from onnx import numpy_helper

    rng = np.random.default_rng(len(shape))
    w = rng.uniform(-1, 1, (17, 33)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w")])  # fmt: skip
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.uniform(-1, 1, shape).astype(np.float32)
    (y,) = load_inference(model.SerializeToString())(x)
    np.testing.assert_allclose(y, x.astype(np.float64) @ w, rtol=1e-4, atol=1e-5)
