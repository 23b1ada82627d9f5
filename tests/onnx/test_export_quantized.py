"""Export of an int8 megbrain graph (TypeCvt into and out of the quantized dtypes, quantized
ConvBias) as QuantizeLinear / QLinearConv / DequantizeLinear, run in onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import megbrain as mgb  # noqa: E402
from megbrain.onnx import ONNXConversionError, export, load  # noqa: E402
from megbrain.opr import conv_bias_activation, typecvt  # noqa: E402

qint8, quint8, qint32 = mgb.dtype.qint8, mgb.dtype.quint8, mgb.dtype.qint32


def _int8_net(asymm, mode, sx, sw, sy, rng, group=1, out_dt=None):
    """x (float32) -> quantize -> ConvBias(int8 filter, int32 bias) -> dequantize."""
    g = mgb.comp_graph()
    x = mgb.make_arg("cpu0", g, name="x", shape=(2, 2 * group, 7, 6), dtype=np.float32)
    if asymm:
        xd, wd, yd = quint8(sx, 120), quint8(sw, 131), quint8(sy, 100)
        wv = rng.integers(0, 256, (group, 3, 2, 3, 3)).astype(np.uint8)
    else:
        xd, wd, yd = qint8(sx), qint8(sw), qint8(sy)
        wv = rng.integers(-128, 128, (group, 3, 2, 3, 3)).astype(np.int8)
    wv = wv if group > 1 else wv[0]
    bd = qint32(float(np.float32(sx) * np.float32(sw)))
    bv = rng.integers(-3000, 3000, (1, 3 * group, 1, 1)).astype(np.int32)
    w = mgb.make_immutable("cpu0", g, wv.view(wd))
    b = mgb.make_immutable("cpu0", g, bv.view(bd))
    kw = {"sparse": "GROUP"} if group > 1 else {}
    y = conv_bias_activation(typecvt(x, xd), w, b, nonlineMode=mode, dtype=out_dt or yd,
                             pad_h=1, pad_w=0, stride_h=2, **kw)  # fmt: skip
    return x, typecvt(y, np.float32), yd


@settings(max_examples=20, deadline=None)
@given(st.booleans(), st.sampled_from(["IDENTITY", "RELU"]), st.sampled_from([1, 2]),
       st.sampled_from([0.05, 0.1, 0.013]), st.sampled_from([0.02, 0.007]),
       st.sampled_from([0.5, 1.3, 4.0]), st.integers(0, 2**16))  # fmt: skip
def test_int8_conv_bias_exports_as_qlinear_nodes_within_one_unit(asymm, mode, group, sx, sw, sy,
                                                                 seed):  # fmt: skip
    rng = np.random.default_rng(seed)
    x, y, yd = _int8_net(asymm, mode, sx, sw, sy, rng, group)
    xv = (rng.standard_normal((2, 2 * group, 7, 6)) * 3).astype(np.float32)
    want = x.owner_graph.compile([x], [mgb.copy_output(y)])(xv)
    want = want[0] if isinstance(want, (list, tuple)) else want
    model = export([y], None)
    onnx.checker.check_model(model, full_check=True)
    ops = {n.op_type for n in model.graph.node}
    assert {"QuantizeLinear", "QLinearConv", "DequantizeLinear"} <= ops, ops
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"x": xv})[0]
    # the quantize steps round ties to even in ONNX, away from zero in MegDNN, and the
    # requantize multiplier is rounded once in onnxruntime: one output unit at most
    units = np.abs(got.astype(np.float64) - want) / np.float32(sy)
    assert units.max() <= 1 + 1e-3, units.max()
    assert (units < 1e-3).mean() >= 0.9
    # the exported model comes back through the importer onto the quantized operators
    res = load(model)
    back = res.graph.compile([res.inputs["x"]], [mgb.copy_output(v) for v in
                                                 res.outputs.values()])(xv)  # fmt: skip
    back = back[0] if isinstance(back, (list, tuple)) else back
    np.testing.assert_array_equal(np.asarray(back), got)


def test_int8_conv_bias_with_h_swish_is_refused_naming_the_operator():
    _, y, _ = _int8_net(False, "H_SWISH", 0.1, 0.02, 0.5, np.random.default_rng(0))
    with pytest.raises(ONNXConversionError, match="ConvBias.*H_SWISH"):
        export([y], None)


def test_a_quantized_elemwise_is_refused():
    g = mgb.comp_graph()
    x = mgb.make_arg("cpu0", g, name="x", shape=(2, 3), dtype=np.float32)
    q = typecvt(x, qint8(0.1))
    y = typecvt(mgb.opr.elemwise(q, q, mode="ADD"), np.float32)
    with pytest.raises(ONNXConversionError, match="Elemwise.*no ONNX form"):
        export([y], None)
