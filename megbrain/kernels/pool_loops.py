"""Compiled (Numba) loops of 2-d max-pooling backward: one pass over each window instead of
one NumPy pass over the whole tensor per window offset.

Single-threaded and GIL-free (``nogil``), so that the comp nodes' worker threads may run
several at once; Numba's parallel threading layers are not safe to enter from several threads.
"""

from __future__ import annotations

import functools

import numpy as np

__all__ = ["max_pool2d_backward"]


def _max_pool2d_backward_py(x, y, d, g, wh, ww, sh, sw, ph, pw):  # pragma: no cover - compiled
    n_, c_, h_, w_ = x.shape
    oh_, ow_ = d.shape[2], d.shape[3]
    for n in range(n_):
        for c in range(c_):
            for i in range(h_):
                for j in range(w_):
                    g[n, c, i, j] = 0
            for oh in range(oh_):
                h0 = oh * sh - ph
                for ow in range(ow_):
                    w0 = ow * sw - pw
                    m = y[n, c, oh, ow]
                    dv = d[n, c, oh, ow]
                    for a in range(wh):
                        hh = h0 + a
                        if hh < 0 or hh >= h_:
                            continue
                        for b in range(ww):
                            wj = w0 + b
                            if 0 <= wj < w_ and x[n, c, hh, wj] == m:
                                g[n, c, hh, wj] += dv


def max_pool2d_backward(
    x: np.ndarray, y: np.ndarray, d: np.ndarray, g: np.ndarray, window, stride, pad
) -> None:
    """Write into ``g`` ``(N, C, H, W)`` the gradient of a 2-d max pooling of ``x`` whose
    output is ``y`` and output gradient ``d`` ``(N, C, OH, OW)``: each window's ``d`` goes to
    every element equal to the window's maximum (MegDNN's rule: ties share it). All four
    arrays have one float dtype."""
    _compiled()(x, y, d, g, *map(int, window), *map(int, stride), *map(int, pad))


@functools.cache
def _compiled():
    # numba is imported on first use: ``import megbrain`` stays free of its import time
    from numba import njit

    return njit(nogil=True, cache=True, error_model="numpy")(_max_pool2d_backward_py)
