"""JITExecutor: a fused subgraph of Elemwise operators (and a closing Reduce) run as one
generated kernel (:mod:`megbrain.kernels.jit_codegen`); made by the ``jit_fusion`` pass."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import MegBrainError, SerializationError
from ..graph import OperatorNodeBase, ParamBase, VarNode, register_opr
from ..graph.operator import fmt_shape
from ..graph.static_infer import infer_shape
from ..kernels import jit_codegen
from ..serialization import sereg
from ._internal import sv
from .base import SymbolVar, insert_opr, make_immutable
from .basic_arith import elemwise, reduce_general

__all__ = ["JITExecutor", "JITExecutorParam", "jit_executor", "expand"]

_FLOATS = (np.dtype(np.float32), np.dtype(np.float16))


@dataclass(frozen=True)
class JITExecutorParam(ParamBase):
    """The fused expression (see :mod:`megbrain.kernels.jit_codegen`) and closing reduction.

    Attributes
    ----------
    expr : tuple
        Nodes ``(mode, args)``; args are ``("i", k)`` (input k), ``("t", j)`` (node j) or
        ``("c", value)`` (a scalar constant); the last node is the result.
    reduce : tuple or None
        ``(mode, axis)``: SUM/MEAN/MAX/MIN over everything (axis None) or one axis (kept).
    """

    expr: tuple = ()
    reduce: tuple | None = None


@register_opr
class JITExecutor(OperatorNodeBase):
    """Computes a fused elementwise expression of its inputs with one compiled kernel."""

    Param = JITExecutorParam
    #: the unfused var computing the same over the same inputs (set by the fusion pass), or
    #: None; the gradient is taken through it
    source: VarNode | None = None

    def clone(self, inputs):
        new = super().clone(inputs)
        if any(a is not b for a, b in zip(inputs, self.inputs)):
            new.source = None  # the unfused graph reads the old inputs
        return new

    def infer_dtypes(self, in_dtypes):
        if not in_dtypes or any(d != in_dtypes[0] for d in in_dtypes):
            raise self.error("inputs must share one dtype, got " + ", ".join(map(str, in_dtypes)))
        if in_dtypes[0] not in _FLOATS:
            raise self.error(f"only float32 and float16 can be fused, got {in_dtypes[0]}")
        try:
            jit_codegen.check_expr(self.param.expr, len(in_dtypes), self.param.reduce)
        except ValueError as exc:
            raise self.error(str(exc)) from None
        return [in_dtypes[0]]

    def infer_shapes(self, in_shapes, in_values):
        try:
            shape = jit_codegen.full_shape(in_shapes)
        except ValueError:
            raise self.error(
                "shapes can not be broadcast together: " + ", ".join(map(fmt_shape, in_shapes))
            ) from None
        red = self.param.reduce
        if red is not None and red[1] is not None and not 0 <= red[1] < len(shape):
            raise self.error(f"reduce axis {red[1]} out of range for shape {fmt_shape(shape)}")
        return [jit_codegen.reduced_shape(shape, red)]

    def bind(self, ins, outs):
        try:
            return jit_codegen.bind(self.param.expr, ins, outs[0], self.param.reduce)
        except ValueError as exc:
            raise self.error(str(exc)) from None

    def infer_value(self, in_values, out_shapes):
        # evaluated with the unfused kernels: static inference never compiles
        return [jit_codegen.interpret(self.param.expr, in_values, self.param.reduce)]

    def inplace_input(self):
        if self.param.reduce is not None:
            return None
        try:
            shape = infer_shape(self.outputs[0])
            for k, v in enumerate(self.inputs):
                if infer_shape(v) == shape:
                    return k
        except MegBrainError:
            pass
        return 0

    def default_name(self):
        args = ",".join(v.name for v in self.inputs)
        if len(args) > 48:
            args = args[:45] + "..."
        return f"JIT[{len(self.param.expr)}]({args})"

    def grad(self, wrt_idx, out_grads):
        """The gradient of the unfused graph (:func:`expand`): its operators between the
        inputs and the result are differentiated one by one, as ``cg::grad`` would."""
        og = out_grads[0]
        if og is None:
            return None
        y = expand(self)
        leaves = set(self.inputs)
        oprs, seen = [], set()
        stack = [y.owner]
        while stack:  # the unfused operators between the inputs and y
            opr = stack.pop()
            if opr in seen or opr.outputs[0] in leaves:
                continue
            if opr.type_name not in ("Elemwise", "Reduce"):
                continue  # a simplification made while rebuilding (x / x -> 1): a leaf
            seen.add(opr)
            oprs.append(opr)
            stack.extend(v.owner for v in opr.inputs)
        order = {o: o.id for o in oprs}
        grads: dict[VarNode, list[VarNode]] = {y: [sv(og).node]}
        for opr in sorted(oprs, key=order.get, reverse=True):
            out = opr.outputs[0]
            if out not in grads:
                continue
            g = _sum(grads[out])
            for i, inp in enumerate(opr.inputs):
                if inp.dtype not in _FLOATS or (inp not in leaves and inp.owner not in seen):
                    continue
                gi = opr.grad(i, [g])
                if gi is not None:
                    grads.setdefault(inp, []).append(sv(gi).node)
        parts = grads.get(self.inputs[wrt_idx])
        return _sum(parts) if parts else None


def _sum(parts: list[VarNode]) -> VarNode:
    acc = SymbolVar(parts[0])
    for p in parts[1:]:
        acc = acc + SymbolVar(p)
    return acc.node


def expand(opr: JITExecutor) -> VarNode:
    """The unfused graph of ``opr``: its Elemwise (and Reduce) operators over its inputs.

    The var the fusion pass replaced when it is known, else the operators rebuilt.
    """
    if opr.source is not None:
        return opr.source

    x = [SymbolVar(v) for v in opr.inputs]
    dtype = opr.inputs[0].dtype
    cn, graph = opr.inputs[0].comp_node, opr.graph
    vals: list[SymbolVar] = []
    for mode, args in opr.param.expr:
        vs = []
        for kind, a in args:
            if kind == "i":
                vs.append(x[a])
            elif kind == "t":
                vs.append(vals[a])
            else:
                vs.append(make_immutable(cn, graph, np.array([a], dtype), dtype=dtype))
        vals.append(elemwise(*vs, mode=mode))
    y = vals[-1]
    red = opr.param.reduce
    if red is not None:
        y = reduce_general(y, mode=red[0], axis=red[1])
    return y.node


def jit_executor(inputs, expr, reduce=None, *, config=None) -> SymbolVar:
    """A JITExecutor computing ``expr`` over ``inputs`` (vars of one float dtype).

    Parameters
    ----------
    inputs : sequence of SymbolVar or VarNode
        The leaves of the expression, input ``k`` being ``("i", k)``.
    expr : tuple
        The expression (see :class:`JITExecutorParam`).
    reduce : (mode, axis) or None
        An optional closing reduction.
    """
    vs = [v.node if isinstance(v, SymbolVar) else v for v in inputs]
    param = JITExecutorParam(tuple(expr), None if reduce is None else tuple(reduce))
    return insert_opr(JITExecutor(vs, param, config))[0]


# ---- serialization (megbrain/serialization/sereg.py) -------------------------------------
# The reference never writes a fused JIT operator (fusion happens at compile, after dumps);
# its file form would be ours alone. A dump of one is refused with what to do instead; the
# load entry only exists to pair with the dump and refuses as well.
def _dump(ctx, opr: JITExecutor) -> None:
    raise sereg.NotSerializable(
        f"serialization as FlatBuffers is not supported for operator {opr.name!r} "
        "(JITExecutor): fused JIT operators are not written to graph files; dump the graph "
        "before JIT fusion (the vars you built, or the outputs of optimize_for_inference), "
        "or the unfused var of megbrain.opr.jit.expand(opr)"
    )


def _load(ctx, inputs, config):
    raise SerializationError("JITExecutor: fused JIT operators are never written to graph files")


sereg.register_serializer(JITExecutor, dump=_dump, load=_load)
