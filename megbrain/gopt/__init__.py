"""Graph optimizer: rewrites registered by name and applied in a readable preset order."""

from . import training  # noqa: F401, I001 - registers mask_pool_grad, before jit_fusion
from . import jit  # noqa: F401  (registers the jit_fusion pass)
from .inference import (
    INFERENCE_PASSES,
    INFERENCE_PRESET,
    optimize_for_inference,
    optimize_nodes_for_inference,
)
from .passes import (
    PASSES,
    PRESET,
    Rewriter,
    arith_simplify_on_insert,
    get_replaced_var,
    install,
    optimize_for_compile,
    register_pass,
)

__all__ = [
    "INFERENCE_PASSES",
    "INFERENCE_PRESET",
    "PASSES",
    "PRESET",
    "Rewriter",
    "arith_simplify_on_insert",
    "get_replaced_var",
    "install",
    "optimize_for_compile",
    "optimize_for_inference",
    "optimize_nodes_for_inference",
    "register_pass",
]
from . import sublinear  # noqa: E402, F401 - registers the sublinear_memory pass last
