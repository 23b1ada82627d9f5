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

import argparse  # noqa: E402

import numpy as np  # noqa: E402
from conv_fast import best_times, ort_conv_relu  # noqa: E402
from pointwise88 import _ort_node_time  # noqa: E402

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
    conv_common.THREADS = threads
    try:
        with constant_filter(True):
            name, step = conv_nchw88.bind_nchw88_forward(
                x, filt, out, (s, s), (p, p), (1, 1), epilogue=Epilogue(b, True))
        fns = {"ours": step}
        if peer:
            sess = ort_conv_relu(w, b, side, threads, stride=s, pad=p)
            fns["ort_run"] = lambda: sess.run(None, {"x": x})
        times = best_times(fns, repeat, False, interleave=threads == 1)
        step()
    finally:
        conv_common.THREADS = None
    if peer:
        want = sess.run(None, {"x": x})[0]
        np.testing.assert_allclose(conv_nchw88.to_nchw(out), want, rtol=1e-4, atol=1e-4)
        times["ort"] = _ort_node_time(IC, oc, side, w, b, x, threads, runs, stride=s, pad=p)
    return {"name": name, "flops": 2 * o * o * IC * f * f * oc, **times}


def _ort_maxpool(case, threads: int, profile: str | None = None):
    import onnxruntime as ort
    from onnx import TensorProto, helper

    c, side, k, s, p, ceil = case
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[k, k], strides=[s, s],
                            pads=[p] * 4, ceil_mode=ceil)  # fmt: skip
    graph = helper.make_graph(
        [node], "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, side, side])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = threads
    if profile:
        opts.enable_profiling = True
        opts.profile_file_prefix = profile
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])  # fmt: skip


def run_pool(case, threads: int, repeat: int, runs: int, peer: bool = True) -> dict:
    """One of :data:`POOLS` at ``threads`` threads (seconds): ours (the NCHW88 kernel with
    ceil mode's end padding), and with ``peer`` onnxruntime's MaxPool node (10th percentile
    of ``runs``), the output checked against onnxruntime's."""
    import json
    import tempfile

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
    saved = parallel.num_threads
    parallel.num_threads = lambda: threads
    try:
        step = pool88.bind_pooling_nchw88(src, out, "MAX", *geo)
        times = best_times({"ours": step}, repeat, False)
    finally:
        parallel.num_threads = saved
    if peer:
        with tempfile.TemporaryDirectory() as tmp:
            sess = _ort_maxpool(case, threads, profile=os.path.join(tmp, "mp"))
            want = sess.run(None, {"x": x})[0]
            np.testing.assert_array_equal(conv_nchw88.to_nchw(out), want)
            times.update(best_times({"ort_run": lambda: sess.run(None, {"x": x})}, repeat, False))
            for _ in range(runs):
                sess.run(None, {"x": x})
            with open(sess.end_profiling()) as f:
                events = json.load(f)
        durs = [e["dur"] for e in events if e.get("cat") == "Node"
                and e.get("args", {}).get("op_name") == "MaxPool"
                and e["name"].endswith("_kernel_time")]  # fmt: skip
        times["ort"] = float(np.percentile(durs[5:], 10)) * 1e-6
    return times


def pool_name(case) -> str:
    c, side, k, s, p, _ = case
    return f"max {c}x{side}x{side} {k}x{k}/s{s}/p{p} ceil"


def main_pool(threads_list, repeat: int, runs: int) -> list[dict]:
    """The :data:`POOLS` table (see the module's docstring)."""
    rows = []
    print(f"{'pooling':>34} {'thr':>3} {'ours ms':>8} {'ort node':>8} {'ort run':>8} "
          f"{'ratio':>6}")  # fmt: skip
    for threads in threads_list:
        alone = {case: run_pool(case, threads, repeat, runs, peer=False)["ours"]
                 for case in POOLS}  # fmt: skip
        tot = dict(ours=0.0, ort=0.0, ort_run=0.0)
        for case in POOLS:
            r = {**run_pool(case, threads, repeat, runs), "ours": alone[case]}
            rows.append({"case": pool_name(case), "threads": threads, **r})
            for key in tot:
                tot[key] += r[key]
            print(f"{pool_name(case):>34} {threads:>3} {r['ours'] * 1e3:8.3f} "
                  f"{r['ort'] * 1e3:8.3f} {r['ort_run'] * 1e3:8.3f} "
                  f"{r['ort'] / r['ours']:6.2f}")  # fmt: skip
        print(f"{'sum':>34} {threads:>3} {tot['ours'] * 1e3:8.3f} {tot['ort'] * 1e3:8.3f} "
              f"{tot['ort_run'] * 1e3:8.3f} {tot['ort'] / tot['ours']:6.2f}")  # fmt: skip
    return rows


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="*", help="case names (default: all)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--runs", type=int, default=100, help="onnxruntime's profiled runs")
    ap.add_argument("--smoke", action="store_true", help="two cases at 32x32, 2 rounds, 1 thread")
    ap.add_argument("--pool", action="store_true", help="GoogLeNet's max poolings instead")
    args = ap.parse_args(argv)
    if args.pool:
        return main_pool(args.threads, args.repeat, args.runs)
    cases = [k for k in CASES if not args.cases or case_name(k) in args.cases]
    side = SIDE
    if args.smoke:
        cases, side, args.repeat, args.runs, args.threads = CASES[1:3], 32, 2, 5, [1]
    rows = []
    print(f"{'case':>18} {'thr':>3} {'algorithm':>18} {'ours ms':>8} {'ort node':>8} "
          f"{'ort run':>8} {'ratio':>6} {'GF/s':>6}")  # fmt: skip
    for threads in args.threads:
        tot = dict(ours=0.0, ort=0.0, ort_run=0.0)
        worst = (float("inf"), "")
        # ours first, before any onnxruntime session exists (its thread pools take the
        # cores from a split kernel timed after them: see pointwise88.py)
        alone = {case: run_case(case, threads, args.repeat, peer=False, side=side)["ours"]
                 for case in cases}  # fmt: skip
        for case in cases:
            r = {**run_case(case, threads, args.repeat, args.runs, side=side),
                 "ours": alone[case]}  # fmt: skip
            rows.append({"case": case_name(case), "threads": threads, **r})
            for k in tot:
                tot[k] += r[k]
            ratio = r["ort"] / r["ours"]
            worst = min(worst, (ratio, case_name(case)))
            print(f"{case_name(case):>18} {threads:>3} {r['name']:>18} {r['ours'] * 1e3:8.3f} "
                  f"{r['ort'] * 1e3:8.3f} {r['ort_run'] * 1e3:8.3f} {ratio:6.2f} "
                  f"{r['flops'] / r['ours'] * 1e-9:6.1f}")  # fmt: skip
        print(f"{'sum':>18} {threads:>3} {'':>18} {tot['ours'] * 1e3:8.3f} {tot['ort'] * 1e3:8.3f} "
              f"{tot['ort_run'] * 1e3:8.3f} {tot['ort'] / tot['ours']:6.2f}   lowest "
              f"{worst[0]:.2f} ({worst[1]})")  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
