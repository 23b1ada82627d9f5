"""The first layers (3 input channels, DIRECT_NCHW_NCHW88) of the networks of
``onnx_zoo.py`` against onnxruntime running a one-Conv+Relu model of the same shape.

    python benchmarks/stem88.py [--threads 1 2] [--repeat 50] [--runs 100] [--smoke]
                                [case ...]

Every output (bias + ReLU, constant filter, a 3x224x224 source) is checked against
onnxruntime's (rtol 1e-4, atol 1e-4). Cases are named ``FxF/sS/pP:3->OC``. Each row: our
time (best of ``--repeat``, every case timed before onnxruntime's sessions are made),
onnxruntime's fused Conv node alone (its profiler's time, 10th percentile of ``--runs``
runs) and its whole run (best of ``--repeat``), the ratio onnxruntime's node time / ours
(>= 1 is good) and our GFLOP/s; then the sums over the cases.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402

import numpy as np  # noqa: E402
from conv_fast import best_times, ort_conv_relu  # noqa: E402
from pointwise88 import _ort_node_time  # noqa: E402

#: (filter side, stride, padding, output channels) of a 3-channel 224x224 first layer
CASES = [
    (3, 2, 1, 16),  # mnasnet0_5, mobilenet_v3_small
    (3, 2, 1, 24),  # shufflenet_v2_x1_0
    (3, 2, 1, 32),  # mobilenet_v2, efficientnet_b0, regnet_y_400mf
    (3, 2, 0, 64),  # squeezenet1_1
    (7, 2, 3, 64),  # resnet18, resnet50, googlenet, densenet121
    (4, 4, 0, 96),  # convnext_tiny
]
IC = 3
SIDE = 224


def case_name(case) -> str:
    f, s, p, oc = case
    return f"{f}x{f}/s{s}/p{p}:{IC}->{oc}"


def run_case(case, threads: int, repeat: int, runs: int = 100, peer: bool = True,
             side: int = SIDE) -> dict:  # fmt: skip
    """Times of one case at ``threads`` threads (seconds): ours, and with ``peer``
    onnxruntime's node and whole run, the output checked against onnxruntime's."""
    from megbrain.kernels.conv import common as conv_common
    from megbrain.kernels.conv import nchw88 as conv_nchw88
    from megbrain.kernels.conv.constant_operands import constant_filter
    from megbrain.kernels.conv.epilogue import Epilogue

    f, s, p, oc = case
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (1, IC, side, side)).astype(np.float32)
    w = (rng.uniform(-1, 1, (oc, IC, f, f)) / np.sqrt(IC * f * f)).astype(np.float32)
    b = rng.uniform(-1, 1, oc).astype(np.float32)
    filt = np.ascontiguousarray(w.reshape(oc // 8, 8, IC, f, f).transpose(0, 3, 4, 2, 1))
    o = conv_common.conv_out_size(side, f, s, p, 1)
    out = np.empty((1, oc // 8, o, o, 8), np.float32)
    conv_common.THREADS = threads
    try:
        with constant_filter(True):
            name, step = conv_nchw88.bind_nchw88_forward(
                x, filt, out, (s, s), (p, p), (1, 1), epilogue=Epilogue(b, True))
        fns = {"ours": step}
        if peer:
            sess = ort_conv_relu(w, b, side, threads, stride=s, pad=p)
            fns["ort_run"] = lambda: sess.run(None, {"x": x})
        times = best_times(fns, repeat, False, interleave=threads == 1)
        step()
    finally:
        conv_common.THREADS = None
    if peer:
        want = sess.run(None, {"x": x})[0]
        np.testing.assert_allclose(conv_nchw88.to_nchw(out), want, rtol=1e-4, atol=1e-4)
        times["ort"] = _ort_node_time(IC, oc, side, w, b, x, threads, runs, stride=s, pad=p)
    return {"name": name, "flops": 2 * o * o * IC * f * f * oc, **times}


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="*", help="case names (default: all)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--runs", type=int, default=100, help="onnxruntime's profiled runs")
    ap.add_argument("--smoke", action="store_true", help="two cases at 32x32, 2 rounds, 1 thread")
    args = ap.parse_args(argv)
    cases = [k for k in CASES if not args.cases or case_name(k) in args.cases]
    side = SIDE
    if args.smoke:
        cases, side, args.repeat, args.runs, args.threads = CASES[1:3], 32, 2, 5, [1]
    rows = []
    print(f"{'case':>18} {'thr':>3} {'algorithm':>18} {'ours ms':>8} {'ort node':>8} "
          f"{'ort run':>8} {'ratio':>6} {'GF/s':>6}")  # fmt: skip
    for threads in args.threads:
        tot = dict(ours=0.0, ort=0.0, ort_run=0.0)
        worst = (float("inf"), "")
        # ours first, before any onnxruntime session exists (its thread pools take the
        # cores from a split kernel timed after them: see pointwise88.py)
        alone = {case: run_case(case, threads, args.repeat, peer=False, side=side)["ours"]
                 for case in cases}  # fmt: skip
        for case in cases:
            r = {**run_case(case, threads, args.repeat, args.runs, side=side),
                 "ours": alone[case]}  # fmt: skip
            rows.append({"case": case_name(case), "threads": threads, **r})
            for k in tot:
                tot[k] += r[k]
            ratio = r["ort"] / r["ours"]
            worst = min(worst, (ratio, case_name(case)))
            print(f"{case_name(case):>18} {threads:>3} {r['name']:>18} {r['ours'] * 1e3:8.3f} "
                  f"{r['ort'] * 1e3:8.3f} {r['ort_run'] * 1e3:8.3f} {ratio:6.2f} "
                  f"{r['flops'] / r['ours'] * 1e-9:6.1f}")  # fmt: skip
        print(f"{'sum':>18} {threads:>3} {'':>18} {tot['ours'] * 1e3:8.3f} {tot['ort'] * 1e3:8.3f} "
              f"{tot['ort_run'] * 1e3:8.3f} {tot['ort'] / tot['ours']:6.2f}   lowest "
              f"{worst[0]:.2f} ({worst[1]})")  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
