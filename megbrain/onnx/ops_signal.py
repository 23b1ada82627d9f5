"""Signal ONNX operators: the window functions (HannWindow, HammingWindow, BlackmanWindow),
computed at load, and DFT as one matrix product: the transform along an axis is linear in the
input's real and imaginary parts, so its (n_in * c, n_out * c_out) real matrix is computed at
load with NumPy's FFT of each basis vector and applied with a matrix multiply."""

from __future__ import annotations

import numpy as np

import megbrain as mgb

from .loader import onnx_to_np_dtype
from .ops_tensor import _norm_axis, _reshape, static_shape
from .registry import Attr, converter


def _dft_matrix(n_in, c, length, inverse, onesided):
    rows = []
    for k in range(n_in * c):
        e = np.zeros(n_in * c)
        e[k] = 1.0
        e = e.reshape(n_in, c)
        s = e[:, 0] + 1j * e[:, 1] if c == 2 else e[:, 0]
        if inverse:
            if onesided:
                out = np.fft.irfft(s, n=length)[:, None]
            else:
                z = np.fft.ifft(s, n=length)
                out = np.stack([z.real, z.imag], axis=1)
        else:
            z = np.fft.fft(s, n=length)
            if onesided:
                z = z[: length // 2 + 1]
            out = np.stack([z.real, z.imag], axis=1)
        rows.append(out.reshape(-1))
    co = 1 if inverse and onesided else 2
    return np.stack(rows).astype(np.float32), co


def _dft(ctx, axis):
    x = ctx.input(0)
    src = static_shape(ctx, x)
    nd = len(src)
    axis = _norm_axis(ctx, axis, nd)
    c = src[-1]
    if axis == nd - 1 or c not in (1, 2):
        raise ctx.fail(f"input {src}: the last dim (1 real or 2 complex) cannot be the axis")
    inverse, onesided = bool(ctx.attr("inverse")), bool(ctx.attr("onesided"))
    n_in = src[axis]
    if ctx.has(1):
        length = int(ctx.const(1, "dft_length").ravel()[0])
    else:
        length = 2 * (n_in - 1) if inverse and onesided else n_in
    mat, co = _dft_matrix(n_in, c, length, inverse, onesided)
    n_out = mat.shape[1] // co
    rest = [i for i in range(nd - 1) if i != axis]
    t = mgb.opr.dimshuffle(x, rest + [axis, nd - 1])
    rows = int(np.prod([src[i] for i in rest]))
    xf = t if np.dtype(x.dtype) == np.float32 else mgb.opr.typecvt(t, np.float32)
    y = mgb.opr.matrix_mul(_reshape(xf, (rows, n_in * c)), ctx.imm(mat))
    y = _reshape(y, [src[i] for i in rest] + [n_out, co])
    back = list(range(len(rest)))
    back.insert(axis, len(rest))
    y = mgb.opr.dimshuffle(y, back + [len(rest) + 1])
    return y if np.dtype(x.dtype) == np.float32 else mgb.opr.typecvt(y, x.dtype)


_DFT_ATTRS = {"inverse": Attr(0, frozenset({0, 1})), "onesided": Attr(0, frozenset({0, 1}))}


@converter("DFT", 17, 19, attrs={**_DFT_ATTRS, "axis": 1})
def _dft17(ctx):
    return _dft(ctx, ctx.attr("axis"))


@converter("DFT", 20, attrs=_DFT_ATTRS)
def _dft20(ctx):
    return _dft(ctx, int(ctx.const(2, "axis").ravel()[0]) if ctx.has(2) else -2)


# ---- window functions --------------------------------------------------------------------
def _window(ctx, fn):
    size = int(ctx.const(0, "size").ravel()[0])
    n = np.arange(size, dtype=np.float64)
    denom = size if ctx.attr("periodic") else size - 1
    dt = onnx_to_np_dtype(ctx.attr("output_datatype"), where=ctx.where)
    with np.errstate(divide="ignore", invalid="ignore"):
        return ctx.imm(fn(n, denom).astype(dt), dt)


_WINDOW_ATTRS = {"output_datatype": 1, "periodic": Attr(1, frozenset({0, 1}))}


@converter("HannWindow", 17, attrs=_WINDOW_ATTRS)
def _hann_window(ctx):
    return _window(ctx, lambda n, d: np.sin(np.pi * n / d) ** 2)


@converter("HammingWindow", 17, attrs=_WINDOW_ATTRS)
def _hamming_window(ctx):
    a = 25.0 / 46.0
    return _window(ctx, lambda n, d: a - (1 - a) * np.cos(2 * np.pi * n / d))


@converter("BlackmanWindow", 17, attrs=_WINDOW_ATTRS)
def _blackman_window(ctx):
    return _window(
        ctx, lambda n, d: 0.42 - 0.5 * np.cos(2 * np.pi * n / d) + 0.08 * np.cos(4 * np.pi * n / d)
    )
