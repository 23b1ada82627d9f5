"""Compiling register-tiled kernels with Numba: a stack-allocated accumulator tile, a tile's
inner loops written as LLVM vector code, and LLVM's SLP vectorizer for the code around them.

A micro-kernel of a direct convolution keeps a small tile of accumulators (12 positions by 16
output channels, twelve AVX-512 vectors; 6 by 16, twelve AVX2 vectors) in registers across a
long reduction, each step one broadcast input value times one vector of filter values per
row of the tile. Numba gives none of the three things that takes:

- an accumulator array LLVM can keep in registers: ``np.empty`` is a heap allocation through
  Numba's runtime, opaque to LLVM, so every update is a load and a store. :func:`stack_tile`
  is an ``alloca`` of a size fixed at compile time, which LLVM's scalar replacement turns into
  registers;
- vector code that does not depend on which loops LLVM's vectorizers choose: written as
  scalar loops, the tile was vectorized well by the SLP vectorizer on an AVX2 host (76 GF/s
  on one core), but on an AVX-512 host the loop vectorizer vectorized its position loop
  first, with gathers and scatters into the accumulators, which then stayed in memory
  (5 GF/s), and the SLP vectorizer never uses 512-bit vectors there (LLVM prefers 256-bit
  ones on those cores). :func:`fma_tile` emits the loops with explicit vectors of
  :func:`vector_width` lanes: 200-215 GF/s per core on the AVX-512 machines (a 12x16 tile;
  127 GF/s with AVX2 vectors on the same core);
- vectorization of the straight-line code around a tile (the epilogue, the copies to and
  from a row buffer): Numba compiles with LLVM's SLP vectorizer off
  (``NUMBA_SLP_VECTORIZE``). :func:`compile_tiled` compiles a kernel, and the kernels it
  calls, with it on, under Numba's compiler lock, leaving the setting as it was for every
  other compilation.

A kernel's loops around the tile should have compile-time trip counts (module constants) and
unsigned indices (``np.uintp``): a signed, computed index makes Numba test it for
wrap-around.
"""

from __future__ import annotations

import functools

import numpy as np
from llvmlite import binding, ir
from numba import njit
from numba.core import cgutils, config, types
from numba.core.compiler_lock import global_compiler_lock
from numba.extending import intrinsic

__all__ = [
    "add_rows",
    "compile_tiled",
    "fetch_add",
    "fma_tile",
    "stack_tile",
    "take_unit",
    "tile_positions",
    "transpose_store",
    "vector_fmas",
    "vector_width",
    "zeroed_slots",
    "zmm_vectors",
]


@functools.cache
def stack_tile():
    """The ``stack_tile(size, dtype)`` Numba intrinsic: a pointer to ``size`` (a compile-time
    constant) uninitialized values of ``dtype`` on the calling kernel's stack, to view with
    ``numba.carray(ptr, size)``. Built on first use; a kernel module binds it to a global
    before compiling."""

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
def zmm_vectors():
    """The ``zmm_vectors()`` Numba intrinsic: lets LLVM's vectorizers use 512-bit vectors in
    the calling function, where they prefer 256 bits on AVX-512 CPUs (a compute-bound float32
    loop then runs at half the width). llvmlite knows no key-value function attributes, so
    the string goes into its attribute set directly; CPUs without AVX-512 ignore it. Built on
    first use, as :func:`stack_tile`."""

    @intrinsic
    def zmm_vectors(typingctx):
        def codegen(context, builder, signature, args):
            set.add(builder.function.attributes, '"prefer-vector-width"="512"')
            return context.get_dummy_value()

        return types.void(), codegen

    return zmm_vectors


@functools.cache
def fetch_add():
    """The ``fetch_add(counters, i, n)`` Numba intrinsic: atomically adds ``n`` to
    ``counters[i]`` (an int64 array) and returns the value before. Threads taking work
    items from one counter this way need no lock and no GIL: a thread the OS holds back
    takes fewer items instead of delaying the others (a fixed split waits for its slowest
    part). Built on first use, as :func:`stack_tile`."""

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


#: fetch_add() for take_unit's loop: a module global, not a closure cell (Numba keys a cached
#: closure by its cells' pickles, and an intrinsic's differs in every process)
_take_add = None


@functools.cache
def take_unit():
    """The compiled ``take(counter, me) -> int``, for kernels that take their work units as
    they go: ``counter`` (int64) holds a ``(next, end)`` pair per thread's range of units
    (:func:`megbrain.kernels.conv.nchw8c.units_as_they_go`), and thread ``me`` takes the
    next unit of its own range, then of the others' in turn, by :func:`fetch_add`; -1 once
    every unit is taken. Compiled on first use; a kernel calls it from its own loop."""
    global _take_add
    _take_add = fetch_add()

    def take(counter, me):  # pragma: no cover - compiled
        nr = counter.size // 2
        for r in range(nr):
            k = (me + r) % nr
            if counter[2 * k] < counter[2 * k + 1]:  # a plain read spares the atomic
                u = _take_add(counter, 2 * k, 1)
                if u < counter[2 * k + 1]:
                    return u
        return -1

    return compile_tiled(take, [types.int64(types.int64[::1], types.int64)])


def vector_fmas(builder, vec: ir.VectorType):
    """The ``llvm.fmuladd`` function of the vector type ``vec`` in ``builder``'s module."""
    name = f"llvm.fmuladd.v{vec.count}f32"
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec, [vec] * 3), name)


def zeroed_slots(builder, vec: ir.VectorType, count: int) -> list:
    """``count`` stack slots of the vector type ``vec`` set to zero: a register tile's
    accumulators (LLVM's scalar replacement keeps them in registers)."""
    i64 = ir.IntType(64)
    regs = cgutils.alloca_once(builder, ir.ArrayType(vec, count))
    slots = [builder.gep(regs, [ir.Constant(i64, 0), ir.Constant(i64, i)], inbounds=True)
             for i in range(count)]  # fmt: skip
    for s in slots:
        builder.store(ir.Constant(vec, None), s)
    return slots


def compile_tiled(fn, signatures: list, **options):
    """``numba.njit(signatures, nogil=True, cache=True, error_model="numpy",
    fastmath={"contract"}, **options)(fn)``, compiled now with LLVM's SLP vectorizer on.

    The signatures are explicit so that compilation happens here, inside the switch, and
    never later at a call with other types (which raises TypeError instead). Only
    floating-point contraction is allowed (``a * b + c`` may become one fused
    multiply-add): no reassociation, so sums keep the order the kernel writes and NaN and
    infinity propagate as usual.
    """
    opts = dict(nogil=True, cache=True, error_model="numpy", fastmath={"contract"})
    opts.update(options)
    with global_compiler_lock:
        saved = config.SLP_VECTORIZE
        config.SLP_VECTORIZE = True
        try:
            return njit(signatures, **opts)(fn)
        finally:
            config.SLP_VECTORIZE = saved


@functools.cache
def vector_width() -> int:
    """The float32 lanes of the vectors :func:`fma_tile` computes with: 16 where the compiler
    targets AVX-512 (``NUMBA_CPU_FEATURES``, else the host's), else 8 (AVX2; LLVM splits
    them into the registers another target has)."""

    features = config.CPU_FEATURES
    if features is None:
        features = binding.get_host_cpu_features().flatten()
    return 16 if "+avx512f" in features.split(",") else 8


@functools.cache
def tile_positions() -> int:
    """The output positions of a 16-channel :func:`fma_tile`: enough accumulators to keep
    both fused multiply-add units busy (their latency is 4 cycles). 12 one-vector rows with
    AVX-512 (of its 32 registers); 6 two-vector rows with AVX2 (of 16)."""
    return 12 if vector_width() == 16 else 6


#: the filter values of a row of a tile are blocks of 16 output channels
_BLOCK = 16
#: float32 values ahead of a filter vector that its load prefetches: a layer's filter
#: streams from memory (ResNet50's weights do not stay in the caches between runs), and the
#: hardware prefetcher alone left the first tile of a unit waiting on it (ResNet50 batch 1,
#: 2 cores: 32.5-32.9 ms with 256-2048 values ahead against 34.2-34.8 without)
_PREFETCH = 512


@functools.cache
def fma_tile():
    """The ``fma_tile(acc, positions, width, channels, xp, x0, wp, w0, cbn, cstride, taps,
    wnext)`` Numba intrinsic: the inner loops of a register-tiled direct convolution, written
    as LLVM vector code (:func:`vector_width` lanes), so that what the core runs does not
    hang on which loops LLVM's vectorizers choose.

    ``acc`` (a :func:`stack_tile` pointer) holds ``positions x width`` float32 sums, a row of
    ``width`` per position, that the call adds to; the literals ``positions``, ``width`` (a
    multiple of 16 and of the vector width, or 8: a remainder block of 8 output channels,
    computed with vectors of 8 lanes) and ``channels`` fix the tile. For each input
    channel block ``cb < cbn``, tap ``t`` and channel ``ic < channels``, in that order,
    position ``p`` adds ``xp[x0 + cb cstride + (taps[t] + p) channels + ic]`` times the
    row's filter values: its ``b``-th block of ``B = min(width, 16)`` at ``wp[w0 + b wnext +
    ((cb len(taps) + t) channels + ic) B:]`` (blocks of ``B`` output channels packed
    ``wnext`` apart). Each
    product is added with ``llvm.fmuladd`` (fused where the target has FMA, as Numba's
    ``contract``), in the order of the scalar loops it stands for. The accumulators live in
    registers across the loops; each filter line is prefetched :data:`_PREFETCH` values
    ahead; no index is checked (the caller's geometry keeps them in bounds; a prefetch
    never faults).
    """
    full_lanes = vector_width()

    @intrinsic
    def fma_tile(typingctx, acc, positions, width, channels, xp, x0, wp, w0, cbn, cstride,
                 taps, wnext):  # fmt: skip
        literals = (positions, width, channels)
        if not all(isinstance(v, types.IntegerLiteral) for v in literals):
            return None
        npos, nw, nch = (v.literal_value for v in literals)
        lanes = min(full_lanes, nw)  # a block of 8 channels: vectors of 8 lanes
        block = min(nw, _BLOCK)
        if nw % lanes or nw != 8 and nw % _BLOCK:
            return None
        if not (isinstance(acc, types.CPointer) and acc.dtype == types.float32):
            return None
        if not all(isinstance(a, types.Array) and a.ndim == 1 for a in (xp, wp, taps)):
            return None
        nvec = nw // lanes

        def codegen(context, builder, signature, args):
            acc_p, _, _, _, xp_v, x0_v, wp_v, w0_v, cbn_v, cs_v, taps_v, wnext_v = args
            i64, vec = ir.IntType(64), ir.VectorType(ir.FloatType(), lanes)

            def const(v):
                return ir.Constant(i64, v)

            def data(k):
                return context.make_array(signature.args[k])(context, builder, args[k])

            xdata, wdata, tarr = data(4).data, data(6).data, data(10)
            ntaps = builder.extract_value(tarr.shape, 0)
            fmuladd = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vec, [vec] * 3), f"llvm.fmuladd.v{lanes}f32"
            )
            # the accumulators: an alloca of vectors (promoted to registers), from acc and back
            regs = cgutils.alloca_once(builder, ir.ArrayType(vec, npos * nvec))
            slots = [builder.gep(regs, [const(0), const(i)], inbounds=True)
                     for i in range(npos * nvec)]  # fmt: skip
            accv = builder.bitcast(acc_p, vec.as_pointer())
            for i, slot in enumerate(slots):
                builder.store(builder.load(builder.gep(accv, [const(i)]), align=4), slot)
            undef = ir.Constant(vec, ir.Undefined)
            splat = ir.Constant(ir.VectorType(ir.IntType(32), lanes), None)  # lane 0 everywhere

            i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
            prefetch = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                "llvm.prefetch.p0")

            def vector_at(base, off):
                ptr = builder.gep(wdata, [builder.add(base, const(off))], inbounds=True)
                if off % _BLOCK == 0:  # one prefetch per 64-byte line of the filter
                    ahead = builder.gep(wdata, [builder.add(base, const(off + _PREFETCH))])
                    builder.call(prefetch, [builder.bitcast(ahead, i8p), ir.Constant(i32, 0),
                                            ir.Constant(i32, 3), ir.Constant(i32, 1)])
                return builder.load(builder.bitcast(ptr, vec.as_pointer()), align=4)

            with cgutils.for_range(builder, cbn_v, intp=i64) as cb_loop:
                cb = cb_loop.index
                with cgutils.for_range(builder, ntaps, intp=i64) as t_loop:
                    t = t_loop.index
                    tap = builder.load(builder.gep(tarr.data, [t]))
                    xb = builder.add(builder.add(x0_v, builder.mul(cb, cs_v)),
                                     builder.mul(tap, const(nch)))  # fmt: skip
                    row0 = builder.mul(builder.add(builder.mul(cb, ntaps), t), const(nch * block))
                    blocks = [builder.add(builder.add(w0_v, row0), builder.mul(wnext_v, const(b)))
                              for b in range(nw // block)]  # fmt: skip
                    for ic in range(nch):
                        ws = [vector_at(blocks[k * lanes // block], ic * block + k * lanes % block)
                              for k in range(nvec)]  # fmt: skip
                        for p in range(npos):
                            xptr = builder.gep(xdata, [builder.add(xb, const(p * nch + ic))],
                                               inbounds=True)  # fmt: skip
                            one = builder.insert_element(undef, builder.load(xptr), const(0))
                            xv = builder.shuffle_vector(one, undef, splat)
                            for k in range(nvec):
                                slot = slots[p * nvec + k]
                                total = builder.call(fmuladd, [xv, ws[k], builder.load(slot)])
                                builder.store(total, slot)
            for i, slot in enumerate(slots):
                builder.store(builder.load(slot), builder.gep(accv, [const(i)]), align=4)
            return context.get_dummy_value()

        sig = types.void(acc, positions, width, channels, xp, x0, wp, w0, cbn, cstride, taps,
                         wnext)  # fmt: skip
        return sig, codegen

    return fma_tile


@functools.cache
def add_rows():
    """The ``add_rows(acc, rows, width, vec, v0)`` Numba intrinsic: ``vec[v0:v0 + width]``
    added to each of the ``rows`` rows of ``width`` float32 values of the tile ``acc`` (a
    :func:`stack_tile` pointer; ``rows`` and ``width``, a multiple of 8, literals), in
    vectors of :func:`vector_width` lanes (8 for a width of 8): a convolution tile's bias.
    As a scalar loop, LLVM's loop vectorizer took the rows of a 7- or 14-row tile as its
    vector lanes, a gather and a scatter of the tile per channel (the bias and ReLU of
    ResNet's 7x7 512->512 layer cost 3% of it, against 0.5% for 12-row tiles). No index is
    checked."""
    full_lanes = vector_width()

    @intrinsic
    def add_rows(typingctx, acc, rows, width, vec, v0):
        if not all(isinstance(v, types.IntegerLiteral) for v in (rows, width)):
            return None
        nrow, nw = rows.literal_value, width.literal_value
        lanes = min(full_lanes, nw)
        if nw % lanes or not (isinstance(acc, types.CPointer) and acc.dtype == types.float32):
            return None
        if not (isinstance(vec, types.Array) and vec.ndim == 1 and vec.dtype == types.float32):
            return None

        def codegen(context, builder, signature, args):
            acc_p, _, _, vec_v, v0_v = args
            i64, vt = ir.IntType(64), ir.VectorType(ir.FloatType(), lanes)
            data = context.make_array(signature.args[3])(context, builder, vec_v).data

            def vector(base, off):
                return builder.bitcast(builder.gep(base, [off], inbounds=True), vt.as_pointer())

            adds = [builder.load(vector(data, builder.add(v0_v, ir.Constant(i64, k))), align=4)
                    for k in range(0, nw, lanes)]  # fmt: skip
            for r in range(nrow):
                for j, add in enumerate(adds):
                    ptr = vector(acc_p, ir.Constant(i64, r * nw + j * lanes))
                    builder.store(builder.fadd(builder.load(ptr, align=4), add), ptr, align=4)
            return context.get_dummy_value()

        return types.void(acc, rows, width, vec, v0), codegen

    return add_rows


@functools.cache
def transpose_store():
    """The ``transpose_store(src, s0, sstride, dst, d0, dstride, bias, b0, epi)`` Numba
    intrinsic: the square block of :func:`vector_width` ``L`` rows of ``L`` float32 values
    at ``src[s0 + p sstride:][:L]`` (``p < L``) written transposed, row ``c`` of the result
    (the block's column ``c``) to ``dst[d0 + c dstride:][:L]``, with the literal ``epi``
    0 (as is), 1 (``+ bias[b0 + c]``), 2 (then ReLU, NaN staying NaN) or 3 (then H_SWISH,
    ``min(max(v + 3, 0), 6) v / 6`` in that order, NaN staying NaN).

    The write-back of a convolution's position-major buffer to NCHW rows: as scalar loops
    a strided read or a strided write per value; here ``L`` vector loads, ``L log2 L``
    two-vector shuffles (each stage swaps the off-diagonal blocks of twice the size) and
    ``L`` vector stores. No index is checked (the caller keeps them in bounds).
    """
    lanes = vector_width()

    @intrinsic
    def transpose_store(typingctx, src, s0, sstride, dst, d0, dstride, bias, b0, epi):
        if not isinstance(epi, types.IntegerLiteral) or epi.literal_value not in (0, 1, 2, 3):
            return None
        if not all(isinstance(a, types.Array) and a.ndim == 1 and a.dtype == types.float32
                   for a in (src, dst, bias)):  # fmt: skip
            return None
        mode = epi.literal_value

        def codegen(context, builder, signature, args):
            src_v, s0_v, ss_v, dst_v, d0_v, ds_v, bias_v, b0_v, _ = args
            i64, f32 = ir.IntType(64), ir.FloatType()
            vec = ir.VectorType(f32, lanes)

            def const(v):
                return ir.Constant(i64, v)

            sdata = context.make_array(signature.args[0])(context, builder, src_v).data
            ddata = context.make_array(signature.args[3])(context, builder, dst_v).data
            barr = context.make_array(signature.args[6])(context, builder, bias_v)

            def at(data, base, stride, k):
                off = builder.add(base, builder.mul(stride, const(k)))
                ptr = builder.gep(data, [off], inbounds=True)
                return builder.bitcast(ptr, vec.as_pointer())

            rows = [builder.load(at(sdata, s0_v, ss_v, p), align=4) for p in range(lanes)]
            i32 = ir.IntType(32)

            def mask(indices):
                return ir.Constant(ir.VectorType(i32, lanes), [ir.Constant(i32, m)
                                                               for m in indices])  # fmt: skip

            d = 1
            while d < lanes:  # swap the off-diagonal d x d blocks of each 2d x 2d block
                low = [j if j & d == 0 else lanes + j - d for j in range(lanes)]
                high = [j + d if j & d == 0 else lanes + j for j in range(lanes)]
                for i in range(lanes):
                    if i & d == 0:
                        a, b = rows[i], rows[i + d]
                        rows[i] = builder.shuffle_vector(a, b, mask(low))
                        rows[i + d] = builder.shuffle_vector(a, b, mask(high))
                d *= 2
            zero = ir.Constant(vec, None)
            splat = ir.Constant(ir.VectorType(i32, lanes), None)
            undef = ir.Constant(vec, ir.Undefined)
            for c, v in enumerate(rows):
                if mode:
                    bptr = cgutils.get_item_pointer(context, builder, signature.args[6], barr,
                                                    [builder.add(b0_v, const(c))],
                                                    wraparound=False)  # fmt: skip
                    one = builder.insert_element(undef, builder.load(bptr), const(0))
                    v = builder.fadd(v, builder.shuffle_vector(one, undef, splat))
                if mode == 2:  # v < 0 is false for NaN: NaN stays NaN
                    v = builder.select(builder.fcmp_ordered("<", v, zero), zero, v)
                elif mode == 3:  # w = v + 3 > 0 is false for NaN: w = 0, and 0 v is NaN
                    w = builder.fadd(v, ir.Constant(vec, [ir.Constant(f32, 3.0)] * lanes))
                    w = builder.select(builder.fcmp_ordered(">", w, zero), w, zero)
                    six = ir.Constant(vec, [ir.Constant(f32, 6.0)] * lanes)
                    w = builder.select(builder.fcmp_ordered("<", w, six), w, six)
                    sixth = ir.Constant(vec, [ir.Constant(f32, float(np.float32(1 / 6)))] * lanes)
                    v = builder.fmul(builder.fmul(w, v), sixth)
                builder.store(v, at(ddata, d0_v, ds_v, c), align=4)
            return context.get_dummy_value()

        return types.void(src, s0, sstride, dst, d0, dstride, bias, b0, epi), codegen

    return transpose_store
