"""Compiled (Numba) loop of the NCHW pointwise convolution of :mod:`..pointwise`: a register
tile of output channels by positions, the source read in place, the ConvBias epilogue applied
as each tile is written.

Single-threaded and GIL-free (``nogil``) over a ``[begin, end)`` range of units (a sample and
a block of positions), so that a caller splits one call over a few Python threads. No
allocation: the accumulators are vectors LLVM keeps in registers (:func:`_rows_tile`), the
epilogue applied to them as they are stored. Compiled on first use
(:func:`.tiled_jit.compile_tiled`).
"""

from __future__ import annotations

import functools

from llvmlite import ir
from numba import types as t
from numba.core import cgutils, types
from numba.extending import intrinsic

from ... import tiled_jit

__all__ = ["ROWS", "VECS", "block_positions", "pointwise_nchw"]

#: output channels of a tile (8 with AVX-512, 6 with AVX2: rebound by the host's vector
#: width before compiling): each is one broadcast filter value per input channel times VECS
#: source vectors. ROWS x VECS accumulators (16 of the 32 AVX-512 registers, 12 of the 16
#: AVX2 ones) hide the latency of the multiply-adds; measured on AVX-512 (one thread), 8 x 2
#: beat 4 x 2, 6 x 2, 10 x 2, 4 x 3 and 6 x 3 over ShuffleNet's and ResNet's 1x1 layers
ROWS = 8
#: vectors of positions of a tile
VECS = 2

# bound by _compiled() before compiling (LANES: the host's vector width)
rows_tile = None
LANES = 16


def block_positions() -> int:
    """The positions of a full tile: ``VECS`` vectors of :func:`.tiled_jit.vector_width`."""
    return VECS * tiled_jit.vector_width()


@functools.cache
def _rows_tile():
    """The ``rows_tile(rows, vecs, x, x0, xs, w, w0, ws, k, used, out, o, os, bias, bo, epi)``
    Numba intrinsic: a tile of ``rows`` output channels by ``vecs`` vectors of positions (the
    literals fixing it), ``acc[r, p] = sum_ic w[w0 + r ws + ic] x[x0 + ic xs + p]`` for
    ``ic < k``, in that order, then ``+ bias[bo + r]`` (``epi`` bit 1), ReLU (bit 4) or
    H_SWISH (bit 8), ReLU6 (bit 16), stored at ``out[o + r os + p]`` for the ``used`` first
    rows (the rows past them repeat the last one's filter values, and are dropped). LLVM vectors of
    :func:`.tiled_jit.vector_width` lanes (``llvm.fmuladd``, fused where the target has FMA),
    one broadcast filter value per row and input channel, the accumulators in registers
    across the loop, no index checked (the caller keeps them in bounds). The epilogue is
    vector code too: as scalar loops after the tile it cost as much as a short reduction."""
    lanes = tiled_jit.vector_width()

    @intrinsic
    def rows_tile(typingctx, rows, vecs, x, x0, xs, w, w0, ws, k, used, out, o, os, bias, bo,
                  epi):  # fmt: skip
        if not all(isinstance(v, types.IntegerLiteral) for v in (rows, vecs)):
            return None
        nr, nv = rows.literal_value, vecs.literal_value

        def codegen(context, builder, signature, args):
            (_, _, _, x0_v, xs_v, _, w0_v, ws_v, k_v, used_v, _, o_v, os_v, _, bo_v,
             epi_v) = args  # fmt: skip
            i64, f32 = ir.IntType(64), ir.FloatType()
            vec = ir.VectorType(f32, lanes)

            def const(v):
                return ir.Constant(i64, v)

            def data(j):
                return context.make_array(signature.args[j])(context, builder, args[j]).data

            xdata, wdata, odata, bdata = data(2), data(5), data(10), data(13)
            fmuladd = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vec, [vec] * 3), f"llvm.fmuladd.v{lanes}f32"
            )
            regs = cgutils.alloca_once(builder, ir.ArrayType(vec, nr * nv))
            slots = [builder.gep(regs, [const(0), const(i)], inbounds=True)
                     for i in range(nr * nv)]  # fmt: skip
            for slot in slots:
                builder.store(ir.Constant(vec, None), slot)
            undef = ir.Constant(vec, ir.Undefined)
            splat = ir.Constant(ir.VectorType(ir.IntType(32), lanes), None)  # lane 0 everywhere

            def broadcast(value):
                one = builder.insert_element(undef, value, const(0))
                return builder.shuffle_vector(one, undef, splat)

            # rows past ``used`` repeat the last one's filter values (their sums are dropped)
            last = builder.sub(used_v, const(1))
            rowsel = [builder.select(builder.icmp_signed("<", const(r), used_v), const(r), last)
                      for r in range(nr)]  # fmt: skip
            wrows = [builder.add(w0_v, builder.mul(ws_v, rc)) for rc in rowsel]
            with cgutils.for_range(builder, k_v, intp=i64) as loop:
                ic = loop.index
                xb = builder.add(x0_v, builder.mul(ic, xs_v))
                xv = []
                for j in range(nv):
                    ptr = builder.gep(xdata, [builder.add(xb, const(j * lanes))], inbounds=True)
                    xv.append(builder.load(builder.bitcast(ptr, vec.as_pointer()), align=4))
                for r in range(nr):
                    wptr = builder.gep(wdata, [builder.add(wrows[r], ic)], inbounds=True)
                    wv = broadcast(builder.load(wptr))
                    for j in range(nv):
                        slot = slots[r * nv + j]
                        builder.store(builder.call(fmuladd, [wv, xv[j], builder.load(slot)]),
                                      slot)  # fmt: skip

            def flag(bit):
                return builder.icmp_signed("!=", builder.and_(epi_v, const(bit)), const(0))

            zero, three = ir.Constant(vec, [0.0] * lanes), ir.Constant(vec, [3.0] * lanes)
            six, sixth = ir.Constant(vec, [6.0] * lanes), ir.Constant(vec, [1.0 / 6.0] * lanes)
            has_bias, relu, hswish, relu6 = flag(1), flag(4), flag(8), flag(16)
            for r in range(nr):
                with cgutils.if_likely(builder, builder.icmp_signed("<", const(r), used_v)):
                    bptr = builder.gep(bdata, [builder.add(bo_v, const(r))], inbounds=True)
                    bval = builder.select(has_bias, builder.load(bptr), ir.Constant(f32, 0.0))
                    bv = broadcast(bval)
                    row = builder.add(o_v, builder.mul(os_v, const(r)))
                    for j in range(nv):
                        v = builder.fadd(builder.load(slots[r * nv + j]), bv)
                        # not max(): NaN stays NaN, as ReLU's
                        v = builder.select(relu, builder.select(
                            builder.fcmp_ordered("<", v, zero), zero, v), v)
                        # H_SWISH as the elementwise kernels compute it
                        h = builder.fadd(v, three)
                        h = builder.select(builder.fcmp_ordered(">", h, zero), h, zero)
                        h = builder.select(builder.fcmp_ordered("<", h, six), h, six)
                        h = builder.fmul(builder.fmul(h, v), sixth)
                        v = builder.select(hswish, h, v)
                        # ReLU6 as the JIT's MAX(0, x), MIN(6, x): NaN stays NaN
                        r6 = builder.select(builder.fcmp_ordered("<", v, zero), zero, v)
                        r6 = builder.select(builder.fcmp_ordered(">", r6, six), six, r6)
                        v = builder.select(relu6, r6, v)
                        ptr = builder.gep(odata, [builder.add(row, const(j * lanes))],
                                          inbounds=True)  # fmt: skip
                        builder.store(v, builder.bitcast(ptr, vec.as_pointer()), align=4)
            return context.get_dummy_value()

        i8 = types.int64
        sig = types.void(rows, vecs, x, i8, i8, w, i8, i8, i8, i8, out, i8, i8, bias, i8, i8)
        return sig, codegen

    return rows_tile


def _pointwise_nchw_py(x, w, out, bias, dims, epi, u0, u1):
    # pragma: no cover - compiled
    """Units [u0, u1) of ``out`` = the grouped pointwise convolution of ``x`` with ``w``
    (G, OCg, ICg), C-contiguous, then the epilogue (epi bits: 1 ``+ bias[oc]``, 4 ReLU, 8
    H_SWISH, 16 ReLU6; no SiLU: the last block's tile rewrites positions of the one before,
    which another thread may be computing, so only what the tile computes in registers is
    safe). ``x`` and ``out`` are flat views starting at their first element, each plane of
    L positions contiguous.

    dims: N, G, OCg, ICg, L, BLOCKS (units per sample), then the sample and channel strides
    of x and of out, in elements. Unit u is sample u // BLOCKS and the positions of its block
    (the last block ends at L: it recomputes a few positions of the one before, the same
    sums); per group, tiles of ROWS output channels over every input channel."""
    g_, ocg, icg, l_, blocks = dims[1], dims[2], dims[3], dims[4], dims[5]
    xn, xc, on, oc = dims[6], dims[7], dims[8], dims[9]
    full = VECS * LANES  # noqa: F821
    vecs = VECS if l_ >= full else 1
    npos = vecs * LANES  # noqa: F821
    for u in range(u0, u1):
        n = u // blocks
        p0 = min((u % blocks) * npos, l_ - npos)
        for g in range(g_):
            x0 = n * xn + g * icg * xc + p0
            for o0 in range(0, ocg, ROWS):
                rr = min(ROWS, ocg - o0)
                c0 = g * ocg + o0
                if vecs == VECS:
                    rows_tile(ROWS, VECS, x, x0, xc, w, c0 * icg, icg, icg, rr,  # noqa: F821
                              out, n * on + c0 * oc + p0, oc, bias, c0, epi)  # fmt: skip
                else:
                    rows_tile(ROWS, 1, x, x0, xc, w, c0 * icg, icg, icg, rr,  # noqa: F821
                              out, n * on + c0 * oc + p0, oc, bias, c0, epi)  # fmt: skip


def pointwise_nchw(x, w, out, bias, dims, epi: int, u0: int, u1: int) -> None:
    """Units [u0, u1) of the NCHW pointwise convolution (:func:`_pointwise_nchw_py`): ``x``,
    ``w`` and ``bias`` read-only float32 vectors, ``out`` a writable one, ``dims`` int64."""
    _compiled()(x, w, out, bias, dims, int(epi), int(u0), int(u1))


@functools.cache
def _compiled():
    global rows_tile, LANES, ROWS
    rows_tile, LANES = _rows_tile(), tiled_jit.vector_width()
    ROWS = 8 if LANES == 16 else 6
    f1, i8 = t.float32[::1], t.int64
    fr = t.Array(t.float32, 1, "C", readonly=True)
    return tiled_jit.compile_tiled(_pointwise_nchw_py,
                                   [t.void(fr, fr, f1, fr, t.int64[::1], i8, i8, i8)])
