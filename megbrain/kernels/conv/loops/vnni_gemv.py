"""The 8-bit matrix-vector product on AVX-512 VNNI (a classifier at batch 1): ``y = W x``
with ``W`` (N, K) signed bytes packed once into blocks of 16 rows, each ``k`` group of 4
one 64-byte vector that ``vpdpbusd`` multiplies by the broadcast word of ``x``'s 4 bytes.

Every weight byte is read once per row of ``x`` and every product is useful (the tiles of
:mod:`.vnni` put the positions, here one, along the vectors: 31 of 32 lanes wasted). The
source enters as :mod:`.vnni` takes it, unsigned (``x ^ 128`` for int8), the filter's row
sums times its shifted zero point folded into ``init``; the sums are exact (wrapping)
int32.

The loop is single-threaded, GIL-free, takes a ``[begin, end)`` range of work items (rows
of ``x`` by groups of :data:`BLOCKS` blocks of 16 output rows), is compiled on first use and
allocates nothing.
"""

from __future__ import annotations

import functools

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import cgutils, types
from numba.extending import intrinsic

from .int8 import _data, _lane_mask

__all__ = ["BLOCKS", "LANES", "gemv", "gemv_loop", "pack_rows"]

#: output rows of a block (16 int32 lanes)
LANES = 16
#: blocks of a work item, summed side by side: one broadcast word feeds as many
#: ``vpdpbusd``, whose independent chains hide its latency
BLOCKS = 4


@intrinsic
def _gemv_blocks(typingctx, out, o0, count, x, x0, kg, flip, tail, w, w0, wstride, init, i0,
                 nb):  # fmt: skip
    """``count`` (<= ``16 nb``) int32 sums ``out[o0 + j]``: ``init[i0 + j]`` plus, for each
    ``k`` group ``kk < kg``, ``vpdpbusd`` of the 4 bytes at ``x[x0 + 4 kk:]`` (read as one
    word, xor the word ``flip``: unsigned) broadcast with block ``j // 16``'s 64 signed
    bytes at ``w[w0 + (j // 16) wstride + 64 kk:]``; ``tail`` = ``(word, used)``: when
    ``used``, group ``kg`` too with the unsigned ``word``. ``nb`` (a literal) is the blocks
    summed side by side."""
    if not (isinstance(nb, types.IntegerLiteral) and isinstance(out, types.Array)
            and out.dtype == types.int32 and isinstance(x, types.Array)
            and x.dtype.bitwidth == 8 and isinstance(w, types.Array)
            and w.dtype.bitwidth == 8 and tail == types.UniTuple(types.int64, 2)):
        return None  # fmt: skip
    nbl = nb.literal_value

    def codegen(context, builder, signature, args):
        tail_v = args[7]
        i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
        v32 = ir.VectorType(i32, LANES)

        def arg64(k):
            return context.cast(builder, args[k], signature.args[k], types.int64)

        def splat(scalar):
            one = builder.insert_element(ir.Constant(v32, ir.Undefined), scalar,
                                         ir.Constant(i32, 0))  # fmt: skip
            return builder.shuffle_vector(one, ir.Constant(v32, ir.Undefined),
                                          ir.Constant(v32, None))  # fmt: skip

        dot = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v32, [v32] * 3),
                                             "llvm.x86.avx512.vpdpbusd.512")  # fmt: skip
        xd = builder.bitcast(_data(context, builder, signature.args[3], args[3]), i8.as_pointer())
        wd = builder.bitcast(_data(context, builder, signature.args[8], args[8]), i8.as_pointer())
        idata = builder.bitcast(_data(context, builder, signature.args[11], args[11]),
                                i32.as_pointer())  # fmt: skip
        od = builder.bitcast(_data(context, builder, signature.args[0], args[0]),
                             i32.as_pointer())  # fmt: skip
        o0, cnt, x0, kg, flip, w0, ws, i0 = (arg64(k) for k in (1, 2, 4, 5, 6, 9, 10, 12))
        flipw = builder.trunc(flip, i32)
        one = ir.Constant(i32, 1)
        masks = [_lane_mask(builder, LANES, ir.Constant(i64, 0),
                            builder.sub(cnt, ir.Constant(i64, LANES * b))) for b in range(nbl)]
        # init's lanes past count are never stored: the masked loads read none of them
        loadm = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
            v32, [v32.as_pointer(), i32, masks[0].type, v32]), "llvm.masked.load.v16i32.p0")
        regs = cgutils.alloca_once(builder, ir.ArrayType(v32, nbl))
        slots = [builder.gep(regs, [ir.Constant(i64, 0), ir.Constant(i64, b)], inbounds=True)
                 for b in range(nbl)]  # fmt: skip
        for b in range(nbl):
            p = builder.gep(idata, [builder.add(i0, ir.Constant(i64, LANES * b))])
            builder.store(builder.call(loadm, [builder.bitcast(p, v32.as_pointer()), one,
                                               masks[b], ir.Constant(v32, None)]), slots[b])
        wbases = [builder.add(w0, builder.mul(ws, ir.Constant(i64, b))) for b in range(nbl)]

        def group(word, kk):
            xv = splat(word)
            for b in range(nbl):
                off = builder.add(wbases[b], builder.mul(kk, ir.Constant(i64, 64)))
                wv = builder.load(builder.bitcast(builder.gep(wd, [off], inbounds=True),
                                                  v32.as_pointer()), align=1)  # fmt: skip
                builder.store(builder.call(dot, [builder.load(slots[b]), xv, wv]), slots[b])

        with cgutils.for_range(builder, kg, intp=i64) as loop:
            kk = loop.index
            ptr = builder.gep(xd, [builder.add(x0, builder.mul(kk, ir.Constant(i64, 4)))])
            word = builder.load(builder.bitcast(ptr, i32.as_pointer()), align=1)
            group(builder.xor(word, flipw), kk)
        word, used = (builder.extract_value(tail_v, k) for k in range(2))
        with builder.if_then(builder.icmp_signed("!=", used, ir.Constant(i64, 0))):
            group(builder.trunc(word, i32), kg)
        store = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
            ir.VoidType(), [v32, v32.as_pointer(), i32, masks[0].type]),
            "llvm.masked.store.v16i32.p0")  # fmt: skip
        for b in range(nbl):
            p = builder.gep(od, [builder.add(o0, ir.Constant(i64, LANES * b))])
            builder.call(store, [builder.load(slots[b]), builder.bitcast(p, v32.as_pointer()),
                                 one, masks[b]])  # fmt: skip
        return context.get_dummy_value()

    sig = types.void(out, o0, count, x, x0, kg, flip, tail, w, w0, wstride, init, i0, nb)
    return sig, codegen


def _gemv_py(x, w, init, out, geom, t0, t1):  # pragma: no cover - compiled
    """Items [t0, t1) of :func:`gemv`: item ``t`` is row ``t // items`` of ``x`` by the
    group ``t % items`` of :data:`BLOCKS` blocks of 16 output rows."""
    k_, n_, xstride, ostride, flip = geom[0], geom[1], geom[2], geom[3], geom[4]
    kfull = k_ // 4
    kg = (k_ + 3) // 4
    nblk = (n_ + LANES - 1) // LANES
    items = (nblk + BLOCKS - 1) // BLOCKS
    wstride = kg * 64
    word4 = np.int64(flip) * 0x01010101
    for t in range(t0, t1):
        m, g = t // items, t % items
        x0 = m * xstride
        tail = (np.int64(0), np.int64(0))
        if kfull < kg:  # the last group's bytes past K meet zero weights: any value
            word = np.int64(0)
            for i in range(k_ - 4 * kfull):
                word |= np.int64(x[x0 + 4 * kfull + i] ^ flip) << (8 * i)
            tail = (word, np.int64(1))
        b0 = g * BLOCKS
        o0 = b0 * LANES
        if b0 + BLOCKS <= nblk:
            _gemv_blocks(out, m * ostride + o0, min(n_ - o0, BLOCKS * LANES), x, x0, kfull,
                         word4, tail, w, b0 * wstride, wstride, init, o0, BLOCKS)  # fmt: skip
        else:
            for b in range(b0, nblk):
                _gemv_blocks(out, m * ostride + b * LANES, min(n_ - b * LANES, LANES), x, x0,
                             kfull, word4, tail, w, b * wstride, wstride, init, b * LANES, 1)


def _pack_rows_py(filt, zf, u0, w, init):  # pragma: no cover - compiled
    """``w`` (ceil(N / 16) blocks of KG groups of 16 rows of 4 bytes, int8): ``filt`` (N, K)
    minus ``zf``, zero past N and K; ``init`` (16 ceil(N / 16) int32): ``-u0`` times each
    row's sum (wrapping, as the sums do)."""
    n_, k_ = filt.shape
    kg = (k_ + 3) // 4
    nblk = (n_ + LANES - 1) // LANES
    for b in range(nblk):
        for r in range(LANES):
            o = b * LANES + r
            total = np.int64(0)
            for kk in range(kg):
                for i in range(4):
                    k = 4 * kk + i
                    v = np.int64(0)
                    if o < n_ and k < k_:
                        v = np.int64(filt[o, k]) - zf
                    w[((b * kg + kk) * LANES + r) * 4 + i] = np.int8(v)
                    total += v
            init[o] = np.int32(np.int64(-u0 * total) & 0xFFFFFFFF)


@functools.cache
def _compiled(name: str):
    fn = {"gemv": _gemv_py, "pack": _pack_rows_py}[name]
    return njit(nogil=True, cache=True, error_model="numpy")(fn)


def pack_rows(filt: np.ndarray, zf: int, u0: int, w: np.ndarray, init: np.ndarray) -> None:
    """Pack the 8-bit ``filt`` (N, K), any strides, minus its zero point ``zf`` into ``w``
    (int8, ``64 KG ceil(N / 16)`` bytes, ``KG = ceil(K / 4)``, 64-byte aligned) and its row
    sums times ``-u0`` (the source's zero point shifted to unsigned) into ``init`` (int32,
    ``16 ceil(N / 16)``); see :func:`_pack_rows_py`."""
    _compiled("pack")(filt, np.int64(zf), np.int64(u0), w, init)


def gemv(x, w, init, out, geom, t0: int, t1: int) -> None:
    """Work items [t0, t1) of ``out[m, n] = init[n] + sum_k w[n, k] u[m, k]``: ``x`` the
    flat unsigned-or-signed bytes of the source's rows (``u = x ^ flip``), ``w`` and
    ``init`` from :func:`pack_rows`, ``out`` flat int32; ``geom`` (int64) K, N, the source's
    and the output's row strides, ``flip`` (128 for an int8 source, else 0). Item ``t``:
    row ``t // G`` of the source, blocks ``[4 (t % G), 4 (t % G) + 4)`` of 16 outputs,
    ``G = ceil(ceil(N / 16) / 4)``."""
    _compiled("gemv")(x, w, init, out, geom, int(t0), int(t1))


def gemv_loop():
    """The compiled loop :func:`gemv` calls, taking the same arguments: a binding calls it
    directly (no lookup each call)."""
    return _compiled("gemv")
