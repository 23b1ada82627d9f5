"""Quantized 2-d convolution and ConvBias kernels (NCHW, dense, grouped and depthwise) with
MegDNN's semantics: 8-bit products accumulated exactly in int32 by a compiled im2col and
integer GEMM of dot products (:mod:`.loops.int8`), the bias added in int32, then the naive
kernels' float32 chain (``handle_z_inp_and_activation``): with a ``z``, the int32 sum and
``z`` dequantized and added, the activation applied and the result quantized; without one,
the quantized activation (dequantize, activation, quantize) or a requantize to the output.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from .. import elemwise as ew
from .. import elemwise_multi_type as emt
from .. import parallel, workspace
from ..steps import Step, chain
from .common import conv_out_size
from .loops import int8 as int8_loops

__all__ = ["bind_quantized_conv_bias", "bind_quantized_convolution", "QUANTIZED_SOURCES"]

_partial = functools.partial
_F32 = np.dtype(np.float32)
_I16, _I32 = np.dtype(np.int16), np.dtype(np.int32)

#: the quantized source/filter dtypes the kernels take (MegDNN's 8-bit ConvBias dispatch)
QUANTIZED_SOURCES = ("QuantizedS8", "Quantized8Asymm")

#: multiply-adds worth one thread of the GEMM
_MIN_MACS_PER_THREAD = 1 << 17


def _plain(a: np.ndarray) -> np.ndarray:
    """``a`` viewed with its storage dtype (no quantization metadata)."""
    return a.view(np.dtype(a.dtype.str))


def _zero_point(a: np.ndarray) -> int:
    qp = ew.quant_params(a.dtype)
    if qp is None or qp.name not in QUANTIZED_SOURCES:
        raise ValueError(
            f"quantized convolution needs {' or '.join(QUANTIZED_SOURCES)} operands, got "
            f"{qp.name if qp else a.dtype.name}"
        )
    return int(qp.zero_point)


def bind_quantized_convolution(src: np.ndarray, filt: np.ndarray, out: np.ndarray,
                               stride: Sequence[int], pad: Sequence[int],
                               dilate: Sequence[int], flip: bool = False) -> Step:  # fmt: skip
    """Bind ``out = conv(src, filt)`` exactly in int32.

    Parameters
    ----------
    src : numpy.ndarray
        (N, G*I, H, W), QuantizedS8 or Quantized8Asymm (its zero point subtracted).
    filt : numpy.ndarray
        (G, O, I, FH, FW), of the source's kind (its zero point subtracted).
    out : numpy.ndarray
        (N, G*O, OH, OW) with 32-bit integer storage (QuantizedS32 or int32): the raw sums.
    stride, pad, dilate : sequence of int
        Per spatial dim.
    flip : bool
        Convolution (the filter flipped) rather than cross-correlation.

    Returns
    -------
    Step
        A zero-argument callable computing the sums into ``out``.
    """
    zx, zf = _zero_point(src), _zero_point(filt)
    n_, c_ = src.shape[:2]
    g_, o_, i_, fh, fw = filt.shape
    oh, ow = (conv_out_size(*a) for a in zip(src.shape[2:], (fh, fw), stride, pad, dilate))
    if c_ != g_ * i_ or out.shape != (n_, g_ * o_, oh, ow) or out.dtype.itemsize != 4:
        raise ValueError(
            f"quantized convolution: shapes src {src.shape}, filter {filt.shape}, out "
            f"{out.shape} ({out.dtype}) do not agree"
        )
    k_, p_ = i_ * fh * fw, oh * ow
    # int8 operands stay int8 (their products and sums widen in the GEMM); zero-point
    # shifted 8-bit values span up to [-255, 255] and take int16
    narrow = zx == 0 and zf == 0 and src.dtype.kind == "i" and filt.dtype.kind == "i"
    lane = np.dtype(np.int8) if narrow else _I16
    steps: list[Step] = []
    wk = workspace.empty((g_, o_, k_), lane)
    fv = _plain(filt)[..., ::-1, ::-1] if flip else _plain(filt)
    steps.append(_partial(np.copyto, wk.reshape(fv.shape), fv, "unsafe"))
    if zf:
        steps.append(_partial(np.subtract, wk, np.int16(zf), wk))
    col = workspace.empty((g_, p_, k_), lane)
    direct = out.flags.c_contiguous and out.dtype.kind == "i"
    y = _plain(out) if direct else workspace.empty(out.shape, _I32)
    y3 = y.reshape(n_, g_ * o_, p_)
    x = _plain(src)
    geo = ((fh, fw), tuple(stride), tuple(pad), tuple(dilate))
    blocks = int8_loops.gemm_blocks(g_, o_)
    blocks_min = max(1, _MIN_MACS_PER_THREAD // max(1, k_ * p_ * min(o_, 4)))
    for n in range(n_):
        im2col = _partial(_im2col_part, x, col, n, geo, ow, zx)
        steps.append(parallel.split(im2col, g_, 1))
        steps.append(parallel.split(_partial(_gemm_part, col, wk, y3, n), blocks, blocks_min))
    if not direct:
        steps.append(_partial(np.copyto, _plain(out), y, "unsafe"))
    return chain(steps)


def _im2col_part(x, col, n, geo, ow, zx, g0, g1):
    int8_loops.int8_im2col(x, col, n, *geo, ow, zx, g0, g1)


def _gemm_part(col, wk, y3, n, t0, t1):
    int8_loops.int8_gemm(col, wk, y3, n, t0, t1)


def bind_quantized_conv_bias(src: np.ndarray, filt: np.ndarray, bias: np.ndarray,
                             z: np.ndarray | None, out: np.ndarray, stride: Sequence[int],
                             pad: Sequence[int], dilate: Sequence[int], flip: bool,
                             mode: str) -> Step:  # fmt: skip
    """Bind MegDNN's quantized ConvBias ``out = act(conv(src, filt) + bias [+ z])``.

    Parameters
    ----------
    src, filt : numpy.ndarray
        As for :func:`bind_quantized_convolution`.
    bias : numpy.ndarray
        QuantizedS32, (1, G*O, 1, 1) or the output's shape; added in int32.
    z : numpy.ndarray or None
        Of the output's shape and quantized kind.
    out : numpy.ndarray
        QuantizedS32 (the int32 sums are written there and read with its scale) or an 8-bit
        quantized dtype (the sums are read with the bias's scale).
    stride, pad, dilate, flip
        As for :func:`bind_quantized_convolution`.
    mode : str
        IDENTITY, RELU or H_SWISH; SIGMOID only with a ``z`` (MegDNN applies it to float
        values only).

    Returns
    -------
    Step
        A zero-argument callable computing ``out``.
    """
    out_q = ew.quant_params(out.dtype)
    if out_q is None:
        raise ValueError(f"quantized ConvBias: the output must be quantized, got {out.dtype}")
    sfb_is_out = out_q.name == "QuantizedS32"
    sfb = out if sfb_is_out else workspace.empty(out.shape, _I32).view(bias.dtype)
    steps = [bind_quantized_convolution(src, filt, sfb, stride, pad, dilate, flip)]
    acc = _plain(sfb)
    steps.append(_partial(np.add, acc, _plain(bias), acc))  # int32, wrapping as C's does
    sfb_q = ew.quant_params(sfb.dtype)
    if z is not None:
        res, zf = np.empty(out.shape, _F32), np.empty(z.shape, _F32)
        steps += ew.dequantize_steps(sfb, res, sfb_q)
        steps += ew.dequantize_steps(z, zf, ew.quant_params(z.dtype))
        steps.append(_partial(np.add, res, zf, res))
        if mode != "IDENTITY":
            act = np.empty(out.shape, _F32)
            steps.append(ew.bind(mode, [res], act))
            res = act
        steps += ew.quantize_steps(res, out, out_q)
    elif mode != "IDENTITY":
        if mode == "SIGMOID":
            raise ValueError("quantized ConvBias: SIGMOID needs a z (float intermediate)")
        steps.append(emt.bind_quantized(mode, [sfb], out))
    elif not sfb_is_out:
        steps.append(ew.typecvt_bind(sfb, out))
    return chain(steps)
