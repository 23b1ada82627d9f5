"""Exporters of the elementwise family: Elemwise (every mode with an exact ONNX form),
JITExecutor (its fused expression, mode by mode), ElemwiseMultiType's fixed-point
multiply-adds, TypeCvt and Reduce."""

from __future__ import annotations

import math

import numpy as np

from ..dtype import is_quantize
from . import export_quant
from .export_base import Writer, exports, onnx_dtype, static_shape

_UNARY = {
    "RELU": "Relu",
    "ABS": "Abs",
    "ACOS": "Acos",
    "ASIN": "Asin",
    "CEIL": "Ceil",
    "COS": "Cos",
    "EXP": "Exp",
    "FLOOR": "Floor",
    "LOG": "Log",
    "NEGATE": "Neg",
    "SIGMOID": "Sigmoid",
    "SIN": "Sin",
    "TANH": "Tanh",
    "ERF": "Erf",
}
_BINARY = {
    "ADD": "Add",
    "SUB": "Sub",
    "MUL": "Mul",
    "TRUE_DIV": "Div",
    "POW": "Pow",
    "MAX": "Max",
    "MIN": "Min",
}
_COMPARE = {"LT": "Less", "LEQ": "LessOrEqual", "EQ": "Equal"}
_FUSED_ADD = {
    "FUSE_ADD_RELU": "RELU",
    "FUSE_ADD_SIGMOID": "SIGMOID",
    "FUSE_ADD_TANH": "TANH",
    "FUSE_ADD_H_SWISH": "H_SWISH",
}
#: Elemwise modes without an exact ONNX form, and why
REFUSED_MODES = {
    "ERFCINV": "ONNX has no inverse complementary error function, and below ~1e-7 a "
    "polynomial fit is not accurate enough",
}
_REDUCE = {
    "SUM": "ReduceSum",
    "MEAN": "ReduceMean",
    "MAX": "ReduceMax",
    "MIN": "ReduceMin",
    "PRODUCT": "ReduceProd",
    "SUM_SQR": "ReduceSumSquare",
}


def _k(w: Writer, value, dtype) -> str:
    return w.const(np.asarray(value, dtype=dtype), "k")


def _log1p(w, x, dt):
    # log1p(x) = x * log(u) / (u - 1) with u = 1 + x (exact where u == 1: x)
    u = w.node("Add", [x, _k(w, 1, dt)])
    um1 = w.node("Sub", [u, _k(w, 1, dt)])
    exact = w.node("Equal", [um1, _k(w, 0, dt)])
    den = w.node("Where", [exact, _k(w, 1, dt), um1])  # no 0 / 0 in the unused branch
    ratio = w.node("Div", [w.node("Mul", [x, w.node("Log", [u])]), den])
    return w.node("Where", [exact, x, ratio])


def _expm1(w, x, dt):
    # expm1(x) = 2 t / (1 - t), t = tanh(x / 2), near 0; exp(x) - 1 elsewhere
    t = w.node("Tanh", [w.node("Mul", [x, _k(w, 0.5, dt)])])
    small = w.node("Div", [w.node("Add", [t, t]), w.node("Sub", [_k(w, 1, dt), t])])
    big = w.node("Sub", [w.node("Exp", [x]), _k(w, 1, dt)])
    near = w.node("Less", [w.node("Abs", [x]), _k(w, 0.5, dt)])
    return w.node("Where", [near, small, big])


def _h_swish(w, x, dt):
    if w.opset >= 14:
        return w.node("HardSwish", [x])
    r6 = w.node("Clip", [w.node("Add", [x, _k(w, 3, dt)]), _k(w, 0, dt), _k(w, 6, dt)])
    return w.node("Mul", [w.node("Mul", [x, r6]), _k(w, 1 / 6, dt)])


#: Numerical Recipes' erfcc: erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z / 2), z >= 0, with a
#: fractional error below 1.2e-7 everywhere (float32's epsilon), where 1 - Erf loses the tail
_ERFC_P = (
    -1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806,
    0.27886807, -1.13520398, 1.48851587, -0.82215223, 0.17087277,
)  # fmt: skip


def _erfc(w, x, dt):
    z = w.node("Abs", [x])
    t = w.node("Reciprocal", [w.node("Add", [w.node("Mul", [z, _k(w, 0.5, dt)]), _k(w, 1, dt)])])
    poly = _k(w, _ERFC_P[-1], dt)
    for c in reversed(_ERFC_P[:-1]):
        poly = w.node("Add", [w.node("Mul", [poly, t]), _k(w, c, dt)])
    e = w.node("Sub", [poly, w.node("Mul", [z, z])])
    ans = w.node("Mul", [t, w.node("Exp", [e])])
    neg = w.node("Less", [x, _k(w, 0, dt)])
    return w.node("Where", [neg, w.node("Sub", [_k(w, 2, dt), ans]), ans])


#: Giles' single-precision erfinv ("Approximating the erfinv function", 2010): x p(w) with
#: w = -log((1 - x)(1 + x)), one polynomial below w = 5 (in w - 2.5) and one above (in
#: sqrt(w) - 3); relative error ~2.5e-7 over float32's (-1, 1)
_ERFINV_CENTRAL = (
    2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
    -0.00125372503, -0.00417768164, 0.246640727, 1.50140941,
)  # fmt: skip
_ERFINV_TAIL = (
    -0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
    -0.0076224613, 0.00943887047, 1.00167406, 2.83297682,
)  # fmt: skip


def _erfinv(w, x, dt):
    one = _k(w, 1, dt)
    wv = w.node("Neg", [w.node("Log", [w.node("Mul", [w.node("Sub", [one, x]),
                                                      w.node("Add", [one, x])])])])  # fmt: skip

    def horner(coefs, t):
        p = _k(w, coefs[0], dt)
        for c in coefs[1:]:
            p = w.node("Add", [w.node("Mul", [p, t]), _k(w, c, dt)])
        return p

    central = horner(_ERFINV_CENTRAL, w.node("Sub", [wv, _k(w, 2.5, dt)]))
    tail = horner(_ERFINV_TAIL, w.node("Sub", [w.node("Sqrt", [wv]), _k(w, 3, dt)]))
    p = w.node("Where", [w.node("Less", [wv, _k(w, 5, dt)]), central, tail])
    return w.node("Mul", [p, x])


def _trunc(w, x):
    return w.node("Mul", [w.node("Sign", [x]), w.node("Floor", [w.node("Abs", [x])])])


def _floor_div(w, a, b, dt):
    if np.dtype(dt).kind == "f":
        return w.node("Floor", [w.node("Div", [a, b])])
    # integer Div truncates: step down where the remainder is nonzero and the signs differ
    q = w.node("Div", [a, b])
    inexact = w.node("Not", [w.node("Equal", [w.node("Mul", [q, b]), a])])
    zero = _k(w, 0, dt)
    signs = w.node("Xor", [w.node("Less", [a, zero]), w.node("Less", [b, zero])])
    step = w.node("Cast", [w.node("And", [inexact, signs])], to=onnx_dtype(dt))
    return w.node("Sub", [q, step])


def _atan2(w, y, x, dt):
    base = w.node("Atan", [w.node("Div", [y, x])])
    zero = _k(w, 0, dt)
    half_turn = w.node(
        "Where", [w.node("Less", [y, zero]), _k(w, -math.pi, dt), _k(w, math.pi, dt)]
    )
    r = w.node("Add", [base, w.node("Where", [w.node("Less", [x, zero]), half_turn, zero])])
    both0 = w.node("And", [w.node("Equal", [x, zero]), w.node("Equal", [y, zero])])
    return w.node("Where", [both0, zero, r])


def _pow2(w, k):
    """2^k as int64 (ONNX BitShift takes unsigned integers only)."""
    from onnx import TensorProto

    p = w.node(
        "BitShift",
        [w.const(np.ones((), np.uint64), "one"), w.node("Cast", [k], to=TensorProto.UINT64)],
        direction="LEFT",
    )
    return w.node("Cast", [p], to=TensorProto.INT64)


def _shift(w, mode, x, k, dt):
    """x << k as x * 2^k, x >> k as floor(x / 2^k), in int64, wrapped back into x's dtype."""
    from onnx import TensorProto

    if np.dtype(dt).kind not in "iu":
        raise w.error(f"Elemwise {mode} takes integers, got {dt}")
    pow2 = _pow2(w, k)
    x64 = w.node("Cast", [x], to=TensorProto.INT64)
    if mode == "SHL":
        r = w.node("Mul", [x64, pow2])
    else:
        r = _floor_div(w, x64, pow2, np.int64)
    return w.cast(r, dt)


def emit_mode(w: Writer, mode: str, ins: list, dt) -> str:
    """The ONNX nodes of Elemwise ``mode`` over ``ins`` (names) of dtype ``dt``."""
    dt = np.dtype(dt)
    if mode in _UNARY:
        return w.node(_UNARY[mode], ins)
    if mode in _BINARY:
        if len(ins) == 2:
            return w.node(_BINARY[mode], ins)
        return w.node({"MAX": "Max", "MIN": "Min", "ADD": "Sum"}[mode], ins)
    if mode in _COMPARE:
        return w.node("Cast", [w.node(_COMPARE[mode], ins)], to=onnx_dtype(dt))
    if mode in _FUSED_ADD:
        return emit_mode(w, _FUSED_ADD[mode], [w.node("Add", ins)], dt)
    if mode in REFUSED_MODES:
        raise w.error(f"Elemwise mode {mode} has no ONNX form: {REFUSED_MODES[mode]}")
    zero = _k(w, 0, dt) if dt.kind != "b" else None
    if mode == "H_SWISH":
        return _h_swish(w, ins[0], dt)
    if mode == "EXPM1":
        return _expm1(w, ins[0], dt)
    if mode == "LOG1P":
        return _log1p(w, ins[0], dt)
    if mode == "ERFC":
        return _erfc(w, ins[0], dt)
    if mode == "ERFINV":
        return _erfinv(w, ins[0], dt)
    if mode == "FLOOR_DIV":
        return _floor_div(w, *ins, dt)
    if mode in ("SHL", "SHR"):
        return _shift(w, mode, *ins, dt)
    if mode == "RMULH":
        if dt.kind not in "iu":
            raise w.error(f"Elemwise RMULH takes integers, got {dt}")
        return w.cast(_rmulh(w, *(w.cast(v, np.int64) for v in ins), dt), dt)
    if mode == "MOD":  # C fmod: the sign of the dividend
        return w.node("Mod", ins, fmod=1)
    if mode == "ATAN2":
        return _atan2(w, *ins, dt)
    if mode == "LOG_SUM_EXP":
        a, b = ins
        m = w.node("Max", [a, b])
        d = w.node("Neg", [w.node("Abs", [w.node("Sub", [a, b])])])
        return w.node("Add", [m, _log1p(w, w.node("Exp", [d]), dt)])
    if mode == "ROUND":  # half away from zero: trunc(x) + trunc(2 frac(x))
        whole = _trunc(w, ins[0])
        frac = w.node("Sub", [ins[0], whole])
        return w.node("Add", [whole, _trunc(w, w.node("Add", [frac, frac]))])
    if mode == "FAST_TANH":  # x (27 + x^2) / (27 + 9 x^2)
        x = ins[0]
        sq = w.node("Mul", [x, x])
        num = w.node("Mul", [w.node("Add", [sq, _k(w, 27, dt)]), x])
        den = w.node("Add", [w.node("Mul", [sq, _k(w, 9, dt)]), _k(w, 27, dt)])
        return w.node("Div", [num, den])
    if mode == "FAST_TANH_GRAD":  # ((x^2 - 9) / (x^2 + 3))^2 / 9 * dy
        x, dy = ins
        sq = w.node("Mul", [x, x])
        r = w.node("Div", [w.node("Sub", [sq, _k(w, 9, dt)]), w.node("Add", [sq, _k(w, 3, dt)])])
        r = w.node("Mul", [w.node("Mul", [r, r]), dy])
        return w.node("Mul", [r, _k(w, 1 / 9, dt)])
    if mode == "ABS_GRAD":
        x, dy = ins
        return w.node("Where", [w.node("Greater", [x, zero]), dy, w.node("Neg", [dy])])
    if mode == "SIGMOID_GRAD":
        y, dy = ins
        return w.node("Mul", [w.node("Mul", [w.node("Sub", [_k(w, 1, dt), y]), y]), dy])
    if mode == "TANH_GRAD":
        y, dy = ins
        return w.node("Mul", [w.node("Sub", [_k(w, 1, dt), w.node("Mul", [y, y])]), dy])
    if mode == "SWITCH_GT0":
        x, dy = ins
        return w.node("Where", [w.node("Greater", [x, zero]), dy, zero])
    if mode == "COND_LEQ_MOV":
        x, y, z = ins
        return w.node("Where", [w.node("LessOrEqual", [x, y]), z, zero])
    if mode == "H_SWISH_GRAD":  # x < -3 ? 0 : (x > 3 ? dy : (2x + 3) / 6 * dy)
        x, dy = ins
        mid = w.node("Add", [w.node("Mul", [x, _k(w, 2, dt)]), _k(w, 3, dt)])
        mid = w.node("Mul", [w.node("Div", [mid, _k(w, 6, dt)]), dy])
        r = w.node("Where", [w.node("Greater", [x, _k(w, 3, dt)]), dy, mid])
        return w.node("Where", [w.node("Less", [x, _k(w, -3, dt)]), zero, r])
    if mode == "FUSE_MUL_ADD3":
        return w.node("Add", [w.node("Mul", ins[:2]), ins[2]])
    if mode == "FUSE_MUL_ADD4":
        return w.node("Add", [w.node("Mul", ins[:2]), w.node("Mul", ins[2:])])
    raise w.error(f"Elemwise mode {mode} has no ONNX form")


@exports("Elemwise")
def _elemwise(w, op, ins):
    return emit_mode(w, op.params["mode"], list(ins), op.outputs[0].dtype)


@exports("JITExecutor")
def _jit(w, op, ins):
    p = op.opr.param
    dt = np.dtype(op.outputs[0].dtype)
    vals: list[str] = []
    for mode, args in p.expr:
        names = []
        for kind, ref in args:
            if kind == "i":
                names.append(ins[ref])
            elif kind == "t":
                names.append(vals[ref])
            else:
                names.append(_k(w, ref, dt))
        vals.append(emit_mode(w, mode, names, dt))
    res = vals[-1]
    if p.reduce is not None:
        rmode, axis = p.reduce
        ndim = len(static_shape(w, op.outputs[0], "fused reduction"))
        axes = list(range(ndim)) if axis is None else [axis]
        keep = 0 if axis is None else 1
        res = w.reduce(_REDUCE[rmode], res, axes, keepdims=keep)
        if axis is None:
            res = w.node("Reshape", [res, w.const(np.array([1], np.int64), "shape")])
    return res


@exports("ElemwiseMultiType")
def _elemwise_multi_type(w, op, ins):
    mode = op.params["mode"]
    out_dt = np.dtype(op.outputs[0].dtype)
    if mode == "FUSE_MUL_ADD3_INT16x32x32x32":
        a = w.cast(ins[0], np.int32)
        return w.node("Add", [w.node("Mul", [a, ins[1]]), ins[2]])
    if mode == "FUSE_MUL_ADD3_IXxF32xF32xI8":
        x = w.cast(ins[0], np.float32)
        v = w.node("Round", [w.node("Add", [w.node("Mul", [ins[1], x]), ins[2]])])
        info = np.iinfo(out_dt)
        f32 = np.float32
        v = w.node("Clip", [v, _k(w, info.min, f32), _k(w, info.max, f32)])
        return w.cast(v, out_dt)
    if mode.startswith("ROUND_SHR_SATURATE_"):
        x, k = (w.cast(ins[j], np.int64) for j in range(2))
        src = np.dtype(op.inputs[0].dtype)
        return w.cast(_round_shr_saturate(w, x, k, None if src == out_dt else out_dt), out_dt)
    if mode.startswith("FUSE_ADD_RMULH_ROUND_SHR_SATURATE_"):
        src = np.dtype(op.inputs[0].dtype)
        x, y, m, shift, lo, hi = (w.cast(ins[j], np.int64) for j in range(6))
        bits = src.itemsize * 8
        half = _k(w, 1 << (bits - 1), np.int64)
        # x + y wraps in the operands' dtype
        s = w.node("Sub", [w.node("Mod", [w.node("Add", [w.node("Add", [x, y]), half]),
                                         _k(w, 1 << bits, np.int64)], fmod=0), half])
        r = _rmulh(w, s, m, src)
        r = _round_shr_saturate(w, r, shift, out_dt)
        return w.cast(w.node("Max", [w.node("Min", [r, hi]), lo]), out_dt)
    if is_quantize(out_dt):
        return export_quant.elemwise_multi_type(w, op, ins)
    raise w.error(f"ElemwiseMultiType mode {mode} (quantized arithmetic) has no ONNX form")


def _rmulh(w, x, y, dt):
    """MegDNN's round_mulh_saturate of int64 x, y holding ``dt`` values: (x y + 2^(k-1)) >> k
    with k = bits - 1, saturated above (only MIN * MIN overflows), as int64."""
    kk = np.dtype(dt).itemsize * 8 - 1
    r = w.node("Add", [w.node("Mul", [x, y]), _k(w, 1 << (kk - 1), np.int64)])
    r = _floor_div(w, r, _k(w, 1 << kk, np.int64), np.int64)
    return w.node("Min", [r, _k(w, np.iinfo(dt).max, np.int64)])


def _round_shr_saturate(w, x, k, out_dt):
    """MegDNN's round_shr_saturate on int64 x, k: x >> k rounded half away from zero, then
    clipped into ``out_dt`` (None: no clipping)."""
    i64 = np.int64
    p = _pow2(w, k)
    q = _floor_div(w, x, p, i64)
    rem = w.node("Sub", [x, w.node("Mul", [q, p])])  # x & (p - 1)
    thr = _floor_div(w, w.node("Sub", [p, _k(w, 1, i64)]), _k(w, 2, i64), i64)
    thr = w.node("Add", [thr, w.cast(w.node("Less", [x, _k(w, 0, i64)]), i64)])
    res = w.node("Add", [q, w.cast(w.node("Greater", [rem, thr]), i64)])
    if out_dt is not None:
        info = np.iinfo(out_dt)
        res = w.node("Clip", [res, _k(w, info.min, i64), _k(w, info.max, i64)])
    return res


@exports("TypeCvt")
def _typecvt(w, op, ins):
    if is_quantize(op.inputs[0].dtype) or is_quantize(op.outputs[0].dtype):
        return export_quant.typecvt(w, op, ins)
    return w.cast(ins[0], op.outputs[0].dtype)


@exports("Reduce")
def _reduce(w, op, ins):
    p = op.params
    name = _REDUCE[p["mode"]]
    if p.get("axis") is not None:
        return w.reduce(name, ins[0], [int(p["axis"])], keepdims=1)
    # reduce to a target shape: the axes where it is 1 and the input's dim is not
    src = static_shape(w, op.inputs[0], "reduce input")
    dst = static_shape(w, op.outputs[0], "reduce output")
    if len(src) != len(dst):
        if dst == [1]:
            r = w.reduce(name, ins[0], list(range(len(src))), keepdims=0)
            return w.node("Reshape", [r, w.const(np.array([1], np.int64), "shape")])
        raise w.error(f"reduce from {src} to {dst} changes the number of dims")
    axes = [i for i, (s, d) in enumerate(zip(src, dst)) if d == 1 and s != 1]
    if not axes:
        return w.node("Identity", [ins[0]])
    return w.reduce(name, ins[0], axes, keepdims=1)

