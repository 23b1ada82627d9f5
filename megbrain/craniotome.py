"""``megengine._internal.craniotome``: operators implemented in Python.

The implementation is :mod:`megbrain.opr.craniotome_desc` (the descriptor base) and
:mod:`megbrain.opr.craniotome` (the operator).
"""

from .opr.craniotome_desc import CraniotomeBase, make_opr, register_loader

__all__ = ["CraniotomeBase", "make_opr", "register_loader"]
