"""Pooling of quantized arrays (QuantizedS8, Quantized8Asymm, QuantizedS32), as MegDNN's naive
poolers compute it on the stored integers: MAX takes the largest stored value of the window
(padding never wins); the averages sum the stored values in int32 and store
``round(float32(sum) / float32(count))`` (half away from zero, saturated), the count being
the window's (AVERAGE: a Quantized8Asymm window's padding adds its zero point to the sum) or
the in-image taps' (AVERAGE_COUNT_EXCLUDE_PADDING). The output has the source's dtype.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np

from .. import workspace
from ..elemwise import quant_params
from ..elemwise_modes import round_in_place
from ..steps import Step, chain
from .binds import _Pool

__all__ = ["QUANTIZED_POOL_DTYPES", "bind_quantized_pooling"]

_partial = functools.partial
_F32, _I32 = np.dtype(np.float32), np.dtype(np.int32)

#: the quantized dtypes MegDNN's naive pooling takes
QUANTIZED_POOL_DTYPES = ("QuantizedS8", "Quantized8Asymm", "QuantizedS32")


def bind_quantized_pooling(
    src: np.ndarray,
    out: np.ndarray,
    mode: str,
    window: Sequence[int],
    stride: Sequence[int],
    pad: Sequence[int],
) -> Callable[[], None]:
    """Bind a pooling of the quantized ``src`` (N, C, H, W) into ``out`` of its dtype.

    Parameters
    ----------
    src, out : numpy.ndarray
        Of one quantized dtype (:data:`QUANTIZED_POOL_DTYPES`).
    mode : {"MAX", "AVERAGE", "AVERAGE_COUNT_EXCLUDE_PADDING"}
        As for :func:`megbrain.kernels.pool.binds.bind_pooling`.
    window, stride, pad : sequence of int
        One value per spatial dim; ``pad < window``.

    Returns
    -------
    Callable[[], None]
        A zero-argument callable computing ``out``.
    """
    qp = quant_params(src.dtype)
    if qp is None or qp.name not in QUANTIZED_POOL_DTYPES:
        raise ValueError(f"quantized pooling takes {', '.join(QUANTIZED_POOL_DTYPES)}, got "
                         f"{qp.name if qp else src.dtype.name}")  # fmt: skip
    geo = _Pool("Pooling", src.shape, out.shape, mode, window, stride, pad)
    x = src.view(np.dtype(src.dtype.str))
    y = out.view(np.dtype(out.dtype.str))
    regions = list(geo.regions())
    steps: list[Step] = []
    if mode == "MAX":
        steps.append(_partial(np.copyto, y, np.iinfo(y.dtype).min))
        for oidx, sidx in regions:
            a = y[oidx]
            steps.append(_partial(np.maximum, a, x[sidx], out=a))
        return chain(steps)
    acc = workspace.empty(out.shape, _I32)
    steps.append(_partial(np.copyto, acc, 0))
    for oidx, sidx in regions:
        a = acc[oidx]
        steps.append(_partial(np.add, a, x[sidx], a, casting="unsafe"))  # wraps as C's int32
    taps = _Pool("Pooling", src.shape, out.shape, "AVERAGE_COUNT_EXCLUDE_PADDING", window,
                 stride, pad)  # fmt: skip
    fed = taps.divisor(_I32)  # the in-image taps of each window
    if mode == "AVERAGE":
        count = geo.divisor(_F32)
        if qp.zero_point:
            padded = (np.int32(count) - np.asarray(fed, _I32)) * np.int32(qp.zero_point)
            steps.append(_partial(np.add, acc, padded, acc))
    else:
        count = np.asarray(fed, _F32)
    w = workspace.empty(out.shape, _F32)
    steps += [_partial(np.copyto, w, acc, "unsafe"), _partial(np.true_divide, w, count, w)]
    steps += round_in_place(w)
    steps += [
        _partial(np.fmax, w, qp.qmin, w),
        _partial(np.fmin, w, qp.qmax, w),
        _partial(np.copyto, y, w, "unsafe"),
    ]
    return chain(steps)
