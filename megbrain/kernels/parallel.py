"""Splitting a GIL-free compiled kernel over a few threads of one small module-level pool.

The executor calls kernels from its comp nodes' worker threads, and Numba's parallel threading
layers (OpenMP, TBB, workqueue) are not safe to enter from several threads at once. A kernel
that takes a range ``[lo, hi)`` of independent items (planes, rows) and releases the GIL
(``nogil``) is instead split here: the calling thread runs the first part, the pool's threads
the others, and the call returns when all are done. The pool has one thread fewer than
:func:`num_threads` (the BLAS thread count, else the number of CPUs); its threads only run
such parts and never submit work themselves, so callers cannot deadlock on it.

OpenBLAS's own worker threads spin for about 2**28 CPU cycles (~0.1 s) after each threaded
call before they sleep; a split kernel or a per-thread GEMM pipeline that follows a threaded
GEMM then shares a core with a spinning worker (measured: the CNN training step ran 1.5x
slower). The first use of the pool or of :func:`blas_single_threaded` therefore shortens that
spin to :data:`BLAS_SPIN_LOG2_CYCLES` (OpenBLAS's ``OPENBLAS_THREAD_TIMEOUT``), unless the
environment sets ``OPENBLAS_THREAD_TIMEOUT`` itself: see :func:`quiet_blas_workers`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import functools
import itertools
import os
import threading
from collections.abc import Callable, Sequence

from .steps import Step, chain

__all__ = [
    "blas_single_threaded",
    "can_single_thread_blas",
    "concurrently",
    "concurrently_blas_single_threaded",
    "num_threads",
    "quiet_blas_workers",
    "ranges",
    "split",
    "take_in_turn",
]

_lock = threading.Lock()
_pool: concurrent.futures.ThreadPoolExecutor | None = None


@functools.cache
def num_threads() -> int:
    """Threads a split kernel uses: OpenBLAS's (through ``threadpoolctl`` when it is
    installed, so that ``OPENBLAS_NUM_THREADS`` caps both alike), else ``os.cpu_count()``."""
    n = 0
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        pass
    else:
        n = max((i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"), default=0)
    return max(1, n or os.cpu_count() or 1)


#: log2 of the CPU cycles OpenBLAS's idle workers spin before sleeping (2**18 ~ 0.1 ms):
#: back-to-back threaded GEMMs still find them awake, the kernels that follow do not compete
#: with them for a core
BLAS_SPIN_LOG2_CYCLES = 18


@functools.cache
def quiet_blas_workers() -> bool:
    """Shorten the spin of OpenBLAS's idle worker threads to :data:`BLAS_SPIN_LOG2_CYCLES`.

    Does nothing when the environment sets ``OPENBLAS_THREAD_TIMEOUT`` (the user's choice) or
    ``threadpoolctl`` is missing. Otherwise it sets the variable (so that an OpenBLAS loaded
    later reads it) and, for each OpenBLAS already loaded with a longer spin, has it re-read
    its environment and restart its workers (``openblas_read_env``, ``blas_thread_shutdown_``:
    the workers start again, with the new timeout, at the next threaded call). Runs once, at
    the first use of the kernel pool or of :func:`blas_single_threaded`.

    Returns
    -------
    bool
        Whether the spin is now :data:`BLAS_SPIN_LOG2_CYCLES` cycles (False when the user's
        setting or a missing library left it alone).
    """
    if "OPENBLAS_THREAD_TIMEOUT" in os.environ:
        return False
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return False
    os.environ["OPENBLAS_THREAD_TIMEOUT"] = str(BLAS_SPIN_LOG2_CYCLES)
    for info in threadpool_info():
        if info.get("internal_api") != "openblas":
            continue
        lib = ctypes.CDLL(info["filepath"])
        needed = ("openblas_thread_timeout", "openblas_read_env", "blas_thread_shutdown_")
        if not all(hasattr(lib, name) for name in needed):
            continue
        lib.openblas_thread_timeout.restype = ctypes.c_int
        if lib.openblas_thread_timeout() != BLAS_SPIN_LOG2_CYCLES:
            lib.openblas_read_env()
            lib.blas_thread_shutdown_()
    return True


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    quiet_blas_workers()
    with _lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(
                max(1, num_threads() - 1), thread_name_prefix="mgb-kernel"
            )
        return _pool


def _forget_pool() -> None:  # a forked child has none of the parent's threads
    global _pool
    _pool = None


os.register_at_fork(after_in_child=_forget_pool)


def split(fn: Callable[[int, int], object], n: int, min_items: int) -> Step:
    """A step running ``fn(lo, hi)`` over ``[0, n)`` in at most :func:`num_threads` parts of
    at least ``min_items`` items each (one plain call when that makes one part).

    Parameters
    ----------
    fn : Callable[[int, int], object]
        Computes items ``[lo, hi)``; parts run concurrently, so ``fn`` must release the GIL
        to gain anything and must write disjoint memory for disjoint ranges.
    n : int
        Number of items.
    min_items : int
        Fewest items worth one thread (below it, the hand-over costs more than it saves).
    """
    bounds = ranges(n, num_threads(), min_items)
    if len(bounds) == 1:
        return functools.partial(fn, 0, n)
    head, rest = bounds[0], bounds[1:]

    def run() -> None:
        pool = _executor()
        futures = [pool.submit(fn, lo, hi) for lo, hi in rest]
        try:
            fn(*head)
        finally:
            for f in futures:
                f.result()

    return run


def ranges(n: int, parts: int, min_items: int = 1) -> list[tuple[int, int]]:
    """``[0, n)`` as at most ``parts`` contiguous ``(lo, hi)`` ranges of at least
    ``min_items`` items each (a single range when that allows no more)."""
    parts = max(1, min(parts, n // max(1, min_items)))
    return [(n * k // parts, n * (k + 1) // parts) for k in range(parts)]


def concurrently(calls: Sequence[Callable[[], None]]) -> Step:
    """A step running ``calls`` (GIL-free kernels writing disjoint memory, each with its own
    scratch) at once through :func:`split`'s pool; the call itself when there is one."""
    if len(calls) == 1:
        return calls[0]

    def run(lo: int, hi: int) -> None:
        for k in range(lo, hi):
            calls[k]()

    return split(run, len(calls), 1)


_blas_lock = threading.Lock()
_blas_users = 0
_blas_saved: list[int] = []


@functools.cache
def _blas_libs() -> tuple:
    # the BLAS libraries loaded at the first call: NumPy's, whose GEMMs the kernels call
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return ()
    quiet_blas_workers()
    return tuple(ThreadpoolController().select(user_api="blas").lib_controllers)


def can_single_thread_blas() -> bool:
    """Whether :func:`blas_single_threaded` can set the BLAS thread count (``threadpoolctl``
    is installed and finds the BLAS library)."""
    return bool(_blas_libs())


@contextlib.contextmanager
def blas_single_threaded():
    """Run the block with BLAS at one thread, so that several threads of a split kernel can
    each call BLAS on their own part (a BLAS call from a thread then runs on that thread, and
    OpenBLAS's threaded GEMMs, which serialize on one lock, are not entered).

    The thread count is process-wide: a GEMM another thread starts meanwhile runs
    single-threaded too (its result is the same). Nested and concurrent blocks are counted:
    the count is restored when the last one ends. Without ``threadpoolctl`` nothing changes.
    """
    global _blas_users, _blas_saved
    libs = _blas_libs()
    if not libs:
        yield
        return
    num_threads()  # measured before it is lowered
    with _blas_lock:
        if _blas_users == 0:
            _blas_saved = [lib.get_num_threads() for lib in libs]
            for lib in libs:
                lib.set_num_threads(1)
        _blas_users += 1
    try:
        yield
    finally:
        with _blas_lock:
            _blas_users -= 1
            if _blas_users == 0:
                for lib, n in zip(libs, _blas_saved):
                    lib.set_num_threads(n)


def concurrently_blas_single_threaded(calls: Sequence[Callable[[], None]]) -> Step:
    """:func:`concurrently`, with BLAS single-threaded (:func:`blas_single_threaded`) while
    more than one call runs: each call's GEMMs then run on its own thread instead of queueing
    for OpenBLAS's threads. One call runs as it is."""
    run = concurrently(calls)
    if len(calls) == 1:
        return run

    def step() -> None:
        with blas_single_threaded():
            run()

    return step


def take_in_turn(table: Sequence[Sequence[Callable[[], None]]]) -> Step:
    """A step running ``n`` work items once each on ``len(table)`` threads.

    ``table[t]`` holds the same ``n`` items bound to thread ``t``'s own buffers; each run,
    the threads take the next item index from one shared counter (``next`` on it is atomic
    under the GIL), so that a thread the OS holds back delays only the item it has, not a
    fixed share of them. An item's result must not depend on the thread running it. BLAS
    runs single-threaded while several threads run (:func:`concurrently_blas_single_threaded`).
    """
    if len(table) == 1:
        return chain(list(table[0]))
    n = len(table[0])
    counter: list = [None]

    def worker(todo: Sequence[Callable[[], None]]) -> Step:
        def run() -> None:
            take = counter[0].__next__
            while (i := take()) < n:
                todo[i]()

        return run

    workers = concurrently_blas_single_threaded([worker(t) for t in table])

    def run() -> None:
        counter[0] = itertools.count()
        workers()

    return run
