"""megbrain.onnx.export: checked by onnx.checker and run by onnxruntime against megbrain."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import megbrain as mgb  # noqa: E402
from megbrain.onnx import ONNXConversionError, export, load  # noqa: E402


def _cnn(graph, cn, rng, batch=2):
    x = mgb.make_arg(cn, graph, dtype=np.float32, shape=(batch, 3, 8, 8), name="x")
    w1 = mgb.make_shared(
        cn, value=rng.standard_normal((4, 3, 3, 3)).astype(np.float32), comp_graph=graph, name="w1"
    )
    wg = mgb.make_shared(
        cn,
        value=rng.standard_normal((2, 3, 2, 3, 3)).astype(np.float32),
        comp_graph=graph,
        name="wg",
    )
    h = mgb.opr.elem.relu(mgb.opr.convolution(x, w1, pad_h=1, pad_w=1))
    h = mgb.opr.convolution(h, wg, pad_h=1, pad_w=1, sparse="GROUP")
    h = mgb.opr.pooling(h, mode="MAX")
    h = mgb.opr.pooling(
        h,
        mode="AVERAGE_COUNT_EXCLUDE_PADDING",
        pad_h=1,
        pad_w=1,
        window_h=3,
        window_w=3,
        stride_h=1,
        stride_w=1,
    )
    f = h.reshape(batch, -1)
    wf = mgb.make_immutable(cn, graph, (0.1 * rng.standard_normal((96, 5))).astype(np.float32))
    y = mgb.opr.elem.sigmoid(mgb.opr.matrix_mul(f, wf) * 0.5 - 1)
    y = mgb.opr.concat(y, y.sum(axis=1, keepdims=True), axis=1).dimshuffle(1, 0)
    return x, y


def test_export_cnn_matches_onnxruntime(tmp_path):
    rng = np.random.default_rng(0)
    cn = mgb.comp_node("cpu0")
    g = mgb.comp_graph()
    x, y = _cnn(g, cn, rng)
    xv = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    (want,) = g.compile([x], [mgb.copy_output(y)])(xv)
    path = tmp_path / "m.onnx"
    model = export([y], path, input_names=["data"], output_names=["prob"])
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (got,) = sess.run(None, {"data": xv})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # and it loads back
    res = load(path)
    (back,) = res.graph.compile([res.inputs["data"]], [mgb.copy_output(res.outputs["prob"])])(xv)
    np.testing.assert_allclose(back, want, rtol=1e-4, atol=1e-5)


def test_export_dynamic_axes_are_symbolic():
    cn = mgb.comp_node("cpu0")
    g = mgb.comp_graph()
    x = mgb.make_arg(cn, g, dtype=np.float32, shape=(2, 3), name="x")
    y = mgb.opr.elem.tanh(x) + 1
    model = export([y], None, dynamic_axes={"x": {0: "N"}, "output_0": {0: "N"}})
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    xv = np.linspace(-1, 1, 15, dtype=np.float32).reshape(5, 3)
    np.testing.assert_allclose(sess.run(None, {"x": xv})[0], np.tanh(xv) + 1, rtol=1e-6)


def test_export_refuses_operators_without_onnx_form():
    cn = mgb.comp_node("cpu0")
    g = mgb.comp_graph()
    x = mgb.make_arg(cn, g, dtype=np.float32, shape=(4,), name="x")
    y = mgb.opr.cumsum(x, 0)
    with pytest.raises(ONNXConversionError, match="Cumsum|has no ONNX form"):
        export([y], None)
