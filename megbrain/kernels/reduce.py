"""Reduce kernels (SUM, SUM_SQR, PRODUCT, MIN, MAX, MEAN), bound once and run into ``out``.

Reduced axes are kept with size 1 in ``out``. Integers accumulate in their own dtype (wrapping
like C), float16 and bfloat16 in float32. Float sums over a contiguous inner run (a bias
gradient's ``(N, C, H, W) -> (1, C, 1, 1)``) are one compiled (Numba) pass.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
from numba import carray, njit
from numba import types as nt

from . import tiled_jit
from .arrays import F32, is_low_float
from .steps import chain

__all__ = [
    "COMPILED_SUM_MIN_INNER",
    "COMPILED_SUM_MIN_SIZE",
    "REDUCE_MODES",
    "bind_reduce",
    "bind_reduce_to_shape",
]

_partial = functools.partial

#: mode name -> the ufunc whose ``reduce`` does the work
REDUCE_MODES: dict[str, np.ufunc] = {
    "SUM": np.add,
    "SUM_SQR": np.add,
    "PRODUCT": np.multiply,
    "MIN": np.minimum,
    "MAX": np.maximum,
    "MEAN": np.add,
}


def _bind(mode: str, src: np.ndarray, out: np.ndarray, view: np.ndarray, axes: tuple[int, ...]):
    """Reduce ``src`` over ``axes`` into ``view``, a view of ``out`` with src's ndim."""
    try:
        ufunc = REDUCE_MODES[mode.upper()]
    except (KeyError, AttributeError):
        raise ValueError(f"unknown Reduce mode {mode!r}") from None
    mode = mode.upper()
    dtype = src.dtype
    if not (dtype.kind in "iuf" or is_low_float(dtype)):
        raise ValueError(f"Reduce mode {mode} does not support dtype {dtype.name}")
    acc = F32 if is_low_float(dtype) else dtype
    count = math.prod(src.shape[a] for a in axes)
    if count == 0 and mode in ("MIN", "MAX", "MEAN") and view.size:
        raise ValueError(f"Reduce mode {mode}: reducing {src.shape} over empty axes {axes}")
    steps = []
    if mode == "SUM_SQR":
        sq = np.empty(src.shape, acc)
        if acc == dtype:
            steps.append(_partial(np.square, src, sq))
        else:
            steps += [_partial(np.copyto, sq, src, "unsafe"), _partial(np.square, sq, sq)]
        src = sq
    res = view if view.dtype == acc else np.empty(view.shape, acc)
    fast = _compiled_sum(src, axes, res) if ufunc is np.add and acc.kind == "f" else None
    if fast is None:
        fast = _compiled_blocked(ufunc, src, axes, res)
    if fast is not None:
        steps += fast
    else:
        # dtype=acc: NumPy would otherwise sum small integers in int64, float16 in float16
        steps.append(_partial(ufunc.reduce, src, axes, acc, res, True))
    if mode == "MEAN":
        n = acc.type(count)
        if acc.kind == "f":
            steps.append(_partial(np.true_divide, res, n, res))
        else:  # C integer division truncates toward zero
            rem = np.empty(res.shape, acc)
            steps += [
                _partial(np.fmod, res, n, rem),
                _partial(np.subtract, res, rem, res),
                _partial(np.floor_divide, res, n, res),
            ]
    if res is not view:
        steps.append(_partial(np.copyto, view, res, "unsafe"))
    return chain(steps)


#: a sum over a contiguous inner run of at least this many elements (of a source of at
#: least COMPILED_SUM_MIN_SIZE) runs as one compiled pass
COMPILED_SUM_MIN_INNER = 16
COMPILED_SUM_MIN_SIZE = 1 << 12


def _groups(shape: tuple, axes: tuple) -> list[list]:
    """``shape`` as runs of consecutive reduced or kept dims, ``[size, reduced]`` each
    (dims of size 1 dropped)."""
    out: list[list] = []
    for d, n in enumerate(shape):
        if n == 1:
            continue
        if out and out[-1][1] == (d in axes):
            out[-1][0] *= n
        else:
            out.append([n, d in axes])
    return out


def _sum_outer_inner_py(x, out):  # pragma: no cover - compiled
    na, nb, nc = x.shape
    tot = np.zeros(nb, np.float64)
    for a in range(na):
        for b in range(nb):
            acc = 0.0
            for c in range(nc):
                acc += x[a, b, c]
            tot[b] += acc
    for b in range(nb):
        out[b] = tot[b]


@functools.cache
def _sum_outer_inner():
    opts = dict(nogil=True, cache=True, error_model="numpy", fastmath={"reassoc"})
    return njit(**opts)(_sum_outer_inner_py)


def _compiled_sum(src: np.ndarray, axes: tuple, res: np.ndarray) -> list | None:
    """The step summing a C-contiguous float ``src`` over an inner run of
    ``C >= COMPILED_SUM_MIN_INNER`` contiguous elements and an outer run, keeping the
    middle: ``(N, C, H, W) -> (1, C, 1, 1)`` (a bias gradient) as ``(N, C, H*W) -> (C,)``,
    one single-threaded compiled pass accumulating in float64 (NumPy's multi-axis reduce
    walks the tensor with short inner loops). None for any other case."""
    g = _groups(src.shape, axes)
    if g and not g[0][1]:
        g.insert(0, [1, True])  # no outer run
    if (
        len(g) != 3
        or [r for _, r in g] != [True, False, True]
        or g[2][0] < COMPILED_SUM_MIN_INNER
        or src.size < COMPILED_SUM_MIN_SIZE
        or src.dtype != res.dtype
        or not (src.flags.c_contiguous and res.flags.c_contiguous)
    ):
        return None
    (na, _), (nb, _), (nc, _) = g
    return [_partial(_sum_outer_inner(), src.reshape(na, nb, nc), res.reshape(nb))]


def bind_reduce(
    mode: str, src: np.ndarray, out: np.ndarray, axis: int | None
) -> Callable[[], None]:
    """Bind a reduction over one axis, or over everything.

    Parameters
    ----------
    mode : str
        SUM, SUM_SQR, PRODUCT, MIN, MAX or MEAN, in any case.
    src : numpy.ndarray
        The input.
    out : numpy.ndarray
        The output: src's shape with ``axis`` set to 1, or shape (1,) when ``axis`` is None.
    axis : int or None
        The reduced axis (negative counts from the end), or None to reduce everything.

    Returns
    -------
    Callable[[], None]
        A zero-argument callable computing the reduction into ``out``.
    """
    if axis is None:
        if out.size != 1:
            raise ValueError(f"Reduce {mode}: output shape {out.shape} for a full reduction")
        return _bind(mode, src, out, out.reshape((1,) * src.ndim), tuple(range(src.ndim)))
    if not -src.ndim <= axis < src.ndim:
        raise ValueError(f"Reduce {mode}: axis {axis} out of range for shape {src.shape}")
    axis %= src.ndim
    expected = src.shape[:axis] + (1,) + src.shape[axis + 1 :]
    if out.shape != expected:
        raise ValueError(
            f"Reduce {mode}: output shape {out.shape} for input shape {src.shape} and axis "
            f"{axis}, expected {expected}"
        )
    return _bind(mode, src, out, out, (axis,))


def bind_reduce_to_shape(mode: str, src: np.ndarray, out: np.ndarray) -> Callable[[], None]:
    """Bind a reduction of ``src`` to ``out.shape`` under broadcasting rules (used by grads).

    Parameters
    ----------
    mode : str
        One of :func:`bind_reduce`'s modes.
    src : numpy.ndarray
        The input.
    out : numpy.ndarray
        The output, whose shape broadcasts to src's: every dim equal to src's or 1 (reduced);
        missing leading dims count as 1.

    Returns
    -------
    Callable[[], None]
        A zero-argument callable computing the reduction into ``out``.
    """
    extra = src.ndim - out.ndim
    target = (1,) * extra + out.shape
    if extra < 0 or any(t not in (1, s) for t, s in zip(target, src.shape)):
        raise ValueError(f"Reduce {mode}: can not reduce shape {src.shape} to {out.shape}")
    axes = tuple(i for i, (t, s) in enumerate(zip(target, src.shape)) if t != s)
    return _bind(mode, src, out, out.reshape(target), axes)


#: the kept inner run of a reduction :func:`_compiled_blocked` takes: the 8 channels of an
#: NCHW88 block, a global pooling's ``(N, C/8, H*W, 8) -> (N, C/8, 1, 8)``
BLOCK_INNER = 8
#: rows of BLOCK_INNER values summed apart (independent sums in registers), then added
_ROWS = 4
_BLOCK_TILE = _ROWS * BLOCK_INNER
stack_tile = None  # bound by _blocked_loop() before compiling


def _block_sum_py(x, out):  # pragma: no cover - compiled
    # x (A, B * 8), out (A, 8): out[a, c] = sum over b of x[a, 8 b + c], in float64 (rows
    # b % _ROWS summed apart, then added)
    nb = x.shape[1] // BLOCK_INNER
    for a in range(x.shape[0]):
        tile = stack_tile(_BLOCK_TILE, np.float64)  # noqa: F821 - the tiled_jit intrinsic
        acc = carray(tile, _BLOCK_TILE)
        for k in range(_BLOCK_TILE):
            acc[k] = 0.0
        row = x[a]
        b = 0
        while b + _ROWS <= nb:
            base = np.uintp(b * BLOCK_INNER)
            for k in range(_BLOCK_TILE):
                acc[k] += np.float64(row[base + k])
            b += _ROWS
        while b < nb:
            base = np.uintp(b * BLOCK_INNER)
            for c in range(BLOCK_INNER):
                acc[c] += np.float64(row[base + c])
            b += 1
        for c in range(BLOCK_INNER):
            total = acc[c]
            for r in range(1, _ROWS):
                total += acc[r * BLOCK_INNER + c]
            out[a, c] = total


def _block_max_py(x, out):  # pragma: no cover - compiled
    # x (A, B * 8), out (A, 8): out[a, c] = max over b of x[a, 8 b + c], NaN propagating as
    # np.maximum's
    nb = x.shape[1] // BLOCK_INNER
    for a in range(x.shape[0]):
        tile = stack_tile(BLOCK_INNER, np.float32)  # noqa: F821 - the tiled_jit intrinsic
        acc = carray(tile, BLOCK_INNER)
        row = x[a]
        for c in range(BLOCK_INNER):
            acc[c] = row[c]
        for b in range(1, nb):
            base = np.uintp(b * BLOCK_INNER)
            for c in range(BLOCK_INNER):
                v = row[base + c]
                m = acc[c]
                acc[c] = v if v > m or v != v else m
        for c in range(BLOCK_INNER):
            out[a, c] = acc[c]


@functools.cache
def _blocked_loop(ufunc):
    """The compiled loop of :func:`_compiled_blocked` for ``ufunc`` (each compiled on first
    use: a network pooling by MEAN never compiles the maximum)."""
    global stack_tile
    stack_tile = tiled_jit.stack_tile()
    sig = [nt.void(nt.Array(nt.float32, 2, "C", readonly=True), nt.float32[:, ::1])]
    fn = _block_sum_py if ufunc is np.add else _block_max_py
    return tiled_jit.compile_tiled(fn, sig, fastmath=False)


def _compiled_blocked(ufunc, src: np.ndarray, axes: tuple, res: np.ndarray) -> list | None:
    """The step of a float32 sum or maximum over the middle of ``(A, B, 8)`` (an inner run
    of :data:`BLOCK_INNER` kept values, the channel blocks of NCHW88): NumPy walks it 8
    values at a time (0.95 ms for (18, 3136, 8), against 0.06 ms here), a compiled pass
    keeps the 8 (sums in float64) in registers. None for any other case."""
    if ufunc not in (np.add, np.maximum):
        return None
    g = _groups(src.shape, axes)
    if g and g[0][1]:
        g.insert(0, [1, False])  # no outer run
    if (
        len(g) != 3
        or [r for _, r in g] != [False, True, False]
        or g[2][0] != BLOCK_INNER
        or src.size < COMPILED_SUM_MIN_SIZE
        or not src.dtype == res.dtype == F32
        or not (src.flags.c_contiguous and res.flags.c_contiguous)
    ):
        return None
    (na, _), (nb, _), _ = g
    x = src.reshape(na, nb * BLOCK_INNER).view()
    x.flags.writeable = False
    return [_partial(_blocked_loop(ufunc), x, res.reshape(na, BLOCK_INNER))]
