"""Writing graphs in MegBrain's FlatBuffers format (``GraphDumperOSS``)."""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import flatbuffers
import numpy as np

from ..errors import SerializationError
from . import fbs, sereg
from .format import (
    FILE_IDENTIFIER,
    HEADER,
    MGB_MAGIC,
    MGB_VERSION,
    GraphSlot,
    OprSlot,
    TensorSlot,
    content_hash,
)
from .sereg import TensorWriteMethod

__all__ = ["DumpConfig", "DumpResult", "TensorValueDumperContext", "dump_graph", "dep_oprs"]

_log = logging.getLogger("megbrain")


@dataclass
class DumpConfig:
    """Options of a dump (the reference's ``GraphDumpConfig``).

    Attributes
    ----------
    keep_var_name:
        0: no var names; 1: the output vars' names; 2: every var's name.
    keep_param_name:
        Whether VALUE_SHARED tensors (parameters) keep their names.
    keep_opr_priority:
        Whether operator priorities are written.
    tensor_value_dumper:
        ``f(ctx: TensorValueDumperContext)`` writing each tensor value instead of its raw
        bytes; None writes the raw bytes.
    """

    keep_var_name: int = 1
    keep_param_name: bool = False
    keep_opr_priority: bool = False
    tensor_value_dumper: Callable[[TensorValueDumperContext], None] | None = None


@dataclass
class DumpResult:
    """What a dump wrote (the reference's ``DumpResult``)."""

    nr_opr: int = 0
    tot_bytes: int = 0
    tensor_value_bytes: int = 0
    content_hash: int = 0
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    params: list[str] = field(default_factory=list)


class TensorValueDumperContext:
    """What a ``tensor_value_dumper`` is given for each tensor value to write.

    Attributes
    ----------
    name:
        The name of the operator owning the tensor.
    type:
        The operator's type name.
    value:
        The tensor value (a contiguous ndarray).
    """

    def __init__(self, out: io.BytesIO, opr: Any, value: np.ndarray):
        self._out = out
        self._opr = opr
        self._value = value

    @property
    def name(self) -> str:
        """The operator's name."""
        return self._opr.name

    @property
    def type(self) -> str:
        """The operator's type name."""
        return self._opr.type_name

    @property
    def value(self) -> np.ndarray:
        """The numerical value of the tensor."""
        return self._value

    def write(self, buf: bytes) -> None:
        """Write raw bytes into the file.

        Parameters
        ----------
        buf:
            The bytes (a ``bytes`` object).
        """
        if type(buf) is not bytes:
            raise TypeError(f"TensorValueDumperContext.write: bad value: {type(buf)!r}")
        self._out.write(buf)

    def write_default(self) -> TensorValueDumperContext:
        """Write the value in the default format (its raw bytes); returns self."""
        self._out.write(np.ascontiguousarray(self._value).tobytes())
        return self


def dep_oprs(output_vars: Sequence[Any]) -> list[Any]:
    """The operators ``output_vars`` depend on, each after its inputs' owners (DFS order from
    the outputs, inputs in order, as the reference's ``DepOprIter``)."""
    seen: set[int] = set()
    order: list[Any] = []
    for v in output_vars:
        root = v.owner
        if id(root) in seen:
            continue
        stack = [(root, 0)]
        seen.add(id(root))
        while stack:
            opr, i = stack.pop()
            if i < len(opr.inputs):
                stack.append((opr, i + 1))
                dep = opr.inputs[i].owner
                if id(dep) not in seen:
                    seen.add(id(dep))
                    stack.append((dep, 0))
            else:
                order.append(opr)
    return order


def _as_array(value: Any) -> np.ndarray:
    if hasattr(value, "as_ndarray"):
        return np.ascontiguousarray(value.as_ndarray())
    return np.ascontiguousarray(value)


class _Dumper:
    """One dump: the builder, the tensor bytes and the per-operator state."""

    def __init__(self, config: DumpConfig):
        self.config = config
        self.keep_var_name = config.keep_var_name
        self.keep_param_name = config.keep_param_name
        self.keep_opr_priority = config.keep_opr_priority
        self.b = flatbuffers.Builder(1024)
        self.data = io.BytesIO()
        self.result = DumpResult()
        self.nr_shared = 0
        self.used_inputs: set[str] = set()
        self.used_params: set[str] = set()
        self.opr: Any = None
        self._params: list[tuple[int, int]] = []
        self._tensors: list[int] = []
        self._blobs: list[int] = []

    # ---- DumpContext ----------------------------------------------------------------------
    def write_param(self, param: Any) -> None:
        spec = sereg.table_spec_of(param)
        self._params.append((spec.union_type, fbs.write_table(self.b, spec, param)))

    def dump_tensor(
        self, name: str, value: Any, method: TensorWriteMethod, *, comp_node: Any = None
    ) -> None:
        method = TensorWriteMethod(method)
        M = TensorWriteMethod
        if (method == M.VALUE_ANONYMOUS) == bool(name):
            raise SerializationError(
                f"{self._opr_desc()}: a tensor name must be given exactly for non "
                f"VALUE_ANONYMOUS tensors (got {name!r} with {method.name})"
            )
        keep_name = True
        if method == M.VALUE_ANONYMOUS:
            keep_name = False
        elif method == M.VALUE_SHARED:
            keep_name = self.keep_param_name
            self.nr_shared += 1
            if self.keep_param_name:
                if name in self.used_params:
                    raise SerializationError(
                        f"{self._opr_desc()}: duplicated VALUE_SHARED tensor name: {name}"
                    )
                self.used_params.add(name)
                self.result.params.append(name)
        else:
            if name in self.used_inputs:
                raise SerializationError(
                    f"{self._opr_desc()}: duplicated input tensor name: {name}"
                )
            self.used_inputs.add(name)
            self.result.inputs.append(name)
        has_value = method != M.META_INPUT
        arr = _as_array(value) if has_value else None
        shape = tuple(arr.shape) if has_value else tuple(getattr(value, "shape", None) or ())
        dtype = arr.dtype if has_value else np.dtype(value.dtype)
        if comp_node is None:
            comp_node = getattr(value, "comp_node", None) or self.opr.comp_node
        value_size = 0
        if has_value:
            if arr.dtype == np.float32 and arr.size and not np.isfinite(arr).all():
                _log.warning("invalid tensor value in %s: %s", name, arr[~np.isfinite(arr)][0])
            begin = self.data.tell()
            dumper = self.config.tensor_value_dumper
            if dumper is not None:
                dumper(TensorValueDumperContext(self.data, self.opr, arr))
            else:
                self.data.write(arr.tobytes())
            value_size = self.data.tell() - begin
            self.result.tensor_value_bytes += value_size
        b = self.b
        fbname = b.CreateSharedString(name) if keep_name else None
        b.StartVector(4, len(shape), 4)
        for d in reversed(shape):
            b.PrependUint32(int(d))
        shape = b.EndVector()
        cn = self._comp_node(comp_node)
        fbdtype = fbs.write_dtype(b, dtype)
        b.StartObject(6)
        if fbname is not None:
            b.PrependUOffsetTRelativeSlot(TensorSlot.NAME, fbname, 0)
        b.PrependUOffsetTRelativeSlot(TensorSlot.SHAPE, shape, 0)
        b.PrependUOffsetTRelativeSlot(TensorSlot.COMP_NODE, cn, 0)
        b.PrependUOffsetTRelativeSlot(TensorSlot.DTYPE, fbdtype, 0)
        b.PrependUint32Slot(TensorSlot.DATA_SIZE, value_size, 0)
        self._tensors.append(b.EndObject())

    def dump_buf(self, data: bytes) -> None:
        data = bytes(data)
        vec = self.b.CreateByteVector(data)
        self.b.StartObject(1)
        self.b.PrependUOffsetTRelativeSlot(0, vec, 0)
        self._blobs.append(self.b.EndObject())

    # ---- helpers --------------------------------------------------------------------------
    def _opr_desc(self) -> str:
        o = self.opr
        return f"dump of operator {o.name!r} ({o.type_name})" if o is not None else "dump"

    def _comp_node(self, cn: Any) -> int:
        loc = cn.to_string_logical() if hasattr(cn, "to_string_logical") else str(cn)
        s = self.b.CreateSharedString(loc)
        self.b.StartObject(1)
        self.b.PrependUOffsetTRelativeSlot(0, s, 0)
        return self.b.EndObject()

    def _offsets(self, offs: Sequence[int]) -> int:
        self.b.StartVector(4, len(offs), 4)
        for o in reversed(offs):
            self.b.PrependUOffsetTRelative(o)
        return self.b.EndVector()

    def _uints(self, vals: Sequence[int]) -> int:
        self.b.StartVector(4, len(vals), 4)
        for x in reversed(vals):
            self.b.PrependUint32(x)
        return self.b.EndVector()

    def build_opr(self, opr: Any, entry: sereg.OprSerializer, var2id: dict, outputs: set) -> int:
        b = self.b
        self.opr = opr
        self.result.nr_opr += 1
        comp_nodes = None
        if opr.config.comp_nodes:
            comp_nodes = self._offsets([self._comp_node(c) for c in opr.config.comp_nodes])
        inputs = None
        if opr.inputs:
            inputs = self._uints([var2id[id(v)] for v in opr.inputs])
        names = None
        if self.keep_var_name >= 2 or (
            self.keep_var_name == 1 and any(id(v) in outputs for v in opr.outputs)
        ):
            names = self._offsets([b.CreateString(v.name) for v in opr.outputs])
        out_dtype = None
        if opr.config.dtype_value is not None:
            out_dtype = fbs.write_dtype(b, opr.config.dtype_value)
        self._params, self._tensors, self._blobs = [], [], []
        try:
            entry.dump(self, opr)
        except SerializationError:
            raise
        except Exception as exc:  # noqa: BLE001 - the registrant's error, named
            raise SerializationError(f"{self._opr_desc()} failed: {exc}") from exc
        tensors = self._offsets(self._tensors) if self._tensors else None
        blobs = self._offsets(self._blobs) if self._blobs else None
        add_types = add_params = None
        if len(self._params) > 1:
            rest = self._params[1:]
            b.StartVector(1, len(rest), 1)
            for t, _ in reversed(rest):
                b.PrependUint8(t)
            add_types = b.EndVector()
            add_params = self._offsets([o for _, o in rest])
        b.StartObject(12)
        b.PrependUint64Slot(OprSlot.TYPE_ID, entry.type_id, 0)
        if inputs is not None:
            b.PrependUOffsetTRelativeSlot(OprSlot.INPUTS, inputs, 0)
        if self.keep_opr_priority:
            b.PrependInt32Slot(OprSlot.PRIORITY, int(opr.priority), 0)
        if comp_nodes is not None:
            b.PrependUOffsetTRelativeSlot(OprSlot.COMP_NODE, comp_nodes, 0)
        if names is not None:
            b.PrependUOffsetTRelativeSlot(OprSlot.OUTPUT_NAME, names, 0)
        if out_dtype is not None:
            b.PrependUOffsetTRelativeSlot(OprSlot.OUTPUT_DTYPE, out_dtype, 0)
        if self._params:
            b.PrependUint8Slot(OprSlot.PARAM_TYPE, self._params[0][0], 0)
            b.PrependUOffsetTRelativeSlot(OprSlot.PARAM, self._params[0][1], 0)
        if add_types is not None:
            b.PrependUOffsetTRelativeSlot(OprSlot.ADDITIONAL_PARAMS_TYPE, add_types, 0)
            b.PrependUOffsetTRelativeSlot(OprSlot.ADDITIONAL_PARAMS, add_params, 0)
        if tensors is not None:
            b.PrependUOffsetTRelativeSlot(OprSlot.TENSORS, tensors, 0)
        if blobs is not None:
            b.PrependUOffsetTRelativeSlot(OprSlot.BLOBS, blobs, 0)
        self.opr = None
        return b.EndObject()


def dump_graph(
    output_vars: Sequence[Any], config: DumpConfig | None = None
) -> tuple[bytes, DumpResult]:
    """Serialize the graph computing ``output_vars``.

    Parameters
    ----------
    output_vars:
        The VarNodes to retrieve after loading, in order.
    config:
        The options; defaults when None.

    Returns
    -------
    (bytes, DumpResult)
        The bytes of one graph (append them to a file to add a graph to it) and what was
        written.

    Raises
    ------
    SerializationError
        For an empty output list, a duplicated output name (when names are kept), an
        operator without a serializer (naming it), or a serializer's own failure. Nothing is
        returned then, so nothing is written.
    """
    config = config or DumpConfig()
    if not output_vars:
        raise SerializationError("Can't dump empty graph")
    d = _Dumper(config)
    outputs = {id(v) for v in output_vars}
    if config.keep_var_name >= 1:
        names: set[str] = set()
        for v in {id(v): v for v in output_vars}.values():
            if v.name in names:
                raise SerializationError(f"duplicated output var name: {v.name}")
            names.add(v.name)
    var2id: dict[int, int] = {}
    todo: list[tuple[Any, sereg.OprSerializer]] = []
    next_id = 0
    for opr in dep_oprs(output_vars):
        if sereg.is_removed_in_dump(opr):
            if len(opr.inputs) != 1:
                raise SerializationError(
                    f"operator {opr.name!r} ({opr.type_name}) is removed in dumps but has "
                    f"{len(opr.inputs)} inputs"
                )
            for v in opr.outputs:
                var2id[id(v)] = var2id[id(opr.inputs[0])]
            continue
        entry = sereg.find_by_opr(opr)
        if entry is None or entry.dump is None:
            raise SerializationError(
                f"serialization as FlatBuffers is not supported for operator {opr.name!r} "
                f"({opr.type_name}): no serializer is registered for {type(opr).__name__}"
            )
        todo.append((opr, entry))
        for v in opr.outputs:
            var2id[id(v)] = next_id
            next_id += 1
    oprs = [d.build_opr(opr, entry, var2id, outputs) for opr, entry in todo]
    b = d.b
    fb_oprs = d._offsets(oprs)
    b.StartVector(8, len(output_vars), 4)
    for v in reversed(list(output_vars)):
        b.Prep(4, 8)
        b.PrependUint32(int(v.id))
        b.PrependUint32(var2id[id(v)])
    fb_outputs = b.EndVector()
    graph_hash = content_hash(bytes(b.Bytes[b.Head() :]))
    b.StartObject(5)
    b.PrependUint64Slot(GraphSlot.HASH, graph_hash, 0)
    b.PrependUOffsetTRelativeSlot(GraphSlot.OPRS, fb_oprs, 0)
    b.PrependUOffsetTRelativeSlot(GraphSlot.OUTPUT_VARS_IDX, fb_outputs, 0)
    b.PrependUint32Slot(GraphSlot.MGB_VERSION, MGB_VERSION, 0)
    b.PrependUint32Slot(GraphSlot.NR_SHARED_TENSOR, d.nr_shared, 0)
    b.FinishSizePrefixed(b.EndObject(), FILE_IDENTIFIER)
    tensor_bytes = d.data.getvalue()
    out = HEADER.pack(MGB_MAGIC, 0, len(tensor_bytes)) + tensor_bytes + bytes(b.Output())
    r = d.result
    for i, v in enumerate(output_vars):
        r.outputs.append(v.name if config.keep_var_name >= 1 else f"unnamed{i}")
    r.content_hash = graph_hash
    r.inputs.sort()
    r.tot_bytes = len(out)
    return out, r
