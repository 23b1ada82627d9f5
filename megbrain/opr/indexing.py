"""Basic indexing operators: Subtensor (a view), SetSubtensor and IncrSubtensor, plus the
``__getitem__`` conversion of SymbolVar (the reference's helper.py ``cvt_getitem_to_idx_desc``).

The index is a tuple of axis descs in the param; the begin/end/step/index values are extra
int inputs (ImmutableTensors for Python ints), so shapes are static when they are inferable.
Gradients reuse the same param and index inputs: Subtensor's is an IncrSubtensor into zeros,
the modifying operators' are Subtensor (and SetSubtensor) of the output gradient.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..errors import MegBrainError, SerializationError
from ..graph import OperatorNodeBase, ParamBase, register_opr
from ..graph.operator import fmt_shape
from ..graph.static_infer import DynamicShapeError, infer_shape
from ..graph.static_infer import infer_value as static_value
from ..kernels.arrays import same_elements
from ..serialization import sereg
from ._internal import provide, reduce_to_input, sv
from .base import SymbolVar, _merge_config, as_var, canonize_input_vars, insert_opr, make_immutable
from .basic_arith import fill_retain_dtype
from .tensor_manip import add_axis

__all__ = [
    "Subtensor",
    "SetSubtensor",
    "IncrSubtensor",
    "SubtensorIndexError",
    "subtensor_getitem",
    "set_subtensor",
    "incr_subtensor",
]


class SubtensorIndexError(MegBrainError, IndexError):
    """An index out of range for the indexed shape."""


@dataclass(frozen=True)
class AxisDescsParam(ParamBase):
    """Param of the operators indexing by axis descs (Subtensor's and the vector indexing
    families'): ``descs`` holds ``(axis, kind, has_begin, has_end, has_step, has_idx)``
    tuples, kind ``"interval"`` (the present begin / end / step are index inputs) or
    ``"index"`` (one index input), in the order of the operator's index inputs.

    Each desc is checked (an interval has no index, an index no bounds; with ``_nonneg`` the
    axis is not negative), the error naming ``_what``; then the subclass's ``_check``.
    """

    descs: tuple = ()
    _what: ClassVar[str] = ""
    _nonneg: ClassVar[bool] = False

    def __post_init__(self):
        super().__post_init__()
        descs = tuple(
            (int(a), str(k), bool(b), bool(e), bool(s), bool(i)) for a, k, b, e, s, i in self.descs
        )
        for d in descs:
            interval = d[1] == "interval" and not d[5]
            index = d[1] == "index" and d[5] and not any(d[2:5])
            if not (interval or index) or (self._nonneg and d[0] < 0):
                raise MegBrainError(f"bad {self._what} axis desc {d!r}")
        self._check(descs)
        object.__setattr__(self, "descs", descs)

    def _check(self, descs: tuple) -> None:
        """Raise for descs that are each valid but wrong together."""


def slice_desc(axis: int, item: slice) -> tuple[tuple | None, list]:
    """The interval desc of ``item`` on ``axis`` and its present bounds (start, stop, step
    that are not None), or ``(None, [])`` for the full slice, which indexes nothing."""
    parts = (item.start, item.stop, item.step)
    if all(p is None for p in parts):
        return None, []
    return (axis, "interval", *(p is not None for p in parts), False), [
        p for p in parts if p is not None
    ]


@dataclass(frozen=True)
class SubtensorParam(AxisDescsParam):
    """Param of the Subtensor family: axes may be negative (counted from the end)."""

    _what: ClassVar[str] = "Subtensor"

    def _check(self, descs):
        if len({d[0] for d in descs}) != len(descs):
            raise MegBrainError(f"Subtensor: an axis is indexed twice in {descs!r}")

    @property
    def nr_values(self) -> int:
        return sum(sum(d[2:]) for d in self.descs)


def _sub_shape(shape: tuple, idx: tuple) -> tuple:
    """The shape ``idx`` selects from ``shape`` (indexing a zero-stride dummy array)."""
    view = np.broadcast_to(np.empty((), np.bool_), shape)[idx]
    return view.shape if view.ndim else (1,)


class _IndexedOpr(OperatorNodeBase):
    """Shared by the Subtensor family: index inputs start at ``_first_index``."""

    Param = SubtensorParam
    _first_index = 1

    def __init__(self, inputs, param=None, config=None):
        super().__init__(inputs, param, config)
        idx = tuple(range(self._first_index, len(self.inputs)))
        self.static_only_inputs = idx
        if len(idx) != param.nr_values:
            raise MegBrainError(
                f"{self.type_name}: {param.nr_values} index inputs expected, got {len(idx)}"
            )

    def infer_dtypes(self, in_dtypes):
        # float indices are taken when integral, as the reference's static_cast_dtype_safe
        # (a detector's gt_boxes[:im_info[4]] slices by a float32 count)
        for d, v in zip(in_dtypes[self._first_index :], self.inputs[self._first_index :]):
            if d.kind not in "iuf":
                raise self.error(f"index var {v.name!r} must be an int or float var, got {d}")
        return super().infer_dtypes(in_dtypes)

    def _index(self, shape: tuple, vals: list) -> tuple:
        """The NumPy basic index of the descs applied to ``shape`` with index ``vals``."""
        ndim = len(shape)
        idx = [slice(None)] * ndim
        it = iter(vals)
        for axis, kind, *has in self.param.descs:
            ax = axis + ndim if axis < 0 else axis
            if not 0 <= ax < ndim:
                raise self.error(
                    f"axis {axis} out of range for shape {fmt_shape(shape)}", SubtensorIndexError
                )
            got = [self._scalar(next(it)) if h else None for h in has]
            if kind == "index":
                i = got[3]
                if not -shape[ax] <= i < shape[ax]:
                    raise self.error(
                        f"index {i} out of range for axis {ax} of shape {fmt_shape(shape)}",
                        SubtensorIndexError,
                    )
                idx[ax] = i
            else:
                if got[2] == 0:
                    raise self.error(f"slice step must not be 0 (axis {ax})")
                idx[ax] = slice(*got[:3])
        return (*idx, Ellipsis)

    def _scalar(self, val) -> int:
        arr = np.asarray(val)
        if arr.size != 1 or arr.dtype.kind not in "iuf":
            raise self.error(f"index value must be one int, got {arr.dtype} {fmt_shape(arr.shape)}")
        x = arr.reshape(-1)[0]
        if arr.dtype.kind == "f" and not (np.isfinite(x) and x == int(x)):
            raise self.error(f"index value {x} ({arr.dtype}) is not an integer")
        return int(x)

    def _sub(self, arr: np.ndarray, ins: list) -> np.ndarray:
        """The view of ``arr`` the index selects; shape (1,) when every axis is indexed."""
        view = arr[self._index(arr.shape, ins[self._first_index :])]
        return view.reshape(1) if view.ndim == 0 else view

    def _same_index(self, cls, *vars_) -> SymbolVar:
        """``cls`` over ``vars_`` followed by this operator's index inputs and param."""
        nodes = [sv(v).node for v in vars_] + self.inputs[self._first_index :]
        return insert_opr(cls(nodes, self.param))[0]


@register_opr
class Subtensor(_IndexedOpr):
    """``src[idx]`` with slices and integer indices: a view of ``src``."""

    def __init__(self, inputs, param=None, config=None):
        super().__init__(inputs, param, config)
        self.value_deps = self.static_only_inputs

    def infer_shapes(self, in_shapes, in_values):
        shape = in_shapes[0]
        idx = self._index(shape, [in_values[i] for i in self.value_deps])
        return [_sub_shape(shape, idx)]

    def fwd_views(self, ins):
        return [self._sub(ins[0], ins)]

    def bind(self, ins, outs):
        out, src = outs[0], ins[0]

        def run():
            np.copyto(out, self._sub(src, ins))

        return run

    def grad(self, wrt_idx, out_grads):
        if wrt_idx != 0 or out_grads[0] is None:
            return None  # index inputs are not differentiable
        zeros = fill_retain_dtype(SymbolVar(self.inputs[0]), 0)
        return self._same_index(IncrSubtensor, zeros, out_grads[0]).node

    def default_name(self):
        return f"subtensor({self.inputs[0].name})"


class _ModifySubtensor(_IndexedOpr):
    """(src, value, index...): a copy of ``src`` with the selected part modified by ``value``
    (broadcast to the part's shape); may overwrite ``src`` in place."""

    _first_index = 2

    def _modify(self, sub: np.ndarray, value: np.ndarray) -> None:
        raise NotImplementedError

    def infer_dtypes(self, in_dtypes):
        if len(in_dtypes) < 2 or in_dtypes[1] != in_dtypes[0]:
            raise self.error(
                "value must have the dtype of src, got " + ", ".join(str(d) for d in in_dtypes[:2])
            )
        return super().infer_dtypes(in_dtypes)

    def infer_shapes(self, in_shapes, in_values):
        shape = in_shapes[0]
        # check the value's shape now when the index values are static
        idx_vars = self.inputs[self._first_index :]
        if all(v.value_static for v in idx_vars):
            try:
                vals = [static_value(v) for v in idx_vars]
            except DynamicShapeError:
                vals = [None]
            if all(v is not None for v in vals):
                sub = _sub_shape(shape, self._index(shape, vals))
                self._check_value(sub, in_shapes[1])
        return [shape]

    def _check_value(self, sub_shape, value_shape):
        try:
            np.broadcast_shapes(value_shape, sub_shape)
        except ValueError:
            ok = False
        else:
            ok = np.broadcast_shapes(value_shape, sub_shape) == tuple(sub_shape)
        if not ok:
            raise self.error(
                f"value shape {fmt_shape(value_shape)} can not be broadcast to the "
                f"subtensor shape {fmt_shape(sub_shape)}"
            )

    def inplace_input(self):
        return 0

    def bind(self, ins, outs):
        out, src, value = outs[0], ins[0], ins[1]
        same = out is src or same_elements(out, src)

        def run():
            if not same:
                np.copyto(out, src)
            sub = self._sub(out, ins)
            self._check_value(sub.shape, value.shape)
            self._modify(sub, value)

        return run

    def _src_grad(self, og):
        raise NotImplementedError

    def grad(self, wrt_idx, out_grads):
        """src: by :meth:`_src_grad`; value: the indexed part of the output gradient,
        summed over the axes ``value`` was broadcast along."""
        og = out_grads[0]
        if og is None or wrt_idx >= self._first_index:
            return None  # index inputs are not differentiable
        if wrt_idx == 0:
            return self._src_grad(og)
        return reduce_to_input(self._same_index(Subtensor, og), self.inputs[1])


@register_opr
class SetSubtensor(_ModifySubtensor):
    """``src`` with ``src[idx] = value``."""

    def _modify(self, sub, value):
        sub[...] = value

    def _src_grad(self, og):
        # the overwritten part of src does not reach the output
        src = self.inputs[0]
        zero = make_immutable(src.comp_node, src.graph, np.zeros(1, src.dtype), dtype=src.dtype)
        return self._same_index(SetSubtensor, og, zero).node

    def default_name(self):
        return f"set_subtensor({self.inputs[0].name},{self.inputs[1].name})"


@register_opr
class IncrSubtensor(_ModifySubtensor):
    """``src`` with ``src[idx] += value``."""

    def _modify(self, sub, value):
        np.add(sub, value, out=sub)

    def _src_grad(self, og):
        return og

    def default_name(self):
        return f"incr_subtensor({self.inputs[0].name},{self.inputs[1].name})"


# ---- serialization (megbrain/serialization/sereg.py) -------------------------------------
def register_index_desc_opr(cls: type, param_cls: type) -> None:
    """Register an operator whose param is an index desc tuple (``descs`` of
    ``(axis, kind, has_begin, has_end, has_step, has_idx)``): the file holds the reference's
    ``IndexDescMaskDump`` (per axis: axis and which of begin/end/step/idx are inputs) and
    the index vars are the operator's inputs after src (and value).

    Parameters
    ----------
    cls:
        The operator class.
    param_cls:
        Its Param class, built as ``param_cls(descs)``.
    """
    table = sereg.CPP_PARAMS["IndexDescMaskDump"]

    def to_def(param):
        return table(items=[(a, b, e, s, i) for a, _, b, e, s, i in param.descs])

    def from_def(d):
        descs = tuple(
            (a, "index" if i else "interval", b, e, s, i) for a, b, e, s, i in d.items
        )
        try:
            return param_cls(descs)
        except MegBrainError as exc:
            raise SerializationError(f"{cls.type_name}: bad IndexDescMaskDump: {exc}") from None

    sereg.register_param_opr(cls, table, to_def=to_def, from_def=from_def)


for _cls in (Subtensor, SetSubtensor, IncrSubtensor):
    register_index_desc_opr(_cls, SubtensorParam)


# ---- __getitem__ conversion ----------------------------------------------------------------
def _cvt_getitem(src: SymbolVar, idx, allow_newaxis: bool = True):
    """``(src with newaxes added, descs, index vars)`` of ``src[idx]``.

    Follows ``cvt_getitem_to_idx_desc``: axes after an Ellipsis are negative; ``None`` adds an
    axis to the input before indexing; a full slice ``:`` produces no desc.
    """
    if not isinstance(idx, tuple):
        idx = (idx,)
    node = src.node
    try:
        shape = infer_shape(node)
    except DynamicShapeError:
        shape = None
    consuming = [i for i in idx if i is not None and i is not Ellipsis]
    if sum(i is Ellipsis for i in idx) > 1:
        raise IndexError("only one ellipsis is allowed")
    if shape is not None and len(consuming) > len(shape):
        raise IndexError(
            f"too many indices ({len(consuming)}) for var {node.name!r} of shape {fmt_shape(shape)}"
        )

    def as_index_var(v):
        var = as_var(v)
        if var is not None:
            if var.dtype.kind not in "iuf":
                raise IndexError(
                    f"index var {var.name!r} must be an int or float var, got {var.dtype}"
                )
            return var
        if isinstance(v, (bool, np.bool_)):
            raise IndexError(f"bad index {v!r}: boolean indexing is not supported")
        try:
            i = operator.index(v)
        except TypeError:
            raise IndexError(
                f"bad index {v!r}: Subtensor takes ints, slices, int vars, None and ...; "
                "use advanced_indexing for arrays"
            ) from None
        return make_immutable(node.comp_node, node.graph, np.array([i], np.int32)).node

    descs, values, new_axes = [], [], []
    cur = -1
    for pos, item in enumerate(idx):
        cur += 1
        if item is None:
            if cur >= 0:
                new_axes.append(cur)
            continue
        if item is Ellipsis:
            cur = -1
            for later in idx[:pos:-1]:
                if later is None:
                    new_axes.append(cur)
                cur -= 1
            continue
        if isinstance(item, slice):
            desc, parts = slice_desc(cur, item)
            if desc is not None:
                descs.append(desc)
                values.extend(as_index_var(p) for p in parts)
        else:
            descs.append((cur, "index", False, False, False, True))
            values.append(as_index_var(item))
    if new_axes:
        if not allow_newaxis:
            raise IndexError("newaxis is not allowed here")
        src = add_axis(src, new_axes)
    return src, tuple(descs), values


def subtensor_getitem(var, idx, *, name=None, comp_node=None, config=None) -> SymbolVar:
    """``var[idx]`` (``SymbolVar.__getitem__``): ints, slices with int or int-var bounds, int
    vars, ``None`` (a new axis) and one ``...``; every axis indexed gives shape (1,)."""
    cfg = _merge_config(name, comp_node, config)
    (v,) = canonize_input_vars([var], config=cfg)
    src, descs, values = _cvt_getitem(SymbolVar(v), idx)
    if not descs:
        return src
    return insert_opr(Subtensor([src.node, *values], SubtensorParam(descs), cfg))[0]


class _ModifyIndexer:
    """``obj[idx]`` builds the modifying operator of ``set_subtensor(src, value)[idx]`` and kin."""

    def __init__(self, cls, src, value, cfg, what: str):
        self._cls, self._src, self._value, self._cfg = cls, src, value, cfg
        self._what = what  # the function that made this indexer, for error messages

    def __getitem__(self, idx) -> SymbolVar:
        src, value = canonize_input_vars(
            [self._src, self._value], config=self._cfg, what=self._what, names=("src", "value")
        )
        _, descs, values = _cvt_getitem(SymbolVar(src), idx, allow_newaxis=False)
        opr = self._cls([src, value, *values], SubtensorParam(descs), self._cfg)
        return insert_opr(opr)[0]


def set_subtensor(src, value, *, name=None, comp_node=None, config=None) -> _ModifyIndexer:
    """``set_subtensor(src, value)[idx]``: ``src`` with ``src[idx] = value`` (SetSubtensor)."""
    cfg = _merge_config(name, comp_node, config)
    return _ModifyIndexer(SetSubtensor, src, value, cfg, "set_subtensor")


def incr_subtensor(src, value, *, name=None, comp_node=None, config=None) -> _ModifyIndexer:
    """``incr_subtensor(src, value)[idx]``: ``src`` with ``src[idx] += value``
    (IncrSubtensor)."""
    cfg = _merge_config(name, comp_node, config)
    return _ModifyIndexer(IncrSubtensor, src, value, cfg, "incr_subtensor")


provide(subtensor_getitem)
