"""Symbolic differentiation (``cg::grad``): reverse accumulation over operators' ``grad``.

Each operator's ``grad(wrt_idx, out_grads)`` returns a var (or None for a zero gradient)
built from other operators, so gradients of gradients work wherever those have gradients.
Contributions to a var used many times are summed. Where an operator's gradient is not
defined (it raises NoGradient) the walk puts an :class:`InvalidGrad` operator, as MegBrain
does: building the gradient never fails, compiling a function that needs it does.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import GraphError, MegBrainError
from ..graph import OperatorNodeBase, ParamBase, VarNode, register_opr
from ..graph.operator import NoGradient
from ..graph.replace import dep_oprs, replace_vars
from ..graph.static_infer import static_shape
from ._internal import elemwise, fill_retain_dtype, sv
from .base import insert_opr

__all__ = ["InvalidGrad", "grad", "current_grad_target", "expand_virtual_grads"]


@dataclass(frozen=True)
class InvalidGradParam(ParamBase):
    grad_opr_id: int
    inp_idx: int


@register_opr
class InvalidGrad(OperatorNodeBase):
    """Stands for the undefined gradient w.r.t. input ``inp_idx`` of ``grad_opr``: shaped like
    that input (its only input), it refuses to be compiled, naming the operator and input."""

    Param = InvalidGradParam
    value_inferable = False

    def __init__(self, inputs, grad_opr, inp_idx: int, reason: str, config=None):
        super().__init__(inputs, InvalidGradParam(grad_opr.id, inp_idx), config)
        self.grad_opr = grad_opr
        self.reason = reason

    def infer_shapes(self, in_shapes, in_values):
        return [in_shapes[0]]

    def default_name(self):
        return f"invalid_grad[{self.grad_opr.name}:{self.param.inp_idx}]"

    def add_input_layout_constraint(self):
        o, i = self.grad_opr, self.param.inp_idx
        raise GraphError(
            f"invalid grad: can not take grad with respect to input {i} "
            f"({o.inputs[i].name!r}) of operator {o.type_name} {o.name!r}: {self.reason}"
        )

    def bind(self, ins, outs):
        self.add_input_layout_constraint()

    def grad(self, wrt_idx, out_grads):
        return None


def invalid_grad(opr, inp_idx: int, reason: str) -> VarNode:
    """The InvalidGrad var standing for the gradient w.r.t. input ``inp_idx`` of ``opr``."""
    return insert_opr(InvalidGrad([opr.inputs[inp_idx]], opr, inp_idx, reason))[0].node


def current_grad_target(graph) -> VarNode | None:
    """The target of the gradient being built in ``graph`` (for SetGrad callbacks)."""
    stack = getattr(graph, "_grad_target_stack", None)
    return stack[-1] if stack else None


def _ancestors(target: VarNode) -> list:
    """Operators ``target`` depends on, in topological order (inputs first)."""
    order, seen = [], set()
    stack = [(target.owner, False)]
    while stack:
        opr, done = stack.pop()
        if done:
            order.append(opr)
            continue
        if opr in seen:
            continue
        seen.add(opr)
        stack.append((opr, True))
        for v in opr.inputs:
            if v.owner not in seen:
                stack.append((v.owner, False))
    return order


def _accumulate(parts: list[VarNode]) -> VarNode:
    if len(parts) == 1:
        return parts[0]
    acc = sv(parts[0])
    for p in parts[1:]:
        acc = elemwise(acc, sv(p), mode="ADD")
    return acc.node


def grad(
    target,
    wrt,
    warn_mid_wrt: bool = True,
    return_zero_for_nodep: bool = True,
) -> list[VarNode | None]:
    """Gradients of the scalar ``target`` with respect to each var of ``wrt``.

    A wrt the target does not depend on gets zeros (``return_zero_for_nodep``) or None.
    """
    target = sv(target).node
    wrts = [sv(w).node for w in (wrt if isinstance(wrt, Sequence) else [wrt])]
    graph = target.graph
    for w in wrts:
        if w.graph is not graph:
            raise GraphError(f"grad: wrt {w.name!r} belongs to another graph")
    tshape = static_shape(target)
    if tshape is not None and int(_prod(tshape)) != 1:
        raise MegBrainError(f"grad: target {target.name!r} must be a scalar, got shape {tshape}")
    if warn_mid_wrt:
        for w in wrts:
            if w.owner.inputs:
                warnings.warn(
                    f"grad: wrt {w.name!r} is an intermediate var ({w.owner.type_name})",
                    stacklevel=2,
                )
    order = _ancestors(target)
    wrt_set = set(wrts)
    depends: dict[VarNode, bool] = {}
    for opr in order:
        d = any(depends.get(v, v in wrt_set) for v in opr.inputs)
        for v in opr.outputs:
            depends[v] = d or v in wrt_set
    stack = graph.__dict__.setdefault("_grad_target_stack", [])
    stack.append(target)
    try:
        grads: dict[VarNode, list[VarNode]] = {target: [fill_retain_dtype(sv(target), 1).node]}
        for opr in reversed(order):
            if not any(o in grads for o in opr.outputs):
                continue
            out_grads = [_accumulate(grads[o]) if o in grads else None for o in opr.outputs]
            for o, g in zip(opr.outputs, out_grads):
                if g is not None:
                    grads[o] = [g]
            for i, inp in enumerate(opr.inputs):
                if not depends.get(inp, inp in wrt_set):
                    continue
                try:
                    g = opr.grad(i, out_grads)
                except NoGradient as exc:
                    g = invalid_grad(opr, i, str(exc).split("\n", 1)[0])
                if g is None:
                    continue
                g = sv(g).node
                grads.setdefault(inp, []).append(g)
    finally:
        stack.pop()
    result = []
    for w in wrts:
        parts = grads.get(w)
        if parts:
            result.append(_accumulate(parts))
        elif return_zero_for_nodep:
            result.append(fill_retain_dtype(sv(w), 0).node)
        else:
            result.append(None)
    return result


def _prod(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def expand_virtual_grads(dest: list[VarNode]) -> list[VarNode]:
    """Replace every VirtualGrad that ``dest`` depends on by the real gradient."""
    vgs = [o for o in dep_oprs(dest) if o.type_name == "VirtualGrad"]
    if not vgs:
        return dest
    by_target: dict[VarNode, list] = {}
    for o in vgs:
        by_target.setdefault(o.inputs[0], []).append(o)
    varmap = {}
    for target, oprs in by_target.items():
        real = grad(target, [o.inputs[1] for o in oprs], warn_mid_wrt=False)
        for o, g in zip(oprs, real):
            varmap[o.outputs[0]] = g
    return replace_vars(dest, varmap)
