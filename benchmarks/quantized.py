"""Int8 deployment (issue 31): ResNet-18 and MobileNetV2 as megbrain int8 graphs, against the
same networks in float32 through megbrain and the int8 network exported to ONNX by megbrain's
exporter and run by onnxruntime; same process, thread count and run.

The networks are torchvision's architectures (ResNet-18's basic blocks with their residual
adds; MobileNetV2's inverted residuals with depthwise 3x3 filters and ReLU6), batch 1,
3x224x224, random weights (He's initialization, no BatchNorm: an inference graph has it
folded). Per-tensor scales are calibrated on one random input by the float network: each
activation's largest magnitude over 127, a ReLU6 output's 6 / 127 (its saturation at 127 is
the clamp at 6, as TFLite deploys ReLU6); the filters' scales their largest magnitude over
127, the biases QuantizedS32 of scale ``x_scale * w_scale``.

- int8: QuantizedS8 activations and filters; ConvBias (dense, depthwise) with RELU or
  IDENTITY into QuantizedS8; the residual adds ElemwiseMultiType QFUSE_ADD_RELU (ResNet) and
  QADD (MobileNetV2); max and average pooling on int8; the classifier a quantized MatrixMul
  into QuantizedS32, dequantized, plus its float bias (MegEngine's quantized models: a
  QuantStub in front, a DequantStub after the classifier).
- float32: the same network with the int8 weights dequantized (ReLU6 a RELU ConvBias and a
  MIN).

Both megbrain graphs are compiled as ``megbrain.onnx.load_inference`` compiles a model
(``optimize_for_inference`` with its choices, JIT fusion, weight preprocessing, one warm-up
run); the int8 graph stays int8 (printed: its operators with a float output, only the input,
its quantize and the classifier's dequantize and bias). onnxruntime (default optimization
level: its QDQ fusions into QLinearAdd, QLinearGlobalAveragePool) runs the int8 graph
exported by ``megbrain.onnx.export`` (QuantizeLinear / QLinearConv / DequantizeLinear, QDQ
around the adds and the average pooling, MaxPool on int8, MatMulInteger), and the same model
with its int8 activations as uint8 of zero point 128 (:func:`uint8_activations`): the same
integers, in the form onnxruntime's x86 kernels are fast for (its int8 x int8 convolution
runs about 10x slower than uint8 x int8). The int8 outputs of megbrain and onnxruntime are
compared on the pooled features (int8, in quantization units) and the logits: ONNX rounds
ties to even where MegDNN rounds them away from zero, and a unit's difference spreads
through the layers after it.

Printed per model: the steady-state medians (a block's calls after its first, interleaved as
``onnx_inference.py`` does) of megbrain int8, megbrain float32 and both onnxruntime forms, the
int8 speedup over float32 (issue 31's target: >= 1.5) and the ratios onnxruntime / megbrain
int8 (target: >= 1.0; higher is better for megbrain).

    python benchmarks/quantized.py [--models resnet18,mobilenet_v2] [--threads 2] [--rounds R]
        [--size 224] [--profile [--top N]] [--nodes] [--layers]
        [--layout auto|use_nchw88|use_nchw4] [--scaling [--wait S]]

``--layout`` forces the layout flag of both megbrain graphs (default: ``load_inference``'s
choice, :func:`megbrain.gopt.nchw4.layout_flag`).
``--profile`` lists megbrain's top operators of both graphs (``op_profile.py``, as
``onnx_zoo.py`` prints them); ``--nodes`` compares megbrain's int8 operators with
onnxruntime's uint8-form nodes per kind of work (onnxruntime's profiler), and lists both
sides' nodes in order. ``--layers`` times each distinct dense convolution of the networks
alone (the VNNI kernels, ConvBias RELU into QuantizedS8), at one thread and at ``--threads``,
in each of :data:`LAYER_FORMS`: NCHW split once by bands of output rows
(``quantized.VNNI_BANDS``), NCHW split per phase as before, and NCHW4 by bands (the layout
of ``use_nchw4``), interleaved in one process: the wall time of a call (min and median of
the rounds) and its CPU time summed over the threads that ran it (min; the work the call
does, readable on a loaded machine where the wall times are not). ``--scaling`` times each
distinct convolution (dense and depthwise) alone at one thread and at ``--threads``, in
bursts taken only while no other task is runnable on the host (``--rounds`` bursts a layer,
waiting at most ``--wait`` seconds; ``--wait 0``: ungated, for a process that outranks the
host's others): on a shared machine the pool's thread otherwise rarely has a core, and a
two-thread time says nothing.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import op_profile
from onnx_inference import _limit_threads, _ort_runner, _settings, interleaved

import megbrain as mgb
from megbrain.gopt.nchw4 import layout_flag

MODELS = ("resnet18", "mobilenet_v2")

#: a ReLU6 output's scale: 127 units are 6.0, so saturation clamps at 6
RELU6_SCALE = 6.0 / 127


@dataclass
class Net:
    """A feed-forward network as a list of nodes, each ``(op, input indices, attributes)``;
    node 0 is the input. Weights are float32, drawn when a node is added."""

    rng: np.random.Generator
    size: int = 224
    nodes: list = field(default_factory=lambda: [("input", (), {})])
    width: list = field(default_factory=lambda: [3])  #: channels per node
    sizes: list = field(default_factory=list)  #: height (= width) per node

    def __post_init__(self):
        self.sizes = [self.size]

    def _add(self, op, ins, width, size, **attrs) -> int:
        self.nodes.append((op, tuple(ins), attrs))
        self.width.append(width)
        self.sizes.append(size)
        return len(self.nodes) - 1

    def conv(self, x: int, cout: int, k: int, stride: int = 1, act: str = "RELU",
             depthwise: bool = False) -> int:  # fmt: skip
        """A k x k convolution with bias and ``act`` (IDENTITY, RELU, RELU6), padded to keep
        the size at stride 1."""
        cin = self.width[x]
        icg = 1 if depthwise else cin
        w = self.rng.standard_normal((cout, icg, k, k)) * np.sqrt(2.0 / (icg * k * k))
        b = self.rng.standard_normal(cout) * 0.05
        size = (self.sizes[x] + 2 * (k // 2) - k) // stride + 1
        return self._add("conv", [x], cout, size, w=w.astype(np.float32), b=b.astype(np.float32),
                         stride=stride, pad=k // 2, group=cin if depthwise else 1, act=act)

    def add(self, a: int, b: int, relu: bool) -> int:
        return self._add("add", [a, b], self.width[a], self.sizes[a], relu=relu)

    def maxpool(self, x: int, k: int, stride: int, pad: int) -> int:
        size = (self.sizes[x] + 2 * pad - k) // stride + 1
        return self._add("maxpool", [x], self.width[x], size, window=k, stride=stride, pad=pad)

    def avgpool(self, x: int) -> int:
        """Average over the whole plane (the global pooling before the classifier)."""
        return self._add("avgpool", [x], self.width[x], 1, window=self.sizes[x])

    def fc(self, x: int, n: int) -> int:
        cin = self.width[x]
        w = self.rng.standard_normal((cin, n)) * np.sqrt(1.0 / cin)
        b = self.rng.standard_normal(n) * 0.05
        return self._add("fc", [x], n, 1, w=w.astype(np.float32), b=b.astype(np.float32))


def resnet18(rng, size: int = 224) -> Net:
    """torchvision's ResNet-18 (BatchNorm folded away)."""
    net = Net(rng, size)
    x = net.maxpool(net.conv(0, 64, 7, stride=2), 3, 2, 1)
    for i, cout in enumerate((64, 128, 256, 512)):
        for j in range(2):
            stride = 2 if i > 0 and j == 0 else 1
            y = net.conv(net.conv(x, cout, 3, stride), cout, 3, act="IDENTITY")
            if stride != 1 or net.width[x] != cout:
                x = net.conv(x, cout, 1, stride, act="IDENTITY")
            x = net.add(y, x, relu=True)
    net.fc(net.avgpool(x), 1000)
    return net


def mobilenet_v2(rng, size: int = 224) -> Net:
    """torchvision's MobileNetV2 (width 1.0; BatchNorm folded away, dropout dropped)."""
    net = Net(rng, size)
    x = net.conv(0, 32, 3, stride=2, act="RELU6")
    cin = 32
    for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                       (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)):  # fmt: skip
        for i in range(n):
            stride = s if i == 0 else 1
            y = x if t == 1 else net.conv(x, cin * t, 1, act="RELU6")
            y = net.conv(y, cin * t, 3, stride, act="RELU6", depthwise=True)
            y = net.conv(y, c, 1, act="IDENTITY")
            x = net.add(y, x, relu=False) if stride == 1 and cin == c else y
            cin = c
    x = net.conv(x, 1280, 1, act="RELU6")
    net.fc(net.avgpool(x), 1000)
    return net


BUILDERS = {"resnet18": resnet18, "mobilenet_v2": mobilenet_v2}


def _group_filter(w: np.ndarray, group: int) -> np.ndarray:
    """An (O, I/G, k, k) filter as megbrain's (G, O/G, I/G, k, k) when grouped."""
    return w if group == 1 else w.reshape(group, w.shape[0] // group, *w.shape[1:])


def _pool(x, mode: str, window: int, stride: int, pad: int):
    return mgb.opr.pooling(x, mode=mode, window_h=window, window_w=window, stride_h=stride,
                           stride_w=stride, pad_h=pad, pad_w=pad)  # fmt: skip


class FloatOps:
    """The nodes as float32 operators; ``params[k]`` are node k's ``(w, b)`` (default: the
    node's own float weights)."""

    def __init__(self, params=None):
        self.params = params or {}

    def _wb(self, k, a):
        return self.params.get(k, (a["w"], a["b"]))

    def conv(self, k, x, *, stride, pad, group, act, **a):
        w, b = self._wb(k, a)
        mode = "IDENTITY" if act == "IDENTITY" else "RELU"
        y = mgb.opr.conv_bias_activation(
            x, _group_filter(w, group), b.reshape(1, -1, 1, 1), nonlineMode=mode,
            stride_h=stride, stride_w=stride, pad_h=pad, pad_w=pad,
            sparse="GROUP" if group > 1 else "DENSE",
        )  # fmt: skip
        return mgb.opr.elemwise(y, 6.0, mode="MIN") if act == "RELU6" else y

    def add(self, k, a, b, *, relu):
        return mgb.opr.elemwise(a, b, mode="FUSE_ADD_RELU" if relu else "ADD")

    def maxpool(self, k, x, *, window, stride, pad):
        return _pool(x, "MAX", window, stride, pad)

    def avgpool(self, k, x, *, window):
        return _pool(x, "AVERAGE", window, 1, 0)

    def fc(self, k, x, **a):
        w, b = self._wb(k, a)
        return mgb.opr.matrix_mul(x.reshape(1, w.shape[0]), w) + b.reshape(1, -1)


def emit(net: Net, ops, x) -> list:
    """The vars of every node of ``net`` built by ``ops`` from input var ``x``."""
    vals = [x]
    for k, (op, ins, attrs) in enumerate(net.nodes[1:], 1):
        vals.append(getattr(ops, op)(k, *(vals[i] for i in ins), **attrs))
    return vals


class Int8Ops:
    """The nodes as int8 operators: ``scales[k]`` is node k's output scale, ``params[k]``
    its ``(int8 filter, filter scale, int32 bias)``."""

    def __init__(self, scales, params):
        self.scales, self.params = scales, params

    def conv(self, k, x, *, stride, pad, group, act, **_):
        wq, sw, bq = self.params[k]
        sx = mgb.dtype.get_scale(x.dtype)
        w = _group_filter(wq, group).view(mgb.dtype.qint8(sw))
        b = bq.reshape(1, -1, 1, 1).view(mgb.dtype.qint32(_bias_scale(sx, sw)))
        g = x.owner_graph
        return mgb.opr.conv_bias_activation(
            x, mgb.make_immutable(x.comp_node, g, w), mgb.make_immutable(x.comp_node, g, b),
            nonlineMode="IDENTITY" if act == "IDENTITY" else "RELU",
            dtype=mgb.dtype.qint8(self.scales[k]), stride_h=stride, stride_w=stride,
            pad_h=pad, pad_w=pad, sparse="GROUP" if group > 1 else "DENSE",
        )  # fmt: skip

    def add(self, k, a, b, *, relu):
        return mgb.opr.elemwise_multi_type(a, b, mode="QFUSE_ADD_RELU" if relu else "QADD",
                                           dtype=mgb.dtype.qint8(self.scales[k]))  # fmt: skip

    maxpool = FloatOps.maxpool
    avgpool = FloatOps.avgpool

    def fc(self, k, x, **a):
        """The quantized MatrixMul into QuantizedS32, dequantized, plus the float bias."""
        wq, sw, _ = self.params[k]
        w = mgb.make_immutable(x.comp_node, x.owner_graph, wq.view(mgb.dtype.qint8(sw)))
        y = mgb.opr.matrix_mul(x.reshape(1, wq.shape[0]), w)
        return mgb.opr.typecvt(y, np.float32) + a["b"].reshape(1, -1)


def _bias_scale(sx: float, sw: float) -> float:
    """The QuantizedS32 bias scale of a product of scales ``sx`` and ``sw`` (in float32, as
    MegDNN checks it)."""
    return float(np.float32(sx) * np.float32(sw))


def _quantize(v: np.ndarray, scale: float, dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.clip(np.round(v / np.float32(scale)), info.min, info.max).astype(dtype)


def calibrate(net: Net, x: np.ndarray) -> list[float]:
    """Each node's output scale: its largest magnitude on ``x`` in the float network over
    127 (a ReLU6 output: 6 / 127; pooling keeps its input's scale; the classifier: 0, float)."""
    g = mgb.comp_graph()
    xv = mgb.make_arg("cpu0", g, name="x", shape=x.shape, dtype=np.float32)
    vals = emit(net, FloatOps(), xv)
    got = g.compile([xv], [mgb.copy_output(v) for v in vals])(x)
    scales = []
    for (op, ins, attrs), v in zip(net.nodes, got):
        if op in ("maxpool", "avgpool"):
            scales.append(scales[ins[0]])
        elif op == "fc":
            scales.append(0.0)
        elif attrs.get("act") == "RELU6":
            scales.append(RELU6_SCALE)
        else:
            scales.append(float(np.abs(np.asarray(v)).max()) / 127)
    return scales


def quantize_params(net: Net, scales: list[float]) -> tuple[dict, dict]:
    """``(int8, float)``: per conv and classifier node, its int8 parameters ``(filter,
    filter scale, int32 bias)`` and the float network's ``(filter, bias)``, the int8 ones
    dequantized."""
    q, f = {}, {}
    for k, (op, ins, a) in enumerate(net.nodes):
        if op not in ("conv", "fc"):
            continue
        sw = float(np.abs(a["w"]).max()) / 127
        wq = _quantize(a["w"], sw, np.int8)
        if op == "fc":  # its bias stays float
            q[k], f[k] = (wq, sw, None), (wq * np.float32(sw), a["b"])
            continue
        sb = _bias_scale(scales[ins[0]], sw)
        bq = _quantize(a["b"], sb, np.int32)
        q[k] = (wq, sw, bq)
        f[k] = (wq * np.float32(sw), (bq * np.float32(sb)).astype(np.float32))
    return q, f


#: the layout flag :func:`compile_inference` passes: None for ``load_inference``'s choice
#: (:func:`megbrain.gopt.nchw4.layout_flag`: ``use_nchw4`` for ResNet-18's int8 graph on a
#: VNNI CPU, ``use_nchw88`` for MobileNetV2's and the float graphs), or the one ``--layout``
#: forces
LAYOUT: str | None = None


def compile_inference(graph, x, outs: list):
    """The function ``x -> outs`` compiled as ``megbrain.onnx.load_inference`` compiles a
    model: its ``optimize_for_inference`` choices (the layout flag :data:`LAYOUT`), JIT
    fusion, weight preprocessing, then one warm-up run on zeros. Returns ``(function,
    optimized output vars)``."""
    flag = LAYOUT or layout_flag(outs)
    outs = mgb.optimize_for_inference(
        outs, fuse_conv_bias_nonlinearity=True, fuse_conv_bias_with_z=True, **{flag: True}
    )
    graph.set_option("graph_opt.jit", 1)
    graph.set_option("graph_opt.weight_preprocess", 1)
    func = graph.compile([x], [mgb.copy_output(v) for v in outs])
    func(np.zeros(x.imm_shape, np.float32))
    return func, outs


def network(net: Net, ops, x: np.ndarray, graph=None):
    """``(graph, input var, [logits, pooled features])``: ``net`` built by ``ops`` for input
    ``x`` (by Int8Ops: ``x`` quantized first, as a QuantStub does)."""
    graph = graph or mgb.comp_graph()
    xv = mgb.make_arg("cpu0", graph, name="x", shape=x.shape, dtype=np.float32)
    src = xv
    if isinstance(ops, Int8Ops):
        src = mgb.opr.typecvt(xv, mgb.dtype.qint8(ops.scales[0]))
    vals = emit(net, ops, src)
    return graph, xv, [vals[-1], vals[-2]]


@dataclass
class Case:
    """One model: its input ``x`` and its operators as ``int8`` (Int8Ops) and ``float32``
    (FloatOps) for :func:`network`."""

    name: str
    net: Net
    x: np.ndarray
    int8: Int8Ops
    float32: FloatOps

    def compiled(self, kind: str, graph=None):
        """``(function of x, optimized outputs)`` of the ``kind`` network, compiled."""
        g, xv, outs = network(self.net, getattr(self, kind), self.x, graph)
        return compile_inference(g, xv, outs)

    def exported(self) -> bytes:
        """The int8 network as an ONNX model (outputs "logits" and "features")."""
        from megbrain.onnx import export

        _, _, outs = network(self.net, self.int8, self.x)
        return export(outs, None, output_names=["logits", "features"]).SerializeToString()


def make_case(name: str, size: int = 224, seed: int = 0) -> Case:
    """Model ``name`` with input ``size`` x ``size``: weights and input drawn from ``seed``,
    scales calibrated, weights quantized."""
    rng = np.random.default_rng(seed)
    net = BUILDERS[name](rng, size)
    x = rng.standard_normal((1, 3, size, size)).astype(np.float32)
    scales = calibrate(net, x)
    qp, fp = quantize_params(net, scales)
    return Case(name, net, x, Int8Ops(scales, qp), FloatOps(fp))


def float_operators(outs) -> list[str]:
    """The types of the operators computing ``outs`` whose output is not quantized (in the
    int8 network: the input, its quantize, the classifier's dequantize and bias)."""
    oprs = mgb.cgtools.get_oprs_seq(outs)
    return sorted({op.type for op in oprs if not mgb.dtype.is_quantize(op.outputs[0].dtype)})


def agreement(ours: list, theirs: list) -> dict:
    """How megbrain's int8 outputs ``ours`` and onnxruntime's ``theirs`` (``[logits,
    features]``) agree: the features (int8; uint8 in :func:`uint8_activations`' form) in
    quantization units, the logits (float)."""
    fa = np.asarray(ours[1]).view(np.int8).astype(np.int32).ravel()
    fb = np.asarray(theirs[1]).astype(np.int32).ravel()
    fb = fb - 128 if theirs[1].dtype == np.uint8 else fb
    units = np.abs(fa - fb)
    la, lb = np.asarray(ours[0]).ravel(), np.asarray(theirs[0]).ravel()
    return {
        "features max units": int(units.max()),
        "features equal": float((units == 0).mean()),
        "logits max diff": float(np.abs(la - lb).max()),
        "logits max": float(np.abs(lb).max()),
        "top-1 equal": bool(la.argmax() == lb.argmax()),
    }


#: where the exported models hold an activation's zero point: input positions per node type
_ACTIVATION_ZERO_POINTS = {
    "QuantizeLinear": (2,), "DequantizeLinear": (2,), "QLinearConv": (2, 7), "Max": (1,),
    "MatMulInteger": (2,),
}  # fmt: skip


def uint8_activations(model: bytes) -> bytes:
    """The exported int8 network with its int8 activations as uint8 of zero point 128
    (``q + 128``; the filters stay int8): the same integers after the zero points are
    subtracted, so the same network, in the form onnxruntime's x86 kernels are fast for
    (uint8 x int8 products, VNNI's ``vpdpbusd``; int8 x int8 takes a slow path). Written for
    the nodes :func:`megbrain.onnx.export` writes for these networks (the RELU as a Max with
    the zero point, the classifier's input the only MatMulInteger activation)."""
    import onnx
    from onnx import TensorProto, numpy_helper

    m = onnx.load_from_string(model)
    inits = {t.name: t for t in m.graph.initializer}
    shifted: dict[str, str] = {}
    for node in m.graph.node:
        for i in _ACTIVATION_ZERO_POINTS.get(node.op_type, ()):
            t = inits.get(node.input[i])
            if t is None or t.data_type != TensorProto.INT8:
                continue
            if t.name not in shifted:
                zp = numpy_helper.to_array(t).astype(np.int16) + 128
                shifted[t.name] = f"{t.name}_uint8"
                m.graph.initializer.append(
                    numpy_helper.from_array(zp.astype(np.uint8), shifted[t.name])
                )
            node.input[i] = shifted[t.name]
    for out in m.graph.output:
        if out.type.tensor_type.elem_type == TensorProto.INT8:
            out.type.tensor_type.elem_type = TensorProto.UINT8
    onnx.checker.check_model(m, full_check=True)
    return m.SerializeToString()


def main(argv=None) -> list[dict]:
    """Run the benchmark; returns the rows printed (one dict per model)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help="names, comma-separated")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--size", type=int, default=224, help="input height and width")
    ap.add_argument("--profile", action="store_true", help="megbrain's top operators")
    ap.add_argument("--top", type=int, default=10, help="rows of each --profile table")
    ap.add_argument("--nodes", action="store_true",
                    help="megbrain int8 against onnxruntime u8 per kind of node")
    ap.add_argument("--layout", choices=("auto", "use_nchw88", "use_nchw4"), default="auto",
                    help="the layout flag of both megbrain graphs (auto: load_inference's)")
    ap.add_argument("--layers", action="store_true",
                    help="the dense convolutions alone, NCHW (bands, phases) and NCHW4")
    ap.add_argument("--scaling", action="store_true",
                    help="each convolution alone at 1 and --threads threads, in idle windows")
    ap.add_argument("--wait", type=float, default=600.0,
                    help="--scaling: the longest wait for idle windows, s (0: no gate)")
    args = ap.parse_args(argv)
    global LAYOUT
    LAYOUT = None if args.layout == "auto" else args.layout
    if args.scaling:
        _limit_threads(args.threads)
        for name in args.models.split(","):
            net = BUILDERS[name](np.random.default_rng(0), args.size)
            print_scaling(name, scaling_times(net, args.threads, args.rounds, wait_s=args.wait),
                          args.threads)  # fmt: skip
            print(f"load average {os.getloadavg()[0]:.2f}")
        return []
    if args.layers:
        _limit_threads(args.threads)
        for name in args.models.split(","):
            print_layers(name, layer_times(BUILDERS[name](np.random.default_rng(0), args.size),
                                           args.threads, args.rounds))  # fmt: skip
        return []
    import onnxruntime  # noqa: F401 - fail early without the peer

    rows, profiles, nodes = [], [], []
    load0 = os.getloadavg()
    for name in args.models.split(","):
        if name not in BUILDERS:
            raise SystemExit(f"unknown model {name!r}; the models are {', '.join(MODELS)}")
        _limit_threads(args.threads)
        case = make_case(name, args.size)
        f8, opt8 = case.compiled("int8")
        f32, _ = case.compiled("float32")
        model = case.exported()
        feed = {"x": case.x}
        fns = {"int8": functools.partial(f8, case.x), "float32": functools.partial(f32, case.x),
               "onnxruntime": _ort_runner(model, feed, args.threads, spin=True),
               "onnxruntime u8": _ort_runner(uint8_activations(model), feed, args.threads,
                                             spin=True)}  # fmt: skip
        ours = f8(case.x)
        row = {"model": name, "float operators": float_operators(opt8),
               "float32 top-1 equal": int(np.asarray(f32(case.x)[0]).argmax())
               == int(np.asarray(ours[0]).argmax())}  # fmt: skip
        for peer in ("onnxruntime", "onnxruntime u8"):
            row[f"{peer} agreement"] = agreement(ours, fns[peer]())
        steady, _ = interleaved(fns, args.rounds)
        row.update({k: statistics.median(v) for k, v in steady.items()})
        rows.append(row)
        if args.nodes:
            nodes.append((name, node_times(case, model, args.threads, max(10, args.rounds))))
        if args.profile:
            runs = max(10, args.rounds)
            for kind in ("int8", "float32"):
                build = functools.partial(_runner, case, kind)
                profiles.append((f"{name} {kind}", op_profile.profile(build, runs)))
    load1 = os.getloadavg()
    print(_settings(args.threads, True))
    print(f"{args.rounds} interleaved rounds; batch 1, 3x{args.size}x{args.size}; load average "
          f"{load0[0]:.2f} before, {load1[0]:.2f} after")  # fmt: skip
    print("ratio = onnxruntime's time / megbrain int8's (higher is better for megbrain); "
          "onnxruntime runs the exported model (int8 activations) and its uint8-activation "
          "form (x86's fast path)")  # fmt: skip
    print(f"{'model':14s} {'int8 ms':>9s} {'float32 ms':>11s} {'int8 speedup':>13s} "
          f"{'onnxrt int8 ms':>15s} {'ratio':>6s} {'onnxrt u8 ms':>13s} {'ratio':>6s}")  # fmt: skip
    for r in rows:
        a, b, c, d = (r[k] for k in ("int8", "float32", "onnxruntime", "onnxruntime u8"))
        print(f"{r['model']:14s} {a * 1e3:9.2f} {b * 1e3:11.2f} {b / a:13.2f} {c * 1e3:15.2f} "
              f"{c / a:6.2f} {d * 1e3:13.2f} {d / a:6.2f}")  # fmt: skip
    for r in rows:
        for peer in ("onnxruntime", "onnxruntime u8"):
            g = r[f"{peer} agreement"]
            print(f"{r['model']}: megbrain int8 against {peer}: pooled features equal on "
                  f"{g['features equal']:.1%}, at most {g['features max units']} unit(s) apart; "
                  f"logits at most {g['logits max diff']:.3g} apart (largest "
                  f"{g['logits max']:.3g}), top-1 {'equal' if g['top-1 equal'] else 'DIFFERENT'}")
        print(f"{r['model']}: int8 and float32 top-1 "
              f"{'equal' if r['float32 top-1 equal'] else 'different'}; float operators in "
              f"the optimized int8 graph: {', '.join(r['float operators'])}")  # fmt: skip
    for name, prof_rows in profiles:
        op_profile.print_profile(name, prof_rows, args.top)
    for name, (ours, theirs) in nodes:
        print_nodes(name, ours, theirs, args.threads)
    return rows


def node_kind(op: str, x: tuple, w: tuple | None, y: tuple, group: int = 1) -> str:
    """The kind of work of a node, named alike for megbrain's operators and onnxruntime's
    nodes: a convolution by its filter, stride and grouping (``x``, ``w``, ``y`` the NCHW
    source, (O, I/G, FH, FW) filter and output shapes), else ``op``."""
    if w is None:
        return op
    stride = -(-x[2] // y[2])
    what = "depthwise" if group > 1 and w[1] == 1 else ("stem" if x[1] == 3 else "dense")
    return f"conv {what} {w[2]}x{w[3]}/s{stride}"


#: megbrain's operator types and onnxruntime's node types, by the work both name alike
_NODE_NAMES = {
    "PoolingForward MAX": "max pool", "MaxPool": "max pool",
    "PoolingForward AVERAGE": "average pool", "QLinearGlobalAveragePool": "average pool",
    "ElemwiseMultiType": "residual add", "QLinearAdd": "residual add",
    "MatrixMul": "classifier", "MatMulInteger": "classifier",
    "TypeCvt": "quantize, dequantize", "QuantizeLinear": "quantize, dequantize",
    "NhwcMaxPool": "max pool", "Max": "ReLU (Max)", "Transpose": "relayout",
    "RelayoutFormat": "relayout",
    "DequantizeLinear": "quantize, dequantize",
}  # fmt: skip


def _our_nodes(case: Case, runs: int) -> list[tuple[str, str, float]]:
    """``(kind, shapes, median s)`` of each operator of megbrain's int8 graph, steady state."""
    from megbrain.graph.static_infer import static_shape

    per = op_profile.operator_times(lambda graph: _runner(case, "int8", graph), runs)
    rows = []
    for opr, ts in per.items():
        if opr.type_name in ("Host2DeviceCopy", "MultipleDeviceTensorHolder"):
            continue
        shapes = [tuple(static_shape(v) or ()) for v in opr.inputs]
        y = tuple(static_shape(opr.outputs[0]) or ())
        p = getattr(opr, "param", None)
        if opr.type_name.startswith("ConvBias") or opr.type_name == "ConvolutionForward":
            if p.format == "NCHW4":  # as NCHW: channels unblocked (the stem's 4 were 3)
                shapes[0] = _unblocked(shapes[0], stem=True)
                shapes[1] = (*shapes[1][:-4], shapes[1][-4] * 4, *shapes[1][-3:-1])
                y = _unblocked(y)
            w = shapes[1]
            group = w[0] if p.sparse == "GROUP" else 1
            w = (w[0] * w[1], *w[2:]) if p.sparse == "GROUP" else w
            kind = node_kind("conv", shapes[0], w, y, group)
        else:
            mode = getattr(p, "mode", None)
            name = f"{opr.type_name} {mode}" if opr.type_name == "PoolingForward" else None
            kind = _NODE_NAMES.get(name or opr.type_name, opr.type_name)
        rows.append((kind, f"{'x'.join(map(str, shapes[0] if shapes else ()))} -> "
                           f"{'x'.join(map(str, y))}", statistics.median(ts)))  # fmt: skip
    return rows


def _unblocked(shape: tuple, stem: bool = False) -> tuple:
    """The NCHW shape of an NCHW4 one (``stem``: 4 channels were the input's 3, padded)."""
    n, c4, h, w, _ = shape
    return (n, 3 if stem and c4 == 1 else 4 * c4, h, w)


def _ort_nodes(model: bytes, feed: dict, threads: int, runs: int) -> list:
    """``(kind, shapes, median s)`` of each node onnxruntime runs of ``model`` (its own
    profiler's kernel times), steady state."""
    import json
    import tempfile

    import onnx
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "1")
    so.log_severity_level = 3
    with tempfile.TemporaryDirectory() as tmp:
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmp, "ort")
        so.optimized_model_filepath = os.path.join(tmp, "optimized.onnx")
        sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        for _ in range(2 + runs):
            sess.run(None, feed)
        with open(sess.end_profiling()) as f:
            events = json.load(f)
        # the profile gives no prepacked filter's shape: the optimized graph's nodes do
        optimized = onnx.load(so.optimized_model_filepath)
    inits = {t.name: tuple(t.dims) for t in optimized.graph.initializer}
    graph_nodes = {n.name: n for n in optimized.graph.node}
    per: dict = {}
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        per.setdefault(e["name"], []).append((e["dur"] * 1e-6, e["args"]))
    rows = []
    for name, ev in per.items():
        args = ev[-1][1]
        ins = [tuple(next(iter(d.values()))) for d in args.get("input_type_shape", [])]
        outs = [tuple(next(iter(d.values()))) for d in args.get("output_type_shape", [])]
        op = args.get("op_name", name)
        node = graph_nodes.get(name[: -len("_kernel_time")])
        if op == "QLinearConv" and node is not None:
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            x, y = ins[0], outs[0]
            if attrs.get("channels_last"):  # NHWC: as NCHW for node_kind
                x, y = (x[0], x[3], x[1], x[2]), (y[0], y[3], y[1], y[2])
            kind = node_kind("conv", x, inits[node.input[3]], y, attrs.get("group", 1))
        else:
            kind = _NODE_NAMES.get(op, op)
        ts = [t for t, _ in ev[2:]] or [t for t, _ in ev]  # the first two runs: warm-up
        rows.append((kind, f"{'x'.join(map(str, ins[0] if ins else ()))} -> "
                           f"{'x'.join(map(str, outs[0] if outs else ()))}",
                     statistics.median(ts)))  # fmt: skip
    return rows


def node_times(case: Case, model: bytes, threads: int, runs: int) -> tuple[list, list]:
    """Per node, megbrain int8's and onnxruntime u8's steady-state times (:func:`_our_nodes`,
    :func:`_ort_nodes`) at ``threads`` threads."""
    ours = _our_nodes(case, runs)
    theirs = _ort_nodes(uint8_activations(model), {"x": case.x}, threads, runs)
    return ours, theirs


def print_nodes(name: str, ours: list, theirs: list, threads: int) -> None:
    """The per-kind table of :func:`node_times`: count, summed medians and the ratio."""
    kinds: dict = {}
    for side, rows in ((0, ours), (1, theirs)):
        for kind, _detail, t in rows:
            k = kinds.setdefault(kind, [0, 0.0, 0, 0.0])
            k[2 * side] += 1
            k[2 * side + 1] += t
    tot = [sum(r[2] for r in ours), sum(r[2] for r in theirs)]
    print(f"\n{name}, {threads} thread(s): per kind of node, megbrain int8 against onnxruntime "
          f"u8 (sums of per-node medians; ratio = onnxruntime / megbrain)")  # fmt: skip
    print(f"  {'kind':28s} {'n':>3s} {'megbrain ms':>12s} {'n':>3s} {'onnxrt u8 ms':>13s} "
          f"{'ratio':>6s} {'gap ms':>7s}")  # fmt: skip
    for kind, (n0, t0, n1, t1) in sorted(kinds.items(), key=lambda kv: kv[1][3] - kv[1][1]):
        ratio = f"{t1 / t0:6.2f}" if t0 and t1 else f"{'-':>6s}"
        print(f"  {kind:28s} {n0:3d} {t0 * 1e3:12.3f} {n1:3d} {t1 * 1e3:13.3f} {ratio} "
              f"{(t0 - t1) * 1e3:7.3f}")  # fmt: skip
    print(f"  {'sum':28s} {len(ours):3d} {tot[0] * 1e3:12.3f} {len(theirs):3d} "
          f"{tot[1] * 1e3:13.3f} {tot[1] / tot[0]:6.2f} {(tot[0] - tot[1]) * 1e3:7.3f}")
    for side, rows in (("megbrain", ours), ("onnxruntime u8", theirs)):
        print(f"  {side} per node, in order:")
        for kind, detail, t in rows:
            print(f"    {kind:28s} {detail:34s} {t * 1e3:8.3f}")


def _runner(case: Case, kind: str, graph):
    """A call of ``case``'s ``kind`` network compiled into ``graph``."""
    f, _ = case.compiled(kind, graph)
    return functools.partial(f, case.x)


#: the forms ``--layers`` times: the NCHW VNNI bands, the same split per phase, and the
#: NCHW4 bands (the blocked source's words read as they are, NCHW4 words written)
LAYER_FORMS = ("bands", "phases", "nchw4")


def _blocked(a: np.ndarray) -> np.ndarray:
    """NCHW ``a`` (channels a multiple of 4, or padded with zeros) as NCHW4, its dtype."""
    n, c, h, w = a.shape
    cp = -(-c // 4) * 4
    b = np.zeros((n, cp, h, w), a.dtype.str)
    b[:, :c] = a.view(a.dtype.str)
    return np.ascontiguousarray(b.reshape(n, cp // 4, 4, h, w).transpose(0, 1, 3, 4, 2)).view(
        a.dtype)


def _bind_layer(cin: int, size: int, cout: int, k: int, stride: int, threads: int, form: str,
                log: list, depthwise: bool = False):  # fmt: skip
    """A ConvBias RELU into QuantizedS8 (random operands, a constant filter) bound for
    ``threads`` threads in ``form`` (:data:`LAYER_FORMS`; a ``depthwise`` one, ``cout`` =
    ``cin`` groups, "bands": the NCHW kernels); each split's parts append ``(thread, thread
    CPU ns)`` to ``log``. Returns the step and a function reading its output in NCHW."""
    from megbrain.kernels import parallel
    from megbrain.kernels.conv import nchw4, quantized
    from megbrain.kernels.conv.constant_operands import constant_filter

    rng = np.random.default_rng(0)
    q8, q32 = mgb.dtype.qint8, mgb.dtype.qint32
    x = rng.integers(-128, 128, (1, cin, size, size), np.int8).view(q8(0.05))
    w = rng.integers(-128, 128, (cin, 1, 1, k, k) if depthwise else (1, cout, cin, k, k),
                     np.int8).view(q8(0.01))  # fmt: skip
    b = rng.integers(-1000, 1000, (1, cout, 1, 1), np.int32).view(q32(0.0005))
    side = (size + 2 * (k // 2) - k) // stride + 1
    y = np.empty((1, cout, side, side), np.int8).view(q8(0.3))
    split, count = parallel.split, parallel.num_threads

    def timed(fn, n, min_items):
        def part(lo, hi):
            t = time.thread_time_ns()
            fn(lo, hi)
            log.append((threading.get_ident(), time.thread_time_ns() - t))

        return split(part, n, min_items)

    def nchw():
        if form != "nchw4":
            return y.view(np.int8)
        return y4.view(np.int8).transpose(0, 1, 4, 2, 3).reshape(y.shape)

    saved = quantized.VNNI_BANDS
    quantized.VNNI_BANDS, parallel.split, parallel.num_threads = (form != "phases", timed,
                                                                  lambda: threads)  # fmt: skip
    geo = ((stride,) * 2, (k // 2,) * 2, (1, 1), False, "RELU")
    try:
        with constant_filter(True):
            if form == "nchw4":
                y4 = _blocked(y)
                step = nchw4.bind_nchw4_conv_bias(_blocked(x), _blocked(w[0]), _blocked(b),
                                                  None, y4, *geo, group=False)
            else:
                step = quantized.bind_quantized_conv_bias(x, w, b, None, y, *geo)
    finally:
        quantized.VNNI_BANDS, parallel.split, parallel.num_threads = saved, split, count
    return step, nchw


def layer_times(net: Net, threads: int, rounds: int, calls: int = 20) -> list[tuple]:
    """``(layer, {(threads, form): (wall min, wall median, CPU min)})`` in s for each
    distinct dense convolution of ``net`` (see the module's ``--layers``)."""
    shapes = []
    for op, ins, a in net.nodes:
        if op == "conv" and a["group"] == 1:
            i = ins[0]
            shape = (net.width[i], net.sizes[i], a["w"].shape[0], a["w"].shape[2], a["stride"])
            if shape not in shapes:
                shapes.append(shape)
    out = []
    for shape in shapes:
        log: list = []
        steps = {(t, form): _bind_layer(*shape, t, form, log)
                 for t in sorted({1, threads}) for form in LAYER_FORMS}  # fmt: skip
        first = None
        for step, result in steps.values():
            step()
            got = result().copy()
            if first is not None and not np.array_equal(got, first):
                raise AssertionError(f"layer {shape}: the forms differ")
            first = got
        walls: dict = {key: [] for key in steps}
        cpus: dict = {key: [] for key in steps}
        me = threading.get_ident()
        for _ in range(rounds):
            for key, (step, _) in steps.items():
                t = time.perf_counter()
                for _ in range(calls):
                    log.clear()
                    t_cpu = time.thread_time_ns()
                    step()
                    mine = time.thread_time_ns() - t_cpu
                    cpus[key].append((mine + sum(ns for who, ns in log if who != me)) * 1e-9)
                walls[key].append((time.perf_counter() - t) / calls)
        out.append((shape, {key: (min(walls[key]), statistics.median(walls[key]),
                                  min(cpus[key])) for key in steps}))  # fmt: skip
    return out


def _runnable_others() -> int:
    """Tasks runnable on the host now besides the one reading (``/proc/loadavg``)."""
    with open("/proc/loadavg") as f:
        return int(f.read().split()[3].split("/")[0]) - 1


def scaling_times(net: Net, threads: int, bursts: int, calls: int = 10,
                  wait_s: float = 600.0) -> list[tuple]:  # fmt: skip
    """``(layer, one-thread min s, threads min s, bursts taken)`` for each distinct
    convolution of ``net`` (dense and depthwise, ConvBias RELU into QuantizedS8, NCHW), each
    bound for one thread and for ``threads``: a burst is ``calls`` calls of each, taken only
    while no other task is runnable on the host (an idle window; its pool thread then has a
    core), ``bursts`` per layer, the layers in turn; a layer that finds fewer idle windows
    within ``wait_s`` overall keeps the bursts it got (0: no time). ``wait_s`` = 0 takes
    every burst at once, ungated (a process of higher priority than the host's others)."""
    seen, layers = set(), []
    for op, ins, a in net.nodes:
        if op == "conv":
            i = ins[0]
            dw = a["group"] > 1
            shape = (net.width[i], net.sizes[i], a["w"].shape[0], a["w"].shape[2], a["stride"],
                     dw)  # fmt: skip
            if shape not in seen:
                seen.add(shape)
                layers.append(shape)
    steps = [tuple(_bind_layer(*shape[:5], t, "bands", [], depthwise=shape[5])[0]
                   for t in (1, threads)) for shape in layers]  # fmt: skip
    best = [[np.inf, np.inf] for _ in layers]
    taken = [0] * len(layers)
    for pair in steps:
        for step in pair:
            step()
    end = time.monotonic() + wait_s if wait_s > 0 else np.inf
    k = 0
    while min(taken) < bursts and time.monotonic() < end:
        time.sleep(0.002)  # (the pool's thread stops polling)
        if wait_s > 0 and _runnable_others() > 0:
            continue
        while taken[k % len(layers)] >= bursts:
            k += 1
        j = k % len(layers)
        for side, step in enumerate(steps[j]):
            for _ in range(calls):
                t = time.perf_counter()
                step()
                best[j][side] = min(best[j][side], time.perf_counter() - t)
        taken[j] += 1
        k += 1
    return [(shape, *best[j], taken[j]) for j, shape in enumerate(layers)]


def print_scaling(name: str, rows: list[tuple], threads: int) -> None:
    """The table of :func:`scaling_times`, us, ratio = one thread / ``threads`` (> 1: the
    split pays), and the sums over the layers timed."""
    print(f"{name}: each distinct convolution alone in idle windows, us (min over the bursts); "
          f"ratio = 1 thread / {threads} threads")  # fmt: skip
    print(f"{'layer':34s} {'1 thread':>9s} {f'{threads} threads':>10s} {'ratio':>6s} "
          f"{'bursts':>6s}")  # fmt: skip
    s1 = s2 = 0.0
    for (cin, size, cout, k, stride, dw), t1, t2, n in rows:
        label = f"{cin}x{size}x{size} -> {cout} {k}x{k}/s{stride}{' depthwise' if dw else ''}"
        if not n:
            print(f"{label:34s} {'-':>9s} {'-':>10s} {'-':>6s} {0:6d}")
            continue
        s1, s2 = s1 + t1, s2 + t2
        print(f"{label:34s} {t1 * 1e6:9.1f} {t2 * 1e6:10.1f} {t1 / t2:6.2f} {n:6d}")
    if s2:
        print(f"{'the layers timed, summed':34s} {s1 * 1e6:9.1f} {s2 * 1e6:10.1f} "
              f"{s1 / s2:6.2f}")  # fmt: skip


def print_layers(name: str, rows: list[tuple]) -> None:
    """The table of :func:`layer_times`, ms, and the sums over the layers."""
    print(f"{name}: dense convolutions alone, ms: wall min / median, CPU over the threads")
    keys = list(rows[0][1])
    print(f"{'layer':28s} " + " ".join(
        f"{f'{t}t {form}':>22s}" for t, form in keys))  # fmt: skip
    sums = {k: [0.0, 0.0, 0.0] for k in keys}
    for (cin, size, cout, k, stride), times in rows:
        label = f"{cin}x{size}x{size} -> {cout} {k}x{k}/s{stride}"
        for key in keys:
            sums[key] = [a + b for a, b in zip(sums[key], times[key])]
        print(f"{label:28s} " + " ".join(_layer_cell(times[key]) for key in keys))
    print(f"{'the layers summed':28s} " + " ".join(_layer_cell(sums[key]) for key in keys))


def _layer_cell(times) -> str:
    lo, med, cpu = (v * 1e3 for v in times)
    return f"{f'{lo:7.3f} /{med:7.3f},{cpu:6.3f}':>22s}"

if __name__ == "__main__":
    main()
