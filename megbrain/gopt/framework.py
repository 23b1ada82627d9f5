"""The graph optimizer's frame: one registry of passes by name, and the two presets, the
orders passes run in, written out below so that they read top to bottom.

A pass is ``f(graph, dest, options=None) -> {old var: new var}``: ``options`` is the
:class:`~megbrain.gopt.inference.InferenceOptions` in the inference preset and absent in the
compile preset. Passes register themselves by name (:func:`register_pass`) where they are
defined; which passes run and in which order is only decided here, so no order depends on
which module was imported first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from ..graph import VarNode
from ..graph.replace import replace_vars

__all__ = [
    "INFERENCE_FLAGS",
    "INFERENCE_PRESET",
    "PASSES",
    "PRESET",
    "get_replaced_var",
    "inference_preset",
    "register_pass",
    "run_passes",
]

logger = logging.getLogger("megbrain")

#: the registry: pass name -> ``f(graph, dest, options=None)``
PASSES: dict[str, Callable] = {}

#: the order passes run in at ``graph_opt_level >= 2`` (``optimize_for_compile``)
PRESET: list[str] = [
    "merge_common_subexpr",  # passes.py
    "reorder_arith_chain",  # constants only (inference.py holds both variants)
    "fold_constants",
    "remove_redundant_typecvt",
    "arith_fuse",
    "mask_pool_grad",  # training.py: on the expanded gradients, before JIT fusion fuses them
    "fuse_bn_activation",  # training.py: a BatchNorm and its ReLU/ReLU6, with their gradients
    "fuse_se_gate",  # jit.py: an SE multiply into the 1x1 ConvBias reading it, before JIT
    "fuse_preactivation",  # jit.py: a scale, shift and ReLU into the 1x1 ConvBias reading it
    "jit_fusion",  # jit.py
    "fuse_conv_bias_tail",  # jit.py: a ConvBias and its ReLU6/SiLU JITExecutor, one operator
    "fuse_depthwise_pointwise",  # nchw88.py: a depthwise ConvBias and the 1x1 one reading it
    "fuse_matmul_tail",  # linear.py: a BatchedMatrixMul and its bias and GELU, one operator
    "fuse_matmul_residual",  # linear.py: a block's layer scale and shortcut in its last product
    "fuse_layer_norm",  # linear.py: a LayerNorm's reductions and elementwise tail, one operator
    "fuse_pool_end_padding",  # nchw88.py: ceil mode's -inf Concats and the NCHW88 max pooling
    "fuse_channel_shuffle",  # nchw88.py: a Concat and ShuffleNet's channel shuffle after it
    "sublinear_memory",  # sublinear.py: last, on the final operators and their seq
]

#: the order of ``optimize_for_inference``'s passes (the reference's inference preset)
INFERENCE_PRESET: list[str] = [
    "expand_batch_norm",
    "remove_non_computing",
    "expand_fused_arith",
    "normalize_affine_chain",
    "fold_conv_scale",
    "param_fuse",
    "reorder_arith_chain",
    "arith_fuse",
    "reorder_arith_chain",
    "remove_redundant_typecvt",
    "param_fuse",
    "fuse_conv_bias_nonlinearity",
    "fuse_conv_bias_with_z",
    "use_nchw88",
    "use_nchw4",
    "convert_f16_io",
    "param_fuse",
    "param_merge",
]

#: inference passes that run only when one of these ``InferenceOptions`` fields is set
INFERENCE_FLAGS: dict[str, tuple[str, ...]] = {
    "fuse_conv_bias_nonlinearity": ("fuse_conv_bias_nonlinearity",),
    "fuse_conv_bias_with_z": ("fuse_conv_bias_with_z",),
    "use_nchw88": ("use_nchw88",),
    "use_nchw4": ("use_nchw4",),
    "convert_f16_io": ("f16_io_comp", "f16_io_f32_comp"),
}


def register_pass(name: str):
    """Register a pass ``f(graph, dest, options=None) -> varmap`` under ``name``.

    Registering places the pass in no preset: :data:`PRESET` and :data:`INFERENCE_PRESET`
    name the passes they run.
    """

    def deco(fn):
        if PASSES.setdefault(name, fn) is not fn:
            raise ValueError(f"gopt: a pass named {name!r} is registered already")
        return fn

    return deco


def inference_preset(options) -> list[str]:
    """The names of :data:`INFERENCE_PRESET` that ``options`` enables, in order."""
    return [
        n
        for n in INFERENCE_PRESET
        if n not in INFERENCE_FLAGS or any(getattr(options, f) for f in INFERENCE_FLAGS[n])
    ]


def run_passes(graph, dest: list[VarNode], names: Iterable[str], table: dict, *args):
    """Apply ``table[name](graph, dest, *args)`` for each name in order; record and log the
    replacements. Returns the new dest vars."""
    cur = list(dest)
    summary = []
    for name in names:
        got = table[name](graph, cur, *args)
        varmap = {k: v for k, v in got.items() if k is not v} if got else {}
        if not varmap:
            continue
        if graph.options.log_level >= 2:
            reasons = getattr(got, "reasons", None)
            for k in reasons or varmap:
                why = reasons[k] if reasons else name
                logger.info("gopt %s: replace %s -> %s (%s)", name, k.name, varmap[k].name, why)
        new = replace_vars(cur, varmap)
        _record(graph, varmap, zip(cur, new))
        _carry_endpoints(graph, varmap)
        summary.append(f"{name} {len(varmap)}")
        cur = new
    if summary and graph.options.log_level >= 1:
        logger.info("gopt: vars replaced per pass: %s", ", ".join(summary))
    return cur


def _carry_endpoints(graph, varmap: dict) -> None:
    """The operator replacing a sublinear-memory endpoint's output is an endpoint too."""
    eps = graph.sublinear_endpoints
    for o in list(eps):
        for v in o.outputs:
            nv = varmap.get(v)
            if nv is not None and nv.owner is not o:
                eps.add(nv.owner)


def _record(graph, varmap: dict, pairs) -> None:
    table = graph.__dict__.setdefault("gopt_replaced", {})
    table.update(varmap)
    for k, v in pairs:
        if k is not v:
            table[k] = v


def get_replaced_var(src: VarNode) -> VarNode:
    """The var that finally replaced ``src`` in the graph optimizer (``src`` if none)."""
    table = getattr(src.graph, "gopt_replaced", None)
    if not table:
        return src
    v, seen = src, {src}
    while v in table:
        v = table[v]
        if v in seen:
            break
        seen.add(v)
    return v
