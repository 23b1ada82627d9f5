"""ShuffleNet's channel shuffle of two channel-blocked (NCHW88) tensors: their concatenation
along the channels with output channel ``2 j + i`` input ``i``'s channel ``j``, written in
the blocked layout ``(N, C/8, H, W, 8)``.

Output block ``q`` holds the four channels ``4 q .. 4 q + 3`` of both inputs, lanes
alternating between them: half of input block ``q // 2`` (lanes ``4 (q % 2) ..``) each. One
pass, no NCHW copy of either input or of the output in between."""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
from numba import njit

__all__ = ["bind_shuffle_nchw88"]


@njit(nogil=True, cache=True)
def _shuffle2_nchw88(a, b, out):  # pragma: no cover - compiled
    n, cb, h, w, _ = a.shape
    for s in range(n):
        for blk in range(cb):
            for r in range(2):
                q = 2 * blk + r
                for y in range(h):
                    for x in range(w):
                        for m in range(4):
                            out[s, q, y, x, 2 * m] = a[s, blk, y, x, 4 * r + m]
                            out[s, q, y, x, 2 * m + 1] = b[s, blk, y, x, 4 * r + m]


def bind_shuffle_nchw88(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> Callable[[], None]:
    """The step writing the shuffled concatenation of ``a`` and ``b`` (one NCHW88 shape
    ``(N, C/8, H, W, 8)``, float32) into ``out`` (``(N, 2 C/8, H, W, 8)``)."""
    return functools.partial(_shuffle2_nchw88, a, b, out)
