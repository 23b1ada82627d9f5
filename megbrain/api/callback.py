"""Output callbacks: value proxies, eager/lazy callback wrappers,
``copy_output``, ``callback_lazycopy`` and ``FuncOutputSaver``."""

from __future__ import annotations

import threading
import time
import warnings
from abc import ABC, abstractmethod

import numpy as np

from ..device.worker import Worker
from ..errors import MegBrainError, mark_user_exception, user_exception_note
from ..graph.value_proxy import CompGraphCallbackValueProxy, copy_into_buffer

__all__ = [
    "CompGraphCallbackValueProxy",
    "callback_lazycopy",
    "copy_output",
    "FuncOutputSaver",
    "SharedNDLazyInitializer",
    "CallbackWorker",
    "make_graph_callback",
]


class callback_lazycopy:  # noqa: N801 - reference name
    """Mark a compile callback as lazy: no eager device-to-host copy, called inline."""

    def __init__(self, func):
        if not callable(func):
            raise TypeError(f"callback_lazycopy needs a callable, got {func!r}")
        self.func = func

    def __call__(self, *args, **kwargs):
        return self.func(*args, **kwargs)


class copy_output:  # noqa: N801 - reference name
    """An outspec item whose value goes into the function's return value."""

    def __init__(self, symvar, *, borrow_mem: bool = False):
        self.symvar = symvar
        self.borrow_mem = borrow_mem


class FuncOutputSaver:
    """Stores the value of an output on every run; :meth:`get` returns it."""

    def __init__(self, borrow_mem: bool = False):
        self.borrow_mem = borrow_mem
        self._value = None
        self._buf = None

    def __call__(self, v) -> None:
        self._value = v.get_value(borrow_mem=self.borrow_mem)

    def save_array(self, arr: np.ndarray) -> None:
        """Fast path used by the function itself: one copy straight from device memory."""
        if self.borrow_mem:
            self._value = self._buf = copy_into_buffer(self._buf, arr)
        else:
            self._value = arr.copy()

    def get(self) -> np.ndarray:
        if self._value is None:
            raise MegBrainError("output value not available (maybe due to unwaited async func)")
        return self._value


class SharedNDLazyInitializer(ABC):
    """Supplies the shape and (later) the value of a SharedND on first use."""

    @abstractmethod
    def get_shape(self) -> tuple:
        """The shape of the value."""

    @abstractmethod
    def get_value(self) -> np.ndarray:
        """The value."""


class CallbackWorker:
    """The per-function thread running eager-copy callbacks (``AsyncExec::Core`` worker)."""

    def __init__(self, name: str):
        self._name = name
        self._worker: Worker | None = None
        self._pending = 0
        self._cv = threading.Condition()
        self.error: BaseException | None = None

    def dispatch(self, fn, *args) -> None:
        if self._worker is None:
            self._worker = Worker(f"mgb-cb-{self._name}")
        with self._cv:
            self._pending += 1
        self._worker.put((self._run, (fn, args)))

    def _run(self, fn, args):
        try:
            fn(*args)
        except BaseException as exc:  # noqa: BLE001 - surfaced by wait()
            if self.error is None:
                self.error = exc
        finally:
            with self._cv:
                self._pending -= 1
                self._cv.notify_all()

    def wait(self) -> None:
        """Drain: block until every dispatched callback has finished."""
        if not self._pending:
            return
        t0 = time.monotonic()
        with self._cv:
            while self._pending:
                self._cv.wait(timeout=2.0)
                if self._pending and time.monotonic() - t0 > 2.0:
                    warnings.warn(
                        f"wait for callbacks for more than {time.monotonic() - t0:.3f} secs",
                        stacklevel=2,
                    )

    def take_error(self) -> BaseException | None:
        err, self.error = self.error, None
        return err

    def on_thread(self) -> bool:
        """Whether the caller is a callback running on this worker (waiting would deadlock)."""
        return self._worker is not None and self._worker.on_thread()

    def stop(self) -> None:
        if self._worker is not None:
            self._worker.stop()
            self._worker = None


def make_graph_callback(user_cb, var, worker: CallbackWorker, nr_vars: int = 1):
    """Wrap a user callback into the ``f(array)`` the graph executor calls.

    ``callback_lazycopy`` callbacks run inline with a proxy over the device value; others
    copy the value eagerly and run on ``worker``. An exception of the callback reaches the
    caller of ``wait()`` as it is, with a note naming the var and its operator (and the
    operator's tracker, if any).
    """
    lazy = isinstance(user_cb, callback_lazycopy)
    fn = user_cb.func if lazy else user_cb
    proxy = CompGraphCallbackValueProxy(var.comp_node)
    opr = var.owner
    where = (
        f"raised by the output callback of var {var.name!r} (operator {opr.type_name} {opr.name!r})"
    )

    def call_py(p):
        try:
            fn(p)
        except BaseException as exc:
            mark_user_exception(exc, user_exception_note(where, opr.tracker))
            raise
        finally:
            p.on_finished()

    if lazy:

        def graph_cb(arr):
            proxy.setup(arr, False)
            call_py(proxy)

    else:

        def graph_cb(arr):
            proxy.setup(arr, True)
            worker.dispatch(call_py, proxy)

    return graph_cb
