"""Top-level graph functions of ``mgb``: grad, current_grad_target,
the add_update fast path."""

from __future__ import annotations

import numpy as np

from ..errors import MegBrainError
from ..graph import static_shape
from ..graph.value_proxy import CompGraphCallbackValueProxy
from ..opr import grad as _grad_mod
from ..opr.base import SymbolVar, as_var
from ..opr.utility import add_update_apply, add_update_coefs, virtual_grad
from ..plugin.footprint import opr_footprint

__all__ = [
    "grad",
    "current_grad_target",
    "_add_update_fastpath",
    "get_graph_optimizer_replaced_var",
    "inter_graph_trans_var",
    "mark_as_input",
    "get_opr_fp_graph_exec",
    "return_free_memory",
]


def grad(target, wrt, warn_mid_wrt=True, use_virtual_grad=None, return_zero_for_nodep=True):
    """Symbolic gradient of the scalar ``target`` w.r.t. ``wrt`` (a var or a list of vars).

    ``use_virtual_grad`` (default: ``|graph_opt_level| >= 2``) returns VirtualGrad vars that
    compile expands into the real gradient after the forward graph is optimized; it can not
    return None for a var the target does not depend on.
    """
    t = as_var(target)
    if t is None:
        raise TypeError(f"grad: target must be a SymbolVar, got {target!r}")
    single = not isinstance(wrt, (list, tuple))
    wrts = [wrt] if single else list(wrt)
    if use_virtual_grad is None:
        use_virtual_grad = abs(t.graph.options.graph_opt_level) >= 2
    if use_virtual_grad:
        if not return_zero_for_nodep:
            raise MegBrainError("grad: VirtualGrad requires return_zero_for_nodep=True")
        res = [virtual_grad(SymbolVar(t), w) for w in wrts]
    else:
        nodes = _grad_mod.grad(t, wrts, warn_mid_wrt, return_zero_for_nodep)
        res = [None if n is None else SymbolVar(n) for n in nodes]
    return res[0] if single else res


def current_grad_target(comp_graph) -> SymbolVar | None:
    """The target of the gradient being computed (inside SetGrad callbacks)."""
    t = _grad_mod.current_grad_target(comp_graph)
    return None if t is None else SymbolVar(t)


def _add_update_fastpath(dest, delta, alpha=1.0, beta=1.0, bias=0.0) -> None:
    """``dest = alpha*dest + beta*delta + bias`` on device tensors, outside any graph.

    Computed as the AddUpdate operator does: in dest's dtype, with the coefficients cast to
    it, in place.

    Parameters
    ----------
    dest : SharedND
        The tensor updated.
    delta : SharedND or CompGraphCallbackValueProxy
        Of dest's dtype and comp node; broadcast to dest's shape.
    alpha, beta, bias : float
        The coefficients; integer values for an integer dest.

    Raises
    ------
    MegBrainError
        For an empty tensor, a comp node, dtype or shape mismatch, or a coefficient the
        dest's dtype can not represent exactly.
    """
    from .shared import SharedND

    if not isinstance(dest, SharedND):
        raise MegBrainError("_add_update_fastpath: dest must be a SharedND")
    dest._apply_lazy_init()
    if not dest.dev_tensor.shape_valid():
        raise MegBrainError("_add_update_fastpath: dest is empty")
    if isinstance(delta, SharedND):
        delta._apply_lazy_init()
        if not delta.dev_tensor.shape_valid():
            raise MegBrainError("_add_update_fastpath: delta is empty")
        dcn = delta.comp_node
    elif isinstance(delta, CompGraphCallbackValueProxy):
        dcn = delta.comp_node
    else:
        raise MegBrainError("_add_update_fastpath: delta must be a SharedND or a value proxy")
    if dcn != dest.comp_node:
        raise MegBrainError(
            f"_add_update_fastpath: comp node mismatch: dest on {dest.comp_node}, delta on {dcn}"
        )
    if isinstance(delta, SharedND):
        delta.dev_tensor.sync()
        d = delta.dev_tensor.as_ndarray()
    else:
        d = delta.dev_value
    if d.dtype != dest.dtype:
        raise MegBrainError(
            f"_add_update_fastpath: dtype mismatch: dest {dest.dtype}, delta {d.dtype}"
        )
    dest._dev.sync()
    out = dest._dev.as_ndarray()
    try:
        d = np.broadcast_to(d, out.shape)
    except ValueError:
        raise MegBrainError(
            f"_add_update_fastpath: delta shape {d.shape} can not broadcast to {out.shape}"
        ) from None
    add_update_apply(out, d, add_update_coefs(out.dtype, alpha, beta, bias))


def get_graph_optimizer_replaced_var(src) -> SymbolVar:
    """The var the graph optimizer put in place of ``src`` (``src`` itself if none)."""
    from ..gopt import get_replaced_var

    return SymbolVar(get_replaced_var(as_var(src)))


def inter_graph_trans_var(dest_graph, src) -> SymbolVar:
    """The var of ``dest_graph`` (a copy of ``src``'s graph) that corresponds to ``src``."""
    table = getattr(dest_graph, "inter_graph_trans", None)
    if table is None:
        raise MegBrainError(f"trans func on graph {dest_graph!r} has not been setup")
    v = as_var(src)
    if v.graph is dest_graph:
        return SymbolVar(v)
    got = table.get(v)
    if got is None:
        raise MegBrainError(f"var {v.name!r} has no counterpart in graph {dest_graph!r}")
    return SymbolVar(got)


def mark_as_input(comp_graph, var) -> None:
    """Register a Host2DeviceCopy var of ``comp_graph`` as a user input of functions."""
    v = as_var(var)
    if v.graph is not comp_graph:
        raise MegBrainError(f"mark_as_input: var {v.name!r} belongs to another graph")
    if v.owner.type_name != "Host2DeviceCopy":
        raise MegBrainError(f"mark_as_input: var {v.name!r} is produced by {v.owner.type_name}")
    comp_graph.user_input_vars[id(v.owner.tensor)] = v


def _footprint(opr) -> dict:
    return opr_footprint(
        opr, [static_shape(v) for v in opr.inputs], [static_shape(v) for v in opr.outputs]
    )


def get_opr_fp_graph_exec(comp_graph, output_vars) -> dict:
    """Footprint of each operator ``output_vars`` need, plus the compiled function's plan.

    The graph is compiled for ``output_vars`` (with static memory allocated), which makes
    every function compiled before on ``comp_graph`` unrunnable, as any compile does.
    Returns ``{"opr_footprint": {opr_id: {computation, memory, in_shapes, out_shapes, param}},
    "graph_exec": <memory allocation info>}``; ``computation`` is None where unknown.
    """
    import json

    if not isinstance(output_vars, (list, tuple)):
        raise TypeError("get_opr_fp_graph_exec: output_vars must be a list of SymbolVars")
    for v in output_vars:
        if not isinstance(v, SymbolVar):
            raise TypeError(f"get_opr_fp_graph_exec: bad var {v!r}")
    old = comp_graph.set_option("allocate_static_mem_after_graph_compile", True)
    try:
        func = comp_graph.compile_outonly(list(output_vars))
    finally:
        comp_graph.set_option("allocate_static_mem_after_graph_compile", old)
    from .cgtools import get_oprs_seq

    fp = {str(o.id): _footprint(o.opr) for o in get_oprs_seq(list(output_vars))}
    del func
    return {"opr_footprint": fp, "graph_exec": json.loads(comp_graph.get_mem_allocation_info())}


def return_free_memory() -> None:
    """Hand cached free device memory back to the system on every comp node."""
    from ..device import CompNode

    CompNode._try_coalesce_all_free_memory()
