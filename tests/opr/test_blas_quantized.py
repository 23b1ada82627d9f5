"""Quantized MatrixMul / BatchedMatrixMul: QuantizedS8, Quantized8Asymm operands give
QuantizedS32 with the product of the scales, accumulated exactly in int32 (zero points
subtracted); int8 operands give int32 or, when asked, int16."""

from __future__ import annotations

import numpy as np
import pytest
from opr_harness import build_and_run, inputs, make_graph

import megbrain as mgb
from megbrain.errors import MegBrainError
from megbrain.opr import batched_matrix_mul, dot, matrix_mul


def _raw(rng, shape, lo, hi, dt):
    return rng.integers(lo, hi, shape).astype(dt)


@pytest.mark.parametrize("ta, tb", [(False, False), (True, False), (False, True), (True, True)])
def test_qint8_matmul_gives_qint32_exact(ta, tb):
    rng = np.random.default_rng(0)
    a = _raw(rng, (6, 5) if ta else (5, 6), -128, 128, np.int8)
    b = _raw(rng, (7, 6) if tb else (6, 7), -128, 128, np.int8)
    qa, qb = a.astype(mgb.dtype.qint8(0.1)), b.astype(mgb.dtype.qint8(0.02))
    out, got = build_and_run(lambda x, y: matrix_mul(x, y, transposeA=ta, transposeB=tb), qa, qb)
    meta = out.dtype.metadata["mgb_dtype"]
    assert meta["name"] == "QuantizedS32"
    assert meta["scale"] == float(np.float32(0.1) * np.float32(0.02))
    A = a.T if ta else a
    B = b.T if tb else b
    np.testing.assert_array_equal(got, A.astype(np.int64) @ B.astype(np.int64))


def test_quint8_matmul_subtracts_zero_points():
    rng = np.random.default_rng(1)
    a, b = _raw(rng, (4, 9), 0, 256, np.uint8), _raw(rng, (9, 3), 0, 256, np.uint8)
    qa, qb = a.astype(mgb.dtype.quint8(0.5, 128)), b.astype(mgb.dtype.quint8(0.25, 7))
    out, got = build_and_run(matrix_mul, qa, qb)
    assert out.dtype.metadata["mgb_dtype"]["scale"] == 0.125
    np.testing.assert_array_equal(got, (a.astype(np.int64) - 128) @ (b.astype(np.int64) - 7))


def test_batched_qint8_matmul():
    rng = np.random.default_rng(2)
    a, b = _raw(rng, (2, 3, 4), -128, 128, np.int8), _raw(rng, (2, 4, 5), -128, 128, np.int8)
    q = mgb.dtype.qint8(0.5)
    out, got = build_and_run(batched_matrix_mul, a.astype(q), b.astype(q))
    assert out.dtype.metadata["mgb_dtype"] == {"name": "QuantizedS32", "scale": 0.25}
    np.testing.assert_array_equal(got, a.astype(np.int64) @ b.astype(np.int64))


def test_int8_matmul_int32_or_int16():
    rng = np.random.default_rng(3)
    a, b = _raw(rng, (3, 8), -128, 128, np.int8), _raw(rng, (8, 2), -128, 128, np.int8)
    out, got = build_and_run(matrix_mul, a, b)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(got, a.astype(np.int32) @ b.astype(np.int32))
    out, got = build_and_run(lambda x, y: matrix_mul(x, y, dtype="int16"), a, b)
    assert got.dtype == np.int16  # accumulated in int16, as MegDNN's Int8x8x16
    np.testing.assert_array_equal(got, a.astype(np.int16) @ b.astype(np.int16))


def test_quantized_matmul_errors():
    q = mgb.dtype.qint8(0.1)
    g = make_graph()
    (x, y, z), _ = inputs(
        g, np.zeros((2, 2), np.int8).astype(q), np.zeros((2, 2), np.int8),
        np.zeros((2, 2), np.uint8).astype(mgb.dtype.quint8(0.1, 1)),
    )  # fmt: skip
    with pytest.raises(MegBrainError, match=r"MatrixMul.*QuantizedS8\(scale=0.1\) and int8"):
        matrix_mul(x, y)
    with pytest.raises(MegBrainError, match="QuantizedS8.*Quantized8Asymm"):
        matrix_mul(x, z)
    with pytest.raises(MegBrainError, match=r"unsupported output dtype QuantizedS32\(scale=0.5\)"):
        matrix_mul(x, x, dtype=mgb.dtype.qint32(0.5))
    with pytest.raises(MegBrainError, match="unsupported operand dtype QuantizedS8"):
        dot(x.reshape(4), x.reshape(4))
    # the deduced dtype may be given explicitly
    assert matrix_mul(x, x, dtype=mgb.dtype.qint32(0.01)).dtype.metadata is not None
