"""Compiling register-tiled kernels with Numba: a stack-allocated accumulator tile and LLVM's
SLP vectorizer.

A micro-kernel of a GEMM or a direct convolution keeps a small tile of accumulators (six
positions by sixteen output channels, twelve 8-float vectors) in registers across a long
reduction, each step one broadcast input value times one vector of filter values per row of
the tile. Numba gives neither of the two things that takes:

- an accumulator array LLVM can keep in registers: ``np.empty`` is a heap allocation through
  Numba's runtime, opaque to LLVM, so every update is a load and a store. :func:`stack_tile`
  is an ``alloca`` of a size fixed at compile time, which LLVM's scalar replacement turns into
  registers once the tile's constant-length loops are unrolled;
- vectorization of the unrolled tile: Numba compiles with LLVM's SLP vectorizer off
  (``NUMBA_SLP_VECTORIZE``). :func:`compile_tiled` compiles a kernel, and the kernels it
  calls, with it on, under Numba's compiler lock, leaving the setting as it was for every
  other compilation.

Measured on one core (AVX2, a 6x16 float32 tile over a reduction of 256): 3.6 GF/s compiled
the default way, 76 GF/s with both (the loop body is then 12 ``vfmadd`` on registers, two
vector loads and six broadcasts).

A tile's loops must have compile-time trip counts (module constants) and its indices must be
unsigned (``np.uintp``): a signed, computed index makes Numba test it for wrap-around, and a
reduction loop of constant length 8 inside the tile was fully unrolled with the tile and
spilled; the callers keep such loops outside or give them a run-time bound.
"""

from __future__ import annotations

import functools

__all__ = ["compile_tiled", "fetch_add", "stack_tile"]


@functools.cache
def stack_tile():
    """The ``stack_tile(size, dtype)`` Numba intrinsic: a pointer to ``size`` (a compile-time
    constant) uninitialized values of ``dtype`` on the calling kernel's stack, to view with
    ``numba.carray(ptr, size)``. Built on first use (``import megbrain`` stays free of
    Numba's import time); a kernel module binds it to a global before compiling."""
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic

    @intrinsic
    def stack_tile(typingctx, size, dtype):
        if not isinstance(size, types.IntegerLiteral):
            return None
        count = size.literal_value

        def codegen(context, builder, signature, args):
            ty = context.get_value_type(dtype.dtype)
            ptr = cgutils.alloca_once(builder, ir.ArrayType(ty, count))
            return builder.bitcast(ptr, ty.as_pointer())

        return types.CPointer(dtype.dtype)(size, dtype), codegen

    return stack_tile


@functools.cache
def fetch_add():
    """The ``fetch_add(counters, i, n)`` Numba intrinsic: atomically adds ``n`` to
    ``counters[i]`` (an int64 array) and returns the value before. Threads taking work
    items from one counter this way need no lock and no GIL: a thread the OS holds back
    takes fewer items instead of delaying the others (a fixed split waits for its slowest
    part). Built on first use, as :func:`stack_tile`."""
    from numba.core import cgutils, types
    from numba.extending import intrinsic

    @intrinsic
    def fetch_add(typingctx, counters, index, n):
        if not (isinstance(counters, types.Array) and counters.dtype == types.int64):
            return None

        def codegen(context, builder, signature, args):
            ary, idx, inc = args
            arr = context.make_array(signature.args[0])(context, builder, ary)
            ptr = cgutils.get_item_pointer(context, builder, signature.args[0], arr, [idx],
                                           wraparound=False)  # fmt: skip
            return builder.atomic_rmw("add", ptr, inc, "seq_cst")

        return types.int64(counters, types.int64, types.int64), codegen

    return fetch_add


def compile_tiled(fn, signatures: list, **options):
    """``numba.njit(signatures, nogil=True, cache=True, error_model="numpy",
    fastmath={"contract"}, **options)(fn)``, compiled now with LLVM's SLP vectorizer on.

    The signatures are explicit so that compilation happens here, inside the switch, and
    never later at a call with other types (which raises TypeError instead). Only
    floating-point contraction is allowed (``a * b + c`` may become one fused
    multiply-add): no reassociation, so sums keep the order the kernel writes and NaN and
    infinity propagate as usual.
    """
    from numba import njit
    from numba.core import config
    from numba.core.compiler_lock import global_compiler_lock

    opts = dict(nogil=True, cache=True, error_model="numpy", fastmath={"contract"})
    opts.update(options)
    with global_compiler_lock:
        saved = config.SLP_VECTORIZE
        config.SLP_VECTORIZE = True
        try:
            return njit(signatures, **opts)(fn)
        finally:
            config.SLP_VECTORIZE = saved
