"""``megbrain.nn.quantization``: quantization-aware training and int8 deployment, as
MegEngine's ``megengine.quantization``: observers, fake quantization, QConfig,
:func:`quantize_qat` (float to QAT modules, :mod:`.qat`) and :func:`quantize` (QAT to int8
inference modules, :mod:`.quantized`)."""

from . import qat, quantized
from .fake_quant import FakeQuantize, fake_quant
from .observer import ExponentialMovingAverageObserver, MinMaxObserver, Observer
from .qconfig import (
    QConfig,
    calibration_qconfig,
    ema_fakequant_qconfig,
    min_max_fakequant_qconfig,
)
from .quantize import (
    Fused,
    disable_fake_quant,
    disable_observer,
    enable_fake_quant,
    enable_observer,
    fuse_sequential,
    quantize,
    quantize_qat,
)
from .quantized import quantize_value

__all__ = [
    "ExponentialMovingAverageObserver",
    "FakeQuantize",
    "Fused",
    "MinMaxObserver",
    "Observer",
    "QConfig",
    "calibration_qconfig",
    "disable_fake_quant",
    "disable_observer",
    "ema_fakequant_qconfig",
    "enable_fake_quant",
    "enable_observer",
    "fake_quant",
    "fuse_sequential",
    "min_max_fakequant_qconfig",
    "qat",
    "quantize",
    "quantize_qat",
    "quantize_value",
    "quantized",
]
