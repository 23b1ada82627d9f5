"""JIT fusion benchmark: a chain of 20 elementwise operators, compiled with and without
``graph_opt.jit``, against PyTensor's compiled function of the same chain (when installed).

Per-call times are the minimum over repeats, in microseconds, measured at three levels:

* ``call``: the user-level ``f(x, y)`` (inputs copied in, run, wait, output copied out);
* ``exec``: ``execute()`` + ``wait()`` of the compiled seq with the inputs already set;
* ``program``: the executor's bound steps alone (the work fusion changes).

Run: ``python benchmarks/jit_fusion.py [--sizes 16,1048576]``. Target (16 elements): jit at
least 3x faster than unfused, and faster than PyTensor.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import timeit

import numpy as np

import megbrain as mgb

# the chain: (mode, second operand) repeated; "x"/"y" are the inputs, numbers are constants
CHAIN = [
    ("MUL", "y"), ("ADD", 0.5), ("TANH", None), ("SUB", "x"), ("MUL", 1.5),
    ("SIGMOID", None), ("ADD", "x"), ("EXP", None), ("MUL", 0.25), ("RELU", None),
] * 2  # fmt: skip


def build_mgb(x, y):
    v = x
    for mode, arg in CHAIN:
        if arg is None:
            v = mgb.opr.elemwise(v, mode=mode)
        else:
            v = mgb.opr.elemwise(v, {"x": x, "y": y}.get(arg, arg), mode=mode)
    return v


def _operand(arg, x, y):
    if arg is None or isinstance(arg, str):
        return {"x": x, "y": y, None: None}[arg]
    return np.float32(arg)


def build_numpy(x, y, out):
    """The same chain as NumPy ufunc calls writing into ``out`` (the hand-written baseline)."""
    f32 = np.float32
    steps: list = []
    for mode, arg in CHAIN:
        b = _operand(arg, x, y)
        if mode == "MUL":
            steps.append((np.multiply, b))
        elif mode == "ADD":
            steps.append((np.add, b))
        elif mode == "SUB":
            steps.append((np.subtract, b))
        else:
            steps.append((mode, None))

    def run():
        np.copyto(out, x)
        for fn, b in steps:
            if fn == "TANH":
                np.tanh(out, out)
            elif fn == "EXP":
                np.exp(out, out)
            elif fn == "RELU":
                np.maximum(out, f32(0), out=out)
            elif fn == "SIGMOID":
                np.negative(out, out)
                np.exp(out, out)
                np.add(out, f32(1), out)
                np.true_divide(f32(1), out, out)
            else:
                fn(out, b, out)

    return run


def build_pytensor():
    import pytensor
    import pytensor.tensor as pt

    x, y = pt.vector("x", dtype="float32"), pt.vector("y", dtype="float32")
    v = x
    for mode, arg in CHAIN:
        b = _operand(arg, x, y)
        v = {
            "MUL": lambda v, b: v * b,
            "ADD": lambda v, b: v + b,
            "SUB": lambda v, b: v - b,
            "TANH": lambda v, b: pt.tanh(v),
            "SIGMOID": lambda v, b: pt.sigmoid(v),
            "EXP": lambda v, b: pt.exp(v),
            "RELU": lambda v, b: pt.maximum(v, np.float32(0)),
        }[mode](v, b)
    fn = pytensor.function([x, y], v)
    fast = pytensor.function([x, y], v)
    fast.trust_input = True
    return fn, fast, pytensor.__version__


def per_call_us(fn, repeat: int = 7) -> float:
    """Minimum per-call time in microseconds (batches of about 20 ms)."""
    fn()
    n = 1
    while timeit.timeit(fn, number=n) < 0.02 and n < 1 << 20:
        n *= 2
    return min(timeit.repeat(fn, number=n, repeat=repeat)) / n * 1e6


def best_of_rounds(fns: dict, rounds: int) -> dict:
    """Per-call times of ``fns``, measured in interleaved rounds; the minimum of each."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for k, fn in fns.items():
            best[k] = min(best[k], per_call_us(fn))
    return best


def compile_mgb(jit: int, size: int):
    g = mgb.comp_graph()
    g.set_option("graph_opt.jit", jit)
    x = mgb.make_arg("cpu0", g, name="x", shape=(size,))
    y = mgb.make_arg("cpu0", g, name="y", shape=(size,))
    return g.compile([x, y], mgb.copy_output(build_mgb(x, y)))


def bench_size(size: int, rows: list, rounds: int) -> None:
    rng = np.random.default_rng(0)
    xv, yv = (rng.uniform(-1, 1, size).astype(np.float32) for _ in range(2))
    fns, outs, info = {}, {}, []
    for jit in (0, 1):
        t0 = time.perf_counter()
        f = compile_mgb(jit, size)
        outs[jit] = f(xv, yv)
        first = time.perf_counter() - t0
        func = f._func
        nops = sum(1 for o in func.iter_opr_seq() if o.type_name in ("Elemwise", "JITExecutor"))
        info.append(f"jit={jit}: {nops} operators, first call (compile + run) {first * 1e3:.0f} ms")
        steps = func._plan.steps[0]

        def program(steps=steps):
            for s in steps:
                s()

        fns[("call", jit)] = lambda f=f: f(xv, yv)
        fns[("exec", jit)] = lambda func=func: func.execute().wait()
        fns[("program", jit)] = program
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-6)
    out = np.empty_like(xv)
    fns["numpy"] = build_numpy(xv, yv, out)
    fns["numpy"]()
    np.testing.assert_allclose(out, outs[0], rtol=1e-5, atol=1e-6)
    try:
        fn, fast, ver = build_pytensor()
    except ImportError:
        ver = None
    else:
        np.testing.assert_allclose(fn(xv, yv), outs[0], rtol=1e-5, atol=1e-6)
        fns["pytensor"] = lambda: fn(xv, yv)
        fns["pytensor_trust"] = lambda: fast(xv, yv)
    t = best_of_rounds(fns, rounds)
    print(f"size {size}: " + "; ".join(info))
    for lvl in ("call", "exec", "program"):
        rows.append((size, f"megbrain {lvl}", t[(lvl, 0)], t[(lvl, 1)]))
    rows.append((size, "numpy ufunc loop (out=)", t["numpy"], t[("call", 1)]))
    if ver is None:
        rows.append((size, "pytensor: not installed", None, None))
    else:
        rows.append((size, f"pytensor {ver} fn(x, y)", t["pytensor"], t[("call", 1)]))
        rows.append((size, "pytensor, trust_input", t["pytensor_trust"], t[("call", 1)]))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="16,1048576", help="comma-separated element counts")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved measuring rounds")
    args = ap.parse_args(argv)
    from megbrain.kernels import jit_codegen

    print(
        f"python {sys.version.split()[0]}, numpy {np.__version__}, cpus {os.cpu_count()}, "
        f"load average {os.getloadavg()[0]:.2f}, jit cache {jit_codegen.cache_dir()}"
    )
    rows: list = []
    for size in [int(s) for s in args.sizes.split(",")]:
        bench_size(size, rows, args.rounds)
    print("\nper call, us (min over rounds); ratio = other / megbrain with jit")
    print(f"{'size':>8}  {'what':<28} {'other us':>10} {'jit us':>9} {'ratio':>7}")
    for size, what, a, b in rows:
        if a is None:
            print(f"{size:>8}  {what:<28}")
        else:
            print(f"{size:>8}  {what:<28} {a:>10.2f} {b:>9.2f} {a / b:>6.2f}x")
    print("('megbrain call/exec/program': other = the same function compiled without jit)")
    print(f"\njit kernels: {jit_codegen.STATS}")


if __name__ == "__main__":
    main()
