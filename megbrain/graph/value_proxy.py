"""The value handed to output callbacks and callback_injector."""

from __future__ import annotations

import threading
import warnings

import numpy as np

from ..errors import MegBrainError

__all__ = ["CompGraphCallbackValueProxy", "copy_into_buffer", "pubapi_dev_tensor_ptr"]


def pubapi_dev_tensor_ptr(version: int, raw_ptr: int) -> int:
    """The address the reference's ``_pubapi_dev_tensor_ptr(version)`` returns.

    Parameters
    ----------
    version:
        0: the raw data pointer. 1: the address of a C++ ``mgb::pubapi::DeviceTensor``
        struct, which C++ extensions read; a Python runtime has no such struct, so this
        raises instead of handing out an address that would be misread.
    raw_ptr:
        The tensor's data pointer.

    Returns
    -------
    int
        ``raw_ptr`` for version 0.

    Raises
    ------
    MegBrainError
        For version 1 or an unknown version.
    """
    if version == 0:
        return raw_ptr
    if version == 1:
        raise MegBrainError(
            "pubapi_dev_tensor_ptr (version 1) is the address of a C++ mgb::pubapi::DeviceTensor "
            "struct, which this Python runtime does not have; use dev_ptr (version 0) for the "
            "raw data pointer"
        )
    raise MegBrainError(
        f"unknown pubapi_dev_tensor_ptr version {version!r} (0: the raw data pointer, "
        "1: a mgb::pubapi::DeviceTensor)"
    )


def array_protocol(arr: np.ndarray, dtype, copy, owner: str) -> np.ndarray:
    """``__array__`` of an object whose value is ``arr``: ``arr`` itself (shared memory), or a
    copy when ``copy=True`` or another ``dtype`` is asked for (refused with ``copy=False``)."""
    if dtype is not None and np.dtype(dtype) != arr.dtype:
        if copy is False:
            raise ValueError(
                f"{owner}.__array__: dtype {np.dtype(dtype)} differs from the value's "
                f"{arr.dtype}, which needs a copy, and copy=False"
            )
        return arr.astype(dtype)
    return arr.copy() if copy else arr


def dlpack_protocol(arr: np.ndarray, stream, max_version, dl_device, copy):
    """``__dlpack__`` of an object whose value is ``arr``: NumPy's capsule for it, passing on
    only the protocol arguments the caller gave (older NumPy lacks some)."""
    kw = {"stream": stream}
    for k, v in (("max_version", max_version), ("dl_device", dl_device), ("copy", copy)):
        if v is not None:
            kw[k] = v
    return arr.__dlpack__(**kw)


def copy_into_buffer(buf: np.ndarray | None, arr: np.ndarray) -> np.ndarray:
    """A copy of ``arr`` in ``buf``, or in a new array when ``buf`` is None or of another
    shape or dtype (so that repeated copies of same-shaped values reuse one buffer).

    Parameters
    ----------
    buf:
        The buffer of the previous copy, or None.
    arr:
        The value to copy.

    Returns
    -------
    numpy.ndarray
        The buffer holding the copy (``buf`` itself when it fits).
    """
    if buf is None or buf.shape != arr.shape or buf.dtype != arr.dtype:
        buf = np.empty(arr.shape, arr.dtype)
    np.copyto(buf, arr)
    return buf


class CompGraphCallbackValueProxy:
    """The value handed to an output callback; valid only while the callback runs.

    Its buffer is reused by the next run, so it must not escape the callback; pass it to
    ``SharedND.set_value`` to copy device to device without a host round trip.
    """

    __slots__ = ("_dev", "_hv", "_comp_node", "_active", "_eager", "_value_used", "_done")

    def __init__(self, comp_node):
        self._dev: np.ndarray | None = None
        self._hv: np.ndarray | None = None
        self._comp_node = comp_node
        self._active = False
        self._eager = False
        self._value_used = False
        self._done = threading.Event()
        self._done.set()

    def setup(self, dev_value: np.ndarray, eager_copy: bool) -> None:
        # wait until the previous callback on this proxy has finished
        self._done.wait()
        self._done.clear()
        self._dev = dev_value
        self._eager = eager_copy
        if eager_copy:
            self._hv = copy_into_buffer(self._hv, dev_value)
            self._value_used = False
        else:
            self._value_used = True
        self._active = True

    def on_finished(self) -> None:
        unread = self._eager and not self._value_used
        self._dev = None
        self._active = False
        self._done.set()
        if unread:
            warnings.warn("computing graph callback did not read the value", stacklevel=2)

    def _check(self):
        if not self._active:
            raise MegBrainError(
                "CompGraphCallbackValueProxy used outside its callback: the value is only "
                "valid while the callback runs"
            )

    @property
    def eager_copied(self) -> bool:
        return self._eager

    @property
    def dev_value(self) -> np.ndarray:
        """The device array (for device-to-device copies into a SharedND)."""
        self._check()
        self._value_used = True
        return self._dev if self._dev is not None else self._hv

    @property
    def shape(self) -> tuple:
        self._check()
        return (self._dev if self._dev is not None else self._hv).shape

    @property
    def dtype(self) -> np.dtype:
        self._check()
        return (self._dev if self._dev is not None else self._hv).dtype

    @property
    def comp_node(self):
        self._check()
        return self._comp_node

    def get_value(self, *, borrow_mem: bool = False) -> np.ndarray:
        """The value as an ndarray: a copy unless ``borrow_mem`` (then valid until next run)."""
        self._check()
        self._value_used = True
        src = self._hv if self._eager else self._dev
        return src if borrow_mem else np.array(src)

    # zero-copy interop: valid, like the value itself, only while the callback runs
    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """The value as an array sharing the proxy's buffer (``np.asarray(proxy)``), or a copy
        when ``copy=True`` or another ``dtype`` is asked for."""
        return array_protocol(self.get_value(borrow_mem=True), dtype, copy, type(self).__name__)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """Export the value as a DLPack capsule sharing its buffer (valid until the callback
        returns); the arguments are those of the DLPack protocol."""
        return dlpack_protocol(
            self.get_value(borrow_mem=True), stream, max_version, dl_device, copy
        )

    def __dlpack_device__(self) -> tuple[int, int]:
        """The DLPack device of the value: ``(1, 0)``, the CPU."""
        self._check()
        return (1, 0)

    def _pubapi_dev_tensor_ptr(self, version: int) -> int:
        """The raw data pointer (version 0); version 1 raises (see
        :func:`pubapi_dev_tensor_ptr`)."""
        self._check()
        return pubapi_dev_tensor_ptr(version, self._dev.__array_interface__["data"][0])

    @property
    def dev_ptr(self) -> int:
        """The address of the device value's data."""
        return self._pubapi_dev_tensor_ptr(0)

    @property
    def pubapi_dev_tensor_ptr(self) -> int:
        """Raises: the reference returned a C++ ``mgb::pubapi::DeviceTensor`` address here
        (version 1), which has no meaning in a Python runtime; use :attr:`dev_ptr`."""
        return self._pubapi_dev_tensor_ptr(1)
