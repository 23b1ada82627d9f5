"""The exec environment of a compiled function: its plan bound into steps, and their dispatch.

Binding turns a :class:`~megbrain.graph.mem_planner.Plan` into one list of closures per part
(and per comp node, with an Event per var read across nodes, when the function runs
threaded); a threaded run hands each node's list to its worker and reports the first error
naming the operator that raised it.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable

from ..device.worker import dispatch_lock
from ..errors import MegBrainError, is_user_exception
from ..kernels import workspace
from .comp_seq import data_inputs
from .mem_planner import Plan, bound_inputs, static_input_indices
from .var import VarNode

__all__ = ["ExecEnv"]


class ExecEnv:
    """Binds the plans of one compiled function and dispatches its threaded runs.

    Parameters
    ----------
    func : AsyncExecutable
        The function: its comp seq and parts, dynamic slots, plugins and threading mode,
        and the run state (error, next part, pending nodes) a threaded run reports to.
    pos_of : callable
        ``var -> position`` of its operator in the comp seq (-1 outside it).
    """

    def __init__(self, func, pos_of: Callable[[VarNode], int]):
        self.func = func
        self.graph = func.graph
        self.seq = func.seq
        self.parts = func.parts
        self.part_bounds = func.part_bounds
        self.pos_of = pos_of
        self._slots = func._slots
        self._observers = func._observers
        self._threaded = func._threaded
        self._lock = threading.Lock()
        self._abort = False
        self._t0 = self._t_end = 0.0

    def bind(self, plan: Plan) -> None:
        """Bind every operator into a step list per part (and per comp node if threaded)."""
        arrays, slots = plan.arrays, self._slots
        plan.steps, plan.step_oprs, plan.node_steps = [], [], []
        # dynamic vars are dropped after their last reader (views keep their base alive)
        free_after: dict = {}
        nseq = len(self.seq)
        for v in plan.dynamic:
            pos = plan.last_read.get(v, -1)
            if pos < 0:
                pos = self.pos_of(v)
            if pos < nseq:
                free_after.setdefault(self.seq[pos], []).append(v)
        for k, part in enumerate(self.parts):
            start, end = self.part_bounds[k]
            callbacks: dict[VarNode, list] = {}
            early = []  # outputs computed by an earlier part: called at this part's start
            for v, cb in part:
                if cb is None:
                    continue
                if self.pos_of(v) < start:
                    early.append((v, cb))
                else:
                    callbacks.setdefault(v, []).append(cb)
            steps, step_oprs, per_node = [], [], {}

            def add(fn, opr, steps=steps, step_oprs=step_oprs, per_node=per_node):
                mask = getattr(opr, "exec_mask", None)
                if mask is not None:  # conditional execution: skipped while masked off
                    fn = _masked(fn, mask)
                steps.append(fn)
                step_oprs.append(opr)
                per_node.setdefault(opr.comp_node, []).append((fn, opr))

            for v, cb in early:
                add(self._callback_step(cb, v, plan), v.owner)
            for opr in self.seq[start:end]:
                fn = None
                if opr.outputs[0] in plan.dynamic:
                    fn = self._dynamic_step(opr, plan)
                elif opr.has_side_effect or not all(
                    plan.decisions[o][0] == "fwd" for o in opr.outputs
                ):
                    ins = bound_inputs(opr, plan)
                    outs = [arrays[o] for o in opr.outputs]
                    chunk = plan.chunks.get(opr)
                    if chunk is not None:
                        cn, off, nb = chunk
                        with workspace.allocating(
                            workspace.Carver(plan.arenas[cn][off : off + nb])
                        ):
                            fn = opr.bind(ins, outs)
                    else:
                        fn = opr.bind(ins, outs)
                if self._observers:
                    fn = _observed(self.func, plan, opr, fn)
                if fn is not None:
                    add(fn, opr)
                elif self._threaded:
                    per_node.setdefault(opr.comp_node, [])
                for out in opr.outputs:
                    for cb in callbacks.get(out, ()):
                        add(self._callback_step(cb, out, plan), opr)
                for v in free_after.get(opr, ()):
                    add(functools.partial(slots.pop, v, None), opr)
            plan.steps.append(steps)
            plan.step_oprs.append(step_oprs)
            plan.node_steps.append(per_node)
        if self._threaded:
            plan.events, plan.inline = [], []
            for k in range(len(self.parts)):
                self._add_cross_node_sync(plan, k)

    def _callback_step(self, cb, var: VarNode, plan: Plan):
        if var in plan.dynamic:
            return _slot_callback(cb, self._slots, var)
        return _static_callback(cb, plan.arrays[var])

    def _dynamic_step(self, opr, plan: Plan) -> Callable[[], None]:
        slots, arrays = self._slots, plan.arrays
        # inputs read only through static inference are fixed for the plan; the others are
        # looked up when the step runs (dynamic vars live in the slots)
        fixed = bound_inputs(opr, plan)
        static = static_input_indices(opr)
        inputs = [None if i in static else v for i, v in enumerate(opr.inputs)]

        def run():
            ins = []
            for v, a in zip(inputs, fixed):
                if v is not None:
                    a = slots.get(v)
                    if a is None:
                        a = arrays.get(v)
                ins.append(a)
            outs = opr.run_dynamic(ins)
            for v, a in zip(opr.outputs, outs):
                slots[v] = a
                v.rt_shape = a.shape

        return run

    def _add_cross_node_sync(self, plan: Plan, part: int) -> None:
        """Make each comp node wait for vars it reads from another node (one Event per var).

        A var is ready before the run when nothing in the part computes it: its operator
        has no step and reads only such vars (a shared or immutable tensor and views of
        it); its readers need no Event. A part whose work is then on one comp node runs on
        the caller's thread (``plan.inline``), unless the async level asks for threads."""
        events: dict[VarNode, threading.Event] = {}
        waits: dict = {}
        start, end = self.part_bounds[part]
        seq = self.seq[start:end]
        in_part = set(seq)
        by_opr: dict = {}
        for lst in plan.node_steps[part].values():
            for fn, opr in lst:
                by_opr.setdefault(opr, []).append(fn)
        ready = set()  # operators of the part whose outputs are ready before the run
        for opr in seq:
            if opr not in by_opr and all(
                v.owner in ready or v.owner not in in_part for v in data_inputs(opr)
            ):
                ready.add(opr)
        for opr in seq:
            for v in data_inputs(opr):
                if v.comp_node != opr.comp_node and v.owner in in_part and v.owner not in ready:
                    ev = events.setdefault(v, threading.Event())
                    waits.setdefault(opr, []).append(ev)
        node_steps: dict = {}
        for opr in seq:
            lst = node_steps.setdefault(opr.comp_node, [])
            for ev in waits.get(opr, ()):
                lst.append((_waiter(ev, self), opr))
            for fn in by_opr.get(opr, ()):
                lst.append((fn, opr))
            for o in opr.outputs:
                ev = events.get(o)
                if ev is not None:
                    lst.append((ev.set, opr))
        # the tasks a threaded run hands out, fixed here rather than filtered at every run
        tasks = [(cn, lst) for cn, lst in node_steps.items() if lst]
        plan.node_steps[part] = tasks
        plan.events.append(list(events.values()))
        plan.inline.append(len(tasks) <= 1 and not self.graph.options.async_exec_level & 0b110)

    def _run_threaded(self, plan: Plan, part: int) -> None:
        events = plan.events[part]
        for ev in events:
            ev.clear()
        self._abort = False
        t0 = time.perf_counter()
        self._t0 = t0
        self._t_end = t0
        tasks = plan.node_steps[part]
        self.func._threads_pending = [cn for cn, _ in tasks]
        task = self._node_task
        try:
            # all of a run's tasks enter the queues at once (see device.worker.dispatch_lock)
            with dispatch_lock:
                for cn, lst in tasks:
                    cn.dispatch(task, lst, events)
        except BaseException:
            # interrupted between two nodes (Ctrl-C): the tasks already queued must not wait
            # for events of tasks never queued
            self._abort = True
            for ev in events:
                ev.set()
            raise

    def _node_task(self, lst, events) -> None:
        func = self.func
        opr = None
        try:
            for fn, opr in lst:  # noqa: B007 - opr names the failing operator
                if self._abort:
                    break
                fn()
        except _Aborted:
            pass
        except BaseException as exc:  # noqa: BLE001 - surfaced by wait()
            with self._lock:
                self._abort = True
                if func._error is None:
                    func._error = self._wrap_error(opr, exc)
                func._next_part = 0
            for ev in events:
                ev.set()
        with self._lock:
            self._t_end = max(self._t_end, time.perf_counter())
            func.prev_exec_time = self._t_end - self._t0

    @staticmethod
    def _wrap_error(opr, exc: BaseException) -> BaseException:
        if is_user_exception(exc) or not isinstance(exc, Exception):
            # the user's own exception, already noted with where it was raised; or an
            # interruption (KeyboardInterrupt, SystemExit) that callers catch by its type
            return exc
        if isinstance(exc, MegBrainError) and opr is not None and opr.name in str(exc):
            if exc.tracker is None:
                exc.tracker = opr.tracker
            return exc
        if opr is None:
            return exc
        err = MegBrainError(
            f"error while executing operator {opr.type_name} {opr.name!r}: "
            f"{type(exc).__name__}: {exc}",
            tracker=opr.tracker,
        )
        err.__cause__ = exc
        return err


def _observed(func, plan: Plan, opr, fn):
    """``fn`` (None: an operator with nothing to run) wrapped by the function's plugins,
    the first attached outermost; ``value_of(var)`` gives a var's current array."""
    slots, arrays, values = func._slots, plan.arrays, plan.static_values

    def value_of(v):
        a = slots.get(v)
        if a is None:
            a = arrays.get(v)
        return values.get(v) if a is None else a

    fn = fn or _noop
    for ob in reversed(func._observers):
        fn = ob.wrap_step(func, opr, fn, value_of)
    return fn


def _noop() -> None:
    pass


def _static_callback(cb, arr):
    return functools.partial(cb, arr)  # no Python frame of its own: a call's output copy


def _slot_callback(cb, slots, var):
    return lambda: cb(slots[var])


def _masked(fn, mask):
    """``fn`` run only while ``mask.enabled`` (an ExecutionMask of opr/cond.py, set by its
    predicate operator earlier in the run); graphs without conditional execution have none."""

    def run():
        if mask.enabled:
            fn()

    return run


def _waiter(ev: threading.Event, env: ExecEnv):
    def wait():
        ev.wait()
        if env._abort:
            raise _Aborted()

    return wait


class _Aborted(Exception):
    pass
