"""Inference of a conv + BatchNorm + ReLU network before and after ``optimize_for_inference``.

The network: ``--layers`` blocks of 3x3 convolution (with bias), ``nn.BatchNorm2d`` in eval
mode (the elementwise ``(x - mean) / sqrt(var + eps) * gamma + beta``) and ReLU, on a batch
of NCHW float32 images. Each variant is compiled once and timed as the best of ``--repeats``
loops; the table gives the time per inference, the operators in the compiled seq and the
speed-up over the unoptimized graph. Results are checked against the unoptimized ones.

Run: ``python benchmarks/inference_opt.py [--batch N] [--size HW] [--layers N]``.
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np

import megbrain as mgb
from megbrain import nn
from megbrain.opr.dnn import convolution

CN = "cpu0"


def build(batch: int, size: int, layers: int, width: int, seed: int = 0):
    """(graph, input var, output var, input value) of the network."""
    rng = np.random.default_rng(seed)
    g = mgb.comp_graph()
    g.set_option("log_level", 0)
    x = mgb.make_arg(CN, g, name="x", shape=(batch, 3, size, size))
    h, cin = x, 3
    for i in range(layers):
        w = rng.standard_normal((width, cin, 3, 3)).astype(np.float32) / np.sqrt(9 * cin)
        b = rng.standard_normal((1, width, 1, 1)).astype(np.float32) * 0.1
        wv = mgb.make_shared(CN, value=w, comp_graph=g, name=f"w{i}")
        bv = mgb.make_shared(CN, value=b, comp_graph=g, name=f"b{i}")
        h = convolution(h, wv, pad_h=1, pad_w=1) + bv
        bn = nn.BatchNorm2d(width)
        bn.running_mean.set_value(rng.standard_normal(width).astype(np.float32) * 0.1)
        bn.running_var.set_value(rng.uniform(0.5, 1.5, width).astype(np.float32))
        bn.weight.set_value(rng.uniform(0.5, 1.5, width).astype(np.float32))
        bn.bias.set_value(rng.standard_normal(width).astype(np.float32) * 0.1)
        bn.training = False
        h = mgb.opr.elem.relu(bn(h))
        cin = width
    xv = rng.standard_normal((batch, 3, size, size)).astype(np.float32)
    return g, x, h, xv


def best_of(fns: list, repeats: int, number: int) -> list[float]:
    """Best time per call of each function; they are timed in turn within each repeat, so
    that load changes on a shared machine hit them alike."""
    for fn in fns:
        fn()  # warm up: plan and bind
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            best[i] = min(best[i], (time.perf_counter() - t0) / number)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--number", type=int, default=5)
    args = ap.parse_args()
    print(f"python {platform.python_version()}, numpy {np.__version__}, {platform.machine()}")
    print(f"network: {args.layers} x (conv3x3 {args.width}ch + bias, BatchNorm2d eval, ReLU), "
          f"input ({args.batch}, 3, {args.size}, {args.size}) float32")  # fmt: skip
    variants = {
        "unoptimized": None,
        "optimize_for_inference()": {},
        "+ fuse_conv_bias_nonlinearity": {"fuse_conv_bias_nonlinearity": True},
        "+ fuse, f16_io_f32_comp": {"fuse_conv_bias_nonlinearity": True, "f16_io_f32_comp": True},
    }
    rows, fns, ref = [], [], None
    for label, flags in variants.items():
        g, x, y, xv = build(args.batch, args.size, args.layers, args.width)
        if flags is not None:
            (y,) = mgb.optimize_for_inference([y], **flags)
        f = g.compile([x], mgb.copy_output(y))
        out = f(xv)
        if ref is None:
            ref = out
        err = float(np.max(np.abs(out - ref)) / max(1.0, float(np.max(np.abs(ref)))))
        n = sum(1 for _ in f._func.iter_opr_seq())
        rows.append((label, n, err))
        fns.append(lambda f=f, xv=xv: f(xv))
    times = best_of(fns, args.repeats, args.number)
    rows = [(label, t, n, err) for (label, n, err), t in zip(rows, times)]
    base = rows[0][1]
    print(f"{'variant':<34}{'ms / inference':>15}{'oprs':>6}{'speed-up':>10}{'max rel err':>13}")
    for label, t, n, err in rows:
        print(f"{label:<34}{t * 1e3:>15.3f}{n:>6}{base / t:>9.2f}x{err:>13.2e}")


if __name__ == "__main__":
    main()
