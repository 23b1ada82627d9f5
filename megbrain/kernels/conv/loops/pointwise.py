"""Compiled (Numba) loops of the NCHW pointwise convolution of :mod:`..pointwise`: register
tiles of ``R`` output channels by ``B`` vectors of positions whose whole reduction and
ConvBias epilogue stay in registers, the source read in place.

Layouts (float32, flat): the source and output planes of ``L`` positions contiguous (any
sample and channel strides); the filter packed ``(G, NR, K, R)``: per group of the
convolution ``NR`` groups of ``R`` output channels (the last one padded with zeros), a
tile's ``R`` filter values of one input channel contiguous, so that a tile's filter is one
stream of broadcasts.

A tile is ``R`` output channels by ``B`` vectors of :func:`.tiled_jit.vector_width` positions
(``R B`` accumulator vectors): per input channel ``B`` vector loads of the source row and
``R`` broadcast filter values, ``R B`` fused multiply-adds, summed over the input channels in
order (reproducible, whoever computes a tile). The epilogue (bias, ReLU, H_SWISH, ReLU6:
:func:`.pointwise88.activate`) is applied to the registers as they are stored; rows past the
output channels are dropped. A plane's last tile starts ``B`` vectors before the plane's
end: it recomputes a few positions of the one before, the same sums.

Work units (a sample, a group of the convolution, a group of ``R`` output channels, a band
of tiles) are taken as they go by GIL-free threads (:func:`.nchw8c.units_as_they_go`),
the channel groups fastest. Nothing is allocated. Compiled per tile shape and epilogue on
first use (:func:`.tiled_jit.compile_tiled`).
"""

from __future__ import annotations

import functools

from llvmlite import ir
from numba import types as t
from numba.core import cgutils, types
from numba.extending import intrinsic

from ... import tiled_jit
from .pointwise88 import ACTIVATIONS, activate

__all__ = ["EPILOGUE_BITS", "arrays_data", "compiled_units", "rows_tile", "runtime_epilogue"]

#: the epilogue bits a tile applies: 1 ``+ bias``, then the activations of
#: :data:`.pointwise88.ACTIVATIONS` (4 ReLU, 8 H_SWISH, 16 ReLU6)
EPILOGUE_BITS = 1 | sum(ACTIVATIONS)


def arrays_data(context, builder, signature, args, *which) -> list:
    """The data pointers of the array arguments ``which`` (indices) of an intrinsic's call."""
    return [context.make_array(signature.args[j])(context, builder, args[j]).data
            for j in which]  # fmt: skip


def runtime_epilogue(builder, epi, bias):
    """``v -> act(v + bias)`` for LLVM float32 vectors ``v``, with the epilogue bits ``epi``
    (an i64 value known at run time): ``bias`` (a float32 value, loaded whatever the bits)
    added where bit 1 is set, then each activation of :data:`.pointwise88.ACTIVATIONS`
    whose bit is set, chosen by selects (one compiled variant for every epilogue)."""
    i64 = ir.IntType(64)

    def flag(bit):
        return builder.icmp_signed("!=", builder.and_(epi, ir.Constant(i64, bit)),
                                   ir.Constant(i64, 0))  # fmt: skip

    acts = [(flag(bit), bit) for bit in ACTIVATIONS]
    bias = builder.select(flag(1), bias, ir.Constant(ir.FloatType(), 0.0))

    def apply(v):
        lanes = v.type.count
        one = builder.insert_element(ir.Constant(v.type, ir.Undefined), bias,
                                     ir.Constant(ir.IntType(32), 0))  # fmt: skip
        v = builder.fadd(v, builder.shuffle_vector(one, one, ir.Constant(
            ir.VectorType(ir.IntType(32), lanes), None)))
        for on, bit in acts:
            v = builder.select(on, activate(builder, v, bit), v)
        return v

    return apply


@functools.cache
def rows_tile():
    """The ``rows_tile(R, B, EPI, x, x0, xs, w, w0, k, used, out, o, os, bias, bo)`` Numba
    intrinsic: one tile (the module's docstring), literals ``R`` and ``B``;
    ``acc[r, p] = sum_ic w[w0 + ic R + r] x[x0 + ic xs + p]`` for ``ic < k``, in that
    order, then ``+ bias[bo + r]`` (``EPI`` bit 1) and the activations of ``EPI``'s bits
    (:data:`.pointwise88.ACTIVATIONS`, in that order), stored at
    ``out[o + r os + p]`` for the ``used`` first rows. LLVM vectors of
    :func:`.tiled_jit.vector_width` lanes (``llvm.fmuladd``, fused where the target has
    FMA), no index checked (the caller keeps them in bounds)."""
    lanes = tiled_jit.vector_width()

    @intrinsic(prefer_literal=True)
    def rows_tile(typingctx, rows, vecs, epi, x, x0, xs, w, w0, k, used, out, o, os, bias,
                  bo):  # fmt: skip
        if not all(isinstance(v, types.IntegerLiteral) for v in (rows, vecs)):
            return None
        nr, nv = rows.literal_value, vecs.literal_value

        def codegen(context, builder, signature, args):
            (_, _, epi_v, _, x0_v, xs_v, _, w0_v, k_v, used_v, _, o_v, os_v, _,
             bo_v) = args  # fmt: skip
            i64, f32 = ir.IntType(64), ir.FloatType()
            vec = ir.VectorType(f32, lanes)

            def const(v):
                return ir.Constant(i64, v)

            if isinstance(signature.args[2], types.IntegerLiteral):  # folded by LLVM
                epi_v = const(signature.args[2].literal_value)
            xdata, wdata, odata, bdata = arrays_data(context, builder, signature, args, 3, 6,
                                                     10, 13)  # fmt: skip
            fmuladd = tiled_jit.vector_fmas(builder, vec)
            slots = tiled_jit.zeroed_slots(builder, vec, nr * nv)
            undef = ir.Constant(vec, ir.Undefined)
            splat = ir.Constant(ir.VectorType(ir.IntType(32), lanes), None)  # lane 0 everywhere

            def broadcast(value):
                one = builder.insert_element(undef, value, const(0))
                return builder.shuffle_vector(one, undef, splat)

            with cgutils.for_range(builder, k_v, intp=i64) as loop:
                ic = loop.index
                xb = builder.add(x0_v, builder.mul(ic, xs_v))
                wb = builder.add(w0_v, builder.mul(ic, const(nr)))
                xv = []
                for j in range(nv):
                    ptr = builder.gep(xdata, [builder.add(xb, const(j * lanes))], inbounds=True)
                    xv.append(builder.load(builder.bitcast(ptr, vec.as_pointer()), align=4))
                for r in range(nr):
                    wptr = builder.gep(wdata, [builder.add(wb, const(r))], inbounds=True)
                    wv = broadcast(builder.load(wptr))
                    for j in range(nv):
                        slot = slots[r * nv + j]
                        builder.store(builder.call(fmuladd, [wv, xv[j], builder.load(slot)]),
                                      slot)  # fmt: skip

            for r in range(nr):
                with cgutils.if_likely(builder, builder.icmp_signed("<", const(r), used_v)):
                    bptr = builder.gep(bdata, [builder.add(bo_v, const(r))], inbounds=True)
                    epilogue = runtime_epilogue(builder, epi_v, builder.load(bptr))
                    row = builder.add(o_v, builder.mul(os_v, const(r)))
                    for j in range(nv):
                        v = epilogue(builder.load(slots[r * nv + j]))
                        ptr = builder.gep(odata, [builder.add(row, const(j * lanes))],
                                          inbounds=True)  # fmt: skip
                        builder.store(v, builder.bitcast(ptr, vec.as_pointer()), align=4)
            return context.get_dummy_value()

        i8 = types.int64
        e = epi if isinstance(epi, types.IntegerLiteral) else i8
        sig = types.void(rows, vecs, e, x, i8, i8, w, i8, i8, i8, out, i8, i8, bias, i8)
        return sig, codegen

    return rows_tile


#: the tile intrinsic and the take-next-unit function, bound before compiling (module
#: globals, not closure cells: Numba's cache keys a closure by its cells' pickled bytes,
#: which for these objects differ from one process to the next)
tile = take = None


def _units_py(R, B, LANES, EPI):
    """The units of a layer of tiles ``R x B`` (``LANES`` positions a vector) with the
    epilogue bits ``EPI`` (-1: those of the ``epi`` argument, chosen per row by selects):
    compile-time constants of the returned function, its only closure cells."""
    global tile, take
    tile, take = rows_tile(), tiled_jit.take_unit()

    def run(x, wp, out, bias, geom, epi, counter, me):
        # pragma: no cover - compiled
        # geom: G, OCg, K (input channels per group), L (positions a plane), NR (groups of R
        # output channels per group), NB (bands of a plane), TPB (tiles per band), then the
        # sample and channel strides of x and of out, in elements
        g_, ocg, k, l_, nr, nb, tpb = (geom[0], geom[1], geom[2], geom[3], geom[4], geom[5],
                                       geom[6])  # fmt: skip
        xn, xc, on, oc = geom[7], geom[8], geom[9], geom[10]
        npos = B * LANES
        nt = (l_ + npos - 1) // npos
        while True:
            u = take(counter, me)
            if u < 0:
                break
            j, g = u % nr, u // nr % g_  # the channel groups fastest
            band, n = u // (nr * g_) % nb, u // (nr * g_ * nb)
            o0 = j * R
            used = min(R, ocg - o0)
            c0 = g * ocg + o0
            x0 = n * xn + g * k * xc
            w0 = (g * nr + j) * k * R
            y0 = n * on + c0 * oc
            for q in range(band * tpb, min(nt, (band + 1) * tpb)):
                p0 = min(q * npos, l_ - npos)
                if EPI < 0:
                    tile(R, B, epi, x, x0 + p0, xc, wp, w0, k, used, out, y0 + p0, oc, bias, c0)
                else:
                    tile(R, B, EPI, x, x0 + p0, xc, wp, w0, k, used, out, y0 + p0, oc, bias, c0)

    return run


#: the epilogues compiled into a variant of their own (bias; bias and ReLU: the selects of
#: :func:`runtime_epilogue` for every activation were a sixth of a 58-channel layer's
#: vector operations); any other one takes the variant choosing per row
COMPILED_EPILOGUES = (1, 5)


def compiled_units(R: int, B: int, epi: int = -1):
    """The compiled units of tiles ``R x B`` (compiled on first use) for the epilogue bits
    ``epi`` (those of :data:`COMPILED_EPILOGUES` compiled in, any other the variant reading
    them at run time): ``units(x, wp, out, bias, geom, epi, counter, me)``, the flat
    read-only source (from its first element), packed filter and bias, the flat output, the
    int64 geometry (see the source), the epilogue bits, the units' counter
    (:func:`megbrain.kernels.tiled_jit.take_unit`) and the thread's index."""
    return _compiled_units(R, B, epi if epi in COMPILED_EPILOGUES else -1)


@functools.cache
def _compiled_units(R: int, B: int, EPI: int):
    lanes = tiled_jit.vector_width()
    fr = t.Array(t.float32, 1, "C", readonly=True)
    f1, ints = t.float32[::1], t.int64[::1]
    run = _units_py(R, B, lanes, EPI)
    # a name of its own per variant: Numba's cache keeps one index per name
    e = "any" if EPI < 0 else EPI
    run.__qualname__ = run.__name__ = f"pointwise_nchw_units_{R}x{B}_e{e}_v{lanes}"
    return tiled_jit.compile_tiled(run, [t.void(fr, fr, f1, fr, ints, t.int64, ints, t.int64)])
