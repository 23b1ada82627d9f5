"""The MPI side of the collective operators: lazy mpi4py import, one communicator per key,
the communication comp node, the abort-on-error hook and the collective watchdog."""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
import traceback
import zlib
from collections.abc import Mapping

from ..errors import MegBrainError

__all__ = [
    "COMM_STREAM",
    "COMM_TIMEOUT",
    "STATS",
    "THREAD_STATS",
    "comm_comp_node",
    "get_comm",
    "group_barrier",
    "install_abort_on_error",
    "is_distributed",
    "local_ranks",
    "mpi",
    "reset_stats",
    "wait",
    "wait_policy",
    "watch",
    "world_rank",
    "world_size",
]

#: the stream of the comp node collectives run on by default (``cpu0:0`` -> ``cpu0:1024``):
#: a node of its own, whose worker thread the executor overlaps with computation
COMM_STREAM = 1024

#: seconds a collective may wait for its peers before the watchdog aborts the whole job
COMM_TIMEOUT = float(os.environ.get("MGB_COMM_TIMEOUT", "50"))

_MPI = None
_clock = time.monotonic
_comms: dict[str, object] = {}
_lock = threading.Lock()


def mpi():
    """mpi4py's ``MPI`` module, imported (and MPI initialised) on first use.

    mpi4py initialises MPI with ``MPI_THREAD_MULTIPLE`` (its default ``rc.thread_level``),
    which the collectives need: they run on the communication comp node's worker thread
    while the caller's thread may call MPI too. mpi4py releases the GIL during transfers.

    Raises
    ------
    MegBrainError
        When mpi4py is not installed (``pip install megbrain[distributed]``) or MPI was
        initialised with a lower thread level.
    """
    global _MPI
    if _MPI is None:
        try:
            from mpi4py import MPI
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise MegBrainError(
                "distributed operators need mpi4py and an MPI library: "
                "pip install 'megbrain[distributed]' and run under mpiexec"
            ) from exc
        if COMM_WAIT not in WAIT_POLICIES:
            raise MegBrainError(
                f"MGB_COMM_WAIT={COMM_WAIT!r}: expected one of {', '.join(WAIT_POLICIES)}"
            )
        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            raise MegBrainError(
                "MPI was initialised without MPI_THREAD_MULTIPLE; collectives run on their "
                "own thread (leave mpi4py.rc.thread_level at 'multiple')"
            )
        _MPI = MPI
    return _MPI


def is_distributed() -> bool:
    """Whether this process is one of several MPI processes (without importing mpi4py when
    no MPI launcher set the environment)."""
    if _MPI is None and not any(
        k in os.environ for k in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "PMI_SIZE")
    ):
        return False
    try:
        return mpi().COMM_WORLD.Get_size() > 1
    except MegBrainError:
        return False


def world_rank() -> int:
    """This process's rank in ``MPI.COMM_WORLD``."""
    return mpi().COMM_WORLD.Get_rank()


def world_size() -> int:
    """The number of processes of the MPI job."""
    return mpi().COMM_WORLD.Get_size()


def get_comm(key: str, nr_devices: int, rank: int, what: str = "collective_comm"):
    """The communicator of ``key``, split from ``COMM_WORLD`` on its first use.

    Every process of the job takes part in the split; ``rank`` orders the new communicator,
    whose size must be ``nr_devices``. The first uses of different keys need not come in the
    same order on every rank: a function's collectives run on several comp nodes' threads,
    whose order differs between ranks. The keys wanted by this process's threads are agreed
    on in rounds (:func:`_creation_round`), so every rank splits the same keys in the same
    order whichever thread asked first.

    Raises
    ------
    MegBrainError
        When ``nr_devices`` or ``rank`` disagree with the communicator (on every rank, so
        none is left waiting).
    """
    with _lock:
        comm = _comms.get(key)
        if comm is None:
            _pending.setdefault(key, (int(nr_devices), int(rank), what))
    while comm is None:
        with _round_lock:  # one thread per process runs the rounds
            with _lock:
                comm = _comms.get(key)
                err = _failed.pop(key, None)
                wanted = dict(_pending)
            if err is not None:
                raise err
            if comm is None and not _creation_round(wanted):
                time.sleep(_ROUND_BACKOFF_S)  # let this process's other threads add keys
    if comm.Get_size() != nr_devices or comm.Get_rank() != rank:
        raise MegBrainError(
            f"{what} key={key!r}: nr_devices={nr_devices}, rank={rank} disagree with the "
            f"key's communicator (size {comm.Get_size()}, rank {comm.Get_rank()})"
        )
    return comm


#: seconds a creation round that made nothing waits before the next one
_ROUND_BACKOFF_S = 1e-4
#: key -> (nr_devices, rank, what) of the communicators this process's threads wait for
_pending: dict[str, tuple[int, int, str]] = {}
#: key -> the error its creation raised on every rank (its threads re-raise it)
_failed: dict[str, MegBrainError] = {}
_round_lock = threading.Lock()


def _creation_round(wanted: dict[str, tuple[int, int, str]]) -> bool:
    """One round of communicator creation, a collective of every rank: gather the keys each
    rank waits for, then split ``COMM_WORLD`` for the keys every rank waits for, in sorted
    order. Keys some rank does not want yet wait for a later round. Returns whether a key
    was settled (made, or failed on every rank alike)."""
    world = mpi().COMM_WORLD
    names = ", ".join(sorted(wanted)) or "none"
    with watch(f"{next(iter(wanted.values()))[2]}: creating the communicators of {names}"):
        everyone = world.allgather(sorted(wanted.items()))
    common = set.intersection(*(set(k for k, _ in lst) for lst in everyone))
    for key in sorted(common):
        infos = [dict(lst)[key][:2] for lst in everyone]
        what = wanted[key][2]
        sizes = {n for n, _ in infos}
        ranks = sorted(r for _, r in infos)
        if len(sizes) != 1 or sizes != {len(infos)} or ranks != list(range(len(infos))):
            err = MegBrainError(
                f"{what} key={key!r}: (nr_devices, rank) of the world ranks are {infos}; "
                f"every one of the {len(infos)} MPI processes must take part with "
                f"nr_devices={len(infos)} and a distinct rank in 0..{len(infos) - 1}"
            )
            with _lock:
                _failed[key] = err
                del _pending[key]
            continue
        color = zlib.crc32(key.encode()) & 0x7FFFFFFF
        with watch(f"{what} key={key!r}: splitting COMM_WORLD"):
            comm = world.Split(color, wanted[key][1])
        with _lock:
            _comms[key] = comm
            del _pending[key]
    return bool(common)


def comm_comp_node(cn):
    """The comp node collectives reading from ``cn`` run on: ``cn``'s device, stream
    :data:`COMM_STREAM`."""
    from ..device import CompNode

    cn = CompNode.load(cn)
    type_, dev, _ = cn.locator_logical
    from ..device.comp_node import locator_to_str

    if dev < 0:  # cpu:default or an unspecified device: the first CPU
        return CompNode.load(f"cpu0:{COMM_STREAM}")
    return CompNode.load(locator_to_str((type_, dev, COMM_STREAM)))


def group_barrier() -> None:
    """Wait for every process of the MPI job (``MPI.COMM_WORLD.Ibarrier``, completed as a
    wait for the peers, see :func:`wait_policy`)."""
    req = mpi().COMM_WORLD.Ibarrier()
    with watch("group_barrier") as w:
        w.wait_peers(req)


# ---- failing ranks end the job ------------------------------------------------------------
class _ThreadRecord:
    """One thread's watched MPI calls: the one it is in (``t0`` > 0, started then, doing
    ``what``), read by the watchdog, and its totals. Written only by its thread, so a
    watched call takes no lock (the watchdog and :data:`STATS` only read)."""

    __slots__ = ("name", "t0", "what", "comm_s", "peers_s", "calls")

    def __init__(self, name: str):
        self.name = name
        self.t0 = 0.0
        self.what = ""
        self.comm_s = self.peers_s = 0.0
        self.calls = 0


_records: list[_ThreadRecord] = []  # every thread's that made a watched call (append only)
_records_lock = threading.Lock()
_local = threading.local()
_watchdog: threading.Thread | None = None


def _record() -> _ThreadRecord:
    """The calling thread's record, made (and the watchdog started) on its first call."""
    rec = _ThreadRecord(threading.current_thread().name)
    with _records_lock:
        _records.append(rec)
    _local.rec = rec
    if _watchdog is None:
        _start_watchdog()
    return rec


class _Stats(Mapping):
    """Totals of the watched MPI calls of this process, summed over its threads' records
    when read: ``comm_s`` (seconds in them), ``peers_s`` (the part spent waiting for the
    other ranks to join), ``calls``."""

    _keys = ("comm_s", "peers_s", "calls")

    def __getitem__(self, key):
        if key not in self._keys:
            raise KeyError(key)
        return sum(getattr(r, key) for r in list(_records))

    def __iter__(self):
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


class _ThreadStats(Mapping):
    """Seconds in watched MPI calls by thread name (the computation's or the communication
    node's worker)."""

    def _totals(self) -> dict:
        out: dict[str, float] = {}
        for r in list(_records):
            out[r.name] = out.get(r.name, 0.0) + r.comm_s
        return out

    def __getitem__(self, key):
        return self._totals()[key]

    def __iter__(self):
        return iter(self._totals())

    def __len__(self) -> int:
        return len(self._totals())


#: seconds spent in (and number of) watched MPI calls of this process (``comm_s``), and the
#: part of it spent waiting for the other ranks to join (``peers_s``); read by benchmarks,
#: reset by :func:`reset_stats`
STATS = _Stats()
#: seconds in watched MPI calls by thread name, reset with :data:`STATS`
THREAD_STATS = _ThreadStats()


def reset_stats() -> None:
    """Zero :data:`STATS` (call it while no collective runs)."""
    for r in list(_records):
        r.comm_s = r.peers_s = 0.0
        r.calls = 0


def _abort(msg: str, code: int = 1) -> None:
    try:
        rank = _MPI.COMM_WORLD.Get_rank() if _MPI is not None else "?"
    except Exception:  # noqa: BLE001 - reporting must not fail
        rank = "?"
    sys.stderr.write(f"[megbrain rank {rank}] {msg}; aborting the MPI job\n")
    sys.stderr.flush()
    # let mpiexec forward the message before Abort makes it kill every process
    time.sleep(1.0)
    if _MPI is not None:
        _MPI.COMM_WORLD.Abort(code)
    os._exit(code)  # pragma: no cover - Abort does not return


def _late(now: float) -> tuple[str, float] | None:
    """(what, seconds waited) of a watched call waiting longer than :data:`COMM_TIMEOUT`."""
    for r in list(_records):
        t0, what = r.t0, r.what
        if t0 > 0.0 and now - t0 > COMM_TIMEOUT:
            return what, now - t0
    return None


def _watch_loop() -> None:
    while True:
        time.sleep(min(1.0, COMM_TIMEOUT / 4))
        late = _late(_clock())
        if late is not None:
            _abort(f"{late[0]}: no answer from the other ranks for {late[1]:.0f} s "
                   f"(MGB_COMM_TIMEOUT={COMM_TIMEOUT:g})")


class _Watch:
    """A watched blocking MPI call (a context manager, reusable, not by two threads at
    once): while it runs, the thread's record names it to the watchdog; its time is added
    to :data:`STATS`. :meth:`exchange`, :meth:`wait_peers` and :meth:`wait` complete
    collectives and requests as :data:`COMM_WAIT` says, keeping the time spent waiting for
    the other ranks apart from the transfer's. Entering and leaving cost well under a
    microsecond (no lock, no dict): a 64 KB all-reduce takes ~40 us."""

    __slots__ = ("what", "peers_s", "rec", "prev")

    def __init__(self, what: str):
        self.what = what
        self.peers_s = 0.0

    def __enter__(self) -> _Watch:
        try:
            rec = _local.rec
        except AttributeError:
            rec = _record()
        self.rec = rec
        self.prev = (rec.t0, rec.what) if rec.t0 else None  # a watch inside a watch
        self.peers_s = 0.0
        rec.what = self.what
        rec.t0 = _clock()
        return self

    def __exit__(self, *exc) -> None:
        rec = self.rec
        rec.comm_s += _clock() - rec.t0
        rec.peers_s += self.peers_s
        rec.calls += 1
        prev = self.prev
        if prev is None:
            rec.t0 = 0.0
        else:
            rec.t0, rec.what = prev

    def exchange(self, comm, mine, infos) -> None:
        """Gather every rank's ``mine`` into ``infos`` (the header exchange, completed once
        every rank has joined): MPI's blocking Allgather under the ``busy`` policy (it
        polls, as Wait would, without a request's overhead), else an Iallgather completed
        by :meth:`wait_peers`. Its time counts as waiting for the peers."""
        if wait_policy() == "busy":
            t0 = _clock()
            comm.Allgather(mine, infos)
            self.peers_s += _clock() - t0
        else:
            self.wait_peers(comm.Iallgather(mine, infos))

    def wait_peers(self, req) -> None:
        """Complete ``req``, a request that completes once every rank has joined (the header
        exchange): without spinning a core unless :func:`wait_policy` is ``busy``."""
        t0 = time.perf_counter()
        if wait_policy() == "busy":
            req.Wait()
        elif not req.Test():
            _sleep_until(req, t0)
        self.peers_s += time.perf_counter() - t0

    @staticmethod
    def wait(req, nbytes: int | None = None) -> None:
        """Complete ``req``, a transfer of ``nbytes`` whose peers have all joined: MPI's own
        Wait (it polls at full speed, only while the data moves; a peer still asleep in its
        wait for the peers costs at most that sleep, see :func:`_sleep_until`), or, for
        transfers of at most :data:`SMALL_BYTES` (done in a few polls) under ``poll``, and
        with ``yield``, polls and sleeps."""
        policy = wait_policy()
        if policy == "yield" or (
            policy == "poll" and nbytes is not None and nbytes <= SMALL_BYTES
        ):
            if not req.Test():
                _sleep_until(req, time.perf_counter(), TRANSFER_SPIN_S)
        else:
            req.Wait()


def _sleep_until(req, t0: float, spin: float | None = None) -> None:
    """Poll ``req`` with MPI's Test, sleeping between tests: back-to-back for the first
    ``spin`` seconds (default :data:`SPIN_S`: a peer that is about to arrive;
    :data:`TRANSFER_SPIN_S` for a transfer whose peers are all there, which moves only
    while the ranks poll), then sleeps doubling from
    20 us to :data:`SHORT_SLEEP_S`, and in a long wait to :data:`LATE_SLEEP_FRACTION` of
    the time waited so far, at most :data:`MAX_SLEEP_S` (a late peer costs at most that
    share of latency and no core; a rank idle in a barrier wakes a few hundred times a
    second, not 5000, each wake-up taking the core from whatever computes on it).

    While it sleeps, the thread's timer slack is :data:`TIMER_SLACK_NS` (restored after):
    Linux's default 50 us slack made a 20 us sleep last 75-105 us, which a peer arriving
    during the sleep waited for."""
    test, sleep, clock = req.Test, time.sleep, time.perf_counter
    t_spin = t0 + (SPIN_S if spin is None else spin)
    while clock() < t_spin:
        if test():
            return
    prev = _timer_slack(TIMER_SLACK_NS)
    try:
        dt = 20e-6
        while not test():
            sleep(dt)
            if dt < MAX_SLEEP_S:
                cap = max(SHORT_SLEEP_S, (clock() - t0) * LATE_SLEEP_FRACTION)
                dt = min(2 * dt, cap, MAX_SLEEP_S)
    finally:
        if prev is not None:
            _timer_slack(prev)


_prctl = None


def _timer_slack(ns: int) -> int | None:
    """Set the calling thread's timer slack to ``ns`` nanoseconds (Linux ``prctl``); return
    the previous value, or None where it can not be set (then nothing changed)."""
    global _prctl
    if _prctl is None:
        _prctl = False
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                _prctl = ctypes.CDLL(None, use_errno=True).prctl
                _prctl.restype = ctypes.c_int
                _prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong,
                                   ctypes.c_ulong, ctypes.c_ulong]
            except (OSError, AttributeError):  # pragma: no cover - no prctl in this libc
                _prctl = False
    if not _prctl:
        return None
    prev = _prctl(_PR_GET_TIMERSLACK, 0, 0, 0, 0)
    if prev < 0 or _prctl(_PR_SET_TIMERSLACK, int(ns), 0, 0, 0) != 0:
        return None
    return prev


_PR_SET_TIMERSLACK, _PR_GET_TIMERSLACK = 29, 30


def _start_watchdog() -> None:
    global _watchdog
    with _records_lock:
        if _watchdog is None:
            _watchdog = threading.Thread(target=_watch_loop, name="mgb-comm-watchdog",
                                         daemon=True)
            _watchdog.start()


def watch(what: str) -> _Watch:
    """Run a blocking MPI call under the watchdog (``with watch(what) as w:``): waiting
    longer than :data:`COMM_TIMEOUT` seconds prints ``what`` with this rank and aborts the
    whole job. ``w.wait_peers(req)`` / ``w.wait(req)`` complete requests."""
    return _Watch(what)


#: how collectives wait, environment ``MGB_COMM_WAIT``: ``busy`` (MPI's Wait throughout: a
#: waiting rank polls its core, the lowest latency when each rank has a core of its own),
#: ``poll`` (the other ranks' arrival, i.e. the header exchange, and small transfers by Test
#: and growing sleeps, which leave the core to whatever else computes on it; larger
#: transfers by MPI's Wait), ``yield`` (Test and sleeps throughout), or ``auto`` (default):
#: ``busy`` unless this node runs more ranks than the process may use CPUs, then ``poll``
#: (as Open MPI yields when idle only when oversubscribed); see :func:`wait_policy`
COMM_WAIT = os.environ.get("MGB_COMM_WAIT", "auto")
WAIT_POLICIES = ("auto", "busy", "poll", "yield")


def local_ranks() -> int:
    """The number of ranks on this node: the launcher's count (MPICH's ``MPI_LOCALNRANKS``,
    Open MPI's ``OMPI_COMM_WORLD_LOCAL_SIZE``), else the size of ``COMM_WORLD`` (as if the
    whole job ran here)."""
    for var in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        v = os.environ.get(var, "")
        if v.isdigit():
            return int(v)
    return mpi().COMM_WORLD.Get_size()


@functools.cache
def wait_policy() -> str:
    """The wait :data:`COMM_WAIT` selects, ``auto`` resolved: ``busy`` while
    :func:`local_ranks` is at most the CPUs this process may run on, else ``poll``.

    Measured on 2 cores, 2 ranks of the digits CNN (idle machine): ``busy`` 1.9-2.1x one
    rank's samples/s, ``poll`` 1.35-1.7x (a waiting rank's sleeps delay the transfers that
    need both ranks' polls). With more ranks than cores a polling rank takes a core from a
    computing one, which ``poll`` leaves alone."""
    if COMM_WAIT != "auto":
        return COMM_WAIT
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return "busy" if local_ranks() <= (cpus or 1) else "poll"
#: seconds a wait polls back to back before it starts sleeping (a peer about to arrive);
#: environment ``MGB_COMM_SPIN_US``, in microseconds
SPIN_S = float(os.environ.get("MGB_COMM_SPIN_US", "50")) * 1e-6
#: seconds a small transfer's wait (its peers all arrived) polls back to back before it
#: sleeps: MPICH moves a 64 KB all-reduce in several steps, each needing both ranks' polls,
#: so a sleep in the middle of it adds its length to the transfer
TRANSFER_SPIN_S = 200e-6
#: the longest sleep between two polls while a wait is young (the latency a peer arriving
#: soon adds at most)
SHORT_SLEEP_S = 200e-6
#: in a longer wait, sleeps grow to this share of the time waited so far ...
LATE_SLEEP_FRACTION = 1 / 8
#: ... up to this many seconds
MAX_SLEEP_S = 5e-3
#: the timer slack (ns) of a thread sleeping between polls (how late a sleep may end)
TIMER_SLACK_NS = 1000
#: transfers up to this size complete in a few polls: waited for like the peers (MPI's Wait
#: would spin while a peer sleeps between its polls)
SMALL_BYTES = 256 << 10


#: complete the MPI request of a transfer as :data:`COMM_WAIT` says
wait = _Watch.wait


def install_abort_on_error() -> None:
    """Make an uncaught exception on this rank end the whole MPI job.

    The hook prints the traceback prefixed by the rank, then calls
    ``MPI.COMM_WORLD.Abort(1)``: mpiexec ends every process with a non-zero exit, instead
    of leaving the other ranks waiting in a collective. Exceptions in threads too.
    """
    mpi()
    prev = sys.excepthook

    def hook(tp, val, tb):
        if issubclass(tp, KeyboardInterrupt):
            prev(tp, val, tb)
        text = "".join(traceback.format_exception(tp, val, tb))
        _abort(f"uncaught exception:\n{text.rstrip()}")

    def thread_hook(args):
        hook(args.exc_type, args.exc_value, args.exc_traceback)

    sys.excepthook = hook
    threading.excepthook = thread_hook
