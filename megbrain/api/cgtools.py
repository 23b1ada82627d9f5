"""``mgb.cgtools``: graph inspection helpers (SPEC.md 2.6)."""

from __future__ import annotations

import collections
from collections.abc import Iterable

from ..opr.base import SymbolVar, as_var
from ..opr.operator_handle import Operator

__all__ = [
    "get_dep_vars",
    "get_inputs",
    "get_type",
    "get_opr_type",
    "get_oprs_seq",
    "graph_traversal",
]


def _as_list(x) -> list:
    if isinstance(x, (list, tuple, set)):
        return list(x)
    return [x]


def get_dep_vars(var, var_type=None) -> list[SymbolVar]:
    """Every var ``var`` depends on (itself included) whose owner type is in ``var_type``."""
    types = None if var_type is None else set(_as_list(var_type))
    out, seen = [], set()
    stack = [as_var(v) for v in _as_list(var)]
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        if types is None or v.owner.type_name in types:
            out.append(SymbolVar(v))
        stack.extend(v.owner.inputs)
    return out


def get_inputs(var) -> list[SymbolVar]:
    """The inputs of the var's owner operator."""
    return [SymbolVar(v) for v in as_var(var).owner.inputs]


def get_type(var) -> str:
    """The owner operator's type name, e.g. ``"SharedDeviceTensor"``."""
    return as_var(var).owner.type_name


def get_opr_type(opr: Operator) -> str:
    """The type name of an :class:`Operator`."""
    return opr.opr.type_name


def graph_traversal(outputs: Iterable):
    """BFS from ``outputs``' owner operators.

    Returns ``(map_oprs, map_vars, var2oprs, opr2receivers, indegree2opr, opr2indegree)``
    keyed by ids, as in the reference.
    """
    map_oprs, map_vars = collections.defaultdict(set), collections.defaultdict(set)
    var2oprs = collections.defaultdict(list)
    opr2receivers = collections.defaultdict(list)
    queue = [as_var(v).owner for v in _as_list(outputs)]
    visited = set()
    while queue:
        opr = queue.pop(0)
        if opr.id in visited:
            continue
        visited.add(opr.id)
        map_oprs[opr.id] = Operator(opr)
        for v in opr.outputs:
            map_vars[v.id] = SymbolVar(v)
        for inp in opr.inputs:
            var2oprs[inp.id].append(opr.id)
            opr2receivers[inp.owner.id].append(opr.id)
            map_vars[inp.id] = SymbolVar(inp)
            queue.append(inp.owner)
    indegree2opr = collections.defaultdict(set)
    opr2indegree = {}
    for oid, o in map_oprs.items():
        deg = len(o.opr.inputs)
        indegree2opr[deg].add(oid)
        opr2indegree[oid] = deg
    return map_oprs, map_vars, var2oprs, opr2receivers, indegree2opr, opr2indegree


def get_oprs_seq(outputs, prune_reshape: bool = False) -> list[Operator]:
    """A topological order of the operators ``outputs`` need, skipping ImmutableTensor.

    With ``prune_reshape``, operators that only compute Reshape target shapes are dropped.
    """
    dest = [as_var(v) for v in _as_list(outputs)]
    # every input counts here (not only run-time data inputs)
    order, seen = [], set()

    def visit(opr):
        stack = [(opr, False)]
        while stack:
            o, done = stack.pop()
            if done:
                order.append(o)
                continue
            if o in seen:
                continue
            seen.add(o)
            stack.append((o, True))
            for inp in reversed(o.inputs):
                if inp.owner not in seen:
                    stack.append((inp.owner, False))

    for v in dest:
        visit(v.owner)
    if prune_reshape:
        needed = set()
        stack = [v.owner for v in dest]
        while stack:
            o = stack.pop()
            if o in needed:
                continue
            needed.add(o)
            ins = o.inputs[:1] if o.type_name in ("Reshape", "Broadcast") else o.inputs
            stack.extend(v.owner for v in ins)
        order = [o for o in order if o in needed]
    return [Operator(o) for o in order if o.type_name != "ImmutableTensor"]

