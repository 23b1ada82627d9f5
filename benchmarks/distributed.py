"""Distributed benchmarks (MPI): ``python benchmarks/distributed.py`` launches the runs itself
(two ``mpiexec -n 2`` jobs, one BLAS thread per rank).

1. all-reduce of float32 (64 KB: latency, 4 MB: the target, 64 MB: bandwidth), 2 ranks:
   mpi4py's ``Allreduce`` on the same buffers vs ``collective_comm`` as a compiled function
   (executor, header exchange, transfer; the function's only work is on the communication
   comp node, so it runs on the caller's thread) and vs the operator's bound kernel called
   directly (no executor: what the operator itself adds). All three read the same input
   (the shared tensor's memory) and write the same output (the function's planned output
   array): with other buffers per side the 2 ranks' 4 MB buffers fill the 32 MB L3 and each
   side's first call reads from memory. mpi4py's call uses the operator's communicator.
   One call of each side in turn, each after a barrier and timed alone (ending on the slower
   rank), the order rotating: 600 / 300 / 18 calls of each (``--iters``, default 60 x
   ``--rounds``, is the count at 4 MB); the ratio is of the 10th percentiles (the machine's
   other load comes and goes and only ever adds time), the medians' ratio is printed too.
2. digits CNN training steps, batch 64 per rank: data-parallel over the 2 ranks
   (SyncBatchNorm, or per-rank BatchNorm statistics; gradients all-reduced) vs 1 rank (rank 0
   alone, the other rank sleeping). The three alternate in rounds inside one job, so the
   machine's other load hits them alike; best round of each. Reported per configuration:
   samples/s, step time, CPU seconds per step and rank (spinning shows as CPU beyond the
   1-rank step's), the share of step time the compute thread is blocked waiting on
   communication, the MPI time (all threads) and the part of it spent waiting for the other
   rank to arrive; how often the machine's other load preempted the computation per step;
   and the speed-up the CPU times give on idle cores (``2 * cpu(1 rank) / cpu(2 ranks)``:
   what the step would reach without other load and without waiting), since on a loaded
   machine the ranks mostly wait for each other's preempted time. Each rank's thread pools
   (every BLAS/OpenMP library loaded, the kernels' split, the threads) are printed too.

``--part allreduce|cnn`` runs one part inside an existing ``mpiexec`` (what the launcher
does); ``--iters`` / ``--rounds`` set the repetitions.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np

ENV1 = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
SIZES = (64 << 10, 4 << 20, 64 << 20)


def _threads_report() -> dict:
    """This rank's thread pools: every BLAS/OpenMP library loaded (threadpoolctl; a process
    may load several, e.g. NumPy's and SciPy's own OpenBLAS), the kernels' split
    (``kernels.parallel.num_threads``) and the names of the process's threads."""
    import threading

    from megbrain.kernels import parallel

    try:
        from threadpoolctl import threadpool_info
    except ImportError:  # pragma: no cover - benchmark-only dependency
        pools = {}
    else:
        pools = {os.path.basename(i["filepath"]): i["num_threads"] for i in threadpool_info()}
    return {"pools": pools, "kernel_split": parallel.num_threads(),
            "threads": sorted(t.name for t in threading.enumerate())}


def _preemptions() -> int:
    """Involuntary context switches of the calling thread so far (Linux; 0 elsewhere): how
    often the machine's other load took its core."""
    try:
        with open("/proc/thread-self/status") as f:
            for line in f:
                if line.startswith("nonvoluntary_ctxt_switches"):
                    return int(line.split()[1])
    except OSError:  # pragma: no cover - not Linux
        pass
    return 0


def part_allreduce(iters: int) -> dict:
    import megbrain as mgb
    from megbrain.device import mpi_comm as dcomm

    MPI = dcomm.mpi()
    world = MPI.COMM_WORLD
    r, n = world.Get_rank(), world.Get_size()
    out = {}
    for nbytes in SIZES:
        value = np.random.RandomState(r).rand(nbytes // 4).astype(np.float32)
        g = mgb.comp_graph()
        x = mgb.make_shared("cpu0", value=value, comp_graph=g)
        y = mgb.opr.collective_comm(x, key=f"bench{nbytes}", nr_devices=n, is_root=r == 0,
                                    rank=r, mode="ALL_REDUCE_SUM")
        f = g.compile(None, [y])
        f()  # first run: plan, communicator, root
        arrays = f._func.var_arrays()  # the function's own memory: its input and output
        src, dst = arrays[x.node], arrays[y.node]
        kernel = y.node.owner.bind([src], [dst])  # the operator without the executor
        kernel()
        np.testing.assert_allclose(dst, world.allreduce(value, MPI.SUM), rtol=1e-6)
        comm = dcomm.get_comm(f"bench{nbytes}", n, r)  # the operator's communicator
        sides = {
            "mpi4py": functools.partial(comm.Allreduce, src, dst, MPI.SUM),
            "collective_comm": f,
            "operator_kernel": kernel,
        }
        fns = list(sides.values())
        calls = min(max(12, iters * (4 << 20) // nbytes), 600)
        times = np.zeros((calls, len(fns)))
        clock = time.perf_counter
        # one call of each side in turn (the order rotating), each after a barrier and timed
        # alone: the machine's other load, which comes and goes, hits the three alike
        for i in range(calls):
            for k in range(len(fns)):
                j = (i + k) % len(fns)
                world.Barrier()
                t0 = clock()
                fns[j]()
                times[i, j] = clock() - t0
        times = np.maximum.reduce(world.allgather(times))  # a call ends on its slowest rank
        best = {}
        for j, name in enumerate(sides):
            best[name] = float(np.percentile(times[:, j], 10))
            best[name + "_median"] = float(np.median(times[:, j]))
        best["calls"] = calls
        best["ratio"] = best["mpi4py"] / best["collective_comm"]  # >= 0.9 wanted at 4 MB
        best["ratio_kernel"] = best["mpi4py"] / best["operator_kernel"]
        best["ratio_median"] = best["mpi4py_median"] / best["collective_comm_median"]
        out[str(nbytes)] = best
    return out


def _sleeping_barrier(world) -> None:
    """A barrier whose waiting rank sleeps (1 ms between tests) instead of polling a core,
    whatever the wait policy: rank 1 waits in it through the 1-rank runs, which must have
    the machine's other core to themselves as much as any run."""
    req = world.Ibarrier()
    while not req.Test():
        time.sleep(1e-3)


class _BlockedTimer:
    """Seconds the compute thread (``mgb-cpu0:0``) spends blocked in the executor's waits
    for vars of another comp node (the collectives' results): wraps the executor's
    cross-node waiter before the step is compiled (benchmark instrumentation only)."""

    def __init__(self):
        from megbrain.graph import executor

        self.blocked = 0.0
        orig = executor._waiter

        def waiter(ev, func):
            inner = orig(ev, func)

            def wait():
                if ev.is_set() or threading.current_thread().name != "mgb-cpu0:0":
                    return inner()
                t0 = time.perf_counter()
                try:
                    return inner()
                finally:
                    self.blocked += time.perf_counter() - t0

            return wait

        executor._waiter = waiter


def _thread_cpu() -> dict:
    """``{thread name: CPU seconds}`` of this process's megbrain worker threads and the main
    thread (per-thread CPU clocks)."""
    out = {}
    for t in threading.enumerate():
        if t.name.startswith("mgb-cpu") or t is threading.main_thread():
            try:
                out[t.name] = time.clock_gettime(time.pthread_getcpuclockid(t.ident))
            except (OSError, AttributeError):  # pragma: no cover - not on Linux
                pass
    return out


def part_cnn(iters: int, rounds: int, batch: int) -> dict:
    from megbrain import optim
    from megbrain.device import mpi_comm as dcomm
    from megbrain.examples import digits

    world = dcomm.mpi().COMM_WORLD
    MPI = dcomm.mpi()
    rank, n = world.Get_rank(), world.Get_size()
    timer = _BlockedTimer()
    xtr, ytr, _, _ = digits.load_digits()
    onehot = np.eye(10, dtype=np.float32)
    steps = {}
    if rank == 0:  # the 1-rank baseline: no collectives, one comp node
        steps["1 rank"] = digits.build_train_step(digits.make_model("cnn"), optim.Adam, batch,
                                                  lr=1e-3)[0]
    for name, sync in (("2 ranks, SyncBatchNorm", True), ("2 ranks, local BatchNorm", False)):
        steps[name] = digits.build_train_step(digits.make_model("cnn", sync_bn=sync),
                                              optim.Adam, batch, lr=1e-3, distributed=True)[0]
    rng = np.random.default_rng(rank)
    batches = [rng.integers(0, len(xtr), batch) for _ in range(iters)]
    data = [(xtr[i], onehot[ytr[i]]) for i in batches]
    names = ["1 rank", "2 ranks, SyncBatchNorm", "2 ranks, local BatchNorm"]
    best: dict = {}

    def run(step):
        for x, y in data:
            step(x, y)

    for name in names:  # warm-up: plans, communicators, first-run header exchanges
        if name in steps:
            for x, y in data[:3]:
                steps[name](x, y)
        dcomm.group_barrier()
    for _ in range(rounds):
        for name in names:
            _sleeping_barrier(world)  # rank 1 sleeps here during "1 rank"
            if name != "1 rank":
                dcomm.group_barrier()  # both ranks start the timed steps together
            if name not in steps:
                continue
            dcomm.reset_stats()
            timer.blocked = 0.0
            th0 = _thread_cpu()
            p0 = _preemptions()
            c0, t0 = time.process_time(), time.perf_counter()
            run(steps[name])
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            preempted = _preemptions() - p0
            th = {k: v - th0.get(k, 0.0) for k, v in _thread_cpu().items()}
            # blocked: in the executor's waits for the communication node's results, or in
            # collectives run on the computation's own node (SyncBatchNorm's; all of them
            # when the step has one comp node and runs on the caller's thread)
            blocked = timer.blocked + sum(dcomm.THREAD_STATS.get(t, 0.0)
                                          for t in ("mgb-cpu0:0", "MainThread"))
            res = {"wall": wall, "cpu": cpu, "blocked": blocked,
                   "cpu_compute": th.get("mgb-cpu0:0", 0.0) + th.get("MainThread", 0.0),
                   "cpu_comm": th.get("mgb-cpu0:1024", 0.0),
                   "comm": dcomm.STATS["comm_s"], "peers": dcomm.STATS["peers_s"],
                   "calls": dcomm.STATS["calls"], "preempted": preempted}
            if name != "1 rank":
                res = {k: world.allreduce(v, MPI.MAX) for k, v in res.items()}
            if name not in best or res["wall"] < best[name]["wall"]:
                best[name] = res
    threads = world.gather(_threads_report(), root=0)
    if rank != 0:
        return {}
    ranks = {"1 rank": 1}
    out = {"threads": threads}
    for name, res in best.items():
        k = ranks.get(name, n)
        out[name] = {
            "samples_per_s": k * batch * iters / res["wall"],
            "step_ms": res["wall"] / iters * 1e3,
            "cpu_ms_per_step": res["cpu"] / iters * 1e3,
            "compute_cpu_ms_per_step": res["cpu_compute"] / iters * 1e3,
            "comm_cpu_ms_per_step": res["cpu_comm"] / iters * 1e3,
            "comm_wait_share": res["blocked"] / res["wall"],
            "mpi_share": res["comm"] / res["wall"],
            "peers_share": res["peers"] / res["wall"],
            "collectives_per_step": res["calls"] / iters,
            "preemptions_per_step": res["preempted"] / iters,
        }
    return out


def _launch(args: list[str], nranks: int) -> dict:
    env = {**os.environ, **ENV1}
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    cmd = [mpiexec, "-n", str(nranks), sys.executable, __file__, *args]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if out.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()) + \
        f" on {os.cpu_count()} CPUs"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--part", choices=("allreduce", "cnn"))
    ap.add_argument("--iters", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64, help="CNN batch per rank")
    ap.add_argument("--only", choices=("allreduce", "cnn"), help="launch one part only")
    a = ap.parse_args()
    if a.part == "allreduce":
        res = part_allreduce(a.iters or 60 * a.rounds)
    elif a.part == "cnn":
        res = part_cnn(a.iters or 40, a.rounds, a.batch)
    else:
        print(f"before: {_load()}")
        ar = {} if a.only == "cnn" else _launch(["--part", "allreduce", "--rounds",
                                                  str(a.rounds)], 2)
        for nbytes, v in ar.items():
            print(f"all-reduce {int(nbytes) >> 10} KB float32, 2 ranks, {v['calls']} calls "
                  f"each, 10th percentile: mpi4py Allreduce {v['mpi4py'] * 1e3:.3f} ms, "
                  f"collective_comm {v['collective_comm'] * 1e3:.3f} ms: ratio {v['ratio']:.2f}x"
                  f"{' (>= 0.9 wanted)' if int(nbytes) == 4 << 20 else ''}; the operator's "
                  f"kernel alone {v['operator_kernel'] * 1e3:.3f} ms ({v['ratio_kernel']:.2f}x);"
                  f" medians {v['mpi4py_median'] * 1e3:.3f} / "
                  f"{v['collective_comm_median'] * 1e3:.3f} ms ({v['ratio_median']:.2f}x)")
        if a.only == "allreduce":
            print(f"after: {_load()}")
            return
        cnn = _launch(["--part", "cnn", "--batch", str(a.batch), "--rounds", str(a.rounds)]
                      + (["--iters", str(a.iters)] if a.iters else []), 2)
        print(f"digits CNN, batch {a.batch} per rank; threads per rank:")
        for r, t in enumerate(cnn.pop("threads")):
            print(f"  rank {r}: pools {t['pools']}, kernel split {t['kernel_split']}, "
                  f"threads {t['threads']}")
        one = cnn["1 rank"]
        for name, v in cnn.items():
            line = (f"  {name}: {v['samples_per_s']:.0f} samples/s ({v['step_ms']:.2f} ms/step,"
                    f" {v['cpu_ms_per_step']:.2f} CPU ms/step per rank, of which compute "
                    f"{v['compute_cpu_ms_per_step']:.2f}, communication thread "
                    f"{v['comm_cpu_ms_per_step']:.2f}; preempted "
                    f"{v['preemptions_per_step']:.1f}x per step)")
            if name != "1 rank":
                line += (f", speed-up {v['samples_per_s'] / one['samples_per_s']:.2f}x (>= 1.6 "
                         f"wanted); compute waiting on communication "
                         f"{v['comm_wait_share'] * 100:.0f}% of the step; in MPI calls "
                         f"(all threads) {v['mpi_share'] * 100:.0f}%, of which waiting for "
                         f"the other rank {v['peers_share'] * 100:.0f}%; "
                         f"{v['collectives_per_step']:.0f} collectives/step; on idle cores "
                         f"(CPU-bound, no waiting) "
                         f"{2 * one['cpu_ms_per_step'] / v['cpu_ms_per_step']:.2f}x")
            print(line)
        print(f"after: {_load()}")
        return
    if os.environ.get("PMI_RANK", "0") == "0":
        print(json.dumps(res))


if __name__ == "__main__":
    main()
