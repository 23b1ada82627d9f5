"""Advanced indexing operators: one-hot indexing, multi-axis vector indexing
(NumPy integer-array indexing), mesh and batched mesh indexing with their set / incr forms
and IndexingRemap, with their ``mgb.opr`` functions.

The vector-indexing families share one param, a tuple of axis descs as in Subtensor: an
axis is indexed by an int array var ("index") or sliced by int begin / end / step vars
("interval"); the values are the operator's inputs after the data inputs.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..errors import MegBrainError
from ..graph import (
    OperatorNodeBase,
    OperatorNodeConfig,
    ParamBase,
    register_opr,
    static_shape,
    table_param,
)
from ..graph.operator import fmt_shape
from ..kernels.arrays import same_elements
from ..serialization import sereg
from . import param_defs as pdefs
from ._internal import AxisParam, check_int, int_var, norm_axis, reduce_to_input
from .base import (
    SymbolVar,
    _merge_config,
    as_var,
    canonize_input_vars,
    insert_opr,
    make_immutable,
)
from .basic_arith import fill_retain_dtype
from .indexing import (
    AxisDescsParam,
    SubtensorIndexError,
    register_index_desc_opr,
    slice_desc,
)
from .param_args import as_axis, opr_params
from .tensor_manip import add_axis, remove_axis

__all__ = [
    "IndexingOneHot",
    "IndexingSetOneHot",
    "IndexingMultiAxisVec",
    "IndexingSetMultiAxisVec",
    "IndexingIncrMultiAxisVec",
    "MeshIndexing",
    "SetMeshIndexing",
    "IncrMeshIndexing",
    "BatchedMeshIndexing",
    "BatchedSetMeshIndexing",
    "BatchedIncrMeshIndexing",
    "IndexingRemap",
    "IndexingRemapBackward",
    "indexing_one_hot",
    "indexing_set_one_hot",
    "advanced_indexing",
    "set_advanced_indexing",
    "incr_advanced_indexing",
    "mesh_indexing",
    "set_mesh_indexing",
    "incr_mesh_indexing",
    "batched_mesh_indexing",
    "batched_set_mesh_indexing",
    "batched_incr_mesh_indexing",
    "indexing_remap",
]


def _copy_unless_same(out: np.ndarray, src: np.ndarray, same: bool) -> None:
    if not same:
        np.copyto(out, src)


def _zeros_like(v) -> SymbolVar:
    return fill_retain_dtype(SymbolVar(v), 0)


def _zero_scalar(v) -> SymbolVar:
    return make_immutable(v.comp_node, v.graph, np.zeros(1, v.dtype), dtype=v.dtype)


# ---- IndexingOneHot / IndexingSetOneHot ------------------------------------------------------
class _OneHotBase(OperatorNodeBase):
    """Shared shape checks: ``index`` has src's shape without ``axis``."""

    Param = AxisParam

    def _check(self, src: tuple, index: tuple) -> int:
        ax = norm_axis(self, self.param.axis, src)
        # a 1-d src takes a (1,) index: there are no 0-d tensors
        if tuple(index) != (src[:ax] + src[ax + 1 :] or (1,)):
            raise self.error(
                f"index shape {fmt_shape(index)} must be the src shape {fmt_shape(src)} "
                f"without axis {ax}"
            )
        return ax

    def _index(self, index: np.ndarray, src_shape: tuple, ax: int) -> np.ndarray:
        n = src_shape[ax]
        if index.size and (index.min() < 0 or index.max() >= n):
            raise self.error(
                f"index out of range [0, {n}) of axis {ax}: min {index.min()}, max {index.max()}",
                SubtensorIndexError,
            )
        index = index.astype(np.intp)
        if len(src_shape) == 1:
            return index  # the (1,) index of a 1-d src already has its axis
        return np.expand_dims(index, ax)


@register_opr
class IndexingOneHot(_OneHotBase):
    """(src, index): ``out[..., 0, ...] = src[..., index[...], ...]`` along ``axis``, which
    the output keeps as size 1."""

    def infer_dtypes(self, in_dtypes):
        check_int(self, in_dtypes[1], "index")
        return [in_dtypes[0]]

    def infer_shapes(self, in_shapes, in_values):
        src = in_shapes[0]
        ax = self._check(src, in_shapes[1])
        return [src[:ax] + (1,) + src[ax + 1 :]]

    def bind(self, ins, outs):
        src, index, out = ins[0], ins[1], outs[0]
        ax = self.param.axis % src.ndim

        def run():
            np.copyto(out, np.take_along_axis(src, self._index(index, src.shape, ax), ax))

        return run

    def grad(self, wrt_idx, out_grads):
        if wrt_idx != 0 or out_grads[0] is None:
            return None
        ins = [_zeros_like(self.inputs[0]).node, self.inputs[1], out_grads[0]]
        return _insert(IndexingSetOneHot, ins, self.param)


@register_opr
class IndexingSetOneHot(_OneHotBase):
    """(src, index, value): a copy of ``src`` with the elements IndexingOneHot reads set to
    ``value`` (of IndexingOneHot's output shape)."""

    def infer_dtypes(self, in_dtypes):
        check_int(self, in_dtypes[1], "index")
        if in_dtypes[2] != in_dtypes[0]:
            raise self.error(f"value dtype {in_dtypes[2]} differs from src dtype {in_dtypes[0]}")
        return [in_dtypes[0]]

    def infer_shapes(self, in_shapes, in_values):
        src, _, value = in_shapes
        ax = self._check(src, in_shapes[1])
        want = src[:ax] + (1,) + src[ax + 1 :]
        if tuple(value) != want:
            raise self.error(f"value shape {fmt_shape(value)} must be {fmt_shape(want)}")
        return [src]

    def inplace_input(self):
        return 0

    def bind(self, ins, outs):
        src, index, value, out = ins[0], ins[1], ins[2], outs[0]
        ax = self.param.axis % src.ndim
        same = same_elements(out, src)

        def run():
            _copy_unless_same(out, src, same)
            np.put_along_axis(out, self._index(index, src.shape, ax), value, ax)

        return run

    def grad(self, wrt_idx, out_grads):
        og = out_grads[0]
        if og is None or wrt_idx == 1:
            return None
        index = self.inputs[1]
        if wrt_idx == 0:
            ins = [og, index, _zeros_like(self.inputs[2]).node]
            return _insert(IndexingSetOneHot, ins, self.param)
        return _insert(IndexingOneHot, [og, index], self.param)


def _insert(cls, inputs, param, cfg=None):
    vars_ = [as_var(v) for v in inputs]
    return insert_opr(cls(vars_, param, cfg or OperatorNodeConfig()))[0].node


# ---- vector indexing families ----------------------------------------------------------------
@dataclass(frozen=True)
class IndexDescParam(AxisDescsParam):
    """Param of the vector indexing families: increasing non-negative axes, kind ``"index"``
    an int array input; at least one axis is indexed."""

    _what: ClassVar[str] = "vector indexing"
    _nonneg: ClassVar[bool] = True

    def _check(self, descs):
        axes = [d[0] for d in descs]
        if axes != sorted(set(axes)):
            raise MegBrainError(f"vector indexing: axes must increase, got {axes}")
        if not any(d[1] == "index" for d in descs):
            raise MegBrainError("vector indexing: at least one axis must be indexed by an array")


class _VecIndexBase(OperatorNodeBase):
    """The shared part of the vector indexing families.

    ``_family`` picks the index semantics (``"mavi"``: NumPy integer-array indexing;
    ``"mesh"``: the Cartesian product of 1-d indices; ``"batched"``: a mesh per entry of axis
    0, with (batch, k) indices); ``_first`` is the first index input (after src, or after
    src and value for the modifying forms).
    """

    Param = IndexDescParam
    _family = "mavi"
    _first = 1
    _modify = None  # None: read; "set" / "incr": modify

    def __init__(self, inputs, param=None, config=None):
        super().__init__(inputs, param, config)
        pos, slots, interval_pos = self._first, [], []
        for axis, kind, *has in param.descs:
            if kind == "index":
                slots.append((axis, pos, None))
                pos += 1
                continue
            parts = []
            for h in has[:3]:
                parts.append(pos if h else None)
                if h:
                    interval_pos.append(pos)
                    pos += 1
            slots.append((axis, None, tuple(parts)))
        if pos != len(self.inputs):
            raise MegBrainError(
                f"{self.type_name}: {pos - self._first} index inputs expected, got "
                f"{len(self.inputs) - self._first}"
            )
        self._slots = slots
        self.value_deps = self.static_only_inputs = tuple(interval_pos)

    # ---- shapes and indices ---------------------------------------------------------------
    def infer_dtypes(self, in_dtypes):
        for v, d in zip(self.inputs[self._first :], in_dtypes[self._first :]):
            check_int(self, d, f"index {v.name!r}")
        if self._modify and in_dtypes[1] != in_dtypes[0]:
            raise self.error(f"value dtype {in_dtypes[1]} differs from src dtype {in_dtypes[0]}")
        return [in_dtypes[0]]

    def _int(self, val) -> int:
        arr = np.asarray(val)
        if arr.size != 1:
            raise self.error(f"slice bound must hold one int, got shape {fmt_shape(arr.shape)}")
        return int(arr.reshape(-1)[0])

    def _plan(self, shape: tuple, vals) -> tuple[tuple, list[int], list[int]]:
        """(slices of the intervals, indexed axes, their input positions) for ``shape``."""
        slices = [slice(None)] * len(shape)
        axes, poss = [], []
        for axis, pos, parts in self._slots:
            if axis >= len(shape):
                raise self.error(f"axis {axis} out of range for shape {fmt_shape(shape)}")
            if pos is not None:
                axes.append(axis)
                poss.append(pos)
                continue
            b, e, s = (None if p is None else self._int(vals(p)) for p in parts)
            if s == 0:
                raise self.error(f"slice step must not be 0 (axis {axis})")
            slices[axis] = slice(b, e, s)
        if self._family == "batched" and axes[0] == 0:
            raise self.error("axis 0 is the batch axis and can not be indexed")
        return tuple(slices), axes, poss

    @staticmethod
    def _sub_shape(shape: tuple, slices: tuple) -> tuple:
        return tuple(len(range(*s.indices(n))) for s, n in zip(slices, shape))

    def _indexed_shape(self, sub: tuple, axes: list[int], ishapes: list[tuple]) -> tuple:
        """The shape indexing ``sub`` on ``axes`` with indices of shapes ``ishapes`` gives."""
        fam = self._family
        if fam == "mavi":
            try:
                b = tuple(np.broadcast_shapes(*ishapes))
            except ValueError:
                raise self.error(
                    "index shapes can not be broadcast together: "
                    + ", ".join(fmt_shape(s) for s in ishapes)
                ) from None
            rest = [n for a, n in enumerate(sub) if a not in axes]
            a0 = axes[0]
            if axes == list(range(a0, a0 + len(axes))):
                return tuple(rest[:a0]) + b + tuple(rest[a0:])
            return b + tuple(rest)
        out = list(sub)
        for a, s in zip(axes, ishapes):
            if fam == "mesh":
                if len(s) != 1:
                    raise self.error(f"index of axis {a} must be 1-d, got {fmt_shape(s)}")
                out[a] = s[0]
            else:
                if len(s) != 2 or s[0] != sub[0]:
                    raise self.error(
                        f"index of axis {a} must be (batch={sub[0]}, k), got {fmt_shape(s)}"
                    )
                out[a] = s[1]
        return tuple(out)

    def _index_tuple(self, sub: tuple, axes: list[int], arrays: list[np.ndarray]) -> tuple:
        """The NumPy index selecting the indexed elements of a view of shape ``sub``."""
        nd = len(sub)
        arrays = [np.asarray(a, dtype=np.intp) for a in arrays]
        for a, arr in zip(axes, arrays):
            n = sub[a]
            if arr.size and (arr.min() < -n or arr.max() >= n):
                raise self.error(
                    f"index out of range [-{n}, {n}) of axis {a}: min {arr.min()}, max {arr.max()}",
                    SubtensorIndexError,
                )
        if self._family == "mavi":
            t = [slice(None)] * (axes[-1] + 1)
            for a, arr in zip(axes, arrays):
                t[a] = arr
            return tuple(t)
        by_axis = dict(zip(axes, arrays))
        t = []
        for a in range(nd):
            shp = [1] * nd
            if self._family == "batched" and (a == 0 or a in by_axis):
                shp[0] = sub[0]
                if a == 0:
                    arr = np.arange(sub[0])
                else:
                    arr = by_axis[a]
                    shp[a] = arr.shape[1]
            else:
                arr = by_axis.get(a)
                if arr is None:
                    arr = np.arange(sub[a])
                shp[a] = arr.size
            t.append(arr.reshape(shp))
        return tuple(t)

    def _indexed_shape_of(self, in_shapes, in_values) -> tuple:
        src = in_shapes[0]
        slices, axes, poss = self._plan(src, lambda p: in_values[p])
        return self._indexed_shape(self._sub_shape(src, slices), axes, [in_shapes[p] for p in poss])

    def infer_shapes(self, in_shapes, in_values):
        shp = self._indexed_shape_of(in_shapes, in_values)
        if not self._modify:
            return [shp]
        try:
            ok = np.broadcast_shapes(in_shapes[1], shp) == shp
        except ValueError:
            ok = False
        if not ok:
            raise self.error(
                f"value shape {fmt_shape(in_shapes[1])} can not be broadcast to the indexed "
                f"shape {fmt_shape(shp)}"
            )
        return [in_shapes[0]]

    def inplace_input(self):
        return 0 if self._modify else None

    def bind(self, ins, outs):
        src, out = ins[0], outs[0]
        slices, axes, poss = self._plan(src.shape, lambda p: ins[p])
        idx = [ins[p] for p in poss]
        mode = self._modify
        if mode is None:

            def run():
                view = src[slices]
                np.copyto(out, view[self._index_tuple(view.shape, axes, idx)])

            return run
        value, same = ins[1], same_elements(out, src)

        def run_modify():
            _copy_unless_same(out, src, same)
            view = out[slices]
            t = self._index_tuple(view.shape, axes, idx)
            if mode == "set":
                view[t] = value
            else:
                np.add.at(view, t, value)

        return run_modify

    # ---- gradients ------------------------------------------------------------------------
    def grad(self, wrt_idx, out_grads):
        og = out_grads[0]
        if og is None or wrt_idx >= self._first:
            return None
        get, set_, incr = _FAMILIES[self._family]
        index = self.inputs[self._first :]
        if self._modify is None:
            ins = [_zeros_like(self.inputs[0]).node, og, *index]
            return _insert(incr, ins, self.param)
        if wrt_idx == 0:
            if self._modify == "incr":
                return og
            return _insert(set_, [og, _zero_scalar(self.inputs[0]).node, *index], self.param)
        return reduce_to_input(_insert(get, [og, *index], self.param), self.inputs[1])

    def default_name(self):
        return f"{self.type_name}({','.join(v.name for v in self.inputs[: self._first])})"


def _family(names: tuple, family: str, doc: str):
    """Register the (get, set, incr) operator classes of one family."""
    docs = (
        doc,
        f"(src, value, index...): a copy of src with the elements {names[0]} selects set to "
        "value (broadcast).",
        f"(src, value, index...): a copy of src with value (broadcast) added to the elements "
        f"{names[0]} selects; repeated indices accumulate.",
    )
    classes = []
    for name, modify, d in zip(names, (None, "set", "incr"), docs):
        attrs = {
            "_family": family,
            "_first": 1 if modify is None else 2,
            "_modify": modify,
            "__doc__": d,
            "__module__": __name__,
            "__qualname__": name,
        }
        classes.append(register_opr(type(name, (_VecIndexBase,), attrs)))
    return tuple(classes)


_FAMILIES = {
    "mavi": _family(
        ("IndexingMultiAxisVec", "IndexingSetMultiAxisVec", "IndexingIncrMultiAxisVec"),
        "mavi",
        "(src, index...): NumPy integer-array indexing on some axes, slices on others; the "
        "indexed axes become the broadcast index shape, in place when they are adjacent, "
        "first otherwise.",
    ),
    "mesh": _family(
        ("MeshIndexing", "SetMeshIndexing", "IncrMeshIndexing"),
        "mesh",
        "(src, index...): the Cartesian product of 1-d indices on their axes.",
    ),
    "batched": _family(
        ("BatchedMeshIndexing", "BatchedSetMeshIndexing", "BatchedIncrMeshIndexing"),
        "batched",
        "(src, index...): per entry b of axis 0, the mesh of the rows index[b] of (batch, k) "
        "indices.",
    ),
}
IndexingMultiAxisVec, IndexingSetMultiAxisVec, IndexingIncrMultiAxisVec = _FAMILIES["mavi"]
MeshIndexing, SetMeshIndexing, IncrMeshIndexing = _FAMILIES["mesh"]
BatchedMeshIndexing, BatchedSetMeshIndexing, BatchedIncrMeshIndexing = _FAMILIES["batched"]


# the reference dumps the index desc as IndexDescMaskDump, the index vars as inputs
for _classes in _FAMILIES.values():
    for _cls in _classes:
        register_index_desc_opr(_cls, IndexDescParam)


def _cvt_index(src, idx, allow_newaxis: bool = False) -> tuple[tuple, list, list]:
    """(descs, index vars, new axes) of ``idx``: ints, slices, int arrays / vars, one ``...``
    and, with ``allow_newaxis``, ``None`` (an axis of size 1 added to ``src`` first; the
    other items index the var with those axes)."""
    if not isinstance(idx, tuple):
        idx = (idx,)
    if any(i is Ellipsis for i in idx):
        if sum(i is Ellipsis for i in idx) > 1:
            raise IndexError("only one ellipsis is allowed")
        shape = static_shape(src)
        if shape is None:
            raise IndexError(f"... needs the static ndim of {src.name!r}, which is unknown")
        k = idx.index(Ellipsis)
        ndim = len(shape) + sum(i is None for i in idx)
        idx = idx[:k] + (slice(None),) * (ndim - len(idx) + 1) + idx[k + 1 :]
    descs, values, new_axes = [], [], []
    for axis, item in enumerate(idx):
        if item is None:
            if not allow_newaxis:
                raise IndexError("newaxis (None) is not allowed when setting by index")
            new_axes.append(axis)
            continue
        if isinstance(item, slice):
            desc, parts = slice_desc(axis, item)
            if desc is not None:
                descs.append(desc)
                values.extend(int_var(p if as_var(p) else np.array([p]), src) for p in parts)
            continue
        v = as_var(item)
        if v is None:
            arr = np.asarray(item)
            if arr.dtype == np.bool_ or (arr.dtype.kind not in "iu" and arr.size):
                raise IndexError(f"bad index {item!r}: int arrays, ints and slices only")
            v = int_var(arr.reshape(1) if arr.ndim == 0 else arr, src)
        elif v.dtype.kind not in "iu":
            raise IndexError(f"index var {v.name!r} must be an int var, got {v.dtype}")
        descs.append((axis, "index", False, False, False, True))
        values.append(v)
    return tuple(descs), values, new_axes


class _VecIndexer:
    """``obj[idx]`` inserts a vector indexing operator (``advanced_indexing(x)[idx]``)."""

    def __init__(self, cls, src, value, cfg, what: str):
        self._cls, self._src, self._value, self._cfg = cls, src, value, cfg
        self._what = what  # the function that made this indexer, for error messages

    def __getitem__(self, idx) -> SymbolVar:
        cfg = self._cfg
        getter = self._value is _GETTER
        if getter:
            data = canonize_input_vars([self._src], config=cfg, what=self._what, names=("src",))
        else:
            data = canonize_input_vars(
                [self._src, self._value], config=cfg, what=self._what, names=("src", "value")
            )
        descs, values, new_axes = _cvt_index(data[0], idx, allow_newaxis=getter)
        if new_axes:
            data[0] = add_axis(data[0], new_axes).node
        if not any(d[1] == "index" for d in descs):
            raise IndexError("vector indexing needs an int array index; use var[idx] for slices")
        return insert_opr(self._cls([*data, *values], IndexDescParam(descs), cfg))[0]


# the value of a getter's indexer: None is a bad value of a setter, not "no value"
_GETTER = object()


def _indexer(cls, src, value, name, comp_node, config) -> _VecIndexer:
    what = sys._getframe(1).f_code.co_name  # the public function calling: advanced_indexing...
    return _VecIndexer(cls, src, value, _merge_config(name, comp_node, config), what)


def advanced_indexing(src, *, name=None, comp_node=None, config=None) -> _VecIndexer:
    """``advanced_indexing(src)[idx]``: NumPy-style indexing by int arrays (lists, arrays or
    int vars) on some axes and ints / slices on others (``IndexingMultiAxisVec``).

    An int indexes like a one-element array, so ``advanced_indexing(x)[1]`` keeps the axis
    with size 1, as in MegBrain.
    """
    return _indexer(IndexingMultiAxisVec, src, _GETTER, name, comp_node, config)


def set_advanced_indexing(src, value, *, name=None, comp_node=None, config=None):
    """``set_advanced_indexing(src, value)[idx]``: ``src`` with ``src[idx] = value``."""
    return _indexer(IndexingSetMultiAxisVec, src, value, name, comp_node, config)


def incr_advanced_indexing(src, value, *, name=None, comp_node=None, config=None):
    """``incr_advanced_indexing(src, value)[idx]``: ``src`` with ``value`` added at ``idx``
    (repeated indices accumulate)."""
    return _indexer(IndexingIncrMultiAxisVec, src, value, name, comp_node, config)


def mesh_indexing(src, *, name=None, comp_node=None, config=None) -> _VecIndexer:
    """``mesh_indexing(src)[idx]``: each 1-d index selects on its own axis (the Cartesian
    product, like ``src[np.ix_(...)]``; ``MeshIndexing``)."""
    return _indexer(MeshIndexing, src, _GETTER, name, comp_node, config)


def set_mesh_indexing(src, value, *, name=None, comp_node=None, config=None):
    """``set_mesh_indexing(src, value)[idx]``: ``src`` with its mesh at ``idx`` set."""
    return _indexer(SetMeshIndexing, src, value, name, comp_node, config)


def incr_mesh_indexing(src, value, *, name=None, comp_node=None, config=None):
    """``incr_mesh_indexing(src, value)[idx]``: ``src`` with ``value`` added to its mesh."""
    return _indexer(IncrMeshIndexing, src, value, name, comp_node, config)


def batched_mesh_indexing(src, *, name=None, comp_node=None, config=None) -> _VecIndexer:
    """``batched_mesh_indexing(src)[:, idx1, ...]``: per entry ``b`` of axis 0, the mesh of
    the index rows ``idx[b]`` ((batch, k) int arrays; ``BatchedMeshIndexing``)."""
    return _indexer(BatchedMeshIndexing, src, _GETTER, name, comp_node, config)


def batched_set_mesh_indexing(src, value, *, name=None, comp_node=None, config=None):
    """``batched_set_mesh_indexing(src, value)[idx]``: the batched mesh of ``src`` set."""
    return _indexer(BatchedSetMeshIndexing, src, value, name, comp_node, config)


def batched_incr_mesh_indexing(src, value, *, name=None, comp_node=None, config=None):
    """``batched_incr_mesh_indexing(src, value)[idx]``: ``value`` added to the batched mesh."""
    return _indexer(BatchedIncrMeshIndexing, src, value, name, comp_node, config)


def indexing_one_hot(
    src, axis: int, index, keepdims: bool = False, *, name=None, comp_node=None, config=None,
    comp_graph=None,
) -> SymbolVar:  # fmt: skip
    """``src`` indexed along ``axis`` by one index per position (``IndexingOneHot``).

    Parameters
    ----------
    src : SymbolVar
        The input.
    axis : int
        The indexed axis.
    index : SymbolVar or array_like
        Int indices of src's shape without ``axis``.
    keepdims : bool
        Keep ``axis`` with size 1 (the operator's own output) instead of removing it.
    """
    cfg = _merge_config(name, comp_node, config)
    (v,) = canonize_input_vars([src], comp_graph=comp_graph, config=cfg)
    axis = as_axis(axis, "indexing_one_hot")
    out = insert_opr(IndexingOneHot([v, int_var(index, v)], AxisParam(axis), cfg))[0]
    if keepdims:
        return out
    return remove_axis(out, axis)


def indexing_set_one_hot(
    src, axis: int, index, value, *, name=None, comp_node=None, config=None, comp_graph=None
) -> SymbolVar:
    """``src`` with the elements :func:`indexing_one_hot` reads set to ``value``
    (``IndexingSetOneHot``); ``value`` has the one-hot output shape, with or without
    ``axis``."""
    cfg = _merge_config(name, comp_node, config)
    axis = as_axis(axis, "indexing_set_one_hot")
    v, val = canonize_input_vars([src, value], comp_graph=comp_graph, config=cfg)
    ss, vs = static_shape(v), static_shape(val)
    if ss is not None and vs is not None and len(vs) == len(ss) - 1:
        val = add_axis(SymbolVar(val), axis % len(ss)).node
    param = AxisParam(axis)
    return insert_opr(IndexingSetOneHot([v, int_var(index, v), val], param, cfg))[0]


# ---- IndexingRemap ---------------------------------------------------------------------------
@dataclass(frozen=True)
@table_param(pdefs.IndexingRemap)
class IndexingRemapParam(ParamBase):
    """Param of IndexingRemap: ``is_non_overlapping`` promises that no two output positions
    read one src element (unused on CPU)."""


class _RemapBase(OperatorNodeBase):
    Param = IndexingRemapParam

    def _check_map(self, src: tuple, map_: tuple) -> None:
        if len(map_) < 1 or map_[-1] != len(src):
            raise self.error(
                f"map shape {fmt_shape(map_)} must end with the src ndim {len(src)} "
                f"(src {fmt_shape(src)})"
            )

    def _where(self, map_: np.ndarray, shape: tuple) -> tuple:
        m = np.moveaxis(map_.astype(np.intp), -1, 0)
        for a, (ix, n) in enumerate(zip(m, shape)):
            if ix.size and (ix.min() < 0 or ix.max() >= n):
                raise self.error(
                    f"map out of range [0, {n}) on axis {a}: min {ix.min()}, max {ix.max()}",
                    SubtensorIndexError,
                )
        return tuple(m)


@register_opr
class IndexingRemap(_RemapBase):
    """(src, map): ``out[i...] = src[map[i..., 0], map[i..., 1], ...]``; the map has shape
    ``out_shape + (src.ndim,)``."""

    def infer_dtypes(self, in_dtypes):
        check_int(self, in_dtypes[1], "map")
        return [in_dtypes[0]]

    def infer_shapes(self, in_shapes, in_values):
        self._check_map(*in_shapes)
        return [in_shapes[1][:-1]]

    def bind(self, ins, outs):
        src, map_, out = ins[0], ins[1], outs[0]

        def run():
            np.copyto(out, src[self._where(map_, src.shape)])

        return run

    def grad(self, wrt_idx, out_grads):
        if wrt_idx != 0 or out_grads[0] is None:
            return None
        ins = [out_grads[0], self.inputs[1], self.inputs[0]]
        return _insert(IndexingRemapBackward, ins, self.param)


@register_opr
class IndexingRemapBackward(_RemapBase):
    """(diff, map, src): zeros of src's shape with each ``diff[i...]`` added at
    ``map[i...]``; the gradient of IndexingRemap."""

    shape_only_inputs = (2,)

    def infer_dtypes(self, in_dtypes):
        check_int(self, in_dtypes[1], "map")
        return [in_dtypes[0]]

    def infer_shapes(self, in_shapes, in_values):
        diff, map_, src = in_shapes
        self._check_map(src, map_)
        if tuple(diff) != tuple(map_[:-1]):
            raise self.error(f"diff shape {fmt_shape(diff)} must be {fmt_shape(map_[:-1])}")
        return [src]

    def bind(self, ins, outs):
        diff, map_, out = ins[0], ins[1], outs[0]

        def run():
            out.fill(0)
            np.add.at(out, self._where(map_, out.shape), diff)

        return run

    def grad(self, wrt_idx, out_grads):
        if wrt_idx != 0 or out_grads[0] is None:
            return None
        return _insert(IndexingRemap, [out_grads[0], self.inputs[1]], self.param)


@opr_params(("param", "IndexingRemap"))
def indexing_remap(
    src, map_, is_non_overlapping: bool = False, *, name=None, comp_node=None, config=None,
    comp_graph=None,
) -> SymbolVar:  # fmt: skip
    """``src`` gathered at the coordinates in ``map_`` (shape ``out_shape + (src.ndim,)``;
    registry name ``IndexingRemap``)."""
    cfg = _merge_config(name, comp_node, config)
    (v,) = canonize_input_vars([src], comp_graph=comp_graph, config=cfg)
    param = IndexingRemapParam(bool(is_non_overlapping))
    return insert_opr(IndexingRemap([v, int_var(map_, v)], param, cfg))[0]


# ---- serialization of the one-hot and remap operators (serialization/sereg.py) -----------
for _cls in (IndexingOneHot, IndexingSetOneHot):
    sereg.register_param_opr(_cls, pdefs.Axis)
for _cls in (IndexingRemap, IndexingRemapBackward):
    sereg.register_param_opr(_cls, pdefs.IndexingRemap)
