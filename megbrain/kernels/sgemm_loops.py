"""Compiled loops of :mod:`megbrain.kernels.sgemm`: a float32 GEMM ``C (+)= A @ B`` as
register tiles over packed panels of both operands, blocked for the caches (BLIS's loops).

Layouts (float32, flat; element strides, non-negative):

- ``A`` (M, K) at ``a[i sa0 + p sa1]`` and ``B`` (K, N) at ``b[p sb0 + j sb1]``; rows of
  ``A`` contiguous along ``k`` are read in place by the tiles (unless their stride is a
  multiple of 4 KB), everything else through the packing;
- packed ``A`` block (``mc`` rows by ``kc``): panels of ``R`` rows, each ``(kc, R)``, the rows
  of one ``k`` contiguous (rows past ``mc`` zero);
- packed ``B`` block (``kc`` by ``nc`` columns): panels of ``16 NB`` columns, each
  ``(kc, 16 NB)`` (columns past ``nc`` zero);
- ``C``: row ``i`` at ``c[c0 + i ldc:][:N]`` (unit column stride).

A tile keeps ``R NB`` accumulator vectors in zmm registers across its ``kc`` steps: per step
``NB`` aligned vector loads of the ``B`` panel and one broadcast of the ``A`` panel per row,
``R NB`` fused multiply-adds; its write-out stores (the first ``K`` block) or adds to ``C``
(the next ones, or every one with ``ACC``), rows below ``nrows`` and columns below
``ncols`` only (masked). Each sum runs over ``k`` in order, in float32, whatever the blocks
and the threads.

The packing's transposes in registers also serve the convolutions' relayouts around the
GEMM: :func:`compiled_transpose` (a batch of matrices transposed, 16 rows at a time) and
:func:`compiled_pack_planes` (``NCHW`` planes packed as the batch-inner ``(H W N, C)``
operand).
"""

from __future__ import annotations

import functools

from llvmlite import ir
from numba import types as t
from numba.core import cgutils
from numba.extending import intrinsic

from . import tiled_jit

__all__ = ["LANES", "compiled_gemm", "compiled_pack", "compiled_pack_planes", "compiled_transpose",
           "pack_sizes"]

#: float32 lanes of a vector (a ``B`` panel is ``NB`` of them wide)
LANES = 16


@functools.cache
def sgemm_tile():
    """The ``sgemm_tile(R, NB, INPLACE, ap, a0, lda, bp, b0, kc, c, c0, ldc, nrows, ncols,
    acc)`` Numba intrinsic: one ``R x 16 NB`` tile (literals ``R``, ``NB``) of ``A`` times
    the ``B`` panel at ``bp[b0:]`` over ``kc`` steps, ``A``'s row ``i`` of step ``kk`` at
    ``ap[a0 + kk R + i]`` (a packed panel, literal ``INPLACE`` 0) or ``ap[a0 + i lda + kk]``
    (rows read in place, ``INPLACE`` 1), stored to (``acc`` zero) or added to (``acc``
    nonzero) ``c[c0 + i ldc + j]`` for rows ``i < nrows`` and columns ``j < ncols``; the
    tile of ``c`` is prefetched before the steps. No index is checked."""

    @intrinsic
    def sgemm_tile(typingctx, nrow, nvec, inplace, ap, a0, lda, bp, b0, kc, c, c0, ldc, nrows,
                   ncols, acc):  # fmt: skip
        if not all(isinstance(v, t.IntegerLiteral) for v in (nrow, nvec, inplace)):
            return None
        R, NB, direct = (v.literal_value for v in (nrow, nvec, inplace))
        NR = NB * LANES

        def codegen(context, builder, signature, args):
            (_, _, _, _, a0_v, lda_v, _, b0_v, kc_v, _, c0_v, ldc_v, nrows_v, ncols_v,
             acc_v) = args  # fmt: skip
            i32, i64 = ir.IntType(32), ir.IntType(64)
            vec = ir.VectorType(ir.FloatType(), LANES)
            vptr = vec.as_pointer()
            adata, bdata, cdata = (
                context.make_array(signature.args[i])(context, builder, args[i]).data
                for i in (3, 6, 9))  # fmt: skip
            fmuladd = tiled_jit.vector_fmas(builder, vec)
            slots = tiled_jit.zeroed_slots(builder, vec, R * NB)
            undef = ir.Constant(vec, ir.Undefined)
            splat = ir.Constant(ir.VectorType(i32, LANES), None)

            def const(v):
                return ir.Constant(i64, v)

            def at(base, off):
                return builder.gep(base, [off], inbounds=True)

            def step(kk):
                wb = builder.add(b0_v, builder.mul(kk, const(NR)))
                ws = [builder.load(builder.bitcast(at(bdata, builder.add(wb, const(b * LANES))),
                                                   vptr), align=4)
                      for b in range(NB)]  # fmt: skip
                if direct:  # row p of ``a`` at a0 + p lda, read in place
                    xb = builder.add(a0_v, kk)
                    rows = [builder.add(xb, builder.mul(lda_v, const(p))) for p in range(R)]
                else:
                    xb = builder.add(a0_v, builder.mul(kk, const(R)))
                    rows = [builder.add(xb, const(p)) for p in range(R)]
                for p in range(R):
                    x = builder.load(at(adata, rows[p]))
                    xv = builder.shuffle_vector(builder.insert_element(undef, x, const(0)),
                                                undef, splat)  # fmt: skip
                    for b in range(NB):
                        s = slots[p * NB + b]
                        builder.store(builder.call(fmuladd, [xv, ws[b], builder.load(s)]), s)

            # the tile of ``c`` fetched while the sums run (a store or an add misses else)
            i8p = ir.IntType(8).as_pointer()
            prefetch = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                "llvm.prefetch.p0")
            for p in range(R):
                row = builder.add(c0_v, builder.mul(ldc_v, const(p)))
                for b in range(NB):
                    ptr = builder.bitcast(at(cdata, builder.add(row, const(b * LANES))), i8p)
                    builder.call(prefetch, [ptr, ir.Constant(i32, 1), ir.Constant(i32, 3),
                                            ir.Constant(i32, 1)])  # fmt: skip
            with cgutils.for_range(builder, kc_v, intp=i64) as loop:
                step(loop.index)

            lane = ir.Constant(ir.VectorType(i64, LANES), [ir.Constant(i64, j)
                                                           for j in range(LANES)])  # fmt: skip
            left = builder.insert_element(ir.Constant(ir.VectorType(i64, LANES), ir.Undefined),
                                          ncols_v, const(0))  # fmt: skip
            left = builder.shuffle_vector(left, ir.Constant(left.type, ir.Undefined), splat)
            masks = [builder.icmp_signed("<", builder.add(lane, ir.Constant(
                lane.type, [ir.Constant(i64, b * LANES)] * LANES)), left)
                for b in range(NB)]  # fmt: skip
            mload = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vec, [vptr, i32, masks[0].type, vec]),
                "llvm.masked.load.v16f32.p0")
            mstore = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [vec, vptr, i32, masks[0].type]),
                "llvm.masked.store.v16f32.p0")
            four = ir.Constant(i32, 4)
            adding = builder.icmp_signed("!=", acc_v, const(0))

            def write(add):
                for p in range(R):
                    with builder.if_then(builder.icmp_signed("<", const(p), nrows_v),
                                         likely=True):  # fmt: skip
                        row = builder.add(c0_v, builder.mul(ldc_v, const(p)))
                        for b in range(NB):
                            ptr = builder.bitcast(at(cdata, builder.add(row, const(b * LANES))),
                                                  vptr)  # fmt: skip
                            v = builder.load(slots[p * NB + b])
                            if add:
                                v = builder.fadd(builder.call(mload, [ptr, four, masks[b],
                                                                      ir.Constant(vec, None)]),
                                                 v)  # fmt: skip
                            builder.call(mstore, [v, ptr, four, masks[b]])

            with builder.if_else(adding) as (then, otherwise):
                with then:
                    write(True)
                with otherwise:
                    write(False)
            return context.get_dummy_value()

        sig = t.void(nrow, nvec, inplace, ap, a0, lda, bp, b0, kc, c, c0, ldc, nrows, ncols,
                     acc)  # fmt: skip
        return sig, codegen

    return sgemm_tile


@functools.cache
def pack_panel():
    """The ``pack_panel(W, x, first, sx, sk, kc, dst, d0, width, ld)`` Numba intrinsic: one
    panel ``dst[d0 + kk ld + w] = x[first + kk sk + w sx]`` for ``kk < kc``, ``w < W``
    (literal), zero for ``w >= width`` (``ld`` is ``W`` for a packed panel; a longer one
    interleaves panels, or writes ``W`` columns of a transposed matrix): by masked vector
    loads where ``sx`` is 1, by 16 x 16 transposes in registers where ``sk`` is 1, else by
    gathers. No index is checked."""

    @intrinsic
    def pack_panel(typingctx, wlit, x, first, sx, sk, kc, dst, d0, width, ld):
        if not isinstance(wlit, t.IntegerLiteral):
            return None
        W = wlit.literal_value
        chunks = -(-W // LANES)

        def codegen(context, builder, signature, args):
            _, _, first_v, sx_v, sk_v, kc_v, _, d0_v, width_v, ld_v = args
            i1, i32, i64 = ir.IntType(1), ir.IntType(32), ir.IntType(64)
            f32 = ir.FloatType()
            vec = ir.VectorType(f32, LANES)
            vi = ir.VectorType(i64, LANES)
            vptr = vec.as_pointer()
            xdata, ddata = (context.make_array(signature.args[i])(context, builder,
                                                                  args[i]).data
                            for i in (1, 6))  # fmt: skip
            pvec = ir.VectorType(f32.as_pointer(), LANES)
            mty = ir.VectorType(i1, LANES)
            mload = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vec, [vptr, i32, mty, vec]),
                "llvm.masked.load.v16f32.p0")
            mstore = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [vec, vptr, i32, mty]),
                "llvm.masked.store.v16f32.p0")
            gather = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vec, [pvec, i32, mty, vec]),
                "llvm.masked.gather.v16f32.v16p0")
            zero = ir.Constant(vec, None)
            four = ir.Constant(i32, 4)
            splat = ir.Constant(ir.VectorType(i32, LANES), None)

            def const(v):
                return ir.Constant(i64, v)

            def bcast(v):
                one = builder.insert_element(ir.Constant(vi, ir.Undefined), v, const(0))
                return builder.shuffle_vector(one, ir.Constant(vi, ir.Undefined), splat)

            lane = [ir.Constant(vi, [ir.Constant(i64, c * LANES + j) for j in range(LANES)])
                    for c in range(chunks)]  # fmt: skip
            wv = bcast(width_v)
            loads = [builder.icmp_signed("<", lane[c], wv) for c in range(chunks)]
            stores = [ir.Constant(mty, [ir.Constant(i1, int(c * LANES + j < W))
                                        for j in range(LANES)]) for c in range(chunks)]  # fmt: skip
            # the gathers' byte offsets from the panel's first element of each k
            offs = [builder.mul(lane[c], bcast(builder.mul(sx_v, const(4))))
                    for c in range(chunks)]  # fmt: skip
            xbase = builder.ptrtoint(xdata, i64)
            unit = builder.icmp_signed("==", sx_v, const(1))

            def store(v, kk, c):
                row = builder.add(d0_v, builder.mul(kk, ld_v))
                ptr = builder.bitcast(builder.gep(ddata, [builder.add(row, const(c * LANES))]),
                                      vptr)  # fmt: skip
                if (c + 1) * LANES <= W:
                    builder.store(v, ptr, align=4)
                else:
                    builder.call(mstore, [v, ptr, four, stores[c]])

            def panel(contiguous, start):
                count = builder.sub(kc_v, start)
                with cgutils.for_range(builder, count, intp=i64) as loop:
                    kk = builder.add(start, loop.index)
                    src = builder.add(first_v, builder.mul(kk, sk_v))
                    for c in range(chunks):
                        if contiguous:
                            ptr = builder.bitcast(builder.gep(xdata, [builder.add(
                                src, const(c * LANES))]), vptr)  # fmt: skip
                            v = builder.call(mload, [ptr, four, loads[c], zero])
                        else:
                            addr = builder.add(xbase, builder.mul(src, const(4)))
                            ptrs = builder.inttoptr(builder.add(bcast(addr), offs[c]), pvec)
                            v = builder.call(gather, [ptrs, four, loads[c], zero])
                        store(v, kk, c)

            def transposed():
                # ``x``'s runs along k contiguous: 16 rows of 16 k loaded, transposed in
                # registers (four rounds of block swaps), stored as 16 k of the panel; the
                # last k (kc % 16) gathered
                full = builder.udiv(kc_v, const(LANES))
                with cgutils.for_range(builder, full, intp=i64) as loop:
                    k0 = builder.mul(loop.index, const(LANES))
                    for c in range(chunks):
                        rows = []
                        for i in range(LANES):
                            w = c * LANES + i
                            if w >= W:
                                rows.append(zero)
                                continue
                            src = builder.add(builder.add(first_v, k0),
                                              builder.mul(sx_v, const(w)))  # fmt: skip
                            ptr = builder.bitcast(builder.gep(xdata, [src]), vptr)
                            live = builder.icmp_signed("<", const(w), width_v)
                            mask = builder.shuffle_vector(
                                builder.insert_element(ir.Constant(mty, ir.Undefined), live,
                                                       const(0)),
                                ir.Constant(mty, ir.Undefined), splat)  # fmt: skip
                            rows.append(builder.call(mload, [ptr, four, mask, zero]))
                        for sft in (8, 4, 2, 1):
                            lo = [j if j & sft == 0 else LANES + j - sft for j in range(LANES)]
                            hi = [j + sft if j & sft == 0 else LANES + j for j in range(LANES)]
                            for i in range(LANES):
                                if i & sft:
                                    continue
                                a, b = rows[i], rows[i + sft]
                                rows[i] = builder.shuffle_vector(a, b, ir.Constant(
                                    ir.VectorType(i32, LANES), lo))  # fmt: skip
                                rows[i + sft] = builder.shuffle_vector(a, b, ir.Constant(
                                    ir.VectorType(i32, LANES), hi))  # fmt: skip
                        for j in range(LANES):
                            store(rows[j], builder.add(k0, const(j)), c)
                panel(False, builder.mul(full, const(LANES)))

            nought = const(0)
            with builder.if_else(unit) as (then, otherwise):
                with then:
                    panel(True, nought)
                with otherwise:
                    along_k = builder.icmp_signed("==", sk_v, const(1))
                    with builder.if_else(along_k) as (then2, otherwise2):
                        with then2:
                            transposed()
                        with otherwise2:
                            panel(False, nought)
            return context.get_dummy_value()

        sig = t.void(wlit, x, first, sx, sk, kc, dst, d0, width, ld)
        return sig, codegen

    return pack_panel


#: the tile and packing intrinsics, bound before compiling (module globals, not closure
#: cells: Numba's cache keys a closure by its cells' pickled bytes)
tile = panel = None


def _gemm_py(R: int, NB: int):
    """The blocked GEMM of ``R x 16 NB`` tiles (compile-time constants, its closure cells)."""
    global tile, panel
    tile, panel = sgemm_tile(), pack_panel()
    NR = NB * LANES

    def gemm(a, sa, b, sb, c, geom, ap, bp):  # pragma: no cover - compiled
        # geom: M, N, K, C0, LDC, ACC (add to C), MC, KC, NC (the cache blocks), PACKED (``bp``
        # holds all of B's panels, each of PACKED >= K rows, NR apart: B is not read)
        m, n, k, c0, ldc, acc = geom[0], geom[1], geom[2], geom[3], geom[4], geom[5]
        bm, bk, bn, packed = geom[6], geom[7], geom[8], geom[9]
        # rows of ``a`` contiguous along k are read in place (no packing), unless their
        # stride is a multiple of 4 KB, where the rows of a block share the caches' sets
        direct = sa[1] == 1 and sa[0] % 1024 != 0
        for jc in range(0, n, bn):
            nc = min(bn, n - jc)
            for pc in range(0, k, bk):
                kc = min(bk, k - pc)
                # panel q of this block at bp[b0 + q kc0 + b1 q / NR], its rows NR apart
                b0, kc0, b1 = 0, kc, 0
                if packed != 0:
                    b0, kc0, b1 = jc * packed + pc * NR, 0, packed * NR
                else:
                    for q in range(0, nc, NR):
                        panel(NR, b, (jc + q) * sb[1] + pc * sb[0], sb[1], sb[0], kc, bp,
                              q * kc, min(NR, nc - q), NR)
                add = 1 if pc > 0 or acc != 0 else 0
                for ic in range(0, m, bm):
                    mc = min(bm, m - ic)
                    if direct:  # whole tiles in place, a last partial one packed
                        whole = mc // R * R
                        if whole < mc:
                            panel(R, a, (ic + whole) * sa[0] + pc, sa[0], 1, kc, ap, 0,
                                  mc - whole, R)
                        for jr in range(0, nc, NR):
                            for ir in range(0, whole, R):
                                tile(R, NB, 1, a, (ic + ir) * sa[0] + pc, sa[0], bp,
                                     b0 + jr * kc0 + jr // NR * b1, kc, c,
                                     c0 + (ic + ir) * ldc + jc + jr, ldc, R, min(NR, nc - jr),
                                     add)  # fmt: skip
                            if whole < mc:
                                tile(R, NB, 0, ap, 0, 1, bp, b0 + jr * kc0 + jr // NR * b1, kc, c,
                                     c0 + (ic + whole) * ldc + jc + jr, ldc, mc - whole,
                                     min(NR, nc - jr), add)  # fmt: skip
                        continue
                    for q in range(0, mc, R):
                        panel(R, a, (ic + q) * sa[0] + pc * sa[1], sa[0], sa[1], kc, ap,
                              q * kc, min(R, mc - q), R)
                    for jr in range(0, nc, NR):
                        for ir in range(0, mc, R):
                            tile(R, NB, 0, ap, ir * kc, 1, bp, b0 + jr * kc0 + jr // NR * b1,
                                 kc, c,
                                 c0 + (ic + ir) * ldc + jc + jr, ldc, min(R, mc - ir),
                                 min(NR, nc - jr), add)  # fmt: skip

    return gemm


def _pack_py(NR: int):
    """All of a ``(K, N)`` matrix's panels of ``NR`` columns (a compile-time constant)."""
    global panel
    panel = pack_panel()

    def pack(b, sb, k, n, dst):  # pragma: no cover - compiled
        for q in range(0, n, NR):
            panel(NR, b, q * sb[1], sb[1], sb[0], k, dst, q * k, min(NR, n - q), NR)

    return pack


@functools.cache
def compiled_pack(NB: int):
    """The compiled ``pack(b, sb, k, n, dst)``: the flat read-only ``(k, n)`` matrix ``b``
    (int64 element strides ``sb``) as the panels of ``16 NB`` columns :func:`compiled_gemm`
    reads with ``PACKED``: panel ``q`` (columns ``[q NR, q NR + NR)``, zero past ``n``) at
    ``dst[q NR k:]``, its rows ``NR`` apart. Allocates nothing; releases the GIL."""
    fr = t.Array(t.float32, 1, "C", readonly=True)
    run = _pack_py(NB * LANES)
    run.__qualname__ = run.__name__ = f"sgemm_pack_{NB}"
    return tiled_jit.compile_tiled(run, [t.void(fr, t.int64[::1], t.int64, t.int64,
                                                t.float32[::1])])  # fmt: skip


def _transpose_py():
    """The transposer of :func:`compiled_transpose` (16-row blocks through the panels)."""
    global panel
    panel = pack_panel()

    def transpose(x, first, sx, m, k, dst, d0, ld, b0, b1, xb, db):  # pragma: no cover
        whole = m // LANES * LANES
        for b in range(b0, b1):
            f, d = first + b * xb, d0 + b * db
            for q in range(0, whole, LANES):
                panel(LANES, x, f + q * sx, sx, 1, k, dst, d + q, LANES, ld)
            for i in range(whole, m):
                for kk in range(k):
                    dst[d + kk * ld + i] = x[f + i * sx + kk]

    return transpose


def _pack_planes_py(NR: int):
    """The plane packing of :func:`compiled_pack_planes` (panels of ``NR`` columns)."""
    global panel
    panel = pack_panel()

    def pack(x, n, m, k, dst, n0, n1):  # pragma: no cover - compiled
        rows = k * n
        for i in range(n0, n1):
            for q in range(0, m, NR):
                panel(NR, x, (i * m + q) * k, k, 1, k, dst, q * rows + i * NR, min(NR, m - q),
                      n * NR)  # fmt: skip

    return pack


@functools.cache
def compiled_transpose():
    """The compiled ``transpose(x, first, sx, m, k, dst, d0, ld, b0, b1, xb, db)``:
    ``dst[d0 + b db + kk ld + i] = x[first + b xb + i sx + kk]`` for ``i < m``, ``kk < k``
    and ``b`` in ``[b0, b1)`` (a batch of ``(m, k)`` matrices of rows ``sx`` apart,
    contiguous along ``k``, written as ``(k, m)`` matrices of rows ``ld`` apart), 16 rows at
    a time by transposes in registers. Allocates nothing; releases the GIL."""
    fr, fw = t.Array(t.float32, 1, "C", readonly=True), t.float32[::1]
    run = _transpose_py()
    run.__qualname__ = run.__name__ = "sgemm_transpose"
    i64 = t.int64
    return tiled_jit.compile_tiled(run, [t.void(fr, i64, i64, i64, i64, fw, i64, i64, i64, i64,
                                                i64, i64)])  # fmt: skip


@functools.cache
def compiled_pack_planes(NB: int):
    """The compiled ``pack(x, n, m, k, dst, n0, n1)``: the C-ordered ``(n, m, k)`` planes
    ``x`` (flat) as the ``(k n, m)`` matrix of rows ``(kk, i)`` (``i`` inner) in
    :func:`compiled_pack`'s panels of ``16 NB`` columns, planes ``[n0, n1)`` (disjoint rows
    of every panel): an ``NCHW`` gradient as the batch-inner ``(H W N, C)`` operand, 16
    channels at a time by transposes in registers. Allocates nothing; releases the GIL."""
    fr, fw = t.Array(t.float32, 1, "C", readonly=True), t.float32[::1]
    run = _pack_planes_py(NB * LANES)
    run.__qualname__ = run.__name__ = f"sgemm_pack_planes_{NB}"
    i64 = t.int64
    return tiled_jit.compile_tiled(run, [t.void(fr, i64, i64, i64, fw, i64, i64)])


@functools.cache
def _compiled(R: int, NB: int):
    fr = t.Array(t.float32, 1, "C", readonly=True)
    run = _gemm_py(R, NB)
    # a name of its own per variant: Numba's cache keeps one index per name
    run.__qualname__ = run.__name__ = f"sgemm_{R}x{NB}"
    i64 = t.int64[::1]
    sig = t.void(fr, i64, fr, i64, t.float32[::1], i64, t.float32[::1], t.float32[::1])
    return tiled_jit.compile_tiled(run, [sig])


def compiled_gemm(R: int, NB: int):
    """The compiled GEMM of ``R x 16 NB`` tiles (``R NB`` accumulators of the 32 zmm
    registers, room left for the ``NB`` loads and a broadcast), compiled on first
    use: ``gemm(a, sa, b, sb, c, geom, ap, bp)``, the flat read-only ``a`` and ``b`` with
    their int64 element strides ``sa``, ``sb`` (the module's docstring), the flat output
    ``c``, the int64 geometry ``(M, N, K, C0, LDC, ACC, MC, KC, NC, PACKED)`` (``ACC``
    nonzero: add the product to ``C``; ``MC`` a multiple of ``R``, ``NC`` of ``16 NB``;
    ``PACKED`` nonzero: ``bp`` holds all of ``B``'s panels as :func:`compiled_pack` writes
    them for a matrix of ``PACKED >= K`` rows, ``B`` its first ``K`` (``bp`` a view from a
    later row gives a later range), ``b`` is not read) and the packing buffers
    (:func:`pack_sizes`). Allocates
    nothing; releases the GIL."""
    return _compiled(int(R), int(NB))


def pack_sizes(R: int, NB: int, m: int, n: int, k: int, blocks: tuple) -> tuple[int, int]:
    """The floats of the ``ap`` and ``bp`` buffers :func:`compiled_gemm` needs for an
    ``(m, k) @ (k, n)`` product with cache blocks ``(MC, KC, NC)``."""
    bm, bk, bn = blocks
    kc = min(bk, k)
    mc = -(-min(bm, m) // R) * R
    nc = -(-min(bn, n) // (NB * LANES)) * NB * LANES
    return mc * kc, kc * nc

