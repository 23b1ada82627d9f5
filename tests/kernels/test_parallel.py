"""The kernel pool: every part runs once, errors reach the caller, concurrent and nested
splits neither deadlock nor lose parts."""

import threading

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


def test_each_item_runs_once_on_two_threads(two_threads):
    out = np.zeros(100, np.int64)
    names: list = []
    step = parallel.split(_marking(out, names), 100, 1)
    for _ in range(3):
        step()
    assert np.all(out == 3)
    assert len(set(names)) == 2  # the caller and a worker


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
    parallel.split(_marking(out, names), 100, 1)()
    assert np.all(out == 1) and len(set(names)) == 2
