"""I/O operators: Host2DeviceCopy, SharedDeviceTensor, VolatileSharedDeviceTensor,
MultipleDeviceTensorHolder, ImmutableTensor and Copy (cross comp node)."""

from __future__ import annotations

import functools
import hashlib
import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import MegBrainError, SerializationError
from ..graph import InferPending, InferType, OperatorNodeBase, ParamBase, register_opr
from ..serialization import sereg
from ..tensor import TensorND
from . import param_defs as _pdefs
from .base import (
    SymbolVar,
    _merge_config,
    canonize_input_vars,
    check_graph,
    insert_opr,
    make_immutable,
)
from .param_args import opr_params

__all__ = [
    "Host2DeviceCopy",
    "SharedDeviceTensor",
    "VolatileSharedDeviceTensor",
    "MultipleDeviceTensorHolder",
    "ImmutableTensor",
    "Copy",
    "host2device_copy",
    "shared_device_tensor",
    "multiple_device_tensor_holder",
    "make_immutable",
    "copy",
]

CONST, RT_STATIC, MISSING = InferType.CONST, InferType.RT_STATIC, InferType.MISSING


def _tensor_array(t) -> np.ndarray | None:
    if t.empty():
        return None
    return t.as_ndarray()


def _tensor_state(t, watch_value: bool) -> tuple | None:
    """What the executor compares before every run for a source holding ``t``: shape,
    strides and the buffer's identity (plus the bytes when values are watched); None for an
    empty tensor. No array view is built: one per tensor per run cost more than the small
    kernels of a training step."""
    if t.empty():
        return None
    if isinstance(t, TensorND):
        lay = t.layout
        st = (tuple(lay.shape), tuple(lay.strides), _BufferIdentity(t.storage))
    else:  # any object of the tensor protocol (empty, shape, dtype, comp_node, as_ndarray)
        arr = t.as_ndarray()
        st = (arr.shape, arr.strides, arr.__array_interface__["data"][0])
    if watch_value:
        st = st + (t.as_ndarray().tobytes(),)
    return st


class _BufferIdentity:
    """Equal to another for the same buffer object at the same offset. It holds the buffer,
    so that the buffer's id can not be reused by a new one while a state refers to it."""

    __slots__ = ("buf", "offset")

    def __init__(self, storage):
        self.buf, self.offset = storage.buffer, storage.offset

    def __eq__(self, other):
        return (
            type(other) is _BufferIdentity and other.buf is self.buf and other.offset == self.offset
        )

    __hash__ = None


class _SourceOpr(OperatorNodeBase):
    """A source: no inputs, its output comes from a tensor it holds."""

    def __init__(self, tensor, param, config):
        super().__init__([], param, config)
        self.tensor = tensor

    def infer_comp_node(self):
        if self.config.comp_nodes:
            return self.config.comp_nodes[0]
        return self.tensor.comp_node

    def infer_dtypes(self, in_dtypes):
        return [self.tensor.dtype]

    def infer_shapes(self, in_shapes, in_values):
        if not self.tensor.shape_valid():
            raise InferPending(f"{self.type_name} {self.name!r}: the tensor has no value yet")
        return [tuple(self.tensor.shape)]

    def shape_tracked(self):
        return isinstance(self.tensor, TensorND)

    def infer_value(self, in_values, out_shapes):
        arr = self.tensor.as_ndarray() if self.tensor.shape_valid() else None
        if arr is None:
            raise InferPending(f"{self.type_name} {self.name!r}: the tensor has no value yet")
        return [np.array(arr)]

    def default_name(self) -> str:
        return f"{self.type_name}{self.id}"


#: host tensors given a shape hint but no value yet (make_arg(shape=...)), by id: their memory
#: is allocated but uninitialized, so their value is neither inferable nor readable until set.
#: The entries hold the tensors: an id alone could be recycled by a new, fed tensor once the
#: marked one is gone (host tensors take no weak references).
_SHAPE_ONLY: dict[int, object] = {}


def mark_shape_only(tensor) -> None:
    """``tensor`` has a shape but no meaningful value yet."""
    # entries nothing else refers to any more (an input dropped without a value) are released
    # here; 3 references: the dict's, ``t`` and getrefcount's argument
    for key in list(_SHAPE_ONLY):
        t = _SHAPE_ONLY[key]
        if sys.getrefcount(t) <= 3:
            del _SHAPE_ONLY[key]
    _SHAPE_ONLY[id(tensor)] = tensor


def clear_shape_only(tensor) -> None:
    """``tensor`` now holds a real value."""
    if _SHAPE_ONLY.get(id(tensor)) is tensor:
        del _SHAPE_ONLY[id(tensor)]


def is_shape_only(tensor) -> bool:
    """Whether ``tensor`` was given a shape but never a value."""
    return _SHAPE_ONLY.get(id(tensor)) is tensor


@dataclass(frozen=True)
class H2DParam(ParamBase):
    tensor_id: int
    enable_value_infer: bool = True


@register_opr
class Host2DeviceCopy(_SourceOpr):
    """Copies a host tensor (the graph's runtime input) to the device before each run."""

    Param = H2DParam
    has_runtime_state = True

    def source_infer(self):
        return [(RT_STATIC, RT_STATIC if self.param.enable_value_infer else MISSING)]

    def infer_value(self, in_values, out_shapes):
        if is_shape_only(self.tensor):
            raise InferPending(f"Host2DeviceCopy {self.name!r}: the input has no value yet")
        return super().infer_value(in_values, out_shapes)

    def runtime_state(self, watch_value=False):
        # the storage object and layout change whenever the host tensor is re-allocated,
        # borrowed or reshaped; same-shape value copies keep both (cheap to compare). Whether
        # the tensor is still only shape-hinted is part of the state: the first value set into
        # its memory must re-bind the copy that refuses to run (see ``bind``)
        t = self.tensor
        try:
            state = t.memory_state  # read before every run: one attribute, no calls
            valid = bool(state[1].shape)
        except AttributeError:  # another object of the host tensor protocol
            valid = t.shape_valid()
            state = (t.storage, t.layout) if valid else None
        if not valid:
            self._raise_empty()
        if _SHAPE_ONLY.get(id(t)) is t:
            return (*state, "shape only")
        if watch_value:
            return (*state, t.as_ndarray().tobytes())
        return state

    def _raise_empty(self, shape_only: bool = False):
        given = " (it was given a shape but never a value)" if shape_only else ""
        raise MegBrainError(
            f"Host2DeviceCopy {self.name!r}: input {self.outputs[0].name!r} has no value"
            f"{given}; set it (or pass it to the compiled function) before running"
        )

    def fwd_views(self, ins):
        # a CPU comp node's memory is the host's: the static plan reads the host tensor in
        # place, as the reference's allow_cpu_mem_fwd does, instead of copying it every run.
        # The view is read-only to the plan (no operator writes into a forwarded source), and
        # a new storage or layout re-plans (runtime_state)
        t = self.tensor
        if is_shape_only(t) or not t.shape_valid():
            return None
        view = t.as_ndarray()
        if not view.flags.c_contiguous or view.dtype != self.outputs[0].dtype:
            return None
        return [view]

    def run_dynamic(self, ins):
        # eager and dynamic runs hand out values that must outlive the next set_value: a copy
        out = np.empty(tuple(self.tensor.shape), self.outputs[0].dtype)
        self.bind(ins, [out])()
        return [out]

    def bind(self, ins, outs):
        if is_shape_only(self.tensor):
            # make_arg(shape=...) allocated the memory without a value: copying it would hand
            # uninitialized memory to the readers. Only the shape may be used (static
            # inference reads it without running this operator)
            def refuse():
                self._raise_empty(shape_only=True)

            return refuse
        # same shape and dtype (planned): item assignment copies as np.copyto does, without
        # its per-call __array_function__ dispatch (half the cost on small inputs)
        return functools.partial(outs[0].__setitem__, Ellipsis, self.tensor.as_ndarray())


@dataclass(frozen=True)
class SharedParam(ParamBase):
    tensor_id: int


@register_opr
class SharedDeviceTensor(_SourceOpr):
    """A device tensor shared with the caller; its buffer and shape are fixed after compile."""

    Param = SharedParam
    has_runtime_state = True

    replan_on_change = False

    def source_infer(self):
        return [(CONST, RT_STATIC)]

    def runtime_state(self, watch_value=False):
        return _tensor_state(self.tensor, watch_value)

    def state_change_error(self, old, new) -> MegBrainError:
        return MegBrainError(
            f"SharedDeviceTensor {self.name!r}: the shared tensor's buffer or shape changed "
            f"after compile (shape {old[0] if old else None} -> {new[0] if new else None}); "
            "restore it, or use a volatile shared tensor"
        )

    def fwd_views(self, ins):
        return [self.tensor.as_ndarray()]


@dataclass(frozen=True)
class MultiSharedParam(ParamBase):
    tensor_ids: tuple


@register_opr
class MultipleDeviceTensorHolder(OperatorNodeBase):
    """Holds several parameter tensors, one output each (what ``optimize_for_inference``
    merges every SharedDeviceTensor into). Like SharedDeviceTensor the buffers and shapes
    are fixed after compile; the shapes are CONST but, as in the reference, the values are
    not statically inferable. All the tensors must be on one comp node."""

    Param = MultiSharedParam
    has_runtime_state = True
    replan_on_change = False

    def __init__(self, tensors, config):
        tensors = list(tensors)
        if not tensors:
            raise MegBrainError("MultipleDeviceTensorHolder: at least one tensor is required")
        cns = {t.comp_node for t in tensors}
        if len(cns) != 1:
            raise MegBrainError(
                "MultipleDeviceTensorHolder: the tensors must be on one comp node, got "
                + ", ".join(sorted(str(c) for c in cns))
            )
        for k, t in enumerate(tensors):
            if not t.shape_valid():
                raise MegBrainError(f"MultipleDeviceTensorHolder: tensor #{k} has no value")
        super().__init__([], MultiSharedParam(tuple(id(t) for t in tensors)), config)
        self.tensors = tensors
        self.nr_outputs = len(tensors)
        self._all_tensornd = all(isinstance(t, TensorND) for t in tensors)
        self._state_epoch, self._state = None, None  # runtime_state's tuple, and its epoch

    def infer_comp_node(self):
        return self.tensors[0].comp_node

    def infer_dtypes(self, in_dtypes):
        return [t.dtype for t in self.tensors]

    def infer_shapes(self, in_shapes, in_values):
        return [tuple(t.shape) for t in self.tensors]

    def source_infer(self):
        return [(CONST, MISSING)] * len(self.tensors)

    def infer_value(self, in_values, out_shapes):
        raise InferPending("MultipleDeviceTensorHolder: values are not statically inferable")

    def runtime_state(self, watch_value=False):
        # compared before every run: with a network's hundred weights that took ~1.6 us a
        # tensor, a tenth of a small network's call. A TensorND's shape, strides and buffer
        # change only with a bump of ``TensorND.layout_epoch``, so the tuple is kept per epoch
        if watch_value or not self._all_tensornd:
            return tuple(_tensor_state(t, watch_value) for t in self.tensors)
        epoch = TensorND.layout_epoch
        if self._state_epoch != epoch:
            self._state = tuple(_tensor_state(t, False) for t in self.tensors)
            self._state_epoch = epoch
        return self._state

    def state_change_error(self, old, new) -> MegBrainError:
        bad = [k for k, (a, b) in enumerate(zip(old, new)) if a != b]
        k = bad[0] if bad else 0
        return MegBrainError(
            f"MultipleDeviceTensorHolder {self.name!r}: the buffer or shape of tensor #{k} "
            f"({self.outputs[k].name!r}) changed after compile"
        )

    def fwd_views(self, ins):
        return [t.as_ndarray() for t in self.tensors]

    def default_name(self) -> str:
        return f"merged{len(self.tensors)}"


def multiple_device_tensor_holder(
    graph, dev_tensors: Sequence, *, name: str | None = None, config=None
) -> list[SymbolVar]:
    """A MultipleDeviceTensorHolder holding ``dev_tensors``.

    Parameters
    ----------
    graph : ComputingGraph
        The graph to insert into.
    dev_tensors : sequence of DeviceTensorND
        The values, all on one comp node, each with a shape.
    name : str, optional
        The operator's name (default ``merged<N>``).
    config : OperatorNodeConfig, optional

    Returns
    -------
    list of SymbolVar
        One output per tensor, in order.

    Raises
    ------
    MegBrainError
        When no tensor is given, a tensor has no value, or they are on several comp nodes.
    """
    check_graph(graph, arg="graph")
    cfg = _merge_config(name, None, config)
    return [SymbolVar(v) for v in graph.insert_opr(MultipleDeviceTensorHolder(dev_tensors, cfg))]


@register_opr
class VolatileSharedDeviceTensor(_SourceOpr):
    """A shared device tensor whose buffer and shape may change between runs."""

    Param = SharedParam
    has_runtime_state = True

    def source_infer(self):
        return [(RT_STATIC, RT_STATIC)]

    def runtime_state(self, watch_value=False):
        st = _tensor_state(self.tensor, watch_value)
        if st is None:
            raise MegBrainError(f"VolatileSharedDeviceTensor {self.name!r}: tensor is empty")
        return st

    def fwd_views(self, ins):
        return [self.tensor.as_ndarray()]


@dataclass(frozen=True)
class ImmutableParam(ParamBase):
    digest: str
    shape: tuple
    dtype: str


@register_opr
class ImmutableTensor(OperatorNodeBase):
    """A constant: shape and value are CONST; identical constants are deduplicated."""

    Param = ImmutableParam

    def __init__(self, value: np.ndarray, comp_node, config):
        value = np.array(value, copy=True)
        value.flags.writeable = False
        param = ImmutableParam(
            hashlib.blake2b(value.tobytes(), digest_size=16).hexdigest(),
            value.shape,
            str(value.dtype),
        )
        super().__init__([], param, config)
        self.value = value
        self.cn = comp_node

    def infer_comp_node(self):
        return self.config.comp_nodes[0] if self.config.comp_nodes else self.cn

    def hash_key(self):
        # the param's dtype string drops quantization parameters (qint8(0.1) reads "int8"):
        # constants of equal bytes but different quantization are different constants
        return super().hash_key() + (self.cn, repr(self.value.dtype.metadata))

    def infer_dtypes(self, in_dtypes):
        return [self.value.dtype]

    def infer_shapes(self, in_shapes, in_values):
        return [self.value.shape]

    def infer_value(self, in_values, out_shapes):
        return [self.value]

    def fwd_views(self, ins):
        return [self.value]

    def default_name(self) -> str:
        if self.value.size == 1:
            return f"const<{self.value.reshape(-1)[0].item()!r}>"
        return f"const{self.value.shape}"


@register_opr
class Copy(OperatorNodeBase):
    """Copies a var to another comp node (or the same one)."""

    def infer_shapes(self, in_shapes, in_values):
        return [in_shapes[0]]

    def bind(self, ins, outs):
        return functools.partial(np.copyto, outs[0], ins[0])

    def grad(self, wrt_idx, out_grads):
        return copy(SymbolVar(out_grads[0]), comp_node=self.inputs[0].comp_node).node


def host2device_copy(graph, host_tensor, *, enable_value_infer=True, name=None, config=None):
    """A Host2DeviceCopy var reading ``host_tensor`` on every run."""
    check_graph(graph, arg="graph")
    cfg = _merge_config(name, None, config)
    opr = Host2DeviceCopy(host_tensor, H2DParam(id(host_tensor), bool(enable_value_infer)), cfg)
    return SymbolVar(graph.insert_opr(opr)[0])


def shared_device_tensor(graph, dev_tensor, *, volatile=False, name=None, config=None):
    """A (Volatile)SharedDeviceTensor var aliasing ``dev_tensor``."""
    check_graph(graph, arg="graph")
    cfg = _merge_config(name, None, config)
    cls = VolatileSharedDeviceTensor if volatile else SharedDeviceTensor
    return SymbolVar(graph.insert_opr(cls(dev_tensor, SharedParam(id(dev_tensor)), cfg))[0])


@opr_params(("param", "Empty"))
def copy(src, *, comp_node=None, name=None, config=None, comp_graph=None) -> SymbolVar:
    """Copy ``src`` to ``comp_node`` (cross comp node copy)."""
    cfg = _merge_config(name, comp_node, config)
    (v,) = canonize_input_vars([src], comp_graph=comp_graph, config=cfg)
    return insert_opr(Copy([v], None, cfg))[0]


# ---- serialization (megbrain/serialization/sereg.py) -------------------------------------
def _h2d_dump(ctx, opr) -> None:
    h2d = sereg.CPP_PARAMS["Host2DeviceCopy"]
    ctx.write_param(h2d(enable_value_infer=opr.param.enable_value_infer))
    # the reference writes the value only with dump_default_value, which we do not have
    ctx.dump_tensor(opr.name, opr.tensor, sereg.TensorWriteMethod.META_INPUT)


def _h2d_load(ctx, inputs, config):
    p = ctx.read_param(sereg.CPP_PARAMS["Host2DeviceCopy"])
    tensor = ctx.load_tensor()
    if tensor.shape_valid() and tensor.empty() and tensor.shape.total_nr_elems:
        mark_shape_only(tensor)  # a layout only: it must be fed before running
    param = H2DParam(id(tensor), bool(p.enable_value_infer))
    return ctx.graph.insert_opr(Host2DeviceCopy(tensor, param, config))


def _shared_dump(ctx, opr) -> None:
    # a volatile one is dumped as its current value too, as the reference does
    ctx.dump_tensor(opr.name, opr.tensor, sereg.TensorWriteMethod.VALUE_SHARED)


def _shared_loader(cls):
    def load(ctx, inputs, config):
        tensor = ctx.load_tensor_shared()
        return ctx.graph.insert_opr(cls(tensor, SharedParam(id(tensor)), config))

    return load


def _multi_dump(ctx, opr) -> None:
    # the count as a uint32 blob, then each value as a shared tensor named by its output
    ctx.dump_buf(struct.pack("<I", len(opr.tensors)))
    for v, t in zip(opr.outputs, opr.tensors):
        ctx.dump_tensor(v.name, t, sereg.TensorWriteMethod.VALUE_SHARED)


def _multi_load(ctx, inputs, config):
    if inputs:
        raise SerializationError(
            f"MultipleDeviceTensorHolder: expects no inputs, the file gives {len(inputs)}"
        )
    buf = ctx.load_buf()
    if len(buf) != 4:
        raise SerializationError(
            f"MultipleDeviceTensorHolder: the count blob has {len(buf)} bytes, expected 4"
        )
    (n,) = struct.unpack("<I", buf)
    tensors = [ctx.load_tensor_shared() for _ in range(n)]
    return ctx.graph.insert_opr(MultipleDeviceTensorHolder(tensors, config))


def _immutable_dump(ctx, opr) -> None:
    ctx.dump_tensor("", opr.value, sereg.TensorWriteMethod.VALUE_ANONYMOUS, comp_node=opr.cn)


def _immutable_load(ctx, inputs, config):
    tensor = ctx.load_tensor()
    if tensor.empty() and tensor.shape.total_nr_elems:
        raise SerializationError(
            f"ImmutableTensor: the file gives no value of shape {tuple(tensor.shape)}"
        )
    return ctx.graph.insert_opr(ImmutableTensor(tensor.as_ndarray(), tensor.comp_node, config))


sereg.register_serializer(Host2DeviceCopy, dump=_h2d_dump, load=_h2d_load)
for _cls in (SharedDeviceTensor, VolatileSharedDeviceTensor):
    sereg.register_serializer(_cls, dump=_shared_dump, load=_shared_loader(_cls))
sereg.register_serializer(MultipleDeviceTensorHolder, dump=_multi_dump, load=_multi_load)
sereg.register_serializer(ImmutableTensor, dump=_immutable_dump, load=_immutable_load)
sereg.register_param_opr(
    Copy, _pdefs.Empty, to_def=lambda param: _pdefs.Empty(), from_def=lambda pdef: None
)
