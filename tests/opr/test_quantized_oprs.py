"""The operators MegEngine's quantized modules use, on quantized vars, against the integer
reference of MegDNN's arithmetic: pooling, the Q* ElemwiseMultiType modes, Elemwise,
MatrixMul + bias (Linear), Concat and the shape operators (which keep the dtype, scale
included)."""

from __future__ import annotations

import numpy as np
import pytest
import quantized_ref as ref
from hypothesis import given, settings
from hypothesis import strategies as st
from opr_harness import build_and_run

import megbrain as mgb
from megbrain.graph import OperatorNodeConfig
from megbrain.opr import (
    concat,
    conv_bias_activation,
    dimshuffle,
    elemwise,
    elemwise_multi_type,
    matrix_mul,
    pooling,
    reshape,
    typecvt,
)

qint8, qint32, quint8 = mgb.dtype.qint8, mgb.dtype.qint32, mgb.dtype.quint8


# ---- pooling -------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(["MAX", "AVERAGE", "AVERAGE_COUNT_EXCLUDE_PADDING"]),
    st.sampled_from([qint8(0.3), quint8(0.2, 7), quint8(0.1, 200), qint32(0.01)]),
    st.integers(1, 3), st.integers(1, 3), st.integers(1, 2), st.integers(1, 2),
    st.integers(0, 2), st.integers(0, 2), st.integers(0, 2**16),
)  # fmt: skip
def test_pooling_on_quantized_equals_the_integer_reference(mode, dt, fh, fw, sh, sw, ph, pw, seed):
    ph, pw = min(ph, fh - 1), min(pw, fw - 1)
    rng = np.random.default_rng(seed)
    x = ref.random_q(rng, (2, 3, rng.integers(fh, 8), rng.integers(fw, 8)), dt)
    out, got = build_and_run(
        lambda v: pooling(v, mode=mode, window_h=fh, window_w=fw, stride_h=sh, stride_w=sw,
                          pad_h=ph, pad_w=pw), x)  # fmt: skip
    assert out.dtype.metadata == dt.metadata
    ref.assert_same(got, ref.pool2d_int(x, mode, (fh, fw), (sh, sw), (ph, pw)))


@pytest.mark.parametrize("dt", [qint8(0.3), quint8(0.1, 200), qint32(0.01)], ids=str)
@pytest.mark.parametrize("h, w", [(9, 8), (6, 11)])
def test_max_pooling_3x3_stride_2_pad_1_on_quantized_equals_the_integer_reference(dt, h, w):
    # ResNet's stem pooling takes the compiled loop (padding rows and columns as repeats)
    x = ref.random_q(np.random.default_rng(h * w), (2, 3, h, w), dt)
    _, got = build_and_run(
        lambda v: pooling(v, mode="MAX", window_h=3, window_w=3, stride_h=2, stride_w=2,
                          pad_h=1, pad_w=1), x)  # fmt: skip
    ref.assert_same(got, ref.pool2d_int(x, "MAX", (3, 3), (2, 2), (1, 1)))


@settings(max_examples=30, deadline=None)
@given(
    st.sampled_from(["AVERAGE", "AVERAGE_COUNT_EXCLUDE_PADDING"]),
    st.sampled_from([qint8(0.3), quint8(0.2, 7), quint8(0.1, 200), qint32(0.01)]),
    st.integers(1, 9), st.integers(1, 9), st.integers(0, 2**16),
)  # fmt: skip
def test_global_average_pooling_on_quantized_equals_the_integer_reference(mode, dt, h, w, seed):
    # one window per plane: summed in one call
    rng = np.random.default_rng(seed)
    x = ref.random_q(rng, (2, 5, h, w), dt)
    _, got = build_and_run(
        lambda v: pooling(v, mode=mode, window_h=h, window_w=w, stride_h=1, stride_w=1), x
    )
    ref.assert_same(got, ref.pool2d_int(x, mode, (h, w), (1, 1), (0, 0)))


def test_pooling_average_rounds_half_away_from_zero():
    x = np.array([[[[1, 2], [-1, -2]]]], np.int8).view(qint8(1.0))  # 1.5 and -1.5
    _, got = build_and_run(
        lambda v: pooling(v, mode="AVERAGE", window_h=1, window_w=2, stride_h=1, stride_w=2), x
    )
    np.testing.assert_array_equal(got.view(np.int8).ravel(), [2, -2])


def test_pooling_refuses_an_other_output_dtype():
    x = np.zeros((1, 1, 4, 4), np.int8).view(qint8(0.5))
    with pytest.raises(mgb.MegBrainError, match=r"QuantizedS8\(scale=0.25\)"):
        build_and_run(lambda v: pooling(v, config=OperatorNodeConfig(output_dtype=qint8(0.25))), x)


# ---- ElemwiseMultiType Q* modes (the quantized Elemwise module) ----------------------------------
_QMODES = {
    "QADD": (2, lambda a, b: (a + b).astype(ref.F32)),
    "QFUSE_ADD_RELU": (2, lambda a, b: ref.relu((a + b).astype(ref.F32))),
    "QMUL": (2, lambda a, b: (a * b).astype(ref.F32)),
    "QH_SWISH": (1, ref.h_swish),
    "QRELU": (1, ref.relu),
    "QFUSE_ADD_H_SWISH": (2, lambda a, b: ref.h_swish((a + b).astype(ref.F32))),
}


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(sorted(_QMODES)),
    st.sampled_from([0.05, 0.1, 0.37]),
    st.sampled_from([0.05, 0.2]),
    st.sampled_from([0.1, 0.5]),
    st.integers(0, 2**16),
    st.sampled_from([None, 0, 128, 251]),
)
def test_q_modes_equal_the_reference(mode, s0, s1, so, seed, zp):
    rng = np.random.default_rng(seed)
    n, fn = _QMODES[mode]
    kind = qint8 if zp is None else (lambda s, z=zp: quint8(s, z))
    xs = [ref.random_q(rng, (3, 5), kind(s)) for s in (s0, s1)[:n]]
    od = kind(so)
    _, got = build_and_run(lambda *v: elemwise_multi_type(*v, mode=mode, dtype=od), *xs)
    ref.assert_same(got, ref.elemwise_q(fn, xs, od))


def test_elemwise_add_of_quantized_vars_keeps_the_dtype():
    rng = np.random.default_rng(3)
    d = qint8(0.1)
    a, b = ref.random_q(rng, (4, 4), d), ref.random_q(rng, (4, 4), d)
    out, got = build_and_run(lambda x, y: elemwise(x, y, mode="ADD"), a, b)
    assert out.dtype.metadata == d.metadata
    ref.assert_same(got, ref.elemwise_q(lambda u, v: (u + v).astype(ref.F32), [a, b], d))


# ---- Linear: MatrixMul + qint32 bias, then TypeCvt -----------------------------------------------
def test_linear_int8_matmul_bias_and_requantize():
    rng = np.random.default_rng(4)
    x, w = ref.random_q(rng, (3, 20), qint8(0.5)), ref.random_q(rng, (6, 20), qint8(0.25))
    b = ref.random_q(rng, (1, 6), qint32(0.125))
    od = qint8(4.0)

    def build(xv, wv, bv):
        y = matrix_mul(xv, wv, transposeB=True)
        return typecvt(elemwise(y, bv, mode="ADD"), od)

    _, got = build_and_run(build, x, w, b)
    sums = ref.wrap_i32(ref.ints(x) @ ref.ints(w).T).view(qint32(0.125))
    added = ref.elemwise_q(lambda u, v: (u + v).astype(ref.F32), [sums, b], qint32(0.125))
    ref.assert_same(got, ref.quantize(ref.dequantize(added), od))


# ---- Concat and the shape operators --------------------------------------------------------------
def test_concat_of_one_quantized_dtype_keeps_it():
    rng = np.random.default_rng(5)
    d = qint8(0.2)
    a, b = ref.random_q(rng, (1, 2, 3, 3), d), ref.random_q(rng, (1, 4, 3, 3), d)
    out, got = build_and_run(lambda x, y: concat([x, y], axis=1), a, b)
    assert out.dtype.metadata == d.metadata
    ref.assert_same(got, np.concatenate([a, b], axis=1).view(d))


def test_concat_after_requantizing_to_the_output_dtype():
    # MegEngine's quantized Concat: each input astype(output dtype), then Concat
    rng = np.random.default_rng(6)
    a, b = ref.random_q(rng, (2, 3), qint8(0.2)), ref.random_q(rng, (2, 3), qint8(0.3))
    od = qint8(0.25)
    _, got = build_and_run(lambda x, y: concat([typecvt(x, od), typecvt(y, od)], axis=0), a, b)
    want = np.concatenate([ref.quantize(ref.dequantize(v), od).view(np.int8) for v in (a, b)])
    np.testing.assert_array_equal(got.view(np.int8), want)


def test_shape_operators_keep_the_quantized_dtype():
    rng = np.random.default_rng(7)
    d = quint8(0.2, 9)
    a = ref.random_q(rng, (2, 3, 4), d)
    for build, want in [
        (lambda v: reshape(v, (6, 4)), a.reshape(6, 4)),
        (lambda v: dimshuffle(v, (2, 0, 1)), a.transpose(2, 0, 1)),
        (lambda v: v[1:, ::2], a[1:, ::2]),
        (lambda v: v.reshape(24).broadcast((2, 24)), np.broadcast_to(a.reshape(24), (2, 24))),
    ]:
        out, got = build_and_run(build, a)
        assert out.dtype.metadata == d.metadata
        ref.assert_same(got, np.ascontiguousarray(want).view(d))


def test_optimized_graph_keeps_a_typecvt_from_int8_to_qint8():
    # numpy's dtype == ignores the quantization metadata: the redundant-TypeCvt pass must not
    g = mgb.comp_graph()
    x = mgb.make_arg("cpu0", g, name="x", shape=(1, 2), dtype=np.int8)
    y = typecvt(typecvt(x, qint8(2.0)), np.float32)
    f = g.compile([x], [mgb.copy_output(y)])
    np.testing.assert_array_equal(f(np.array([[3, -7]], np.int8))[0], [[4.0, -8.0]])


def test_q_mode_fed_a_float_var_names_the_operator_var_and_dtypes():
    a = np.zeros((2, 2), np.int8).view(qint8(0.5))
    b = np.zeros((2, 2), np.float32)
    with pytest.raises(mgb.MegBrainError) as info:
        build_and_run(lambda x, y: elemwise_multi_type(x, y, mode="QADD", dtype=qint8(1.0)), a, b)
    msg = str(info.value)
    assert "ElemwiseMultiType" in msg and "'x1' float32" in msg
    assert "'x0' QuantizedS8(scale=0.5)" in msg


def test_elemwise_of_mismatched_scales_names_the_vars_and_dtypes():
    a = np.zeros((2, 2), np.int8).view(qint8(0.5))
    b = np.zeros((2, 2), np.int8).view(qint8(0.25))
    with pytest.raises(mgb.MegBrainError) as info:
        build_and_run(lambda x, y: elemwise(x, y, mode="ADD"), a, b)
    msg = str(info.value)
    assert "Elemwise mode ADD" in msg and "quantization parameters differ" in msg
    assert "'x0' QuantizedS8(scale=0.5)" in msg and "'x1' QuantizedS8(scale=0.25)" in msg


def test_an_out_of_range_zero_point_is_refused():
    with pytest.raises(mgb.MegBrainError, match=r"zero_point .* \[0, 255\], got 300"):
        quint8(0.1, 300)
    bad = np.dtype(np.uint8, metadata={"mgb_dtype": {"name": "Quantized8Asymm", "scale": 0.1,
                                                     "zero_point": 300}})  # fmt: skip
    with pytest.raises(mgb.MegBrainError, match="zero_point"):
        build_and_run(lambda v: pooling(v), np.zeros((1, 1, 2, 2), np.uint8).view(bad))


def test_optimize_for_inference_keeps_an_int8_graph_int8():
    rng = np.random.default_rng(8)
    g = mgb.comp_graph()
    cn = mgb.comp_node("cpu0")
    x = mgb.make_arg(cn, g, name="x", shape=(1, 4, 6, 6), dtype=np.int8)
    w = mgb.make_shared(cn, value=ref.random_q(rng, (8, 4, 3, 3), qint8(0.1)), comp_graph=g)
    b = mgb.make_shared(cn, value=ref.random_q(rng, (1, 8, 1, 1), qint32(0.05)), comp_graph=g)
    q = typecvt(x, qint8(0.5))
    y = conv_bias_activation(q, w, b, nonlineMode="RELU", pad_h=1, pad_w=1, dtype=qint8(0.3))
    y = pooling(elemwise_multi_type(y, y, mode="QADD", dtype=qint8(0.6)), mode="AVERAGE")
    out = typecvt(y, np.float32)
    (opt,) = mgb.optimize_for_inference([out], fuse_conv_bias_nonlinearity=True)
    kinds = [o.type for o in mgb.cgtools.get_oprs_seq([opt])]
    assert kinds.count("TypeCvt") == 2  # the QuantStub and the DequantStub only
    xv = rng.integers(-128, 128, (1, 4, 6, 6)).astype(np.int8)
    want = g.compile([x], [mgb.copy_output(out)])(xv)[0]
    got = g.compile([x], [mgb.copy_output(opt)])(xv)[0]
    np.testing.assert_array_equal(got, want)
