"""Var replacement (``cg::replace_vars``): rebuild the operators between replaced vars and
the destination vars over the new inputs."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..errors import GraphError
from .var import VarNode

__all__ = ["replace_vars", "dep_oprs", "postorder"]


def postorder(
    roots: Iterable, inputs_of: Callable[[Any], Iterable], key: Callable | None = None
) -> list:
    """Every node reachable from ``roots`` once, each after all of ``inputs_of(node)``.

    A depth-first post-order without recursion (deep graphs do not overflow the stack): the
    roots are walked in order, and a node's inputs are pushed in the order ``inputs_of``
    gives them, so the last one is visited first.

    Parameters
    ----------
    roots:
        The nodes to start from.
    inputs_of:
        The nodes a node depends on.
    key:
        What identifies a node (the node itself when None).

    Returns
    -------
    list
        The nodes, inputs first.
    """
    key = key or (lambda node: node)
    order, seen = [], set()
    for root in roots:
        stack = [(root, False)]
        while stack:
            node, done = stack.pop()
            if done:
                order.append(node)
                continue
            if key(node) in seen:
                continue
            seen.add(key(node))
            stack.append((node, True))
            stack.extend((i, False) for i in inputs_of(node) if key(i) not in seen)
    return order


def dep_oprs(dest: Iterable[VarNode]) -> list:
    """Every operator ``dest`` depends on (through any input), inputs first."""
    # the last of dest is walked first, as one stack holding them all would
    return postorder(
        [v.owner for v in reversed(list(dest))],
        lambda opr: [v.owner for v in (*opr.inputs, *opr.extra_deps)],
    )


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
    ndest = len(dest)
    if memo is None:
        memo = {}
    memo.update(varmap)
    src_graph = dest[0].graph if dest else None
    vardeps = src_graph.options.extra_vardeps if src_graph is not None else {}
    if vardeps:
        dest = _with_extra_deps(dest, vardeps)
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
        if (
            opr.graph is g
            and all(a is b for a, b in zip(ins, opr.inputs))
            and all(a is b for a, b in zip(extra, opr.extra_deps))
        ):
            continue
        new = opr.clone(ins)
        new.extra_deps = extra
        outs = g.insert_opr(new)
        for old, nv in zip(opr.outputs, outs):
            memo[old] = nv
    if vardeps:
        # carry add_extra_vardep over to the replacements (as replace_vars_internal does)
        target_extra = (graph or src_graph).options.extra_vardeps
        for v, deps in list(vardeps.items()):
            nv = memo.get(v)
            if nv is not None and nv is not v:
                lst = target_extra.setdefault(nv, [])
                for d in deps:
                    nd = memo.get(d, d)
                    if nd not in lst and nd.graph is nv.graph:
                        lst.append(nd)
    return [memo.get(v, v) for v in dest[:ndest]]


def _with_extra_deps(dest: list[VarNode], extra: dict) -> list[VarNode]:
    """``dest`` plus every extra dep of a var reachable from it (until closed)."""
    out, seen = list(dest), set(dest)
    while True:
        added = False
        for opr in dep_oprs(out):
            for v in list(opr.inputs) + list(opr.outputs):
                for d in extra.get(v, ()):
                    if d not in seen:
                        seen.add(d)
                        out.append(d)
                        added = True
        if not added:
            return out
