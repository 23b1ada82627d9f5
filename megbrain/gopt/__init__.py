"""Graph optimizer: rewrites registered by name and applied in a readable preset order
(:mod:`megbrain.gopt.framework`)."""

from . import jit, linear, nchw4, nchw88, sublinear, training
from .framework import (
    INFERENCE_PRESET,
    PASSES,
    PRESET,
    get_replaced_var,
    register_pass,
    run_passes,
)
from .inference import INFERENCE_PASSES, optimize_for_inference, optimize_nodes_for_inference
from .passes import Rewriter, arith_simplify_on_insert, install, optimize_for_compile

__all__ = [
    "INFERENCE_PASSES",
    "INFERENCE_PRESET",
    "PASSES",
    "PRESET",
    "Rewriter",
    "arith_simplify_on_insert",
    "get_replaced_var",
    "install",
    "jit",
    "linear",
    "nchw4",
    "nchw88",
    "optimize_for_compile",
    "optimize_for_inference",
    "optimize_nodes_for_inference",
    "register_pass",
    "run_passes",
    "sublinear",
    "training",
]
