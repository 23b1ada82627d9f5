"""``helper``: the input, shape and config canonization behind every ``opr`` function."""

from __future__ import annotations

from .opr.base import _merge_config, canonize_input_vars  # noqa: F401
from .opr.tensor_manip import shape_to_var


def gen_config(name=None, comp_node=None, config=None, output_dtype=None):
    """An operator config with ``name``, ``comp_node`` and ``output_dtype`` set on ``config``
    (a new one when it is None)."""
    return _merge_config(name, comp_node, config, output_dtype)


def cvt_to_shape_desc(val, inpvar, graph=None, config=None):
    """One int32 var holding the shape ``val`` (ints, int vars, or a mix) in ``inpvar``'s
    graph and comp node."""
    return shape_to_var(val, inpvar)


def cvt_opr_result(rst, *, explode_single: bool = True):
    """An operator function's outputs: the single var itself when there is one and
    ``explode_single``, else the list."""
    rst = list(rst) if isinstance(rst, (list, tuple)) else [rst]
    if explode_single and len(rst) == 1:
        return rst[0]
    return rst
