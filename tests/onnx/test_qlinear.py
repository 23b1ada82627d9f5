"""ONNX's integer quantized operators imported onto megbrain's quantized operators, equal to
onnxruntime bit for bit on random shapes, scales and zero points (int8 and uint8)."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import megbrain as mgb  # noqa: E402
from megbrain.onnx import ONNXConversionError, load  # noqa: E402

_T = {np.dtype(np.uint8): TensorProto.UINT8, np.dtype(np.int8): TensorProto.INT8,
      np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int32): TensorProto.INT32}  # fmt: skip


def _model(node, inputs, out_type, inits, opset=13):
    vis = [helper.make_tensor_value_info(n, _T[a.dtype], a.shape) for n, a in inputs]
    g = helper.make_graph(
        [node], "g", vis, [helper.make_tensor_value_info("y", out_type, None)],
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in inits],
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _both(model, inputs, reference=False):
    """The outputs of onnxruntime (or of ONNX's reference evaluator, for what onnxruntime
    does not run) and of megbrain's import."""
    feeds = dict(inputs)
    if reference:
        want = ReferenceEvaluator(model).run(None, feeds)
    else:
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        want = sess.run(None, feeds)
    res = load(model)
    f = res.graph.compile(list(res.inputs.values()),
                          [mgb.copy_output(v) for v in res.outputs.values()])  # fmt: skip
    got = f(*[feeds[k] for k in res.inputs])
    got = got if isinstance(got, (list, tuple)) else [got]
    return want, got


def _assert_equal(want, got):
    for w, g in zip(want, got):
        g = np.asarray(g)
        if w.ndim == 0:  # megbrain holds an ONNX 0-d value as (1,)
            g = g.reshape(())
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        np.testing.assert_array_equal(g, w)


def _q(rng, shape, dt):
    lo, hi = (0, 255) if np.dtype(dt) == np.uint8 else (-128, 127)
    return rng.integers(lo, hi + 1, shape).astype(dt)


def _zp(rng, dt, zero):
    if zero:
        return np.array(0, dt)
    return np.array(rng.integers(0, 256) if np.dtype(dt) == np.uint8 else rng.integers(-20, 20), dt)


_SCALES = st.sampled_from([0.5, 0.25, 0.1, 0.0173, 0.003, 1.7, 0.0421])
_KINDS = st.sampled_from([(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)])


@settings(max_examples=10, deadline=None)
@given(_KINDS, st.integers(1, 2), st.integers(1, 3), st.integers(1, 3), st.integers(1, 3),
       st.integers(1, 2), st.integers(0, 2), st.integers(1, 2), st.booleans(), st.booleans(),
       _SCALES, _SCALES, _SCALES, st.booleans(), st.integers(0, 2**16))  # fmt: skip
def test_qlinear_conv_equals_onnxruntime(kinds, n, g, icg, ocg, k, pad, stride, per_channel,
                                         with_bias, sx, sw, sy, zero_x, seed):  # fmt: skip
    xt, wt = kinds
    rng = np.random.default_rng(seed)
    c, oc = g * icg, g * ocg
    x = _q(rng, (n, c, 7, 6), xt)
    w = _q(rng, (oc, icg, k, k), wt)
    wscale = (sw * rng.uniform(0.5, 2, oc) if per_channel else np.array(sw)).astype(np.float32)
    # onnxruntime takes per-channel int8 weights with zero zero points only
    zw = np.zeros(oc if per_channel else (), wt) if (per_channel or wt == np.int8) else _zp(
        rng, wt, False)  # fmt: skip
    yt = xt
    inits = [("xs", np.float32(sx)), ("xz", _zp(rng, xt, zero_x)), ("w", w), ("ws", wscale),
             ("wz", zw), ("ys", np.float32(sy * 20)), ("yz", _zp(rng, yt, False))]  # fmt: skip
    names = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"]
    if with_bias:
        inits.append(("b", rng.integers(-5000, 5000, oc).astype(np.int32)))
        names.append("b")
    node = helper.make_node("QLinearConv", names, ["y"], group=g, pads=[pad] * 4,
                            strides=[stride] * 2)  # fmt: skip
    model = _model(node, [("x", x)], _T[np.dtype(yt)], inits)
    _assert_equal(*_both(model, [("x", x)]))


def test_qlinear_conv_1d_and_asymmetric_auto_pad():
    rng = np.random.default_rng(3)
    x, w = _q(rng, (1, 3, 9), np.uint8), _q(rng, (4, 3, 4), np.uint8)
    inits = [("xs", np.float32(0.05)), ("xz", np.uint8(100)), ("w", w), ("ws", np.float32(0.02)),
             ("wz", np.uint8(120)), ("ys", np.float32(0.3)), ("yz", np.uint8(128))]  # fmt: skip
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"],
                            auto_pad="SAME_UPPER")  # fmt: skip
    _assert_equal(*_both(_model(node, [("x", x)], TensorProto.UINT8, inits), [("x", x)]))


@settings(max_examples=30, deadline=None)
@given(_KINDS, st.sampled_from([((3, 20), (20, 5)), ((2, 4, 7), (7, 3)), ((2, 1, 3, 6), (4, 6, 2)),
                                ((8,), (8, 3))]),
       st.booleans(), st.booleans(), _SCALES, _SCALES, _SCALES,
       st.integers(0, 2**16))  # fmt: skip
def test_qlinear_matmul_equals_onnxruntime(kinds, shapes, zero_a, per_column, sa, sb, sy, seed):
    at, bt = kinds
    rng = np.random.default_rng(seed)
    a, b = _q(rng, shapes[0], at), _q(rng, shapes[1], bt)
    n = shapes[1][-1]
    per_column = per_column and len(shapes[1]) == 2
    bs = (sb * rng.uniform(0.5, 2, n) if per_column else np.array(sb)).astype(np.float32)
    bz = _zp(rng, bt, bt == np.int8)
    inits = [("as", np.float32(sa)), ("az", _zp(rng, at, zero_a)), ("b", b),
             ("bs", bs), ("bz", np.full(n, bz) if per_column else bz),
             ("ys", np.float32(sy * 10)), ("yz", _zp(rng, at, False))]  # fmt: skip
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"],
                            ["y"])  # fmt: skip
    _assert_equal(*_both(_model(node, [("a", a)], _T[np.dtype(at)], inits), [("a", a)]))


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([np.uint8, np.int8]), st.integers(1, 2), st.integers(1, 3),
       st.integers(0, 1), st.booleans(), st.booleans(), st.integers(0, 2**16))  # fmt: skip
def test_conv_integer_equals_onnxruntime(xt, g, k, pad, with_zp, per_channel, seed):
    rng = np.random.default_rng(seed)
    x, w = _q(rng, (2, 2 * g, 6, 5), xt), _q(rng, (3 * g, 2, k, k), np.uint8)
    names, inits = ["x", "w"], [("w", w)]
    if with_zp:
        wz = rng.integers(0, 256, 3 * g).astype(np.uint8) if per_channel else _zp(
            rng, np.uint8, False)  # fmt: skip
        names += ["xz", "wz"]
        inits += [("xz", _zp(rng, xt, False)), ("wz", wz)]
    node = helper.make_node("ConvInteger", names, ["y"], group=g, pads=[pad] * 4)
    # onnxruntime takes per-tensor zero points only
    model = _model(node, [("x", x)], TensorProto.INT32, inits)
    _assert_equal(*_both(model, [("x", x)], reference=with_zp and per_channel))


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)]),
       st.sampled_from([((3, 20), (20, 5)), ((2, 4, 7), (7, 3))]), st.booleans(),
       st.integers(0, 2**16))  # fmt: skip
def test_matmul_integer_equals_onnxruntime(kinds, shapes, with_zp, seed):
    at, bt = kinds
    rng = np.random.default_rng(seed)
    a, b = _q(rng, shapes[0], at), _q(rng, shapes[1], bt)
    names, inits = ["a", "b"], [("b", b)]
    if with_zp:
        names += ["az", "bz"]
        inits += [("az", _zp(rng, at, False)), ("bz", _zp(rng, bt, False))]
    node = helper.make_node("MatMulInteger", names, ["y"])
    _assert_equal(*_both(_model(node, [("a", a)], TensorProto.INT32, inits), [("a", a)]))


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**16), st.sampled_from([1.0, 0.01, 300.0]), st.booleans())
def test_dynamic_quantize_linear_equals_onnxruntime(seed, mag, positive):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((3, 17)) * mag).astype(np.float32)
    if positive:
        x = np.abs(x)
    g = helper.make_graph(
        [helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info(n, t, None)
         for n, t in (("y", TensorProto.UINT8), ("s", TensorProto.FLOAT),
                      ("z", TensorProto.UINT8))],
    )  # fmt: skip
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    _assert_equal(*_both(model, [("x", x)]))


def test_qlinear_conv_uses_the_quantized_operators():
    rng = np.random.default_rng(1)
    x, w = _q(rng, (1, 4, 5, 5), np.int8), _q(rng, (2, 4, 3, 3), np.int8)
    inits = [("xs", np.float32(0.1)), ("xz", np.int8(0)), ("w", w), ("ws", np.float32(0.02)),
             ("wz", np.int8(0)), ("ys", np.float32(0.5)), ("yz", np.int8(0)),
             ("b", np.arange(2, dtype=np.int32))]  # fmt: skip
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"],
                            ["y"])  # fmt: skip
    res = load(_model(node, [("x", x)], TensorProto.INT8, inits))
    oprs = mgb.cgtools.get_oprs_seq(list(res.outputs.values()))
    assert "ConvBiasForward" in {o.type for o in oprs}
    names = {mgb.dtype.dtype_name(v.dtype) for o in oprs for v in o.outputs}
    assert {"QuantizedS8", "QuantizedS32"} <= names


def test_qlinear_conv_with_per_channel_weight_zero_points_equals_onnxruntime():
    rng = np.random.default_rng(5)
    x, w = _q(rng, (2, 4, 6, 6), np.uint8), _q(rng, (6, 2, 3, 3), np.uint8)
    inits = [("xs", np.float32(0.03)), ("xz", np.uint8(90)), ("w", w),
             ("ws", rng.uniform(0.01, 0.05, 6).astype(np.float32)),
             ("wz", rng.integers(0, 256, 6).astype(np.uint8)), ("ys", np.float32(2.5)),
             ("yz", np.uint8(128)), ("b", rng.integers(-900, 900, 6).astype(np.int32))]  # fmt: skip
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"],
                            ["y"], group=2, pads=[1, 0, 1, 2])  # fmt: skip
    _assert_equal(*_both(_model(node, [("x", x)], TensorProto.UINT8, inits), [("x", x)]))


def test_differing_per_column_matmul_zero_points_are_refused_naming_the_node():
    rng = np.random.default_rng(2)
    a, b = _q(rng, (2, 4), np.uint8), _q(rng, (4, 2), np.uint8)
    inits = [("as", np.float32(0.1)), ("az", np.uint8(3)), ("b", b),
             ("bs", np.array([0.1, 0.2], np.float32)), ("bz", np.array([1, 2], np.uint8)),
             ("ys", np.float32(0.5)), ("yz", np.uint8(0))]  # fmt: skip
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"],
                            ["y"], name="qm")  # fmt: skip
    with pytest.raises(ONNXConversionError, match="qm.*b_zero_point"):
        load(_model(node, [("a", a)], TensorProto.UINT8, inits))
