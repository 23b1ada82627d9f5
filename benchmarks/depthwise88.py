"""The channel-wise (depthwise) NCHW88 convolution (CHANNELWISE_NCHW88) on the depthwise
layers of MobileNetV2, MnasNet, MobileNetV3, EfficientNet-B0 and ConvNeXt, against
onnxruntime running a one-Conv (group=C) model of the same shape and against the time a copy
of the bytes it moves takes (source read and output written once).

    python benchmarks/depthwise88.py [--threads 1 2] [--repeat 30] [--cpu] [--smoke] [case ...]

Every output is checked against onnxruntime's (rtol 1e-4, atol 1e-4).

Cases are named ``FxF/sS:C,HxW`` (channels, source plane). Each row: our time, onnxruntime's
(NCHW, the same threads), their ratio (onnxruntime / ours, >= 1 is good), GMAC/s and our
time over the copy's (the memory floor; 1.0 would be memory speed). Ours, onnxruntime's and
the copy are timed interleaved, best of ``--repeat`` rounds. ``--cpu`` times the calling
thread's CPU time instead of wall time: with ``--threads 1`` (onnxruntime then runs on the
caller's thread too) the steadier comparison on a loaded machine.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402

import numpy as np  # noqa: E402
from conv_fast import best_times, ort_conv_relu  # noqa: E402

#: (filter, stride, channels, source side): the zoo's depthwise layers
CASES = [
    (3, 1, 32, 112), (3, 1, 16, 112), (3, 1, 144, 56), (3, 1, 192, 28), (3, 1, 384, 14),
    (3, 1, 576, 14), (3, 1, 960, 7),
    (3, 2, 96, 112), (3, 2, 144, 56), (3, 2, 576, 14),
    (5, 1, 240, 28), (5, 1, 672, 14), (5, 1, 240, 14), (5, 1, 1152, 7),
    (5, 2, 144, 56), (5, 2, 672, 14),
    (7, 1, 96, 56), (7, 1, 768, 7),
]  # fmt: skip


def case_name(case) -> str:
    f, s, c, h = case
    return f"{f}x{f}/s{s}:{c},{h}x{h}"


def run_case(case, threads: int, repeat: int, peer: bool = True, cpu: bool = False) -> dict:
    """Times of one case at ``threads`` threads (seconds), and its MACs and bytes; with
    ``peer``, onnxruntime's too, and the output checked against it."""
    from megbrain.kernels.conv import common as conv_common
    from megbrain.kernels.conv import nchw88 as conv_nchw88
    from megbrain.kernels.conv.constant_operands import constant_filter
    from megbrain.kernels.conv.epilogue import Epilogue

    f, s, c, h = case
    p = f // 2
    oh = (h + 2 * p - f) // s + 1
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (1, c, h, h)).astype(np.float32)
    w = rng.uniform(-1, 1, (c, 1, f, f)).astype(np.float32)
    b = rng.uniform(-1, 1, c).astype(np.float32)
    src = np.ascontiguousarray(conv_nchw88.to_nchw88(x))
    filt = np.ascontiguousarray(w.reshape(c // 8, 8, f, f).transpose(0, 2, 3, 1))[:, None, None]
    out = np.empty((1, c // 8, oh, oh, 8), np.float32)
    conv_common.THREADS = threads
    try:
        with constant_filter(True):
            name, step = conv_nchw88.bind_nchw88_forward(
                src, filt, out, (s, s), (p, p), (1, 1), group=True,
                epilogue=Epilogue(b, True))  # fmt: skip
        fns = {"ours": step}
        big = np.empty((src.size + out.size) // 2, np.float32)  # read + written: the bytes
        dst = np.empty_like(big)
        fns["copy"] = lambda: np.copyto(dst, big)
        if peer:
            sess = ort_conv_relu(w, b, h, threads, stride=s, group=c)
            fns["ort"] = lambda: sess.run(None, {"x": x})
        times = best_times(fns, repeat, cpu, interleave=threads == 1)
        step()
    finally:
        conv_common.THREADS = None
    if peer:
        want = sess.run(None, {"x": x})[0]
        np.testing.assert_allclose(conv_nchw88.to_nchw(out), want, rtol=1e-4, atol=1e-4)
    return {"name": name, "macs": c * oh * oh * f * f, "bytes": 4 * (src.size + out.size),
            **times}  # fmt: skip


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="*", help="case names (default: all)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--cpu", action="store_true", help="the calling thread's CPU time")
    ap.add_argument("--smoke", action="store_true", help="two small cases, 2 rounds, 1 thread")
    args = ap.parse_args(argv)
    cases = [k for k in CASES if not args.cases or case_name(k) in args.cases]
    if args.smoke:
        cases, args.repeat, args.threads = [(3, 1, 16, 20), (5, 2, 24, 15)], 2, [1]
    rows = []
    print(f"{'case':>18} {'thr':>3} {'ours ms':>8} {'ort ms':>8} {'ratio':>6} {'GMAC/s':>7} "
          f"{'xcopy':>6}")  # fmt: skip
    for threads in args.threads:
        tot = dict(ours=0.0, ort=0.0)
        for case in cases:
            r = run_case(case, threads, args.repeat, cpu=args.cpu)
            rows.append({"case": case_name(case), "threads": threads, **r})
            ort_ms = r.get("ort", float("nan")) * 1e3
            tot["ours"] += r["ours"]
            tot["ort"] += r.get("ort", float("nan"))
            print(f"{case_name(case):>18} {threads:>3} {r['ours'] * 1e3:8.3f} {ort_ms:8.3f} "
                  f"{r.get('ort', float('nan')) / r['ours']:6.2f} "
                  f"{r['macs'] / r['ours'] * 1e-9:7.1f} {r['ours'] / r['copy']:6.1f}")  # fmt: skip
        print(f"{'total':>18} {threads:>3} {tot['ours'] * 1e3:8.3f} {tot['ort'] * 1e3:8.3f} "
              f"{tot['ort'] / tot['ours']:6.2f}")  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
