"""SymbolVar's methods that build operators, bound once every family is loaded.

``base.SymbolVar`` holds what needs no operator family (identity, properties, naming);
``opr/__init__.py`` imports this module after the families, so these methods import each
family's front end at module level instead of inside every call.
"""

from __future__ import annotations

import numpy as np

from .base import SymbolVar
from .basic_arith import elemwise, fill_retain_dtype, mean, reduce_, typecvt
from .blas import matrix_mul
from .indexing import subtensor_getitem
from .operator_handle import Operator
from .tensor_manip import broadcast, dimshuffle, get_var_shape, reshape

__all__: list[str] = []


class _FamilyMethods:
    """The methods bound onto SymbolVar (a class, so they read as SymbolVar's own)."""

    @property
    def owner_opr(self):
        return Operator(self.node.owner)

    @property
    def shape(self) -> SymbolVar:
        """The shape as a symbolic var (GetVarShape)."""
        return get_var_shape(self)

    def axis_shape(self, axis: int) -> SymbolVar:
        return get_var_shape(self, axis=axis)

    # ---- methods --------------------------------------------------------------------------
    def reshape(self, *shape) -> SymbolVar:
        return reshape(self, _unpack_shape(shape))

    def broadcast(self, *shape) -> SymbolVar:
        return broadcast(self, _unpack_shape(shape))

    def flatten(self) -> SymbolVar:
        return self.reshape(-1)

    def dimshuffle(self, *pattern, ndim: int = 0) -> SymbolVar:
        if len(pattern) == 1 and isinstance(pattern[0], (list, tuple)):
            pattern = tuple(pattern[0])
        return dimshuffle(self, pattern, ndim=ndim)

    def astype(self, dtype) -> SymbolVar:
        return typecvt(self, dtype)

    def fill_retain_dtype(self, value) -> SymbolVar:
        return fill_retain_dtype(self, value)

    def _reduce(self, mode, axis, keepdims):
        return reduce_(self, mode, axis, keepdims)

    def sum(self, axis=None, keepdims=False):
        return self._reduce("SUM", axis, keepdims)

    def max(self, axis=None, keepdims=False):
        return self._reduce("MAX", axis, keepdims)

    def min(self, axis=None, keepdims=False):
        return self._reduce("MIN", axis, keepdims)

    def prod(self, axis=None, keepdims=False):
        return self._reduce("PRODUCT", axis, keepdims)

    def mean(self, axis=None, keepdims=False):
        return mean(self, axis, keepdims)

    def __getitem__(self, idx):
        return subtensor_getitem(self, idx)

    # ---- arithmetic -----------------------------------------------------------------------
    def _ew(self, mode, *others, rev=False):
        args = (*others, self) if rev else (self, *others)
        return elemwise(*args, mode=mode)

    def _binary_opr(self, mode, rhs):
        """``elemwise([self, rhs], mode)``; the binding's entry point behind the operators."""
        return self._ew(mode, rhs)

    def _binary_opr_lhs(self, mode, lhs):
        """``elemwise([lhs, self], mode)``."""
        return self._ew(mode, lhs, rev=True)

    def __add__(self, o):
        return self._ew("ADD", o)

    def __radd__(self, o):
        return self._ew("ADD", o, rev=True)

    def __sub__(self, o):
        return self._ew("SUB", o)

    def __rsub__(self, o):
        return self._ew("SUB", o, rev=True)

    def __mul__(self, o):
        return self._ew("MUL", o)

    def __rmul__(self, o):
        return self._ew("MUL", o, rev=True)

    def __truediv__(self, o):
        return self._ew("TRUE_DIV", o)

    def __rtruediv__(self, o):
        return self._ew("TRUE_DIV", o, rev=True)

    def __floordiv__(self, o):
        return self._ew("FLOOR_DIV", o)

    def __rfloordiv__(self, o):
        return self._ew("FLOOR_DIV", o, rev=True)

    def __mod__(self, o):
        return self._ew("MOD", o)

    def __rmod__(self, o):
        return self._ew("MOD", o, rev=True)

    def __pow__(self, o):
        return self._ew("POW", o)

    def __rpow__(self, o):
        return self._ew("POW", o, rev=True)

    def __lshift__(self, o):
        return self._ew("SHL", o)

    def __rshift__(self, o):
        return self._ew("SHR", o)

    def __rlshift__(self, o):
        return self._ew("SHL", o, rev=True)

    def __rrshift__(self, o):
        return self._ew("SHR", o, rev=True)

    def __lt__(self, o):
        return self._ew("LT", o)

    def __le__(self, o):
        return self._ew("LEQ", o)

    def __gt__(self, o):
        return self._ew("LT", o, rev=True)

    def __ge__(self, o):
        return self._ew("LEQ", o, rev=True)

    def __neg__(self):
        return self._ew("NEGATE")

    def __abs__(self):
        return self._ew("ABS")

    def __matmul__(self, o):
        return matrix_mul(self, o)

    def __rmatmul__(self, o):
        return matrix_mul(o, self)


def _unpack_shape(shape):
    if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
        return shape[0]
    return shape


_CLASS_MACHINERY = frozenset({"__module__", "__qualname__", "__doc__", "__dict__", "__weakref__"})
for _name, _member in vars(_FamilyMethods).items():
    if _name not in _CLASS_MACHINERY:
        # named as SymbolVar's own in reprs and the API reference
        _fn = _member.fget if isinstance(_member, property) else _member
        _fn.__qualname__ = f"SymbolVar.{_name}"
        setattr(SymbolVar, _name, _member)
