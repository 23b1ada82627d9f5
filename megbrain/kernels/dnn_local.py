"""Locally connected convolution kernels (MegDNN's GroupLocal{Forward,BackwardData,
BackwardFilter}; Local is the one-group case), bound once.

The filter is untied: every output position (oh, ow) has its own weights, laid out
(G, OH, OW, ICg, FH, FW, OCg). The source windows are gathered once per run into a column
buffer of shape (G, OH, OW, N, ICg*FH*FW); each output position is then one small matmul
against its (ICg*FH*FW, OCg) filter, all of them in one batched ``np.matmul(..., out=)``:

* forward: ``out[g, oh, ow] = col[g, oh, ow] @ W[g, oh, ow]`` (N, OCg);
* backward data: ``col = diff @ W^T`` per position, then col2im (one strided add per filter
  offset) into a zero-padded gradient;
* backward filter: ``dW[g, oh, ow] = col[g, oh, ow]^T @ diff[g, oh, ow]`` (the batch is the
  contraction).

As in MegDNN, only CROSS_CORRELATION without dilation exists; zero padding and strides do.
float16 and bfloat16 compute in float32. Buffers rewritten on every run come from
:func:`workspace.empty`; the padded source, whose border is written once, stays private.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from . import workspace
from .arrays import compute_dtype
from .conv.common import _interior, _matrix_in, _matrix_out, _padded, _windows
from .steps import chain

_partial = functools.partial

__all__ = [
    "bind_group_local",
    "bind_group_local_backward_data",
    "bind_group_local_backward_filter",
]

#: (N, G, ICg, FH, FW, OH, OW) windows -> the column layout (G, OH, OW, N, ICg, FH, FW)
_WIN_TO_COL = (1, 5, 6, 0, 2, 3, 4)


def _geometry(filt_shape: tuple) -> tuple[int, int, int, int, int, int, int]:
    g, oh, ow, icg, fh, fw, ocg = (int(s) for s in filt_shape)
    return g, oh, ow, icg, fh, fw, ocg


def _split_channels(a: np.ndarray, g: int) -> np.ndarray:
    """The view (N, G, C/G, ...) of ``a`` (N, C, ...) for any strides (``reshape`` would copy
    a non-contiguous array at bind time, and the copy would never see new values)."""
    n, c, *rest = a.shape
    s0, s1, *srest = a.strides
    return as_strided(a, (n, g, c // g, *rest), (s0, s1 * (c // g), s1, *srest), writeable=False)


def _columns(
    src: np.ndarray, filt_shape: tuple, stride: Sequence[int], pad: Sequence[int], ct, steps
) -> np.ndarray:
    """A (G, OH, OW, N, ICg*FH*FW) buffer a step refills with the windows of ``src``."""
    g, oh, ow, icg, fh, fw, _ = _geometry(filt_shape)
    padded = _padded(src, pad, ct, 0, steps)
    win = _windows(padded, (fh, fw), (oh, ow), stride, (1, 1))  # (N, G*ICg, FH, FW, OH, OW)
    win = _split_channels(win, g).transpose(_WIN_TO_COL)
    col = workspace.empty((g, oh, ow, src.shape[0], icg, fh, fw), ct)
    steps.append(_partial(np.copyto, col, win))
    return col.reshape(g, oh, ow, src.shape[0], icg * fh * fw)


def _diff_matrix(diff: np.ndarray, filt_shape: tuple, ct, steps) -> np.ndarray:
    """``diff`` (N, G*OCg, OH, OW) as a (G, OH, OW, N, OCg) buffer a step refreshes."""
    g, oh, ow, _, _, _, ocg = _geometry(filt_shape)
    src = _split_channels(diff, g).transpose(1, 3, 4, 0, 2)
    buf = workspace.empty((g, oh, ow, diff.shape[0], ocg), ct)
    steps.append(_partial(np.copyto, buf, src, "unsafe"))
    return buf


def bind_group_local(
    src: np.ndarray,
    filt: np.ndarray,
    out: np.ndarray,
    stride: Sequence[int],
    pad: Sequence[int],
) -> Callable[[], None]:
    """Bind ``out = group_local(src, filt)`` (cross-correlation, untied weights).

    Parameters
    ----------
    src : numpy.ndarray
        The (N, G*ICg, IH, IW) input (any strides).
    filt : numpy.ndarray
        The (G, OH, OW, ICg, FH, FW, OCg) filter.
    out : numpy.ndarray
        The (N, G*OCg, OH, OW) output; ``OH = (IH + 2 pad_h - FH) // stride_h + 1``.
    stride, pad : sequence of int
        (h, w) values.

    Returns
    -------
    callable
        Computes ``out[n, g*OCg + o, oh, ow] = sum(src_pad[n, g*ICg + i, oh*sh + fh, ow*sw + fw]
        * filt[g, oh, ow, i, fh, fw, o])`` on every call.
    """
    g, oh, ow, icg, fh, fw, ocg = _geometry(filt.shape)
    n = src.shape[0]
    ct = compute_dtype(src.dtype)
    steps: list = []
    col = _columns(src, filt.shape, stride, pad, ct, steps)
    w = _matrix_in(filt, (g, oh, ow, icg * fh * fw, ocg), ct, steps)
    res = workspace.empty((g, oh, ow, n, ocg), ct)
    steps.append(_partial(np.matmul, col, w, out=res))
    # (G, OH, OW, N, OCg) -> (N, G, OCg, OH, OW)
    post: list = []
    dst = _matrix_out(out, (n, g, ocg, oh, ow), ct, post, blas=False)
    steps.append(_partial(np.copyto, dst, res.transpose(3, 0, 4, 1, 2)))
    return chain(steps + post)


#: backward kind -> (the doc of the operand before ``diff``, what ``grad`` holds)
_BACKWARD_DOCS = {
    "data": (
        "filt : numpy.ndarray\n        The (G, OH, OW, ICg, FH, FW, OCg) filter.",
        "The (N, G*ICg, IH, IW) source gradient",
    ),
    "filter": (
        "src : numpy.ndarray\n        The (N, G*ICg, IH, IW) forward input.",
        "The (G, OH, OW, ICg, FH, FW, OCg) filter gradient",
    ),
}


def _backward_doc(kind: str):
    """Decorate the ``kind`` backward bind: its docstring (a summary) gets the Parameters and
    Returns sections the two share."""
    operand, grad = _BACKWARD_DOCS[kind]

    def decorate(fn: Callable) -> Callable:
        fn.__doc__ = fn.__doc__.rstrip() + f"""

    Parameters
    ----------
    {operand}
    diff : numpy.ndarray
        The (N, G*OCg, OH, OW) output gradient.
    grad : numpy.ndarray
        {grad} written on every call.
    stride, pad : sequence of int
        (h, w) values of the forward operator.

    Returns
    -------
    callable
        The bound computation.
    """
        return fn

    return decorate


@_backward_doc("data")
def bind_group_local_backward_data(
    filt: np.ndarray, diff: np.ndarray, grad: np.ndarray, stride: Sequence[int], pad: Sequence[int]
) -> Callable[[], None]:
    """Bind ``grad = d(sum(group_local(src, filt) * diff)) / d(src)``: the columns' gradient
    by one batched matmul, then col2im."""
    g, oh, ow, icg, fh, fw, ocg = _geometry(filt.shape)
    n, ic, ih, iw = grad.shape
    ct = compute_dtype(diff.dtype)
    steps: list = []
    d = _diff_matrix(diff, filt.shape, ct, steps)
    w = _matrix_in(filt, (g, oh, ow, icg * fh * fw, ocg), ct, steps)
    col = workspace.empty((g, oh, ow, n, icg * fh * fw), ct)
    steps.append(_partial(np.matmul, d, w.swapaxes(-1, -2), out=col))
    # col2im: each filter offset adds its (N, G, ICg, OH, OW) slab at a strided region
    col = col.reshape(g, oh, ow, n, icg, fh, fw)
    ph, pw = pad
    sh, sw = stride
    gp = workspace.empty((n, g, icg, ih + 2 * ph, iw + 2 * pw), ct)
    steps.append(_partial(gp.fill, 0))
    for a in range(fh):
        for b in range(fw):
            region = gp[:, :, :, a : a + sh * (oh - 1) + 1 : sh, b : b + sw * (ow - 1) + 1 : sw]
            slab = col[..., a, b].transpose(3, 0, 4, 1, 2)
            steps.append(_partial(np.add, region, slab, out=region))
    inner = _interior(gp.reshape(n, ic, ih + 2 * ph, iw + 2 * pw), pad, (ih, iw))
    steps.append(_partial(np.copyto, grad, inner, "unsafe"))
    return chain(steps)


@_backward_doc("filter")
def bind_group_local_backward_filter(
    src: np.ndarray, diff: np.ndarray, grad: np.ndarray, stride: Sequence[int], pad: Sequence[int]
) -> Callable[[], None]:
    """Bind ``grad = d(sum(group_local(src, filt) * diff)) / d(filt)``."""
    g, oh, ow, icg, fh, fw, ocg = _geometry(grad.shape)
    ct = compute_dtype(src.dtype)
    steps: list = []
    col = _columns(src, grad.shape, stride, pad, ct, steps)
    d = _diff_matrix(diff, grad.shape, ct, steps)
    post: list = []
    dw = _matrix_out(grad, (g, oh, ow, icg * fh * fw, ocg), ct, post)
    steps.append(_partial(np.matmul, col.swapaxes(-1, -2), d, out=dw))
    return chain(steps + post)
