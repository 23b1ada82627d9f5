"""Linear algebra operators: MatrixMul, BatchedMatrixMul and Dot, with their
``mgb.opr`` functions ``matrix_mul``, ``batched_matrix_mul`` and ``dot``; the compile-time
BatchedMatrixMulTail (a product with its bias and elementwise tail)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..dtype import dtype_name, get_scale, is_bfloat16, is_quantize, qint32
from ..graph import OperatorNodeBase, ParamBase, register_opr, static_shape
from ..graph.operator import NoGradient, fmt_shape, table_param
from ..kernels import blas as blas_kernels
from ..kernels.conv.constant_operands import constant_filter
from ..serialization import sereg
from . import param_defs as pdefs
from ._internal import input_is_constant, reduce_to_input, sv
from .base import SymbolVar, build_opr
from .basic_arith import fmt_dtype, same_dtype
from .param_args import opr_params
from .sereg_params import register_strict
from .tensor_manip import broadcast, get_var_shape

__all__ = [
    "MatrixMul",
    "BatchedMatrixMul",
    "BatchedMatrixMulTail",
    "BatchedMatrixMulTailParam",
    "Dot",
    "MatrixMulParam",
    "matrix_mul",
    "batched_matrix_mul",
    "dot",
    "matrix_mul_v0",
    "batched_matrix_mul_v0",
]

_I32 = np.dtype(np.int32)
_I16 = np.dtype(np.int16)
_I8 = np.dtype(np.int8)
#: integer operand dtypes whose product is accumulated in int32 (MegDNN's Int8/Int16 matmul)
_WIDENED_INTS = (np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16))


@dataclass(frozen=True)
@table_param(pdefs.MatrixMul)
class MatrixMulParam(ParamBase):
    """Param of MatrixMul and BatchedMatrixMul.

    ``compute_mode=FLOAT32`` asks float16 operands to be multiplied in float32; the kernels
    always do so, so both modes give the same result. Of the formats only DEFAULT
    (row-major matrices) is implemented.
    """

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "transposeA", bool(self.transposeA))
        object.__setattr__(self, "transposeB", bool(self.transposeB))


#: quantized operand kinds MegDNN multiplies into QuantizedS32 (scale = product of scales)
_QUANT_OPERANDS = ("QuantizedS8", "Quantized8Asymm", "Quantized4Asymm")


def _deduce_dtype(
    opr: OperatorNodeBase, in_dtypes: list[np.dtype], quantized: bool = True
) -> np.dtype:
    """MegDNN's ``MatrixMulForward::deduce_dtype``: floats keep their dtype, int8/int16 give
    int32 (int8 also int16 when asked), quantized operands of one kind give QuantizedS32 with
    the product of their scales; a dtype given in the config must be a deduced one."""
    a, b = in_dtypes
    qa, qb = is_quantize(a), is_quantize(b)
    want = opr.config.dtype_value
    if qa or qb:
        if not (qa and qb and dtype_name(a) == dtype_name(b)):
            raise opr.error(f"operands must be of one dtype, got {fmt_dtype(a)} and {fmt_dtype(b)}")
        if not quantized or dtype_name(a) not in _QUANT_OPERANDS:
            raise opr.error(f"unsupported operand dtype {fmt_dtype(a)}")
        # MegDNN's mul_scale: the float32 product of the float32 scales
        scale = float(np.float32(get_scale(a)) * np.float32(get_scale(b)))
        if want is None:
            return qint32(scale)
        if dtype_name(want) != "QuantizedS32" or not math.isclose(
            get_scale(want), scale, rel_tol=1e-6
        ):
            raise opr.error(
                f"unsupported output dtype {fmt_dtype(want)} for operands of dtypes "
                f"{fmt_dtype(a)} and {fmt_dtype(b)} (expected QuantizedS32(scale={scale:g}))"
            )
        return want
    if a != b:
        raise opr.error(f"operands must share one dtype, got {a} and {b}")
    if not (a.kind in "iuf" or is_bfloat16(a)):
        raise opr.error(f"unsupported operand dtype {a}")
    deduced = _I32 if a in _WIDENED_INTS else a
    allowed = (deduced, _I16) if a == _I8 else (deduced,)
    if want is not None and not any(same_dtype(want, d) for d in allowed):
        raise opr.error(f"unsupported output dtype {fmt_dtype(want)} for operands of dtype {a}")
    return deduced if want is None else want


class _MatMulBase(OperatorNodeBase):
    """Shared dtype and format checks of MatrixMul and BatchedMatrixMul."""

    Param = MatrixMulParam
    ndim: int = 2

    def infer_dtypes(self, in_dtypes):
        if len(in_dtypes) != 2:
            raise self.error(f"expected 2 inputs, got {len(in_dtypes)}")
        if self.param.format != "DEFAULT":
            raise self.error(f"format {self.param.format} is not supported")
        return [_deduce_dtype(self, in_dtypes)]

    def _shape_error(self, a, b, why: str):
        p = self.param
        return self.error(
            f"{why}: shapes {fmt_shape(a)} and {fmt_shape(b)} "
            f"(transposeA={p.transposeA}, transposeB={p.transposeB})"
        )

    def infer_shapes(self, in_shapes, in_values):
        a, b = (tuple(s) for s in in_shapes)
        nd = self.ndim
        if len(a) != nd or len(b) != nd:
            raise self._shape_error(a, b, f"operands must be {nd}-d")
        p = self.param
        m, k = (a[-1], a[-2]) if p.transposeA else (a[-2], a[-1])
        k2, n = (b[-1], b[-2]) if p.transposeB else (b[-2], b[-1])
        if k != k2:
            raise self._shape_error(a, b, f"inner dimensions differ ({k} vs {k2})")
        if nd == 3 and a[0] != b[0]:
            raise self._shape_error(a, b, f"batch sizes differ ({a[0]} vs {b[0]})")
        return [a[:-2] + (m, n)]


@register_opr
class MatrixMul(_MatMulBase):
    """``op(A) @ op(B)`` for 2-d ``A`` (m, k) and ``B`` (k, n), op transposing when asked."""

    def bind(self, ins, outs):
        p = self.param
        # a constant B (a classifier's weight) is packed once (float32, quantized products)
        with constant_filter(input_is_constant(self, 1)):
            return blas_kernels.bind_matmul(ins[0], ins[1], outs[0], p.transposeA,
                                            p.transposeB)

    def grad(self, wrt_idx, out_grads):
        return _matmul_grad(self, wrt_idx, out_grads, matrix_mul)


@register_opr
class BatchedMatrixMul(_MatMulBase):
    """``op(A[i]) @ op(B[i])`` for 3-d batches of matrices, batch first."""

    ndim = 3

    def bind(self, ins, outs):
        p = self.param
        # a constant weight (a Linear layer's, one matrix or broadcast) is packed once
        with constant_filter(input_is_constant(self, 1)):
            return blas_kernels.bind_batched_matmul(ins[0], ins[1], outs[0], p.transposeA,
                                                    p.transposeB)

    def grad(self, wrt_idx, out_grads):
        return _matmul_grad(self, wrt_idx, out_grads, batched_matrix_mul)


@dataclass(frozen=True)
class BatchedMatrixMulTailParam(MatrixMulParam):
    """Param of BatchedMatrixMulTail: MatrixMul's and the fused ``tail``, a JIT expression
    (:mod:`megbrain.kernels.jit_codegen`'s form) of one input, the biased product."""

    tail: tuple = ()


@register_opr
class BatchedMatrixMulTail(BatchedMatrixMul):
    """``tail(op(A[i]) @ op(B[i]) + bias)``: a BatchedMatrixMul, the bias (its third input,
    ``n`` values, one per column: shape (n,) or (1, ..., 1, n)) and the elementwise tail
    after it (a Linear layer's bias and GELU); with a fourth and fifth input, ``scale`` (as
    the bias) and ``addend`` (the output's shape), ``tail(...) * scale + addend`` (a ConvNeXt
    block's layer scale and shortcut).

    Made at compile time by the ``fuse_matmul_tail`` and ``fuse_matmul_residual`` passes
    (:mod:`megbrain.gopt.linear`), never by a user and never written to a graph file (the
    reference has no such operator): the packed GEMM of a constant ``B`` applies bias, tail
    and residual to its tiles' registers before it stores them; otherwise the JIT's kernel of
    them runs over the product, in place."""

    type_name = "BatchedMatrixMulTail"
    short_name = "batched_matrix_mul_tail"
    Param = BatchedMatrixMulTailParam

    def default_name(self):
        res = "+residual" if len(self.inputs) == 5 else ""
        return f"{super().default_name()}+bias{'+tail' if self.param.tail else ''}{res}"

    def infer_dtypes(self, in_dtypes):
        if len(in_dtypes) not in (3, 5) or any(d != np.float32 for d in in_dtypes):
            raise self.error(f"expected float32 A, B and bias (then scale and addend), got "
                             f"{list(map(str, in_dtypes))}")  # fmt: skip
        return super().infer_dtypes(in_dtypes[:2])

    def infer_shapes(self, in_shapes, in_values):
        (out,) = super().infer_shapes(in_shapes[:2], in_values)
        for name, i in (("bias", 2), ("scale", 3))[: len(in_shapes) - 2]:
            vec = tuple(in_shapes[i])
            if not vec or vec[-1] != out[-1] or any(d != 1 for d in vec[:-1]):
                raise self.error(f"{name} {fmt_shape(vec)} must be ({out[-1]},) or (1, ..., "
                                 f"{out[-1]}): one value per column of the product "
                                 f"{fmt_shape(out)}")  # fmt: skip
        if len(in_shapes) == 5 and tuple(in_shapes[4]) != tuple(out):
            raise self.error(f"addend {fmt_shape(in_shapes[4])} must have the product's shape "
                             f"{fmt_shape(out)}")  # fmt: skip
        return [out]

    def bind(self, ins, outs):
        p = self.param
        with constant_filter(input_is_constant(self, 1)):
            bias = ins[2].reshape(-1)  # a view: read at every run
            residual = (ins[3].reshape(-1), ins[4]) if len(ins) == 5 else None
            return blas_kernels.bind_batched_matmul_tail(ins[0], ins[1], bias, outs[0],
                                                         p.transposeA, p.transposeB, p.tail,
                                                         residual)  # fmt: skip

    def grad(self, wrt_idx, out_grads):
        raise self.error("a fused product and tail has no gradient (made at compile time)",
                         NoGradient)  # fmt: skip


@register_opr
class Dot(OperatorNodeBase):
    """The dot product of two 1-d vectors, shape (1,); a (1,) vector broadcasts."""

    def infer_dtypes(self, in_dtypes):
        if len(in_dtypes) != 2:
            raise self.error(f"expected 2 inputs, got {len(in_dtypes)}")
        return [_deduce_dtype(self, in_dtypes, quantized=False)]

    def infer_shapes(self, in_shapes, in_values):
        a, b = (tuple(s) for s in in_shapes)
        if len(a) != 1 or len(b) != 1 or (a != b and (1,) not in (a, b)):
            raise self.error(
                f"operands must be 1-d vectors of one length (or of length 1), got shapes "
                f"{fmt_shape(a)} and {fmt_shape(b)}"
            )
        return [(1,)]

    def bind(self, ins, outs):
        return blas_kernels.bind_dot(ins[0], ins[1], outs[0])

    def grad(self, wrt_idx, out_grads):
        og = out_grads[0]
        if og is None or not np.issubdtype(self.inputs[wrt_idx].dtype, np.floating):
            return None
        x, other = self.inputs[wrt_idx], sv(self.inputs[1 - wrt_idx])
        g = sv(og) * other
        if static_shape(other.node) == (1,) and static_shape(x) != (1,):
            return broadcast(g, get_var_shape(sv(x))).node  # a length-1 operand broadcast
        return reduce_to_input(g, x)


def _matmul_grad(opr, wrt_idx, out_grads, mm):
    """Gradients of ``C = op(A) @ op(B)``: each is one more (batched) matmul of dC."""
    og = out_grads[0]
    if og is None or not np.issubdtype(opr.inputs[wrt_idx].dtype, np.floating):
        return None
    a, b, dc = sv(opr.inputs[0]), sv(opr.inputs[1]), sv(og)
    ta, tb = opr.param.transposeA, opr.param.transposeB
    if wrt_idx == 0:
        if ta:
            return mm(b, dc, transposeA=tb, transposeB=True).node
        return mm(dc, b, transposeB=not tb).node
    if tb:
        return mm(dc, a, transposeA=True, transposeB=ta).node
    return mm(a, dc, transposeA=not ta).node


# ---- functions ---------------------------------------------------------------------------
@opr_params(("param", "MatrixMul"))
def matrix_mul(
    opr0,
    opr1,
    transposeA: bool = False,
    transposeB: bool = False,
    *,
    compute_mode: str = "DEFAULT",
    format: str = "DEFAULT",
    dtype=None,
    name: str | None = None,
    comp_node=None,
    config=None,
    comp_graph=None,
) -> SymbolVar:
    """Matrix product ``op(opr0) @ op(opr1)`` of 2-d vars (registry name ``MatrixMul``).

    Parameters
    ----------
    opr0, opr1 : SymbolVar or array_like
        The (m, k) and (k, n) operands (before transposition), of one dtype.
    transposeA, transposeB : bool
        Whether to use the transpose of ``opr0`` / ``opr1``.
    compute_mode : {"DEFAULT", "FLOAT32"}
        FLOAT32 multiplies float16 operands in float32.
    format : {"DEFAULT"}
        The matrix layout; only DEFAULT is supported.
    dtype : dtype-like, optional
        The output dtype. By default floats keep theirs, int8/int16 operands give int32
        (int8 may also ask for int16), and quantized operands of one kind (QuantizedS8,
        Quantized8Asymm, Quantized4Asymm) give QuantizedS32 whose scale is the product of
        theirs, accumulated exactly in int32.
    name, comp_node, config, comp_graph
        The operator config, as for every ``mgb.opr`` function.

    Returns
    -------
    SymbolVar
        The (m, n) product.
    """
    param = MatrixMulParam(transposeA, transposeB, compute_mode, format)
    return build_opr(MatrixMul, [opr0, opr1], param, dtype, name, comp_node, config, comp_graph)


@opr_params(("param", "MatrixMul"))
def batched_matrix_mul(
    opr0,
    opr1,
    transposeA: bool = False,
    transposeB: bool = False,
    *,
    compute_mode: str = "DEFAULT",
    format: str = "DEFAULT",
    dtype=None,
    name: str | None = None,
    comp_node=None,
    config=None,
    comp_graph=None,
) -> SymbolVar:
    """Batched matrix product of 3-d vars, batch first (registry name ``BatchedMatrixMul``).

    Parameters
    ----------
    opr0, opr1 : SymbolVar or array_like
        The (batch, m, k) and (batch, k, n) operands (before transposition).
    transposeA, transposeB : bool
        Whether to transpose every matrix of ``opr0`` / ``opr1``.
    compute_mode, format, dtype, name, comp_node, config, comp_graph
        As for :func:`matrix_mul`.

    Returns
    -------
    SymbolVar
        The (batch, m, n) products.
    """
    param = MatrixMulParam(transposeA, transposeB, compute_mode, format)
    vars_ = [opr0, opr1]
    return build_opr(BatchedMatrixMul, vars_, param, dtype, name, comp_node, config, comp_graph)


@opr_params(("param", "Empty"))
def dot(
    opr0, opr1, *, dtype=None, name: str | None = None, comp_node=None, config=None, comp_graph=None
) -> SymbolVar:
    """Dot product of two 1-d vars, of shape (1,) (registry name ``Dot``).

    Parameters
    ----------
    opr0, opr1 : SymbolVar or array_like
        1-d vectors of one length and dtype; a vector of length 1 broadcasts.
    dtype : dtype-like, optional
        The output dtype; int8/int16 operands give int32.
    name, comp_node, config, comp_graph
        The operator config, as for every ``mgb.opr`` function.

    Returns
    -------
    SymbolVar
        The (1,) dot product.
    """
    return build_opr(Dot, [opr0, opr1], None, dtype, name, comp_node, config, comp_graph)


# ---- legacy param version --------------------------------------------------------------------
# MatrixMulV0's data_type chose MegDNN's mixed-precision kernels; FLOAT, the default, is the
# plain computation the functions above do
@opr_params(("param", "MatrixMulV0"))
def matrix_mul_v0(
    opr0, opr1, *, transposeA: bool = False, transposeB: bool = False, name=None,
    comp_node=None, config=None, comp_graph=None,
) -> SymbolVar:  # fmt: skip
    """:func:`matrix_mul` with MegBrain's legacy param ``MatrixMulV0`` (``data_type`` FLOAT).

    Returns
    -------
    SymbolVar
        The (m, n) product.
    """
    return matrix_mul(
        opr0, opr1, transposeA, transposeB, name=name, comp_node=comp_node, config=config,
        comp_graph=comp_graph,
    )  # fmt: skip


@opr_params(("param", "MatrixMulV0"))
def batched_matrix_mul_v0(
    opr0, opr1, *, transposeA: bool = False, transposeB: bool = False, name=None,
    comp_node=None, config=None, comp_graph=None,
) -> SymbolVar:  # fmt: skip
    """:func:`batched_matrix_mul` with the legacy param ``MatrixMulV0`` (``data_type`` FLOAT).

    Returns
    -------
    SymbolVar
        The (batch, m, n) products.
    """
    return batched_matrix_mul(
        opr0, opr1, transposeA, transposeB, name=name, comp_node=comp_node, config=config,
        comp_graph=comp_graph,
    )  # fmt: skip


# ---- serialization (megbrain/serialization/sereg.py) -------------------------------------
# the reference registers its current MatrixMul as MatrixMulV2 (the type id of "MatrixMul")
# both write param.MatrixMul, MatrixMulParam's table
register_strict(MatrixMul, name="MatrixMulV2")
register_strict(BatchedMatrixMul, name="BatchedMatrixMulV2")
register_strict(Dot, pdefs.Empty)
sereg.register_fused(BatchedMatrixMulTail,
                     lambda opr: "BatchedMatrixMul with a fused bias and elementwise tail")
