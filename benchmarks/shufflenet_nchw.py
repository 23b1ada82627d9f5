"""ShuffleNetV2's NCHW convolutions (its 1x1 layers and its depthwise 3x3 ones: 24 to 464
channels, not multiples of 8, so the network stays in NCHW) with the algorithm megbrain's
HEURISTIC chooses, against onnxruntime running a one-Conv+Relu model of the same shape.

    python benchmarks/shufflenet_nchw.py [--threads 1 2] [--repeat 30] [--runs 100] [--smoke]
                                         [case ...]

Cases are named ``HxW:IC->OC`` (1x1) and ``3x3/sS:C,HxW`` (depthwise, source plane). Every
output (bias + ReLU, constant filter) is checked against onnxruntime's (rtol 1e-4, atol
1e-4). Each row: the algorithm, our time (best of ``--repeat``; every case timed before any
onnxruntime session exists, whose thread pools would take the cores from ours), onnxruntime's
Conv node alone (its profiler's time, 10th percentile of ``--runs`` runs) and its whole run
(best of ``--repeat``), the ratio onnxruntime's node / ours (>= 1 is good) and our GFLOP/s;
one table with its sum per kind.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import functools  # noqa: E402

import numpy as np  # noqa: E402
from conv_fast import best_times, ort_conv_relu  # noqa: E402
from pointwise88 import _ort_node_time, parser, table  # noqa: E402

#: (filter, stride, input channels, output channels, source side): shufflenet_v2_x1_0's
#: 1x1 layers and depthwise layers (output channels = input channels)
CASES = [
    (1, 1, 24, 58, 56), (1, 1, 24, 58, 28), (1, 1, 58, 58, 28), (1, 1, 116, 116, 28),
    (1, 1, 116, 116, 14), (1, 1, 232, 232, 14), (1, 1, 232, 232, 7),
    (3, 2, 24, 24, 56), (3, 2, 58, 58, 56), (3, 1, 58, 58, 28), (3, 2, 116, 116, 28),
    (3, 1, 116, 116, 14), (3, 2, 232, 232, 14), (3, 1, 232, 232, 7),
]  # fmt: skip


def case_name(case) -> str:
    f, s, ic, oc, h = case
    return f"{h}x{h}:{ic}->{oc}" if f == 1 else f"{f}x{f}/s{s}:{ic},{h}x{h}"


def run_case(case, threads: int, repeat: int, runs: int = 100, peer: bool = True) -> dict:
    """Times of one case at ``threads`` threads (seconds) and its flops; with ``peer``,
    onnxruntime's node and whole run too, the output checked against onnxruntime's."""
    from megbrain.kernels.conv import common as conv_common
    from megbrain.kernels.conv import registry
    from megbrain.kernels.conv.constant_operands import constant_filter
    from megbrain.kernels.conv.epilogue import Epilogue

    f, s, ic, oc, h = case
    icg = 1 if f != 1 else ic
    oh = (h + 2 * (f // 2) - f) // s + 1
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (1, ic, h, h)).astype(np.float32)
    w = (rng.uniform(-1, 1, (oc, icg, f, f)) / np.sqrt(icg * f * f)).astype(np.float32)
    b = rng.uniform(-1, 1, oc).astype(np.float32)
    out = np.empty((1, oc, oh, oh), np.float32)
    # a depthwise filter is (C, 1, 1, F, F), a dense one (1, OC, IC, 1, 1)
    args = (x, w.reshape(oc, 1, 1, f, f) if icg == 1 else w[None], out, (s, s),
            (f // 2, f // 2), (1, 1))  # fmt: skip
    conv = dict(stride=s, group=ic // icg)
    conv_common.THREADS = threads
    try:
        with constant_filter(True):
            algo = registry.select("forward", *args)
            step = algo.bind(*args, epilogue=Epilogue(b, True))
        sess = ort_conv_relu(w, b, h, threads, **conv) if peer else None
        fns = {"ours": step, **({"ort_run": functools.partial(sess.run, None, {"x": x})}
                                if peer else {})}  # fmt: skip
        times = best_times(fns, repeat, False, interleave=threads == 1)
    finally:
        conv_common.THREADS = None
    if peer:
        step()
        np.testing.assert_allclose(out, sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
        times["ort"] = _ort_node_time(ic, oc, h, w, b, x, threads, runs, **conv)
    return {"name": algo.name, "flops": 2 * oc * oh * oh * icg * f * f, **times}


def main(argv=None) -> list[dict]:
    args = parser(__doc__, 30, "two small cases, 2 rounds, 1 thread").parse_args(argv)
    cases = [k for k in CASES if not args.cases or case_name(k) in args.cases]
    if args.smoke:
        cases = [(1, 1, 13, 21, 9), (3, 2, 11, 11, 9)]
        args.repeat, args.runs, args.threads = 2, 5, [1]
    rows = []
    for kind in ("1x1", "depthwise"):  # one table, with its own sum, per kind
        part = [k for k in cases if (k[0] == 1) == (kind == "1x1")]
        if part:
            print(kind)
            rows += table(part, case_name, run_case, args.threads, args.repeat, args.runs, 18)
    return rows


if __name__ == "__main__":
    main()
