"""The dispatch worker of a comp node: one daemon thread running queued tasks in order.

A task is a ``(fn, args)`` pair put on a ``queue.SimpleQueue`` (about 0.35 us per put, half
the cost of a deque guarded by a Condition). The first exception a task raises is kept
until :meth:`Worker.take_error` hands it out; later tasks still run. :data:`dispatch_lock`
orders the enqueues that can make one worker wait for another's work (no deadlock).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

__all__ = ["Worker", "dispatch_lock"]

#: Held while enqueueing work that waits for another worker's work: all the tasks of one
#: execution (on every comp node it uses, at once) and each device wait. So every wait sits
#: in its queue behind only work enqueued before the work it waits for, and no set of waits
#: can form a cycle across the queues (docs/DECISIONS.md, "Dispatch across comp nodes").
#: A task that waits on nothing (a copy, an event record) is enqueued without it.
dispatch_lock = threading.Lock()


class Worker:
    """A daemon thread that runs ``(fn, args)`` tasks in FIFO order.

    Parameters
    ----------
    name:
        The thread's name (``"mgb-cpu0:0"``).
    """

    __slots__ = ("name", "put", "ident", "_queue", "_thread", "_error", "_stopped")

    def __init__(self, name: str):
        self.name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        #: enqueue a ``(fn, args)`` task; bound once so that dispatch is one call
        self.put: Callable[[tuple], None] = self._queue.put
        self._error: BaseException | None = None
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self.ident = self._thread.ident

    def _run(self) -> None:
        get = self._queue.get
        while True:
            task = get()
            if task is None or self._stopped:
                return
            try:
                task[0](*task[1])
            except BaseException as exc:  # noqa: BLE001 - kept for sync() to re-raise
                if self._error is None:
                    self._error = exc

    def record_error(self, exc: BaseException) -> None:
        """Keep ``exc`` as the worker's error unless an earlier one is pending."""
        if self._error is None:
            self._error = exc

    def take_error(self) -> BaseException | None:
        """Return the first error raised since the last call, and forget it."""
        exc, self._error = self._error, None
        return exc

    def stop(self) -> None:
        """Stop after the running task; pending tasks are dropped. Does not wait."""
        self._stopped = True
        self._queue.put(None)

    def join(self, timeout: float | None = None) -> bool:
        """Wait (at most ``timeout`` seconds) for the thread to end; True if it ended."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def is_alive(self) -> bool:
        """Whether the thread is still running."""
        return self._thread.is_alive()

    def on_thread(self) -> bool:
        """Whether the caller runs on this worker's thread."""
        return threading.get_ident() == self.ident

    def __repr__(self) -> str:
        return f"Worker({self.name!r})"
