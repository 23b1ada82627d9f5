"""Compile time per operator at graph_opt_level 2 (target: <= 1 ms per operator).

A training graph of about 300 operators: an MLP forward pass, its loss, the gradients of
every parameter (VirtualGrad, expanded at compile) and one ``add_update`` per parameter. The
time of ``CompGraph.compile`` (optimizer passes, VirtualGrad expansion, comp seq, executor
construction) and of the first run (static memory plan and program binding, which the first
call builds) are reported per operator of the compiled seq, with the optimizer's share.
``--profile`` prints the cProfile hot spots of compile + first run.

Then the scaling table: a residual MLP's training step (``h = h + relu(h @ w + b)`` per block,
the gradient and update of every weight) at ``--blocks`` sizes (1,000 / 4,000 / 16,000 by
default), in CPU seconds: compile, the first run's planning (the first run less a later
one), their ratio (target <= 1.0) and the log-log slopes from the first size to the last
(target <= 1.15); ``--big 64000`` also compiles and runs a graph of about 64,000 operators
(target < 60 s).

Run: ``python benchmarks/compile_time.py [--layers N] [--profile] [--blocks 1000,4000]
[--big 64000]``.
"""

from __future__ import annotations

import argparse
import cProfile
import math
import platform
import pstats
import time

import numpy as np

import megbrain as mgb
from megbrain import gopt

CN = "cpu0"
TARGET_MS = 1.0


def build(layers: int, width: int = 32, batch: int = 16, seed: int = 0):
    """(graph, outspec, feed) of one MLP training step with ``layers`` dense layers."""
    rng = np.random.default_rng(seed)
    g = mgb.comp_graph()
    g.set_option("graph_opt_level", 2)
    g.set_option("log_level", 0)
    x = mgb.make_arg(CN, g, name="x", shape=(batch, width))
    label = mgb.make_arg(CN, g, name="label", shape=(batch, width))
    params, h = [], x
    for i in range(layers):
        w = mgb.make_shared(
            CN, value=(rng.standard_normal((width, width)) * 0.2).astype(np.float32),
            comp_graph=g, name=f"w{i}",
        )  # fmt: skip
        b = mgb.make_shared(CN, value=np.zeros((1, width), np.float32), comp_graph=g, name=f"b{i}")
        params += [w, b]
        h = mgb.opr.matrix_mul(h, w) + b
        if i < layers - 1:
            h = mgb.opr.elem.relu(h) * 1.0 + 0.0  # level 1 removes the no-ops
            h = mgb.opr.elem.tanh(h) * 0.5 + h * 0.5
    d = h - label
    loss = (d * d).mean()
    grads = mgb.grad(loss, params)
    ups = [mgb.opr.add_update(p, gr, beta=-0.01) for p, gr in zip(params, grads)]
    feed = {
        "x": rng.standard_normal((batch, width)).astype(np.float32),
        "label": rng.standard_normal((batch, width)).astype(np.float32),
    }
    return g, [mgb.copy_output(loss)] + ups, feed


def build_residual(blocks: int, width: int = 8, batch: int = 4, seed: int = 0):
    """(graph, outspec, feed) of a residual MLP training step: ``blocks`` blocks of
    ``h = h + relu(h @ w + b)``, a squared loss, the gradient of every weight and bias and
    an ``add_update`` of each (tiny tensors: the graph's size, not the math, is measured)."""
    rng = np.random.default_rng(seed)
    g = mgb.comp_graph()
    g.set_option("graph_opt_level", 2)
    g.set_option("log_level", 0)
    x = mgb.make_arg(CN, g, name="x", shape=(batch, width))
    w0 = np.zeros((width, width), np.float32)  # the residual sum stays finite at any depth
    b0 = np.zeros((1, width), np.float32)
    params, h = [], x
    for i in range(blocks):
        w = mgb.make_shared(CN, value=w0, comp_graph=g, name=f"w{i}")
        b = mgb.make_shared(CN, value=b0, comp_graph=g, name=f"b{i}")
        params += [w, b]
        h = h + mgb.opr.elem.relu(mgb.opr.matrix_mul(h, w) + b)
    loss = (h * h).mean()
    grads = mgb.grad(loss, params)
    ups = [mgb.opr.add_update(p, gr, beta=-1e-4) for p, gr in zip(params, grads)]
    feed = {"x": rng.standard_normal((batch, width)).astype(np.float32)}
    return g, [mgb.copy_output(loss)] + ups, feed


def measure_residual(blocks: int) -> dict:
    """Compile time, first-run planning time (the first run less a later run) and the seq
    length of the residual MLP of ``blocks`` blocks. Times are the process's CPU time: on a
    shared machine wall-clock time mostly measures the neighbours."""
    g, outspec, feed = build_residual(blocks)
    clock = time.process_time
    t0 = clock()
    f = g.compile(None, outspec)
    t1 = clock()
    f(**feed)
    t2 = clock()
    f(**feed)
    t3 = clock()
    return {
        "blocks": blocks,
        "oprs": sum(1 for _ in f._func.iter_opr_seq()),
        "compile": t1 - t0,
        "plan": max((t2 - t1) - (t3 - t2), 1e-9),
        "run": t3 - t2,
    }


def _slope(a: dict, b: dict, key: str) -> float:
    return math.log(b[key] / a[key]) / math.log(b["blocks"] / a["blocks"])


def residual_table(sizes: list[int], big_oprs: int = 0) -> None:
    """Print compile and planning time of the residual MLP per size, their ratio and the
    log-log slopes from the first size to the last; with ``big_oprs``, also the time to
    compile and run the first step of a graph of about that many operators."""
    print("\nresidual MLP training step (matmul, bias, ReLU, add per block), CPU seconds")
    print(f"{'blocks':>8}{'oprs':>9}{'compile s':>11}{'plan s':>9}{'plan/compile':>14}")
    rows = []
    for n in sizes:
        r = measure_residual(n)
        rows.append(r)
        print(f"{n:>8}{r['oprs']:>9}{r['compile']:>11.3f}{r['plan']:>9.3f}"
              f"{r['plan'] / r['compile']:>14.2f}")  # fmt: skip
    if len(rows) > 1:
        a, b = rows[0], rows[-1]
        print(f"log-log slope {a['blocks']} -> {b['blocks']} blocks: compile "
              f"{_slope(a, b, 'compile'):.3f}, plan {_slope(a, b, 'plan'):.3f} "
              f"(target <= 1.15)")  # fmt: skip
    if big_oprs:
        per_block = rows[-1]["oprs"] / rows[-1]["blocks"] if rows else 16
        blocks = max(1, round(big_oprs / per_block))
        t0 = time.process_time()
        g, outspec, feed = build_residual(blocks)
        t1 = time.process_time()
        f = g.compile(None, outspec)
        f(**feed)
        t2 = time.process_time()
        n = sum(1 for _ in f._func.iter_opr_seq())
        print(f"{blocks} blocks, {n} operators: build {t1 - t0:.1f} s, compile + first step "
              f"{t2 - t1:.1f} CPU s (target < 60 s)")  # fmt: skip


def measure(layers: int, repeats: int = 5) -> dict:
    best = {}
    for _ in range(repeats):
        tb = time.perf_counter()
        g, outspec, feed = build(layers)
        t_build = time.perf_counter() - tb
        opt_time = [0.0]
        orig = gopt.optimize_for_compile

        def timed(graph, dest, _orig=orig, _acc=opt_time, **kw):
            t = time.perf_counter()
            try:
                return _orig(graph, dest, **kw)
            finally:
                _acc[0] += time.perf_counter() - t

        gopt.optimize_for_compile = timed  # CompGraph.compile looks it up on the package
        try:
            t0 = time.perf_counter()
            f = g.compile(None, outspec)
            t1 = time.perf_counter()
        finally:
            gopt.optimize_for_compile = orig
        f(**feed)
        t2 = time.perf_counter()
        n = sum(1 for _ in f._func.iter_opr_seq())
        res = {
            "oprs": n,
            "build": t_build,
            "graph_oprs": len(g.all_oprs()),
            "compile": t1 - t0,
            "optimizer": opt_time[0],
            "first_run": t2 - t1,
        }
        if not best or res["compile"] < best["compile"]:
            best = res
    return best


def profile(layers: int, top: int = 25) -> None:
    g, outspec, feed = build(layers)
    pr = cProfile.Profile()
    pr.enable()
    f = g.compile(None, outspec)
    f(**feed)
    pr.disable()
    pstats.Stats(pr).sort_stats("cumulative").print_stats(top)
    pstats.Stats(pr).sort_stats("tottime").print_stats(top)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument(
        "--blocks", default="1000,4000,16000",
        help="comma-separated residual-MLP sizes (blocks); empty to skip",
    )  # fmt: skip
    ap.add_argument(
        "--big", type=int, default=0, metavar="OPRS",
        help="also compile and run a residual MLP of about OPRS operators (e.g. 64000)",
    )  # fmt: skip
    args = ap.parse_args()
    print(f"python {platform.python_version()}, numpy {np.__version__}, {platform.machine()}")
    r = measure(args.layers)
    n = r["oprs"]
    print(f"MLP training step, {args.layers} layers: {n} operators in the compiled seq "
          f"({r['graph_oprs']} in the graph, including replaced ones)")  # fmt: skip
    print(f"{'stage':<28}{'total ms':>10}{'ms / opr':>10}")
    for key, label in (
        ("build", "graph construction"),
        ("compile", "compile (all)"),
        ("optimizer", "  of which optimizer passes"),
        ("first_run", "first run (plan + bind)"),
    ):
        print(f"{label:<28}{r[key] * 1e3:>10.2f}{r[key] * 1e3 / n:>10.3f}")
    per = r["compile"] * 1e3 / n
    print(f"compile: {per:.3f} ms per operator (target <= {TARGET_MS} ms): "
          f"{'OK' if per <= TARGET_MS else 'ABOVE TARGET'}")  # fmt: skip
    if args.profile or per > TARGET_MS:
        profile(args.layers)
    sizes = [int(n) for n in args.blocks.split(",") if n.strip()]
    if sizes or args.big:
        residual_table(sizes, args.big)


if __name__ == "__main__":
    main()
