"""Compiled (Numba) loops of :mod:`megbrain.kernels.conv.tapwise`: the relayouts around its
products, each a range of its outer items so that a caller splits it over the kernel threads
(:func:`megbrain.kernels.parallel.split`; disjoint ranges write disjoint memory).

- :func:`result_rows`: the ``(OH, OW, N, OC)`` result into the ``(N, OC, OH, OW)`` output,
  samples ``[n0, n1)``, in blocks of 16 channels (a line of the result each), for an
  output that is not C-ordered (a C-ordered one takes :mod:`..sgemm_loops`' transposes).

Indices are unsigned (``np.uintp``): a signed, computed index makes Numba test it for
wrap-around. No loop allocates; all release the GIL.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["result_rows"]


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


