"""``load``: build megbrain operators for an ONNX graph."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import megbrain as mgb

from .registry import ONNXConversionError, as_numpy_attr, known_shape, lookup

__all__ = ["load", "LoadResult", "NodeContext", "onnx_to_np_dtype"]

#: ONNX element types and the megbrain dtype their tensors get (64-bit types are narrowed,
#: booleans are int32 0/1 inside the graph and bool again on the model's outputs)
_DTYPES: dict[int, np.dtype] = {
    TensorProto.FLOAT: np.dtype(np.float32),
    TensorProto.DOUBLE: np.dtype(np.float32),
    TensorProto.FLOAT16: np.dtype(np.float16),
    TensorProto.BFLOAT16: mgb.dtype.canonize_dtype("bfloat16"),
    TensorProto.INT8: np.dtype(np.int8),
    TensorProto.UINT8: np.dtype(np.uint8),
    TensorProto.INT16: np.dtype(np.int16),
    TensorProto.INT32: np.dtype(np.int32),
    TensorProto.INT64: np.dtype(np.int32),
    TensorProto.BOOL: np.dtype(np.int32),
}


def narrow(arr) -> np.ndarray:
    """An array as megbrain holds it: int64 clipped into int32, float64 as float32, bool int32."""
    arr = np.asarray(arr)
    if arr.dtype == np.bool_:
        return arr.astype(np.int32)
    if arr.dtype.kind in "iu" and arr.dtype.itemsize == 8:
        return np.clip(arr, np.iinfo(np.int32).min, np.iinfo(np.int32).max).astype(np.int32)
    if arr.dtype == np.float64:
        return arr.astype(np.float32)
    return arr


def onnx_to_np_dtype(elem_type: int, *, where: str = "") -> np.dtype:
    """The megbrain dtype that holds ONNX element type ``elem_type`` inside a graph."""
    try:
        return _DTYPES[elem_type]
    except KeyError:
        name = TensorProto.DataType.Name(elem_type) if elem_type else "UNDEFINED"
        raise ONNXConversionError(
            f"{where}: ONNX dtype {name} is not supported by megbrain (supported: "
            + ", ".join(TensorProto.DataType.Name(t) for t in _DTYPES)
            + ")"
        ) from None


class LoadResult(NamedTuple):
    """What :func:`load` returns: the graph and the model's named inputs and outputs."""

    graph: Any
    inputs: dict
    outputs: dict


def _describe(node: onnx.NodeProto, idx: int, opset: int) -> str:
    name = node.name or f"#{idx}"
    return f"ONNX node {name!r} (op {node.op_type}, opset {opset})"


def physical_shape(shape) -> tuple:
    """The shape megbrain holds an ONNX value of shape ``shape`` in: a 0-d one is (1,)."""
    shape = tuple(int(d) for d in shape)
    return shape or (1,)


class NodeContext:
    """What a converter sees of one node: its input vars, attributes and helpers.

    ``ranks`` holds the ONNX rank of each input (None when absent or unknown): megbrain has
    no 0-d tensors, so a 0-d ONNX value is a (1,) var whose rank only the importer knows.  A
    converter gives an output's rank with :meth:`as_shape` or :meth:`set_rank`; the loader
    derives the others (:func:`_output_rank`).
    """

    def __init__(self, node, idx, opset, inputs, graph, comp_node, types, attrs, ranks):
        self.node = node
        self.idx = idx
        self.opset = opset
        self.inputs = inputs
        self.ranks = ranks
        self.out_ranks: dict[int, int] = {}
        self.graph = graph
        self.comp_node = comp_node
        self._types = types
        self._attrs = attrs
        self.where = _describe(node, idx, opset)

    def rank_of(self, var) -> int | None:
        """The ONNX rank of ``var`` when it is one of this node's inputs, else None."""
        for v, r in zip(self.inputs, self.ranks):
            if v is var:
                return r
        return None

    def set_rank(self, rank: int, i: int = 0) -> None:
        """Declare the ONNX rank of output ``i``."""
        self.out_ranks[i] = int(rank)

    def as_shape(self, var, shape, i: int = 0):
        """``var`` reshaped to the ONNX shape ``shape``, declared as output ``i``'s shape."""
        shape = tuple(int(d) for d in shape)
        self.set_rank(len(shape), i)
        phys = physical_shape(shape)
        return var if known_shape(var) == phys else mgb.opr.reshape(var, phys)

    def fail(self, msg: str) -> ONNXConversionError:
        """An error naming this node; raise it."""
        return ONNXConversionError(f"{self.where}: {msg}")

    def attr(self, name: str) -> Any:
        """Attribute ``name``, or its declared default."""
        return self._attrs[name]

    def input(self, i: int):
        """Input ``i`` as a var, or None when it is absent (optional and empty)."""
        return self.inputs[i] if i < len(self.inputs) else None

    def has(self, i: int) -> bool:
        """Whether optional input ``i`` is given."""
        return self.input(i) is not None

    def const(self, i: int, what: str = "") -> np.ndarray:
        """The value of input ``i``, which must be known when the graph is built."""
        v = self.input(i)
        if v is None:
            raise self.fail(f"input {i} ({what}) is required")
        val = v.inferred_value
        if val is None:
            raise self.fail(
                f"input {i} {self.node.input[i]!r} ({what or 'a value'}) must be a constant"
                " (an initializer, a Constant, or an input given at load)"
            )
        return np.asarray(val)

    def in_type(self, i: int) -> int:
        """ONNX element type of input ``i`` (0 when unknown)."""
        return self._types.get(self.node.input[i], 0)

    def out_type(self, i: int = 0) -> int:
        """ONNX element type of output ``i`` (0 when unknown)."""
        return self._types.get(self.node.output[i], 0)

    def imm(self, value, dtype=None):
        """A constant var in this graph."""
        value = np.asarray(value)
        if dtype is None:
            dtype = mgb.to_mgb_supported_dtype(value.dtype)
        return mgb.make_immutable(self.comp_node, self.graph, value.astype(dtype))


def _model_of(src) -> onnx.ModelProto:
    if isinstance(src, onnx.ModelProto):
        return src
    if isinstance(src, (str, os.PathLike)):
        return onnx.load(os.fspath(src))
    if isinstance(src, (bytes, bytearray)):
        return onnx.load_from_string(bytes(src))
    raise ONNXConversionError(
        f"load: expected a path, bytes or an onnx.ModelProto, got {type(src).__name__}"
    )


def _opset_of(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    raise ONNXConversionError("load: the model imports no opset of the default ONNX domain")


def _read_attrs(node, conv, where) -> dict:
    given = {a.name: as_numpy_attr(helper.get_attribute_value(a)) for a in node.attribute}
    out = {}
    for name, value in given.items():
        spec = conv.attrs.get(name)
        if spec is None:
            raise ONNXConversionError(f"{where}: attribute {name!r} is not supported")
        if isinstance(value, onnx.TensorProto):
            value = numpy_helper.to_array(value)
        if isinstance(value, bytes):
            value = value.decode()
        if spec.allowed is not None and value not in spec.allowed:
            raise ONNXConversionError(
                f"{where}: attribute {name}={value!r} is not supported"
                f" (supported: {sorted(map(repr, spec.allowed))})"
            )
        if spec.check is not None and not spec.check(value):
            raise ONNXConversionError(
                f"{where}: attribute {name}={value!r} is not supported"
                + (f" ({spec.why})" if spec.why else "")
            )
        out[name] = value
    for name, spec in conv.attrs.items():
        out.setdefault(name, spec.default)
    return out


def _value_types(model: onnx.ModelProto) -> tuple[dict[str, int], dict[str, int]]:
    """The ONNX element type and, where ONNX's shape inference knows it, the rank of each
    value."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - inference is a help, not a requirement
        inferred = model
    g = inferred.graph
    types, ranks = {}, {}
    for vi in list(g.value_info) + list(g.input) + list(g.output):
        if vi.type.HasField("tensor_type"):
            types[vi.name] = vi.type.tensor_type.elem_type
            if vi.type.tensor_type.HasField("shape"):
                ranks[vi.name] = len(vi.type.tensor_type.shape.dim)
    for init in g.initializer:
        types[init.name] = init.data_type
    for node in g.node:
        if node.op_type == "Constant" and node.output:
            for a in node.attribute:
                if a.name == "value":
                    types[node.output[0]] = a.t.data_type
    return types, ranks


def _output_rank(ctx, i: int, var, inferred: int | None) -> int | None:
    """The ONNX rank of output ``i`` of a node: as its converter declared it, else the shape
    megbrain gives it, where a (1,) var is 0-d when ONNX's shape inference says so or (that
    unknown) when every input is 0-d, as an elementwise operator's output is."""
    if i in ctx.out_ranks:
        return ctx.out_ranks[i]
    shape = known_shape(var)
    if shape is None:
        return inferred
    if shape not in ((), (1,)):
        return len(shape)
    if inferred is not None:
        return inferred
    given = [r for v, r in zip(ctx.inputs, ctx.ranks) if v is not None]
    return 0 if not shape or (given and all(r == 0 for r in given)) else 1


def _static_shape(vi) -> tuple | None:
    t = vi.type.tensor_type
    if not t.HasField("shape"):
        return None
    dims = []
    for d in t.shape.dim:
        if not d.HasField("dim_value"):
            return None
        dims.append(d.dim_value)
    return tuple(dims)


def load(
    path_or_model,
    *,
    comp_node: str = "cpu0",
    graph=None,
    static_inputs: Mapping[str, np.ndarray] | None = None,
) -> LoadResult:
    """Build megbrain operators for an ONNX model.

    Parameters
    ----------
    path_or_model:
        A file path, the serialized bytes or an ``onnx.ModelProto``.
    comp_node:
        The comp node every operator and tensor is placed on.
    graph:
        The CompGraph to build into; a new one when None.
    static_inputs:
        Values for some of the model's inputs, known at load: their ``make_arg`` vars are
        created holding these values, so operators that need a constant operand (Reshape's
        shape, Slice's starts, ...) can read them.

    Returns
    -------
    LoadResult
        ``(graph, inputs, outputs)``: ``inputs`` maps the model's input names to their
        ``make_arg`` vars (initializers are ``make_shared`` tensors, not inputs), ``outputs``
        the model's output names to vars.  INT64 and DOUBLE values are held as int32 and
        float32; BOOL outputs are bool.

    Raises
    ------
    ONNXConversionError
        Before anything is built, when a node's op type, an attribute value or a dtype is
        not supported; the message names the node, its op type and the opset.
    """
    model = _model_of(path_or_model)
    opset = _opset_of(model)
    g = model.graph
    types, inferred_ranks = _value_types(model)
    static_inputs = dict(static_inputs or {})

    # 1. validate everything before building anything
    plans = []
    for idx, node in enumerate(g.node):
        where = _describe(node, idx, opset)
        if node.domain not in ("", "ai.onnx"):
            raise ONNXConversionError(f"{where}: domain {node.domain!r} is not supported")
        conv = lookup(node.op_type, opset)
        if conv is None:
            raise ONNXConversionError(f"{where}: op type {node.op_type} is not supported")
        attrs = _read_attrs(node, conv, where)
        for name in list(node.input) + list(node.output):
            if name and name in types:
                onnx_to_np_dtype(types[name], where=f"{where}, value {name!r}")
        if conv.validate is not None:
            conv.validate(attrs, [types.get(n, 0) for n in node.input], where)
        plans.append((idx, node, conv, attrs))
    init_names = {t.name for t in g.initializer}
    for vi in g.input:
        if vi.name not in init_names:
            onnx_to_np_dtype(vi.type.tensor_type.elem_type, where=f"model input {vi.name!r}")
    for t in g.initializer:
        onnx_to_np_dtype(t.data_type, where=f"initializer {t.name!r}")

    # 2. build
    cn = mgb.comp_node(comp_node)
    if graph is None:
        graph = mgb.comp_graph()
    env: dict[str, Any] = {}
    ranks: dict[str, int | None] = {}  # each value's ONNX rank
    for t in g.initializer:
        arr = numpy_helper.to_array(t)
        dt = onnx_to_np_dtype(t.data_type)
        env[t.name] = mgb.make_shared(
            cn,
            value=narrow(arr).astype(dt).reshape(physical_shape(arr.shape)),
            comp_graph=graph,
            name=t.name or None,
        )
        ranks[t.name] = arr.ndim
    inputs = {}
    for vi in g.input:
        if vi.name in init_names:
            continue
        et = vi.type.tensor_type.elem_type
        dt = np.dtype(np.bool_) if et == TensorProto.BOOL else onnx_to_np_dtype(et)
        value = static_inputs.get(vi.name)
        shape = _static_shape(vi)
        ranks[vi.name] = inferred_ranks.get(vi.name)
        if value is not None:
            value = np.asarray(value)
            ranks[vi.name] = value.ndim
            value = value if et == TensorProto.BOOL else narrow(value).astype(dt)
            value = value.reshape(physical_shape(value.shape))
        arg = mgb.make_arg(
            cn,
            graph,
            dtype=dt,
            shape=None if value is not None or shape is None else physical_shape(shape),
            name=vi.name,
            value=value,
        )
        inputs[vi.name] = arg
        env[vi.name] = mgb.opr.typecvt(arg, np.int32) if et == TensorProto.BOOL else arg
    rank_of_var = {id(env[n]): r for n, r in ranks.items() if r is not None}
    for idx, node, conv, attrs in plans:
        ins = [env[n] if n else None for n in node.input]
        missing = [n for n in node.input if n and n not in env]
        if missing:
            raise ONNXConversionError(f"{_describe(node, idx, opset)}: unknown inputs {missing}")
        in_ranks = [ranks.get(n) if n else None for n in node.input]
        ctx = NodeContext(node, idx, opset, ins, graph, cn, types, attrs, in_ranks)
        try:
            outs = conv.fn(ctx)
        except ONNXConversionError:
            raise
        except (mgb.MegBrainError, ValueError, TypeError, IndexError) as e:
            raise ctx.fail(f"{type(e).__name__}: {e}") from e
        if not isinstance(outs, (list, tuple)):
            outs = [outs]
        for i, (name, var) in enumerate(zip(node.output, outs)):
            if not name:
                continue
            rank = _output_rank(ctx, i, var, inferred_ranks.get(name))
            if rank is not None and rank != rank_of_var.setdefault(id(var), rank):
                # one var stands for values of two ranks (a 0-d value unsqueezed to (1,)):
                # converters find a var's rank by the var, so the new value gets its own
                var = mgb.opr.identity(var)
                rank_of_var[id(var)] = rank
            env[name], ranks[name] = var, rank
    outputs = {}
    for vi in g.output:
        var = env[vi.name]
        if vi.type.tensor_type.elem_type == TensorProto.BOOL:
            var = mgb.opr.typecvt(var, np.bool_)
        outputs[vi.name] = var
    return LoadResult(graph, inputs, outputs)
