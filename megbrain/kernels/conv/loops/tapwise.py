"""Compiled (Numba) loops of :mod:`megbrain.kernels.conv.tapwise`: the relayouts around its
products, each a range of its outer items so that a caller splits it over the kernel threads
(:func:`megbrain.kernels.parallel.split`; disjoint ranges write disjoint memory).

- :func:`source_rows`: ``x (N, C, H, W)`` into the interior of the zero-framed ``(Hp, Wp, N,
  C)`` buffer, source rows ``[h0, h1)``;
- :func:`result_rows`: the ``(OH, OW, N, OC)`` result into the ``(N, OC, OH, OW)`` output,
  samples ``[n0, n1)``, in blocks of 16 channels (a line of the result each);
- :func:`transpose_blocks`: a batch of planes transposed (the filter gradient's relayouts),
  a range of planes and of their rows.

Indices are unsigned (``np.uintp``): a signed, computed index makes Numba test it for
wrap-around. No loop allocates; all release the GIL.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["result_rows", "source_rows", "transpose_blocks"]


@njit(nogil=True, cache=True, error_model="numpy")
def source_rows(x, xr, ph, pw, h0, h1):  # pragma: no cover - compiled
    """``xr[ph + h, pw + w, n, c] = x[n, c, h, w]`` for source rows ``h`` in ``[h0, h1)``."""
    n_, c_, _, w_ = x.shape
    for h in range(h0, h1):
        for n in range(n_):
            for w in range(w_):
                for c in range(c_):
                    xr[np.uintp(ph + h), np.uintp(pw + w), np.uintp(n), np.uintp(c)] = x[
                        np.uintp(n), np.uintp(c), np.uintp(h), np.uintp(w)]


@njit(nogil=True, cache=True, error_model="numpy")
def result_rows(res, out, n0, n1):  # pragma: no cover - compiled
    """``out[n, oc, i, j] = res[i, j, n, oc]`` for samples ``n`` in ``[n0, n1)``."""
    oh_, ow_, _, oc_ = res.shape
    for n in range(n0, n1):
        for o0 in range(0, oc_, 16):
            o1 = min(oc_, o0 + 16)
            for i in range(oh_):
                for j in range(ow_):
                    for oc in range(o0, o1):
                        out[np.uintp(n), np.uintp(oc), np.uintp(i), np.uintp(j)] = res[
                            np.uintp(i), np.uintp(j), np.uintp(n), np.uintp(oc)]



@njit(nogil=True, cache=True, error_model="numpy")
def transpose_blocks(src, dst, b0, b1, m0, m1):  # pragma: no cover - compiled
    """``dst[b, k, m] = src[b, m, k]`` for ``b`` in ``[b0, b1)`` and ``m`` in ``[m0, m1)``, in
    blocks of 16 by 16 (a block's lines of both stay in the L1 cache: the filter gradient's
    relayouts are transposes of planes)."""
    _, _, k_ = src.shape
    for b in range(b0, b1):
        for i0 in range(m0, m1, 16):
            i1 = min(m1, i0 + 16)
            for j0 in range(0, k_, 16):
                j1 = min(k_, j0 + 16)
                for j in range(j0, j1):
                    for i in range(i0, i1):
                        dst[np.uintp(b), np.uintp(j), np.uintp(i)] = src[
                            np.uintp(b), np.uintp(i), np.uintp(j)]
