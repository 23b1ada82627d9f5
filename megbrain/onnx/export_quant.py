"""Export of megbrain's int8 operators: TypeCvt into and out of the quantized dtypes as
QuantizeLinear / DequantizeLinear, quantized ConvBias as QLinearConv, the quantized
ElemwiseMultiType modes and average pooling as float operators between DequantizeLinear and
QuantizeLinear (the QDQ form runtimes fuse), max pooling on the stored integers, quantized
MatrixMul as MatMulInteger; a quantized var is written as the ONNX tensor of its stored
integers."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from ..dtype import dtype_name, get_scale, get_zero_point, is_quantize
from ..kernels.elemwise_multi_type import QUANTIZED_MODES
from .export_base import Writer, static_shape

__all__ = [
    "QUANTIZED_OPERATORS", "quantized_storage", "typecvt", "conv_bias", "elemwise_multi_type",
    "pooling", "matmul",
]  # fmt: skip

#: quantized dtypes an exported tensor can hold, with the ONNX type of their integers
_STORAGE = {
    "QuantizedS8": TensorProto.INT8,
    "Quantized8Asymm": TensorProto.UINT8,
    "QuantizedS32": TensorProto.INT32,
}

#: operator types whose exporters handle quantized outputs (the shape operators move the
#: stored integers, which keeps their meaning)
QUANTIZED_OPERATORS = frozenset(
    {"ImmutableTensor", "SharedDeviceTensor", "VolatileSharedDeviceTensor", "TypeCvt",
     "ConvBiasForward", "ElemwiseMultiType", "PoolingForward", "MatrixMul", "BatchedMatrixMul",
     "Reshape", "Dimshuffle", "Concat", "Subtensor", "Broadcast"}
)  # fmt: skip


def quantized_storage(dtype) -> int | None:
    """The ONNX type holding the integers of quantized ``dtype``, or None."""
    return _STORAGE.get(dtype_name(dtype)) if is_quantize(dtype) else None


def _params(w: Writer, dtype) -> tuple[str, str]:
    """The scale and zero-point initializers of quantized ``dtype``."""
    t = _STORAGE[dtype_name(dtype)]
    zp = np.asarray(get_zero_point(dtype) if t == TensorProto.UINT8 else 0)
    zdt = {TensorProto.INT8: np.int8, TensorProto.UINT8: np.uint8, TensorProto.INT32: np.int32}
    return (w.const(np.float32(get_scale(dtype)), "scale"),
            w.const(zp.astype(zdt[t]), "zero_point"))  # fmt: skip


def typecvt(w: Writer, op, ins) -> str:
    """TypeCvt with a quantized side: DequantizeLinear out of one (then a Cast when the
    target is not float32), QuantizeLinear into one (from float32)."""
    src, dst = op.inputs[0].dtype, op.outputs[0].dtype
    x = ins[0]
    if is_quantize(src):
        x = w.node("DequantizeLinear", [x, *_params(w, src)])
        if not is_quantize(dst):
            return x if np.dtype(dst) == np.float32 else w.cast(x, dst)
    elif np.dtype(src) != np.float32:
        x = w.cast(x, np.float32)
    if _STORAGE.get(dtype_name(dst)) == TensorProto.INT32:
        raise w.error("TypeCvt into QuantizedS32 has no ONNX form (QuantizeLinear gives 8 bits)")
    return w.node("QuantizeLinear", [x, *_params(w, dst)])


def conv_bias(w: Writer, op, ins, geometry: dict, weight: str, group: int) -> str:
    """Quantized ConvBias (8-bit output, no ``z``, IDENTITY or RELU) as QLinearConv."""
    src, filt = op.inputs[0].dtype, op.inputs[1].dtype
    out = op.outputs[0].dtype
    mode = op.params["nonlineMode"]
    if _STORAGE.get(dtype_name(out)) not in (TensorProto.INT8, TensorProto.UINT8):
        raise w.error(f"a quantized ConvBias into {dtype_name(out)} has no ONNX form here")
    if len(ins) == 4 or mode not in ("IDENTITY", "RELU"):
        raise w.error(f"a quantized ConvBias with {'a z' if len(ins) == 4 else mode} has no "
                      "ONNX form here (QLinearConv: IDENTITY or RELU, no z)")  # fmt: skip
    bshape = static_shape(w, op.inputs[2], "bias")
    if bshape != [1, static_shape(w, op.outputs[0], "output")[1], 1, 1]:
        raise w.error(f"a quantized ConvBias's bias of shape {bshape} has no ONNX form")
    bias = w.node("Reshape", [ins[2], w.const(np.array([-1], np.int64), "shape")])
    ys, yz = _params(w, out)
    y = w.node("QLinearConv", [ins[0], *_params(w, src), weight, *_params(w, filt), ys, yz, bias],
               group=group, **geometry)  # fmt: skip
    # RELU on the quantized value: max(quantize(v), zero point) = quantize(max(v, 0))
    return y if mode == "IDENTITY" else w.node("Max", [y, yz])


def _eight_bit(w: Writer, dtype, what: str) -> int:
    """The ONNX type of an 8-bit quantized ``dtype`` (refusing the others for ``what``)."""
    t = _STORAGE.get(dtype_name(dtype))
    if t not in (TensorProto.INT8, TensorProto.UINT8):
        raise w.error(f"{what} into {dtype_name(dtype)} has no ONNX form (QuantizeLinear gives "
                      "8 bits)")  # fmt: skip
    return t


def elemwise_multi_type(w: Writer, op, ins) -> str:
    """A quantized mode ``Q<MODE>``: the inputs dequantized, ``MODE`` in float32, the result
    quantized to the output dtype. A mode ending in RELU applies it after the quantize, as
    a Max with the zero point (equal, the quantize being monotonic), so that the add before
    it stays in the DequantizeLinear / Add / QuantizeLinear form runtimes fuse."""
    from .export_elemwise import emit_mode  # it imports this module

    mode = op.params["mode"]
    out = op.outputs[0].dtype
    _eight_bit(w, out, f"ElemwiseMultiType {mode}")
    xs = [w.node("DequantizeLinear", [x, *_params(w, v.dtype)]) for x, v in zip(ins, op.inputs)]
    base = QUANTIZED_MODES[mode]
    relu = base in ("RELU", "FUSE_ADD_RELU")
    if base == "RELU":
        y = xs[0]
    else:
        y = emit_mode(w, "ADD" if base == "FUSE_ADD_RELU" else base, xs, np.float32)
    scale, zp = _params(w, out)
    y = w.node("QuantizeLinear", [y, scale, zp])
    return w.node("Max", [y, zp]) if relu else y


def pooling(w: Writer, op, ins, kw: dict) -> str:
    """Pooling of a quantized var (the output keeps its dtype): MAX on the stored integers
    (the quantization is monotonic), the averages on the dequantized values (a padded
    Quantized8Asymm window counts its zero point: 0.0), quantized back; an average over
    the whole input plane is GlobalAveragePool."""
    src = op.inputs[0].dtype
    _eight_bit(w, src, "quantized pooling")
    mode = op.params["mode"]
    if mode == "MAX":
        return w.node("MaxPool", [ins[0]], **kw)
    scale, zp = _params(w, src)
    x = w.node("DequantizeLinear", [ins[0], scale, zp])
    plane = static_shape(w, op.inputs[0], "pooled input")[2:]
    if kw["kernel_shape"] == plane and not any(kw["pads"]):
        y = w.node("GlobalAveragePool", [x])
    else:
        y = w.node("AveragePool", [x], count_include_pad=int(mode == "AVERAGE"), **kw)
    return w.node("QuantizeLinear", [y, scale, zp])


def matmul(w: Writer, op, a: str, b: str) -> str:
    """A quantized (batched) matrix product of ``a`` and ``b`` (transposed already) as
    MatMulInteger: the exact int32 sums, which QuantizedS32 stores."""
    ta, tb = op.inputs[0].dtype, op.inputs[1].dtype
    for dt in (ta, tb):
        _eight_bit(w, dt, f"a quantized {op.type}'s operand")
    if dtype_name(op.outputs[0].dtype) != "QuantizedS32":
        raise w.error(f"a quantized {op.type} into {dtype_name(op.outputs[0].dtype)} has no "
                      "ONNX form here (MatMulInteger gives the int32 sums)")  # fmt: skip
    return w.node("MatMulInteger", [a, b, _params(w, ta)[1], _params(w, tb)[1]])
