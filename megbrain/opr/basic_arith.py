"""Arithmetic operators: Elemwise (every MegDNN mode), TypeCvt and Reduce, with their
``mgb.opr`` functions (``elemwise``, ``elem.<mode>``, ``typecvt``, ``reduce_``, ``mean``...)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..dtype import canonize_dtype, is_lowbit, is_quantize
from ..errors import ConversionError, MegBrainError
from ..graph import OperatorNodeBase, ParamBase, register_opr
from ..graph.operator import fmt_shape
from ..graph.param_def import members_of
from ..kernels import elemwise as ew_kernels
from ..kernels import reduce as reduce_kernels
from . import param_defs as pdefs
from .base import SymbolVar, _merge_config, canonize_input_vars, insert_opr
from .param_args import opr_params, reduce_axis

__all__ = [
    "Elemwise",
    "TypeCvt",
    "Reduce",
    "elemwise",
    "elem",
    "typecvt",
    "reduce_",
    "reduce_general",
    "mean",
    "square",
    "sqrt",
    "fill_retain_dtype",
    "broadcast_shapes",
]

#: in the table's order, so an int mode is the reference's index; the kernel implements all
ELEMWISE_MODES = members_of(pdefs.Elemwise.Mode)
REDUCE_MODES = members_of(pdefs.Reduce.Mode)


def broadcast_shapes(opr: OperatorNodeBase, shapes) -> tuple:
    """NumPy broadcasting of ``shapes``; an error naming ``opr`` and the shapes otherwise."""
    try:
        return tuple(np.broadcast_shapes(*[tuple(s) for s in shapes]))
    except ValueError:
        raise opr.error(
            "shapes can not be broadcast together: " + ", ".join(fmt_shape(s) for s in shapes)
        ) from None


@dataclass(frozen=True)
class ElemwiseParam(ParamBase):
    mode: str = "ADD"
    _choices = {"mode": ELEMWISE_MODES}


@register_opr
class Elemwise(OperatorNodeBase):
    """Elementwise computation with NumPy broadcasting; every input has the same dtype."""

    Param = ElemwiseParam

    def infer_dtypes(self, in_dtypes):
        mode = self.param.mode
        n = ew_kernels.arity(mode)
        if len(in_dtypes) != n:
            raise self.error(f"mode {mode} takes {n} inputs, got {len(in_dtypes)}")
        if any(d != in_dtypes[0] for d in in_dtypes):
            raise self.error(
                f"mode {mode}: inputs must share one dtype, got "
                + ", ".join(str(d) for d in in_dtypes)
            )
        try:
            ew_kernels.check_mode(mode, in_dtypes[0])
        except ValueError as exc:
            raise self.error(str(exc)) from None
        return [in_dtypes[0]]

    def infer_shapes(self, in_shapes, in_values):
        return [broadcast_shapes(self, in_shapes)]

    def bind(self, ins, outs):
        return ew_kernels.bind(self.param.mode, ins, outs[0])

    def inplace_input(self):
        return 0

    def grad(self, wrt_idx, out_grads):
        return _elemwise_grad_method(self, wrt_idx, out_grads)


@dataclass(frozen=True)
class TypeCvtParam(ParamBase):
    dtype: np.dtype = np.dtype(np.float32)


@register_opr
class TypeCvt(OperatorNodeBase):
    """Converts the dtype of its input."""

    Param = TypeCvtParam

    def infer_dtypes(self, in_dtypes):
        return [self.param.dtype]

    def infer_shapes(self, in_shapes, in_values):
        return [in_shapes[0]]

    def bind(self, ins, outs):
        return ew_kernels.typecvt_bind(ins[0], outs[0])

    def fwd_views(self, ins):
        # same dtype: the conversion is the identity
        if ins[0] is not None and ins[0].dtype == self.param.dtype:
            return [ins[0]]
        return None

    def default_name(self):
        return f"TypeCvt[{self.param.dtype}]({self.inputs[0].name})"

    def grad(self, wrt_idx, out_grads):
        return _typecvt_grad(self, wrt_idx, out_grads)


@dataclass(frozen=True)
class ReduceParam(ParamBase):
    mode: str = "SUM"
    #: the reduced axis (kept with size 1); None reduces everything to shape (1,) or, with a
    #: second input, to the target shape given by that input's value
    axis: int | None = None
    _choices = {"mode": REDUCE_MODES}


@register_opr
class Reduce(OperatorNodeBase):
    """Reduction over one axis (kept as size 1), everything, or to a target shape."""

    Param = ReduceParam
    value_deps = (1,)
    static_only_inputs = (1,)

    def infer_shapes(self, in_shapes, in_values):
        src = in_shapes[0]
        axis = self.param.axis
        if len(self.inputs) == 2:
            tshape = tuple(int(x) for x in np.asarray(in_values[1]).reshape(-1))
            if len(tshape) != len(src) or any(t not in (1, s) for t, s in zip(tshape, src)):
                raise self.error(
                    f"can not reduce {fmt_shape(src)} to target shape {fmt_shape(tshape)}"
                )
            return [tshape]
        if axis is None:
            return [(1,)]
        if not -len(src) <= axis < len(src):
            raise self.error(f"axis {axis} out of range for shape {fmt_shape(src)}")
        axis %= len(src)
        return [src[:axis] + (1,) + src[axis + 1 :]]

    def fwd_views(self, ins):
        # reducing to the input's own shape (a gradient of an unbroadcast operand) is the
        # identity for SUM/MAX/MIN/MEAN/PRODUCT: forward the input instead of copying
        src = ins[0]
        if src is None or self.param.mode == "SUM_SQR" or len(self.inputs) != 2:
            return None
        target = ins[1]
        if target is not None and tuple(int(t) for t in np.asarray(target).ravel()) == src.shape:
            return [src]
        return None

    def bind(self, ins, outs):
        if len(self.inputs) == 2:
            return reduce_kernels.bind_reduce_to_shape(self.param.mode, ins[0], outs[0])
        axis = self.param.axis
        if axis is not None:
            axis %= ins[0].ndim
        return reduce_kernels.bind_reduce(self.param.mode, ins[0], outs[0], axis)

    def default_name(self):
        return f"{self.param.mode}({self.inputs[0].name})"

    def grad(self, wrt_idx, out_grads):
        return _reduce_grad(self, wrt_idx, out_grads)


# ---- functions ---------------------------------------------------------------------------
@opr_params(("param", "Elemwise"))
def elemwise(*inputs, mode="ADD", name=None, comp_node=None, config=None, comp_graph=None):
    """Elementwise ``mode`` over ``inputs`` with broadcasting (registry name ``Elemwise``)."""
    if len(inputs) == 1 and isinstance(inputs[0], (list, tuple)):
        inputs = tuple(inputs[0])
    cfg = _merge_config(name, comp_node, config)
    param = ElemwiseParam(mode)
    vars_ = canonize_input_vars(inputs, comp_graph=comp_graph, config=cfg)
    return insert_opr(Elemwise(vars_, param, cfg))[0]


class _ElemNamespace:
    """``mgb.opr.elem.<mode>(*inputs)`` is ``elemwise(*inputs, mode=<MODE>)``."""

    def __getattr__(self, name: str):
        mode = name.upper()
        if mode not in ELEMWISE_MODES:
            raise AttributeError(f"no elemwise mode {name!r}")
        return functools.partial(elemwise, mode=mode)

    def __dir__(self):
        return [m.lower() for m in ELEMWISE_MODES]


elem = _ElemNamespace()


def typecvt(
    src, target_dtype, *, name=None, comp_node=None, config=None, comp_graph=None
) -> SymbolVar:
    """Convert ``src`` to ``target_dtype`` (registry name ``TypeCvt``)."""
    cfg = _merge_config(name, comp_node, config)
    (v,) = canonize_input_vars([src], comp_graph=comp_graph, config=cfg)
    return insert_opr(TypeCvt([v], TypeCvtParam(_graph_dtype(target_dtype)), cfg))[0]


def _graph_dtype(dtype) -> np.dtype:
    """A dtype vars may have: the supported ones, plus float64/int64 for graphs built below
    the API (float64 gradient checks)."""
    if isinstance(dtype, np.dtype) and dtype in (np.dtype(np.float64), np.dtype(np.int64)):
        return dtype
    return canonize_dtype(dtype)


@opr_params(("param", "Reduce"))
def reduce_general(
    *inputs, mode="SUM", axis=None, target_shape=None, name=None, comp_node=None, config=None,
    comp_graph=None,
) -> SymbolVar:  # fmt: skip
    """A Reduce operator: over ``axis`` (kept as size 1), to a target shape, or to (1,).

    Parameters
    ----------
    *inputs
        ``src``, or ``src, target_shape`` as in MegBrain (also as one list); the target shape
        may instead be given as ``target_shape=``.
    mode : str
        The Reduce mode (SUM, SUM_SQR, PRODUCT, MIN, MAX, MEAN).
    axis : int, optional
        The reduced axis; None (or MegBrain's INT_MAX) reduces to the target shape or (1,).
    name, comp_node, config, comp_graph
        The operator config, as for every ``mgb.opr`` function.

    Returns
    -------
    SymbolVar
    """
    if len(inputs) == 1 and isinstance(inputs[0], (list, tuple)):
        inputs = tuple(inputs[0])
    if len(inputs) == 2 and target_shape is None:
        inputs, target_shape = inputs[:1], inputs[1]
    if len(inputs) != 1:
        raise TypeError(
            f"reduce_general() takes src and an optional target shape, got {len(inputs)} inputs"
            + (" and target_shape=" if target_shape is not None else "")
        )
    cfg = _merge_config(name, comp_node, config)
    (src,) = canonize_input_vars(inputs, comp_graph=comp_graph, config=cfg)
    vars_ = [src]
    if target_shape is not None:
        from .tensor_manip import shape_to_var

        vars_.append(shape_to_var(target_shape, src).node)
    return insert_opr(Reduce(vars_, ReduceParam(mode, reduce_axis(axis)), cfg))[0]


def reduce_(
    src, mode, axis=None, keepdims=False, *, name=None, comp_node=None, config=None,
    comp_graph=None,
):  # fmt: skip
    """Reduce ``src`` with ``mode`` over ``axis`` (None: everything, giving shape (1,)).

    Without ``keepdims`` the reduced axis is removed.
    """
    if comp_graph is not None:
        # an immediate src goes to the given graph once; the steps below work on the var
        cfg = _merge_config(None, comp_node, config)
        src = SymbolVar(canonize_input_vars([src], comp_graph=comp_graph, config=cfg)[0])
    if axis is None:
        return reduce_general(src, mode=mode, name=name, comp_node=comp_node, config=config)
    axes = [axis] if isinstance(axis, (int, np.integer)) else list(axis)
    out = src
    (sv,) = canonize_input_vars([src])
    ndim = len(_static_ndim(sv))
    axes = sorted({a % ndim for a in axes}, reverse=True)
    for a in axes:
        out = reduce_general(out, mode=mode, axis=a, name=name, comp_node=comp_node, config=config)
    if not keepdims:
        from .tensor_manip import remove_axis

        out = remove_axis(out, axes)
    return out


def _static_ndim(v) -> tuple:
    from ..graph import infer_shape

    try:
        return infer_shape(v)
    except MegBrainError:
        raise MegBrainError(
            f"reduce over an axis needs the static ndim of {v.name!r}, which is unknown"
        ) from None


def mean(inp, axis=None, keepdims=False, **kw) -> SymbolVar:
    """Arithmetic mean over ``axis`` (None: everything)."""
    return reduce_(inp, "MEAN", axis, keepdims, **kw)


def square(inp) -> SymbolVar:
    """``inp ** 2``."""
    return elemwise(inp, inp, mode="MUL")


def sqrt(inp) -> SymbolVar:
    """``inp ** 0.5``."""
    return elemwise(inp, 0.5, mode="POW")


def fill_retain_dtype(var, value) -> SymbolVar:
    """A var with ``var``'s shape and dtype filled with the scalar ``value`` (SPEC.md 1.9)."""
    if np.ndim(value) != 0:
        raise ConversionError(f"fill_retain_dtype: value must be a scalar, got {value!r}")
    (v,) = canonize_input_vars([var])
    dt = v.dtype
    if is_quantize(dt) or is_lowbit(dt) or getattr(dt, "metadata", None):
        raise ConversionError(f"fill_retain_dtype: unsupported value dtype {dt}")
    value = int(value) if np.issubdtype(dt, np.integer) else float(value)
    from .io import make_immutable
    from .tensor_manip import broadcast, get_var_shape

    const = make_immutable(v.comp_node, v.graph, np.array(value, dtype=dt).reshape(1), dtype=dt)
    return broadcast(const, get_var_shape(SymbolVar(v)))


# ---- gradients ---------------------------------------------------------------------------
def _ew(mode, *args):
    return elemwise(*args, mode=mode)


def _elemwise_grad(opr: Elemwise, i: int, og):
    """The gradient of Elemwise w.r.t. input ``i`` before reducing broadcast axes."""
    from .grad import sv

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
    if mode == "MAX":
        return og * (_ew("LEQ", b, a) if i == 0 else _ew("LT", a, b))
    if mode == "MIN":
        return og * (_ew("LEQ", a, b) if i == 0 else _ew("LT", b, a))
    if mode == "MOD":
        if i == 0:
            return og
        raise opr.error("MOD has no gradient with respect to the divisor")
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
    raise opr.error(f"mode {mode} has no gradient")


def _elemwise_grad_method(self, wrt_idx, out_grads):
    from .grad import reduce_to_input, sv

    og = out_grads[0]
    if og is None or not np.issubdtype(self.inputs[wrt_idx].dtype, np.floating):
        return None
    g = _elemwise_grad(self, wrt_idx, sv(og))
    if g is None:
        return None
    return reduce_to_input(g, self.inputs[wrt_idx])


def _typecvt_grad(self, wrt_idx, out_grads):
    from .grad import sv

    src = self.inputs[0]
    if out_grads[0] is None or not np.issubdtype(src.dtype, np.floating):
        return None
    return typecvt(sv(out_grads[0]), src.dtype).node


def _reduce_grad(self, wrt_idx, out_grads):
    from .grad import sv
    from .tensor_manip import broadcast, get_var_shape

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
        return (broadcast(og * y, shp) / x).node
    raise self.error(f"Reduce mode {mode} has no gradient")
