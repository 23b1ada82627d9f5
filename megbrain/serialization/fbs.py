"""FlatBuffers for graph files: a verifying reader over the bytes, and writers for the param
tables described in :mod:`megbrain.serialization.sereg`.

The Python ``flatbuffers`` runtime writes (its Builder lays out vtables and omits fields at
their defaults, as flatc's generated code does) but has no verifier, so reading goes through
:class:`Reader`: every offset, vtable, vector length, string and nested table is bounds
checked before it is used, nesting depth and the number of tables visited are limited, and
every failure is a SerializationError saying what was malformed.
"""

from __future__ import annotations

import struct
from typing import Any

import flatbuffers

from ..errors import SerializationError
from .sereg import (
    DTYPE_TABLE_UNION,
    FBS_DTYPES,
    SCALAR_FMT,
    FbsStruct,
    TableField,
    TableSpec,
    fbs_dtype_num,
)

__all__ = ["Reader", "Table", "write_table", "read_table", "MAX_DEPTH", "MAX_TABLES"]

#: deepest nesting of tables the reader follows
MAX_DEPTH = 64
#: most table visits per buffer (a vector may point many times at one table)
MAX_TABLES = 1 << 20

_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")


class Reader:
    """Bounds-checked access to one FlatBuffer.

    Parameters
    ----------
    buf:
        The buffer (without the size prefix).
    what:
        What the buffer is, for messages.
    """

    def __init__(self, buf: bytes, what: str = "graph"):
        self.buf = memoryview(bytes(buf))
        self.what = what
        self.nr_tables = 0

    def error(self, msg: str) -> SerializationError:
        return SerializationError(f"corrupted {self.what} FlatBuffer: {msg}")

    def check(self, pos: int, size: int, what: str) -> None:
        if pos < 0 or size < 0 or pos + size > len(self.buf):
            raise self.error(
                f"{what} at byte {pos} (+{size}) lies outside the buffer of {len(self.buf)} bytes"
            )

    def unpack(self, st: struct.Struct, pos: int, what: str) -> Any:
        self.check(pos, st.size, what)
        return st.unpack_from(self.buf, pos)[0]

    def root(self, identifier: bytes | None = None) -> Table:
        """The root table; with ``identifier`` the 4 bytes after the root offset must be it."""
        if identifier is not None:
            self.check(4, 4, "file identifier")
            got = bytes(self.buf[4:8])
            if got != identifier:
                raise SerializationError(
                    f"not a MegBrain graph: file identifier {got!r}, expected {identifier!r}"
                )
        off = self.unpack(_U32, 0, "root offset")
        return Table(self, off, 0, "root table")


class Table:
    """One table of a :class:`Reader`'s buffer, its vtable already checked."""

    def __init__(self, reader: Reader, pos: int, depth: int, what: str):
        if depth > MAX_DEPTH:
            raise reader.error(f"tables nested deeper than {MAX_DEPTH} at {what}")
        reader.nr_tables += 1
        if reader.nr_tables > MAX_TABLES:
            raise reader.error(f"more than {MAX_TABLES} table visits")
        self.r, self.pos, self.depth, self.what = reader, pos, depth, what
        if pos % 4:
            raise reader.error(f"{what} at byte {pos} is not 4-byte aligned")
        soff = reader.unpack(_I32, pos, f"{what} vtable offset")
        vt = pos - soff
        if vt % 2:
            raise reader.error(f"{what}: vtable at odd byte {vt}")
        vt_size = reader.unpack(_U16, vt, f"{what} vtable")
        self.tbl_size = reader.unpack(_U16, vt + 2, f"{what} vtable")
        if vt_size < 4 or vt_size % 2:
            raise reader.error(f"{what}: bad vtable size {vt_size}")
        reader.check(vt, vt_size, f"{what} vtable")
        if self.tbl_size < 4:
            raise reader.error(f"{what}: bad table size {self.tbl_size}")
        reader.check(pos, self.tbl_size, what)
        self.vt, self.vt_size = vt, vt_size

    def field_pos(self, slot: int, size: int) -> int | None:
        """Absolute position of field ``slot`` of ``size`` bytes, or None when absent."""
        entry = 4 + 2 * slot
        if entry + 2 > self.vt_size:
            return None
        off = _U16.unpack_from(self.r.buf, self.vt + entry)[0]
        if off == 0:
            return None
        if off + size > self.tbl_size:
            raise self.r.error(f"{self.what}: field {slot} lies outside its table")
        return self.pos + off

    def scalar(self, slot: int, fmt: str, default: Any = 0) -> Any:
        st = struct.Struct("<" + fmt)
        p = self.field_pos(slot, st.size)
        if p is None:
            return default
        return st.unpack_from(self.r.buf, p)[0]

    def _target(self, slot: int) -> int | None:
        p = self.field_pos(slot, 4)
        if p is None:
            return None
        off = _U32.unpack_from(self.r.buf, p)[0]
        if off == 0:
            raise self.r.error(f"{self.what}: field {slot} has a null offset")
        tgt = p + off
        self.r.check(tgt, 4, f"{self.what} field {slot} target")
        return tgt

    def table(self, slot: int, what: str) -> Table | None:
        tgt = self._target(slot)
        return None if tgt is None else Table(self.r, tgt, self.depth + 1, what)

    def _vector(self, slot: int, elem_size: int, what: str) -> tuple[int, int] | None:
        tgt = self._target(slot)
        if tgt is None:
            return None
        n = _U32.unpack_from(self.r.buf, tgt)[0]
        self.r.check(tgt + 4, n * elem_size, f"{what} ({n} elements of {elem_size} bytes)")
        return tgt + 4, n

    def string(self, slot: int, what: str) -> str | None:
        v = self._vector(slot, 1, what)
        return None if v is None else _string_at(self.r, v[0] - 4, what)

    def scalars(self, slot: int, fmt: str, what: str) -> list | None:
        st = struct.Struct("<" + fmt)
        v = self._vector(slot, st.size, what)
        if v is None:
            return None
        start, n = v
        return [x[0] for x in st.iter_unpack(self.r.buf[start : start + n * st.size])]

    def raw_bytes(self, slot: int, what: str) -> bytes | None:
        v = self._vector(slot, 1, what)
        return None if v is None else bytes(self.r.buf[v[0] : v[0] + v[1]])

    def _offsets(self, slot: int, what: str) -> list[tuple[int, int]] | None:
        """``(position, offset)`` of each element of a vector of offsets (tables, strings)."""
        v = self._vector(slot, 4, what)
        if v is None:
            return None
        start, n = v
        return [(p, _U32.unpack_from(self.r.buf, p)[0]) for p in range(start, start + 4 * n, 4)]

    def tables(self, slot: int, what: str) -> list[Table] | None:
        offs = self._offsets(slot, what)
        if offs is None:
            return None
        out = []
        for i, (p, off) in enumerate(offs):
            if off == 0:
                raise self.r.error(f"{what}[{i}] is a null offset")
            out.append(Table(self.r, p + off, self.depth + 1, f"{what}[{i}]"))
        return out

    def strings(self, slot: int, what: str) -> list[str] | None:
        offs = self._offsets(slot, what)
        if offs is None:
            return None
        return [_string_at(self.r, p + off, f"{what}[{i}]") for i, (p, off) in enumerate(offs)]

    def struct(self, slot: int, spec: FbsStruct) -> tuple | None:
        p = self.field_pos(slot, spec.size)
        if p is None:
            return None
        return struct.unpack_from(spec.fmt, self.r.buf, p)

    def structs(self, slot: int, spec: FbsStruct, what: str) -> list[tuple] | None:
        v = self._vector(slot, spec.size, what)
        if v is None:
            return None
        start, n = v
        st = struct.Struct(spec.fmt)
        return list(st.iter_unpack(self.r.buf[start : start + n * spec.size]))

    def union(self, type_slot: int, what: str) -> tuple[int, Table | None]:
        """(type number, table) of the union whose type field is ``type_slot``."""
        t = self.scalar(type_slot, "B", 0)
        if t == 0:
            return 0, None
        tbl = self.table(type_slot + 1, what)
        if tbl is None:
            raise self.r.error(f"{what}: union type {t} without a value")
        return t, tbl


def _string_at(r: Reader, pos: int, what: str) -> str:
    n = r.unpack(_U32, pos, what)
    r.check(pos + 4, n + 1, f"{what} (string of {n} bytes)")
    if r.buf[pos + 4 + n] != 0:
        raise r.error(f"{what}: string without its terminating zero")
    try:
        return bytes(r.buf[pos + 4 : pos + 4 + n]).decode("utf-8")
    except UnicodeDecodeError:
        raise r.error(f"{what}: string is not UTF-8") from None


# ---- param tables ---------------------------------------------------------------------------
_PREPEND = {
    "?": "PrependBool",
    "b": "PrependInt8",
    "B": "PrependUint8",
    "h": "PrependInt16",
    "H": "PrependUint16",
    "i": "PrependInt32",
    "I": "PrependUint32",
    "q": "PrependInt64",
    "Q": "PrependUint64",
    "f": "PrependFloat32",
    "d": "PrependFloat64",
}


def _fmt_tokens(fmt: str) -> list[str]:
    out, num = [], ""
    for ch in fmt.lstrip("<"):
        if ch.isdigit():
            num += ch
            continue
        out.append(num + ch)
        num = ""
    return out


def prepend_struct(b: flatbuffers.Builder, spec: FbsStruct, value: tuple) -> int:
    """Write struct ``value`` at the builder's head; returns its offset."""
    if len(value) != len(spec.fields):
        raise SerializationError(f"struct {spec.name}: expected {len(spec.fields)} fields")
    b.Prep(spec.align, spec.size)
    vals = list(value)
    for tok in reversed(_fmt_tokens(spec.fmt)):
        if tok == "x":
            b.Pad(1)
        elif tok.endswith("s"):
            raw = bytes(vals.pop())
            n = int(tok[:-1])
            raw = raw.ljust(n, b"\0")[:n]
            for byte in reversed(raw):
                b.PrependUint8(byte)
        else:
            getattr(b, _PREPEND[tok])(vals.pop())
    return b.Offset()


def _scalar_fmt(f: TableField) -> str:
    if f.kind == "enum":
        return "I"
    if f.kind == "dtype":
        return "b"
    return SCALAR_FMT[f.type]


def write_table(b: flatbuffers.Builder, spec: TableSpec, obj: Any) -> int:
    """Write the param table ``obj`` of ``spec``; returns its offset."""
    if spec.union_type == DTYPE_TABLE_UNION:
        return write_dtype(b, spec.values(obj)[0])
    values = spec.values(obj)
    pre: dict[int, int] = {}
    for i, (f, v) in enumerate(zip(spec.fields, values)):
        if f.kind == "vector":
            fmt = SCALAR_FMT[f.type]
            size = struct.calcsize(fmt)
            b.StartVector(size, len(v), size)
            for x in reversed(list(v)):
                getattr(b, _PREPEND[fmt])(x)
            pre[i] = b.EndVector()
        elif f.kind == "structs":
            b.StartVector(f.type.size, len(v), f.type.align)
            for x in reversed(list(v)):
                prepend_struct(b, f.type, tuple(x))
            pre[i] = b.EndVector()
    b.StartObject(len(spec.fields))
    for i, (f, v) in enumerate(zip(spec.fields, values)):
        if i in pre:
            b.PrependUOffsetTRelativeSlot(i, pre[i], 0)
        elif f.kind == "struct":
            if v is not None:
                b.PrependStructSlot(i, prepend_struct(b, f.type, tuple(v)), 0)
        else:
            fmt = _scalar_fmt(f)
            slot = _PREPEND[fmt] + "Slot"
            getattr(b, slot)(i, v, f.default)
    return b.EndObject()


def read_table(tbl: Table, spec: TableSpec) -> Any:
    """The Python param object of table ``tbl`` of ``spec``."""
    if spec.union_type == DTYPE_TABLE_UNION:
        return spec.make([read_dtype(tbl)])
    vals = []
    for i, f in enumerate(spec.fields):
        what = f"param {spec.name} field {f.name}"
        if f.kind == "vector":
            v = tbl.scalars(i, SCALAR_FMT[f.type], what)
            vals.append([] if v is None else v)
        elif f.kind == "structs":
            v = tbl.structs(i, f.type, what)
            vals.append([] if v is None else v)
        elif f.kind == "struct":
            vals.append(tbl.struct(i, f.type))
        else:
            vals.append(tbl.scalar(i, _scalar_fmt(f), f.default))
    return spec.make(vals)


# ---- dtypes ---------------------------------------------------------------------------------
def write_dtype(b: flatbuffers.Builder, dtype: Any) -> int:
    """Write a ``DType`` table for ``dtype`` (quantized dtypes with their parameters)."""
    from ..dtype import canonize_dtype, dtype_name, get_scale, get_zero_point, is_quantize

    dt = canonize_dtype(dtype)
    num = fbs_dtype_num(dt)
    param = None
    if is_quantize(dt):
        b.StartObject(2)
        b.PrependFloat32Slot(0, float(get_scale(dt)), 0.0)
        if "Asymm" in dtype_name(dt):
            b.PrependUint8Slot(1, int(get_zero_point(dt)), 0)
        param = b.EndObject()
    b.StartObject(3)
    if param is not None:
        b.PrependUOffsetTRelativeSlot(2, param, 0)
    b.PrependInt8Slot(0, num, 0)
    if param is not None:
        b.PrependUint8Slot(1, 1, 0)
    return b.EndObject()


def read_dtype(tbl: Table) -> Any:
    """The numpy dtype of ``DType`` table ``tbl``."""
    from ..dtype import dtype_from_num, get_dtype_num, get_quantized_dtype

    num = tbl.scalar(0, "b", 0)
    if not 0 <= num < len(FBS_DTYPES):
        raise SerializationError(
            f"{tbl.what}: bad DTypeEnum {num} (the file format knows 0..{len(FBS_DTYPES) - 1})"
        )
    name = FBS_DTYPES[num]
    ptype, ptbl = tbl.union(1, f"{tbl.what} param")
    quantized = name.startswith("Quantized")
    if not quantized:
        if ptype not in (0, 1):
            raise SerializationError(f"{tbl.what}: bad DTypeParam type {ptype}")
        return dtype_from_num(get_dtype_num(name))
    if ptype != 1 or ptbl is None:
        raise SerializationError(f"{tbl.what}: quantized dtype {name} without its scale")
    scale = ptbl.scalar(0, "f", 0.0)
    zp = ptbl.scalar(1, "B", 0) if "Asymm" in name else None
    try:
        return get_quantized_dtype(name, scale, zp)
    except Exception as exc:  # noqa: BLE001 - a bad scale / zero point
        raise SerializationError(f"{tbl.what}: bad quantization of {name}: {exc}") from None
