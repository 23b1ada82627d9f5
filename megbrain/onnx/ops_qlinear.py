"""ONNX's integer-arithmetic quantized operators (QLinearConv, QLinearMatMul, ConvInteger,
MatMulInteger, DynamicQuantizeLinear) on megbrain's quantized Convolution, ConvBias and
MatrixMul, with the requantize written the ONNX way (float32 multiplier, half to even)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

import megbrain as mgb
from megbrain.dtype import same_dtype

from .ops_elemwise import round_half_even
from .ops_nn import _CONV_ATTRS, _conv_common, _explicit_pad, conv_operands, matmul_vars
from .ops_tensor import _reshape, static_shape
from .registry import converter

E = mgb.opr.elemwise
_F32 = np.float32
_I32 = np.dtype(np.int32)
_RANGES = {np.dtype(np.uint8): (0, 255), np.dtype(np.int8): (-128, 127)}
_ONNX_8BIT = {TensorProto.UINT8, TensorProto.INT8}
#: scales (read at load, used as float32) and biases
_OTHER_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT32}


def _check_8bit(attrs, in_types, where):
    from .registry import ONNXConversionError

    for t in in_types:
        if t and t not in _ONNX_8BIT and t not in _OTHER_TYPES:
            raise ONNXConversionError(
                f"{where}: type {TensorProto.DataType.Name(t)} is not supported (UINT8, INT8 are)"
            )


def _scale(ctx, i, what) -> np.ndarray:
    """Scale input ``i`` as a flat float32 vector (one entry per tensor or per channel)."""
    return ctx.const(i, what).astype(_F32).reshape(-1)


def _zero_point(ctx, i, what, per_channel=False):
    """Zero point input ``i`` (0 when absent) as an int; with ``per_channel``, differing
    per-channel values come back as an int64 vector."""
    if not ctx.has(i):
        return 0
    z = ctx.const(i, what).reshape(-1).astype(np.int64)
    if z.size and not (z == z[0]).all():
        if per_channel:
            return z
        raise ctx.fail(
            f"per-channel {what} with differing values is not supported (megbrain's quantized"
            " dtypes have one zero point per tensor)"
        )
    return int(z[0]) if z.size else 0


def _asymm(x, zx, w, zw) -> bool:
    """Whether the operands go as Quantized8Asymm (QuantizedS8 holds int8 without zero point;
    the two operands of one operator must be of one kind)."""
    signed = np.dtype(x.dtype) == np.int8 and np.dtype(w.dtype) == np.int8
    return not (signed and zx == 0 and zw == 0)


def _shifted(x, zp):
    """``x - zp`` in float32 (exact: 8-bit values)."""
    d = mgb.opr.typecvt(x, _F32)
    return E(d, _F32(zp), mode="SUB") if zp else d


def _quantized(d, x, zp, asymm):
    """``d = x - zp`` as a quantized var of scale 1 holding ``x``'s integers: QuantizedS8, or
    Quantized8Asymm (int8 moved up by 128 with its zero point, which leaves ``x - zp``)."""
    if not asymm:
        return mgb.opr.typecvt(d, mgb.dtype.qint8(1.0))
    shift = 128 if np.dtype(x.dtype) == np.int8 else 0
    return mgb.opr.typecvt(d, mgb.dtype.quint8(1.0, zp + shift))


def _int32(acc):
    """The int32 sums of a QuantizedS32(1) var (through float32: exact up to 2**24)."""
    return acc if same_dtype(acc.dtype, _I32) else mgb.opr.typecvt(acc, _I32)


def _requantize(ctx, acc, mult, zp, out_dtype, axis):
    """onnxruntime's requantize of int32 sums: ``float32(acc) * mult`` (per tensor or along
    ``axis``), saturated, rounded half to even, plus the output zero point."""
    f = mgb.opr.typecvt(acc, _F32)  # QuantizedS32 of scale 1 or int32: float32(acc)
    if mult.size == 1:
        m = ctx.imm(mult.reshape(()))
    else:
        nd = len(static_shape(ctx, acc))
        m = ctx.imm(mult.reshape([mult.size if i == axis % nd else 1 for i in range(nd)]))
    lo, hi = _RANGES[np.dtype(out_dtype)]
    v = E(E(E(f, m, mode="MUL"), _F32(lo - zp), mode="MAX"), _F32(hi - zp), mode="MIN")
    v = round_half_even(ctx, v)
    if zp:
        v = E(v, _F32(zp), mode="ADD")
    return mgb.opr.typecvt(v, out_dtype)


def _conv_sums(ctx, x, zx, w, zw, bias=None):
    """Exact int32 sums of the ONNX convolution of ``x - zx`` by ``w - zw`` (plus an int32
    ``bias``): a quantized Convolution, or ConvBias with a bias, into QuantizedS32(1).

    Per-channel filter zero points ``zw`` (a vector) are subtracted after the sums, as
    ``zw[c] * (window sums of x - zx)`` in int32 (a second convolution by ones).
    """
    ws = static_shape(ctx, w, "weight")
    _src, n, strides, dil, pads = _conv_common(ctx, x, ws[2:])
    if n not in (1, 2):
        raise ctx.fail(f"{n}-d quantized convolution is not supported (1-d and 2-d are)")
    zw_vec = zw if isinstance(zw, np.ndarray) else None
    zw = 0 if zw_vec is not None else zw
    asymm = zw_vec is not None or _asymm(x, zx, w, zw)
    d, sym = _explicit_pad(ctx, _shifted(x, zx), pads)  # the padding is the zero point
    xq = _quantized(d, x, zx, asymm)
    wq = _quantized(_shifted(w, zw), w, zw, asymm)
    xq, wq, kw = conv_operands(ctx, xq, wq, ws, strides, dil, sym)
    ws = ws + (1,) * (4 - len(ws))
    acc_dt = mgb.dtype.qint32(1.0)
    if bias is None:
        y = mgb.opr.convolution(xq, wq, dtype=acc_dt, **kw)
    else:
        b = np.ascontiguousarray(bias.astype(np.int32).reshape(1, -1, 1, 1))
        bv = ctx.imm(b.view(acc_dt), acc_dt)
        y = mgb.opr.conv_bias_activation(xq, wq, bv, dtype=acc_dt, **kw)
    if zw_vec is not None:
        y = _minus_window_sums(ctx, y, xq, ws, zw_vec, kw)
    if n == 1:
        y = _reshape(y, static_shape(ctx, y)[:3])
    return y


def _minus_window_sums(ctx, y, xq, ws, zw, kw):
    """``y - zw[c] * sum(x - zx over c's window)`` in int32, for per-channel zero points."""
    g = ctx.attr("group")
    oc, icg = ws[0], ws[1]
    if zw.size != oc:
        raise ctx.fail(f"w_zero_point has {zw.size} values for {oc} output channels")
    ones = np.ones((g, 1, icg) + tuple(ws[2:]), np.uint8).view(mgb.dtype.quint8(1.0, 0))
    kw = {**kw, "sparse": "GROUP"}
    sums = _int32(mgb.opr.convolution(xq, ctx.imm(ones, ones.dtype), dtype=y.dtype, **kw))
    nb, _, oh, ow = static_shape(ctx, sums)
    zv = ctx.imm(zw.astype(np.int32).reshape(1, g, oc // g, 1, 1))
    corr = E(_reshape(sums, (nb, g, 1, oh, ow)), zv, mode="MUL")
    return E(_int32(y), _reshape(corr, (nb, oc, oh, ow)), mode="SUB")


def _matmul_sums(ctx, a, za, b, zb):
    """Exact int32 sums of ``(a - za) @ (b - zb)`` (ONNX MatMul broadcasting), QuantizedS32(1)."""
    asymm = _asymm(a, za, b, zb)
    aq = _quantized(_shifted(a, za), a, za, asymm)
    bq = _quantized(_shifted(b, zb), b, zb, asymm)
    return matmul_vars(ctx, aq, bq)


@converter("QLinearConv", 10, attrs=_CONV_ATTRS, validate=_check_8bit)
def _qlinear_conv(ctx):
    x, w = ctx.input(0), ctx.input(3)
    xs, ws, ys = _scale(ctx, 1, "x_scale"), _scale(ctx, 4, "w_scale"), _scale(ctx, 6, "y_scale")
    zx, zw = _zero_point(ctx, 2, "x_zero_point"), _zero_point(ctx, 5, "w_zero_point", True)
    zy = _zero_point(ctx, 7, "y_zero_point")
    bias = ctx.const(8, "B") if ctx.has(8) else None
    acc = _conv_sums(ctx, x, zx, w, zw, bias)
    # onnxruntime's float32 multiplier: x_scale * w_scale[c] / y_scale
    mult = (xs[0] * ws) / ys[0]
    return _requantize(ctx, acc, mult, zy, np.dtype(ctx.input(7).dtype), 1)


@converter("QLinearMatMul", 10, validate=_check_8bit)
def _qlinear_matmul(ctx):
    a, b = ctx.input(0), ctx.input(3)
    sa, sb, sy = _scale(ctx, 1, "a_scale"), _scale(ctx, 4, "b_scale"), _scale(ctx, 6, "y_scale")
    za, zb = _zero_point(ctx, 2, "a_zero_point"), _zero_point(ctx, 5, "b_zero_point")
    zy = _zero_point(ctx, 7, "y_zero_point")
    if len(static_shape(ctx, b)) == 1 and sb.size > 1:
        raise ctx.fail("a per-column b_scale needs a 2-d or wider b")
    acc = _matmul_sums(ctx, a, za, b, zb)
    mult = (sa[0] * sb) / sy[0]
    return _requantize(ctx, acc, mult, zy, np.dtype(ctx.input(7).dtype), -1)


@converter("ConvInteger", 10, attrs=_CONV_ATTRS, validate=_check_8bit)
def _conv_integer(ctx):
    x, w = ctx.input(0), ctx.input(1)
    zx, zw = _zero_point(ctx, 2, "x_zero_point"), _zero_point(ctx, 3, "w_zero_point", True)
    return _int32(_conv_sums(ctx, x, zx, w, zw))


@converter("MatMulInteger", 10, validate=_check_8bit)
def _matmul_integer(ctx):
    a, b = ctx.input(0), ctx.input(1)
    za, zb = _zero_point(ctx, 2, "a_zero_point"), _zero_point(ctx, 3, "b_zero_point")
    return _int32(_matmul_sums(ctx, a, za, b, zb))


@converter("DynamicQuantizeLinear", 11)
def _dynamic_quantize(ctx):
    # the scale is a run-time value, so this stays float32 arithmetic (as ONNX defines it);
    # a constant input gives 1 as scale, as onnxruntime does
    x = ctx.input(0)
    zero = ctx.imm(_F32(0))
    hi = E(mgb.opr.reduce_(x, "MAX"), zero, mode="MAX")
    lo = E(mgb.opr.reduce_(x, "MIN"), zero, mode="MIN")
    span = E(hi, lo, mode="SUB")
    flat = E(span, zero, mode="EQ")
    scale = E(E(span, _F32(255), mode="TRUE_DIV"), flat, mode="ADD")  # 0 -> 1 (span is 0)
    zp = round_half_even(ctx, E(E(zero, E(lo, scale, mode="TRUE_DIV"), mode="SUB"),
                                _F32(0), mode="MAX"))  # fmt: skip
    zp = E(zp, _F32(255), mode="MIN")
    y = E(round_half_even(ctx, E(x, scale, mode="TRUE_DIV")), zp, mode="ADD")
    y = E(E(y, _F32(0), mode="MAX"), _F32(255), mode="MIN")
    u8 = np.dtype(np.uint8)
    return (mgb.opr.typecvt(y, u8), ctx.as_shape(scale, (), 1),
            ctx.as_shape(mgb.opr.typecvt(zp, u8), (), 2))  # fmt: skip
