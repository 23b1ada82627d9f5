"""Plugins that observe the operators run by the functions compiled in a graph, as
``megengine._internal.plugin``: :class:`CompGraphProfiler`, :class:`NumRangeChecker`,
:class:`TextOprIODump`, :class:`BinaryOprIODump` (with :func:`load_tensor_binary`),
:class:`InfkernFinder` and :class:`GlobalInfkernFinder`.

A plugin observes the functions compiled in its graph after it was created, until it is
detached; functions compiled with no plugin attached run exactly as without this module.
"""

from .base import PluginBase
from .infkern_finder import (
    GlobalInfkernFinder,
    InfkernFinder,
    InfkernFinderInputValueRec,
    fast_signal_hander,
)
from .num_range_checker import NumRangeChecker, NumRangeCheckerError
from .opr_io_dump import BinaryOprIODump, TextOprIODump, load_tensor_binary
from .profiler import CompGraphProfiler

__all__ = [
    "BinaryOprIODump",
    "CompGraphProfiler",
    "GlobalInfkernFinder",
    "InfkernFinder",
    "InfkernFinderInputValueRec",
    "NumRangeChecker",
    "NumRangeCheckerError",
    "PluginBase",
    "TextOprIODump",
    "fast_signal_hander",
    "load_tensor_binary",
]
