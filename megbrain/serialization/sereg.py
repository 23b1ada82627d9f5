"""The operator serialization registry: how each operator family says how it is dumped to and
loaded from a graph file (MegBrain's ``OprRegistry`` and ``MGB_SEREG_OPR``).

Each ``opr/`` module registers its own operators next to their code; there is no central
switch. The file format itself (``megbrain.serialization``) only talks to operators through
this registry.

Registering a family
--------------------
The common case, "the operator's Param is one param-def of ``megbrain.opr_param_defs``, the
inputs are the file's inputs as they are"::

    from ..serialization import sereg
    sereg.register_param_opr(Elemwise, pdefs.Elemwise)

Fields are matched by name between the param-def class (``pdefs.Elemwise``: the FlatBuffers
table ``param.Elemwise``) and the operator's ``Param`` dataclass; enum members by name. Pass
``to_def(param) -> param_def`` / ``from_def(param_def) -> Param`` when the names differ, and
``make(graph, inputs, param, config) -> vars`` when the operator is not built as
``opr_cls(inputs, param, config)``.

Anything else registers a dump and a load function::

    def _dump(ctx: DumpContext, opr) -> None:
        ctx.write_param(pdefs.Reduce(mode=..., axis=...))   # params, in order
        ctx.dump_tensor(opr.name, array, TensorWriteMethod.VALUE_SHARED)  # tensors
        ctx.dump_buf(b"...")                                 # opaque blobs

    def _load(ctx: LoadContext, inputs: list[VarNode], config: OperatorNodeConfig):
        p = ctx.read_param(pdefs.Reduce)                     # the same order as written
        value = ctx.load_tensor()            # HostTensorND  (or ctx.load_tensor_shared())
        blob = ctx.load_buf()
        return ctx.graph.insert_opr(Reduce(inputs, ..., config))  # the outputs (or the opr)

    sereg.register_serializer(Reduce, dump=_dump, load=_load)

* ``name`` is the reference's registered class name (default ``opr_cls.type_name``); the file
  stores :func:`type_id_of` it, the XXH64 (seed 20160701) of the name without a trailing
  ``V<digit>`` (``MatrixMulV2`` has the id of ``MatrixMul``).
* ``compat_names``: more names whose files load through this class's loader; or
  :func:`register_loader` for a load-only entry (a legacy operator of the reference).
* :func:`register_removed_in_dump`: operators replaced by their single input in a dump
  (SetGrad, as the reference).
* Params written by ``write_param`` are the tables of the ``OperatorParam`` union
  (:data:`OPERATOR_PARAM_UNION`): instances of the non-legacy param-def classes of
  ``megbrain.opr_param_defs``, of the C++-side tables of :data:`CPP_PARAMS`
  (``sereg.CPP_PARAMS["Dimshuffle"](pattern=[1, 0], ndim=2)``; Host2DeviceCopy,
  MGBAddUpdate, MGBSleep, Dimshuffle, AxisAddRemove, IndexDescMaskDump, NMSKeep) or a
  :class:`DTypeParam` (the ``DType`` table: a dtype with its quantization parameters).
* ``MGBAddUpdate``'s coefficients are ``PersistentDTypeScalar`` structs: build them with
  :func:`persistent_scalar` and read them with :func:`persistent_scalar_value`; struct
  fields and vectors of structs are tuples in field order (``AxisAddRemove(desc=[(0, 1)])``:
  method ADD_1=0 / REMOVE=1, axis).
* Tensor write methods (:class:`TensorWriteMethod`) are the reference's: ``VALUE_ANONYMOUS``
  (a constant, no name), ``VALUE_SHARED`` (a parameter; read back with
  ``load_tensor_shared``; named when the dump keeps param names), ``VALUE_INPUT`` /
  ``META_INPUT`` (a graph input with or without its value; the name is required).
* An operator class without a serializer makes the dump raise a SerializationError naming the
  operator; so does one whose ``dump`` raises :class:`NotSerializable` (a Python-defined
  operator without serialize params).
* The loader's result: the operator, or its output vars (VarNode/SymbolVar, one or a list);
  the outputs of the owner operator are numbered in the order of ``opr.outputs``.
"""

from __future__ import annotations

import enum
import functools
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, NamedTuple, Protocol

import numpy as np
import xxhash

from ..dtype import canonize_dtype, dtype_from_num, dtype_key, dtype_name
from ..errors import MegBrainError, SerializationError
from ..graph.param_def import enum_index

__all__ = [
    "XXHASH_SEED",
    "TensorWriteMethod",
    "NotSerializable",
    "OprSerializer",
    "DumpContext",
    "LoadContext",
    "type_id_of",
    "unversioned_name",
    "register_serializer",
    "register_loader",
    "register_fused",
    "register_param_opr",
    "param_to_def",
    "register_removed_in_dump",
    "find_by_opr",
    "find_by_type_id",
    "is_removed_in_dump",
    "registered_oprs",
    "OPERATOR_PARAM_UNION",
    "FbsStruct",
    "TableField",
    "TableSpec",
    "CppParam",
    "CPP_PARAMS",
    "DTypeParam",
    "DTYPE_TABLE_UNION",
    "table_spec_of",
    "table_spec_by_union",
    "SCALAR_FMT",
    "FBS_DTYPES",
    "fbs_dtype_num",
    "persistent_scalar",
    "persistent_scalar_value",
    "PERSISTENT_DTYPE_SCALAR",
    "AXIS_DESC",
    "INDEX_DESC_MASK_ITEM",
]

#: the seed of every XXH64 in MegBrain's serialization (type ids, graph hashes)
XXHASH_SEED = 20160701


class TensorWriteMethod(enum.IntEnum):
    """How ``DumpContext.dump_tensor`` stores a tensor (the reference's TensorWriteMethod)."""

    #: only the layout, for a graph input with a name
    META_INPUT = 0
    #: the value of a graph input (Host2DeviceCopy with dump_default_value), with a name
    VALUE_INPUT = 1
    #: a shared tensor (parameter), loaded by ``load_tensor_shared``
    VALUE_SHARED = 2
    #: a value without a name (constants)
    VALUE_ANONYMOUS = 3


class NotSerializable(SerializationError):
    """Raised by a ``dump`` function for an operator instance that can not be dumped."""


def unversioned_name(name: str) -> str:
    """``name`` without a trailing ``V<digit>`` (``MatrixMulV2`` -> ``MatrixMul``).

    Parameters
    ----------
    name:
        A registered operator name.

    Returns
    -------
    str
    """
    if len(name) > 2 and name[-1].isdigit() and name[-2] == "V":
        return name[:-2]
    return name


def type_id_of(name: str) -> int:
    """The type id a file stores for operator ``name``: XXH64 (seed 20160701) of
    :func:`unversioned_name` of it (the reference's ``MGB_HASH_STR_WITHOUT_TAIL_0_AND_VERSION``).

    Parameters
    ----------
    name:
        The reference's registered class name.

    Returns
    -------
    int
        The unsigned 64-bit id.
    """
    return xxhash.xxh64_intdigest(unversioned_name(name).encode(), seed=XXHASH_SEED)


# ---- contexts (implemented by megbrain.serialization) -----------------------------------------
class DumpContext(Protocol):
    """What a ``dump(ctx, opr)`` function is given.

    Attributes
    ----------
    keep_param_name, keep_var_name, keep_opr_priority:
        The dump options.
    opr:
        The operator being dumped.
    """

    keep_param_name: bool
    keep_var_name: int
    keep_opr_priority: bool
    opr: Any

    def write_param(self, param: Any) -> None:
        """Write one param table (param-def instance, CppParam or DTypeParam)."""

    def dump_tensor(self, name: str, value: Any, method: TensorWriteMethod) -> None:
        """Write a tensor: an ndarray or a HostTensorND/DeviceTensorND (its comp node is
        written too; an ndarray is on ``cpu:default`` unless ``comp_node=`` is given)."""

    def dump_buf(self, data: bytes) -> None:
        """Write an opaque byte blob."""


class LoadContext(Protocol):
    """What a ``load(ctx, inputs, config)`` function is given.

    Attributes
    ----------
    graph:
        The graph being loaded into (insert operators with ``ctx.graph.insert_opr``).
    mgb_version:
        The MegBrain version number the file declares.
    """

    graph: Any
    mgb_version: int

    def read_param(self, cls: type) -> Any:
        """Read the next param table, which must be of ``cls``'s table (else a
        SerializationError naming both)."""

    def load_tensor(self) -> Any:
        """The next tensor, as a HostTensorND (a META_INPUT one has a shape but no value)."""

    def load_tensor_shared(self) -> Any:
        """The next VALUE_SHARED tensor, as a DeviceTensorND."""

    def load_buf(self) -> bytes:
        """The next blob."""


# ---- the registry ---------------------------------------------------------------------------
@dataclass(frozen=True)
class OprSerializer:
    """One registry entry.

    Attributes
    ----------
    name:
        The name written (its unversioned form gives the type id).
    type_id:
        :func:`type_id_of` ``name``.
    opr_cls:
        The operator class dumped by ``dump``; None for a load-only (compat) entry.
    dump, load:
        The functions (see the module docstring); ``dump`` is None for a load-only entry.
    """

    name: str
    type_id: int
    opr_cls: type | None
    dump: Callable | None
    load: Callable


_BY_CLASS: dict[type, OprSerializer] = {}
_BY_ID: dict[int, OprSerializer] = {}
_REMOVED: set[type] = set()


def _add_by_id(entry: OprSerializer) -> None:
    old = _BY_ID.get(entry.type_id)
    if old is not None and old.load is not entry.load and old.opr_cls is not entry.opr_cls:
        raise MegBrainError(
            f"serializer: type id {entry.type_id:#x} of {entry.name!r} is already registered "
            f"for {old.name!r}"
        )
    _BY_ID[entry.type_id] = entry


def register_serializer(
    opr_cls: type,
    *,
    dump: Callable,
    load: Callable,
    name: str | None = None,
    compat_names: Sequence[str] = (),
) -> OprSerializer:
    """Register how ``opr_cls`` is dumped and loaded.

    Parameters
    ----------
    opr_cls:
        The operator class (subclasses are not covered: each class registers itself).
    dump:
        ``dump(ctx: DumpContext, opr) -> None``.
    load:
        ``load(ctx: LoadContext, inputs: list[VarNode], config: OperatorNodeConfig)``
        returning the new operator or its output vars.
    name:
        The reference's registered name; ``opr_cls.type_name`` by default.
    compat_names:
        More names (legacy versions) whose type ids load through ``load``.

    Returns
    -------
    OprSerializer
        The entry.

    Raises
    ------
    MegBrainError
        When the class or the type id is registered already for something else.
    """
    name = name or opr_cls.type_name
    if opr_cls in _BY_CLASS:
        raise MegBrainError(f"serializer: operator class {opr_cls.__name__} registered twice")
    entry = OprSerializer(name, type_id_of(name), opr_cls, dump, load)
    _add_by_id(entry)
    for extra in compat_names:
        _add_by_id(OprSerializer(extra, type_id_of(extra), opr_cls, None, load))
    _BY_CLASS[opr_cls] = entry
    return entry


def register_fused(opr_cls: type, fused: Callable[[Any], str]) -> OprSerializer:
    """Register ``opr_cls``, an operator made by a compile-time fusion (no reference
    operator), as refused by dump and load: the dump's :class:`NotSerializable` names the
    operator and ``fused(opr)`` (what it fuses), and says to dump before fusion."""

    def dump(ctx, opr) -> None:
        raise NotSerializable(
            f"serialization as FlatBuffers is not supported for operator {opr.name!r} "
            f"({opr_cls.type_name}: {fused(opr)}): fused operators are not written to graph "
            "files; dump the graph before compile-time fusion (the vars you built, or the "
            "outputs of optimize_for_inference)"
        )

    def load(ctx, inputs, config):
        raise SerializationError(
            f"{opr_cls.type_name}: fused operators are never written to graph files"
        )

    return register_serializer(opr_cls, dump=dump, load=load)


def register_loader(name: str, load: Callable) -> OprSerializer:
    """Register a load-only entry: files naming operator ``name`` load through ``load``
    (the reference's ``MGB_SEREG_OPR_COMPAT`` for legacy operators).

    Parameters
    ----------
    name:
        The operator name in the files.
    load:
        As for :func:`register_serializer`.

    Returns
    -------
    OprSerializer
    """
    entry = OprSerializer(name, type_id_of(name), None, None, load)
    _add_by_id(entry)
    return entry


def register_removed_in_dump(opr_cls: type) -> None:
    """Make dumps replace operators of ``opr_cls`` (one input) by their input, as the
    reference does for SetGrad.

    Parameters
    ----------
    opr_cls:
        The operator class.
    """
    _REMOVED.add(opr_cls)


def is_removed_in_dump(opr: Any) -> bool:
    """Whether a dump skips ``opr`` (see :func:`register_removed_in_dump`)."""
    return type(opr) in _REMOVED


def find_by_opr(opr: Any) -> OprSerializer | None:
    """The entry dumping ``opr`` (by its exact class), or None."""
    return _BY_CLASS.get(type(opr))


def find_by_type_id(type_id: int) -> OprSerializer | None:
    """The entry loading operators of ``type_id``, or None."""
    return _BY_ID.get(type_id)


def registered_oprs() -> dict[int, str]:
    """Every registered type id and its name (``config.dump_registered_oprs``)."""
    return {k: v.name for k, v in sorted(_BY_ID.items(), key=lambda kv: kv[1].name)}


def param_to_def(def_cls: type, param: Any, **extra: Any) -> Any:
    """The ``def_cls`` table of an operator's ``param``: fields taken by name, ``extra``
    overriding; table fields the param lacks keep their defaults.

    Parameters
    ----------
    def_cls:
        A param-def class of :mod:`megbrain.opr.param_defs`.
    param:
        The operator's Param (a dataclass) or None.
    **extra:
        Field values given explicitly.

    Returns
    -------
    Any
        A ``def_cls`` instance.
    """
    kw = {}
    for f in def_cls.FIELDS:
        if param is not None and hasattr(param, f.name):
            kw[f.name] = getattr(param, f.name)
    kw.update(extra)
    return def_cls(**kw)


def _default_to_def(def_cls: type) -> Callable:
    return lambda param: param_to_def(def_cls, param)


def _default_from_def(opr_cls: type) -> Callable:
    pcls = getattr(opr_cls, "Param", None)

    def from_def(pdef: Any) -> Any:
        if pcls is None:
            return None
        kw = {}
        for f in fields(pcls) if is_dataclass(pcls) else ():
            if f.name in pdef.__slots__:
                v = getattr(pdef, f.name)
                kw[f.name] = v.name if isinstance(v, enum.Enum) else v
        return pcls(**kw)

    return from_def


def register_param_opr(
    opr_cls: type,
    def_cls: type,
    *,
    to_def: Callable | None = None,
    from_def: Callable | None = None,
    make: Callable | None = None,
    name: str | None = None,
    compat_names: Sequence[str] = (),
) -> OprSerializer:
    """Register an operator whose file form is one param table and its inputs.

    Parameters
    ----------
    opr_cls:
        The operator class.
    def_cls:
        The param-def class of ``megbrain.opr_param_defs`` (or a CppParam class) written.
    to_def:
        ``to_def(opr.param) -> def_cls instance``; default: the fields of ``def_cls`` taken
        by name from the operator's param (missing ones at their defaults).
    from_def:
        ``from_def(def_instance) -> opr_cls.Param``; default: the Param dataclass's fields
        taken by name (enum members by name).
    make:
        ``make(graph, inputs, param, config)`` building the operator and returning it or its
        outputs; default ``graph.insert_opr(opr_cls(inputs, param, config))``.
    name, compat_names:
        As for :func:`register_serializer`.

    Returns
    -------
    OprSerializer
    """
    to_def = to_def or _default_to_def(def_cls)
    from_def = from_def or _default_from_def(opr_cls)

    def dump(ctx: DumpContext, opr: Any) -> None:
        ctx.write_param(to_def(opr.param))

    def load(ctx: LoadContext, inputs: list, config: Any) -> Any:
        param = from_def(ctx.read_param(def_cls))
        if make is not None:
            return make(ctx.graph, list(inputs), param, config)
        return ctx.graph.insert_opr(opr_cls(list(inputs), param, config))

    return register_serializer(opr_cls, dump=dump, load=load, name=name, compat_names=compat_names)


# ---- the param tables of the OperatorParam union ------------------------------------------------
#: the members of schema.fbs's ``OperatorParam`` union; member ``i`` has type number ``i + 1``.
#: Names are the tables' (``param.X`` tables but ``Reserved0`` and ``DType``).
OPERATOR_PARAM_UNION: tuple[str, ...] = tuple(
    """Empty Axis Convolution MaskPropagate ConvPooling ConvBias SeparableConv Images2Neibs
    Pooling LRN BN ROIPooling WarpPerspective SpatialTfGridGenerator SpatialTfSampler
    MGBAddUpdate Elemwise ElemwiseMultiType PowC MatrixMul Winograd SVD Reduce Cumsum CondTake
    Argsort IndexingRemap MGBSleep Linspace LinspaceFull Eye UniformRNG GaussianRNG Flip Rotate
    ROICopy CvtColor WarpAffine GaussianBlur Resize Convolution3D Conv3DBias SeparableConv3D
    TopK RelayoutFormat SeparableFilter LocalShare ROIAlign DeformablePSROIPooling BatchConvBias
    DType PersistentOutputStorage OptionalAxis OptionalAxisV1 ExecutionPolicy AssertEqual
    Reserved0 CollectiveComm CondExecPred CondExecPredLogical CondExecMark CondExecMerge
    Host2DeviceCopy Dimshuffle AxisAddRemove IndexDescMaskDump DTypeTable Remap NMSKeep""".split()
)
# number 51 is ``param.DType`` (a pdef with one dtype field), 67 the ``DType`` table itself
_UNION_NUM = {n: i + 1 for i, n in enumerate(OPERATOR_PARAM_UNION)}
#: the type number of the ``DType`` table (:class:`DTypeParam`)
DTYPE_TABLE_UNION = _UNION_NUM["DTypeTable"]

#: FlatBuffers scalar type -> struct format
SCALAR_FMT = {
    "bool": "?",
    "byte": "b",
    "ubyte": "B",
    "short": "h",
    "ushort": "H",
    "int": "i",
    "uint": "I",
    "long": "q",
    "ulong": "Q",
    "float": "f",
    "double": "d",
}


class FbsStruct(NamedTuple):
    """A FlatBuffers struct: fields ``(name, struct format)``, laid out as C does.

    Values are tuples in field order (a ``4s`` field is 4 bytes).
    """

    name: str
    fields: tuple[tuple[str, str], ...]

    @property
    def fmt(self) -> str:
        """The little-endian struct format with C alignment padding."""
        out, off, align = "<", 0, 1
        for _, f in self.fields:
            a = 1 if f.endswith("s") else struct.calcsize(f)
            align = max(align, a)
            pad = (-off) % a
            out += "x" * pad + f
            off += pad + struct.calcsize(f)
        return out + "x" * ((-off) % align)

    @property
    def size(self) -> int:
        return struct.calcsize(self.fmt)

    @property
    def align(self) -> int:
        return max(1 if f.endswith("s") else struct.calcsize(f) for _, f in self.fields)


class TableField(NamedTuple):
    """One field of a param table.

    ``kind`` is ``scalar`` (``type`` a :data:`SCALAR_FMT` key), ``enum`` (a uint holding the
    member index of ``type``, an enum class), ``dtype`` (a byte: the file's DTypeEnum number),
    ``vector`` (of the scalar ``type``), ``struct`` or ``structs`` (one or a vector of the
    :class:`FbsStruct` ``type``). ``default`` is the value a missing field reads as.
    """

    name: str
    kind: str
    type: Any
    default: Any = 0


@dataclass(frozen=True)
class TableSpec:
    """A param table: its name, ``OperatorParam`` type number and fields.

    ``values(obj)`` gives the field values of a Python param object in file form (enum
    indices, file dtype numbers, tuples); ``make(values)`` builds the Python object back.
    """

    name: str
    union_type: int
    fields: tuple[TableField, ...]
    values: Callable[[Any], list]
    make: Callable[[list], Any]


_PDEF_KIND = {
    "int32": "int",
    "uint32": "uint",
    "uint64": "ulong",
    "float32": "float",
    "float64": "double",
    "bool": "bool",
}

#: the file's DTypeEnum (dtype.fbs); megbrain.dtype's numbering adds Bool at the end
FBS_DTYPES: tuple[str, ...] = tuple(
    """Float32 Uint8 Int8 Int16 Int32 IntB1 IntB2 IntB4 Byte Float16 UintB4 Quantized8Asymm
    QuantizedS32 QuantizedS8 Quantized4Asymm QuantizedS4 QuantizedS16 BFloat16""".split()
)
_FBS_DTYPE_NUM = {n: i for i, n in enumerate(FBS_DTYPES)}


def fbs_dtype_num(dtype: Any) -> int:
    """The file's DTypeEnum number of ``dtype`` (a dtype-like or megbrain's DTypeEnum number).

    Raises
    ------
    SerializationError
        For a dtype the file format has no number for (bool, 64-bit types).
    """
    try:
        dt = dtype_from_num(dtype) if isinstance(dtype, int) else canonize_dtype(dtype)
        name = dtype_name(dt)
    except Exception as exc:  # noqa: BLE001 - re-raised as the format's error
        raise SerializationError(f"dtype {dtype!r} can not be serialized: {exc}") from None
    if name not in _FBS_DTYPE_NUM:
        raise SerializationError(f"dtype {name} has no number in MegBrain's file format")
    return _FBS_DTYPE_NUM[name]


def _pdef_spec(cls: type) -> TableSpec:

    name = cls.__name__
    if getattr(cls, "IS_LEGACY", False) or name not in _UNION_NUM:
        raise SerializationError(
            f"param {name} is not a table of the OperatorParam union (legacy or C++-only); "
            "it can not be written to a graph file"
        )
    tfields = []
    for f in cls.FIELDS:
        if f.ctype == "enum":
            tfields.append(
                TableField(f.name, "enum", f.enum, enum_index(f.enum.convert(f.default)))
            )
        elif f.ctype == "dtype":
            tfields.append(TableField(f.name, "dtype", None, fbs_dtype_num(f.default)))
        else:
            tfields.append(TableField(f.name, "scalar", _PDEF_KIND[f.ctype], f.default))
    tfields = tuple(tfields)

    def values(obj: Any) -> list:
        out = []
        for tf in tfields:
            v = getattr(obj, tf.name)
            if tf.kind == "enum":
                v = enum_index(v)
            elif tf.kind == "dtype":
                v = _fbs_from_our_num(int(v), f"param {name} field {tf.name}")
            out.append(v)
        return out

    def make(vals: list) -> Any:
        kw, raw = {}, {}
        for tf, v in zip(tfields, vals):
            if tf.kind == "enum":
                members = list(tf.type)
                if not 0 <= v < len(members):
                    raise SerializationError(
                        f"param {name}: field {tf.name} holds {v}, not a member index of "
                        f"{tf.type.__name__} (0..{len(members) - 1})"
                    )
                v = members[v]
            elif tf.kind == "dtype":
                # stored as megbrain's DTypeEnum number (quantized ones have no scale here)
                raw[tf.name] = _dtype_from_fbs(v, f"param {name} field {tf.name}")
                continue
            kw[tf.name] = v
        obj = cls(**kw)
        for k, v in raw.items():
            setattr(obj, k, v)
        return obj

    return TableSpec(name, _UNION_NUM[name], tfields, values, make)


@functools.cache
def _our_dtype_nums() -> dict[str, int]:
    """megbrain.dtype's DTypeEnum number of each dtype name."""
    out = {}
    for num in range(64):
        for args in ((), (1.0,), (1.0, 0)):
            try:
                out[dtype_name(dtype_from_num(num, *args))] = num
                break
            except MegBrainError:
                continue
    return out


def _fbs_from_our_num(num: int, where: str) -> int:
    """The file's DTypeEnum number of megbrain.dtype's number ``num``."""
    for name, ours in _our_dtype_nums().items():
        if ours == num:
            if name not in _FBS_DTYPE_NUM:
                raise SerializationError(f"{where}: dtype {name} has no number in the file format")
            return _FBS_DTYPE_NUM[name]
    raise SerializationError(f"{where}: unknown dtype number {num}")


def _dtype_from_fbs(num: int, where: str) -> int:
    """megbrain.dtype's number of the file's DTypeEnum ``num``."""
    if not 0 <= num < len(FBS_DTYPES):
        raise SerializationError(f"{where}: bad DTypeEnum {num} (0..{len(FBS_DTYPES) - 1})")
    return _our_dtype_nums()[FBS_DTYPES[num]]


class CppParam:
    """Base of the C++-side param tables (``src/opr/impl/mgb_cpp_opr.fbs``).

    Instances take their fields as keywords (missing ones at their defaults); a struct field
    is a tuple, a vector field a list.
    """

    TABLE: str = ""
    FIELDS: tuple[TableField, ...] = ()

    def __init__(self, **kwargs: Any):
        names = {f.name for f in self.FIELDS}
        bad = set(kwargs) - names
        if bad:
            raise TypeError(f"param {self.TABLE}: unknown fields {sorted(bad)}")
        for f in self.FIELDS:
            v = kwargs.get(f.name, f.default)
            setattr(self, f.name, list(v) if f.kind in ("vector", "structs") else v)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, f.name) == getattr(other, f.name) for f in self.FIELDS)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        args = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in self.FIELDS)
        return f"{self.TABLE}({args})"


def _cpp(table: str, *tfields: TableField) -> type[CppParam]:
    return type(table, (CppParam,), {"TABLE": table, "FIELDS": tuple(tfields), "__slots__": ()})


#: ``PersistentDTypeScalar``: (file DTypeEnum number, the value's 4 bytes)
PERSISTENT_DTYPE_SCALAR = FbsStruct("PersistentDTypeScalar", (("dtype", "b"), ("storage", "4s")))
AXIS_DESC = FbsStruct("AxisDesc", (("method", "b"), ("axis", "i")))
INDEX_DESC_MASK_ITEM = FbsStruct(
    "IndexDescMaskItem",
    (("axis", "b"), ("begin", "?"), ("end", "?"), ("step", "?"), ("idx", "?")),
)
_ZERO_SCALAR = (0, b"\0\0\0\0")

#: the C++-side tables by name
CPP_PARAMS: dict[str, type[CppParam]] = {
    c.TABLE: c
    for c in (
        _cpp(
            "MGBAddUpdate",
            TableField("alpha", "struct", PERSISTENT_DTYPE_SCALAR, None),
            TableField("beta", "struct", PERSISTENT_DTYPE_SCALAR, None),
            TableField("bias", "struct", PERSISTENT_DTYPE_SCALAR, None),
        ),
        _cpp(
            "Host2DeviceCopy",
            TableField("enable_value_infer", "scalar", "bool", True),
            TableField("dump_default_value", "scalar", "bool", False),
            TableField("allow_cpu_mem_fwd", "scalar", "bool", True),
        ),
        _cpp(
            "Dimshuffle",
            TableField("pattern", "vector", "int", ()),
            TableField("ndim", "scalar", "uint", 0),
        ),
        _cpp("AxisAddRemove", TableField("desc", "structs", AXIS_DESC, ())),
        _cpp(
            "MGBSleep",
            TableField("device", "scalar", "bool", True),
            TableField("host", "scalar", "bool", False),
            TableField("seconds", "scalar", "double", 0.0),
        ),
        _cpp("IndexDescMaskDump", TableField("items", "structs", INDEX_DESC_MASK_ITEM, ())),
        _cpp(
            "NMSKeep",
            TableField("iou_thresh", "scalar", "float", 0.0),
            TableField("max_output", "scalar", "uint", 0),
        ),
    )
}


def persistent_scalar(value: float | int, dtype: Any = "float32") -> tuple[int, bytes]:
    """A ``PersistentDTypeScalar`` struct value: ``value`` stored as ``dtype`` (4 bytes)."""
    dt = canonize_dtype(dtype)
    raw = np.asarray(value, dtype=dt).tobytes()
    if len(raw) > 4:
        raise SerializationError(f"persistent scalar of dtype {dt} does not fit in 4 bytes")
    return (fbs_dtype_num(dt), raw.ljust(4, b"\0"))


def persistent_scalar_value(scalar: tuple[int, bytes] | None) -> Any:
    """The Python number of a ``PersistentDTypeScalar`` struct value (None stays None)."""
    if scalar is None:
        return None
    dt = np.dtype(dtype_from_num(_dtype_from_fbs(scalar[0], "PersistentDTypeScalar")))
    if dt.itemsize > 4:
        raise SerializationError(f"PersistentDTypeScalar: dtype {dt} does not fit in 4 bytes")
    return np.frombuffer(scalar[1][: dt.itemsize], dtype=dt)[0].item()


class DTypeParam:
    """The ``DType`` table of the union (type 67): a dtype with its quantization parameters.

    Parameters
    ----------
    dtype:
        A dtype-like.
    """

    def __init__(self, dtype: Any):
        self.dtype = canonize_dtype(dtype)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DTypeParam):
            return NotImplemented
        return dtype_key(self.dtype) == dtype_key(other.dtype)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"DTypeParam({self.dtype!r})"


def _cpp_spec(cls: type[CppParam]) -> TableSpec:
    def values(obj: Any) -> list:
        return [getattr(obj, f.name) for f in cls.FIELDS]

    def make(vals: list) -> Any:
        return cls(**{f.name: v for f, v in zip(cls.FIELDS, vals)})

    return TableSpec(cls.TABLE, _UNION_NUM[cls.TABLE], cls.FIELDS, values, make)


_DTYPE_SPEC = TableSpec(
    "DType", _UNION_NUM["DTypeTable"], (), lambda o: [o.dtype], lambda v: DTypeParam(v[0])
)
_SPECS: dict[type, TableSpec] = {DTypeParam: _DTYPE_SPEC}


def table_spec_of(cls_or_obj: Any) -> TableSpec:
    """The table of a param class (or instance): a non-legacy param-def class, a CppParam
    class or :class:`DTypeParam`.

    Raises
    ------
    SerializationError
        For anything else (a legacy param-def, a param not in the union).
    """
    cls = cls_or_obj if isinstance(cls_or_obj, type) else type(cls_or_obj)
    spec = _SPECS.get(cls)
    if spec is None:
        if issubclass(cls, CppParam):
            spec = _cpp_spec(cls)
        elif hasattr(cls, "FIELDS") and hasattr(cls, "TAG"):
            spec = _pdef_spec(cls)
        else:
            raise SerializationError(f"{cls.__name__} is not a serializable param table")
        _SPECS[cls] = spec
    return spec


def table_spec_by_union(union_type: int) -> str | None:
    """The table name of ``OperatorParam`` type number ``union_type`` (None if out of range)."""
    if 1 <= union_type <= len(OPERATOR_PARAM_UNION):
        n = OPERATOR_PARAM_UNION[union_type - 1]
        return "DType" if n == "DTypeTable" else n
    return None
