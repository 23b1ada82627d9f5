"""Overhead of each plugin (megbrain.plugin) against no plugin on the same function.

(a) a chain of 30 elementwise operators on 16-element float32 tensors (per-operator cost
    dominates: the worst case for a plugin);
(b) one training step of the digits CNN (batch 32; kernels dominate).

Each plugin is attached to a fresh graph before the function is compiled; the ratio is the
best time per call with the plugin over the best without. The dumps write to a temporary
directory (text to a file, binary one file per var). No target: the numbers tell what a
debugging session costs.

Run: ``python benchmarks/plugin_overhead.py [--repeats N]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

import megbrain as mgb
from megbrain import optim, plugin

N = 16


def best_of(fns: dict, numbers: dict, repeats: int) -> dict:
    """Best per-call time of each function, timed in turn within each repeat."""
    for fn in fns.values():
        fn()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for key, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(numbers[key]):
                fn()
            best[key] = min(best[key], (time.perf_counter() - t0) / numbers[key])
    return best


def _attach(kind: str, g, tmp: str):
    if kind == "none":
        return None
    if kind == "CompGraphProfiler":
        return plugin.CompGraphProfiler(g)
    if kind == "NumRangeChecker":
        return plugin.NumRangeChecker(g, 1e30)
    if kind == "TextOprIODump":
        return plugin.TextOprIODump(g, os.path.join(tmp, f"io_{g.id}.txt"))
    if kind == "BinaryOprIODump":
        return plugin.BinaryOprIODump(g, os.path.join(tmp, f"bin_{g.id}"))
    if kind == "InfkernFinder":
        return plugin.InfkernFinder(g, False)
    raise ValueError(kind)


KINDS = [
    "none",
    "CompGraphProfiler",
    "NumRangeChecker",
    "InfkernFinder",
    "TextOprIODump",
    "BinaryOprIODump",
]


def chain_case(kind: str, tmp: str):
    g = mgb.comp_graph()
    keep = _attach(kind, g, tmp)
    x = mgb.make_arg("cpu0", g, name="x", value=np.ones(N, np.float32))
    h = x
    for i in range(30):
        h = h * 1.0001 if i % 2 else h + 0.5
    f = g.compile(None, [h])

    def run():
        f()

    run.keep = keep
    return run


def digits_case(kind: str, tmp: str):
    from megbrain.examples.digits import build_train_step, make_model

    g = mgb.comp_graph()
    keep = _attach(kind, g, tmp)
    model = make_model("cnn")
    step, _ = build_train_step(model, optim.Adam, 32, graph=g, lr=1e-3)
    rng = np.random.default_rng(0)
    xb = rng.random((32, 1, 8, 8), dtype=np.float32)
    yb = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 32)]

    def run():
        step(xb, yb)

    run.keep = keep
    return run


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        cases = (("30-op chain", chain_case, 300), ("digits CNN step", digits_case, 5))
        for case, make, number in cases:
            fns = {k: make(k, tmp) for k in KINDS}
            best = best_of(fns, dict.fromkeys(KINDS, number), args.repeats)
            results[case] = best
    print(f"{'plugin':<20}" + "".join(f"{c:>26}" for c in results))
    for k in KINDS:
        row = f"{k:<20}"
        for best in results.values():
            row += f"{best[k] * 1e6:>12.1f} us {best[k] / best['none']:>8.2f}x  "
        print(row)
    return results


if __name__ == "__main__":
    main()
