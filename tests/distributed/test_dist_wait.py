"""How a collective waits for its peers (megbrain/device/mpi_comm.py), without an MPI job:
requests are stand-ins whose Test() answers after a given number of polls."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from megbrain.device import mpi_comm

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")


class _Req:
    """Completes on the ``after``-th Test(); records the thread's timer slack at each."""

    def __init__(self, after: int):
        self.after, self.calls, self.slack = after, 0, []

    def Test(self) -> bool:  # noqa: N802 - mpi4py's name
        self.calls += 1
        prev = mpi_comm._timer_slack(0)  # 0 sets the thread's default; read it back below
        if prev is not None:
            mpi_comm._timer_slack(prev)
        self.slack.append(prev)
        return self.calls >= self.after


@linux
def test_sleeps_with_a_small_timer_slack_and_restores_it():
    before = mpi_comm._timer_slack(123_000)
    assert before is not None
    try:
        req = _Req(after=6)
        # the spin phase is over at once: it polls between sleeps from the start
        mpi_comm._sleep_until(req, time.perf_counter() - 1.0)
        assert req.calls == 6
        assert set(req.slack) == {mpi_comm.TIMER_SLACK_NS}
        assert mpi_comm._timer_slack(before) == 123_000  # restored after the wait
    finally:
        mpi_comm._timer_slack(before)


def test_a_request_done_while_spinning_never_sleeps(monkeypatch):
    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    # a spin long enough for the three polls on a loaded machine (the first Test also pays
    # the first prctl call)
    monkeypatch.setattr(mpi_comm, "SPIN_S", 1.0)
    req = _Req(after=3)
    mpi_comm._sleep_until(req, time.perf_counter())
    assert req.calls == 3 and slept == []


@pytest.fixture
def frozen_clock(monkeypatch):
    """A clock that stands still, and sleeps that only record their length: the sleeps a
    wait chooses then depend on the time waited that the test sets, not on how loaded the
    machine running it is."""
    now = 1000.0
    monkeypatch.setattr(time, "perf_counter", lambda: now)
    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    return now, slept


def test_sleeps_double_up_to_the_short_cap_in_a_young_wait(frozen_clock):
    now, slept = frozen_clock
    req = _Req(after=9)
    mpi_comm._sleep_until(req, now - mpi_comm.SPIN_S)
    assert slept[:4] == pytest.approx([20e-6, 40e-6, 80e-6, 160e-6])
    assert slept[4:] == pytest.approx([mpi_comm.SHORT_SLEEP_S] * 4)


def test_sleeps_grow_with_the_time_waited_up_to_the_cap(frozen_clock):
    now, slept = frozen_clock
    waited = 0.008  # a peer 8 ms late: sleeps up to 1 ms (1/8 of it)
    mpi_comm._sleep_until(_Req(after=12), now - waited)
    assert max(slept) == pytest.approx(waited * mpi_comm.LATE_SLEEP_FRACTION)
    slept.clear()
    mpi_comm._sleep_until(_Req(after=12), now - 10.0)
    assert max(slept) == pytest.approx(mpi_comm.MAX_SLEEP_S)
    assert slept[:2] == pytest.approx([20e-6, 40e-6])  # still starts short


def test_a_small_transfer_spins_longer_than_a_wait_for_the_peers(monkeypatch):
    """Once the peers are there, a small transfer moves only while the ranks poll: its wait
    spins :data:`TRANSFER_SPIN_S` before sleeping; waiting for the peers spins less."""
    monkeypatch.setattr(mpi_comm, "wait_policy", lambda: "poll")
    spins = []
    monkeypatch.setattr(mpi_comm, "_sleep_until", lambda req, t0, spin=None: spins.append(spin))
    mpi_comm.wait(_Req(after=2), 1024)
    with mpi_comm.watch("test wait") as w:
        w.wait_peers(_Req(after=2))
    assert spins == [mpi_comm.TRANSFER_SPIN_S, None]
    assert mpi_comm.TRANSFER_SPIN_S > mpi_comm.SPIN_S


@pytest.mark.parametrize(
    ("ranks", "cpus", "policy"), [(2, 2, "busy"), (1, 2, "busy"), (3, 2, "poll"), (8, 4, "poll")]
)
def test_auto_polls_a_core_only_while_each_rank_has_one(monkeypatch, ranks, cpus, policy):
    monkeypatch.setattr(mpi_comm, "COMM_WAIT", "auto")
    monkeypatch.setenv("MPI_LOCALNRANKS", str(ranks))
    monkeypatch.setattr(mpi_comm.os, "sched_getaffinity", lambda pid: set(range(cpus)))
    mpi_comm.wait_policy.cache_clear()
    try:
        assert mpi_comm.wait_policy() == policy
    finally:
        mpi_comm.wait_policy.cache_clear()


def test_an_explicit_policy_is_kept(monkeypatch):
    monkeypatch.setattr(mpi_comm, "COMM_WAIT", "yield")
    mpi_comm.wait_policy.cache_clear()
    try:
        assert mpi_comm.wait_policy() == "yield"
    finally:
        mpi_comm.wait_policy.cache_clear()


def test_a_watch_names_the_waiting_call_to_the_watchdog_and_counts_it(monkeypatch):
    mpi_comm.reset_stats()
    before = dict(mpi_comm.THREAD_STATS)
    w = mpi_comm.watch("outer op")
    with w:
        rec = mpi_comm._local.rec
        assert rec.t0 > 0 and rec.what == "outer op"
        with mpi_comm.watch("inner op"):  # a watch inside a watch restores the outer one
            assert rec.what == "inner op"
        assert rec.what == "outer op" and rec.t0 > 0
        now = time.monotonic()
        monkeypatch.setattr(mpi_comm, "COMM_TIMEOUT", 5.0)
        assert mpi_comm._late(now + 1.0) is None
        what, waited = mpi_comm._late(now + 6.0)
        assert what == "outer op" and waited > 5.0
        time.sleep(0.01)
    assert rec.t0 == 0.0 and mpi_comm._late(time.monotonic() + 1e6) is None
    with w:  # reusable
        pass
    assert mpi_comm.STATS["calls"] == 3
    assert mpi_comm.STATS["comm_s"] >= 0.01
    name = threading.current_thread().name
    assert mpi_comm.THREAD_STATS[name] - before.get(name, 0.0) >= 0.01


def test_watched_calls_of_another_thread_count_under_its_name():
    mpi_comm.reset_stats()

    def work():
        with mpi_comm.watch("worker op"):
            time.sleep(0.005)

    t = threading.Thread(target=work, name="test-comm-worker")
    t.start()
    t.join()
    assert mpi_comm.THREAD_STATS["test-comm-worker"] >= 0.005
    assert mpi_comm.STATS["calls"] == 1
    mpi_comm.reset_stats()
    assert mpi_comm.STATS["calls"] == 0 and mpi_comm.THREAD_STATS["test-comm-worker"] == 0.0
