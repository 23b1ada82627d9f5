"""Facts about NumPy arrays that kernels and operators share."""

from __future__ import annotations

import ml_dtypes
import numpy as np

__all__ = ["BF16", "F16", "F32", "F64", "LOW_FLOATS", "compute_dtype", "same_elements"]

#: the float dtypes kernels compare against
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
F16 = np.dtype(np.float16)
BF16 = np.dtype(ml_dtypes.bfloat16)
#: the floats narrower than float32, which compute in float32
LOW_FLOATS = (F16, BF16)


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
    if dtype in LOW_FLOATS:
        return F32
    if dtype in (F32, F64):
        return dtype
    raise ValueError(f"unsupported dtype {dtype.name} (floating point only)")
