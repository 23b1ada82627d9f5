"""Dump every operator's outputs: as text (TextOprIODump) or one binary file per var
(BinaryOprIODump, read back by :func:`load_tensor_binary`)."""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Callable

import numpy as np

from ..dtype import canonize_dtype, dtype_name
from ..errors import ArgumentError, SerializationError
from ..graph.operator import fmt_shape
from .base import Observer, PluginBase

__all__ = ["TextOprIODump", "BinaryOprIODump", "load_tensor_binary"]


# ---- text --------------------------------------------------------------------------------
def _as_float(a: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "b":
        return a.astype(np.float64)
    try:
        return a.astype(np.float64)
    except (TypeError, ValueError):
        return a.view(np.uint8).astype(np.float64)


def format_values(value, max_size: int, stat: bool = False) -> str:
    """``[v0, v1, ...]`` with at most ``max_size`` values (``%.4g``), and with ``stat``
    the reference's ``min= max= mean= l2= sd=`` statistics."""
    a = np.asarray(value)
    flat = _as_float(a.reshape(-1))
    shown = [f"{x:.4g}" for x in flat[:max_size]]
    if flat.size > max_size:
        shown.append("...")
    out = "[" + ", ".join(shown) + "]"
    if not stat:
        return out
    n = flat.size
    if n == 0:
        return out + "min=N/A max=N/A mean=N/A l2=N/A sd=N/A"
    with np.errstate(all="ignore"):
        s1, s2 = flat.sum(), (flat * flat).sum()
        out += (
            f"min={flat.min():.3g} max={flat.max():.3g} mean={s1 / n:.3g} "
            f"l2={np.sqrt(s2 / n):.3g}"
        )
        if n > 1:
            out += f" sd={np.sqrt(max((s2 * n - s1 * s1) / (n * (n - 1)), 0.0)):.3g}"
        else:
            out += " sd=N/A"
    return out


def _storage_flag(var) -> str:
    return "s" if var.shape_static else "d"


class _TextObserver(Observer):
    def __init__(self, fout, owns: bool):
        self.fout, self.owns = fout, owns
        self.print_addr = True
        self.max_size = 5
        self.lock = threading.Lock()

    def close(self) -> None:
        with self.lock:
            if self.owns:
                self.fout.close()
            else:
                self.fout.flush()

    def wrap_step(self, func, opr, fn: Callable[[], None], value_of) -> Callable[[], None]:
        ob = self

        def step():
            if not ob.active:
                return fn()
            deps = ob.deps(opr, value_of)  # before the run: it may overwrite an input
            fn()
            ob.dump(opr, value_of, deps)

        return step

    def _val(self, a) -> str:
        if a is None:
            return "<invalid>"
        s = format_values(a, self.max_size)
        if self.print_addr and isinstance(a, np.ndarray):
            s += f"  <{a.ctypes.data:#x}>"
        return s

    def deps(self, opr, value_of) -> list[str]:
        """The ``deps:`` lines of ``opr``: its inputs' values (taken before it runs)."""
        lines = [" deps:"]
        for i, v in enumerate(opr.inputs):
            if i in opr.shape_only_inputs:
                iv = value_of(v)
                dep = f" <shape dep[{_storage_flag(v)}]> " + (
                    fmt_shape(np.shape(iv)) if iv is not None else "<unknown>"
                )
            elif i in opr.static_only_inputs:
                dep = f" <host value[{'s' if v.value_static else 'd'}]> " + self._val(
                    value_of(v)
                )
            else:
                dep = self._val(value_of(v))
            lines.append(f"  [i{i}]var{v.id}: {dep} {_storage_flag(v)}")
        for v in getattr(opr, "extra_deps", ()):
            lines.append(f"  var{v.id}:  <dev comp order> {_storage_flag(v)}")
        return lines

    def dump(self, opr, value_of, deps: list[str]) -> None:
        lines = []
        for var in opr.outputs:
            a = value_of(var)
            layout = "<invalid>" if a is None else f"{fmt_shape(np.shape(a))}"
            lines.append(
                f"var{var.id} produced: name={var.name} layout={layout} "
                f"dtype={dtype_name(var.dtype)} owner_opr={opr.name}{{{opr.type_name}}} "
                f"opr{opr.id}"
            )
            if a is None:
                continue
            lines.extend(deps)
            val = format_values(a, self.max_size, stat=True)
            if self.print_addr and isinstance(a, np.ndarray):
                val += f"  <{a.ctypes.data:#x}>"
            lines.append(f" val: {val} {_storage_flag(var)}")
        text = "\n".join(lines) + "\n"
        with self.lock:
            if not self.fout.closed:
                self.fout.write(text)
                self.fout.flush()


class TextOprIODump(PluginBase):
    """Write every operator's outputs, with its inputs, as text to ``fpath``, in the
    reference's layout: per output var ``varN produced: name=.. layout={shape} dtype=..
    owner_opr=name{Type} oprM``, then ``deps:`` (each input: its first values, or
    ``<shape dep>`` / ``<host value>`` for inputs read only through static inference) and
    ``val:`` (the first values and ``min max mean l2 sd``).

    Only functions compiled after the dump was created are observed (see
    :class:`~megbrain.plugin.base.PluginBase`); :meth:`detach` (or dropping the object)
    stops it and closes the file.

    Parameters
    ----------
    comp_graph:
        The graph to observe.
    fpath:
        The file to write (truncated), or an open text file object (left open).
    print_addr:
        Whether to print each value's address (default True, as the reference).
    max_size:
        How many values to print per var (default 5).
    """

    def __init__(self, comp_graph, fpath, *, print_addr: bool | None = None, max_size=None):
        if isinstance(fpath, (str, os.PathLike)):
            ob = _TextObserver(open(fpath, "w"), owns=True)  # noqa: SIM115 - closed on detach
        elif hasattr(fpath, "write"):
            ob = _TextObserver(fpath, owns=False)
        else:
            raise ArgumentError(
                f"TextOprIODump: fpath must be a path or a text file, got {type(fpath).__name__}"
            )
        super().__init__(comp_graph, ob)
        if print_addr is not None:
            self.print_addr(print_addr)
        if max_size is not None:
            self.max_size(max_size)

    def print_addr(self, flag: bool) -> TextOprIODump:
        """Set whether to print var addresses; returns self."""
        self._observer.print_addr = bool(flag)
        return self

    def max_size(self, size: int) -> TextOprIODump:
        """Set the number of values printed per var; returns self."""
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
            raise ArgumentError(
                f"TextOprIODump.max_size: size must be a non-negative integer, got {size!r}"
            )
        self._observer.max_size = int(size)
        return self


# ---- binary ------------------------------------------------------------------------------
#: MegDNN's DTypeEnum numbers (the binary dump's header); Bool is MegEngine's later number
_BINARY_DTYPE = {
    "Float32": 0,
    "Uint8": 1,
    "Int8": 2,
    "Int16": 3,
    "Int32": 4,
    "IntB1": 5,
    "IntB2": 6,
    "IntB4": 7,
    "Byte": 8,
    "Float16": 9,
    "UintB4": 10,
    "BFloat16": 11,
    "Bool": 12,
    "Quantized8Asymm": 100000,
    "QuantizedS32": 100001,
    "QuantizedS8": 100002,
    "Quantized4Asymm": 100003,
    "QuantizedS4": 100004,
    "QuantizedS16": 100005,
}
_BINARY_NAME = {num: name for name, num in _BINARY_DTYPE.items()}
_MAX_NDIM = 7  # TensorShape::MAX_NDIM
_HEADER = struct.Struct(f"<III{_MAX_NDIM}I")


def _load_dtype(num: int) -> np.dtype:
    name = _BINARY_NAME[num]
    if num >= 100000:  # quantized: the values only (the file has no scale), as the reference
        storage = {"QuantizedS32": "int32", "QuantizedS16": "int16"}
        return np.dtype(storage.get(name, "uint8" if "Asymm" in name else "int8"))
    return canonize_dtype(name)


def dump_tensor(value: np.ndarray, dtype_num: int, name: str) -> bytes:
    """One value in the reference's ``debug::dump_tensor`` layout: ``uint32`` name length,
    dtype number and ``MAX_NDIM`` (7), 7 ``uint32`` shape entries (unused ones 0), the
    name, then the raw C-contiguous data (native byte order)."""
    a = np.ascontiguousarray(value)
    if a.ndim > _MAX_NDIM:
        raise ArgumentError(f"dump_tensor: {a.ndim} dims, at most {_MAX_NDIM}")
    shape = list(a.shape) + [0] * (_MAX_NDIM - a.ndim)
    raw = name.encode("ascii", "backslashreplace")
    return _HEADER.pack(len(raw), dtype_num, _MAX_NDIM, *shape) + raw + a.tobytes()


def _copy(value):
    return None if value is None else np.array(value, copy=True)


def _var_title(var, value) -> str:
    return f"{var.name}(id:{var.id},shape:{fmt_shape(np.shape(value))},{dtype_name(var.dtype)})"


class _BinaryObserver(Observer):
    def __init__(self, dir_path: str):
        self.dir = dir_path
        self.dump_inputs = bool(os.getenv("MGB_DUMP_INPUT"))

    def wrap_step(self, func, opr, fn: Callable[[], None], value_of) -> Callable[[], None]:
        ob = self

        def step():
            if not ob.active:
                return fn()
            ins = None
            if ob.dump_inputs:  # copied before the run: it may overwrite an input in place
                ins = [(v, _copy(value_of(v))) for v in opr.inputs]
            fn()
            ob.dump(opr, value_of, ins)

        return step

    def _write(self, fid: int, var, value, inputs_desc: str, prefix: str, suffix: str) -> None:
        num = _BINARY_DTYPE.get(dtype_name(var.dtype))
        if num is None or value is None:
            return
        title = f"{prefix}var={_var_title(var, value)} owner_opr_inputs={inputs_desc}"
        path = os.path.join(self.dir, f"{fid:06x}{suffix}")
        with open(path, "wb") as fout:
            fout.write(dump_tensor(value, num, title))

    def dump(self, opr, value_of, ins=None) -> None:
        if ins is None:
            ins = [(v, value_of(v)) for v in opr.inputs]
        desc = "[" + ", ".join(_var_title(v, a) for v, a in ins) + "]"
        for var in opr.outputs:
            self._write(var.id, var, value_of(var), desc, "", "")
            if self.dump_inputs:  # named after the output, as the reference
                for i, (v, a) in enumerate(ins):
                    self._write(var.id, v, a, desc, f"inp{i}: ", f"-inp{i}")


class BinaryOprIODump(PluginBase):
    """Write every operator output to ``dir_path`` as one binary file per var, named by
    the var id in 6 hex digits (``00002a``), in the reference's layout (see
    :func:`load_tensor_binary`); a later run overwrites the files. With the environment
    variable ``MGB_DUMP_INPUT`` set, the inputs of each operator are written too, as read
    before it ran, named after its output (``00002a-inp0``). Vars of dtypes without a dump
    number are skipped.

    Only functions compiled after the dump was created are observed (see
    :class:`~megbrain.plugin.base.PluginBase`); :meth:`detach` stops it.

    Parameters
    ----------
    comp_graph:
        The graph to observe.
    dir_path:
        The directory (created if missing).
    """

    def __init__(self, comp_graph, dir_path):
        if not isinstance(dir_path, (str, os.PathLike)):
            raise ArgumentError(
                f"BinaryOprIODump: dir_path must be a path, got {type(dir_path).__name__}"
            )
        dir_path = os.fspath(dir_path)
        os.makedirs(dir_path, exist_ok=True)
        self.dir_path = dir_path
        super().__init__(comp_graph, _BinaryObserver(dir_path))


def load_tensor_binary(fobj):
    """Load a value written by :class:`BinaryOprIODump`.

    Parameters
    ----------
    fobj:
        A binary file object, or a path.

    Returns
    -------
    tuple
        ``(value, name)``: the numpy array (quantized values come back as their integer
        storage, the file has no scale) and the var description stored with it, in the
        reference's order.

    Raises
    ------
    SerializationError
        When the file is truncated, has an unknown or unsupported dtype, a bad header, a
        non-ASCII name, or more or fewer data bytes than its shape needs.
    """
    if isinstance(fobj, (str, os.PathLike)):
        with open(fobj, "rb") as fin:
            return load_tensor_binary(fin)
    where = getattr(fobj, "name", "<file>")
    head = fobj.read(12)
    if len(head) < 12:
        raise SerializationError(
            f"load_tensor_binary: {where}: truncated header ({len(head)} of 12 bytes)"
        )
    name_len, dtype_num, max_ndim = struct.unpack("<III", head)
    if not 1 <= max_ndim <= 64:
        raise SerializationError(
            f"load_tensor_binary: {where}: bad header: max_ndim={max_ndim} (the dump writes "
            f"{_MAX_NDIM}); not a tensor dump"
        )
    if dtype_num not in _BINARY_NAME:
        raise SerializationError(f"load_tensor_binary: {where}: unknown dtype number {dtype_num}")
    if _BINARY_NAME[dtype_num] == "Byte":
        raise SerializationError(
            f"load_tensor_binary: {where}: Cannot load this tensor: dtype Byte is unsupported"
        )
    raw_shape = fobj.read(4 * max_ndim)
    if len(raw_shape) < 4 * max_ndim:
        raise SerializationError(f"load_tensor_binary: {where}: truncated shape")
    shape = list(struct.unpack(f"<{max_ndim}I", raw_shape))
    while shape and shape[-1] == 0:
        shape.pop()
    raw_name = fobj.read(name_len)
    if len(raw_name) < name_len:
        raise SerializationError(
            f"load_tensor_binary: {where}: truncated name ({len(raw_name)} of {name_len} bytes)"
        )
    try:
        name = raw_name.decode("ascii")
    except UnicodeDecodeError:
        raise SerializationError(
            f"load_tensor_binary: {where}: the name is not ASCII; not a tensor dump"
        ) from None
    dt = _load_dtype(dtype_num)
    data = fobj.read()
    need = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    if len(data) == 0 and need:
        shape.append(0)  # an empty value whose trailing dims were 0
        need = 0
    if len(data) != need:
        raise SerializationError(
            f"load_tensor_binary: {where}: {len(data)} data bytes, but shape "
            f"{fmt_shape(tuple(shape))} of {_BINARY_NAME[dtype_num]} needs {need}"
        )
    return np.frombuffer(data, dtype=dt).reshape(shape).copy(), name
