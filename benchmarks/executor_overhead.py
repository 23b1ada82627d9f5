"""Executor overhead on tiny tensors.

(a) Per-operator cost: a chain of 5 vs 105 elementwise ADDs on 16-element float32 tensors,
    ``(time(105) - time(5)) / 100``, against the same difference for a hand-written loop of
    NumPy ``np.add(a, b, out)`` calls. Target: ratio <= 1.1.
(b) Per-call overhead of a compiled 1-operator function with positional inputs
    (``f(av, bv)`` of ``copy_output(a + b)``), next to the NumPy floor for the same work
    (two copies in, the add, one copy out). Target: <= 2 us.
(c) A call ``f(xv, yv)`` of the 20-operator elementwise chain of ``jit_fusion.py`` compiled
    with ``graph_opt.jit`` (one fused operator), 16 elements. Target: <= 4 us.

Run: ``python benchmarks/executor_overhead.py [--profile]``.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import platform
import pstats
import sys
import time

import numpy as np

import megbrain as mgb

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from jit_fusion import compile_mgb  # noqa: E402

N = 16
SHORT, LONG = 5, 105
# many short timed loops, each function in turn: on a shared machine the best of many short
# windows is the steadiest estimate (long ones are all hit by other processes)
NUMBER, REPEATS = 100, 400


def best_of(fns: dict, numbers: dict, repeats: int = REPEATS) -> dict:
    """Best per-iteration time (seconds) of each function over ``repeats`` timed loops.

    The functions are timed in turn within each repeat, so that load changes on a shared
    machine hit them alike.
    """
    for fn in fns.values():
        fn()  # warm up (plans, caches)
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for key, fn in fns.items():
            number = numbers[key]
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            best[key] = min(best[key], (time.perf_counter() - t0) / number)
    return best


def chain_function(n_ops: int):
    """A compiled function running ``n_ops`` ADDs in a chain; inputs set once."""
    g = mgb.comp_graph()
    x = mgb.make_arg("cpu0", g, name="x", value=np.ones(N, np.float32))
    y = mgb.make_arg("cpu0", g, name="y", value=np.full(N, 0.5, np.float32))
    h = x
    for _ in range(n_ops):
        h = h + y
    f = g.compile(None, [h])  # compute only: no output copy
    return f


def numpy_chain(n_ops: int):
    a = np.ones(N, np.float32)
    b = np.full(N, 0.5, np.float32)
    out = np.empty(N, np.float32)
    add = np.add

    def run():
        add(a, b, out)
        for _ in range(n_ops - 1):
            add(out, b, out)

    return run


def per_call_functions():
    g = mgb.comp_graph()
    a = mgb.make_arg("cpu0", g, name="a", shape=(N,))
    b = mgb.make_arg("cpu0", g, name="b", shape=(N,))
    f = g.compile([a, b], mgb.copy_output(a + b))
    av = np.arange(N, dtype=np.float32)
    bv = np.ones(N, np.float32)
    np.testing.assert_array_equal(f(av, bv), av + bv)

    def mgb_call():
        f(av, bv)

    abuf, bbuf, cbuf = (np.empty(N, np.float32) for _ in range(3))
    copyto, add = np.copyto, np.add

    def numpy_floor():
        copyto(abuf, av)
        copyto(bbuf, bv)
        add(abuf, bbuf, cbuf)
        return cbuf.copy()

    return mgb_call, numpy_floor


def fused_chain_call():
    """``f(xv, yv)`` of the JIT-fused 20-operator chain of ``jit_fusion.py``."""
    f = compile_mgb(1, N)
    rng = np.random.default_rng(0)
    xv, yv = (rng.uniform(-1, 1, N).astype(np.float32) for _ in range(2))
    f(xv, yv)

    def call():
        f(xv, yv)

    return call


def environment() -> list[str]:
    lines = [
        f"python {platform.python_version()}, numpy {np.__version__}, "
        f"{os.cpu_count()} CPUs, {platform.machine()}",
    ]
    for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        val = os.environ.get(var)
        lines.append(f"{var}: {'set to ' + repr(val) if val is not None else 'not set'}")
    try:
        from threadpoolctl import threadpool_info

        for info in threadpool_info():
            lines.append(
                "threadpoolctl: {internal_api} {version} threads={num_threads} arch={arch}".format(
                    internal_api=info.get("internal_api"),
                    version=info.get("version"),
                    num_threads=info.get("num_threads"),
                    arch=info.get("architecture"),
                )
            )
    except ImportError:
        lines.append("threadpoolctl: not installed")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", action="store_true", help="cProfile the 105-ADD chain")
    ap.add_argument("--number", type=int, default=NUMBER, help="calls per timed loop")
    ap.add_argument("--repeats", type=int, default=REPEATS, help="timed loops (best of)")
    args = ap.parse_args()
    number = args.number

    for line in environment():
        print(line)
    print()

    t = best_of(
        {
            "fs": chain_function(SHORT),
            "fl": chain_function(LONG),
            "ns": numpy_chain(SHORT),
            "nl": numpy_chain(LONG),
        },
        {"fs": number, "fl": number // 4, "ns": number, "nl": number // 4},
        args.repeats,
    )
    t_fs, t_fl, t_ns, t_nl = t["fs"], t["fl"], t["ns"], t["nl"]
    per_mgb = (t_fl - t_fs) / (LONG - SHORT)
    per_np = (t_nl - t_ns) / (LONG - SHORT)
    ratio = per_mgb / per_np

    mgb_call, np_floor = per_call_functions()
    t = best_of(
        {"call": mgb_call, "floor": np_floor, "fused": fused_chain_call()},
        {"call": number * 5, "floor": number * 5, "fused": number * 5},
        args.repeats,
    )
    t_call, t_floor, t_fused = t["call"], t["floor"], t["fused"]

    print(f"{'measure':<52}{'megbrain':>12}{'numpy':>12}{'ratio':>9}")
    print("-" * 85)
    print(
        f"{'(a) chain of 5 ADDs, per run (us)':<52}{t_fs * 1e6:>12.2f}{t_ns * 1e6:>12.2f}"
        f"{t_fs / t_ns:>9.2f}"
    )
    print(
        f"{'    chain of 105 ADDs, per run (us)':<52}{t_fl * 1e6:>12.2f}{t_nl * 1e6:>12.2f}"
        f"{t_fl / t_nl:>9.2f}"
    )
    print(
        f"{'    per operator: (t105 - t5) / 100 (us)':<52}{per_mgb * 1e6:>12.3f}"
        f"{per_np * 1e6:>12.3f}{ratio:>9.2f}   target <= 1.1"
        f"  [{'OK' if ratio <= 1.1 else 'MISS'}]"
    )
    print(
        f"{'(b) 1-opr function f(av, bv), per call (us)':<52}{t_call * 1e6:>12.2f}"
        f"{t_floor * 1e6:>12.2f}{t_call / t_floor:>9.2f}"
    )
    over = t_call - t_floor
    print(
        f"{'    overhead above the NumPy floor (us)':<52}{over * 1e6:>12.2f}{'':>12}{'':>9}"
        f"   target <= 2 us  [{'OK' if over <= 2e-6 else 'MISS'}]"
    )
    print(
        f"{'(c) 20-op JIT-fused chain f(xv, yv), per call (us)':<52}{t_fused * 1e6:>12.2f}"
        f"{'':>12}{'':>9}   target <= 4 us  [{'OK' if t_fused <= 4e-6 else 'MISS'}]"
    )

    if args.profile:
        print("\ncProfile: 105-ADD chain, 2000 runs")
        f_long = chain_function(LONG)
        f_long()
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(2000):
            f_long()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(12)
        print("cProfile: 1-operator function f(av, bv), 20000 calls")
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(20000):
            mgb_call()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
