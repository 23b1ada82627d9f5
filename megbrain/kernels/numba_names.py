"""Compiled functions' symbol names that no two processes share: Numba's function ids made
random (:func:`randomize_function_ids`), so that kernels loaded from Numba's on-disk cache
never resolve a call into another kernel's body."""

from __future__ import annotations

import secrets

from numba.core import bytecode

__all__ = ["randomize_function_ids"]


class _RandomIds:
    """An endless iterator of random 64-bit ids, in place of Numba's ``itertools.count``."""

    def __iter__(self) -> _RandomIds:
        return self

    def __next__(self) -> int:
        return secrets.randbits(64)


def randomize_function_ids() -> None:
    """Make Numba name each compiled function ``qualname$<random id>`` instead of
    ``qualname$<n>``, ``n`` counting the compilations of the process.

    The kernels are made by factories (one function per tile width, tiling, epilogue), so
    many share a qualname and a signature; with ``cache=True`` each is compiled in whichever
    process first needs it and cached with that process's count. Two such kernels compiled
    by different processes can get the same symbol for different bodies, and a process that
    loads both from the cache links every call of that symbol to one of them (LLVM merges
    the duplicate definitions): a unit of a convolution then ran another tile's code, left
    output positions unwritten and corrupted the heap. Random ids make that collision
    impossible in practice; nothing else depends on their values (the cache's index is keyed
    by the function's code, closure and signature). Idempotent; a Numba without the
    attribute is left as it is."""
    ident = bytecode.FunctionIdentity
    if hasattr(ident, "_unique_ids") and not isinstance(ident._unique_ids, _RandomIds):
        ident._unique_ids = _RandomIds()
