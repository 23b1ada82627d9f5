"""The Elemwise mode table: each MegDNN Elemwise mode's arity, dtypes and math, in the two
forms the kernels run it in: the NumPy steps of the plain kernels (:data:`MODES`, bound by
:func:`bind_numpy`) and the scalar float32 expression the fused kernels compile
(:data:`JIT_FORMS`, :data:`JIT_HELPERS`; :mod:`.jit_codegen`).

The two forms of a mode compute the same function: the same formula and operation order
where both are exact (FAST_TANH, H_SWISH, ROUND, the gradients), while the fused form of
EXP/LOG/TANH/ERF/SIGMOID is a vectorizable float32 approximation of the function the NumPy
form computes with libm (or, for the erf family, :mod:`.special` in float64).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial as _partial

import numpy as np

from ..dtype import is_bfloat16
from . import special
from .arrays import F32, F64, is_low_float
from .steps import Step, chain

__all__ = [
    "EIGEN_RATIONALS",
    "EXP_LN2",
    "EXP_POLY",
    "FUSABLE_MODES",
    "JIT_FORMS",
    "JIT_HELPERS",
    "MODES",
    "REDUCE_MODES",
    "ModeTrait",
    "arity",
    "bind_numpy",
    "check_mode",
    "check_operands",
    "compute",
    "numpy_steps",
    "round_in_place",
]

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
_NATIVE_LOWP: dict[str, tuple[str, ...]] = {}


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


def _register(name: str, n: int, kernel, ints: bool, floats: bool = True, native=("float16",)):
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


def round_in_place(w: np.ndarray) -> list[Step]:
    """The steps rounding the float array ``w`` in place, half away from zero (ROUND)."""
    return _round(_Ctx(w, True), w)


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


# ---- the erf family (:mod:`.special`, float64) ------------------------------------------------
def _run_special(fn, x: np.ndarray, out: np.ndarray) -> None:
    np.copyto(out, fn(x.astype(F64)), "unsafe")


def _special(fn):
    return lambda c, x: [_partial(_run_special, fn, x, c.out)]


for _name, _fn in [("ERF", special.erf), ("ERFC", special.erfc), ("ERFINV", special.erfinv),
    ("ERFCINV", special.erfcinv)]:
    _register(_name, 1, _special(_fn), False, native=("float16", "bfloat16"))


# ---- modes and dtypes -------------------------------------------------------------------------
def _trait(mode: str) -> ModeTrait:
    try:
        return MODES[mode.upper()]
    except (KeyError, AttributeError):
        raise ValueError(f"unknown Elemwise mode {mode!r}") from None


def _is_float(dtype: np.dtype) -> bool:
    return (dtype.kind == "f" and dtype.itemsize <= 8) or is_bfloat16(dtype)


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


# ---- the plain (NumPy) binding --------------------------------------------------------------
def check_operands(mode: str, inputs: Sequence[np.ndarray], out: np.ndarray) -> ModeTrait:
    """The trait of ``mode`` after checking its operands (:func:`bind_numpy`'s rules).

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
    return trait


def bind_numpy(mode: str, inputs: Sequence[np.ndarray], out: np.ndarray) -> Callable[[], None]:
    """Bind an Elemwise mode to its arrays as its NumPy steps (never compiled); the arguments,
    result and errors are those of :func:`megbrain.kernels.elemwise.bind`."""
    return numpy_steps(check_operands(mode, inputs, out), inputs, out)


def numpy_steps(trait: ModeTrait, inputs: Sequence[np.ndarray], out: np.ndarray):
    """The NumPy steps of a mode on checked operands (:func:`check_operands`), chained."""
    dtype = inputs[0].dtype
    steps: list[Step] = []
    cdtype = dtype
    if is_low_float(dtype) and dtype.name not in _NATIVE_LOWP[trait.name]:
        cdtype = F32
        converted = []
        for x in inputs:
            x32 = np.empty(x.shape, F32)
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
    bind_numpy(mode, arrays, out)()
    return out


#: Eigen's rational approximations (:func:`_rational`): name -> (bound, p, q, result); beyond
#: the bound the function is +-1 in float32
EIGEN_RATIONALS = {
    "_tanh": (
        "7.90531110763549805",
        "-2.76076847742355e-16 2.00018790482477e-13 -8.60467152213735e-11 5.12229709037114e-08 "
        "1.48572235717979e-05 6.37261928875436e-04 4.89352455891786e-03",
        "1.19825839466702e-06 1.18534705686654e-04 2.26843463243900e-03 4.89352518554385e-03",
        # +-1 at the bound itself too: there the fused multiply-adds leave 1 - 2^-22
        "x if (abs(x) < F(0.0004)) | (x != x) else r if abs(x) < F(7.90531110763549805) "
        "else F(1.0) if x > F(0.0) else F(-1.0)",
    ),
    "_erf": (
        "4.0",
        "-2.72614225801306e-10 2.77068142495902e-08 -2.10102402082508e-06 -5.69250639462346e-05 "
        "-7.34990630326855e-04 -2.95459980854025e-03 -1.60960333262415e-02",
        "-1.45660718464996e-05 -2.13374055278905e-04 -1.68282697438203e-03 -7.37332916720468e-03 "
        "-1.42647390514189e-02",
        "x if x != x else r",
    ),
}


def _rational(name: str, bound: str, p: str, q: str, result: str) -> str:
    """The source of ``name(x)``, Eigen's rational approximation ``xc p(xc^2) / q(xc^2)``
    (``p``, ``q`` the coefficients from the highest power, float literals apart by spaces) of
    ``x`` clamped to ``[-bound, bound]``; it returns ``result`` (an expression of ``x`` and
    ``r``, the quotient)."""

    def horner(v: str, coefficients: str) -> str:
        first, *rest = coefficients.split()
        return "\n".join([f"    {v} = F({first})"] + [f"    {v} = {v} * x2 + F({c})" for c in rest])

    return f"""
@njit(**_APPROX)
def {name}(x):
    xc = x if x < F({bound}) else F({bound})
    xc = xc if xc > F(-{bound}) else F(-{bound})
    x2 = xc * xc
{horner("p", p)}
    p = p * xc
{horner("q", q)}
    r = p / q
    return {result}
"""


# ---- the scalar forms the fused kernels compile ----------------------------------------------
#: the closing reductions a fused kernel can apply
REDUCE_MODES = ("SUM", "MEAN", "MAX", "MIN")
# ---- helpers emitted into generated modules -----------------------------------------------
#: Cephes expf's ln 2 in two parts (the Cody-Waite reduction r = x - n ln2) and its
#: polynomial of exp(r), highest degree first, ``exp(r) = P(r) r^2 + r + 1``: read by the
#: JIT's ``_exp_reduced`` and the convolutions' vector SiLU (:mod:`.conv.loops.pointwise88`)
EXP_LN2 = (0.693359375, -2.12194440e-4)
EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
            5.0000001201e-1)  # fmt: skip
# name -> (source, helpers it calls). Literals are float32 (``F``) or int32 (``I``) so that
# nothing is promoted to float64/int64; selects use ``|``, not ``or`` (no branches), so that
# the loops vectorize.
JIT_HELPERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "_i2f": (
        """
@intrinsic
def _i2f(typingctx, i):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], _llir.FloatType())
    return types.float32(types.int32), codegen
""",
        (),
    ),
    "_f2i": (
        """
@intrinsic
def _f2i(typingctx, f):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], _llir.IntType(32))
    return types.int32(types.float32), codegen
""",
        (),
    ),
    # Cephes expf's exp(x - n ln2) for an integral n rounded from x / ln2: the reduction in
    # two steps (Cody-Waite), then the polynomial
    "_exp_reduced": (
        f"""
@njit(**_APPROX)
def _exp_reduced(x, n):
    r = x - n * F({EXP_LN2[0]!r})
    r = r - n * F({EXP_LN2[1]!r})
    p = F({EXP_POLY[0]!r})
""" + "".join(f"    p = p * r + F({c!r})\n" for c in EXP_POLY[1:]) + """\
    p = p * (r * r) + r + F(1.0)
    return p
""",
        (),
    ),
    # Cephes expf: exp(x) = 2^n exp(r), r = x - n ln2, 2^n as two exponent fields so that
    # subnormal results come out right; ~1.5 ulp.
    "_exp": (
        """
@njit(**_APPROX)
def _exp(x):
    xc = x if x < F(89.0) else F(89.0)
    xc = xc if xc > F(-104.0) else F(-104.0)
    n = np.floor(xc * F(1.4426950408889634) + F(0.5))
    p = _exp_reduced(xc, n)
    ni = I(n)
    n1 = ni >> I(1)
    n2 = ni - n1
    res = p * _i2f((n1 + I(127)) << I(23)) * _i2f((n2 + I(127)) << I(23))
    res = F(np.inf) if x > F(88.72283905206835) else res
    res = F(0.0) if x < F(-103.97208) else res
    return x if x != x else res
""",
        ("_i2f", "_exp_reduced"),
    ),
    # Cephes logf: x = m 2^e with m in [sqrt(1/2), sqrt(2)), log(m) by a degree-9 polynomial.
    "_log": (
        """
@njit(**_APPROX)
def _log(x):
    sub = x < F(1.1754943508222875e-38)
    xs = x * F(8388608.0) if sub else x
    bits = _f2i(xs)
    e = ((bits >> I(23)) & I(255)) - I(126)
    e = e - I(23) if sub else e
    m = _i2f((bits & I(-2139095041)) | I(1056964608))
    small = m < F(0.7071067811865476)
    fe = F(e) - (F(1.0) if small else F(0.0))
    m = (m + m - F(1.0)) if small else (m - F(1.0))
    z = m * m
    y = F(7.0376836292e-2)
    y = y * m - F(1.1514610310e-1)
    y = y * m + F(1.1676998740e-1)
    y = y * m - F(1.2420140846e-1)
    y = y * m + F(1.4249322787e-1)
    y = y * m - F(1.6668057665e-1)
    y = y * m + F(2.0000714765e-1)
    y = y * m - F(2.4999993993e-1)
    y = y * m + F(3.3333331174e-1)
    y = y * m * z
    y = y + F(-2.12194440e-4) * fe
    y = y - F(0.5) * z
    r = m + y + F(0.693359375) * fe
    r = F(-np.inf) if x == F(0.0) else r
    r = F(np.nan) if x < F(0.0) else r
    r = x if x == F(np.inf) else r
    return x if x != x else r
""",
        ("_i2f", "_f2i"),
    ),
    "_tanh": (_rational("_tanh", *EIGEN_RATIONALS["_tanh"]), ()),
    "_erf": (_rational("_erf", *EIGEN_RATIONALS["_erf"]), ()),
    # exp(t) for t in [-88, 88] (not NaN): _exp's polynomial and one scale 2^n, n rounded
    # by the 1.5 2^23 shifter (whose low bits then hold n), none of _exp's edge selects: a
    # third of _exp's operations, for the sigmoid that only needs this range
    "_exp_mid": (
        """
@njit(**_APPROX)
def _exp_mid(t):
    k = t * F(1.4426950408889634) + F(12582912.0)
    n = k - F(12582912.0)
    return _exp_reduced(t, n) * _i2f((_f2i(k) << I(23)) + I(1065353216))
""",
        ("_i2f", "_f2i", "_exp_reduced"),
    ),
    # 1 / (1 + exp(-x)) with exp's argument clipped to [-88, 88] (the kernel clips at
    # floor(log(FLT_MAX)) = 88 above; below, 1 + exp(-88) is 1 already)
    "_sigmoid": (
        """
@njit(**_APPROX)
def _sigmoid(x):
    t = -x
    t = t if t < F(88.0) else F(88.0)
    t = t if t > F(-88.0) else F(-88.0)
    r = F(1.0) / (F(1.0) + _exp_mid(t))
    return x if x != x else r
""",
        ("_exp_mid",),
    ),
    "_lse": (
        """
@njit(**_APPROX)
def _lse(a, b):
    d = a - b
    m = a if a > b else b
    r = m + np.log1p(_exp(-abs(d)))
    r = d if d != d else r
    return a + F(0.6931471805599453) if a == b else r
""",
        ("_exp",),
    ),
    "_h_swish": (
        """
@njit(**_OPTS)
def _h_swish(x):
    w = x + F(3.0)
    w = w if w > F(0.0) else F(0.0)
    w = w if w < F(6.0) else F(6.0)
    return w * x * F(1.0 / 6.0)
""",
        (),
    ),
    "_h_swish_grad": (
        """
@njit(**_OPTS)
def _h_swish_grad(x, dy):
    w = (x * F(2.0) + F(3.0)) / F(6.0) * dy
    w = dy if x > F(3.0) else w
    return F(0.0) if x < F(-3.0) else w
""",
        (),
    ),
    "_fast_tanh": (
        """
@njit(**_OPTS)
def _fast_tanh(x):
    sq = x * x
    return (sq + F(27.0)) * x / (sq * F(9.0) + F(27.0))
""",
        (),
    ),
    "_fast_tanh_grad": (
        """
@njit(**_OPTS)
def _fast_tanh_grad(x, dy):
    sq = x * x
    w = (sq - F(9.0)) / (sq + F(3.0))
    return w * w * dy * F(1.0 / 9.0)
""",
        (),
    ),
    # half away from zero, like C round(); |x| >= 2^23 (and inf) is already integral
    "_round": (
        """
@njit(**_OPTS)
def _round(x):
    t = np.trunc(x)
    r = t + np.trunc((x - t) * F(2.0))
    return x if abs(x) >= F(8388608.0) else r
""",
        (),
    ),
}


def _relu(a: str) -> str:
    return f"({a} if ({a} > F(0.0)) | ({a} != {a}) else F(0.0))"


def _select(cond: str) -> str:
    return f"(F(1.0) if {cond} else F(0.0))"


# mode -> (template over argument names, helpers used)
JIT_FORMS: dict[str, tuple[Callable[..., str], tuple[str, ...]]] = {
    "ADD": (lambda a, b: f"{a} + {b}", ()),
    "SUB": (lambda a, b: f"{a} - {b}", ()),
    "MUL": (lambda a, b: f"{a} * {b}", ()),
    "TRUE_DIV": (lambda a, b: f"{a} / {b}", ()),
    "NEGATE": (lambda a: f"-{a}", ()),
    "ABS": (lambda a: f"abs({a})", ()),
    "MAX": (lambda a, b: f"({a} if ({a} > {b}) | ({a} != {a}) else {b})", ()),
    "MIN": (lambda a, b: f"({a} if ({a} < {b}) | ({a} != {a}) else {b})", ()),
    "RELU": (_relu, ()),
    "LT": (lambda a, b: _select(f"{a} < {b}"), ()),
    "LEQ": (lambda a, b: _select(f"{a} <= {b}"), ()),
    "EQ": (lambda a, b: _select(f"{a} == {b}"), ()),
    "MOD": (lambda a, b: f"np.fmod({a}, {b})", ()),
    "POW": (lambda a, b: f"{a} ** {b}", ()),
    "ATAN2": (lambda a, b: f"np.arctan2({a}, {b})", ()),
    "FLOOR_DIV": (lambda a, b: f"np.floor({a} / {b})", ()),
    "LOG_SUM_EXP": (lambda a, b: f"_lse({a}, {b})", ("_lse",)),
    "ACOS": (lambda a: f"np.arccos({a})", ()),
    "ASIN": (lambda a: f"np.arcsin({a})", ()),
    "CEIL": (lambda a: f"np.ceil({a})", ()),
    "FLOOR": (lambda a: f"np.floor({a})", ()),
    "COS": (lambda a: f"np.cos({a})", ()),
    "SIN": (lambda a: f"np.sin({a})", ()),
    "EXPM1": (lambda a: f"np.expm1({a})", ()),
    "LOG1P": (lambda a: f"np.log1p({a})", ()),
    "EXP": (lambda a: f"_exp({a})", ("_exp",)),
    "LOG": (lambda a: f"_log({a})", ("_log",)),
    "TANH": (lambda a: f"_tanh({a})", ("_tanh",)),
    "ERF": (lambda a: f"_erf({a})", ("_erf",)),
    "ERFC": (lambda a: f"F(math.erfc({a}))", ()),
    "SIGMOID": (lambda a: f"_sigmoid({a})", ("_sigmoid",)),
    "H_SWISH": (lambda a: f"_h_swish({a})", ("_h_swish",)),
    "FAST_TANH": (lambda a: f"_fast_tanh({a})", ("_fast_tanh",)),
    "ROUND": (lambda a: f"_round({a})", ("_round",)),
    "ABS_GRAD": (lambda a, b: f"({b} if {a} > F(0.0) else -{b})", ()),
    "SIGMOID_GRAD": (lambda a, b: f"(F(1.0) - {a}) * {a} * {b}", ()),
    "TANH_GRAD": (lambda a, b: f"(F(1.0) - {a} * {a}) * {b}", ()),
    "SWITCH_GT0": (lambda a, b: f"({b} if {a} > F(0.0) else F(0.0))", ()),
    "FAST_TANH_GRAD": (lambda a, b: f"_fast_tanh_grad({a}, {b})", ("_fast_tanh_grad",)),
    "H_SWISH_GRAD": (lambda a, b: f"_h_swish_grad({a}, {b})", ("_h_swish_grad",)),
    "FUSE_ADD_RELU": (lambda a, b: _relu(f"({a} + {b})"), ()),
    "FUSE_ADD_SIGMOID": (lambda a, b: f"_sigmoid({a} + {b})", ("_sigmoid",)),
    "FUSE_ADD_TANH": (lambda a, b: f"_tanh({a} + {b})", ("_tanh",)),
    "FUSE_ADD_H_SWISH": (lambda a, b: f"_h_swish({a} + {b})", ("_h_swish",)),
    "COND_LEQ_MOV": (lambda a, b, c: f"({c} if {a} <= {b} else F(0.0))", ()),
    "FUSE_MUL_ADD3": (lambda a, b, c: f"{a} * {b} + {c}", ()),
    "FUSE_MUL_ADD4": (lambda a, b, c, d: f"{a} * {b} + {c} * {d}", ()),
}

#: the Elemwise modes a fused kernel can compute (floating-point inputs)
FUSABLE_MODES = frozenset(JIT_FORMS)
