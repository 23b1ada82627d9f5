"""Normalization kernels (MegDNN's BNForward/BNBackward and LRN forward/backward), bound once
to their arrays and run into the given outputs.

Low-precision floats (float16, bfloat16) are computed in float32; float32 and float64 in their
own precision. The TRAINING forward and the backward of float32 NCHW-like arrays with per-channel
statistics run the compiled loops of :mod:`.norm_loops` (float64 sums); the rest NumPy.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

from . import norm_loops, parallel, workspace

__all__ = [
    "bn_reduce_axes",
    "bind_bn_forward",
    "bind_bn_backward",
    "bind_lrn_forward",
    "bind_lrn_backward",
]


def _ct(*arrays: np.ndarray) -> np.dtype:
    """The compute dtype: float64 if any operand is float64, else float32."""
    if any(a.dtype == np.float64 for a in arrays):
        return np.dtype(np.float64)
    return np.dtype(np.float32)


def _cast(a: np.ndarray, ct: np.dtype) -> np.ndarray:
    return a if a.dtype == ct else a.astype(ct)


def _store(out: np.ndarray, val) -> None:
    np.copyto(out, val, casting="unsafe")


def _update_running_stats(out_mean, out_var, mean, var, m, v, n: int, f: float) -> None:
    """``out = old * (1 - f) + batch * f`` for the mean and the variance, the batch variance
    ``v`` made unbiased (``n / (n - 1)``; ``n == 1`` gives inf/nan as in MegDNN). The
    right-hand sides are computed before the store: correct when ``out_*`` is the input's own
    memory."""
    with np.errstate(divide="ignore", invalid="ignore"):
        unbiased = v * (n / (n - 1) if n > 1 else np.inf)
    _store(out_mean, mean * (1 - f) + m * f)
    _store(out_var, var * (1 - f) + unbiased * f)


def bn_reduce_axes(x_shape: tuple, param_shape: tuple) -> tuple[int, ...]:
    """The axes BatchNorm reduces over: those where the param (scale) has size 1."""
    del x_shape
    return tuple(i for i, s in enumerate(param_shape) if s == 1)


#: fewest channels per thread of the compiled loops (below it one thread runs them all)
_MIN_CHANNELS = 4


def _channel_views(x: np.ndarray, params: tuple, outs: tuple = ()) -> tuple | None:
    """``x`` (and the same-shaped ``outs``) as (N, C, L) and each of ``params`` as (C,), all
    views of their memory, when the compiled loops of :mod:`.norm_loops` apply: float32,
    statistics per axis 1, every array C-contiguous and the outputs writable; else None."""
    arrays = (x, *params, *outs)
    if x.ndim < 2 or any(a.dtype != np.float32 or not a.flags.c_contiguous for a in arrays):
        return None
    if any(not o.flags.writeable for o in outs):
        return None
    c = x.shape[1]
    if any(p.size != c or p.ndim != x.ndim or p.shape[1] != c for p in params):
        return None
    nlc = (x.shape[0], c, math.prod(x.shape[2:]))
    if nlc[0] * nlc[2] == 0:
        return None
    return tuple(a.reshape(nlc) for a in (x, *outs)), tuple(p.reshape(c) for p in params)


def bind_bn_forward(
    x: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray,
    mean: np.ndarray | None,
    var: np.ndarray | None,
    out_mean: np.ndarray,
    out_var: np.ndarray,
    save_mean: np.ndarray,
    save_inv_var: np.ndarray,
    y: np.ndarray,
    *,
    training: bool,
    epsilon: float,
    avg_factor: float,
    tail: str | None = None,
) -> Callable[[], None]:
    """Batch normalization over the axes where ``scale`` has size 1.

    TRAINING: batch statistics normalize ``x``; ``save_mean``/``save_inv_var`` receive the batch
    mean and ``1/sqrt(var + eps)`` (biased variance) and, when ``mean``/``var`` are given,
    ``out_mean``/``out_var`` receive ``old*(1-avg_factor) + batch*avg_factor`` where the variance
    is the unbiased one (``n/(n-1)``; ``n == 1`` gives inf/nan as in MegDNN). ``out_mean`` and
    ``out_var`` may be ``mean`` and ``var`` themselves (the operator's in-place update).
    INFERENCE: ``mean`` and ``var`` normalize ``x``; ``save_mean``/``save_inv_var`` receive them
    as used. ``tail`` ("RELU" or "RELU6", TRAINING only) clamps ``y`` as the activation
    would (:data:`.norm_loops.TAILS`), in the writing pass.
    """
    if tail is not None and (tail not in norm_loops.TAILS or not training):
        raise ValueError(f"BatchNorm: tail {tail!r} needs TRAINING and one of RELU, RELU6")
    axes = bn_reduce_axes(x.shape, scale.shape)
    n = math.prod(x.shape[i] for i in axes)
    ct = _ct(x, scale)
    eps, f = float(epsilon), float(avg_factor)
    has_stats = mean is not None and out_mean.size > 0
    views = _channel_views(x, (scale, bias, save_mean, save_inv_var), (y,)) if training else None
    if views is not None:
        return _bn_forward_compiled(views, mean, var, out_mean, out_var, has_stats, n, eps, f,
                                    tail)  # fmt: skip

    # buffers fixed at bind time: the hot path only runs ufuncs with out=
    pshape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    xs = x if x.dtype == ct else np.empty(x.shape, ct)
    dev = workspace.empty(x.shape, ct)  # x - mean, rewritten every run
    ys = y if (y.dtype == ct and y.flags.writeable) else np.empty(y.shape, ct)
    m = np.empty(pshape, ct)
    v = np.empty(pshape, ct)
    inv = np.empty(pshape, ct)
    k = np.empty(pshape, ct)
    sc, bi = scale, bias

    def run_training() -> None:
        if xs is not x:
            np.copyto(xs, x, casting="unsafe")
        np.mean(xs, axis=axes, keepdims=True, out=m)
        np.subtract(xs, m, out=dev)
        np.multiply(dev, dev, out=ys)  # ys as scratch for the squares
        np.mean(ys, axis=axes, keepdims=True, out=v)
        np.add(v, eps, out=inv)
        np.sqrt(inv, out=inv)
        np.divide(1.0, inv, out=inv)
        _store(save_mean, m)
        _store(save_inv_var, inv)
        if has_stats:
            _update_running_stats(out_mean, out_var, _cast(mean, ct), _cast(var, ct), m, v, n, f)
        np.multiply(inv, sc, out=k, casting="unsafe")
        np.multiply(dev, k, out=ys)
        np.add(ys, bi, out=ys, casting="unsafe")
        if tail is not None:
            _clamp(ys, tail)
        if ys is not y:
            _store(y, ys)

    def run_inference() -> None:
        xc = _cast(x, ct)
        inv = 1.0 / np.sqrt(_cast(var, ct) + eps)
        _store(save_mean, mean)
        _store(save_inv_var, inv)
        d = xc - _cast(mean, ct)
        d *= inv * _cast(scale, ct)
        d += _cast(bias, ct)
        _store(y, d)

    return run_training if training else run_inference


def _clamp(y: np.ndarray, tail: str) -> None:
    """``y`` clamped in place as the activation ``tail`` (NaN kept, as RELU and MIN keep
    it)."""
    np.maximum(y, 0, out=y)
    if tail == "RELU6":
        np.minimum(y, 6, out=y)


def _bn_forward_compiled(views, mean, var, out_mean, out_var, has_stats, n, eps, f, tail):
    """The TRAINING forward through :func:`.norm_loops.bn_forward_training` split over the
    channels, then the running statistics' update (C values) as :func:`bind_bn_forward`
    says."""
    (x3, y3), (sc, bi, smean, sinv) = views
    c = x3.shape[1]
    m64, v64 = np.empty(c), np.empty(c)
    loop = parallel.split(
        functools.partial(
            norm_loops.bn_forward_training, x3, sc, bi, y3, m64, v64, smean, sinv, eps,
            tail=tail,
        ),
        c,
        _MIN_CHANNELS,
    )  # fmt: skip
    if not has_stats:
        return loop
    m, v = m64.reshape(out_mean.shape), v64.reshape(out_mean.shape)

    def run() -> None:
        loop()
        _update_running_stats(out_mean, out_var, mean, var, m, v, n, f)

    return run


def bind_bn_backward(
    x: np.ndarray,
    dy: np.ndarray,
    save_mean: np.ndarray,
    save_inv_var: np.ndarray,
    scale: np.ndarray,
    d_scale: np.ndarray,
    d_bias: np.ndarray,
    dx: np.ndarray,
    *,
    tail: str | None = None,
    z: np.ndarray | None = None,
) -> Callable[[], None]:
    """The gradient of TRAINING-mode batch normalization w.r.t. scale, bias and x; with a
    ``tail`` ("RELU" or "RELU6"), of the normalization followed by that activation:
    ``dy`` is then the gradient of the clamped output ``z`` (the tail forward's ``y``), kept
    where the clamp is not flat (``0 < z``, and ``z < 6`` for RELU6; the gradient of
    ``min(y, 6)`` at exactly 6 taken as 0, PyTorch's ``hardtanh_backward``), inside the
    backward's two passes."""
    if (tail is None) != (z is None) or tail not in norm_loops.TAILS:
        raise ValueError(f"BatchNormBackward: tail {tail!r} needs z (and z a tail)")
    axes = bn_reduce_axes(x.shape, scale.shape)
    n = math.prod(x.shape[i] for i in axes)
    ct = _ct(x, scale)
    outs = (dy, dx) if z is None else (dy, dx, z)
    views = _channel_views(x, (save_mean, save_inv_var, scale, d_scale, d_bias), outs)
    if views is not None and dy.shape == x.shape and (z is None or z.shape == x.shape):
        (x3, dy3, dx3, *z3), params = views
        sums = np.empty((2, x3.shape[1]))
        return parallel.split(
            functools.partial(norm_loops.bn_backward, x3, dy3, *params, dx3, sums,
                              z=z3[0] if z3 else None, tail=tail),
            x3.shape[1],
            _MIN_CHANNELS,
        )  # fmt: skip

    def run() -> None:
        mu, ivar = _cast(save_mean, ct), _cast(save_inv_var, ct)
        xmu = _cast(x, ct) - mu
        g = _cast(dy, ct)
        if z is not None:
            zc = _cast(z, ct)
            keep = zc > 0 if tail == "RELU" else (zc > 0) & (zc < 6)
            g = np.where(keep, g, 0)
        _store(d_bias, g.sum(axis=axes, keepdims=True))
        _store(d_scale, (g * xmu).sum(axis=axes, keepdims=True) * ivar)
        dxhat = g * _cast(scale, ct)
        dvar = (dxhat * xmu).sum(axis=axes, keepdims=True) * (-0.5 * ivar**3)
        dmu = dxhat.sum(axis=axes, keepdims=True) * -ivar
        dxhat *= ivar
        dxhat += xmu * (2.0 * dvar / n)
        dxhat += dmu / n
        _store(dx, dxhat)

    return run


def _window_sum(sq: np.ndarray, half: int) -> np.ndarray:
    """``out[:, c] = sum(sq[:, max(0, c-half) : c+half+1])`` along axis 1."""
    out = sq.copy()
    nc = sq.shape[1]
    for k in range(1, min(half, nc - 1) + 1):
        out[:, k:] += sq[:, :-k]
        out[:, :-k] += sq[:, k:]
    return out


def bind_lrn_forward(
    src: np.ndarray, dst: np.ndarray, *, n: int, k: float, alpha: float, beta: float
) -> Callable[[], None]:
    """``dst = src * (k + alpha * sum_{window of n channels} src**2) ** -beta`` (NCHW)."""
    ct, half = _ct(src), n // 2

    def run() -> None:
        s = _cast(src, ct)
        t = _window_sum(s * s, half)
        t *= alpha
        t += k
        _store(dst, s * t ** (-beta))

    return run


def bind_lrn_backward(
    src: np.ndarray,
    diff: np.ndarray,
    grad: np.ndarray,
    *,
    n: int,
    k: float,
    alpha: float,
    beta: float,
) -> Callable[[], None]:
    """The gradient of LRN w.r.t. its input, given the output gradient ``diff``."""
    ct, half = _ct(src), n // 2

    def run() -> None:
        s, h = _cast(src, ct), _cast(diff, ct)
        t = _window_sum(s * s, half)
        t *= alpha
        t += k
        cross = _window_sum(h * s * t ** (-beta - 1.0), half)
        _store(grad, h * t ** (-beta) - (2.0 * alpha * beta) * s * cross)

    return run
