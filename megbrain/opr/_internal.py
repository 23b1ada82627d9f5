"""The helper layer the operator families share, so that none imports a later family.

Besides the gradients' helpers (:func:`sv`, :func:`reduce_to_input`), the axis param and the
int-input checks of the indexing families live here.

``opr/__init__.py`` imports the families in a fixed order; a family imports ``base``, this
module and the families before it. What a family needs of a later one (a gradient rule built
from another family's operators, as MegBrain's ``.cpp`` files call each other's ``make``
through headers) it calls through the builders here, which each family publishes with
:func:`provide` as it loads: by the time any graph is built, every family is loaded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..graph import InferType, OperatorNodeBase, ParamBase, VarNode, table_param
from ..graph.operator import fmt_shape
from ..graph.static_infer import static_shape
from . import param_defs as pdefs
from .base import SymbolVar, as_var, entry_point_name, make_immutable

__all__ = [
    "provide",
    "sv",
    "reduce_to_input",
    "input_is_constant",
    "AxisParam",
    "int_var",
    "norm_axis",
    "check_int",
]

_BUILDERS: dict[str, Callable] = {}


def provide(*fns: Callable) -> None:
    """Publish the front ends ``fns`` (by their names) to the families loaded before them."""
    for fn in fns:
        _BUILDERS[fn.__name__] = fn


def _builder(name: str) -> Callable:
    def build(*args, **kwargs):
        return _BUILDERS[name](*args, **kwargs)

    build.__name__ = build.__qualname__ = name
    build.__doc__ = f"The ``{name}`` front end of its family, bound when that family loads."
    return build


# what the families and the gradient walk build from families after them
typecvt = _builder("typecvt")
dtype_promotion = _builder("dtype_promotion")
elemwise = _builder("elemwise")
fill_retain_dtype = _builder("fill_retain_dtype")
reduce_general = _builder("reduce_general")
get_var_shape = _builder("get_var_shape")
reshape = _builder("reshape")
concat = _builder("concat")
subtensor_getitem = _builder("subtensor_getitem")


@dataclass(frozen=True)
@table_param(pdefs.Axis)
class AxisParam(ParamBase):
    """Param of the operators taking one axis (Argmax, Argmin, IndexingOneHot...)."""


_I32 = np.dtype(np.int32)


def int_var(x, ref, dtype=_I32):
    """``x`` as a VarNode: vars pass through, ints and arrays become int32 constants on the
    graph and comp node of the var ``ref``."""
    v = as_var(x)
    if v is not None:
        return v
    arr = np.asarray(x)
    if arr.dtype.kind not in "iub" and arr.size:
        raise TypeError(f"{entry_point_name('int_var')}: expected ints, got {arr.dtype} {x!r}")
    ref = as_var(ref)
    return make_immutable(ref.comp_node, ref.graph, arr.astype(dtype), dtype=dtype).node


def norm_axis(opr: OperatorNodeBase, axis: int, shape: tuple) -> int:
    """``axis`` made non-negative; an error naming ``opr`` when out of range for ``shape``."""
    if not -len(shape) <= axis < len(shape):
        raise opr.error(f"axis {axis} out of range for shape {fmt_shape(shape)}")
    return axis % len(shape)


def check_int(opr: OperatorNodeBase, dtype, what: str) -> None:
    """An error naming ``opr`` unless ``dtype`` (of the input ``what``) is an int dtype."""
    if dtype.kind not in "iu":
        raise opr.error(f"{what} must be an int var, got {dtype}")


def sv(v) -> SymbolVar:
    """The SymbolVar of a VarNode (grad methods mix both)."""
    return v if isinstance(v, SymbolVar) else SymbolVar(v)


def reduce_to_input(g, inp: VarNode) -> VarNode:
    """Sum a gradient ``g`` (of a broadcast result) back to ``inp``'s shape.

    Static shortcuts are taken only for CONST shapes: RT_STATIC shapes may change between
    runs, so the reduction then follows the shapes symbolically.
    """
    g = sv(g)
    const = g.node.shape_type == InferType.CONST and inp.shape_type == InferType.CONST
    gs, xs = static_shape(g.node), static_shape(inp)
    if const and gs == xs:
        return g.node
    if gs is not None and xs is not None and len(gs) > len(xs):
        k = len(gs) - len(xs)
        if const:
            r = reduce_general(g, mode="SUM", target_shape=(1,) * k + tuple(xs))
            return reshape(r, xs).node
        ones = make_immutable(inp.comp_node, inp.graph, np.ones(k, np.int32))
        xshape = get_var_shape(sv(inp))
        r = reduce_general(g, mode="SUM", target_shape=concat([ones, xshape], axis=0))
        return reshape(r, xshape).node
    return reduce_general(g, mode="SUM", target_shape=get_var_shape(sv(inp))).node


#: operators whose outputs are parameters: their values change only when the user writes
#: them (``graph_opt.weight_preprocess`` promises that no write follows the first run)
_PARAM_SOURCES = ("SharedDeviceTensor", "MultipleDeviceTensorHolder")


def input_is_constant(opr: OperatorNodeBase, i: int) -> bool:
    """Whether ``opr``'s input ``i`` keeps its values from run to run: an ImmutableTensor,
    or, under ``graph_opt.weight_preprocess``, a parameter (the user's promise that it is not
    updated after the first run, as in the reference)."""
    owner = opr.inputs[i].owner
    if owner.type_name == "ImmutableTensor":
        return True
    opts = getattr(opr.graph, "options", None)
    return (
        opts is not None
        and bool(opts.graph_opt.weight_preprocess)
        and owner.type_name in _PARAM_SOURCES
    )
