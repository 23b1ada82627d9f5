"""QConfig: which observers and fake quantizations a QAT module gets for its weight and its
output, and the presets."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from .fake_quant import FakeQuantize
from .observer import ExponentialMovingAverageObserver, MinMaxObserver

__all__ = [
    "QConfig",
    "ema_fakequant_qconfig",
    "min_max_fakequant_qconfig",
    "calibration_qconfig",
]


@dataclass(frozen=True)
class QConfig:
    """Factories (classes or ``functools.partial``) of the modules quantization adds.

    Attributes
    ----------
    weight_observer, act_observer : callable
        Make the observer of the weight and of the output (:mod:`.observer`).
    weight_fake_quant, act_fake_quant : callable or None
        Make the fake quantization of the weight and of the output; None leaves the values
        float (calibration: the observers only record ranges).
    """

    weight_observer: Callable
    act_observer: Callable
    weight_fake_quant: Callable | None
    act_fake_quant: Callable | None


#: weights by their min and max, outputs by a moving average of theirs (MegEngine's default)
ema_fakequant_qconfig = QConfig(
    weight_observer=partial(MinMaxObserver, narrow_range=True),
    act_observer=ExponentialMovingAverageObserver,
    weight_fake_quant=partial(FakeQuantize, narrow_range=True),
    act_fake_quant=FakeQuantize,
)

#: weights and outputs by their min and max over all runs
min_max_fakequant_qconfig = QConfig(
    weight_observer=partial(MinMaxObserver, narrow_range=True),
    act_observer=MinMaxObserver,
    weight_fake_quant=partial(FakeQuantize, narrow_range=True),
    act_fake_quant=FakeQuantize,
)

#: post-training calibration: ranges observed on a float forward, no fake quantization
calibration_qconfig = QConfig(
    weight_observer=partial(MinMaxObserver, narrow_range=True),
    act_observer=MinMaxObserver,
    weight_fake_quant=None,
    act_fake_quant=None,
)
