"""ONNX inference: megbrain (optimize_for_inference, JIT fusion) against onnxruntime on the same
model, machine and run, as a ratio of their times (higher is better for megbrain).

Models: the light ResNet50 of the onnx wheel's test data (batch 1, 224x224; weights from
ConstantOfShape) and the digits CNN exported with ``megbrain.onnx.export``.

    python benchmarks/onnx_inference.py [--threads N] [--repeat R]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np


def _time(fn, repeat: int) -> float:
    fn()  # warm up (compile, allocate)
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _megbrain_runner(path: str, feed: dict):
    import megbrain as mgb
    import megbrain.onnx as mo

    res = mo.load(path)
    names = list(res.outputs)
    outs = mgb.optimize_for_inference([res.outputs[n] for n in names])
    res.graph.set_option("graph_opt.jit", 1)
    func = res.graph.compile([res.inputs[k] for k in feed], [mgb.copy_output(o) for o in outs])
    args = [feed[k] for k in feed]
    return lambda: func(*args)


def _ort_runner(path: str, feed: dict, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3  # not the warnings about initializers it drops
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return lambda: sess.run(None, feed)


def _digits_model(tmp: str) -> tuple[str, dict]:
    import megbrain as mgb
    import megbrain.onnx as mo
    from megbrain.examples import digits

    path = os.path.join(tmp, "digits.mge")
    digits.main(["--epochs", "1", "--no-progress", "--dump", path, "--dump-batch", "64",
                 "--out", os.path.join(tmp, "w.npz")])
    res = mgb.load_comp_graph_from_file(path)
    onnx_path = os.path.join(tmp, "digits.onnx")
    mo.export(res.output_vars_list, onnx_path)
    x = np.random.default_rng(0).random((64, 1, 8, 8), dtype=np.float32)
    import onnx

    name = onnx.load(onnx_path).graph.input[0].name
    return onnx_path, {name: x}


def _resnet50() -> tuple[str, dict] | None:
    import onnx

    path = os.path.join(
        os.path.dirname(onnx.__file__), "backend", "test", "data", "light", "light_resnet50.onnx"
    )
    if not os.path.exists(path):
        return None
    model = onnx.load(path)
    init = {t.name for t in model.graph.initializer}
    feed = {}
    for vi in model.graph.input:
        if vi.name not in init:
            shape = [d.dim_value or 1 for d in vi.type.tensor_type.shape.dim]
            feed[vi.name] = np.random.default_rng(0).random(shape, dtype=np.float32)
    return path, feed


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cases = [("digits CNN (batch 64)", _digits_model(tmp))]
        r50 = _resnet50()
        if r50 is not None:
            cases.append(("light ResNet50 (batch 1)", r50))
        for name, (path, feed) in cases:
            t_ort = _time(_ort_runner(path, feed, args.threads), args.repeat)
            t_mgb = _time(_megbrain_runner(path, feed), args.repeat)
            rows.append((name, t_mgb * 1e3, t_ort * 1e3, t_ort / t_mgb))
    print(f"{'model':28s} {'megbrain ms':>12s} {'onnxruntime ms':>15s} {'ratio':>7s}")
    for name, a, b, r in rows:
        print(f"{name:28s} {a:12.2f} {b:15.2f} {r:7.2f}")


if __name__ == "__main__":
    main()
