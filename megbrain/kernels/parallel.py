"""Splitting a GIL-free compiled kernel over a few threads of one small module-level pool.

The executor calls kernels from its comp nodes' worker threads, and Numba's parallel threading
layers (OpenMP, TBB, workqueue) are not safe to enter from several threads at once. A kernel
that takes a range ``[lo, hi)`` of independent items (planes, rows) and releases the GIL
(``nogil``) is instead split here: the calling thread runs the first part, the pool's threads
the others, and the call returns when all are done; the parts no pool thread has begun by
the time the caller's own is done, the caller runs itself. The pool has one thread fewer than
:func:`num_threads` (the BLAS thread count, else the number of CPUs). One caller at a time
holds it: a split started while another holds it (a second comp node's thread, or a part
splitting again) runs all its parts on its own thread, as the cores are busy anyway, so
callers never wait for the pool nor deadlock on it. Each worker waits on a lock of its own
for its part: a fork/join took ~16 us against ~36 us through ``concurrent.futures``. Both
sides poll a counter for 0.5 ms before they block (:data:`SPIN_NS`), so that back-to-back
splits find the other thread awake, and hand the GIL over without making the other side
sleep on it (:func:`_spinner`).
A part that is a compiled kernel bound to its arguments is handed over as a C call
(:mod:`.native_call`): the worker runs it from its compiled poll and signals its end there,
and the caller runs its own part and waits in one compiled call, so neither side takes the
GIL for it, and a worker never sleeps on the GIL behind its caller (mnasnet0_5 at two
threads: 0.72 of the time with Python parts).
Each worker runs on one CPU, never the one its caller runs on when it offers a part
(:meth:`_Worker.keep_off`): left to the scheduler, a worker woken by its caller was often
put on the caller's core and stayed there, and a whole network then ran on one thread.

megbrain's GEMMs run with BLAS single-threaded (:func:`blas_single_threaded`), a large one
split here over the kernel threads (:mod:`megbrain.kernels.gemm`, which says why and names
the one exception): OpenBLAS's workers spin ~0.1 s after each threaded call, sharing a core
with the kernels that follow (the CNN training step ran 1.5x slower).
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import os
import platform
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np
from numba import njit
from numba import types as t
from threadpoolctl import ThreadpoolController, threadpool_info

from .native_call import NativeCall, call_native, compare_swap, native_call
from .steps import Step, chain
from .tiled_jit import fetch_add

__all__ = [
    "blas_single_threaded",
    "blas_thread_counts",
    "can_single_thread_blas",
    "concurrently",
    "concurrently_blas_single_threaded",
    "num_threads",
    "ranges",
    "split",
    "take_in_turn",
]


@functools.cache
def num_threads() -> int:
    """Threads a split kernel uses: OpenBLAS's (through ``threadpoolctl``, so that
    ``OPENBLAS_NUM_THREADS`` caps both alike), else ``os.cpu_count()``."""
    n = max((i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"), default=0)
    return max(1, n or os.cpu_count() or 1)


#: nanoseconds a waiting side polls before it blocks on its lock. A worker that blocked took
#: 35-45 us to wake on the 2-vCPU machines, and the gaps between a network's kernels (the
#: executor, a small serial operator) are often longer than the 30 us the earlier 200
#: ``sched_yield`` polls lasted there (0.15 us each): ResNet50 at batch 1 ran in 29.6-29.9
#: ms polling 0.3 ms or longer, 31.7 ms with 30 us
SPIN_NS = 500_000
#: nanoseconds a woken worker still waits before it takes the GIL: about the caller's way
#: from starting it into its own GIL-free kernel. 10 us before the workers were pinned and
#: skipped the offers taken back without the GIL; a split of two 12 us parts then took
#: 26.8 us against 17.9 with 2 us (docs/performance.md)
SETTLE_NS = 2_000
#: whether :func:`split`, :func:`concurrently` and :func:`take_in_turn` hand the pool
#: threads compiled kernels' parts as C calls (:func:`_native_after_first_run`); read when a
#: step is bound
NATIVE_PARTS = True


@functools.cache
def _libc_calls():
    """libc's ``sched_yield`` and ``clock_gettime`` as typed ctypes functions (which compiled
    code calls without the GIL), or None where they are not found."""
    try:
        libc = ctypes.CDLL(None)
        sched_yield, clock_gettime = libc.sched_yield, libc.clock_gettime
    except (OSError, AttributeError, TypeError):
        return None
    sched_yield.restype, sched_yield.argtypes = ctypes.c_int, []
    clock_gettime.restype = ctypes.c_int
    clock_gettime.argtypes = [ctypes.c_int, ctypes.c_void_p]
    return sched_yield, clock_gettime


@functools.cache
def _spinner():
    """``spin(counters, i, seen, signal, settle, clock)``, compiled without the GIL: first
    adds one to ``counters[signal]`` when ``signal >= 0``, then polls (``sched_yield``
    between polls) until ``counters[i]`` differs from ``seen``, for up to :data:`SPIN_NS`,
    and once it does waits ``settle`` nanoseconds more. A worker's poll (``i == 0``) then
    goes on polling while ``counters[2]`` equals ``counters[0]``: the caller took that
    offer back, so the worker has nothing to take the GIL for. ``clock`` is the calling thread's
    int64 pair for ``clock_gettime``. None where libc's ``sched_yield`` or
    ``clock_gettime`` is not found (the threads then block at once).

    The GIL is why: a thread that wants it while another thread holds it sleeps on a
    condition variable, and waking it took 20-40 us on the 2-vCPU machines, as long as a
    small kernel part. So each side takes it only once the other is (about to be) without
    it: a worker announces its part done from inside this function (``signal``), and
    starts its next part :data:`SETTLE_NS` after it was given, the caller then on its way
    into its own kernel (ResNet50 at batch 1: 31.7 ms with both sides taking the GIL at
    once, 29.0 with neither)."""
    calls = _libc_calls()
    if calls is None:
        return None
    sched_yield, clock_gettime = calls

    add = fetch_add()
    monotonic = time.CLOCK_MONOTONIC
    ints = t.int64[::1]

    # compiled here, by the thread that creates the pool: Numba's first compilation in a
    # process, made by a worker while the caller compiled a kernel, deadlocked inside Numba
    # (its compiler lock against the lock of its lazily built target context)
    @njit([t.int64(ints)], nogil=True)
    def now(clock):  # pragma: no cover - compiled
        clock_gettime(monotonic, clock.ctypes.data)
        return clock[0] * 1_000_000_000 + clock[1]

    @njit([t.int64(ints, t.int64, t.int64, t.int64, t.int64, ints)], nogil=True)
    def spin(counters, i, seen, signal, settle, clock):  # pragma: no cover - compiled
        if signal >= 0:
            add(counters, signal, 1)  # atomic: the part's writes are visible before it
        end = now(clock) + SPIN_NS
        while True:
            while counters[i] == seen:  # the opaque calls make each test load it again
                if now(clock) > end:
                    return seen
                sched_yield()
            if i == 0 and add(counters, _KIND, 0) == _NATIVE:  # an atomic read: the
                seen = counters[0]  # offer's fields were written before its count
                if compare_swap(counters, _CLAIM, 0, 1) == 0:
                    call_native(counters[_TRAMPOLINE], counters[_BLOCK])
                    add(counters, _NATIVE_DONE, 1)
                end = now(clock) + SPIN_NS
                continue
            until = now(clock) + settle
            while now(clock) < until:
                sched_yield()
            if i != 0 or counters[2] != counters[0]:
                return seen
            seen = counters[0]  # the caller took that offer back: wait for the next one
            end = now(clock) + SPIN_NS

    return spin


@functools.cache
def _native_runner():
    """``run_parts(ctl, table, used, run)``, compiled without the GIL: runs the
    :class:`NativeCall` of row 0 of ``table`` (``(trampoline, block)`` rows), then, for each
    of the first ``used`` workers (rows of ``ctl``, each offered row ``k + 1``), claims its
    part back and runs it if the worker has not claimed it, else waits for the worker to end
    it; rows no worker was offered run here too. With ``run`` 0 it runs nothing and only
    settles the offers (after an interrupt).
    None where :func:`_spinner` is (no libc calls to poll with), and off x86: the caller
    publishes an offer by plain stores from Python (:meth:`_Worker.give_native`), whose
    order only x86's memory model (TSO) keeps for the worker reading them."""
    if _spinner() is None or platform.machine().lower() not in _TSO_MACHINES:
        return None
    sched_yield = _libc_calls()[0]
    add = fetch_add()

    @njit([t.void(t.int64[:, ::1], t.int64[:, ::1], t.int64, t.int64)], nogil=True)
    def run_parts(ctl, table, used, run):  # pragma: no cover - compiled
        if run:
            call_native(table[0, 0], table[0, 1])
            for k in range(used + 1, table.shape[0]):  # more parts than workers: a larger
                call_native(table[k, 0], table[k, 1])  # count was set after the pool started
        for k in range(used):
            c = ctl[k]
            before = compare_swap(c, _CLAIM, 0, 2)
            if before == 0:  # taken back before the worker claimed it
                if run:
                    call_native(table[k + 1, 0], table[k + 1, 1])
            elif before == 1:
                while add(c, _NATIVE_DONE, 0) == 0:
                    sched_yield()

    return run_parts


def _cpu_getter() -> Callable[[], int] | None:
    """libc's ``sched_getcpu`` (the CPU the calling thread is on; a vDSO call), or None where
    there is none or :envvar:`MGB_KERNEL_THREADS_FLOAT` is set (the workers are not pinned)."""
    if os.environ.get("MGB_KERNEL_THREADS_FLOAT") or not hasattr(os, "sched_setaffinity"):
        return None
    try:
        getcpu = ctypes.CDLL(None).sched_getcpu
    except (OSError, AttributeError, TypeError):
        return None
    getcpu.restype, getcpu.argtypes = ctypes.c_int, []
    return getcpu


@functools.cache
def _cpus() -> tuple[int, ...]:
    """The CPUs the process may run on, when its pool starts."""
    return tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else ()


_getcpu = _cpu_getter()

#: who ran an offered part: the value of its ``claims[0]`` (:class:`_Worker`)
_WORKER, _CALLER = "worker", "caller"

#: machines whose stores become visible in program order (x86's TSO), where native offers
#: run
_TSO_MACHINES = ("x86_64", "amd64", "i386", "i686")

#: a worker's counters (:class:`_Worker`): offers made (0), Python parts it ended (1), the
#: offer the caller took back last (2), then the last offer's kind, and a native offer's
#: trampoline, block, claim (0 open, 1 the worker's, 2 the caller's) and end (1 once ended)
_KIND, _TRAMPOLINE, _BLOCK, _CLAIM, _NATIVE_DONE = 3, 4, 5, 6, 7
_COUNTERS = 8
_PYTHON, _NATIVE = 0, 1


class _Worker:
    """A pool thread, given parts by one caller at a time.

    The caller offers a part as ``offer = (fn, lo, hi, claims)``, ``claims`` a new dict, and
    releases ``go`` unless a wake-up is still pending (the worker then reads this offer when
    it wakes). The side whose ``claims.setdefault(0, side)`` comes first runs the part: one
    C call under the GIL, so that claiming a part and recording who has it are a single step
    that no signal handler (a Ctrl-C's KeyboardInterrupt, run between bytecodes) can split.
    The worker releases ``done`` after each part it claimed and then sets ``claims[1]``; its
    exception goes to ``claims[2]``. The caller acquires ``done`` once for each part the
    worker claimed and for no other; a part the caller took back leaves the worker a
    wake-up that finds it claimed, after which the worker waits again without releasing
    ``done``. A wake-up may also find the very offer the worker claimed at its previous
    wake-up (the caller took an offer back and made the next one between the worker's
    wake-up and its read of ``offer``, so that one wake-up read the next offer early): the
    worker skips the offer it claimed last, as running it again would release ``done`` twice.

    ``counters`` (offers made, parts the worker ended, the offer the caller took back last)
    let either side poll a moment before
    it blocks on its lock (:func:`_spinner`); ``clocks`` are the worker's and the caller's
    buffers for the poll's clock; ``claimed`` (parts the worker claimed, written by the
    worker alone) is the count the caller's poll waits for. ``cpu`` is the one CPU the
    worker is pinned to (-1: not pinned; :meth:`keep_off`), ``index`` its place in the pool
    (workers spread over the CPUs their caller leaves them)."""

    def __init__(self, name: str, index: int = 0, counters: np.ndarray | None = None) -> None:
        self.index = index
        self.cpu = -1

        self.go = threading.Lock()
        self.go.acquire()
        self.done = threading.Lock()
        self.done.acquire()
        self.counters = np.zeros(_COUNTERS, np.int64) if counters is None else counters
        self.clocks = np.zeros((2, 2), np.int64)
        self.offer: tuple = (None, 0, 0, {0: _CALLER})  # nothing to claim yet
        self.claimed = 0
        thread = threading.Thread(target=self._serve, name=name, daemon=True)
        thread.start()
        self.tid = thread.native_id

    def keep_off(self, cpu: int) -> None:
        """Pin the worker to one of the process's CPUs other than ``cpu`` (its caller's), where
        it is pinned to ``cpu`` or not yet pinned; nothing where no other CPU is allowed.

        Why pinned: the worker sleeps on its lock or on the GIL, and the caller wakes it;
        the scheduler often woke it on the caller's core, and, its wake-ups short, left it
        there: it then waited for the GIL behind its caller, which took every part back,
        and MobileNetV2's calls ran at one thread's 7 ms instead of 4.5 ms, for seconds at a
        time. A pinned worker cannot follow its caller there; a caller that moves onto the
        worker's CPU moves the worker away at its next split (one system call)."""
        if cpu != self.cpu and self.cpu >= 0:
            return
        others = [c for c in _cpus() if c != cpu]
        if not others:
            return
        target = others[self.index % len(others)]
        try:
            os.sched_setaffinity(self.tid, {target})
        except OSError:  # the thread's CPUs restricted meanwhile (a cpuset): stay as it is
            return
        self.cpu = target

    def give(self, fn, lo: int, hi: int, claims: dict) -> None:
        """Offer the part ``fn(lo, hi)``, claimed through ``claims`` (see the class)."""
        self.offer = (fn, lo, hi, claims)
        self.counters[_KIND] = _PYTHON
        self.counters[0] += 1
        if self.go.locked():  # only this side releases it, so it stays locked until then
            self.go.release()

    def give_native(self, part: NativeCall) -> None:
        """Offer a part the worker runs from its compiled poll, never taking the GIL; the
        caller claims it back, or waits for its end, in ``run_parts`` (:func:`_native_runner`).
        A worker blocked on ``go`` wakes into Python once, and polls for it again."""
        c = self.counters
        c[_KIND], c[_TRAMPOLINE], c[_BLOCK] = _NATIVE, part.trampoline, part.block_addr
        # the end flag before the claim: a worker still polling after an offer taken back
        # may claim this one as soon as the claim is open, and end it before the count
        c[_NATIVE_DONE] = 0
        c[_CLAIM] = 0
        c[0] += 1  # last: the worker reads the fields once it sees the count change
        if self.go.locked():
            self.go.release()

    def join(self, spin) -> None:
        """Wait for the part the worker claimed last to end."""
        if spin is not None:
            spin(self.counters, 1, self.claimed - 1, -1, 0, self.clocks[1])
        self.done.acquire()

    def _serve(self) -> None:
        spin = _spinner()
        seen = 0  # offers made when the worker last looked
        signal = -1  # no part ended since it last polled
        last = None  # the claims of the part it ran last (kept: an id could be reused)
        while True:
            if spin is not None:
                # counts the part ended, then waits for the next offer, running native ones
                seen = spin(self.counters, 0, seen, signal, SETTLE_NS, self.clocks[0])
            self.go.acquire()
            if spin is not None and self.counters[_KIND] == _NATIVE:
                signal = -1  # woken for a native offer (or by one the poll ran): poll for it
                continue
            seen = int(self.counters[0])  # read before the offer: the caller writes it after
            fn, lo, hi, claims = self.offer
            if claims is last or claims.setdefault(0, _WORKER) is not _WORKER:
                signal = -1  # the caller took it back, or this worker ran it already
                continue
            last = claims
            self.claimed += 1
            try:
                fn(lo, hi)
            except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
                claims[2] = exc
            self.done.release()
            claims[1] = True
            if spin is None:
                self.counters[1] += 1
            signal = 1


_pool_lock = threading.Lock()  # creates the workers
#: ``{0: token}`` while one caller's parts run on the pool. Claimed by ``setdefault`` inside the
#: ``try`` that releases it: a KeyboardInterrupt raised right after a lock's ``acquire``
#: returned (Python runs signal handlers after a call) would leave the lock held for good, and
#: every later split would run unsplit
_claim: dict[int, object] = {}
_workers: list[_Worker] = []
_ctl: list[np.ndarray] = []  # the workers' counters as the rows of one array


def _settle(offers: list[tuple[_Worker, dict, tuple]]) -> None:
    """Leave the pool as a split found it after an exception or interrupt anywhere in its
    bookkeeping: claim every offered part no worker has begun (it never runs), wait for
    those a worker did begin to end, and take their ``done`` releases, whichever joins
    already took them. Idempotent, so a second interrupt just settles again; the exception
    itself is re-raised by the caller."""
    while True:
        try:
            for w, claims, _ in offers:
                if claims.setdefault(0, _CALLER) is _WORKER:
                    while 1 not in claims:  # set after ``done`` was released
                        time.sleep(1e-4)
                    w.done.acquire(blocking=False)
            return
        except BaseException:  # noqa: BLE001, S112 - a second Ctrl-C: settle to the end
            continue


def _pool() -> list[_Worker]:
    if _workers:  # every split's run comes here: no lock once the pool exists
        return _workers
    with _pool_lock:
        if not _workers:
            _spinner()  # compiled before any worker runs (see there)
            _cpus()
            n = num_threads() - 1
            ctl = np.zeros((max(n, 1), _COUNTERS), np.int64)  # the native runs' rows
            _workers.extend(_Worker(f"mgb-kernel_{i}", i, ctl[i]) for i in range(n))
            _ctl[:] = [ctl]
        return _workers


def _forget_pool() -> None:  # a forked child has none of the parent's threads
    _workers.clear()
    _ctl.clear()
    _claim.clear()
    _cpus.cache_clear()  # nor, perhaps, its CPUs


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

    Notes
    -----
    Once its own part is done, the caller runs the parts no pool thread has begun yet
    (:class:`_Worker` says how a part is claimed): a thread waking late (:data:`SETTLE_NS`
    after it was given its part at best, much later on a busy machine) then costs nothing
    but the offer, and a small split runs at one thread's speed instead of waiting. Parts
    taking their work from a shared counter (:func:`.conv.nchw8c.units_as_they_go`) find it
    done. A ``fn`` that is a compiled kernel bound by ``functools.partial`` (``lo`` and
    ``hi`` its last two arguments) has its parts run as C calls from its second run on
    (:func:`_native_after_first_run`).
    """
    bounds = ranges(n, num_threads(), min_items)
    if len(bounds) == 1:
        return functools.partial(fn, 0, n)
    python = _split_in_python(fn, bounds)
    if not isinstance(fn, functools.partial):
        return python
    calls = [functools.partial(fn, lo, hi) for lo, hi in bounds]
    return _native_after_first_run(python, functools.partial(_natively, calls))


def _native_after_first_run(python: Step, native: Callable[[], Step | None]) -> Step:
    """``python`` until its first run has compiled the kernels, then ``native()``'s step
    (None: ``python`` for good). ``python`` alone where :data:`NATIVE_PARTS` is off when the
    step is bound."""
    if not NATIVE_PARTS:
        return python

    def first() -> None:
        python()
        current[0] = native() or python

    current: list[Step] = [first]  # the step's body, replaced after its first run

    def step() -> None:
        current[0]()

    return step


def _split_in_python(fn: Callable[[int, int], object], bounds: list[tuple[int, int]]) -> Step:
    """The step of :func:`split` handing the pool threads ``fn`` and their ``bounds`` as
    Python calls (:meth:`_Worker.give`)."""
    head, rest = bounds[0], bounds[1:]

    def run() -> None:
        used = _pool()[: len(rest)]
        token = object()
        offers: list[tuple[_Worker, dict, tuple]] = []
        try:
            if _claim.setdefault(0, token) is not token:  # the pool runs another's parts
                for lo, hi in bounds:
                    fn(lo, hi)
                return
            try:
                here = _getcpu() if _getcpu is not None else -1
                for w, part in zip(used, rest):
                    if here >= 0:
                        w.keep_off(here)
                    claims: dict = {}
                    offers.append((w, claims, part))  # before the worker can claim it
                    w.give(fn, *part, claims)
                fn(*head)
                for lo, hi in rest[len(used) :]:  # more parts than workers: a larger count
                    fn(lo, hi)  # was set after the pool started
                for w, claims, part in offers:  # the parts no worker has begun run here
                    if claims.setdefault(0, _CALLER) is _CALLER:
                        w.counters[2] = w.counters[0]  # its poll need not wake for it
                        fn(*part)
                spin = _spinner()
                for w, claims, _ in offers:
                    if claims[0] is _WORKER:
                        w.join(spin)
            except BaseException:
                _settle(offers)  # the parts begun still end before we go
                raise
        finally:
            if 0 in _claim and _claim[0] is token:  # no call in between: no signal handler
                del _claim[0]
        for _, claims, _ in offers:
            if 2 in claims:
                raise claims[2]

    return run


def ranges(n: int, parts: int, min_items: int = 1) -> list[tuple[int, int]]:
    """``[0, n)`` as at most ``parts`` contiguous ``(lo, hi)`` ranges of at least
    ``min_items`` items each (a single range when that allows no more)."""
    parts = max(1, min(parts, n // max(1, min_items)))
    return [(n * k // parts, n * (k + 1) // parts) for k in range(parts)]


def concurrently(calls: Sequence[Callable[[], None]]) -> Step:
    """A step running ``calls`` (GIL-free kernels writing disjoint memory, each with its own
    scratch) at once through :func:`split`'s pool; the call itself when there is one.
    Calls of compiled kernels bound to their arguments run on the pool threads as C calls
    (:func:`_native_after_first_run`)."""
    if len(calls) == 1:
        return calls[0]

    def run(lo: int, hi: int) -> None:
        for k in range(lo, hi):
            calls[k]()

    return _native_after_first_run(split(run, len(calls), 1), functools.partial(_natively, calls))


def _natively(calls: Sequence[Callable[[], None]]) -> Step | None:
    """The step handing the pool threads ``calls`` (one each, the first the caller's) as C
    calls (:func:`_native_split`), which they run and end without the GIL; None unless every
    call is a compiled kernel bound to its arguments (:func:`.native_call.native_call`)."""
    if len(calls) > num_threads():
        return None
    parts = [native_call(c) for c in calls]
    runner = _native_runner() if all(p is not None for p in parts) else None
    return None if runner is None else _native_split(parts, calls, runner)


def _native_split(parts: list[NativeCall], calls: Sequence[Callable[[], None]],
                  run_parts) -> Step:  # fmt: skip
    """The step running ``parts`` (``calls`` as :class:`NativeCall`) on the caller and the
    pool's first ``len(parts) - 1`` workers: :meth:`_Worker.give_native` offers, then one
    compiled call runs the caller's part and claims back or waits for the others. A split
    started while another holds the pool runs every call here, as :func:`split`'s does."""
    table = np.array([[p.trampoline, p.block_addr] for p in parts], np.int64)
    rest = parts[1:]

    def run() -> None:
        token = object()
        try:
            if _claim.setdefault(0, token) is not token:
                for c in calls:
                    c()
                return
            used = _pool()[: len(rest)]
            ctl = _ctl[0]
            given = 0
            try:
                here = _getcpu() if _getcpu is not None else -1
                for w, part in zip(used, rest):
                    if here >= 0:
                        w.keep_off(here)
                    given += 1  # first: an interrupt in the offer still settles it
                    w.give_native(part)
                run_parts(ctl, table, given, 1)
            except BaseException:
                run_parts(ctl, table, given, 0)  # no part left running once we raise
                raise
        finally:
            if 0 in _claim and _claim[0] is token:
                del _claim[0]

    run.parts = parts  # keeps the blocks (and the bound arrays) with the step
    return run


_blas_lock = threading.Lock()
_blas_users = 0
_blas_saved: list[int] = []


def _openblas_calls(lib) -> tuple | None:
    """OpenBLAS's own thread-count getter and setter (its pthreads build), called directly:
    threadpoolctl lets only the first thread that set a limit set one again (the executor's
    worker threads would silently change nothing), and its call took ~8 us."""
    if lib.internal_api != "openblas" or getattr(lib, "threading_layer", "") == "openmp":
        return None
    dl = ctypes.CDLL(lib.filepath)
    for prefix, suffix in itertools.product(("", "scipy_"), ("", "64_", "_64")):
        get = getattr(dl, f"{prefix}openblas_get_num_threads{suffix}", None)
        put = getattr(dl, f"{prefix}openblas_set_num_threads{suffix}", None)
        if get is not None and put is not None:
            get.restype, get.argtypes = ctypes.c_int, []
            put.restype, put.argtypes = None, [ctypes.c_int]
            return get, put
    return None


@functools.cache
def _blas_libs() -> tuple:
    """``(get_num_threads, set_num_threads)`` of each BLAS library loaded at the first call
    (NumPy's, whose GEMMs the kernels call), found by ``threadpoolctl``."""
    libs = ThreadpoolController().select(user_api="blas").lib_controllers
    return tuple(_openblas_calls(lib) or (lib.get_num_threads, lib.set_num_threads)
                 for lib in libs)  # fmt: skip


def blas_thread_counts() -> list[int]:
    """The thread count of each BLAS library :func:`blas_single_threaded` sets."""
    return [get() for get, _ in _blas_libs()]


def can_single_thread_blas() -> bool:
    """Whether :func:`blas_single_threaded` can set the BLAS thread count (``threadpoolctl``
    is installed and finds the BLAS library)."""
    return bool(_blas_libs())


class _BlasSingleThreaded:
    """The context manager :func:`blas_single_threaded` returns (a class: entering and
    leaving cost ~2 us, a third of a generator-based one's)."""

    __slots__ = ()

    def __enter__(self) -> None:
        global _blas_users, _blas_saved
        libs = _blas_libs()
        if not libs:
            return
        with _blas_lock:
            if _blas_users == 0:
                _blas_saved = [get() for get, _ in libs]
                for _, put in libs:
                    put(1)
            _blas_users += 1

    def __exit__(self, *exc) -> None:
        global _blas_users
        libs = _blas_libs()
        if not libs:
            return
        with _blas_lock:
            _blas_users -= 1
            if _blas_users == 0:
                for (_, put), n in zip(libs, _blas_saved):
                    put(n)


_BLAS_SINGLE = _BlasSingleThreaded()


def blas_single_threaded() -> _BlasSingleThreaded:
    """A context manager running its block with BLAS at one thread, so that several threads
    of a split kernel can each call BLAS on their own part (a BLAS call from a thread then
    runs on that thread, and OpenBLAS's threaded GEMMs, which serialize on one lock, are not
    entered).

    The thread count is process-wide: a GEMM another thread starts meanwhile runs
    single-threaded too (its result is the same). Nested and concurrent blocks are counted:
    the count is restored when the last one ends. Without ``threadpoolctl`` nothing changes.
    """
    num_threads()  # measured before it is lowered
    return _BLAS_SINGLE


def concurrently_blas_single_threaded(calls: Sequence[Callable[[], None]]) -> Step:
    """:func:`concurrently`, with BLAS single-threaded (:func:`blas_single_threaded`): each
    call's GEMMs run on its own thread, never on BLAS's threads (a single call too)."""
    run = concurrently(calls)
    if not can_single_thread_blas():
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

    return _native_after_first_run(run, functools.partial(_taking_natively, table))


def _taking_natively(table: Sequence[Sequence[Callable[[], None]]]) -> Step | None:
    """:func:`take_in_turn`'s step with every item a C call (:func:`_native_taker`), each
    thread's loop taking them itself a C call of :func:`_natively`'s; None unless every item
    is a compiled kernel bound to its arguments."""
    items = [[native_call(c) for c in row] for row in table]
    if not all(p is not None for row in items for p in row):
        return None
    counter = np.zeros(1, np.int64)
    take = _native_taker()
    rows = [np.array([[p.trampoline, p.block_addr] for p in row], np.int64) for row in items]
    loops = _natively([functools.partial(take, r, counter) for r in rows])
    if loops is None:
        return None

    def run() -> None:
        counter[0] = 0
        loops()

    run.items = items  # keeps the blocks (and the bound arrays) with the step
    return run


@functools.cache
def _native_taker():
    """``take(items, counter)``, compiled without the GIL: runs the :class:`NativeCall`
    rows ``(trampoline, block)`` of ``items`` whose indices it takes from ``counter[0]`` by
    atomic increments, until none is left."""
    add = fetch_add()

    @njit([t.void(t.int64[:, ::1], t.int64[::1])], nogil=True)
    def take(items, counter):  # pragma: no cover - compiled
        while True:
            i = add(counter, 0, 1)
            if i >= items.shape[0]:
                return
            call_native(items[i, 0], items[i, 1])

    return take
