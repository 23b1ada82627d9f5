"""ElemwiseMultiType kernels: MegDNN's fixed-point modes and the quantized (``Q*``) modes.

The fixed-point modes mix integer and float32 operands of fixed dtypes (``INT_MODES``). A
quantized mode ``Q<MODE>`` dequantizes its inputs to float32, computes the Elemwise mode
``<MODE>`` in float32 and quantizes the result to the output's quantized dtype, as MegDNN's
naive kernels do (:func:`bind_quantized`, also used by Elemwise on quantized inputs).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from . import elemwise as ew
from . import parallel
from .conv.loops import int8 as int8_loops
from .elemwise_modes import arity as elemwise_arity
from .elemwise_modes import compute
from .steps import chain

__all__ = [
    "INT_MODES",
    "IntModeTrait",
    "QUANTIZED_MODES",
    "QUANTIZED_DTYPE_NAMES",
    "arity",
    "bind",
    "bind_quantized",
]

_partial = functools.partial
_F32 = np.dtype(np.float32)
_I8, _I16, _I32 = np.dtype(np.int8), np.dtype(np.int16), np.dtype(np.int32)
#: MegDNN's MEGDNN_FOREACH_COMPUTING_DTYPE_INT: the "IX" operand of the fixed-point modes
_INTS = (_I32, _I16, _I8, np.dtype(np.uint8))

#: the quantized dtypes the quantized kernels read and write (MEGDNN_FOREACH_QUANTIZED_DTYPE)
QUANTIZED_DTYPE_NAMES = ("Quantized8Asymm", "QuantizedS32", "QuantizedS8")

#: ``Q<MODE>`` -> the Elemwise mode computed on dequantized values, in MegDNN's dispatch order
QUANTIZED_MODES: dict[str, str] = {
    "Q" + m: m
    for m in (
        # unary
        "RELU ABS ACOS ASIN CEIL COS EXP EXPM1 FLOOR LOG LOG1P NEGATE SIGMOID SIN TANH "
        "FAST_TANH ROUND ERF ERFINV ERFC ERFCINV H_SWISH "
        # binary
        "ABS_GRAD ADD FLOOR_DIV MAX MIN MOD MUL POW SIGMOID_GRAD SUB SWITCH_GT0 TANH_GRAD "
        "TRUE_DIV LOG_SUM_EXP LT LEQ EQ FUSE_ADD_RELU FUSE_ADD_SIGMOID FUSE_ADD_TANH "
        "FAST_TANH_GRAD ATAN2 H_SWISH_GRAD FUSE_ADD_H_SWISH "
        # ternary
        "FUSE_MUL_ADD3 COND_LEQ_MOV"
    ).split()
}


@dataclass(frozen=True)
class IntModeTrait:
    """One fixed-point mode of ElemwiseMultiType.

    Attributes
    ----------
    name : str
        The mode name.
    inputs : tuple of tuple of numpy.dtype
        For each input, the dtypes it may have.
    out : numpy.dtype
        The output dtype (fixed by the mode).
    kernel : Callable
        ``kernel(inputs, out)`` computing the result into ``out`` when called.
    """

    name: str
    inputs: tuple[tuple[np.dtype, ...], ...]
    out: np.dtype
    kernel: Callable[[Sequence[np.ndarray], np.ndarray], None]


def _round_shr_saturate(x: np.ndarray, k: np.ndarray, out_dtype: np.dtype) -> np.ndarray:
    """MegDNN's ``round_shr_saturate``: ``x >> k`` rounded half away from zero, saturated to
    ``out_dtype`` (computed in int64, exact for shifts below the width of x's dtype)."""
    xi = x.astype(np.int64)
    ki = k.astype(np.int64)
    mask = np.left_shift(np.int64(1), ki) - 1
    threshold = np.right_shift(mask, 1) + (xi < 0)
    res = np.right_shift(xi, ki) + (np.bitwise_and(xi, mask) > threshold)
    if x.dtype != out_dtype:
        info = np.iinfo(out_dtype)
        np.clip(res, info.min, info.max, out=res)
    return res


def _fma3_int16x32x32x32(ins: Sequence[np.ndarray], out: np.ndarray) -> None:
    x, y, z = ins
    np.multiply(x, y, out=out, casting="unsafe")  # int32 products wrap, as in C
    np.add(out, z, out=out, casting="unsafe")


def _fma3_ix_f32_f32_i8(ins: Sequence[np.ndarray], out: np.ndarray) -> None:
    x, k, b = ins
    w = np.empty(out.shape, _F32)
    np.copyto(w, x, "unsafe")
    np.multiply(k, w, w)
    np.add(w, b, w)
    np.rint(w, w)  # C rint: half to even
    info = np.iinfo(out.dtype)
    np.fmax(w, np.float32(info.min), w)  # NaN saturates to the minimum, as in MegDNN
    np.fmin(w, np.float32(info.max), w)
    np.copyto(out, w, "unsafe")


def _round_shr_kernel(ins: Sequence[np.ndarray], out: np.ndarray) -> None:
    x, k = ins
    np.copyto(out, _round_shr_saturate(x, k, out.dtype), "unsafe")


def _fuse_add_rmulh_round_shr(ins: Sequence[np.ndarray], out: np.ndarray) -> None:
    x, y, m, shift, lo, hi = ins
    s = np.add(x, y)  # wraps in the operands' dtype, as the C kernel's conversion back does
    r = compute("RMULH", s, m)
    res = _round_shr_saturate(r, shift, out.dtype)
    np.minimum(res, hi, out=res)
    np.maximum(res, lo, out=res)
    np.copyto(out, res, "unsafe")


INT_MODES: dict[str, IntModeTrait] = {
    t.name: t
    for t in (
        IntModeTrait(
            "FUSE_MUL_ADD3_INT16x32x32x32", ((_I16,), (_I32,), (_I32,)), _I32, _fma3_int16x32x32x32
        ),
        IntModeTrait(
            "FUSE_MUL_ADD3_IXxF32xF32xI8", (_INTS, (_F32,), (_F32,)), _I8, _fma3_ix_f32_f32_i8
        ),
        IntModeTrait("ROUND_SHR_SATURATE_IXxI8xI8", (_INTS, (_I8,)), _I8, _round_shr_kernel),
        IntModeTrait(
            "FUSE_ADD_RMULH_ROUND_SHR_SATURATE_INT16x16x16x8",
            ((_I16,),) * 3 + ((_I8,),) * 3,
            _I8,
            _fuse_add_rmulh_round_shr,
        ),
        IntModeTrait(
            "FUSE_ADD_RMULH_ROUND_SHR_SATURATE_INT32x32x32x8",
            ((_I32,),) * 3 + ((_I8,),) * 3,
            _I8,
            _fuse_add_rmulh_round_shr,
        ),
        # MegDNN's naive kernel takes int32 and int16 sources only
        IntModeTrait(
            "ROUND_SHR_SATURATE_IXxI8xI16", ((_I32, _I16), (_I8,)), _I16, _round_shr_kernel
        ),
    )
}


def arity(mode: str) -> int:
    """The number of inputs of an ElemwiseMultiType mode.

    Parameters
    ----------
    mode : str
        The upper-case mode name.
    """
    if mode in INT_MODES:
        return len(INT_MODES[mode].inputs)
    if mode in QUANTIZED_MODES:
        return elemwise_arity(QUANTIZED_MODES[mode])
    raise ValueError(f"unknown ElemwiseMultiType mode {mode!r}")


def _quant(x: np.ndarray, what: str) -> ew.QuantParams:
    qp = ew.quant_params(x.dtype)
    if qp is None or qp.name not in QUANTIZED_DTYPE_NAMES:
        raise ValueError(
            f"{what} must be of a quantized dtype ({', '.join(QUANTIZED_DTYPE_NAMES)}), "
            f"got {qp.name if qp else x.dtype.name}"
        )
    return qp


def bind_quantized(mode: str, inputs: Sequence[np.ndarray], out: np.ndarray) -> Callable[[], None]:
    """Bind a quantized computation: Elemwise ``mode`` on dequantized inputs, quantized to
    ``out``'s dtype.

    Parameters
    ----------
    mode : str
        The Elemwise mode (``"ADD"``; not the ``Q``-prefixed name).
    inputs : sequence of numpy.ndarray
        Quantized inputs (QuantizedS8, Quantized8Asymm or QuantizedS32, each with its own
        scale), broadcastable to ``out.shape``.
    out : numpy.ndarray
        The quantized output.

    Returns
    -------
    Callable[[], None]
        A zero-argument callable computing the result into ``out``.
    """
    fused = _bind_8bit_add(mode, inputs, out)
    if fused is not None:
        return fused
    steps: list = []
    reals = []
    for i, x in enumerate(inputs):
        r = np.empty(x.shape, _F32)
        steps += ew.dequantize_steps(x, r, _quant(x, f"input {i}"))
        reals.append(r)
    res = np.empty(out.shape, _F32)
    steps.append(ew.bind(mode, reals, res))
    steps += ew.quantize_steps(res, out, _quant(out, "the output"))
    return chain(steps)


def _bind_8bit_add(mode: str, inputs: Sequence[np.ndarray], out: np.ndarray):
    """ADD or FUSE_ADD_RELU of two 8-bit quantized arrays of the output's shape, all
    C-contiguous, into an 8-bit output, as one compiled pass (a network's residual adds: the
    NumPy steps took 12 passes over the values), the same float32 operations in the same
    order; else None."""
    if mode not in ("ADD", "FUSE_ADD_RELU") or len(inputs) != 2:
        return None
    arrays = (*inputs, out)
    if any(a.shape != out.shape or a.dtype.itemsize != 1 or not a.flags.c_contiguous
           for a in arrays):  # fmt: skip
        return None
    qa, qb, qo = (_quant(a, what) for a, what in zip(arrays, ("input 0", "input 1",
                                                             "the output")))  # fmt: skip
    q = np.array([qa.scale, qa.zero_point, qb.scale, qb.zero_point, qo.scale, qo.zero_point,
                  qo.qmin, qo.qmax], _F32)  # fmt: skip
    flat = [a.view(np.dtype(a.dtype.str)).reshape(-1) for a in arrays]
    part = int8_loops.quantized_add(*flat, q, mode == "FUSE_ADD_RELU")
    return parallel.split(part, out.size, ew.EIGHT_BIT_MIN_PER_THREAD)


def bind(mode: str, inputs: Sequence[np.ndarray], out: np.ndarray) -> Callable[[], None]:
    """Bind an ElemwiseMultiType mode to its input and output arrays.

    Parameters
    ----------
    mode : str
        The upper-case mode name (``"FUSE_MUL_ADD3_INT16x32x32x32"``, ``"QADD"``...).
    inputs : sequence of numpy.ndarray
        The inputs, of the mode's dtypes, broadcastable to ``out.shape``.
    out : numpy.ndarray
        The output.

    Returns
    -------
    Callable[[], None]
        A zero-argument callable computing the result into ``out``.
    """
    if mode in QUANTIZED_MODES:
        return bind_quantized(QUANTIZED_MODES[mode], inputs, out)
    trait = INT_MODES.get(mode)
    if trait is None:
        raise ValueError(f"unknown ElemwiseMultiType mode {mode!r}")
    if len(inputs) != len(trait.inputs):
        raise ValueError(f"mode {mode} takes {len(trait.inputs)} inputs, got {len(inputs)}")
    return _partial(trait.kernel, tuple(inputs), out)
