"""TypeCvt into, from and between quantized dtypes, as MegDNN's quantize/dequantize: round half
away from zero in float32, zero points, saturation; distinct quantizations stay distinct."""

from __future__ import annotations

import numpy as np
import pytest
from opr_harness import build_and_run, inputs, make_graph, run

import megbrain as mgb
from megbrain.opr import make_immutable, typecvt

F32 = np.dtype(np.float32)


def _quantize_ref(x, scale, zp, lo, hi):
    """MegDNN's quantize in float32: roundf (half away from zero), then saturation."""
    v = np.float32(x) / np.float32(scale)
    r = np.trunc(v + np.copysign(np.float32(0.5), v))  # exact for the test values
    return np.clip(r + zp, lo, hi)


# ---- TypeCvt ---------------------------------------------------------------------------------
def test_float_to_qint8_stores_round_of_value_over_scale():
    q = mgb.dtype.qint8(0.1)
    out, got = build_and_run(lambda x: typecvt(x, q), np.ones((3, 4), F32))
    assert got.dtype.metadata == q.metadata and out.dtype.metadata == q.metadata
    np.testing.assert_array_equal(got, np.full((3, 4), 10))


@pytest.mark.parametrize(
    "make, lo, hi, zp",
    [
        (lambda: mgb.dtype.qint8(0.25), -128, 127, 0),
        (lambda: mgb.dtype.quint8(0.25, 120), 0, 255, 120),
        (lambda: mgb.dtype.qint32(0.25), -(2**31), 2**31 - 1, 0),
        (lambda: mgb.dtype.qint4(0.25), -8, 7, 0),
        (lambda: mgb.dtype.quint4(0.25, 8), 0, 15, 8),
    ],
)
def test_quantize_rounds_half_away_from_zero_and_saturates(make, lo, hi, zp):
    q = make()
    x = np.array([0.125, -0.125, 0.375, -0.375, 0.1, 1.0, -1.0, 1e3, -1e3], F32)
    _, got = build_and_run(lambda v: typecvt(v, q), x)
    want = _quantize_ref(x, 0.25, zp, lo, hi)
    np.testing.assert_array_equal(got.astype(np.int64), want.astype(np.int64))
    # ties go away from zero (0.125 / 0.25 = 0.5 -> 1), unlike numpy's half to even
    assert int(got[0]) - zp == 1 and int(got[1]) - zp == max(-1, lo - zp)


def test_int_to_quantized_quantizes_the_value():
    q = mgb.dtype.qint8(0.5)
    _, got = build_and_run(lambda v: typecvt(v, q), np.array([1, -3, 100], np.int32))
    np.testing.assert_array_equal(got, [2, -6, 127])


def test_nan_quantizes_to_the_minimum():
    _, got = build_and_run(lambda v: typecvt(v, mgb.dtype.qint8(0.5)), np.array([np.nan], F32))
    assert int(got[0]) == -128


def test_quantized_to_float_dequantizes():
    q = mgb.dtype.quint8(0.5, 100)
    raw = np.array([100, 101, 0, 255], np.uint8).astype(q)
    _, got = build_and_run(lambda v: typecvt(v, F32), raw)
    assert got.dtype == F32
    np.testing.assert_array_equal(got, [0.0, 0.5, -50.0, 77.5])
    _, got = build_and_run(lambda v: typecvt(v, np.int32), raw)  # via float, truncated
    np.testing.assert_array_equal(got, [0, 0, -50, 77])


def test_quantized_to_quantized_requantizes():
    src = np.ones((3, 4), np.int8).astype(mgb.dtype.qint8(1))
    dst = mgb.dtype.qint8(0.3)
    _, got = build_and_run(lambda v: typecvt(v, dst), src)
    assert got.dtype.metadata == dst.metadata
    np.testing.assert_array_equal(got, np.full((3, 4), 3))  # 1 / 0.3 = 3.33 -> 3
    asym = mgb.dtype.quint8(0.1, 128)
    _, got = build_and_run(
        lambda v: typecvt(v, asym), np.array([-5, 5], np.int8).astype(mgb.dtype.qint8(0.2))
    )
    np.testing.assert_array_equal(got, [118, 138])


def test_conversions_of_different_scales_are_not_merged():
    g = make_graph()
    (x,), _ = inputs(g, np.ones(2, F32))
    a, b = typecvt(x, mgb.dtype.qint8(0.1)), typecvt(x, mgb.dtype.qint8(0.5))
    assert a.node is not b.node
    got = run([a, b], g)
    np.testing.assert_array_equal(got[0], [10, 10])
    np.testing.assert_array_equal(got[1], [2, 2])
    # and equal constants of different quantization stay two constants
    c0 = make_immutable("cpu0", g, np.array([1, 2], np.int8), dtype=mgb.dtype.qint8(0.1))
    c1 = make_immutable("cpu0", g, np.array([1, 2], np.int8), dtype=mgb.dtype.qint8(0.2))
    assert c0.node is not c1.node and c1.dtype.metadata["mgb_dtype"]["scale"] == 0.2


def test_same_quantized_dtype_is_the_identity():
    q = mgb.dtype.qint8(0.1)
    raw = np.array([1, -7, 127], np.int8).astype(q)
    _, got = build_and_run(lambda v: typecvt(v, mgb.dtype.qint8(0.1)), raw)
    np.testing.assert_array_equal(got, raw)


@pytest.mark.parametrize("make", [lambda: mgb.dtype.qint8(0.037),
                                  lambda: mgb.dtype.quint8(0.05, 131),
                                  lambda: mgb.dtype.qint4(0.3)])  # fmt: skip
def test_the_compiled_8bit_quantize_equals_the_numpy_steps(make):
    # the one-pass loop of a float32 -> 8-bit TypeCvt against MegDNN's chain as NumPy steps:
    # ties, saturation, infinities, NaN, -0 and values of every magnitude
    from megbrain.kernels import elemwise as ew
    from megbrain.kernels.steps import chain

    q = make()
    rng = np.random.default_rng(7)
    scale = np.float32(mgb.dtype.get_scale(q))
    ties = (np.arange(-300, 300, dtype=F32) + np.float32(0.5)) * scale
    special = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e30, -1e30, 3e-39], F32)
    x = np.concatenate([ties, np.nextafter(ties, np.inf), np.nextafter(ties, -np.inf), special,
                        (rng.standard_normal(5000) * 20).astype(F32)])  # fmt: skip
    got, want = np.empty(x.shape, np.dtype(q.str)).view(q), np.empty(x.shape, q)
    fast = ew._bind_8bit_quantize(x, got)
    assert fast is not None
    fast()
    chain(ew.quantize_steps(x, want, ew.quant_params(q)))()
    np.testing.assert_array_equal(got.view(np.dtype(q.str)), want.view(np.dtype(q.str)))
