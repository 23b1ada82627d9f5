"""The programs of the concurrency tests (issue 35), shared by the fast stress tests and the
``-m slow`` long runs: threads calling compiled functions, each thread's results compared
with a single-threaded run, and a watchdog that fails a hung run with every thread's stack.
"""

from __future__ import annotations

import contextlib
import faulthandler
import sys
import threading

import numpy as np

import megbrain as mgb


class Hang(AssertionError):
    """A run whose threads did not finish in time (their stacks were printed)."""


def run_threads(targets, timeout: float) -> list:
    """Run each callable of ``targets`` on its own thread; return their results in order.

    Raises
    ------
    Hang
        When a thread is still running after ``timeout`` seconds: every thread's stack is
        dumped to stderr first (faulthandler), so that a deadlock is diagnosed, not waited on.
    """
    results: list = [None] * len(targets)
    errors: list = []

    def body(i, fn):
        try:
            results[i] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised on the test's thread
            errors.append(exc)

    threads = [
        threading.Thread(target=body, args=(i, fn), daemon=True) for i, fn in enumerate(targets)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        if t.is_alive():
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            raise Hang(f"threads still running after {timeout} s (stacks above)")
    if errors:
        raise errors[0]
    return results


@contextlib.contextmanager
def fast_switching(interval: float = 1e-6):
    """Make the interpreter switch threads as often as it can: two runs dispatched by two
    threads then interleave at every point (the deadlock of issue 35 shows in most runs)."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(interval)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def cross_node_function(n: int = 16):
    """The issue's program: ``make_arg`` on cpu0, a copy to cpu1, a matrix product, a copy to
    cpu2, ReLU, and the gradient of the sum w.r.t. the input (copies back cpu2 -> cpu0)."""
    g = mgb.comp_graph()
    x = mgb.make_arg("cpu0", g, shape=(n, n), dtype=np.float32, name="x")
    w = mgb.make_shared(
        "cpu1", value=np.random.RandomState(0).rand(n, n).astype(np.float32), comp_graph=g
    )
    a = mgb.opr.matrix_mul(mgb.opr.copy(x, comp_node="cpu1"), w)
    y = mgb.opr.elemwise(mgb.opr.copy(a, comp_node="cpu2"), mode="RELU")
    gx = mgb.grad(y.sum(), x)
    return g.compile([x], [mgb.copy_output(y), mgb.copy_output(gx)])


def cross_node_run(calls: int, seed: int, n: int = 16) -> list:
    """Build the issue's function in a graph of this thread and call it ``calls`` times;
    returns the last results."""
    f = cross_node_function(n)
    xv = np.random.RandomState(seed).rand(n, n).astype(np.float32)
    out = None
    for _ in range(calls):
        out = f(xv)
    return [np.array(o) for o in out]


def two_layer_function(two_nodes: bool, n: int = 256, batch: int = 64):
    """The issue's shared function: ``tanh(relu(x @ w1) @ w2)``, x of (64, 256), on cpu0
    (``two_nodes``: the second product on cpu1)."""
    rng = np.random.RandomState(0)
    g = mgb.comp_graph()
    x = mgb.make_arg("cpu0", g, shape=(batch, n), dtype=np.float32, name="x")
    w1 = mgb.make_shared("cpu0", value=rng.rand(n, n).astype(np.float32) / n, comp_graph=g)
    cn2 = "cpu1" if two_nodes else "cpu0"
    w2 = mgb.make_shared(cn2, value=rng.rand(n, n).astype(np.float32) / n, comp_graph=g)
    h = mgb.opr.elemwise(mgb.opr.matrix_mul(x, w1), mode="RELU")
    if two_nodes:
        h = mgb.opr.copy(h, comp_node="cpu1")
    y = mgb.opr.elemwise(mgb.opr.matrix_mul(h, w2), mode="TANH")
    return g.compile([x], mgb.copy_output(y))


def inputs_for(count: int, seed: int, shape=(64, 256)) -> list[np.ndarray]:
    rng = np.random.RandomState(seed)
    return [rng.rand(*shape).astype(np.float32) - 0.5 for _ in range(count)]


def shared_function_wrong(func, threads: int, calls: int, distinct: int = 8) -> int:
    """Call ``func`` from ``threads`` threads ``calls`` times each, thread ``t`` feeding its
    own inputs; return how many results differ from a single-threaded run of the same input
    (``distinct`` different inputs per thread, cycled)."""
    feeds = [inputs_for(distinct, 100 + t) for t in range(threads)]
    want = [[np.array(func(x)) for x in f] for f in feeds]

    def caller(t):
        bad = 0
        for k in range(calls):
            got = func(feeds[t][k % distinct])
            if not np.array_equal(got, want[t][k % distinct]):
                bad += 1
        return bad

    return sum(run_threads([lambda t=t: caller(t) for t in range(threads)], timeout=120))
