"""What an imported CNN runs after optimize_for_inference with JIT fusion: the convolutions and
one elementwise pass after each (no BatchNorm, no padding copies, no pooling of a whole plane),
and the same values as onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import megbrain as mgb  # noqa: E402
from megbrain.onnx import load  # noqa: E402

F32 = np.float32


def _bottleneck_model(rng) -> onnx.ModelProto:
    """Stem conv 3x3 + BN + ReLU + MaxPool(3, 2, pad 1); a residual block with a projection
    shortcut (conv-BN-ReLU, conv-BN, shortcut conv-BN, Add, ReLU); AveragePool of the whole
    plane, Flatten, Gemm: ResNet's layer kinds, small."""
    inits, nodes = [], []

    def param(name, arr):
        inits.append(numpy_helper.from_array(arr.astype(F32), name))
        return name

    def conv_bn(x, y, cin, cout, k, stride=1, relu=True):
        w = param(f"{y}_w", rng.uniform(-0.5, 0.5, (cout, cin, k, k)))
        nodes.append(
            helper.make_node(
                "Conv", [x, w], [f"{y}_c"], kernel_shape=[k, k], strides=[stride] * 2,
                pads=[k // 2] * 4,
            )
        )
        bn = [param(f"{y}_{p}", rng.uniform(lo, hi, cout))
              for p, lo, hi in (("g", 0.5, 1.5), ("b", -0.2, 0.2), ("m", -0.1, 0.1),
                                ("v", 0.5, 1.5))]  # fmt: skip
        out = y if not relu else f"{y}_bn"
        nodes.append(helper.make_node("BatchNormalization", [f"{y}_c", *bn], [out]))
        if relu:
            nodes.append(helper.make_node("Relu", [out], [y]))
        return y

    conv_bn("x", "s", 3, 8, 3)
    nodes.append(
        helper.make_node("MaxPool", ["s"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)
    )
    conv_bn("p", "a", 8, 8, 1)
    conv_bn("a", "b", 8, 16, 3, relu=False)
    conv_bn("p", "sc", 8, 16, 1, relu=False)
    nodes.append(helper.make_node("Add", ["b", "sc"], ["r"]))
    nodes.append(helper.make_node("Relu", ["r"], ["h"]))
    nodes.append(helper.make_node("AveragePool", ["h"], ["gp"], kernel_shape=[6, 6]))
    nodes.append(helper.make_node("Flatten", ["gp"], ["f"]))
    fw, fb = param("fw", rng.uniform(-0.5, 0.5, (5, 16))), param("fb", rng.uniform(-1, 1, 5))
    nodes.append(helper.make_node("Gemm", ["f", fw, fb], ["y"], transB=1))
    g = helper.make_graph(
        nodes, "bottleneck",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], inits,
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def test_optimized_cnn_runs_convolutions_and_one_pass_after_each():
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(0)
    model = _bottleneck_model(rng)
    res = load(model)
    outs = mgb.optimize_for_inference(list(res.outputs.values()))
    res.graph.set_option("graph_opt.jit", 1)
    f = res.graph.compile(list(res.inputs.values()), [mgb.copy_output(o) for o in outs])
    types = [o.type_name for o in f._func.iter_opr_seq()]
    computing = [
        t for t in types
        if t not in ("Host2DeviceCopy", "MultipleDeviceTensorHolder", "ImmutableTensor", "Reshape")
    ]  # fmt: skip
    # stem, a, b + shortcut: 4 convolutions; bias+ReLU after stem and a; one fused pass for
    # b's bias + the shortcut (its bias folded in) + ReLU; pooling; the head's reduction,
    # GEMM and bias
    assert computing.count("ConvolutionForward") == 4
    assert computing.count("PoolingForward") == 1  # the stem's, padded by the pooling itself
    assert computing.count("JITExecutor") == 1
    assert computing.count("Elemwise") == 3  # two bias+ReLU, the Gemm's bias
    assert computing.count("Reduce") == 1 and computing.count("MatrixMul") == 1
    assert len(computing) == 11, computing
    x = rng.uniform(-1, 1, (1, 3, 12, 12)).astype(F32)
    (y,) = f(x)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(y, sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
