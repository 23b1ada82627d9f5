"""Training-graph passes: rewrites of the expanded gradient graph (after VirtualGrad
expansion, in the compile preset's second round).

``mask_pool_grad``: the ReLU gradient applied after a MAX pooling gradient,
``SWITCH_GT0(y, PoolingBackward(y, pool(y), d))``, becomes
``PoolingBackward(y, pool(y), SWITCH_GT0(pool(y), d))``: the mask is taken on the pooled
tensor (a quarter of the elements for 2x2 pooling) instead of the full one.

Why the values are the same: MAX pooling's backward gives a window's gradient only to the
elements equal to the window's maximum ``m``; such an element is positive exactly when ``m``
is, so masking each window's gradient by ``m > 0`` drops the same terms as masking each
element by ``y > 0``. An element with ``y <= 0`` (or NaN) then receives only zero terms, an
element with ``y > 0`` lies only in windows with ``m > 0`` and receives its terms unchanged.
The results compare equal; a zero may come out as -0.0 where the mask gave +0.0, and an
infinite gradient (which already turns the pooling gradient's other elements into NaN) may
leave NaN where the mask gave 0.
"""

from __future__ import annotations

from ..graph import VarNode
from ..graph.static_infer import static_shape
from ..opr.base import SymbolVar
from ..opr.basic_arith import elemwise
from .passes import Rewriter, register_pass

__all__ = ["mask_pool_grad"]


def _relu_output(cond: VarNode, pooled_src: VarNode) -> bool:
    """Whether ``cond > 0`` exactly where ``pooled_src > 0``: the same var, or ``cond`` is
    the input of the RELU that produced ``pooled_src``."""
    if cond is pooled_src:
        return True
    o = pooled_src.owner
    return (
        o.type_name == "Elemwise"
        and o.param.mode == "RELU"
        and not o.extra_deps
        and o.inputs[0] is cond
    )


@register_pass("mask_pool_grad")
def mask_pool_grad(graph, dest: list[VarNode]) -> dict:
    """``SWITCH_GT0(y, PoolingBackward[MAX](y, pool(y), d))`` ->
    ``PoolingBackward[MAX](y, pool(y), SWITCH_GT0(pool(y), d))`` where the pooling
    gradient has no other reader (see the module docstring for why the values agree)."""
    rw = Rewriter(graph, dest)

    def rule(opr):
        if opr.type_name != "Elemwise" or opr.param.mode != "SWITCH_GT0" or opr.extra_deps:
            return None
        cond, grad = opr.inputs
        bwd = rw.sole_source(grad, "PoolingBackward", "MAX")
        if bwd is None:
            return None
        src, dst, diff = bwd.inputs
        fwd = dst.owner
        if (
            fwd.type_name != "PoolingForward"
            or fwd.param != bwd.param
            or fwd.inputs[0] is not src
            or not _relu_output(cond, src)
            or cond.dtype != grad.dtype
            or diff.dtype != dst.dtype
        ):
            return None
        shape = static_shape(opr.outputs[0])
        if shape is None or shape != static_shape(grad) or static_shape(dst) != static_shape(diff):
            return None  # the mask must not broadcast
        masked = elemwise(SymbolVar(dst), SymbolVar(diff), mode="SWITCH_GT0").node
        return graph.insert_opr(bwd.clone([src, dst, masked]))[:1]

    return rw.apply(rule, "ReLU gradient masked before the MAX pooling gradient")
