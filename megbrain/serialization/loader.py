"""Reading graphs in MegBrain's FlatBuffers format (``GraphLoaderOSS``).

Every read is checked against the bytes actually present before anything is allocated: a
tensor's declared size must match its dtype and shape and lie inside the file's tensor area,
var indices must refer to outputs of earlier operators (so a file can not describe a cycle),
and union types, dtype numbers and type ids must be known. Loading builds a fresh graph,
handed out only when the whole graph loaded; nothing from the file is executed.
"""

from __future__ import annotations

import logging
import math
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import MegBrainError, SerializationError
from ..graph import ComputingGraph, OperatorNodeBase, OperatorNodeConfig, VarNode
from ..graph.operator import OPR_REGISTRY
from . import fbs, sereg
from .format import (
    FILE_IDENTIFIER,
    HEADER,
    MAX_NDIM,
    MGB_MAGIC,
    MGB_VERSION,
    MGB_VERSION_LIMIT,
    GraphSlot,
    OprSlot,
    TensorSlot,
)

__all__ = [
    "LoadConfig",
    "LoadResult",
    "TensorValueLoaderContext",
    "load_graph",
    "iter_graphs",
    "is_graph_file",
]

_log = logging.getLogger("megbrain")
_U32 = struct.Struct("<I")


@dataclass
class LoadConfig:
    """Options of a load (the reference's ``GraphLoadConfig``).

    Attributes
    ----------
    comp_node_mapper:
        ``f(locator: str) -> str`` applied to every comp node locator of the file.
    tensor_value_loader:
        ``f(ctx: TensorValueLoaderContext) -> ndarray`` reading each tensor value instead of
        the raw bytes.
    graph_factory:
        Makes the fresh graph the operators are loaded into.
    """

    comp_node_mapper: Callable[[str], str] | None = None
    tensor_value_loader: Callable[[TensorValueLoaderContext], Any] | None = None
    graph_factory: Callable[[], ComputingGraph] = ComputingGraph


@dataclass
class LoadResult:
    """One loaded graph.

    Attributes
    ----------
    graph:
        The new graph.
    output_var_list:
        The output vars in dump order.
    output_var_map:
        Output var name -> var.
    output_var_map_id:
        The var id at dump time -> var.
    tensor_map:
        Named tensors (inputs, and parameters dumped with their names) -> the loaded host
        or device tensor.
    mgb_version, hash:
        What the file declares.
    end:
        The byte after this graph in the file.
    """

    graph: Any
    output_var_list: list[VarNode] = field(default_factory=list)
    output_var_map: dict[str, VarNode] = field(default_factory=dict)
    output_var_map_id: dict[int, VarNode] = field(default_factory=dict)
    tensor_map: dict[str, Any] = field(default_factory=dict)
    mgb_version: int = 0
    hash: int = 0
    end: int = 0


class TensorValueLoaderContext:
    """What a ``tensor_value_loader`` is given: the layout to produce and the bytes to read.

    Reads are limited to the tensor's own data blob.
    """

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, data: memoryview):
        self._shape = shape
        self._dtype = dtype
        self._data = data
        self._pos = 0

    @property
    def shape(self) -> list[int]:
        """The shape of the tensor to return."""
        return list(self._shape)

    @property
    def dtype(self) -> np.dtype:
        """The dtype of the tensor to return."""
        return self._dtype

    def read(self, size: int) -> bytes:
        """Read ``size`` raw bytes of the tensor's data blob.

        Raises
        ------
        SerializationError
            When fewer than ``size`` bytes are left in the blob.
        """
        size = int(size)
        left = len(self._data) - self._pos
        if size < 0 or size > left:
            raise SerializationError(
                f"tensor value loader consumed more data than available: asked for {size} "
                f"bytes, {left} left of {len(self._data)}"
            )
        out = bytes(self._data[self._pos : self._pos + size])
        self._pos += size
        return out


def _nbytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    return math.prod(shape) * dtype.itemsize


class _OprLoader:
    """The LoadContext of one graph."""

    def __init__(
        self,
        data: memoryview,
        tensor_begin: int,
        tensor_end: int,
        config: LoadConfig,
        graph: Any,
        version: int,
        nr_shared: int,
    ):
        self.data = data
        self.pos = tensor_begin
        self.tensor_end = tensor_end
        self.config = config
        self.graph = graph
        self.mgb_version = version
        self.nr_shared = nr_shared
        self.cur_shared = 0
        self.tensor_map: dict[str, Any] = {}
        self.fbopr: fbs.Table | None = None
        self.where = ""
        self._nparam = self._ntensor = self._nblob = 0

    def error(self, msg: str) -> SerializationError:
        return SerializationError(f"{self.where}: {msg}")

    # ---- LoadContext ----------------------------------------------------------------------
    def read_param(self, cls: type) -> Any:
        spec = sereg.table_spec_of(cls)
        k = self._nparam
        self._nparam += 1
        op = self.fbopr
        if k == 0:
            t, tbl = op.union(OprSlot.PARAM_TYPE, f"{self.where} param")
        else:
            types = op.raw_bytes(OprSlot.ADDITIONAL_PARAMS_TYPE, f"{self.where} param types")
            tbls = op.tables(OprSlot.ADDITIONAL_PARAMS, f"{self.where} params")
            if types is None or tbls is None or len(types) != len(tbls) or k - 1 >= len(tbls):
                raise self.error(f"the loader asks for param #{k} ({spec.name}), not in the file")
            t, tbl = types[k - 1], tbls[k - 1]
        if t != spec.union_type:
            got = sereg.table_spec_by_union(t) or "NONE" if t else "NONE"
            raise self.error(
                f"param #{k} is of type {got} ({t}) in the file, the loader asks for "
                f"{spec.name} ({spec.union_type})"
            )
        return fbs.read_table(tbl, spec)

    def _next_tensor(self) -> fbs.Table:
        tensors = self.fbopr.tables(OprSlot.TENSORS, f"{self.where} tensors") or []
        if self._ntensor >= len(tensors):
            raise self.error(
                f"the loader asks for tensor #{self._ntensor}, the file has {len(tensors)}"
            )
        t = tensors[self._ntensor]
        self._ntensor += 1
        return t

    def _comp_node(self, tbl: fbs.Table | None) -> Any:
        from ..device import CompNode

        loc = None if tbl is None else tbl.string(0, f"{self.where} comp node")
        if loc is None:
            loc = "xpux"
        if self.config.comp_node_mapper is not None:
            loc = self.config.comp_node_mapper(loc)
        try:
            return CompNode.load(loc)
        except MegBrainError as exc:
            raise self.error(f"bad comp node {loc!r}: {exc}") from None

    def _layout(self, t: fbs.Table) -> tuple[tuple[int, ...], np.dtype, Any]:
        shape = tuple(t.scalars(TensorSlot.SHAPE, "I", f"{self.where} tensor shape") or ())
        if len(shape) > MAX_NDIM:
            raise self.error(f"tensor of {len(shape)} dims (at most {MAX_NDIM})")
        dt_tbl = t.table(TensorSlot.DTYPE, f"{self.where} tensor dtype")
        if dt_tbl is None:
            raise self.error("tensor without a dtype")
        dtype = fbs.read_dtype(dt_tbl)
        cn = self._comp_node(t.table(TensorSlot.COMP_NODE, f"{self.where} tensor comp node"))
        return shape, dtype, cn

    def _value(self, t: fbs.Table, shape: tuple, dtype: np.dtype, name: str) -> np.ndarray:
        size = t.scalar(TensorSlot.DATA_SIZE, "I", 0)
        offset = t.scalar(TensorSlot.OFFSET, "I", 0)
        start = self.pos + offset
        if start + size > self.tensor_end:
            raise self.error(
                f"tensor {name!r} {shape} {dtype}: its {size} bytes at offset {offset} exceed "
                f"the file's tensor data ({self.tensor_end - self.pos} bytes left)"
            )
        blob = self.data[start : start + size]
        self.pos = start + size
        loader = self.config.tensor_value_loader
        if loader is None:
            need = _nbytes(shape, dtype)
            if need != size:
                raise self.error(
                    f"tensor {name!r}: declared data size {size} does not match its shape "
                    f"{shape} and dtype {dtype} ({need} bytes)"
                )
            base = np.dtype(dtype.str)
            return np.frombuffer(blob, dtype=base).reshape(shape).copy().view(dtype)
        ctx = TensorValueLoaderContext(shape, dtype, blob)
        value = np.asarray(loader(ctx))
        if ctx._pos < size:
            _log.warning(
                "Tensor value loader consumed less data than available: consumed %d bytes, "
                "has %d bytes",
                ctx._pos,
                size,
            )
        if value.shape != shape:
            if value.size != math.prod(shape):
                raise self.error(
                    f"tensor value loader returned shape {value.shape} for tensor {name!r} "
                    f"of shape {shape}"
                )
            value = value.reshape(shape)
        from ..dtype import convert_array, same_dtype

        if not same_dtype(value.dtype, dtype):
            value = convert_array(value, dtype)
        return np.ascontiguousarray(value)

    def load_tensor(self) -> Any:
        from ..tensor import HostTensorND, Storage, TensorLayout, TensorShape

        t = self._next_tensor()
        shape, dtype, cn = self._layout(t)
        name = t.string(TensorSlot.NAME, f"{self.where} tensor name")
        if t.scalar(TensorSlot.DATA_SIZE, "I", 0):
            ret = HostTensorND.from_ndarray(
                self._value(t, shape, dtype, name or ""), cn, dtype=dtype
            )
        elif shape and math.prod(shape) == 0:
            ret = HostTensorND.from_ndarray(np.empty(shape, dtype), cn, dtype=dtype)
        else:
            # a layout without a value: no memory is allocated for it (its size is not
            # backed by the file); the first value set allocates
            ret = HostTensorND._new(
                Storage(cn, host=True), TensorLayout._contig(TensorShape(shape), dtype)
            )
        if name is not None:
            self.tensor_map[name] = ret
        return ret

    def load_tensor_shared(self) -> Any:
        from ..tensor import DeviceTensorND

        t = self._next_tensor()
        shape, dtype, cn = self._layout(t)
        name = t.string(TensorSlot.NAME, f"{self.where} tensor name")
        if not t.scalar(TensorSlot.DATA_SIZE, "I", 0) and _nbytes(shape, dtype):
            raise self.error(f"shared tensor {name!r} {shape} without a value")
        if self.cur_shared >= self.nr_shared:
            raise self.error(f"more shared tensors than the {self.nr_shared} the graph declares")
        self.cur_shared += 1
        value = self._value(t, shape, dtype, name or "")
        ret = DeviceTensorND.from_ndarray(value, cn, borrow=True, dtype=dtype)
        if name is not None:
            self.tensor_map[name] = ret
        return ret

    def load_buf(self) -> bytes:
        blobs = self.fbopr.tables(OprSlot.BLOBS, f"{self.where} blobs") or []
        if self._nblob >= len(blobs):
            raise self.error(f"the loader asks for blob #{self._nblob}, the file has {len(blobs)}")
        b = blobs[self._nblob]
        self._nblob += 1
        data = b.raw_bytes(0, f"{self.where} blob")
        if data is None:
            raise self.error("blob without its (required) data")
        return data

    # ---- operators ------------------------------------------------------------------------
    def load_opr(self, idx: int, fbopr: fbs.Table, id2var: list[VarNode]) -> None:
        self.fbopr = fbopr
        self._nparam = self._ntensor = self._nblob = 0
        type_id = fbopr.scalar(OprSlot.TYPE_ID, "Q", 0)
        names = fbopr.strings(OprSlot.OUTPUT_NAME, f"operator #{idx} output names")
        entry = sereg.find_by_type_id(type_id)
        self.where = f"operator #{idx} ({entry.name if entry else hex(type_id)})"
        if entry is None:
            known = {sereg.type_id_of(n): n for n in OPR_REGISTRY}
            what = (
                f"{known[type_id]}, an operator of megbrain without a serializer"
                if type_id in known
                else "not an operator registered for serialization"
            )
            out = f"; its outputs are named {names}" if names else ""
            raise SerializationError(
                f"operator #{idx}: failed to find opr with type id {type_id} ({type_id:#x}): "
                f"{what}{out}; megbrain.serialization.sereg.registered_oprs() maps ids to names"
            )
        config = OperatorNodeConfig()
        odt = fbopr.table(OprSlot.OUTPUT_DTYPE, f"{self.where} output dtype")
        if odt is not None:
            config.output_dtype(fbs.read_dtype(odt))
        cns = fbopr.tables(OprSlot.COMP_NODE, f"{self.where} comp nodes")
        if cns:
            config.comp_node_arr([self._comp_node(c) for c in cns])
        in_ids = fbopr.scalars(OprSlot.INPUTS, "I", f"{self.where} inputs") or []
        inputs = []
        for i in in_ids:
            if i >= len(id2var):
                raise self.error(
                    f"input var index {i} out of range: only {len(id2var)} vars are defined "
                    "by the operators before it"
                )
            inputs.append(id2var[i])
        try:
            got = entry.load(self, inputs, config)
        except SerializationError as exc:
            if str(exc).startswith(self.where):
                raise
            raise SerializationError(f"{self.where}: {exc}") from exc
        except Exception as exc:  # noqa: BLE001 - a bad file makes a bad operator: name it
            raise self.error(f"loading failed: {type(exc).__name__}: {exc}") from exc
        opr = _owner(got, self.where)
        if names is not None and len(names) != len(opr.outputs):
            raise self.error(f"{len(names)} output names for {len(opr.outputs)} outputs")
        for k, v in enumerate(opr.outputs):
            id2var.append(v)
            if names is not None:
                v.name = names[k]
                v.name_given = True
        if names is not None and len(opr.outputs) == 1:
            opr.name = names[0]
        opr.priority = fbopr.scalar(OprSlot.PRIORITY, "i", 0)


def _owner(got: Any, where: str) -> OperatorNodeBase:
    if isinstance(got, OperatorNodeBase):
        return got
    if isinstance(got, (list, tuple)):
        got = got[0] if got else None
    node = getattr(got, "node", got)
    if not isinstance(node, VarNode):
        raise SerializationError(
            f"{where}: the loader returned {type(got).__name__}, not an operator or its vars"
        )
    return node.owner


def _u32(data: memoryview, pos: int, what: str) -> int:
    if pos + 4 > len(data):
        raise SerializationError(f"truncated graph file: {what} at byte {pos} is missing")
    return _U32.unpack_from(data, pos)[0]


def load_graph(
    data: bytes | memoryview, pos: int = 0, config: LoadConfig | None = None
) -> LoadResult:
    """Load the graph starting at byte ``pos`` of ``data`` (the whole file).

    Parameters
    ----------
    data:
        The file's bytes.
    pos:
        Where the graph starts (0 for the first).
    config:
        The options; defaults when None.

    Returns
    -------
    LoadResult
        The graph; ``end`` is where the next graph of the file would start.

    Raises
    ------
    SerializationError
        For every malformed file (see the module docstring).
    """
    config = config or LoadConfig()
    data = memoryview(data).cast("B")
    if pos + HEADER.size > len(data):
        raise SerializationError(
            f"truncated graph file: {len(data) - pos} bytes at byte {pos}, the header alone "
            f"takes {HEADER.size}"
        )
    magic, _, offset = HEADER.unpack_from(data, pos)
    if magic != MGB_MAGIC:
        raise SerializationError(
            f"wrong magic: wanted {MGB_MAGIC:#010x}, actual {magic:#010x} (not a MegBrain fbs "
            "model?)"
        )
    tensor_begin = pos + HEADER.size
    fbs_pos = tensor_begin + offset
    if fbs_pos + 4 > len(data):
        raise SerializationError(
            f"offset to the graph ({offset}) is out of range: the file has "
            f"{len(data) - tensor_begin} bytes after the header"
        )
    size = _u32(data, fbs_pos, "graph size")
    end = fbs_pos + 4 + size
    if end > len(data):
        raise SerializationError(
            f"truncated graph file: the graph declares {size} bytes, {len(data) - fbs_pos - 4} "
            "are left"
        )
    reader = fbs.Reader(data[fbs_pos + 4 : end])
    root = reader.root(FILE_IDENTIFIER)
    version = root.scalar(GraphSlot.MGB_VERSION, "I", 0)
    if version == 0 or version >= MGB_VERSION_LIMIT:
        raise SerializationError(f"bad MegBrain version {version} in the graph file")
    if version > MGB_VERSION:
        _log.warning(
            "loading model from future MegBrain: version=%d model_version=%d", MGB_VERSION, version
        )
    ghash = root.scalar(GraphSlot.HASH, "Q", 0)
    if not ghash:
        raise SerializationError("invalid graph hash 0; maybe an error occurred during the dump")
    nr_shared = root.scalar(GraphSlot.NR_SHARED_TENSOR, "I", 0)
    oprs = root.tables(GraphSlot.OPRS, "oprs") or []
    outputs = root.structs(GraphSlot.OUTPUT_VARS_IDX, _OUTPUT_VAR, "output_vars_idx") or []
    graph = config.graph_factory()
    ctx = _OprLoader(data, tensor_begin, fbs_pos, config, graph, version, nr_shared)
    id2var: list[VarNode] = []
    for i, fbopr in enumerate(oprs):
        ctx.load_opr(i, fbopr, id2var)
    if ctx.cur_shared != nr_shared:
        raise SerializationError(
            f"the graph declares {nr_shared} shared tensors, its operators loaded {ctx.cur_shared}"
        )
    res = LoadResult(graph, mgb_version=version, hash=ghash, end=end, tensor_map=ctx.tensor_map)
    for compact, original in outputs:
        if compact >= len(id2var):
            raise SerializationError(
                f"output var index {compact} out of range: the graph defines {len(id2var)} vars"
            )
        v = id2var[compact]
        res.output_var_list.append(v)
        res.output_var_map[v.name] = v
        res.output_var_map_id[original] = v
    return res


_OUTPUT_VAR = sereg.FbsStruct("OutputVar", (("compact_id", "I"), ("original_id", "I")))


def iter_graphs(data: bytes | memoryview, config: LoadConfig | None = None) -> Iterator[LoadResult]:
    """Every graph of a file whose graphs were appended one after another.

    Parameters
    ----------
    data:
        The file's bytes.
    config:
        The options, for every graph.

    Yields
    ------
    LoadResult
    """
    pos = 0
    data = memoryview(data).cast("B")
    while pos < len(data):
        res = load_graph(data, pos, config)
        pos = res.end
        yield res


def is_graph_file(data: bytes | memoryview) -> bool:
    """Whether ``data`` starts with the magic and reserved bytes of a graph file."""
    return len(data) >= 8 and bytes(data[:8]) == struct.pack("<II", MGB_MAGIC, 0)
