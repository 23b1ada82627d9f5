"""Graph optimizer: rewrites registered by name and applied in a readable preset order."""

from .passes import (
    PASSES,
    arith_simplify_on_insert,
    get_replaced_var,
    install,
    optimize_for_compile,
    register_pass,
)

__all__ = [
    "PASSES",
    "arith_simplify_on_insert",
    "get_replaced_var",
    "install",
    "optimize_for_compile",
    "register_pass",
]
