"""``mgb.config``: device mapping, graph options and per-graph scopes (SPEC.md 2.7)."""

from __future__ import annotations

import contextlib
import sys

from ..device import comp_node as _cn
from ..errors import MegBrainError
from ..graph import OPR_REGISTRY
from ..opr.base import as_var

__all__ = [
    "set_device_map",
    "set_default_device",
    "set_default_device_type",
    "get_device_count",
    "parse_locator",
    "set_comp_graph_option",
    "comp_graph_is_eager",
    "add_extra_vardep",
    "opr_priority_scope",
    "exc_opr_tracker_scope",
    "get_opr_tracker",
    "set_opr_sublinear_memory_endpoint",
    "dump_registered_oprs",
    "max_size_t",
    "is_compiled_with_cuda",
    "LOWEST_PRIORITY",
    "HIGHEST_PRIORITY",
]

LOWEST_PRIORITY = 2**31 - 1
HIGHEST_PRIORITY = -LOWEST_PRIORITY
_default_type = ["CUDA"]


def set_device_map(logical_dev, physical_dev, device_type=None) -> None:
    """Map logical device ``logical_dev`` to ``physical_dev`` (ints or strings like 'gpu3')."""
    _cn.set_device_map(device_type or _default_type[0], logical_dev, physical_dev)


def set_default_device(physical_dev, device_type=None) -> None:
    """Map ``xpux`` to ``physical_dev``; a 'cpuN'/'gpuN' string also switches the type."""
    if isinstance(physical_dev, str) and physical_dev[:3] in ("cpu", "gpu"):
        _default_type[0] = "CPU" if physical_dev.startswith("cpu") else "CUDA"
    _cn.set_default_device(physical_dev, device_type)


def set_default_device_type(device_type) -> None:
    """Set the device type ``xpu`` resolves to."""
    _default_type[0] = device_type
    _cn.set_unspec_device_type(device_type)


def get_device_count(device_type="xpu", warn=True) -> int:
    return _cn.get_device_count(device_type, warn)


def parse_locator(device_name: str) -> tuple:
    """``(type, dev, stream)`` of a locator string."""
    return tuple(_cn.parse_locator(device_name))


def set_comp_graph_option(comp_graph, name: str, val):
    """Set a graph option (SPEC.md section 3); returns the old value."""
    return comp_graph.options.set(name, val)


def comp_graph_is_eager(comp_graph) -> bool:
    return bool(comp_graph.options.eager_evaluation)


def add_extra_vardep(var, dep) -> None:
    """Whenever ``var`` is computed by a function, ``dep`` is computed too."""
    v, d = as_var(var), as_var(dep)
    if v.graph is not d.graph:
        raise MegBrainError("add_extra_vardep: the vars belong to different graphs")
    v.graph.options.extra_vardeps.setdefault(v, []).append(d)


def _scoped_hook(comp_graph, hook):
    @contextlib.contextmanager
    def scope():
        comp_graph.opr_insert_hooks.append(hook)
        try:
            yield
        finally:
            comp_graph.opr_insert_hooks.remove(hook)

    return scope()


def opr_priority_scope(comp_graph, priority: int):
    """Operators inserted in the scope get ``priority`` (or min(old, priority) if set)."""

    def hook(opr):
        opr.priority = priority if opr.priority == 0 else min(opr.priority, priority)

    return _scoped_hook(comp_graph, hook)


def exc_opr_tracker_scope(comp_graph, tracker):
    """Operators inserted in the scope carry ``tracker``; their errors expose it."""

    def hook(opr):
        opr.tracker = tracker

    return _scoped_hook(comp_graph, hook)


def get_opr_tracker(cg, var_id: int):
    """``(msg, tracker, grad_tracker)`` of the operator of var ``var_id``, or None."""
    v = cg.var_by_id(var_id)
    if v is None or v.owner.tracker is None:
        return None
    return (v.owner.name, v.owner.tracker, None)


def set_opr_sublinear_memory_endpoint(var) -> None:
    """Sublinear memory splits only at operators marked by this."""
    v = as_var(var)
    v.graph.user_data.setdefault("__sublinear_endpoints__", set()).add(v.owner)


def dump_registered_oprs() -> dict:
    """``{id: name}`` of every registered operator type."""
    return dict(enumerate(sorted(OPR_REGISTRY)))


def max_size_t() -> int:
    return sys.maxsize * 2 + 1


def is_compiled_with_cuda() -> bool:
    return False
