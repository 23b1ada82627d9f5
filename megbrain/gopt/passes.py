"""Optimizer passes (SPEC.md section 3 ``graph_opt_level``; DESIGN.md section 3 step 2).

* level 1: arithmetic simplification while the graph is built (``x*1``, ``x+0``, ``x/x``,
  double negation), :func:`arith_simplify_on_insert`;
* level 2: global passes before compile, in the order of :data:`PRESET` (constant folding,
  redundant TypeCvt removal), :func:`optimize_for_compile`;
* a negative level runs the same passes and checks each replaced output against the
  unoptimized one at run time (AssertEqual).

A pass is ``f(graph, dest_vars) -> {old var: new var}``; passes are small registered
functions, so the optimizer is data (see STYLE.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from ..graph import InferType, VarNode
from ..graph.replace import dep_oprs, replace_vars
from ..graph.static_infer import DynamicShapeError, Inferer, infer_shape
from ..opr.base import SymbolVar
from ..opr.basic_arith import fill_retain_dtype
from ..opr.io import ImmutableTensor

__all__ = [
    "PASSES",
    "PRESET",
    "register_pass",
    "optimize_for_compile",
    "arith_simplify_on_insert",
    "install",
    "get_replaced_var",
]

logger = logging.getLogger("megbrain")

PASSES: dict[str, Callable] = {}
#: the order passes run in at graph_opt_level >= 2
PRESET: list[str] = []

_FOLD_MAX_BYTES = 1 << 20


def register_pass(name: str, preset: bool = True):
    """Register a pass ``f(graph, dest) -> varmap`` under ``name`` (appended to PRESET)."""

    def deco(fn):
        PASSES[name] = fn
        if preset:
            PRESET.append(name)
        return fn

    return deco


def _const(v: VarNode):
    return v.const_value if v.value_type == InferType.CONST else None


def _shape(v: VarNode):
    try:
        return infer_shape(v)
    except DynamicShapeError:
        return None


def _is_scalar_const(v: VarNode, value: float) -> bool:
    if v.value_type != InferType.CONST or v.owner.type_name != "ImmutableTensor":
        return False
    c = v.owner.value
    return c.size >= 1 and bool(np.all(c == value))


# ---- level 1: at insertion ---------------------------------------------------------------
def arith_simplify_on_insert(graph, opr):
    """Simplify an Elemwise about to be inserted; returns replacement outputs or None."""
    if abs(graph.options.graph_opt_level) < 1 or opr.type_name != "Elemwise":
        return None
    mode, ins = opr.param.mode, opr.inputs
    out = None
    if mode == "NEGATE" and ins[0].owner.type_name == "Elemwise" and (
        ins[0].owner.param.mode == "NEGATE"
    ):
        out = ins[0].owner.inputs[0]
    elif len(ins) == 2:
        a, b = ins
        if mode in ("ADD", "SUB") and _is_scalar_const(b, 0):
            out = a
        elif mode == "ADD" and _is_scalar_const(a, 0):
            out = b
        elif mode in ("MUL", "TRUE_DIV") and _is_scalar_const(b, 1):
            out = a
        elif mode == "MUL" and _is_scalar_const(a, 1):
            out = b
        elif mode == "TRUE_DIV" and a is b and np.issubdtype(a.dtype, np.floating):
            out = fill_retain_dtype(SymbolVar(a), 1).node
        if out is not None and out in (a, b):
            # the result must keep the broadcast shape and dtype
            sa, sb = _shape(a), _shape(b)
            if sa is None or sb is None or out.dtype != a.dtype:
                return None
            if tuple(np.broadcast_shapes(sa, sb)) != _shape(out):
                return None
    if out is None:
        return None
    if graph.options.log_level >= 2:
        logger.info("gopt: %s simplified to %s", opr.default_name(), out.name)
    return [out]


def install(graph) -> None:
    """Attach the insertion-time simplifier to ``graph`` (it checks the level per call)."""
    if arith_simplify_on_insert not in graph.insert_rewriters:
        graph.insert_rewriters.append(arith_simplify_on_insert)


# ---- level 2: before compile -------------------------------------------------------------
@register_pass("fold_constants")
def fold_constants(graph, dest):
    """Replace computed vars with a CONST value by ImmutableTensors of that value."""
    varmap = {}
    inf = Inferer()
    for opr in dep_oprs(dest):
        if not opr.inputs or opr.has_side_effect or opr.type_name == "ImmutableTensor":
            continue
        if opr.type_name in ("Broadcast",):  # folding would materialize a large tensor
            continue
        for v in opr.outputs:
            if v.value_type != InferType.CONST:
                continue
            val = inf.value(v)
            if val.nbytes > _FOLD_MAX_BYTES:
                continue
            new = graph.insert_opr(ImmutableTensor(val, v.comp_node, _cfg()))[0]
            varmap[v] = new
    return varmap


@register_pass("remove_redundant_typecvt")
def remove_redundant_typecvt(graph, dest):
    """TypeCvt to the dtype its input already has is the identity."""
    return {
        o.outputs[0]: o.inputs[0]
        for o in dep_oprs(dest)
        if o.type_name == "TypeCvt" and o.inputs[0].dtype == o.outputs[0].dtype
    }


def _cfg():
    from ..graph import OperatorNodeConfig

    return OperatorNodeConfig()


def optimize_for_compile(graph, dest: list[VarNode]) -> list[VarNode]:
    """Run the PRESET passes on ``dest`` when ``|graph_opt_level| >= 2``; record and log
    every replacement; at a negative level, wrap replaced outputs in a run-time check."""
    level = graph.options.graph_opt_level
    if abs(level) < 2:
        return dest
    cur = list(dest)
    for name in PRESET:
        varmap = PASSES[name](graph, cur)
        varmap = {k: v for k, v in varmap.items() if k is not v}
        if not varmap:
            continue
        if graph.options.log_level >= 2:
            for k, v in varmap.items():
                logger.info("gopt %s: %s -> %s", name, k.name, v.name)
        new = replace_vars(cur, varmap)
        _record(graph, cur, new, varmap)
        cur = new
    if level < 0:
        from ..opr.utility import assert_equal

        cur = [
            v if v is o else assert_equal(SymbolVar(o), SymbolVar(v)).node
            for o, v in zip(dest, cur)
        ]
    return cur


def _record(graph, old, new, varmap):
    table = graph.__dict__.setdefault("gopt_replaced", {})
    for k, v in list(varmap.items()) + list(zip(old, new)):
        if k is not v:
            table[k] = v
    # keep chains resolved: a -> b -> c becomes a -> c
    for k in list(table):
        v = table[k]
        seen = set()
        while v in table and v not in seen:
            seen.add(v)
            v = table[v]
        table[k] = v


def get_replaced_var(src: VarNode) -> VarNode:
    """The var that replaced ``src`` in the latest optimization (``src`` if none)."""
    return getattr(src.graph, "gopt_replaced", {}).get(src, src)
