"""The public convolution binds (MegDNN's Convolution{,3D}{Forward,BackwardData,BackwardFilter}):
each chooses one registered algorithm per shape through :mod:`.registry`, as its ``strategy``
(the execution policy) says, and binds it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from . import registry
from .common import bind_doc

__all__ = ["bind_conv_backward_data", "bind_conv_backward_filter", "bind_convolution"]


@bind_doc("forward", strategy=True)
def bind_convolution(src: np.ndarray, filt: np.ndarray, out: np.ndarray, stride: Sequence[int],
                     pad: Sequence[int], dilate: Sequence[int], flip: bool = False, *,
                     strategy: str = "HEURISTIC") -> Callable[[], None]:  # fmt: skip
    """Bind a grouped convolution ``out = conv(src, filt)`` (any strides), by the algorithm
    ``strategy`` chooses."""
    return registry.bind("forward", src, filt, out, stride, pad, dilate, flip, strategy=strategy)


@bind_doc("backward_data", strategy=True)
def bind_conv_backward_data(filt: np.ndarray, diff: np.ndarray, grad: np.ndarray,
                            stride: Sequence[int], pad: Sequence[int], dilate: Sequence[int],
                            flip: bool = False, *, strategy: str = "HEURISTIC",
                            ) -> Callable[[], None]:  # fmt: skip
    """Bind the gradient of a convolution w.r.t. its input (deconvolution).

    The HEURISTIC choice: a stride-1 gradient with a "same" padding is the forward convolution
    of ``diff`` (padded by ``dilate (F - 1) - pad``) with the filter transposed (input and
    output channels swapped) and flipped; otherwise one GEMM per batch chunk gives the columns,
    which col2im adds into a padded gradient (one strided add per filter offset)."""
    return registry.bind(
        "backward_data", filt, diff, grad, stride, pad, dilate, flip, strategy=strategy
    )


@bind_doc("backward_filter", strategy=True)
def bind_conv_backward_filter(src: np.ndarray, diff: np.ndarray, grad: np.ndarray,
                              stride: Sequence[int], pad: Sequence[int], dilate: Sequence[int],
                              flip: bool = False, *, strategy: str = "HEURISTIC",
                              ) -> Callable[[], None]:  # fmt: skip
    """Bind the gradient of a convolution w.r.t. its filter.

    HEURISTIC takes IM2COL_GEMM_BLOCKED (:mod:`.bwd_filter`: cache-sized blocks of columns,
    each GEMM-accumulated, one pipeline per thread) for 2-d convolutions. Otherwise (1-d, 3-d)
    it computes, per batch chunk, the transposed gradient (G, K, OCg): the columns
    (G, K, k * L) times a channel-last copy of ``diff`` (G, k * L, OCg), the batch summed
    inside the GEMM. Measured on 2 cores, this orientation (the K = ICg * prod(F) rows split
    between OpenBLAS's threads) ran 4-5x faster than ``diff @ columns^T`` (OCg rows), whose
    threads synchronise once per block of the long reduction dim."""
    return registry.bind(
        "backward_filter", src, diff, grad, stride, pad, dilate, flip, strategy=strategy
    )
