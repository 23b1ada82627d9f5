"""Comp nodes: locators, the logical->physical device map, dispatch workers and events.

The device layer hides which array module backs a comp node: tensors, graphs and
operators use only :class:`CompNode` (and its :class:`~megbrain.device.impl.CompNodeImpl`),
so a CUDA backend is one more implementation class (see ``impl.py``).
"""

from __future__ import annotations

from . import comp_node
from .comp_node import *  # noqa: F403 - the comp node API, listed in comp_node.__all__
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
    "Event",
    "CompNodeImpl",
    "CpuCompNodeImpl",
    "XPU",
    "CUDA",
    "CPU",
    "DEVICE_CPU_DEFAULT",
    "register_backend",
    "get_backend",
    *comp_node.__all__,
]
