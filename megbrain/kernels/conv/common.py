"""What every convolution algorithm shares: the checked geometry (:class:`_Conv`: sizes,
im2col, filter matrices, batch chunks), the output-size rules, the padded and windowed views
of a source, the thread count of the split kernels, and the GEMM steps and per-thread chunk
pipelines of the im2col family.

Filters are grouped, ``(G, OCg, ICg, *F)``; a dense filter is the G = 1 view ``filt[None]``.
float16 and bfloat16 compute in float32 (:func:`compute_dtype`). Every buffer is allocated at
bind time, so the bound callables allocate nothing; the buffers rewritten on every run come
from :func:`workspace.empty`, so the executor places them in the static memory plan.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial as _partial

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .. import gemm, parallel, workspace
from ..arrays import F32, F64, compute_dtype
from ..parallel import split
from ..steps import Step, chain
from .loops import im2col as im2col_loops

__all__ = [
    "CACHE_CHUNK_BYTES",
    "COL_BUFFER_LIMIT",
    "MAX_THREADS",
    "SPLIT_MIN_ELEMS",
    "THREADS",
    "bind_doc",
    "check_convolution",
    "checked",
    "compute_dtype",
    "conv_out_size",
    "deconv_out_size",
    "threads",
]

#: the most bytes one column buffer may take; larger batches are processed in chunks
COL_BUFFER_LIMIT = 256 << 20
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
    return _matrix_view(a, shape, dtype, steps, blas, output=False)


def _matrix_out(
    a: np.ndarray, shape: tuple, dtype: np.dtype, post: list, blas: bool = True
) -> np.ndarray:
    """A writable ``shape`` view of output ``a`` (a BLAS result unless ``blas`` is False), or a
    buffer a step copies into ``a`` after."""
    return _matrix_view(a, shape, dtype, post, blas, output=True)


def _matrix_view(
    a: np.ndarray, shape: tuple, dtype: np.dtype, steps: list, blas: bool, output: bool
) -> np.ndarray:
    if a.dtype == dtype and (a.flags.writeable or not output):
        r = _reshaped(a, shape)
        if r is not None and (not blas or _blasable(r)):
            return r
    buf = np.empty(a.shape, dtype)
    src, dst = (buf, a) if output else (a, buf)
    steps.append(_partial(np.copyto, dst, src, "unsafe"))
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

    def pipeline_chunk_bytes(self, dtype) -> int:
        """The most column bytes one batch chunk of the compiled im2col + GEMM pipelines
        takes: :data:`CACHE_CHUNK_BYTES`, or, for a filter matrix larger than that, the
        filter matrix's bytes, but no more than an even share of the batch per kernel thread.
        Each chunk's GEMM reads (and BLAS packs) the whole filter matrix: on a thin chunk
        (the deep layers' few positions per sample) that cost as much as the product.
        Measured on the 2-core machine under load (CPU time, batch 32, 3x3), forward /
        backward data: 512x4x4 65 / 62 ms in one-sample chunks, 23 / 22 in 16-sample ones;
        256x8x8 27 / 25 against 23 / 21 in 4-sample chunks."""
        filt = self.g * self.ocg * self.k * dtype.itemsize
        if filt <= CACHE_CHUNK_BYTES:
            return CACHE_CHUNK_BYTES
        per_sample = self.c * math.prod(self.fshape) * self.l * dtype.itemsize
        share = -(-self.n // max(1, parallel.num_threads())) * per_sample
        return max(CACHE_CHUNK_BYTES, min(filt, share))

    def compiled_loops(self, dtype) -> bool:
        """Whether :mod:`.loops.im2col` handles this geometry in ``dtype`` (2-d, float32 or
        float64); other convolutions take the NumPy strided copies."""
        return self.nsp == 2 and dtype in (F32, F64) and self.l > 0

    def im2col(self, src: np.ndarray, dtype, steps: list, limit: int | None = None):
        """Per batch chunk, (begin, end, column matrix (G, K, k * L), fill step).

        The columns of a chunk of ``k`` samples go into one workspace buffer in the
        batch-inner layout, so that one GEMM covers the chunk (per-sample GEMMs with a few
        dozen output channels keep OpenBLAS's threads far below its peak); ``limit`` caps the
        buffer's bytes (cache blocking). 2-d float32/float64 columns are filled by the
        compiled :func:`im2col_loops.im2col`, split over the kernel threads, from the
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
        x = _contiguous(src, dtype, steps)
        nb, chunks = self.chunks(dtype, limit)
        rows = self.c * math.prod(self.fshape)
        flat = workspace.empty((rows * nb * self.l,), dtype)
        geom = (self.stride, self.pad, self.dilate, self.fshape)
        res = []
        for a, b in chunks:
            cols = flat[: rows * (b - a) * self.l].reshape(rows, (b - a) * self.l)
            fill = _partial(im2col_loops.im2col, x, cols, a, b, *geom)
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
# binds below, ``(a, b, out, stride, pad, dilate, flip)``; megbrain.kernels.conv.registry
# registers them and chooses one per shape (the execution policy). The predicates assume the


# ---- the checked geometry of each kind -----------------------------------------------------
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

#: each kind's operands, as the algorithms' binds take them
_OPERANDS = {
    "forward": ("src", "filter", "out"),
    "backward_data": ("filter", "diff", "grad"),
    "backward_filter": ("src", "diff", "grad"),
}


def checked(kind: str, algo: str, needs: str, usable: Callable, a, b, out, stride, pad, dilate,
            flip: bool = False) -> _Conv:  # fmt: skip
    """The checked geometry of a ``kind`` convolution that the algorithm ``algo`` binds: the
    common prologue of the algorithms' binds. Raises ValueError when the geometry is not a
    convolution, or, naming what the algorithm ``needs`` and the operands, when
    ``usable(a, b, out, stride, pad, dilate, flip)`` refuses it."""
    geo = _geometry(kind, a, b, out, stride, pad, dilate)
    if not usable(a, b, out, stride, pad, dilate, flip):
        got = ", ".join(f"{n} {tuple(x.shape)} {x.dtype}" for n, x in zip(_OPERANDS[kind],
                                                                          (a, b, out)))  # fmt: skip
        raise ValueError(
            f"{_KIND_NAMES[kind]} ({algo}): needs {needs}; got {got}, stride={tuple(stride)}, "
            f"pad={tuple(pad)}, dilate={tuple(dilate)}"
        )
    return geo


_DOC_OPERANDS = {
    "forward": """    src : numpy.ndarray
        The ``(N, G*ICg, *S)`` input (any strides).
    filt : numpy.ndarray
        The grouped ``(G, OCg, ICg, *F)`` filter.
    out : numpy.ndarray
        The ``(N, G*OCg, *O)`` output, ``O = (S + 2 pad - dilate (F - 1) - 1) // stride + 1``.
""",
    "backward_data": """    filt : numpy.ndarray
        The grouped ``(G, OCg, ICg, *F)`` filter of the forward convolution.
    diff : numpy.ndarray
        The ``(N, G*OCg, *O)`` gradient of the forward output.
    grad : numpy.ndarray
        The ``(N, G*ICg, *S)`` result; the forward convolution of an input of this shape must
        give ``diff``'s shape.
""",
    "backward_filter": """    src : numpy.ndarray
        The ``(N, G*ICg, *S)`` input of the forward convolution.
    diff : numpy.ndarray
        The ``(N, G*OCg, *O)`` gradient of the forward output.
    grad : numpy.ndarray
        The grouped ``(G, OCg, ICg, *F)`` result.
""",
}
_DOC_STRATEGY = """    strategy : str
        The execution policy choosing the algorithm (see :mod:`megbrain.kernels.conv.registry`):
        HEURISTIC (default), HEURISTIC_REPRODUCIBLE, PROFILE, PROFILE_REPRODUCIBLE or
        PROFILE_HEURISTIC.
"""
_DOC_EPILOGUE = """    epilogue : Epilogue, optional
        ``act(conv + bias)`` (:class:`.epilogue.Epilogue`) applied as the output is written.
"""


def bind_doc(kind: str, *, strategy: bool = False, epilogue: bool = False):
    """Decorate a ``kind`` convolution bind: its docstring (a summary saying what the bind
    computes and which geometry it needs) gets the Parameters, Returns and Raises sections
    every bind shares."""
    result = {"forward": "out", "backward_data": "grad", "backward_filter": "grad"}[kind]
    sections = (
        "\n\n    Parameters\n    ----------\n" + _DOC_OPERANDS[kind]
        + "    stride, pad, dilate : sequence of int\n        One value per spatial dim.\n"
        + "    flip : bool\n        True for CONVOLUTION mode (the filter is flipped spatially), "
        + "False for\n        CROSS_CORRELATION.\n"
        + (_DOC_STRATEGY if strategy else "") + (_DOC_EPILOGUE if epilogue else "")
        + "\n    Returns\n    -------\n    Callable[[], None]\n        A zero-argument callable "
        + f"computing ``{result}`` from the current inputs.\n"
        + "\n    Raises\n    ------\n    ValueError\n        When the operands and the geometry do "
        + "not make a convolution the bind accepts.\n    "
    )  # fmt: skip

    def decorate(fn: Callable) -> Callable:
        fn.__doc__ = (fn.__doc__ or "").rstrip() + sections
        return fn

    return decorate


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


# ---- threads -------------------------------------------------------------------------------
#: threads Winograd's bands and the direct planes are split over; None:
#: :func:`parallel.num_threads` (the BLAS thread count, so that both sides of a comparison use
#: the same threads), at most :data:`MAX_THREADS`
THREADS: int | None = None
MAX_THREADS = 4


def threads() -> int:
    """The thread count Winograd's transforms and the direct convolution's planes are split
    over now (:data:`THREADS`)."""
    n = parallel.num_threads() if THREADS is None else int(THREADS)
    return max(1, min(MAX_THREADS, n))
