"""megbrain's time per operator against onnxruntime's per node, on torchvision's models through
ONNX: which kinds of layer lose, by how much, on one thread and on two.

    python benchmarks/zoo_nodes.py [--models mnasnet0_5,mobilenet_v3_small] [--threads 1 2]
        [--runs 40] [--top 12]

Both sides run the same exported model (:mod:`torchvision_models`; batch 1, 3x224x224):
megbrain through ``megbrain.onnx.load_inference`` under its CompGraphProfiler, onnxruntime
with its profiler on (spinning threads, as ``onnx_zoo.py`` runs it). Each operator's and each
node's time is the 10th percentile of its ``--runs`` steady-state runs (a shared machine's
stalls land in the upper tail). Operators and nodes are grouped by the kind of work:
convolutions by depthwise / dense, filter, stride and output plane ("1x1 @7" is a 1x1 layer
with a 7x7 output; "1x1 @1" the squeeze-and-excitation FCs), the classifier's product,
global pooling, elementwise work (onnxruntime's Mul, HardSigmoid, ... and megbrain's
Elemwise / JITExecutor) and layout changes (onnxruntime's NCHWc reorders, megbrain's
RelayoutFormat). Printed per model and thread count: per kind, count and summed time of
each side and their ratio (onnxruntime / megbrain: below 1 megbrain loses), sorted by what
megbrain loses; then the kinds' layers one by one, paired in execution order, for the
``--top`` kinds that lose most.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import tempfile

import numpy as np
import op_profile
import torchvision_models as zoo
from onnx_inference import _limit_threads

_ELEMWISE = {"Mul", "Add", "HardSigmoid", "HardSwish", "Relu", "Sigmoid", "Clip", "Sum",
             "Elemwise", "JITExecutor", "TypeCvt"}  # fmt: skip
_POOL = {"GlobalAveragePool", "ReduceMean", "Reduce", "AveragePool", "MaxPool", "Pooling"}
_MATMUL = {"Gemm", "MatMul", "FusedGemm", "FusedMatMul", "MatrixMul", "BatchedMatrixMul"}
_LAYOUT = {"ReorderInput", "ReorderOutput", "RelayoutFormat", "Transpose"}


def _conv_kind(kh: int, kw: int, stride: int, depthwise: bool, out_h: int) -> str:
    return f"{'dw' if depthwise else 'conv'} {kh}x{kw}/s{stride} @{out_h}"


def _kind(op: str) -> str:
    if op in _ELEMWISE:
        return "elementwise"
    if op in _POOL:
        return "pooling"
    if op in _MATMUL:
        return "matmul"
    if op in _LAYOUT:
        return "layout"
    return "other"


def ours(path: str, feed: dict, runs: int) -> list[tuple[str, str, float]]:
    """``(kind, detail, seconds)`` per megbrain operator, in execution order."""
    import megbrain.onnx as mo
    from megbrain.graph.static_infer import static_shape

    per = op_profile.operator_times(
        lambda graph: functools.partial(mo.load_inference(path, graph=graph), **feed), runs, 3
    )
    rows = []
    for opr, ts in per.items():
        name = opr.type_name
        if name in ("Host2DeviceCopy", "MultipleDeviceTensorHolder", "Reshape",
                    "AxisAddRemove", "Dimshuffle", "GetVarShape"):  # fmt: skip
            continue
        t = float(np.percentile(ts, 10))
        p = getattr(opr, "param", None)
        if (name == "ConvolutionForward" or name.startswith("ConvBias")) and p is not None:
            src = static_shape(opr.inputs[0])
            fil = static_shape(opr.inputs[1])
            out = static_shape(opr.outputs[0])
            if p.format == "NCHW88" and len(src) == 4:  # the first layer: (OC/8, FH, FW, IC, 8)
                kh, kw = fil[1:3]
            elif p.format == "NCHW88":
                kh, kw = fil[-4:-2] if fil[-2:] == (8, 8) else fil[-3:-1]
            else:
                kh, kw = fil[-2:]
            dw = p.sparse == "GROUP" and fil[-2:] != (8, 8) and fil[1] == fil[2] == 1
            ic = src[1] * (src[4] if len(src) == 5 else 1)
            oc = out[1] * (out[4] if len(out) == 5 else 1)
            kind = _conv_kind(kh, kw, p.stride_h, dw, out[2])
            rows.append((kind, f"{ic}->{oc} {name} [{opr.chosen_algorithm}]", t))
        else:
            out = static_shape(opr.outputs[0]) if opr.outputs else None
            rows.append((_kind(name), f"{name} -> {out}", t))
    return rows


def ort(path: str, feed: dict, threads: int, runs: int) -> list[tuple[str, str, float]]:
    """``(kind, detail, seconds)`` per onnxruntime node, in execution order."""
    import onnxruntime as rt

    with tempfile.TemporaryDirectory() as tmp:
        so = rt.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.add_session_config_entry("session.intra_op.allow_spinning", "1")
        so.log_severity_level = 3
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmp, "zoo")
        sess = rt.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        for _ in range(runs + 3):
            sess.run(None, feed)
        with open(sess.end_profiling()) as f:
            events = json.load(f)
    per: dict = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per.setdefault(e["name"], (e["args"], []))[1].append(e["dur"] * 1e-6)
    rows = []
    for args, ts in per.values():
        ts = ts[3:]
        op = args.get("op_name", "?")
        t = float(np.percentile(ts, 10))
        ins = [next(iter(d.values())) for d in args.get("input_type_shape", [])]
        outs = [next(iter(d.values())) for d in args.get("output_type_shape", [])]
        if op in ("Conv", "FusedConv") and len(ins) >= 2 and len(ins[1]) == 4:
            oc, icg, kh, kw = ins[1]
            src, out = ins[0], outs[0]
            stride = max(1, round(src[2] / out[2]))
            dw = icg == 1 and oc == src[1]
            kind = _conv_kind(kh, kw, stride, dw, out[2])
            rows.append((kind, f"{src[1]}->{oc} {op}", t))
        else:
            rows.append((_kind(op), f"{op} -> {outs[0] if outs else '?'}", t))
    return rows


def compare(mine, theirs, top: int) -> str:
    """The per-kind table and the paired layers of the ``top`` kinds that lose most."""
    kinds: dict = collections.defaultdict(lambda: ([], []))
    for k, d, t in mine:
        kinds[k][0].append((d, t))
    for k, d, t in theirs:
        kinds[k][1].append((d, t))
    order = sorted(kinds, key=lambda k: -(sum(t for _, t in kinds[k][0])
                                          - sum(t for _, t in kinds[k][1])))  # fmt: skip
    lines = [f"  {'kind':18s} {'n ours':>6s} {'ms ours':>8s} {'n ORT':>6s} {'ms ORT':>8s}"
             f" {'ratio':>6s} {'ours - ORT':>10s}"]  # fmt: skip
    tot = [0.0, 0.0]
    for k in order:
        a, b = kinds[k]
        ta, tb = sum(t for _, t in a), sum(t for _, t in b)
        tot[0] += ta
        tot[1] += tb
        ratio = f"{tb / ta:6.2f}" if ta > 0 else "     -"
        lines.append(f"  {k:18s} {len(a):6d} {ta * 1e3:8.3f} {len(b):6d} {tb * 1e3:8.3f} {ratio}"
                     f" {(ta - tb) * 1e3:10.3f}")  # fmt: skip
    lines.append(f"  {'all':18s} {'':6s} {tot[0] * 1e3:8.3f} {'':6s} {tot[1] * 1e3:8.3f}"
                 f" {tot[1] / tot[0]:6.2f} {(tot[0] - tot[1]) * 1e3:10.3f}")  # fmt: skip
    for k in order[:top]:
        a, b = kinds[k]
        if not a or k in ("layout", "other"):
            continue
        lines.append(f"  {k}: megbrain ms | onnxruntime ms, in execution order")
        for i in range(max(len(a), len(b))):
            da, ta = a[i] if i < len(a) else ("", float("nan"))
            db, tb = b[i] if i < len(b) else ("", float("nan"))
            lines.append(f"    {ta * 1e3:7.3f} {da:58s} | {tb * 1e3:7.3f} {db}")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mnasnet0_5,mobilenet_v3_small")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--top", type=int, default=6, help="kinds listed layer by layer")
    args = ap.parse_args(argv)
    tv = zoo.import_torchvision()
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    feed = {"x": x}
    for name in args.models.split(","):
        path = zoo.cached_export(tv, name)
        for threads in args.threads:
            _limit_threads(threads)
            mine = ours(path, feed, args.runs)
            theirs = ort(path, feed, threads, args.runs)
            print(f"\n{name}, {threads} thread(s), load average {os.getloadavg()[0]:.1f}: "
                  f"10th percentile of {args.runs} runs, ms")  # fmt: skip
            print(compare(mine, theirs, args.top))


if __name__ == "__main__":
    main()
