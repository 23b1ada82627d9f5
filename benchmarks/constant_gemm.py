"""Products by a constant matrix (ConvNeXt-Tiny's Linear layers, the mobile nets'
classifiers): the packed GEMM (:mod:`megbrain.kernels.packed_gemm`) against the OpenBLAS
split megbrain ran before (:func:`megbrain.kernels.gemm.matmul_step`) and onnxruntime's
session of one MatMul of the same shape.

    python benchmarks/constant_gemm.py [--threads 1 2] [--repeat 30] [--smoke] [--sweep]

Cases are ``MxK@KxN``. Each row: best of ``--repeat`` per side (ours and OpenBLAS timed
before any onnxruntime session exists: its spinning pool takes the cores), onnxruntime's
whole run, the ratio onnxruntime / ours (>= 1 is good) and our GFLOP/s. Our output is
checked against onnxruntime's (rtol 1e-4, atol 1e-4).

``--sweep`` instead times, per product of several rows at one thread, the cost model's tiling
(:func:`megbrain.kernels.packed_gemm.packed_tiles`) against every tiling of 12-24
accumulators, interleaved call by call on the thread's CPU clock (so that a shared
machine's drift hits all alike), with the bias and, where the product widens, GELU in the
write-out as ConvNeXt's layers have them; it prints the model's time and the best three.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402

import numpy as np  # noqa: E402
from conv_fast import best_times  # noqa: E402

#: (M, K, N): ConvNeXt-Tiny's MLP products at batch 1 (rows = positions), then the
#: classifiers of MnasNet0.5 / MobileNetV3-Small (one row)
CASES = [
    (3136, 96, 384), (3136, 384, 96), (784, 192, 768), (784, 768, 192), (196, 384, 1536),
    (196, 1536, 384), (49, 768, 3072), (49, 3072, 768), (1, 768, 1000), (1, 1280, 1000),
    (1, 576, 1024), (1, 1024, 1000),
]  # fmt: skip


def case_name(case) -> str:
    m, k, n = case
    return f"{m}x{k}@{k}x{n}"


def ort_matmul(b: np.ndarray, m: int, threads: int):
    """An onnxruntime session of ``x @ b`` for an (m, K) input ``x``, at ``threads``."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    k, n = b.shape
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "b"], ["y"])], "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
        [numpy_helper.from_array(b, "b")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])  # fmt: skip


def _operands(case):
    m, k, n = case
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    b = (rng.uniform(-1, 1, (k, n)) / np.sqrt(k)).astype(np.float32)
    return a, b


def ours_and_blas(case, threads: int, repeat: int) -> tuple[dict, np.ndarray]:
    """Best times (seconds) of the packed GEMM and of the OpenBLAS split, and our output."""
    from megbrain.kernels import gemm, packed_gemm, parallel
    from megbrain.kernels.conv import common as conv_common

    a, b = _operands(case)
    out, ref = (np.empty((a.shape[0], b.shape[1]), np.float32) for _ in range(2))
    conv_common.THREADS = threads
    try:
        ours = packed_gemm.bind_packed_matmul(a, b, out, True)
    finally:
        conv_common.THREADS = None
    if threads == parallel.num_threads():
        blas = gemm.matmul_step(a, b, ref)
    else:  # one thread: one single-threaded call
        blas = parallel.concurrently_blas_single_threaded([lambda: np.matmul(a, b, out=ref)])
    times = best_times({"ours": ours, "blas": blas}, repeat, False, interleave=False)
    return times, out


def ort_case(case, threads: int, repeat: int, ours: np.ndarray) -> dict:
    """onnxruntime's best time of the case (seconds), its output checked against ``ours``."""
    a, b = _operands(case)
    sess = ort_matmul(b, a.shape[0], threads)
    times = best_times({"ort": lambda: sess.run(None, {"x": a})}, repeat, False)
    np.testing.assert_allclose(ours, sess.run(None, {"x": a})[0], rtol=1e-4, atol=1e-4)
    return times


#: GELU's erf form as the optimizer leaves ONNX's (the tail a widening Linear layer fuses)
GELU = (("MUL", (("c", 0.7071067690849304), ("i", 0))), ("ERF", (("t", 0),)),
        ("ADD", (("c", 1.0), ("t", 1))), ("MUL", (("i", 0), ("t", 2))),
        ("MUL", (("c", 0.5), ("t", 3))))  # fmt: skip


def sweep_tilings(case, repeat: int) -> tuple:
    """``(model's tiling, its best time, [(time, tiling)] best first)`` of ``case`` at one
    thread, every tiling of 12-24 accumulators interleaved (seconds of CPU time)."""
    from megbrain.kernels import packed_gemm
    from megbrain.kernels.conv import common as conv_common
    from megbrain.kernels.conv.pointwise88 import PointwiseTiles

    a, b = _operands(case)
    m, k, n = case
    bias = np.linspace(-1, 1, n, dtype=np.float32)
    out = np.empty((m, n), np.float32)
    nblk = -(-n // 16)
    model = packed_gemm.packed_tiles(m, k, n, 1)
    tilings = {(model.r, model.b): model}
    for bb in (d for d in range(1, 7) if nblk % d == 0):
        for r in range(max(1, 12 // bb), 24 // bb + 1):
            # one band of rows: at one thread the bands only order the same tiles
            tilings.setdefault((r, bb), PointwiseTiles(r, bb, nblk // bb, 1, m // r))
    conv_common.THREADS = 1
    try:
        steps = {key: packed_gemm.bind_packed_matmul(a, b, out, True, bias=bias, epi=1, tiles=tl,
                                                     tail=GELU if n > k else ())
                 for key, tl in tilings.items()}  # fmt: skip
    finally:
        conv_common.THREADS = None
    times = best_times(steps, repeat, True)
    ranked = sorted((t, tilings[key]) for key, t in times.items())
    return model, times[(model.r, model.b)], ranked


def sweep(repeat: int) -> None:
    """Print :func:`sweep_tilings` of each product of several rows."""
    print(f"{'case':>18} {'model':>6} {'ms':>7}   best tilings (r x b: ms)")
    for case in (c for c in CASES if c[0] > 1):
        model, mt, ranked = sweep_tilings(case, repeat)
        best = ", ".join(f"{tl.r}x{tl.b}: {t * 1e3:.3f}" for t, tl in ranked[:3])
        print(f"{case_name(case):>18} {f'{model.r}x{model.b}':>6} {mt * 1e3:7.3f}   {best}")


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--smoke", action="store_true", help="two small cases, 2 rounds, 1 thread")
    ap.add_argument("--sweep", action="store_true", help="the model's tilings against others")
    args = ap.parse_args(argv)
    if args.sweep:
        sweep(args.repeat)
        return []
    cases = CASES
    if args.smoke:
        cases, args.repeat, args.threads = [(20, 24, 40), (1, 24, 33)], 2, [1]
    rows = []
    print(f"{'case':>18} {'thr':>3} {'ours ms':>8} {'blas ms':>8} {'ort ms':>8} {'ratio':>6} "
          f"{'GF/s':>6}")  # fmt: skip
    for threads in args.threads:
        alone = {case: ours_and_blas(case, threads, args.repeat) for case in cases}
        for case in cases:
            times, out = alone[case]
            times = {**times, **ort_case(case, threads, args.repeat, out)}
            flops = 2 * case[0] * case[1] * case[2]
            rows.append({"case": case_name(case), "threads": threads, **times})
            print(f"{case_name(case):>18} {threads:>3} {times['ours'] * 1e3:8.3f} "
                  f"{times['blas'] * 1e3:8.3f} {times['ort'] * 1e3:8.3f} "
                  f"{times['ort'] / times['ours']:6.2f} {flops / times['ours'] * 1e-9:6.1f}")
    return rows


if __name__ == "__main__":
    main()
