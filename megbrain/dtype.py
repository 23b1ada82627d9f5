"""The dtypes of megbrain: numpy dtypes, bfloat16, low-bit and quantized dtypes (numpy dtypes
carrying ``mgb_dtype`` metadata), their MegBrain names and enum numbers, and conversions."""

from __future__ import annotations

import functools
import math
import numbers
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from .errors import ConversionError, blame_prefix

__all__ = [
    "bfloat16",  # noqa: F822 - defined by the module's __getattr__
    "byte",
    "intb1",
    "intb2",
    "intb4",
    "uintb4",
    "is_quantize",
    "is_lowbit",
    "is_bfloat16",
    "get_scale",
    "get_zero_point",
    "get_quantized_dtype",
    "qint8",
    "quint8",
    "qint32",
    "qint4",
    "quint4",
    "qint16",
    "convert_to_qint8",
    "convert_from_qint8",
    "convert_to_quint8",
    "convert_from_quint8",
    "convert_to_qint32",
    "convert_from_qint32",
    "convert_to_qint4",
    "convert_from_qint4",
    "convert_to_quint4",
    "convert_from_quint4",
    "convert_to_qint16",
    "convert_from_qint16",
    "dtype_name",
    "dtype_size",
    "canonize_dtype",
    "to_mgb_supported_dtype",
    "convert_array",
    "get_dtype_num",
    "get_serialized_dtype",
    "dtype_from_num",
]

DTypeLike = Any
_KEY = "mgb_dtype"


def _special(storage: type, name: str) -> np.dtype:
    return np.dtype(storage, metadata={_KEY: {"name": name}})


byte: np.dtype = _special(np.uint8, "Byte")
intb1: np.dtype = _special(np.int8, "IntB1")
intb2: np.dtype = _special(np.int8, "IntB2")
intb4: np.dtype = _special(np.int8, "IntB4")
uintb4: np.dtype = _special(np.uint8, "UintB4")

# MegBrain name -> canonical numpy dtype of the dtypes without parameters.
_PLAIN = {
    "Float32": np.dtype(np.float32),
    "Float16": np.dtype(np.float16),
    "Int8": np.dtype(np.int8),
    "Int16": np.dtype(np.int16),
    "Int32": np.dtype(np.int32),
    "Uint8": np.dtype(np.uint8),
    "Bool": np.dtype(np.bool_),
}
_PLAIN_BY_LAYOUT = {(d.kind, d.itemsize): n for n, d in _PLAIN.items() if d.kind in "biuf"}
_SPECIAL = {"Byte": byte, "IntB1": intb1, "IntB2": intb2, "IntB4": intb4, "UintB4": uintb4}
_LOWBIT_NAMES = {"IntB1", "IntB2", "IntB4", "UintB4", "QuantizedS4", "Quantized4Asymm"}


class _QuantInfo(NamedTuple):
    kind: str
    name: str
    storage: np.dtype
    qmin: int
    qmax: int
    asymm: bool


_QUANT = {
    q.kind: q
    for q in (
        _QuantInfo("qint8", "QuantizedS8", np.dtype(np.int8), -128, 127, False),
        _QuantInfo("quint8", "Quantized8Asymm", np.dtype(np.uint8), 0, 255, True),
        _QuantInfo("qint32", "QuantizedS32", np.dtype(np.int32), -(2**31), 2**31 - 1, False),
        _QuantInfo("qint4", "QuantizedS4", np.dtype(np.int8), -8, 7, False),
        _QuantInfo("quint4", "Quantized4Asymm", np.dtype(np.uint8), 0, 15, True),
        _QuantInfo("qint16", "QuantizedS16", np.dtype(np.int16), -32768, 32767, False),
    )
}
_QUANT_BY_NAME = {q.name: q for q in _QUANT.values()}

# MegBrain's DTypeEnum order (megdnn/dtype.h); the numbers are part of the file format.
_ENUM = (
    "Float32 Uint8 Int8 Int16 Int32 IntB1 IntB2 IntB4 Byte Float16 UintB4 Quantized8Asymm "
    "QuantizedS32 QuantizedS8 Quantized4Asymm QuantizedS4 QuantizedS16 BFloat16 Bool"
).split()
_NUM = {name: i for i, name in enumerate(_ENUM)}

# Names a string may use for a dtype without parameters, besides numpy's own.
_BY_STR = {**_PLAIN, **_SPECIAL, **{n.lower(): d for n, d in _SPECIAL.items()}}
_BFLOAT16_NAMES = ("BFloat16", "bfloat16")


# bfloat16 comes from ml_dtypes, whose import costs more than the rest of ``import megbrain``
# together; it is imported the first time bfloat16 is asked for by name. No array or dtype can be
# bfloat16 before ml_dtypes is imported, so the checks below never import it.
@functools.cache
def _bfloat16() -> np.dtype:
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def _is_bfloat16_type(scalar_type: type) -> bool:
    mod = sys.modules.get("ml_dtypes")
    return mod is not None and scalar_type is mod.bfloat16


def _plain(name: str) -> np.dtype:
    """The dtype of a MegBrain name without parameters (bfloat16 included)."""
    return _bfloat16() if name == "BFloat16" else _PLAIN[name]


def __getattr__(name: str) -> np.dtype:
    # ``megbrain.dtype.bfloat16``, imported on first use
    if name == "bfloat16":
        return _bfloat16()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _meta(dt: np.dtype) -> dict | None:
    return None if dt.metadata is None else dt.metadata.get(_KEY)


def _resolve(dtype_like: DTypeLike) -> np.dtype:
    """Turn ``dtype_like`` into a numpy dtype without checking that megbrain supports it."""
    if isinstance(dtype_like, np.dtype):
        return dtype_like
    if dtype_like is float:
        return _PLAIN["Float32"]
    if dtype_like is int:
        return _PLAIN["Int32"]
    if dtype_like is None:
        raise ConversionError("dtype None is not supported by megbrain; give a dtype explicitly")
    if isinstance(dtype_like, str) and dtype_like in _BY_STR:
        return _BY_STR[dtype_like]
    if isinstance(dtype_like, str) and dtype_like in _BFLOAT16_NAMES:
        return _bfloat16()
    try:
        return np.dtype(dtype_like)
    except (TypeError, ValueError) as exc:
        raise ConversionError(f"cannot interpret {dtype_like!r} as a dtype") from exc


def _unsupported(dt: np.dtype, why: str = "") -> ConversionError:
    msg = f"dtype {dt} is not supported by megbrain"
    if dt.kind in "if" and dt.itemsize == 8:
        msg += " (use to_mgb_supported_dtype() to map int64/float64 to int32/float32)"
    return ConversionError(msg + why)


def _check_scale(scale: Any) -> float:
    ok = isinstance(scale, numbers.Real) and not isinstance(scale, (bool, np.bool_))
    if not ok or not math.isfinite(float(scale)) or float(scale) <= 0:
        raise ConversionError(f"quantization scale must be a positive finite float, got {scale!r}")
    return float(scale)


def _check_zero_point(zero_point: Any, q: _QuantInfo) -> int:
    ok = isinstance(zero_point, numbers.Integral) and not isinstance(zero_point, (bool, np.bool_))
    if not ok or not q.qmin <= int(zero_point) <= q.qmax:
        raise ConversionError(
            f"zero_point of {q.kind} ({q.name}) must be an int in [{q.qmin}, {q.qmax}], "
            f"got {zero_point!r}"
        )
    return int(zero_point)


def _mgb_name(dt: np.dtype) -> str:
    """The MegBrain name of ``dt``; ConversionError if megbrain does not support it."""
    meta = _meta(dt)
    if meta is not None:
        name = meta.get("name")
        name = name if isinstance(name, str) else ""
        q = _QUANT_BY_NAME.get(name)
        base = q.storage if q is not None else _SPECIAL[name] if name in _SPECIAL else None
        if base is None or (dt.kind, dt.itemsize) != (base.kind, base.itemsize):
            raise _unsupported(dt, f" (bad mgb_dtype metadata {meta!r})")
        try:
            if q is not None:
                _check_scale(meta.get("scale"))
            if q is not None and q.asymm:
                _check_zero_point(meta.get("zero_point"), q)
        except ConversionError as exc:
            raise _unsupported(dt, f" ({exc.msg})") from None
        return name
    if _is_bfloat16_type(dt.type):
        return "BFloat16"
    name = _PLAIN_BY_LAYOUT.get((dt.kind, dt.itemsize))
    if name is None or dt.fields is not None or dt.subdtype is not None:
        raise _unsupported(dt)
    return name


def canonize_dtype(dtype_like: DTypeLike) -> np.dtype:
    """Convert ``dtype_like`` to a numpy dtype that megbrain supports.

    Parameters
    ----------
    dtype_like:
        A numpy dtype or scalar type, a name (``"float32"``, ``"int8"``, ``"bfloat16"``,
        ``"intb4"``, ``"byte"`` or a MegBrain name such as ``"Float32"``), the Python types
        ``float`` (float32), ``int`` (int32) or ``bool``, or one of our special dtypes.

    Returns
    -------
    numpy.dtype
        The canonical (native byte order) dtype; bfloat16, low-bit, byte and quantized dtypes
        are returned unchanged, metadata included.

    Raises
    ------
    ConversionError
        If megbrain does not support the dtype: float64, int64, uint16/32/64, complex, object,
        string, bytes, datetime and structured dtypes, or malformed ``mgb_dtype`` metadata.
    """
    dt = _resolve(dtype_like)
    name = _mgb_name(dt)
    return dt if _meta(dt) is not None else _plain(name)


def to_mgb_supported_dtype(dtype_like: DTypeLike) -> np.dtype:
    """Map int64 to int32 and float64 to float32; canonize every other dtype.

    Parameters
    ----------
    dtype_like:
        Anything :func:`canonize_dtype` accepts, or a 64-bit int/float dtype.

    Returns
    -------
    numpy.dtype
        int32 for int64, float32 for float64, else ``canonize_dtype(dtype_like)`` (low-bit,
        quantized and bfloat16 dtypes pass through unchanged).
    """
    dt = _resolve(dtype_like)
    if _meta(dt) is None and dt.fields is None and dt.itemsize == 8:
        if dt.kind == "i":
            return _PLAIN["Int32"]
        if dt.kind == "f":
            return _PLAIN["Float32"]
    return canonize_dtype(dt)


def dtype_name(dt: DTypeLike) -> str:
    """MegBrain's name of a dtype (``"Float32"``, ``"Int8"``, ``"QuantizedS8"``, ...).

    Parameters
    ----------
    dt:
        A dtype accepted by :func:`canonize_dtype`.

    Returns
    -------
    str
        The name, as MegBrain's ``DType::name()`` spells it.
    """
    return _mgb_name(_resolve(dt))


def dtype_size(dt: DTypeLike) -> int:
    """Bytes per element of the storage of ``dt`` (low-bit dtypes use one byte per element).

    Parameters
    ----------
    dt:
        A dtype accepted by :func:`canonize_dtype`.

    Returns
    -------
    int
        The item size in bytes.
    """
    return canonize_dtype(dt).itemsize


def _named_in(dt: DTypeLike, names) -> bool:
    """Whether ``dt`` (None gives False) carries ``mgb_dtype`` metadata named in ``names``."""
    meta = None if dt is None else _meta(_resolve(dt))
    return meta is not None and meta.get("name") in names


def is_quantize(dt: DTypeLike) -> bool:
    """Whether ``dt`` is a quantized dtype (carries a quantized ``mgb_dtype`` metadata).

    Parameters
    ----------
    dt:
        A dtype-like value; None gives False.

    Returns
    -------
    bool
    """
    return _named_in(dt, _QUANT_BY_NAME)


def is_lowbit(dt: DTypeLike) -> bool:
    """Whether ``dt`` is low-bit: intb1/2/4, uintb4, qint4 or quint4, as in MegBrain.

    Parameters
    ----------
    dt:
        A dtype-like value; None gives False.

    Returns
    -------
    bool
    """
    return _named_in(dt, _LOWBIT_NAMES)


def is_bfloat16(dt: DTypeLike) -> bool:
    """Whether ``dt`` is bfloat16.

    Parameters
    ----------
    dt:
        A dtype-like value; None gives False.

    Returns
    -------
    bool
    """
    return dt is not None and _is_bfloat16_type(_resolve(dt).type)


def _quant_meta(dt: DTypeLike) -> tuple[np.dtype, dict, _QuantInfo]:
    d = _resolve(dt)
    if not is_quantize(d):
        raise ConversionError(f"dtype {d} ({_describe(d)}) is not a quantized dtype")
    meta = _meta(d)
    _mgb_name(d)  # validate the metadata
    return d, meta, _QUANT_BY_NAME[meta["name"]]


def _describe(dt: np.dtype) -> str:
    meta = _meta(dt)
    return str(meta.get("name")) if meta is not None else dt.name


def get_scale(dt: DTypeLike) -> float:
    """The scale of a quantized dtype.

    Parameters
    ----------
    dt:
        A quantized dtype.

    Returns
    -------
    float

    Raises
    ------
    ConversionError
        If ``dt`` is not quantized.
    """
    return float(_quant_meta(dt)[1]["scale"])


def get_zero_point(dt: DTypeLike) -> int:
    """The zero point of an asymmetric quantized dtype (quint8, quint4).

    Parameters
    ----------
    dt:
        An asymmetric quantized dtype.

    Returns
    -------
    int

    Raises
    ------
    ConversionError
        If ``dt`` is not an asymmetric quantized dtype.
    """
    _, meta, q = _quant_meta(dt)
    if not q.asymm:
        raise ConversionError(f"dtype {q.name} has no zero_point (it is symmetric)")
    return int(meta["zero_point"])


def get_quantized_dtype(name_or_kind: str, scale: float, zero_point: int | None = None) -> np.dtype:
    """Make a quantized dtype.

    Parameters
    ----------
    name_or_kind:
        ``"qint8"``, ``"quint8"``, ``"qint32"``, ``"qint4"``, ``"quint4"``, ``"qint16"`` or the
        MegBrain name (``"QuantizedS8"``, ``"Quantized8Asymm"``, ...).
    scale:
        A positive finite float.
    zero_point:
        Required for the asymmetric dtypes (an int in the storage range); must be None or 0
        for the symmetric ones.

    Returns
    -------
    numpy.dtype
        The storage dtype carrying ``{"mgb_dtype": {"name", "scale"[, "zero_point"]}}``.
    """
    q = _QUANT.get(name_or_kind) or _QUANT_BY_NAME.get(name_or_kind)
    if q is None:
        raise ConversionError(f"unknown quantized dtype {name_or_kind!r}")
    meta: dict[str, Any] = {"name": q.name, "scale": _check_scale(scale)}
    if q.asymm:
        if zero_point is None:
            raise ConversionError(f"{q.kind} ({q.name}) needs a zero_point")
        meta["zero_point"] = _check_zero_point(zero_point, q)
    elif zero_point not in (None, 0):
        raise ConversionError(f"{q.kind} ({q.name}) is symmetric, got zero_point {zero_point!r}")
    return np.dtype(q.storage, metadata={_KEY: meta})


def qint8(scale: float) -> np.dtype:
    """QuantizedS8: int8 storage, ``real = scale * q``."""
    return get_quantized_dtype("qint8", scale)


def quint8(scale: float, zero_point: int) -> np.dtype:
    """Quantized8Asymm: uint8 storage, ``real = scale * (q - zero_point)``."""
    return get_quantized_dtype("quint8", scale, zero_point)


def qint32(scale: float) -> np.dtype:
    """QuantizedS32: int32 storage, ``real = scale * q``."""
    return get_quantized_dtype("qint32", scale)


def qint4(scale: float) -> np.dtype:
    """QuantizedS4: values in [-8, 7], one per int8 byte, ``real = scale * q``."""
    return get_quantized_dtype("qint4", scale)


def quint4(scale: float, zero_point: int) -> np.dtype:
    """Quantized4Asymm: values in [0, 15], one per uint8 byte, ``real = scale * (q - zp)``."""
    return get_quantized_dtype("quint4", scale, zero_point)


def qint16(scale: float) -> np.dtype:
    """QuantizedS16: int16 storage, ``real = scale * q``."""
    return get_quantized_dtype("qint16", scale)


def _numeric(value: Any) -> np.ndarray:
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise ConversionError(
            f"{blame_prefix()}cannot convert {type(value).__name__} to an array: {exc}"
        ) from exc
    if arr.dtype.kind not in "biuf" and not _is_bfloat16_type(arr.dtype.type):
        raise ConversionError(
            f"{blame_prefix()}arrays of dtype {arr.dtype} can not be converted (not numeric)"
        )
    return arr


def _make_converters(kind: str) -> tuple[Callable, Callable]:
    q = _QUANT[kind]

    def convert_to(arr: Any, q_dtype: DTypeLike) -> np.ndarray:
        d, meta, got = _quant_meta(q_dtype)
        if got is not q:
            raise ConversionError(f"convert_to_{kind} needs a {q.name} dtype, got {got.name}")
        real = _numeric(arr).astype(np.float64)
        zp = meta.get("zero_point", 0)
        return (np.round(real / meta["scale"]) + zp).clip(q.qmin, q.qmax).astype(d)

    def convert_from(arr: np.ndarray) -> np.ndarray:
        if not isinstance(arr, np.ndarray) or not is_quantize(arr.dtype):
            raise ConversionError(
                f"convert_from_{kind} needs an ndarray of a {q.name} dtype, "
                f"got {getattr(arr, 'dtype', type(arr).__name__)}"
            )
        _, meta, got = _quant_meta(arr.dtype)
        if got is not q:
            raise ConversionError(f"convert_from_{kind} needs a {q.name} array, got {got.name}")
        zp, scale = np.float32(meta.get("zero_point", 0)), np.float32(meta["scale"])
        return (arr.astype(np.float32) - zp) * scale

    zp_doc = " - zero_point" if q.asymm else ""
    convert_to.__name__ = convert_to.__qualname__ = f"convert_to_{kind}"
    convert_to.__doc__ = f"""Quantize a real-valued array to {kind} ({q.name}).

    Parameters
    ----------
    arr:
        A numeric array-like.
    q_dtype:
        A {q.name} dtype, as made by ``{kind}(...)``.

    Returns
    -------
    numpy.ndarray
        ``clip(round(arr / scale){" + zero_point" if q.asymm else ""}, {q.qmin}, {q.qmax})``
        of dtype ``q_dtype``.
    """
    convert_from.__name__ = convert_from.__qualname__ = f"convert_from_{kind}"
    convert_from.__doc__ = f"""Dequantize a {kind} ({q.name}) array to float32.

    Parameters
    ----------
    arr:
        An ndarray whose dtype is a {q.name} dtype.

    Returns
    -------
    numpy.ndarray
        ``(arr{zp_doc}) * scale`` as float32.
    """
    return convert_to, convert_from


convert_to_qint8, convert_from_qint8 = _make_converters("qint8")
convert_to_quint8, convert_from_quint8 = _make_converters("quint8")
convert_to_qint32, convert_from_qint32 = _make_converters("qint32")
convert_to_qint4, convert_from_qint4 = _make_converters("qint4")
convert_to_quint4, convert_from_quint4 = _make_converters("quint4")
convert_to_qint16, convert_from_qint16 = _make_converters("qint16")


def convert_array(value: Any, dtype: DTypeLike = None) -> np.ndarray:
    """Convert a user value to an ndarray of a dtype megbrain supports.

    Parameters
    ----------
    value:
        A numeric array-like (float64/int64 values are allowed and cast).
    dtype:
        The target dtype (see :func:`canonize_dtype`); None means
        ``to_mgb_supported_dtype(value's dtype)``.

    Returns
    -------
    numpy.ndarray
        The value cast to the target dtype; no copy when it already has it.

    Raises
    ------
    ConversionError
        For object, string or other non-numeric values, an unsupported target dtype, a
        quantized value whose dtype differs from the target, float values for a quantized
        target (use ``convert_to_*``), or integers outside a quantized dtype's range.
    """
    arr = _numeric(value)
    target = to_mgb_supported_dtype(arr.dtype) if dtype is None else canonize_dtype(dtype)
    src_q, dst_q = is_quantize(arr.dtype), is_quantize(target)
    if src_q and _meta(arr.dtype) != _meta(target):
        raise ConversionError(
            f"can not convert a {_describe(arr.dtype)} array to {_describe(target)}; "
            "dequantize it with convert_from_* first"
        )
    if dst_q and not src_q:
        q = _QUANT_BY_NAME[_meta(target)["name"]]
        if arr.dtype.kind not in "biu":
            raise ConversionError(
                f"can not convert {arr.dtype} values to {q.name} directly; use convert_to_{q.kind}"
            )
        if arr.size and (arr.min() < q.qmin or arr.max() > q.qmax):
            raise ConversionError(f"values out of the range [{q.qmin}, {q.qmax}] of {q.name}")
    out = arr.astype(target, copy=False)
    return out if out.dtype.metadata == target.metadata else out.view(target)


def get_dtype_num(dt: DTypeLike) -> int:
    """The number of ``dt`` in MegBrain's DTypeEnum (Float32=0 ... Bool=18).

    Parameters
    ----------
    dt:
        A dtype accepted by :func:`canonize_dtype`.

    Returns
    -------
    int
    """
    return _NUM[dtype_name(dt)]


def get_serialized_dtype(dt: DTypeLike) -> int:
    """The stable number under which ``dt`` is serialized (its DTypeEnum number).

    Quantization parameters are stored separately (see :func:`get_scale`,
    :func:`get_zero_point`) and given back to :func:`dtype_from_num`.

    Parameters
    ----------
    dt:
        A dtype accepted by :func:`canonize_dtype`.

    Returns
    -------
    int
    """
    return get_dtype_num(dt)


def dtype_from_num(num: int, scale: float | None = None, zero_point: int | None = None) -> np.dtype:
    """The dtype of DTypeEnum number ``num`` (the inverse of :func:`get_dtype_num`).

    Parameters
    ----------
    num:
        The DTypeEnum number.
    scale:
        Required for quantized dtypes, must be None otherwise.
    zero_point:
        Required for asymmetric quantized dtypes, must be None otherwise (0 is accepted for
        symmetric ones).

    Returns
    -------
    numpy.dtype
    """
    if isinstance(num, bool) or not isinstance(num, numbers.Integral) or not 0 <= num < len(_ENUM):
        raise ConversionError(f"unknown dtype number {num!r}")
    name = _ENUM[int(num)]
    if name in _QUANT_BY_NAME:
        if scale is None:
            raise ConversionError(f"dtype {name} needs a scale")
        return get_quantized_dtype(name, scale, zero_point)
    if scale is not None or zero_point is not None:
        raise ConversionError(f"dtype {name} is not quantized; it takes no scale or zero_point")
    return _SPECIAL[name] if name in _SPECIAL else _plain(name)


#: quantized kind -> (kind, name, storage, qmin, qmax, asymm); the name MegEngine's layer reads.
_metadata_dict = _QUANT


def _meta_key(dt: np.dtype):
    md = dt.metadata
    return None if md is None else repr(md.get("mgb_dtype", md))


def dtype_key(dt: np.dtype | None) -> tuple | None:
    """A hashable identity of ``dt`` including its quantization parameters, which numpy's
    dtype ``==`` and ``hash`` ignore (for operators' deduplication keys)."""
    return None if dt is None else (dt, _meta_key(dt))


def same_dtype(a: np.dtype, b: np.dtype) -> bool:
    """Whether ``a`` and ``b`` are one dtype, quantization parameters included (numpy's
    ``==`` ignores dtype metadata)."""
    return a == b and _meta_key(a) == _meta_key(b)


def fmt_dtype(dt: np.dtype) -> str:
    """``dt`` for messages: numpy's name, or MegBrain's with the quantization parameters
    (``QuantizedS8(scale=0.1)``) for quantized dtypes."""
    if not is_quantize(dt):
        return dt.name
    meta = dt.metadata["mgb_dtype"]
    zp = f", zero_point={meta['zero_point']}" if "zero_point" in meta else ""
    return f"{meta['name']}(scale={float(meta['scale']):g}{zp})"
