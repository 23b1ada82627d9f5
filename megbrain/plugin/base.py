"""What every plugin shares: attaching to a graph, and describing vars and values.

A plugin attaches an *observer* to ``graph.plugins``. Each function compiled in that graph
afterwards keeps the observers it was compiled with and, only then, runs each operator's
bound step through ``observer.wrap_step(func, opr, fn, value_of)`` (the executor's
contract, see :class:`megbrain.graph.executor.AsyncExecutable`); ``on_run_start(func,
part)`` is called at the start of each run. A function compiled with no plugin attached runs
its steps unwrapped.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import numpy as np

from ..dtype import dtype_name
from ..errors import ArgumentError
from ..graph import ComputingGraph
from ..graph.operator import fmt_shape

__all__ = ["PluginBase", "Observer", "describe_var", "value_stats", "is_float_var"]

_FLOAT_NAMES = frozenset({"Float32", "Float16", "BFloat16"})


class Observer:
    """The object a plugin puts in ``graph.plugins``; it never refers to the plugin, so
    dropping the plugin detaches it. ``active`` is cleared on detach: steps already wrapped
    then run as if unobserved."""

    active = True

    def wrap_step(self, func, opr, fn: Callable[[], None], value_of) -> Callable[[], None]:
        return fn

    def on_run_start(self, func, part: int) -> None:
        pass

    def close(self) -> None:
        """Called once when the plugin is detached."""


class PluginBase:
    """Base of the plugins: attaches an :class:`Observer` to ``comp_graph``.

    The plugin keeps its graph alive while it lives. It observes every function compiled
    in that graph after it was created, until it is detached (:meth:`detach`, or dropping
    the last reference to it). Functions compiled before it was attached are not observed,
    nor are the separate graphs that ``compile(copy=True)`` (with a current function) and
    eager graphs compile into, nor operators evaluated eagerly at insertion.
    """

    _observer: Observer | None = None

    def __init__(self, comp_graph, observer: Observer):
        if not isinstance(comp_graph, ComputingGraph):
            raise ArgumentError(
                f"{type(self).__name__}: comp_graph must be a CompGraph, got "
                f"{type(comp_graph).__name__}"
            )
        self._comp_graph = comp_graph
        self._observer = observer
        comp_graph.plugins.append(observer)
        # the graph's list must not keep a dropped plugin attached
        self._finalizer = weakref.finalize(self, _detach, comp_graph.plugins, observer)

    @property
    def comp_graph(self):
        """The graph this plugin is attached to."""
        return self._comp_graph

    @property
    def attached(self) -> bool:
        """Whether the plugin still observes its graph."""
        return self._finalizer.alive

    def detach(self) -> None:
        """Stop observing: functions compiled from now on are not observed, and those
        already compiled stop reporting to this plugin. Idempotent."""
        self._finalizer()


def _detach(plugins: list, observer: Observer) -> None:
    observer.active = False
    for i, ob in enumerate(plugins):
        if ob is observer:
            del plugins[i]
            break
    observer.close()


def is_float_var(var) -> bool:
    """Whether ``var`` holds floating-point values (float32, float16, bfloat16)."""
    return dtype_name(var.dtype) in _FLOAT_NAMES


def describe_var(var, value=None) -> str:
    """``var 'x' (id 3, Float32 {2,3}, owner Elemwise 'x')``; the shape of ``value`` if
    given, else the static shape."""
    if value is not None:
        shape = fmt_shape(np.shape(value))
    else:
        try:
            from ..graph import static_shape

            shape = fmt_shape(static_shape(var))
        except Exception:  # noqa: BLE001 - describing must not raise
            shape = "<unknown>"
    owner = var.owner
    return (
        f"var {var.name!r} (id {var.id}, {dtype_name(var.dtype)} {shape}, owner "
        f"{owner.type_name} {owner.name!r})"
    )


def value_stats(value) -> str:
    """``min=.. max=.. nan=.. inf=..`` of an array (what a range error reports of inputs)."""
    if value is None:
        return "<no value>"
    a = np.asarray(value)
    if a.size == 0:
        return "<empty>"
    if a.dtype.kind == "b":
        a = a.astype(np.int8)
    try:
        f = a.astype(np.float64)
    except (TypeError, ValueError):
        return "<not numeric>"
    finite = np.isfinite(f)
    nan = int(np.isnan(f).sum())
    inf = int(f.size - finite.sum() - nan)
    if finite.any():
        fin = f[finite]
        rng = f"min={fin.min():.6g} max={fin.max():.6g}"
    else:
        rng = "min=N/A max=N/A"
    return f"{rng} nan={nan} inf={inf}"
