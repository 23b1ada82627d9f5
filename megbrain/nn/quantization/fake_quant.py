"""Fake quantization: the float value a QuantizedS8 tensor would hold, with a straight-through
gradient inside its range."""

from __future__ import annotations

import megbrain as mgb

from ..module import Module

__all__ = ["FakeQuantize", "fake_quant"]

_E = mgb.opr.elemwise


def fake_quant(x, scale, qmin: int = -128, qmax: int = 127):
    """``clip(round(x / scale), qmin, qmax) * scale`` with MegDNN's QuantizedS8 arithmetic
    (float32 division, rounding half away from zero, saturation), so that it equals the
    dequantized TypeCvt of ``x`` to ``qint8(scale)``.

    The gradient is straight through the rounding: ``d/dx`` is 1 where ``x / scale`` is inside
    ``[qmin, qmax]`` and 0 where the value saturates.

    Parameters
    ----------
    x : SymbolVar
        The float32 value.
    scale : SymbolVar or float
        The scale (a (1,) var, as an observer gives it).
    qmin, qmax : int
        The integer range.

    Returns
    -------
    SymbolVar
        The fake-quantized value, of ``x``'s shape.
    """
    t = x / scale
    # t + (round(t) - t) is round(t) exactly (the difference is below 1 and a multiple of
    # t's ulp); the zero_grad makes the rounding the identity for the gradient
    r = t + mgb.opr.zero_grad(mgb.opr.elem.round(t) - t)
    r = _E(_E(r, float(qmin), mode="MAX"), float(qmax), mode="MIN")
    return r * scale


class FakeQuantize(Module):
    """:func:`fake_quant` as a module, which :meth:`disable` turns into the identity.

    Parameters
    ----------
    narrow_range : bool
        Saturate to [-127, 127] rather than [-128, 127] (as the weight's observer).
    """

    def __init__(self, narrow_range: bool = False):
        super().__init__()
        self.narrow_range = narrow_range
        self.qmin, self.qmax = (-127 if narrow_range else -128), 127
        self.enabled = True

    def enable(self) -> None:
        self.enabled = True

    def disable(self) -> None:
        self.enabled = False

    def forward(self, x, scale):
        if not self.enabled:
            return x
        return fake_quant(x, scale, self.qmin, self.qmax)
