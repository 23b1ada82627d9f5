"""Elemwise kernels: every MegDNN Elemwise mode, bound once to its arrays and run into ``out``.

``bind(mode, inputs, out)`` resolves everything (ufuncs, constants, scratch buffers) and returns
a zero-argument callable; the executor calls it on the hot path. The modes' math is the table
of :mod:`.elemwise_modes`; a few run as one compiled loop (:mod:`.jit_codegen`) on large
float32 arrays. Also here: TypeCvt, the quantized dtypes' parameters and the compiled in-place
update of AddUpdate.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from functools import partial as _partial
from typing import NamedTuple

import numpy as np
from numba import njit

from .. import dtype as _dt
from . import jit_codegen, parallel
from .arrays import F32, same_elements
from .conv.loops import int8 as int8_loops
from .elemwise_modes import check_operands, numpy_steps, round_in_place
from .steps import Step, chain

__all__ = [
    "COMPILED_BCAST_MODES",
    "COMPILED_MIN_SIZE",
    "COMPILED_MODES",
    "COMPILED_UPDATE_MIN_SIZE",
    "QuantParams",
    "bind",
    "compiled_scaled_update",
    "dequantize_steps",
    "quant_params",
    "quantize_steps",
    "typecvt_bind",
]



#: modes run by one compiled loop (:mod:`megbrain.kernels.jit_codegen`) on large float32
#: arrays, whose compiled form gives the same values (no approximation, same operation
#: order): those NumPy computes in several passes or slowly (RELU's NaN-aware maximum) ...
COMPILED_MODES = frozenset(
    {"RELU", "MAX", "MIN", "SWITCH_GT0", "FUSE_ADD_RELU", "FUSE_MUL_ADD3", "FUSE_MUL_ADD4",
     "COND_LEQ_MOV"}
)  # fmt: skip
#: ... and one-pass modes whose broadcast operand (a per-channel bias, a squeeze-and-excitation
#: gate of NCHW88) makes NumPy's inner loop short: compiled only for the per-channel
#: broadcast layouts
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
    if out.dtype != F32 or out.size < COMPILED_MIN_SIZE:
        return None
    for x in inputs:
        if np.may_share_memory(x, out) and not same_elements(x, out):
            return None
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
    trait = check_operands(mode, inputs, out)
    if compiled and out.dtype == inputs[0].dtype:
        fn = _compiled_bind(trait.name, inputs, out)
        if fn is not None:
            return fn
    return numpy_steps(trait, inputs, out)


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
    w = np.empty(out.shape, F32)
    steps: list[Step] = [_partial(np.true_divide, src, qp.scale, w)]
    steps += round_in_place(w)
    if qp.zero_point:
        steps.append(_partial(np.add, w, qp.zero_point, w))
    steps += [
        _partial(np.fmax, w, qp.qmin, w),
        _partial(np.fmin, w, qp.qmax, w),
        _partial(np.copyto, out, w, "unsafe"),
    ]
    return steps


#: elements worth one thread of a one-pass 8-bit loop (TypeCvt's quantize, the quantized add)
EIGHT_BIT_MIN_PER_THREAD = 1 << 16


def _bind_8bit_quantize(src: np.ndarray, out: np.ndarray) -> Callable[[], None] | None:
    """MegDNN's quantize of float32 ``src`` into the 8-bit quantized ``out`` of its shape,
    both C-contiguous, as one compiled pass (a network's input TypeCvt: the NumPy steps made
    seven passes), the same float32 operations; else None.

    Parameters
    ----------
    src, out : numpy.ndarray
        The float32 values and the QuantizedS8 / Quantized8Asymm destination.

    Returns
    -------
    Callable[[], None] or None
    """
    qo = quant_params(out.dtype)
    if not (qo is not None and out.dtype.itemsize == 1 and src.dtype == F32
            and src.shape == out.shape and src.flags.c_contiguous and out.flags.c_contiguous):
        return None  # fmt: skip
    q = np.array([qo.scale, qo.zero_point, qo.qmin, qo.qmax], F32)
    flat_out = out.view(np.dtype(out.dtype.str)).reshape(-1)
    part = int8_loops.quantize_8bit(src.reshape(-1), flat_out, q)
    return parallel.split(part, out.size, EIGHT_BIT_MIN_PER_THREAD)


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
        one_bf16 = _dt.is_bfloat16(src.dtype) != _dt.is_bfloat16(out.dtype)
        if not one_bf16 or F32 in (src.dtype, out.dtype):
            return _partial(np.copyto, out, src, "unsafe")
    if src_q is None and out_q is not None:
        fast = _bind_8bit_quantize(src, out)
        if fast is not None:
            return fast
    steps: list[Step] = []
    mid = src
    if src_q is not None:
        mid = np.empty(src.shape, F32)
        steps += dequantize_steps(src, mid, src_q)
    elif src.dtype != F32:
        mid = np.empty(src.shape, F32)
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
        dest.dtype != F32
        or delta.dtype != F32
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
