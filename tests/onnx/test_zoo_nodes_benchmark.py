"""benchmarks/zoo_nodes.py on a small ONNX model (a depthwise, a 1x1 convolution, a global
pooling and a Gemm), so that it cannot rot: both sides' rows are grouped into the same kinds;
times unchecked."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")


def _model(path: str) -> None:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def init(name, shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "wd", "bd"], ["d"], group=16, pads=[1, 1, 1, 1],
                         kernel_shape=[3, 3]),  # fmt: skip
        helper.make_node("Relu", ["d"], ["dr"]),
        helper.make_node("Conv", ["dr", "wp", "bp"], ["p"], kernel_shape=[1, 1]),
        helper.make_node("GlobalAveragePool", ["p"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "wg", "bg"], ["y"], transB=1),
    ]
    graph = helper.make_graph(
        nodes, "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 14, 14])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [init("wd", (16, 1, 3, 3)), init("bd", (16,)), init("wp", (32, 16, 1, 1)),
         init("bp", (32,)), init("wg", (10, 32)), init("bg", (10,))],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)


@pytest.mark.slow  # load_inference compiles the model's kernels
def test_the_benchmark_groups_both_sides_by_kind(tmp_path, benchmark_module):
    pytest.importorskip("threadpoolctl")
    zoo_nodes = benchmark_module("zoo_nodes")

    path = str(tmp_path / "small.onnx")
    _model(path)
    feed = {"x": np.random.default_rng(1).standard_normal((1, 16, 14, 14)).astype(np.float32)}
    mine = zoo_nodes.ours(path, feed, 3)
    theirs = zoo_nodes.ort(path, feed, 1, 3)
    kinds = {k for k, _, _ in mine}
    assert {"dw 3x3/s1 @14", "conv 1x1/s1 @14", "matmul"} <= kinds
    assert {"dw 3x3/s1 @14", "conv 1x1/s1 @14", "matmul"} <= {k for k, _, _ in theirs}
    assert all(t >= 0 for _, _, t in mine + theirs)
    table = zoo_nodes.compare(mine, theirs, 2)
    assert "dw 3x3/s1 @14" in table and table.splitlines()[0].split()[0] == "kind"
