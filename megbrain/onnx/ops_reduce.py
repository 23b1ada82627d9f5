"""Reductions: ReduceSum/Mean/Max/Min/Prod/L1/L2/LogSum/LogSumExp/SumSquare, ArgMax/ArgMin."""

from __future__ import annotations

import numpy as np
import onnx

import megbrain as mgb

from .ops_nn import _global_reduce
from .ops_tensor import _norm_axis, static_shape
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


#: the value a reduction of an empty set gives (the identity of its combining operation)
_EMPTY_VALUE = {
    "ReduceSum": 0.0,
    "ReduceSumSquare": 0.0,
    "ReduceL1": 0.0,
    "ReduceL2": 0.0,
    "ReduceProd": 1.0,
    "ReduceMax": -np.inf,
    "ReduceMin": np.inf,
    "ReduceLogSum": -np.inf,
    "ReduceLogSumExp": -np.inf,
    "ReduceMean": np.nan,
}


def _int_range(dt):
    info = np.iinfo(dt)
    return int(info.min), int(info.max)


def _empty_reduce(ctx, x, src, axes):
    """A reduction of a statically empty tensor: a constant of the output shape.

    The reduced axes hold no element, so each output is the identity of the combining
    operation (0 for sums, 1 for products, -inf for max and the log-sums, +inf for min); for
    integer dtypes the infinities are the dtype's extremes.  An output with a zero-length
    kept axis is itself empty.
    """
    keep = ctx.attr("keepdims")
    out = [1 if i in axes else d for i, d in enumerate(src) if keep or i not in axes]
    dt = np.dtype(x.dtype)
    value = _EMPTY_VALUE[ctx.node.op_type]
    if dt.kind in "iub" and not np.isfinite(value):
        if np.isnan(value):
            raise ctx.fail(f"the mean of an empty {dt} tensor of shape {src} is undefined")
        # booleans are held as int32 0/1: their extremes are False and True
        lo, hi = (0, 1) if ctx.in_type(0) == onnx.TensorProto.BOOL else _int_range(dt)
        value = lo if value < 0 else hi
    return ctx.imm(np.full(out, value, dt), dt)


def _reduce(ctx):
    x = ctx.input(0)
    src = static_shape(ctx, x)
    nd = len(src)
    if ctx.opset >= _AXES_INPUT_SINCE.get(ctx.node.op_type, 18):
        axes = ctx.const(1, "axes").ravel().tolist() if ctx.has(1) else []
        if not axes and ctx.attr("noop_with_empty_axes"):
            ctx.set_rank(nd)
            return mgb.opr.identity(x)
    else:
        axes = list(ctx.attr("axes") or [])
    axes = sorted({_norm_axis(ctx, a, nd) for a in axes}) if axes else list(range(nd))
    if 0 in src:
        return _empty_reduce(ctx, x, src, axes)
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
    if nd >= 4 and axes == list(range(2, nd)):
        # the spatial axes of (N, C, H, W): one reduction over the planes, as a global
        # pooling (MnasNet's head, ``x.mean([2, 3])``), which the NCHW88 pass keeps blocked;
        # one per axis took one pass over the tensor each
        y = _global_reduce(y, mode, tuple(src))
    else:
        for a in axes:
            y = mgb.opr.reduce_(y, mode, a, True)
    if post == "SQRT":
        y = E(y, ctx.imm(np.asarray(0.5, np.dtype(y.dtype))), mode="POW")
    elif post:
        y = E(y, mode=post)
    if lse_max is not None:
        y = E(y, lse_max, mode="ADD")
    if ctx.attr("keepdims"):
        return ctx.as_shape(y, [1 if i in axes else d for i, d in enumerate(src)])
    return ctx.as_shape(y, [d for i, d in enumerate(src) if i not in axes])


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
        return ctx.as_shape(idx, src[:axis] + src[axis + 1 :])
    return idx


converter(
    ["ArgMax", "ArgMin"],
    1,
    attrs={"axis": 0, "keepdims": 1, "select_last_index": Attr(0, frozenset({0, 1}))},
)(_arg)
