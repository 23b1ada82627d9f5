"""Reductions: ReduceSum/Mean/Max/Min/Prod/L1/L2/LogSum/LogSumExp/SumSquare, ArgMax/ArgMin."""

from __future__ import annotations

import numpy as np

import megbrain as mgb

from .ops_tensor import _norm_axis, _reshape, static_shape
from .registry import Attr, converter

E = mgb.opr.elemwise

#: op type -> (pre-map, reduce mode, post-map)
_REDUCE = {
    "ReduceSum": (None, "SUM", None),
    "ReduceMean": (None, "MEAN", None),
    "ReduceMax": (None, "MAX", None),
    "ReduceMin": (None, "MIN", None),
    "ReduceProd": (None, "PRODUCT", None),
    "ReduceSumSquare": ("SQUARE", "SUM", None),
    "ReduceL1": ("ABS", "SUM", None),
    "ReduceL2": ("SQUARE", "SUM", "SQRT"),
    "ReduceLogSum": (None, "SUM", "LOG"),
    "ReduceLogSumExp": ("EXP", "SUM", "LOG"),
}

#: first opset whose reduction takes ``axes`` as an input
_AXES_INPUT_SINCE = {"ReduceSum": 13}


def _reduce(ctx):
    x = ctx.input(0)
    src = static_shape(ctx, x)
    nd = len(src)
    if ctx.opset >= _AXES_INPUT_SINCE.get(ctx.node.op_type, 18):
        axes = ctx.const(1, "axes").ravel().tolist() if ctx.has(1) else []
        if not axes and ctx.attr("noop_with_empty_axes"):
            return mgb.opr.identity(x)
    else:
        axes = list(ctx.attr("axes") or [])
    axes = sorted({_norm_axis(ctx, a, nd) for a in axes}) if axes else list(range(nd))
    if any(src[a] == 0 for a in axes) or 0 in src:
        raise ctx.fail(f"reducing an empty tensor of shape {src} is not supported")
    pre, mode, post = _REDUCE[ctx.node.op_type]
    y = x
    lse_max = None
    if ctx.node.op_type == "ReduceLogSumExp":
        lse_max = y
        for a in axes:
            lse_max = mgb.opr.reduce_(lse_max, "MAX", a, True)
        y = E(y, lse_max, mode="SUB")
    if pre == "SQUARE":
        y = E(y, y, mode="MUL")
    elif pre:
        y = E(y, mode=pre)
    if nd == 0:
        y = mgb.opr.identity(y)
    for a in axes:
        y = mgb.opr.reduce_(y, mode, a, True)
    if post == "SQRT":
        y = E(y, ctx.imm(np.asarray(0.5, np.dtype(y.dtype))), mode="POW")
    elif post:
        y = E(y, mode=post)
    if lse_max is not None:
        y = E(y, lse_max, mode="ADD")
    if ctx.attr("keepdims"):
        return y
    return _reshape(y, [d for i, d in enumerate(src) if i not in axes])


converter(list(_REDUCE), 1, attrs={"axes": None, "keepdims": 1, "noop_with_empty_axes": 0})(_reduce)


def _arg(ctx):
    x = ctx.input(0)
    src = static_shape(ctx, x)
    axis = _norm_axis(ctx, ctx.attr("axis"), len(src))
    fn = mgb.opr.argmax if ctx.node.op_type == "ArgMax" else mgb.opr.argmin
    n = src[axis]
    if ctx.attr("select_last_index"):
        flipped = x[(slice(None),) * axis + (slice(None, None, -1),)]
        idx = fn(flipped, axis, True)
        idx = E(ctx.imm(np.int32(n - 1)), idx, mode="SUB")
    else:
        idx = fn(x, axis, True)
    if not ctx.attr("keepdims"):
        idx = _reshape(idx, src[:axis] + src[axis + 1 :])
    return idx


converter(
    ["ArgMax", "ArgMin"],
    1,
    attrs={"axis": 0, "keepdims": 1, "select_last_index": Attr(0, frozenset({0, 1}))},
)(_arg)
