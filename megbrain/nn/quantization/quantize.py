"""quantize_qat and quantize: float modules to QAT modules, QAT modules to int8 ones, and the
switches of their observers and fake quantizations."""

from __future__ import annotations

import megbrain as mgb

from .. import layers as F
from ..module import Module, Sequential
from . import qat, quantized
from .qconfig import QConfig, ema_fakequant_qconfig

__all__ = [
    "Fused",
    "fuse_sequential",
    "quantize_qat",
    "quantize",
    "enable_observer",
    "disable_observer",
    "enable_fake_quant",
    "disable_fake_quant",
]

#: float module type -> its QAT module type (exact types: a QAT module is not converted again)
FLOAT_TO_QAT = {
    F.Conv2d: qat.Conv2d,
    F.ConvRelu2d: qat.ConvRelu2d,
    F.ConvBn2d: qat.ConvBn2d,
    F.ConvBnRelu2d: qat.ConvBnRelu2d,
    F.Linear: qat.Linear,
    F.Elemwise: qat.Elemwise,
    F.QuantStub: qat.QuantStub,
    F.DequantStub: qat.DequantStub,
}

#: QAT module type -> its int8 module type
QAT_TO_QUANTIZED = {
    qat.Conv2d: quantized.Conv2d,
    qat.ConvRelu2d: quantized.Conv2d,
    qat.ConvBn2d: quantized.Conv2d,
    qat.ConvBnRelu2d: quantized.Conv2d,
    qat.Linear: quantized.Linear,
    qat.Elemwise: quantized.Elemwise,
    qat.QuantStub: quantized.QuantStub,
    qat.DequantStub: quantized.DequantStub,
}


def _swap(module: Module, convert, path: str = "") -> Module:
    """``module`` with every sub-module ``m`` for which ``convert(m, name)`` gives a module
    replaced by it (in place; the converted ones are not entered)."""
    new = convert(module, path)
    if new is not None:
        return new
    # every child is set again, in order: setattr moves a name to the end
    for name, child in list(module.named_children()):
        setattr(module, name, _swap(child, convert, f"{path}.{name}" if path else name))
    return module


class Fused(Module):
    """The place of a layer fused into the unit before it in a Sequential: the identity."""

    def forward(self, x):
        return x


def _unit(cls, **parts) -> Module:
    m = object.__new__(cls)
    Module.__init__(m)
    for k, v in parts.items():
        setattr(m, k, v)
    return m


def fuse_sequential(module: Module) -> Module:
    """Fuse the runs of every Sequential in ``module`` that quantization converts as one
    unit, in place: Conv2d, BatchNorm2d, ReLU becomes ConvBnRelu2d; Conv2d, BatchNorm2d
    ConvBn2d; Conv2d, ReLU ConvRelu2d. The unit takes the Conv2d's place (its parameters
    named ``conv.*`` and ``bn.*``), a :class:`Fused` the places of the others, so that the
    float network computes what it did.

    Parameters
    ----------
    module : Module
        Any network.

    Returns
    -------
    Module
        ``module``.
    """
    for _, seq in list(module.named_modules()):
        if not isinstance(seq, Sequential):
            continue
        names, mods = list(seq._modules), list(seq._modules.values())
        i = 0
        while i < len(mods):
            kinds = [type(m) for m in mods[i : i + 3]]
            n, unit = 1, None
            if kinds[:3] == [F.Conv2d, F.BatchNorm2d, F.ReLU]:
                n, unit = 3, _unit(F.ConvBnRelu2d, conv=mods[i], bn=mods[i + 1])
            elif kinds[:2] == [F.Conv2d, F.BatchNorm2d]:
                n, unit = 2, _unit(F.ConvBn2d, conv=mods[i], bn=mods[i + 1])
            elif kinds[:2] == [F.Conv2d, F.ReLU]:
                n, unit = 2, qat.retype(mods[i], F.ConvRelu2d)
            if unit is not None:
                mods[i : i + n] = [unit] + [Fused() for _ in range(n - 1)]
            i += n
        for name, m in zip(names, mods):
            setattr(seq, name, m)
    return module


def quantize_qat(
    module: Module, qconfig: QConfig = ema_fakequant_qconfig, fuse: bool = True
) -> Module:
    """Swap the float modules of ``module`` for QAT ones, in place.

    With ``fuse``, the Conv2d, BatchNorm2d(, ReLU) and Conv2d, ReLU runs of its Sequentials
    become single units first (:func:`fuse_sequential`).

    Conv2d, ConvRelu2d, ConvBn2d, ConvBnRelu2d, Linear, Elemwise, QuantStub and DequantStub
    become their :mod:`.qat` modules, which share the float module's parameters and get the
    observers and fake quantizations ``qconfig`` makes. Other modules (ReLU, pooling,
    Flatten...) stay: on a fake-quantized input their output is fake-quantized too, and they
    run on int8 vars unchanged.

    Parameters
    ----------
    module : Module
        The float network; mark where the int8 part begins and ends with QuantStub and
        DequantStub.
    qconfig : QConfig
        The observers and fake quantizations (default :data:`.ema_fakequant_qconfig`).
    fuse : bool
        Fuse the runs of the Sequentials first.

    Returns
    -------
    Module
        ``module`` converted (a new object only when ``module`` itself is converted).
    """

    def convert(m, _):
        cls = FLOAT_TO_QAT.get(type(m))
        if cls is None:
            return None
        q = cls.from_float_module(m)
        q.set_qconfig(qconfig)
        return q

    if fuse:
        fuse_sequential(module)
    return _swap(module, convert)


def quantize(module: Module) -> Module:
    """Swap the QAT modules of ``module`` for int8 inference modules, in place.

    Each QAT module is put in eval mode and converted with the ranges its observers recorded:
    the weight becomes QuantizedS8 (the fake-quantized values), the output dtype QuantizedS8
    at the output observer's scale.

    Parameters
    ----------
    module : Module
        A network from :func:`quantize_qat`, trained or calibrated.

    Returns
    -------
    Module
        ``module`` converted (a new object only when ``module`` itself is converted).

    Raises
    ------
    MegBrainError
        Naming the module when one of its observers never saw a value.
    """

    def convert(m, path):
        cls = QAT_TO_QUANTIZED.get(type(m))
        if cls is None:
            return None
        m.eval()
        try:
            q = cls.from_qat_module(m)
        except mgb.MegBrainError as exc:
            raise mgb.MegBrainError(
                f"quantize: {type(m).__name__} module {path or '(the root)'!r}: {exc}"
            ) from exc
        q.path = path
        return q

    return _swap(module, convert)


def _set(module: Module, kind: str, on: bool) -> None:
    for _, m in module.named_modules():
        if isinstance(m, qat.QATModule):
            for part in (f"weight_{kind}", f"act_{kind}"):
                sub = getattr(m, part, None)
                if sub is not None:
                    sub.enable() if on else sub.disable()


def enable_observer(module: Module) -> None:
    """Let every observer of ``module``'s QAT modules take ranges in."""
    _set(module, "observer", True)


def disable_observer(module: Module) -> None:
    """Freeze every observer of ``module``'s QAT modules."""
    _set(module, "observer", False)


def enable_fake_quant(module: Module) -> None:
    """Turn on every fake quantization of ``module``'s QAT modules."""
    _set(module, "fake_quant", True)


def disable_fake_quant(module: Module) -> None:
    """Make every fake quantization of ``module``'s QAT modules the identity."""
    _set(module, "fake_quant", False)
