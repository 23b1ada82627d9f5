"""Facts about NumPy arrays that kernels and operators share."""

from __future__ import annotations

import numpy as np

from ..dtype import is_bfloat16

__all__ = ["F16", "F32", "F64", "compute_dtype", "is_low_float", "same_elements"]

#: the float dtypes kernels compare against
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
F16 = np.dtype(np.float16)


def is_low_float(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is a float narrower than float32 (float16, bfloat16): those compute in
    float32."""
    return dtype == F16 or is_bfloat16(dtype)


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
    if is_low_float(dtype):
        return F32
    if dtype in (F32, F64):
        return dtype
    raise ValueError(f"unsupported dtype {dtype.name} (floating point only)")
