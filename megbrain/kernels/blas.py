"""BLAS kernels (MatrixMul, BatchedMatrixMul, Dot), bound once and run into ``out``.

Transposes are views prepared at bind time; float16/bfloat16 compute in float32, int8/int16
operands multiply in ``out``'s wider integer dtype (int32, or int16 for int8), and quantized
operands (QuantizedS8, Quantized8Asymm, Quantized4Asymm) multiply their stored integers, less
their zero points, with exact int32 accumulation into a QuantizedS32 ``out`` (8-bit matrices
on the AVX-512 VNNI tiles of the quantized convolution where the CPU has them).

A float32 product by a constant matrix (bound inside
:func:`.conv.constant_operands.constant_filter`: a MatrixMul's or BatchedMatrixMul's weight)
runs the packed GEMM (:mod:`.packed_gemm`), with a bias and elementwise tail in its write-out
for :func:`bind_batched_matmul_tail`. The others run on megbrain's kernel threads with
BLAS single-threaded (:mod:`.gemm`): a large matrix product is split into row or column
blocks, a batch into its matrices.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from . import jit_codegen, packed_gemm, parallel
from .arrays import F32, is_low_float
from .conv.constant_operands import filter_is_constant
from .conv.quantized import bind_quantized_matmul
from .elemwise import quant_params
from .gemm import matmul_step, products_step
from .steps import Step, chain

__all__ = ["bind_batched_matmul", "bind_batched_matmul_tail", "bind_dot", "bind_matmul"]

_partial = functools.partial
_I32 = np.dtype(np.int32)
_I16 = np.dtype(np.int16)
_SMALL_INTS = (np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16))
_QUANT_OPERANDS = ("QuantizedS8", "Quantized8Asymm", "Quantized4Asymm")


def _compute_dtype(name: str, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.dtype:
    qa, qb = quant_params(a.dtype), quant_params(b.dtype)
    if qa is not None or qb is not None:
        if qa is None or qb is None or qa.name != qb.name or qa.name not in _QUANT_OPERANDS:
            raise ValueError(
                f"{name}: unsupported quantized operands {qa.name if qa else a.dtype.name}, "
                f"{qb.name if qb else b.dtype.name}"
            )
        if out.dtype != _I32:
            raise ValueError(f"{name}: quantized operands need an int32 (QuantizedS32) output")
        return _I32
    if a.dtype != b.dtype:
        raise ValueError(f"{name}: operands of different dtypes {a.dtype.name}, {b.dtype.name}")
    dtype = a.dtype
    if is_low_float(dtype):
        return F32
    if dtype in _SMALL_INTS and out.dtype in (_I16, _I32) and out.dtype.itemsize > dtype.itemsize:
        return out.dtype  # accumulate in the output's width, as MegDNN's Int8x8x16/x32 do
    if dtype.kind not in "iuf":
        raise ValueError(f"{name}: unsupported dtype {dtype.name}")
    return dtype


def _bind(name: str, product, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> Callable[[], None]:
    """The step ``product(a, b, out)`` binds, with operands and result converted to the
    compute dtype if needed.

    Quantized operands are converted to their stored integers less their zero points."""
    dtype = _compute_dtype(name, a, b, out)
    steps = []
    operands = []
    for x in (a, b):
        qp = quant_params(x.dtype)
        if x.dtype != dtype or qp is not None:
            x32 = np.empty(x.shape, dtype)
            steps.append(_partial(np.copyto, x32, x, "unsafe"))
            if qp is not None and qp.zero_point:
                steps.append(_partial(np.subtract, x32, dtype.type(qp.zero_point), x32))
            x = x32
        operands.append(x)
    res = out if out.dtype == dtype else np.empty(out.shape, dtype)
    steps.append(product(*operands, res))
    if res is not out:
        steps.append(_partial(np.copyto, out, res, "unsafe"))
    return chain(steps)


def bind_matmul(
    a: np.ndarray, b: np.ndarray, out: np.ndarray, transpose_a: bool = False,
    transpose_b: bool = False,
) -> Callable[[], None]:  # fmt: skip
    """Bind ``out = op(a) @ op(b)`` for 2-d matrices, op transposing when asked.

    Parameters
    ----------
    a, b : numpy.ndarray
        2-d operands of one dtype.
    out : numpy.ndarray
        The (m, n) result.
    transpose_a, transpose_b : bool
        Whether to use the transpose of ``a`` / ``b``.

    Returns
    -------
    Callable[[], None]
        A zero-argument callable computing the product into ``out``.
    """
    return _bind_products("MatrixMul", 2, matmul_step, a, b, out, transpose_a, transpose_b)


def bind_batched_matmul(
    a: np.ndarray, b: np.ndarray, out: np.ndarray, transpose_a: bool = False,
    transpose_b: bool = False,
) -> Callable[[], None]:  # fmt: skip
    """Bind :func:`bind_matmul` over 3-d batches of matrices, batch first:
    ``out[i] = op(a[i]) @ op(b[i])``.

    Parameters
    ----------
    a, b, out : numpy.ndarray
        :func:`bind_matmul`'s operands and result with a leading batch axis of one size.
    transpose_a, transpose_b : bool
        Whether to transpose every matrix of ``a`` / ``b``.

    Returns
    -------
    Callable[[], None]
        A zero-argument callable computing every product of the batch into ``out``.
    """
    return _bind_products(
        "BatchedMatrixMul", 3, _batched_step, a, b, out, transpose_a, transpose_b
    )


def _bind_products(
    name: str, ndim: int, product, a: np.ndarray, b: np.ndarray, out: np.ndarray,
    transpose_a: bool, transpose_b: bool,
) -> Callable[[], None]:  # fmt: skip
    """:func:`_bind` of ``product`` on ``ndim``-d operands (matrices, or a batch of them
    first), each transposed (its last two axes swapped) when asked, shapes checked."""
    if a.ndim != ndim or b.ndim != ndim:
        raise ValueError(
            f"{name}: operands must be {ndim}-d, got shapes {a.shape} and {b.shape}"
        )
    x = a.swapaxes(-1, -2) if transpose_a else a
    y = b.swapaxes(-1, -2) if transpose_b else b
    expected = (*x.shape[:-1], y.shape[-1])
    if x.shape[:-2] != y.shape[:-2] or x.shape[-1] != y.shape[-2] or out.shape != expected:
        raise ValueError(
            f"{name}: shapes {a.shape} and {b.shape} (transpose_a={transpose_a}, "
            f"transpose_b={transpose_b}) do not give output shape {out.shape}"
        )
    if ndim == 2 and quant_params(x.dtype) is not None:
        fast = bind_quantized_matmul(x, y, out)
        if fast is not None:
            return fast
    if filter_is_constant():
        packed = _packed_step(x, y, out)
        if packed is not None:
            return packed
    return _bind(name, product, x, y, out)


def bind_batched_matmul_tail(
    a: np.ndarray, b: np.ndarray, bias: np.ndarray, out: np.ndarray, transpose_a: bool,
    transpose_b: bool, tail: tuple, residual: tuple | None = None,
) -> Callable[[], None]:  # fmt: skip
    """Bind ``out[i] = tail(op(a[i]) @ op(b[i]) + bias)``: :func:`bind_batched_matmul` with a
    bias along the columns and an elementwise tail (a JIT expression of one input); with a
    ``residual`` ``(scale, addend)``, ``out = tail(...) * scale + addend``.

    Parameters
    ----------
    a, b, out, transpose_a, transpose_b
        As for :func:`bind_batched_matmul` (float32).
    bias : numpy.ndarray
        The ``n`` float32 values added to every row (1-d).
    tail : tuple
        The JIT expression (:mod:`.jit_codegen`'s form) of ``("i", 0)``, the biased product;
        ``()`` for none.
    residual : tuple, optional
        ``(scale, addend)``: the float32 vector of the output's columns (1-d) multiplying the
        tail's result and the float32 array of the output's shape added after (a ConvNeXt
        block's layer scale and shortcut).

    Returns
    -------
    Callable[[], None]
        A zero-argument callable computing ``out``: the packed GEMM applies the bias, the
        tail and the residual in its tiles' write-out (a constant ``b``,
        :data:`.gemm_loops.TAIL_MODES`), else the JIT's kernel of them runs over ``out``
        after the product, in place.
    """
    if bias.ndim != 1 or bias.shape[0] != out.shape[-1] or bias.dtype != F32 or out.dtype != F32:
        raise ValueError(
            f"BatchedMatrixMulTail: bias {bias.shape} {bias.dtype} must be a float32 vector of "
            f"the output's {out.shape[-1]} columns (output {out.shape} {out.dtype})"
        )
    jit_codegen.check_expr(tail or (("ADD", (("i", 0), ("c", 0.0))),), 1)
    if residual is not None:
        scale, addend = residual
        if (scale.shape != bias.shape or addend.shape != out.shape
                or scale.dtype != F32 or addend.dtype != F32):  # fmt: skip
            raise ValueError(
                f"BatchedMatrixMulTail: scale {scale.shape} {scale.dtype} and addend "
                f"{addend.shape} {addend.dtype} must be float32 of shapes {bias.shape} and "
                f"{out.shape}"
            )
    if filter_is_constant() and bias.flags.c_contiguous and all(
        m in packed_gemm.TAIL_MODES for m, _ in tail
    ):
        x = a.swapaxes(-1, -2) if transpose_a else a
        y = b.swapaxes(-1, -2) if transpose_b else b
        if x.ndim == y.ndim == 3 and out.shape == (*x.shape[:-1], y.shape[-1]):
            packed = _packed_step(x, y, out, bias, tail, residual)
            if packed is not None:
                return packed
    product = bind_batched_matmul(a, b, out, transpose_a, transpose_b)
    shifted = tuple((m, tuple(("t", j + 1) if k == "t" else ("t", 0) if k == "i" else (k, j)
                              for k, j in args)) for m, args in tail)  # fmt: skip
    expr = (("ADD", (("i", 0), ("i", 1))), *shifted)
    if residual is None:
        return chain([product, jit_codegen.bind(expr, [out, bias], out)])
    last = ("t", len(expr) - 1)
    expr = (*expr, ("MUL", (last, ("i", 2))), ("ADD", (("t", len(expr)), ("i", 3))))
    return chain([product, jit_codegen.bind(expr, [out, bias, *residual], out)])


def _packed_step(a: np.ndarray, b: np.ndarray, out: np.ndarray, bias: np.ndarray | None = None,
                 tail: tuple = (), residual: tuple | None = None) -> Step | None:  # fmt: skip
    """The packed GEMM (:mod:`.packed_gemm`) of a constant float32 ``b``: a matrix, a batch
    of one, or one matrix broadcast over the batch with the rows of ``a`` and ``out`` views
    of one matrix each, with ``bias``, ``tail`` and ``residual`` in its write-out; None where
    it does not apply."""
    addend = None if residual is None else residual[1]
    if a.ndim == 3:
        if a.shape[0] == 1:
            a, b, out = a[0], b[0], out[0]
            addend = None if addend is None else addend[0]
        elif b.strides[0] == 0 and out.size:
            a, b, out = _as_rows(a), b[0], _as_rows(out)
            addend = None if addend is None else _as_rows(addend)
            if a is None or out is None or residual is not None and addend is None:
                return None
        else:
            return None
    if not packed_gemm.usable_packed_matmul(a, b, out):
        return None
    if residual is not None:
        if not packed_gemm.usable_residual(residual[0], addend, out):
            return None
        residual = (residual[0], addend)
    epi = 0 if bias is None else 1
    return packed_gemm.bind_packed_matmul(a, b, out, constant=True, bias=bias, epi=epi,
                                          tail=tail, residual=residual)  # fmt: skip


def _batched_step(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> Step:
    """``out[i] = a[i] @ b[i]``, the batch's products as :func:`products_step` runs them.

    Where every ``b[i]`` is one matrix (a broadcast weight, batch stride 0) and the rows of
    ``a`` and ``out`` are views of one matrix each, the batch is one GEMM over all the rows:
    a channels-last Linear layer's 56 products of 56 rows ran as many small BLAS calls."""
    if a.shape[0] > 1 and b.strides[0] == 0 and out.size:
        rows_a, rows_out = _as_rows(a), _as_rows(out)
        if rows_a is not None and rows_out is not None:
            return matmul_step(rows_a, b[0], rows_out)
    return products_step([(a[i], b[i], out[i]) for i in range(a.shape[0])])


def _as_rows(x: np.ndarray) -> np.ndarray | None:
    """The (bt, m, k) batch ``x`` as one (bt * m, k) matrix, a view; None where its strides
    do not allow one."""
    bt, m, k = x.shape
    if m == 1:
        row = x.strides[0]
    elif x.strides[0] == m * x.strides[1]:
        row = x.strides[1]
    else:
        return None
    return np.lib.stride_tricks.as_strided(x, (bt * m, k), (row, x.strides[2]))


def bind_dot(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> Callable[[], None]:
    """Bind the dot product of two 1-d vectors into ``out`` of shape (1,).

    A vector of shape (1,) broadcasts against the other, as MegBrain's Dot allows.

    Parameters
    ----------
    a, b : numpy.ndarray
        1-d operands of one dtype.
    out : numpy.ndarray
        The (1,) result.

    Returns
    -------
    Callable[[], None]
        A zero-argument callable computing the dot product into ``out``.
    """
    if a.ndim != 1 or b.ndim != 1 or out.shape != (1,):
        raise ValueError(f"Dot: shapes {a.shape} and {b.shape} (1-d) into {out.shape}")
    if a.shape != b.shape:
        if a.shape == (1,):
            a = np.broadcast_to(a, b.shape)
        elif b.shape == (1,):
            b = np.broadcast_to(b, a.shape)
        else:
            raise ValueError(f"Dot: vectors of different lengths, shapes {a.shape} and {b.shape}")
    return _bind("Dot", _dot_step, a, b, out.reshape(()))


def _dot_step(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> Step:
    return parallel.concurrently_blas_single_threaded([_partial(np.dot, a, b, out)])
