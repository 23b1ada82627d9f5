"""The kernel pool: every part runs once, errors reach the caller, concurrent and nested
splits neither deadlock nor lose parts."""

import os
import threading
import time

import numpy as np
import pytest

from megbrain.kernels import parallel


@pytest.fixture
def two_threads(monkeypatch):
    monkeypatch.setattr(parallel, "num_threads", lambda: 2)
    parallel._forget_pool()  # workers for this count
    yield
    parallel._forget_pool()


def _marking(out: np.ndarray, names: list | None = None):
    def fn(lo: int, hi: int) -> None:
        out[lo:hi] += 1
        if names is not None:
            names.append(threading.current_thread().name)

    return fn


def _meeting(out: np.ndarray, names: list):
    """``_marking`` whose first part (the caller's own) ends only once another part has
    run: the pool thread then always runs its part, as the caller cannot take it back."""
    met = threading.Event()
    mark = _marking(out, names)

    def fn(lo: int, hi: int) -> None:
        if lo == 0:
            assert met.wait(30), "no pool thread ran a part"
            met.clear()
        mark(lo, hi)
        if lo > 0:
            met.set()

    return fn


def test_each_item_runs_once_on_two_threads(two_threads):
    out = np.zeros(100, np.int64)
    names: list = []
    step = parallel.split(_meeting(out, names), 100, 1)
    for _ in range(3):
        step()
    assert np.all(out == 3)
    assert len(set(names)) == 2  # the caller and a worker
    step = parallel.split(_marking(out), 100, 1)  # whoever runs the worker's part
    for _ in range(200):
        step()
    assert np.all(out == 203)


def _in_thread(step, timeout: float = 30) -> None:
    """Run ``step`` on a thread and fail, instead of hanging, if it does not return."""
    errors: list = []

    def run() -> None:
        try:
            step()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "the split did not return"
    if errors:
        raise errors[0]


def test_a_part_no_worker_has_begun_runs_on_the_caller_without_waiting(two_threads):
    (w,) = parallel._pool()
    time.sleep(0.05)  # past its poll: the worker sleeps on its ``go`` lock
    asleep, w.go = w.go, threading.Lock()  # a worker that never wakes
    w.go.acquire()
    try:
        out = np.zeros(100, np.int64)
        names: list = []
        _in_thread(parallel.split(_marking(out, names), 100, 1))
        assert np.all(out == 1) and len(set(names)) == 1  # both parts on the caller
    finally:
        w.go = asleep
    out = np.zeros(100, np.int64)
    names = []
    step = parallel.split(_meeting(out, names), 100, 1)
    # the worker, woken for a part taken back, takes the next
    _in_thread(lambda: [step() for _ in range(3)])
    assert np.all(out == 3) and len(set(names)) == 2


def test_a_workers_exception_reaches_the_caller_and_the_pool_recovers(two_threads):
    def fn(lo: int, hi: int) -> None:
        if lo > 0:
            raise ValueError("part failed")

    with pytest.raises(ValueError, match="part failed"):
        parallel.split(fn, 10, 1)()
    out = np.zeros(10, np.int64)
    parallel.split(_marking(out), 10, 1)()
    assert np.all(out == 1)


def test_more_parts_than_workers_all_run(monkeypatch):
    monkeypatch.setattr(parallel, "num_threads", lambda: 2)
    parallel._forget_pool()
    parallel.split(lambda lo, hi: None, 2, 1)()  # a pool of one worker
    monkeypatch.setattr(parallel, "num_threads", lambda: 4)  # the count grew after
    out = np.zeros(40, np.int64)
    parallel.split(_marking(out), 40, 1)()
    assert np.all(out == 1)
    parallel._forget_pool()


def test_nested_and_concurrent_splits_complete(two_threads):
    inner_out = np.zeros((8, 50), np.int64)

    def outer(lo: int, hi: int) -> None:
        for i in range(lo, hi):  # a part that splits again runs its parts itself
            parallel.split(_marking(inner_out[i]), 50, 1)()

    parallel.split(outer, 8, 1)()
    assert np.all(inner_out == 1)

    outs = [np.zeros(1000, np.int64) for _ in range(4)]
    steps = [parallel.split(_marking(o), 1000, 1) for o in outs]

    def caller(step) -> None:
        for _ in range(50):
            step()

    threads = [threading.Thread(target=caller, args=(s,)) for s in steps]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert all(np.all(o == 50) for o in outs)


def test_a_workers_error_is_not_left_for_the_next_run_when_the_caller_also_failed(two_threads):
    def both_fail(lo: int, hi: int) -> None:
        raise ValueError("caller's part" if lo == 0 else "worker's part")

    with pytest.raises(ValueError, match="caller's part"):
        parallel.split(both_fail, 10, 1)()
    out = np.zeros(10, np.int64)
    parallel.split(_marking(out), 10, 1)()  # raised the worker's stale error before
    assert np.all(out == 1)


class _InterruptedRightAfterClaiming(dict):
    """The pool's claim, with a Ctrl-C whose handler runs as soon as the claiming call
    returns (Python runs signal handlers after calls)."""

    def setdefault(self, key, value):
        super().setdefault(key, value)
        raise KeyboardInterrupt


def test_an_interrupt_right_after_claiming_the_pool_leaves_it_free(two_threads, monkeypatch):
    claim = _InterruptedRightAfterClaiming()
    monkeypatch.setattr(parallel, "_claim", claim)
    out = np.zeros(100, np.int64)
    with pytest.raises(KeyboardInterrupt):
        parallel.split(_marking(out), 100, 1)()
    assert not claim  # released: later splits still use the workers
    monkeypatch.setattr(parallel, "_claim", {})
    names: list = []
    parallel.split(_meeting(out, names), 100, 1)()
    assert np.all(out == 1) and len(set(names)) == 2


def _interrupting_join(when: str):
    join = parallel._Worker.join

    def interrupted(self, spin) -> None:
        if when == "after":
            join(self, spin)
        raise KeyboardInterrupt

    return interrupted


@pytest.mark.parametrize("where", ["caller's part", "part taken back", "before join",
                                   "after join"])  # fmt: skip
def test_an_interrupt_anywhere_in_a_split_leaves_the_pool_consistent(
    two_threads, monkeypatch, where
):
    """A KeyboardInterrupt in the caller's own part, in a part it took back, or while it
    joins the worker: the split raises it, every part the worker began has ended, and the
    next splits run every item once on both threads (a worker's ``done`` release left
    unmatched made the next join return early or hang)."""
    out = np.zeros(100, np.int64)
    ended = threading.Event()
    mark = _marking(out)
    if where == "caller's part":

        def fn(lo, hi):
            if lo == 0:
                raise KeyboardInterrupt
            mark(lo, hi)

    elif where == "part taken back":

        def fn(lo, hi):
            if lo > 0 and threading.current_thread() is threading.main_thread():
                raise KeyboardInterrupt
            mark(lo, hi)

        (w,) = parallel._pool()
        time.sleep(0.05)
        asleep, w.go = w.go, threading.Lock()  # late: the caller takes its part back
        w.go.acquire()
    else:

        def fn(lo, hi):
            if lo == 0:
                assert ended.wait(30)
            time.sleep(0.002 if lo > 0 else 0)
            mark(lo, hi)
            if lo > 0:
                ended.set()

        monkeypatch.setattr(parallel._Worker, "join", _interrupting_join(where.split()[0]))
    with pytest.raises(KeyboardInterrupt):
        parallel.split(fn, 100, 1)()
    if where == "part taken back":
        w.go = asleep
    monkeypatch.undo()
    monkeypatch.setattr(parallel, "num_threads", lambda: 2)
    assert np.all(out[:50] == (0 if where == "caller's part" else 1))
    if where == "caller's part":  # the worker's part ran whole or, taken back, not at all
        assert out[50:].min() == out[50:].max()
    else:
        assert np.all(out[50:] == (0 if where == "part taken back" else 1))
    out[:] = 0
    names: list = []
    step = parallel.split(_meeting(out, names), 100, 1)
    _in_thread(lambda: [step() for _ in range(3)])
    assert np.all(out == 3) and len(set(names)) == 2
    assert all(t.is_alive() for t in threading.enumerate() if t.name.startswith("mgb-kernel"))


class _CountersHook(np.ndarray):
    """``_Worker.counters`` that runs ``hook`` at the worker thread's first read of it after
    being armed: between its wake-up and its read of the offer, where a GIL switch can run
    the caller."""

    hook = None

    def __getitem__(self, k):
        value = super().__getitem__(k)
        hook = type(self).hook
        if hook is not None and threading.current_thread().name == "mgb-race":
            type(self).hook = None
            hook()
        return value


def test_an_offer_read_early_by_a_wake_up_runs_once(monkeypatch):
    # the caller takes part A back and offers part B between the worker's wake-up for A and
    # its read of the offer: that wake-up runs B, and the next one (B's own) must skip it
    monkeypatch.setattr(parallel, "_spinner", lambda: None)  # the worker blocks at once
    errors: list = []
    monkeypatch.setattr(threading, "excepthook", lambda a: errors.append(a.exc_value))
    runs = {"A": 0, "B": 0}
    claims_a: dict = {}
    claims_b: dict = {}

    def part(name):
        return lambda lo, hi: runs.__setitem__(name, runs[name] + 1)

    w = parallel._Worker("mgb-race")
    w.counters = np.zeros(parallel._COUNTERS, np.int64).view(_CountersHook)
    time.sleep(0.05)  # the worker waits on ``go``

    def caller_meanwhile():
        assert claims_a.setdefault(0, parallel._CALLER) is parallel._CALLER
        w.give(part("B"), 0, 1, claims_b)

    _CountersHook.hook = caller_meanwhile
    w.give(part("A"), 0, 1, claims_a)
    w.join(None)  # B's ``done``
    deadline = time.monotonic() + 2
    while not w.go.locked() and time.monotonic() < deadline:
        time.sleep(1e-3)  # the worker's second wake-up (B's own) consumed ``go``
    time.sleep(0.05)
    assert runs == {"A": 0, "B": 1}
    assert not errors
    assert not w.done.acquire(blocking=False)  # ``done`` released once, and taken
    w.give(part("A"), 0, 1, claims_c := {})
    w.join(None)
    assert runs["A"] == 1 and claims_c[0] is parallel._WORKER


needs_two_cpus = pytest.mark.skipif(
    parallel._getcpu is None or len(parallel._cpus()) < 2,
    reason="pins threads: needs sched_getcpu and two CPUs the process may use")


@needs_two_cpus
def test_a_worker_is_pinned_off_its_callers_cpu(two_threads):
    (w,) = parallel._pool()
    first = parallel._cpus()[0]
    w.keep_off(first)
    assert w.cpu != first and os.sched_getaffinity(w.tid) == {w.cpu}
    pinned = w.cpu
    w.keep_off(first)  # the caller elsewhere again: the worker stays
    assert w.cpu == pinned and os.sched_getaffinity(w.tid) == {pinned}
    w.keep_off(pinned)  # the caller moved onto the worker's CPU: the worker moves
    assert w.cpu not in (pinned, -1) and os.sched_getaffinity(w.tid) == {w.cpu}


@needs_two_cpus
def test_a_split_pins_its_workers_off_the_callers_cpu(two_threads):
    out = np.zeros(64, np.int64)
    step = parallel.split(_marking(out), 64, 1)
    step()
    (w,) = parallel._pool()
    assert np.all(out == 1)
    assert w.cpu >= 0 and os.sched_getaffinity(w.tid) == {w.cpu}


def test_workers_float_when_the_environment_asks(monkeypatch):
    monkeypatch.setenv("MGB_KERNEL_THREADS_FLOAT", "1")
    assert parallel._cpu_getter() is None
