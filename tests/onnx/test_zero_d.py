"""0-d ONNX values through the importer, against onnxruntime.

megbrain holds a 0-d value as shape (1,) (as MegBrain does); the importer tracks each ONNX
value's rank, so operators that produce, consume or reduce to 0-d values give ONNX's shapes.
Every model also outputs the ``Shape`` of its result, which checks the rank the importer
tracked; each runs with ONNX's shape inference and without it (the importer's own ranks).
"""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import megbrain as mgb  # noqa: E402
from megbrain.onnx import load  # noqa: E402

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
node = helper.make_node


def _const(name, value):
    return node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name))


def _model(nodes, inputs, outputs=("y",), inits=(), opset=17):
    """``nodes`` computing ``outputs``; each output also has its ``Shape`` as ``<out>_shape``."""
    nodes = list(nodes) + [node("Shape", [o], [o + "_shape"]) for o in outputs]
    outs = [helper.make_tensor_value_info(o, 0, None) for o in outputs]
    outs += [helper.make_tensor_value_info(o + "_shape", I64, None) for o in outputs]
    ins = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
           for n, v in inputs.items()]  # fmt: skip
    inits = [numpy_helper.from_array(np.asarray(v), n) for n, v in dict(inits).items()]
    g = helper.make_graph(nodes, "zero_d", ins, outs, initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    # the outputs' element types from ONNX's inference (on a copy where each output is read
    # by an Identity, so it is inferred as an inner value); their shapes stay undeclared
    probe = onnx.ModelProto()
    probe.CopyFrom(m)
    probe.graph.node.extend(node("Identity", [o.name], [o.name + "_p"]) for o in outs)
    del probe.graph.output[:]
    probe.graph.output.extend(helper.make_tensor_value_info(o.name + "_p", F, None) for o in outs)
    known = onnx.shape_inference.infer_shapes(probe).graph.value_info
    types = {vi.name: vi.type.tensor_type.elem_type for vi in known}
    for o in m.graph.output:
        o.type.tensor_type.elem_type = types[o.name]
    return m


def _check(model, inputs, monkeypatch, inference):
    """Run ``model`` with onnxruntime and megbrain; the values and the shapes must agree."""
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, dict(inputs))
    if not inference:

        def no_inference(m, *args, **kwargs):
            raise RuntimeError("shape inference switched off by the test")

        monkeypatch.setattr(onnx.shape_inference, "infer_shapes", no_inference)
    res = load(model, static_inputs=inputs)
    func = res.graph.compile(None, [mgb.copy_output(v) for v in res.outputs.values()])
    got = [np.asarray(v) for v in func()]
    n = len(want) // 2
    for w, g, ws, gs in zip(want[:n], got[:n], want[n:], got[n:]):
        np.testing.assert_array_equal(gs, ws)  # the rank and shape megbrain tracked
        assert g.size == w.size
        np.testing.assert_allclose(g.reshape(w.shape), w, rtol=1e-6, atol=1e-6)


f32 = np.float32
CASES = {
    # the four nodes: a 0-d Constant, Unsqueeze, Concat with a length-3 vector
    "concat_unsqueezed_constant": (
        [
            _const("c", np.int64(7)),
            node("Unsqueeze", ["c", "ax"], ["u"]),
            node("Concat", ["u", "v"], ["y"], axis=0),
        ],
        {"v": np.array([1, 2, 3], np.int64)},
        {"ax": np.array([0], np.int64)},
    ),
    "gather_scalar_index_removes_axis": (
        [node("Gather", ["x", "i"], ["y"], axis=1)],
        {"x": np.arange(12, dtype=f32).reshape(3, 4)},
        {"i": np.int64(2)},
    ),
    "gather_scalar_index_of_vector_is_0d": (
        [node("Gather", ["x", "i"], ["y"])],
        {"x": np.arange(5, dtype=f32), "i": np.array(-2, np.int64)},
        {},
    ),
    "gather_runtime_scalar_index": (
        [node("Gather", ["x", "i"], ["y"], axis=0)],
        {"x": np.arange(6, dtype=f32).reshape(3, 2), "i": np.array(1, np.int64)},
        {},
    ),
    "squeeze_to_0d": (
        [node("Squeeze", ["x", "ax"], ["y"])],
        {"x": np.array([3.5], f32)},
        {"ax": np.array([0], np.int64)},
    ),
    "squeeze_0d_no_axes": ([node("Squeeze", ["x"], ["y"])], {"x": np.array(2.5, f32)}, {}),
    "unsqueeze_0d_opset11": (
        [node("Unsqueeze", ["x"], ["y"], axes=[0, 1])],
        {"x": np.array(4.0, f32)},
        {},
        11,
    ),
    "reshape_0d_to_2d": (
        [node("Reshape", ["x", "s"], ["y"])],
        {"x": np.array(1.5, f32)},
        {"s": np.array([1, 1], np.int64)},
    ),
    "reshape_to_0d": (
        [node("Reshape", ["x", "s"], ["y"])],
        {"x": np.array([[1.5]], f32)},
        {"s": np.zeros(0, np.int64)},
    ),
    "shape_of_0d_is_empty": (
        [node("Shape", ["x"], ["s"]), node("Size", ["s"], ["y"])],
        {"x": np.array(1.0, f32)},
        {},
    ),
    "slice_with_0d_bounds": (
        [
            node("Unsqueeze", ["b", "ax"], ["st"]),
            node("Unsqueeze", ["e", "ax"], ["en"]),
            node("Slice", ["x", "st", "en"], ["y"]),
        ],
        {"x": np.arange(8, dtype=f32), "b": np.array(2, np.int64), "e": np.array(6, np.int64)},
        {"ax": np.array([0], np.int64)},
    ),
    "reduce_sum_keepdims0_to_0d": (
        [node("ReduceSum", ["x"], ["y"], keepdims=0)],
        {"x": np.arange(6, dtype=f32)},
        {},
    ),
    "reduce_max_all_axes_keepdims0": (
        [node("ReduceMax", ["x"], ["y"], keepdims=0)],
        {"x": np.arange(6, dtype=f32).reshape(2, 3)},
        {},
    ),
    "reduce_mean_of_0d": (
        [node("ReduceMean", ["x"], ["y"], keepdims=1)],
        {"x": np.array(3.0, f32)},
        {},
    ),
    "reduce_keepdims1_keeps_rank": (
        [node("ReduceSum", ["x", "ax"], ["y"], keepdims=1)],
        {"x": np.ones((2, 3), f32)},
        {"ax": np.array([1], np.int64)},
    ),
    "argmax_keepdims0_to_0d": (
        [node("ArgMax", ["x"], ["y"], keepdims=0)],
        {"x": np.array([1, 5, 2], f32)},
        {},
    ),
    "size_is_0d": ([node("Size", ["x"], ["y"])], {"x": np.ones((2, 3), f32)}, {}),
    "constant_of_empty_shape_is_0d": (
        [
            node(
                "ConstantOfShape",
                ["s"],
                ["y"],
                value=numpy_helper.from_array(np.array([2.5], f32), "v"),
            )
        ],
        {},
        {"s": np.zeros(0, np.int64)},
    ),
    "range_of_0d_bounds": (
        [node("Range", ["a", "b", "d"], ["y"])],
        {},
        {"a": np.int64(1), "b": np.int64(2), "d": np.int64(1)},
    ),
    "expand_0d": (
        [node("Expand", ["x", "s"], ["y"])],
        {"x": np.array(2.0, f32)},
        {"s": np.array([2, 3], np.int64)},
    ),
    "expand_0d_to_0d": (
        [node("Expand", ["x", "s"], ["y"])],
        {"x": np.array(2.0, f32)},
        {"s": np.zeros(0, np.int64)},
    ),
    "where_all_0d": (
        [node("Where", ["c", "a", "b"], ["y"])],
        {"c": np.array(False), "a": np.array(1.0, f32), "b": np.array(-1.0, f32)},
        {},
    ),
    "where_0d_condition_broadcasts": (
        [node("Where", ["c", "a", "b"], ["y"])],
        {"c": np.array(True), "a": np.array([1.0], f32), "b": np.array(-1.0, f32)},
        {},
    ),
    "elementwise_of_0d": (
        [node("Add", ["a", "b"], ["s"]), node("Cast", ["s"], ["y"], to=I64)],
        {"a": np.array(1.5, f32), "b": np.array(2.0, f32)},
        {},
    ),
    "matmul_vectors_is_0d": (
        [node("MatMul", ["a", "b"], ["y"])],
        {"a": np.arange(3, dtype=f32), "b": np.ones(3, f32)},
        {},
    ),
    "flatten_and_transpose_0d": (
        [node("Transpose", ["x"], ["t"]), node("Flatten", ["t"], ["y"], axis=0)],
        {"x": np.array(3.0, f32)},
        {},
    ),
    "concat_of_gathered_shape_dims": (
        [
            node("Shape", ["x"], ["s"]),
            node("Gather", ["s", "i"], ["d"]),
            node("Unsqueeze", ["d", "ax"], ["u"]),
            node("Concat", ["u", "m"], ["shp"], axis=0),
            node("Reshape", ["x", "shp"], ["y"]),
        ],
        {"x": np.arange(12, dtype=f32).reshape(2, 6)},
        {"i": np.int64(0), "ax": np.array([0], np.int64), "m": np.array([3, 2], np.int64)},
    ),
}


@pytest.mark.parametrize("inference", [True, False], ids=["inferred", "own-ranks"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_0d_values_match_onnxruntime(case, inference, monkeypatch):
    nodes, inputs, inits, *opset = CASES[case]
    model = _model(nodes, inputs, inits=inits, opset=opset[0] if opset else 17)
    _check(model, inputs, monkeypatch, inference)


def test_0d_model_input_is_held_as_shape_1():
    model = _model([node("Neg", ["x"], ["y"])], {"x": np.array(1.0, f32)})
    res = load(model)
    assert tuple(res.inputs["x"].imm_shape) == (1,)
