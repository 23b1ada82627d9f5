"""Comp node events: markers in a comp node's task queue that other threads can wait on.

``record()`` enqueues a marker; the marker fires (a lock is released, a timestamp taken)
when the comp node's worker reaches it, so ``finished()`` is true once all work
dispatched before the record has run. Each record makes a new marker, so an event can be
re-recorded, and a wait started earlier keeps waiting on the record it saw (as with CUDA
events).
"""

from __future__ import annotations

import time
from _thread import allocate_lock
from typing import TYPE_CHECKING

from ..errors import MegBrainError

if TYPE_CHECKING:
    from .comp_node import CompNode

__all__ = ["Event", "Marker"]


class Marker:
    """One recorded point of a task queue: ``fire()`` on the worker, ``wait()`` anywhere."""

    __slots__ = ("_lock", "time")

    def __init__(self):
        self._lock = allocate_lock()
        self._lock.acquire()
        #: ``time.perf_counter()`` when the marker fired, or None
        self.time: float | None = None

    def fire(self) -> None:
        """Mark as reached; wakes every waiter."""
        self.time = time.perf_counter()
        self._lock.release()

    def done(self) -> bool:
        """Whether the marker has fired."""
        return not self._lock.locked()

    def wait(self) -> None:
        """Block until the marker has fired."""
        lock = self._lock
        lock.acquire()
        lock.release()


class Event:
    """An event on a comp node (``CompNode.create_event()``).

    Parameters
    ----------
    comp_node:
        The node whose queue the event is recorded on.
    flags:
        Accepted for MegBrain compatibility (``NEED_TIMER``); timing is always available.
    """

    __slots__ = ("_cn", "_marker", "flags")

    def __init__(self, comp_node: CompNode, flags: int = 0):
        self._cn = comp_node
        self._marker: Marker | None = None
        self.flags = flags

    @property
    def comp_node(self) -> CompNode:
        """The comp node this event is recorded on."""
        return self._cn

    def record(self) -> Event:
        """Enqueue a marker after all work dispatched so far to the comp node."""
        marker = Marker()
        self._marker = marker
        self._cn.impl.dispatch(marker.fire)
        return self

    def _recorded(self) -> Marker:
        marker = self._marker
        if marker is None:
            raise MegBrainError(f"event on {self._cn} used before record()")
        return marker

    def finished(self) -> bool:
        """Whether the work before the last ``record()`` has finished."""
        return self._recorded().done()

    def host_wait(self) -> None:
        """Block the calling thread until :meth:`finished` is true."""
        self._recorded().wait()

    def waiter(self):
        """A callable that blocks until the current record has finished (for device_wait)."""
        return self._recorded().wait

    def elapsed_time_until(self, end: Event) -> float:
        """Seconds between this event's record firing and ``end``'s (waits for both)."""
        a, b = self._recorded(), end._recorded()
        a.wait()
        b.wait()
        return b.time - a.time

    def __repr__(self) -> str:
        state = (
            "unrecorded" if self._marker is None else ("finished" if self.finished() else "pending")
        )
        return f"Event({self._cn}, {state})"
