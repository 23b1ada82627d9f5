"""Linear algebra operators beyond matrix products: MatrixInverse and SVD over
batches of matrices ``[..., m, n]``, computed by ``numpy.linalg``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..graph import OperatorNodeBase, OperatorNodeConfig, ParamBase, register_opr, static_shape
from ..graph.operator import fmt_shape, table_param
from . import param_defs as pdefs
from .base import SymbolVar, _merge_config, canonize_input_vars, insert_opr
from .blas import batched_matrix_mul, matrix_mul
from .param_args import opr_params
from .sereg_params import register_strict
from .tensor_manip import add_axis, reshape

__all__ = ["MatrixInverse", "SVD", "matrix_inverse", "svd"]


class _LinalgBase(OperatorNodeBase):
    def infer_dtypes(self, in_dtypes):
        if in_dtypes[0].kind != "f" or in_dtypes[0].itemsize < 4:
            raise self.error(f"input must be float32 or float64, got {in_dtypes[0]}")
        return [in_dtypes[0]] * self.nr_outputs

    def _matrices(self, shape: tuple) -> tuple[tuple, int, int]:
        if len(shape) < 2:
            raise self.error(f"input must be [..., m, n], got {fmt_shape(shape)}")
        return tuple(shape[:-2]), shape[-2], shape[-1]

    def _run_linalg(self, fn, *args, **kw):
        try:
            return fn(*args, **kw)
        except np.linalg.LinAlgError as exc:
            raise self.error(f"{exc} (input shape {fmt_shape(args[0].shape)})") from None


def _matmul(a, b, ta: bool = False, tb: bool = False) -> SymbolVar:
    """``op(a) @ op(b)`` over batches ``[..., m, n]`` with static shapes."""
    a, b = SymbolVar(a), SymbolVar(b)
    sa, sb = static_shape(a.node), static_shape(b.node)
    if len(sa) == 2:
        return matrix_mul(a, b, ta, tb)
    if len(sa) == 3:
        return batched_matrix_mul(a, b, ta, tb)
    out = batched_matrix_mul(reshape(a, (-1, *sa[-2:])), reshape(b, (-1, *sb[-2:])), ta, tb)
    return reshape(out, sa[:-2] + static_shape(out.node)[-2:])


# ---- MatrixInverse ---------------------------------------------------------------------------
@register_opr
class MatrixInverse(_LinalgBase):
    """The inverse of each matrix of ``[..., n, n]``."""

    def infer_shapes(self, in_shapes, in_values):
        _, m, n = self._matrices(in_shapes[0])
        if m != n:
            raise self.error(f"matrices must be square, got {fmt_shape(in_shapes[0])}")
        return [in_shapes[0]]

    def bind(self, ins, outs):
        src, out = ins[0], outs[0]

        def run():
            np.copyto(out, self._run_linalg(np.linalg.inv, src))

        return run

    def grad(self, wrt_idx, out_grads):
        """``-Y^T G Y^T`` with ``Y = A^-1``."""
        if out_grads[0] is None:
            return None
        y = self.outputs[0]
        return (-_matmul(_matmul(y, out_grads[0], ta=True), y, tb=True)).node


# ---- SVD -------------------------------------------------------------------------------------
@dataclass(frozen=True)
@table_param(pdefs.SVD)
class SVDParam(ParamBase):
    """Param of SVD: ``full_matrices`` makes u and vt square ([..., m, m] and [..., n, n]
    instead of [..., m, k] and [..., k, n]); without ``compute_uv`` they are empty (shape
    (0,))."""


@register_opr
class SVD(_LinalgBase):
    """``A = u @ diag(s) @ vt`` for each matrix of ``[..., m, n]``; outputs u, s (descending,
    ``[..., min(m, n)]``) and vt."""

    Param = SVDParam
    nr_outputs = 3

    def infer_shapes(self, in_shapes, in_values):
        lead, m, n = self._matrices(in_shapes[0])
        k = min(m, n)
        p = self.param
        if not p.compute_uv:
            return [(0,), lead + (k,), (0,)]
        if p.full_matrices:
            return [lead + (m, m), lead + (k,), lead + (n, n)]
        return [lead + (m, k), lead + (k,), lead + (k, n)]

    def bind(self, ins, outs):
        src, (u, s, vt), p = ins[0], outs, self.param

        def run():
            if not p.compute_uv:
                np.copyto(s, self._run_linalg(np.linalg.svd, src, compute_uv=False))
                return
            got = self._run_linalg(np.linalg.svd, src, full_matrices=p.full_matrices)
            for o, g in zip((u, s, vt), got):
                np.copyto(o, g)

        return run

    def grad(self, wrt_idx, out_grads):
        """The gradient through s: ``u @ diag(gs) @ vt`` (thin u and vt)."""
        gu, gs, gvt = out_grads
        if gu is not None or gvt is not None:
            raise self.error("only the gradient through the singular values s is implemented")
        if gs is None:
            return None
        src = self.inputs[0]
        u, _, vt = insert_opr(SVD([src], SVDParam(False, True), OperatorNodeConfig()))
        lead = len(static_shape(src)) - 2
        return _matmul(u * add_axis(SymbolVar(gs), lead), vt).node


# ---- functions -------------------------------------------------------------------------------
@opr_params(("param", "Empty"))
def matrix_inverse(src, *, name=None, comp_node=None, config=None, comp_graph=None) -> SymbolVar:
    """The inverse of each matrix of ``src`` ``[..., n, n]`` (registry name
    ``MatrixInverse``); a singular matrix raises when the function runs."""
    cfg = _merge_config(name, comp_node, config)
    (v,) = canonize_input_vars([src], comp_graph=comp_graph, config=cfg)
    return insert_opr(MatrixInverse([v], None, cfg))[0]


@opr_params(("param", "SVD"))
def svd(
    src,
    full_matrices: bool = False,
    compute_uv: bool = True,
    *,
    name=None,
    comp_node=None,
    config=None,
    comp_graph=None,
) -> list[SymbolVar]:
    """Singular value decomposition of each matrix of ``src`` ``[..., m, n]`` (``SVD``).

    Returns
    -------
    list of SymbolVar
        ``[u, s, vt]`` with ``src = u @ diag(s) @ vt``; u and vt are empty without
        ``compute_uv``. Only the gradient through ``s`` is defined.
    """
    cfg = _merge_config(name, comp_node, config)
    (v,) = canonize_input_vars([src], comp_graph=comp_graph, config=cfg)
    return insert_opr(SVD([v], SVDParam(bool(full_matrices), bool(compute_uv)), cfg))


# ---- serialization (megbrain/serialization/sereg.py) -------------------------------------
register_strict(MatrixInverse, pdefs.Empty)
register_strict(SVD)  # param.SVD, SVDParam's table
