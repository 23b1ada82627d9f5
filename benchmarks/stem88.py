"""The first layers (3 input channels, DIRECT_NCHW_NCHW88) of the networks of
``onnx_zoo.py`` against onnxruntime running a one-Conv+Relu model of the same shape; with
``--pool``, GoogLeNet's NCHW88 max poolings (the ceil-mode ones with their end padding)
against onnxruntime's MaxPool node.

    python benchmarks/stem88.py [--threads 1 2] [--repeat 50] [--runs 100] [--smoke]
                                [--pool] [case ...]

Every output (bias + ReLU, constant filter, a 3x224x224 source) is checked against
onnxruntime's (rtol 1e-4, atol 1e-4). Cases are named ``FxF/sS/pP:3->OC``. Each row: our
time (best of ``--repeat``, every case timed before onnxruntime's sessions are made),
onnxruntime's fused Conv node alone (its profiler's time, 10th percentile of ``--runs``
runs) and its whole run (best of ``--repeat``), the ratio onnxruntime's node time / ours
(>= 1 is good) and our GFLOP/s; then the sums over the cases.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import functools  # noqa: E402

import numpy as np  # noqa: E402
from conv_fast import ort_conv_relu, ort_session  # noqa: E402
from pointwise88 import _ort_node_time, node_time, parser, table, time_with_peer  # noqa: E402

#: (filter side, stride, padding, output channels) of a 3-channel 224x224 first layer
CASES = [
    (3, 2, 1, 16),  # mnasnet0_5, mobilenet_v3_small
    (3, 2, 1, 24),  # shufflenet_v2_x1_0
    (3, 2, 1, 32),  # mobilenet_v2, efficientnet_b0, regnet_y_400mf
    (3, 2, 0, 64),  # squeezenet1_1
    (7, 2, 3, 64),  # resnet18, resnet50, googlenet, densenet121
    (4, 4, 0, 96),  # convnext_tiny
]
IC = 3
SIDE = 224
#: (channels, side, window, stride, padding, ceil mode): GoogLeNet's max poolings
POOLS = [
    (64, 112, 3, 2, 0, 1), (192, 56, 3, 2, 0, 1), (192, 28, 3, 1, 1, 1), (256, 28, 3, 1, 1, 1),
    (480, 28, 3, 2, 0, 1), (480, 14, 3, 1, 1, 1), (512, 14, 3, 1, 1, 1), (528, 14, 3, 1, 1, 1),
    (832, 14, 2, 2, 0, 1), (832, 7, 3, 1, 1, 1),
]  # fmt: skip


def case_name(case) -> str:
    f, s, p, oc = case
    return f"{f}x{f}/s{s}/p{p}:{IC}->{oc}"


def run_case(case, threads: int, repeat: int, runs: int = 100, peer: bool = True,
             side: int = SIDE) -> dict:  # fmt: skip
    """Times of one case at ``threads`` threads (seconds): ours, and with ``peer``
    onnxruntime's node and whole run, the output checked against onnxruntime's."""
    from megbrain.kernels.conv import common as conv_common
    from megbrain.kernels.conv import nchw88 as conv_nchw88
    from megbrain.kernels.conv.constant_operands import constant_filter
    from megbrain.kernels.conv.epilogue import Epilogue

    f, s, p, oc = case
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (1, IC, side, side)).astype(np.float32)
    w = (rng.uniform(-1, 1, (oc, IC, f, f)) / np.sqrt(IC * f * f)).astype(np.float32)
    b = rng.uniform(-1, 1, oc).astype(np.float32)
    filt = np.ascontiguousarray(w.reshape(oc // 8, 8, IC, f, f).transpose(0, 3, 4, 2, 1))
    o = conv_common.conv_out_size(side, f, s, p, 1)
    out = np.empty((1, oc // 8, o, o, 8), np.float32)

    def bind():
        with constant_filter(True):
            return conv_nchw88.bind_nchw88_forward(x, filt, out, (s, s), (p, p), (1, 1),
                                                   epilogue=Epilogue(b, True))  # fmt: skip

    def session():
        return ort_conv_relu(w, b, side, threads, stride=s, pad=p)

    name, times = time_with_peer(bind, out, session, x, threads, repeat, peer)
    if peer:
        times["ort"] = _ort_node_time(IC, oc, side, w, b, x, threads, runs, stride=s, pad=p)
    return {"name": name, "flops": 2 * o * o * IC * f * f * oc, **times}


def _ort_maxpool(case, threads: int, profile: str | None = None):
    from onnx import TensorProto, helper

    c, side, k, s, p, ceil = case
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[k, k], strides=[s, s],
                            pads=[p] * 4, ceil_mode=ceil)  # fmt: skip
    graph = helper.make_graph(
        [node], "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, side, side])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return ort_session(model, threads, profile)


def run_pool(case, threads: int, repeat: int, runs: int = 100, peer: bool = True) -> dict:
    """One of :data:`POOLS` at ``threads`` threads (seconds), as :func:`run_case`: ours the
    NCHW88 kernel with ceil mode's end padding, onnxruntime's MaxPool node; "flops" counts
    the window's comparisons."""
    from megbrain.kernels import parallel
    from megbrain.kernels.conv import nchw88 as conv_nchw88
    from megbrain.kernels.pool import nchw88 as pool88

    c, side, k, s, p, ceil = case
    x = np.random.default_rng(0).standard_normal((1, c, side, side)).astype(np.float32)
    span = side + 2 * p - k
    end = (-span) % s if ceil and span % s and span // s * s + s < side + p else 0
    src = np.ascontiguousarray(conv_nchw88.to_nchw88(x))
    geo = ((k, k), (s, s), (p, p), (end, end))
    out = np.empty(pool88.pool_nchw88_shape(src.shape, *geo), np.float32)

    def bind():
        return "NCHW88 MAX", pool88.bind_pooling_nchw88(src, out, "MAX", *geo)

    saved = parallel.num_threads  # the pooling splits over the kernel pool's threads
    parallel.num_threads = lambda: threads
    try:
        _, times = time_with_peer(bind, out, lambda: _ort_maxpool(case, threads), x, threads,
                                  repeat, peer)  # fmt: skip
    finally:
        parallel.num_threads = saved
    if peer:
        times["ort"] = node_time(functools.partial(_ort_maxpool, case, threads), x, runs,
                                 ("MaxPool",))  # fmt: skip
    return {"name": "NCHW88 MAX", "flops": out.size * k * k, **times}


def pool_name(case) -> str:
    c, side, k, s, p, _ = case
    return f"{c}x{side}x{side} {k}x{k}/s{s}/p{p}"


def main(argv=None) -> list[dict]:
    ap = parser(__doc__, 50, "two cases at 32x32, 2 rounds, 1 thread")
    ap.add_argument("--pool", action="store_true", help="GoogLeNet's max poolings instead")
    args = ap.parse_args(argv)
    if args.pool:
        return table(POOLS, pool_name, run_pool, args.threads, args.repeat, args.runs, 24)
    cases = [k for k in CASES if not args.cases or case_name(k) in args.cases]
    side = SIDE
    if args.smoke:
        cases, side, args.repeat, args.runs, args.threads = CASES[1:3], 32, 2, 5, [1]
    return table(cases, case_name, functools.partial(run_case, side=side), args.threads,
                 args.repeat, args.runs, 18)  # fmt: skip


if __name__ == "__main__":
    main()
