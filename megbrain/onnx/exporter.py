"""``export``: write a megbrain graph as an ONNX model.

The driver: walks the operators the outputs need (value-only dependencies such as a
Reshape's target shape included, so shapes computed from ``GetVarShape`` stay dynamic),
validates them all, calls one exporter per operator (``export_*.py``, registered in
:mod:`.export_base`), drops the nodes and initializers no output needs, checks the model and
checks that every dim named in ``dynamic_axes`` is really dynamic in the exported graph.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..graph.replace import postorder
from . import export_elemwise, export_nn, export_tensor  # noqa: F401 - register exporters
from .export_base import EXPORTERS, REFUSED, Writer, imm_shape, onnx_dtype, static_shape
from .export_quant import QUANTIZED_OPERATORS, quantized_storage
from .registry import ONNXConversionError

__all__ = ["export", "exportable_operator_types", "refused_operator_types"]

#: the opsets ``export`` writes
MIN_OPSET, MAX_OPSET = 13, 21

_CONST_SOURCES = {"ImmutableTensor", "SharedDeviceTensor", "VolatileSharedDeviceTensor"}
_SOURCES = _CONST_SOURCES | {"Host2DeviceCopy", "MultipleDeviceTensorHolder"}


def exportable_operator_types() -> list[str]:
    """The megbrain operator types ``export`` writes (sources included)."""
    return sorted(set(EXPORTERS) | _SOURCES)


def refused_operator_types() -> dict[str, str]:
    """The megbrain operator types ``export`` refuses, with the reason."""
    return dict(sorted(REFUSED.items()))


def _topo_order(outs) -> list:
    """The operators ``outs`` need, every input (value-only ones too) before its reader."""
    return postorder(
        [v.owner_opr for v in outs],
        lambda op: [i.owner_opr for i in reversed(op.inputs)],
        key=lambda op: op.id,
    )


class _Names(Sequence):
    """The ONNX names of an operator's inputs, looked up on access (an exporter that reads
    only an input's shape or value never asks for its name)."""

    def __init__(self, w: Writer, vars_) -> None:
        self._w, self._vars = w, tuple(vars_)

    def __len__(self) -> int:
        return len(self._vars)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self._w.name(v) for v in self._vars[k]]
        return self._w.name(self._vars[k])


def _source_value(var):
    op = var.owner_opr
    t = op.type
    if t in _CONST_SOURCES:
        val = var.inferred_value
        return None if val is None else np.asarray(val)
    if t == "MultipleDeviceTensorHolder":
        k = [o.id for o in op.outputs].index(var.id)
        return np.asarray(op.opr.tensors[k].as_ndarray())
    return None


def _validate(oprs) -> None:
    for op in oprs:
        if op.type in _SOURCES:
            pass
        elif op.type in REFUSED:
            raise ONNXConversionError(
                f"export: operator {op.name!r} ({op.type}) has no ONNX form: {REFUSED[op.type]}"
            )
        elif op.type not in EXPORTERS:
            raise ONNXConversionError(f"export: operator {op.name!r} ({op.type}) has no ONNX form")
        for v in op.outputs:
            quantized = op.type in QUANTIZED_OPERATORS and quantized_storage(v.dtype)
            if onnx_dtype(v.dtype) is None and not quantized:
                raise ONNXConversionError(
                    f"export: operator {op.name!r} ({op.type}): output {v.name!r} has dtype "
                    f"{v.dtype}, which has no ONNX form"
                )


def _prune(nodes, inits, graph_inputs, out_names):
    """Keep the nodes the outputs need and the initializers those nodes read."""
    producer = {}
    for k, n in enumerate(nodes):
        for o in n.output:
            producer[o] = k
    need, stack = set(), list(out_names)
    seen = set()
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        k = producer.get(t)
        if k is not None and k not in need:
            need.add(k)
            stack.extend(i for i in nodes[k].input if i)
    kept = [n for k, n in enumerate(nodes) if k in need]
    read = {i for n in kept for i in n.input}
    return kept, [t for name, t in inits.items() if name in read]


def _dims(vi) -> list:
    out = []
    for d in vi.type.tensor_type.shape.dim:
        if d.HasField("dim_param"):
            out.append(d.dim_param)
        else:
            out.append(d.dim_value if d.HasField("dim_value") else None)
    return out


def _out_shape(v) -> list | None:
    shp = imm_shape(v)
    return None if shp is None else list(shp)


def _name_dynamic_axes(shape: list, name: str, dyn: dict, what: str) -> None:
    """Give the axes of ``dyn[name]`` their symbolic names in ``shape`` (of an input or
    output, ``what``), refusing an axis out of range."""
    for ax, dname in dyn.get(name, {}).items():
        if not 0 <= ax < len(shape):
            raise ONNXConversionError(
                f"export: dynamic axis {ax} of {what} {name!r} is out of range for its "
                f"{len(shape)} dims"
            )
        shape[ax] = dname


def _check_dynamic(model, out_values, dyn, node_owner, baked) -> dict:
    """Output dims as ONNX shape inference sees them; raises where a dim named dynamic is
    fixed by the graph (naming the operator that fixes it)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    info = {vi.name: vi for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}
    info.update({vi.name: vi for vi in inferred.graph.input})
    for name, opr_name, what, axes in baked:
        vi = info.get(name)
        dims = _dims(vi) if vi is not None else []
        if any(isinstance(d, str) for k, d in enumerate(dims) if axes is None or k in axes):
            raise ONNXConversionError(
                f"export: operator {opr_name!r} needs the static shape of its input ({what}) "
                f"but dynamic_axes makes it {_dims(vi)}"
            )
    consts = {t.name: t for t in model.graph.initializer}
    for n in model.graph.node:  # a reshape to a fixed element count of a dynamic tensor
        if n.op_type != "Reshape" or n.input[1] not in consts or n.input[0] not in info:
            continue
        target = numpy_helper.to_array(consts[n.input[1]])
        dims = _dims(info[n.input[0]])
        if target.size and (target > 0).all() and any(isinstance(d, str) for d in dims):
            raise ONNXConversionError(
                f"export: operator {node_owner.get(n.name, n.name)!r} reshapes a tensor of "
                f"dynamic shape {dims} to the fixed shape {target.tolist()}, which fails for "
                "any other size of the dims named in dynamic_axes (build the target shape "
                "from the input's shape, e.g. x.shape[0], or use -1)"
            )
    got = {}
    for out_name, pre in out_values.items():
        vi = info.get(pre)
        dims = _dims(vi) if vi is not None else None
        got[out_name] = dims
        for ax, dname in dyn.get(out_name, {}).items():
            if dims is None or ax >= len(dims) or not isinstance(dims[ax], int):
                continue
            culprit = _fixing_node(inferred, info, pre)
            raise ONNXConversionError(
                f"export: dim {ax} of output {out_name!r} is named dynamic ({dname!r}) but the "
                f"exported graph fixes it to {dims[ax]}"
                + (f" at operator {node_owner.get(culprit, culprit)!r}" if culprit else "")
                + " (build that shape from the input's shape, e.g. x.shape[0], not a number)"
            )
    return got


def _fixing_node(model, info, target):
    """The first node on the way to ``target`` that reads a symbolic dim and writes none."""
    producer = {o: n for n in model.graph.node for o in n.output}
    anc, stack = set(), [target]
    while stack:
        t = stack.pop()
        n = producer.get(t)
        if n is None or n.name in anc:
            continue
        anc.add(n.name)
        stack.extend(n.input)
    consts = {t.name for t in model.graph.initializer}
    fallback = None
    for n in model.graph.node:
        if n.name not in anc:
            continue
        sym_in = any(
            i in info and any(isinstance(d, str) for d in _dims(info[i])) for i in n.input
        )
        if not sym_in:
            continue
        if n.op_type in ("Reshape", "Expand") and n.input[1] in consts:
            return n.name  # a constant target shape
        outs = [info.get(o) for o in n.output]
        if fallback is None and all(
            o is not None and all(isinstance(d, int) for d in _dims(o)) for o in outs
        ):
            fallback = n.name
    return fallback


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
        The ONNX opset, 13 to 21.
    input_names:
        Names of the graph's runtime inputs (``make_arg`` vars) in the order they are first
        used; their var names by default.
    output_names:
        Names of the outputs; ``output_0``, ... by default.
    dynamic_axes:
        ``{input or output name: {axis: dim name}}``: those dims are written symbolic. A dim
        of an output named here must be dynamic in the exported graph (shapes computed from
        ``GetVarShape`` are exported as ONNX ``Shape`` computations; a number in a reshape
        target fixes the dim and raises).

    Returns
    -------
    onnx.ModelProto
        The model, checked by ``onnx.checker.check_model(full_check=True)``. Shared tensors,
        parameters and constants become initializers; only the initializers some node reads
        are written.

    Raises
    ------
    ONNXConversionError
        Before anything is written, for an operator, mode or dtype without an ONNX form,
        or a dim named in ``dynamic_axes`` that the graph fixes.
    """
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise ONNXConversionError(
            f"export: opset {opset} is not supported ({MIN_OPSET} to {MAX_OPSET})"
        )
    outs = list(output_vars)
    if not outs:
        raise ONNXConversionError("export: no output vars given")
    if output_names is not None and len(output_names) != len(outs):
        raise ONNXConversionError(
            f"export: {len(output_names)} output names for {len(outs)} outputs"
        )
    oprs = _topo_order(outs)
    _validate(oprs)
    w = Writer(opset, _source_value)
    dyn = {k: dict(v) for k, v in (dynamic_axes or {}).items()}
    for given, what in ((input_names, "input"), (output_names, "output")):
        if given is not None and len(set(given)) != len(given):
            raise ONNXConversionError(f"export: repeated {what} names in {list(given)}")
    # the model's own names first, so no tensor made on the way takes one
    out_names = [w.unique(output_names[i] if output_names else f"output_{i}")
                 for i in range(len(outs))]
    graph_inputs = []
    in_names = list(input_names or [])
    n_in = 0
    for op in oprs:
        if op.type != "Host2DeviceCopy":
            continue
        out = op.outputs[0]
        if n_in < len(in_names) and in_names[n_in] in w.used:
            raise ONNXConversionError(f"export: input name {in_names[n_in]!r} is an output's")
        name = w.unique(in_names[n_in] if n_in < len(in_names) else out.name)
        n_in += 1
        shape = static_shape(w, out, "input")
        _name_dynamic_axes(shape, name, dyn, "input")
        graph_inputs.append(helper.make_tensor_value_info(name, onnx_dtype(out.dtype), shape))
        w.names[out.id] = name
    if n_in < len(in_names):
        raise ONNXConversionError(
            f"export: {len(in_names)} input names for the graph's {n_in} inputs"
        )
    node_owner: dict[str, str] = {}
    for op in oprs:
        if op.type in _SOURCES:
            continue  # written on first use (w.name)
        w.op = op
        first = len(w.nodes)
        ins = _Names(w, op.inputs)
        res = EXPORTERS[op.type](w, op, ins)
        res = res if isinstance(res, list) else [res]
        for v, r in zip(op.outputs, res):
            if r is not None:
                w.names[v.id] = r
        for n in w.nodes[first:]:
            node_owner[n.name] = op.name
        w.op = None
    out_values, named = {}, []
    for name, v in zip(out_names, outs):
        if v.id not in w.names and _source_value(v) is None:
            raise ONNXConversionError(f"export: output {v.name!r} has no ONNX value")
        pre = w.name(v)
        w.node("Identity", [pre], [name])
        out_values[name] = pre
        named.append((name, v))
    out_names = named
    nodes, inits = _prune(w.nodes, w.inits, graph_inputs, [n for n, _ in out_names])
    used_inputs = {i for n in nodes for i in n.input}
    graph_inputs = [gi for gi in graph_inputs if gi.name in used_inputs]

    def build(out_shapes):
        outputs = []
        for name, v in out_names:
            shape = out_shapes.get(name) or _out_shape(v)
            # a quantized output is the tensor of its stored integers, as inside the model
            dt = onnx_dtype(v.dtype) or quantized_storage(v.dtype)
            outputs.append(helper.make_tensor_value_info(name, dt, shape))
        graph = helper.make_graph(nodes, "megbrain", graph_inputs, outputs, inits)
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="megbrain"
        )
        model.ir_version = min(model.ir_version, 10)
        return model

    # output dims: the names given, else what shape inference finds symbolic, else static
    model = build({})
    inferred = _check_dynamic(model, out_values, dyn, node_owner, w.baked)
    shapes = {}
    for name, v in out_names:
        shape = _out_shape(v)
        dims = inferred.get(name)
        if shape is None and dims is not None:  # data-dependent: the rank shape inference says
            shape = [d if isinstance(d, int) else 0 for d in dims]
        if shape is None:
            if dyn.get(name):
                raise ONNXConversionError(
                    f"export: output {name!r} has no known rank for its dynamic_axes"
                )
            shapes[name] = None
            continue
        if dims is not None and len(dims) == len(shape):
            for k, d in enumerate(dims):
                # dims shape inference can not fix (data-dependent, computed shapes) are
                # symbolic; its own names (unk__0) are replaced by readable ones
                if d is None or (isinstance(d, str) and d.startswith("unk__")):
                    shape[k] = f"{name}_dim{k}"
                elif isinstance(d, str):
                    shape[k] = d
        _name_dynamic_axes(shape, name, dyn, "output")
        shapes[name] = shape
    model = build(shapes)
    onnx.checker.check_model(model, full_check=True)
    if path is not None:
        onnx.save(model, os.fspath(path))
    return model

