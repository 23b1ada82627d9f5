"""Convolution kernels (MegDNN's Convolution{,3D}{Forward,BackwardData,BackwardFilter}) for
batch-channel-first layouts, bound once (pooling is in :mod:`.dnn_pool`).

Convolution is im2col plus one GEMM per batch chunk. The windows of a chunk of samples are
copied once into a column buffer in the batch-inner layout ``(C, *F, k, *O)``, so that one
2-d matmul per group, ``res[g] = W[g] @ col[g]`` with ``col[g]`` of shape ``(K, k * L)``,
covers every sample; a copy puts the ``(OC, k, *O)`` result into the ``(k, OC, *O)`` output
(a one-sample chunk's GEMM writes the output itself). 2-d float32/float64 columns are filled
by the compiled loops of :mod:`conv_gemm_loops` straight from the source (padding written as
zeros by the loop), in chunks of at most :data:`CACHE_CHUNK_BYTES`, so that the GEMM reads the
columns from the cache the loop just wrote them to; with at least as many samples as kernel
threads, each thread runs its own im2col + GEMM pipeline over its part of the batch, BLAS
single-threaded (:func:`parallel.blas_single_threaded`), one fork/join per call. Other
convolutions (1-d, 3-d) read the source through a strided window view (``as_strided``) of a
zero-padded copy, one NumPy copy per chunk.

Backward data with stride 1 and a "same" padding may be the forward convolution of ``diff``
with the transposed, flipped filter (AS_FORWARD_CONV); GEMM_COL2IM is the transposed GEMM
``W^T @ diff`` followed by col2im, compiled (and pipelined per thread, chunk by chunk, as the
forward pass) for 2-d gradients, else one strided add per filter offset.
Backward filter is the GEMM ``col (K, k * L) @ diff (k * L, OCg)`` against a channel-last copy
of ``diff``, the batch summed inside the GEMM. Any number of spatial dims works (2-d and 3-d
convolution share the code). Filters are grouped, ``(G, OCg, ICg, *F)``; a dense filter is
the G = 1 view ``filt[None]``. float16 and bfloat16 compute in float32.

Each convolution formulation is an algorithm (``fwd_*``, ``bwd_data_*``, ``bwd_filter_*``
with a ``usable`` predicate) that :mod:`megbrain.kernels.conv_algos` registers; the public
``bind_convolution`` / ``bind_conv_backward_data`` / ``bind_conv_backward_filter`` choose one
per shape through it, as their ``strategy`` (the execution policy) says; HEURISTIC, the
default, makes the choices described here.

Measured on the 2-core machines (OpenBLAS, 2 threads): one GEMM per chunk beat per-sample
GEMMs threaded by OpenBLAS (the 8x64x56x56 3x3 forward went from 0.3x to about 0.9x
PyTorch); NumPy's stacked (1, M, K) @ (1, K, N) matmul ran 3-4x slower than the 2-d call on
the same operands; and ``diff @ col^T`` (OCg rows) ran 4-5x slower than ``col @ diff^T`` (K
rows), its threads synchronising once per block of the long k * L reduction. Under load,
OpenBLAS's threads synchronising (and spinning) on every small chunk's GEMM cost far more
than the GEMMs (128x16x14x14 3x3 forward: 76 ms of CPU time against 7 ms for the per-thread
pipelines, PyTorch 9 ms).

Every buffer (padded source, column buffer, staging copies) is allocated at bind time, so the
bound callables allocate nothing. The buffers rewritten on every run (the column buffers,
the GEMM results, the batch-inner and channel-last copies of ``diff``, backward data's
padded gradient, contiguous staging copies) come from :func:`workspace.empty`, so
the executor places them in the static memory plan (a workspace); the padded source,
whose border is written once, stays private. The column buffer is capped at
:data:`COL_BUFFER_LIMIT` bytes by processing the batch in chunks.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import ml_dtypes
import numpy as np
from numpy.lib.stride_tricks import as_strided

from . import conv_epilogue, gemm, parallel, workspace
from .parallel import split
from .steps import Step, chain

__all__ = [
    "CACHE_CHUNK_BYTES",
    "COL2IM_MAX_SAMPLE_BYTES",
    "COL_BUFFER_LIMIT",
    "PER_SAMPLE_MAX_K",
    "SPLIT_MIN_ELEMS",
    "bind_conv_backward_data",
    "bind_conv_backward_filter",
    "bind_convolution",
    "check_convolution",
    "compute_dtype",
    "conv_out_size",
    "deconv_out_size",
]

_partial = functools.partial
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_LOW_FLOATS = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
#: the most bytes one column buffer may take; larger batches are processed in chunks
COL_BUFFER_LIMIT = 256 << 20
#: a forward convolution whose reduction (ICg * prod(F)) is at most this long runs one GEMM per
#: sample: measured on 2 cores, (16, 9) @ (9, 784) x 128 took 2 ms, the single
#: (16, 9) @ (9, 100352) GEMM 46 ms (OpenBLAS threads it); from K = 144 on, the single GEMM wins
PER_SAMPLE_MAX_K = 32
#: the most column bytes one batch chunk of a compiled (2-d) im2col + GEMM takes: small
#: enough that the GEMM reads the columns from the cache (L2 is 512 KB per core here)
CACHE_CHUNK_BYTES = 512 << 10
#: fewest elements a compiled im2col / col2im call splits over the kernel threads
SPLIT_MIN_ELEMS = 1 << 15


# ---- sizes ---------------------------------------------------------------------------------
def conv_out_size(size: int, filt: int, stride: int, pad: int, dilate: int) -> int:
    """Output length of a convolution along one dim (may be <= 0 for a too-small input)."""
    return (size + 2 * pad - dilate * (filt - 1) - 1) // stride + 1


def deconv_out_size(size: int, filt: int, stride: int, pad: int, dilate: int) -> int:
    """Input length a convolution with output length ``size`` is deduced to have."""
    return (size - 1) * stride + dilate * (filt - 1) + 1 - 2 * pad


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype kernels compute in: float32 for float16/bfloat16, else the dtype itself.

    Raises
    ------
    ValueError
        For a dtype that is not floating point.
    """
    dtype = np.dtype(dtype)
    if dtype in _LOW_FLOATS:
        return _F32
    if dtype in (_F32, _F64):
        return dtype
    raise ValueError(f"unsupported dtype {dtype.name} (floating point only)")


# ---- helpers -------------------------------------------------------------------------------
def _reshaped(a: np.ndarray, shape: tuple) -> np.ndarray | None:
    """``a.reshape(shape)`` when that is a view of ``a`` (no copy), else None."""
    r = a.reshape(shape)
    if r.size and not np.may_share_memory(r, a):
        return None
    return r


def _blasable(m: np.ndarray) -> bool:
    """Whether every matrix of the stack ``m`` is row- or column-major, so that matmul hands
    it to BLAS as is (NumPy falls back to a slow loop otherwise)."""
    it = m.itemsize
    (r, c), (s0, s1) = m.shape[-2:], m.strides[-2:]
    s1 = it if c == 1 else s1  # the stride of a length-1 dim is irrelevant
    s0 = it * c if r == 1 else s0
    row_major = s1 == it and s0 % it == 0 and s0 >= it * c
    return row_major or (s0 == it and s1 % it == 0 and s1 >= it * r)


def _matrix_in(
    a: np.ndarray, shape: tuple, dtype: np.dtype, steps: list, blas: bool = True
) -> np.ndarray:
    """``a`` as ``shape`` in ``dtype`` (a BLAS operand unless ``blas`` is False): a view, or a
    buffer a step refreshes from ``a``."""
    if a.dtype == dtype:
        r = _reshaped(a, shape)
        if r is not None and (not blas or _blasable(r)):
            return r
    buf = np.empty(a.shape, dtype)
    steps.append(_partial(np.copyto, buf, a, "unsafe"))
    return buf.reshape(shape)


def _matrix_out(
    a: np.ndarray, shape: tuple, dtype: np.dtype, post: list, blas: bool = True
) -> np.ndarray:
    """A writable ``shape`` view of output ``a`` (a BLAS result unless ``blas`` is False), or a
    buffer a step copies into ``a`` after."""
    if a.dtype == dtype and a.flags.writeable:
        r = _reshaped(a, shape)
        if r is not None and (not blas or _blasable(r)):
            return r
    buf = np.empty(a.shape, dtype)
    post.append(_partial(np.copyto, a, buf, "unsafe"))
    return buf.reshape(shape)


def _contiguous(a: np.ndarray, dtype, steps: list) -> np.ndarray:
    """``a`` itself when it is C-contiguous in ``dtype``, else a workspace copy a step
    refreshes."""
    if a.dtype == dtype and a.flags.c_contiguous:
        return a
    buf = workspace.empty(a.shape, dtype)
    steps.append(_partial(np.copyto, buf, a, "unsafe"))
    return buf


def _interior(a: np.ndarray, pad: Sequence[int], spatial: Sequence[int]) -> np.ndarray:
    idx = (slice(None), slice(None), *(slice(p, p + s) for p, s in zip(pad, spatial)))
    return a[idx]


def _padded(src: np.ndarray, pad, dtype, fill, steps: list) -> np.ndarray:
    """``src`` ``(N, C, *S)`` padded by ``pad`` with ``fill``, in ``dtype`` (``src`` itself when
    there is nothing to do); a step refreshes the interior from ``src`` on every run."""
    if not any(pad) and src.dtype == dtype:
        return src
    spatial = src.shape[2:]
    shape = src.shape[:2] + tuple(s + 2 * p for s, p in zip(spatial, pad))
    buf = np.full(shape, fill, dtype)  # workspace: its border is written once, here
    steps.append(_partial(np.copyto, _interior(buf, pad, spatial), src, "unsafe"))
    return buf


def _windows(a: np.ndarray, fshape, oshape, stride, dilate) -> np.ndarray:
    """The read-only view ``(N, C, *F, *O)`` of ``a`` ``(N, C, *S)`` whose element [n, c, *f, *o] is
    ``a[n, c, *(o * stride + f * dilate)]``."""
    sp = a.strides[2:]
    strides = (
        a.strides[:2]
        + tuple(s * d for s, d in zip(sp, dilate))
        + tuple(s * t for s, t in zip(sp, stride))
    )
    return as_strided(a, a.shape[:2] + tuple(fshape) + tuple(oshape), strides, writeable=False)


def _offset_slices(fshape, oshape, stride, dilate):
    """(f, index) for each filter offset f: ``index`` selects the positions
    ``o * stride + f * dilate`` of an ``(N, C, *S)`` array, giving an ``(N, C, *O)`` view."""
    for f in np.ndindex(*fshape):
        idx = tuple(
            slice(fi * d, fi * d + s * (o - 1) + 1, s)
            for fi, d, s, o in zip(f, dilate, stride, oshape)
        )
        yield f, (slice(None), slice(None), *idx)


def _chunks(
    n: int, per_sample_bytes: int, limit: int | None = None
) -> tuple[int, list[tuple[int, int]]]:
    """Batch chunk size keeping a column buffer under the limits, and the (begin, end) chunks."""
    cap = COL_BUFFER_LIMIT if limit is None else min(limit, COL_BUFFER_LIMIT)
    nb = max(1, min(n, cap // max(1, per_sample_bytes)))
    return nb, [(i, min(n, i + nb)) for i in range(0, n, nb)]


def _flipped(a: np.ndarray, nsp: int) -> np.ndarray:
    return a[(..., *([slice(None, None, -1)] * nsp))]


def _is_pointwise(fshape, stride, pad) -> bool:
    return all(f == 1 for f in fshape) and all(s == 1 for s in stride) and not any(pad)


class _Conv:
    """The geometry of one grouped convolution, checked against the arrays' shapes."""

    def __init__(self, name, src_shape, filt_shape, out_shape, stride, pad, dilate):
        nsp = len(src_shape) - 2
        self.nsp = nsp
        if len(filt_shape) != nsp + 3 or len(out_shape) != nsp + 2:
            raise ValueError(
                f"{name}: src {src_shape}, grouped filter {filt_shape} and output {out_shape} "
                f"must have {nsp + 2}, {nsp + 3} and {nsp + 2} dims"
            )
        if not len(stride) == len(pad) == len(dilate) == nsp:
            raise ValueError(f"{name}: stride, pad and dilate need {nsp} values each")
        self.n, self.c = src_shape[:2]
        self.g, self.ocg, self.icg = filt_shape[:3]
        self.fshape = tuple(filt_shape[3:])
        self.sshape = tuple(src_shape[2:])
        self.stride, self.pad, self.dilate = tuple(stride), tuple(pad), tuple(dilate)
        self.oshape = tuple(
            conv_out_size(*a) for a in zip(self.sshape, self.fshape, stride, pad, dilate)
        )
        expected = (self.n, self.g * self.ocg, *self.oshape)
        if self.c != self.g * self.icg or tuple(out_shape) != expected:
            raise ValueError(
                f"{name}: src {tuple(src_shape)} and grouped filter {tuple(filt_shape)} "
                f"(stride={stride}, pad={pad}, dilate={dilate}) do not give {tuple(out_shape)}"
            )
        self.k = self.icg * math.prod(self.fshape)  # rows of one group's column matrix
        self.l = math.prod(self.oshape)  # output positions
        self.pointwise = _is_pointwise(self.fshape, stride, pad)

    def col_matrix_shape(self, n: int) -> tuple:
        return (n, self.g, self.k, self.l)

    def filter_matrix(self, filt: np.ndarray, flip: bool, dtype, steps: list) -> np.ndarray:
        """(G, OCg, K) matrix of ``filt``, flipped spatially for CONVOLUTION mode."""
        src = _flipped(filt, self.nsp) if flip else filt
        return _matrix_in(src, (self.g, self.ocg, self.k), dtype, steps)

    def batch_inner(self, k: int) -> tuple:
        """The ``(C, *F, k, *O)`` layout of a column buffer for ``k`` samples: the batch is an
        inner dim, so that one matrix (G, K, k * L) holds every sample's columns."""
        return (self.c, *self.fshape, k, *self.oshape)

    def chunks(self, dtype, limit: int | None = None) -> tuple[int, list[tuple[int, int]]]:
        """Batch chunk size and chunks keeping one column buffer under :data:`COL_BUFFER_LIMIT`
        and ``limit`` bytes."""
        per_sample = self.c * math.prod(self.fshape) * self.l * dtype.itemsize
        return _chunks(self.n, per_sample, limit)

    def compiled_loops(self, dtype) -> bool:
        """Whether :mod:`conv_gemm_loops` handles this geometry in ``dtype`` (2-d, float32 or
        float64); other convolutions take the NumPy strided copies."""
        return self.nsp == 2 and dtype in (_F32, _F64) and self.l > 0

    def im2col(self, src: np.ndarray, dtype, steps: list, limit: int | None = None):
        """Per batch chunk, (begin, end, column matrix (G, K, k * L), fill step).

        The columns of a chunk of ``k`` samples go into one workspace buffer in the
        batch-inner layout, so that one GEMM covers the chunk (per-sample GEMMs with a few
        dozen output channels keep OpenBLAS's threads far below its peak); ``limit`` caps the
        buffer's bytes (cache blocking). 2-d float32/float64 columns are filled by the
        compiled :func:`conv_gemm_loops.im2col`, split over the kernel threads, from the
        source itself (or a C-contiguous copy of it); others by a strided NumPy copy from a
        padded copy of the source."""
        if self.compiled_loops(dtype):
            return self._compiled_im2col(src, dtype, steps, limit)
        padded = _padded(src, self.pad, dtype, 0, steps)
        win = _windows(padded, self.fshape, self.oshape, self.stride, self.dilate)
        perm = (1, *range(2, 2 + self.nsp), 0, *range(2 + self.nsp, 2 + 2 * self.nsp))
        win = win.transpose(perm)  # ``(C, *F, N, *O)``
        nb, chunks = self.chunks(dtype)
        flat = workspace.empty((self.c * math.prod(self.fshape) * nb * self.l,), dtype)
        res = []
        for a, b in chunks:
            col = flat[: flat.size // nb * (b - a)].reshape(self.batch_inner(b - a))
            colm = col.reshape(self.g, self.k, (b - a) * self.l)
            sl = (slice(None),) * (1 + self.nsp) + (slice(a, b),)
            res.append((a, b, colm, _partial(np.copyto, col, win[sl])))
        return res

    def _compiled_im2col(self, src: np.ndarray, dtype, steps: list, limit: int | None):
        from . import conv_gemm_loops

        x = _contiguous(src, dtype, steps)
        nb, chunks = self.chunks(dtype, limit)
        rows = self.c * math.prod(self.fshape)
        flat = workspace.empty((rows * nb * self.l,), dtype)
        geom = (self.stride, self.pad, self.dilate, self.fshape)
        res = []
        for a, b in chunks:
            cols = flat[: rows * (b - a) * self.l].reshape(rows, (b - a) * self.l)
            fill = _partial(conv_gemm_loops.im2col, x, cols, a, b, *geom)
            min_rows = -(-SPLIT_MIN_ELEMS // cols.shape[1])
            res.append((a, b, cols.reshape(self.g, self.k, -1), split(fill, rows, min_rows)))
        return res

    def batch_inner_matrix(self, a: np.ndarray, nb: int, dtype, steps: list):
        """A function giving, per batch chunk [begin, end) of ``a`` ``(N, G*M, *O)``, its
        ``(G, M, k * L)`` matrix: a workspace buffer ``(G*M, k, *O)`` that a step (appended
        to ``steps`` when the function is called) refreshes from ``a``."""
        m = a.shape[1]
        flat = workspace.empty((m * nb * self.l,), dtype)

        def matrix(begin: int, end: int) -> np.ndarray:
            buf = flat[: m * (end - begin) * self.l].reshape(m, end - begin, *self.oshape)
            steps.append(_partial(np.copyto, buf, _swap01(a[begin:end]), "unsafe"))
            return buf.reshape(self.g, m // self.g, (end - begin) * self.l)

        return matrix


def _gemms(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> list[Step]:
    """Steps ``out[g] = a[g] @ b[g]`` for each group, one 2-d matmul each on the calling
    thread (a pipeline's, BLAS single-threaded): NumPy's stacked matmul was 3-4x slower than
    the 2-d call on the same (1, M, K) @ (1, K, N) operands."""
    return [_partial(np.matmul, a[i], b[i], out=out[i]) for i in range(out.shape[0])]


def _split_gemms(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> list[Step]:
    """:func:`_gemms` outside a pipeline: each group's GEMM split over the kernel threads
    (:func:`gemm.matmul_step`)."""
    return [gemm.matmul_step(a[i], b[i], out[i]) for i in range(out.shape[0])]


def _swap01(a: np.ndarray) -> np.ndarray:
    return a.swapaxes(0, 1)


# ---- convolution algorithms ----------------------------------------------------------------
# Each algorithm is a bind function and a ``usable`` predicate with the signature of the public
# binds below, ``(a, b, out, stride, pad, dilate, flip)``; megbrain.kernels.conv_algos
# registers them and chooses one per shape (the execution policy). The predicates assume the
# geometry was checked by :func:`check_convolution` first.
_KIND_NAMES = {
    "forward": "Convolution",
    "backward_data": "ConvolutionBackwardData",
    "backward_filter": "ConvolutionBackwardFilter",
}


def _geometry(kind: str, a, b, out, stride, pad, dilate) -> _Conv:
    """The checked geometry of a ``kind`` convolution bound to (a, b, out)."""
    name = _KIND_NAMES[kind]
    if kind == "forward":  # (src, filter, dst)
        return _Conv(name, a.shape, b.shape, out.shape, stride, pad, dilate)
    if kind == "backward_data":  # (filter, diff, grad)
        return _Conv(name, out.shape, a.shape, b.shape, stride, pad, dilate)
    return _Conv(name, a.shape, out.shape, b.shape, stride, pad, dilate)  # (src, diff, grad)


def check_convolution(kind: str, a, b, out, stride, pad, dilate, flip=False) -> None:
    """Raise ValueError unless (a, b, out) and the geometry make a ``kind`` convolution
    ("forward", "backward_data" or "backward_filter") of a supported dtype."""
    _geometry(kind, a, b, out, stride, pad, dilate)
    src = b if kind == "backward_data" else a
    try:
        compute_dtype(src.dtype)
    except ValueError as exc:
        raise ValueError(f"{_KIND_NAMES[kind]}: {exc}") from None


def _per_sample_out(geo: _Conv, out: np.ndarray, dt) -> np.ndarray | None:
    """``out`` as (N, G, OCg, L) when each sample's matrices are BLAS results, else None."""
    if out.dtype != dt:
        return None
    outm = _reshaped(out, (geo.n, geo.g, geo.ocg, geo.l))
    if outm is None or not outm.flags.writeable or (geo.n and not _blasable(outm[0])):
        return None
    return outm


def fwd_im2col_gemm(src, filt, out, stride, pad, dilate, flip=False) -> Callable[[], None]:
    """Forward IM2COL_GEMM: per batch chunk, the columns, one GEMM per group, then a copy of
    the ``(OC, k, *O)`` result into the output (a one-sample chunk's GEMM writes into the
    output itself).

    A 2-d convolution of several cache-sized chunks runs them on the kernel threads
    (:func:`_chunk_pipelines`); a single chunk's compiled im2col and its GEMM are each split
    over the threads (:func:`gemm.matmul_step`)."""
    from . import conv_gemm_loops

    geo = _geometry("forward", src, filt, out, stride, pad, dilate)
    dt = compute_dtype(src.dtype)
    steps: list[Step] = []
    wm = geo.filter_matrix(filt, flip, dt, steps)
    oc = geo.g * geo.ocg
    outm = _per_sample_out(geo, out, dt)

    def chunk_steps(a: int, b: int, colm: np.ndarray, res: np.ndarray | None,
                    gemms=_gemms) -> list[Step]:  # fmt: skip
        if b - a == 1 and outm is not None:
            return gemms(wm, colm, outm[a])
        res = res[: oc * (b - a) * geo.l]
        resv = _swap01(res.reshape(oc, b - a, *geo.oshape))
        return gemms(wm, colm, res.reshape(geo.g, geo.ocg, -1)) + [
            _partial(np.copyto, out[a:b], resv, "unsafe")
        ]

    def result_buffer(nb: int) -> np.ndarray | None:
        # the GEMM result ``(OC, k, *O)`` of a chunk, unless every chunk writes ``out``
        return workspace.empty((oc * nb * geo.l,), dt) if nb > 1 or outm is None else None

    rows = geo.c * math.prod(geo.fshape)
    units, width = _forward_units(geo, dt)
    if geo.compiled_loops(dt) and len(units) > 1:
        x = _contiguous(src, dt, steps)
        geom = (geo.stride, geo.pad, geo.dilate, geo.fshape)
        oh, ow = geo.oshape

        def slot():  # one thread's buffers: its columns and GEMM result
            res = workspace.empty((oc * width,), dt) if width > geo.l or outm is None else None
            return workspace.empty((rows * width,), dt), res

        def pipeline(buffers, a: int, b: int, i0: int, i1: int) -> list[Step]:
            cols = buffers[0][: rows * (b - a) * (i1 - i0) * ow].reshape(rows, -1)
            colm = cols.reshape(geo.g, geo.k, -1)
            fill = _partial(conv_gemm_loops.im2col, x, cols, a, b, *geom, 0, rows, (i0, i1))
            if (i0, i1) == (0, oh):
                return [fill] + chunk_steps(a, b, colm, buffers[1])
            if outm is not None:  # a block of output rows of one sample, a view of ``out``
                return [fill] + _gemms(wm, colm, outm[a][:, :, i0 * ow : i1 * ow])
            res = buffers[1][: oc * (i1 - i0) * ow]
            back = _partial(np.copyto, out[a, :, i0:i1], res.reshape(oc, i1 - i0, ow), "unsafe")
            return [fill] + _gemms(wm, colm, res.reshape(geo.g, geo.ocg, -1)) + [back]

        steps.append(_chunk_pipelines(units, slot, pipeline))
        return chain(steps)
    chunks = geo.im2col(src, dt, steps, CACHE_CHUNK_BYTES if geo.compiled_loops(dt) else None)
    res = result_buffer(max((b - a for a, b, _, _ in chunks), default=0))
    for a, b, colm, fill in chunks:
        steps.append(fill)
        steps += chunk_steps(a, b, colm, res, _split_gemms)
    return chain(steps)


def _forward_units(geo: _Conv, dt) -> tuple[list[tuple[int, int, int, int]], int]:
    """The pieces ``(begin, end, row0, row1)`` (samples, output rows) a 2-d forward
    convolution's pipelines take, each of at most :data:`CACHE_CHUNK_BYTES` of columns, and
    the most output positions one holds: whole samples in batch chunks, or, where one sample's
    columns are larger and the filter matrix is at most half the piece (it is re-read for
    each), blocks of output rows of one sample. Measured under load (wall, 2 threads) on
    ResNet50's batch-1 layers: 64x56x56 (7 MB of columns, a 147 KB filter) 11-12 ms in row
    blocks against 23-28 ms as one GEMM threaded by OpenBLAS; 128x28x28 (a 590 KB filter)
    lost in row blocks, 8-16 ms against 3.5-5."""
    rows = geo.c * math.prod(geo.fshape)
    nb, chunks = geo.chunks(dt, CACHE_CHUNK_BYTES)
    oh = geo.oshape[0] if geo.nsp == 2 else 1
    per_row = rows * (geo.l // max(1, oh)) * dt.itemsize
    filt_bytes = geo.ocg * geo.k * dt.itemsize
    if geo.nsp != 2 or per_row * oh <= CACHE_CHUNK_BYTES or 2 * filt_bytes > CACHE_CHUNK_BYTES:
        return [(a, b, 0, oh) for a, b in chunks], nb * geo.l
    rb = max(1, min(oh, CACHE_CHUNK_BYTES // max(1, per_row)))
    units = [(n, n + 1, i, min(oh, i + rb)) for n in range(geo.n) for i in range(0, oh, rb)]
    return units, rb * (geo.l // oh)


def _chunk_pipelines(chunks: list[tuple], slot, pipeline) -> Step:
    """One step running the batch chunks' pipelines on :func:`parallel.num_threads` threads.

    ``slot()`` allocates one thread's buffers (called once per thread, at bind time);
    ``pipeline(buffers, *chunk)`` gives the steps of one chunk on them (a compiled loop
    and GEMMs, each chunk writing its own samples of the output). Each run, the threads take
    the chunks in turn from a shared counter, so that a thread the OS leaves waiting (a loaded
    machine) costs the others only the chunk it holds (:func:`parallel.take_in_turn`); BLAS
    runs single-threaded meanwhile, one fork/join per call. A chunk's result does not
    depend on the thread that computes it (its GEMM runs on that thread alone).

    Measured on the 2-core machines under load, CPU time of the 128x16x14x14 3x3 forward:
    about 7 ms (PyTorch 9 ms on 2 threads); one chunk loop threading each GEMM through
    OpenBLAS spent 76 ms, its threads synchronising (and spinning) on every chunk's GEMM."""
    nt = max(1, min(parallel.num_threads(), len(chunks)))
    table = [[chain(pipeline(bufs, *c)) for c in chunks] for bufs in
             [slot() for _ in range(nt)]]  # fmt: skip
    return parallel.take_in_turn(table)


def fwd_per_sample_usable(src, filt, out, stride, pad, dilate, flip=False) -> bool:
    """Whether each sample's output is a writable BLAS result view of ``out``."""
    geo = _geometry("forward", src, filt, out, stride, pad, dilate)
    return _per_sample_out(geo, out, compute_dtype(src.dtype)) is not None


def fwd_per_sample_preferred(src, filt, out, stride, pad, dilate, flip=False) -> bool:
    """The heuristic: per-sample GEMMs for reductions of at most :data:`PER_SAMPLE_MAX_K`."""
    return _geometry("forward", src, filt, out, stride, pad, dilate).k <= PER_SAMPLE_MAX_K


def fwd_per_sample_gemm(src, filt, out, stride, pad, dilate, flip=False) -> Callable[[], None]:
    """Forward IM2COL_GEMM_PER_SAMPLE: the batch-inner columns, one GEMM per sample straight
    into the output (no result copy); 2-d chunks run on the kernel threads'
    :func:`_chunk_pipelines` (each per-sample GEMM joined by OpenBLAS's threads took 97 ms
    for 128x16x14x14 3x3 under load, 30x the pipelines)."""
    from . import conv_gemm_loops

    geo = _geometry("forward", src, filt, out, stride, pad, dilate)
    dt = compute_dtype(src.dtype)
    outm = _per_sample_out(geo, out, dt)
    if outm is None:
        raise ValueError(
            f"Convolution: output {out.shape} {out.dtype} (strides {out.strides}) is not a "
            "per-sample GEMM result"
        )
    steps: list[Step] = []
    wm = geo.filter_matrix(filt, flip, dt, steps)

    def gemms(a: int, b: int, colm: np.ndarray, group_gemms=_gemms) -> list[Step]:
        per = [group_gemms(wm, colm[:, :, i * geo.l : (i + 1) * geo.l], outm[a + i])
               for i in range(b - a)]  # fmt: skip
        return [s for sample in per for s in sample]

    rows = geo.c * math.prod(geo.fshape)
    nb, chunks = geo.chunks(dt, CACHE_CHUNK_BYTES)
    if geo.compiled_loops(dt) and len(chunks) > 1:
        x = _contiguous(src, dt, steps)
        geom = (geo.stride, geo.pad, geo.dilate, geo.fshape)

        def slot():  # one thread's columns
            return workspace.empty((rows * nb * geo.l,), dt)

        def pipeline(cflat, a: int, b: int) -> list[Step]:
            cols = cflat[: rows * (b - a) * geo.l].reshape(rows, -1)
            fill = _partial(conv_gemm_loops.im2col, x, cols, a, b, *geom, 0, rows)
            return [fill] + gemms(a, b, cols.reshape(geo.g, geo.k, -1))

        steps.append(_chunk_pipelines(chunks, slot, pipeline))
        return chain(steps)
    limit = CACHE_CHUNK_BYTES if geo.compiled_loops(dt) else None
    for a, b, colm, fill in geo.im2col(src, dt, steps, limit):
        steps.append(fill)
        steps += gemms(a, b, colm, _split_gemms)
    return chain(steps)


# ---- convolution ---------------------------------------------------------------------------
def bind_convolution(
    src: np.ndarray,
    filt: np.ndarray,
    out: np.ndarray,
    stride: Sequence[int],
    pad: Sequence[int],
    dilate: Sequence[int],
    flip: bool = False,
    *,
    strategy: str = "HEURISTIC",
) -> Callable[[], None]:
    """Bind a grouped convolution ``out = conv(src, filt)``.

    Parameters
    ----------
    src : numpy.ndarray
        The ``(N, G*ICg, *S)`` input (any strides).
    filt : numpy.ndarray
        The grouped ``(G, OCg, ICg, *F)`` filter.
    out : numpy.ndarray
        The ``(N, G*OCg, *O)`` output, ``O = (S + 2 pad - dilate (F - 1) - 1) // stride + 1``.
    stride, pad, dilate : sequence of int
        One value per spatial dim.
    flip : bool
        True for CONVOLUTION mode (the filter is flipped spatially), False for
        CROSS_CORRELATION.
    strategy : str
        The execution policy choosing the algorithm (see :mod:`megbrain.kernels.conv_algos`):
        HEURISTIC (default), HEURISTIC_REPRODUCIBLE, PROFILE, PROFILE_REPRODUCIBLE or
        PROFILE_HEURISTIC.

    Returns
    -------
    Callable[[], None]
        A zero-argument callable computing ``out`` from the current inputs.
    """
    from . import conv_algos

    return conv_algos.bind("forward", src, filt, out, stride, pad, dilate, flip, strategy=strategy)


#: HEURISTIC takes GEMM_COL2IM's compiled pipelines over AS_FORWARD_CONV for a 2-d gradient
#: whose one sample's columns take at most this many bytes. Measured on one core (CPU time,
#: under load; PyTorch in brackets): 128x16x14x14 3x3 5.9 vs 16 ms (6.7), 64x20x12x12 5x5
#: 4.0 vs 19 (7.3), ResNet50's batch-1 7x7 7.2 vs 12.4 (7.2), 14x14 4.6 vs 6.2 (4.8), 28x28
#: 4.5 vs 4.7 (3.9, 3.6 MB of columns); at 56x56 (7.2 MB) the forward route won, 4.5 vs 5.5
COL2IM_MAX_SAMPLE_BYTES = 2 << 20
#: backward data runs as a forward convolution when the gradient has at most this many times
#: the positions of ``diff`` (that GEMM has prod(S) columns, col2im's has prod(O))
AS_FORWARD_MAX_GROWTH = 1.25


def _as_forward_pad(geo: _Conv) -> tuple | None:
    """The padding ``dilate (F - 1) - pad`` making backward data a stride-1 forward convolution
    of ``diff`` with the transposed, flipped filter; None unless every stride is 1 and
    ``pad <= dilate (F - 1)``."""
    if any(s != 1 for s in geo.stride):
        return None
    tpad = tuple(d * (f - 1) - p for d, f, p in zip(geo.dilate, geo.fshape, geo.pad))
    return tpad if all(p >= 0 for p in tpad) else None


def _as_forward(geo: _Conv) -> tuple | None:
    """The heuristic's choice: :func:`_as_forward_pad` where the gradient is not much larger
    than ``diff`` (a "same" padding, :data:`AS_FORWARD_MAX_GROWTH`), else None."""
    if math.prod(geo.sshape) > AS_FORWARD_MAX_GROWTH * geo.l:
        return None
    return _as_forward_pad(geo)



def _pointwise_src(geo: _Conv, src: np.ndarray, dt) -> np.ndarray | None:
    """``src`` as (N, G, ICg, L) when each sample's matrices are BLAS operands as they are
    (a pointwise convolution's columns are its source), else None."""
    if not geo.pointwise or src.dtype != dt:
        return None
    srcm = _reshaped(src, (geo.n, geo.g, geo.icg, geo.l))
    if srcm is None or (geo.n and not _blasable(srcm[0])):
        return None
    return srcm


def fwd_1x1_usable(src, filt, out, stride, pad, dilate, flip=False) -> bool:
    """Whether the convolution is pointwise (1x1 filter, stride 1, no padding) and each
    sample's source and output are BLAS matrices as they are."""
    geo = _geometry("forward", src, filt, out, stride, pad, dilate)
    dt = compute_dtype(src.dtype)
    return _pointwise_src(geo, src, dt) is not None and _per_sample_out(geo, out, dt) is not None


def fwd_1x1_gemm(
    src, filt, out, stride, pad, dilate, flip=False, epilogue=None
) -> Callable[[], None]:
    """Forward CONV1X1_GEMM: a pointwise convolution is ``W @ x[n]`` for each sample, its
    source and output read and written in place (no columns, no result copy). The
    per-sample, per-group products run as :func:`gemm.products_step` does: at least one per
    thread, one product per thread at a time; fewer, each split over the threads. Measured
    at batch 1 (2 threads): ResNet50's 1x1 layers took 0.28-1.3 ms against 1.0-4.6 ms
    through IM2COL_GEMM's copies of the source. An ``epilogue``
    (:class:`conv_epilogue.Epilogue`) is applied to each part right after its product."""
    geo = _geometry("forward", src, filt, out, stride, pad, dilate)
    dt = compute_dtype(src.dtype)
    srcm, outm = _pointwise_src(geo, src, dt), _per_sample_out(geo, out, dt)
    if srcm is None or outm is None:
        raise ValueError(
            f"Convolution: CONV1X1_GEMM needs a pointwise convolution of BLAS matrices; got "
            f"src {src.shape} {src.dtype}, filter {filt.shape}, out {out.shape} {out.dtype}"
        )
    steps: list[Step] = []
    wm = geo.filter_matrix(filt, flip, dt, steps)
    pairs = [(i, g) for i in range(geo.n) for g in range(geo.g)]
    thens = None
    if epilogue is not None:  # act(out + bias) on each part while it is in cache
        thens = [conv_epilogue.rows_then(epilogue, g * geo.ocg) for _, g in pairs]
    steps.append(gemm.products_step([(wm[g], srcm[i, g], outm[i, g]) for i, g in pairs], thens))
    return chain(steps)

def bwd_data_as_forward_usable(filt, diff, grad, stride, pad, dilate, flip=False) -> bool:
    """Whether backward data is a stride-1 forward convolution (:func:`_as_forward_pad`)."""
    geo = _geometry("backward_data", filt, diff, grad, stride, pad, dilate)
    return _as_forward_pad(geo) is not None


def bwd_data_as_forward_preferred(filt, diff, grad, stride, pad, dilate, flip=False) -> bool:
    """The heuristic: as a forward convolution for a "same" padding (:func:`_as_forward`),
    unless GEMM_COL2IM runs compiled with one sample's columns of at most
    :data:`COL2IM_MAX_SAMPLE_BYTES`."""
    geo = _geometry("backward_data", filt, diff, grad, stride, pad, dilate)
    dt = compute_dtype(diff.dtype)
    per_sample = geo.c * math.prod(geo.fshape) * geo.l * dt.itemsize
    if geo.compiled_loops(dt) and per_sample <= COL2IM_MAX_SAMPLE_BYTES:
        return False
    return _as_forward(geo) is not None


def bwd_data_as_forward(filt, diff, grad, stride, pad, dilate, flip=False) -> Callable[[], None]:
    """Backward data AS_FORWARD_CONV: the forward convolution of ``diff`` padded by
    ``dilate (F - 1) - pad`` with the filter transposed (input and output channels swapped)
    and flipped; the forward algorithm is the HEURISTIC_REPRODUCIBLE one."""
    from . import conv_algos

    geo = _geometry("backward_data", filt, diff, grad, stride, pad, dilate)
    tpad = _as_forward_pad(geo)
    if tpad is None:
        raise ValueError(
            f"ConvolutionBackwardData: stride {geo.stride} / pad {geo.pad} is not a stride-1 "
            "forward convolution"
        )
    wt = filt.swapaxes(1, 2)
    return conv_algos.bind(
        "forward", diff, wt, grad, stride, tpad, dilate, not flip,
        strategy="HEURISTIC_REPRODUCIBLE",
    )  # fmt: skip


def bwd_data_gemm_col2im(filt, diff, grad, stride, pad, dilate, flip=False) -> Callable[[], None]:
    """Backward data GEMM_COL2IM: one GEMM ``W^T @ diff`` per batch chunk gives the columns,
    which col2im adds into a padded gradient (one strided add per filter offset)."""
    geo = _geometry("backward_data", filt, diff, grad, stride, pad, dilate)
    dt = compute_dtype(diff.dtype)
    steps: list[Step] = []
    wmt = geo.filter_matrix(filt, flip, dt, steps).transpose(0, 2, 1)  # (G, K, OCg)
    if geo.compiled_loops(dt):
        return _col2im_pipelines(geo, wmt, diff, grad, dt, steps)
    nb, chunks = geo.chunks(dt)
    diff_matrix = geo.batch_inner_matrix(diff, nb, dt, steps)
    # col2im into a padded gradient in the batch-inner layout ``(C, k, *Spad)``
    spad = tuple(s + 2 * p for s, p in zip(geo.sshape, geo.pad))
    tflat = workspace.empty((geo.c * nb * math.prod(spad),), dt)  # zeroed on every run below
    cflat = workspace.empty((geo.c * math.prod(geo.fshape) * nb * geo.l,), dt)
    offsets = list(_offset_slices(geo.fshape, geo.oshape, geo.stride, geo.dilate))
    for a, b in chunks:
        k = b - a
        dm = diff_matrix(a, b)
        dcol = cflat[: cflat.size // nb * k].reshape(geo.batch_inner(k))
        target = tflat[: tflat.size // nb * k].reshape(geo.c, k, *spad)
        steps += _split_gemms(wmt, dm, dcol.reshape(geo.g, geo.k, k * geo.l))
        steps.append(_partial(np.copyto, target, 0))
        for f, idx in offsets:
            t = target[idx]
            steps.append(_partial(np.add, t, dcol[(slice(None), *f)], t))
        inner = _swap01(_interior(target, geo.pad, geo.sshape))
        steps.append(_partial(np.copyto, grad[a:b], inner, "unsafe"))
    return chain(steps)


def _col2im_pipelines(geo: _Conv, wmt, diff, grad, dt, steps: list) -> Callable[[], None]:
    """GEMM_COL2IM of a 2-d gradient: per batch chunk of at most :data:`CACHE_CHUNK_BYTES`
    of columns, the batch-inner copy of ``diff``, the GEMM ``W^T @ diff`` into the columns
    and the compiled :func:`conv_gemm_loops.col2im` adding them into the gradient while they
    are in the cache; several chunks run on the kernel threads (:func:`_chunk_pipelines`), a
    single one with its col2im split over the channels."""
    from . import conv_gemm_loops

    post: list[Step] = []
    target = grad
    if grad.dtype != dt or not grad.flags.c_contiguous or not grad.flags.writeable:
        target = workspace.empty(grad.shape, dt)
        post.append(_partial(np.copyto, grad, target, "unsafe"))
    rows = geo.c * math.prod(geo.fshape)
    nb, chunks = geo.chunks(dt, CACHE_CHUNK_BYTES)
    geom = (geo.stride, geo.pad, geo.dilate, geo.fshape)

    def slot():  # one thread's buffers: the batch-inner diff and the columns
        copies: list[Step] = []
        cflat = workspace.empty((rows * nb * geo.l,), dt)
        return geo.batch_inner_matrix(diff, nb, dt, copies), copies, cflat

    def pipeline(buffers, a: int, b: int, whole: bool = True) -> list[Step]:
        diff_matrix, copies, cflat = buffers
        dm = diff_matrix(a, b)  # appends the copy of diff[a:b] to ``copies``
        cols = cflat[: rows * (b - a) * geo.l].reshape(rows, -1)
        back = _partial(conv_gemm_loops.col2im, cols, target, a, b, *geom)
        min_channels = -(-SPLIT_MIN_ELEMS // max(1, math.prod(geo.sshape) * (b - a)))
        add = _partial(back, 0, geo.c) if whole else split(back, geo.c, min_channels)
        gemms = _gemms if whole else _split_gemms
        return [copies.pop()] + gemms(wmt, dm, cols.reshape(geo.g, geo.k, -1)) + [add]

    if len(chunks) > 1:
        run = _chunk_pipelines(chunks, slot, pipeline)
    else:  # one chunk (or none): its GEMM and its col2im each split over the threads
        buffers = slot()
        run = chain([s for a, b in chunks for s in pipeline(buffers, a, b, whole=False)])
    return chain(steps + [run] + post)


def bind_conv_backward_data(
    filt: np.ndarray,
    diff: np.ndarray,
    grad: np.ndarray,
    stride: Sequence[int],
    pad: Sequence[int],
    dilate: Sequence[int],
    flip: bool = False,
    *,
    strategy: str = "HEURISTIC",
) -> Callable[[], None]:
    """Bind the gradient of a convolution w.r.t. its input (deconvolution).

    The HEURISTIC choice: a stride-1 gradient with a "same" padding is the forward convolution
    of ``diff`` (padded by ``dilate (F - 1) - pad``) with the filter transposed (input and
    output channels swapped) and flipped; otherwise one GEMM per batch chunk gives the columns,
    which col2im adds into a padded gradient (one strided add per filter offset).

    Parameters
    ----------
    filt : numpy.ndarray
        The grouped ``(G, OCg, ICg, *F)`` filter of the forward convolution.
    diff : numpy.ndarray
        The ``(N, G*OCg, *O)`` gradient of the forward output.
    grad : numpy.ndarray
        The ``(N, G*ICg, *S)`` result; the forward convolution of an input of this shape must
        give ``diff``'s shape.
    stride, pad, dilate, flip, strategy
        As for :func:`bind_convolution`.

    Returns
    -------
    Callable[[], None]
        A zero-argument callable computing ``grad``.
    """
    from . import conv_algos

    return conv_algos.bind(
        "backward_data", filt, diff, grad, stride, pad, dilate, flip, strategy=strategy
    )


def _bwd_filter_common(src, diff, grad, stride, pad, dilate):
    geo = _geometry("backward_filter", src, diff, grad, stride, pad, dilate)
    return geo, compute_dtype(src.dtype)


def bwd_filter_diff_nhwc(src, diff, grad, stride, pad, dilate, flip=False) -> Callable[[], None]:
    """Backward filter IM2COL_GEMM_DIFF_NHWC: per batch chunk, the transposed gradient
    (G, K, OCg) = columns (G, K, k * L) @ channel-last diff (G, k * L, OCg), the batch summed
    inside the GEMM."""
    geo, dt = _bwd_filter_common(src, diff, grad, stride, pad, dilate)
    steps: list[Step] = []
    g, ocg = geo.g, geo.ocg
    res = np.empty((g, geo.k, ocg), dt)  # the transposed gradient, summed over the chunks
    chunks = geo.im2col(src, dt, steps)
    if not chunks:  # an empty batch
        steps.append(_partial(np.copyto, res, 0))
    nb = max((b - a for a, b, _, _ in chunks), default=0)
    # diff channel-last, ``(k, *O, G, OCg)``: each group's (k * L, OCg) matrix is row-major
    dflat = workspace.empty((nb * geo.l * g * ocg,), dt)
    part = np.empty_like(res) if len(chunks) > 1 else None
    for i, (a, b, colm, fill) in enumerate(chunks):
        k = b - a
        steps.append(fill)
        dbuf = dflat[: k * geo.l * g * ocg].reshape(k, *geo.oshape, g * ocg)
        steps.append(_partial(np.copyto, dbuf, np.moveaxis(diff[a:b], 1, -1), "unsafe"))
        dm = dbuf.reshape(k * geo.l, g, ocg).swapaxes(0, 1)  # (G, k * L, OCg)
        if i == 0:
            steps += _split_gemms(colm, dm, res)
        else:
            steps += _split_gemms(colm, dm, part)
            steps.append(_partial(np.add, res, part, res))
    view = res.swapaxes(1, 2).reshape(grad.shape)  # ``(G, OCg, ICg, *F)``, a copy-free view
    steps.append(_partial(np.copyto, grad, _flipped(view, geo.nsp) if flip else view, "unsafe"))
    return chain(steps)


def bwd_filter_diff_rows(src, diff, grad, stride, pad, dilate, flip=False) -> Callable[[], None]:
    """Backward filter IM2COL_GEMM_DIFF_ROWS: per batch chunk, the gradient (G, OCg, K) =
    batch-inner diff (G, OCg, k * L) @ columns^T (G, k * L, K). Measured on 2 cores it ran
    4-5x slower than IM2COL_GEMM_DIFF_NHWC for a few dozen channels (OpenBLAS's threads
    synchronise once per block of the long reduction); a PROFILE candidate, never the
    heuristic's."""
    geo, dt = _bwd_filter_common(src, diff, grad, stride, pad, dilate)
    steps: list[Step] = []
    res = np.empty((geo.g, geo.ocg, geo.k), dt)  # summed over the chunks
    nb, _ = geo.chunks(dt)
    chunks = geo.im2col(src, dt, steps)
    if not chunks:
        steps.append(_partial(np.copyto, res, 0))
    diff_matrix = geo.batch_inner_matrix(diff, max(nb, 1), dt, steps)
    part = np.empty_like(res) if len(chunks) > 1 else None
    for i, (a, b, colm, fill) in enumerate(chunks):
        steps.append(fill)
        dm = diff_matrix(a, b)  # (G, OCg, k * L)
        cols_t = colm.transpose(0, 2, 1)  # (G, k * L, K), column-major matrices
        if i == 0:
            steps += _split_gemms(dm, cols_t, res)
        else:
            steps += _split_gemms(dm, cols_t, part)
            steps.append(_partial(np.add, res, part, res))
    view = res.reshape(grad.shape)
    steps.append(_partial(np.copyto, grad, _flipped(view, geo.nsp) if flip else view, "unsafe"))
    return chain(steps)


def bind_conv_backward_filter(
    src: np.ndarray,
    diff: np.ndarray,
    grad: np.ndarray,
    stride: Sequence[int],
    pad: Sequence[int],
    dilate: Sequence[int],
    flip: bool = False,
    *,
    strategy: str = "HEURISTIC",
) -> Callable[[], None]:
    """Bind the gradient of a convolution w.r.t. its filter.

    HEURISTIC takes IM2COL_GEMM_BLOCKED (:mod:`megbrain.kernels.conv_bwd_filter`: cache-sized
    blocks of columns, each GEMM-accumulated, one pipeline per thread) for 2-d convolutions.
    Otherwise (1-d, 3-d) it computes, per batch chunk, the transposed gradient (G, K, OCg):
    the columns (G, K, k * L) times a channel-last copy of ``diff`` (G, k * L, OCg), the
    batch summed inside the GEMM. Measured on 2 cores, this orientation (the K =
    ICg * prod(F) rows split between OpenBLAS's threads) ran 4-5x faster than
    ``diff @ columns^T`` (OCg rows), whose threads synchronise once per block of the long
    reduction dim.

    Parameters
    ----------
    src : numpy.ndarray
        The ``(N, G*ICg, *S)`` input of the forward convolution.
    diff : numpy.ndarray
        The ``(N, G*OCg, *O)`` gradient of the forward output.
    grad : numpy.ndarray
        The grouped ``(G, OCg, ICg, *F)`` result.
    stride, pad, dilate, flip, strategy
        As for :func:`bind_convolution`.

    Returns
    -------
    Callable[[], None]
        A zero-argument callable computing ``grad``.
    """
    from . import conv_algos

    return conv_algos.bind(
        "backward_filter", src, diff, grad, stride, pad, dilate, flip, strategy=strategy
    )
