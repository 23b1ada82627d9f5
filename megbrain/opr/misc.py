"""Selection, sorting and scan operators: Argmax, Argmin, Argsort (with
ArgsortBackward, its gradient), TopK, Cumsum and CondTake, with their ``mgb.opr`` functions."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..graph import OperatorNodeBase, OperatorNodeConfig, ParamBase, register_opr
from ..graph.operator import fmt_shape, table_param
from ..graph.static_infer import static_shape
from ..serialization import sereg
from . import param_defs as pdefs
from ._internal import AxisParam, check_int, int_var, norm_axis
from .base import (
    SymbolVar,
    _merge_config,
    as_var,
    canonize_input_vars,
    insert_opr,
)
from .basic_arith import elemwise, fill_retain_dtype
from .indexing_adv import incr_advanced_indexing
from .param_args import as_axis, as_int, is_int, opr_params
from .tensor_manip import add_axis, remove_axis, reshape

__all__ = [
    "AxisParam",
    "Argmax",
    "Argmin",
    "Argsort",
    "ArgsortBackward",
    "TopK",
    "Cumsum",
    "CondTake",
    "argmax",
    "argmin",
    "argsort",
    "top_k",
    "cumsum",
    "cond_take",
]

INT_MAX = 2**31 - 1
_I32 = np.dtype(np.int32)


def _insert(cls, inputs, param, cfg, comp_graph=None):
    vars_ = canonize_input_vars(inputs, comp_graph=comp_graph, config=cfg)
    return insert_opr(cls(vars_, param, cfg))


class _NamedOpr(OperatorNodeBase):
    """Named by type, not by the mode in the param (the default for Elemwise-like oprs)."""

    def default_name(self):
        return f"{self.type_name}({','.join(v.name for v in self.inputs)})"


# ---- Argmax / Argmin -----------------------------------------------------------------------
class _ArgReduce(OperatorNodeBase):
    """Index of the extreme along ``axis``, kept as size 1; int32 output."""

    Param = AxisParam
    _fn = staticmethod(np.argmax)

    def infer_dtypes(self, in_dtypes):
        return [_I32]

    def infer_shapes(self, in_shapes, in_values):
        src = in_shapes[0]
        ax = norm_axis(self, self.param.axis, src)
        if src[ax] == 0:
            raise self.error(f"can not reduce the empty axis {ax} of {fmt_shape(src)}")
        return [src[:ax] + (1,) + src[ax + 1 :]]

    def bind(self, ins, outs):
        src, out, fn = ins[0], outs[0], self._fn
        ax = self.param.axis % src.ndim

        def run():
            np.copyto(out, fn(src, axis=ax, keepdims=True), casting="unsafe")

        return run

    def grad(self, wrt_idx, out_grads):
        return None  # piecewise constant


@register_opr
class Argmax(_ArgReduce):
    """Index of the maximum along an axis (the first one on ties)."""


@register_opr
class Argmin(_ArgReduce):
    """Index of the minimum along an axis (the first one on ties)."""

    _fn = staticmethod(np.argmin)


# ---- Argsort ---------------------------------------------------------------------------------
@dataclass(frozen=True)
@table_param(pdefs.Argsort)
class ArgsortParam(ParamBase):
    """Param of Argsort: the sort ``order``."""


def _sort_idx(src: np.ndarray, descending: bool) -> np.ndarray:
    """Stable sort order of each row of ``src``; ties keep their original order."""
    if not descending:
        return np.argsort(src, axis=1, kind="stable")
    n = src.shape[1]
    return n - 1 - np.argsort(src[:, ::-1], axis=1, kind="stable")[:, ::-1]


def _check_2d(opr, shape):
    if len(shape) != 2:
        raise opr.error(f"input must be 2-d (m, n), got {fmt_shape(shape)}")


@register_opr
class Argsort(OperatorNodeBase):
    """Sorts each row of an (m, n) input; outputs the sorted values and int32 indices."""

    Param = ArgsortParam
    nr_outputs = 2

    def infer_dtypes(self, in_dtypes):
        return [in_dtypes[0], _I32]

    def infer_shapes(self, in_shapes, in_values):
        _check_2d(self, in_shapes[0])
        return [in_shapes[0]] * 2

    def bind(self, ins, outs):
        src, (val, idx) = ins[0], outs
        desc = self.param.order == "DESCENDING"

        def run():
            order = _sort_idx(src, desc)
            np.copyto(idx, order, casting="unsafe")
            np.copyto(val, np.take_along_axis(src, order, 1))

        return run

    def grad(self, wrt_idx, out_grads):
        if out_grads[0] is None:
            return None
        return argsort_backward(out_grads[0], self.outputs[1], self.inputs[0]).node


@register_opr
class ArgsortBackward(OperatorNodeBase):
    """(diff (m, k), indices (m, k), src (m, n)): zeros of src's shape with
    ``out[i, indices[i, j]] = diff[i, j]``; the gradient of Argsort and TopK."""

    shape_only_inputs = (2,)

    def infer_shapes(self, in_shapes, in_values):
        diff, idx, src = in_shapes
        _check_2d(self, src)
        if diff != idx or len(diff) != 2 or diff[0] != src[0] or diff[1] > src[1]:
            raise self.error(
                f"diff {fmt_shape(diff)} and indices {fmt_shape(idx)} must both be (m, k) "
                f"with k <= n for src {fmt_shape(src)}"
            )
        return [src]

    def infer_dtypes(self, in_dtypes):
        check_int(self, in_dtypes[1], "indices")
        return [in_dtypes[0]]

    def bind(self, ins, outs):
        diff, idx, out = ins[0], ins[1], outs[0]

        def run():
            out.fill(0)
            np.put_along_axis(out, idx.astype(np.intp), diff, axis=1)

        return run

    def grad(self, wrt_idx, out_grads):
        if wrt_idx != 0:
            return None
        raise self.error("the gradient with respect to diff is not implemented")


def argsort_backward(diff, indices, src) -> SymbolVar:
    """The ArgsortBackward operator (see its docstring)."""
    return _insert(ArgsortBackward, [diff, indices, src], None, OperatorNodeConfig())[0]


# ---- TopK ------------------------------------------------------------------------------------
@dataclass(frozen=True)
@table_param(pdefs.TopK)
class TopKParam(ParamBase):
    """Param of TopK: what it outputs (``mode``)."""


@register_opr
class TopK(_NamedOpr):
    """(data (m, n), k): the k smallest of each row (k > 0) or the ``|k|`` largest (k < 0).

    KTH_ONLY outputs the k-th value of each row, shape (m,), and an empty index output;
    VALUE_IDX_NOSORT / VALUE_IDX_SORTED output values and int32 indices of shape ``(m, |k|)``,
    in no particular order or sorted (ascending for k > 0, descending for k < 0).
    """

    Param = TopKParam
    nr_outputs = 2
    value_deps = (1,)

    def infer_dtypes(self, in_dtypes):
        check_int(self, in_dtypes[1], "k")
        return [in_dtypes[0], _I32]

    def _k(self, val) -> int:
        arr = np.asarray(val)
        if arr.size != 1:
            raise self.error(f"k must hold one int, got shape {fmt_shape(arr.shape)}")
        return int(arr.reshape(-1)[0])

    def infer_shapes(self, in_shapes, in_values):
        src = in_shapes[0]
        _check_2d(self, src)
        k = self._k(in_values[1])
        if k == 0 or abs(k) > src[1]:
            raise self.error(f"k={k} out of range for input {fmt_shape(src)}")
        if self.param.mode == "KTH_ONLY":
            return [(src[0],), (0,)]
        return [(src[0], abs(k))] * 2

    def bind(self, ins, outs):
        src, kvar, (val, idx) = ins[0], ins[1], outs
        mode = self.param.mode

        def run():
            k, n = self._k(kvar), src.shape[1]
            kk = abs(k)
            if mode == "KTH_ONLY":
                kth = k - 1 if k > 0 else n - kk
                np.copyto(val, np.partition(src, kth, axis=1)[:, kth])
                return
            if mode == "VALUE_IDX_SORTED":
                order = _sort_idx(src, k < 0)[:, :kk]
            elif k > 0:
                order = np.argpartition(src, kk - 1, axis=1)[:, :kk]
            else:
                order = np.argpartition(src, n - kk, axis=1)[:, n - kk :]
            np.copyto(idx, order, casting="unsafe")
            np.copyto(val, np.take_along_axis(src, order, 1))

        return run

    def grad(self, wrt_idx, out_grads):
        og = out_grads[0]
        if wrt_idx != 0 or og is None:
            return None
        if self.param.mode != "KTH_ONLY":
            return argsort_backward(og, self.outputs[1], self.inputs[0]).node
        x = SymbolVar(self.inputs[0])
        mask = elemwise(add_axis(SymbolVar(self.outputs[0]), 1), x, mode="EQ")
        share = add_axis(SymbolVar(og), 1) / mask.sum(axis=1, keepdims=True)
        return (share * mask).node


# ---- Cumsum ----------------------------------------------------------------------------------
@dataclass(frozen=True)
@table_param(pdefs.Cumsum)
class CumsumParam(ParamBase):
    """Param of Cumsum: the ``axis`` (INT_MAX, the default, means over the flattened input);
    ``exclusive``: out[i] sums the elements before i (out[0] = 0); ``reverse``: accumulate
    from the end of the axis."""


@register_opr
class Cumsum(OperatorNodeBase):
    """Cumulative sum along an axis, inclusive or exclusive, forward or reverse."""

    Param = CumsumParam

    def infer_shapes(self, in_shapes, in_values):
        norm_axis(self, self.param.axis, in_shapes[0])
        return [in_shapes[0]]

    def bind(self, ins, outs):
        src, out, p = ins[0], outs[0], self.param
        ax = p.axis % src.ndim
        rev = (slice(None),) * ax + (slice(None, None, -1),)
        a, o = (src[rev], out[rev]) if p.reverse else (src, out)
        head = (slice(None),) * ax + (slice(0, 1),)
        body = (slice(None),) * ax + (slice(1, None),)
        most = (slice(None),) * ax + (slice(None, -1),)
        dt = out.dtype

        def run():
            if not p.exclusive:
                np.cumsum(a, axis=ax, dtype=dt, out=o)
            elif a.shape[ax]:
                o[head] = 0
                np.cumsum(a[most], axis=ax, dtype=dt, out=o[body])

        return run

    def grad(self, wrt_idx, out_grads):
        if out_grads[0] is None:
            return None
        p = self.param
        param = CumsumParam(p.axis, p.exclusive, not p.reverse)
        return _insert(Cumsum, [out_grads[0]], param, OperatorNodeConfig())[0].node


# ---- CondTake --------------------------------------------------------------------------------
@dataclass(frozen=True)
@table_param(pdefs.CondTake)
class CondTakeParam(ParamBase):
    """Param of CondTake: the comparison ``mode`` with ``val``; ``eps`` is the tolerance of
    EQ / NEQ for float masks."""


@register_opr
class CondTake(_NamedOpr):
    """(data, mask): the elements of ``data`` where ``mask <mode> val`` holds, and their int32
    offsets in the flattened data; both 1-d, their length known only after running."""

    Param = CondTakeParam
    nr_outputs = 2
    dynamic_output_shape = True
    value_deps = (1,)

    def infer_dtypes(self, in_dtypes):
        shapes = [static_shape(v) for v in self.inputs]
        if None not in shapes:
            self._check_shapes(*shapes)
        return [in_dtypes[0], _I32]

    def _check_shapes(self, data, mask):
        if tuple(data) != tuple(mask):
            raise self.error(
                f"data {fmt_shape(data)} and mask {fmt_shape(mask)} must have one shape"
            )

    def _cond(self, mask: np.ndarray) -> np.ndarray:
        p = self.param
        m = mask.reshape(-1)
        if p.mode in ("EQ", "NEQ"):
            if m.dtype.kind == "f":
                eq = np.abs(m.astype(np.float64) - p.val) < p.eps
            else:
                eq = m == p.val
            return eq if p.mode == "EQ" else ~eq
        op = {"LT": np.less, "LEQ": np.less_equal, "GT": np.greater, "GEQ": np.greater_equal}
        return op[p.mode](m, p.val)

    def infer_shapes(self, in_shapes, in_values):
        self._check_shapes(*in_shapes[:2])
        n = int(np.count_nonzero(self._cond(np.asarray(in_values[1]))))
        return [(n,), (n,)]

    def bind(self, ins, outs):
        data, mask, (val, idx) = ins[0], ins[1], outs

        def run():
            (where,) = np.nonzero(self._cond(mask))
            np.copyto(idx, where, casting="unsafe")
            np.take(data.reshape(-1), where, out=val)

        return run

    def grad(self, wrt_idx, out_grads):
        if wrt_idx != 0 or out_grads[0] is None:
            return None
        data = SymbolVar(self.inputs[0])
        flat = fill_retain_dtype(data.flatten(), 0)
        g = incr_advanced_indexing(flat, SymbolVar(out_grads[0]))[SymbolVar(self.outputs[1])]
        return reshape(g, data.shape).node


# ---- serialization (megbrain/serialization/sereg.py) -------------------------------------
for _cls in (Argmax, Argmin):
    sereg.register_param_opr(_cls, pdefs.Axis)
sereg.register_param_opr(Argsort, pdefs.Argsort)
# the reference's ArgsortBackward carries param.Argsort too (its order is unused)
sereg.register_param_opr(
    ArgsortBackward, pdefs.Argsort, to_def=lambda p: pdefs.Argsort(), from_def=lambda d: None
)
sereg.register_param_opr(TopK, pdefs.TopK)
sereg.register_param_opr(Cumsum, pdefs.Cumsum, name="CumsumV1")
sereg.register_param_opr(CondTake, pdefs.CondTake)


# ---- functions -------------------------------------------------------------------------------
def _arg_reduce(cls, src, axis, keepdims, name, comp_node, config, comp_graph):
    cfg = _merge_config(name, comp_node, config)
    (v,) = canonize_input_vars([src], comp_graph=comp_graph, config=cfg)
    if axis is None:
        if keepdims:
            raise ValueError("can not set axis=None and keepdims=True")
        return insert_opr(cls([SymbolVar(v).flatten().node], AxisParam(0), cfg))[0]
    axis = as_axis(axis, cls.__name__.lower())
    out = insert_opr(cls([v], AxisParam(axis), cfg))[0]
    if keepdims:
        return out
    return remove_axis(out, axis)


def argmax(
    src, axis: int | None = None, keepdims: bool = False, *, name=None, comp_node=None,
    config=None, comp_graph=None,
) -> SymbolVar:  # fmt: skip
    """Int32 index of the maximum of ``src`` along ``axis`` (registry name ``Argmax``).

    Parameters
    ----------
    src : SymbolVar
        The input.
    axis : int, optional
        The reduced axis; None flattens ``src`` first (the result has shape (1,)).
    keepdims : bool
        Keep the reduced axis as size 1 (the operator's own output).
    name, comp_node, config, comp_graph
        The operator config, as for every ``mgb.opr`` function.
    """
    return _arg_reduce(Argmax, src, axis, keepdims, name, comp_node, config, comp_graph)


def argmin(
    src, axis: int | None = None, keepdims: bool = False, *, name=None, comp_node=None,
    config=None, comp_graph=None,
) -> SymbolVar:  # fmt: skip
    """Int32 index of the minimum of ``src`` along ``axis`` (registry name ``Argmin``); see
    :func:`argmax`."""
    return _arg_reduce(Argmin, src, axis, keepdims, name, comp_node, config, comp_graph)


@opr_params(("param", "Argsort"))
def argsort(
    src, order: str = "ASCENDING", *, name=None, comp_node=None, config=None, comp_graph=None
) -> list[SymbolVar]:
    """Sort each row of the (m, n) ``src``: ``[sorted values, int32 indices]`` (``Argsort``).

    Parameters
    ----------
    src : SymbolVar
        A 2-d input.
    order : {"ASCENDING", "DESCENDING"}
        The sort order; ties keep their original order.
    """
    cfg = _merge_config(name, comp_node, config)
    return _insert(Argsort, [src], ArgsortParam(order), cfg, comp_graph)


@opr_params(("param", "TopK"))
def top_k(
    data, k, mode: str = "KTH_ONLY", *, name=None, comp_node=None, config=None, comp_graph=None
) -> list[SymbolVar]:
    """The top-k of each row of the (m, n) ``data`` (registry name ``TopK``).

    Parameters
    ----------
    data : SymbolVar
        A 2-d input.
    k : int or SymbolVar
        k > 0 selects the k smallest, k < 0 the ``|k|`` largest of each row.
    mode : {"KTH_ONLY", "VALUE_IDX_NOSORT", "VALUE_IDX_SORTED"}
        See :class:`TopK`.

    Returns
    -------
    list of SymbolVar
        ``[values, indices]``; for KTH_ONLY the values have shape (m,) and the indices are
        empty.
    """
    cfg = _merge_config(name, comp_node, config)
    (d,) = canonize_input_vars([data], comp_graph=comp_graph, config=cfg)
    if as_var(k) is None and not hasattr(k, "__mgb_symvar__"):
        k = np.array([as_int(k, "top_k", "k")])
    kv = int_var(k, d)
    return insert_opr(TopK([d, kv], TopKParam(mode), cfg))


@opr_params(("param", "Cumsum"))
def cumsum(
    src,
    axis: int | None = INT_MAX,
    exclusive: bool = True,
    reverse: bool = False,
    *,
    name=None,
    comp_node=None,
    config=None,
    comp_graph=None,
) -> SymbolVar:
    """Cumulative sum of ``src`` along ``axis`` (registry name ``Cumsum``).

    Parameters
    ----------
    src : SymbolVar
        The input.
    axis : int
        The axis; INT_MAX (the default) or None sums the flattened input, giving a 1-d var.
    exclusive : bool
        ``out[i]`` sums the elements strictly before ``i`` (MegBrain's default).
    reverse : bool
        Accumulate from the end of the axis.
    """
    cfg = _merge_config(name, comp_node, config)
    (v,) = canonize_input_vars([src], comp_graph=comp_graph, config=cfg)
    if axis is None or (is_int(axis) and axis == INT_MAX):
        v, axis = SymbolVar(v).flatten().node, 0
    param = CumsumParam(as_axis(axis, "cumsum"), bool(exclusive), bool(reverse))
    return insert_opr(Cumsum([v], param, cfg))[0]


@opr_params(("param", "CondTake"))
def cond_take(
    data,
    mask,
    mode: str = "EQ",
    val: float = 0,
    eps: float = 1e-6,
    *,
    name=None,
    comp_node=None,
    config=None,
    comp_graph=None,
) -> list[SymbolVar]:
    """The elements of ``data`` where ``mask <mode> val``: ``[values, int32 offsets]``.

    Parameters
    ----------
    data, mask : SymbolVar
        Two vars of one shape (their dtypes may differ).
    mode : {"EQ", "NEQ", "LT", "LEQ", "GT", "GEQ"}
        The comparison of each mask element with ``val``; EQ / NEQ on float masks compare
        with tolerance ``eps``.

    Returns
    -------
    list of SymbolVar
        The 1-d values and their offsets into the flattened ``data``; their shape is dynamic
        (registry name ``CondTake``).
    """
    cfg = _merge_config(name, comp_node, config)
    d, m = canonize_input_vars([data, mask], comp_graph=comp_graph, config=cfg)
    param = CondTakeParam(mode, float(val), float(eps))
    return insert_opr(CondTake([d, m], param, cfg))
