"""Comp nodes: locators, the logical->physical device map, dispatch workers and events.

The device layer hides which array module backs a comp node: tensors, graphs and
operators use only :class:`CompNode` (and its :class:`~megbrain.device.impl.CompNodeImpl`),
so a CUDA backend is one more implementation class (see ``impl.py``).
"""

from __future__ import annotations

from .comp_node import (
    CompNode,
    _mgb_global_finalize,
    add_device_map,
    as_comp_node,
    cn_thread_local,
    del_device_map,
    finalize,
    get_device_count,
    locator_to_str,
    parse_locator,
    set_default_device,
    set_device_map,
    set_unspec_device_type,
)
from .event import Event
from .impl import (
    CPU,
    CUDA,
    DEVICE_CPU_DEFAULT,
    XPU,
    CompNodeImpl,
    CpuCompNodeImpl,
    get_backend,
    register_backend,
)

__all__ = [
    "CompNode",
    "Event",
    "CompNodeImpl",
    "CpuCompNodeImpl",
    "XPU",
    "CUDA",
    "CPU",
    "DEVICE_CPU_DEFAULT",
    "as_comp_node",
    "parse_locator",
    "locator_to_str",
    "set_device_map",
    "set_default_device",
    "set_unspec_device_type",
    "get_device_count",
    "cn_thread_local",
    "add_device_map",
    "del_device_map",
    "finalize",
    "_mgb_global_finalize",
    "register_backend",
    "get_backend",
]
