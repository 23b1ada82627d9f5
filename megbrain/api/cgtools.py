"""``mgb.cgtools``: graph inspection helpers."""

from __future__ import annotations

import collections
from collections.abc import Iterable

from ..errors import ArgumentError, MegBrainError
from ..graph.replace import dep_oprs, postorder
from ..opr.base import SymbolVar, as_var
from ..opr.operator_handle import Operator

__all__ = [
    "get_dep_vars",
    "get_inputs",
    "get_type",
    "get_opr_type",
    "get_oprs_seq",
    "graph_traversal",
    "replace_vars",
    "replace_oprs",
    "set_priority_to_id",
]


def _as_list(x) -> list:
    if isinstance(x, (list, tuple, set)):
        return list(x)
    return [x]


def _vars_arg(x, func: str, arg: str) -> list:
    """``x`` (a var or a list of vars) as VarNodes; an ArgumentError naming ``func`` and
    ``arg`` for anything else."""
    out = []
    for v in _as_list(x):
        node = as_var(v)
        if node is None:
            raise ArgumentError(
                f"{func}: {arg} must be a SymbolVar or a list of SymbolVars, got "
                f"{type(v).__name__} {v!r}"
            )
        out.append(node)
    return out


def _pair_list(pairs, func: str, arg: str, what: str) -> list[tuple]:
    """``pairs`` (a dict, or an iterable of 2-item pairs) as a list of 2-tuples; an
    ArgumentError naming ``func``, ``arg`` and ``what`` the pairs hold for anything else."""
    items = pairs.items() if isinstance(pairs, dict) else pairs
    expected = f"{func}: {arg} must be {what}"
    if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise ArgumentError(f"{expected}, got {type(pairs).__name__} {pairs!r}")
    out = []
    for item in items:
        pair = None
        if not isinstance(item, (str, bytes)) and isinstance(item, Iterable):
            pair = tuple(item)
        if pair is None or len(pair) != 2:
            raise ArgumentError(f"{expected}, got the item {item!r} in {pairs!r}")
        out.append(pair)
    return out


def get_dep_vars(var, var_type=None) -> list[SymbolVar]:
    """Every var ``var`` depends on (itself included) whose owner type is in ``var_type``."""
    types = None if var_type is None else set(_as_list(var_type))
    out, seen = [], set()
    stack = _vars_arg(var, "get_dep_vars", "var")
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
    keyed by ids, as in the reference: ``map_oprs`` opr id -> :class:`Operator`,
    ``map_vars`` var id -> var (every output and input seen), ``var2oprs`` var id ->
    ``[(reader opr id, input index)]``, ``opr2receivers`` opr id -> reader opr ids (once per
    input edge), ``indegree2opr`` number of inputs -> opr ids and ``opr2indegree``.
    """
    map_oprs, map_vars = collections.defaultdict(set), collections.defaultdict(set)
    var2oprs = collections.defaultdict(list)
    opr2receivers = collections.defaultdict(list)
    queue = [v.owner for v in _vars_arg(outputs, "graph_traversal", "outputs")]
    visited = set()
    while queue:
        opr = queue.pop(0)
        if opr.id in visited:
            continue
        visited.add(opr.id)
        map_oprs[opr.id] = Operator(opr)
        for v in opr.outputs:
            map_vars[v.id] = SymbolVar(v)
        for idx, inp in enumerate(opr.inputs):
            var2oprs[inp.id].append((opr.id, idx))
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
    dest = _vars_arg(outputs, "get_oprs_seq", "outputs")
    # every input counts here (not only run-time data inputs)
    order = postorder([v.owner for v in dest], lambda o: [i.owner for i in reversed(o.inputs)])
    if prune_reshape:
        needed = set()
        stack = [v.owner for v in dest]
        while stack:
            o = stack.pop()
            if o in needed:
                continue
            needed.add(o)
            ins = o.inputs[:1] if o.type_name == "Reshape" else o.inputs
            stack.extend(v.owner for v in ins)
        order = [o for o in order if o in needed]
    return [Operator(o) for o in order if o.type_name != "ImmutableTensor"]


def replace_vars(dst, varmap) -> list[SymbolVar]:
    """New vars for ``dst`` with their dependencies substituted (``cg::replace_vars``).

    ``varmap`` is a dict or a list of ``(old, new)`` pairs of vars.
    """
    from ..graph.replace import replace_vars as _replace

    vmap = {}
    what = "a dict or a list of (old, new) pairs of SymbolVars"
    for k, v in _pair_list(varmap, "replace_vars", "varmap", what):
        (old,) = _vars_arg(k, "replace_vars", "varmap's keys")
        (new,) = _vars_arg(v, "replace_vars", "varmap's values")
        vmap[old] = new
    return [SymbolVar(v) for v in _replace(_vars_arg(dst, "replace_vars", "dst"), vmap)]


def replace_oprs(dst, oprmap) -> list[SymbolVar]:
    """New vars for ``dst`` with operators substituted (``cg::replace_oprs``).

    ``oprmap`` maps :class:`Operator` to :class:`Operator` (a dict or a list of pairs); the
    outputs of each old operator are replaced by those of the new one.
    """
    varmap = []
    what = "a dict or a list of (old, new) pairs of Operators"
    for old, new in _pair_list(oprmap, "replace_oprs", "oprmap", what):
        old_outs, new_outs = old.opr.outputs, new.opr.outputs
        if len(old_outs) != len(new_outs):
            raise MegBrainError(
                f"replace_oprs: {old.name!r} has {len(old_outs)} outputs but its replacement "
                f"{new.name!r} has {len(new_outs)}"
            )
        varmap.extend(zip(old_outs, new_outs))
    return replace_vars(dst, varmap)


def set_priority_to_id(dest_vars) -> None:
    """Give every operator ``dest_vars`` depend on whose priority is 0 priority = its id."""
    for opr in dep_oprs([as_var(v) for v in _as_list(dest_vars)]):
        if opr.priority == 0:
            opr.priority = opr.id
