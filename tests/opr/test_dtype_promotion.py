"""Elemwise dtype promotion as MegBrain's ``Elemwise::make`` does it: mixed inputs are
converted by TypeCvt operators to one dtype (``dtype_promotion``), integer inputs of
float-only modes become float32, and numbers take the vars' dtype (float values stay float)."""

from __future__ import annotations

import numpy as np
import pytest
from opr_harness import check_opr, inputs, make_graph, run

import megbrain as mgb
from megbrain.errors import ConversionError, MegBrainError
from megbrain.opr import elem, elemwise, reduce_
from megbrain.opr.basic_arith import Elemwise, TypeCvt, dtype_promotion
from megbrain.opr.grad import grad

F16, F32, BF16 = np.dtype(np.float16), np.dtype(np.float32), mgb.dtype.bfloat16
I8, I16, I32, U8 = (np.dtype(t) for t in (np.int8, np.int16, np.int32, np.uint8))


# ---- the pairwise rule ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "a, b, want",
    [
        (F32, I32, F32),
        (I32, F32, F32),
        (I16, I32, I32),
        (I8, I16, I16),
        (U8, U8, U8),
        (F16, F16, F16),
        (F16, F32, F32),
        (F16, I8, F32),  # float16 counts as float32 once dtypes differ
        (BF16, F32, F32),
        (U8, F16, F32),
    ],
)
def test_plain_promotion(a, b, want):
    assert dtype_promotion(a, b) == want


@pytest.mark.parametrize("a, b", [(U8, I8), (I16, U8)])
def test_signedness_mismatch_has_no_rule(a, b):
    with pytest.raises(ConversionError, match="different signedness"):
        dtype_promotion(a, b)


def test_quantized_promotion():
    q = mgb.dtype.qint8(0.1)
    # a quantized dtype wins over a plain one
    for plain in (F32, I32):
        assert dtype_promotion(q, plain).metadata == q.metadata
        assert dtype_promotion(plain, q).metadata == q.metadata
    # nearly equal scales (below 1e-6) keep the first
    near = mgb.dtype.qint8(0.1 + 1e-9)
    assert dtype_promotion(q, near).metadata == q.metadata
    with pytest.raises(ConversionError, match="quantization parameters differ"):
        dtype_promotion(q, mgb.dtype.qint8(0.2))
    with pytest.raises(ConversionError, match="quantization parameters differ"):
        dtype_promotion(mgb.dtype.quint8(0.1, 3), mgb.dtype.quint8(0.1, 4))
    with pytest.raises(ConversionError, match="can not promote"):
        dtype_promotion(q, mgb.dtype.quint8(0.1, 3))


# ---- through the graph ---------------------------------------------------------------------
def _opr_inputs(var):
    return [v.dtype for v in var.node.owner.inputs]


@pytest.mark.parametrize(
    "mode, ref",
    [("ADD", np.add), ("SUB", np.subtract), ("MUL", np.multiply), ("MAX", np.maximum)],
)
@pytest.mark.parametrize("order", [0, 1])
def test_mixed_float32_int32_binary(mode, ref, order):
    f = np.array([[0.5, -1.25, 3.0]], np.float32)
    i = np.array([[2], [-3]], np.int32)
    arrays = [f, i] if order == 0 else [i, f]

    def build(x, y):
        out = elemwise(x, y, mode=mode)
        assert out.dtype == F32
        # the operator computes in one dtype: the int32 input went through a TypeCvt
        assert _opr_inputs(out) == [F32, F32]
        cvt = [v.owner for v in out.node.owner.inputs if isinstance(v.owner, TypeCvt)]
        assert len(cvt) == 1 and cvt[0].inputs[0].dtype == I32
        return out

    (got,) = check_opr(build, lambda a, b: ref(a.astype(F32), b.astype(F32)), arrays)
    assert got.dtype == F32


def test_int16_int32_gives_int32():
    a = np.array([30000, -30000], np.int16)
    b = np.array([30000, 5], np.int32)
    (got,) = check_opr(lambda x, y: x + y, lambda x, y: x.astype(I32) + y, [a, b])
    assert got.dtype == I32  # no int16 wrap-around: the sum is taken in int32


def test_int32_true_div_is_float32():
    a = np.array([7, -7, 1, 0], np.int32)
    b = np.array([2, 2, 3, 5], np.int32)
    (got,) = check_opr(lambda x, y: x / y, lambda x, y: x.astype(F32) / y.astype(F32), [a, b])
    assert got.dtype == F32
    np.testing.assert_array_equal(got[:2], [3.5, -3.5])


@pytest.mark.parametrize("mode, ref", [("FLOOR", np.floor), ("EXP", np.exp), ("SIN", np.sin)])
def test_float_only_unary_modes_convert_int_to_float32(mode, ref):
    a = np.array([3, -2, 0, 1], np.int32)
    (got,) = check_opr(lambda x: elemwise(x, mode=mode), lambda x: ref(x.astype(F32)), [a])
    assert got.dtype == F32


def test_int_modes_keep_int():
    a = np.array([3, -2, 0], np.int32)
    (got,) = check_opr(lambda x: elemwise(x, mode="RELU"), lambda x: np.maximum(x, 0), [a])
    assert got.dtype == I32
    (got,) = check_opr(lambda x: x // 2, lambda x: x // 2, [a])
    assert got.dtype == I32


def test_float_input_of_int_only_mode_raises():
    g = make_graph()
    (x, y), _ = inputs(g, np.ones(3, np.float32), np.ones(3, np.int32))
    with pytest.raises(ConversionError, match="SHL does not allow float"):
        elemwise(x, y, mode="SHL")


def test_scalars_take_the_vars_dtype_except_floats_on_ints():
    a = np.array([1, 2, 3], np.int32)
    (got,) = check_opr(lambda x: x * 0.5, lambda x: x * np.float32(0.5), [a])
    assert got.dtype == F32
    (got,) = check_opr(lambda x: 1.5 - x, lambda x: np.float32(1.5) - x, [a])
    assert got.dtype == F32
    (got,) = check_opr(lambda x: x + 1, lambda x: x + 1, [a])
    assert got.dtype == I32
    h = np.array([1, 2], np.float16)
    (got,) = check_opr(lambda x: x * 3.0, lambda x: x * np.float16(3), [h])
    assert got.dtype == F16
    s = np.array([100, -100], np.int16)
    (got,) = check_opr(lambda x: x + 1, lambda x: x + np.int16(1), [s])
    assert got.dtype == I16


def test_elem_namespace_and_operators_share_the_path():
    a = np.array([3, 4], np.int32)
    f = np.array([0.5, 0.25], np.float32)
    (got,) = check_opr(lambda x, y: elem.mul(x, y), lambda x, y: x * y, [a, f])
    assert got.dtype == F32
    (got,) = check_opr(lambda x: elem.true_div(x, 2), lambda x: x / np.float32(2), [a])
    assert got.dtype == F32
    (got,) = check_opr(lambda x, y: elem.fuse_mul_add3(x, y, 1), lambda x, y: x * y + 1, [a, f])
    assert got.dtype == F32


def test_gradient_reaches_the_float_input():
    xv = np.array([0.5, -1.0, 2.0], np.float32)
    kv = np.array([3, -2, 5], np.int32)
    g = make_graph()
    (x, k), _ = inputs(g, xv, kv)
    loss = reduce_(x * k + (x - k) * (x - k) / k, "SUM")
    (dx,) = grad(loss, [x])
    (got,) = run([dx], g)
    kf = kv.astype(np.float64)
    want = kf + 2 * (xv - kf) / kf
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert got.dtype == F32


def test_operator_itself_still_takes_one_dtype():
    from megbrain.opr import insert_opr, make_opr_config
    from megbrain.opr.basic_arith import ElemwiseParam

    g = make_graph()
    (x, y), _ = inputs(g, np.ones(3, np.float32), np.ones(3, np.int32))
    with pytest.raises(MegBrainError, match="inputs must share one dtype"):
        insert_opr(Elemwise([x.node, y.node], ElemwiseParam("ADD"), make_opr_config()))


# ---- quantized Elemwise ----------------------------------------------------------------------
def test_quantized_elemwise_computes_on_real_values():
    q = mgb.dtype.qint8(0.5)
    a = mgb.dtype.convert_to_qint8(np.array([1.0, -2.0, 40.0, 60.0]), q)
    b = mgb.dtype.convert_to_qint8(np.array([0.5, -0.5, 30.0, -60.0]), q)
    g = make_graph()
    (x, y), _ = inputs(g, a, b)
    s, m, n = x + y, elemwise(x, y, mode="MAX"), -x
    got = run([s, m, n], g)
    for v in got:
        assert v.dtype.metadata == q.metadata
    # dequantized sums, requantized with saturation (70 / 0.5 = 140 > 127)
    np.testing.assert_array_equal(got[0], [3, -5, 127, 0])
    np.testing.assert_array_equal(got[1], [2, -1, 80, 120])
    np.testing.assert_array_equal(got[2], [-2, 4, -80, -120])


def test_quantized_relu_respects_the_zero_point():
    q = mgb.dtype.quint8(0.1, 100)
    a = np.array([90, 100, 130], np.uint8).astype(q)
    g = make_graph()
    (x,), _ = inputs(g, a)
    (got,) = run([elemwise(x, mode="RELU")], g)
    np.testing.assert_array_equal(got, [100, 100, 130])


def test_quantized_elemwise_rejects_other_modes():
    q = mgb.dtype.qint8(0.5)
    g = make_graph()
    (x,), _ = inputs(g, np.zeros(3, np.int8).astype(q))
    with pytest.raises(MegBrainError, match="EXP does not support quantized dtype QuantizedS8"):
        elemwise(x, mode="EXP")


# ---- the other makes that convert their inputs (Concat, AddUpdate, IndexingOneHot) ----------
def test_concat_promotes_its_inputs_dtypes():
    # faster_rcnn's RPN: F.concat([batch_inds (int32), rois (float32)], axis=1)
    g = make_graph()
    (i, f), _ = inputs(g, np.array([[1], [2]], np.int32), np.array([[0.5], [1.5]], np.float32))
    y = mgb.opr.concat([i, f], axis=1)
    assert y.dtype == F32
    assert [v.owner.type_name for v in y.node.owner.inputs] == ["TypeCvt", f.node.owner.type_name]
    (got,) = run([y], g)
    np.testing.assert_array_equal(got, [[1.0, 0.5], [2.0, 1.5]])
    (a, b), _ = inputs(g, np.ones(2, np.int16), np.ones(3, np.int32))
    assert mgb.opr.concat([a, b], axis=0).dtype == I32
    (u,), _ = inputs(g, np.ones(2, np.uint8))
    with pytest.raises(ConversionError, match="concat: .*signedness"):
        mgb.opr.concat([u, a], axis=0)


def test_concat_operator_itself_still_takes_one_dtype():
    from megbrain.opr import insert_opr, make_opr_config
    from megbrain.opr.tensor_manip import Concat, ConcatParam

    g = make_graph()
    (x, y), _ = inputs(g, np.ones(3, np.float32), np.ones(3, np.int32))
    with pytest.raises(MegBrainError, match="inputs must share one dtype"):
        insert_opr(Concat([x.node, y.node], ConcatParam(0), make_opr_config()))


def test_indexing_one_hot_converts_its_index_to_int32():
    g = make_graph()
    (x, k), _ = inputs(g, np.arange(6, dtype=np.float32).reshape(2, 3), np.array([2, 0], np.int16))
    y = mgb.opr.indexing_one_hot(x, 1, k, keepdims=True)
    assert y.node.owner.inputs[1].dtype == I32
    (kf,), _ = inputs(g, np.array([1.0, 2.0], np.float32))
    s = mgb.opr.indexing_set_one_hot(x, 1, kf, np.zeros(2, np.float32))
    got = run([y, s], g)
    np.testing.assert_array_equal(got[0], [[2], [3]])
    np.testing.assert_array_equal(got[1], [[0, 0, 2], [3, 4, 0]])


def test_add_update_converts_delta_to_the_dest_dtype():
    g = make_graph()
    dest = mgb.make_shared(mgb.comp_node("cpu0"), value=np.zeros(2, np.float32), comp_graph=g)
    (d,), _ = inputs(g, np.array([1, 2], np.int32))
    u = mgb.opr.add_update(dest, d)
    assert u.node.owner.inputs[1].dtype == F32
    np.testing.assert_array_equal(run([u], g)[0], [1.0, 2.0])
