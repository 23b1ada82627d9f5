"""ONNX inference: megbrain (``megbrain.onnx.load_inference``) against onnxruntime on the same
model, machine and run, as a ratio of their times (higher is better for megbrain).

megbrain runs the model as a user does, through ``load_inference``: ConvBias fusions, the
channel-blocked NCHW88 layout between the convolutions (as onnxruntime's NCHWc transformer),
JIT fusion and ``graph_opt.weight_preprocess`` (its convolutions pack their filters once, as
onnxruntime prepacks its initializers).

Models: the light ResNet50 of the onnx wheel's test data (batch 1, 224x224; weights from
ConstantOfShape) and the digits CNN exported with ``megbrain.onnx.export``.

Both sides get the same thread count (``--threads``, default the CPU count): megbrain's BLAS
through ``threadpoolctl`` (which also sizes the kernel pool of ``megbrain.kernels.parallel``),
onnxruntime's intra-op pool through its session options. Rounds are interleaved (one block of
:data:`BLOCK` back-to-back calls of each side per round, the order alternating, the blocks
:data:`SETTLE_S` apart), so that a change in the machine's load hits both. The table has
the median and the best of the steady-state calls (all but the first of each block) and
their ratios, the median of the first calls (after the rest, the cores' threads asleep)
and its ratio, and the header the thread settings and the load average before and after.

    python benchmarks/onnx_inference.py [--threads N] [--rounds R] [--models resnet50,digits]
        [--ort-no-spin] [--profile]

``--profile`` adds megbrain's time per operator type (its CompGraphProfiler, summed over the
operators of a type, median over the rounds) for each model; megbrain's times then include the
profiler's own small cost per operator.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import tempfile
import time

import numpy as np


def _megbrain_runner(path: str, feed: dict, profile: bool = False):
    import megbrain as mgb
    import megbrain.onnx as mo

    graph = mgb.comp_graph()
    prof = None
    if profile:
        from megbrain.plugin import CompGraphProfiler

        prof = CompGraphProfiler(graph)
    func = mo.load_inference(path, graph=graph)
    return (lambda: func(**feed)), prof


def _ort_runner(path: str, feed: dict, threads: int, spin: bool):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    so.log_severity_level = 3  # not the warnings about initializers it drops
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return lambda: sess.run(None, feed)


def _digits_model(tmp: str) -> tuple[str, dict]:
    import megbrain as mgb
    import megbrain.onnx as mo
    from megbrain.examples import digits

    path = os.path.join(tmp, "digits.mge")
    digits.main(["--epochs", "1", "--no-progress", "--dump", path, "--dump-batch", "64",
                 "--out", os.path.join(tmp, "w.npz")])
    res = mgb.load_comp_graph_from_file(path)
    onnx_path = os.path.join(tmp, "digits.onnx")
    mo.export(res.output_vars_list, onnx_path)
    x = np.random.default_rng(0).random((64, 1, 8, 8), dtype=np.float32)
    import onnx

    name = onnx.load(onnx_path).graph.input[0].name
    return onnx_path, {name: x}


def _resnet50() -> tuple[str, dict] | None:
    import onnx

    path = os.path.join(
        os.path.dirname(onnx.__file__), "backend", "test", "data", "light", "light_resnet50.onnx"
    )
    if not os.path.exists(path):
        return None
    model = onnx.load(path)
    init = {t.name for t in model.graph.initializer}
    feed = {}
    for vi in model.graph.input:
        if vi.name not in init:
            shape = [d.dim_value or 1 for d in vi.type.tensor_type.shape.dim]
            feed[vi.name] = np.random.default_rng(0).random(shape, dtype=np.float32)
    return path, feed


#: seconds of rest before each block of calls: onnxruntime's worker threads spin on after its
#: call returns (its default), and a megbrain call started before they stop finds a core
#: taken. They spun for 40-80 ms after a ResNet50 call (one core's CPU time, sampled every
#: 20 ms); 20 ms after one, megbrain's first layers ran 2-3x slower than alone
SETTLE_S = 0.15
#: calls per block: the first one is the block's warm-up (after the rest, both runtimes'
#: first call is slower: the cores' threads are asleep; on the 2-vCPU machines megbrain's
#: ResNet50 call 20-30% slower, onnxruntime's 5-10%), the others are timed back to back
BLOCK = 4


def interleaved(fns: dict, rounds: int, warmup: int = 1, block: int = BLOCK
                ) -> tuple[dict[str, list[float]], dict[str, list[float]]]:  # fmt: skip
    """Wall times (s) of each callable over ``rounds`` rounds, the order of the callables
    alternating between rounds, after ``warmup`` untimed rounds. In a round each callable
    runs one block of ``block`` calls, :data:`SETTLE_S` after the previous block ended.

    Returns ``(steady, first)``: per callable the times of the calls after the first of
    each block (back to back: the steady state), and of the first calls (after the rest)."""
    names = list(fns)
    steady: dict[str, list[float]] = {k: [] for k in names}
    first: dict[str, list[float]] = {k: [] for k in names}
    for r in range(warmup + rounds):
        order = names if r % 2 == 0 else names[::-1]
        for k in order:
            time.sleep(SETTLE_S)
            for i in range(block):
                t0 = time.perf_counter()
                fns[k]()
                if r >= warmup:
                    (first if i == 0 else steady)[k].append(time.perf_counter() - t0)
    return steady, first


def _op_types(prof) -> list[tuple[str, float]]:
    """Per operator type, the sum over its operators of their median time (s) over the runs
    (the warm-up rounds too: the median is robust to the first, slower run)."""
    per = collections.defaultdict(list)
    for opr, _cn, _ident, t0, t1, _run in list(prof._observer.events):
        per[opr].append(t1 - t0)
    agg: dict[str, float] = collections.defaultdict(float)
    for opr, ts in per.items():
        agg[opr.type_name] += statistics.median(ts)
    return sorted(agg.items(), key=lambda kv: -kv[1])


def _limit_threads(n: int) -> None:
    """Every BLAS library at ``n`` threads, and megbrain's kernel pool sized from them again:
    the kernels bound after this split into at most ``n`` parts. SciPy's OpenBLAS is loaded
    first: Numba loads it on its first compile (and the digits data with scikit-learn), and
    the kernel pool follows the largest BLAS pool."""
    from threadpoolctl import threadpool_limits

    from megbrain.kernels import parallel

    try:
        import scipy.linalg.cython_blas  # noqa: F401
    except ImportError:
        pass
    threadpool_limits(n)
    parallel.num_threads.cache_clear()


def _settings(threads: int, spin: bool) -> str:
    from threadpoolctl import threadpool_info

    from megbrain.kernels import jit_codegen, parallel

    blas = ", ".join(
        f"{i['internal_api']} {i['num_threads']} threads"
        for i in threadpool_info()
        if i["user_api"] == "blas"
    )
    return (
        f"threads {threads}: megbrain BLAS ({blas}), kernel pool {parallel.num_threads()} "
        f"threads, JIT kernels serial below {jit_codegen.PARALLEL_MIN_SIZE} elements "
        f"({jit_codegen.PARALLEL_MIN_SIZE_TRANSCENDENTAL} with exp/log/tanh/erf); "
        f"onnxruntime intra-op {threads}, inter-op 1, spinning {'on' if spin else 'off'}; "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}"
    )


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--repeat", type=int, help=argparse.SUPPRESS)  # the old name of --rounds
    ap.add_argument("--models", default="resnet50,digits")
    ap.add_argument("--ort-no-spin", action="store_true", help="onnxruntime threads sleep")
    ap.add_argument("--profile", action="store_true", help="megbrain's time per operator type")
    args = ap.parse_args(argv)
    rounds = args.repeat or args.rounds
    _limit_threads(args.threads)
    spin = not args.ort_no_spin
    models = args.models.split(",")
    rows, profiles = [], []
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        cases = []
        if "digits" in models:
            cases.append(("digits CNN (batch 64)", _digits_model(tmp)))
        r50 = _resnet50() if "resnet50" in models else None
        if r50 is not None:
            cases.append(("light ResNet50 (batch 1)", r50))
        for name, (path, feed) in cases:
            _limit_threads(args.threads)
            mgb_run, prof = _megbrain_runner(path, feed, args.profile)
            fns = {"megbrain": mgb_run, "onnxruntime": _ort_runner(path, feed, args.threads, spin)}
            t, first = interleaved(fns, rounds)
            med = {k: statistics.median(v) for k, v in t.items()}
            best = {k: min(v) for k, v in t.items()}
            cold = {k: statistics.median(v) for k, v in first.items()}
            rows.append((name, med, best, cold))
            if prof is not None:
                profiles.append((name, _op_types(prof)))
    load1 = os.getloadavg()
    print(_settings(args.threads, spin))
    print(
        f"{rounds} interleaved rounds of {BLOCK}-call blocks, {SETTLE_S * 1e3:.0f} ms apart; "
        f"load average {load0[0]:.2f} before, {load1[0]:.2f} after"
    )
    print(
        f"{'model':26s} {'megbrain ms':>18s} {'onnxruntime ms':>18s} {'ratio':>13s} "
        f"{'first call of a block':>30s}\n"
        f"{'':26s} {'median':>9s}{'best':>9s} {'median':>9s}{'best':>9s} {'median':>7s}"
        f"{'best':>6s} {'megbrain':>10s}{'onnxrt':>9s}{'ratio':>7s}"
    )
    for name, med, best, cold in rows:
        a, b = med["megbrain"], med["onnxruntime"]
        c, d = best["megbrain"], best["onnxruntime"]
        e, f = cold["megbrain"], cold["onnxruntime"]
        print(
            f"{name:26s} {a * 1e3:9.2f}{c * 1e3:9.2f} {b * 1e3:9.2f}{d * 1e3:9.2f} "
            f"{b / a:7.2f}{d / c:6.2f} {e * 1e3:10.2f}{f * 1e3:9.2f}{f / e:7.2f}"
        )
    for name, agg in profiles:
        print(f"\nmegbrain per operator type, {name} (ms):")
        for t, s in agg:
            if s >= 1e-5:
                print(f"  {t:28s} {s * 1e3:8.3f}")


if __name__ == "__main__":
    main()
