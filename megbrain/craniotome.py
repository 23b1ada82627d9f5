"""``megengine._internal.craniotome``: operators implemented in Python.

The implementation is :mod:`megbrain.opr.craniotome`.
"""

from .opr.craniotome import CraniotomeBase, make_opr, register_loader

__all__ = ["CraniotomeBase", "make_opr", "register_loader"]
