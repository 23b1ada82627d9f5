"""Element-wise ONNX operators: arithmetic, activations, comparisons, logic, Cast, Where."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

import megbrain as mgb

from .loader import onnx_to_np_dtype
from .registry import Attr, converter

E = mgb.opr.elemwise


def _is_int(var) -> bool:
    return np.dtype(var.dtype).kind in "iu"


def _f(ctx, value, like):
    """A scalar constant with ``like``'s dtype."""
    return ctx.imm(np.asarray(value, dtype=np.dtype(like.dtype)))


def _cast(var, dt):
    return var if np.dtype(var.dtype) == np.dtype(dt) else mgb.opr.typecvt(var, dt)


def _bool(var):
    """0/1 int32 from any 0/1 var (comparisons give the operands' dtype)."""
    return _cast(var, np.int32)


_UNARY = {
    "Abs": "ABS",
    "Neg": "NEGATE",
    "Exp": "EXP",
    "Log": "LOG",
    "Relu": "RELU",
    "Sigmoid": "SIGMOID",
    "Tanh": "TANH",
    "Erf": "ERF",
    "Floor": "FLOOR",
    "Ceil": "CEIL",
    "Sin": "SIN",
    "Cos": "COS",
    "Asin": "ASIN",
    "Acos": "ACOS",
}


def _unary(ctx):
    x = ctx.input(0)
    mode = _UNARY[ctx.node.op_type]
    if mode in ("FLOOR", "CEIL") and _is_int(x):
        return x
    if mode == "ABS" or mode == "NEGATE" or mode == "RELU":
        return E(x, mode=mode)
    if _is_int(x):
        raise ctx.fail(f"integer input {x.dtype} is not supported")
    return E(x, mode=mode)


converter(list(_UNARY), 6)(_unary)


@converter("Sqrt", 6)
def _sqrt(ctx):
    return E(ctx.input(0), _f(ctx, 0.5, ctx.input(0)), mode="POW")


# x against the constant 1: op type -> (first opset, mode, the constant on the left)
_WITH_ONE = {
    "Reciprocal": (6, "TRUE_DIV", True),
    "Atan": (7, "ATAN2", False),
    "Not": (1, "SUB", True),
}


def _with_one(ctx):
    _, mode, one_first = _WITH_ONE[ctx.node.op_type]
    x = ctx.input(0)
    one = _f(ctx, 1, x)
    return E(one, x, mode=mode) if one_first else E(x, one, mode=mode)


for _op, (_since, _, _) in _WITH_ONE.items():
    converter(_op, _since)(_with_one)


@converter("Tan", 7)
def _tan(ctx):
    x = ctx.input(0)
    return E(E(x, mode="SIN"), E(x, mode="COS"), mode="TRUE_DIV")


@converter("Sign", 9)
def _sign(ctx):
    x = ctx.input(0)
    z = _f(ctx, 0, x)
    return E(E(z, x, mode="LT"), E(x, z, mode="LT"), mode="SUB")


@converter("Round", 11)
def _round(ctx):
    return round_half_even(ctx, ctx.input(0))


def round_half_even(ctx, x):
    """``x`` rounded to the nearest integer, ties to even (NumPy's ``rint``)."""
    # floor(x + .5), minus one where x sat exactly half-way and that is odd
    r = E(E(x, _f(ctx, 0.5, x), mode="ADD"), mode="FLOOR")
    tie = E(E(r, x, mode="SUB"), _f(ctx, 0.5, x), mode="EQ")
    odd = E(E(r, _f(ctx, 2, x), mode="MOD"), mode="ABS")
    return E(r, E(tie, odd, mode="MUL"), mode="SUB")


@converter("Softplus", 1)
def _softplus(ctx):
    x = ctx.input(0)
    return E(E(x, mode="EXP"), mode="LOG1P")


@converter("Softsign", 1)
def _softsign(ctx):
    x = ctx.input(0)
    return E(x, E(_f(ctx, 1, x), E(x, mode="ABS"), mode="ADD"), mode="TRUE_DIV")


@converter("LeakyRelu", 6, attrs={"alpha": 0.01})
def _leaky_relu(ctx):
    x = ctx.input(0)
    a = ctx.attr("alpha")
    neg = E(E(_f(ctx, 0, x), x, mode="MIN"), _f(ctx, a, x), mode="MUL")
    return E(E(x, mode="RELU"), neg, mode="ADD")


@converter("PRelu", 7)
def _prelu(ctx):
    x, slope = ctx.input(0), ctx.input(1)
    neg = E(E(_f(ctx, 0, x), x, mode="MIN"), slope, mode="MUL")
    return E(E(x, mode="RELU"), neg, mode="ADD")


@converter("ThresholdedRelu", 10, attrs={"alpha": 1.0})
def _thresholded_relu(ctx):
    x = ctx.input(0)
    return E(E(_f(ctx, ctx.attr("alpha"), x), x, mode="LT"), x, mode="MUL")


def _elu_like(ctx, x, alpha, scale=1.0):
    z = _f(ctx, 0, x)
    neg = E(E(E(x, z, mode="MIN"), mode="EXPM1"), _f(ctx, alpha, x), mode="MUL")
    out = E(E(x, mode="RELU"), neg, mode="ADD")
    return out if scale == 1.0 else E(out, _f(ctx, scale, x), mode="MUL")


@converter("Elu", 6, attrs={"alpha": 1.0})
def _elu(ctx):
    return _elu_like(ctx, ctx.input(0), ctx.attr("alpha"))


@converter("Celu", 12, attrs={"alpha": 1.0})
def _celu(ctx):
    x = ctx.input(0)
    a = ctx.attr("alpha")
    neg = E(E(E(x, _f(ctx, 0, x), mode="MIN"), _f(ctx, a, x), mode="TRUE_DIV"), mode="EXPM1")
    return E(E(x, mode="RELU"), E(neg, _f(ctx, a, x), mode="MUL"), mode="ADD")


@converter(
    "Selu", 6, attrs={"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875}
)
def _selu(ctx):
    return _elu_like(ctx, ctx.input(0), ctx.attr("alpha"), ctx.attr("gamma"))


@converter("HardSigmoid", 6, attrs={"alpha": 0.2, "beta": 0.5})
def _hard_sigmoid(ctx):
    x = ctx.input(0)
    y = E(E(x, _f(ctx, ctx.attr("alpha"), x), mode="MUL"), _f(ctx, ctx.attr("beta"), x), mode="ADD")
    return E(E(y, _f(ctx, 0, x), mode="MAX"), _f(ctx, 1, x), mode="MIN")


@converter("HardSwish", 14)
def _hard_swish(ctx):
    return E(ctx.input(0), mode="H_SWISH")


@converter("Mish", 18)
def _mish(ctx):
    x = ctx.input(0)
    return E(x, E(E(E(x, mode="EXP"), mode="LOG1P"), mode="TANH"), mode="MUL")


@converter("Gelu", 20, attrs={"approximate": Attr("none", frozenset({"none", "tanh"}))})
def _gelu(ctx):
    x = ctx.input(0)
    c = lambda v: _f(ctx, v, x)  # noqa: E731
    if ctx.attr("approximate") == "tanh":
        x3 = E(E(x, x, mode="MUL"), x, mode="MUL")
        inner = E(
            E(x, E(x3, c(0.044715), mode="MUL"), mode="ADD"), c(np.sqrt(2 / np.pi)), mode="MUL"
        )
        t = E(c(1), E(inner, mode="TANH"), mode="ADD")
    else:
        t = E(c(1), E(E(x, c(1 / np.sqrt(2)), mode="MUL"), mode="ERF"), mode="ADD")
    return E(E(x, t, mode="MUL"), c(0.5), mode="MUL")


@converter(
    "Clip",
    6,
    10,
    attrs={"min": float(np.finfo(np.float32).min), "max": float(np.finfo(np.float32).max)},
)
def _clip6(ctx):
    x = ctx.input(0)
    y = E(x, _f(ctx, ctx.attr("min"), x), mode="MAX")
    return E(y, _f(ctx, ctx.attr("max"), x), mode="MIN")


@converter("Clip", 11)
def _clip11(ctx):
    x = ctx.input(0)
    if ctx.has(1):
        x = E(x, ctx.input(1), mode="MAX")
    if ctx.has(2):
        x = E(x, ctx.input(2), mode="MIN")
    return x


# one elemwise mode each; And/Or act on 0/1 bools
_BINARY = {"Add": "ADD", "Sub": "SUB", "Mul": "MUL", "And": "MUL", "Or": "MAX"}


def _binary(ctx):
    return E(ctx.input(0), ctx.input(1), mode=_BINARY[ctx.node.op_type])


converter(list(_BINARY), 7)(_binary)


def _trunc_div(a, b):
    # integer division rounding toward zero: (a - fmod(a, b)) / b is exact
    return E(E(a, E(a, b, mode="MOD"), mode="SUB"), b, mode="FLOOR_DIV")


@converter("Div", 7)
def _div(ctx):
    a, b = ctx.input(0), ctx.input(1)
    if _is_int(a):
        return _trunc_div(a, b)
    return E(a, b, mode="TRUE_DIV")


@converter("Pow", 7)
def _pow(ctx):
    a, b = ctx.input(0), ctx.input(1)
    out = E(
        _cast(a, np.float32) if _is_int(a) else a,
        _cast(b, a.dtype) if not _is_int(a) else _cast(b, np.float32),
        mode="POW",
    )
    return _cast(out, a.dtype)


@converter("Mod", 10, attrs={"fmod": Attr(0, frozenset({0, 1}))})
def _mod(ctx):
    a, b = ctx.input(0), ctx.input(1)
    r = E(a, b, mode="MOD")
    if ctx.attr("fmod") == 1:
        return r
    # Python-style: the remainder takes the divisor's sign
    wrong_sign = E(E(r, b, mode="MUL"), _f(ctx, 0, r), mode="LT")
    # a select for floats: an infinite divisor must not turn 0 * inf into nan
    fix = E(wrong_sign, b, mode="MUL" if _is_int(r) else "SWITCH_GT0")
    return E(r, fix, mode="ADD")


def _variadic(mode):
    def conv(ctx):
        vs = [v for v in ctx.inputs if v is not None]
        out = vs[0]
        for v in vs[1:]:
            out = E(out, v, mode=mode)
        if ctx.node.op_type == "Mean":
            out = E(out, _f(ctx, len(vs), out), mode="TRUE_DIV")
        elif len(vs) == 1:
            out = mgb.opr.identity(out)
        return out

    return conv


converter("Max", 8)(_variadic("MAX"))
converter("Min", 8)(_variadic("MIN"))
converter("Sum", 8)(_variadic("ADD"))
converter("Mean", 8)(_variadic("ADD"))


def _cmp(ctx, a, b, mode, swap=False):
    if swap:
        a, b = b, a
    return _bool(E(a, b, mode=mode))


# op type -> (first opset, mode, swap the operands): Greater(a, b) is Less(b, a)
_COMPARE = {
    "Equal": (7, "EQ", False),
    "Less": (7, "LT", False),
    "Greater": (7, "LT", True),
    "LessOrEqual": (12, "LEQ", False),
    "GreaterOrEqual": (12, "LEQ", True),
}


def _compare(ctx):
    _, mode, swap = _COMPARE[ctx.node.op_type]
    return _cmp(ctx, ctx.input(0), ctx.input(1), mode, swap=swap)


for _op, (_since, _, _) in _COMPARE.items():
    converter(_op, _since)(_compare)


@converter("Xor", 7)
def _xor(ctx):
    return E(E(ctx.input(0), ctx.input(1), mode="SUB"), mode="ABS")


@converter("Where", 9)
def _where(ctx):
    c, a, b = ctx.inputs
    if np.dtype(a.dtype).kind not in "iub":
        # selects exactly (no arithmetic on the unselected branch's inf/nan)
        cf = _cast(c, a.dtype)
        pa = E(cf, a, mode="SWITCH_GT0")
        pb = E(E(_f(ctx, 1, cf), cf, mode="SUB"), b, mode="SWITCH_GT0")
        return E(pa, pb, mode="ADD")
    ci = _cast(c, a.dtype)
    return E(E(ci, a, mode="MUL"), E(E(_f(ctx, 1, ci), ci, mode="SUB"), b, mode="MUL"), mode="ADD")


def _check_cast(attrs, in_types, where):
    onnx_to_np_dtype(attrs["to"], where=f"{where}, attribute to")


@converter("Cast", 6, attrs={"to": Attr(None), "saturate": Attr(1)}, validate=_check_cast)
def _cast_op(ctx):
    x = ctx.input(0)
    to = ctx.attr("to")
    if to == TensorProto.BOOL:
        return _bool(E(_f(ctx, 1, x), E(x, _f(ctx, 0, x), mode="EQ"), mode="SUB"))
    dt = onnx_to_np_dtype(to)
    if np.dtype(x.dtype) == dt:
        return mgb.opr.identity(x)
    return mgb.opr.typecvt(x, dt)


@converter("CastLike", 15, attrs={"saturate": Attr(1)})
def _cast_like(ctx):
    x, like = ctx.input(0), ctx.input(1)
    if ctx.in_type(1) == TensorProto.BOOL:
        return _bool(E(_f(ctx, 1, x), E(x, _f(ctx, 0, x), mode="EQ"), mode="SUB"))
    return _cast(x, like.dtype)


def _sqrt_of(ctx, v):
    return E(v, _f(ctx, 0.5, v), mode="POW")


@converter("Sinh", 9)
def _sinh(ctx):
    x = ctx.input(0)
    d = E(E(x, mode="EXP"), E(E(x, mode="NEGATE"), mode="EXP"), mode="SUB")
    return E(d, _f(ctx, 0.5, x), mode="MUL")


@converter("Cosh", 9)
def _cosh(ctx):
    x = ctx.input(0)
    d = E(E(x, mode="EXP"), E(E(x, mode="NEGATE"), mode="EXP"), mode="ADD")
    return E(d, _f(ctx, 0.5, x), mode="MUL")


@converter("Asinh", 9)
def _asinh(ctx):
    x = ctx.input(0)
    r = _sqrt_of(ctx, E(E(x, x, mode="MUL"), _f(ctx, 1, x), mode="ADD"))
    return E(E(x, r, mode="ADD"), mode="LOG")


@converter("Acosh", 9)
def _acosh(ctx):
    x = ctx.input(0)
    r = _sqrt_of(ctx, E(E(x, x, mode="MUL"), _f(ctx, 1, x), mode="SUB"))
    return E(E(x, r, mode="ADD"), mode="LOG")


@converter("Atanh", 9)
def _atanh(ctx):
    x = ctx.input(0)
    one = _f(ctx, 1, x)
    q = E(E(one, x, mode="ADD"), E(one, x, mode="SUB"), mode="TRUE_DIV")
    return E(E(q, mode="LOG"), _f(ctx, 0.5, x), mode="MUL")


@converter("Swish", 24, attrs={"alpha": 1.0})
def _swish(ctx):
    x = ctx.input(0)
    return E(x, E(E(x, _f(ctx, ctx.attr("alpha"), x), mode="MUL"), mode="SIGMOID"), mode="MUL")


@converter("Shrink", 9, attrs={"bias": 0.0, "lambd": 0.5})
def _shrink(ctx):
    x = ctx.input(0)
    lam, bias = _f(ctx, ctx.attr("lambd"), x), _f(ctx, ctx.attr("bias"), x)
    neg_lam = _f(ctx, -ctx.attr("lambd"), x)
    hi = E(E(lam, x, mode="LT"), E(x, bias, mode="SUB"), mode="MUL")
    lo = E(E(x, neg_lam, mode="LT"), E(x, bias, mode="ADD"), mode="MUL")
    return E(hi, lo, mode="ADD")


@converter("IsNaN", 9)
def _isnan(ctx):
    x = ctx.input(0)
    return _bool(E(_f(ctx, 1, x), E(x, x, mode="EQ"), mode="SUB"))


@converter("IsInf", 10, attrs={"detect_negative": 1, "detect_positive": 1})
def _isinf(ctx):
    x = ctx.input(0)
    out = None
    for flag, v in (("detect_positive", np.inf), ("detect_negative", -np.inf)):
        if ctx.attr(flag):
            t = E(x, _f(ctx, v, x), mode="EQ")
            out = t if out is None else E(out, t, mode="ADD")
    return _bool(out if out is not None else E(x, _f(ctx, 0, x), mode="MUL"))


@converter("SwiGLU", 28, attrs={"alpha": 1.0})
def _swiglu(ctx):
    a, b = ctx.input(0), ctx.input(1)
    if a.imm_shape != b.imm_shape:
        raise ctx.fail(f"A {a.imm_shape} and B {b.imm_shape} must have one shape (no broadcast)")
    gate = E(E(a, _f(ctx, ctx.attr("alpha"), a), mode="MUL"), mode="SIGMOID")
    return E(E(a, gate, mode="MUL"), b, mode="MUL")


#: bit widths of the ONNX integer types (INT64 is held as int32 but shifts as 64 bits)
_BITS = {
    TensorProto.INT8: 8,
    TensorProto.UINT8: 8,
    TensorProto.INT16: 16,
    TensorProto.INT32: 32,
    TensorProto.INT64: 64,
}
_SIGNED = {TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64}


def _check_int_types(attrs, in_types, where):
    from .registry import ONNXConversionError

    for t in in_types[:1]:
        if t and t not in _BITS:
            raise ONNXConversionError(
                f"{where}: {TensorProto.DataType.Name(t)} is not supported (INT8, UINT8, INT16,"
                " INT32, INT64 are)"
            )


@converter(
    "BitShift",
    11,
    attrs={"direction": Attr(None, frozenset({"LEFT", "RIGHT"}))},
    validate=_check_int_types,
)
def _bit_shift(ctx):
    # shifts of 0 .. width - 1 as SHL/SHR in int32 (wrapped back to the type's width); other
    # amounts give 0, or -1 for a negative value shifted right
    a, b = ctx.input(0), ctx.input(1)
    t = ctx.in_type(0) or TensorProto.INT32
    bits, signed = _BITS[t], t in _SIGNED
    dt = np.dtype(a.dtype)
    a32, b32 = _cast(a, np.int32), _cast(b, np.int32)
    zero, one = ctx.imm(np.int32(0)), ctx.imm(np.int32(1))
    valid = E(
        E(E(b32, zero, mode="LT"), E(ctx.imm(np.int32(bits - 1)), b32, mode="LT"), mode="ADD"),
        zero,
        mode="EQ",
    )
    amount = E(E(b32, zero, mode="MAX"), ctx.imm(np.int32(min(bits, 32) - 1)), mode="MIN")
    if ctx.attr("direction") == "LEFT":
        shifted = E(a32, amount, mode="SHL")
        fill = zero
    else:
        shifted = E(a32, amount, mode="SHR")
        fill = E(zero, E(a32, zero, mode="LT"), mode="SUB") if signed else zero
    if bits >= 32:
        # shifts of 32 .. 63 (INT64) leave nothing of an int32-held value but its sign
        big = E(ctx.imm(np.int32(31)), b32, mode="LT")
        shifted = E(E(one, big, mode="SUB"), shifted, mode="MUL")
        if ctx.attr("direction") == "RIGHT" and signed:
            shifted = E(shifted, E(big, fill, mode="MUL"), mode="ADD")
    y = E(E(valid, shifted, mode="MUL"), E(E(one, valid, mode="SUB"), fill, mode="MUL"), mode="ADD")
    return _cast(y, dt) if dt != np.int32 else y


@converter("BitwiseNot", 18, validate=_check_int_types)
def _bitwise_not(ctx):
    x = ctx.input(0)
    t = ctx.in_type(0)
    if t == TensorProto.UINT8:
        return E(_f(ctx, 255, x), x, mode="SUB")
    return E(E(_f(ctx, 0, x), x, mode="SUB"), _f(ctx, 1, x), mode="SUB")


def _bitwise(ctx, combine):
    # bit by bit in int32: bit k is (x >> k) - 2 * (x >> (k + 1)); the bits are combined
    # arithmetically and summed back with weights 2^k (the top bit of a signed type weighs
    # -2^(width - 1), two's complement)
    a, b = ctx.input(0), ctx.input(1)
    t = ctx.in_type(0) or TensorProto.INT32
    bits, signed = min(_BITS[t], 32), t in _SIGNED
    dt = np.dtype(a.dtype)
    a32, b32 = _cast(a, np.int32), _cast(b, np.int32)

    def bit(x, k):
        hi = E(x, ctx.imm(np.int32(k + 1)), mode="SHR")
        lo = E(x, ctx.imm(np.int32(k)), mode="SHR") if k else x
        return E(lo, E(hi, ctx.imm(np.int32(2)), mode="MUL"), mode="SUB")

    acc = None
    for k in range(bits):
        ba, bb = bit(a32, k), bit(b32, k)
        both = E(ba, bb, mode="MUL")
        if combine == "and":
            r = both
        elif combine == "or":
            r = E(E(ba, bb, mode="ADD"), both, mode="SUB")
        else:
            r = E(E(ba, bb, mode="ADD"), E(both, ctx.imm(np.int32(2)), mode="MUL"), mode="SUB")
        weight = -(1 << (bits - 1)) if signed and k == bits - 1 else 1 << k
        term = E(r, ctx.imm(np.int32(weight)), mode="MUL") if weight != 1 else r
        acc = term if acc is None else E(acc, term, mode="ADD")
    return _cast(acc, dt) if dt != np.int32 else acc


@converter("BitwiseAnd", 18, validate=_check_int_types)
def _bitwise_and(ctx):
    return _bitwise(ctx, "and")


@converter("BitwiseOr", 18, validate=_check_int_types)
def _bitwise_or(ctx):
    return _bitwise(ctx, "or")


@converter("BitwiseXor", 18, validate=_check_int_types)
def _bitwise_xor(ctx):
    return _bitwise(ctx, "xor")
