"""Export of megbrain's int8 operators: TypeCvt into and out of the quantized dtypes as
QuantizeLinear / DequantizeLinear, quantized ConvBias as QLinearConv; a quantized var is
written as the ONNX tensor of its stored integers."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from ..dtype import dtype_name, get_scale, get_zero_point, is_quantize
from .export_base import Writer, static_shape

__all__ = ["QUANTIZED_OPERATORS", "quantized_storage", "typecvt", "conv_bias"]

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
     "ConvBiasForward", "Reshape", "Dimshuffle", "Concat", "Subtensor", "Broadcast"}
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
