"""Normalization operators: BatchNorm and LRN with their backward operators, the
compile-time LayerNormLast, and the ``mgb.opr`` functions ``batch_norm``,
``batch_norm_no_statistic`` and ``lrn``.

Running statistics: as MegBrain's BatchNormForward, BatchNorm in TRAINING mode with
running_mean and running_variance inputs (which must then be shared tensors) updates them in
place, ``old*(1-avg_factor) + batch*avg_factor``: its outputs 0 and 1 are views of those
inputs' memory (:meth:`BatchNorm.fwd_views`), declared through
:meth:`BatchNorm.overwritten_inputs` so that the comp seq runs every other reader of the old
statistics first, as for AddUpdate. The update happens whenever the operator runs, whether
or not outputs 0 and 1 are fetched.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..dtype import is_bfloat16
from ..errors import GraphError
from ..graph import OperatorNodeBase, ParamBase, register_opr
from ..graph.operator import NoGradient, fmt_shape, table_param
from ..kernels import dnn_norm as kern
from ..kernels.layer_norm import bind_layer_norm, bind_layer_norm_nchw88
from ..serialization import sereg
from . import param_defs as pdefs
from .base import SymbolVar, _merge_config, canonize_input_vars, insert_opr
from .param_args import as_int, opr_params
from .sereg_params import register_strict

__all__ = [
    "BNParam",
    "BatchNorm",
    "BatchNormBackward",
    "BatchNormTail",
    "BatchNormTailBackward",
    "BNTailParam",
    "LRNParam",
    "LRN",
    "LRNBackward",
    "LayerNormLast",
    "LayerNormLastParam",
    "batch_norm",
    "batch_norm_no_statistic",
    "lrn",
]


def _is_float(dt: np.dtype) -> bool:
    return (dt.kind == "f" and not dt.metadata) or is_bfloat16(dt)


def _check_float(opr: OperatorNodeBase, what: str, dt: np.dtype) -> None:
    if not _is_float(dt):
        raise opr.error(f"{what} must be a float var, got {dt}")


# the table's scale and bias (constants of MegDNN's BN) are not supported: scale and bias
# are the operator's inputs
@dataclass(frozen=True)
@table_param(pdefs.BN, skip=("scale", "bias"))
class BNParam(ParamBase):
    """Param of BatchNorm (MegDNN's ``BN``).

    ``param_dim`` names the shape of scale, bias and the statistics; as in MegDNN's CPU kernel,
    the statistics are taken over the axes where scale has size 1.
    """

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "epsilon", float(self.epsilon))
        object.__setattr__(self, "avg_factor", float(self.avg_factor))


@register_opr
class BatchNorm(OperatorNodeBase):
    """Batch normalization of a 4-d ``x``; inputs (x, scale, bias[, running_mean, running_var]).

    Outputs in MegBrain order: running_mean, running_var (in TRAINING mode the statistics
    updated in place: views of inputs 3 and 4; shape (0,) without statistics or in INFERENCE
    mode), save_mean, save_inv_var (``1/sqrt(var + eps)``) and y. INFERENCE normalizes with
    the given running statistics, which save_mean and save_inv_var then echo.
    """

    #: the reference's C++ type (BatchNorm is an alias of BatchNormForward)
    type_name = "BatchNormForward"

    uses_workspace = True  # the centered input of TRAINING mode

    Param = BNParam

    @property
    def _has_stats(self) -> bool:
        return len(self.inputs) == 5 and self.param.fwd_mode == "TRAINING"

    # TRAINING with statistics writes into memory it does not own: never pruned, deduplicated
    # or folded, and bound (its outputs 0/1 forwarded) whatever the memory options
    @property
    def has_side_effect(self) -> bool:  # type: ignore[override]
        return self._has_stats

    # the statistics outputs change with every run: no static value, and inference must not
    # re-run the update
    @property
    def value_inferable(self) -> bool:  # type: ignore[override]
        return not self._has_stats

    def overwritten_inputs(self):
        return (self.inputs[3], self.inputs[4]) if self._has_stats else ()

    def fwd_views(self, ins):
        if not self._has_stats:
            return None
        return [ins[3], ins[4], None, None, None]

    def _check_stats_shared(self) -> None:
        for what, v in zip(("running_mean", "running_variance"), self.inputs[3:]):
            owner = v.owner.type_name
            if owner not in ("SharedDeviceTensor", "VolatileSharedDeviceTensor"):
                raise self.error(
                    f"{what} {v.name!r} must be a shared tensor (SharedDeviceTensor or "
                    f"VolatileSharedDeviceTensor, from make_shared) in TRAINING mode, where it "
                    f"is updated in place; got a var produced by {owner}",
                    GraphError,
                )

    def infer_dtypes(self, in_dtypes):
        if len(in_dtypes) not in (3, 5):
            raise self.error(f"expected 3 or 5 inputs, got {len(in_dtypes)}")
        if len(in_dtypes) == 3 and self.param.fwd_mode == "INFERENCE":
            raise self.error("INFERENCE mode needs running_mean and running_variance")
        if self._has_stats:
            self._check_stats_shared()
        _check_float(self, "x", in_dtypes[0])
        _check_float(self, "scale", in_dtypes[1])
        for i, what in enumerate(
            ("bias", "running_mean", "running_variance")[: len(in_dtypes) - 2]
        ):
            if in_dtypes[i + 2] != in_dtypes[1]:
                raise self.error(
                    f"{what} must have scale's dtype {in_dtypes[1]}, got {in_dtypes[i + 2]}"
                )
        return [in_dtypes[1]] * 4 + [in_dtypes[0]]

    def infer_shapes(self, in_shapes, in_values):
        x, p = tuple(in_shapes[0]), tuple(in_shapes[1])
        if len(x) != 4:
            raise self.error(f"x must be 4-d, got {fmt_shape(x)}")
        if len(p) != 4 or any(s not in (1, xs) for s, xs in zip(p, x)):
            raise self.error(
                f"scale of shape {fmt_shape(p)} does not match x {fmt_shape(x)} "
                f"({self.param.param_dim}: every axis must be 1 or x's size)"
            )
        names = ("bias", "running_mean", "running_variance")
        for what, s in zip(names, in_shapes[2:]):
            if tuple(s) != p:
                raise self.error(f"{what} has shape {fmt_shape(s)}, scale has {fmt_shape(p)}")
        stats = p if self._has_stats else (0,)
        return [stats, stats, p, p, x]

    def bind(self, ins, outs):
        mean, var = (ins[3], ins[4]) if len(ins) == 5 else (None, None)
        return kern.bind_bn_forward(
            ins[0],
            ins[1],
            ins[2],
            mean,
            var,
            *outs,
            training=self.param.fwd_mode == "TRAINING",
            epsilon=self.param.epsilon,
            avg_factor=self.param.avg_factor,
        )

    def default_name(self):
        return f"batch_norm({self.inputs[0].name})"

    def grad(self, wrt_idx, out_grads):
        if self.param.fwd_mode != "TRAINING":
            raise self.error("batch norm could only take grad in TRAINING mode")
        if wrt_idx > 2 or out_grads[4] is None:
            return None  # MegBrain differentiates y only; the statistics get no gradient
        x, scale = self.inputs[0], self.inputs[1]
        save_mean, save_inv_var = self.outputs[2], self.outputs[3]
        bwd = BatchNormBackward([x, out_grads[4], save_mean, save_inv_var, scale], self.param, None)
        d_scale, d_bias, dx = insert_opr(bwd)
        return (dx, d_scale, d_bias)[wrt_idx].node


@register_opr
class BatchNormBackward(OperatorNodeBase):
    """Inputs (x, y_grad, save_mean, save_inv_var, scale); outputs (scale_grad, bias_grad,
    x_grad) of TRAINING-mode batch normalization."""

    Param = BNParam

    def infer_dtypes(self, in_dtypes):
        if len(in_dtypes) != 5:
            raise self.error(f"expected 5 inputs, got {len(in_dtypes)}")
        return [in_dtypes[4], in_dtypes[4], in_dtypes[0]]

    def infer_shapes(self, in_shapes, in_values):
        p = tuple(in_shapes[4])
        if tuple(in_shapes[1]) != tuple(in_shapes[0]):
            raise self.error(
                f"y_grad {fmt_shape(in_shapes[1])} differs from x {fmt_shape(in_shapes[0])}"
            )
        return [p, p, tuple(in_shapes[0])]

    def bind(self, ins, outs):
        return kern.bind_bn_backward(*ins, *outs)

    def default_name(self):
        return f"batch_norm_bwd({self.inputs[0].name})"


@dataclass(frozen=True)
class BNTailParam(BNParam):
    """Param of BatchNormTail and BatchNormTailBackward: BatchNorm's and the fused
    activation ``tail`` ("RELU" or "RELU6")."""

    tail: str = "RELU6"


@register_opr
class BatchNormTail(BatchNorm):
    """A TRAINING-mode BatchNorm and the activation reading its output, ``tail(y)`` with
    tail RELU (``max(y, 0)``) or RELU6 (``min(max(y, 0), 6)``): output 4 is the activation's
    output, clamped in the normalization's writing pass; the other outputs are BatchNorm's
    (the running statistics updated in place).

    Made at compile time by the ``fuse_bn_activation`` pass (:mod:`megbrain.gopt.training`)
    on the expanded gradients, with :class:`BatchNormTailBackward` for the gradient; never
    by a user and never written to a graph file (the reference has no such operator)."""

    type_name = "BatchNormTail"
    short_name = "batch_norm_tail"
    Param = BNTailParam

    def bind(self, ins, outs):
        mean, var = (ins[3], ins[4]) if len(ins) == 5 else (None, None)
        return kern.bind_bn_forward(ins[0], ins[1], ins[2], mean, var, *outs, training=True,
                                    epsilon=self.param.epsilon,
                                    avg_factor=self.param.avg_factor,
                                    tail=self.param.tail)  # fmt: skip

    def default_name(self):
        return f"{super().default_name()}+{self.param.tail}"

    def grad(self, wrt_idx, out_grads):
        raise self.error("a fused BatchNorm activation has no gradient (made at compile time)",
                         NoGradient)  # fmt: skip


@register_opr
class BatchNormTailBackward(BatchNormBackward):
    """Inputs (x, z_grad, save_mean, save_inv_var, scale, z), outputs (scale_grad,
    bias_grad, x_grad): the gradient of :class:`BatchNormTail`, whose output ``z`` tells
    where the activation passes the gradient (``0 < z``, and ``z < 6`` for RELU6)."""

    type_name = "BatchNormTailBackward"
    short_name = "batch_norm_tail_bwd"
    Param = BNTailParam

    def infer_dtypes(self, in_dtypes):
        if len(in_dtypes) != 6:
            raise self.error(f"expected 6 inputs, got {len(in_dtypes)}")
        return super().infer_dtypes(in_dtypes[:5])

    def infer_shapes(self, in_shapes, in_values):
        if tuple(in_shapes[5]) != tuple(in_shapes[0]):
            raise self.error(f"z {fmt_shape(in_shapes[5])} differs from x "
                             f"{fmt_shape(in_shapes[0])}")  # fmt: skip
        return super().infer_shapes(in_shapes[:5], in_values)

    def bind(self, ins, outs):
        return kern.bind_bn_backward(*ins[:5], *outs, tail=self.param.tail, z=ins[5])

    def grad(self, wrt_idx, out_grads):
        raise self.error("a fused BatchNorm activation has no gradient (made at compile time)",
                         NoGradient)  # fmt: skip


@dataclass(frozen=True)
@table_param(pdefs.LRN)
class LRNParam(ParamBase):
    """Param of LRN: window ``n`` (odd) channels, ``(k + alpha * sum x**2) ** -beta``."""

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "n", as_int(self.n, "lrn", "n"))
        for f in ("k", "alpha", "beta"):
            object.__setattr__(self, f, float(getattr(self, f)))


class _LRNBase(OperatorNodeBase):
    Param = LRNParam

    def default_name(self):
        return f"{self.type_name.lower()}({self.inputs[0].name})"

    def _kw(self) -> dict:
        p = self.param
        return {"n": p.n, "k": p.k, "alpha": p.alpha, "beta": p.beta}

    def infer_dtypes(self, in_dtypes):
        for i, dt in enumerate(in_dtypes):
            _check_float(self, f"input {i}", dt)
        if any(d != in_dtypes[0] for d in in_dtypes):
            raise self.error("inputs must share one dtype: " + ", ".join(map(str, in_dtypes)))
        if self.param.n <= 0 or self.param.n % 2 == 0:
            raise self.error(f"window n must be a positive odd number, got {self.param.n}")
        return [in_dtypes[0]]

    def infer_shapes(self, in_shapes, in_values):
        src = tuple(in_shapes[0])
        if len(src) != 4:
            raise self.error(f"src must be 4-d (NCHW), got {fmt_shape(src)}")
        for s in in_shapes[1:]:
            if tuple(s) != src:
                raise self.error(f"shape {fmt_shape(s)} differs from src {fmt_shape(src)}")
        return [src]


@register_opr
class LRN(_LRNBase):
    """Local response normalization across channels of an NCHW var."""

    #: the reference's C++ type (LRN is an alias of LRNForward)
    type_name = "LRNForward"

    def bind(self, ins, outs):
        return kern.bind_lrn_forward(ins[0], outs[0], **self._kw())

    def grad(self, wrt_idx, out_grads):
        if out_grads[0] is None:
            return None
        bwd = LRNBackward([self.inputs[0], self.outputs[0], out_grads[0]], self.param, None)
        return insert_opr(bwd)[0].node


@register_opr
class LRNBackward(_LRNBase):
    """Inputs (src, dst, dst_grad); output src_grad of LRN."""

    def bind(self, ins, outs):
        return kern.bind_lrn_backward(ins[0], ins[2], outs[0], **self._kw())


# ---- functions ---------------------------------------------------------------------------
# BN's scale and bias fields share their names with inputs: only a whole param gives them
_bn_params = opr_params(("param", "BN"), fixed=("scale", "bias"))


@_bn_params
def batch_norm(
    x,
    scale,
    bias,
    running_mean=None,
    running_variance=None,
    *,
    param_dim: str = "DIM_11HW",
    fwd_mode: str = "TRAINING",
    epsilon: float = 1e-4,
    avg_factor: float = 1.0,
    name: str | None = None,
    comp_node=None,
    config=None,
    comp_graph=None,
) -> list[SymbolVar]:
    """Batch normalization (registry name ``BatchNorm``), cuDNN-like.

    Parameters
    ----------
    x : SymbolVar
        The 4-d input.
    scale, bias : SymbolVar or array_like
        Of the param shape: 1 on the reduced axes, x's size elsewhere (``(1, C, 1, 1)`` for
        ``DIM_1C11``).
    running_mean, running_variance : SymbolVar, optional
        The running statistics (both or neither). In TRAINING mode they must be shared
        tensors (from ``make_shared``), updated in place each time the operator runs.
        Without them this is :func:`batch_norm_no_statistic`.
    param_dim : {"DIM_11HW", "DIM_1CHW", "DIM_1C11"}
        The param shape's name.
    fwd_mode : {"TRAINING", "INFERENCE"}
        Batch statistics (TRAINING) or the running ones (INFERENCE).
    epsilon : float
        Added to the variance.
    avg_factor : float
        Weight of the batch statistics in the running update
        ``new = old * (1 - avg_factor) + batch * avg_factor`` (the variance unbiased).
    name, comp_node, config, comp_graph
        The operator config, as for every ``mgb.opr`` function.

    Returns
    -------
    list of SymbolVar
        In TRAINING mode with statistics: ``[running_mean, running_variance, save_mean,
        save_inv_variance, y]``, the first two being the statistics after the in-place
        update (views of the shared tensors). Otherwise MegBrain drops the two empty
        outputs: ``[save_mean, save_inv_variance, y]``.

    Raises
    ------
    GraphError
        In TRAINING mode, when running_mean or running_variance is not a shared tensor.
    """
    if (running_mean is None) != (running_variance is None):
        raise GraphError("batch_norm: give both running_mean and running_variance, or neither")
    cfg = _merge_config(name, comp_node, config)
    inputs = [x, scale, bias]
    if running_mean is not None:
        inputs += [running_mean, running_variance]
    vars_ = canonize_input_vars(inputs, comp_graph=comp_graph, config=cfg)
    param = BNParam(param_dim, fwd_mode, epsilon, avg_factor)
    outs = insert_opr(BatchNorm(vars_, param, cfg))
    if len(vars_) == 5 and param.fwd_mode == "TRAINING":
        return outs
    return outs[2:]


@_bn_params
def batch_norm_no_statistic(
    x,
    scale,
    bias,
    *,
    param_dim: str = "DIM_11HW",
    fwd_mode: str = "TRAINING",
    epsilon: float = 1e-4,
    avg_factor: float = 1.0,
    name: str | None = None,
    comp_node=None,
    config=None,
    comp_graph=None,
) -> list[SymbolVar]:
    """Batch normalization without running statistics (registry name ``BatchNorm``).

    Parameters are those of :func:`batch_norm`; INFERENCE mode is an error (it needs running
    statistics).

    Returns
    -------
    list of SymbolVar
        ``[save_mean, save_inv_variance, y]``.
    """
    return batch_norm(
        x,
        scale,
        bias,
        param_dim=param_dim,
        fwd_mode=fwd_mode,
        epsilon=epsilon,
        avg_factor=avg_factor,
        name=name,
        comp_node=comp_node,
        config=config,
        comp_graph=comp_graph,
    )


@opr_params(("param", "LRN"))
def lrn(
    src,
    *,
    n: int = 5,
    k: float = 2.0,
    alpha: float = 1e-4,
    beta: float = 0.75,
    name: str | None = None,
    comp_node=None,
    config=None,
    comp_graph=None,
) -> SymbolVar:
    """Local response normalization across channels (registry name ``LRN``).

    ``y[:, c] = x[:, c] * (k + alpha * sum(x[:, c'] ** 2)) ** -beta`` over the channels
    ``c'`` within ``n // 2`` of ``c``.

    Parameters
    ----------
    src : SymbolVar
        A 4-d float NCHW var.
    n : int
        The (odd) window size.
    k, alpha, beta : float
        The normalization constants.
    name, comp_node, config, comp_graph
        The operator config, as for every ``mgb.opr`` function.

    Returns
    -------
    SymbolVar
        Of ``src``'s shape and dtype.
    """
    cfg = _merge_config(name, comp_node, config)
    vars_ = canonize_input_vars([src], comp_graph=comp_graph, config=cfg)
    return insert_opr(LRN(vars_, LRNParam(n, k, alpha, beta), cfg))[0]


@dataclass(frozen=True)
class LayerNormLastParam(ParamBase):
    """Param of LayerNormLast: ``eps``, added to the variance; ``nchw88``, whether ``x`` is
    an NCHW88 tensor (N, C/8, H, W, 8) normalized over its C channels into (N, H, W, C)."""

    eps: float = 1e-5
    nchw88: bool = False


@register_opr
class LayerNormLast(OperatorNodeBase):
    """``(x - mean) / sqrt(var + eps) * scale [+ bias]``, the statistics over the last axis
    of the float32 ``x`` (inputs ``x, scale[, bias]``, each vector of the last axis' size,
    shape (C,) or (1, ..., C)): ONNX's LayerNormalization as one kernel
    (:func:`megbrain.kernels.layer_norm.bind_layer_norm`); with ``param.nchw88``, of the
    channels-last view of an NCHW88 ``x``, read in place
    (:func:`~megbrain.kernels.layer_norm.bind_layer_norm_nchw88`).

    Made at compile time by the ``fuse_layer_norm`` pass (:mod:`megbrain.gopt.linear`) from
    the reductions and elementwise operators the importer builds, never by a user and never
    written to a graph file (MegBrain 0.x has no such operator)."""

    type_name = "LayerNormLast"
    short_name = "layer_norm_last"
    Param = LayerNormLastParam
    uses_workspace = True  # the statistics of a band of rows; a copy of an x it cannot read

    def infer_dtypes(self, in_dtypes):
        if len(in_dtypes) not in (2, 3) or any(d != np.float32 for d in in_dtypes):
            raise self.error(f"expected float32 x, scale[, bias], got {list(map(str, in_dtypes))}")
        return [in_dtypes[0]]

    def infer_shapes(self, in_shapes, in_values):
        x = tuple(in_shapes[0])
        if self.param.nchw88:
            if len(x) != 5 or x[-1] != 8:
                raise self.error(f"x {fmt_shape(x)} must be an NCHW88 tensor (N, C/8, H, W, 8)")
            x = (x[0], x[2], x[3], x[1] * 8)
        for what, s in zip(("scale", "bias"), in_shapes[1:]):
            s = tuple(s)
            if not x or not s or s[-1] != x[-1] or any(d != 1 for d in s[:-1]):
                raise self.error(f"{what} {fmt_shape(s)} must be ({x[-1] if x else '?'},) or "
                                 f"(1, ..., C): one value per channel of x {fmt_shape(x)}")
        return [x]

    def bind(self, ins, outs):
        vecs = [v.reshape(-1) for v in ins[1:]]  # views: read at every run
        bias = vecs[1] if len(vecs) > 1 else None
        bind = bind_layer_norm_nchw88 if self.param.nchw88 else bind_layer_norm
        return bind(ins[0], vecs[0], bias, outs[0], self.param.eps)

    def grad(self, wrt_idx, out_grads):
        raise self.error("a fused layer normalization has no gradient (made at compile time)",
                         NoGradient)  # fmt: skip


# ---- serialization (megbrain/serialization/sereg.py) -------------------------------------
# param.BN's scale and bias fields have no place in BNParam: files must hold their defaults
# param.BN and param.LRN, their Params' tables
register_strict(BatchNorm, name="BatchNorm")
register_strict(BatchNormBackward)
register_strict(LRN, name="LRN")
register_strict(LRNBackward)
sereg.register_fused(LayerNormLast, lambda opr: "a layer normalization over the last axis")
sereg.register_fused(BatchNormTail, lambda opr: f"BatchNorm with a fused {opr.param.tail}")
sereg.register_fused(BatchNormTailBackward,
                     lambda opr: f"the gradient of BatchNorm with a fused {opr.param.tail}")
