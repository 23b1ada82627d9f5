"""Reduce kernels against NumPy references: one axis, everything, and to a target shape."""

import functools

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from megbrain.kernels import reduce as rk

BF16 = np.dtype(ml_dtypes.bfloat16)
MODES = ["SUM", "SUM_SQR", "PRODUCT", "MIN", "MAX", "MEAN"]
DTYPES = [np.dtype(t) for t in (np.float32, np.float16, BF16, np.float64, np.int32, np.int8)]
TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2, "float64": 1e-12}
FAST = settings(max_examples=25, deadline=None)


def _values(rng, mode, shape, dtype):
    if dtype.kind in "iu":
        hi = 3 if mode == "PRODUCT" else 120
        return rng.integers(-hi, hi, shape, endpoint=True).astype(dtype)
    if mode == "PRODUCT":  # keep products in float16 range
        return (rng.choice([-1, 1], shape) * rng.uniform(0.9, 1.1, shape)).astype(dtype)
    return rng.uniform(-2, 2, shape).astype(dtype)


def _reference(mode, x, axes):
    """float64 / wrapping int64 reference; returns (value, magnitude bound for the tolerance)."""
    integer = x.dtype.kind in "iu"
    w = x.astype(np.int64 if integer else np.float64)
    if mode == "SUM_SQR":
        w = w * w
    if mode in ("SUM", "SUM_SQR", "MEAN"):
        ref = np.sum(w, axis=axes, keepdims=True)
    elif mode == "PRODUCT":
        ref = np.prod(w, axis=axes, keepdims=True)
    else:
        ref = (np.min if mode == "MIN" else np.max)(w, axis=axes, keepdims=True)
    bound = np.sum(np.abs(w), axis=axes, keepdims=True) if mode != "PRODUCT" else np.abs(ref)
    if mode == "MEAN":
        n = np.prod([x.shape[a] for a in axes], dtype=np.int64)
        if integer:  # sum wraps in the dtype, then C division truncates
            ref = ref.astype(x.dtype).astype(np.int64)
            ref = np.sign(ref) * (np.abs(ref) // n)
        else:
            ref, bound = ref / n, bound / n
    return ref, bound


def _check(mode, x, axes, got):
    ref, bound = _reference(mode, x, axes)
    if x.dtype.kind in "iu":
        np.testing.assert_array_equal(got, ref.astype(x.dtype).reshape(got.shape), err_msg=mode)
        return
    tol = TOL[x.dtype.name]
    err = np.abs(got.astype(np.float64) - ref.reshape(got.shape))
    assert np.all(err <= tol * (bound.reshape(got.shape) + 1)), (mode, got, ref)


@pytest.mark.parametrize("mode", MODES)
@FAST
@given(data=st.data())
def test_reduce_axis_or_all(mode, data):
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    shape = data.draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4))
    axis = data.draw(st.none() | st.integers(-len(shape), len(shape) - 1) if shape else st.none())
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    x = _values(rng, mode, shape, dtype)
    if axis is None:
        out, axes = np.empty((1,), dtype), tuple(range(x.ndim))
    else:
        a = axis % x.ndim
        out, axes = np.empty(shape[:a] + (1,) + shape[a + 1 :], dtype), (a,)
    rk.bind_reduce(mode.lower(), x, out, axis)()
    _check(mode, x, axes, out)


@pytest.mark.parametrize("mode", MODES)
@FAST
@given(data=st.data())
def test_reduce_to_shape(mode, data):
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4))
    keep = data.draw(st.lists(st.booleans(), min_size=len(shape), max_size=len(shape)))
    target = tuple(s if k else 1 for s, k in zip(shape, keep))
    drop = data.draw(st.integers(0, len(shape)))  # leading 1s may be left out
    while drop and target[0] == 1:
        target, drop = target[1:], drop - 1
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    x = _values(rng, mode, shape, dtype)
    out = np.empty(target, dtype)
    rk.bind_reduce_to_shape(mode, x, out)()
    full = (1,) * (len(shape) - len(target)) + target
    axes = tuple(i for i, (t, s) in enumerate(zip(full, shape)) if t != s)
    _check(mode, x, axes, out)


def test_integer_sum_accumulates_in_dtype():
    x = np.full((4, 3), 100, np.int8)
    out = np.empty((1, 3), np.int8)
    rk.bind_reduce("SUM", x, out, 0)()
    assert out.tolist() == [[np.int8(400 - 512)] * 3]  # wraps like C, as MegDNN does
    m = np.empty((1, 3), np.int32)
    rk.bind_reduce("MEAN", np.array([[-7, 7, 5], [0, 0, 0]], np.int32), m, 0)()
    assert m.tolist() == [[-3, 3, 2]]  # truncation toward zero


def test_float16_accumulates_in_float32():
    x = np.full(4096, 1.0, np.float16)  # float16 accumulation would stall at 2048
    out = np.empty((1,), np.float16)
    rk.bind_reduce("SUM", x, out, None)()
    assert out[0] == 4096


def test_single_step_binding():
    x = np.ones((3, 4), np.float32)
    f = rk.bind_reduce("SUM", x, np.empty((3, 1), np.float32), 1)
    assert isinstance(f, functools.partial)


def test_empty_reductions():
    x = np.ones((0, 3), np.float32)
    out = np.empty((1, 3), np.float32)
    rk.bind_reduce("SUM", x, out, 0)()
    assert out.tolist() == [[0, 0, 0]]
    rk.bind_reduce("PRODUCT", x, out, 0)()
    assert out.tolist() == [[1, 1, 1]]
    for mode in ("MIN", "MAX", "MEAN"):
        with pytest.raises(ValueError, match=mode):
            rk.bind_reduce(mode, x, out, 0)


def test_bad_bindings():
    x = np.ones((3, 4), np.float32)
    with pytest.raises(ValueError, match="unknown Reduce mode"):
        rk.bind_reduce("MEDIAN", x, np.empty((1, 4), np.float32), 0)
    with pytest.raises(ValueError, match="axis 2 out of range"):
        rk.bind_reduce("SUM", x, np.empty((1, 4), np.float32), 2)
    with pytest.raises(ValueError, match=r"\(3, 1\).*\(3, 4\)"):
        rk.bind_reduce("SUM", x, np.empty((3, 1), np.float32), 0)
    with pytest.raises(ValueError, match="full reduction"):
        rk.bind_reduce("SUM", x, np.empty((2,), np.float32), None)
    with pytest.raises(ValueError, match="can not reduce"):
        rk.bind_reduce_to_shape("SUM", x, np.empty((2, 4), np.float32))
    with pytest.raises(ValueError, match="can not reduce"):
        rk.bind_reduce_to_shape("SUM", x, np.empty((1, 3, 4), np.float32))
    with pytest.raises(ValueError, match="bool"):
        rk.bind_reduce("SUM", np.ones(3, bool), np.empty((1,), bool), 0)


# ---- sums over a contiguous inner run: one compiled pass --------------------------------------
@pytest.mark.parametrize(
    "shape, target",
    [
        ((16, 8, 6, 7), (1, 8, 1, 1)),  # a bias gradient over NCHW
        ((80, 6, 17), (80, 1, 1)),  # no outer run
        ((1, 128, 1, 40), (1, 128, 1, 1)),  # size-1 dims dropped
        ((25, 3, 4, 2, 8), (1, 3, 4, 1, 1)),  # runs of several dims
    ],
)
@pytest.mark.parametrize("mode", ["SUM", "MEAN"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_inner_run_sum_compiled(shape, target, mode, dtype):
    rng = np.random.default_rng(11)
    x = _values(rng, mode, shape, np.dtype(dtype))
    out = np.full(target, np.nan, dtype)
    f = rk.bind_reduce_to_shape(mode, x, out)
    f()
    f()  # repeated runs overwrite, never accumulate
    axes = tuple(i for i, (s, t) in enumerate(zip(shape, target)) if s != t)
    _check(mode, x, axes, out)
    steps = [f] if isinstance(f, functools.partial) else f.__closure__[0].cell_contents
    assert steps[0].func is rk._sum_outer_inner()


def test_compiled_sum_not_used_off_its_pattern():
    rng = np.random.default_rng(12)
    x = rng.uniform(-1, 1, (32, 6, 40)).astype(np.float32)
    cases = [
        (x[:, :, ::2], (1, 6, 1)),  # not contiguous
        (x[:, :, :8], (1, 6, 1)),  # inner run shorter than COMPILED_SUM_MIN_INNER
        (x[:4], (1, 6, 1)),  # fewer elements than COMPILED_SUM_MIN_SIZE
        (x, (32, 1, 40)),  # a middle axis
        (x, (1, 1, 40)),  # outer runs only
    ]
    for src, target in cases:
        out = np.empty(target, np.float32)
        f = rk.bind_reduce_to_shape("SUM", src, out)
        assert getattr(f, "func", None) == np.add.reduce
        f()
        axes = tuple(i for i, (s, t) in enumerate(zip(src.shape, target)) if s != t)
        _check("SUM", src, axes, out)


# ---- float32 sums and maxima over the middle of (A, B, 8): NCHW88 global pooling -----------
@pytest.mark.parametrize("shape, axis", [((1, 18, 3136, 8), 2), ((2, 5, 701, 8), 2),
                                         ((600, 8), 0), ((3, 1, 1500, 1, 8), 2)])  # fmt: skip
@pytest.mark.parametrize("mode", ["SUM", "MEAN", "SUM_SQR", "MAX"])
def test_blocked_middle_reduction_compiled(shape, axis, mode):
    rng = np.random.default_rng(13)
    x = _values(rng, mode, shape, np.dtype(np.float32))
    target = shape[:axis] + (1,) + shape[axis + 1 :]
    out = np.full(target, np.nan, np.float32)
    f = rk.bind_reduce(mode, x, out, axis)
    f()
    f()  # repeated runs overwrite, never accumulate
    _check(mode, x, (axis,), out)
    steps = [f] if isinstance(f, functools.partial) else f.__closure__[0].cell_contents
    loop = rk._blocked_loop(np.maximum if mode == "MAX" else np.add)
    assert any(getattr(s, "func", None) is loop for s in steps)


@pytest.mark.parametrize("mode", ["SUM", "MAX"])
def test_blocked_middle_reduction_propagates_nan(mode):
    x = np.ones((2, 3, 900, 8), np.float32)
    x[1, 2, 450, 5] = np.nan
    out = np.empty((2, 3, 1, 8), np.float32)
    rk.bind_reduce(mode, x, out, 2)()
    nan = np.isnan(out)
    assert nan[1, 2, 0, 5] and nan.sum() == 1
