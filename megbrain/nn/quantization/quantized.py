"""Int8 inference modules, made from QAT modules by :func:`.quantize.quantize`: ConvBias on
QuantizedS8 input and weight with a QuantizedS32 bias, quantized MatrixMul, the Q modes of
ElemwiseMultiType, and TypeCvt at the stubs."""

from __future__ import annotations

import numpy as np

import megbrain as mgb
from megbrain.graph.param_def import per_axis_fields

from ..module import Buffer, Module
from . import qat

__all__ = [
    "QuantizedModule",
    "Conv2d",
    "Linear",
    "Elemwise",
    "QuantStub",
    "DequantStub",
    "quantize_value",
]


def quantize_value(value, dtype: np.dtype) -> np.ndarray:
    """``value`` (float) quantized to ``dtype`` as MegDNN's TypeCvt does (float32 division by
    the scale, rounding half away from zero, saturation): the result of a TypeCvt operator.

    Parameters
    ----------
    value : array_like
        Float values.
    dtype : numpy.dtype
        A quantized dtype (``mgb.dtype.qint8(s)``, ``qint32(s)``...).

    Returns
    -------
    numpy.ndarray
        The stored integers, of dtype ``dtype``.
    """
    g = mgb.comp_graph()
    c = mgb.make_immutable("cpu0", g, np.asarray(value, np.float32))
    return mgb.opr.typecvt(c, dtype).inferred_value


def _evaluate(build) -> list:
    """The values of the vars ``build(graph)`` makes in a fresh graph (no inputs)."""
    g = mgb.comp_graph()
    return g.compile([], [mgb.copy_output(v) for v in build(g)])()


class QuantizedModule(Module):
    """Base of the int8 modules: inference only, whatever the training flag says."""

    #: the module's dotted name in the network :func:`.quantize.quantize` converted (errors
    #: name it)
    path = ""

    def _input_scale(self, x, what: str = "input") -> float:
        """The scale of ``x``, which must be QuantizedS8."""
        if mgb.dtype.dtype_name(x.dtype) != "QuantizedS8":
            who = f"{type(self).__name__} {self.path!r}" if self.path else type(self).__name__
            raise mgb.MegBrainError(
                f"quantized {who}: the {what} {x.name!r} must be QuantizedS8 "
                f"(a QuantStub or a quantized module before it), got "
                f"{mgb.dtype.fmt_dtype(x.dtype)}"
            )
        return mgb.dtype.get_scale(x.dtype)

    @classmethod
    def from_qat_module(cls, qat_module: qat.QATModule) -> QuantizedModule:
        """The int8 module of a calibrated ``qat_module`` (in eval mode)."""
        raise NotImplementedError


def _weight_and_float_bias(m: qat.QATModule) -> tuple[np.ndarray, np.ndarray | None]:
    """The QuantizedS8 weight of ``m`` (its fake-quantized value in eval mode, so equal to
    what the QAT network computes with) and its float bias."""
    dt = m.get_weight_dtype()

    def build(g):
        w, b = m.weight_and_bias(g)
        wq = mgb.opr.typecvt(m.apply_quant_weight(w), dt)
        return [wq] if b is None else [wq, b]

    vals = _evaluate(build)
    return vals[0], (vals[1] if len(vals) > 1 else None)


class Conv2d(QuantizedModule):
    """An int8 convolution: ConvBias of a QuantizedS8 input with the QuantizedS8 ``weight``
    and the float ``bias`` quantized to QuantizedS32 at the scale ``input_scale *
    weight_scale``, activation ``nonlinearity``, output ``output_dtype``; the int8 form of
    the QAT Conv2d, ConvRelu2d, ConvBn2d and ConvBnRelu2d."""

    def __init__(self, weight: np.ndarray, bias: np.ndarray, output_dtype: np.dtype, *,
                 stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups: int = 1,
                 nonlinearity: str = "IDENTITY"):  # fmt: skip
        super().__init__()
        self.weight = Buffer(weight, dtype=weight.dtype)
        self.bias = Buffer(np.asarray(bias).reshape(1, -1, 1, 1))
        self.output_dtype = output_dtype
        self.stride, self.padding, self.dilation = stride, padding, dilation
        self.groups, self.nonlinearity = groups, nonlinearity

    @classmethod
    def from_qat_module(cls, qat_module):
        conv = getattr(qat_module, "conv", qat_module)
        w, b = _weight_and_float_bias(qat_module)
        if b is None:
            b = np.zeros(w.shape[0], np.float32)
        return cls(w, b, qat_module.get_activation_dtype(), stride=conv.stride,
                   padding=conv.padding, dilation=conv.dilation, groups=conv.groups,
                   nonlinearity=qat_module.nonlinearity)  # fmt: skip

    def forward(self, x):
        g = x.owner_graph
        w_dtype = self.weight.dtype
        scale = np.float32(self._input_scale(x)) * np.float32(mgb.dtype.get_scale(w_dtype))
        bias = quantize_value(self.bias.get_value(), mgb.dtype.qint32(float(scale)))
        w = self.weight.symvar(g)
        if self.groups > 1:
            oc, icg, kh, kw = self.weight.shape
            w = w.reshape(self.groups, oc // self.groups, icg, kh, kw)
        return mgb.opr.conv_bias_activation(
            x, w, mgb.make_immutable(x.comp_node, g, bias),
            nonlineMode=self.nonlinearity, dtype=self.output_dtype,
            sparse="GROUP" if self.groups > 1 else "DENSE",
            **per_axis_fields(pad=self.padding, stride=self.stride, dilate=self.dilation),
        )  # fmt: skip


class Linear(QuantizedModule):
    """An int8 fully connected layer: quantized MatrixMul (QuantizedS32 sums), the bias added
    in QuantizedS32 and a TypeCvt to ``output_dtype``."""

    def __init__(self, weight: np.ndarray, bias: np.ndarray | None, output_dtype: np.dtype):
        super().__init__()
        self.weight = Buffer(weight, dtype=weight.dtype)
        self.bias = None if bias is None else Buffer(np.asarray(bias).reshape(1, -1))
        self.output_dtype = output_dtype

    @classmethod
    def from_qat_module(cls, qat_module):
        w, b = _weight_and_float_bias(qat_module)
        return cls(w, b, qat_module.get_activation_dtype())

    def forward(self, x):
        self._input_scale(x)
        g = x.owner_graph
        y = mgb.opr.matrix_mul(x, self.weight.symvar(g), transposeB=True)
        if self.bias is not None:
            b = quantize_value(self.bias.get_value(), y.dtype)
            y = y + mgb.make_immutable(x.comp_node, g, b)
        return mgb.opr.typecvt(y, self.output_dtype)


class Elemwise(QuantizedModule):
    """The ``Q`` mode of ElemwiseMultiType of an Elemwise method, output ``output_dtype``."""

    def __init__(self, method: str, output_dtype: np.dtype):
        super().__init__()
        self.method, self.output_dtype = method, output_dtype

    @classmethod
    def from_qat_module(cls, qat_module):
        return cls(qat_module.method, qat_module.get_activation_dtype())

    def forward(self, *xs):
        for i, x in enumerate(xs):
            self._input_scale(x, f"input {i}")
        return mgb.opr.elemwise_multi_type(*xs, mode="Q" + self.method, dtype=self.output_dtype)


class QuantStub(QuantizedModule):
    """TypeCvt of the float input to ``output_dtype``."""

    def __init__(self, output_dtype: np.dtype):
        super().__init__()
        self.output_dtype = output_dtype

    @classmethod
    def from_qat_module(cls, qat_module):
        return cls(qat_module.get_activation_dtype())

    def forward(self, x):
        return mgb.opr.typecvt(x, self.output_dtype)


class DequantStub(QuantizedModule):
    """TypeCvt of the quantized input to float32."""

    @classmethod
    def from_qat_module(cls, qat_module):
        return cls()

    def forward(self, x):
        self._input_scale(x)
        return mgb.opr.typecvt(x, np.float32)
