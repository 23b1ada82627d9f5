"""``mgb.config``: device mapping, graph options and per-graph scopes."""

from __future__ import annotations

import sys
import weakref

from ..device import comp_node as _cn
from ..errors import MegBrainError
from ..opr.base import as_var
from ..serialization import sereg

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
    "is_cuda_ctx_set",
    "get_include_path",
    "get_cuda_gencode",
    "get_cuda_lib_path",
    "get_cuda_include_path",
    "get_cuda_version",
    "set_fork_cuda_warning_flag",
    "set_mem_reserve_size",
    "load_opr_library",
    "create_mm_server",
    "group_barrier",
    "LOWEST_PRIORITY",
    "HIGHEST_PRIORITY",
]

LOWEST_PRIORITY = 2**31 - 1
HIGHEST_PRIORITY = -LOWEST_PRIORITY
_default_type = ["CUDA"]


def set_device_map(logical_dev, physical_dev, device_type=None) -> None:
    """Map logical device ``logical_dev`` to ``physical_dev`` (ints or strings like 'gpu3').

    The device type defaults to that of a ``'cpuN'``/``'gpuN'`` string argument, else to
    ``'CUDA'`` or whatever :func:`set_default_device` last set.
    """
    if device_type is None:
        for d in (logical_dev, physical_dev):
            if isinstance(d, str) and d[:3] in ("cpu", "gpu"):
                device_type = "CPU" if d.startswith("cpu") else "CUDA"
                break
        else:
            device_type = _default_type[0]
    _cn.set_device_map(device_type, logical_dev, physical_dev)


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
    """The number of devices of ``device_type`` (``"xpu"``, ``"cpu"``, ``"gpu"``): the CPU
    count for CPU; 0 for CUDA, which has no backend (with a ``RuntimeWarning`` if ``warn``)."""
    return _cn.get_device_count(device_type, warn)


def parse_locator(device_name: str) -> tuple:
    """``(type, dev, stream)`` of a locator string."""
    return tuple(_cn.parse_locator(device_name))


def set_comp_graph_option(comp_graph, name: str, val):
    """Set graph option ``name`` (a :class:`GraphOptions` field); returns the old value."""
    return comp_graph.options.set(name, val)


def comp_graph_is_eager(comp_graph) -> bool:
    """Whether ``comp_graph`` evaluates operators as they are built (``eager_evaluation``)."""
    return bool(comp_graph.options.eager_evaluation)


def add_extra_vardep(var, dep) -> None:
    """Whenever ``var`` is computed by a function, ``dep`` is computed too."""
    v, d = as_var(var), as_var(dep)
    if v.graph is not d.graph:
        raise MegBrainError("add_extra_vardep: the vars belong to different graphs")
    v.graph.options.extra_vardeps.setdefault(v, []).append(d)


class _GraphPropertyBase:
    """A context manager setting a property on the operators inserted into a graph.

    Each graph keeps one stack per property class: only the innermost scope applies, and
    leaving it restores the enclosing one.
    """

    _stacks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __init__(self, comp_graph, prop):
        self._graph = comp_graph
        self._prop = prop

    @staticmethod
    def _apply(opr, prop) -> None:
        raise NotImplementedError

    def __enter__(self):
        per_graph = self._stacks.setdefault(self._graph, {})
        entry = per_graph.get(type(self))
        if entry is None:
            stack: list = []
            apply = type(self)._apply

            def hook(opr):
                apply(opr, stack[-1])

            entry = per_graph[type(self)] = (stack, hook)
            self._graph.opr_insert_hooks.append(hook)
        entry[0].append(self._prop)
        return self

    def __exit__(self, *exc):
        per_graph = self._stacks[self._graph]
        stack, hook = per_graph[type(self)]
        stack.pop()
        if not stack:
            self._graph.opr_insert_hooks.remove(hook)
            del per_graph[type(self)]
        return False


class opr_priority_scope(_GraphPropertyBase):  # noqa: N801 - reference name
    """Operators inserted in the scope get ``priority`` (or min(old, priority) if set).

    Smaller runs earlier; see :data:`LOWEST_PRIORITY` and :data:`HIGHEST_PRIORITY`.
    """

    def __init__(self, comp_graph, priority: int):
        super().__init__(comp_graph, int(priority))

    @staticmethod
    def _apply(opr, prop) -> None:
        opr.priority = prop if opr.priority == 0 else min(opr.priority, prop)


class exc_opr_tracker_scope(_GraphPropertyBase):  # noqa: N801 - reference name
    """Operators inserted in the scope carry ``tracker``; their errors expose it as
    ``MegBrainError.tracker``."""

    def __init__(self, comp_graph, tracker):
        super().__init__(comp_graph, tracker)

    @staticmethod
    def _apply(opr, prop) -> None:
        opr.tracker = prop


def get_opr_tracker(cg, var_id: int):
    """``(msg, tracker, grad_tracker)`` of the operator of var ``var_id``, or None."""
    v = cg.var_by_id(var_id)
    if v is None or v.owner.tracker is None:
        return None
    return (v.owner.name, v.owner.tracker, None)


def set_opr_sublinear_memory_endpoint(var) -> None:
    """Sublinear memory splits only at operators marked by this."""
    v = as_var(var)
    v.graph.sublinear_endpoints.add(v.owner)


def dump_registered_oprs() -> dict:
    """``{type id: name}`` of every operator a graph file can hold: the ids a load error
    names when it meets an operator type it does not know."""
    return sereg.registered_oprs()


def max_size_t() -> int:
    """The largest value of a C ``size_t`` on this platform (the reference's ``max_size_t``)."""
    return sys.maxsize * 2 + 1


def is_compiled_with_cuda() -> bool:
    """False: megbrain has no CUDA backend (all comp nodes run on the CPU)."""
    return False


def is_cuda_ctx_set() -> bool:
    """Whether a CUDA context is current on this thread (never: megbrain runs on CPUs)."""
    return False


def get_include_path() -> str:
    """The directory of megbrain's package (it ships no C headers)."""
    import os

    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _no_cuda(what: str):
    raise MegBrainError(f"{what}: megbrain was built without CUDA")


def get_cuda_gencode(only_cap: bool = False):
    """Raises: there is no CUDA backend (see :func:`is_compiled_with_cuda`)."""
    _no_cuda("get_cuda_gencode")


def get_cuda_lib_path():
    """Raises: there is no CUDA backend (see :func:`is_compiled_with_cuda`)."""
    _no_cuda("get_cuda_lib_path")


def get_cuda_include_path():
    """Raises: there is no CUDA backend (see :func:`is_compiled_with_cuda`)."""
    _no_cuda("get_cuda_include_path")


def get_cuda_version():
    """Raises: there is no CUDA backend (see :func:`is_compiled_with_cuda`)."""
    _no_cuda("get_cuda_version")


def set_fork_cuda_warning_flag(flag: int) -> None:
    """Accepted for compatibility: there is no CUDA context to warn about after fork()."""
    if int(flag) not in (0, 1, 2):
        raise MegBrainError(f"set_fork_cuda_warning_flag: flag must be 0, 1 or 2, got {flag}")


def set_mem_reserve_size(size: int) -> None:
    """Accepted for compatibility: CPU comp nodes reserve no device memory up front."""
    if int(size) < 0:
        raise MegBrainError(f"set_mem_reserve_size: size must be >= 0, got {size}")


def load_opr_library(path: str):
    """Load a C++ operator library: impossible here, operators are Python classes."""
    raise MegBrainError(
        f"load_opr_library({path!r}): megbrain loads no C++ operator libraries; define "
        "operators in Python instead"
    )


def create_mm_server(server_addr: str, port: int) -> int:
    """Start nothing and return ``port``: on MPI the launcher (mpiexec) connects the ranks,
    so no multi-machine server is needed (``megbrain.distributed``)."""
    return int(port)


def group_barrier(server_addr: str, port: int, size: int, rank: int) -> None:
    """Block until every rank reaches this barrier: an MPI barrier of ``COMM_WORLD``, whose
    size must be ``size`` (``server_addr`` and ``port`` are unused)."""
    from ..device import mpi_comm as comm

    if comm.world_size() != int(size) or not 0 <= int(rank) < int(size):
        raise MegBrainError(
            f"group_barrier: size={size}, rank={rank} disagree with the MPI job "
            f"(size {comm.world_size()}, rank {comm.world_rank()})"
        )
    comm.group_barrier()
