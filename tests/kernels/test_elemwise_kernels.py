"""Elemwise kernels against independent reference formulas, in place, and on bad input."""

import functools
import math
import warnings

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from megbrain.kernels import elemwise as ew
from megbrain.kernels import elemwise_modes as ew_modes
from megbrain.kernels.elemwise_modes import compute

BF16 = np.dtype(ml_dtypes.bfloat16)
F16, F32, F64, I32 = (np.dtype(t) for t in (np.float16, np.float32, np.float64, np.int32))
FAST = settings(max_examples=12, deadline=None)


def _vec(fn):
    return lambda *a: np.vectorize(fn, otypes=[np.float64])(*a)


def _bisect(fn, y, lo, hi, decreasing=False):
    """Solve fn(x) = y elementwise by bisection in float64 (fn a scalar math function)."""
    f = np.frompyfunc(fn, 1, 1)
    shape, y = y.shape, y.reshape(-1)
    lo, hi = np.full(y.shape, lo), np.full(y.shape, hi)
    for _ in range(90):
        mid = (lo + hi) / 2
        below = f(mid).astype(np.float64) < y
        if decreasing:
            below = ~below
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return ((lo + hi) / 2).reshape(shape)


def _erfinv(y):
    """Bisection on erf near 0, on erfc(x) = 1 - |y| (exact there) near +-1."""
    a = np.abs(y)
    central = _bisect(math.erf, a, 0.0, 7.0)
    tail = _bisect(math.erfc, 1 - a, 0.0, 7.0, decreasing=True)
    return np.copysign(np.where(a < 0.5, central, tail), y)


def _relu(x):
    return np.where(x <= 0, 0 * x, x)


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _h_swish(x):
    return x * np.minimum(np.maximum(x + 3, 0), 6) / 6


def _c_mod(x, y):
    if x.dtype.kind == "f":
        return _vec(math.fmod)(x, y)
    return np.sign(x) * (np.abs(x) % np.abs(y))


def _rmulh(x, y, dtype):
    k = dtype.itemsize * 8 - 1
    lo = np.iinfo(dtype).min

    def one(a, b):
        if a == b == lo:
            return -lo - 1
        p = int(a) * int(b)
        mask = (1 << k) - 1
        return (p >> k) + ((p & mask) > (mask >> 1))

    return np.vectorize(one, otypes=[np.int64])(x, y)


# mode -> (reference on float64 / int64 arrays (plus the dtype), input domain per input)
# a domain is (lo, hi) for uniform values, or "int" for small integral values (ties).
U = (-5.0, 5.0)
POS = (0.1, 5.0)
UNIT = (-0.999, 0.999)
DIV = "div"  # |y| in [0.5, 4], random sign
TIE = "int"
REF = {
    "RELU": (lambda x, d: _relu(x), [U]),
    "ABS": (lambda x, d: np.abs(x), [U]),
    "NEGATE": (lambda x, d: -x, [U]),
    "ACOS": (lambda x, d: _vec(math.acos)(x), [UNIT]),
    "ASIN": (lambda x, d: _vec(math.asin)(x), [UNIT]),
    "CEIL": (lambda x, d: _vec(math.ceil)(x), [U]),
    "FLOOR": (lambda x, d: _vec(math.floor)(x), [U]),
    "COS": (lambda x, d: _vec(math.cos)(x), [U]),
    "SIN": (lambda x, d: _vec(math.sin)(x), [U]),
    "EXP": (lambda x, d: _vec(math.exp)(x), [(-10.0, 10.0)]),
    "EXPM1": (lambda x, d: _vec(math.expm1)(x), [U]),
    "LOG": (lambda x, d: _vec(math.log)(x), [POS]),
    "LOG1P": (lambda x, d: _vec(math.log1p)(x), [(-0.9, 5.0)]),
    "TANH": (lambda x, d: _vec(math.tanh)(x), [U]),
    "SIGMOID": (lambda x, d: _sigmoid(x), [(-20.0, 20.0)]),
    "FAST_TANH": (lambda x, d: x * (27 + x * x) / (27 + 9 * x * x), [U]),
    "ROUND": (lambda x, d: _vec(lambda v: math.copysign(math.floor(abs(v) + 0.5), v))(x), ["half"]),
    "ERF": (lambda x, d: _vec(math.erf)(x), [(-4.0, 4.0)]),
    "ERFC": (lambda x, d: _vec(math.erfc)(x), [(-3.0, 9.0)]),
    "ERFINV": (lambda y, d: _erfinv(y), ["erfinv"]),
    "ERFCINV": (lambda y, d: _bisect(math.erfc, y, -7.0, 12.0, True), ["erfcinv"]),
    "H_SWISH": (lambda x, d: _h_swish(x), [U]),
    "ABS_GRAD": (lambda x, dy, d: np.where(x > 0, dy, -dy), [U, U]),
    "ADD": (lambda x, y, d: x + y, [U, U]),
    "SUB": (lambda x, y, d: x - y, [U, U]),
    "MUL": (lambda x, y, d: x * y, [U, U]),
    "MAX": (lambda x, y, d: np.where(x > y, x, y), [TIE, TIE]),
    "MIN": (lambda x, y, d: np.where(x < y, x, y), [TIE, TIE]),
    "FLOOR_DIV": (lambda x, y, d: np.floor(x / y) if d.kind == "f" else x // y, [U, DIV]),
    "MOD": (lambda x, y, d: _c_mod(x, y), [U, DIV]),
    "POW": (lambda x, y, d: x**y, [POS, (-2.0, 2.0)]),
    "SIGMOID_GRAD": (lambda y, dy, d: y * (1 - y) * dy, [(0.0, 1.0), U]),
    "TANH_GRAD": (lambda y, dy, d: (1 - y * y) * dy, [(-1.0, 1.0), U]),
    "SWITCH_GT0": (lambda x, dy, d: np.where(x > 0, dy, 0), [TIE, U]),
    "TRUE_DIV": (lambda x, y, d: x / y, [U, DIV]),
    "LOG_SUM_EXP": (lambda x, y, d: np.maximum(x, y) + np.log1p(np.exp(-np.abs(x - y))), [U, U]),
    "LT": (lambda x, y, d: x < y, [TIE, TIE]),
    "LEQ": (lambda x, y, d: x <= y, [TIE, TIE]),
    "EQ": (lambda x, y, d: x == y, [TIE, TIE]),
    "SHL": (lambda x, y, d: x << y, [TIE, "shift"]),
    "SHR": (lambda x, y, d: x >> y, [TIE, "shift"]),
    "FUSE_ADD_RELU": (lambda x, y, d: _relu(x + y), [U, U]),
    "FUSE_ADD_SIGMOID": (lambda x, y, d: _sigmoid(x + y), [U, U]),
    "FUSE_ADD_TANH": (lambda x, y, d: np.tanh(x + y), [U, U]),
    "FUSE_ADD_H_SWISH": (lambda x, y, d: _h_swish(x + y), [U, U]),
    "FAST_TANH_GRAD": (  # MegDNN's own formula
        lambda x, dy, d: ((-48 * x * x) / (3 + x * x) + 27 + x * x) / ((3 + x * x) * 9) * dy,
        [U, U],
    ),
    "RMULH": (lambda x, y, d: _rmulh(x, y, d), ["full", "full"]),
    "ATAN2": (lambda x, y, d: _vec(math.atan2)(x, y), [U, U]),
    "H_SWISH_GRAD": (
        lambda x, dy, d: np.where(x < -3, 0, np.where(x > 3, dy, (2 * x + 3) / 6 * dy)),
        [(-6.0, 6.0), U],
    ),
    "COND_LEQ_MOV": (lambda x, y, z, d: np.where(x <= y, z, 0), [TIE, TIE, U]),
    "FUSE_MUL_ADD3": (lambda a, b, c, d: a * b + c, [U, U, U]),
    "FUSE_MUL_ADD4": (lambda a, b, c, e, d: a * b + c * e, [U, U, U, U]),
}
BF16_MODES = {"ADD", "MUL", "RELU", "EXP", "SIGMOID", "TANH_GRAD", "ERF", "H_SWISH", "MAX", "LT"}
F64_MODES = {"ERF", "ERFC", "ERFINV", "ERFCINV", "SIGMOID", "ROUND"}
TOL = {F32: 1e-5, F16: 2e-3, BF16: 1.6e-2, F64: 1e-11}
SPECIAL = {"ERF", "ERFC", "ERFINV", "ERFCINV"}


def _dtypes(mode):
    t = ew_modes.MODES[mode]
    out = []
    if t.float_ok:
        out += [F32, F16]
        out += [BF16] if mode in BF16_MODES else []
        out += [F64] if mode in F64_MODES else []
    if t.int_ok:
        out += [np.dtype(np.int8), np.dtype(np.int16), I32] if mode in ("RMULH", "SHL") else [I32]
    return out


def _values(rng, domain, shape, dtype):
    if domain == "full":
        info = np.iinfo(dtype)
        v = rng.integers(info.min, info.max, shape, endpoint=True)
        return v.astype(dtype)
    if domain == "shift":
        return rng.integers(0, 8, shape).astype(dtype)
    if domain == TIE:
        return rng.integers(-3, 4, shape).astype(dtype)
    if domain == "half":
        v = rng.integers(-40, 41, shape) / 4 + rng.choice([0, 0.3], shape)
    elif domain == "erfinv":
        v = rng.choice([-1, 1], shape) * (1 - 10.0 ** rng.uniform(-7, 0, shape))
    elif domain == "erfcinv":
        tiny = 10.0 ** rng.uniform(-30, 0, shape)
        v = np.where(rng.random(shape) < 0.5, tiny, 2 - rng.random(shape))
    elif domain == DIV:
        v = rng.choice([-1, 1], shape) * rng.uniform(0.5, 4.0, shape)
    else:
        v = rng.uniform(*domain, shape)
    if dtype.kind in "iu":
        v = np.clip(np.round(v * 20), -100, 100)
    v = np.asarray(v).astype(dtype)
    w = v.astype(np.float64)
    if domain == "erfinv":  # keep the open domains open after rounding to dtype
        v = np.where(np.abs(w) >= 1, 0.5, w).astype(dtype)
    elif domain == "erfcinv":
        v = np.where((w <= 0) | (w >= 2), 1.5, w).astype(dtype)
    return v


def _check(mode, inputs, got):
    ref_fn = REF[mode][0]
    dtype = inputs[0].dtype
    wide = [x.astype(np.int64 if dtype.kind in "iu" else np.float64) for x in inputs]
    ref = np.asarray(ref_fn(*wide, dtype))
    if dtype.kind in "iu":
        np.testing.assert_array_equal(got, ref.astype(dtype), err_msg=mode)
        return
    tol = TOL[dtype]
    if mode in SPECIAL and dtype in (F32, F64):  # F32: within one ulp of the exact value
        rtol = 1.2e-7 if dtype == F32 else 1e-12
        np.testing.assert_allclose(got.astype(np.float64), ref, rtol=rtol, atol=0, err_msg=mode)
        return
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=tol, atol=tol, err_msg=mode)


def test_mode_table_matches_megdnn():
    arity = {1: 22, 2: 27, 3: 2, 4: 1}
    assert set(REF) == set(ew_modes.MODES)
    for n, count in arity.items():
        assert sum(t.arity == n for t in ew_modes.MODES.values()) == count
    assert ew_modes.arity("fuse_mul_add4") == 4 and ew_modes.arity("COND_LEQ_MOV") == 3
    for name in ("RELU", "ABS", "NEGATE", "ADD", "MOD", "FLOOR_DIV", "COND_LEQ_MOV", "RMULH"):
        assert ew_modes.MODES[name].int_ok, name
    for name in ("EXP", "TRUE_DIV", "POW", "LOG_SUM_EXP", "ERF", "SIGMOID"):
        assert not ew_modes.MODES[name].int_ok, name
    assert not ew_modes.MODES["SHL"].float_ok and not ew_modes.MODES["RMULH"].float_ok


@pytest.mark.parametrize("mode", sorted(REF))
@FAST
@given(data=st.data())
def test_mode_against_reference(mode, data):
    dtype = data.draw(st.sampled_from(_dtypes(mode)), label="dtype")
    arity = ew_modes.arity(mode)
    shapes = data.draw(
        hnp.mutually_broadcastable_shapes(num_shapes=arity, min_dims=0, max_dims=3, max_side=5)
    )
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    domains = REF[mode][1]
    inputs = [_values(rng, d, s, dtype) for d, s in zip(domains, shapes.input_shapes)]
    out = np.empty(shapes.result_shape, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no spurious overflow, no deprecated NumPy calls
        ew.bind(mode, inputs, out)()
    _check(mode, inputs, out)


@pytest.mark.parametrize("mode", sorted(REF))
def test_in_place(mode):
    """``out`` may be any input's buffer, or broadcast against a smaller input."""
    t = ew_modes.MODES[mode]
    for dtype in (F32, F16) if t.float_ok else (np.dtype(np.int32),):
        rng = np.random.default_rng(7)
        for target in range(t.arity):
            # the others alternate between full and broadcast shapes
            shapes = [(3, 4) if i == target or i % 2 == 0 else (1, 4) for i in range(t.arity)]
            inputs = [_values(rng, d, s, dtype) for d, s in zip(REF[mode][1], shapes)]
            expect = compute(mode, *inputs)
            buf = inputs[target].copy()
            aliased = [buf if i == target else x for i, x in enumerate(inputs)]
            ew.bind(mode, aliased, buf)()
            np.testing.assert_array_equal(buf, expect, err_msg=f"{mode} out=input {target}")


def test_same_array_twice_in_place():
    x = np.linspace(-0.9, 0.9, 12, dtype=np.float32).reshape(3, 4)
    for mode in ("TANH_GRAD", "SIGMOID_GRAD", "MUL", "H_SWISH_GRAD", "FAST_TANH_GRAD", "ABS_GRAD"):
        expect = compute(mode, x, x.copy())
        buf = x.copy()
        ew.bind(mode, [buf, buf], buf)()
        np.testing.assert_array_equal(buf, expect, err_msg=mode)


def test_simple_modes_bind_to_one_ufunc_call():
    a, b = np.ones(4, np.float32), np.ones(4, np.float32)
    out = np.empty(4, np.float32)
    f = ew.bind("add", [a, b], out)
    assert isinstance(f, functools.partial) and f.func is np.add
    assert isinstance(ew.bind("MAX", [a, b], out), functools.partial)


def test_edge_values():
    inf, nan = np.inf, np.nan
    x = [0.5, -0.5, 1.5, 2.5, -2.5, 0.49999997, -0.0, 8388609.0, inf, -inf, nan]
    x = np.array(x, np.float32)
    expect = [1, -1, 2, 3, -3, 0, -0.0, 8388609, inf, -inf, nan]
    np.testing.assert_array_equal(compute("ROUND", x), np.array(expect, np.float32))
    assert np.signbit(compute("ROUND", np.float32([-0.3])))[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        e = np.array([inf, -inf, nan, 0.0, -0.0, 100.0], np.float32)
        np.testing.assert_array_equal(compute("ERF", e), [1, -1, nan, 0, -0.0, 1])
        np.testing.assert_array_equal(compute("ERFC", e), [0, 2, nan, 1, 1, 0])
        y = np.array([1, -1, 1.5, -2, nan, 0, -0.0], np.float32)
        np.testing.assert_array_equal(compute("ERFINV", y), [inf, -inf, nan, nan, nan, 0, -0.0])
        c = np.array([0, 2, -0.5, 2.5, nan, 1], np.float32)
        np.testing.assert_array_equal(compute("ERFCINV", c), [inf, -inf, nan, nan, nan, 0])
        tiny = np.array([1e-45, 1e-38, 1e-300], np.float64)
        np.testing.assert_allclose(compute("ERFC", compute("ERFCINV", tiny)), tiny, rtol=1e-9)
        s = compute("SIGMOID", np.array([-1000, -100, 0, 100, 1000, nan], np.float32))
        np.testing.assert_allclose(s, [0, 0, 0.5, 1, 1, nan], atol=1e-30)
        relu = compute("RELU", np.array([nan, -1, 2], np.float32))
        np.testing.assert_array_equal(relu, [nan, 0, 2])
        grad = compute("SWITCH_GT0", np.float32([-1, nan, 1]), np.float32([inf, nan, nan]))
        np.testing.assert_array_equal(grad, [0, 0, nan])  # x > 0 ? dy : 0, never NaN * 0
    # C semantics of MOD for both signs, floor semantics of integer FLOOR_DIV
    ix, iy = np.int32([7, -7, 7, -7]), np.int32([3, 3, -3, -3])
    np.testing.assert_array_equal(compute("MOD", ix, iy), [1, -1, 1, -1])
    np.testing.assert_array_equal(compute("FLOOR_DIV", ix, iy), [2, -3, -3, 2])
    np.testing.assert_array_equal(compute("MOD", np.float32([-7.5]), np.float32([2])), [-1.5])
    # floor(x / y), not NumPy's divmod-based floor_divide
    np.testing.assert_array_equal(compute("FLOOR_DIV", np.float32([1]), np.float32([0.1])), [10])
    np.testing.assert_array_equal(compute("LT", ix, iy), np.int32([0, 1, 0, 1]))


def test_rmulh_saturates_and_rounds():
    for dt in (np.int8, np.int16, np.int32):
        info = np.iinfo(dt)
        x = np.array([info.min, info.min, info.max, 3, -3], dt)
        y = np.array([info.min, info.max, info.max, 1 << (info.bits - 3), 1 << (info.bits - 3)], dt)
        np.testing.assert_array_equal(compute("RMULH", x, y), _rmulh(x, y, np.dtype(dt)))
        assert compute("RMULH", x, y)[0] == info.max


def test_compute_casts_to_requested_dtype():
    r = compute("ADD", np.float32([1.5]), np.float32([2]), dtype=np.float64)
    assert r.dtype == np.float64 and r[0] == 3.5
    assert compute("EQ", np.int32([1, 2]), np.int32([1, 3])).tolist() == [1, 0]


@pytest.mark.parametrize(
    ("mode", "dtype"),
    [("EXP", np.int32), ("TRUE_DIV", np.int32), ("POW", np.int32), ("SHL", np.float32),
     ("RMULH", np.float32), ("RMULH", np.int64), ("ADD", np.bool_), ("ADD", np.complex64)],
)  # fmt: skip
def test_unsupported_dtype(mode, dtype):
    with pytest.raises(ValueError, match=f"{mode}.*{np.dtype(dtype).name}"):
        ew_modes.check_mode(mode, dtype)
    ins = [np.ones(3, dtype)] * ew_modes.arity(mode)
    with pytest.raises(ValueError, match=mode):
        ew.bind(mode, ins, np.empty(3, dtype))


def test_bad_bindings():
    a = np.ones(3, np.float32)
    with pytest.raises(ValueError, match="unknown Elemwise mode"):
        ew.bind("NOPE", [a], a)
    with pytest.raises(ValueError, match="takes 2 inputs, got 1"):
        ew.bind("ADD", [a], a)
    with pytest.raises(ValueError, match="float32, float16"):
        ew.bind("ADD", [a, a.astype(np.float16)], a)
    with pytest.raises(ValueError, match=r"\(3,\).*\(4,\)"):
        ew.bind("ADD", [a, np.ones(4, np.float32)], np.empty(4, np.float32))
    with pytest.raises(ValueError, match="output shape"):
        ew.bind("ADD", [a, a], np.empty(4, np.float32))


def test_typecvt():
    src = np.array([1.7, -1.7, 2.5, -0.2, 100.9], np.float32)
    for dt in (np.int32, np.int8, np.int16):
        out = np.empty(5, dt)
        ew.typecvt_bind(src, out)()
        np.testing.assert_array_equal(out, [1, -1, 2, 0, 100])  # truncation toward zero
    for s, d in [(np.float32, BF16), (BF16, np.int32), (np.int32, BF16), (BF16, np.float16)]:
        x = np.array([1.0, -3.0, 2.5, 7.0], np.float32).astype(s)
        out = np.empty(4, d)
        ew.typecvt_bind(x, out)()
        expect = x.astype(np.float32).astype(d)
        np.testing.assert_array_equal(out.astype(np.float64), expect.astype(np.float64))
    with pytest.raises(ValueError, match="TypeCvt"):
        ew.typecvt_bind(np.ones(3, np.float32), np.empty(4, np.int32))


# ---- the compiled loops of COMPILED_MODES (large float32 arrays) ------------------------------
def _with_specials(rng, shape):
    """Values in [-3, 3] with NaN, +-inf and signed zeros sprinkled in."""
    x = rng.uniform(-3, 3, shape).astype(F32)
    flat = x.reshape(-1)
    m = min(8, flat.size // 5)
    idx = rng.choice(flat.size, m * 5, replace=False).reshape(5, m)
    for k, v in zip(idx, (np.nan, np.inf, -np.inf, 0.0, -0.0)):
        flat[k] = v
    return x


_BIG = (4, 8, 16, 32)  # 16384 elements, above COMPILED_MIN_SIZE
# operand shapes per layout: all full (flat), a per-channel bias of NCHW, a row bias
_LAYOUTS = {
    "flat": lambda n: [_BIG] * n,
    "channel": lambda n: [_BIG] + [(1, 8, 1, 1)] * (n - 1),
    "bias_first": lambda n: [(8, 1, 1)] + [_BIG] * (n - 1),
    "row": lambda n: [(256, 128)] + [(1, 128)] * (n - 1),
}


@pytest.mark.parametrize(
    "mode, layout",
    [
        (m, lay)
        for m in sorted(ew.COMPILED_MODES | ew.COMPILED_BCAST_MODES)
        for lay in sorted(_LAYOUTS)
        if ew_modes.arity(m) > 1 or lay == "flat"
    ],
)
def test_compiled_loop_equals_numpy_kernel(mode, layout):
    """Same values (NaN where NumPy has NaN) as the NumPy kernel, in place too."""
    rng = np.random.default_rng(7)
    n = ew_modes.arity(mode)
    shapes = _LAYOUTS[layout](n)
    xs = [_with_specials(rng, s) for s in shapes]
    shape = np.broadcast_shapes(*shapes)
    assert math.prod(shape) >= ew.COMPILED_MIN_SIZE
    ref = np.empty(shape, F32)
    with np.errstate(all="ignore"):
        ew.bind(mode, xs, ref, compiled=False)()
        out = np.full(shape, 5.0, F32)
        step = ew.bind(mode, xs, out)
        step()
    np.testing.assert_array_equal(out, ref)
    # one compiled call, not a chain of NumPy passes (ADD & co. only for a broadcast)
    compiled = mode in ew.COMPILED_MODES or layout != "flat"
    assert isinstance(step, functools.partial)
    assert isinstance(step.func, np.ufunc) != compiled
    full = next((k for k, s in enumerate(shapes) if s == shape), None)
    if full is not None:  # in place over a full operand
        xs2 = [x.copy() for x in xs]
        with np.errstate(all="ignore"):
            ew.bind(mode, xs2, xs2[full])()
        np.testing.assert_array_equal(xs2[full], ref)


def test_compiled_loop_is_not_used_for_small_or_overlapping_arrays():
    rng = np.random.default_rng(3)
    small = rng.standard_normal((8, 8)).astype(F32)
    step = ew.bind("RELU", [small], np.empty_like(small))
    assert getattr(step, "func", None) is np.maximum
    # out overlapping the input shifted by one element: NumPy's kernel, right values
    buf = rng.standard_normal(ew.COMPILED_MIN_SIZE + 1).astype(F32)
    x, out = buf[1:], buf[:-1]
    ref = np.where(x > 0, x, 0)
    ew.bind("RELU", [x], out)()
    np.testing.assert_array_equal(out, ref)
    # float64 and non-contiguous outputs stay on NumPy too, with the same values
    x64 = rng.standard_normal((64, 1024))
    o64 = np.empty_like(x64)
    ew.bind("SWITCH_GT0", [x64, x64], o64)()
    np.testing.assert_array_equal(o64, np.where(x64 > 0, x64, 0))
    xt = rng.standard_normal((256, 256)).astype(F32)
    ot = np.empty((256, 256), F32).T
    ew.bind("FUSE_ADD_RELU", [xt, xt[:1]], ot)()
    np.testing.assert_array_equal(ot, np.maximum(xt + xt[:1], 0))


def test_compute_never_compiles(monkeypatch):
    from megbrain.kernels import jit_codegen as jc

    def boom(*a, **k):
        raise AssertionError("compute() must not compile")

    monkeypatch.setattr(jc, "bind", boom)
    x = np.ones(ew.COMPILED_MIN_SIZE, F32)
    np.testing.assert_array_equal(compute("RELU", x), x)
