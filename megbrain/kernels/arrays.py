"""Facts about NumPy arrays that kernels and operators share."""

from __future__ import annotations

import ml_dtypes
import numpy as np

__all__ = ["compute_dtype", "same_elements"]

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_LOW_FLOATS = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def same_elements(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``a`` and ``b`` view exactly the same elements: one start address, shape and
    strides (one array, or two views alike). This is what lets a kernel run in place; arrays
    that merely overlap are not the same."""
    return (
        a.shape == b.shape
        and a.strides == b.strides
        and a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
    )


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype kernels compute in: float32 for float16/bfloat16, else the dtype itself.

    Raises
    ------
    ValueError
        For a dtype that is not floating point.
    """
    dtype = np.dtype(dtype)
    if dtype in _LOW_FLOATS:
        return _F32
    if dtype in (_F32, _F64):
        return dtype
    raise ValueError(f"unsupported dtype {dtype.name} (floating point only)")
