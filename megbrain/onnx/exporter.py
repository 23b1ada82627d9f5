"""``export``: write a megbrain graph as an ONNX model (the elementwise, matmul, conv,
pooling, reduce and reshape families)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import megbrain as mgb

from .registry import ONNXConversionError

__all__ = ["export"]

_NP_TO_ONNX = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.int16): TensorProto.INT16,
    np.dtype(np.int8): TensorProto.INT8,
    np.dtype(np.uint8): TensorProto.UINT8,
    np.dtype(np.bool_): TensorProto.BOOL,
}

_UNARY = {
    "RELU": "Relu",
    "SIGMOID": "Sigmoid",
    "TANH": "Tanh",
    "EXP": "Exp",
    "LOG": "Log",
    "ABS": "Abs",
    "NEGATE": "Neg",
    "FLOOR": "Floor",
    "CEIL": "Ceil",
    "ERF": "Erf",
    "SIN": "Sin",
    "COS": "Cos",
    "H_SWISH": "HardSwish",
}
_BINARY = {
    "ADD": "Add",
    "SUB": "Sub",
    "MUL": "Mul",
    "TRUE_DIV": "Div",
    "POW": "Pow",
    "MAX": "Max",
    "MIN": "Min",
}
_COMPARE = {"LT": "Less", "LEQ": "LessOrEqual", "EQ": "Equal"}
_FUSED = {"FUSE_ADD_RELU": "Relu", "FUSE_ADD_SIGMOID": "Sigmoid", "FUSE_ADD_TANH": "Tanh"}
_REDUCE = {
    "SUM": "ReduceSum",
    "MEAN": "ReduceMean",
    "MAX": "ReduceMax",
    "MIN": "ReduceMin",
    "PRODUCT": "ReduceProd",
    "SUM_SQR": "ReduceSumSquare",
}


class _Writer:
    def __init__(self, opset: int) -> None:
        self.opset = opset
        self.nodes: list = []
        self.inits: list = []
        self.names: dict[int, str] = {}
        self.count = 0

    def fresh(self, hint: str = "t") -> str:
        self.count += 1
        return f"{hint}_{self.count}"

    def const(self, value, hint="c") -> str:
        name = self.fresh(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op, ins, outs=None, **attrs) -> str:
        outs = outs or [self.fresh(op.lower())]
        self.nodes.append(helper.make_node(op, ins, outs, **attrs))
        return outs[0]

    def name(self, var) -> str:
        if var.id not in self.names:
            # a value-only dependency (a reshape's target shape) is not in the opr sequence
            val = var.inferred_value
            if val is None:
                raise ONNXConversionError(f"export: the value of {var.name!r} is not known")
            self.names[var.id] = self.const(np.asarray(val).astype(var.dtype), "value")
        return self.names[var.id]


def _shape_of(var, what):
    shp = var.imm_shape
    if shp is None:
        raise ONNXConversionError(f"export: the shape of {var.name!r} ({what}) must be static")
    return [int(d) for d in shp]


def _elemwise(w, op, ins, out):
    mode = op.params["mode"]
    if mode in _UNARY:
        return w.node(_UNARY[mode], ins)
    if mode in _BINARY:
        if mode in ("MAX", "MIN") or len(ins) == 2:
            return w.node(_BINARY[mode], ins)
    if mode in _COMPARE:
        b = w.node(_COMPARE[mode], ins)
        return w.node("Cast", [b], to=_NP_TO_ONNX[np.dtype(out.dtype)])
    if mode in _FUSED:
        return w.node(_FUSED[mode], [w.node("Add", ins)])
    if mode == "FUSE_MUL_ADD3":
        return w.node("Add", [w.node("Mul", ins[:2]), ins[2]])
    raise ONNXConversionError(f"export: Elemwise mode {mode} is not supported")


def _conv(w, op, ins, out):
    p = op.params
    if p["format"] != "NCHW" or p["mode"] != "CROSS_CORRELATION":
        raise ONNXConversionError(f"export: convolution {p['format']}/{p['mode']} not supported")
    weight = ins[1]
    group = 1
    if p["sparse"] == "GROUP":
        ws = _shape_of(op.inputs[1], "grouped weight")
        group = ws[0]
        shape = w.const(np.asarray([ws[0] * ws[1]] + ws[2:], np.int64), "shape")
        weight = w.node("Reshape", [weight, shape])
    return w.node(
        "Conv",
        [ins[0], weight],
        group=group,
        pads=[p["pad_h"], p["pad_w"]] * 2,
        strides=[p["stride_h"], p["stride_w"]],
        dilations=[p["dilate_h"], p["dilate_w"]],
    )


def _pool(w, op, ins, out):
    p = op.params
    if p["format"] != "NCHW":
        raise ONNXConversionError(f"export: pooling format {p['format']} not supported")
    kw = dict(
        kernel_shape=[p["window_h"], p["window_w"]],
        pads=[p["pad_h"], p["pad_w"]] * 2,
        strides=[p["stride_h"], p["stride_w"]],
    )
    if p["mode"] == "MAX":
        return w.node("MaxPool", ins, **kw)
    include = 1 if p["mode"] == "AVERAGE" else 0
    return w.node("AveragePool", ins, count_include_pad=include, **kw)


def _matmul(w, op, ins, out):
    p = op.params
    a, b = ins
    nd = len(_shape_of(op.inputs[0], "matmul operand"))
    perm = list(range(nd - 2)) + [nd - 1, nd - 2]
    if p.get("transposeA"):
        a = w.node("Transpose", [a], perm=perm)
    if p.get("transposeB"):
        b = w.node("Transpose", [b], perm=perm)
    return w.node("MatMul", [a, b])


def _reshape_to_out(w, op, ins, out):
    shape = w.const(np.asarray(_shape_of(out, "reshape output"), np.int64), "shape")
    return w.node("Reshape", [ins[0], shape])


def _dimshuffle(w, op, ins, out):
    pattern = list(op.params["pattern"])
    if sorted(pattern) == list(range(len(pattern))):
        return w.node("Transpose", ins, perm=pattern)
    real = [d for d in pattern if d != "x"]
    t = w.node("Transpose", ins, perm=real) if real != sorted(real) else ins[0]
    shape = w.const(np.asarray(_shape_of(out, "dimshuffle output"), np.int64), "shape")
    return w.node("Reshape", [t, shape])


def _reduce(w, op, ins, out):
    p = op.params
    if p.get("axis") is None:
        raise ONNXConversionError("export: Reduce to a target shape is not supported")
    name = _REDUCE[p["mode"]]
    if name == "ReduceSum" or w.opset >= 18:
        return w.node(
            name, [ins[0], w.const(np.asarray([p["axis"]], np.int64), "axes")], keepdims=1
        )
    return w.node(name, [ins[0]], axes=[p["axis"]], keepdims=1)


_EXPORTERS: dict[str, Callable] = {
    "Elemwise": _elemwise,
    "ConvolutionForward": _conv,
    "PoolingForward": _pool,
    "MatrixMul": _matmul,
    "BatchedMatrixMul": _matmul,
    "Reshape": _reshape_to_out,
    "AxisAddRemove": _reshape_to_out,
    "Dimshuffle": _dimshuffle,
    "Reduce": _reduce,
    "Concat": lambda w, op, ins, out: w.node("Concat", ins, axis=int(op.params["axis"])),
    "TypeCvt": lambda w, op, ins, out: w.node("Cast", ins, to=_NP_TO_ONNX[np.dtype(out.dtype)]),
    "Identity": lambda w, op, ins, out: w.node("Identity", ins),
}
_SOURCES = {
    "Host2DeviceCopy",
    "SharedDeviceTensor",
    "ImmutableTensor",
    "VolatileSharedDeviceTensor",
}


def export(
    output_vars: Sequence,
    path: str | os.PathLike | None = None,
    *,
    opset: int = 17,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    dynamic_axes: Mapping[str, Mapping[int, str]] | None = None,
) -> onnx.ModelProto:
    """Write the graph computing ``output_vars`` as an ONNX model.

    Parameters
    ----------
    output_vars:
        The vars to compute (the model's outputs).
    path:
        Where to save the model; None only returns it.
    opset:
        The ONNX opset (13 or newer).
    input_names:
        Names of the graph's runtime inputs (``make_arg`` vars) in the order they are first
        used; their var names by default.
    output_names:
        Names of the outputs; ``output_0``, ... by default.
    dynamic_axes:
        ``{input or output name: {axis: dim name}}``: those dims are written symbolic.

    Returns
    -------
    onnx.ModelProto
        The model (checked by ``onnx.checker``). Shared tensors and constants become
        initializers; reshapes write their static target shape.

    Raises
    ------
    ONNXConversionError
        Before anything is written, for an operator, mode or dtype without an ONNX form.
    """
    if opset < 13:
        raise ONNXConversionError(f"export: opset {opset} is not supported (13 or newer)")
    outs = list(output_vars)
    oprs = mgb.cgtools.get_oprs_seq(outs)
    for op in oprs:  # validate first
        if op.type not in _EXPORTERS and op.type not in _SOURCES:
            raise ONNXConversionError(f"export: operator {op.name!r} ({op.type}) has no ONNX form")
        for v in op.outputs:
            if np.dtype(v.dtype) not in _NP_TO_ONNX:
                raise ONNXConversionError(f"export: {v.name!r} has dtype {v.dtype} (no ONNX form)")
    w = _Writer(opset)
    dyn = dict(dynamic_axes or {})
    graph_inputs = []
    in_names = list(input_names or [])
    n_in = 0
    for op in oprs:
        out = op.outputs[0]
        if op.type == "Host2DeviceCopy":
            name = in_names[n_in] if n_in < len(in_names) else out.name
            n_in += 1
            shape = _shape_of(out, "input")
            for ax, dname in dyn.get(name, {}).items():
                shape[ax] = dname
            graph_inputs.append(
                helper.make_tensor_value_info(name, _NP_TO_ONNX[np.dtype(out.dtype)], shape)
            )
            w.names[out.id] = name
        elif op.type in _SOURCES:
            val = out.inferred_value
            if val is None:
                raise ONNXConversionError(f"export: the value of {out.name!r} is not known")
            w.names[out.id] = w.const(np.asarray(val).astype(out.dtype), "param")
        else:
            ins = [w.name(v) for v in op.inputs]
            w.names[out.id] = _EXPORTERS[op.type](w, op, ins, out)
    graph_outputs = []
    for i, v in enumerate(outs):
        name = output_names[i] if output_names else f"output_{i}"
        w.node("Identity", [w.name(v)], [name])
        shape = _shape_of(v, "output")
        for ax, dname in dyn.get(name, {}).items():
            shape[ax] = dname
        graph_outputs.append(
            helper.make_tensor_value_info(name, _NP_TO_ONNX[np.dtype(v.dtype)], shape)
        )
    graph = helper.make_graph(w.nodes, "megbrain", graph_inputs, graph_outputs, w.inits)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="megbrain"
    )
    model.ir_version = min(model.ir_version, 10)
    onnx.checker.check_model(model, full_check=True)
    if path is not None:
        onnx.save(model, os.fspath(path))
    return model
