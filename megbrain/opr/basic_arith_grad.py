"""The gradients of the arithmetic operators (Elemwise, TypeCvt, Reduce).

Bound onto the operators here, after the shape and utility families they build on, as
MegBrain keeps ``MGB_IMPL_OPR_GRAD`` apart from the operators' declarations.
"""

from __future__ import annotations

import numpy as np

from ..graph import InferType, OperatorNodeConfig, infer_value
from ..graph.operator import NoGradient
from ..graph.static_infer import static_shape
from ._internal import reduce_to_input, sv
from .base import SymbolVar, insert_opr
from .basic_arith import (
    Elemwise,
    Reduce,
    ReduceParam,
    TypeCvt,
    elemwise,
    fill_retain_dtype,
    reduce_general,
    sqrt,
    typecvt,
)
from .tensor_manip import broadcast, concat, get_var_shape
from .utility import assert_equal, virtual_dep

__all__: list[str] = []


def _ew(mode, *args):
    return elemwise(*args, mode=mode)


def _elemwise_grad(opr: Elemwise, i: int, og):
    """The gradient of Elemwise w.r.t. input ``i`` before reducing broadcast axes."""
    mode = opr.param.mode
    x = [sv(v) for v in opr.inputs]
    y = sv(opr.outputs[0])
    a = x[0]
    b = x[1] if len(x) > 1 else None
    unary = {
        "RELU": lambda: _ew("SWITCH_GT0", a, og),
        "ABS": lambda: _ew("ABS_GRAD", a, og),
        "NEGATE": lambda: -og,
        "EXP": lambda: og * y,
        "EXPM1": lambda: og * _ew("EXP", a),
        "LOG": lambda: og / a,
        "LOG1P": lambda: og / (a + 1),
        "SIN": lambda: og * _ew("COS", a),
        "COS": lambda: -og * _ew("SIN", a),
        "ASIN": lambda: og / sqrt(1 - a * a),
        "ACOS": lambda: -og / sqrt(1 - a * a),
        "SIGMOID": lambda: _ew("SIGMOID_GRAD", y, og),
        "TANH": lambda: _ew("TANH_GRAD", y, og),
        "FAST_TANH": lambda: _ew("FAST_TANH_GRAD", a, og),
        "H_SWISH": lambda: _ew("H_SWISH_GRAD", a, og),
        "ERF": lambda: og * (2 / np.sqrt(np.pi)) * _ew("EXP", -(a * a)),
        "ERFC": lambda: og * (-2 / np.sqrt(np.pi)) * _ew("EXP", -(a * a)),
        "ERFINV": lambda: og * (np.sqrt(np.pi) / 2) * _ew("EXP", y * y),
        "ERFCINV": lambda: og * (-np.sqrt(np.pi) / 2) * _ew("EXP", y * y),
        "CEIL": lambda: None,
        "FLOOR": lambda: None,
        "ROUND": lambda: None,
    }
    if mode in unary:
        return unary[mode]()
    if mode in ("LT", "LEQ", "EQ", "SHL", "SHR", "RMULH", "FLOOR_DIV"):
        return None
    if mode == "ADD":
        return og
    if mode == "SUB":
        return og if i == 0 else -og
    if mode == "MUL":
        return og * x[1 - i]
    if mode == "TRUE_DIV":
        return og / b if i == 0 else -og * a / (b * b)
    if mode == "POW":
        if i == 0:
            return og * b * _ew("POW", a, b - 1)
        return og * _ew("LOG", a) * y
    # the first input's as MegBrain's one pass (COND_LEQ_MOV: og where it is the max / min),
    # not a mask and a product; the second input keeps a strict comparison (ties count once)
    if mode == "MAX":
        return _ew("COND_LEQ_MOV", b, a, og) if i == 0 else og * _ew("LT", a, b)
    if mode == "MIN":
        return _ew("COND_LEQ_MOV", a, b, og) if i == 0 else og * _ew("LT", b, a)
    if mode == "MOD":
        if i == 0:
            return og
        raise opr.error("MOD has no gradient with respect to the divisor", NoGradient)
    if mode == "LOG_SUM_EXP":
        return og * _ew("SIGMOID", x[i] - x[1 - i])
    if mode == "ATAN2":
        den = a * a + b * b
        return og * b / den if i == 0 else -og * a / den
    if mode == "FUSE_ADD_RELU":
        return _ew("SWITCH_GT0", y, og)
    if mode == "FUSE_ADD_SIGMOID":
        return _ew("SIGMOID_GRAD", y, og)
    if mode == "FUSE_ADD_TANH":
        return _ew("TANH_GRAD", y, og)
    if mode == "FUSE_ADD_H_SWISH":
        return _ew("H_SWISH_GRAD", a + b, og)
    if mode == "SWITCH_GT0":
        return None if i == 0 else _ew("SWITCH_GT0", a, og)
    if mode == "ABS_GRAD":
        return None if i == 0 else _ew("ABS_GRAD", a, og)
    if mode == "SIGMOID_GRAD":
        return og * b * (1 - 2 * a) if i == 0 else _ew("SIGMOID_GRAD", a, og)
    if mode == "TANH_GRAD":
        return og * b * (-2 * a) if i == 0 else _ew("TANH_GRAD", a, og)
    if mode == "H_SWISH_GRAD":
        if i == 1:
            return _ew("H_SWISH_GRAD", a, og)
        inside = _ew("LT", a, 3.0) * _ew("LT", -3.0, a)
        return og * b * inside * (1.0 / 3.0)
    if mode == "FUSE_MUL_ADD3":
        return og * x[1 - i] if i < 2 else og
    if mode == "FUSE_MUL_ADD4":
        return og * x[i ^ 1]
    if mode == "COND_LEQ_MOV":
        return None if i < 2 else og * _ew("LEQ", a, b)
    if mode == "FAST_TANH_GRAD":
        if i == 1:
            return _ew("FAST_TANH_GRAD", a, og)
        sq = a * a
        p = sq + 3.0
        return og * b * (48.0 / 9.0) * a * (sq - 9.0) / (p * p * p)
    raise opr.error(f"mode {mode} has no gradient", NoGradient)


def _elemwise_grad_method(self, wrt_idx, out_grads):
    og = out_grads[0]
    if og is None or not np.issubdtype(self.inputs[wrt_idx].dtype, np.floating):
        return None
    g = _elemwise_grad(self, wrt_idx, sv(og))
    if g is None:
        return None
    return reduce_to_input(g, self.inputs[wrt_idx])


def _typecvt_grad(self, wrt_idx, out_grads):
    src = self.inputs[0]
    if out_grads[0] is None or not np.issubdtype(src.dtype, np.floating):
        return None
    return typecvt(sv(out_grads[0]), src.dtype).node


def _reduce_grad(self, wrt_idx, out_grads):
    if wrt_idx != 0 or out_grads[0] is None:
        return None
    x, y, og = sv(self.inputs[0]), sv(self.outputs[0]), sv(out_grads[0])
    shp = get_var_shape(x)
    mode = self.param.mode
    bog = broadcast(og, shp)
    if mode == "SUM":
        return bog.node
    if mode == "SUM_SQR":
        return (bog * x * 2).node
    if mode == "MEAN":
        nx = reduce_general(typecvt(shp, x.dtype), mode="PRODUCT")
        ny = reduce_general(typecvt(get_var_shape(y), x.dtype), mode="PRODUCT")
        return (bog * (ny / nx)).node
    if mode in ("MAX", "MIN"):
        return (bog * elemwise(x, broadcast(y, shp), mode="EQ")).node
    if mode == "PRODUCT":
        return (bog * _product_grad_factor(self, x)).node
    raise self.error(f"Reduce mode {mode} has no gradient", NoGradient)


def _reduced_axes(opr: Reduce, shape: tuple) -> list[int] | None:
    """The axes a Reduce operator of static input ``shape`` reduces (those of size > 1), or
    None when they are not statically known (a target shape with no static value)."""
    if len(opr.inputs) == 2:
        target = infer_value(opr.inputs[1])
        if target is None:
            return None
        tshape = tuple(int(t) for t in np.asarray(target).reshape(-1))
        if tshape == (1,):
            return [a for a, s in enumerate(shape) if s != 1]
        if len(tshape) != len(shape):
            return None
        return [a for a, (t, s) in enumerate(zip(tshape, shape)) if t == 1 and s != 1]
    if opr.param.axis is None:
        return [a for a, s in enumerate(shape) if s != 1]
    axis = opr.param.axis % len(shape)
    return [axis] if shape[axis] != 1 else []


def _product_grad_factor(opr: Reduce, x: SymbolVar) -> SymbolVar:
    """d PRODUCT / dx: for each element, the product of the other reduced elements.

    The reference divides the product by the input, which gives NaN (0/0) where an input is
    zero although the true gradient is finite. The exclusive product needs no division: over
    reduced axes ``r1..rm`` it is ``excl_r1(prod_{r2..rm} x) * ... * excl_rm(x)``, and each
    one-axis exclusive product is a product of prefix and suffix products built from
    Subtensor, Concat and Elemwise MUL only, so gradients of every order stay exact.
    """
    shape = static_shape(x.node)
    axes = None if shape is None else _reduced_axes(opr, shape)
    if axes is None:
        return _product_grad_factor_dynamic(opr, x)
    factor = None
    part = x
    # innermost axis first: excl over r_t reads the product of x over r_{t+1..m}
    for a in reversed(axes):
        term = _exclusive_prod(part, a, shape[a], check=x.node.shape_type != InferType.CONST)
        factor = term if factor is None else term * factor
        part = reduce_general(part, mode="PRODUCT", axis=a)
    if factor is None:  # nothing reduced (sizes 1): the operator is the identity
        return fill_retain_dtype(x, 1)
    return factor


def _exclusive_prod(v: SymbolVar, axis: int, n: int, *, check: bool) -> SymbolVar:
    """``out[..., i, ...] = prod_{j != i} v[..., j, ...]`` along ``axis`` of static size ``n``.

    Inclusive prefix and suffix products by Hillis-Steele doubling (ceil(log2 n) steps, each
    a shifted multiply), then ``prefix[i-1] * suffix[i+1]``. The steps cover sizes up to
    ``2**steps``; with ``check`` (a shape that may change between runs) an AssertEqual stops
    a run whose size outgrew them instead of giving a wrong gradient.
    """

    def sl(t, begin=None, end=None):
        return t[(slice(None),) * axis + (slice(begin, end),)]

    one = fill_retain_dtype(sl(v, 0, 1), 1)
    if n == 1:
        return one
    prefix, suffix, s = v, v, 1
    while s < n:
        prefix = concat([sl(prefix, None, s), sl(prefix, s) * sl(prefix, None, -s)], axis=axis)
        suffix = concat([sl(suffix, None, -s) * sl(suffix, s), sl(suffix, -s)], axis=axis)
        s *= 2
    out = concat([one, sl(prefix, None, -1)], axis=axis) * concat([sl(suffix, 1), one], axis=axis)
    if check:
        size = get_var_shape(v, axis=axis)
        ok = assert_equal(
            size,
            elemwise(size, s, mode="MIN"),
            maxerr=0.0,
            name=f"PRODUCT grad of {v.name}: axis {axis} is longer than {s}; rebuild the grad",
        )
        out = virtual_dep([out, ok])
    return out


def _product_grad_factor_dynamic(opr: Reduce, x: SymbolVar) -> SymbolVar:
    """The exclusive product where the reduced sizes are not static.

    Zeros are counted rather than divided by: with ``safe`` the input whose zeros are
    replaced by 1 and ``z`` the number of zeros reduced together with an element, the
    product of the others is ``prod(safe) / safe`` where no *other* element is zero, else 0.
    Exact in the first order; its own gradient treats the zero pattern as constant, so the
    second order is exact only away from zeros.
    """

    def same_reduce(mode: str, v: SymbolVar) -> SymbolVar:
        ins = [v.node, *opr.inputs[1:]]
        out = insert_opr(Reduce(ins, ReduceParam(mode, opr.param.axis), OperatorNodeConfig()))[0]
        return broadcast(out, get_var_shape(x))

    is_zero = elemwise(x, 0, mode="EQ")
    safe = x + is_zero
    others_zero = same_reduce("SUM", is_zero) - is_zero
    return elemwise(others_zero, 0, mode="EQ") * same_reduce("PRODUCT", safe) / safe


Elemwise.grad = _elemwise_grad_method
TypeCvt.grad = _typecvt_grad
Reduce.grad = _reduce_grad
