"""The pointwise (1x1, stride 1) NCHW88 convolutions of MobileNetV2, MnasNet0.5,
MobileNetV3-small and EfficientNet-B0 (POINTWISE_NCHW88, or whatever ``bind_nchw88_forward``
chooses) against onnxruntime running a one-Conv+Relu model of the same shape.

    python benchmarks/pointwise88.py [--threads 1 2] [--repeat 30] [--runs 100] [--smoke]
                                     [case ...]

Every output (bias + ReLU, constant filter) is checked against onnxruntime's (rtol 1e-4,
atol 1e-4). Cases are named ``HxW:IC->OC``. Each row: our time (best of ``--repeat``, every
case timed before onnxruntime's sessions are made),
onnxruntime's fused Conv node alone (its profiler's time, 10th percentile of ``--runs`` runs:
its reorders to and from its blocked layout are not counted) and its whole run (best of
``--repeat``, reorders included), the ratio onnxruntime's node time / ours (>= 1 is good) and
our GFLOP/s; then the sums over the cases.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402

import numpy as np  # noqa: E402
from conv_fast import best_times, ort_conv_relu  # noqa: E402

#: (plane side, input channels, output channels): the four models' pointwise layers (the
#: squeeze-and-excitation ones of MobileNetV3 on their 1x1 planes too)
CASES = [
    # mobilenet_v2
    (112, 32, 16), (112, 16, 96), (56, 96, 24), (56, 24, 144), (56, 144, 24), (28, 144, 32),
    (28, 32, 192), (28, 192, 32), (14, 192, 64), (14, 64, 384), (14, 384, 64), (14, 384, 96),
    (14, 96, 576), (14, 576, 96), (7, 576, 160), (7, 160, 960), (7, 960, 160), (7, 960, 320),
    (7, 320, 1280),
    # mnasnet0_5
    (112, 16, 8), (112, 8, 24), (56, 24, 16), (56, 16, 48), (56, 48, 16), (28, 48, 24),
    (28, 24, 72), (28, 72, 24), (28, 24, 144), (14, 144, 40), (14, 40, 240), (14, 240, 40),
    (14, 240, 48), (14, 48, 288), (14, 288, 48), (7, 288, 96), (7, 96, 576), (7, 576, 96),
    (7, 576, 160), (7, 160, 1280),
    # mobilenet_v3_small
    (56, 16, 16), (56, 16, 72), (28, 72, 24), (28, 24, 88), (28, 88, 24), (28, 24, 96),
    (14, 96, 40), (14, 120, 48), (14, 40, 120), (14, 48, 144), (14, 144, 48), (14, 288, 96),
    (7, 288, 96), (1, 576, 144), (1, 144, 576), (1, 240, 64), (1, 64, 240), (1, 96, 24),
    (1, 24, 96),
    # efficientnet_b0
    (112, 32, 16), (28, 144, 40), (28, 40, 240), (28, 240, 40), (14, 240, 80), (14, 80, 480),
    (14, 480, 80), (14, 480, 112), (14, 112, 672), (14, 672, 112), (7, 672, 192),
    (7, 192, 1152), (7, 1152, 192), (7, 1152, 320),
]  # fmt: skip
CASES = list(dict.fromkeys(CASES))  # the models share some


def case_name(case) -> str:
    h, ic, oc = case
    return f"{h}x{h}:{ic}->{oc}"


def _ort_node_time(ic, oc, h, w, b, x, threads: int, runs: int, **conv) -> float:
    """The 10th percentile of onnxruntime's Conv node time (seconds) over ``runs`` runs
    (``conv``: the ``stride`` and ``group`` of :func:`conv_fast.ort_conv_relu`)."""
    with tempfile.TemporaryDirectory() as tmp:
        sess = ort_conv_relu(w, b, h, threads, profile=os.path.join(tmp, "pw"), **conv)
        for _ in range(runs + 5):
            sess.run(None, {"x": x})
        with open(sess.end_profiling()) as f:
            events = json.load(f)
    durs = [e["dur"] for e in events if e.get("cat") == "Node"
            and e.get("args", {}).get("op_name") in ("Conv", "FusedConv")
            and e["name"].endswith("_kernel_time")]  # fmt: skip
    return float(np.percentile(durs[5:], 10)) * 1e-6


def run_case(case, threads: int, repeat: int, runs: int = 100, peer: bool = True) -> dict:
    """Times of one case at ``threads`` threads (seconds): ours, and with ``peer``
    onnxruntime's node and whole run, the output checked against onnxruntime's."""
    from megbrain.kernels.conv import common as conv_common
    from megbrain.kernels.conv import nchw88 as conv_nchw88
    from megbrain.kernels.conv.constant_operands import constant_filter
    from megbrain.kernels.conv.epilogue import Epilogue

    h, ic, oc = case
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (1, ic, h, h)).astype(np.float32)
    w = (rng.uniform(-1, 1, (oc, ic, 1, 1)) / np.sqrt(ic)).astype(np.float32)
    b = rng.uniform(-1, 1, oc).astype(np.float32)
    src = np.ascontiguousarray(conv_nchw88.to_nchw88(x))
    filt = np.ascontiguousarray(w[:, :, 0, 0].reshape(oc // 8, 8, ic // 8, 8)
                                .transpose(0, 2, 3, 1))[:, :, None, None]  # fmt: skip
    out = np.empty((1, oc // 8, h, h, 8), np.float32)
    conv_common.THREADS = threads
    try:
        with constant_filter(True):
            name, step = conv_nchw88.bind_nchw88_forward(
                src, filt, out, (1, 1), (0, 0), (1, 1), epilogue=Epilogue(b, True))
        fns = {"ours": step}
        if peer:
            sess = ort_conv_relu(w, b, h, threads)
            fns["ort_run"] = lambda: sess.run(None, {"x": x})
        times = best_times(fns, repeat, False, interleave=threads == 1)
        step()
    finally:
        conv_common.THREADS = None
    if peer:
        want = sess.run(None, {"x": x})[0]
        np.testing.assert_allclose(conv_nchw88.to_nchw(out), want, rtol=1e-4, atol=1e-4)
        times["ort"] = _ort_node_time(ic, oc, h, w, b, x, threads, runs)
    return {"name": name, "flops": 2 * h * h * ic * oc, **times}


def layer_args(doc: str, argv, cases: list, name, smoke: list):
    """``(args, cases)`` of a per-layer benchmark: the positional case names (``name(case)``
    of ``cases``; default all), ``--threads``, ``--repeat``, ``--runs`` (onnxruntime's
    profiled runs) and ``--smoke`` (the ``smoke`` cases, 2 rounds, 1 thread)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("cases", nargs="*", help="case names (default: all)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--runs", type=int, default=100, help="onnxruntime's profiled runs")
    ap.add_argument("--smoke", action="store_true", help="two small cases, 2 rounds, 1 thread")
    args = ap.parse_args(argv)
    cases = [k for k in cases if not args.cases or name(k) in args.cases]
    if args.smoke:
        cases, args.repeat, args.runs, args.threads = smoke, 2, 5, [1]
    return args, cases


def row_line(label: str, threads: int, r: dict, width: int = 16) -> str:
    """A printed row: ``label``, ``threads``, ``r``'s algorithm ``name``, times (ms) ``ours``,
    ``ort`` (onnxruntime's node) and ``ort_run``, their ratio, and with ``flops`` our
    GFLOP/s."""
    gf = f" {r['flops'] / r['ours'] * 1e-9:6.1f}" if "flops" in r else ""
    return (f"{label:>{width}} {threads:>3} {r.get('name', ''):>17} {r['ours'] * 1e3:8.3f} "
            f"{r['ort'] * 1e3:8.3f} {r['ort_run'] * 1e3:8.3f} {r['ort'] / r['ours']:6.2f}"
            + gf)  # fmt: skip


def main(argv=None) -> list[dict]:
    args, cases = layer_args(__doc__, argv, CASES, case_name, [(7, 16, 24), (1, 24, 16)])
    rows = []
    print(f"{'case':>16} {'thr':>3} {'algorithm':>17} {'ours ms':>8} {'ort node':>8} "
          f"{'ort run':>8} {'ratio':>6} {'GF/s':>6}")  # fmt: skip
    for threads in args.threads:
        tot = dict(ours=0.0, ort=0.0, ort_run=0.0)
        worst = (float("inf"), "")
        # ours first, every case, before any onnxruntime session exists: its sessions' thread
        # pools take the cores from a split kernel timed after them (2 threads: 8.1 ms
        # against 3.5 ms over the 68 cases, the same kernels)
        alone = {case: run_case(case, threads, args.repeat, peer=False)["ours"]
                 for case in cases}  # fmt: skip
        for case in cases:
            r = {**run_case(case, threads, args.repeat, args.runs), "ours": alone[case]}
            rows.append({"case": case_name(case), "threads": threads, **r})
            for k in tot:
                tot[k] += r[k]
            worst = min(worst, (r["ort"] / r["ours"], case_name(case)))
            print(row_line(case_name(case), threads, r))
        print(row_line("sum", threads, tot) + f"   lowest {worst[0]:.2f} ({worst[1]})")
    return rows


if __name__ == "__main__":
    main()
