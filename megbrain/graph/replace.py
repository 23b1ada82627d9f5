"""Var replacement (``cg::replace_vars``): rebuild the operators between replaced vars and
the destination vars over the new inputs."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..errors import GraphError
from .var import VarNode

__all__ = ["replace_vars", "dep_oprs"]


def dep_oprs(dest: Iterable[VarNode]) -> list:
    """Every operator ``dest`` depends on (through any input), inputs first."""
    order, seen = [], set()
    stack = [(v.owner, False) for v in dest]
    while stack:
        opr, done = stack.pop()
        if done:
            order.append(opr)
            continue
        if opr in seen:
            continue
        seen.add(opr)
        stack.append((opr, True))
        for v in list(opr.inputs) + list(opr.extra_deps):
            if v.owner not in seen:
                stack.append((v.owner, False))
    return order


def replace_vars(
    dest: Iterable[VarNode],
    varmap: Mapping[VarNode, VarNode],
    graph=None,
    memo: dict | None = None,
):
    """New vars for ``dest`` where each key of ``varmap`` is replaced by its value.

    Operators are cloned over their new inputs and inserted into ``graph`` (default: the
    graph of the dest vars), which deduplicates unchanged structure. ``memo``, when given,
    is filled with every old var -> new var mapping made (for inter-graph translation).
    """
    dest = list(dest)
    if memo is None:
        memo = {}
    memo.update(varmap)
    for k, v in memo.items():
        if k.dtype != v.dtype:
            raise GraphError(
                f"replace_vars: {k.name!r} ({k.dtype}) replaced by {v.name!r} ({v.dtype})"
            )
    target = graph
    for opr in dep_oprs(dest):
        if all(o in memo for o in opr.outputs):
            continue
        ins = [memo.get(v, v) for v in opr.inputs]
        extra = [memo.get(v, v) for v in opr.extra_deps]
        g = target or opr.graph
        if opr.graph is g and all(a is b for a, b in zip(ins, opr.inputs)) and all(
            a is b for a, b in zip(extra, opr.extra_deps)
        ):
            continue
        new = opr.clone(ins)
        new.extra_deps = extra
        outs = g.insert_opr(new)
        for old, nv in zip(opr.outputs, outs):
            memo[old] = nv
    return [memo.get(v, v) for v in dest]
