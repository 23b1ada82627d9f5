"""The fast convolution algorithms (Winograd F(2x2,3x3), direct) against the im2col + GEMM
ones they replace and PyTorch, on the shapes of issue 16, interleaved in one process (best of
several rounds each), at one thread count on every side.

    python benchmarks/conv_fast.py [--threads 2] [--repeat 15] [--cpu] [case ...]

``--cpu`` reports each callable's CPU time on the calling thread instead of wall time: on a
loaded machine a single-thread comparison (``--threads 1 --cpu``) is the steadier ratio.
Cases: big (8x64x56x56 3x3 p1), conv1 (128x1x28x28 -> 16, 3x3 p1), conv2 (128x16x14x14 -> 32,
3x3 p1), lenet1 (64x1x28x28 -> 20, 5x5), lenet2 (64x20x12x12 -> 50, 5x5).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402

CASES = {
    "big": (8, 64, 56, 64, 3, 1),
    "conv1": (128, 1, 28, 16, 3, 1),
    "conv2": (128, 16, 14, 32, 3, 1),
    "lenet1": (64, 1, 28, 20, 5, 0),
    "lenet2": (64, 20, 12, 50, 5, 0),
}


def best_times(fns, repeat: int, cpu: bool, interleave: bool = True) -> dict[str, float]:
    """The best time (seconds) of each of ``fns`` over ``repeat`` calls, by the calling
    thread's CPU clock when ``cpu``. Calls alternate between the functions when
    ``interleave``; otherwise each function runs all its calls in a block of its own: a
    multi-threaded peer's spinning threads (onnxruntime's keep spinning after each run) take
    the cores from whatever runs right after it."""
    clock = time.thread_time if cpu else time.perf_counter
    if not interleave:
        return {k: best_times({k: f}, repeat, cpu)[k] for k, f in fns.items()}
    for _ in range(2):
        for f in fns.values():
            f()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeat):
        for k, f in fns.items():
            t0 = clock()
            f()
            best[k] = min(best[k], clock() - t0)
    return best


def ort_conv_relu(w: np.ndarray, b: np.ndarray, h: int, threads: int, *, stride: int = 1,
                  group: int = 1, profile: str | None = None,
                  pad: int | None = None):  # fmt: skip
    """An onnxruntime session of one Conv (filter ``w`` of shape (OC, IC/group, F, F), bias
    ``b``, padding ``pad`` (default F // 2), ``stride``) and a Relu over an (1, IC, h, h)
    input ``x``, at ``threads`` threads; profiling into files prefixed ``profile`` when
    given."""
    from onnx import TensorProto, helper, numpy_helper

    oc, icg, f = w.shape[0], w.shape[1], w.shape[2]
    p = f // 2 if pad is None else pad
    oh = (h + 2 * p - f) // stride + 1
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], group=group, kernel_shape=[f, f],
                            strides=[stride, stride], pads=[p, p, p, p])  # fmt: skip
    graph = helper.make_graph(
        [node, helper.make_node("Relu", ["y"], ["r"])], "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, icg * group, h, h])],
        [helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, oc, oh, oh])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )  # fmt: skip
    return ort_session(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                       threads, profile)  # fmt: skip


def ort_session(model, threads: int, profile: str | None = None):
    """An onnxruntime CPU session of the ONNX ``model`` at ``threads`` threads, profiling
    into files prefixed ``profile`` when given."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = threads
    if profile:
        opts.enable_profiling = True
        opts.profile_file_prefix = profile
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])  # fmt: skip


def case_fns(name: str) -> dict:
    import torch
    import torch.nn.functional as F

    from megbrain.kernels.conv import bwd_data as conv_bwd_data
    from megbrain.kernels.conv import direct as conv_direct
    from megbrain.kernels.conv import im2col as conv_im2col
    from megbrain.kernels.conv import winograd as conv_winograd

    n, c, h, oc, f, p = CASES[name]
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (n, c, h, h)).astype(np.float32)
    w = rng.uniform(-1, 1, (1, oc, c, f, f)).astype(np.float32)
    oh = h + 2 * p - f + 1
    dy = rng.uniform(-1, 1, (n, oc, oh, oh)).astype(np.float32)
    y, gx = np.empty(dy.shape, np.float32), np.empty(x.shape, np.float32)
    one, pad = (1, 1), (p, p)
    fwd_old = conv_im2col.fwd_per_sample_gemm if c * f * f <= conv_im2col.PER_SAMPLE_MAX_K else (
        conv_im2col.fwd_im2col_gemm
    )
    fns = {"fwd im2col": fwd_old(x, w, y, one, pad, one)}
    if f == 3:
        fns["fwd WINOGRAD_F23"] = conv_winograd.bind_winograd_forward(x, w, y, one, pad, one)
    if conv_direct.usable_direct_forward(x, w, y, one, pad, one):
        fns["fwd DIRECT"] = conv_direct.bind_direct_forward(x, w, y, one, pad, one)
    tx, tw, tdy = map(torch.from_numpy, (x, w[0], dy))
    fns["fwd torch"] = lambda: F.conv2d(tx, tw, padding=p)
    if c > 1:  # a first layer's data gradient is not computed
        if conv_bwd_data.bwd_data_as_forward_preferred(w, dy, gx, one, pad, one):
            fns["bwd data AS_FORWARD"] = conv_bwd_data.bwd_data_as_forward(w, dy, gx, one, pad, one)
        else:
            fns["bwd data COL2IM"] = conv_bwd_data.bwd_data_gemm_col2im(w, dy, gx, one, pad, one)
        if conv_direct.usable_direct_backward_data(w, dy, gx, one, pad, one):
            fns["bwd data DIRECT"] = conv_direct.bind_direct_backward_data(
                w, dy, gx, one, pad, one
            )
        if f == 3:
            fns["bwd data WINOGRAD_F23"] = conv_winograd.bind_winograd_backward_data(
                w, dy, gx, one, pad, one
            )
        fns["bwd data torch"] = lambda: torch.ops.aten.convolution_backward(
            tdy, tx, tw, None, [1, 1], [p, p], [1, 1], False, [0, 0], 1, [True, False, False]
        )
    return fns


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="*", default=list(CASES))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--cpu", action="store_true", help="CPU time of the calling thread")
    args = ap.parse_args(argv)
    import torch
    from threadpoolctl import threadpool_limits

    threadpool_limits(args.threads)
    torch.set_num_threads(args.threads)
    print(f"threads={args.threads} {'cpu' if args.cpu else 'wall'} ms, load {os.getloadavg()}")
    for name in args.cases:
        t = best_times(case_fns(name), args.repeat, args.cpu)
        print(name, "  ".join(f"{k}: {v * 1e3:.2f}" for k, v in t.items()), flush=True)


if __name__ == "__main__":
    sys.exit(main())
