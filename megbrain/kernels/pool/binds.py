"""Pooling kernels (MegDNN's PoolingForward and PoolingBackward) for batch-channel-first
layouts, bound once; quantized arrays are pooled forward by MegDNN's integer arithmetic.

2-d pooling runs the compiled loops of :mod:`.loops` over the ``N * C`` planes, split
over :func:`parallel.num_threads` threads by :func:`parallel.split` when each part gets at
least :data:`SPLIT_MIN_ELEMS` source elements (else in the calling thread). The loops want
C-contiguous arrays of one float dtype, so float16 / bfloat16 arrays (computed in float32) and
non-contiguous ones go through contiguous staging copies.
Other ranks (3-d pooling) use the NumPy formulation: one strided ufunc pass per window
offset, reading the source directly (no padded copy).

Staging copies and the NumPy formulation's temporaries are rewritten on every run, so they
come from :func:`workspace.empty` (the memory plan's workspace of the operator).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import numpy as np

from .. import parallel, workspace
from ..arrays import F32, compute_dtype
from ..elemwise import quant_params
from ..elemwise_modes import round_in_place
from ..steps import Step, chain
from . import loops as pool_loops

__all__ = [
    "POOLING_MODES",
    "QUANTIZED_POOL_DTYPES",
    "SPLIT_MIN_ELEMS",
    "bind_pooling",
    "bind_pooling_backward",
    "pool_out_size",
]

_partial = functools.partial
POOLING_MODES = ("MAX", "AVERAGE", "AVERAGE_COUNT_EXCLUDE_PADDING")
#: the fewest source elements one thread of a split 2-d pooling gets (None: every pooling runs
#: in the calling thread; the NCHW88 pooling counts window taps against it). Timed on the
#: 2-core machine while the machine was under 30% busy,
#: two threads against one: 2x2 MAX forward 2.0-2.4x and backward 1.45-1.75x on the CNNs'
#: 128x16x28x28, 128x32x14x14 and 64x20x24x24, 3x3/s2/p1 MAX 1.45x forward and 1.4x backward
#: on 8x64x112x112, AVERAGE 2x2 1.4-1.5x. The vector loops do 2x2 at 0.1 (forward) to 0.3
#: (backward) ns an element, so a part of 256K elements is 25-80 us of work, about what
#: handing it over costs: LeNet's 64x50x8x8 (205K elements, 0.02 / 0.07 ms, 1.1x) stays in
#: one thread. Once the other core is busy the second part waits for it and the split loses:
#: 1.2-1.8x slower at load 2-8.
SPLIT_MIN_ELEMS: int | None = 1 << 18


def pool_out_size(size: int, window: int, stride: int, pad: int) -> int:
    """Output length of a pooling along one dim."""
    return (size + 2 * pad - window) // stride + 1


class _Pool:
    """The geometry of one pooling, checked against the arrays' shapes.

    The NumPy formulation reads the source one strided region per window offset: for offset
    ``f`` the outputs ``o`` with ``0 <= o * stride - pad + f < S`` read source positions
    ``o * stride - pad + f``.
    """

    def __init__(self, name, src_shape, out_shape, mode, window, stride, pad):
        if mode not in POOLING_MODES:
            raise ValueError(f"{name}: unknown mode {mode!r}")
        nsp = len(src_shape) - 2
        if not len(window) == len(stride) == len(pad) == nsp:
            raise ValueError(f"{name}: window, stride and pad need {nsp} values each")
        if any(p >= w for p, w in zip(pad, window)):
            raise ValueError(f"{name}: padding {pad} must be smaller than the window {window}")
        self.mode = mode
        self.window = tuple(map(int, window))
        self.stride = tuple(map(int, stride))
        self.pad = tuple(map(int, pad))
        self.sshape = tuple(src_shape[2:])
        self.oshape = tuple(pool_out_size(*a) for a in zip(self.sshape, window, stride, pad))
        if tuple(out_shape) != tuple(src_shape[:2]) + self.oshape:
            raise ValueError(
                f"{name}: src {tuple(src_shape)} (window={window}, stride={stride}, "
                f"pad={pad}) does not give {tuple(out_shape)}"
            )
        self.planes = math.prod(src_shape[:2])

    @property
    def compiled(self) -> bool:
        """Whether the compiled 2-d loops apply (2-d, nothing empty)."""
        return len(self.sshape) == 2 and self.planes > 0 and min(self.sshape + self.oshape) > 0

    def is_(self, window: int, stride: int, pad: int) -> bool:
        """Whether every dim has this window, stride and padding."""
        return (
            set(self.window) == {window} and set(self.stride) == {stride} and set(self.pad) == {pad}
        )

    def is_global(self) -> bool:
        """Whether this is an average over each whole plane (one window, no padding)."""
        return self.mode != "MAX" and self.window == self.sshape and not any(self.pad)

    def geometry(self) -> tuple[int, ...]:
        """``(wh, ww, sh, sw, ph, pw)``, the compiled loops' geometry arguments."""
        return self.window + self.stride + self.pad

    def split(self, fn: Callable[[int, int], object]) -> Step:
        """``fn(lo, hi)`` over the planes, split over threads when :data:`SPLIT_MIN_ELEMS` says
        they are large enough."""
        if SPLIT_MIN_ELEMS is None:
            return _partial(fn, 0, self.planes)
        per_plane = max(1, math.prod(self.sshape))
        return parallel.split(fn, self.planes, -(-SPLIT_MIN_ELEMS // per_plane))

    def divisor(self, dtype) -> np.ndarray | np.generic:
        """The per-output divisor of the average modes (a scalar for AVERAGE)."""
        if self.mode == "AVERAGE":
            return dtype.type(math.prod(self.window))
        count = np.ones((), dtype)
        geometry = zip(self.sshape, self.window, self.stride, self.pad, self.oshape)
        for d, (s, w, t, p, o) in enumerate(geometry):
            start = np.arange(o) * t - p
            valid = np.minimum(start + w, s) - np.maximum(start, 0)
            shape = [1] * len(self.oshape)
            shape[d] = o
            count = count * valid.astype(dtype).reshape(shape)
        return count

    def regions(self):
        """(output index, source index) for each window offset that reads any source."""
        for f in np.ndindex(*self.window):
            oidx, sidx = [], []
            for fi, s, t, p, o in zip(f, self.sshape, self.stride, self.pad, self.oshape):
                lo = max(0, -((fi - p) // t))  # ceil((p - fi) / t)
                hi = min(o, (s - 1 + p - fi) // t + 1)
                if hi <= lo:
                    break
                start = lo * t - p + fi
                oidx.append(slice(lo, hi))
                sidx.append(slice(start, start + (hi - lo - 1) * t + 1, t))
            else:
                yield (slice(None), slice(None), *oidx), (slice(None), slice(None), *sidx)


# ---- staging -------------------------------------------------------------------------------
def _staged_in(a: np.ndarray, dtype: np.dtype, steps: list, contiguous: bool) -> np.ndarray:
    """``a`` in ``dtype`` (and C-contiguous if asked): ``a`` itself, or a workspace buffer a
    step refreshes from ``a`` on every run."""
    if a.dtype == dtype and (a.flags.c_contiguous or not contiguous):
        return a
    buf = workspace.empty(a.shape, dtype)
    steps.append(_partial(np.copyto, buf, a, "unsafe"))
    return buf


def _staged_out(a: np.ndarray, dtype: np.dtype, post: list, contiguous: bool) -> np.ndarray:
    """A writable array standing for output ``a``: ``a`` itself, or a workspace buffer that a
    step copies into ``a`` after the kernel (which writes all of it)."""
    if a.dtype == dtype and a.flags.writeable and (a.flags.c_contiguous or not contiguous):
        return a
    buf = workspace.empty(a.shape, dtype)
    post.append(_partial(np.copyto, a, buf, "unsafe"))
    return buf


def _planes(a: np.ndarray) -> np.ndarray:
    """The ``(N * C, H, W)`` view of a C-contiguous ``(N, C, H, W)`` array."""
    return a.reshape(-1, *a.shape[2:])


# ---- forward -------------------------------------------------------------------------------
def bind_pooling(
    src: np.ndarray,
    out: np.ndarray,
    mode: str,
    window: Sequence[int],
    stride: Sequence[int],
    pad: Sequence[int],
) -> Callable[[], None]:
    """Bind a pooling of ``src`` ``(N, C, *S)`` into ``out`` ``(N, C, *O)``.

    Parameters
    ----------
    src, out : numpy.ndarray
        Input and output; ``O = (S + 2 pad - window) // stride + 1``.
    mode : {"MAX", "AVERAGE", "AVERAGE_COUNT_EXCLUDE_PADDING"}
        MAX ignores padding (and propagates NaN); AVERAGE divides by the window size (padding
        counts as zeros); AVERAGE_COUNT_EXCLUDE_PADDING divides by the number of non-padding
        elements.
        Quantized arrays (:data:`QUANTIZED_POOL_DTYPES`, ``out`` of the source's dtype) are
        pooled as MegDNN's naive integer poolers do: MAX of the stored values; the averages
        store ``round(float32(int32 sum) / float32(count))`` (half away from zero,
        saturated), a Quantized8Asymm AVERAGE window's padding adding its zero point.
    window, stride, pad : sequence of int
        One value per spatial dim; ``pad < window``.

    Returns
    -------
    Callable[[], None]
        A zero-argument callable computing ``out``.

    Raises
    ------
    ValueError
        For an unknown mode, a geometry that does not give ``out``'s shape, or a dtype that is
        neither floating point nor one of :data:`QUANTIZED_POOL_DTYPES`.
    """
    if quant_params(src.dtype) is not None:
        return _bind_quantized(src, out, mode, window, stride, pad)
    geo = _Pool("Pooling", src.shape, out.shape, mode, window, stride, pad)
    dt = compute_dtype(src.dtype)
    steps: list[Step] = []
    post: list[Step] = []
    fast = geo.compiled
    x = _staged_in(src, dt, steps, contiguous=fast)
    acc = _staged_out(out, dt, post, contiguous=fast)
    if fast and geo.is_global():
        _global_average(geo, _planes(x), _planes(acc), dt, steps)
    elif fast:
        steps.append(geo.split(_forward_loop(geo, _planes(x), _planes(acc), dt)))
    else:
        _numpy_forward(geo, x, acc, dt, steps)
    return chain(steps + post)


def _forward_loop(geo: _Pool, x: np.ndarray, y: np.ndarray, dt: np.dtype):
    k = pool_loops.kernels()
    inv = dt.type(1.0 / math.prod(geo.window))
    if geo.is_(2, 2, 0):
        # windows inside the image: AVERAGE_COUNT_EXCLUDE_PADDING divides by 4 as well
        if geo.mode == "MAX":
            return _partial(k.fwd_max_2x2, x, y)
        return _partial(k.fwd_avg_2x2, x, y, inv)
    if geo.mode == "MAX":
        if geo.is_(3, 2, 1):
            return _partial(k.fwd_max_3s2p1, x, y)
        return _partial(k.fwd_max, x, y, *geo.geometry())
    exclude = geo.mode == "AVERAGE_COUNT_EXCLUDE_PADDING"
    return _partial(k.fwd_avg, x, y, *geo.geometry(), exclude, inv)


def _global_average(geo: _Pool, x: np.ndarray, y: np.ndarray, dt: np.dtype, steps: list):
    """A global average in NumPy, rounded as :func:`.loops._fwd_avg` rounds it: the plane's
    elements summed in order from zero in ``dt``, then times ``1 / area`` (AVERAGE) or divided
    by the area in float64 (AVERAGE_COUNT_EXCLUDE_PADDING). Compiling that loop took about a
    second on a cold cache, more than a classifier's whole head costs."""
    area = math.prod(geo.window)
    xt = workspace.empty((area, geo.planes), dt)  # rows: one window element of every plane
    acc = y.reshape(geo.planes)
    steps.append(_partial(np.copyto, xt, x.reshape(geo.planes, area).T))
    steps.append(_partial(np.add.reduce, xt, 0, None, acc, False, dt.type(0)))
    if geo.mode == "AVERAGE":
        steps.append(_partial(np.multiply, acc, dt.type(1.0 / area), acc))
    else:
        steps.append(_partial(np.true_divide, acc, np.float64(area), acc, casting="unsafe"))


def _numpy_forward(geo: _Pool, x: np.ndarray, acc: np.ndarray, dt: np.dtype, steps: list):
    regions = list(geo.regions())
    if acc[regions[0][0]].shape == acc.shape:
        # the first window offset covers every output: start from it instead of a fill
        steps.append(_partial(np.copyto, acc, x[regions[0][1]]))
        regions = regions[1:]
    else:
        steps.append(_partial(np.copyto, acc, -np.inf if geo.mode == "MAX" else 0))
    for oidx, sidx in regions:
        a = acc[oidx]
        if geo.mode == "MAX":
            steps.append(_partial(np.maximum, a, x[sidx], out=a))
        else:
            steps.append(_partial(np.add, a, x[sidx], a))
    if geo.mode != "MAX":
        div = geo.divisor(dt)
        if np.ndim(div) == 0:
            steps.append(_partial(np.multiply, acc, dt.type(1.0 / float(div)), acc))
        else:
            steps.append(_partial(np.true_divide, acc, div, acc))


# ---- quantized -----------------------------------------------------------------------------
_I32 = np.dtype(np.int32)
#: the quantized dtypes MegDNN's naive pooling takes
QUANTIZED_POOL_DTYPES = ("QuantizedS8", "Quantized8Asymm", "QuantizedS32")


def _is_global(src, out, window, pad) -> bool:
    """Whether a 2-d pooling has one window, the whole plane, per output plane."""
    return (src.ndim == 4 and tuple(out.shape[2:]) == (1, 1) and not any(pad)
            and tuple(window) == tuple(src.shape[2:]))  # fmt: skip


def _bind_quantized(src, out, mode, window, stride, pad) -> Step:
    """The quantized pooling of :func:`bind_pooling`."""
    qp = quant_params(src.dtype)
    if qp.name not in QUANTIZED_POOL_DTYPES:
        raise ValueError(
            f"quantized pooling takes {', '.join(QUANTIZED_POOL_DTYPES)}, got {qp.name}"
        )
    geo = _Pool("Pooling", src.shape, out.shape, mode, window, stride, pad)
    x = src.view(np.dtype(src.dtype.str))
    y = out.view(np.dtype(out.dtype.str))
    regions = list(geo.regions())
    steps: list[Step] = []
    if mode == "MAX":
        if geo.compiled and geo.is_(3, 2, 1) and x.flags.c_contiguous and y.flags.c_contiguous:
            # ResNet's stem pooling: the compiled loop, exact on integers (a maximum rounds
            # nothing); NumPy's nine strided passes took 10x longer on 64x112x112 int8
            return geo.split(_partial(pool_loops.kernels().fwd_max_3s2p1, _planes(x), _planes(y)))
        steps.append(_partial(np.copyto, y, np.iinfo(y.dtype).min))
        for oidx, sidx in regions:
            a = y[oidx]
            steps.append(_partial(np.maximum, a, x[sidx], out=a))
        return chain(steps)
    if (_is_global(src, out, window, pad) and x.dtype.itemsize == 1 and x.flags.c_contiguous
            and y.flags.c_contiguous and geo.compiled):
        # the sum and its requantize in one compiled pass (NumPy's eight steps cost 0.1 ms
        # at 1280x7x7)
        q = np.array([math.prod(geo.window), qp.qmin, qp.qmax], F32)
        part = _partial(pool_loops.kernels().fwd_avg_global_q8,
                        x.reshape(geo.planes, -1), y.reshape(-1), q)  # fmt: skip
        return geo.split(part)
    acc = workspace.empty(out.shape, _I32)
    if _is_global(src, out, window, pad) and x.flags.c_contiguous:
        # one window per plane: its sum in one call (a call per tap took 0.1 ms at 1280x7x7)
        planes = x.reshape(*x.shape[:2], -1)
        steps.append(_partial(np.sum, planes, -1, _I32, acc.reshape(x.shape[:2])))
    else:
        steps.append(_partial(np.copyto, acc, 0))
        for oidx, sidx in regions:
            a = acc[oidx]
            steps.append(_partial(np.add, a, x[sidx], a, casting="unsafe"))  # wraps as C's
    taps = _Pool("Pooling", src.shape, out.shape, "AVERAGE_COUNT_EXCLUDE_PADDING", window,
                 stride, pad)  # fmt: skip
    fed = taps.divisor(_I32)  # the in-image taps of each window
    if mode == "AVERAGE":
        count = geo.divisor(F32)
        if qp.zero_point:
            padded = (np.int32(count) - np.asarray(fed, _I32)) * np.int32(qp.zero_point)
            steps.append(_partial(np.add, acc, padded, acc))
    else:
        count = np.asarray(fed, F32)
    w = workspace.empty(out.shape, F32)
    steps += [_partial(np.copyto, w, acc, "unsafe"), _partial(np.true_divide, w, count, w)]
    steps += round_in_place(w)
    steps += [
        _partial(np.fmax, w, qp.qmin, w),
        _partial(np.fmin, w, qp.qmax, w),
        _partial(np.copyto, y, w, "unsafe"),
    ]
    return chain(steps)


# ---- backward ------------------------------------------------------------------------------
def bind_pooling_backward(
    src: np.ndarray,
    dst: np.ndarray,
    diff: np.ndarray,
    grad: np.ndarray,
    mode: str,
    window: Sequence[int],
    stride: Sequence[int],
    pad: Sequence[int],
) -> Callable[[], None]:
    """Bind the gradient of a pooling w.r.t. its input.

    MAX gives each window's ``diff`` to every element of the window equal to the window's
    maximum (MegDNN's rule, so ties share it; unlike MegDNN's branch, an infinite ``diff``
    also leaks ``0 * inf = NaN`` to the window's other elements); the average modes spread
    ``diff`` divided by the divisor of the forward pooling.

    Parameters
    ----------
    src : numpy.ndarray
        The ``(N, C, *S)`` forward input (read by MAX only).
    dst : numpy.ndarray
        The ``(N, C, *O)`` forward output (read by MAX only).
    diff : numpy.ndarray
        The ``(N, C, *O)`` gradient of the output.
    grad : numpy.ndarray
        The ``(N, C, *S)`` result.
    mode, window, stride, pad
        As for :func:`bind_pooling`.

    Returns
    -------
    Callable[[], None]
        A zero-argument callable computing ``grad``.

    Raises
    ------
    ValueError
        As :func:`bind_pooling`, and for MAX when ``src`` / ``dst`` do not have the shapes of
        ``grad`` / ``diff``.
    """
    geo = _Pool("PoolingBackward", grad.shape, diff.shape, mode, window, stride, pad)
    dt = compute_dtype(diff.dtype)
    if mode == "MAX" and (src.shape != grad.shape or dst.shape != diff.shape):
        raise ValueError(
            f"PoolingBackward: src {src.shape} / dst {dst.shape} must have the shapes of "
            f"grad {grad.shape} / diff {diff.shape}"
        )
    steps: list[Step] = []
    post: list[Step] = []
    fast = geo.compiled
    target = _staged_out(grad, dt, post, contiguous=fast)
    d = _staged_in(diff, dt, steps, contiguous=fast)
    x = y = None
    if mode == "MAX":
        x = _staged_in(src, dt, steps, contiguous=fast)
        y = _staged_in(dst, dt, steps, contiguous=fast)
    if fast and geo.is_global():
        _global_average_backward(geo, _planes(d), _planes(target), dt, steps)
    elif fast:
        x3, y3 = (None, None) if x is None else (_planes(x), _planes(y))
        loop = _backward_loop(geo, x3, y3, _planes(d), _planes(target), dt)
        steps.append(geo.split(loop))
    else:
        _numpy_backward(geo, x, y, d, target, dt, steps)
    return chain(steps + post)


def _backward_loop(geo: _Pool, x, y, d, g, dt: np.dtype):
    k = pool_loops.kernels()
    inv = dt.type(1.0 / math.prod(geo.window))
    if geo.mode == "MAX":
        if geo.is_(2, 2, 0):
            return _partial(k.bwd_max_2x2, x, y, d, g)
        if geo.is_(3, 2, 1):
            return _partial(k.bwd_max_3s2p1, x, y, d, g)
        return _partial(k.bwd_max, x, y, d, g, *geo.geometry())
    if geo.is_(2, 2, 0):
        return _partial(k.bwd_avg_2x2, d, g, inv)
    exclude = geo.mode == "AVERAGE_COUNT_EXCLUDE_PADDING"
    return _partial(k.bwd_avg, d, g, *geo.geometry(), exclude, inv)


def _global_average_backward(geo: _Pool, d, g, dt: np.dtype, steps: list):
    """The gradient of :func:`_global_average`, rounded as :func:`.loops._bwd_avg` rounds it:
    each plane's ``diff`` times ``1 / area`` (in ``dt``; in float64 for
    AVERAGE_COUNT_EXCLUDE_PADDING) added to a zeroed gradient."""
    area = math.prod(geo.window)
    if geo.mode == "AVERAGE":
        scaled = workspace.empty(d.shape, dt)
        steps.append(_partial(np.multiply, d, dt.type(1.0 / area), scaled))
    else:
        scaled = workspace.empty(d.shape, np.float64)
        steps.append(_partial(np.multiply, d, np.float64(1.0) / np.float64(area), scaled))
    steps.append(_partial(np.copyto, g, 0))
    steps.append(_partial(np.add, g, scaled, g, casting="unsafe"))


def _numpy_backward(geo: _Pool, x, y, d, target, dt: np.dtype, steps: list):
    steps.append(_partial(np.copyto, target, 0))
    if geo.mode == "MAX":
        # 1.0 where the window element is the maximum, times diff (``add(where=)`` is 1.8x
        # slower); every region's part of ``hit`` is written before it is read
        hit = workspace.empty(d.shape, dt)
        for oidx, sidx in geo.regions():
            t, h = target[sidx], hit[oidx]
            steps.append(_partial(np.equal, x[sidx], y[oidx], h, casting="unsafe"))
            steps.append(_partial(np.multiply, h, d[oidx], h))
            steps.append(_partial(np.add, t, h, t))
    else:
        scaled = workspace.empty(d.shape, dt)
        steps.append(_partial(np.true_divide, d, geo.divisor(dt), scaled))
        for oidx, sidx in geo.regions():
            t = target[sidx]
            steps.append(_partial(np.add, t, scaled[oidx], t))
