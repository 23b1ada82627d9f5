"""Layer normalization over the last axis as one kernel: ``(x - mean) / sqrt(var + eps) *
scale + bias`` per row, the statistics of a row in one pass (float64 sums of ``x`` and
``x^2``) and the normalized row written in a second, instead of a chain of reductions and
elementwise passes over the whole tensor.

A row whose channels are contiguous (channels-last memory) is read as it is; a row whose
*positions* are contiguous (a channels-last view of NCHW memory, as a ``Transpose`` before
ONNX's LayerNormalization leaves it) is read a band of rows at a time along the positions,
the band's statistics in per-thread scratch; an NCHW88 tensor (N, C/8, H, W, 8) is read in
place too (:func:`bind_layer_norm_nchw88`: a band of positions, whole blocks of 8 channels
at a time, written channels-last); any other layout is copied first. Rows are
split over the kernel threads from a size on; a row's sums run in one fixed order (over the
channels in order; for NCHW88 per lane over the blocks, then over the lanes), so results do
not depend on the thread count.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit
from numba import types as t

from . import parallel, workspace
from .conv.loops.nchw8c import readonly_view
from .steps import Step, chain

__all__ = ["bind_layer_norm", "bind_layer_norm_nchw88"]

_F32 = np.dtype(np.float32)
#: rows of a band the positions-contiguous kernel normalizes at once
BAND = 64
#: elements a thread's part holds at least: the kernel is compute bound (float64 sums, 1-1.4
#: ns an element on one thread), so it splits from the JIT's bar for its compute-bound
#: kernels (``jit_codegen.PARALLEL_MIN_SIZE_TRANSCENDENTAL``), each part half of it; below
#: it a fork and join costs about what the part saves
_MIN_PART = 1 << 17


def _rows_py(x, sr, c, scale, bias, out, eps, lo, hi):  # pragma: no cover - compiled
    # spans sliced and indexed from 0 by the loop variable: no wraparound test, vector code
    inv_c = 1.0 / c
    for r in range(lo, hi):
        xs = x[r * sr : r * sr + c]
        s1 = 0.0
        s2 = 0.0
        for k in range(c):
            v = np.float64(xs[k])
            s1 += v
            s2 += v * v
        mean = s1 * inv_c
        var = max(s2 * inv_c - mean * mean, 0.0)
        inv = np.float32(1.0 / np.sqrt(var + eps))
        m32 = np.float32(mean)
        os = out[r * c : r * c + c]
        for k in range(c):
            os[k] = (xs[k] - m32) * inv * scale[k] + bias[k]


@njit(nogil=True, cache=True, error_model="numpy")
def _band_statistics(s1, s2, nb, inv_c, eps):  # pragma: no cover - compiled
    # a band's sums of x and x^2 -> its means and 1 / sqrt(var + eps), in place
    for j in range(nb):
        mean = s1[j] * inv_c
        var = max(s2[j] * inv_c - mean * mean, 0.0)
        s1[j] = mean
        s2[j] = 1.0 / np.sqrt(var + eps)


def _columns_py(x, sc, c, scale, bias, out, eps, lo, hi, stats):  # pragma: no cover
    # x[r + k sc]: a band's rows along the vectors; stats: 2 BAND float64 of this thread's
    inv_c = 1.0 / c
    s1 = stats[:BAND]
    s2 = stats[BAND:]
    for r0 in range(lo, hi, BAND):
        nb = min(BAND, hi - r0)
        for j in range(nb):
            s1[j] = 0.0
            s2[j] = 0.0
        for k in range(c):
            xs = x[r0 + k * sc : r0 + k * sc + nb]
            for j in range(nb):
                v = np.float64(xs[j])
                s1[j] += v
                s2[j] += v * v
        _band_statistics(s1, s2, nb, inv_c, eps)
        for j in range(nb):
            m32 = np.float32(s1[j])
            inv = np.float32(s2[j])
            xs = x[r0 + j :]
            os = out[(r0 + j) * c : (r0 + j) * c + c]
            for k in range(c):
                os[k] = (xs[k * sc] - m32) * inv * scale[k] + bias[k]


def _blocks_py(x, hw, c, scale, bias, out, eps, lo, hi, stats):  # pragma: no cover
    # x: (N, C/8, HW, 8) flat, row r = (image r // hw, position r % hw); a band stays in one
    # image. stats: 2 BAND 8 float64 of this thread's, per row and lane the sums over the
    # channel blocks in order (whole vectors), then the 8 lanes' in order: a fixed order
    inv_c = 1.0 / c
    a1 = stats[: BAND * 8]
    a2 = stats[BAND * 8 :]
    r0 = lo
    while r0 < hi:
        img = r0 // hw
        p0 = r0 - img * hw
        nb = min(BAND, hi - r0, hw - p0)
        base = img * c * hw + p0 * 8
        span = nb * 8
        for i in range(span):
            a1[i] = 0.0
            a2[i] = 0.0
        for g in range(c // 8):
            xs = x[base + g * hw * 8 : base + g * hw * 8 + span]
            for i in range(span):
                v = np.float64(xs[i])
                a1[i] += v
                a2[i] += v * v
        for j in range(nb):  # the lanes' sums into the row's, kept in the first nb slots
            t1 = 0.0
            t2 = 0.0
            for lane in range(8):
                t1 += a1[j * 8 + lane]
                t2 += a2[j * 8 + lane]
            a1[j] = t1
            a2[j] = t2
        _band_statistics(a1, a2, nb, inv_c, eps)
        for j in range(nb):
            m32, inv = np.float32(a1[j]), np.float32(a2[j])
            os = out[(r0 + j) * c : (r0 + j) * c + c]
            for g in range(c // 8):
                xs = x[base + g * hw * 8 + j * 8 : base + g * hw * 8 + j * 8 + 8]
                sg = scale[g * 8 : g * 8 + 8]
                bg = bias[g * 8 : g * 8 + 8]
                og = os[g * 8 : g * 8 + 8]
                for lane in range(8):
                    og[lane] = (xs[lane] - m32) * inv * sg[lane] + bg[lane]
        r0 += nb


@functools.cache
def _compiled(kind: str):
    """The compiled kernel ``kind`` ("rows", "columns" or "blocks"), compiled now (by
    binding code)."""
    ro = t.Array(t.float32, 1, "C", readonly=True)
    args = [ro, t.int64, t.int64, ro, ro, t.float32[::1], t.float64, t.int64, t.int64]
    if kind == "rows":
        return njit([t.void(*args)], nogil=True, cache=True, error_model="numpy")(_rows_py)
    fn = _columns_py if kind == "columns" else _blocks_py
    return njit([t.void(*args, t.float64[::1])], nogil=True, cache=True,
                error_model="numpy")(fn)  # fmt: skip


def _as_rows(x: np.ndarray) -> tuple[int, int] | None:
    """``(row stride, channel stride)`` in elements when the leading axes of ``x`` merge
    into one axis of rows (non-negative strides); None otherwise."""
    if any(s < 0 or s % x.itemsize for s in x.strides):
        return None
    st = [s // x.itemsize for s in x.strides]
    lead = [(d, s) for d, s in zip(x.shape[:-1], st[:-1]) if d != 1]
    row = lead[-1][1] if lead else x.shape[-1] * max(st[-1], 1)
    for (_, s0), (d1, s1) in zip(lead, lead[1:]):
        if s0 != d1 * s1:
            return None
    return row, st[-1]


def _checked(x, scale, bias, out, want: tuple, c: int) -> tuple[list, np.ndarray, np.ndarray]:
    """``(steps, scale, bias)``: the operands checked (``out`` of shape ``want``, the vectors
    of ``c`` values), the steps copying a vector that is not contiguous at every run first,
    zeros for a missing bias."""
    vec = (c,)
    if (
        x.ndim < 1 or x.dtype != _F32 or out.dtype != _F32 or out.shape != want
        or scale.shape != vec or scale.dtype != _F32
        or (bias is not None and (bias.shape != vec or bias.dtype != _F32))
        or not out.flags.c_contiguous
    ):  # fmt: skip
        raise ValueError(
            f"layer norm: x {x.shape} {x.dtype} into out {out.shape} {out.dtype} (C-contiguous)"
            f" with scale {scale.shape} {scale.dtype} and bias "
            f"{None if bias is None else (bias.shape, bias.dtype)}: expected float32, the "
            f"scale and bias of shape ({c},), out of shape {want}"
        )
    if np.shares_memory(x, out):
        raise ValueError("layer norm: out overlaps x")
    steps: list[Step] = []
    if bias is None:
        bias = np.zeros(vec, _F32)  # bound once: read-only
    vecs = []
    for v in (scale, bias):
        if not v.flags.c_contiguous:  # read at every run: copied at every run
            dense = workspace.empty(vec, _F32)
            steps.append(functools.partial(np.copyto, dense, v))
            v = dense
        vecs.append(v)
    return steps, vecs[0], vecs[1]


def bind_layer_norm(x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None, out: np.ndarray,
                    eps: float) -> Step:  # fmt: skip
    """Bind ``out = (x - mean) / sqrt(var + eps) * scale + bias``, the statistics over the
    last axis.

    Parameters
    ----------
    x : numpy.ndarray
        float32, at least 1-d, any strides.
    scale, bias : numpy.ndarray
        The last axis' float32 vectors (read at every run); ``bias`` None for none.
    out : numpy.ndarray
        float32 of ``x``'s shape, C-contiguous, not overlapping ``x``.
    eps : float
        Added to the variance.

    Returns
    -------
    Step
        The callable computing ``out`` (allocating nothing).

    Raises
    ------
    ValueError
        For operands of other dtypes, shapes or layouts.
    """
    c = x.shape[-1] if x.ndim else 0
    steps, scale, bias = _checked(x, scale, bias, out, x.shape, c)
    rows = x.size // c if c else 0
    if rows == 0:
        return chain([])
    lay = _as_rows(x)
    if lay is None or lay[1] != 1 and lay[0] != 1:
        dense = workspace.empty(x.shape, _F32)
        steps.append(functools.partial(np.copyto, dense, x))
        x, lay = dense, (c, 1)
    sr, sc = lay
    # the flat view from x's first element to its last
    size = (rows - 1) * sr + (c - 1) * sc + 1
    xf = np.lib.stride_tricks.as_strided(x, (size,), (x.itemsize,), writeable=False)
    outf, scale, bias = out.reshape(-1), readonly_view(scale), readonly_view(bias)
    parts = parallel.ranges(rows, parallel.num_threads(), -(-_MIN_PART // c))
    if sc == 1 or c == 1:
        run = _compiled("rows")
        calls = [functools.partial(run, xf, sr, c, scale, bias, outf, float(eps), lo, hi)
                 for lo, hi in parts]  # fmt: skip
    else:
        run = _compiled("columns")
        stats = workspace.empty((len(parts), 2 * BAND), np.float64)
        calls = [functools.partial(run, xf, sc, c, scale, bias, outf, float(eps), lo, hi, s)
                 for (lo, hi), s in zip(parts, stats)]  # fmt: skip
    steps.append(parallel.concurrently(calls))
    return chain(steps)


def bind_layer_norm_nchw88(x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None,
                           out: np.ndarray, eps: float) -> Step:  # fmt: skip
    """Bind :func:`bind_layer_norm` of the channels-last view of the NCHW88 tensor ``x``:
    ``out[n, h, w, c]`` normalizes ``x[n, c // 8, h, w, c % 8]`` over the channels.

    Parameters
    ----------
    x : numpy.ndarray
        float32 (N, C/8, H, W, 8), any strides (copied first unless C-contiguous).
    scale, bias, eps
        As for :func:`bind_layer_norm`, of the C channels.
    out : numpy.ndarray
        float32 (N, H, W, C), C-contiguous, not overlapping ``x``.

    Returns
    -------
    Step
        The callable computing ``out`` (allocating nothing); ValueError for operands of
        other dtypes, shapes or layouts.
    """
    if x.ndim != 5 or x.shape[-1] != 8:
        raise ValueError(f"layer norm: x {x.shape} is not an NCHW88 tensor (N, C/8, H, W, 8)")
    n, cb, h, w, _ = x.shape
    c = cb * 8
    steps, scale, bias = _checked(x, scale, bias, out, (n, h, w, c), c)
    rows = n * h * w
    if rows == 0 or c == 0:
        return chain([])
    if not x.flags.c_contiguous:
        dense = workspace.empty(x.shape, _F32)
        steps.append(functools.partial(np.copyto, dense, x))
        x = dense
    xf, outf = readonly_view(x.reshape(-1)), out.reshape(-1)
    scale, bias = readonly_view(scale), readonly_view(bias)
    parts = parallel.ranges(rows, parallel.num_threads(), -(-_MIN_PART // c))
    run = _compiled("blocks")
    stats = workspace.empty((len(parts), 16 * BAND), np.float64)
    calls = [functools.partial(run, xf, h * w, c, scale, bias, outf, float(eps), lo, hi, st)
             for (lo, hi), st in zip(parts, stats)]  # fmt: skip
    steps.append(parallel.concurrently(calls))
    return chain(steps)
