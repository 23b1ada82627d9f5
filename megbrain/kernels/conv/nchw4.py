"""Quantized ConvBias and Convolution in the channel-blocked NCHW4 format (the layout
``optimize_for_inference(use_nchw4=True)`` writes, MegDNN's ``Format::NCHW4``): source
``(N, C/4, H, W, 4)``, filter ``(OC, IC/4, FH, FW, 4)`` (dense) or ``(G, OCg, ICg/4, FH,
FW, 4)`` (grouped), bias ``(1, OC/4, 1, 1, 4)`` or the output's shape, output ``(N, OC/4,
OH, OW, 4)``; 8-bit quantized operands, no dilation (the reference's checks).

The values are those of the NCHW kernels (:mod:`.quantized`) bit for bit. Where the VNNI
kernels take the convolution they read the blocked source's 4-channel words as they are
(their relayout a padded, shifted copy without the transpose) and write the blocked output
(:func:`.quantized.bind_vnni_blocked`); otherwise the operands are relaid to NCHW, the NCHW
kernel runs, and its output is relaid back.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from .. import parallel, workspace
from ..steps import Step, chain
from . import quantized
from .common import conv_out_size
from .constant_operands import filter_is_constant
from .loops import vnni as vnni_loops
from .nchw8c import filter_packed

__all__ = ["bind_blocked_copy", "bind_nchw4_conv_bias", "bind_nchw4_convolution",
           "from_nchw", "nchw4_geometry", "to_nchw"]

_partial = functools.partial


def nchw4_geometry(src: Sequence[int], filt: Sequence[int], group: bool, stride, pad,
                   dilate) -> tuple:  # fmt: skip
    """The NCHW4 output shape of a convolution of ``src`` by ``filt``, or ValueError naming
    the shapes where they do not agree (the reference's ``check_layout_fwd`` for NCHW4)."""
    src, filt = tuple(src), tuple(filt)
    nd = 6 if group else 5
    kind = "grouped (G, OCg, ICg/4, FH, FW, 4)" if group else "dense (OC, IC/4, FH, FW, 4)"
    if len(src) != 5 or src[4] != 4:
        raise ValueError(f"NCHW4 needs a (N, C/4, H, W, 4) src, got {_fmt(src)}")
    if len(filt) != nd or filt[-1] != 4:
        raise ValueError(f"NCHW4 needs a {kind} filter, got {_fmt(filt)}")
    if tuple(dilate) != (1, 1):
        raise ValueError(f"NCHW4 takes no dilation, got dilate={tuple(dilate)}")
    g, ocg, icg4 = (filt[0], filt[1], filt[2]) if group else (1, filt[0], filt[1])
    if src[1] != g * icg4:
        raise ValueError(
            f"channel mismatch: src {_fmt(src)} has {src[1] * 4} channels but filter "
            f"{_fmt(filt)} expects {g * icg4 * 4} (groups={g}, channels per group={icg4 * 4})"
        )
    if (g * ocg) % 4:
        raise ValueError(f"NCHW4 needs output channels a multiple of 4, filter {_fmt(filt)} "
                         f"gives {g * ocg}")  # fmt: skip
    if group and ocg % 4:
        raise ValueError(f"grouped NCHW4 needs each group's output channels a multiple of 4, "
                         f"filter {_fmt(filt)} gives {ocg}")  # fmt: skip
    fsp = filt[-3:-1]
    out = tuple(conv_out_size(*a) for a in zip(src[2:4], fsp, stride, pad, dilate))
    if any(o <= 0 for o in out):
        raise ValueError(f"src {_fmt(src)} is smaller than the filter {_fmt(fsp)} "
                         f"(pad={tuple(pad)}): output size {_fmt(out)}")  # fmt: skip
    return (src[0], g * ocg // 4, *out, 4)


def _fmt(shape) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ")"


def _storage(a: np.ndarray) -> np.ndarray:
    return a.view(np.dtype(a.dtype.str))


def _nchw_shape(a: np.ndarray) -> tuple:
    n, c4, h, w, k = a.shape
    return (n, c4 * k, h, w)


#: bytes of a relayout worth one thread
_MIN_RELAYOUT_BYTES = 1 << 16


def bind_blocked_copy(src: np.ndarray, dst: np.ndarray) -> Step:
    """The step copying ``src`` into ``dst`` of the other layout: NCHW ``(N, C, H, W)`` into
    NCHW4 ``(N, C/4, H, W, 4)`` or back, ``C`` a multiple of 4 (RelayoutFormat's
    NCHW_NCHW4 and NCHW4_NCHW without padding). 8-bit C-contiguous arrays take the
    compiled loops (:func:`.loops.vnni.relayout_blocked`, split over the blocks), others
    NumPy's strided copy."""
    to_blocked = dst.ndim == 5
    nchw = src if to_blocked else dst
    n, c, h, w = nchw.shape
    view = _storage(nchw).reshape(n, c // 4, 4, h, w).transpose(0, 1, 3, 4, 2)
    if not (src.dtype.itemsize == 1 and src.flags.c_contiguous and dst.flags.c_contiguous):
        if to_blocked:
            return _partial(np.copyto, _storage(dst), view)
        return _partial(np.copyto, view, _storage(src))
    part = _partial(vnni_loops.relayout_blocked, _bytes(src), _bytes(dst), h * w, to_blocked)
    return parallel.split(part, n * c // 4, max(1, _MIN_RELAYOUT_BYTES // (4 * h * w)))


def _bytes(a: np.ndarray) -> np.ndarray:
    return _storage(a).view(np.uint8).reshape(-1)


def to_nchw(a: np.ndarray, keep=None) -> tuple[np.ndarray, Step]:
    """``(b, step)``: ``b`` an NCHW array of ``a``'s dtype, ``step`` copying the NCHW4 ``a``
    into it; ``keep`` allocates (default the workspace)."""
    b = (keep or workspace.empty)(_nchw_shape(a), np.dtype(a.dtype.str)).view(a.dtype)
    return b, bind_blocked_copy(a, b)


def from_nchw(b: np.ndarray, a: np.ndarray) -> Step:
    """The step copying the NCHW ``b`` into the NCHW4 ``a``."""
    return bind_blocked_copy(b, a)


def _nchw_filter(filt: np.ndarray, group: bool) -> tuple[np.ndarray, Step]:
    """The (G, OCg, ICg, FH, FW) copy of an NCHW4 filter and its step (a constant filter's
    copy is private memory, made once: the step then runs on the first call only)."""
    f = filt if group else filt[None]
    g, ocg, icg4, fh, fw, k = f.shape
    constant = filter_is_constant()
    keep = workspace.aligned if constant else workspace.empty
    out = keep((g, ocg, icg4 * k, fh, fw), np.dtype(f.dtype.str)).view(f.dtype)
    view = _storage(out).reshape(g, ocg, icg4, k, fh, fw).transpose(0, 1, 2, 4, 5, 3)
    return out, _partial(np.copyto, view, _storage(f))


def bind_nchw4_conv_bias(src: np.ndarray, filt: np.ndarray, bias: np.ndarray,
                         z: np.ndarray | None, out: np.ndarray, stride, pad, dilate,
                         flip: bool, mode: str, group: bool) -> Step:  # fmt: skip
    """Bind the quantized ConvBias ``out = act(conv(src, filt) + bias [+ z])`` on NCHW4
    operands (the module's shapes), computed as
    :func:`.quantized.bind_quantized_conv_bias` computes the NCHW one.

    Parameters
    ----------
    src, filt : numpy.ndarray
        The NCHW4 source and filter (dense, or grouped with ``group``), 8-bit quantized.
    bias : numpy.ndarray
        QuantizedS32, (1, OC/4, 1, 1, 4) or the output's shape.
    z : numpy.ndarray or None
        Of the output's shape and quantized kind.
    out : numpy.ndarray
        (N, OC/4, OH, OW, 4), quantized.
    stride, pad, dilate, flip, mode
        As for :func:`.quantized.bind_quantized_conv_bias`.
    group : bool
        Whether ``filt`` is grouped.

    Returns
    -------
    Step
    """
    fn, pack = _nchw_filter(filt, group)
    constant = filter_is_constant()
    fast = quantized.bind_vnni_blocked(src, fn, bias, z, out, stride, pad, dilate, flip, mode)
    if fast is not None:
        return filter_packed(pack, fast, constant)
    steps: list[Step] = []
    x, step = to_nchw(src)
    steps.append(step)
    b = bias
    if bias.ndim == 5:
        b, step = to_nchw(bias)
        steps.append(step)
    zn = None
    if z is not None:
        zn, step = to_nchw(z)
        steps.append(step)
    y = workspace.empty(_nchw_shape(out), np.dtype(out.dtype.str)).view(out.dtype)
    steps.append(quantized.bind_quantized_conv_bias(x, fn, b, zn, y, stride, pad, dilate,
                                                    flip, mode))  # fmt: skip
    steps.append(from_nchw(y, out))
    return filter_packed(pack, chain(steps), constant)


def bind_nchw4_convolution(src: np.ndarray, filt: np.ndarray, out: np.ndarray, stride, pad,
                           dilate, flip: bool, group: bool) -> Step:  # fmt: skip
    """Bind the quantized Convolution ``out = conv(src, filt)`` (the int32 sums, ``out``
    QuantizedS32 or int32) on NCHW4 operands, as
    :func:`.quantized.bind_quantized_convolution` computes the NCHW one."""
    fn, pack = _nchw_filter(filt, group)
    x, step = to_nchw(src)
    y = workspace.empty(_nchw_shape(out), np.dtype(out.dtype.str)).view(out.dtype)
    conv = quantized.bind_quantized_convolution(x, fn, y, stride, pad, dilate, flip)
    return filter_packed(pack, chain([step, conv, from_nchw(y, out)]), filter_is_constant())
