"""Static memory plan and sublinear memory on a training step.

The step: a ``--layers``-layer MLP (batch ``--batch``, width ``--width``, ReLU), squared loss,
``mgb.grad`` of every weight and bias and an ``add_update`` of each, compiled as one function.

(a) Memory plan: the arena bytes of the static plan against ``tot_alloc_lower_bound()`` (the
    most bytes live at one step; target arena / bound <= 1.05) and against the sum of the
    sizes of all vars (what planning without reuse or forwarding would take), and the time to
    build the plan (``update_static_alloc_plan_and_get_size``), per solver of the allocator.
(b) Sublinear memory (``enable_sublinear_memory_opt``): arena bytes and step time relative to
    the option off, for cheap recomputation (no endpoints) and for segments between
    ``set_opr_sublinear_memory_endpoint`` operators.
(c) The plan of the digits example's small CNN training step, with sublinear memory off/on.

Both run for two schedules: as built ("default": the comp seq runs the updates after the
whole backward pass, so every weight gradient is live at the end), and "updates early", with
the grads built (``use_virtual_grad=False``) in ``opr_priority_scope(g, -1)`` and the updates
in ``opr_priority_scope(g, -2)``, so that each weight update runs as soon as its gradient
exists (then activations make more of the peak, which is what recomputation targets).

Run: ``python benchmarks/memory_plan.py [--layers 6] [--batch 64] [--width 512] [--repeats 7]``
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from contextlib import nullcontext

import numpy as np

import megbrain as mgb
from megbrain.api.config import opr_priority_scope, set_opr_sublinear_memory_endpoint
from megbrain.graph import mem_plan

try:
    from threadpoolctl import threadpool_info, threadpool_limits
except ImportError:  # pragma: no cover - threadpoolctl is optional
    threadpool_info = threadpool_limits = None

CN = "cpu0"


def mlp_step(layers, batch, width, *, early=False, sublinear=False, every=0):
    """Compile the training step; returns (function, feed dict, params).

    ``every > 0`` marks the output of every ``every``-th layer as a sublinear endpoint.
    """
    g = mgb.comp_graph()
    g.set_option("enable_sublinear_memory_opt", int(sublinear))
    g.set_option("log_level", 0)
    rng = np.random.RandomState(0)
    x = mgb.make_arg(CN, g, name="x", shape=(batch, width))
    y = mgb.make_arg(CN, g, name="y", shape=(batch, width))
    params, h = [], x
    for i in range(layers):
        w = (rng.randn(width, width) / np.sqrt(width)).astype(np.float32)
        w = mgb.make_shared(CN, value=w, comp_graph=g, name=f"w{i}")
        b = mgb.make_shared(CN, value=np.zeros((1, width), np.float32), comp_graph=g, name=f"b{i}")
        params += [w, b]
        h = mgb.opr.matrix_mul(h, w) + b
        if i < layers - 1:
            h = mgb.opr.elem.relu(h)
            if every and (i + 1) % every == 0:
                set_opr_sublinear_memory_endpoint(h)
    d = h - y
    loss = mgb.opr.reduce_(d * d, "SUM") / (batch * width)
    with opr_priority_scope(g, -1) if early else nullcontext():
        # built now (not as VirtualGrad expanded at compile), so the scope reaches them
        grads = mgb.grad(loss, params, use_virtual_grad=not early)
    with opr_priority_scope(g, -2) if early else nullcontext():
        ups = [mgb.opr.add_update(p, gr, beta=-0.01) for p, gr in zip(params, grads)]
    f = g.compile(None, [mgb.copy_output(loss)] + ups)
    feed = {
        "x": rng.randn(batch, width).astype(np.float32),
        "y": rng.randn(batch, width).astype(np.float32),
    }
    return f, feed, params


def _one(d: dict):
    (v,) = d.values()
    return v


def plan_stats(f) -> dict:
    """Arena bytes, lower bound, sum of var sizes and plan-building time of ``f``."""
    core = f._func
    t0 = time.perf_counter()
    arena = _one(f.update_static_alloc_plan_and_get_size())
    t_plan = time.perf_counter() - t0
    bound = _one(core.static_alloc_lower_bound())
    shared = ("SharedDeviceTensor", "VolatileSharedDeviceTensor", "ImmutableTensor")
    total = sum(
        int(np.prod(arr.shape)) * arr.dtype.itemsize
        for v, arr in core.var_arrays().items()
        if v.owner.type_name not in shared
    )
    return {"arena": arena, "bound": bound, "total": total, "plan_s": t_plan, "oprs": len(core.seq)}


def time_steps(funcs: dict, repeats: int, inner: int = 3) -> dict:
    """Best per-step time of each ``(f, feed)``; the functions take turns every repeat."""
    best = dict.fromkeys(funcs, float("inf"))
    for f, feed in funcs.values():
        f(**feed)
    for _ in range(repeats):
        for name, (f, feed) in funcs.items():
            t0 = time.perf_counter()
            for _ in range(inner):
                f(**feed)
            best[name] = min(best[name], (time.perf_counter() - t0) / inner)
    return best


def _mb(n: int) -> str:
    return f"{n / 2**20:8.2f}"


def table_plan(args) -> bool:
    print("\n(a) static memory plan of the training step (MB)")
    print(
        f"{'schedule':<15}{'solver':<18}{'arena':>9}{'bound':>9}{'arena/bound':>13}"
        f"{'all vars':>10}{'arena/all':>11}{'plan ms':>9}"
    )
    ok = True
    saved = mem_plan.SOLVERS["best"]
    for early in (False, True):
        for solver in ("best", "size_best_fit", "begin_first_fit"):
            mem_plan.SOLVERS["best"] = saved if solver == "best" else mem_plan.SOLVERS[solver]
            try:
                f, _, _ = mlp_step(args.layers, args.batch, args.width, early=early)
                s = plan_stats(f)
            finally:
                mem_plan.SOLVERS["best"] = saved
            ratio = s["arena"] / s["bound"]
            if solver == "best":
                ok &= ratio <= 1.05
            print(
                f"{'updates early' if early else 'default':<15}{solver:<18}"
                f"{_mb(s['arena']):>9}{_mb(s['bound']):>9}{ratio:13.3f}"
                f"{_mb(s['total']):>10}{s['arena'] / s['total']:11.3f}"
                f"{s['plan_s'] * 1e3:9.1f}"
            )
    print(f"arena / bound <= 1.05 with the default solver: {'OK' if ok else 'MISS'}")
    return ok


def cnn_step(batch: int, *, sublinear: bool = False):
    """The digits example's CNN (2 conv+BN+ReLU+pool blocks, 2 linear layers) training step
    with SGD momentum, on 8x8 inputs; returns (function, feed dict)."""
    from megbrain import nn, optim
    from megbrain.examples.digits import make_model

    model = make_model()
    g = mgb.comp_graph()
    g.set_option("enable_sublinear_memory_opt", int(sublinear))
    g.set_option("log_level", 0)
    x = mgb.make_arg(CN, g, shape=(batch, 1, 8, 8), name="x")
    y = mgb.make_arg(CN, g, shape=(batch, 10), name="y")
    loss = nn.functional.cross_entropy(model(x), y)
    opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    f = g.compile(None, [mgb.copy_output(loss)] + opt.minimize(loss) + nn.pending_updates(g))
    rng = np.random.RandomState(0)
    feed = {
        "x": rng.rand(batch, 1, 8, 8).astype(np.float32),
        "y": np.eye(10, dtype=np.float32)[rng.randint(0, 10, batch)],
    }
    return f, feed


def table_cnn(args) -> bool:
    print(f"\n(c) small CNN training step (digits CNN, batch {args.batch})")
    print(
        f"{'mode':<12}{'oprs':>6}{'arena MB':>10}{'bound MB':>10}{'arena/bound':>13}"
        f"{'all vars':>10}{'arena/all':>11}{'step ms':>9}"
    )
    rows, ok = {}, True
    for sub in (False, True):
        f, feed = cnn_step(args.batch, sublinear=sub)
        f(**feed)
        rows["sublinear" if sub else "off"] = (f, feed, plan_stats(f))
    times = time_steps({k: (f, feed) for k, (f, feed, _) in rows.items()}, args.repeats)
    for name, (_, _, s) in rows.items():
        ratio = s["arena"] / s["bound"]
        if name == "off":
            ok &= ratio <= 1.05
        print(
            f"{name:<12}{s['oprs']:>6}{_mb(s['arena']):>10}{_mb(s['bound']):>10}{ratio:13.3f}"
            f"{_mb(s['total']):>10}{s['arena'] / s['total']:11.3f}{times[name] * 1e3:9.2f}"
        )
    print(f"CNN arena / bound <= 1.05: {'OK' if ok else 'MISS'}")
    return ok


def table_sublinear(args) -> None:
    print("\n(b) sublinear memory: arena and step time (best of --repeats, BLAS threads = 1)")
    print(
        f"{'schedule':<15}{'mode':<26}{'oprs':>6}{'arena MB':>10}{'arena/off':>11}"
        f"{'step ms':>9}{'time/off':>10}  same result"
    )
    modes = [("off", False, 0), ("cheap recompute", True, 0)]
    modes += [(f"endpoints every {k} layers", True, k) for k in (2, 3)]
    for early in (False, True):
        built, stats = {}, {}
        for name, sub, every in modes:
            f, feed, params = mlp_step(
                args.layers, args.batch, args.width, early=early, sublinear=sub, every=every
            )
            built[name] = (f, feed, params)
            stats[name] = plan_stats(f)
        # identical results: one step from the same initial parameters
        results = {}
        for name, (f, feed, params) in built.items():
            loss = f(**feed)[0]
            results[name] = [loss] + [p.get_value().copy() for p in params]
        # one BLAS thread: steadier times on a shared 2-core machine
        with threadpool_limits(1, "blas") if threadpool_limits else nullcontext():
            times = time_steps({k: v[:2] for k, v in built.items()}, args.repeats)
        off = stats["off"]
        for name, _, _ in modes:
            s = stats[name]
            same = all(np.array_equal(a, b) for a, b in zip(results[name], results["off"]))
            print(
                f"{'updates early' if early else 'default':<15}{name:<26}{s['oprs']:>6}"
                f"{_mb(s['arena']):>10}{s['arena'] / off['arena']:11.3f}"
                f"{times[name] * 1e3:9.2f}{times[name] / times['off']:10.3f}  "
                f"{'yes' if same else 'NO'}"
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    print(
        f"python {platform.python_version()}, numpy {np.__version__}, "
        f"{os.cpu_count()} CPUs, {platform.machine()}"
    )
    for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS"):
        print(f"{var}: {os.environ[var]!r} (set)" if var in os.environ else f"{var}: not set")
    if threadpool_info is not None:
        for info in threadpool_info():
            print(
                f"threadpoolctl: {info.get('internal_api')} {info.get('version')} "
                f"threads={info.get('num_threads')}"
            )
    print(f"MLP training step: {args.layers} layers, batch {args.batch}, width {args.width}")
    table_plan(args)
    table_sublinear(args)
    table_cnn(args)


if __name__ == "__main__":
    main()
