"""InfkernFinder: which operator a run is stuck in; GlobalInfkernFinder; fast_signal_hander."""

from __future__ import annotations

import atexit
import collections
import logging
import os
import queue
import signal
import threading
import weakref
from collections.abc import Callable

import numpy as np

from ..errors import ArgumentError, MegBrainError
from .base import Observer, PluginBase, describe_var

_log = logging.getLogger("megbrain")  # set_logger forwards its records

__all__ = [
    "InfkernFinder",
    "InfkernFinderInputValueRec",
    "GlobalInfkernFinder",
    "fast_signal_hander",
]

InfkernFinderInputValueRec = collections.namedtuple(
    "InfkernFinderInputValueRec", ["var_name", "var_id", "run_id", "value"]
)


class _FinderObserver(Observer):
    def __init__(self, record_input_value: bool):
        self.record = record_input_value
        self.func_ref = None
        self.part = 0
        self.run_id = 0  # runs of the current function, 1 for the first
        self.started: dict = {}  # opr -> run id of its latest start
        self.finished: dict = {}  # opr -> run id of its latest finish
        self.running: dict = {}  # comp node -> operator started last (None once finished)
        self.values: dict = {}  # var -> (run id, copy of its value)
        self.oprs_by_id: dict = {}

    def on_run_start(self, func, part: int) -> None:
        if self.func_ref is None or self.func_ref() is not func:
            self.func_ref = weakref.ref(func)
            self.run_id = 0
            self.started, self.finished = {}, {}
            for o in func.iter_opr_seq():
                self.oprs_by_id[o.id] = o
        self.part = part
        self.run_id += 1
        self.running = {}

    def wrap_step(self, func, opr, fn: Callable[[], None], value_of) -> Callable[[], None]:
        ob, cn, outs = self, opr.comp_node, opr.outputs
        self.oprs_by_id[opr.id] = opr

        def step():
            if not ob.active:
                return fn()
            run = ob.run_id
            ob.started[opr] = run
            ob.running[cn] = opr
            fn()
            ob.finished[opr] = run
            if ob.running.get(cn) is opr:
                ob.running[cn] = None
            if ob.record:
                for v in outs:
                    a = value_of(v)
                    ob.values[v] = (run, None if a is None else np.array(a, copy=True))

        return step


class InfkernFinder(PluginBase):
    """Find the operator a run of a function compiled in ``comp_graph`` is stuck in.

    Each operator's start and finish are recorded per run. :meth:`write_to_file` writes
    the state of every operator of the latest run and returns the id of the first one
    that has not finished (or None when the run completed), and :meth:`running` tells
    which operator each comp node started last and has not finished: the one executing
    now. (The reference waits for device events; our kernels run on the host, so the
    operator executing is the one that never finished.)

    Only functions compiled after the finder was created are observed (see
    :class:`~megbrain.plugin.base.PluginBase`).

    Parameters
    ----------
    comp_graph:
        The graph to observe.
    record_input_value:
        Whether to keep a copy of every operator output of the latest run, for
        :meth:`get_input_values`.
    """

    def __init__(self, comp_graph, record_input_value: bool):
        super().__init__(comp_graph, _FinderObserver(bool(record_input_value)))

    def running(self) -> dict:
        """``{comp node name: (operator id, name, type)}`` of the operators started and not
        finished in the latest run, one per comp node at most."""
        return {
            str(cn): (o.id, o.name, o.type_name)
            for cn, o in list(self._observer.running.items())
            if o is not None
        }

    def _seq(self):
        ob = self._observer
        func = ob.func_ref() if ob.func_ref is not None else None
        if func is None:
            return [], None
        seq = list(func.iter_opr_seq())
        bounds = getattr(func, "part_bounds", None)
        if bounds:
            start, end = bounds[ob.part]
            seq = seq[start:end]
        return seq, func

    def write_to_file(self, fpath) -> int | None:
        """Write the execution state of the latest run to the text file ``fpath``.

        Returns
        -------
        int or None
            The id of the first operator of the run that has not finished, or None when
            every operator finished (or nothing ran yet).
        """
        ob = self._observer
        seq, _ = self._seq()
        run = ob.run_id
        started, finished = dict(ob.started), dict(ob.finished)
        bad = None
        lines = [f"InfkernFinder: run_id={run}"]
        for cn, (oid, name, tname) in sorted(self.running().items()):
            lines.append(f"running on {cn}: opr {tname}{{{name}}} id={oid}")
        for idx, o in enumerate(seq):
            s, f = started.get(o, 0), finished.get(o, 0)
            if f == run:
                state = "done"
            elif s == run:
                state = "__waiting__"
            else:
                state = "__unrec__"
            if state != "done" and bad is None:
                bad = o
            lines.append(f"#{idx}: opr {o.type_name}{{{o.name}}} id={o.id}")
            lines.append(f" before exec:\n  {o.comp_node}:{state},run_id={s}")
            lines.append(" used outputs:")
            for v in o.outputs:
                lines.append(f"  {state} {describe_var(v)}")
        with open(fpath, "w") as fout:
            fout.write("\n".join(lines) + "\n")
        return None if bad is None else bad.id

    def get_input_values(self, opr_id: int) -> list:
        """The recorded values of the inputs of operator ``opr_id`` in the latest run.

        Returns
        -------
        list of InfkernFinderInputValueRec
            ``(var_name, var_id, run_id, value)`` per input; ``value`` is None (and
            ``run_id`` 0) where no value was recorded.
        """
        ob = self._observer
        if not ob.record:
            raise MegBrainError(
                "InfkernFinder.get_input_values: the finder was created with "
                "record_input_value=False"
            )
        opr = ob.oprs_by_id.get(opr_id)
        if opr is None:
            raise ArgumentError(
                f"InfkernFinder.get_input_values: no operator with id {opr_id!r} was run by "
                "an observed function"
            )
        out = []
        for v in opr.inputs:
            run, val = ob.values.get(v, (0, None))
            out.append(InfkernFinderInputValueRec(v.name, v.id, run, val))
        return out

    def __repr__(self) -> str:
        return f"InfkernFinder(graph={self.comp_graph!r})"


# ---- signals -------------------------------------------------------------------------------
class _FastSignal:
    """Run signal callbacks on a dedicated thread: Python's handler (always on the main
    thread, between bytecodes or when a wait is interrupted) only queues the signal."""

    def __init__(self):
        self.handlers: dict[int, Callable[[], None]] = {}
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()

    def _worker(self) -> None:
        while True:
            signum = self.queue.get()
            if signum is None:
                return
            cb = self.handlers.get(signum)
            if cb is None:
                continue
            try:
                cb()
            except Exception:  # noqa: BLE001 - a handler must not kill the worker
                _log.exception(f"error calling signal handler for {signum}")

    def register_handler(self, signum: int, cb: Callable[[], None]) -> None:
        with self.lock:
            if self.thread is None:
                self.thread = threading.Thread(target=self._worker, name="fastsgl", daemon=True)
                self.thread.start()
            self.handlers[signum] = cb
        signal.signal(signum, lambda s, _frame: self.queue.put(s))

    def shutdown(self) -> None:
        with self.lock:
            if self.thread is None:
                return
            self.queue.put(None)
            self.thread.join(timeout=5)
            self.thread = None
            self.handlers.clear()


_fast_signal = _FastSignal()
atexit.register(_fast_signal.shutdown)


def fast_signal_hander(signum: int, callback: Callable[[int], None]) -> None:
    """Register ``callback(signum)`` for signal ``signum``, run on a dedicated thread.

    The reference bypasses Python's signal handling in C++; here Python's handler (run on
    the main thread as soon as it executes bytecode or its blocking wait is interrupted)
    only hands the signal to the ``fastsgl`` thread, which calls ``callback``. Errors of
    the callback are logged. The name keeps the reference's spelling.
    """

    def wrapped():
        callback(signum)

    _fast_signal.register_handler(signum, wrapped)


class GlobalInfkernFinder:
    """Keep an :class:`InfkernFinder` per registered graph when the environment variable
    ``MGB_DBG_INFKERN_FINDER`` is ``1`` (or ``2``: also record input values); on
    ``SIGUSR1`` an interactive shell (IPython's, or :mod:`code`'s without it) opens with
    the finders in ``f``. The registered graphs are never freed.
    """

    _signal = signal.SIGUSR1
    _registry: list = []
    _shell_maker = None

    @classmethod
    def add_graph(cls, comp_graph) -> InfkernFinder | None:
        """Register ``comp_graph``; returns its finder, or None when the environment
        variable is not set."""
        enabled = os.getenv("MGB_DBG_INFKERN_FINDER")
        if not enabled:
            return None
        if enabled not in ("1", "2"):
            raise ArgumentError(
                "MGB_DBG_INFKERN_FINDER must be either 1 or 2, indicating whether to record "
                f"input values; got {enabled!r}"
            )
        finder = InfkernFinder(comp_graph, enabled == "2")
        _log.warning(
            f"interactive InfkernFinder {finder} registered to graph {comp_graph}; the graph "
            "would never be reclaimed. You can enter the interactive debug session by "
            f'executing "kill -{int(cls._signal)} {os.getpid()}". '
            f"record_input_value={enabled == '2'}"
        )
        if not cls._registry:
            fast_signal_hander(cls._signal, cls._on_signal)
        cls._registry.append(finder)
        return finder

    @classmethod
    def _on_signal(cls, signum) -> None:
        header = (
            "Enter interactive InfkernFinder session; the registered finder objects can be "
            "found in variable f"
        )
        try:
            from IPython.terminal.embed import InteractiveShellEmbed
        except ImportError:
            import code

            code.interact(banner=header, local={"f": cls._registry})
            return
        InteractiveShellEmbed()(header=header, local_ns={"f": cls._registry})
