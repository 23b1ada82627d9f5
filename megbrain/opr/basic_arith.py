"""Arithmetic operators: Elemwise (every MegDNN mode), TypeCvt and Reduce, with their
``mgb.opr`` functions (``elemwise``, ``elem.<mode>``, ``typecvt``, ``reduce_``, ``mean``...)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..dtype import (
    canonize_dtype,
    dtype_key,
    dtype_name,
    fmt_dtype,
    is_bfloat16,
    is_lowbit,
    is_quantize,
    same_dtype,
    to_mgb_supported_dtype,
)
from ..errors import ArgumentError, ConversionError, MegBrainError, SerializationError
from ..graph import OperatorNodeBase, ParamBase, infer_shape, register_opr
from ..graph.operator import fmt_shape, table_param
from ..graph.param_def import members_of
from ..kernels import elemwise as ew_kernels
from ..kernels import elemwise_modes as ew_modes
from ..kernels import elemwise_multi_type as emt_kernels
from ..kernels import reduce as reduce_kernels
from ..serialization import sereg
from . import param_defs as pdefs
from ._internal import provide
from .base import (
    SymbolVar,
    _merge_config,
    as_var,
    canonize_input_vars,
    insert_opr,
    make_immutable,
)
from .param_args import as_axes, check_axis_range, is_int, opr_params, reduce_axis
from .tensor_manip import broadcast, get_var_shape, remove_axis, shape_to_var

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
    "dtype_promotion",
    "dtype_key",
    "same_dtype",
    "fmt_dtype",
    "QUANTIZED_ELEMWISE_MODES",
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


# the default mode is ADD, elemwise()'s, not the table's first member RELU
@dataclass(frozen=True)
@table_param(pdefs.Elemwise, mode="ADD")
class ElemwiseParam(ParamBase):
    """Param of Elemwise: the ``mode``."""


@register_opr
class Elemwise(OperatorNodeBase):
    """Elementwise computation with NumPy broadcasting; every input has the same dtype."""

    Param = ElemwiseParam

    def infer_dtypes(self, in_dtypes):
        mode = self.param.mode
        n = ew_modes.arity(mode)
        if len(in_dtypes) != n:
            raise self.error(f"mode {mode} takes {n} inputs, got {len(in_dtypes)}")
        # the operator computes in one dtype; elemwise() converts mixed inputs before it
        if any(not same_dtype(d, in_dtypes[0]) for d in in_dtypes):
            raise self.error(
                f"mode {mode}: inputs must share one dtype, got "
                + ", ".join(fmt_dtype(d) for d in in_dtypes)
            )
        dt = in_dtypes[0]
        if is_quantize(dt):
            if mode not in QUANTIZED_ELEMWISE_MODES or dtype_name(dt) not in _QUANT_COMPUTE:
                raise self.error(
                    f"mode {mode} does not support quantized dtype {fmt_dtype(dt)}: Elemwise "
                    f"takes {'/'.join(QUANTIZED_ELEMWISE_MODES)} on "
                    f"{'/'.join(sorted(_QUANT_COMPUTE))}; use elemwise_multi_type for others"
                )
            return [dt]
        try:
            ew_modes.check_mode(mode, dt)
        except ValueError as exc:
            raise self.error(str(exc)) from None
        return [dt]

    def infer_shapes(self, in_shapes, in_values):
        return [broadcast_shapes(self, in_shapes)]

    def bind(self, ins, outs):
        if is_quantize(outs[0].dtype):
            return emt_kernels.bind_quantized(self.param.mode, ins, outs[0])
        return ew_kernels.bind(self.param.mode, ins, outs[0])

    def inplace_input(self):
        return 0


sereg.register_param_opr(Elemwise, pdefs.Elemwise)


@dataclass(frozen=True)
class TypeCvtParam(ParamBase):
    dtype: np.dtype = np.dtype(np.float32)

    # numpy's dtype equality and hash ignore metadata, so qint8(0.1) would equal qint8(0.3)
    # (and the graph would merge the two conversions): compare the quantization too
    def _key(self) -> tuple:
        return dtype_key(self.dtype)

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())


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
        if ins[0] is not None and same_dtype(ins[0].dtype, self.param.dtype):
            return [ins[0]]
        return None

    def default_name(self):
        return f"TypeCvt[{fmt_dtype(self.param.dtype)}]({self.inputs[0].name})"


# only data_type DEFAULT is supported (the file's other types are refused at load)
@dataclass(frozen=True)
@table_param(pdefs.Reduce, skip=("data_type",))
class ReduceParam(ParamBase):
    #: the reduced axis (kept with size 1); None, not the table's INT_MAX, reduces everything
    #: to shape (1,) or, with a second input, to the target shape given by that input's value
    axis: int | None = None


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
            if tshape == (1,):  # a scalar target reduces everything, whatever the ndim
                return [tshape]
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


# ---- serialization (megbrain/serialization/sereg.py) -------------------------------------
#: the reference's "no axis" value of param.Reduce (reduce to the target shape input)
_REDUCE_NO_AXIS = 2**31 - 1


def _reduce_to_def(param: ReduceParam):
    axis = _REDUCE_NO_AXIS if param.axis is None else param.axis
    return pdefs.Reduce(mode=param.mode, axis=axis, data_type="DEFAULT")


def _reduce_from_def(pdef) -> ReduceParam:
    if pdef.data_type.name != "DEFAULT":
        raise SerializationError(
            f"Reduce: param data_type={pdef.data_type.name} is not supported (DEFAULT only)"
        )
    # the reference takes an axis in [-MAX_NDIM, MAX_NDIM); anything else means "no axis"
    axis = pdef.axis if -_MAX_NDIM <= pdef.axis < _MAX_NDIM else None
    return ReduceParam(pdef.mode.name, axis)


_MAX_NDIM = 7
sereg.register_param_opr(
    Reduce, pdefs.Reduce, to_def=_reduce_to_def, from_def=_reduce_from_def, name="ReduceV2"
)
# TypeCvt's param is the DType table itself (with its quantization parameters)
sereg.register_param_opr(
    TypeCvt,
    sereg.DTypeParam,
    to_def=lambda param: sereg.DTypeParam(param.dtype),
    from_def=lambda pdef: TypeCvtParam(pdef.dtype),
    name="TypeCvtV2",
)


# ---- functions ---------------------------------------------------------------------------
@opr_params(("param", "Elemwise"))
def elemwise(*inputs, mode="ADD", name=None, comp_node=None, config=None, comp_graph=None):
    """Elementwise ``mode`` over ``inputs`` with broadcasting (registry name ``Elemwise``).

    Inputs of different dtypes are promoted to one (:func:`dtype_promotion`) and integer
    inputs of a mode defined on floats only (TRUE_DIV, EXP, FLOOR, ...) become float32, each
    converted by a TypeCvt operator, as MegBrain's ``Elemwise::make`` does. Numbers and
    arrays become constants of the vars' promoted dtype, except that floating-point values
    meeting integer vars stay float32 (``int_var * 0.5`` is float32).

    Parameters
    ----------
    *inputs : SymbolVar, number or array_like
        The operands (a single list is taken as the operand list); their number is the
        mode's arity.
    mode : str
        The Elemwise mode (``"ADD"``, ``"fuse_mul_add3"``...), in any case.
    name, comp_node, config, comp_graph
        The operator config, as for every ``mgb.opr`` function; ``comp_graph`` (and
        ``comp_node``) are needed when no input is a var.

    Returns
    -------
    SymbolVar
        The result, of the inputs' broadcast shape and of the computing dtype.

    Raises
    ------
    ConversionError
        For dtypes with no promotion rule (signed with unsigned integers, quantized dtypes
        of different parameters) and float inputs of an integer-only mode (SHL, SHR, RMULH).
    """
    if len(inputs) == 1 and isinstance(inputs[0], (list, tuple)):
        inputs = tuple(inputs[0])
    cfg = _merge_config(name, comp_node, config)
    param = ElemwiseParam(mode)
    vars_ = _elemwise_inputs(inputs, comp_graph, cfg)
    dtype = _promote_many(param.mode, vars_)
    trait = ew_modes.MODES[param.mode]
    if _category(dtype) == "int" and not trait.int_ok:
        dtype = _F32
    if _category(dtype) == "float" and not trait.float_ok:
        raise ConversionError(
            f"Elemwise mode {param.mode} does not allow float inputs; got "
            + ", ".join(f"{v.name!r} {fmt_dtype(v.dtype)}" for v in vars_)
        )
    vars_ = [v if same_dtype(v.dtype, dtype) else typecvt(SymbolVar(v), dtype).node for v in vars_]
    return insert_opr(Elemwise(vars_, param, cfg))[0]


def _is_plain(x) -> bool:
    """Whether ``x`` is a value that becomes a constant (not a var, nor carrying one)."""
    carrier = hasattr(x, "__mgb_symvar__") or hasattr(x, "_as_sym_var") or hasattr(x, "symvar")
    return as_var(x) is None and not carrier


def _elemwise_inputs(inputs, comp_graph, cfg) -> list:
    """The vars of elemwise's operands, constants made with the dtype rule of :func:`elemwise`."""
    plain = [_is_plain(x) for x in inputs]
    if all(plain) or not any(plain):
        return canonize_input_vars(list(inputs), comp_graph=comp_graph, config=cfg)
    var_in = canonize_input_vars(
        [x for x, p in zip(inputs, plain) if not p], comp_graph=comp_graph, config=cfg
    )
    base = functools.reduce(dtype_promotion, [v.dtype for v in var_in])
    ref, it, out = var_in[0], iter(var_in), []
    for x, p in zip(inputs, plain):
        if not p:
            out.append(next(it))
            continue
        kind = np.asarray(x).dtype.kind
        if is_quantize(base) or (_category(base) == "int" and kind == "f"):
            # a constant keeps its own value: float32 (or int32), converted like a var
            dt = None
        else:
            dt = base
        out.append(make_immutable(ref.comp_node, ref.graph, x, dtype=dt).node)
    return out


# ---- dtype promotion (MegBrain's dtype_promotion / BatchedDTypePromotion) ----------------
_F32 = np.dtype(np.float32)
_F16 = np.dtype(np.float16)
#: the modes MegBrain's Elemwise guarantees on quantized inputs (computed on dequantized values)
QUANTIZED_ELEMWISE_MODES = ("ADD", "SUB", "NEGATE", "RELU", "MAX", "MIN")
#: quantized dtypes the quantized kernels take (MegDNN's MEGDNN_FOREACH_QUANTIZED_DTYPE)
_QUANT_COMPUTE = frozenset({"QuantizedS8", "Quantized8Asymm", "QuantizedS32"})
#: quantized dtypes dtype_promotion accepts in pairs (equal scale and zero point)
_QUANT_PROMOTABLE = _QUANT_COMPUTE


def _category(dt: np.dtype) -> str:
    """MegDNN's DTypeCategory: quantized, lowbit, float, int, bool or other (Byte)."""
    if is_quantize(dt):
        return "quantized"
    if is_lowbit(dt):
        return "lowbit"
    if dt.metadata and "mgb_dtype" in dt.metadata:
        return "other"
    if dt.kind == "f" or is_bfloat16(dt):
        return "float"
    if dt.kind in "iu":
        return "int"
    return "bool" if dt.kind == "b" else "other"


def dtype_promotion(t0: np.dtype, t1: np.dtype) -> np.dtype:
    """The common dtype of two operands, by MegBrain's ``dtype_promotion`` rules.

    * equal dtypes stay;
    * two quantized dtypes must be of one kind (QuantizedS8, Quantized8Asymm or QuantizedS32)
      with scales within 1e-6 (and equal zero points); the first is kept;
    * a quantized dtype wins over a plain one;
    * otherwise float16 counts as float32; a float meeting an integer (or any two dtypes of
      different categories) gives float32; integers of different signedness have no rule;
      else the wider dtype wins.

    Parameters
    ----------
    t0, t1 : numpy.dtype
        The dtypes of two operands.

    Returns
    -------
    numpy.dtype
        The promoted dtype.

    Raises
    ------
    ConversionError
        Byte operands, quantized dtypes of different kinds or parameters, or integers of
        different signedness.
    """
    for t in (t0, t1):
        if _category(t) == "other":
            raise ConversionError(f"dtype {fmt_dtype(t)} can not take part in dtype promotion")
    if same_dtype(t0, t1):
        return t0
    q0, q1 = _category(t0) == "quantized", _category(t1) == "quantized"
    if q0 and q1:
        n0, n1 = dtype_name(t0), dtype_name(t1)
        if n0 != n1 or n0 not in _QUANT_PROMOTABLE:
            raise ConversionError(
                f"can not promote quantized dtypes {fmt_dtype(t0)} and {fmt_dtype(t1)}"
            )
        p0, p1 = ew_kernels.quant_params(t0), ew_kernels.quant_params(t1)
        if abs(float(p0.scale) - float(p1.scale)) >= 1e-6 or p0.zero_point != p1.zero_point:
            raise ConversionError(
                f"can not promote {fmt_dtype(t0)} and {fmt_dtype(t1)}: quantization "
                "parameters differ, which usually does not make sense"
            )
        return t0
    if q0 or q1:
        return t0 if q0 else t1
    a = _F32 if t0 == _F16 else t0
    b = _F32 if t1 == _F16 else t1
    if _category(a) != _category(b):
        # float32 in MegBrain; float64 (graphs built below the API) is not narrowed
        wide = [t for t in (a, b) if t.kind == "f" and t.itemsize > 4]
        return wide[0] if wide else _F32
    if a.kind != b.kind and "u" in (a.kind, b.kind):
        raise ConversionError(
            "dtype promotion rule between different signedness is undefined: "
            f"{fmt_dtype(t0)} {fmt_dtype(t1)}"
        )
    return a if a.itemsize > b.itemsize else b


def _promote_many(mode: str, vars_: list) -> np.dtype:
    try:
        return functools.reduce(dtype_promotion, [v.dtype for v in vars_])
    except ConversionError as exc:
        got = ", ".join(f"{v.name!r} {fmt_dtype(v.dtype)}" for v in vars_)
        raise ConversionError(f"Elemwise mode {mode}: {exc.msg}; inputs {got}") from None


# What each Elemwise mode computes, for the docstrings of ``mgb.opr.elem.<mode>``
_ELEM_FORMULAS = {
    "RELU": "max(x, 0)", "ABS": "|x|", "ACOS": "acos(x)", "ASIN": "asin(x)",
    "CEIL": "ceil(x)", "COS": "cos(x)", "EXP": "exp(x)", "EXPM1": "exp(x) - 1",
    "FLOOR": "floor(x)", "LOG": "log(x)", "LOG1P": "log(1 + x)", "NEGATE": "-x",
    "SIGMOID": "1 / (1 + exp(-x))", "SIN": "sin(x)", "TANH": "tanh(x)",
    "ABS_GRAD": "y if x > 0 else -y (the gradient of abs at x, times y)",
    "ADD": "x + y", "FLOOR_DIV": "floor(x / y)", "MAX": "max(x, y)", "MIN": "min(x, y)",
    "MOD": "x mod y, with the sign of x (C's fmod / %)", "MUL": "x * y", "POW": "x ** y",
    "SIGMOID_GRAD": "x * (1 - x) * y (x a sigmoid output, y its output gradient)",
    "SUB": "x - y", "SWITCH_GT0": "y if x > 0 else 0 (the gradient of relu)",
    "TANH_GRAD": "(1 - x * x) * y (x a tanh output, y its output gradient)",
    "TRUE_DIV": "x / y", "LOG_SUM_EXP": "log(exp(x) + exp(y))", "LT": "x < y",
    "LEQ": "x <= y", "EQ": "x == y", "SHL": "x << y", "SHR": "x >> y",
    "COND_LEQ_MOV": "z if x <= y else 0", "FUSE_MUL_ADD3": "x * y + z",
    "FUSE_MUL_ADD4": "a * b + c * d", "FUSE_ADD_RELU": "max(x + y, 0)",
    "FUSE_ADD_SIGMOID": "sigmoid(x + y)", "FUSE_ADD_TANH": "tanh(x + y)",
    "FAST_TANH": "x * (27 + x * x) / (27 + 9 * x * x), a rational approximation of tanh",
    "FAST_TANH_GRAD": "the gradient of fast_tanh at x, times y",
    "ROUND": "x rounded to the nearest integer, halves away from zero",
    "RMULH": "the high half of the integer product x * y (rounding multiply-high)",
    "ATAN2": "atan2(x, y)", "ERF": "erf(x)", "ERFINV": "the inverse of erf at x",
    "ERFC": "1 - erf(x)", "ERFCINV": "the inverse of erfc at x",
    "H_SWISH": "x * min(max(x + 3, 0), 6) / 6",
    "H_SWISH_GRAD": "the gradient of h_swish at x, times y",
    "FUSE_ADD_H_SWISH": "h_swish(x + y)",
}  # fmt: skip


def _elem_function(mode: str):
    """``mgb.opr.elem.<mode>``: ``elemwise(*inputs, mode=mode)`` with its own docstring."""

    def func(*inputs, **kwargs) -> SymbolVar:
        return elemwise(*inputs, mode=mode, **kwargs)

    func.__name__ = func.__qualname__ = mode.lower()
    func.__module__ = "megbrain.opr"
    formula = _ELEM_FORMULAS.get(mode, f"the Elemwise mode {mode}")
    func.__doc__ = (
        f"Element-wise ``{mode}``: {formula}.\n\n"
        f"The same as ``elemwise(*inputs, mode={mode!r}, **kwargs)``: the inputs (vars, "
        "arrays or scalars) are broadcast together, and the keyword arguments (``name``, "
        "``comp_node``, ``config``, ``comp_graph``) are those of :func:`elemwise`.\n\n"
        "Returns\n-------\nSymbolVar\n    The result.\n"
    )
    return func


class _ElemNamespace:
    """``mgb.opr.elem.<mode>(*inputs)`` is ``elemwise(*inputs, mode=<MODE>)``."""

    def __init__(self):
        self._funcs: dict = {}

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        mode = name.upper()
        if mode not in ELEMWISE_MODES:
            raise AttributeError(f"no elemwise mode {name!r}")
        func = self._funcs.get(mode)
        if func is None:
            func = self._funcs[mode] = _elem_function(mode)
        return func

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
        vars_.append(shape_to_var(target_shape, src).node)
    return insert_opr(Reduce(vars_, ReduceParam(mode, reduce_axis(axis)), cfg))[0]


def reduce_(
    src, mode, axis=None, keepdims=False, *, name=None, comp_node=None, config=None,
    comp_graph=None,
):  # fmt: skip
    """Reduce ``src`` with ``mode`` over ``axis``.

    Parameters
    ----------
    src : SymbolVar
        The input.
    mode : str
        The Reduce mode (SUM, SUM_SQR, PRODUCT, MIN, MAX, MEAN).
    axis : int, list of int or None
        The reduced axis or axes (negative ones count from the end); None reduces
        everything to shape (1,).
    keepdims : bool
        Keep the reduced axes with size 1; otherwise they are removed.
    name, comp_node, config, comp_graph
        The operator config, as for every ``mgb.opr`` function.

    Returns
    -------
    SymbolVar

    Raises
    ------
    ArgumentError
        For an axis that is not an int (``1.5``, ``'1'``, a bool), an axis out of range
        (when the ndim is static) or an axis given twice.
    """
    if comp_graph is not None:
        # an immediate src goes to the given graph once; the steps below work on the var
        cfg = _merge_config(None, comp_node, config)
        src = SymbolVar(canonize_input_vars([src], comp_graph=comp_graph, config=cfg)[0])
    if axis is None:
        return reduce_general(src, mode=mode, name=name, comp_node=comp_node, config=config)
    if is_int(axis):
        # one axis (negative counts from the end): the operator resolves it and checks its
        # range when shapes are known, so a var whose ndim is not static yet reduces too
        axis = int(axis)
        out = reduce_general(
            src, mode=mode, axis=axis, name=name, comp_node=comp_node, config=config
        )
        if not keepdims:
            out = remove_axis(out, axis)
        return out
    axes = as_axes(axis, "reduce_")
    (sv,) = canonize_input_vars([src])
    ndim = len(_static_ndim(sv))
    resolved = [check_axis_range(a, ndim, "reduce_") for a in axes]
    if len(set(resolved)) != len(resolved):
        raise ArgumentError(f"reduce_(): axis {list(axis)!r} names an axis more than once")
    out = src
    # from the last axis down, so the axes still to reduce keep their numbers
    resolved.sort(reverse=True)
    sum_sqr = ReduceParam(mode).mode == "SUM_SQR"
    for k, a in enumerate(resolved):
        # the squares are taken once: later axes sum the partial sums of squares
        m = "SUM" if k and sum_sqr else mode
        out = reduce_general(out, mode=m, axis=a, name=name, comp_node=comp_node, config=config)
    if not keepdims:
        out = remove_axis(out, resolved)
    return out


def _static_ndim(v) -> tuple:
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
    """A var with ``var``'s shape and dtype filled with ``value``.

    Parameters
    ----------
    var:
        The var whose shape and dtype the result has.
    value:
        A number, or a 0-d or (1,) array, of an integer or floating dtype: float64 and int64
        values are first taken as float32 and int32, then cast to ``var``'s dtype (a float
        truncates toward zero for an integer dtype), as the reference converts them.

    Returns
    -------
    SymbolVar
        The filled var.

    Raises
    ------
    ConversionError
        For a value of another shape, a bool or non-numeric value, or a quantized or
        low-bit ``var``.
    """
    arr = np.asarray(value)
    if arr.shape not in ((), (1,)):
        raise ConversionError(
            f"fill_retain_dtype: value must be a scalar (a number, a 0-d or a (1,) array), "
            f"got shape {arr.shape}"
        )
    if arr.dtype.kind not in "iuf" and not is_bfloat16(arr.dtype):
        raise ConversionError(f"fill_retain_dtype: unsupported value dtype {arr.dtype}")
    src = arr.reshape(1).astype(to_mgb_supported_dtype(arr.dtype))
    (v,) = canonize_input_vars([var])
    dt = v.dtype
    if is_quantize(dt) or is_lowbit(dt) or getattr(dt, "metadata", None):
        raise ConversionError(f"fill_retain_dtype: unsupported var dtype {dt}")
    const = make_immutable(v.comp_node, v.graph, src.astype(dt), dtype=dt)
    return broadcast(const, get_var_shape(SymbolVar(v)))


provide(elemwise, typecvt, reduce_general, fill_retain_dtype, dtype_promotion)
