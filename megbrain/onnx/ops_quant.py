"""QuantizeLinear and DequantizeLinear for the 8- and 16-bit integer types megbrain has.

Scales and zero points are per tensor, per axis (a vector along ``axis``) or blocked (the
input's rank, each entry covering ``block_size`` elements along ``axis``); arithmetic is in
float32, rounding is half to even, and quantized values saturate to the target type's range.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

import megbrain as mgb

from .loader import onnx_to_np_dtype
from .ops_elemwise import round_half_even
from .ops_tensor import _norm_axis, _reshape, _take, static_shape
from .registry import Attr, converter

E = mgb.opr.elemwise

#: quantized ONNX types megbrain can hold, with their ranges
_RANGES = {
    TensorProto.UINT8: (0, 255),
    TensorProto.INT8: (-128, 127),
    TensorProto.INT16: (-32768, 32767),
}


def _f32(v):
    return v if np.dtype(v.dtype) == np.float32 else mgb.opr.typecvt(v, np.float32)


def _param(ctx, p, xshape, what):
    """Scale or zero point ``p`` shaped to broadcast against the input."""
    ps = static_shape(ctx, p, what)
    nd = len(xshape)
    if int(np.prod(ps)) == 1 and len(ps) <= 1:
        return p
    axis = _norm_axis(ctx, ctx.attr("axis"), nd)
    block = int(ctx.attr("block_size") or 0)
    if block <= 0:
        if len(ps) != 1 or ps[0] != xshape[axis]:
            raise ctx.fail(f"{what} of shape {ps} does not match axis {axis} of {xshape}")
        return _reshape(p, [xshape[axis] if i == axis else 1 for i in range(nd)])
    nb = -(-xshape[axis] // block)
    want = tuple(nb if i == axis else d for i, d in enumerate(xshape))
    if ps != want:
        raise ctx.fail(f"blocked {what} must have shape {want}, got {ps}")
    inter = list(want)
    inter.insert(axis + 1, 1)
    full = list(want)
    full.insert(axis + 1, block)
    merged = list(want)
    merged[axis] = nb * block
    rep = _reshape(mgb.opr.broadcast(_reshape(p, inter), full), merged)
    return _take(rep, axis, 0, xshape[axis]) if nb * block != xshape[axis] else rep


def _check_quant(attrs, in_types, where):
    from .registry import ONNXConversionError

    t = in_types[2] if len(in_types) > 2 and in_types[2] else attrs.get("output_dtype") or 0
    if t and t not in _RANGES:
        raise ONNXConversionError(
            f"{where}: quantized type {TensorProto.DataType.Name(t)} is not supported"
            " (UINT8, INT8, INT16 are)"
        )


def _check_dequant(attrs, in_types, where):
    from .registry import ONNXConversionError

    t = in_types[0] if in_types else 0
    if t and t not in _RANGES and t != TensorProto.INT32:
        raise ONNXConversionError(
            f"{where}: quantized type {TensorProto.DataType.Name(t)} is not supported"
            " (UINT8, INT8, INT16, INT32 are)"
        )


_Q_ATTRS = {
    "axis": 1,
    "block_size": 0,
    "output_dtype": 0,
    "saturate": Attr(1, frozenset({0, 1})),
    "precision": Attr(0, frozenset({0, TensorProto.FLOAT})),
}


@converter("QuantizeLinear", 10, attrs=_Q_ATTRS, validate=_check_quant)
def _quantize(ctx):
    x, scale = ctx.input(0), ctx.input(1)
    xs = static_shape(ctx, x)
    t = ctx.in_type(2) if ctx.has(2) else (ctx.attr("output_dtype") or TensorProto.UINT8)
    lo, hi = _RANGES[t]
    q = round_half_even(ctx, E(_f32(x), _f32(_param(ctx, scale, xs, "y_scale")), mode="TRUE_DIV"))
    if ctx.has(2):
        q = E(q, _f32(_param(ctx, ctx.input(2), xs, "y_zero_point")), mode="ADD")
    q = E(E(q, ctx.imm(np.float32(lo)), mode="MAX"), ctx.imm(np.float32(hi)), mode="MIN")
    return mgb.opr.typecvt(q, onnx_to_np_dtype(t))


@converter(
    "DequantizeLinear",
    10,
    attrs={"axis": 1, "block_size": 0, "output_dtype": 0},
    validate=_check_dequant,
)
def _dequantize(ctx):
    x, scale = ctx.input(0), ctx.input(1)
    xs = static_shape(ctx, x)
    d = _f32(x)
    if ctx.has(2):
        d = E(d, _f32(_param(ctx, ctx.input(2), xs, "x_zero_point")), mode="SUB")
    y = E(d, _f32(_param(ctx, scale, xs, "x_scale")), mode="MUL")
    out = ctx.attr("output_dtype")
    dt = onnx_to_np_dtype(out, where=ctx.where) if out else np.dtype(scale.dtype)
    return y if np.dtype(y.dtype) == dt else mgb.opr.typecvt(y, dt)
