"""Export of an int8 megbrain graph (TypeCvt into and out of the quantized dtypes, quantized
ConvBias, ElemwiseMultiType's quantized modes, pooling and MatrixMul) as QuantizeLinear /
QLinearConv / DequantizeLinear around float operators, MaxPool and MatMulInteger, run in
onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import megbrain as mgb  # noqa: E402
from megbrain.kernels.elemwise_multi_type import arity  # noqa: E402
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


def _run_both(outs, feed: dict):
    """``(megbrain's values, onnxruntime's values, model)`` of ``outs`` exported."""
    g = outs[0].owner_graph
    got = g.compile(list(feed), [mgb.copy_output(v) for v in outs])
    ours = got(*feed.values())
    ours = [np.asarray(v) for v in (ours if isinstance(ours, (list, tuple)) else [ours])]
    model = export(outs, None)
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    theirs = sess.run(None, {v.name: x for v, x in feed.items()})
    return ours, theirs, model


def _reloaded(model, feed: dict) -> list:
    """The outputs of ``model`` loaded back by megbrain's importer."""
    res = load(model)
    f = res.graph.compile([res.inputs[v.name] for v in feed],
                          [mgb.copy_output(v) for v in res.outputs.values()])  # fmt: skip
    got = f(*feed.values())
    return [np.asarray(v) for v in (got if isinstance(got, (list, tuple)) else [got])]


def _stored(a: np.ndarray) -> np.ndarray:
    """The stored integers of a quantized array, as int64."""
    return a.view(np.dtype(a.dtype.str)).astype(np.int64)


def _assert_ties_apart(ours, theirs, exact, scale):
    """megbrain's and onnxruntime's quantized results ``ours`` (stored integers) and
    ``theirs`` one unit apart at most, and only at a tie: where the float result ``exact``
    is half a unit from the grid (ONNX rounds ties to even, MegDNN away from zero; each side
    rounds the scaling once more or less)."""
    units = np.abs(_stored(ours) - theirs.astype(np.int64))
    assert units.max() <= 1, units.max()
    frac = np.mod(np.asarray(exact, np.float64) / scale, 1.0)[units == 1]
    assert np.all(np.abs(frac - 0.5) < 1e-3), frac


def _q_inputs(g, asymm: bool, shapes, scales, zps, rng):
    """Float inputs quantized by TypeCvt: ``(feed {var: value}, quantized vars)``."""
    feed, qs = {}, []
    for i, (shape, s, z) in enumerate(zip(shapes, scales, zps)):
        x = mgb.make_arg("cpu0", g, name=f"x{i}", shape=shape, dtype=np.float32)
        feed[x] = (rng.standard_normal(shape) * 2).astype(np.float32)
        qs.append(typecvt(x, quint8(s, z) if asymm else qint8(s)))
    return feed, qs


@settings(max_examples=25, deadline=None)
@given(st.booleans(), st.sampled_from(["QADD", "QFUSE_ADD_RELU", "QMUL", "QSUB", "QMAX",
                                       "QRELU", "QFUSE_ADD_SIGMOID", "QH_SWISH", "QABS"]),
       st.sampled_from([((2, 3, 4, 5), (2, 3, 4, 5)), ((2, 3, 4, 5), (1, 3, 1, 1))]),
       st.sampled_from([0.02, 0.05]), st.sampled_from([0.03, 0.011]),
       st.sampled_from([0.04, 0.1]), st.integers(0, 2**16))  # fmt: skip
def test_quantized_elemwise_multi_type_exports_as_qdq_within_one_unit(asymm, mode, shapes, sa,
                                                                      sb, sy, seed):  # fmt: skip
    rng = np.random.default_rng(seed)
    n = arity(mode)
    g = mgb.comp_graph()
    feed, qs = _q_inputs(g, asymm, shapes[:n], (sa, sb), (120, 131), rng)
    yd = quint8(sy, 125) if asymm else qint8(sy)
    y = mgb.opr.elemwise_multi_type(*qs, mode=mode, dtype=yd)
    ours, theirs, model = _run_both([y], feed)
    ops = {node.op_type for node in model.graph.node}
    assert {"DequantizeLinear", "QuantizeLinear"} <= ops, ops
    assert theirs[0].dtype == (np.uint8 if asymm else np.int8)
    exact = mgb.opr.elemwise(*(typecvt(q, np.float32) for q in qs), mode=mode[1:])
    (exact,) = _run_both([exact], feed)[0]
    _assert_ties_apart(ours[0], theirs[0], exact, sy)


@pytest.mark.parametrize("asymm", [False, True])
@pytest.mark.parametrize("mode, window, stride, pad", [
    ("MAX", 3, 2, 1), ("AVERAGE", 3, 2, 1), ("AVERAGE_COUNT_EXCLUDE_PADDING", 3, 2, 1),
    ("AVERAGE", 2, 2, 0), ("AVERAGE", 7, 1, 0),
])  # fmt: skip
def test_quantized_pooling_exports_max_exactly_averages_within_one_unit(asymm, mode, window,
                                                                         stride, pad):  # fmt: skip
    rng = np.random.default_rng(window + pad)
    g = mgb.comp_graph()
    feed, (q,) = _q_inputs(g, asymm, [(2, 3, 7, 7)], (0.03,), (110,), rng)
    y = mgb.opr.pooling(q, mode=mode, window_h=window, window_w=window, stride_h=stride,
                        stride_w=stride, pad_h=pad, pad_w=pad)  # fmt: skip
    ours, theirs, model = _run_both([y], feed)
    ops = {node.op_type for node in model.graph.node}
    if mode == "MAX":  # on the stored integers: exact
        assert "MaxPool" in ops and "DequantizeLinear" not in ops, ops
        np.testing.assert_array_equal(_stored(ours[0]), theirs[0])
        np.testing.assert_array_equal(_reloaded(model, feed)[0], theirs[0])
        return
    assert ("GlobalAveragePool" if window == 7 else "AveragePool") in ops, ops
    # the float average of the dequantized values (a Quantized8Asymm padding: 0.0)
    exact = mgb.opr.pooling(typecvt(q, np.float32), mode=mode, window_h=window,
                            window_w=window, stride_h=stride, stride_w=stride, pad_h=pad,
                            pad_w=pad)  # fmt: skip
    (exact,) = _run_both([exact], feed)[0]
    _assert_ties_apart(ours[0], theirs[0], exact, 0.03)


@pytest.mark.parametrize("asymm", [False, True])
@pytest.mark.parametrize("ta, tb", [(False, False), (False, True), (True, False)])
def test_quantized_matrix_mul_exports_as_matmul_integer_exactly(asymm, ta, tb):
    rng = np.random.default_rng(int(ta) * 2 + int(tb))
    g = mgb.comp_graph()
    sa, sb = (5, 7), (7, 3)
    shapes = [sa[::-1] if ta else sa, sb[::-1] if tb else sb]
    feed, (a, b) = _q_inputs(g, asymm, shapes, (0.05, 0.02), (120, 131), rng)
    y = mgb.opr.matrix_mul(a, b, transposeA=ta, transposeB=tb)
    assert mgb.dtype.dtype_name(y.dtype) == "QuantizedS32"
    ours, theirs, model = _run_both([y, typecvt(y, np.float32)], feed)
    assert "MatMulInteger" in {node.op_type for node in model.graph.node}
    # the int32 sums (the model's output holds a quantized var's stored integers), and their
    # dequantized value
    assert theirs[0].dtype == np.int32
    np.testing.assert_array_equal(_stored(ours[0]), theirs[0])
    np.testing.assert_array_equal(ours[1], theirs[1])
    for got, want in zip(_reloaded(model, feed), theirs):
        np.testing.assert_array_equal(got, want)


def test_quantized_elemwise_multi_type_into_qint32_is_refused():
    g = mgb.comp_graph()
    _, (a,) = _q_inputs(g, False, [(2, 3)], (0.1,), (0,), np.random.default_rng(0))
    y = mgb.opr.elemwise_multi_type(a, a, mode="QADD", dtype=qint32(0.01))
    with pytest.raises(ONNXConversionError, match="ElemwiseMultiType QADD into QuantizedS32"):
        export([y], None)
