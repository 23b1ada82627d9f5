"""Do two CPU comp nodes run NumPy work in parallel?

Runs the same batch of 512x512 float32 matmuls (``np.matmul(..., out=)``) on cpu0 and cpu1,
once one node after the other and once both at the same time, and prints the wall times and
their ratio (parallel / serial; target <= 0.65 on 2 cores). Two plain threads doing the same
work show what the machine allows at the moment: on a VM whose two vCPUs the host sometimes
places on one physical core, that ceiling itself moves between about 0.5 and 1.0.

Run: ``python benchmarks/comp_node_parallel.py [--n 512] [--per-node 40] [--repeat 10]``
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import numpy as np

from megbrain.device import CompNode

try:
    from threadpoolctl import threadpool_info, threadpool_limits
except ImportError:  # pragma: no cover - threadpoolctl is optional
    threadpool_info = threadpool_limits = None


def make_batch(n: int, per_node: int, seed: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    return [(a, b, np.empty((n, n), np.float32)) for _ in range(per_node)]


def run_batch(batch) -> None:
    for a, b, out in batch:
        np.matmul(a, b, out=out)


def measure(n: int, per_node: int, repeat: int) -> dict[str, float]:
    nodes = [CompNode.load("cpu0"), CompNode.load("cpu1")]
    batches = [make_batch(n, per_node, seed) for seed in range(2)]

    def serial():
        for cn, batch in zip(nodes, batches):
            cn.dispatch(run_batch, batch)
            cn.sync()

    def parallel():
        for cn, batch in zip(nodes, batches):
            cn.dispatch(run_batch, batch)
        for cn in nodes:
            cn.sync()

    def inline():
        for batch in batches:
            run_batch(batch)

    def threads():
        ts = [threading.Thread(target=run_batch, args=(b,)) for b in batches]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    modes = {
        "inline (caller thread)": inline,
        "serial (cpu0 then cpu1)": serial,
        "parallel (cpu0 + cpu1)": parallel,
        "2 plain threads": threads,
    }
    parallel()  # warm up: start the workers, touch the buffers
    # best of `repeat`, the modes interleaved so that a burst of load from other processes
    # on the machine hits all of them alike
    res = dict.fromkeys(modes, float("inf"))
    for _ in range(repeat):
        for name, fn in modes.items():
            t0 = time.perf_counter()
            fn()
            res[name] = min(res[name], time.perf_counter() - t0)
    for batch in batches:  # both nodes computed the right thing
        a, b, out = batch[-1]
        np.testing.assert_allclose(out, a @ b, rtol=1e-3, atol=1e-2)
    return res


def print_table(title: str, res: dict[str, float], n: int, per_node: int) -> float:
    flop = 2 * n**3 * per_node * 2
    serial = res["serial (cpu0 then cpu1)"]
    print(f"\n{title}")
    print(f"{'mode':<26}{'wall ms':>10}{'GFLOP/s':>10}{'/ serial':>10}")
    for name, t in res.items():
        print(f"{name:<26}{t * 1e3:>10.1f}{flop / t / 1e9:>10.1f}{t / serial:>10.3f}")
    print(
        "comp nodes vs plain threads: "
        f"{res['parallel (cpu0 + cpu1)'] / res['2 plain threads']:.3f} (1.0 = no dispatch overhead)"
    )
    return res["parallel (cpu0 + cpu1)"] / serial


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=512)
    p.add_argument("--per-node", type=int, default=40)
    p.add_argument("--repeat", type=int, default=10)
    args = p.parse_args()

    print(f"cpu count: {os.cpu_count()}, numpy {np.__version__}")
    for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        print(f"{var}: {os.environ[var]!r} (set)" if var in os.environ else f"{var}: not set")
    if threadpool_info is None:
        print("threadpoolctl: not installed (BLAS thread count can not be pinned)")
    else:
        for info in threadpool_info():
            keys = ("user_api", "internal_api", "num_threads", "version", "architecture")
            print("threadpool:", ", ".join(f"{k}={info.get(k)}" for k in keys))

    # The comparison is about comp-node parallelism: each worker should be one core's worth
    # of work. A multi-threaded BLAS already spreads one matmul over both cores, so two
    # workers would then just compete for the same cores and the ratio would measure BLAS
    # threading instead. OpenBLAS's thread count is process-wide, so limiting it to 1 here
    # gives every worker a single-threaded BLAS.
    if threadpool_limits is not None:
        with threadpool_limits(limits=1, user_api="blas"):
            res = measure(args.n, args.per_node, args.repeat)
        ratio = print_table("BLAS threads = 1 per worker", res, args.n, args.per_node)
        res_default = measure(args.n, args.per_node, args.repeat)
        print_table("BLAS threads = default (for reference)", res_default, args.n, args.per_node)
    else:
        res = measure(args.n, args.per_node, args.repeat)
        ratio = print_table("BLAS threads = default", res, args.n, args.per_node)
    print(f"\nparallel / serial = {ratio:.3f} (target <= 0.65 on 2 cores)")


if __name__ == "__main__":
    main()
