"""Compile-time fusions of a transformer-style block's operators (ConvNeXt's): a product by
a weight with the bias and elementwise tail reading it (``fuse_matmul_tail``,
:class:`~megbrain.opr.blas.BatchedMatrixMulTail`), and a layer normalization over the last
axis as one operator (``fuse_layer_norm``, :class:`~megbrain.opr.dnn_norm.LayerNormLast`).
Both run after ``jit_fusion``, on its JITExecutors, at the same JIT levels, and only in
compiled functions (graph files keep the operators they replace)."""

from __future__ import annotations

import numpy as np

from ..graph import OperatorNodeConfig, VarNode
from ..kernels.packed_gemm import TAIL_MODES
from ..opr.blas import BatchedMatrixMul, BatchedMatrixMulTail, BatchedMatrixMulTailParam
from .jit import _fusable_graph, _shape, _sweep
from .passes import register_pass

__all__ = ["fuse_matmul_tail"]

_F32 = np.dtype(np.float32)


def _column_bias(v: VarNode, n: int) -> bool:
    """Whether ``v`` is a float32 vector of ``n`` values along the last axis ((n,), or
    (1, ..., 1, n))."""
    shape = _shape(v)
    return (
        v.dtype == _F32
        and shape is not None
        and len(shape) >= 1
        and shape[-1] == n
        and all(d == 1 for d in shape[:-1])
    )


def _split_bias_add(opr, y: VarNode, n: int) -> tuple[VarNode, tuple] | None:
    """``(bias, tail)`` when ``opr`` (an Elemwise ADD or a JITExecutor) computes
    ``tail(y + bias)``: its first node adds a column bias to ``y`` and the rest reads only
    that sum, constants and modes of :data:`TAIL_MODES`; else None."""
    if opr.extra_deps or len(opr.inputs) != 2 or opr.outputs[0].dtype != _F32:
        return None
    if opr.type_name == "Elemwise" and opr.param.mode == "ADD":
        bias = opr.inputs[1] if opr.inputs[0] is y else opr.inputs[0]
        if bias is y or opr.inputs[1] is not y and opr.inputs[0] is not y:
            return None
        return (bias, ()) if _column_bias(bias, n) else None
    if opr.type_name != "JITExecutor" or opr.param.reduce is not None:
        return None
    if opr.inputs[0] is opr.inputs[1] or y not in opr.inputs:
        return None
    iy = opr.inputs.index(y)
    (mode, args), *rest = opr.param.expr
    if mode != "ADD" or sorted(args) != [("i", 0), ("i", 1)]:
        return None
    tail = []
    for m, margs in rest:
        if m not in TAIL_MODES or any(k == "i" for k, _ in margs):
            return None
        tail.append((m, tuple(("i", 0) if (k, j) == ("t", 0) else (k, j - 1) if k == "t"
                              else (k, j) for k, j in margs)))  # fmt: skip
    bias = opr.inputs[1 - iy]
    return (bias, tuple(tail)) if _column_bias(bias, n) else None


@register_pass("fuse_matmul_tail")
def fuse_matmul_tail(graph, dest: list[VarNode]) -> dict:
    """The pass (after ``jit_fusion``, at JIT level 1 and up): a float32 BatchedMatrixMul
    whose product only an Elemwise ADD of a column bias, or a JITExecutor computing an
    expression of such a sum (a Linear layer's bias and GELU), reads (directly or through
    one Reshape that only it reads) becomes one
    :class:`~megbrain.opr.blas.BatchedMatrixMulTail`; a Reshape after it gives the replaced
    output's shape."""
    found = _fusable_graph(graph, dest)
    if found is None:
        return {}
    oprs, readers, external = found
    fused_at: dict = {}  # the tail operator -> (product, reshape or None, bias, tail)
    for o in oprs:
        if type(o) is not BatchedMatrixMul or o.extra_deps or o.outputs[0].dtype != _F32:
            continue
        y = o.outputs[0]
        shape = _shape(y)
        if shape is None or y in external or len(readers.get(y, ())) != 1:
            continue
        (nxt,) = readers[y]
        reshape = None
        if nxt.type_name == "Reshape" and not nxt.extra_deps:
            reshape, y = nxt, nxt.outputs[0]
            if y in external or len(readers.get(y, ())) != 1:
                continue
            (nxt,) = readers[y]
        if nxt.comp_node != o.comp_node:
            continue
        split = _split_bias_add(nxt, y, shape[-1])
        if split is not None:
            fused_at[nxt] = (o, reshape, *split)
    if not fused_at:
        return {}

    def fused(t, memo: dict) -> tuple[VarNode, VarNode]:
        mm, reshape, bias, tail = fused_at[t]
        fields = {f: getattr(mm.param, f) for f in mm.param.__dataclass_fields__}
        param = BatchedMatrixMulTailParam(**fields, tail=tail)
        cfg = OperatorNodeConfig(comp_node=mm.comp_node)
        b = memo.get(bias, bias)
        new = graph.insert_opr(BatchedMatrixMulTail([memo.get(v, v) for v in mm.inputs] + [b],
                                                    param, cfg))[0]  # fmt: skip
        if reshape is not None:
            new = graph.insert_opr(reshape.clone([new, *reshape.inputs[1:]]))[0]
        return t.outputs[0], new

    skip = {mm for mm, *_ in fused_at.values()}
    skip.update(r for _, r, *_ in fused_at.values() if r is not None)
    return _sweep(graph, oprs, skip, {t: fused for t in fused_at})
