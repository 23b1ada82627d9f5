"""BLAS kernels (matmul, batched matmul, dot) against explicit sums of products."""


import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megbrain.kernels import blas

BF16 = np.dtype(ml_dtypes.bfloat16)
# (operand dtype, output dtype)
DTYPES = [
    (np.dtype(np.float32),) * 2,
    (np.dtype(np.float16),) * 2,
    (BF16, BF16),
    (np.dtype(np.float16), np.dtype(np.float32)),
    (np.dtype(np.float64),) * 2,
    (np.dtype(np.int32),) * 2,
    (np.dtype(np.int8), np.dtype(np.int32)),
]
TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2, "float64": 1e-12}
FAST = settings(max_examples=30, deadline=None)
SIDE = st.integers(1, 6)


def _operand(rng, shape, dtype):
    if dtype.kind in "iu":
        return rng.integers(-100, 100, shape).astype(dtype)
    return rng.uniform(-2, 2, shape).astype(dtype)


def _check(a, b, got, ref_fn):
    """ref_fn(a, b) computes the exact result from int64 / float64 operands."""
    integer = a.dtype.kind in "iu"
    wide = np.int64 if integer else np.float64
    ref = ref_fn(a.astype(wide), b.astype(wide))
    if integer:
        np.testing.assert_array_equal(got, ref)
        return
    bound = ref_fn(np.abs(a.astype(wide)), np.abs(b.astype(wide)))
    tol = max(TOL[a.dtype.name], TOL[got.dtype.name])
    assert np.all(np.abs(got.astype(np.float64) - ref) <= tol * (bound + 1)), (got, ref)


def _mm(x, y):
    return (x[..., :, :, None] * y[..., None, :, :]).sum(-2)


@FAST
@given(dt=st.sampled_from(DTYPES), m=SIDE, k=SIDE, n=SIDE, ta=st.booleans(), tb=st.booleans())
def test_matmul(dt, m, k, n, ta, tb):
    rng = np.random.default_rng(m * 100 + k * 10 + n)
    a = _operand(rng, (k, m) if ta else (m, k), dt[0])
    b = _operand(rng, (n, k) if tb else (k, n), dt[0])
    out = np.empty((m, n), dt[1])
    blas.bind_matmul(a, b, out, ta, tb)()
    _check(a, b, out, lambda x, y: _mm(x.T if ta else x, y.T if tb else y))


@FAST
@given(dt=st.sampled_from(DTYPES), batch=st.integers(1, 3), m=SIDE, k=SIDE, n=SIDE,
       ta=st.booleans(), tb=st.booleans())  # fmt: skip
def test_batched_matmul(dt, batch, m, k, n, ta, tb):
    rng = np.random.default_rng(batch * 1000 + m * 100 + k * 10 + n)
    a = _operand(rng, (batch, k, m) if ta else (batch, m, k), dt[0])
    b = _operand(rng, (batch, n, k) if tb else (batch, k, n), dt[0])
    out = np.empty((batch, m, n), dt[1])
    blas.bind_batched_matmul(a, b, out, ta, tb)()

    def ref(x, y):
        return _mm(x.swapaxes(1, 2) if ta else x, y.swapaxes(1, 2) if tb else y)

    _check(a, b, out, ref)


@FAST
@given(dt=st.sampled_from(DTYPES), n=st.integers(1, 20), scalar=st.sampled_from([None, 0, 1]))
def test_dot(dt, n, scalar):
    rng = np.random.default_rng(n)
    a = _operand(rng, (1,) if scalar == 0 else (n,), dt[0])
    b = _operand(rng, (1,) if scalar == 1 else (n,), dt[0])
    out = np.empty((1,), dt[1])
    blas.bind_dot(a, b, out)()
    _check(a, b, out, lambda x, y: np.array([(x * y).sum()]))  # (1,) broadcasts


def test_float32_matmul_reads_the_operands_current_contents():
    a, b = np.ones((8, 4), np.float32), np.ones((8, 5), np.float32)
    out = np.empty((4, 5), np.float32)
    f = blas.bind_matmul(a, b, out, transpose_a=True)
    a[:] = 2  # the bound call reads the arrays' current contents
    f()
    assert np.all(out == 16)


def test_shape_errors_name_both_shapes():
    f32 = np.float32
    with pytest.raises(ValueError, match=r"\(2, 3\) and \(4, 5\)"):
        blas.bind_matmul(np.ones((2, 3), f32), np.ones((4, 5), f32), np.empty((2, 5), f32))
    with pytest.raises(ValueError, match=r"\(2, 3\) and \(3, 5\).*\(2, 4\)"):
        blas.bind_matmul(np.ones((2, 3), f32), np.ones((3, 5), f32), np.empty((2, 4), f32))
    with pytest.raises(ValueError, match="2-d"):
        blas.bind_matmul(np.ones((2, 3, 1), f32), np.ones((3, 5), f32), np.empty((2, 5), f32))
    with pytest.raises(ValueError, match=r"\(2, 3, 4\) and \(3, 4, 5\)"):
        blas.bind_batched_matmul(
            np.ones((2, 3, 4), f32), np.ones((3, 4, 5), f32), np.empty((2, 3, 5), f32)
        )
    with pytest.raises(ValueError, match=r"\(3,\) and \(4,\)"):
        blas.bind_dot(np.ones(3, f32), np.ones(4, f32), np.empty(1, f32))
    with pytest.raises(ValueError, match="float32, float16"):
        blas.bind_matmul(np.ones((2, 3), f32), np.ones((3, 5), np.float16), np.empty((2, 5), f32))
