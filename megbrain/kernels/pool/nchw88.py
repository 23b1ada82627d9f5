"""2-d pooling in the channel-blocked NCHW88 layout: source ``(N, C/8, H, W, 8)``, output
``(N, C/8, OH, OW, 8)``, float32, any window, stride and padding, the three modes of
:func:`.binds.bind_pooling`.

The averages: the 8 channels of a position are one vector, each output its window's taps
folded into an 8-lane accumulator held in registers (:func:`.tiled_jit.stack_tile`, LLVM's
SLP vectorizer on), one vector load and one ``add`` per tap; a 3x3 or 2x2 window inside
the image has its taps unrolled (the loops' control cost a third of the time of a 3x3
pooling). The taps are visited in the order of the NCHW loops (:mod:`.loops`: window row
by window row, from zero) and the averages finished the same way (times ``1 / window
area`` in float32, or divided by the in-image tap count in float64), so the values equal
the NCHW pooling's. MAX with windows that overlap along the width (GoogLeNet's 3x3/s1 branch
poolings, the 3x3/s2 ceil-mode ones of GoogLeNet and SqueezeNet) is separable
(:func:`_max88_py`: the maximum over the window's rows per source column in one pass 16
lanes wide, then over its columns; 2-2.6 times the tap loop's speed at stride 1, 2.5-3
at 3x3/s2), each maximum one ``max`` instruction and a NaN test (:func:`_nanmax`); the
order of the taps does not change a maximum (NaN propagates either way), so its values
equal the NCHW pooling's too. The
``N * C/8 * OH`` output rows are split over threads (planes alone left a 3-plane tensor
unbalanced on 2 threads); each output is computed alone, so the values do not depend on
the split.
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
stack_tile = carray = zmm_vectors = None


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


def _nanmax(a, b):  # pragma: no cover - compiled
    """``np.maximum(a, b)`` (NaN from either side) as one ``max`` instruction and a test of
    ``a``: x86's ``max(a, b)`` is ``a > b ? a : b``, so only a NaN ``a`` needs the select."""
    m = a if a > b else b
    return m if a == a else a


#: source columns (of 8 channels) of the max pooling's two stack buffers: an output row is
#: made in chunks of as many windows as they hold (8 KiB each, inside L1)
_MAX_COLS = 256
_MAX_BUF = _MAX_COLS * _CB


def _max88_py(x, y, geo, lo, hi):  # pragma: no cover - compiled
    """MAX pooling of output rows ``[lo, hi)`` (as :func:`_pool88_py`), separable: a chunk
    of the row's windows first takes the maximum over the window's in-image rows of each
    source column (contiguous passes over the rows, into a stack buffer whose columns
    outside the image are ``-inf``), then over each window's columns of that buffer. Every
    pass over the rows runs over columns and lanes alike, so LLVM's loop vectorizer makes it
    16 lanes wide (the 8-lane taps of :func:`_pool88_py` were 2-2.6 times slower at stride
    1); at stride 1 so does the pass over columns, at a larger stride each output takes its
    window's columns of the buffer, 8 lanes at a time.

    ``x`` and ``y`` are the flat C-contiguous source and output; ``geo`` the window,
    stride and padding (height then width each) and the source and output sizes ``H, W,
    OH, OW``; the window is at most ``_MAX_COLS`` columns wide."""
    zmm_vectors()  # noqa: F821 - bound by _compiled_max
    wh, ww, sh, sw, ph, pw = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5]
    h_, w_, oh_, ow_ = geo[6], geo[7], geo[8], geo[9]
    # the windows' rows, then their columns, per source column; bound by _compiled
    buf = carray(stack_tile(_MAX_BUF, np.float32), _MAX_BUF)  # noqa: F821
    hb = carray(stack_tile(_MAX_BUF, np.float32), _MAX_BUF)  # noqa: F821
    chunk = (_MAX_COLS - ww) // sw + 1
    row = w_ * _CB
    ninf = np.float32(-np.inf)
    for k in range(lo, hi):
        p = k // oh_
        i = k - p * oh_
        h0, a0, a1 = _window(i, sh, ph, h_, wh)
        top = (p * h_ + h0 + a0) * row
        out = k * ow_ * _CB
        for j0 in range(0, ow_, chunk):
            j1 = min(ow_, j0 + chunk)
            c0 = j0 * sw - pw  # the buffer's first source column
            ncols = (j1 - 1 - j0) * sw + ww
            qa = min(ncols, max(0, -c0))  # the buffer's columns inside the image: [qa, qb)
            qb = max(qa, min(ncols, w_ - c0))
            for q in range(qa):
                for c in range(_CB):
                    buf[np.uintp(q * _CB + c)] = ninf
            for q in range(qb, ncols):
                for c in range(_CB):
                    buf[np.uintp(q * _CB + c)] = ninf
            src = top + (c0 + qa) * _CB
            b0 = qa * _CB
            n = (qb - qa) * _CB
            r1, r2 = src + row, src + 2 * row
            if a1 - a0 == 3:  # the window's rows in one pass: no stores in between
                for e in range(n):
                    buf[np.uintp(b0 + e)] = _nanmax(
                        _nanmax(x[np.uintp(src + e)], x[np.uintp(r1 + e)]), x[np.uintp(r2 + e)]
                    )
            elif a1 - a0 == 2:
                for e in range(n):
                    buf[np.uintp(b0 + e)] = _nanmax(x[np.uintp(src + e)], x[np.uintp(r1 + e)])
            else:
                for e in range(n):
                    buf[np.uintp(b0 + e)] = x[np.uintp(src + e)]
                for a in range(1, a1 - a0):
                    r = src + a * row
                    for e in range(n):
                        v = x[np.uintp(r + e)]
                        buf[np.uintp(b0 + e)] = _nanmax(buf[np.uintp(b0 + e)], v)
            dst = out + j0 * _CB
            if sw == 1 and ww == 3:  # the branch poolings: one pass over columns and lanes
                for e in range((j1 - j0) * _CB):
                    m = _nanmax(buf[np.uintp(e)], buf[np.uintp(e + _CB)])
                    y[np.uintp(dst + e)] = _nanmax(m, buf[np.uintp(e + 2 * _CB)])
                continue
            if sw > 1:  # each output's columns alone, into a vector of the stack: 2.3-2.8
                # times as fast on the 3x3/s2 poolings as each output's maximum stored
                # straight from three loads of the buffer
                for j in range(j1 - j0):
                    s0 = j * sw * _CB
                    for c in range(_CB):
                        hb[np.uintp(c)] = buf[np.uintp(s0 + c)]
                    for tap in range(1, ww):
                        for c in range(_CB):
                            v = buf[np.uintp(s0 + tap * _CB + c)]
                            hb[np.uintp(c)] = _nanmax(hb[np.uintp(c)], v)
                    for c in range(_CB):
                        y[np.uintp(dst + j * _CB + c)] = hb[np.uintp(c)]
                continue
            # the window's columns at every buffer column (contiguous, vectorized)
            nh = (j1 - j0) * _CB
            for e in range(nh):
                hb[np.uintp(e)] = buf[np.uintp(e)]
            for tap in range(1, ww):
                for e in range(nh):
                    v = buf[np.uintp(e + tap * _CB)]
                    hb[np.uintp(e)] = _nanmax(hb[np.uintp(e)], v)
            for e in range(nh):
                y[np.uintp(dst + e)] = hb[np.uintp(e)]


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


@functools.cache
def _compiled_max():
    """:func:`_max88_py` compiled for float32 (a read-only flat source)."""
    global zmm_vectors, _nanmax
    _compiled()  # binds the intrinsics and compiles ``_window``
    zmm_vectors = tiled_jit.zmm_vectors()
    _nanmax = tiled_jit.compile_tiled(_nanmax, [t.float32(t.float32, t.float32)], inline="always")
    flat = t.Array(t.float32, 1, "C")
    geo = t.Array(t.int64, 1, "C", readonly=True)
    return tiled_jit.compile_tiled(
        _max88_py, [t.void(flat.copy(readonly=True), flat, geo, t.int64, t.int64)]
    )


def pool_nchw88_shape(src: Sequence[int], window, stride, pad,
                      end=(0, 0)) -> tuple[int, ...]:  # fmt: skip
    """The ``(N, C/8, OH, OW, 8)`` output shape of pooling a ``(N, C/8, H, W, 8)`` source,
    padded by ``pad`` at both ends of H and W and by ``end`` more after them (ceil mode's
    end padding).

    Raises
    ------
    ValueError
        For a source that is not 5-d with a last dim of 8, a padding not smaller than the
        window, or a last window that starts in the end padding.
    """
    if len(src) != 5 or src[4] != _CB:
        raise ValueError(f"an NCHW88 source is (N, C/8, H, W, 8), got {tuple(src)}")
    if any(p >= w for p, w in zip(pad, window)):
        raise ValueError(f"padding {tuple(pad)} must be smaller than the window {tuple(window)}")
    out = tuple(pool_out_size(n + e, w, s, p)
                for n, w, s, p, e in zip(src[2:4], window, stride, pad, end))  # fmt: skip
    if any((o - 1) * s - p >= n for o, s, p, n in zip(out, stride, pad, src[2:4])):
        raise ValueError(f"end padding {tuple(end)}: a window of {tuple(src[2:4])} would lie "
                         "entirely in the padding")  # fmt: skip
    return (src[0], src[1], *out, _CB)


def bind_pooling_nchw88(src: np.ndarray, out: np.ndarray, mode: str, window, stride, pad,
                        end=(0, 0)) -> Step:  # fmt: skip
    """Bind a pooling of the NCHW88 ``src`` into ``out``.

    Parameters
    ----------
    src, out : numpy.ndarray
        ``(N, C/8, H, W, 8)`` and ``(N, C/8, OH, OW, 8)`` float32 (any strides).
    mode : {"MAX", "AVERAGE", "AVERAGE_COUNT_EXCLUDE_PADDING"}
        As for :func:`.binds.bind_pooling`.
    window, stride, pad : sequence of int
        Two values each; ``pad < window``.
    end : sequence of int
        The padding after ``pad`` at the end of H and W (ceil mode's; MAX only): the
        windows there take the taps inside the image, as at the other padding.

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
    if any(end) and mode != "MAX":  # an average's divisor would count the end padding
        raise ValueError(f"NCHW88 pooling takes an end padding for MAX only, not {mode}")
    want = pool_nchw88_shape(src.shape, window, stride, pad, end)
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
    if mode == "MAX" and stride[1] < window[1] <= _MAX_COLS:
        geo = np.array([*window, *stride, *pad, *src.shape[2:4], *out.shape[2:4]], np.int64)
        geo.flags.writeable = False
        fn = functools.partial(_compiled_max(), x4.reshape(-1), y4.reshape(-1), geo)
    else:
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
