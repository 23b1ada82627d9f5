"""ElemwiseMultiType (``mgb.opr.elemwise_multi_type``): the fixed-point modes and the quantized
``Q*`` modes against NumPy references, shape inference, params, errors and no gradient."""

from __future__ import annotations

import numpy as np
import pytest
from opr_harness import inputs, make_graph, run

import megbrain as mgb
from megbrain.errors import MegBrainError
from megbrain.graph import OPR_REGISTRY, infer_shape
from megbrain.opr import elemwise_multi_type
from megbrain.opr.elemwise_multi_type import MODES, ElemwiseMultiType

F32 = np.dtype(np.float32)
I8, I16, I32 = np.dtype(np.int8), np.dtype(np.int16), np.dtype(np.int32)
Mode = mgb.opr_param_defs.ElemwiseMultiType.Mode


def _run(mode, *arrays, dtype=None):
    g = make_graph()
    xs, _ = inputs(g, *arrays)
    out = elemwise_multi_type(*xs, mode=mode, dtype=dtype)
    (got,) = run([out], g)
    return out, got


# ---- NumPy references of MegDNN's integer helpers --------------------------------------------
def _round_shr(x, k):
    """x / 2**k rounded half away from zero, in Python integers."""
    x, k = np.broadcast_arrays(np.asarray(x, np.int64), np.asarray(k, np.int64))
    out = np.empty(x.shape, np.int64)
    for i, (xv, kv) in enumerate(zip(x.ravel().tolist(), k.ravel().tolist())):
        mag = abs(xv) if kv == 0 else (abs(xv) + (1 << (kv - 1))) >> kv
        out.ravel()[i] = mag if xv >= 0 else -mag
    return out


def _rmulh(a, b, bits):
    """round_mulh_saturate: (a * b + 2**(bits-2)) >> (bits-1), MIN * MIN saturating."""
    p = a.astype(np.int64) * b.astype(np.int64)
    r = (p + (1 << (bits - 2))) >> (bits - 1)
    return np.minimum(r, (1 << (bits - 1)) - 1)


# ---- fixed-point modes -----------------------------------------------------------------------
def test_fuse_mul_add3_int16x32x32x32():
    rng = np.random.default_rng(0)
    x = rng.integers(-30000, 30000, (3, 4)).astype(I16)
    y = rng.integers(-50000, 50000, (4,)).astype(I32)
    z = rng.integers(-1000, 1000, (3, 1)).astype(I32)
    out, got = _run("FUSE_MUL_ADD3_INT16x32x32x32", x, y, z)
    assert got.dtype == I32 and out.dtype == I32
    np.testing.assert_array_equal(got, x.astype(np.int64) * y + z)


@pytest.mark.parametrize("xdt", [I8, I16, I32, np.dtype(np.uint8)])
def test_fuse_mul_add3_ix_f32_f32_i8(xdt):
    x = np.array([0, 1, 2, 3, 5, 7, 100], xdt)
    k = np.array([0.5], F32)
    b = np.array([0.0, 0.0, 0.25, 0.0, -0.25, 200.0, -400.0], F32)
    _, got = _run("FUSE_MUL_ADD3_IXxF32xF32xI8", x, k, b)
    assert got.dtype == I8
    # rint: ties to even (0.5 -> 0, 1.5 -> 2); saturated to int8
    ref = np.clip(np.rint(k * x.astype(F32) + b), -128, 127)
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(got[:2], [0, 0])


def test_round_shr_saturate_ix_i8_i8():
    x = np.array([6, -6, 5, -5, 7, -7, 1000, -1000, 3], I32)
    k = np.array([2, 2, 1, 1, 0, 0, 2, 2, 1], I8)
    _, got = _run("ROUND_SHR_SATURATE_IXxI8xI8", x, k)
    assert got.dtype == I8
    np.testing.assert_array_equal(got, np.clip(_round_shr(x, k), -128, 127))
    np.testing.assert_array_equal(got[:4], [2, -2, 3, -3])  # halves away from zero


def test_round_shr_saturate_ix_i8_i16():
    x = np.array([[100000, -100000, 12345, -12345]], I32)
    k = np.array([[1], [4]], I8)
    out, got = _run("ROUND_SHR_SATURATE_IXxI8xI16", x, k)
    assert got.shape == (2, 4) and got.dtype == I16
    np.testing.assert_array_equal(got, np.clip(_round_shr(x, k), -32768, 32767))


@pytest.mark.parametrize("ctype, bits", [(I16, 16), (I32, 32)])
def test_fuse_add_rmulh_round_shr_saturate(ctype, bits):
    rng = np.random.default_rng(1)
    info = np.iinfo(ctype)
    x = rng.integers(info.min // 2, info.max // 2, (5, 6)).astype(ctype)
    y = rng.integers(info.min // 2, info.max // 2, (5, 6)).astype(ctype)
    x[0, 0] = y[0, 0] = info.min // 2  # the sum is MIN: MIN * MIN saturates in RMULH
    m = np.array([info.min], ctype)
    shift = np.array([3], I8)
    lo, hi = np.array([-100], I8), np.array([90], I8)
    mode = f"FUSE_ADD_RMULH_ROUND_SHR_SATURATE_INT{bits}x{bits}x{bits}x8"
    _, got = _run(mode, x, y, m, shift, lo, hi)
    assert got.dtype == I8
    s = (x.astype(np.int64) + y).astype(ctype)
    ref = np.clip(_round_shr(_rmulh(s, m, bits), shift), -128, 127)
    np.testing.assert_array_equal(got, np.clip(ref, -100, 90))


# ---- quantized modes -------------------------------------------------------------------------
def _quantize(real, scale, zp=0, lo=-128, hi=127):
    v = np.asarray(real, np.float32) / np.float32(scale)
    r = np.where(np.abs(v - np.trunc(v)) == 0.5, np.trunc(v) + np.sign(v), np.round(v))
    return np.clip(r + zp, lo, hi)


def _dequant(q):
    meta = q.dtype.metadata["mgb_dtype"]
    return (q.astype(np.float32) - np.float32(meta.get("zero_point", 0))) * np.float32(
        meta["scale"]
    )


QA = np.array([-40, -7, 0, 3, 25, 90], np.int8).astype(mgb.dtype.qint8(0.05))
QB = np.array([12, -30, 5, 5, -1, 60], np.int8).astype(mgb.dtype.qint8(0.1))
QC = np.array([3, 3, -3, 9, 0, -9], np.int8).astype(mgb.dtype.qint8(0.2))


@pytest.mark.parametrize(
    "mode, ref, args, exact",
    [
        ("QADD", np.add, (QA, QB), True),
        ("QSUB", np.subtract, (QA, QB), True),
        ("QMUL", np.multiply, (QA, QB), True),
        ("QMAX", np.maximum, (QA, QB), True),
        ("QFUSE_ADD_RELU", lambda a, b: np.maximum(a + b, 0), (QA, QB), True),
        ("QLT", lambda a, b: (a < b).astype(F32), (QA, QB), True),
        ("QTRUE_DIV", np.divide, (QA, QB), False),
        ("QRELU", lambda a: np.maximum(a, 0), (QA,), True),
        ("QNEGATE", np.negative, (QA,), True),
        ("QSIGMOID", lambda a: 1 / (1 + np.exp(-a)), (QA,), False),
        ("QTANH", np.tanh, (QA,), False),
        ("QH_SWISH", lambda a: a * np.clip(a + 3, 0, 6) / 6, (QA,), False),
        ("QFUSE_MUL_ADD3", lambda a, b, c: a * b + c, (QA, QB, QC), True),
    ],
)
def test_quantized_modes(mode, ref, args, exact):
    out_dt = mgb.dtype.qint8(0.04)
    out, got = _run(mode, *args, dtype=out_dt)
    assert out.dtype.metadata == out_dt.metadata and got.dtype.metadata == out_dt.metadata
    real = ref(*[_dequant(a) for a in args])
    want = _quantize(real, 0.04)
    if exact:
        np.testing.assert_array_equal(got, want)
    else:  # float32 transcendental functions may differ in the last bit across libraries
        np.testing.assert_allclose(got.astype(np.int64), want, atol=1)


def test_quantized_output_kinds_and_asymmetric_inputs():
    ua = np.array([0, 100, 128, 255], np.uint8).astype(mgb.dtype.quint8(0.1, 128))
    ub = np.array([128, 128, 200, 10], np.uint8).astype(mgb.dtype.quint8(0.2, 100))
    real = _dequant(ua) + _dequant(ub)
    for out_dt, zp, lo, hi in [
        (mgb.dtype.quint8(0.05, 50), 50, 0, 255),
        (mgb.dtype.qint32(0.001), 0, -(2**31), 2**31 - 1),
        (mgb.dtype.qint8(0.3), 0, -128, 127),
    ]:
        out, got = _run(Mode.convert("QADD"), ua, ub, dtype=out_dt)
        assert got.dtype.metadata == out_dt.metadata
        scale = out_dt.metadata["mgb_dtype"]["scale"]
        np.testing.assert_array_equal(got, _quantize(real, scale, zp, lo, hi))


def test_static_shape_inference_broadcasts():
    g = make_graph()
    (x, y), _ = inputs(g, np.zeros((2, 1, 3), I8).astype(mgb.dtype.qint8(1)),
                       np.zeros((4, 1), I8).astype(mgb.dtype.qint8(1)))  # fmt: skip
    out = elemwise_multi_type(x, y, mode="QADD", dtype=mgb.dtype.qint8(1))
    assert infer_shape(out.node) == (2, 4, 3)
    (got,) = run([out], g)
    assert got.shape == (2, 4, 3)


def test_mode_forms_param_object_and_registry():
    a, b = np.array([3], I32), np.array([1], I8)
    for mode in ("ROUND_SHR_SATURATE_IXxI8xI8", "round_shr_saturate_ixxi8xi8", 2,
                 Mode.ROUND_SHR_SATURATE_IXxI8xI8):  # fmt: skip
        out, got = _run(mode, a, b)
        assert out.node.owner.param.mode == "ROUND_SHR_SATURATE_IXxI8xI8"
        np.testing.assert_array_equal(got, [2])
    g = make_graph()
    (x, y), _ = inputs(g, a, b)
    param = mgb.opr_param_defs.ElemwiseMultiType(mode="ROUND_SHR_SATURATE_IXxI8xI8")
    out = elemwise_multi_type(x, y, param=param)
    assert isinstance(out.node.owner, ElemwiseMultiType)
    assert OPR_REGISTRY.get("ElemwiseMultiType") is ElemwiseMultiType
    assert MODES[0] == "FUSE_MUL_ADD3_INT16x32x32x32" and MODES[6] == "QADD"
    assert len(MODES) == len(Mode.__members__)
    with pytest.raises(MegBrainError, match="invalid mode"):
        elemwise_multi_type(x, y, mode="NOPE")


def test_quantized_outputs_of_different_scales_are_not_merged():
    g = make_graph()
    (x,), _ = inputs(g, np.array([10], I8).astype(mgb.dtype.qint8(0.1)))
    a = elemwise_multi_type(x, mode="QRELU", dtype=mgb.dtype.qint8(0.1))
    b = elemwise_multi_type(x, mode="QRELU", dtype=mgb.dtype.qint8(0.5))
    assert a.node is not b.node
    got = run([a, b], g)
    np.testing.assert_array_equal(got[0], [10])
    np.testing.assert_array_equal(got[1], [2])


def _graph_vars(*arrays):
    g = make_graph()
    xs, _ = inputs(g, *arrays)
    return xs


def test_errors_name_operator_mode_and_dtypes():
    q = mgb.dtype.qint8(0.1)
    qa, qb = np.zeros(3, I8).astype(q), np.zeros(3, np.uint8).astype(mgb.dtype.quint8(0.1, 3))
    x, y, f = _graph_vars(qa, qb, np.zeros(3, F32))
    with pytest.raises(MegBrainError, match=r"ElemwiseMultiType .*QADD takes 2 inputs, got 1"):
        elemwise_multi_type(x, mode="QADD", dtype=q)
    with pytest.raises(MegBrainError, match="QADD needs its quantized output dtype"):
        elemwise_multi_type(x, x, mode="QADD")
    with pytest.raises(MegBrainError, match=r"QADD: inputs must be of one quantized kind"):
        elemwise_multi_type(x, y, mode="QADD", dtype=q)
    with pytest.raises(MegBrainError, match=r"QADD: inputs must be quantized.*float32"):
        elemwise_multi_type(x, f, mode="QADD", dtype=q)
    with pytest.raises(MegBrainError, match="output dtype must be quantized"):
        elemwise_multi_type(x, x, mode="QADD", dtype="float32")
    with pytest.raises(MegBrainError, match=r"input 1 must be int8; got .*QuantizedS8"):
        elemwise_multi_type(f.astype("int32"), x, mode="ROUND_SHR_SATURATE_IXxI8xI8")
    with pytest.raises(MegBrainError, match="input 0 must be int32/int16"):
        elemwise_multi_type(f.astype("int8"), f.astype("int8"), mode="ROUND_SHR_SATURATE_IXxI8xI16")
    with pytest.raises(MegBrainError, match="gives int8; the requested output dtype int32"):
        elemwise_multi_type(f.astype("int32"), f.astype("int8"), mode=2, dtype="int32")


def test_no_gradient():
    x, k = _graph_vars(np.ones(3, I32), np.ones(1, I8))
    out = elemwise_multi_type(x, k, mode="ROUND_SHR_SATURATE_IXxI8xI8")
    with pytest.raises(MegBrainError, match="ElemwiseMultiType.*has no gradient"):
        out.node.owner.grad(0, [out.node])
