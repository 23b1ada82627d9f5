"""2-d pooling in the channel-blocked NCHW88 layout: source ``(N, C/8, H, W, 8)``, output
``(N, C/8, OH, OW, 8)``, float32, any window, stride and padding, the three modes of
:func:`.binds.bind_pooling`.

The 8 channels of a position are one vector: each output is its window's taps folded into
an 8-lane accumulator held in registers (:func:`.tiled_jit.stack_tile`, LLVM's SLP
vectorizer on), one vector load and one ``maximum`` or ``add`` per tap; a 3x3 or 2x2 window
inside the image has its taps unrolled (the loops' control cost a third of the time of
a 3x3 max pooling). The taps are
visited in the order of the NCHW loops (:mod:`.loops`: window row by window row, from
``-inf`` or zero) and the averages finished the same way (times ``1 / window area`` in
float32, or divided by the in-image tap count in float64), so the values equal the NCHW
pooling's. The ``N * C/8 * OH`` output rows are split over threads (planes alone left
a 3-plane tensor unbalanced on 2 threads); each output is computed alone, so the values
do not depend on the split. The columns whose window lies inside the image's width run
without clamping the window's columns.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
from numba import carray as _carray
from numba import types as t

from .. import parallel, tiled_jit, workspace
from ..steps import Step, chain
from .binds import POOLING_MODES, SPLIT_MIN_ELEMS, pool_out_size

__all__ = ["bind_pooling_nchw88"]

_F32 = np.dtype(np.float32)
#: the channels of a block
_CB = 8
# the tiled_jit intrinsic and numba.carray, bound by _compiled before the loops compile
stack_tile = carray = None


def _window(i, stride, pad, size, window):  # pragma: no cover - compiled
    """The first source index of output ``i``'s window and its in-image taps ``[lo, hi)``."""
    start = i * stride - pad
    return start, max(0, -start), min(window, size - start)


def _tap(acc, x, p, h, w, kind):  # pragma: no cover - compiled
    """Fold source position ``(h, w)`` (inside the image) of plane ``p`` into ``acc``."""
    # unsigned indices: Numba tests a signed one for wrap-around
    row = x[np.uintp(p), np.uintp(h), np.uintp(w)]
    if kind == 0:
        for c in range(_CB):
            acc[c] = np.maximum(acc[c], row[c])
    else:
        for c in range(_CB):
            acc[c] += row[c]


def _taps(acc, x, p, h0, a0, a1, w0, b0, b1, kind):  # pragma: no cover - compiled
    """Fold the in-image taps ``[a0, a1) x [b0, b1)`` of the window at ``(h0, w0)`` into
    ``acc``, window row by window row; a whole 3x3 or 2x2 window unrolled."""
    if a1 - a0 == 3 and b1 - b0 == 3:
        for a in range(a0, a0 + 3):
            _tap(acc, x, p, h0 + a, w0 + b0, kind)
            _tap(acc, x, p, h0 + a, w0 + b0 + 1, kind)
            _tap(acc, x, p, h0 + a, w0 + b0 + 2, kind)
    elif a1 - a0 == 2 and b1 - b0 == 2:
        for a in range(a0, a0 + 2):
            _tap(acc, x, p, h0 + a, w0 + b0, kind)
            _tap(acc, x, p, h0 + a, w0 + b0 + 1, kind)
    else:
        for a in range(a0, a1):
            for b in range(b0, b1):
                _tap(acc, x, p, h0 + a, w0 + b, kind)


def _store(acc, y, p, i, j, kind, inv, taps):  # pragma: no cover - compiled
    """Write output ``(i, j)`` of plane ``p`` from its folded window ``acc``."""
    out = y[np.uintp(p), np.uintp(i), np.uintp(j)]
    if kind == 2:  # ``taps`` an int: the division is float64's
        for c in range(_CB):
            out[c] = acc[c] / taps
    elif kind == 1:
        for c in range(_CB):
            out[c] = acc[c] * inv
    else:
        for c in range(_CB):
            out[c] = acc[c]


def _pool88_py(x, y, geo, kind, inv, lo, hi):  # pragma: no cover - compiled
    """Output rows ``[lo, hi)`` of the planes' rows laid end to end (row ``k`` is row
    ``k % OH`` of plane ``k // OH``); ``kind`` 0: MAX, 1: AVERAGE (times ``inv``), 2:
    AVERAGE_COUNT_EXCLUDE_PADDING (LLVM moves the tests on ``kind`` out of the loops).

    The columns ``[jlo, jhi)`` have their whole window inside the image's width: there the
    window's columns are not clamped, only the rows of the top and bottom output rows."""
    wh, ww, sh, sw, ph, pw = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5]
    h_, w_, oh_, ow_ = x.shape[1], x.shape[2], y.shape[1], y.shape[2]
    acc = carray(stack_tile(_CB, np.float32), _CB)  # noqa: F821 - bound by _compiled
    start = -np.inf if kind == 0 else 0.0
    jlo = min(ow_, (pw + sw - 1) // sw)
    jhi = max(jlo, min(ow_, (w_ - ww + pw) // sw + 1))
    for k in range(lo, hi):
        p = k // oh_
        i = k - p * oh_
        h0, a0, a1 = _window(i, sh, ph, h_, wh)
        for j in range(jlo):
            w0, b0, b1 = _window(j, sw, pw, w_, ww)
            for c in range(_CB):
                acc[c] = start
            _taps(acc, x, p, h0, a0, a1, w0, b0, b1, kind)
            _store(acc, y, p, i, j, kind, inv, (a1 - a0) * (b1 - b0))
        for j in range(jlo, jhi):
            for c in range(_CB):
                acc[c] = start
            _taps(acc, x, p, h0, a0, a1, j * sw - pw, 0, ww, kind)
            _store(acc, y, p, i, j, kind, inv, (a1 - a0) * ww)
        for j in range(jhi, ow_):
            w0, b0, b1 = _window(j, sw, pw, w_, ww)
            for c in range(_CB):
                acc[c] = start
            _taps(acc, x, p, h0, a0, a1, w0, b0, b1, kind)
            _store(acc, y, p, i, j, kind, inv, (a1 - a0) * (b1 - b0))


@functools.cache
def _compiled():
    """The loop compiled for float32 (a read-only source)."""
    global stack_tile, carray, _window, _tap, _taps, _store
    stack_tile, carray = tiled_jit.stack_tile(), _carray
    _window = tiled_jit.compile_tiled(_window, [t.UniTuple(t.int64, 3)(*[t.int64] * 5)],
                                      inline="always")  # fmt: skip
    src = t.Array(t.float32, 4, "C", readonly=True)
    _tap = tiled_jit.compile_tiled(_tap, [t.void(t.Array(t.float32, 1, "C"), src, *[t.int64] * 4)],
                                   inline="always")  # fmt: skip
    acc = t.Array(t.float32, 1, "C")
    _taps = tiled_jit.compile_tiled(_taps, [t.void(acc, src, *[t.int64] * 8)], inline="always")
    dst = t.Array(t.float32, 4, "C")
    _store = tiled_jit.compile_tiled(_store, [t.void(acc, dst, *[t.int64] * 4, t.float32,
                                                     t.int64)], inline="always")  # fmt: skip
    geo, i8 = t.Array(t.int64, 1, "C", readonly=True), t.int64
    return tiled_jit.compile_tiled(_pool88_py, [t.void(src, dst, geo, i8, t.float32, i8, i8)])


def pool_nchw88_shape(src: Sequence[int], window, stride, pad) -> tuple[int, ...]:
    """The ``(N, C/8, OH, OW, 8)`` output shape of pooling a ``(N, C/8, H, W, 8)`` source.

    Raises
    ------
    ValueError
        For a source that is not 5-d with a last dim of 8, or a padding not smaller than
        the window.
    """
    if len(src) != 5 or src[4] != _CB:
        raise ValueError(f"an NCHW88 source is (N, C/8, H, W, 8), got {tuple(src)}")
    if any(p >= w for p, w in zip(pad, window)):
        raise ValueError(f"padding {tuple(pad)} must be smaller than the window {tuple(window)}")
    out = tuple(pool_out_size(*a) for a in zip(src[2:4], window, stride, pad))
    return (src[0], src[1], *out, _CB)


def bind_pooling_nchw88(src: np.ndarray, out: np.ndarray, mode: str, window, stride,
                        pad) -> Step:  # fmt: skip
    """Bind a pooling of the NCHW88 ``src`` into ``out``.

    Parameters
    ----------
    src, out : numpy.ndarray
        ``(N, C/8, H, W, 8)`` and ``(N, C/8, OH, OW, 8)`` float32 (any strides).
    mode : {"MAX", "AVERAGE", "AVERAGE_COUNT_EXCLUDE_PADDING"}
        As for :func:`.binds.bind_pooling`.
    window, stride, pad : sequence of int
        Two values each; ``pad < window``.

    Returns
    -------
    Step
        A zero-argument callable computing ``out``.

    Raises
    ------
    ValueError
        For an unknown mode, a dtype other than float32, or shapes the geometry does not
        give.
    """
    if mode not in POOLING_MODES:
        raise ValueError(f"Pooling: unknown mode {mode!r}")
    if src.dtype != _F32 or out.dtype != _F32:
        raise ValueError(f"NCHW88 pooling takes float32, got {src.dtype} -> {out.dtype}")
    want = pool_nchw88_shape(src.shape, window, stride, pad)
    if tuple(out.shape) != want:
        raise ValueError(f"Pooling: src {src.shape} (window={tuple(window)}, "
                         f"stride={tuple(stride)}, pad={tuple(pad)}) gives {want}, "
                         f"not {out.shape}")  # fmt: skip
    steps: list[Step] = []
    x = src
    if not x.flags.c_contiguous:
        x = workspace.empty(src.shape, _F32)
        steps.append(functools.partial(np.copyto, x, src))
    y = out
    if not out.flags.c_contiguous or not out.flags.writeable:
        y = workspace.empty(out.shape, _F32)
    planes = src.shape[0] * src.shape[1]
    if planes == 0 or 0 in out.shape:
        return chain(steps)
    x4 = x.reshape(planes, *src.shape[2:])
    x4.flags.writeable = False
    y4 = y.reshape(planes, *out.shape[2:])
    geo = np.array([*window, *stride, *pad], np.int64)
    geo.flags.writeable = False
    inv = np.float32(1.0 / math.prod(window))
    fn = functools.partial(_compiled(), x4, y4, geo, POOLING_MODES.index(mode), inv)
    rows = planes * out.shape[2]
    if SPLIT_MIN_ELEMS is None:
        steps.append(functools.partial(fn, 0, rows))
    else:
        # counted in window taps, not source elements: a 3x3 window costs each source
        # element 2-9 taps (0.6 ns an element at stride 2, six times the NCHW 2x2 loops')
        taps = max(1, math.prod(out.shape[3:]) * math.prod(window))
        steps.append(parallel.split(fn, rows, -(-SPLIT_MIN_ELEMS // taps)))
    if y is not out:
        steps.append(functools.partial(np.copyto, out, y))
    return chain(steps)
