"""torchvision's classification models through ONNX: megbrain (``megbrain.onnx.load_inference``,
exactly as a user calls it) against onnxruntime, same machine, process and thread count.

Each model (random weights, eval mode, batch 1, 3x224x224) is exported at opset 17 with
``torch.onnx.export(..., dynamo=False)`` into a cache under the temp directory
(:mod:`torchvision_models`), checked against onnxruntime (rtol 1e-3), then timed with the
interleaved blocks of ``onnx_inference.py``. Printed per model: the steady-state medians (a
block's calls after its first) of both sides and their ratio (onnxruntime's time / ours,
higher is better for megbrain), the first call after compile (megbrain: binding and planning
included; onnxruntime: its first ``run``) and its ratio; then the geometric means.

    python benchmarks/onnx_zoo.py [--threads 2] [--rounds R] [--models a,b|all]
        [--profile [--top N]]

``--models all`` tries every classification model of torchvision (a model that does not
export or load is reported, not timed). ``--profile`` then runs each model under megbrain's
CompGraphProfiler (a separate function: the timed one carries no profiler) and lists its top
operators by steady-state time (median per operator over the runs): per kind (type, layout,
depthwise / grouped / dense, filter size, stride) and one by one, with shapes and shares.
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import time

import numpy as np
import op_profile
import torchvision_models as zoo
from onnx_inference import _limit_threads, _ort_runner, _settings, interleaved


def _profile(path: str, feed: dict, runs: int) -> list[tuple[str, str, float]]:
    import megbrain.onnx as mo

    def build(graph):
        return functools.partial(mo.load_inference(path, graph=graph), **feed)

    return op_profile.profile(build, runs)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--models", default=",".join(zoo.DEFAULT_MODELS), help="names, or all")
    ap.add_argument("--profile", action="store_true", help="megbrain's top operators")
    ap.add_argument("--top", type=int, default=8, help="rows of each --profile table")
    args = ap.parse_args(argv)
    import onnxruntime  # noqa: F401 - fail early without the peer

    import megbrain.onnx as mo

    tv = zoo.import_torchvision()
    names = zoo.classification_models(tv) if args.models == "all" else args.models.split(",")
    _limit_threads(args.threads)
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    feed = {"x": x}
    rows, failed, profiles = [], [], []
    for name in names:
        try:
            path = zoo.cached_export(tv, name)
        except Exception as exc:  # noqa: BLE001 - any exporter failure: report, go on
            failed.append((name, f"does not export: {type(exc).__name__}: {exc}"))
            continue
        _limit_threads(args.threads)
        try:
            t0 = time.perf_counter()
            f = mo.load_inference(path)
            compile_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            (ours,) = f(**feed)
            first_ours = time.perf_counter() - t0
        except Exception as exc:  # noqa: BLE001 - a model megbrain refuses: report, go on
            failed.append((name, f"does not load: {type(exc).__name__}: {str(exc)[:200]}"))
            continue
        ort_run = _ort_runner(path, feed, args.threads, spin=True)
        t0 = time.perf_counter()
        (want,) = ort_run()
        first_ort = time.perf_counter() - t0
        ok = np.allclose(ours, want, rtol=1e-3, atol=1e-4 * max(1.0, float(np.abs(want).max())))
        if not ok:
            err = float(np.abs(ours - want).max())
            failed.append((name, f"differs from onnxruntime (max abs error {err:.3g})"))
        ours_run = functools.partial(f, **feed)
        steady, _ = interleaved({"megbrain": ours_run, "onnxruntime": ort_run}, args.rounds)
        med = {k: statistics.median(v) for k, v in steady.items()}
        rows.append((name, med["megbrain"], med["onnxruntime"], first_ours, first_ort, compile_s))
        if args.profile:
            profiles.append((name, _profile(path, feed, max(10, args.rounds))))
    print(_settings(args.threads, True))
    print(f"{args.rounds} interleaved rounds; batch 1, 3x224x224; ratio = onnxruntime / megbrain")
    print(f"{'model':22s} {'megbrain ms':>12s} {'onnxrt ms':>10s} {'ratio':>6s}   "
          f"{'first call ms: megbrain':>24s} {'onnxrt':>7s} {'ratio':>6s} {'/steady':>7s}"
          f" {'load+compile s':>14s}")  # fmt: skip
    for name, a, b, fa, fb, cs in rows:
        print(f"{name:22s} {a * 1e3:12.2f} {b * 1e3:10.2f} {b / a:6.2f}   {fa * 1e3:24.1f} "
              f"{fb * 1e3:7.1f} {fb / fa:6.2f} {fa / a:7.1f} {cs:14.1f}")  # fmt: skip
    if rows:
        gm = math.exp(statistics.fmean(math.log(b / a) for _, a, b, *_ in rows))
        gf = math.exp(statistics.fmean(math.log(fb / fa) for _, _, _, fa, fb, _ in rows))
        print(f"{'geometric mean':22s} {'':12s} {'':10s} {gm:6.2f}   {'':24s} {'':7s} {gf:6.2f}"
              f"   ({len(rows)} models)")  # fmt: skip
    for name, why in failed:
        print(f"{name}: {why}")
    for name, prof_rows in profiles:
        op_profile.print_profile(name, prof_rows, args.top)


if __name__ == "__main__":
    main()
