"""Facts about NumPy arrays that kernels and operators share."""

from __future__ import annotations

import numpy as np

__all__ = ["same_elements"]


def same_elements(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``a`` and ``b`` view exactly the same elements: one start address, shape and
    strides (one array, or two views alike). This is what lets a kernel run in place; arrays
    that merely overlap are not the same."""
    return (
        a.shape == b.shape
        and a.strides == b.strides
        and a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
    )
