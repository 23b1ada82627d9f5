"""Convolution algorithms and their choice per shape: MegBrain's execution policy.

Every convolution kernel (forward, backward data, backward filter; 2-d and 3-d) is a
registered :class:`ConvAlgorithm`: a bind function with the signature of
:func:`megbrain.kernels.conv.binds.bind_convolution` (``(a, b, out, stride, pad, dilate, flip)``
-> a zero-argument step), a ``usable`` predicate with the same arguments, a ``reproducible``
flag and a ``priority``. :func:`select` chooses one for the bound arrays at bind time, as the
operator param's ``strategy`` (MegDNN's ``ExecutionPolicy``) says:

- ``HEURISTIC`` (the default): the usable algorithm of highest priority whose optional
  ``heuristic`` predicate accepts the shape (the first usable one when none does);
- ``HEURISTIC_REPRODUCIBLE``: the same among the reproducible algorithms;
- ``PROFILE``: every usable candidate is timed once per shape (a warm-up run each, then the
  best of :data:`PROFILE_RUNS` interleaved rounds, :func:`time_algorithms`) on scratch arrays
  of the operands' shapes, strides and dtypes, values in [-1, 1], their workspaces outside
  the memory plan, so that profiling writes nothing the operator owns; the fastest is kept in
  memory and in the persistent cache (category :data:`CACHE_CATEGORY`, the value is the
  algorithm's name), as MegBrain's fastrun does;
- ``PROFILE_REPRODUCIBLE``: the same among the reproducible candidates;
- ``PROFILE_HEURISTIC``: a choice PROFILE made for the same key, if any, else the HEURISTIC
  one; it never times (MegBrain's ``choose_by_profile`` without updating the cache).

The cache key (:func:`choice_key`) holds the kind, the shapes, strides and dtypes of the three
operands, stride/pad/dilate/flip, the BLAS thread count and the names of the candidates, so a
new algorithm or a different thread count profiles again; a cached name that is no longer a
usable candidate is ignored. The process-wide persistent cache is the one registered with
:func:`set_persistent_cache` (``megbrain.global_init`` registers its
``persistent_cache_impl_ins`` through ``PersistentCache.reg``); ``cache=`` overrides it.

Reproducibility rule: an algorithm is reproducible when, for the same inputs and thread count,
every run gives the same bits, i.e. every floating-point sum runs in an order fixed at bind
time. GEMMs through NumPy's BLAS (OpenBLAS partitions statically), strided NumPy copies and
adds are; an algorithm whose summation order depends on thread scheduling (atomic or
work-stealing parallel reductions) must register with ``reproducible=False``. Every built-in
algorithm is reproducible.

Priorities: 0 for the general fallbacks (usable on every shape), 10 for the built-in
shape-specialised ones; a new algorithm registers with the priority that ranks it among them.
A less accurate algorithm must not become the HEURISTIC default.

Registering is all this module does with the algorithms: each algorithm module of this
package registers its own as it loads (:mod:`.binds` imports them all, in a fixed order, since
registration order breaks priority ties), by kind:

- forward: :mod:`.im2col` (``IM2COL_GEMM_PER_SAMPLE``, priority 10; ``IM2COL_GEMM``, the
  fallback; ``CONV1X1_GEMM``, 30), :mod:`.nchw8c` (``DIRECT_NCHW8C``, 25), :mod:`.winograd`
  (``WINOGRAD_F23``, 20), :mod:`.direct` (``DIRECT``, 20), :mod:`.grouped`
  (``DIRECT_GROUPED``, 22: depthwise convolutions at any stride), :mod:`.pointwise`
  (``DIRECT_POINTWISE``, 31: NCHW 1x1 convolutions of short reductions),
  :mod:`.channelwise` (``CHANNELWISE_NCHW``, 23: depthwise, one output per channel),
  :mod:`.tapwise` (``TAPWISE_SGEMM``, 21: stride 1, small planes of many channels);
- backward_data: :mod:`.bwd_data` (``AS_FORWARD_CONV``, 10; ``GEMM_COL2IM``, the fallback),
  :mod:`.winograd`, :mod:`.direct`, :mod:`.depthwise_bwd` (``DIRECT_DEPTHWISE``, 25:
  depthwise at strides other than 1);
- backward_filter: :mod:`.bwd_filter` (``IM2COL_GEMM_DIFF_NHWC``, 10;
  ``IM2COL_GEMM_DIFF_ROWS``, a PROFILE candidate; ``IM2COL_GEMM_BLOCKED``, 20;
  ``POINTWISE_BATCHED_GEMM``, 30: 1x1 on planes of 16x16 and more),
  :mod:`.depthwise_bwd` (``DIRECT_DEPTHWISE``, 25: depthwise, any stride).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import as_strided
from threadpoolctl import threadpool_info

from .. import workspace
from .common import _KIND_NAMES, check_convolution
from .constant_operands import filter_is_constant

__all__ = [
    "CACHE_CATEGORY",
    "KINDS",
    "PROFILE_BUDGET_S",
    "PROFILE_DROP_RATIO",
    "PROFILE_RUNS",
    "STRATEGIES",
    "ConvAlgorithm",
    "algorithms",
    "bind",
    "blas_threads",
    "choice_key",
    "clear_choices",
    "register",
    "select",
    "set_persistent_cache",
    "time_algorithms",
    "unregister",
    "usable_algorithms",
]

KINDS = ("forward", "backward_data", "backward_filter")
#: MegDNN's ExecutionPolicy strategies
STRATEGIES = (
    "HEURISTIC",
    "HEURISTIC_REPRODUCIBLE",
    "PROFILE",
    "PROFILE_REPRODUCIBLE",
    "PROFILE_HEURISTIC",
)
#: the persistent cache category of the profiled choices
CACHE_CATEGORY = "conv_algo"
#: timed rounds over the candidates (after one warm-up run each); each keeps its best time
PROFILE_RUNS = 5
#: no further round starts once profiling one shape has taken this many seconds
PROFILE_BUDGET_S = 2.0
#: a candidate whose best time is this many times the fastest one's is not run again
PROFILE_DROP_RATIO = 3.0

_log = logging.getLogger("megbrain")


@dataclass(frozen=True)
class ConvAlgorithm:
    """One convolution algorithm of one kind.

    Attributes
    ----------
    name : str
        MegDNN-style upper-case name, unique within its kind ("IM2COL_GEMM").
    kind : str
        "forward", "backward_data" or "backward_filter".
    bind : Callable
        ``bind(a, b, out, stride, pad, dilate, flip) -> step``, as
        :func:`megbrain.kernels.conv.binds.bind_convolution` (forward: src, filter, dst),
        ``bind_conv_backward_data`` (filter, diff, grad) or ``bind_conv_backward_filter``
        (src, diff, grad); it writes only ``out`` and takes its scratch from
        :func:`megbrain.kernels.workspace.empty`.
    usable : Callable
        Same arguments as ``bind`` -> bool: whether it applies (shape, dtype, strides...);
        called on checked geometry only.
    reproducible : bool
        Whether every run gives the same bits for the same inputs and thread count.
    priority : int
        HEURISTIC takes the usable (and heuristic-accepted) algorithm of highest priority.
    heuristic : Callable or None
        Same arguments as ``bind`` -> bool: whether HEURISTIC may choose it for this shape
        (None: wherever usable). PROFILE ignores it.
    epilogue : bool
        Whether ``bind`` also takes ``epilogue=`` (a
        :class:`megbrain.kernels.conv.epilogue.Epilogue`, forward only): ``act(conv +
        bias)`` applied by the algorithm as it writes each block of the output.
    hswish : bool
        Whether that epilogue may also be H_SWISH (``Epilogue.hswish``); an algorithm
        without it gets no H_SWISH epilogue (the operator applies it after the kernel).
    relu6, silu : bool
        Whether that epilogue may also carry the ReLU6 / SiLU tail (``Epilogue.relu6``,
        ``Epilogue.silu``); as for ``hswish``, an algorithm without it never gets one.
    """

    name: str
    kind: str
    bind: Callable
    usable: Callable
    reproducible: bool = True
    priority: int = 0
    heuristic: Callable | None = None
    epilogue: bool = False
    hswish: bool = False
    relu6: bool = False
    silu: bool = False


_lock = threading.RLock()
_registry: dict[str, dict[str, ConvAlgorithm]] = {k: {} for k in KINDS}
_choices: dict[str, str] = {}  # choice_key -> algorithm name, the in-memory profile cache
_persistent: list = [None]  # the registered persistent cache (put/get of bytes by category)


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown convolution kind {kind!r}; expected one of {KINDS}")


def register(algo: ConvAlgorithm) -> None:
    """Register ``algo`` under its kind.

    Raises
    ------
    ValueError
        For an unknown kind, a name that is not upper case, or a name already registered for
        the kind by another algorithm.
    """
    _check_kind(algo.kind)
    if not algo.name or algo.name != algo.name.upper() or "," in algo.name:
        raise ValueError(f"algorithm name {algo.name!r} must be upper case, without commas")
    with _lock:
        known = _registry[algo.kind].get(algo.name)
        if known is not None and known != algo:
            raise ValueError(f"{algo.kind} algorithm {algo.name} is already registered")
        _registry[algo.kind][algo.name] = algo


def unregister(kind: str, name: str) -> None:
    """Remove the ``kind`` algorithm ``name`` (KeyError if it is not registered)."""
    _check_kind(kind)
    with _lock:
        del _registry[kind][name]


def algorithms(kind: str) -> list[ConvAlgorithm]:
    """The registered ``kind`` algorithms, highest priority first (then registration order)."""
    _check_kind(kind)
    with _lock:
        algos = list(_registry[kind].values())
    return sorted(algos, key=lambda a: -a.priority)


def usable_algorithms(
    kind: str, a: np.ndarray, b: np.ndarray, out: np.ndarray, stride: Sequence[int],
    pad: Sequence[int], dilate: Sequence[int], flip: bool = False, *,
    reproducible: bool = False,
) -> list[ConvAlgorithm]:  # fmt: skip
    """The ``kind`` algorithms usable on these arrays (reproducible ones only if asked),
    highest priority first.

    Raises
    ------
    ValueError
        When the arrays and the geometry do not make a ``kind`` convolution.
    """
    _check_kind(kind)
    args = (a, b, out, stride, pad, dilate, flip)
    check_convolution(kind, *args)
    return [
        algo
        for algo in algorithms(kind)
        if (algo.reproducible or not reproducible) and algo.usable(*args)
    ]


def set_persistent_cache(cache) -> object:
    """Make ``cache`` (an object with ``put(category, key, value)`` and ``get(category, key)``
    of bytes, or None) the process-wide persistent cache of profiled choices; returns the
    previous one."""
    with _lock:
        prev, _persistent[0] = _persistent[0], cache
    return prev


def clear_choices() -> None:
    """Forget the in-memory profiled choices (the persistent cache keeps its own)."""
    with _lock:
        _choices.clear()


def blas_threads() -> int:
    """The thread count of the BLAS NumPy uses (by threadpoolctl, else the usual environment
    variables, else 1)."""
    counts = [i.get("num_threads", 1) for i in threadpool_info() if i.get("user_api") == "blas"]
    if counts:
        return int(max(counts))
    for var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
        v = os.environ.get(var, "")
        if v.isdigit():
            return int(v)
    return 1


def _layout(a: np.ndarray) -> str:
    return f"{a.dtype.name}{list(a.shape)}/{list(a.strides)}"


def choice_key(
    kind: str, a: np.ndarray, b: np.ndarray, out: np.ndarray, stride: Sequence[int],
    pad: Sequence[int], dilate: Sequence[int], flip: bool, candidates: Sequence[ConvAlgorithm],
) -> str:  # fmt: skip
    """The cache key of a profiled choice: the kind, the operands' dtypes, shapes and
    strides, the geometry, the BLAS thread count, whether the filter is constant
    (:func:`.constant_operands.filter_is_constant`: an algorithm may then prepare it once)
    and the candidates' names."""
    geometry = f"stride={list(stride)} pad={list(pad)} dilate={list(dilate)} flip={bool(flip)}"
    names = ",".join(sorted(c.name for c in candidates))
    return (
        f"{kind}|{_layout(a)}|{_layout(b)}|{_layout(out)}|{geometry}|"
        f"blas_threads={blas_threads()}|constant_filter={filter_is_constant()}|{names}"
    )


def _scratch_like(a: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A writable array of ``a``'s shape, dtype and strides in its own memory, values in
    [-1, 1] (contiguous when the strides are not multiples of the item size)."""
    it = a.dtype.itemsize
    if a.size == 0 or any(s % it for s in a.strides):
        return rng.uniform(-1, 1, a.shape).astype(a.dtype)
    lo = sum((n - 1) * s for n, s in zip(a.shape, a.strides) if s < 0)
    hi = sum((n - 1) * s for n, s in zip(a.shape, a.strides) if s > 0)
    base = rng.uniform(-1, 1, (hi - lo) // it + 1).astype(a.dtype)
    return as_strided(base[-lo // it :], a.shape, a.strides, writeable=True)


def time_algorithms(
    algos: Sequence[ConvAlgorithm], a: np.ndarray, b: np.ndarray, out: np.ndarray,
    stride: Sequence[int], pad: Sequence[int], dilate: Sequence[int], flip: bool = False,
    runs: int | None = None,
) -> dict[str, float]:  # fmt: skip
    """Seconds each of ``algos`` takes on scratch copies of the operands, by name.

    Each algorithm is bound and run once (a warm-up), then the algorithms run in turns,
    ``runs`` rounds (:data:`PROFILE_RUNS` by default; after the first, none starts once
    :data:`PROFILE_BUDGET_S` seconds are spent), each keeping its best time: interleaved, a
    burst of load from elsewhere slows every candidate alike. After the first round, a
    candidate :data:`PROFILE_DROP_RATIO` times slower than the fastest sits out. Nothing of
    ``a``, ``b``, ``out`` is written, and the workspaces come from plain allocations, not from
    a memory plan. An algorithm whose bind or run raises ValueError, MemoryError or
    FloatingPointError is left out (logged).
    """
    rng = np.random.default_rng(0)
    sa, sb, so = (_scratch_like(x, rng) for x in (a, b, out))
    steps: dict[str, Callable[[], None]] = {}
    best: dict[str, float] = {}
    start = time.perf_counter()
    for algo in algos:
        try:
            with workspace.allocating(None):
                step = algo.bind(sa, sb, so, stride, pad, dilate, flip)
            t0 = time.perf_counter()
            step()
            best[algo.name] = time.perf_counter() - t0
            steps[algo.name] = step
        except (ValueError, MemoryError, FloatingPointError) as exc:
            _log.warning("profiling %s algorithm %s failed: %s", algo.kind, algo.name, exc)
    for r in range(PROFILE_RUNS if runs is None else runs):
        if not steps or (r and time.perf_counter() - start > PROFILE_BUDGET_S):
            break
        lead = min(best[n] for n in steps)
        for name, step in steps.items():
            if r and best[name] > PROFILE_DROP_RATIO * lead:
                continue  # can not win (after one timed run past the warm-up): sits out
            t0 = time.perf_counter()
            step()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def _heuristic(cands: list[ConvAlgorithm], args: tuple) -> ConvAlgorithm:
    for algo in cands:
        if algo.heuristic is None or algo.heuristic(*args):
            return algo
    return cands[0]


def _cached(key: str, by_name: dict, cache) -> ConvAlgorithm | None:
    with _lock:
        name = _choices.get(key)
    if name is None and cache is not None:
        raw = cache.get(CACHE_CATEGORY, key.encode())
        name = raw.decode(errors="replace") if raw is not None else None
    algo = by_name.get(name)
    if algo is not None:
        with _lock:
            _choices[key] = algo.name
    return algo


def _profile(kind: str, cands: list[ConvAlgorithm], args: tuple) -> ConvAlgorithm:
    times = time_algorithms(cands, *args)
    if not times:
        raise ValueError(f"{kind} convolution: every candidate failed while profiling")
    best = min((c for c in cands if c.name in times), key=lambda c: times[c.name])
    _log.debug("profiled %s convolution: %s -> %s", kind, times, best.name)
    return best


def select(
    kind: str, a: np.ndarray, b: np.ndarray, out: np.ndarray, stride: Sequence[int],
    pad: Sequence[int], dilate: Sequence[int], flip: bool = False, *,
    strategy: str = "HEURISTIC", cache=None, keep: str | None = None,
) -> ConvAlgorithm:  # fmt: skip
    """The ``kind`` algorithm ``strategy`` chooses for these arrays (see the module doc).

    Parameters
    ----------
    kind : str
        "forward", "backward_data" or "backward_filter".
    a, b, out : numpy.ndarray
        The operands, as the kind's bind takes them.
    stride, pad, dilate, flip
        The geometry, as for :func:`megbrain.kernels.conv.binds.bind_convolution`.
    strategy : str
        One of :data:`STRATEGIES`.
    cache : object, optional
        The persistent cache of the PROFILE strategies (``get``/``put`` by category); the
        registered process-wide one (:func:`set_persistent_cache`) by default.
    keep : str, optional
        The PROFILE strategies return the algorithm of this name while it is a usable
        candidate, without profiling (the graph option ``no_profiling_on_shape_change``).

    Returns
    -------
    ConvAlgorithm

    Raises
    ------
    ValueError
        For an unknown strategy or kind, bad geometry, or no usable algorithm.
    """
    if strategy not in STRATEGIES:
        raise ValueError(
            f"{kind} convolution: unknown execution strategy {strategy!r}; "
            f"expected one of {STRATEGIES}"
        )
    args = (a, b, out, tuple(stride), tuple(pad), tuple(dilate), bool(flip))
    reproducible = strategy.endswith("_REPRODUCIBLE")
    cands = usable_algorithms(kind, *args, reproducible=reproducible)
    if not cands:
        which = "reproducible " if reproducible else ""
        raise ValueError(
            f"{_KIND_NAMES[kind]}: no {which}algorithm is usable for operands "
            f"{_layout(a)}, {_layout(b)}, {_layout(out)} (stride={args[3]}, pad={args[4]}, "
            f"dilate={args[5]})"
        )
    if strategy.startswith("HEURISTIC") or len(cands) == 1:
        return _heuristic(cands, args)
    by_name = {c.name: c for c in cands}
    if keep in by_name:
        return by_name[keep]
    cache = _persistent[0] if cache is None else cache
    key = choice_key(kind, *args, cands)
    algo = _cached(key, by_name, cache)
    if algo is not None:
        return algo
    if strategy == "PROFILE_HEURISTIC":
        return _heuristic(cands, args)
    algo = _profile(kind, cands, args)
    with _lock:
        _choices[key] = algo.name
    if cache is not None:
        try:
            cache.put(CACHE_CATEGORY, key.encode(), algo.name.encode())
        except OSError as exc:
            _log.warning("could not persist the %s convolution choice: %s", kind, exc)
    return algo


def bind(
    kind: str, a: np.ndarray, b: np.ndarray, out: np.ndarray, stride: Sequence[int],
    pad: Sequence[int], dilate: Sequence[int], flip: bool = False, *,
    strategy: str = "HEURISTIC", cache=None,
) -> Callable[[], None]:  # fmt: skip
    """Choose the ``kind`` algorithm (:func:`select`) and bind it; returns its step."""
    algo = select(kind, a, b, out, stride, pad, dilate, flip, strategy=strategy, cache=cache)
    return algo.bind(a, b, out, stride, pad, dilate, flip)


def always(*args) -> bool:
    """The ``usable`` predicate of an algorithm that applies to every checked geometry."""
    return True
