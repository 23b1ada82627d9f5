"""The export machinery shared by the per-family exporters: the operator table, the writer
that collects ONNX nodes and initializers, and small helpers (int64 index vectors, constants).

An exporter is registered with :func:`exports` for one or more megbrain operator type names;
it receives the :class:`Writer`, the :class:`Operator` handle and the ONNX names of the
operator's inputs, and returns the ONNX names of the operator's outputs (one name, or a list
with one entry per output; ``None`` entries for outputs that have no ONNX value). Operators
that have no ONNX form are listed in :data:`REFUSED` with the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from .registry import ONNXConversionError, known_shape

__all__ = [
    "EXPORTERS",
    "REFUSED",
    "Writer",
    "exports",
    "imm_shape",
    "onnx_dtype",
    "static_shape",
    "INT64_MAX",
    "INT64_MIN",
]

INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min

_NP_TO_ONNX = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.float64): TensorProto.DOUBLE,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.int16): TensorProto.INT16,
    np.dtype(np.int8): TensorProto.INT8,
    np.dtype(np.uint8): TensorProto.UINT8,
    np.dtype(np.uint16): TensorProto.UINT16,
    np.dtype(np.bool_): TensorProto.BOOL,
}

#: megbrain type name -> exporter(writer, op, input names) -> output name(s)
EXPORTERS: dict[str, Callable] = {}

#: megbrain type name -> why it has no ONNX form
REFUSED: dict[str, str] = {}


def exports(*type_names: str) -> Callable:
    """Register the decorated function as the exporter of ``type_names``."""

    def deco(fn: Callable) -> Callable:
        for t in type_names:
            EXPORTERS[t] = fn
        return fn

    return deco


def onnx_dtype(dtype) -> int | None:
    """The ONNX element type of a NumPy dtype, or None (quantized, bfloat16, int4...)."""
    dt = np.dtype(dtype)
    if getattr(dt, "metadata", None):  # quantized dtypes carry mgb_dtype metadata
        return None
    return _NP_TO_ONNX.get(dt)


class Writer:
    """Collects the nodes and initializers of the model being written.

    Parameters
    ----------
    opset:
        The ONNX opset written.
    source_value:
        ``source_value(var) -> ndarray | None``: the value of a var owned by a source
        (shared tensor, constant) or None for a graph input; given by the driver.
    """

    def __init__(self, opset: int, source_value: Callable) -> None:
        self.opset = opset
        self.nodes: list = []
        self.inits: dict[str, TensorProto] = {}
        self.names: dict[int, str] = {}
        self.used: set[str] = set()
        self.op = None  # the operator being exported (names nodes and errors)
        self._source_value = source_value
        self._count = 0
        self._consts: dict[tuple, str] = {}
        #: (tensor name, operator name, what, axes or None for all): tensors whose static
        #: shape an exporter baked
        self.baked: list[tuple] = []

    # ---- names -------------------------------------------------------------------------
    def unique(self, hint: str) -> str:
        """A name not used yet in the model, made from ``hint``."""
        base = "".join(c if c.isalnum() or c in "_.:/-" else "_" for c in hint) or "t"
        name = base
        while name in self.used:
            self._count += 1
            name = f"{base}_{self._count}"
        self.used.add(name)
        return name

    def fresh(self, hint: str = "t") -> str:
        """A fresh tensor name; prefixed with the current operator's name when there is one."""
        prefix = f"{self.op.name}/" if self.op is not None else ""
        return self.unique(prefix + hint)

    def error(self, msg: str) -> ONNXConversionError:
        """An error naming the operator being exported."""
        where = f"operator {self.op.name!r} ({self.op.type})" if self.op is not None else "export"
        return ONNXConversionError(f"export: {where}: {msg}")

    # ---- values ------------------------------------------------------------------------
    def const(self, value, hint: str = "c", dtype=None) -> str:
        """An initializer holding ``value``; small constants are shared."""
        arr = np.asarray(value, dtype=dtype)
        key = None
        if arr.size <= 16:
            key = (arr.dtype.str, arr.shape, arr.tobytes())
            if key in self._consts:
                return self._consts[key]
        name = self.fresh(hint)
        self.inits[name] = numpy_helper.from_array(np.array(arr, order="C"), name)
        if key is not None:
            self._consts[key] = name
        return name

    def name(self, var) -> str:
        """The ONNX name of ``var``, writing a source's value as an initializer on first use."""
        got = self.names.get(var.id)
        if got is not None:
            return got
        val = self._source_value(var)
        if val is None:
            raise self.error(
                f"{var.name!r} has no ONNX value (an output its operator's export does not "
                "write, e.g. TopK's KTH_ONLY index or BatchNorm's running statistics)"
            )
        arr = np.asarray(val).astype(var.dtype, copy=False)
        name = self.unique(var.name)
        self.inits[name] = numpy_helper.from_array(np.array(arr, order="C"), name)
        self.names[var.id] = name
        return name

    def value(self, var) -> np.ndarray | None:
        """The value of ``var`` when it is a constant of the exported graph (a source)."""
        return self._source_value(var)

    def bakes_shape(self, name: str, what: str, axes: Sequence[int] | None = None) -> None:
        """Record that the current exporter baked the static size of tensor ``name`` (on
        ``axes``, all by default): a dynamic dim there makes export raise."""
        opr = self.op.name if self.op is not None else "?"
        self.baked.append((name, opr, what, None if axes is None else tuple(axes)))

    # ---- nodes -------------------------------------------------------------------------
    def node(self, op_type: str, ins: Sequence[str], outs=None, n_out: int = 1, **attrs):
        """Append a node; returns its output name (or the list of them when ``n_out`` > 1)."""
        if outs is None:
            outs = [self.fresh(op_type.lower()) for _ in range(n_out)]
        name = self.fresh(op_type) if self.op is not None else None
        self.nodes.append(helper.make_node(op_type, list(ins), list(outs), name=name, **attrs))
        return outs[0] if len(outs) == 1 else list(outs)

    def i64(self, var) -> str:
        """``var`` (an int var) as a 1-d int64 tensor: a constant when its value is known."""
        val = self._source_value(var)
        if val is not None:
            return self.const(np.asarray(val, np.int64).reshape(-1), "i64")
        t = self.node("Cast", [self.name(var)], to=TensorProto.INT64)
        if len(_static_shape(var)) != 1:
            t = self.node("Reshape", [t, self.const(np.array([-1], np.int64), "shape")])
        return t

    def cast(self, name: str, dtype) -> str:
        """``name`` cast to ``dtype`` (a NumPy dtype)."""
        return self.node("Cast", [name], to=onnx_dtype(dtype))

    def reduce(self, op_type: str, x: str, axes: Sequence[int], keepdims: int = 1) -> str:
        """A Reduce* node over ``axes`` in the form of this opset (axes input from 18)."""
        if op_type == "ReduceSum" or self.opset >= 18:
            return self.node(
                op_type, [x, self.const(np.asarray(axes, np.int64), "axes")], keepdims=keepdims
            )
        return self.node(op_type, [x], axes=list(axes), keepdims=keepdims)

    def squeeze(self, x: str, axes: Sequence[int]) -> str:
        return self.node("Squeeze", [x, self.const(np.asarray(axes, np.int64), "axes")])

    def unsqueeze(self, x: str, axes: Sequence[int]) -> str:
        return self.node("Unsqueeze", [x, self.const(np.asarray(axes, np.int64), "axes")])


#: the static shape of a var, or None where it is known only by running (not
#: ``SymbolVar.imm_shape``: after a run, that is the last computed shape of a dynamic var too)
imm_shape = known_shape


def _static_shape(var) -> tuple:
    shp = imm_shape(var)
    if shp is None:
        raise ONNXConversionError(f"export: the shape of {var.name!r} must be static")
    return tuple(int(d) for d in shp)


def static_shape(w: Writer, var, what: str) -> list[int]:
    """The static shape of ``var`` (what the exporter needs it for names the error)."""
    shp = imm_shape(var)
    if shp is None:
        raise w.error(f"the shape of {var.name!r} ({what}) must be static")
    return [int(d) for d in shp]
