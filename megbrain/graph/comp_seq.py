"""The comp seq: the operators a set of outputs needs, in a topological order honouring
operator priorities (smaller runs earlier; ties by creation order)."""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from ..errors import GraphError
from .operator import OperatorNodeBase
from .var import VarNode

__all__ = ["data_inputs", "dep_vars", "topo_order"]


def data_inputs(opr: OperatorNodeBase) -> list[VarNode]:
    """Inputs whose values must be computed before ``opr`` runs.

    Inputs used only for static inference (Reshape's target shape, GetVarShape's source) are
    skipped when what they provide is statically inferable.
    """
    out = []
    for i, v in enumerate(opr.inputs):
        if i in opr.static_only_inputs and v.value_static:
            continue
        if i in opr.shape_only_inputs and v.shape_static:
            continue
        out.append(v)
    return out


def dep_vars(opr: OperatorNodeBase, extra_vardeps: dict) -> list[VarNode]:
    """Every var that must be computed before ``opr``: data inputs plus extra deps."""
    deps = data_inputs(opr) + list(opr.extra_deps)
    if extra_vardeps:
        for v in opr.inputs:
            deps.extend(extra_vardeps.get(v, ()))
    return deps


def topo_order(dest: Iterable[VarNode], extra_vardeps: dict | None = None) -> list:
    """Operators needed to compute ``dest`` (and the ``extra_vardeps`` of any var needed)."""
    extra_vardeps = extra_vardeps or {}
    deps: dict[OperatorNodeBase, list[OperatorNodeBase]] = {}
    stack = []
    for v in dest:
        stack.append(v.owner)
        stack.extend(d.owner for d in extra_vardeps.get(v, ()))
    while stack:
        opr = stack.pop()
        if opr in deps:
            continue
        dv = dep_vars(opr, extra_vardeps)
        for out in opr.outputs:
            dv.extend(extra_vardeps.get(out, ()))
        deps[opr] = list(dict.fromkeys(d.owner for d in dv if d.owner is not opr))
        stack.extend(deps[opr])
    _order_overwrites(deps)
    nr_pending = {o: len(d) for o, d in deps.items()}
    receivers: dict[OperatorNodeBase, list] = {o: [] for o in deps}
    for o, ds in deps.items():
        for d in ds:
            receivers[d].append(o)
    heap = [_order(o) for o, n in nr_pending.items() if n == 0]
    heapq.heapify(heap)
    seq = []
    while heap:
        o = heapq.heappop(heap)[-1]
        seq.append(o)
        for r in receivers[o]:
            nr_pending[r] -= 1
            if nr_pending[r] == 0:
                heapq.heappush(heap, _order(r))
    return seq


def _order(opr) -> tuple:
    """Heap key: priority first; then in-place updates as soon as they are ready (their
    destination's readers are already done, and the delta's memory is freed early); then
    the creation order of the operator a rewrite cloned this one from."""
    return (opr.priority, not opr.overwritten_inputs(), opr.order_key, opr.id, opr)


def _order_overwrites(deps: dict) -> None:
    """Make every reader of a var updated in place (AddUpdate, BatchNorm's statistics) run
    before the update.

    A var may have one such writer per comp seq: with two, which value a reader sees would
    depend on their order (MegBrain refuses it the same way).
    """
    writer_of: dict[VarNode, OperatorNodeBase] = {}
    for o in deps:
        for var in o.overwritten_inputs():
            prev = writer_of.setdefault(var, o)
            if prev is not o:
                raise GraphError(
                    f"var {var.name!r} is updated in place by two operators in one function: "
                    f"{prev.type_name} {prev.name!r} and {o.type_name} {o.name!r}"
                )
    if not writer_of:
        return
    readers: dict[VarNode, list] = {v: [] for v in writer_of}
    for r in deps:
        for v in dict.fromkeys(r.inputs):
            lst = readers.get(v)
            if lst is not None:
                lst.append(r)
    original = {o: list(d) for o, d in deps.items()}
    for var, w in writer_of.items():
        have = set(deps[w])
        for r in readers[var]:
            if r is not w and r not in have:
                deps[w].append(r)
                have.add(r)
    if _has_cycle(deps):
        # a reader depends on the update it must precede: find which, as one check per
        # pair would (the slow walk runs only to name the culprit)
        deps.clear()
        deps.update(original)
        for var, w in writer_of.items():
            for r in readers[var]:
                if r is w:
                    continue
                if _reaches(deps, r, w):
                    raise GraphError(
                        f"operator {r.type_name} {r.name!r} reads both the old value of "
                        f"{var.name!r} and its value updated by {w.type_name} {w.name!r}"
                    )
                if r not in deps[w]:
                    deps[w].append(r)


def _has_cycle(deps: dict) -> bool:
    """Whether the dependency graph (operator -> operators it depends on) has a cycle."""
    pending = {o: 0 for o in deps}
    for ds in deps.values():
        for d in ds:
            if d in pending:
                pending[d] += 1
    stack = [o for o, n in pending.items() if n == 0]
    seen = 0
    while stack:
        o = stack.pop()
        seen += 1
        for d in deps[o]:
            if d in pending:
                pending[d] -= 1
                if pending[d] == 0:
                    stack.append(d)
    return seen < len(pending)


def _reaches(deps: dict, start, goal) -> bool:
    """Whether ``start`` depends (transitively) on ``goal``."""
    stack, seen = [start], set()
    while stack:
        o = stack.pop()
        for d in deps.get(o, ()):
            if d is goal:
                return True
            if d not in seen:
                seen.add(d)
                stack.append(d)
    return False
