"""CompGraphProfiler: per-operator times of the functions compiled in a graph."""

from __future__ import annotations

import collections
import json
import threading
import time
import weakref
from collections.abc import Callable

import numpy as np

from ..dtype import dtype_name
from ..errors import ArgumentError
from ..graph import static_shape
from .base import Observer, PluginBase
from .footprint import opr_footprint

__all__ = ["CompGraphProfiler"]


class _ProfileObserver(Observer):
    def __init__(self, max_events: int):
        self.t_origin = time.perf_counter()
        #: (opr, comp node, thread ident, start, end, run index), seconds, in the order
        #: each thread ran them; the oldest are dropped beyond ``max_events``
        self.events: collections.deque = collections.deque(maxlen=max_events)
        #: run index -> (function ref, part, start time)
        self.runs: list[tuple] = []
        self.footprints: dict = {}  # opr -> footprint of its latest shapes
        self.func_ref = None  # the function of the latest run
        self.func_first_run = 0  # index of the first run of that function
        self.run = -1

    def on_run_start(self, func, part: int) -> None:
        t0 = time.perf_counter()
        self.run += 1
        if self.func_ref is None or self.func_ref() is not func:
            # a new function: the JSON result describes only its runs (as the reference
            # clears its records when the graph compiles a new sequence)
            self.func_ref = weakref.ref(func)
            self.func_first_run = self.run
        self.runs.append((self.func_ref, part, t0))

    def wrap_step(self, func, opr, fn: Callable[[], None], value_of) -> Callable[[], None]:
        ob, cn, perf = self, opr.comp_node, time.perf_counter
        append, get_ident = self.events.append, threading.get_ident
        footprints = self.footprints
        ins, outs = opr.inputs, opr.outputs

        def step():
            if not ob.active:
                return fn()
            t0 = perf()
            fn()
            t1 = perf()
            append((opr, cn, get_ident(), t0, t1, ob.run))
            if opr not in footprints:
                footprints[opr] = _footprint(opr, ins, outs, value_of)

        return step

    def with_dispatch(self, events=None) -> list[tuple]:
        """``(opr, cn, ident, dispatch, start, end, run)`` per event: ``dispatch`` is the
        end of the previous operator of the same comp node in the same run, or the run's
        start for its first one."""
        events = list(self.events) if events is None else events
        starts = {k: r[2] for k, r in enumerate(self.runs)}
        last: dict = {}
        out = []
        for opr, cn, ident, t0, t1, run in events:
            d = last.get((run, cn))
            if d is None:
                d = starts.get(run, t0)
            last[(run, cn)] = t1
            out.append((opr, cn, ident, d, t0, t1, run))
        return out


def _shape_of(var, value_of):
    a = value_of(var)
    if a is not None:
        return tuple(np.shape(a))
    try:
        return static_shape(var)
    except Exception:  # noqa: BLE001 - unknown shapes are reported as None
        return None


def _footprint(opr, ins, outs, value_of) -> dict:
    return opr_footprint(
        opr, [_shape_of(v, value_of) for v in ins], [_shape_of(v, value_of) for v in outs]
    )


def _thread_names() -> dict[int, str]:
    return {t.ident: t.name for t in threading.enumerate()}


class CompGraphProfiler(PluginBase):
    """Profile the operators run by the functions compiled in ``comp_graph``.

    Each operator's step is timed on the thread that runs it: the caller's thread for a
    function on one comp node, the comp node's worker thread when a function spans several
    (``async_exec_level``). Per comp node the profiler also records when the operator could
    have been dispatched (the end of that node's previous operator in the run, or the run's
    start), so ``kern - start`` is the time it waited for inputs from other comp nodes.

    Only functions compiled after the profiler was created are observed (see
    :class:`~megbrain.plugin.base.PluginBase`: not the separate graphs that
    ``compile(copy=True)`` and eager graphs compile into); dropping the profiler or calling
    :meth:`detach` stops the observation.

    Parameters
    ----------
    comp_graph:
        The graph to observe.
    max_events:
        How many operator runs to keep (the oldest are dropped first; about 100 bytes
        each): the Chrome trace and :meth:`top_operators` cover what is kept.

    Examples
    --------
    >>> prof = CompGraphProfiler(graph)          # doctest: +SKIP
    >>> func = graph.compile(...); func(...)      # doctest: +SKIP
    >>> prof.get()["profiler"]["host"]            # doctest: +SKIP
    >>> prof.write_chrome_trace("trace.json")     # doctest: +SKIP
    """

    def __init__(self, comp_graph, *, max_events: int = 1_000_000):
        if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 1:
            raise ArgumentError(
                f"CompGraphProfiler: max_events must be a positive integer, got {max_events!r}"
            )
        super().__init__(comp_graph, _ProfileObserver(max_events))

    # ---- the reference's result ----------------------------------------------------------
    def _current_events(self) -> tuple[object, list]:
        """The function of the latest run and the latest record of each of its operators."""
        ob = self._observer
        func = ob.func_ref() if ob.func_ref is not None else None
        latest: dict = {}
        if func is not None:
            first = ob.func_first_run
            for ev in ob.with_dispatch():
                if ev[6] >= first:
                    latest[ev[0]] = ev
        if func is None:
            func = self.comp_graph.current_exec
        return func, list(latest.values())

    def to_json(self) -> dict:
        """The reference's ``to_json_full``: ``{"graph_exec": ..., "profiler": ...}``.

        ``profiler`` has ``device`` (operator id -> comp node -> ``start``/``kern``/``end``,
        seconds since the first run of the profiled function started; ``start`` is when the
        operator could be dispatched), ``host`` (operator id -> thread name -> the same
        times, seconds since the profiler was created), ``opr_footprint`` (operator id ->
        ``computation``, ``memory``, ``in_shapes``, ``out_shapes``, ``param``) and
        ``opr_internal_pf`` (empty). Each operator's latest run is reported. ``graph_exec``
        describes the function: ``operator``, ``var``, ``mem_chunk`` and ``comp_seq``.
        """
        ob = self._observer
        func, events = self._current_events()
        names = _thread_names()
        device, host, fps = {}, {}, {}
        sot = ob.runs[ob.func_first_run][2] if events else 0.0
        for opr, cn, ident, dispatch, t0, t1, _ in events:
            oid = str(opr.id)
            device.setdefault(oid, {})[str(cn)] = {
                "start": dispatch - sot,
                "kern": t0 - sot,
                "end": t1 - sot,
            }
            host.setdefault(oid, {})[names.get(ident, f"thread-{ident}")] = {
                "start": t0 - ob.t_origin,
                "kern": t0 - ob.t_origin,
                "end": t1 - ob.t_origin,
            }
            fp = ob.footprints.get(opr)
            if fp is not None:
                fps[oid] = fp
        return {
            "graph_exec": _graph_exec_json(func, ob.footprints),
            "profiler": {
                "device": device,
                "host": host,
                "opr_footprint": fps,
                "opr_internal_pf": {},
            },
        }

    def _get_result(self) -> str:
        """The result as JSON text (the reference binding's ``_get_result``)."""
        return json.dumps(self.to_json())

    def get(self) -> dict:
        """The profiling result of the latest function run, as the reference's
        ``get()``: the parsed JSON of :meth:`to_json` (its ``"profiler"`` entry has the
        times)."""
        return json.loads(self._get_result())

    def write_json(self, fobj) -> None:
        """Write the result as JSON text to ``fobj`` (a file object or a path)."""
        if isinstance(fobj, str):
            with open(fobj, "w") as fout:
                return self.write_json(fout)
        fobj.write(self._get_result())

    # ---- beyond the reference -------------------------------------------------------------
    def clear(self) -> None:
        """Forget every record (times and footprints); later runs are recorded anew."""
        ob = self._observer
        ob.events.clear()
        ob.runs.clear()
        ob.footprints.clear()
        ob.func_ref = None
        ob.run = -1

    def chrome_trace(self) -> dict:
        """Every recorded operator run in the Chrome trace event format.

        One ``"ph": "X"`` (complete) event per operator per run, ``ts``/``dur`` in
        microseconds since the profiler was created; ``pid`` is the comp node (named by a
        ``process_name`` metadata event), ``tid`` the thread that ran the operator (named
        by ``thread_name``). ``args`` has the operator id, type, inputs, outputs, the run
        index, the time it waited after it could be dispatched (``wait_us``), its
        footprint (``memory`` bytes, shapes) and, for a convolution, the kernel ``algorithm``
        its execution policy chose.
        """
        ob = self._observer
        names = _thread_names()
        pids: dict = {}
        tids: dict = {}
        meta, out = [], []
        for opr, cn, ident, dispatch, t0, t1, run in ob.with_dispatch():
            pid = pids.get(cn)
            if pid is None:
                pid = pids[cn] = len(pids)
                meta.append(_meta("process_name", pid, None, name=str(cn)))
                meta.append(_meta("process_sort_index", pid, None, sort_index=pid))
            key = (pid, ident)
            tid = tids.get(key)
            if tid is None:
                tid = tids[key] = len(tids)
                tname = names.get(ident, f"thread-{ident}")
                meta.append(_meta("thread_name", pid, tid, name=tname))
            fp = ob.footprints.get(opr) or {}
            out.append(
                {
                    "name": opr.name,
                    "cat": opr.type_name,
                    "ph": "X",
                    "ts": (t0 - ob.t_origin) * 1e6,
                    "dur": (t1 - t0) * 1e6,
                    "pid": pid,
                    "tid": tid,
                    "args": {
                        "id": opr.id,
                        "type": opr.type_name,
                        "inputs": [v.name for v in opr.inputs],
                        "outputs": [v.name for v in opr.outputs],
                        "run": run,
                        "wait_us": (t0 - dispatch) * 1e6,
                        "memory": fp.get("memory"),
                        "in_shapes": fp.get("in_shapes"),
                        "out_shapes": fp.get("out_shapes"),
                    },
                }
            )
            algo = getattr(opr, "chosen_algorithm", None)  # the convolution kernel chosen
            if algo is not None:
                out[-1]["args"]["algorithm"] = algo
        return {
            "traceEvents": meta + out,
            "displayTimeUnit": "ms",
            "otherData": {"producer": "megbrain.plugin.CompGraphProfiler"},
        }

    def write_chrome_trace(self, path) -> None:
        """Write :meth:`chrome_trace` to ``path`` (a path or a text file object); open it in
        chrome://tracing or https://ui.perfetto.dev."""
        if isinstance(path, str) or hasattr(path, "__fspath__"):
            with open(path, "w") as fout:
                return self.write_chrome_trace(fout)
        json.dump(self.chrome_trace(), path)

    def top_operators(self, n: int = 10) -> list[dict]:
        """The ``n`` operators with the most total time over every recorded run.

        Returns
        -------
        list of dict
            ``name``, ``type``, ``id``, ``calls``, ``total`` (seconds), ``mean`` (seconds)
            and ``share`` (of the time of all recorded operators), largest total first.
        """
        agg: dict = {}
        for opr, _cn, _ident, t0, t1, _run in list(self._observer.events):
            rec = agg.setdefault(opr, [0, 0.0])
            rec[0] += 1
            rec[1] += t1 - t0
        tot = sum(r[1] for r in agg.values()) or 1.0
        rows = sorted(agg.items(), key=lambda kv: -kv[1][1])[:n]
        return [
            {
                "name": o.name,
                "type": o.type_name,
                "id": o.id,
                "calls": c,
                "total": t,
                "mean": t / c,
                "share": t / tot,
            }
            for o, (c, t) in rows
        ]


def _meta(what: str, pid: int, tid: int | None, **args) -> dict:
    """A Chrome trace metadata event (``ph`` M) naming a process or thread."""
    ev = {"name": what, "ph": "M", "pid": pid, "args": args}
    if tid is not None:
        ev["tid"] = tid
    return ev


def _graph_exec_json(func, footprints: dict) -> dict:
    """The reference's ``ComputingSequence::to_json``: the function's operators (and the
    owners of their inputs), vars, memory chunks (none: our plan is not exported here)
    and comp seq, keyed by id strings."""
    if func is None:
        return {"operator": {}, "var": {}, "mem_chunk": {}, "comp_seq": []}
    seq = list(func.iter_opr_seq())
    oprs, order = {}, []
    stack = list(reversed(seq))
    while stack:
        o = stack.pop()
        if o.id in oprs:
            continue
        oprs[o.id] = o
        order.append(o)
        stack.extend(v.owner for v in o.inputs if v.owner.id not in oprs)
    operators, varz = {}, {}
    for o in order:
        param = getattr(o, "param", None)
        operators[str(o.id)] = {
            "node_type": "operator",
            "id": str(o.id),
            "name": o.name,
            "type": o.type_name,
            "input": [str(v.id) for v in o.inputs],
            "output": [str(v.id) for v in o.outputs],
            "param": param.to_json() if hasattr(param, "to_json") else None,
        }
        fp = footprints.get(o)
        for i, v in enumerate(o.outputs):
            shape = None
            if fp is not None and fp["out_shapes"][i] is not None:
                shape = fp["out_shapes"][i]
            else:
                try:
                    s = static_shape(v)
                    shape = list(s) if s is not None else None
                except Exception:  # noqa: BLE001 - unknown shapes are None
                    shape = None
            varz[str(v.id)] = {
                "node_type": "var",
                "id": str(v.id),
                "name": v.name,
                "shape": shape,
                "dtype": dtype_name(v.dtype),
                "comp_node": str(v.comp_node),
                "owner_opr": str(o.id),
            }
    return {
        "operator": operators,
        "var": varz,
        "mem_chunk": {},
        "comp_seq": [str(o.id) for o in seq],
    }
