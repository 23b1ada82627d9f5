"""Observers: modules that track the range of a tensor while a network trains and give the
scale of the symmetric QuantizedS8 dtype that covers it."""

from __future__ import annotations

import numpy as np

import megbrain as mgb

from ..module import Buffer, Module, _add_state_update

__all__ = ["Observer", "MinMaxObserver", "ExponentialMovingAverageObserver"]

_F32 = np.float32
_E = mgb.opr.elemwise


class Observer(Module):
    """The range ``[min_val, max_val]`` of what it saw (buffers of shape (1,)) and the scale
    of the QuantizedS8 dtype covering it: ``max(-min(min_val, 0), max(max_val, 0)) /
    ((qmax - qmin) / 2)``, at least ``eps``, in float32.

    Called on a var while training (and enabled), it takes the var's range in and updates
    its buffers in place (the update is one of :func:`megbrain.nn.pending_updates`); in eval
    mode it reads them. Either way it returns the scale as a (1,) var, which fake
    quantization divides by.

    Parameters
    ----------
    narrow_range : bool
        Quantize to [-127, 127] rather than [-128, 127] (for weights: no product of two
        -128s in the int32 sums).
    eps : float
        The smallest scale.
    """

    def __init__(self, narrow_range: bool = False, eps: float = 1e-5):
        super().__init__()
        self.narrow_range, self.eps = narrow_range, eps
        self.qmin, self.qmax = (-127 if narrow_range else -128), 127
        self.enabled = True
        self.min_val = Buffer(np.full(1, np.finfo(_F32).max))
        self.max_val = Buffer(np.full(1, np.finfo(_F32).min))

    def enable(self) -> None:
        """Take the range of what the observer sees in (the default)."""
        self.enabled = True

    def disable(self) -> None:
        """Freeze the range: the observer only reads its buffers."""
        self.enabled = False

    def forward(self, x):
        g = x.owner_graph
        if self.training and self.enabled:
            lo, hi = self._observe(mgb.opr.zero_grad(x), g)
            for buf, v in ((self.min_val, lo), (self.max_val, hi)):
                _add_state_update(g, mgb.opr.add_update(buf.symvar(g), v, alpha=0.0))
        else:
            lo, hi = self.min_val.symvar(g), self.max_val.symvar(g)
        m = _E(_E(lo, 0.0, mode="MIN") * -1.0, _E(hi, 0.0, mode="MAX"), mode="MAX")
        return _E(m / self._half_range(), self.eps, mode="MAX")

    def _observe(self, x, g) -> tuple:
        """The range after seeing ``x``, as vars of ``g``."""
        raise NotImplementedError

    def _half_range(self) -> np.float32:
        return _F32((self.qmax - self.qmin) / 2)

    def calibrated(self) -> bool:
        """Whether the observer saw anything."""
        return bool(self.min_val.get_value()[0] <= self.max_val.get_value()[0])

    def get_scale(self) -> float:
        """The scale of the range seen so far (the float32 value the graph computes).

        Raises
        ------
        MegBrainError
            When the observer never saw a value in training mode.
        """
        if not self.calibrated():
            raise mgb.MegBrainError(
                f"{type(self).__name__} has seen no value: run the network in training mode "
                "(with nn.pending_updates in the compiled outputs) before converting it"
            )
        lo, hi = self.min_val.get_value()[0], self.max_val.get_value()[0]
        m = max(-min(lo, _F32(0)), max(hi, _F32(0)))
        return float(max(_F32(m / self._half_range()), _F32(self.eps)))

    def get_dtype(self) -> np.dtype:
        """The QuantizedS8 dtype of :meth:`get_scale`."""
        return mgb.dtype.qint8(self.get_scale())


class MinMaxObserver(Observer):
    """The smallest and largest values seen over all the runs."""

    def _observe(self, x, g):
        lo = _E(self.min_val.symvar(g), x.min(), mode="MIN")
        hi = _E(self.max_val.symvar(g), x.max(), mode="MAX")
        return lo, hi


class ExponentialMovingAverageObserver(Observer):
    """A moving average of each run's minimum and maximum, ``r = momentum * r + (1 -
    momentum) * value``, that starts at the first run's values.

    Parameters
    ----------
    momentum : float
        The weight of the past.
    narrow_range, eps
        As for :class:`Observer`.
    """

    def __init__(self, momentum: float = 0.9, narrow_range: bool = False, eps: float = 1e-5):
        super().__init__(narrow_range, eps)
        self.momentum = momentum
        #: 0 until the first run, then ``momentum``
        self.runtime_momentum = Buffer(np.zeros(1))

    def _observe(self, x, g):
        r = self.runtime_momentum.symvar(g)
        rest = 1.0 - r
        lo = self.min_val.symvar(g) * r + rest * x.min()
        hi = self.max_val.symvar(g) * r + rest * x.max()
        _add_state_update(g, mgb.opr.add_update(r, self.momentum, alpha=0.0))
        return lo, hi
