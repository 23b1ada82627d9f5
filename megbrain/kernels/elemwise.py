"""Elemwise kernels: every MegDNN Elemwise mode, bound once to its arrays and run into ``out``.

``bind(mode, inputs, out)`` resolves everything (ufuncs, constants, scratch buffers) and returns
a zero-argument callable; the executor calls it on the hot path. ``MODES`` is the mode table.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import ml_dtypes
import numpy as np
from numpy.polynomial import chebyshev as _cheb

from .. import dtype as _dt
from .arrays import same_elements
from .steps import Step, chain

__all__ = [
    "COMPILED_BCAST_MODES",
    "COMPILED_MIN_SIZE",
    "COMPILED_MODES",
    "COMPILED_UPDATE_MIN_SIZE",
    "MODES",
    "ModeTrait",
    "QuantParams",
    "arity",
    "bind",
    "check_mode",
    "compiled_scaled_update",
    "compute",
    "dequantize_steps",
    "quant_params",
    "quantize_steps",
    "typecvt_bind",
]

_partial = functools.partial
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_F16 = np.dtype(np.float16)
_BF16 = np.dtype(ml_dtypes.bfloat16)
_LOW_FLOATS = (_F16, _BF16)
_RMULH_DTYPES = (np.dtype(np.int8), np.dtype(np.int16), np.dtype(np.int32))


@dataclass(frozen=True)
class ModeTrait:
    """What MegDNN declares about one Elemwise mode.

    Attributes
    ----------
    name : str
        The upper-case mode name (``"ADD"``).
    arity : int
        The number of inputs.
    kernel : Callable
        The builder ``kernel(ctx, *inputs) -> list of steps`` that ``bind`` calls.
    int_ok, float_ok : bool
        Whether integer and floating-point dtypes are supported.
    """

    name: str
    arity: int
    kernel: Callable[..., list[Step]]
    int_ok: bool
    float_ok: bool


MODES: dict[str, ModeTrait] = {}
# Low-precision float dtypes a mode's kernel takes directly instead of through float32 scratch:
# float16 for one-ufunc modes (NumPy's float16 loops compute in float32 and round once, and are
# several times faster than converting), never bfloat16 (ml_dtypes' own loops are slow).
_NATIVE_LOWP: dict[str, tuple[np.dtype, ...]] = {}


class _Ctx:
    """What a kernel builder gets besides its inputs: the destination and scratch buffers.

    A builder returns steps. Only the last one may write ``out`` when it shares memory with an
    input; earlier ones write buffers from ``work()`` (``out`` itself when it shares none)
    and ``tmp()``.
    """

    __slots__ = ("out", "dtype", "_out_taken")

    def __init__(self, out: np.ndarray, aliased: bool):
        self.out = out
        self.dtype = out.dtype
        self._out_taken = aliased

    def k(self, value: float) -> np.generic:
        """A constant of the compute dtype."""
        return self.dtype.type(value)

    def work(self) -> np.ndarray:
        """A buffer of out's shape overlapping no input: ``out`` itself the first time if it can."""
        if not self._out_taken:
            self._out_taken = True
            return self.out
        return self.tmp()

    def tmp(self, dtype: np.dtype | type | None = None) -> np.ndarray:
        """A fresh scratch buffer of out's shape."""
        return np.empty(self.out.shape, self.dtype if dtype is None else dtype)

    def finish(self, w: np.ndarray) -> list[Step]:
        """The step moving a result computed in ``w`` into ``out``, if it is not there already."""
        return [] if w is self.out else [_partial(np.copyto, self.out, w)]


def _register(name: str, n: int, kernel, ints: bool, floats: bool = True, native=(_F16,)):
    MODES[name] = ModeTrait(name, n, kernel, ints, floats)
    _NATIVE_LOWP[name] = tuple(native)


# ---- modes that are one NumPy call ----------------------------------------------------------
def _ufunc(uf):
    return lambda c, *ins: [_partial(uf, *ins, c.out)]


def _ufunc_kw(uf):  # np.maximum/np.minimum deprecate a positional ``out`` (NumPy 2.4)
    return lambda c, *ins: [_partial(uf, *ins, out=c.out)]


for _name, _uf, _ints in [
    ("ABS", np.absolute, True),
    ("NEGATE", np.negative, True),
    ("ACOS", np.arccos, False),
    ("ASIN", np.arcsin, False),
    ("CEIL", np.ceil, False),
    ("COS", np.cos, False),
    ("EXP", np.exp, False),
    ("EXPM1", np.expm1, False),
    ("FLOOR", np.floor, False),
    ("LOG", np.log, False),
    ("LOG1P", np.log1p, False),
    ("SIN", np.sin, False),
    ("TANH", np.tanh, False),
]:
    _register(_name, 1, _ufunc(_uf), _ints)

for _name, _uf, _ints in [
    ("ADD", np.add, True),
    ("SUB", np.subtract, True),
    ("MUL", np.multiply, True),
    ("MOD", np.fmod, True),  # C semantics: the sign of the dividend
    ("LT", np.less, True),
    ("LEQ", np.less_equal, True),
    ("EQ", np.equal, True),
    ("TRUE_DIV", np.true_divide, False),
    ("POW", np.power, False),
    ("ATAN2", np.arctan2, False),
    ("LOG_SUM_EXP", np.logaddexp, False),  # max + log1p(exp(-|x - y|)), -inf for two -infs
]:
    _register(_name, 2, _ufunc(_uf), _ints)
_register("MAX", 2, _ufunc_kw(np.maximum), True)
_register("MIN", 2, _ufunc_kw(np.minimum), True)
_register("SHL", 2, _ufunc(np.left_shift), True, floats=False)
_register("SHR", 2, _ufunc(np.right_shift), True, floats=False)
_register("RELU", 1, lambda c, x: [_partial(np.maximum, x, c.k(0), out=c.out)], True)


def _floor_div(c, x, y):
    if c.dtype.kind in "iu":
        return [_partial(np.floor_divide, x, y, c.out)]
    w = c.work()  # MegDNN: floorf(x / y), which differs from np.floor_divide at the edges
    return [_partial(np.true_divide, x, y, w), _partial(np.floor, w, c.out)]


_register("FLOOR_DIV", 2, _floor_div, True, native=())


# ---- multi-step modes -----------------------------------------------------------------------
def _sigmoid_steps(c, src, w):
    """1 / (1 + exp(-src)) into out; exp's argument is clipped so that it can not overflow."""
    clip = c.k(math.floor(math.log(np.finfo(c.dtype).max)))
    return [
        _partial(np.negative, src, w),
        _partial(np.minimum, w, clip, out=w),
        _partial(np.exp, w, w),
        _partial(np.add, w, c.k(1), w),
        _partial(np.true_divide, c.k(1), w, c.out),
    ]


def _h_swish_steps(c, src, w):
    """src * min(max(src + 3, 0), 6) * (1/6) into out (w must not be src)."""
    return [
        _partial(np.add, src, c.k(3), w),
        _partial(np.fmax, w, c.k(0), w),  # NaN still propagates through the product below
        _partial(np.fmin, w, c.k(6), w),
        _partial(np.multiply, w, src, w),
        _partial(np.multiply, w, c.k(1 / 6), c.out),
    ]


def _sigmoid(c, x):
    return _sigmoid_steps(c, x, c.work())


def _fuse_add_sigmoid(c, x, y):
    w = c.work()
    return [_partial(np.add, x, y, w), *_sigmoid_steps(c, w, w)]


def _fuse_add_tanh(c, x, y):
    w = c.work()
    return [_partial(np.add, x, y, w), _partial(np.tanh, w, c.out)]


def _fuse_add_relu(c, x, y):
    w = c.work()
    return [_partial(np.add, x, y, w), _partial(np.maximum, w, c.k(0), out=c.out)]


def _h_swish(c, x):
    return _h_swish_steps(c, x, c.work())


def _fuse_add_h_swish(c, x, y):
    s = c.work()
    return [_partial(np.add, x, y, s), *_h_swish_steps(c, s, c.tmp())]


def _fast_tanh(c, x):
    num, den = c.work(), c.tmp()  # x * (27 + x^2) / (27 + 9 x^2)
    return [
        _partial(np.multiply, x, x, den),
        _partial(np.add, den, c.k(27), num),
        _partial(np.multiply, num, x, num),
        _partial(np.multiply, den, c.k(9), den),
        _partial(np.add, den, c.k(27), den),
        _partial(np.true_divide, num, den, c.out),
    ]


def _fast_tanh_grad(c, x, dy):
    w, sq = c.work(), c.tmp()  # d/dx fast_tanh = ((x^2 - 9) / (x^2 + 3))^2 / 9
    return [
        _partial(np.multiply, x, x, sq),
        _partial(np.subtract, sq, c.k(9), w),
        _partial(np.add, sq, c.k(3), sq),
        _partial(np.true_divide, w, sq, w),
        _partial(np.multiply, w, w, w),
        _partial(np.multiply, w, dy, w),
        _partial(np.multiply, w, c.k(1 / 9), c.out),
    ]


def _round(c, x):
    frac, whole = c.tmp(), c.work()  # half away from zero, like C round()
    return [
        _partial(np.modf, x, frac, whole),
        _partial(np.multiply, frac, c.k(2), frac),
        _partial(np.trunc, frac, frac),  # -1, 0 or 1
        _partial(np.add, whole, frac, c.out),
    ]


def _sigmoid_grad(c, y, dy):
    w = c.work()
    return [
        _partial(np.subtract, c.k(1), y, w),
        _partial(np.multiply, w, y, w),
        _partial(np.multiply, w, dy, c.out),
    ]


def _tanh_grad(c, y, dy):
    w = c.work()
    return [
        _partial(np.multiply, y, y, w),
        _partial(np.subtract, c.k(1), w, w),
        _partial(np.multiply, w, dy, c.out),
    ]


def _abs_grad(c, x, dy):
    sign = c.tmp()  # dy * (x > 0 ? 1 : -1): exact, and branch-free unlike a masked copy
    return [
        _partial(np.greater, x, c.k(0), sign),
        _partial(np.multiply, sign, c.k(2), sign),
        _partial(np.subtract, sign, c.k(1), sign),
        _partial(np.multiply, dy, sign, c.out),
    ]


def _bits(a: np.ndarray) -> np.ndarray:
    """``a`` viewed as signed integers of its itemsize, for bitwise selects."""
    return a if a.dtype.kind in "iu" else a.view(f"i{a.dtype.itemsize}")


def _select_or_zero(c, cond, value):
    """``cond ? value : 0`` into out, given ``cond(mask)`` writing 1 or 0 into an int mask."""
    m = c.tmp(_bits(c.out).dtype)  # 0 or all ones, then a bitwise and: no branches, no NaN*0
    return [
        _partial(cond, m),
        _partial(np.negative, m, m),
        _partial(np.bitwise_and, _bits(value), m, _bits(c.out)),
    ]


def _switch_gt0(c, x, dy):
    return _select_or_zero(c, _partial(np.greater, x, c.k(0)), dy)


def _cond_leq_mov(c, x, y, z):
    return _select_or_zero(c, _partial(np.less_equal, x, y), z)


def _h_swish_grad(c, x, dy):
    w = c.work()  # x < -3 ? 0 : (x > 3 ? dy : (2x + 3) / 6 * dy)
    wb, m, t = _bits(w), c.tmp(_bits(w).dtype), c.tmp(_bits(w).dtype)
    return [
        _partial(np.multiply, x, c.k(2), w),
        _partial(np.add, w, c.k(3), w),
        _partial(np.true_divide, w, c.k(6), w),
        _partial(np.multiply, w, dy, w),
        _partial(np.greater, x, c.k(3), m),  # w = x > 3 ? dy : w, as w ^ ((dy ^ w) & mask)
        _partial(np.negative, m, m),
        _partial(np.bitwise_xor, _bits(dy), wb, t),
        _partial(np.bitwise_and, t, m, t),
        _partial(np.bitwise_xor, wb, t, wb),
        _partial(np.less, x, c.k(-3), m),  # mask: 0 where x < -3, all ones elsewhere
        _partial(np.subtract, m, m.dtype.type(1), m),
        _partial(np.bitwise_and, wb, m, _bits(c.out)),
    ]


def _fuse_mul_add3(c, a, b, d):
    w = c.work()
    return [_partial(np.multiply, a, b, w), _partial(np.add, w, d, c.out)]


def _fuse_mul_add4(c, a, b, d, e):
    w, t = c.work(), c.tmp()
    return [
        _partial(np.multiply, a, b, w),
        _partial(np.multiply, d, e, t),
        _partial(np.add, w, t, c.out),
    ]


def _rmulh(c, x, y):
    """MegDNN round_mulh_saturate: (x * y + 2^(k-1)) >> k with k = bits - 1, saturated."""
    k = c.dtype.itemsize * 8 - 1
    p = c.tmp(np.int64)
    return [
        _partial(np.copyto, p, x),
        _partial(np.multiply, p, y, p),
        _partial(np.add, p, np.int64(1 << (k - 1)), p),
        _partial(np.right_shift, p, np.int64(k), p),
        _partial(np.minimum, p, np.int64(np.iinfo(c.dtype).max), out=p),  # only MIN * MIN
        _partial(np.copyto, c.out, p, "unsafe"),
    ]


for _name, _n, _kern, _ints in [
    ("SIGMOID", 1, _sigmoid, False),
    ("H_SWISH", 1, _h_swish, False),
    ("FAST_TANH", 1, _fast_tanh, False),
    ("ROUND", 1, _round, False),
    ("ABS_GRAD", 2, _abs_grad, True),
    ("SIGMOID_GRAD", 2, _sigmoid_grad, True),
    ("TANH_GRAD", 2, _tanh_grad, True),
    ("SWITCH_GT0", 2, _switch_gt0, True),
    ("FUSE_ADD_RELU", 2, _fuse_add_relu, True),
    ("FUSE_ADD_SIGMOID", 2, _fuse_add_sigmoid, False),
    ("FUSE_ADD_TANH", 2, _fuse_add_tanh, False),
    ("FAST_TANH_GRAD", 2, _fast_tanh_grad, False),
    ("H_SWISH_GRAD", 2, _h_swish_grad, False),
    ("FUSE_ADD_H_SWISH", 2, _fuse_add_h_swish, False),
    ("COND_LEQ_MOV", 3, _cond_leq_mov, True),
    ("FUSE_MUL_ADD3", 3, _fuse_mul_add3, True),
    ("FUSE_MUL_ADD4", 4, _fuse_mul_add4, True),
]:
    _register(_name, _n, _kern, _ints, native=())
_register("RMULH", 2, _rmulh, True, floats=False, native=())


# ---- the erf family, evaluated in float64 ---------------------------------------------------
# For z >= 0.5, erfc(z) = t * exp(-z^2 + P(u)) with t = 2 / (2 + z) and u = t mapped onto
# [-1, 1]; P interpolates log(erfc(z) e^(z^2) / t), a smooth function of t, over z in [0.5, 26]
# (relative error of erfc below 1e-12). For |x| < 0.5, erf(x) = x * Q(8 x^2 - 1). The inverses
# start from Giles' single-precision approximation (an asymptotic guess in the far tail) and take
# two Newton steps: on erf near 0, on log(erfc) elsewhere, where erfc is concave and Newton
# converges monotonically. Coefficients are fitted at import from ``math.erf``/``math.erfc``.
def _cheb_fit(f, lo: float, hi: float, deg: int) -> tuple[float, ...]:
    """Power coefficients (highest first) in u in [-1, 1] of f's interpolant on [lo, hi]."""
    c = _cheb.chebinterpolate(lambda u: [f((ui + 1) / 2 * (hi - lo) + lo) for ui in u], deg)
    return tuple(_cheb.cheb2poly(c)[::-1].tolist())


def _log_erfc_scaled(t: float) -> float:
    z = 2 / t - 2
    return math.log(math.erfc(z)) + z * z - math.log(t)


_T_LO, _T_HI = 2 / (2 + 26.0), 2 / (2 + 0.5)
_T_A, _T_B = 4 / (_T_HI - _T_LO), (_T_HI + _T_LO) / (_T_HI - _T_LO)
_TAIL = _cheb_fit(_log_erfc_scaled, _T_LO, _T_HI, 16)
_SMALL = _cheb_fit(lambda s: math.erf(math.sqrt(s)) / math.sqrt(s), 0.0, 0.25, 7)  # inner nodes
_GILES_CENTRAL = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                  -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)  # fmt: skip
_GILES_TAIL = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
               -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)  # fmt: skip
_SQRTPI_2 = math.sqrt(math.pi) / 2


def _horner(coef: Sequence[float], u: np.ndarray) -> np.ndarray:
    r = np.full(u.shape, coef[0])
    for a in coef[1:]:
        r *= u
        r += a
    return r


def _tail(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(t, P) with erfc(z) = t * exp(P - z^2), for 0 <= z <= 30."""
    s = z + 2.0
    u = _T_A / s
    u -= _T_B
    return 2.0 / s, _horner(_TAIL, u)


def _erf_small(x: np.ndarray) -> np.ndarray:
    """erf(x) for |x| <= 0.5."""
    u = x * x
    u *= 8.0
    u -= 1.0
    return x * _horner(_SMALL, u)


def _erfc_abs(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(|x|, erfc(|x|) valid where |x| >= 0.5, erf(x) valid where |x| < 0.5)."""
    z = np.minimum(np.abs(x), 30.0)
    t, p = _tail(z)
    p -= z * z
    tail = t * np.exp(p)
    return z, tail, _erf_small(np.clip(x, -0.5, 0.5))


def _erf(x: np.ndarray) -> np.ndarray:
    z, tail, small = _erfc_abs(x)
    return np.where(z < 0.5, small, np.copysign(1.0 - tail, x))


def _erfc(x: np.ndarray) -> np.ndarray:
    z, tail, small = _erfc_abs(x)
    return np.where(z < 0.5, 1.0 - small, np.where(x > 0, tail, 2.0 - tail))


def _inv_erf(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """x >= 0 with erf(x) = p and erfc(x) = q, for 0 <= p < 1, q = 1 - p (exact when p >= 0.5)."""
    w = np.maximum(-np.log(q * (1.0 + p)), 0.0)
    x = np.where(w < 5.0, _horner(_GILES_CENTRAL, w - 2.5), _horner(_GILES_TAIL, np.sqrt(w) - 3.0))
    x *= p
    log_q = np.log(q)
    big = -log_q  # far tail: erfc(x) ~ exp(-x^2) / (x sqrt(pi))
    guess = np.sqrt(np.maximum(big - 0.5 * np.log(np.pi * np.maximum(big, 1.0)), 0.0))
    x = np.where(w > 16.0, guess, x)
    central = p < 0.52  # erf(0.5) = 0.5205: x < 0.5, where _erf_small is valid
    for _ in range(2):
        xs = np.minimum(x, 0.5)
        step_c = (_erf_small(xs) - p) * np.exp(xs * xs) * _SQRTPI_2
        z = np.clip(x, 0.0, 30.0)
        t, pt = _tail(z)
        step_t = (np.log(t) - z * z + pt - log_q) * t * np.exp(pt) * _SQRTPI_2
        x = np.where(central, x - step_c, x + step_t)
    return x


def _erfinv(y: np.ndarray) -> np.ndarray:
    a = np.abs(y)
    ok = a < 1.0
    a0 = np.where(ok, a, 0.0)
    x = np.where(ok, _inv_erf(a0, 1.0 - a0), np.where(a == 1.0, np.inf, np.nan))
    return np.copysign(x, y)


def _erfcinv(y: np.ndarray) -> np.ndarray:
    ok = (y > 0.0) & (y < 2.0)
    y0 = np.where(ok, y, 1.0)
    upper = y0 > 1.0
    q = np.where(upper, 2.0 - y0, y0)
    x = _inv_erf(1.0 - q, q)
    x = np.where(upper, -x, x)
    return np.where(ok, x, np.where(y == 0.0, np.inf, np.where(y == 2.0, -np.inf, np.nan)))


def _run_special(fn, x: np.ndarray, out: np.ndarray) -> None:
    np.copyto(out, fn(x.astype(_F64)), "unsafe")


def _special(fn):
    return lambda c, x: [_partial(_run_special, fn, x, c.out)]


for _name, _fn in [("ERF", _erf), ("ERFC", _erfc), ("ERFINV", _erfinv), ("ERFCINV", _erfcinv)]:
    _register(_name, 1, _special(_fn), False, native=_LOW_FLOATS)


# ---- public API ---------------------------------------------------------------------------
def _trait(mode: str) -> ModeTrait:
    try:
        return MODES[mode.upper()]
    except (KeyError, AttributeError):
        raise ValueError(f"unknown Elemwise mode {mode!r}") from None


def _is_float(dtype: np.dtype) -> bool:
    return (dtype.kind == "f" and dtype.itemsize <= 8) or dtype == _BF16


def arity(mode: str) -> int:
    """The number of inputs of an Elemwise mode.

    Parameters
    ----------
    mode : str
        The mode name, in any case.
    """
    return _trait(mode).arity


def check_mode(mode: str, dtype: np.dtype | type) -> None:
    """Raise ValueError if the Elemwise mode does not support ``dtype``.

    Parameters
    ----------
    mode : str
        The mode name, in any case.
    dtype : numpy dtype
        The (common) dtype of the inputs.
    """
    trait, dtype = _trait(mode), np.dtype(dtype)
    if _is_float(dtype):
        ok = trait.float_ok
    elif dtype.kind in "iu":
        ok = trait.int_ok and (trait.name != "RMULH" or dtype in _RMULH_DTYPES)
    else:
        ok = False
    if not ok:
        raise ValueError(f"Elemwise mode {trait.name} does not support dtype {dtype.name}")


#: modes run by one compiled loop (:mod:`megbrain.kernels.jit_codegen`) on large float32
#: arrays, whose compiled form gives the same values (no approximation, same operation
#: order): those NumPy computes in several passes or slowly (RELU's NaN-aware maximum) ...
COMPILED_MODES = frozenset(
    {"RELU", "MAX", "MIN", "SWITCH_GT0", "FUSE_ADD_RELU", "FUSE_MUL_ADD3", "FUSE_MUL_ADD4",
     "COND_LEQ_MOV"}
)  # fmt: skip
#: ... and one-pass modes whose broadcast operand (a per-channel bias) makes NumPy's inner
#: loop short: compiled only for the per-channel broadcast layout
COMPILED_BCAST_MODES = frozenset({"ADD", "SUB", "MUL", "TRUE_DIV"})
#: output elements from which COMPILED_MODES run compiled
COMPILED_MIN_SIZE = 1 << 12


def _compiled_bind(mode: str, inputs: Sequence[np.ndarray], out: np.ndarray):
    """The compiled loop of one float32 node, or None where NumPy's kernel is used: small
    outputs, layouts other than flat or a per-channel broadcast, or an input overlapping
    ``out`` other than as the very same array (in-place)."""
    if mode in COMPILED_MODES:
        layouts = ("flat", "bcast")
    elif mode in COMPILED_BCAST_MODES:
        layouts = ("bcast",)
    else:
        return None
    if out.dtype != _F32 or out.size < COMPILED_MIN_SIZE:
        return None
    for x in inputs:
        if np.may_share_memory(x, out) and not same_elements(x, out):
            return None
    from . import jit_codegen

    expr = ((mode, tuple(("i", k) for k in range(len(inputs)))),)
    # serial: one memory-bound pass gains little from a second thread, and a parallel
    # region per operator is what a loaded machine punishes most
    return jit_codegen.bind(expr, inputs, out, layouts=layouts, parallel=False)


def bind(
    mode: str, inputs: Sequence[np.ndarray], out: np.ndarray, *, compiled: bool = True
) -> Callable[[], None]:
    """Bind an Elemwise mode to its input and output arrays.

    Parameters
    ----------
    mode : str
        The mode name, in any case (``"ADD"``, ``"fuse_mul_add3"``).
    inputs : sequence of numpy.ndarray
        The inputs, all of one dtype, broadcastable to ``out.shape`` (NumPy rules). Any of them
        may share memory with ``out`` (in-place computation).
    out : numpy.ndarray
        The output; normally of the inputs' dtype (comparisons write 1 and 0 in it).
    compiled : bool
        Whether a mode of :data:`COMPILED_MODES` (and :data:`COMPILED_BCAST_MODES`, for a
        per-channel broadcast) on float32 arrays of at least
        :data:`COMPILED_MIN_SIZE` elements may run as one compiled loop (Numba, compiled on
        first use and cached on disk; single-threaded, like NumPy's) instead of NumPy's
        passes; False never compiles.

    Returns
    -------
    Callable[[], None]
        A zero-argument callable computing the result into ``out`` from the current contents
        of the inputs; a bare ``functools.partial`` of one ufunc where the mode allows.

    Raises
    ------
    ValueError
        Unknown mode, wrong number of inputs, mixed or unsupported dtypes, or shapes that do
        not broadcast to ``out.shape``.
    """
    trait = _trait(mode)
    if len(inputs) != trait.arity:
        n = len(inputs)
        raise ValueError(f"Elemwise mode {trait.name} takes {trait.arity} inputs, got {n}")
    dtype = inputs[0].dtype
    if any(x.dtype != dtype for x in inputs):
        dtypes = ", ".join(x.dtype.name for x in inputs)
        raise ValueError(f"Elemwise mode {trait.name}: inputs of different dtypes ({dtypes})")
    check_mode(trait.name, dtype)
    shapes = [x.shape for x in inputs]
    try:
        ok = np.broadcast_shapes(out.shape, *shapes) == out.shape
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(
            f"Elemwise mode {trait.name}: input shapes {shapes} do not broadcast to the output "
            f"shape {out.shape}"
        )
    if compiled and out.dtype == dtype:
        fn = _compiled_bind(trait.name, inputs, out)
        if fn is not None:
            return fn
    steps: list[Step] = []
    cdtype = dtype
    if dtype in _LOW_FLOATS and dtype not in _NATIVE_LOWP[trait.name]:
        cdtype = _F32
        converted = []
        for x in inputs:
            x32 = np.empty(x.shape, _F32)
            steps.append(_partial(np.copyto, x32, x, "unsafe"))
            converted.append(x32)
        inputs = converted
    res = out if out.dtype == cdtype else np.empty(out.shape, cdtype)
    aliased = res is out and any(np.may_share_memory(out, x) for x in inputs)
    steps += trait.kernel(_Ctx(res, aliased), *inputs)
    if res is not out:
        steps.append(_partial(np.copyto, out, res, "unsafe"))
    return chain(steps)


def compute(mode: str, *inputs: np.ndarray, dtype: np.dtype | type | None = None) -> np.ndarray:
    """Compute an Elemwise mode into a new array (constant folding, tests).

    Parameters
    ----------
    mode : str
        The mode name, in any case.
    *inputs : array_like
        The inputs, all of one dtype.
    dtype : numpy dtype, optional
        The output dtype; the inputs' dtype by default.

    Returns
    -------
    numpy.ndarray
        The result, of the inputs' broadcast shape.
    """
    arrays = [np.asarray(x) for x in inputs]
    shape = np.broadcast_shapes(*(a.shape for a in arrays)) if arrays else ()
    out = np.empty(shape, arrays[0].dtype if dtype is None and arrays else dtype)
    bind(mode, arrays, out, compiled=False)()
    return out


# ---- quantized dtypes ------------------------------------------------------------------------
class QuantParams(NamedTuple):
    """MegDNN's quantization parameters of a dtype, as the float32 numbers its kernels use.

    ``real = (q - zero_point) * scale``; quantizing clamps to ``[qmin, qmax]`` in float32.
    """

    name: str
    scale: np.float32
    zero_point: np.float32
    qmin: np.float32
    qmax: np.float32


# the largest float32 that converts to int32 without overflow (2**31 itself does not fit)
_QINT32_MAX = np.float32(2147483520.0)


def quant_params(dtype: np.dtype) -> QuantParams | None:
    """The quantization parameters of ``dtype``; None for dtypes that are not quantized.

    Parameters
    ----------
    dtype : numpy dtype
        Any dtype; quantized ones carry ``mgb_dtype`` metadata (see :mod:`megbrain.dtype`).
    """
    meta = None if dtype.metadata is None else dtype.metadata.get("mgb_dtype")
    if meta is None or "scale" not in meta:
        return None
    info = next(q for q in _dt._metadata_dict.values() if q.name == meta["name"])
    qmax = _QINT32_MAX if info.name == "QuantizedS32" else np.float32(info.qmax)
    zp = np.float32(meta.get("zero_point", 0))
    return QuantParams(info.name, np.float32(meta["scale"]), zp, np.float32(info.qmin), qmax)


def dequantize_steps(q: np.ndarray, dst: np.ndarray, qp: QuantParams) -> list[Step]:
    """Steps writing ``(q - zero_point) * scale`` into the float32 ``dst`` (q's shape).

    The arithmetic is MegDNN's ``dequantize``: the stored integer converted to float32 (exact
    for 8-bit values, rounded for int32 ones), then one float32 product.
    """
    steps: list[Step] = [_partial(np.copyto, dst, q, "unsafe")]
    if qp.zero_point:
        steps.append(_partial(np.subtract, dst, qp.zero_point, dst))
    steps.append(_partial(np.multiply, dst, qp.scale, dst))
    return steps


def quantize_steps(src: np.ndarray, out: np.ndarray, qp: QuantParams) -> list[Step]:
    """Steps writing MegDNN's ``quantize(src)`` into the quantized ``out``.

    ``src`` (float32, broadcastable to ``out``) is divided by the scale in float32, rounded
    half away from zero (C ``roundf``), shifted by the zero point and clamped to the storage
    range; NaN gives ``qmin``, as ``fmin(fmax(qmin, v), qmax)`` does in C.
    """
    w = np.empty(out.shape, _F32)
    steps: list[Step] = [_partial(np.true_divide, src, qp.scale, w)]
    steps += _round(_Ctx(w, True), w)
    if qp.zero_point:
        steps.append(_partial(np.add, w, qp.zero_point, w))
    steps += [
        _partial(np.fmax, w, qp.qmin, w),
        _partial(np.fmin, w, qp.qmax, w),
        _partial(np.copyto, out, w, "unsafe"),
    ]
    return steps


def typecvt_bind(src: np.ndarray, out: np.ndarray) -> Callable[[], None]:
    """Bind TypeCvt: convert ``src`` into ``out``'s dtype, as MegDNN's TypeCvt does.

    Between plain dtypes this is a C cast: floats convert to integers by truncation toward
    zero; bfloat16 converts through float32. A quantized source is dequantized to float32
    first (``(q - zero_point) * scale``) and a quantized destination quantizes the float32
    value (``round(v / scale) + zero_point``, half away from zero, saturated), so quantized
    to quantized requantizes.

    Parameters
    ----------
    src : numpy.ndarray
        The source, broadcastable to ``out.shape``.
    out : numpy.ndarray
        The destination.

    Returns
    -------
    Callable[[], None]
        A zero-argument callable doing the conversion.
    """
    try:
        ok = np.broadcast_shapes(out.shape, src.shape) == out.shape
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"TypeCvt: source shape {src.shape} does not fit output shape {out.shape}")
    src_q, out_q = quant_params(src.dtype), quant_params(out.dtype)
    if src_q is None and out_q is None:
        one_bf16 = (src.dtype == _BF16) != (out.dtype == _BF16)
        if not one_bf16 or _F32 in (src.dtype, out.dtype):
            return _partial(np.copyto, out, src, "unsafe")
    steps: list[Step] = []
    mid = src
    if src_q is not None:
        mid = np.empty(src.shape, _F32)
        steps += dequantize_steps(src, mid, src_q)
    elif src.dtype != _F32:
        mid = np.empty(src.shape, _F32)
        steps.append(_partial(np.copyto, mid, src, "unsafe"))
    if out_q is not None:
        steps += quantize_steps(mid, out, out_q)
    else:
        steps.append(_partial(np.copyto, out, mid, "unsafe"))
    return chain(steps)


# ---- the in-place update ``dest = alpha*dest + beta*delta (+ bias)`` (AddUpdate) ------------
#: float32 elements from which the in-place update runs as one compiled pass
COMPILED_UPDATE_MIN_SIZE = 1 << 12


def _scaled_update_py(dest, delta, a, b, c, add_c):  # pragma: no cover - compiled
    # float32 throughout and no fast-math: each element is (a*d + b*x) + c rounded step by
    # step, the value NumPy's passes give
    if add_c:
        for i in range(dest.size):
            dest[i] = (a * dest[i] + b * delta[i]) + c
    else:
        for i in range(dest.size):
            dest[i] = a * dest[i] + b * delta[i]


@functools.cache
def _scaled_update():
    from numba import njit  # on first use: ``import megbrain`` stays free of numba

    return njit(nogil=True, cache=True, error_model="numpy")(_scaled_update_py)


def compiled_scaled_update(
    dest: np.ndarray, delta: np.ndarray
) -> Callable[[np.float32, np.float32, np.float32], None] | None:
    """The one-pass compiled form of ``dest[...] = alpha*dest + beta*delta + bias`` for
    float32 arrays, or None where it does not apply.

    It applies to a C-contiguous float32 ``dest`` of at least
    :data:`COMPILED_UPDATE_MIN_SIZE` elements and a C-contiguous float32 ``delta`` of the same
    shape sharing no memory with it. Every element gets the float32 value of
    ``(alpha*dest + beta*delta) + bias`` (no bias term when bias is 0, so that ``-0.0``
    stays), which is what the unfused passes (scale, add, add) compute, in one pass
    instead of two to four.

    Parameters
    ----------
    dest : numpy.ndarray
        The array updated in place.
    delta : numpy.ndarray
        The update's operand.

    Returns
    -------
    Callable or None
        ``fn(alpha, beta, bias)`` taking float32 scalars and updating ``dest``.
    """
    if (
        dest.dtype != _F32
        or delta.dtype != _F32
        or dest.shape != delta.shape
        or dest.size < COMPILED_UPDATE_MIN_SIZE
        or not (dest.flags.c_contiguous and delta.flags.c_contiguous)
        or np.may_share_memory(dest, delta)
    ):
        return None
    kernel = _scaled_update()
    d1, x1 = dest.reshape(-1), delta.reshape(-1)

    def run(a: np.float32, b: np.float32, c: np.float32) -> None:
        kernel(d1, x1, a, b, c, c != 0)

    return run
