"""2-d pooling in the channel-blocked NCHW4 layout of ``use_nchw4``: source ``(N, C/4, H,
W, 4)``, output ``(N, C/4, OH, OW, 4)``, the values of the NCHW pooling (:mod:`.binds`).

ResNet's stem pooling (MAX, 3x3, stride 2, padding 1) of 8-bit signed values runs blocked
(:func:`_max_3s2p1_py`): per output row, the maximum of its three source rows over the
row's bytes (4 channels a position, contiguous), then of each byte and its neighbours 4
bytes away (the positions before and after, the padding the lowest value), then every
other position's word copied out; every pass runs over contiguous bytes (LLVM vectorizes
them; a loop over the taps of each output's channels stayed scalar, 3x slower than the
NCHW loop). A maximum rounds nothing, so the values equal the NCHW pooling's. The global
average of 8-bit quantized values (a classifier's head) sums each block's 4 channels over
its positions and quantizes each sum as the NCHW loop does. Other geometries, modes and
dtypes run the NCHW pooling between relayouts.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit

from .. import parallel
from ..conv import nchw4 as conv_nchw4
from ..conv.loops.int8 import _quantize
from ..elemwise import quant_params
from ..steps import Step, chain
from . import binds

__all__ = ["bind_pooling_nchw4"]

#: bytes of source worth one thread
_MIN_BYTES = 1 << 16


def _max_3s2p1_py(x, y, h_, w_, oh_, ow_, lo, hi):  # pragma: no cover - compiled
    """Blocks [lo, hi) of the int8 ``y`` (blocks of ``OH x OW`` words) pooled from ``x``
    (blocks of ``H x W`` words; flat per block: 2-d arrays)."""
    n = w_ * 4
    tmp = np.empty(2 * n + 8, np.int8)
    cm, hm = tmp[: n + 8], tmp[n + 8 :]
    hw = hm.view(np.uint32)
    for j in range(4):  # the padding positions before and after the row
        cm[j] = -128
        cm[n + 4 + j] = -128
    four, eight = np.uintp(4), np.uintp(8)
    for p in range(lo, hi):
        xp, yw = x[p], y[p].view(np.uint32)
        for i in range(oh_):
            c = 2 * i  # source rows c - 1 .. c + 1, a padding row replaced by row c
            ra = np.uintp((c - 1 if c > 0 else c) * n)
            rc = np.uintp(c * n)
            rb = np.uintp((c + 1 if c + 1 < h_ else c) * n)
            for j in range(np.uintp(n)):
                cm[four + j] = max(max(xp[ra + j], xp[rc + j]), xp[rb + j])
            for j in range(np.uintp(n)):
                hm[j] = max(max(cm[j], cm[j + four]), cm[j + eight])
            d = np.uintp(i * ow_)
            for q in range(np.uintp(ow_)):
                yw[d + q] = hw[np.uintp(2) * q]


def _avg_global_py(x, y, q, lo, hi):  # pragma: no cover - compiled
    """Blocks [lo, hi) of the 8-bit global average (``x`` (B, H W 4) a block's positions,
    ``y`` (B, 4)): each channel's int32 sum (wrapping) quantized as
    :func:`.loops._fwd_avg_global_q8` quantizes a plane's (``q``: the area, qmin, qmax)."""
    area = x.shape[1] // 4
    for b in range(lo, hi):
        xb = x[b]
        t0 = t1 = t2 = t3 = np.int64(0)
        for p in range(np.uintp(area)):
            o = np.uintp(4) * p
            t0 += np.int64(xb[o])
            t1 += np.int64(xb[o + np.uintp(1)])
            t2 += np.int64(xb[o + np.uintp(2)])
            t3 += np.int64(xb[o + np.uintp(3)])
        for k, t in enumerate((t0, t1, t2, t3)):
            y[b, k] = _quantize(np.float32(np.int32(t)), q[0], np.float32(0), q[1], q[2])


@functools.cache
def _compiled(name: str = "max"):
    fn = _max_3s2p1_py if name == "max" else _avg_global_py
    return njit(nogil=True, cache=True, error_model="numpy")(fn)


def bind_pooling_nchw4(src: np.ndarray, out: np.ndarray, mode: str, window, stride,
                       pad) -> Step:  # fmt: skip
    """Bind the pooling of the NCHW4 ``src`` into the NCHW4 ``out``, the arguments as for
    :func:`.binds.bind_pooling` (whose values it computes).

    Parameters
    ----------
    src, out : numpy.ndarray
        ``(N, C/4, H, W, 4)`` and ``(N, C/4, OH, OW, 4)``, one dtype.
    mode : str
        MAX, AVERAGE or AVERAGE_COUNT_EXCLUDE_PADDING.
    window, stride, pad : sequence of int
        Per spatial dim.

    Returns
    -------
    Step
    """
    n, c4, h, w, _ = src.shape
    oh, ow = out.shape[2:4]
    stem = (mode == "MAX" and tuple(window) == (3, 3) and tuple(stride) == (2, 2)
            and tuple(pad) == (1, 1) and np.dtype(src.dtype.str) == np.int8
            and src.flags.c_contiguous and out.flags.c_contiguous)  # fmt: skip
    if stem:
        x = src.view(np.int8).reshape(n * c4, h * w * 4)
        y = out.view(np.int8).reshape(n * c4, oh * ow * 4)
        part = functools.partial(_compiled(), x, y, h, w, oh, ow)
        return parallel.split(part, n * c4, max(1, _MIN_BYTES // (h * w * 4)))
    if (mode in ("AVERAGE", "AVERAGE_COUNT_EXCLUDE_PADDING") and (oh, ow) == (1, 1)
            and tuple(window) == (h, w) and not any(pad) and src.dtype.itemsize == 1
            and quant_params(src.dtype) is not None and src.flags.c_contiguous
            and out.flags.c_contiguous):  # fmt: skip
        qp = quant_params(src.dtype)
        q = np.array([h * w, qp.qmin, qp.qmax], np.float32)
        x = src.view(np.dtype(src.dtype.str)).reshape(n * c4, h * w * 4)
        y = out.view(np.dtype(out.dtype.str)).reshape(n * c4, 4)
        part = functools.partial(_compiled("avg"), x, y, q)
        return parallel.split(part, n * c4, max(1, _MIN_BYTES // (h * w * 4)))
    x, to = conv_nchw4.to_nchw(src)
    y, _ = conv_nchw4.to_nchw(out)
    pool = binds.bind_pooling(x, y, mode, window, stride, pad)
    return chain([to, pool, conv_nchw4.from_nchw(y, out)])
