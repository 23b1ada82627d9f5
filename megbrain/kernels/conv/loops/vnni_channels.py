"""The 8-bit convolution's VNNI tile with output channels along the vectors, for the small
planes where :mod:`.vnni`'s tiles (positions along the vectors) compute lanes for nothing.

:mod:`.vnni`'s tile runs 16 consecutive positions of the phase planes' rows per vector:
a 7x7 plane is 63 such positions (rows padded to 9) in 4 vectors, 64 computed for 49
outputs; 14x14, 224 for 196. This tile turns the roles around: each vector holds 16 output
channels of one position, so that a tile is ``P`` positions of one output row (or of a
run of rows where the planes have no padding column) by ``V`` vectors of 16 channels, and
the only lanes computed for nothing are those of a row's last tile past its end and of
channels past the layer's (rounded up to 16 ``V``).

Per ``k`` group (4 input channels of one tap) the tile loads ``V`` 64-byte filter vectors
(16 channels by 4 input channels; the packed filter's channel-vector layout,
:func:`.vnni.pack_filter` with ``vec``) and broadcasts each position's 4-byte word of the
relaid source (:mod:`.vnni`'s layouts, unchanged: the same band buffers and offsets), then
issues the ``P V`` ``vpdpbusd``. The sums start at the bias vectors (``init``, one int32
per channel) and leave as int32 or requantized bytes (:func:`.requant_ir.requantize_bytes`,
the same float32 chain, exact), a position's channels written to their planes: NCHW, or
NCHW4 a word per 4 channels. No column is dropped afterwards.

:func:`bands_kernel` is :func:`.vnni.bands_kernel` with these tiles: the same units (bands
of output rows by chunks of output channels) taken as they go, the same per-thread
relayout. :mod:`megbrain.kernels.conv.quantized` takes them layer by layer where they
compute fewer products (``_channel_tile``).
"""

from __future__ import annotations

import functools

from llvmlite import ir
from numba import njit
from numba.core import cgutils, types
from numba.extending import intrinsic

from ... import tiled_jit
from . import requant_ir
from . import vnni as vl

__all__ = ["TILES", "bands_kernel", "padded_products", "tile_shape", "vnni_ctile"]

#: the tiles' shapes, positions to vectors of 16 output channels: ``P V`` accumulators of
#: the 32 zmm registers, with room for a broadcast word and the filter vectors of a pass
#: (:func:`vnni_ctile`); :func:`tile_shape` takes the one with the least padding
TILES = {7: 4, 8: 3, 14: 2}


def padded_products(channels: int, runs: list[int], tile: tuple[int, int]) -> int:
    """Output values computed (lanes, real or not) by channel tiles ``tile`` = (P, V) for
    ``channels`` output channels over runs of positions of the lengths ``runs``."""
    p, v = tile
    return -(-channels // (16 * v)) * 16 * v * sum(-(-n // p) * p for n in runs)


def tile_shape(channels: int, runs: list[int]) -> tuple[int, int]:
    """``(positions, vectors)`` of the tile (:data:`TILES`) that computes the fewest padded
    products (:func:`padded_products`), the most accumulators where they pad alike."""
    return min(TILES.items(), key=lambda t: (padded_products(channels, runs, t), -t[0] * t[1]))


@functools.cache
def vnni_ctile():
    """The ``vnni_ctile(a, a0, offs, offs0, w, w0, wstride, kg, init, i0, out, o0, ostep,
    cstride, count, nch, q, pos, vecs, epi, blocked)`` Numba intrinsic: one tile of ``pos``
    positions by ``vecs`` vectors of 16 output channels (literals).

    Vector ``v`` of position ``p`` starts at ``init[i0 + 16 v:]`` and adds, for each ``k``
    group ``kk < kg``, the ``vpdpbusd`` of the 4 unsigned bytes at ``a[a0 + 4 p +
    offs[offs0 + kk]:]`` broadcast with the 64 signed bytes at ``w[w0 + v wstride + 64
    kk:]``. Positions ``p < count`` and channels ``c < nch`` are stored: with ``epi``
    :data:`.vnni.EPI_INT32`, int32 to ``out[o0 + p ostep + c cstride]``; else requantized
    to one byte with ``q`` (:func:`.vnni.requant_params`), to the same place, or with the
    literal ``blocked`` 1 (NCHW4), to byte ``c % 4`` of the word at ``out[o0 + p ostep + (c
    // 4) cstride:]``. No index is checked; all ``pos`` positions are read.
    """

    @intrinsic
    def vnni_ctile(typingctx, a, a0, offs, offs0, w, w0, wstride, kg, init, i0, out, o0, ostep,
                   cstride, count, nch, q, pos, vecs, epi, blocked):  # fmt: skip
        literals = (pos, vecs, epi, blocked)
        if not all(isinstance(v, types.IntegerLiteral) for v in literals):
            return None
        npos, nv, mode, by_word = (v.literal_value for v in literals)
        out_ty = types.int32 if mode == vl.EPI_INT32 else types.uint8
        if not (isinstance(out, types.Array) and out.dtype == out_ty):
            return None

        def codegen(context, builder, signature, args):
            (a_v, a0_v, offs_v, offs0_v, w_v, w0_v, ws_v, kg_v, init_v, i0_v, out_v, o0_v,
             ostep_v, cs_v, count_v, nch_v, q_v) = args[:17]  # fmt: skip
            i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
            v32 = ir.VectorType(i32, vl.LANES)

            def const(v, ty=i64):
                return ir.Constant(ty, v)

            data = vl.array_data(context, builder, signature, args)
            adata = builder.bitcast(data(0), i8.as_pointer())
            wdata = builder.bitcast(data(4), i8.as_pointer())
            tdata, idata, odata, qdata = data(2), data(8), data(10), data(16)
            splat0 = ir.Constant(v32, None)

            def splat(scalar):
                one = builder.insert_element(ir.Constant(v32, ir.Undefined), scalar, const(0))
                return builder.shuffle_vector(one, ir.Constant(v32, ir.Undefined), splat0)

            dot = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(v32, [v32] * 3), "llvm.x86.avx512.vpdpbusd.512")
            # the vectors of the tile's columns summed in one pass over its positions: as
            # many filter vectors as fit in registers beside the P V sums and a broadcast
            # word (of 32; LLVM spilled sums at 7 x 4 in one pass); a pass after the first
            # reads the words through a copy of the source's address LLVM cannot see
            # through, so that it loads them again rather than keeping the first pass's
            # broadcasts in registers
            per = max(1, min(nv, 31 - npos * nv))
            groups = [range(v, min(nv, v + per)) for v in range(0, nv, per)]
            sources = [adata] + [builder.asm(ir.FunctionType(adata.type, [adata.type]), "",
                                             "=r,0", [adata], side_effect=False)
                                 for _ in groups[1:]]  # fmt: skip
            regs = cgutils.alloca_once(builder, ir.ArrayType(v32, npos * nv))
            slots = [builder.gep(regs, [const(0), const(i)], inbounds=True)
                     for i in range(npos * nv)]  # fmt: skip
            for v in range(nv):
                ptr = builder.gep(idata, [builder.add(i0_v, const(v * vl.LANES))])
                start = builder.load(builder.bitcast(ptr, v32.as_pointer()), align=4)
                for p in range(npos):
                    builder.store(start, slots[p * nv + v])
            with cgutils.for_range(builder, kg_v, intp=i64) as loop:
                kk = loop.index
                step = builder.load(builder.gep(tdata, [builder.add(offs0_v, kk)]))
                abase = builder.add(a0_v, step)
                wbase = builder.add(w0_v, builder.mul(kk, const(64)))
                for group, src in zip(groups, sources):
                    fvs = {}
                    for v in group:
                        off = builder.add(wbase, builder.mul(ws_v, const(v)))
                        ptr = builder.bitcast(builder.gep(wdata, [off], inbounds=True),
                                              v32.as_pointer())  # fmt: skip
                        fvs[v] = builder.load(ptr, align=1)
                    for p in range(npos):
                        ptr = builder.gep(src, [builder.add(abase, const(4 * p))], inbounds=True)
                        word = splat(builder.load(builder.bitcast(ptr, i32.as_pointer()),
                                                  align=4))  # fmt: skip
                        for v in group:
                            slot = slots[p * nv + v]
                            builder.store(builder.call(dot, [builder.load(slot), word, fvs[v]]),
                                          slot)  # fmt: skip
            # each position's vectors through a stack buffer, each channel to its plane
            # (or each 4 channels' word to its block's plane)
            relu = mode == vl.EPI_QUANT_RELU
            if mode != vl.EPI_INT32:
                qs = [requant_ir.splat16(builder, builder.load(builder.gep(qdata, [const(i)])))
                      for i in range(7)]  # fmt: skip
                ops = requant_ir.bytes_operands(builder, qs, relu)
            ety = i32 if mode == vl.EPI_INT32 else i8
            buf = cgutils.alloca_once(builder, ir.ArrayType(ety, vl.LANES * nv))
            bufp = builder.bitcast(buf, ety.as_pointer())
            optr = builder.bitcast(odata, ety.as_pointer())

            def scatter_words(base):
                # whole words of 4 channels, then the bytes of a last short one
                words = builder.sdiv(nch_v, const(4))
                wbuf = builder.bitcast(bufp, i32.as_pointer())
                with cgutils.for_range(builder, words, intp=i64) as loop:
                    m = loop.index
                    dst = builder.add(base, builder.mul(m, cs_v))
                    builder.store(builder.load(builder.gep(wbuf, [m])),
                                  builder.bitcast(builder.gep(optr, [dst]), i32.as_pointer()),
                                  align=1)  # fmt: skip
                last = builder.add(base, builder.mul(words, cs_v))
                first = builder.mul(words, const(4))
                with cgutils.for_range(builder, builder.sub(nch_v, first), intp=i64) as loop:
                    k = loop.index
                    val = builder.load(builder.gep(bufp, [builder.add(first, k)]))
                    builder.store(val, builder.gep(optr, [builder.add(last, k)]))

            for p in range(npos):
                with builder.if_then(builder.icmp_signed("<", const(p), count_v)):
                    accs = [builder.load(slots[p * nv + v]) for v in range(nv)]
                    if mode == vl.EPI_INT32:
                        for v in range(nv):
                            ptr = builder.gep(bufp, [const(v * vl.LANES)])
                            builder.store(accs[v], builder.bitcast(ptr, v32.as_pointer()),
                                          align=1)  # fmt: skip
                    else:
                        val = requant_ir.requantize_bytes(builder, accs, qs, ops, relu)
                        builder.store(val, builder.bitcast(bufp, val.type.as_pointer()), align=1)
                    base = builder.add(o0_v, builder.mul(ostep_v, const(p)))
                    if by_word:
                        scatter_words(base)
                    else:
                        with cgutils.for_range(builder, nch_v, intp=i64) as loop:
                            c = loop.index
                            val = builder.load(builder.gep(bufp, [c]))
                            builder.store(val, builder.gep(optr, [builder.add(
                                base, builder.mul(c, cs_v))]))  # fmt: skip
            return context.get_dummy_value()

        sig = types.void(a, a0, offs, offs0, w, w0, wstride, kg, init, i0, out, o0, ostep,
                         cstride, count, nch, q, pos, vecs, epi, blocked)  # fmt: skip
        return sig, codegen

    return vnni_ctile


#: the entries of :func:`bands_kernel`'s ``geom`` before the taps' offsets
_GEOM = 14
#: the tile, relayout and unit taker the bands call: module globals, not closure cells
#: (as in :mod:`.vnni`)
_ctile_g = _relay_g = _relay4_g = _take_g = None


def _make_bands(npos: int, nv: int, epi: int, blocked: bool):
    global _ctile_g, _relay_g, _relay4_g, _take_g
    _ctile_g, _take_g = vnni_ctile(), tiled_jit.take_unit()
    _relay_g, _relay4_g = vl._compiled("relayout"), vl._compiled("relayout4")
    width = vl.LANES * nv  # output channels of a tile
    by_word = 1 if blocked else 0

    def bands(x, x4w, tmp, xoff, hw, ci, geo, flip, u0, x4, w, init, out, q, geom, counter, me):
        """The units thread ``me`` takes; see :func:`bands_kernel`."""
        rb, oh, wph, nchunk, o_, kg_, cg_, out0, cstride, w0, i0, ow, ostep, cdiv = geom[0], \
            geom[1], geom[2], geom[3], geom[4], geom[5], geom[6], geom[7], geom[8], geom[9], \
            geom[10], geom[11], geom[12], geom[13]  # fmt: skip
        obn = (o_ + width - 1) // width
        per = (obn + nchunk - 1) // nchunk
        wstride = kg_ * 4 * vl.LANES
        flat = wph == ow  # no column to skip: a band's rows are one run of positions
        relaid = -1  # the band in this thread's buffer
        while True:
            u = _take_g(counter, me)
            if u < 0:
                break
            b, c = u // nchunk, u % nchunk
            r0 = b * rb
            if b != relaid:
                if blocked:
                    _relay4_g(x, x4w, tmp, xoff, hw, ci, geo, flip, u0, 0, cg_, r0)
                else:
                    _relay_g(x, x4w, tmp, xoff, hw, ci, geo, flip, u0, 0, cg_, r0)
                relaid = b
            nr = min(oh, r0 + rb) - r0
            runs, run = (1, nr * ow) if flat else (nr, ow)
            # a chunk's tiles of channels outermost: a tile's filter (KG 64 V bytes) is read
            # from the cache by each run of positions after the first
            for ob in range(c * per, min(obn, (c + 1) * per)):
                o = ob * width
                nch = min(width, o_ - o)
                obase = out0 + o // cdiv * cstride + r0 * ow * ostep
                for r in range(runs):
                    for q0 in range(0, run, npos):
                        _ctile_g(x4, (r * wph + q0) * 4, geom, _GEOM, w, w0 + o * kg_ * 4,
                                 wstride, kg_, init, i0 + o, out, obase + (r * ow + q0) * ostep,
                                 ostep, cstride, min(npos, run - q0), nch, q, npos, nv, epi,
                                 by_word)  # fmt: skip

    return bands


@functools.cache
def _compiled(npos: int, nv: int, epi: int, blocked: bool):
    return njit(nogil=True, cache=True, error_model="numpy", fastmath=False)(
        _make_bands(npos, nv, epi, blocked))


def bands_kernel(npos: int, nv: int, epi: int, blocked: bool = False):
    """The compiled bands of channel tiles of ``npos`` positions by ``nv`` vectors: called
    as :func:`.vnni.bands_kernel`'s kernels are, with ``src8``/``dst8`` left out (the
    tiles write the output in place, NCHW, or NCHW4 with ``blocked``). ``geom`` (int64):
    RB, OH, WPh, chunks, O, KG, CG, the output's first index, the channel stride (a
    plane, or with ``blocked`` a block of 4 planes), the packed filter's first byte
    (channel-vector layout), ``init``'s first index, OW, the output's position step (1, or
    4 blocked), 1 (4 blocked), then each k group's byte offset into the band's buffer."""
    return _compiled(int(npos), int(nv), int(epi), bool(blocked))
