"""Comp node implementations: the backend interface and the CPU backend.

One implementation object exists per physical locator ``(type, dev, stream)``; every
:class:`~megbrain.device.CompNode` that maps to that locator shares it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from .event import Event, Marker
from .memory import aligned_empty, host_mem_status
from .worker import Worker, dispatch_lock

if TYPE_CHECKING:
    from .comp_node import CompNode

__all__ = [
    "XPU",
    "CUDA",
    "CPU",
    "DEVICE_CPU_DEFAULT",
    "CompNodeImpl",
    "CpuCompNodeImpl",
    "CpuDefaultCompNodeImpl",
    "register_backend",
    "get_backend",
]

#: device types, numbered as MegBrain's ``CompNode::DeviceType``
XPU, CUDA, CPU = 0, 1, 2
#: the device number of ``cpu:default`` (MegBrain's ``Locator::DEVICE_CPU_DEFAULT``)
DEVICE_CPU_DEFAULT = -1024


class CompNodeImpl:
    """Interface of one physical comp node: memory, copies, ordered dispatch and events.

    A backend is one subclass registered with :func:`register_backend` for its device type.
    Everything above the device layer (tensors, graph, operators) talks to devices only
    through these members, so a CUDA backend is added by writing one more subclass (say
    ``CudaCompNodeImpl`` with ``array_module = cupy``, ``alloc`` returning a cupy uint8
    array, ``copy`` doing ``cupy.copyto`` on the node's stream, events backed by
    ``cupy.cuda.Event`` and ``device_count()`` from the CUDA runtime) and registering it
    for ``CUDA``; nothing outside ``megbrain/device`` changes.

    Parameters
    ----------
    locator:
        The physical locator ``(type, dev, stream)``.
    """

    #: the NumPy-compatible module whose arrays live in this node's memory
    array_module: ClassVar[Any] = np
    #: alignment in bytes of every buffer :meth:`alloc` returns
    mem_align: ClassVar[int] = 64
    #: whether :meth:`dispatch` runs work inline on the caller's thread
    is_inline: ClassVar[bool] = False

    def __init__(self, locator: tuple[int, int, int]):
        self.locator = locator

    @classmethod
    def create(cls, locator: tuple[int, int, int]) -> CompNodeImpl:
        """Make the implementation for a physical locator (may pick a subclass)."""
        return cls(locator)

    @classmethod
    def device_count(cls) -> int:
        """Number of physical devices of this type."""
        raise NotImplementedError

    def alloc(self, nbytes: int):
        """Return a 1-d uint8 array of ``nbytes`` bytes aligned to :attr:`mem_align`."""
        raise NotImplementedError

    def view(self, buf, offset: int, layout):
        """An array over ``buf`` (from :meth:`alloc`) from byte ``offset`` with ``layout``'s
        ``shape``, ``dtype`` and ``byte_strides``, sharing the memory."""
        raise NotImplementedError

    def copy(self, dst, src) -> None:
        """Copy array ``src`` into array ``dst`` (same shape and dtype), either of which may
        be a host (numpy) array; called on this node's queue."""
        raise NotImplementedError

    def dispatch(self, fn: Callable, *args) -> None:
        """Enqueue ``fn(*args)``; work runs in dispatch order, off the caller's thread."""
        raise NotImplementedError

    def sync(self) -> None:
        """Wait for all dispatched work; re-raise the first error a task raised since."""
        raise NotImplementedError

    def create_event(self, comp_node: CompNode, flags: int = 0) -> Event:
        """Make an event recorded on this node's queue."""
        return Event(comp_node, flags)

    def device_wait(self, event: Event) -> None:
        """Make work dispatched to this node from now on wait until ``event`` finished."""
        if event.comp_node.impl is not self:
            waiter = event.waiter()
            with dispatch_lock:  # never between the tasks of one execution
                self.dispatch(waiter)

    def mem_status_bytes(self) -> tuple[int, int]:
        """``(total, free)`` bytes of the node's memory."""
        raise NotImplementedError

    def stop(self) -> Worker | None:
        """Drop pending work and release threads (called by ``finalize``); returns the
        worker still finishing its running task, if any, for ``finalize`` to join."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.locator})"


class CpuCompNodeImpl(CompNodeImpl):
    """A ``cpuN:M`` node: host memory and one lazily started daemon worker thread."""

    def __init__(self, locator: tuple[int, int, int]):
        super().__init__(locator)
        self._worker: Worker | None = None
        self._start_lock = threading.Lock()

    @classmethod
    def create(cls, locator: tuple[int, int, int]) -> CompNodeImpl:
        if locator[1] == DEVICE_CPU_DEFAULT:
            return CpuDefaultCompNodeImpl(locator)
        return cls(locator)

    @classmethod
    def device_count(cls) -> int:
        return os.cpu_count() or 1

    def alloc(self, nbytes: int) -> np.ndarray:
        return aligned_empty(nbytes, self.mem_align)

    def view(self, buf: np.ndarray, offset: int, layout) -> np.ndarray:
        return np.ndarray(layout.shape, layout.dtype, buf, offset, layout.byte_strides)

    def copy(self, dst: np.ndarray, src: np.ndarray) -> None:
        np.copyto(dst, src)

    def _start_worker(self) -> Worker:
        with self._start_lock:
            if self._worker is None:
                type_, dev, stream = self.locator
                self._worker = Worker(f"mgb-cpu{dev}:{stream}")
            return self._worker

    def dispatch(self, fn: Callable, *args) -> None:
        worker = self._worker
        if worker is None:
            worker = self._start_worker()
        worker.put((fn, args))

    def sync(self) -> None:
        worker = self._worker
        if worker is None:
            return
        if not worker.on_thread():
            marker = Marker()
            worker.put((marker.fire, ()))
            marker.wait()
        exc = worker.take_error()
        if exc is not None:
            raise exc

    def mem_status_bytes(self) -> tuple[int, int]:
        return host_mem_status()

    def stop(self) -> Worker | None:
        with self._start_lock:
            worker, self._worker = self._worker, None
        if worker is not None:
            worker.stop()
        return worker


class CpuDefaultCompNodeImpl(CpuCompNodeImpl):
    """``cpu:default``: runs dispatched work inline, on the caller's thread.

    A task's exception is kept and re-raised by :meth:`sync`, as on worker nodes, so code
    written for any comp node handles errors the same way.
    """

    is_inline: ClassVar[bool] = True

    def __init__(self, locator: tuple[int, int, int]):
        super().__init__(locator)
        self._error: BaseException | None = None

    def dispatch(self, fn: Callable, *args) -> None:
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - re-raised by sync()
            if self._error is None:
                self._error = exc

    def sync(self) -> None:
        exc, self._error = self._error, None
        if exc is not None:
            raise exc

    def stop(self) -> None:
        return None


_BACKENDS: dict[int, type[CompNodeImpl]] = {CPU: CpuCompNodeImpl}


def register_backend(device_type: int, impl_cls: type[CompNodeImpl]) -> None:
    """Use ``impl_cls`` for comp nodes of ``device_type`` (``CPU`` or ``CUDA``)."""
    _BACKENDS[device_type] = impl_cls


def get_backend(device_type: int) -> type[CompNodeImpl] | None:
    """The implementation class of a device type, or None when there is no backend."""
    return _BACKENDS.get(device_type)
