"""megbrain's own float32 GEMM ``out (+)= a @ b`` on AVX-512: register tiles over packed
panels of both operands (:mod:`.sgemm_loops`), cut over the kernel threads.

The product's columns (or rows, when it has more rows than columns) are split into one part
per thread, each a whole blocked GEMM with its own packing buffers: every sum runs over ``k``
in order, so results do not depend on the thread count. ``a`` and ``b`` take any
non-negative strides (transposes and slices read in place by the packing); ``out`` needs a
unit stride along one axis (a C-ordered output is the product itself, an F-ordered one the
transposed product ``out.T = b.T @ a.T``).
"""

from __future__ import annotations

import functools

import numpy as np

from . import gemm, parallel, tiled_jit, workspace
from . import sgemm_loops as loops
from .steps import Step, chain

__all__ = ["BLOCKS", "ENABLED", "SPLIT_MIN_FLOPS", "TILE", "bind_pack", "bind_packed_product",
           "bind_sgemm", "bind_sgemm_sum", "group_products", "packed_size", "product_buffer_size",
           "product_step", "sgemm", "usable_sgemm"]  # fmt: skip

#: the register tile: rows by vectors of 16 columns (24 accumulators; with six rows the
#: rows of ``a`` read in place need few address registers, where 12 or 14 spilled)
TILE = (6, 4)
#: the cache blocks ``(MC, KC, NC)``: a ``KC x 64`` panel of ``b`` (32 KB) in L1 across a
#: row block's tiles, an ``MC x KC`` block of ``a`` (120 KB) in L2, a ``KC x NC`` block of
#: ``b`` (2 MB) in L3 (``KC`` 256 put the panel in L2: 0-15 % slower, in the noise)
BLOCKS = (240, 128, 4096)
#: the fewest floating-point operations (2 m n k) split over the threads: ~30 us on one core
SPLIT_MIN_FLOPS = 1 << 22

#: whether :func:`product_step` binds this GEMM, else NumPy's matmul: GEMM_COL2IM's data
#: gradients of ResNet-18 took 0.96-1.14x less CPU time with it (two interleaved runs on the
#: loaded 2-core machine, 1.07-1.11 on most layers); ``benchmarks/sgemm.py --layers``
#: compares the two
ENABLED = True

_F32 = np.dtype(np.float32)


def _flat(x: np.ndarray, writeable: bool = False) -> tuple[np.ndarray, np.ndarray] | None:
    """The 2-d ``x`` as a flat view from its first element to its last with its int64
    element strides (those of length-1 axes 0); None where a stride is negative or not a
    multiple of the item size."""
    st = [s if n > 1 else 0 for s, n in zip(x.strides, x.shape)]
    if any(s < 0 or s % x.itemsize for s in st):
        return None
    es = np.array([s // x.itemsize for s in st], np.int64)
    size = int(sum((n - 1) * s for n, s in zip(x.shape, es))) + 1
    v = np.lib.stride_tricks.as_strided(x, (size,), (x.itemsize,), writeable=writeable)
    if not writeable:
        v.flags.writeable = False
    return v, es


def _check(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    if a.ndim != 2 or b.ndim != 2 or out.ndim != 2 or a.shape[1] != b.shape[0] \
            or out.shape != (a.shape[0], b.shape[1]):  # fmt: skip
        raise ValueError(f"sgemm: a {a.shape} @ b {b.shape} does not give out {out.shape} "
                         "(2-d a (m, k), b (k, n), out (m, n))")  # fmt: skip
    if not a.dtype == b.dtype == out.dtype == _F32:
        raise TypeError(f"sgemm: a {a.dtype}, b {b.dtype}, out {out.dtype}: float32 only")


def usable_sgemm(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> bool:
    """Whether :func:`bind_sgemm` computes ``out = a @ b``: 2-d float32 operands of matching
    shapes, non-negative strides that are multiples of 4 bytes, ``out`` writable with a unit
    stride along one axis and sharing no memory with ``a`` or ``b``."""
    try:
        _check(a, b, out)
    except (ValueError, TypeError):
        return False
    if not out.flags.writeable or _flat(a) is None or _flat(b) is None:
        return False
    if out.size and (np.shares_memory(out, a) or np.shares_memory(out, b)):
        return False
    ok = _flat(out)
    return ok is not None and (out.size == 0 or 1 in ok[1] or 0 in ok[1])


def bind_sgemm(a: np.ndarray, b: np.ndarray, out: np.ndarray, accumulate: bool = False,
               threads: int | None = None) -> Step:  # fmt: skip
    """Bind ``out = a @ b`` (``out += a @ b`` with ``accumulate``) in float32.

    Parameters
    ----------
    a, b : numpy.ndarray
        The (m, k) and (k, n) float32 operands, any non-negative strides (multiples of 4
        bytes).
    out : numpy.ndarray
        The (m, n) float32 result: writable, a unit stride along one axis, sharing no memory
        with ``a`` or ``b``.
    accumulate : bool
        Add the product to ``out`` instead of overwriting it.
    threads : int, optional
        Threads to split the product over (default :func:`parallel.num_threads`; one below
        :data:`SPLIT_MIN_FLOPS`).

    Returns
    -------
    Step
        A zero-argument callable computing ``out``; it allocates nothing (its packing
        buffers come from :func:`workspace.empty`, written before they are read).

    Raises
    ------
    ValueError
        Shapes that do not multiply (the message names the operands and their shapes), or
        strides or aliasing :func:`usable_sgemm` rejects.
    TypeError
        An operand that is not float32.
    """
    _check(a, b, out)
    if not usable_sgemm(a, b, out):
        raise ValueError(f"sgemm: a {a.shape} strides {a.strides}, b {b.shape} strides "
                         f"{b.strides}, out {out.shape} strides {out.strides}: needs "
                         "non-negative strides of whole items, out writable with a unit "
                         "stride along one axis and not overlapping a or b")  # fmt: skip
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0:
        return _nothing
    if k == 0:
        return _nothing if accumulate else functools.partial(out.fill, 0)
    if _flat(out)[1][1] != 1 and (m == 1 or _flat(out)[1][0] == 1):
        a, b, out = b.T, a.T, out.T  # F order: the transposed product
        m, n = n, m
    nt = parallel.num_threads() if threads is None else max(1, threads)
    if 2 * m * n * k < SPLIT_MIN_FLOPS:
        nt = 1
    r, nb = TILE
    nr = nb * loops.LANES
    if m <= n:  # split the columns: each part packs all of ``a``, the smaller operand
        parts = [(slice(None), slice(lo * nr, min(n, hi * nr)))
                 for lo, hi in parallel.ranges(-(-n // nr), nt)]  # fmt: skip
    else:
        parts = [(slice(lo * r, min(m, hi * r)), slice(None))
                 for lo, hi in parallel.ranges(-(-m // r), nt)]  # fmt: skip
    calls = [_part(a[rows], b[:, cols], out[rows, cols], accumulate) for rows, cols in parts]
    return calls[0] if len(calls) == 1 else parallel.concurrently(calls)


def _nothing() -> None:
    pass


def bind_sgemm_sum(a: np.ndarray, b: np.ndarray, out: np.ndarray,
                   threads: int | None = None) -> Step:  # fmt: skip
    """Bind ``out = sum over i of a[i] @ b[i]`` in float32: a batch of products summed into
    one result (a filter gradient over the samples) with no per-product buffer.

    Each thread takes its columns (or rows, when ``out`` has more rows than columns) of
    ``out`` and runs the products of every ``i`` in order, the first storing its tile and
    the next ones adding to it (the tiles' ``ACC`` write-out), with one pair of packing
    buffers: every element's sum runs over ``i`` and then ``k`` in order, whatever the
    threads.

    Parameters
    ----------
    a, b : numpy.ndarray
        The (N, m, k) and (N, k, n) float32 operands; each ``a[i]``, ``b[i]`` with
        :func:`bind_sgemm`'s strides.
    out : numpy.ndarray
        The (m, n) float32 result, C-ordered rows (unit column stride), sharing no memory
        with ``a`` or ``b``.
    threads : int, optional
        As :func:`bind_sgemm`'s (one below :data:`SPLIT_MIN_FLOPS` in all).

    Returns
    -------
    Step
        A zero-argument callable computing ``out``; it allocates nothing.

    Raises
    ------
    ValueError
        Operands that are not 3-d of matching shapes, or that :func:`usable_sgemm` rejects
        (the message names them), or an ``out`` without a unit column stride.
    """
    if a.ndim != 3 or b.ndim != 3 or a.shape[0] != b.shape[0] or a.shape[0] == 0:
        raise ValueError(f"sgemm: a {a.shape} and b {b.shape} are not two batches of "
                         "matrices of one length (N, m, k), (N, k, n)")  # fmt: skip
    if not all(usable_sgemm(a[i], b[i], out) for i in range(a.shape[0])) or (
            out.shape[1] > 1 and out.strides[1] != out.itemsize):  # fmt: skip
        raise ValueError(f"sgemm: a {a.shape} strides {a.strides}, b {b.shape} strides "
                         f"{b.strides}, out {out.shape} strides {out.strides}: needs "
                         "bind_sgemm's strides and out's rows contiguous")  # fmt: skip
    nb_, m, k = a.shape
    n = b.shape[2]
    if m == 0 or n == 0:
        return _nothing
    if k == 0:
        return functools.partial(out.fill, 0)
    nt = parallel.num_threads() if threads is None else max(1, threads)
    if 2 * m * n * k * nb_ < SPLIT_MIN_FLOPS:
        nt = 1
    r, nbv = TILE
    nr = nbv * loops.LANES
    if m <= n:
        parts = [(slice(None), slice(lo * nr, min(n, hi * nr)))
                 for lo, hi in parallel.ranges(-(-n // nr), nt)]  # fmt: skip
    else:
        parts = [(slice(lo * r, min(m, hi * r)), slice(None))
                 for lo, hi in parallel.ranges(-(-m // r), nt)]  # fmt: skip
    run = loops.compiled_gemm(r, nbv)
    calls = []
    for rows, cols in parts:
        o = out[rows, cols]
        mp, np_ = o.shape
        na, nbp = loops.pack_sizes(r, nbv, mp, np_, k, BLOCKS)
        ap, bp = workspace.empty((na,), _F32), workspace.empty((nbp,), _F32)
        cf, sc = _flat(o, writeable=True)
        steps = []
        for i in range(nb_):
            sa_, sb_ = _flat(a[i][rows]), _flat(b[i][:, cols])
            geom = np.array([mp, np_, k, 0, sc[0] if mp > 1 else np_, int(i > 0), *BLOCKS, 0],
                            np.int64)  # fmt: skip
            steps.append(functools.partial(run, sa_[0], sa_[1], sb_[0], sb_[1], cf, geom, ap,
                                           bp))  # fmt: skip
        calls.append(chain(steps))
    return calls[0] if len(calls) == 1 else parallel.concurrently(calls)


def _part(a: np.ndarray, b: np.ndarray, out: np.ndarray, accumulate: bool) -> Step:
    """One thread's whole blocked GEMM ``out (+)= a @ b`` (``out`` of unit column stride)."""
    m, k = a.shape
    n = b.shape[1]
    r, nb = TILE
    sa_, sb_ = _flat(a), _flat(b)
    cf, sc = _flat(out, writeable=True)
    na, nbp = loops.pack_sizes(r, nb, m, n, k, BLOCKS)
    ap, bp = workspace.empty((na,), _F32), workspace.empty((nbp,), _F32)
    geom = np.array([m, n, k, 0, sc[0] if m > 1 else n, int(accumulate), *BLOCKS, 0], np.int64)
    run = loops.compiled_gemm(r, nb)
    return functools.partial(run, sa_[0], sa_[1], sb_[0], sb_[1], cf, geom, ap, bp)


def packed_size(k: int, n: int) -> int:
    """The floats of a ``(k, n)`` matrix packed by :func:`bind_pack` (its columns rounded up
    to whole panels of ``16 TILE[1]``)."""
    nr = TILE[1] * loops.LANES
    return int(k) * (-(-int(n) // nr) * nr)


def bind_pack(b: np.ndarray, panels: np.ndarray) -> Step:
    """Bind the packing of the (k, n) float32 ``b`` (any non-negative strides) into
    ``panels``, a flat float32 buffer of :func:`packed_size` items: the right-hand operand of
    :func:`bind_packed_product`, packed once for any number of products.

    Raises
    ------
    ValueError
        A ``b`` that is not 2-d float32 of non-negative strides, or a ``panels`` buffer that
        is not a writable flat float32 array of :func:`packed_size` items or more.
    """
    flat = _flat(b) if b.ndim == 2 and b.dtype == _F32 else None
    k, n = b.shape if b.ndim == 2 else (0, 0)
    if flat is None or panels.ndim != 1 or panels.dtype != _F32 or not panels.flags.writeable \
            or panels.size < packed_size(k, n) or not panels.flags.c_contiguous:  # fmt: skip
        raise ValueError(f"sgemm: cannot pack b {b.shape} {b.dtype} strides {b.strides} into "
                         f"panels {panels.shape} {panels.dtype}: needs a 2-d float32 b of "
                         f"non-negative strides and a flat float32 buffer of "
                         f"{packed_size(k, n)} items")  # fmt: skip
    if b.size == 0:
        return _nothing
    return functools.partial(loops.compiled_pack(TILE[1]), flat[0], flat[1], k, n, panels)


def bind_packed_product(a: np.ndarray, panels: np.ndarray, n: int, out: np.ndarray,
                        accumulate: bool, ap: np.ndarray, rows: int | None = None,
                        first: int = 0) -> Step:  # fmt: skip
    """Bind ``out = a @ B`` (``out += a @ B`` with ``accumulate``) on the calling thread,
    ``B`` the (k, n) matrix :func:`bind_pack` packed into ``panels`` (read as they are), or
    the rows ``[first, first + k)`` of a (``rows``, n) matrix packed there.

    Parameters
    ----------
    a : numpy.ndarray
        The (m, k) float32 operand (:func:`bind_sgemm`'s strides; rows contiguous along k
        are read in place).
    panels : numpy.ndarray
        The packed (k, n) operand.
    n : int
        Its columns.
    out : numpy.ndarray
        The (m, n) float32 result: writable, a unit column stride, not overlapping ``a``.
    accumulate : bool
        Add the product to ``out``.
    ap : numpy.ndarray
        A flat float32 packing buffer of :func:`product_buffer_size` items, shared by the
        products one thread runs (written before it is read).
    rows, first : int, optional
        The packed matrix's rows (default ``k``) and the first of them that ``B`` takes
        (default 0): one packing serves products over ranges of its rows.

    Returns
    -------
    Step
        A zero-argument callable computing ``out``; it allocates nothing.
    """
    m, k = a.shape
    rows = k if rows is None else int(rows)
    if not 0 <= first <= rows - k:
        raise ValueError(f"sgemm: rows [{first}, {first + k}) of a packed matrix of {rows}")
    if out.shape != (m, n) or panels.size < packed_size(rows, n) or ap.size < \
            product_buffer_size(m, k) or not usable_sgemm(a, np.empty((k, n), _F32), out) \
            or (m > 1 and n > 1 and out.strides[1] != out.itemsize):  # fmt: skip
        raise ValueError(f"sgemm: a {a.shape} strides {a.strides}, packed ({k}, {n}), out "
                         f"{out.shape} strides {out.strides}: shapes that do not multiply, "
                         "strides bind_sgemm rejects, a non-unit column stride of out, or "
                         "buffers too small")  # fmt: skip
    if m == 0 or n == 0:
        return _nothing
    if k == 0:
        return _nothing if accumulate else functools.partial(out.fill, 0)
    r, nb = TILE
    sa_ = _flat(a)
    cf, sc = _flat(out, writeable=True)
    geom = np.array([m, n, k, 0, sc[0] if m > 1 else n, int(accumulate), *BLOCKS, rows],
                    np.int64)  # fmt: skip
    run = loops.compiled_gemm(r, nb)
    bp = panels[first * TILE[1] * loops.LANES :]
    return functools.partial(run, sa_[0], sa_[1], sa_[0], sa_[1], cf, geom, ap, bp)


def product_buffer_size(m: int, k: int) -> int:
    """The floats of :func:`bind_packed_product`'s ``ap`` for an (m, k) left operand."""
    r, nb = TILE
    return loops.pack_sizes(r, nb, m, 1, k, BLOCKS)[0]


def sgemm(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None,
          threads: int | None = None) -> np.ndarray:  # fmt: skip
    """``a @ b`` in float32 by :func:`bind_sgemm`, computed now.

    Parameters
    ----------
    a, b : numpy.ndarray
        The (m, k) and (k, n) float32 operands (:func:`bind_sgemm`'s strides).
    out : numpy.ndarray, optional
        The (m, n) result (a new C-ordered array by default).
    threads : int, optional
        As :func:`bind_sgemm`'s.

    Returns
    -------
    numpy.ndarray
        ``out``.
    """
    if out is None:
        if a.ndim != 2 or b.ndim != 2:
            _check(a, b, np.empty((0,), _F32))
        out = np.empty((a.shape[0], b.shape[1]), _F32)
    bind_sgemm(a, b, out, threads=threads)()
    return out


def product_step(a: np.ndarray, b: np.ndarray, out: np.ndarray, split: bool = False) -> Step:
    """A step computing ``out = a @ b``: :func:`bind_sgemm` where :func:`usable_sgemm` holds,
    :data:`ENABLED` is set and the compiler targets AVX-512 (on AVX2 its 16-lane tile would
    take 48 registers), else NumPy's matmul.

    Parameters
    ----------
    a, b, out : numpy.ndarray
        As :func:`bind_sgemm`'s (any dtypes NumPy's ``matmul(out=)`` takes for the
        fallback).
    split : bool
        Split the product over the kernel threads (:func:`gemm.matmul_step` for the
        fallback); else one call on the calling thread (a pipeline's, BLAS single-threaded
        by its caller).

    Returns
    -------
    Step
        A zero-argument callable computing ``out``.
    """
    if ENABLED and tiled_jit.vector_width() == 16 and usable_sgemm(a, b, out):
        return bind_sgemm(a, b, out, threads=None if split else 1)
    if split:
        return gemm.matmul_step(a, b, out)
    return functools.partial(np.matmul, a, b, out=out)


def group_products(a: np.ndarray, b: np.ndarray, out: np.ndarray, split: bool = False
                   ) -> list[Step]:  # fmt: skip
    """Steps ``out[g] = a[g] @ b[g]`` for each group of the 3-d operands, one
    :func:`product_step` each."""
    return [product_step(a[i], b[i], out[i], split) for i in range(out.shape[0])]
