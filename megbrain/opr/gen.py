"""Tensor generation operators : Alloc, Linspace and Eye, with their ``mgb.opr``
functions and the shape-input helper the random operators share."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..dtype import canonize_dtype, dtype_from_num
from ..errors import GraphError, ShapeDescError
from ..graph import OperatorNodeBase, OperatorNodeConfig, ParamBase, register_opr, table_param
from ..graph.operator import fmt_shape
from ..serialization import sereg
from . import param_defs as pdefs
from ._internal import check_int, reduce_to_input
from .base import SymbolVar, _merge_config, as_var, canonize_input_vars, insert_opr, make_immutable
from .basic_arith import typecvt
from .param_args import as_int, is_int, opr_params
from .tensor_manip import _as_int, int32_shape, shape_to_var

__all__ = [
    "Alloc",
    "Linspace",
    "Eye",
    "alloc",
    "linspace",
    "eye",
    "shape_input",
]

_I32 = np.dtype(np.int32)
_F32 = np.dtype(np.float32)
_WIDE = (np.dtype(np.float64), np.dtype(np.int64))


def param_dtype(dtype) -> np.dtype:
    """A param's dtype: a megbrain dtype, or float64 / int64 (used below the API)."""
    dt = np.dtype(dtype) if not isinstance(dtype, str) or dtype in ("float64", "int64") else None
    if dt is not None and dt in _WIDE:
        return dt
    return canonize_dtype(dtype)


class DTypeParam(ParamBase):
    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "dtype", param_dtype(self.dtype))


def shape_input(shape, cfg, comp_graph=None, fname: str = "shape_input"):
    """The int32 1-d shape var of ``shape``: a var, ints and int vars mixed, or plain ints
    (which need ``comp_graph`` and a comp node in ``cfg``).

    Parameters
    ----------
    shape:
        The shape argument.
    cfg:
        The operator's config (its comp node places a constant shape).
    comp_graph:
        The graph of a constant shape.
    fname:
        The function taking ``shape``, for messages.

    Raises
    ------
    ShapeDescError
        For elements that are neither Python or NumPy integers nor int vars: ``(1.5, 4)``
        is refused rather than truncated to ``(1, 4)``.
    """
    what = f"{fname}() shape"
    v = as_var(shape)
    if v is not None:
        return v
    if is_int(shape):
        shape = (int(shape),)
    if not isinstance(shape, (list, tuple, np.ndarray)):
        raise ShapeDescError(f"{what}: bad shape {shape!r}: expected ints or int vars")
    if isinstance(shape, np.ndarray):
        shape = shape.reshape(-1).tolist()
    refs = [as_var(s) for s in shape if as_var(s) is not None]
    if refs:
        return shape_to_var(shape, refs[0], what=what).node
    ints = [_as_int(s, what) for s in shape]
    if any(i < 0 for i in ints):
        raise ShapeDescError(f"{what}: bad shape {tuple(ints)}: dims must be >= 0")
    if comp_graph is None or not cfg.comp_nodes:
        raise GraphError(f"{fname}(): a shape given as ints needs comp_graph= and comp_node=")
    arr = int32_shape(ints, what)
    return make_immutable(cfg.comp_nodes[0], comp_graph, arr, dtype=_I32).node


class ShapeSourceOpr(OperatorNodeBase):
    """An operator whose output shape is the value of its shape input 0."""

    value_deps = (0,)
    static_only_inputs = (0,)

    def _shape(self, val) -> tuple:
        arr = np.asarray(val)
        if arr.ndim != 1 or (arr.size and arr.min() < 0):
            raise self.error(f"bad output shape {arr.tolist()}")
        return tuple(int(s) for s in arr)

    def infer_dtypes(self, in_dtypes):
        check_int(self, in_dtypes[0], "shape")
        return [self.param.dtype]

    def infer_shapes(self, in_shapes, in_values):
        return [self._shape(in_values[0])]

    def grad(self, wrt_idx, out_grads):
        return None


# ---- Alloc -----------------------------------------------------------------------------------
# float32, alloc()'s default, not the table's byte
@dataclass(frozen=True)
@table_param(pdefs.DType, dtype=np.dtype(np.float32))
class AllocParam(DTypeParam):
    """Param of Alloc: the output ``dtype``."""


@register_opr
class Alloc(ShapeSourceOpr):
    """A tensor of the given shape and dtype; MegBrain leaves it uninitialized, we zero it."""

    Param = AllocParam

    def bind(self, ins, outs):
        out = outs[0]
        return lambda: out.fill(0)


# ---- Eye -------------------------------------------------------------------------------------
@dataclass(frozen=True)
@table_param(pdefs.Eye)
class EyeParam(DTypeParam):
    """Param of Eye: the diagonal ``k`` (0 the main one, > 0 above it, < 0 below) and the
    ``dtype``."""


@register_opr
class Eye(ShapeSourceOpr):
    """A 2-d (rows, cols) matrix of ones on diagonal ``k`` and zeros elsewhere."""

    Param = EyeParam

    def infer_shapes(self, in_shapes, in_values):
        shp = self._shape(in_values[0])
        if len(shp) != 2:
            raise self.error(f"shape must be (rows, cols), got {fmt_shape(shp)}")
        return [shp]

    def bind(self, ins, outs):
        out, k = outs[0], self.param.k

        def run():
            np.copyto(out, np.eye(*out.shape, k=k, dtype=out.dtype))

        return run


# ---- Linspace --------------------------------------------------------------------------------
@dataclass(frozen=True)
@table_param(pdefs.Linspace)
class LinspaceParam(ParamBase):
    """Param of Linspace: whether ``stop`` is the last value (``endpoint``)."""


@register_opr
class Linspace(OperatorNodeBase):
    """(start, stop, num): ``num`` evenly spaced values from start to stop; the dtype is the
    config's, else start's when it is a float, else float32."""

    Param = LinspaceParam
    value_deps = (2,)
    static_only_inputs = (2,)

    def infer_dtypes(self, in_dtypes):
        check_int(self, in_dtypes[2], "num")
        if self.config.dtype_value is not None:
            return [self.config.dtype_value]
        return [in_dtypes[0] if in_dtypes[0].kind == "f" else np.dtype(np.float32)]

    def _scalar(self, val, what) -> float:
        arr = np.asarray(val)
        if arr.size != 1:
            raise self.error(f"{what} must hold one value, got shape {fmt_shape(arr.shape)}")
        return arr.reshape(-1)[0].item()

    def infer_shapes(self, in_shapes, in_values):
        for i, what in enumerate(("start", "stop")):
            if int(np.prod(in_shapes[i])) != 1:
                raise self.error(f"{what} must hold one value, got {fmt_shape(in_shapes[i])}")
        num = int(self._scalar(in_values[2], "num"))
        if num <= 0:
            raise self.error(f"num must be positive, got {num}")
        return [(num,)]

    def bind(self, ins, outs):
        start, stop, out = ins[0], ins[1], outs[0]
        endpoint = self.param.endpoint

        def run():
            a, b = self._scalar(start, "start"), self._scalar(stop, "stop")
            np.copyto(out, np.linspace(a, b, out.shape[0], endpoint=endpoint), casting="unsafe")

        return run

    def grad(self, wrt_idx, out_grads):
        og = out_grads[0]
        if wrt_idx == 2 or og is None:
            return None
        start = self.inputs[0]
        og = SymbolVar(og)

        def const(x):
            return make_immutable(
                start.comp_node, start.graph, np.array([x], og.dtype), dtype=og.dtype
            )

        ins = [const(0.0).node, const(1.0).node, self.inputs[2]]
        t = insert_opr(Linspace(ins, self.param, OperatorNodeConfig()))[0]
        w = 1 - t if wrt_idx == 0 else t
        return reduce_to_input(og * w, self.inputs[wrt_idx])


# ---- serialization (megbrain/serialization/sereg.py) -------------------------------------
# param.DType / param.Eye hold the dtype as the file's DTypeEnum: float64 and int64 (used
# below the API) have no number there, and the dump names them (fbs_dtype_num's error)
sereg.register_param_opr(
    Alloc,
    pdefs.DType,
    to_def=lambda p: pdefs.DType(dtype=p.dtype),
    from_def=lambda d: AllocParam(dtype_from_num(d.dtype)),
)
sereg.register_param_opr(
    Eye,
    pdefs.Eye,
    to_def=lambda p: pdefs.Eye(k=p.k, dtype=p.dtype),
    from_def=lambda d: EyeParam(k=d.k, dtype=dtype_from_num(d.dtype)),
)
sereg.register_param_opr(Linspace, pdefs.Linspace)


# ---- functions -------------------------------------------------------------------------------
def alloc(
    shape, dtype="float32", *, name=None, comp_node=None, config=None, comp_graph=None
) -> SymbolVar:
    """A zero-filled tensor of ``shape`` and ``dtype`` (registry name ``Alloc``).

    ``shape`` is ints (then ``comp_graph`` and ``comp_node`` are needed), an int var, or a
    mix of ints and int vars.
    """
    cfg = _merge_config(name, comp_node, config)
    sv = shape_input(shape, cfg, comp_graph, "alloc")
    return insert_opr(Alloc([sv], AllocParam(dtype), cfg))[0]


# a whole Eye param carries its dtype as MegBrain's DTypeEnum number
@opr_params(("param", "Eye"), convert={"dtype": dtype_from_num})
def eye(
    shape, k: int = 0, dtype="float32", *, name=None, comp_node=None, config=None, comp_graph=None
) -> SymbolVar:
    """A (rows, cols) matrix with ones on diagonal ``k`` (registry name ``Eye``); an int
    ``shape`` n means (n, n)."""
    if is_int(shape):
        shape = (int(shape), int(shape))
    cfg = _merge_config(name, comp_node, config)
    sv = shape_input(shape, cfg, comp_graph, "eye")
    return insert_opr(Eye([sv], EyeParam(as_int(k, "eye", "k"), dtype), cfg))[0]


@opr_params(("param", "Linspace"))
def linspace(
    start,
    stop,
    num,
    endpoint: bool = True,
    *,
    dtype=None,
    name=None,
    comp_node=None,
    config=None,
    comp_graph=None,
) -> SymbolVar:
    """``num`` evenly spaced values from ``start`` to ``stop`` (registry name ``Linspace``).

    Parameters
    ----------
    start, stop : float or SymbolVar
        The first and (with ``endpoint``) last value.
    num : int or SymbolVar
        The number of values.
    endpoint : bool
        Include ``stop``; otherwise the spacing is ``(stop - start) / num``.
    dtype : dtype-like, optional
        The output dtype; by default start's dtype when it is a float var, else float32.
    """
    if isinstance(num, (int, float, np.number, np.bool_, str)) and not is_int(num):
        # a var num may be any int var; a plain one is checked here, as typecvt to int32
        # below would truncate 2.5 to 2
        as_int(num, "linspace", "num")
    cfg = _merge_config(name, comp_node, config, dtype)
    a, b, n = canonize_input_vars([start, stop, num], comp_graph=comp_graph, config=cfg)
    if a.dtype.kind != "f" or b.dtype.kind != "f":
        fdt = a.dtype if a.dtype.kind == "f" else (b.dtype if b.dtype.kind == "f" else _F32)
        a, b = (v if v.dtype == fdt else typecvt(v, fdt).node for v in (a, b))
    if n.dtype != _I32:
        n = typecvt(n, _I32).node
    return insert_opr(Linspace([a, b, n], LinspaceParam(bool(endpoint)), cfg))[0]
