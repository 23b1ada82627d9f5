"""QAT modules: the float modules with observers and fake quantization on their weights and
outputs, trained in float; :func:`.quantize.quantize` turns them into int8 modules."""

from __future__ import annotations

from collections import OrderedDict

import megbrain as mgb

from .. import layers as F
from ..module import Module
from .qconfig import QConfig

__all__ = [
    "QATModule",
    "Conv2d",
    "ConvRelu2d",
    "ConvBn2d",
    "ConvBnRelu2d",
    "Linear",
    "Elemwise",
    "QuantStub",
    "DequantStub",
]


class QATModule(Module):
    """Base of the QAT modules: the observers and fake quantizations of the weight (modules
    with one) and of the output, made from a :class:`.QConfig` by :meth:`set_qconfig`."""

    #: whether the module has a weight to observe
    has_weight = True
    #: whether the module's output is observed (DequantStub's is float)
    has_output = True
    #: the activation before the output's fake quantization (ConvBias's nonlineMode)
    nonlinearity = "IDENTITY"

    def set_qconfig(self, qconfig: QConfig) -> None:
        """Give the module fresh observers and fake quantizations made by ``qconfig``."""

        def make(factory):
            return None if factory is None or not self.has_output else factory()

        if self.has_weight:
            self.weight_observer = qconfig.weight_observer()
            f = qconfig.weight_fake_quant
            self.weight_fake_quant = None if f is None else f()
        self.act_observer = make(qconfig.act_observer)
        self.act_fake_quant = make(qconfig.act_fake_quant)

    def apply_quant_weight(self, w):
        """The weight var ``w`` as the module's convolution or product reads it."""
        return _observed(w, self.weight_observer, self.weight_fake_quant)

    def apply_quant_activation(self, y):
        """The output var ``y`` as the next module reads it."""
        return _observed(y, self.act_observer, self.act_fake_quant)

    def _output(self, y):
        """The activation and the output's fake quantization of ``y``."""
        if self.nonlinearity == "RELU":
            y = mgb.opr.elem.relu(y)
        return self.apply_quant_activation(y)

    def get_weight_dtype(self):
        """The QuantizedS8 dtype of the weight (its observer's range)."""
        return _dtype(self.weight_observer, "weight")

    def get_activation_dtype(self):
        """The QuantizedS8 dtype of the output (its observer's range)."""
        return _dtype(self.act_observer, "output")

    @classmethod
    def from_float_module(cls, float_module: Module) -> QATModule:
        """The QAT module of ``float_module``, sharing its parameters and sub-modules (no
        observer yet: :meth:`set_qconfig`)."""
        return retype(float_module, cls)

    def weight_and_bias(self, g):
        """The float weight and bias (or None) the module quantizes, as vars of ``g``: its
        ``weight`` and ``bias`` parameters."""
        return _var(self.weight, g), _var(self.bias, g)


def retype(module: Module, cls: type) -> Module:
    """An object of ``cls`` holding ``module``'s attributes, parameters and sub-modules (the
    same objects)."""
    m = object.__new__(cls)
    state = dict(module.__dict__)
    for d in ("_params", "_buffers", "_modules"):
        state[d] = OrderedDict(state[d])
    m.__dict__.update(state)
    return m


def _dtype(observer, what: str):
    try:
        return observer.get_dtype()
    except mgb.MegBrainError as exc:
        raise mgb.MegBrainError(f"the {what}'s {exc}") from None


def _observed(v, observer, fake_quant):
    if observer is None:
        return v
    scale = observer(v)
    return v if fake_quant is None else fake_quant(v, scale)


def _var(p, g):
    return None if p is None else p.symvar(g)


class Conv2d(F.Conv2d, QATModule):
    """:class:`megbrain.nn.Conv2d` with a fake-quantized weight and output."""

    def forward(self, x):
        w, b = self.weight_and_bias(x.owner_graph)
        return self._output(self._conv(x, self.apply_quant_weight(w), b))


class ConvRelu2d(Conv2d):
    """:class:`megbrain.nn.ConvRelu2d`: :class:`Conv2d` then ReLU (one int8 ConvBias with
    RELU once quantized)."""

    nonlinearity = "RELU"


class ConvBn2d(F.ConvBn2d, QATModule):
    """:class:`megbrain.nn.ConvBn2d` with the normalization folded into the fake-quantized
    weight and the bias.

    In eval mode (and once quantized) the convolution runs with ``w * gamma / std`` and the
    bias ``beta + gamma * (b - mean) / std`` of the running statistics. While training, the
    convolution with the folded weight is scaled back by ``std / gamma`` and normalized by
    the batch statistics (which update the running ones), as MegEngine's QAT ConvBn2d.
    """

    def _factor(self, g):
        """``gamma / sqrt(running_var + eps)``, shape (C,)."""
        bn = self.bn
        return bn.weight.symvar(g) / mgb.opr.sqrt(bn.running_var.symvar(g) + bn.eps)

    def weight_and_bias(self, g):
        bn, conv = self.bn, self.conv
        factor = self._factor(g)
        w = conv.weight.symvar(g) * factor.reshape(-1, 1, 1, 1)
        shift = -bn.running_mean.symvar(g)
        if conv.bias is not None:
            shift = shift + conv.bias.symvar(g).reshape(-1)
        b = bn.bias.symvar(g) + factor * shift
        return w, b.reshape(1, -1, 1, 1)

    def forward(self, x):
        g = x.owner_graph
        w, b = self.weight_and_bias(g)
        wq = self.apply_quant_weight(w)
        if not self.training:
            y = self.conv._conv(x, wq, b)
        else:
            y = self.conv._conv(x, wq, None) / self._factor(g).reshape(1, -1, 1, 1)
            if self.conv.bias is not None:
                y = y + self.conv.bias.symvar(g)
            y = self.bn(y)
        return self._output(y)


class ConvBnRelu2d(ConvBn2d):
    """:class:`ConvBn2d` then ReLU."""

    nonlinearity = "RELU"


class Linear(F.Linear, QATModule):
    """:class:`megbrain.nn.Linear` with a fake-quantized weight and output."""

    def forward(self, x):
        w, b = self.weight_and_bias(x.owner_graph)
        return self._output(self._linear(x, self.apply_quant_weight(w), b))


class Elemwise(F.Elemwise, QATModule):
    """:class:`megbrain.nn.Elemwise` with a fake-quantized output."""

    has_weight = False

    def forward(self, *xs):
        return self.apply_quant_activation(super().forward(*xs))


class QuantStub(F.QuantStub, QATModule):
    """The fake-quantized input of the int8 part."""

    has_weight = False

    def forward(self, x):
        return self.apply_quant_activation(x)


class DequantStub(F.DequantStub, QATModule):
    """The end of the int8 part: the identity while training."""

    has_weight = has_output = False
