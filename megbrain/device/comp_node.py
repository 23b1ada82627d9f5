"""Comp nodes: locator parsing, the logical->physical device map, and :class:`CompNode`.

A locator string names a comp node: ``cpuN[:M]``, ``gpuN[:M]``, ``xpuN[:M]`` (N the
device, M the stream, default 0), ``cpux``/``gpux``/``xpux``/``xpu`` (the default device)
and ``cpu:default`` (the inline node of the caller's thread). Loading maps the *logical*
locator to a *physical* one: ``xpu`` becomes the unspec device type (CUDA when a CUDA
backend has devices, else CPU), then the device number goes through the per-type device
map (``x`` = -1 maps to 0 unless ``set_default_device`` said otherwise).

Locators are ``(type, dev, stream)`` tuples with ``type`` in ``{0: XPU, 1: CUDA, 2: CPU}``,
``dev == -1`` for ``x`` and ``dev == DEVICE_CPU_DEFAULT`` (-1024, as in MegBrain) for
``cpu:default``.
"""

from __future__ import annotations

import atexit
import re
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

from ..errors import ConversionError, MegBrainError
from .event import Event
from .impl import CPU, CUDA, DEVICE_CPU_DEFAULT, XPU, CompNodeImpl, get_backend

__all__ = [
    "CompNode",
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
]

_TYPE_PREFIX = {XPU: "xpu", CUDA: "gpu", CPU: "cpu"}
_PREFIX_TYPE = {v: k for k, v in _TYPE_PREFIX.items()}
_TYPE_NAMES = {"XPU": XPU, "UNSPEC": XPU, "CUDA": CUDA, "GPU": CUDA, "CPU": CPU}
_LOCATOR_RE = re.compile(r"(cpu|gpu|xpu)(x|[0-9]+)?(?::([0-9]+))?")

_lock = threading.RLock()
_device_map: dict[int, dict[int, int]] = {CUDA: {}, CPU: {}}
_unspec_type: int = XPU  # XPU: not chosen yet, resolved on first use
_impls: dict[tuple[int, int, int], CompNodeImpl] = {}
_load_cache: dict[str, CompNode] = {}

#: thread-local settings; ``map_location`` (a callable str -> str, or None) rewrites
#: locators of comp nodes being unpickled, see :func:`add_device_map`
cn_thread_local = threading.local()


# ---------------------------------------------------------------- locators


def parse_locator(locator: str) -> tuple[int, int, int]:
    """Parse a locator string into ``(type, dev, stream)``.

    Raises
    ------
    MegBrainError
        If ``locator`` is not a valid comp node locator.
    """
    if locator == "cpu:default":
        return (CPU, DEVICE_CPU_DEFAULT, 0)
    m = _LOCATOR_RE.fullmatch(locator) if isinstance(locator, str) else None
    if m is None or (m[2] is None and m[1] != "xpu"):
        raise MegBrainError(f"invalid comp node locator: {locator!r}")
    dev = -1 if m[2] in (None, "x") else int(m[2])
    return (_PREFIX_TYPE[m[1]], dev, int(m[3] or 0))


def locator_to_str(locator: tuple[int, int, int]) -> str:
    """Format a locator as MegBrain does: ``"cpu0:0"``, ``"xpux:0"``, ``"cpu:default"``."""
    type_, dev, stream = locator
    if dev == DEVICE_CPU_DEFAULT:
        return "cpu:default"
    return f"{_TYPE_PREFIX[type_]}{'x' if dev == -1 else dev}:{stream}"


def _device_type(device_type: int | str) -> int:
    if isinstance(device_type, str):
        t = _TYPE_NAMES.get(device_type.upper())
    else:
        t = int(device_type) if device_type in (XPU, CUDA, CPU) else None
    if t is None:
        raise MegBrainError(f"invalid device type {device_type!r}: expected 'CPU', 'CUDA' or 'XPU'")
    return t


def _resolve_type(type_: int) -> int:
    global _unspec_type
    if type_ != XPU:
        return type_
    if _unspec_type == XPU:
        cuda = get_backend(CUDA)
        _unspec_type = CUDA if cuda is not None and cuda.device_count() > 0 else CPU
    return _unspec_type


def _to_physical(locator: tuple[int, int, int]) -> tuple[int, int, int]:
    type_, dev, stream = locator
    if dev == DEVICE_CPU_DEFAULT:
        return locator
    type_ = _resolve_type(type_)
    dev = _device_map[type_].get(dev, dev)
    return (type_, 0 if dev == -1 else dev, stream)


def _get_impl(physical: tuple[int, int, int], what: str) -> CompNodeImpl:
    impl = _impls.get(physical)
    if impl is None:
        with _lock:
            impl = _impls.get(physical)
            if impl is None:
                backend = get_backend(physical[0])
                if backend is None:
                    name = "CUDA" if physical[0] == CUDA else f"type-{physical[0]}"
                    raise MegBrainError(
                        f"no {name} device available: can not load comp node {what!r} "
                        f"(physical {locator_to_str(physical)})"
                    )
                impl = _impls[physical] = backend.create(physical)
    return impl


# ---------------------------------------------------------------- device map


def _dev_number(dev: int | str, type_: int, what: str) -> int:
    if isinstance(dev, str):
        if dev.lstrip("-").isdigit():
            return int(dev)
        t, num, stream = parse_locator(dev)
        if (t != type_ and t != XPU) or num == DEVICE_CPU_DEFAULT or ":" in dev:
            raise MegBrainError(
                f"bad {what} device {dev!r} for device type {_TYPE_PREFIX[type_]} in device map"
            )
        return num
    return int(dev)


def _changed() -> None:
    _load_cache.clear()


def set_device_map(device_type: int | str, logical_dev: int | str, physical_dev: int | str) -> None:
    """Map logical device ``logical_dev`` of ``device_type`` to ``physical_dev``.

    Parameters
    ----------
    device_type:
        ``'CPU'``, ``'CUDA'`` (also ``'cpu'``, ``'gpu'``, or 2, 1); ``'XPU'`` means the
        type ``xpu`` currently resolves to.
    logical_dev, physical_dev:
        Device numbers or locators such as ``'cpu3'``; ``-1`` (or ``'cpux'``) is the default
        device ``x``. Affects comp nodes loaded afterwards.
    """
    with _lock:
        type_ = _resolve_type(_device_type(device_type))
        src = _dev_number(logical_dev, type_, "logical")
        dst = _dev_number(physical_dev, type_, "physical")
        if dst < 0 or src < -1:
            raise MegBrainError(
                f"bad device map {logical_dev!r} -> {physical_dev!r}: "
                "physical device must be >= 0, logical >= -1"
            )
        _device_map[type_][src] = dst
        _changed()


def set_unspec_device_type(device_type: int | str) -> None:
    """Set the device type ``xpu`` locators resolve to (``'CPU'`` or ``'CUDA'``)."""
    t = _device_type(device_type)
    if t == XPU:
        raise MegBrainError("unspec device type must be CPU or CUDA, not XPU")
    global _unspec_type
    with _lock:
        _unspec_type = t
        _changed()


def set_default_device(physical_dev: int | str, device_type: int | str | None = None) -> None:
    """Map the default device (``xpux``, and ``cpux``/``gpux`` of that type) to ``physical_dev``.

    Parameters
    ----------
    physical_dev:
        A device number or a locator such as ``'gpu1'`` or ``'cpu2'``. When ``device_type``
        is None, a ``'cpu*'``/``'gpu*'`` string also makes that type the one ``xpu``
        resolves to.
    device_type:
        The device type of a numeric ``physical_dev``; None means the type ``xpu`` resolves
        to now.
    """
    with _lock:
        if (
            device_type is None
            and isinstance(physical_dev, str)
            and physical_dev[:3] in ("cpu", "gpu")
        ):
            device_type = _PREFIX_TYPE[physical_dev[:3]]
            set_unspec_device_type(device_type)
        set_device_map(XPU if device_type is None else device_type, -1, physical_dev)


def get_device_count(device_type: int | str = "xpu", warn: bool = True) -> int:
    """Number of devices of a type: ``os.cpu_count()`` for CPU, 0 for CUDA without a backend.

    Parameters
    ----------
    device_type:
        ``'CPU'``, ``'CUDA'``/``'gpu'``, or ``'xpu'`` (the type ``xpu`` resolves to).
    warn:
        Warn (``RuntimeWarning``) when the type has no backend.
    """
    type_ = _resolve_type(_device_type(device_type))
    backend = get_backend(type_)
    if backend is None:
        if warn:
            warnings.warn(
                f"{_TYPE_PREFIX[type_]} comp nodes are unavailable: no backend",
                RuntimeWarning,
                stacklevel=2,
            )
        return 0
    return backend.device_count()


def _reset_device_config() -> None:
    """Forget every device map and the unspec type (for tests)."""
    global _unspec_type
    with _lock:
        for m in _device_map.values():
            m.clear()
        _unspec_type = XPU
        _changed()


# ---------------------------------------------------------------- map_location


def _callable_map_location(map_location: Any) -> Callable[[str], str] | None:
    if map_location is None or callable(map_location):
        return map_location
    if isinstance(map_location, str):
        parse_locator(map_location)
        return lambda state: map_location
    if isinstance(map_location, dict):
        table = {parse_locator(k): v for k, v in map_location.items()}
        for v in table.values():
            parse_locator(v)
        return lambda state: table.get(parse_locator(state), state)
    raise ConversionError(
        f"map_location must be None, a str, a dict or a callable, got {type(map_location).__name__}"
    )


def add_device_map(map_location: Any) -> None:
    """Rewrite the locators of comp nodes unpickled on this thread from now on.

    Parameters
    ----------
    map_location:
        A callable taking and returning a locator string; a locator string used for every
        comp node; or a dict from locator to locator (keys match after parsing, so
        ``"gpu0"`` matches a pickled ``"gpu0:0"``); None removes the mapping.
    """
    cn_thread_local.map_location = _callable_map_location(map_location)


def del_device_map() -> None:
    """Stop rewriting unpickled comp nodes on this thread."""
    cn_thread_local.map_location = None


# ---------------------------------------------------------------- CompNode


def _new_comp_node() -> CompNode:
    return CompNode.__new__(CompNode)


class CompNode:
    """A named execution queue on a device (MegBrain ``CompNode``).

    Created by :meth:`load` (or ``CompNode(locator)``). Two comp nodes are equal when they
    map to the same physical locator, and then share memory, queue and worker thread.

    Parameters
    ----------
    locator:
        A locator string or a CompNode.
    """

    __slots__ = ("_impl", "_logical")

    def __init__(self, locator: str | CompNode = "xpux"):
        cn = CompNode.load(locator)
        self._impl: CompNodeImpl = cn._impl
        self._logical: tuple[int, int, int] = cn._logical

    @staticmethod
    def load(locator: str | CompNode) -> CompNode:
        """Return the comp node of a locator string (cached); a CompNode is returned as is.

        Raises
        ------
        MegBrainError
            For a malformed locator, or a CUDA locator without a CUDA device.
        """
        if type(locator) is CompNode:
            return locator
        cn = _load_cache.get(locator) if isinstance(locator, str) else None
        if cn is None:
            if isinstance(locator, CompNode):
                return locator
            if not isinstance(locator, str):
                raise ConversionError(f"can not use {locator!r} as a comp node locator")
            with _lock:
                logical = parse_locator(locator)
                cn = _new_comp_node()
                cn._impl = _get_impl(_to_physical(logical), locator)
                cn._logical = logical
                _load_cache[locator] = cn
        return cn

    @staticmethod
    def default_cpu() -> CompNode:
        """The ``cpu:default`` comp node."""
        return CompNode.load("cpu:default")

    # -- the static helpers of the reference binding
    @staticmethod
    def _parse_locator(locator: str) -> list[int]:
        return list(parse_locator(locator))

    @staticmethod
    def _set_device_map(device_type: int | str, logical: int, physical: int) -> None:
        set_device_map(device_type, logical, physical)

    @staticmethod
    def _get_device_count(device_type: int | str, warn: bool = True) -> int:
        return get_device_count(device_type, warn)

    @staticmethod
    def _set_unspec_device_type(device_type: int | str) -> None:
        set_unspec_device_type(device_type)

    @staticmethod
    def _try_coalesce_all_free_memory() -> None:
        """No-op: host buffers are returned to the allocator as soon as they are dropped."""

    # -- properties
    @property
    def impl(self) -> CompNodeImpl:
        """The shared per-physical-locator implementation (backend interface)."""
        return self._impl

    @property
    def locator_logical(self) -> tuple[int, int, int]:
        """``(type, dev, stream)`` as loaded (type 0 XPU, 1 CUDA, 2 CPU; dev -1 for x)."""
        return self._logical

    @property
    def locator_physical(self) -> tuple[int, int, int]:
        """``(type, dev, stream)`` after the device map."""
        return self._impl.locator

    @property
    def device_type(self) -> int:
        """The physical device type (1 CUDA, 2 CPU)."""
        return self._impl.locator[0]

    @property
    def mem_align(self) -> int:
        """Alignment in bytes of buffers allocated on this node."""
        return self._impl.mem_align

    @property
    def mem_status_bytes(self) -> tuple[int, int]:
        """``(total, free)`` bytes of the node's memory."""
        return self._impl.mem_status_bytes()

    @property
    def is_inline(self) -> bool:
        """Whether dispatched work runs inline on the caller's thread (``cpu:default``)."""
        return self._impl.is_inline

    @property
    def array_module(self) -> Any:
        """The array module of the node's memory (numpy on CPU)."""
        return self._impl.array_module

    # -- work
    def dispatch(self, fn: Callable, *args) -> None:
        """Run ``fn(*args)`` on this node after all work dispatched before; returns at once.

        An exception the task raises is re-raised by the next :meth:`sync`.
        """
        self._impl.dispatch(fn, *args)

    def sync(self) -> None:
        """Block until all work dispatched so far has run; re-raise the first task error."""
        self._impl.sync()

    def create_event(self, flags: int = 0) -> Event:
        """Make an :class:`~megbrain.device.Event` recorded on this node's queue."""
        return self._impl.create_event(self, flags)

    def device_wait(self, event: Event) -> None:
        """Make work dispatched to this node from now on wait until ``event`` has finished."""
        self._impl.device_wait(event)

    def alloc(self, nbytes: int):
        """Allocate ``nbytes`` bytes of this node's memory as an aligned 1-d uint8 array."""
        return self._impl.alloc(nbytes)

    # -- naming, identity, pickling
    def to_string(self) -> str:
        """The physical locator, e.g. ``"cpu0:0"``."""
        return locator_to_str(self._impl.locator)

    def to_string_logical(self) -> str:
        """The logical locator, e.g. ``"cpux:0"``."""
        return locator_to_str(self._logical)

    def __str__(self) -> str:
        return locator_to_str(self._impl.locator)

    def __repr__(self) -> str:
        return f'CompNode("{self.to_string()}" from "{self.to_string_logical()}")'

    def __eq__(self, other: object) -> bool:
        if isinstance(other, CompNode):
            return self._impl is other._impl
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        if isinstance(other, CompNode):
            return self._impl is not other._impl
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._impl.locator)

    def __getstate__(self) -> str:
        return self.to_string_logical()

    def __setstate__(self, state: str) -> None:
        map_location = getattr(cn_thread_local, "map_location", None)
        if map_location is not None:
            state = _callable_map_location(map_location)(state)
        cn = CompNode.load(state)
        self._impl, self._logical = cn._impl, cn._logical

    def __reduce__(self):
        return (_new_comp_node, (), self.to_string_logical())

    def __copy__(self) -> CompNode:
        return self

    def __deepcopy__(self, memo: dict) -> CompNode:
        return self


def as_comp_node(desc: str | CompNode) -> CompNode:
    """Convert a locator string or a CompNode to a CompNode.

    Raises
    ------
    ConversionError
        For anything else.
    """
    if isinstance(desc, CompNode):
        return desc
    if isinstance(desc, str):
        return CompNode.load(desc)
    raise ConversionError(f"can not convert {desc!r} ({type(desc).__name__}) to a comp node")


def finalize(timeout: float = 2.0) -> None:
    """Stop every worker thread: pending work is dropped, running tasks may finish.

    Runs at interpreter exit. It waits at most ``timeout`` seconds in all for the tasks that
    are running to return, because a kernel still running in a daemon thread while the
    process exits can deadlock native libraries (OpenBLAS joins its own threads in its
    exit handler and hangs if a multi-threaded BLAS call is in flight); longer tasks are
    abandoned. Comp nodes stay usable: a later dispatch starts a new worker.
    """
    workers = [w for w in (impl.stop() for impl in list(_impls.values())) if w is not None]
    deadline = time.monotonic() + timeout
    for w in workers:
        if not w.on_thread():
            w.join(max(0.0, deadline - time.monotonic()))


_mgb_global_finalize = finalize
atexit.register(finalize)
