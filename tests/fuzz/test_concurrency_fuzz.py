"""The long concurrency run of issue 35 (``-m slow``): random graphs of the differential
fuzzer on random comp nodes, async levels and (some) sublinear memory, built and called by
many threads at once (each thread its own graphs, and functions shared by all), every result
compared with a single-threaded run. ``MGB_CONC_FUZZ_SECONDS`` (default 120) and
``MGB_CONC_FUZZ_THREADS`` (default 8) size it."""

from __future__ import annotations

import os
import sys
import time
import warnings

import numpy as np
import pytest
from graph_fuzzer import FWD_RTOL, _namespace, generate

import megbrain as mgb

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "api"))
from concurrency_progs import run_threads  # noqa: E402

CASES = 24
LEVELS = (0, 1, 0b100, 0b110)


def _case(seed: int, rng: np.random.Generator):
    a, b = (int(c) for c in rng.choice(4, 2, replace=False))
    opts = {"async_exec_level": int(rng.choice(LEVELS))}
    if rng.random() < 0.3:
        opts["enable_sublinear_memory_opt"] = 1
    return generate(seed), (a, b), opts


def _build(case):
    """A function of ``case`` in a fresh graph, and its feed."""
    desc, (a, b), opts = case
    g = mgb.comp_graph()
    for k, v in opts.items():
        g.set_option(k, v)
    src = desc.program("f32", True, False)
    src = src.replace('"cpu0"', '"@A"').replace('"cpu1"', '"@B"')
    src = src.replace('"@A"', f'"cpu{a}"').replace('"@B"', f'"cpu{b}"')
    ns = _namespace(desc, g, np.float32)
    exec(compile(src, "<fuzz graph>", "exec"), ns)
    outs = [ns[f"v{o}"] for o in desc.outputs]
    return g.compile(None, [mgb.copy_output(v) for v in outs]), desc.feed()


def _call(func, feed) -> list:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="extra inputs ignored")
        return [np.array(r) for r in func(**feed)]


@pytest.mark.slow
def test_random_graphs_from_many_threads():
    seconds = float(os.environ.get("MGB_CONC_FUZZ_SECONDS", "120"))
    nthreads = int(os.environ.get("MGB_CONC_FUZZ_THREADS", "8"))
    rng = np.random.default_rng(35)
    cases = [_case(seed, rng) for seed in range(CASES)]
    shared = [_build(c) for c in cases]
    want = [_call(f, feed) for f, feed in shared]

    def check(i, got):
        scale = cases[i][0].scale
        for a, b in zip(got, want[i]):
            np.testing.assert_allclose(a, b, rtol=FWD_RTOL, atol=1e-6 * scale)

    def worker(t):
        r = np.random.default_rng(t)
        end = time.monotonic() + seconds
        n = 0
        while time.monotonic() < end:
            i = int(r.integers(CASES))
            if r.random() < 0.5:
                f, feed = _build(cases[i])  # this thread's own graph
            else:
                f, feed = shared[i]  # called by every thread: calls take turns
            for _ in range(3):
                check(i, _call(f, feed))
                n += 1
        return n

    done = run_threads([lambda t=t: worker(t) for t in range(nthreads)], seconds + 300)
    print(f"\n{sum(done)} calls of {CASES} random graphs from {nthreads} threads, all right")
