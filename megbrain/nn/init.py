"""Parameter initializations (Kaiming / Xavier), seeded through a numpy Generator."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["fan_in_out", "kaiming_uniform", "xavier_uniform", "default_rng"]

_rng = [np.random.default_rng(0)]


def default_rng(seed: int | None = None) -> np.random.Generator:
    """The generator initializers use; pass a seed to reset it."""
    if seed is not None:
        _rng[0] = np.random.default_rng(seed)
    return _rng[0]


def fan_in_out(shape: tuple) -> tuple[int, int]:
    """(fan_in, fan_out) of a Linear (out, in) or conv (out, in, kh, kw) weight shape."""
    receptive = int(np.prod(shape[2:])) if len(shape) > 2 else 1
    return shape[1] * receptive, shape[0] * receptive


def kaiming_uniform(shape: tuple, a: float = math.sqrt(5), rng=None) -> np.ndarray:
    """He initialization as PyTorch's default for Linear/Conv weights."""
    fan_in, _ = fan_in_out(shape)
    gain = math.sqrt(2.0 / (1 + a * a))
    bound = gain * math.sqrt(3.0 / fan_in)
    return (rng or _rng[0]).uniform(-bound, bound, shape).astype(np.float32)


def xavier_uniform(shape: tuple, gain: float = 1.0, rng=None) -> np.ndarray:
    """Glorot initialization."""
    fan_in, fan_out = fan_in_out(shape)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return (rng or _rng[0]).uniform(-bound, bound, shape).astype(np.float32)
