"""Compiled (Numba) loops of TRAINING-mode batch normalization over (N, C, L) float32 arrays
(NCHW with the statistics per channel): the forward in one reading pass for the statistics
and one writing pass, the backward in one reading pass for its two sums and one writing pass.

Single-threaded and GIL-free (``nogil``), over a ``[c0, c1)`` range of channels, so that a
caller splits one call over :mod:`.parallel`'s threads. Sums are accumulated in float64 in
four interleaved partial sums (a fixed order: the results are reproducible); the statistics
are shifted by the channel's first value, so that one pass gives the variance without the
cancellation of ``E[x^2] - E[x]^2``. Compiled on first use.
"""

from __future__ import annotations

import functools

from numba import njit

__all__ = ["bn_forward_training", "bn_backward"]


def _bn_forward_py(x, scale, bias, y, mean, var, save_mean, save_inv, eps, c0, c1):
    # pragma: no cover - compiled
    """Channels [c0, c1): ``mean``/``var`` (float64, the biased variance), ``save_mean`` and
    ``save_inv = 1/sqrt(var + eps)``, ``y = (x - mean) * save_inv * scale + bias``."""
    n_, _c, l_ = x.shape
    cnt = n_ * l_
    l4 = l_ - l_ % 4
    for c in range(c0, c1):
        shift = float(x[0, c, 0])
        s0 = s1 = s2 = s3 = 0.0
        q0 = q1 = q2 = q3 = 0.0
        for n in range(n_):
            xr = x[n, c]
            for i in range(0, l4, 4):
                d0 = xr[i] - shift
                d1 = xr[i + 1] - shift
                d2 = xr[i + 2] - shift
                d3 = xr[i + 3] - shift
                s0 += d0
                s1 += d1
                s2 += d2
                s3 += d3
                q0 += d0 * d0
                q1 += d1 * d1
                q2 += d2 * d2
                q3 += d3 * d3
            for i in range(l4, l_):
                d0 = xr[i] - shift
                s0 += d0
                q0 += d0 * d0
        md = ((s0 + s1) + (s2 + s3)) / cnt
        v = ((q0 + q1) + (q2 + q3)) / cnt - md * md
        if v < 0.0:
            v = 0.0
        m = md + shift
        inv = 1.0 / (v + eps) ** 0.5
        mean[c] = m
        var[c] = v
        save_mean[c] = m
        save_inv[c] = inv
        k = inv * float(scale[c])
        b = float(bias[c])
        # in float64: x - mean loses nothing to the mean's rounding
        for n in range(n_):
            xr = x[n, c]
            yr = y[n, c]
            for i in range(l_):
                yr[i] = (xr[i] - m) * k + b


def _bn_backward_py(x, dy, save_mean, save_inv, scale, d_scale, d_bias, dx, c0, c1):
    # pragma: no cover - compiled
    """Channels [c0, c1): ``d_bias = sum dy``, ``d_scale = sum dy (x - mean) * inv`` and
    ``dx = scale inv (dy - d_bias / n - (x - mean) inv d_scale / n)``."""
    n_, _c, l_ = x.shape
    cnt = n_ * l_
    l4 = l_ - l_ % 4
    for c in range(c0, c1):
        mu = float(save_mean[c])
        s0 = s1 = s2 = s3 = 0.0
        q0 = q1 = q2 = q3 = 0.0
        for n in range(n_):
            xr = x[n, c]
            gr = dy[n, c]
            for i in range(0, l4, 4):
                g0 = float(gr[i])
                g1 = float(gr[i + 1])
                g2 = float(gr[i + 2])
                g3 = float(gr[i + 3])
                s0 += g0
                s1 += g1
                s2 += g2
                s3 += g3
                q0 += g0 * (xr[i] - mu)
                q1 += g1 * (xr[i + 1] - mu)
                q2 += g2 * (xr[i + 2] - mu)
                q3 += g3 * (xr[i + 3] - mu)
            for i in range(l4, l_):
                g0 = float(gr[i])
                s0 += g0
                q0 += g0 * (xr[i] - mu)
        sg = (s0 + s1) + (s2 + s3)
        sgx = (q0 + q1) + (q2 + q3)
        inv = float(save_inv[c])
        d_bias[c] = sg
        d_scale[c] = sgx * inv
        a = float(scale[c]) * inv
        b = -a * inv * inv * sgx / cnt
        k = -a * sg / cnt
        for n in range(n_):
            xr = x[n, c]
            gr = dy[n, c]
            dr = dx[n, c]
            for i in range(l_):
                dr[i] = gr[i] * a + (xr[i] - mu) * b + k


def bn_forward_training(x, scale, bias, y, mean, var, save_mean, save_inv, eps: float,
                        c0: int, c1: int) -> None:  # fmt: skip
    """Channels [c0, c1) of the TRAINING forward (:func:`_bn_forward_py`): ``x``, ``y``
    (N, C, L) float32; ``scale``, ``bias``, ``save_mean``, ``save_inv`` (C,) float32;
    ``mean``, ``var`` (C,) float64."""
    _compiled()[0](x, scale, bias, y, mean, var, save_mean, save_inv, float(eps), int(c0),
                   int(c1))  # fmt: skip


def bn_backward(x, dy, save_mean, save_inv, scale, d_scale, d_bias, dx, c0: int,
                c1: int) -> None:  # fmt: skip
    """Channels [c0, c1) of the backward (:func:`_bn_backward_py`): ``x``, ``dy``, ``dx``
    (N, C, L) float32, the rest (C,) float32."""
    _compiled()[1](x, dy, save_mean, save_inv, scale, d_scale, d_bias, dx, int(c0), int(c1))


@functools.cache
def _compiled():
    jit = njit(nogil=True, cache=True, error_model="numpy", fastmath=False)
    return jit(_bn_forward_py), jit(_bn_backward_py)
