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

``fuse_bn_activation``: a TRAINING-mode float32 BatchNorm whose output only a ReLU
(``RELU``) or a ReLU6 (``MIN(RELU(y), 6)``) reads, and the gradient of that activation
(``SWITCH_GT0(y, g)``, for ReLU6 ``SWITCH_GT0(y, COND_LEQ_MOV(RELU(y), 6, g))``) read only by
the BatchNorm's own BatchNormBackward, become one
:class:`~megbrain.opr.dnn_norm.BatchNormTail` (the clamp in the normalization's writing
pass) and one :class:`~megbrain.opr.dnn_norm.BatchNormTailBackward` (the mask inside the
backward's two passes, read from the clamped output): four elementwise passes over the
tensor fewer per layer. The values are the unfused graph's but at one tie: where ``y`` is
exactly 6.0 the fused ReLU6 passes no gradient (the mask ``0 < z < 6`` of the clamped
output ``z``, PyTorch's ``hardtanh_backward``), where ``COND_LEQ_MOV`` passed it.
"""

from __future__ import annotations

import numpy as np

from ..graph import OperatorNodeConfig, VarNode
from ..graph.static_infer import static_shape
from ..opr.base import SymbolVar
from ..opr.basic_arith import elemwise
from ..opr.dnn_norm import (
    BatchNorm,
    BatchNormBackward,
    BatchNormTail,
    BatchNormTailBackward,
    BNTailParam,
)
from .passes import Rewriter, _is_scalar_const, register_pass

__all__ = ["fuse_bn_activation", "mask_pool_grad"]


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


def _elemwise(o, mode: str) -> bool:
    return o is not None and o.type_name == "Elemwise" and o.param.mode == mode \
        and not o.extra_deps  # fmt: skip


def _six(v: VarNode, like: VarNode) -> bool:
    """Whether ``v`` is the constant 6 and does not broadcast ``like``'s shape."""
    shape = static_shape(like)
    return _is_scalar_const(v, 6) and shape is not None and v.owner.value.ndim <= len(shape)


def _shape_sum(o) -> bool:
    """Whether ``o`` is a SUM Reduce to its input's own (static) shape: the identity the
    gradient of an Elemwise input puts on each gradient (reduce to the input's shape)."""
    if o is None or o.type_name != "Reduce" or o.param.mode != "SUM" or o.extra_deps:
        return False
    shape = static_shape(o.outputs[0])
    return shape is not None and shape == static_shape(o.inputs[0])


def _past_sums(v: VarNode, readers: dict) -> tuple[VarNode, list]:
    """``v`` followed through the :func:`_shape_sum` Reduces that alone read it: the last
    var and the Reduces."""
    chain = []
    while True:
        rs = readers.get(v, [])
        if len(rs) != 1 or not _shape_sum(rs[0]) or rs[0].inputs[0] is not v:
            return v, chain
        chain.append(rs[0])
        v = rs[0].outputs[0]


def _split_shapes(rs: list) -> tuple[list, list]:
    """The readers ``rs`` less their GetVarShape operators, and those operators."""
    shapes = [o for o in rs if o is not None and o.type_name == "GetVarShape"]
    return [o for o in rs if o not in shapes], shapes


def _bn_activation(bn, readers: dict) -> tuple | None:
    """``(tail, tail output var, backward or None, the tail's output gradient or None)`` of a
    BatchNorm matching ``fuse_bn_activation``'s pattern (the module docstring; the identity
    SUM Reduces of the gradients looked through), else None; ``readers`` is
    :attr:`Rewriter.readers`."""
    if type(bn) is not BatchNorm or bn.param.fwd_mode != "TRAINING" or bn.extra_deps:
        return None
    y = bn.outputs[4]
    if y.dtype != np.float32:
        return None
    ys, shapes = _split_shapes(readers.get(y, []))
    relus = [o for o in ys if _elemwise(o, "RELU")]
    masks = [o for o in ys if _elemwise(o, "SWITCH_GT0") and o.inputs[0] is y]
    if len(relus) != 1 or len(masks) > 1 or len(relus) + len(masks) != len(ys):
        return None
    r = relus[0].outputs[0]
    dead: list = []  # the gradient's identity Reduces, which the fusion leaves unread
    gz = None
    if masks:
        gz = masks[0].inputs[1]
    rs, more = _split_shapes(readers.get(r, []))
    mins = [o for o in rs if _elemwise(o, "MIN") and o.inputs[0] is r and _six(o.inputs[1], r)]
    if mins:  # RELU6: MIN(RELU(y), 6); its gradient COND_LEQ_MOV(r, 6, g) -> SWITCH_GT0(y, .)
        shapes += more
        leqs = [o for o in rs if _elemwise(o, "COND_LEQ_MOV") and o.inputs[0] is r
                and _six(o.inputs[1], r)]  # fmt: skip
        if len(mins) != 1 or len(leqs) != len(masks) or len(rs) != 1 + len(leqs):
            return None
        if masks:
            last, chain = _past_sums(leqs[0].outputs[0], readers)
            if gz is not last or readers.get(last) != masks:
                return None
            dead += chain
            gz = leqs[0].inputs[2]
        tail, out = "RELU6", mins[0].outputs[0]
    else:  # RELU: its gradient SWITCH_GT0(y, g)
        tail, out = "RELU", r
    if static_shape(out) != static_shape(y) or out.dtype != y.dtype:
        return None
    bwd = None
    if masks:
        gy, chain = _past_sums(masks[0].outputs[0], readers)
        dead += chain
        got = readers.get(gy, [])
        bwd = got[0] if len(got) == 1 else None
        want = [bn.inputs[0], gy, bn.outputs[2], bn.outputs[3], bn.inputs[1]]
        if type(bwd) is not BatchNormBackward or bwd.extra_deps or bwd.param != bn.param \
                or list(bwd.inputs) != want:  # fmt: skip
            return None
    # nothing else keeps the unfused operators alive: BatchNorm's other outputs read by its
    # backward only, the shapes of y and RELU(y) by the gradient's identity Reduces only
    if any(o is not bwd for v in bn.outputs[:4] for o in readers.get(v, [])):
        return None
    if any(o not in dead for g in shapes for o in readers.get(g.outputs[0], [])):
        return None
    return tail, out, bwd, gz


@register_pass("fuse_bn_activation")
def fuse_bn_activation(graph, dest: list[VarNode]) -> dict:
    """A TRAINING BatchNorm, its ReLU or ReLU6 and their gradients ->
    :class:`~megbrain.opr.dnn_norm.BatchNormTail` and
    :class:`~megbrain.opr.dnn_norm.BatchNormTailBackward` (the module docstring), on the
    expanded gradients only (before, the gradients would have to pass the fused
    operator)."""
    rw = Rewriter(graph, dest)
    if any(o.type_name == "VirtualGrad" for o in rw.oprs):
        return {}
    extra = graph.options.extra_vardeps
    fwd: dict = {}  # the operator whose output the tail replaces -> (BatchNorm, tail)
    bwd: dict = {}  # BatchNormBackward -> (BatchNorm, the tail output's gradient)
    for o in rw.oprs:
        found = _bn_activation(o, rw.readers)
        if found is None or o.outputs[4] in extra:
            continue
        tail, out, b, gz = found
        fwd[out.owner] = (o, tail)
        if b is not None:
            bwd[b] = (o, gz)
    made: dict = {}

    def rule(cur):
        orig = rw.original(cur.outputs[0]).owner
        if orig in fwd:
            bn, tail = fwd[orig]
            fields = {f: getattr(bn.param, f) for f in bn.param.__dataclass_fields__}
            param = BNTailParam(**fields, tail=tail)
            cfg = OperatorNodeConfig(comp_node=bn.comp_node)
            new = graph.insert_opr(BatchNormTail([rw.get(v) for v in bn.inputs], param, cfg))
            for old, nv in zip(bn.outputs[:4], new[:4]):
                rw.replace(old, nv, "BatchNorm and its activation fused")
            made[bn] = (new, param)
            return [new[4]]
        if orig in bwd and bwd[orig][0] in made:
            bn, gz = bwd[orig]
            new, param = made[bn]
            ins = [rw.get(bn.inputs[0]), rw.get(gz), new[2], new[3], rw.get(bn.inputs[1]),
                   new[4]]  # fmt: skip
            cfg = OperatorNodeConfig(comp_node=bn.comp_node)
            return graph.insert_opr(BatchNormTailBackward(ins, param, cfg))
        return None

    if not fwd:
        return {}
    return rw.apply(rule, "BatchNorm and its activation fused")
