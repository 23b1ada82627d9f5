"""Shape manipulation operators: GetVarShape, Reshape, Broadcast, Dimshuffle, AxisAddRemove,
Concat and the compile-time ChannelShuffleConcat, with their ``mgb.opr`` functions and
``shape_to_var``.

Reshape, Broadcast, Dimshuffle and AxisAddRemove forward read-only views of their input
(no memory, no work at run time); they copy only when a view is impossible. Their gradients
are built from the same operators (and Subtensor, Reduce), so gradients of gradients work.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..dtype import same_dtype
from ..errors import (
    ArgumentError,
    ConversionError,
    GraphError,
    MegBrainError,
    SerializationError,
    ShapeDescError,
)
from ..graph import OperatorNodeBase, ParamBase, register_opr, table_param
from ..graph.operator import NoGradient, fmt_shape
from ..graph.static_infer import DynamicShapeError, infer_shape
from ..graph.var import InferType
from ..kernels.channel_shuffle import bind_shuffle_nchw88
from ..serialization import sereg
from . import param_defs as _pdefs
from ._internal import dtype_promotion, provide, reduce_to_input, subtensor_getitem, typecvt
from .base import SymbolVar, _merge_config, as_var, canonize_input_vars, insert_opr, make_immutable
from .param_args import as_axes, as_axis, as_int, is_int, opr_params, optional_axis

__all__ = [
    "GetVarShape",
    "Reshape",
    "Broadcast",
    "Dimshuffle",
    "AxisAddRemove",
    "Concat",
    "ChannelShuffleConcat",
    "get_var_shape",
    "reshape",
    "broadcast",
    "dimshuffle",
    "add_axis",
    "remove_axis",
    "concat",
    "shape_to_var",
]

_INT32 = np.dtype(np.int32)


def _shape_value(opr: OperatorNodeBase, val, what: str = "target shape") -> tuple[int, ...]:
    """The int tuple held by a 1-d shape var value."""
    arr = np.asarray(val)
    if arr.dtype.kind not in "iu" or arr.ndim > 1:
        raise opr.error(f"{what} must be a 1-d int var, got {arr.dtype} {fmt_shape(arr.shape)}")
    return tuple(int(x) for x in arr.reshape(-1))


class _ViewOpr(OperatorNodeBase):
    """An operator whose output is a view of input 0 (or, for Reshape, a copy if it must)."""

    def _view(self, ins: list[np.ndarray]) -> np.ndarray | None:
        raise NotImplementedError

    def fwd_views(self, ins):
        view = self._view(ins)
        return None if view is None else [view]

    def bind(self, ins, outs):
        out, src = outs[0], ins[0]
        view = self._view(ins)
        if view is None:  # a reshape of memory that can not be viewed: copy element order
            return functools.partial(np.copyto, out.reshape(src.shape), src)
        return functools.partial(np.copyto, out, view)


# ---- GetVarShape ---------------------------------------------------------------------------
@dataclass(frozen=True)
class GetVarShapeParam(ParamBase):
    #: None: the whole shape; else the size of that axis, as shape (1,)
    axis: int | None = None


@register_opr
class GetVarShape(_ViewOpr):
    """The shape of its input as an int32 1-d var (only the input's shape is read)."""

    Param = GetVarShapeParam
    shape_only_inputs = (0,)

    def infer_dtypes(self, in_dtypes):
        return [_INT32]

    def infer_shapes(self, in_shapes, in_values):
        return [self._value(in_shapes[0]).shape]

    def _value(self, shape) -> np.ndarray:
        axis = self.param.axis
        if axis is None:
            return np.array(shape, _INT32)
        if not -len(shape) <= axis < len(shape):
            raise self.error(f"axis {axis} out of range for shape {fmt_shape(shape)}")
        return np.array([shape[axis]], _INT32)

    def _view(self, ins):
        # the input array when it is there (dynamic shapes), else its static shape
        shape = ins[0].shape if ins[0] is not None else infer_shape(self.inputs[0])
        val = self._value(shape)
        val.flags.writeable = False
        return val

    def infer_value(self, in_values, out_shapes):
        # the inferer hands a stand-in of the input's shape: asking the graph's inferer again
        # here would start a nested inference per GetVarShape
        val = self._value(in_values[0].shape)
        val.flags.writeable = False
        return [val]

    def grad(self, wrt_idx, out_grads):
        return None  # a shape is not differentiable

    def default_name(self):
        return f"shape_of({self.inputs[0].name})"


# ---- Reshape / Broadcast -------------------------------------------------------------------
@dataclass(frozen=True)
class ReshapeParam(ParamBase):
    #: the axis of the target shape computed from the element count (a -1 in NumPy)
    unspec_axis: int | None = None


class _TargetShapeOpr(_ViewOpr):
    """(src, target shape var): the target's value decides the output shape."""

    value_deps = (1,)
    static_only_inputs = (1,)

    def infer_dtypes(self, in_dtypes):
        if len(in_dtypes) != 2:
            raise self.error(f"expected 2 inputs (src, target shape), got {len(in_dtypes)}")
        if in_dtypes[1].kind not in "iu":
            raise self.error(f"target shape must be an int var, got {in_dtypes[1]}")
        return super().infer_dtypes(in_dtypes)

    def infer_shapes(self, in_shapes, in_values):
        return [self._target(in_shapes[0], _shape_value(self, in_values[1]))]

    def _view(self, ins):
        return self._make_view(ins[0], self._target(ins[0].shape, _shape_value(self, ins[1])))

    def _target(self, src: tuple, tshape: tuple) -> tuple:
        raise NotImplementedError

    def _make_view(self, src: np.ndarray, shape: tuple) -> np.ndarray | None:
        raise NotImplementedError


@register_opr
class Reshape(_TargetShapeOpr):
    """Reshape to the target shape (a view when the memory allows, else a copy)."""

    Param = ReshapeParam

    def _target(self, src, tshape):
        total = math.prod(src)
        ua = self.param.unspec_axis
        if ua is not None:
            if not -len(tshape) <= ua < len(tshape):
                raise self.error(
                    f"unspec_axis {ua} out of range for target shape {fmt_shape(tshape)}"
                )
            ua %= len(tshape)
            others = [s for i, s in enumerate(tshape) if i != ua]  # the value at ua is ignored
            rest = math.prod(others)
            if rest <= 0 or total % rest or min(others, default=0) < 0:
                shown = ",".join("?" if i == ua else str(s) for i, s in enumerate(tshape))
                raise self.error(f"can not reshape {fmt_shape(src)} to {{{shown}}}")
            return tshape[:ua] + (total // rest,) + tshape[ua + 1 :]
        if any(s < 0 for s in tshape) or math.prod(tshape) != total:
            raise self.error(
                f"can not reshape {fmt_shape(src)} ({total} elements) to {fmt_shape(tshape)}"
            )
        return tshape

    def _make_view(self, src, shape):
        try:
            return np.reshape(src, shape, copy=False)
        except ValueError:
            return None

    def grad(self, wrt_idx, out_grads):
        if wrt_idx != 0 or out_grads[0] is None:
            return None  # the target shape is not differentiable
        return reshape(out_grads[0], get_var_shape(self.inputs[0])).node

    def default_name(self):
        return f"reshape({self.inputs[0].name})"


@register_opr
class Broadcast(_TargetShapeOpr):
    """Broadcast to the target shape with NumPy rules (a read-only zero-stride view)."""

    def _target(self, src, tshape):
        ok = len(src) <= len(tshape) and all(s in (1, t) for s, t in zip(src[::-1], tshape[::-1]))
        if not ok or any(t < 0 for t in tshape):
            raise self.error(f"can not broadcast {fmt_shape(src)} to {fmt_shape(tshape)}")
        return tshape

    def _make_view(self, src, shape):
        return np.broadcast_to(src, shape)

    def grad(self, wrt_idx, out_grads):
        if wrt_idx != 0 or out_grads[0] is None:
            return None
        return reduce_to_input(out_grads[0], self.inputs[0])

    def default_name(self):
        return f"broadcast({self.inputs[0].name})"


# ---- Dimshuffle / AxisAddRemove ------------------------------------------------------------
@dataclass(frozen=True)
class DimshuffleParam(ParamBase):
    #: input axis of each output axis; -1 adds an axis of size 1
    pattern: tuple = ()
    #: the input's ndim
    ndim: int = 0

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "pattern", tuple(int(i) for i in self.pattern))
        for i in self.pattern:
            if not -1 <= i < self.ndim:
                raise GraphError(f"bad Dimshuffle pattern {self.pattern} for ndim {self.ndim}")


@register_opr
class Dimshuffle(_ViewOpr):
    """Permute axes, add size-1 axes (-1 in the pattern) and drop unlisted size-1 axes."""

    Param = DimshuffleParam

    def infer_shapes(self, in_shapes, in_values):
        return [self._layout(in_shapes[0], (0,) * len(in_shapes[0]))[0]]

    def _layout(self, shape, strides):
        p = self.param
        if len(shape) != p.ndim:
            raise self.error(
                f"input ndim mismatch: pattern {p.pattern} expects ndim {p.ndim}, "
                f"got shape {fmt_shape(shape)}"
            )
        for i, s in enumerate(shape):
            if i not in p.pattern and s != 1:
                raise self.error(f"non-1 axis {i} of shape {fmt_shape(shape)} is discarded")
        oshp = tuple(1 if i < 0 else shape[i] for i in p.pattern)
        ostr = tuple(0 if i < 0 else strides[i] for i in p.pattern)
        return oshp, ostr

    def _view(self, ins):
        src = ins[0]
        shape, strides = self._layout(src.shape, src.strides)
        dup = len({i for i in self.param.pattern if i >= 0}) != sum(
            i >= 0 for i in self.param.pattern
        )
        return np.lib.stride_tricks.as_strided(
            src, shape, strides, writeable=bool(src.flags.writeable and not dup)
        )

    def grad(self, wrt_idx, out_grads):
        """The inverse dimshuffle: added axes (size 1) are dropped, dropped ones re-added."""
        p = self.param
        if out_grads[0] is None:
            return None
        kept = [i for i in p.pattern if i >= 0]
        if len(set(kept)) != len(kept):
            raise self.error(f"pattern {p.pattern} repeats an axis: no gradient", NoGradient)
        inv = tuple(p.pattern.index(i) if i in kept else "x" for i in range(p.ndim))
        return dimshuffle(out_grads[0], inv, len(p.pattern)).node

    def default_name(self):
        return f"dimshuffle({self.inputs[0].name})"


@dataclass(frozen=True)
class AxisAddRemoveParam(ParamBase):
    #: ``(("add" | "remove", axis), ...)`` applied in order; a negative axis counts from the
    #: end of the shape it applies to (for "add", of the shape after adding)
    desc: tuple = ()

    def __post_init__(self):
        super().__post_init__()
        desc = tuple((str(m).lower(), int(a)) for m, a in self.desc)
        if not desc or any(m not in ("add", "remove") for m, _ in desc):
            raise GraphError(f"bad AxisAddRemove desc {self.desc!r}")
        object.__setattr__(self, "desc", desc)


@register_opr
class AxisAddRemove(_ViewOpr):
    """Add or remove size-1 axes; removing the only axis of shape (1,) keeps (1,)."""

    Param = AxisAddRemoveParam

    def infer_shapes(self, in_shapes, in_values):
        return [self._out_shape(in_shapes[0])]

    def _out_shape(self, shape):
        out = list(shape)
        for method, axis in self.param.desc:
            n = len(out) + (method == "add")
            ax = axis + n if axis < 0 else axis
            if not 0 <= ax < n or (method == "remove" and out[ax] != 1):
                raise self.error(
                    f"can not {method} axis {axis} {'to' if method == 'add' else 'from'} "
                    f"shape {fmt_shape(out)} (input shape {fmt_shape(shape)})"
                )
            if method == "add":
                out.insert(ax, 1)
            elif len(out) > 1:
                del out[ax]
        return tuple(out)

    def _view(self, ins):
        return np.reshape(ins[0], self._out_shape(ins[0].shape), copy=False)

    def grad(self, wrt_idx, out_grads):
        """The inverse: the steps reversed with add and remove swapped (a negative axis
        names the same position either way). Removing the only axis keeps shape (1,), which
        has no inverse step: then, or when the input ndim is unknown, reshape instead."""
        og, src = out_grads[0], self.inputs[0]
        if og is None:
            return None
        try:
            ndim = len(infer_shape(src))
        except DynamicShapeError:
            ndim = None
        inverse = []
        for method, axis in self.param.desc:
            if ndim is None or (method == "remove" and ndim == 1):
                return reshape(og, get_var_shape(src)).node
            ndim += 1 if method == "add" else -1
            inverse.append(("remove" if method == "add" else "add", axis))
        param = AxisAddRemoveParam(tuple(reversed(inverse)))
        return insert_opr(AxisAddRemove([SymbolVar(og).node], param))[0].node

    def default_name(self):
        return f"axis_add_rm({self.inputs[0].name})"


# ---- Concat --------------------------------------------------------------------------------
@dataclass(frozen=True)
@table_param(_pdefs.Axis)
class ConcatParam(ParamBase):
    """Param of Concat: the ``axis``."""


@register_opr
class Concat(OperatorNodeBase):
    """Concatenate inputs of one dtype along ``axis``."""

    Param = ConcatParam

    def infer_dtypes(self, in_dtypes):
        if not in_dtypes:
            raise self.error("needs at least one input")
        if any(d != in_dtypes[0] for d in in_dtypes):
            raise self.error(
                "inputs must share one dtype, got " + ", ".join(str(d) for d in in_dtypes)
            )
        return super().infer_dtypes(in_dtypes)

    def infer_comp_node(self):
        cns = {v.comp_node for v in self.inputs}
        if not self.config.comp_nodes and len(cns) > 1:
            raise self.error("inputs are on different comp nodes: the target must be given")
        return super().infer_comp_node()

    def infer_shapes(self, in_shapes, in_values):
        ref = in_shapes[0]
        axis = self.param.axis
        if not -len(ref) <= axis < len(ref):
            raise self.error(f"axis {axis} out of range for shape {fmt_shape(ref)}")
        axis %= len(ref)
        for s in in_shapes:
            if len(s) != len(ref) or any(
                a != b for i, (a, b) in enumerate(zip(s, ref)) if i != axis
            ):
                raise self.error(
                    f"shapes do not match except on axis {axis}: "
                    + ", ".join(fmt_shape(x) for x in in_shapes)
                )
        return [ref[:axis] + (sum(s[axis] for s in in_shapes),) + ref[axis + 1 :]]

    has_input_parts = True

    def input_parts(self, in_shapes, out_shape):
        """An input's part of the output is one contiguous range when the axes before
        ``axis`` have one position (NCHW or NCHW88 channels at batch 1, any axis 0), or when
        the other inputs are empty."""
        axis = self.param.axis % len(out_shape)
        outer = math.prod(out_shape[:axis])
        inner = math.prod(out_shape[axis + 1 :])
        parts, begin = [], 0
        for s in in_shapes:
            n = s[axis]
            parts.append(begin * inner if outer == 1 or n == out_shape[axis] else None)
            begin += n
        return parts

    def bind(self, ins, outs):
        out = outs[0]
        axis = self.param.axis % out.ndim
        copies, begin = [], 0
        for a in ins:
            n = a.shape[axis]
            part = out[(slice(None),) * axis + (slice(begin, begin + n),)]
            begin += n
            if not _is_part(a, part):
                copies.append((part, a))
        if len(copies) == len(ins):
            return functools.partial(np.concatenate, ins, axis, out=out)
        # the memory plan had the producers write these inputs in place
        return functools.partial(_copy_parts, tuple(copies))

    def grad(self, wrt_idx, out_grads):
        """The slice of the output gradient along ``axis`` that input ``wrt_idx`` filled.

        The offsets are sums of the inputs' sizes on ``axis`` (GetVarShape), so a changed or
        dynamic input shape is followed; constant when every input shape is CONST.
        """
        og = out_grads[0]
        if og is None:
            return None
        if len(self.inputs) == 1:
            return og
        axis = self.param.axis

        def size(v):
            if v.shape_type == InferType.CONST:
                return infer_shape(v)[axis]
            return get_var_shape(v, axis)

        begin = None
        for v in self.inputs[:wrt_idx]:
            n = size(v)
            begin = n if begin is None else begin + n
        end = None
        if wrt_idx + 1 < len(self.inputs):
            end = size(self.inputs[wrt_idx])
            if begin is not None:
                end = begin + end
        if axis >= 0:
            idx = (slice(None),) * axis + (slice(begin, end),)
        else:
            idx = (Ellipsis, slice(begin, end)) + (slice(None),) * (-axis - 1)
        return subtensor_getitem(og, idx).node

    def default_name(self):
        return f"concat({','.join(v.name for v in self.inputs)})"


@register_opr
class ChannelShuffleConcat(Concat):
    """The concatenation of ``G`` inputs of one 4-d shape ``(N, C, H, W)`` along the channels
    followed by ShuffleNet's channel shuffle: output channel ``j G + i`` is input ``i``'s
    channel ``j`` (the concatenation reshaped to ``(N, G, C, H, W)``, the two channel axes
    swapped, reshaped back).

    Made at compile time by the ``fuse_channel_shuffle`` pass (:mod:`megbrain.gopt.nchw88`)
    from a Concat and the Reshape, Dimshuffle and Reshape after it, never by a user and never
    written to a graph file. Each input's part of the output is a strided view (every
    ``G``-th channel, :meth:`input_parts`): the static memory plan has a ConvBias producing
    an input write there, and the operator copies only the other inputs.

    Two NCHW88 inputs ``(N, C/8, H, W, 8)`` (``G == 2``) give the shuffle in NCHW88,
    ``(N, 2 C/8, H, W, 8)``: their channels interleave within the 8 lanes, so no input is a
    view of the output and both are copied, in one pass
    (:func:`~megbrain.kernels.channel_shuffle.bind_shuffle_nchw88`)."""

    type_name = "ChannelShuffleConcat"
    short_name = "channel_shuffle_concat"
    #: the producers the memory plan may have write their output into a strided part of
    #: this operator's output (their kernels take any channel stride)
    strided_part_writers = ("ConvBiasForward",)

    def infer_shapes(self, in_shapes, in_values):
        ref = in_shapes[0]
        blocked = len(ref) == 5 and ref[4] == 8 and len(in_shapes) == 2
        if (
            not (len(ref) == 4 or blocked)
            or self.param.axis % len(ref) != 1
            or any(s != ref for s in in_shapes)
        ):
            raise self.error("the channel shuffle takes 4-d inputs of one shape, or two NCHW88 "
                             "inputs of one shape, along axis 1, got "
                             + ", ".join(fmt_shape(s) for s in in_shapes))  # fmt: skip
        return [(ref[0], ref[1] * len(in_shapes), *ref[2:])]

    def input_parts(self, in_shapes, out_shape):
        """Input ``i``'s part: ``(offset, element strides)`` of the view starting at channel
        ``i`` with every ``G``-th channel of the output; none in NCHW88 (lanes interleave)."""
        g = len(in_shapes)
        if len(out_shape) == 5:
            return [None] * g
        n, c, h, w = out_shape
        return [(i * h * w, (c * h * w, g * h * w, w, 1)) for i in range(g)]

    def bind(self, ins, outs):
        out = outs[0]
        if out.ndim == 5:
            return bind_shuffle_nchw88(ins[0], ins[1], out)
        n, c, h, w = out.shape
        g = len(ins)
        blocks = out.reshape(n, c // g, g, h, w)
        copies = tuple((blocks[:, :, i], a) for i, a in enumerate(ins)
                       if not _is_part(a, blocks[:, :, i]))  # fmt: skip
        return functools.partial(_copy_parts, copies)

    def grad(self, wrt_idx, out_grads):
        raise self.error(f"{self.type_name} has no gradient (made at compile time)", NoGradient)


def _is_part(a: np.ndarray, part: np.ndarray) -> bool:
    """Whether ``a`` is the memory of ``part`` (a Concat input its producer wrote in place)."""
    if not a.size:
        return True
    return (
        a.shape == part.shape
        and all(n == 1 or p == q for n, p, q in zip(a.shape, a.strides, part.strides))
        and a.__array_interface__["data"][0] == part.__array_interface__["data"][0]
    )


def _copy_parts(copies) -> None:
    for dst, src in copies:
        np.copyto(dst, src)


# ---- serialization (megbrain/serialization/sereg.py) -------------------------------------
#: param.OptionalAxisV1's "no axis" (MAX_NDIM); valid axes are in [-MAX_NDIM, MAX_NDIM)
_NO_AXIS = _pdefs.OptionalAxisV1.INVALID_AXIS


def _optional_axis_to_def(axis: int | None):
    return _pdefs.OptionalAxisV1(axis=_NO_AXIS if axis is None else axis)


def _optional_axis_from_def(pdef) -> int | None:
    return pdef.axis if -_NO_AXIS <= pdef.axis < _NO_AXIS else None


def _empty_def(param) -> object:
    return _pdefs.Empty()


def _get_var_shape_make(graph, inputs, param, config):
    if len(inputs) != 1:
        # the reference's GetVarShape of several vars gives their broadcast shape
        raise SerializationError(
            f"GetVarShape: the shape of one var is supported, the file gives {len(inputs)} inputs"
        )
    return graph.insert_opr(GetVarShape(list(inputs), param, config))


sereg.register_param_opr(
    GetVarShape,
    _pdefs.OptionalAxisV1,
    to_def=lambda p: _optional_axis_to_def(p.axis),
    from_def=lambda d: GetVarShapeParam(_optional_axis_from_def(d)),
    make=_get_var_shape_make,
    name="GetVarShapeV1",
)
sereg.register_param_opr(
    Reshape,
    _pdefs.OptionalAxisV1,
    to_def=lambda p: _optional_axis_to_def(p.unspec_axis),
    from_def=lambda d: ReshapeParam(_optional_axis_from_def(d)),
    name="ReshapeV1",
)
sereg.register_param_opr(Broadcast, _pdefs.Empty, to_def=_empty_def, from_def=lambda d: None)
sereg.register_param_opr(
    Dimshuffle,
    sereg.CPP_PARAMS["Dimshuffle"],
    to_def=lambda p: sereg.CPP_PARAMS["Dimshuffle"](pattern=list(p.pattern), ndim=p.ndim),
    from_def=lambda d: DimshuffleParam(tuple(d.pattern), d.ndim),
)
#: AxisDescMethod of the file: ADD_1 = 0, REMOVE = 1
_AXIS_METHODS = ("add", "remove")


def _axis_add_remove_from_def(d) -> AxisAddRemoveParam:
    desc = []
    for method, axis in d.desc:
        if not 0 <= method < len(_AXIS_METHODS):
            raise SerializationError(f"AxisAddRemove: bad AxisDescMethod {method} in the file")
        desc.append((_AXIS_METHODS[method], axis))
    return AxisAddRemoveParam(tuple(desc))


sereg.register_param_opr(
    AxisAddRemove,
    sereg.CPP_PARAMS["AxisAddRemove"],
    to_def=lambda p: sereg.CPP_PARAMS["AxisAddRemove"](
        desc=[(_AXIS_METHODS.index(m), a) for m, a in p.desc]
    ),
    from_def=_axis_add_remove_from_def,
)
sereg.register_param_opr(Concat, _pdefs.Axis)
sereg.register_fused(ChannelShuffleConcat,
                     lambda opr: "a Concat and the channel shuffle after it")  # fmt: skip


# ---- functions -----------------------------------------------------------------------------
def _src_var(src, cfg, comp_graph=None):
    (v,) = canonize_input_vars([src], comp_graph=comp_graph, config=cfg)
    return v


@opr_params(("axis", "OptionalAxisV1"), convert={"axis": optional_axis})
def get_var_shape(
    src, axis: int | None = None, *, name=None, comp_node=None, config=None, comp_graph=None
) -> SymbolVar:
    """The shape of ``src`` (or of one axis, as shape (1,)) as an int32 var (GetVarShape)."""
    cfg = _merge_config(name, comp_node, config)
    v = _src_var(src, cfg, comp_graph)
    param = GetVarShapeParam(None if axis is None else as_axis(axis, "get_var_shape"))
    return insert_opr(GetVarShape([v], param, cfg))[0]


def shape_to_var(shape, ref_var, *, what: str = "shape") -> SymbolVar:
    """One int32 1-d var holding ``shape`` (helper.py ``cvt_to_shape_desc``).

    Parameters
    ----------
    shape:
        An int, a sequence of ints, a SymbolVar, or a sequence mixing ints and int vars
        (``x.shape[0]``, or a vector var contributing all its elements); mixed parts are
        concatenated.
    ref_var:
        A var giving the graph and comp node of the constants made.
    what:
        The argument, for messages (``"alloc() shape"``).

    Raises
    ------
    ShapeDescError
        For an element that is neither a Python or NumPy integer (bools and floats such as
        ``1.5`` are refused rather than truncated) nor an int var.
    """
    ref = as_var(ref_var)
    if ref is None:
        raise GraphError(f"shape_to_var: ref_var must be a var, got {ref_var!r}")
    if as_var(shape, ref.graph) is not None:
        return SymbolVar(as_var(shape, ref.graph))
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    if isinstance(shape, np.ndarray):
        shape = shape.reshape(-1).tolist()
    if not isinstance(shape, Sequence) or isinstance(shape, str):
        raise ShapeDescError(f"{what}: bad shape {shape!r}: expected ints or int vars")

    def const(ints):
        return make_immutable(ref.comp_node, ref.graph, int32_shape(ints, what).reshape(-1))

    parts, ints = [], []
    for s in shape:
        var = as_var(s, ref.graph)
        if var is None:
            ints.append(_as_int(s, what))
            continue
        if ints:
            parts.append(const(ints))
            ints = []
        if var.dtype.kind not in "iu":
            raise ShapeDescError(f"{what} element {var.name!r} must be an int var, got {var.dtype}")
        try:
            static = infer_shape(var)
        except DynamicShapeError:
            static = None
        # a vector var contributes all its elements
        parts.append(
            SymbolVar(var) if static is not None and len(static) == 1 else reshape(var, -1)
        )
    if ints or not parts:
        parts.append(const(ints))
    if len(parts) == 1:
        return parts[0]
    if any(p.dtype != _INT32 for p in parts):
        parts = [p if p.dtype == _INT32 else typecvt(p, _INT32) for p in parts]
    return concat(parts, axis=0)


def int32_shape(ints: Sequence[int], what: str = "shape") -> np.ndarray:
    """``ints`` as the int32 array of a shape var; ShapeDescError for an element int32 can
    not hold (numpy would raise an OverflowError naming nothing)."""
    for s in ints:
        if not -(2**31) <= s < 2**31:
            raise ShapeDescError(f"{what}: bad shape element {s}: it does not fit in int32")
    return np.array(ints, _INT32)


def _as_int(s, what: str = "shape") -> int:
    # strict: int() would truncate 1.5 and parse '1'; bools are not sizes either
    if not is_int(s):
        raise ShapeDescError(
            f"{what}: bad shape element {s!r} of type {type(s).__name__}: expected an int (a "
            "Python or NumPy integer) or an int var"
        )
    return int(s)


@opr_params(
    ("unspec_axis", "OptionalAxisV1"),
    rename={"axis": "unspec_axis"},
    convert={"unspec_axis": optional_axis},
)
def reshape(
    src, target_shape, unspec_axis: int | None = None, *, name=None, comp_node=None,
    config=None, comp_graph=None,
) -> SymbolVar:  # fmt: skip
    """Reshape ``src`` to ``target_shape`` (registry name ``Reshape``).

    ``target_shape`` is an int, a sequence of ints and int vars, or an int var; a -1 entry
    becomes ``unspec_axis``, the axis whose size follows from the element count.
    """
    cfg = _merge_config(name, comp_node, config)
    v = _src_var(src, cfg, comp_graph)
    if as_var(target_shape) is None:
        if isinstance(target_shape, (int, np.integer)):
            target_shape = (target_shape,)
        target_shape = list(target_shape)
        for i, s in enumerate(target_shape):
            if as_var(s) is None and _as_int(s, "reshape() target_shape") == -1:
                if unspec_axis is not None:
                    raise GraphError(
                        f"reshape: more than one unknown axis in target shape {target_shape}"
                    )
                unspec_axis = i
                target_shape[i] = 1
    tshp = shape_to_var(target_shape, v, what="reshape() target_shape")
    owner = tshp.node.owner
    if (
        unspec_axis is None
        and isinstance(owner, GetVarShape)
        and owner.param.axis is None
        and owner.inputs[0] is v
    ):
        return SymbolVar(v)  # reshape to its own shape
    param = ReshapeParam(
        None if unspec_axis is None else as_axis(unspec_axis, "reshape", "unspec_axis")
    )
    return insert_opr(Reshape([v, tshp.node], param, cfg))[0]


@opr_params(("param", "Empty"))
def broadcast(
    src, target_shape, *, name=None, comp_node=None, config=None, comp_graph=None
) -> SymbolVar:
    """Broadcast ``src`` to ``target_shape`` (ints, int vars or a mix; ``Broadcast``)."""
    cfg = _merge_config(name, comp_node, config)
    v = _src_var(src, cfg, comp_graph)
    tshp = shape_to_var(target_shape, v, what="broadcast() target_shape")
    owner = tshp.node.owner
    if isinstance(owner, GetVarShape) and owner.param.axis is None and owner.inputs[0] is v:
        return SymbolVar(v)
    return insert_opr(Broadcast([v, tshp.node], None, cfg))[0]


def dimshuffle(
    src, pattern: Sequence, ndim: int = 0, *, name=None, comp_node=None, config=None
) -> SymbolVar:
    """Permute the axes of ``src`` by ``pattern``; ``'x'`` adds an axis of size 1.

    ``ndim`` is the input ndim; 0 means ``max(pattern) + 1``. Input axes missing from the
    pattern must have size 1.
    """
    cfg = _merge_config(name, comp_node, config)
    v = _src_var(src, cfg)
    if isinstance(pattern, str) or not isinstance(pattern, Sequence):
        raise ArgumentError(
            f"dimshuffle(): pattern must be a sequence of ints and 'x', got {pattern!r}"
        )
    pat = tuple(
        -1
        if isinstance(p, str) and p == "x"
        else as_int(p, "dimshuffle", f"pattern[{i}]", "an int axis or 'x'")
        for i, p in enumerate(pattern)
    )
    ndim = as_int(ndim, "dimshuffle", "ndim")
    if not ndim:
        ndim = max(pat, default=-1) + 1
    return insert_opr(Dimshuffle([v], DimshuffleParam(pat, ndim), cfg))[0]


def add_axis(src, axis, *, name=None, comp_node=None, config=None, comp_graph=None) -> SymbolVar:
    """Add size-1 axes at ``axis`` (an int or a list, applied in order; ``AxisAddRemove``)."""
    cfg = _merge_config(name, comp_node, config)
    v = _src_var(src, cfg, comp_graph)
    desc = tuple(("add", a) for a in as_axes(axis, "add_axis"))
    return insert_opr(AxisAddRemove([v], AxisAddRemoveParam(desc), cfg))[0]


def remove_axis(src, axis, *, name=None, comp_node=None, config=None, comp_graph=None) -> SymbolVar:
    """Remove size-1 axes ``axis`` (an int or a list, applied in order; ``AxisAddRemove``)."""
    cfg = _merge_config(name, comp_node, config)
    v = _src_var(src, cfg, comp_graph)
    desc = tuple(("remove", a) for a in as_axes(axis, "remove_axis"))
    return insert_opr(AxisAddRemove([v], AxisAddRemoveParam(desc), cfg))[0]


@opr_params(("axis", "Axis"))
def concat(
    *inputs, axis: int, name=None, comp_node=None, config=None, comp_graph=None
) -> SymbolVar:
    """Concatenate ``inputs`` (vars or a list of them) along ``axis`` (``Concat``).

    Inputs of different dtypes are first converted to their promoted dtype, as Elemwise's
    (MegBrain's ``BatchedDTypePromotion``): an int32 and a float32 var give float32.
    """
    if len(inputs) == 1 and isinstance(inputs[0], (list, tuple)):
        inputs = tuple(inputs[0])
    if not inputs:
        raise MegBrainError("concat: needs at least one input")
    cfg = _merge_config(name, comp_node, config)
    vars_ = canonize_input_vars(inputs, comp_graph=comp_graph, config=cfg)
    try:
        dtype = functools.reduce(dtype_promotion, [v.dtype for v in vars_])
    except ConversionError as exc:
        raise ConversionError(f"concat: {exc.msg}") from None
    vars_ = [v if same_dtype(v.dtype, dtype) else typecvt(SymbolVar(v), dtype).node for v in vars_]
    return insert_opr(Concat(vars_, ConcatParam(as_axis(axis, "concat")), cfg))[0]


provide(get_var_shape, reshape, concat)
