"""Compiled (Numba) loop of the channel-wise (depthwise) NCHW88 convolution of
:mod:`..channelwise88`: any filter size, stride, padding and dilation, the ConvBias epilogue
applied while an output row's sums are in registers.

Single-threaded and GIL-free (``nogil``): each of a few Python threads runs the kernel on
one shared counter, taking units (a sample, a block of 8 channels and a band of output rows)
one at a time as they go (:func:`megbrain.kernels.tiled_jit.take_unit`). No allocation, no
scratch: the positions of a row whose taps are all inside the source go a tile at a time
straight from the source (:func:`_dw_tile`, the filter width a literal so that its columns
unroll), the few at a row's ends one at a time with the taps outside the source read from a
zero vector. Compiled on first use, one kernel per filter
width and tile shape (:func:`.tiled_jit.compile_tiled`).
"""

from __future__ import annotations

import functools

import numpy as np
from llvmlite import ir
from numba import types as t
from numba.core import cgutils, types
from numba.extending import intrinsic

from ... import tiled_jit
from .pointwise88 import silu8

# Numba's cache keys this file's kernels on its time stamp alone: a change to the
# activations of .pointwise88 they inline goes with an edit here (this line)
__all__ = [
    "CB",
    "ZEROS",
    "channelwise88",
    "kernel_key",
    "signature",
    "zeros",
]

#: channels of a block: the innermost dim of the source, filter and output
CB = 8
#: filter widths with kernels of their own (their columns unrolled: the networks' 3, 5 and
#: 7); the others take the kernel that loops over them, each kernel being seconds to compile
_UNROLLED = (3, 5, 7)
#: strides along rows with kernels of their own (with no dilation along rows)
_STRIDES = (1, 2)
#: output positions of an interior tile: that many independent vector sums hide the latency
#: of the multiply-adds
_TILE = 8
#: the vector read for a tap outside the source (a read-only array the caller passes)
ZEROS = np.zeros(CB, np.float32)
ZEROS.flags.writeable = False


@functools.cache
def _dw_tile():
    """The ``dw_tile(x, x0, sstep, cstep, rstep, a0, a1, w, w0, fw, out, o, z, bias, bo,
    epi, zero, c0, cols, positions, fwl, swl, guard, n, lanes, xh, oh)`` Numba intrinsic:
    output positions
    ``p < positions`` of a row, of which those ``p < n`` are stored, ``out[o + 8 p:][:8]`` =
    the epilogue of the sum over filter
    rows ``a`` in ``[a0, a1)`` and columns ``b < fw``, in that order, of ``w[w0 + (a fw + b)
    8:][:8]`` times ``x[x0 + a rstep + b cstep + p sstep:][:8]``: ``llvm.fmuladd`` (fused
    where the target has FMA) on vectors of 8, the accumulators in registers across the
    loops. The literal ``fwl`` is ``fw`` unrolled, or 0 for a loop over ``fw``; the literal
    ``swl``, nonzero, is the stride (``sstep`` = 8 ``swl``, ``cstep`` = 8), so that every
    offset is a constant. With ``guard`` (a bool), a tap whose source column ``c0 + (p sstep
    + b cstep) / 8`` is outside ``[0, cols)`` reads the zeros of ``zero`` instead; without
    it no index is checked (the caller keeps them in bounds); with two blocks (below) ``zero``
    holds ``xh + 8`` zeros. The epilogue, by the bits of
    ``epi``: 1 adds ``bias[bo:][:8]``, 2 adds ``z`` (out's layout), 4 ReLU (NaN kept), 8
    H_SWISH (as :func:`.nchw8c._hswish_py`), 16 ReLU6 (NaN kept).
    SiLU (bit 32) is the kernel's, on the row just stored (:func:`.pointwise88.silu8`).

    With the literal ``lanes`` 16 the tile computes two channel blocks at once in vectors of
    16 (where the target has AVX-512: twice the lanes a multiply-add, half the
    instructions): the second block's source and output (and ``z``) vectors are ``xh`` and
    ``oh`` elements after the first's, its filter vectors the upper 8 lanes of 16 (the
    filter packed in pairs, tap-major, ``w[w0 + (a fw + b) 16:][:16]``), its bias the 8
    values after the first's. Each lane's sum is the same sequence of fused multiply-adds
    as with 8 lanes, so the results are the same bits.
    """

    @intrinsic
    def dw_tile(typingctx, x, x0, sstep, cstep, rstep, a0, a1, w, w0, fw, out, o, z, bias, bo,
                epi, zero, c0, cols, positions, fwl, swl, guard, n, lanes, xh, oh):  # fmt: skip
        lits = (positions, fwl, swl, lanes)
        if not all(isinstance(v, types.IntegerLiteral) for v in lits):
            return None
        npos, nfw, nsw, nl = (v.literal_value for v in lits)
        two = nl == 2 * CB

        def codegen(context, builder, signature, args):
            (_, x0_v, ss_v, cs_v, rs_v, a0_v, a1_v, _, w0_v, fw_v, _, o_v, _, _, bo_v, epi_v,
             _, c0_v, cols_v) = args[:19]  # fmt: skip
            xh_v, oh_v = args[25], args[26]
            i64, vec8 = ir.IntType(64), ir.VectorType(ir.FloatType(), CB)
            vec = ir.VectorType(ir.FloatType(), nl)

            def const(v):
                return ir.Constant(i64, v)

            if nsw:
                ss_v, cs_v = const(nsw * CB), const(CB)

            def data(k):
                return context.make_array(signature.args[k])(context, builder, args[k]).data

            xdata, wdata, odata, zdata, bdata, zero_p = (data(k) for k in (0, 7, 10, 12, 13, 16))
            fmuladd = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vec, [vec] * 3), f"llvm.fmuladd.v{nl}f32"
            )

            def load(base, off):
                ptr = builder.gep(base, [off], inbounds=True)
                return builder.load(builder.bitcast(ptr, vec.as_pointer()), align=4)

            def load8(ptr):
                return builder.load(builder.bitcast(ptr, vec8.as_pointer()), align=4)

            def lanes_of(first, count):
                return ir.Constant(ir.VectorType(ir.IntType(32), count),
                                   list(range(first, first + count)))  # fmt: skip

            def joined(lo, hi):  # two vectors of 8 as one of 16
                return builder.shuffle_vector(lo, hi, lanes_of(0, 2 * CB))

            def halves(v):
                return tuple(builder.shuffle_vector(v, v, lanes_of(k * CB, CB)) for k in (0, 1))

            def load_blocks(base, off, other):
                """The vector at ``base + off`` (and, for two blocks, the one ``other``
                elements after it); ``base`` a pointer value."""
                if not two:
                    return load8(builder.gep(base, [off], inbounds=True))
                lo = load8(builder.gep(base, [off], inbounds=True))
                hi = load8(builder.gep(base, [builder.add(off, other)], inbounds=True))
                return joined(lo, hi)

            regs = cgutils.alloca_once(builder, ir.ArrayType(vec, npos))
            slots = [builder.gep(regs, [const(0), const(p)], inbounds=True) for p in range(npos)]
            for slot in slots:
                builder.store(ir.Constant(vec, None), slot)
            c08, cols8 = builder.mul(c0_v, const(CB)), builder.mul(cols_v, const(CB))

            def column(xa, wa, b, guarded):
                wv = load(wdata, builder.add(wa, builder.mul(b, const(nl))))
                xb = builder.add(xa, builder.mul(b, cs_v))
                for p, slot in enumerate(slots):
                    dp = builder.mul(ss_v, const(p))
                    off = builder.add(xb, dp)
                    if guarded:  # 8 times the tap's source column, against 8 cols unsigned
                        col = builder.add(builder.add(c08, builder.mul(b, cs_v)), dp)
                        inside = builder.icmp_unsigned("<", col, cols8)
                        ptr = builder.select(inside, builder.gep(xdata, [off]), zero_p)
                        xv = load8(ptr)
                        if two:  # zero holds xh + 8 zeros: one select for both blocks
                            xv = joined(xv, load8(builder.gep(ptr, [xh_v])))
                    else:
                        xv = load_blocks(xdata, off, xh_v)
                    builder.store(builder.call(fmuladd, [wv, xv, builder.load(slot)]), slot)

            def rows(guarded):
                with cgutils.for_range(builder, builder.sub(a1_v, a0_v), intp=i64) as a_loop:
                    a = builder.add(a0_v, a_loop.index)
                    xa = builder.add(x0_v, builder.mul(a, rs_v))
                    wa = builder.add(w0_v, builder.mul(builder.mul(a, fw_v), const(nl)))
                    if nfw:
                        for b in range(nfw):
                            column(xa, wa, const(b), guarded)
                    else:
                        with cgutils.for_range(builder, fw_v, intp=i64) as b_loop:
                            column(xa, wa, b_loop.index, guarded)

            guard_v = builder.icmp_unsigned("!=", args[22], ir.Constant(args[22].type, 0))
            with builder.if_else(guard_v) as (checked, unchecked):
                with checked:
                    rows(True)
                with unchecked:
                    rows(False)

            def bit(k):
                return builder.icmp_unsigned("!=", builder.and_(epi_v, const(k)), const(0))

            def each(fn):
                for p, slot in enumerate(slots):
                    builder.store(fn(p, builder.load(slot)), slot)

            def splat(v):
                return ir.Constant(vec, [v] * nl)

            zerov = splat(0.0)
            with builder.if_then(bit(1)):
                bv = load(bdata, bo_v)
                each(lambda p, v: builder.fadd(v, bv))
            stored = [builder.icmp_signed("<", const(p), args[23]) for p in range(npos)]

            def z_at(p):  # past n, the zeros: z ends where out does
                off = builder.add(o_v, const(p * CB))
                lo = builder.select(stored[p], builder.gep(zdata, [off], inbounds=True), zero_p)
                if not two:
                    return load8(lo)
                hi = builder.gep(zdata, [builder.add(off, oh_v)], inbounds=True)
                return joined(load8(lo), load8(builder.select(stored[p], hi, zero_p)))

            with builder.if_then(bit(2)):
                each(lambda p, v: builder.fadd(v, z_at(p)))
            with builder.if_then(bit(4)):  # not max(): NaN stays NaN
                each(lambda p, v: builder.select(builder.fcmp_ordered("<", v, zerov), zerov, v))
            with builder.if_then(bit(8)):

                def hswish(p, v):
                    r = builder.fadd(v, splat(3.0))
                    r = builder.select(builder.fcmp_ordered(">", r, zerov), r, zerov)
                    r = builder.select(builder.fcmp_ordered("<", r, splat(6.0)), r, splat(6.0))
                    return builder.fmul(builder.fmul(r, v), splat(1.0 / 6.0))

                each(hswish)
            with builder.if_then(bit(16)):  # ReLU6: MAX(0, x), MIN(6, x); NaN stays NaN
                six = splat(6.0)

                def relu6(p, v):
                    v = builder.select(builder.fcmp_ordered("<", v, zerov), zerov, v)
                    return builder.select(builder.fcmp_ordered(">", v, six), six, v)

                each(relu6)
            for p, slot in enumerate(slots):
                with builder.if_then(stored[p], likely=True):
                    off = builder.add(o_v, const(p * CB))
                    parts = halves(builder.load(slot)) if two else (builder.load(slot),)
                    for k, v in enumerate(parts):
                        at = builder.add(off, oh_v) if k else off
                        ptr = builder.gep(odata, [at], inbounds=True)
                        builder.store(v, builder.bitcast(ptr, vec8.as_pointer()), align=4)
            return context.get_dummy_value()

        i8 = types.int64
        sig = types.void(x, i8, i8, i8, i8, i8, i8, w, i8, i8, out, i8, z, bias, i8, i8, zero,
                         i8, i8, positions, fwl, swl, types.boolean, i8, lanes, i8,
                         i8)  # fmt: skip
        return sig, codegen

    return dw_tile


#: the compiled tile, unit taker and SiLU the kernels call: module globals, not closure cells
#: (Numba keys a cached closure by its cells' pickles, and a compiled function's differs in
#: every process, so each process compiled the kernels again)
_tile_g = _take_g = _silu_g = None


def _make_kernel(fwl: int, swl: int):
    """The loop over units for the filter width ``fwl`` and stride along rows ``swl`` with
    no dilation along rows (0, 0: any, looped over)."""
    global _tile_g, _take_g, _silu_g
    _tile_g, _take_g, _silu_g = _dw_tile(), tiled_jit.take_unit(), silu8()
    big, half, quarter = _TILE, _TILE // 2, _TILE // 4

    def kernel(x, w, out, z, bias, zero, dims, conv, epi, counter, me):
        """The units thread ``me`` takes from ``counter`` (:func:`.tiled_jit.take_unit`) of
        the flat C-contiguous NCHW88 ``out`` (N, CB_N, OH, OW, 8) = the
        channel-wise convolution of the flat C-contiguous ``x`` (N, CB_N, H, W, 8) with ``w``
        (CB_N, FH, FW, 8), or packed in pairs (PAIRS below), flipped already for CONVOLUTION
        mode, then ``+ bias[8 cb + c]`` (epi bit 1), ``+ z`` (bit 2, out's layout), ReLU
        (bit 4) or H_SWISH (bit 8), ReLU6 (bit 16) or SiLU (bit 32, on each row once its
        tiles are stored).

        dims: N, CB_N, H, W, OH, OW, FH, FW, ROWS (output rows a unit takes), BANDS (units
        per channel slot), PER (the (sample, channel slot) pairs of a unit: each unit costs
        an atomic on a cache line the threads share), PAIRS (1: a channel slot is two
        blocks, computed at once in vectors of 16, ``w`` packed in pairs as 16 lanes a tap
        with the odd last block as 8; 0: one block); conv: SH, SW, PH, PW, DH, DW. Filter
        rows outside the source are skipped, filter columns outside it read zeros; each
        output sums its taps in filter order (row-major), whichever tile computes it."""
        cbn, h_, w_, oh, ow = dims[1], dims[2], dims[3], dims[4], dims[5]
        fh, fw, rows, bands, per = dims[6], dims[7], dims[8], dims[9], dims[10]
        sh, sw, ph, pw, dh, dw = conv[0], conv[1], conv[2], conv[3], conv[4], conv[5]
        xrow = w_ * CB
        rstep, cstep, sstep = dh * xrow, dw * CB, sw * CB
        # positions [jl, jr) have every filter column inside the source
        jl = min(ow, (pw + sw - 1) // sw)
        jr = max(jl, min(ow, (w_ - 1 + pw - (fw - 1) * dw) // sw + 1))
        pairs = dims[11]
        slots = (cbn + 1) // 2 if pairs else cbn  # the units' channel slots of a sample
        xh, ohh = h_ * xrow, oh * ow * CB  # a block's elements in x, in out
        while True:
            u = _take_g(counter, me)
            if u < 0:
                return
            b0 = u // bands * per
            for slot in range(b0, min(dims[0] * slots, b0 + per)):
                cb = (slot % slots) * 2 if pairs else slot % slots
                two = pairs and cb + 1 < cbn
                blk = slot // slots * cbn + cb
                r0 = (u % bands) * rows
                r1 = min(oh, r0 + rows)
                wo = cb * fh * fw * CB  # pairs packed as 16 lanes, the odd last block as 8
                bo = cb * CB
                for i in range(r0, r1):
                    top = i * sh - ph  # the source row of filter row 0
                    a0 = 0 if top >= 0 else min(fh, (-top + dh - 1) // dh)
                    a1 = min(fh, (h_ - 1 - top) // dh + 1) if top <= h_ - 1 else 0
                    if a1 < a0:
                        a1 = a0
                    xr = (blk * h_ + top) * xrow - pw * CB  # row top, column -pw
                    orow = (blk * oh + i) * ow * CB
                    # tiles of `big` positions (`half` or `quarter` in a narrower row), the
                    # last one stored up to the row's end; a tile reaching past [jl, jr)
                    # checks its columns; two blocks at once in vectors of 16 lanes
                    if two:
                        if ow > half:
                            for jj in range(0, ow, big):
                                _tile_g(x, xr + jj * sstep, sstep, cstep, rstep, a0, a1, w, wo, fw,
                                     out, orow + jj * CB, z, bias, bo, epi, zero, jj * sw - pw,
                                     w_, big, fwl, swl, jj < jl or jj + big > jr, ow - jj, 16,
                                     xh, ohh)  # fmt: skip
                        elif ow > quarter:
                            _tile_g(x, xr, sstep, cstep, rstep, a0, a1, w, wo, fw, out, orow, z,
                                 bias, bo, epi, zero, -pw, w_, half, fwl, swl,
                                 jl > 0 or half > jr, ow, 16, xh, ohh)  # fmt: skip
                        else:
                            _tile_g(x, xr, sstep, cstep, rstep, a0, a1, w, wo, fw, out, orow, z,
                                 bias, bo, epi, zero, -pw, w_, quarter, fwl, swl,
                                 jl > 0 or quarter > jr, ow, 16, xh, ohh)  # fmt: skip
                    elif ow > half:
                        for jj in range(0, ow, big):
                            _tile_g(x, xr + jj * sstep, sstep, cstep, rstep, a0, a1, w, wo, fw, out,
                                 orow + jj * CB, z, bias, bo, epi, zero, jj * sw - pw, w_, big,
                                 fwl, swl, jj < jl or jj + big > jr, ow - jj, 8, 0,
                                 0)  # fmt: skip
                    elif ow > quarter:
                        _tile_g(x, xr, sstep, cstep, rstep, a0, a1, w, wo, fw, out, orow, z, bias,
                             bo, epi, zero, -pw, w_, half, fwl, swl, jl > 0 or half > jr,
                             ow, 8, 0, 0)  # fmt: skip
                    else:
                        _tile_g(x, xr, sstep, cstep, rstep, a0, a1, w, wo, fw, out, orow, z,
                                bias, bo, epi, zero, -pw, w_, quarter, fwl, swl,
                                jl > 0 or quarter > jr, ow, 8, 0, 0)  # fmt: skip
                    if epi & 32:  # SiLU on the row just stored (in L1), 8 channels a vector
                        for e in range(orow, orow + ow * CB, CB):
                            _silu_g(out, e)
                        if two:
                            for e in range(orow + ohh, orow + ohh + ow * CB, CB):
                                _silu_g(out, e)

    return kernel


def kernel_key(fw: int, sw: int, dw: int) -> tuple[int, int]:
    """The (unrolled filter width, stride) of the kernel computing a filter ``fw`` wide at
    stride ``sw`` and dilation ``dw`` along rows; (0, 0), the kernel of any, where they have
    none of their own."""
    if fw in _UNROLLED and sw in _STRIDES and dw == 1:
        return fw, sw
    return 0, 0


def channelwise88(key, x, w, out, z, bias, dims, conv, epi: int, counter, me: int,
                  zero: np.ndarray = ZEROS):  # fmt: skip
    """The call of the compiled kernel bound to its arguments (which the kernel pool can run as a C
    call, without the GIL) computing thread ``me``'s units of the channel-wise NCHW88
    convolution (the kernel of :func:`_make_kernel`) by the kernel of ``key``
    (:func:`kernel_key`), taken from ``counter`` (int64, a ``(next, end)`` pair per thread's
    range of units, :func:`megbrain.kernels.conv.nchw8c.units_as_they_go`) one at a time,
    its own range first: ``x``, ``w``, ``z`` and ``bias`` read-only float32 vectors, ``out``
    a writable one; ``zero`` read-only zeros, at least ``H W 8 + 8`` of them when ``dims``
    pairs the blocks (:func:`zeros`)."""
    return functools.partial(_compiled(key), x, w, out, z, bias, zero, dims, conv, int(epi),
                             counter, int(me))  # fmt: skip


def zeros(size: int) -> np.ndarray:
    """``size`` (at least 8) read-only float32 zeros for the kernel's taps outside the
    source: :data:`ZEROS`, or a fresh array (``np.zeros``: pages of the OS's zero page
    until written, and the kernel reads only its first and last 8)."""
    if size <= ZEROS.size:
        return ZEROS
    a = np.zeros(size, np.float32)
    a.flags.writeable = False
    return a


def signature():
    """The Numba signature of the kernels of :func:`_make_kernel`."""
    fr = t.Array(t.float32, 1, "C", readonly=True)
    f1, ints, i8 = t.float32[::1], t.int64[::1], t.int64
    return t.void(fr, fr, f1, fr, fr, fr, ints, ints, i8, ints, i8)


@functools.cache
def _compiled(key: tuple[int, int]):
    return tiled_jit.compile_tiled(_make_kernel(*key), [signature()])
