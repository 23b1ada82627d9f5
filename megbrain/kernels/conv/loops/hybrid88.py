"""Compiled (Numba) loops of the hybrid NCHW88 convolution (:mod:`..hybrid88`): a network's
first layer, an NCHW source of at most 8 channels, written straight into the NCHW88 output
with the ConvBias epilogue.

A unit is a sample and a band of output rows. It first copies the source rows its band reads
into zero-padded phase planes of one channel (its thread's scratch), one plane per input
channel and stride phase, so that every filter tap of a row of output positions is a
stride-1 read at a fixed offset; then, per group of ``B`` blocks of 16 output channels and
output row, tiles of ``R`` consecutive positions keep their ``R B`` accumulator vectors in
registers over the whole reduction (input channels, then filter rows, then filter columns,
in that order, whoever computes it), apply bias, ``z`` and the activation to the registers
and store each vector as two blocks of 8 channels of the output (:func:`stem_tile`). A
row's last tile starts ``R`` positions before its end and stores only the positions not
stored yet. Threads take the units as they go (:func:`megbrain.kernels.tiled_jit.take_unit`).
No allocation; compiled on first use, per tile shape.
"""

from __future__ import annotations

import functools

import numpy as np
from llvmlite import ir
from numba import types as t
from numba.core import cgutils
from numba.extending import intrinsic

from ... import tiled_jit
from .pointwise88 import ACTIVATIONS, activate

__all__ = ["BLOCK", "CB", "DIMS", "band_planes", "compiled_units", "deinterleave",
           "phase_columns", "scratch_size", "stem_tile", "tap_offsets"]  # fmt: skip

#: channels of a block of the output (its innermost dim)
CB = 8
#: output channels of a filter vector (a tile's column)
BLOCK = 16
#: the fields of the int64 geometry the units read, in order
DIMS = ("N", "IC", "H", "W", "OC8", "OH", "OW", "ROWS", "BANDS", "HQ", "WQ", "NG", "HALF",
        "SH", "SW", "PH", "PW", "SCRATCH", "COLUMNS")  # fmt: skip


@functools.cache
def stem_tile():
    """The ``stem_tile(R, B, half, xp, x0, cstride, icn, taps, wp, w0, out, o0, ohw8, z,
    bias, b0, skip, epi)`` Numba intrinsic: one tile (the module's docstring). Literals
    ``R``, ``B`` and ``half`` (the last block's upper 8 channels are padding); position
    ``p`` adds, for input channel ``ic < icn`` and tap ``k``, ``xp[x0 + ic cstride +
    taps[k] + p]`` times the filter vectors ``wp[w0 + ((ic len(taps) + k) B + b) 16:]``;
    then, by the run-time epilogue bits ``epi`` (1 bias, 2 ``z``, 4 ReLU, 8 H_SWISH, 16
    ReLU6), ``+ bias[b0 + 16 b:]``, ``+ z`` (laid out as ``out``) and the activation; it
    writes ``out[o0 + (2 b + h) ohw8 + 8 p:][:8]`` for positions ``p >= skip``. No index
    is checked."""

    @intrinsic
    def stem_tile(typingctx, npos, nblk, half, xp, x0, cstride, icn, taps, wp, w0, out, o0,
                  ohw8, z, bias, b0, skip, epi):  # fmt: skip
        literals = (npos, nblk, half)
        if not all(isinstance(v, t.IntegerLiteral) for v in literals):
            return None
        R, B, hf = (v.literal_value for v in literals)

        def codegen(context, builder, signature, args):
            (_, _, _, xp_v, x0_v, cs_v, icn_v, taps_v, wp_v, w0_v, out_v, o0_v, ohw8_v, z_v,
             bias_v, b0_v, skip_v, epi_v) = args  # fmt: skip
            i64, f32, i32 = ir.IntType(64), ir.FloatType(), ir.IntType(32)
            vec, half_vec = ir.VectorType(f32, BLOCK), ir.VectorType(f32, CB)

            def const(v):
                return ir.Constant(i64, v)

            def array(k):
                return context.make_array(signature.args[k])(context, builder, args[k])

            xdata, wdata, odata = array(3).data, array(8).data, array(10).data
            zdata, bdata, tarr = array(13).data, array(14).data, array(7)
            ntaps = builder.extract_value(tarr.shape, 0)
            fmuladd = tiled_jit.vector_fmas(builder, vec)
            slots = tiled_jit.zeroed_slots(builder, vec, R * B)
            undef = ir.Constant(vec, ir.Undefined)
            splat = ir.Constant(ir.VectorType(i32, BLOCK), None)

            def load(data, off, ty):
                ptr = builder.gep(data, [off], inbounds=True)
                return builder.load(builder.bitcast(ptr, ty.as_pointer()), align=4)

            with cgutils.for_range(builder, icn_v, intp=i64) as ic_loop:
                ic = ic_loop.index
                xb = builder.add(x0_v, builder.mul(ic, cs_v))
                wrow = builder.mul(ic, ntaps)
                with cgutils.for_range(builder, ntaps, intp=i64) as k_loop:
                    k = k_loop.index
                    xt = builder.add(xb, builder.load(builder.gep(tarr.data, [k])))
                    wt = builder.add(w0_v, builder.mul(builder.add(wrow, k), const(B * BLOCK)))
                    ws = [load(wdata, builder.add(wt, const(b * BLOCK)), vec) for b in range(B)]
                    for p in range(R):
                        xptr = builder.gep(xdata, [builder.add(xt, const(p))], inbounds=True)
                        one = builder.insert_element(undef, builder.load(xptr), const(0))
                        xv = builder.shuffle_vector(one, undef, splat)
                        for b in range(B):
                            s = slots[p * B + b]
                            builder.store(builder.call(fmuladd, [xv, ws[b], builder.load(s)]), s)

            def mask(idx):
                return ir.Constant(ir.VectorType(i32, len(idx)), [ir.Constant(i32, m)
                                                                  for m in idx])  # fmt: skip

            lo, hi, both = mask(range(CB)), mask(range(CB, BLOCK)), mask(range(BLOCK))
            hundef = ir.Constant(half_vec, ir.Undefined)
            halves_of = [1 if hf and b == B - 1 else 2 for b in range(B)]

            def load16(data, off, halves, stride):
                parts = [load(data, builder.add(off, builder.mul(stride, const(h))), half_vec)
                         for h in range(halves)]  # fmt: skip
                return builder.shuffle_vector(parts[0], parts[1] if halves == 2 else hundef,
                                              both)  # fmt: skip

            def offset(p, b):  # of position p, block b's first half in out and z
                return builder.add(o0_v, builder.add(builder.mul(ohw8_v, const(2 * b)),
                                                     const(p * CB)))  # fmt: skip

            def when(bit):
                return builder.if_then(builder.icmp_unsigned(
                    "!=", builder.and_(epi_v, const(bit)), const(0)))  # fmt: skip

            with when(1):
                for b in range(B):
                    bv = load16(bdata, builder.add(b0_v, const(b * BLOCK)), halves_of[b],
                                const(CB))  # fmt: skip
                    for p in range(R):
                        s = slots[p * B + b]
                        builder.store(builder.fadd(builder.load(s), bv), s)
            with when(2):
                for p in range(R):
                    for b in range(B):
                        s = slots[p * B + b]
                        zv = load16(zdata, offset(p, b), halves_of[b], ohw8_v)
                        builder.store(builder.fadd(builder.load(s), zv), s)
            for bit in ACTIVATIONS:
                with when(bit):
                    for s in slots:
                        builder.store(activate(builder, builder.load(s), bit), s)
            for p in range(R):
                with builder.if_then(builder.icmp_signed("<=", skip_v, const(p)), likely=True):
                    for b in range(B):
                        v, off = builder.load(slots[p * B + b]), offset(p, b)
                        for h in range(halves_of[b]):
                            part = builder.shuffle_vector(v, undef, lo if h == 0 else hi)
                            ptr = builder.gep(odata, [builder.add(off, builder.mul(
                                ohw8_v, const(h)))], inbounds=True)  # fmt: skip
                            builder.store(part, builder.bitcast(ptr, half_vec.as_pointer()),
                                          align=4)  # fmt: skip
            return context.get_dummy_value()

        sig = t.void(npos, nblk, half, xp, x0, cstride, icn, taps, wp, w0, out, o0, ohw8, z,
                     bias, b0, skip, epi)  # fmt: skip
        return sig, codegen

    return stem_tile


@functools.cache
def deinterleave():
    """The ``deinterleave(S, x, s, xp, d, dstep, n)`` Numba intrinsic: for the literal ``S``
    (2 or 4) and ``k < n`` (a multiple of 16), ``xp[d + phi dstep + k] = x[s + S k + phi]``
    for each phase ``phi < S``: ``S`` vector loads and ``S`` shuffles per 16 values of a
    phase, where the compiler's own loop made a gather of each phase. No index is
    checked."""

    @intrinsic
    def deinterleave(typingctx, stride, x, s, xp, d, dstep, n):
        if not isinstance(stride, t.IntegerLiteral) or stride.literal_value not in (2, 4):
            return None
        S = stride.literal_value

        def codegen(context, builder, signature, args):
            _, x_v, s_v, xp_v, d_v, ds_v, n_v = args
            i64, i32, f32 = ir.IntType(64), ir.IntType(32), ir.FloatType()
            vec, wide = ir.VectorType(f32, BLOCK), ir.VectorType(f32, BLOCK * S)

            def const(v):
                return ir.Constant(i64, v)

            xdata = context.make_array(signature.args[1])(context, builder, x_v).data
            odata = context.make_array(signature.args[3])(context, builder, xp_v).data
            count = builder.udiv(n_v, const(BLOCK))
            with cgutils.for_range(builder, count, intp=i64) as loop:
                k = builder.mul(loop.index, const(BLOCK))
                src = builder.gep(xdata, [builder.add(s_v, builder.mul(k, const(S)))],
                                  inbounds=True)  # fmt: skip
                values = builder.load(builder.bitcast(src, wide.as_pointer()), align=4)
                for phi in range(S):
                    idx = ir.Constant(ir.VectorType(i32, BLOCK),
                                      [ir.Constant(i32, S * j + phi) for j in range(BLOCK)])
                    part = builder.shuffle_vector(values, ir.Constant(wide, ir.Undefined), idx)
                    off = builder.add(builder.add(d_v, builder.mul(ds_v, const(phi))), k)
                    dst = builder.gep(odata, [off], inbounds=True)
                    builder.store(part, builder.bitcast(dst, vec.as_pointer()), align=4)
            return context.get_dummy_value()

        return t.void(stride, x, s, xp, d, dstep, n), codegen

    return deinterleave


def _pack_band_py(x, xp, dims, n, r0):
    # pragma: no cover - compiled
    # the phase planes of sample n's band starting at output row r0: plane (ic, rho, phi)
    # holds source value x[n, ic, SH (r0 + r) + rho - PH, SW k + phi - PW] at (r, k), zero
    # outside the source; rows of a plane are WQ positions, a plane HQ rows
    ic_n, h_, w_, hq, wq = dims[1], dims[2], dims[3], dims[9], dims[10]
    sh, sw, ph, pw = dims[13], dims[14], dims[15], dims[16]
    phase = hq * wq
    for ic in range(ic_n):
        for rho in range(sh):
            for r in range(hq):
                sr = sh * (r0 + r) + rho - ph
                d = (ic * sh + rho) * sw * phase + r * wq  # phase 0's row; phase phi's + phi phase
                if sr < 0 or sr >= h_:
                    for phi in range(sw):
                        for k in range(wq):
                            xp[np.uintp(d + phi * phase + k)] = np.float32(0.0)
                    continue
                row = ((n * ic_n + ic) * h_ + sr) * w_ - pw  # source column -PW
                # phase phi's columns [K0, K1) are in the source, zeros outside; [C0, C1)
                # those of every phase
                c0, c1 = dims[18], dims[19]
                for phi in range(sw):
                    k0, k1 = dims[20 + 2 * phi], dims[21 + 2 * phi]
                    for k in range(k0):
                        xp[np.uintp(d + phi * phase + k)] = np.float32(0.0)
                    for k in range(k1, wq):
                        xp[np.uintp(d + phi * phase + k)] = np.float32(0.0)
                nv = (c1 - c0) // BLOCK * BLOCK if sw == 2 or sw == 4 else 0
                if sw == 2:
                    split(2, x, row + 2 * c0, xp, d + c0, phase, nv)
                elif sw == 4:
                    split(4, x, row + 4 * c0, xp, d + c0, phase, nv)
                for phi in range(sw):
                    k0, k1 = dims[20 + 2 * phi], dims[21 + 2 * phi]
                    dp, sp = d + phi * phase, row + phi
                    for k in range(k0, min(c0, k1)):
                        xp[np.uintp(dp + k)] = x[np.uintp(sp + sw * k)]
                    for k in range(max(c0 + nv, k0), k1):
                        xp[np.uintp(dp + k)] = x[np.uintp(sp + sw * k)]


def phase_columns(w: int, wq: int, sw: int, pw: int) -> list[int]:
    """``[C0, C1, K0(0), K1(0), K0(1), ...]``: the columns ``[K0, K1)`` of each phase of
    stride ``sw`` that lie in a source ``w`` wide padded by ``pw`` (phase planes ``wq``
    wide), and ``[C0, C1)`` those of every phase (``C1 >= C0``)."""
    ranges = []
    for phi in range(sw):
        k0 = min(wq, max(0, -(-(pw - phi) // sw)))
        ranges += [k0, min(wq, max(k0, (w - 1 + pw - phi) // sw + 1))]
    c0 = max(ranges[0::2])
    return [c0, max(c0, min(ranges[1::2])), *ranges]


def band_planes(rows: int, w: int, fshape, stride, pad, dilate) -> tuple[int, int]:
    """``(HQ, WQ)``: the rows and columns of the phase planes of a band of ``rows`` output
    rows, for a source ``w`` positions wide; ``WQ`` a multiple of 16, so that a plane's
    rows are 64-byte aligned in an aligned scratch (a stride-2 source split into misaligned
    rows took twice as long)."""
    hq = rows + (fshape[0] - 1) * dilate[0] // stride[0]
    wq = -(-(w + 2 * pad[1]) // stride[1])
    return hq, -(-wq // BLOCK) * BLOCK


def scratch_size(ic: int, hq: int, wq: int, stride) -> int:
    """The float32 values of a unit's phase planes."""
    return ic * stride[0] * stride[1] * hq * wq


def tap_offsets(hq: int, wq: int, fshape, stride, dilate) -> np.ndarray:
    """The plane offsets (positions) of the filter taps, row-major: tap ``(a, b)`` reads
    phase ``(a DH % SH, b DW % SW)`` ``a DH // SH`` rows and ``b DW // SW`` columns on."""
    (sh, sw), (dh, dw) = stride, dilate
    phase = hq * wq
    return np.array([((a * dh % sh) * sw + b * dw % sw) * phase + a * dh // sh * wq
                     + b * dw // sw for a in range(fshape[0]) for b in range(fshape[1])],
                    np.int64)  # fmt: skip


#: the tile intrinsic, the band packer and the take-next-unit function, bound before
#: compiling (module globals, not closure cells: Numba's cache keys a closure by its cells'
#: pickled bytes, which for these objects differ from one process to the next)
tile = take = pack = split = None


def _units_py(R, B):
    """The units of a layer of tiles ``R x B`` (compile-time constants of the returned
    function, its only closure cells)."""
    global tile, take, pack, split
    tile, take, split = stem_tile(), tiled_jit.take_unit(), deinterleave()
    pack = tiled_jit.compile_tiled(_pack_band_py, [t.void(
        t.Array(t.float32, 1, "C", readonly=True), t.float32[::1], t.int64[::1], t.int64,
        t.int64)])  # fmt: skip

    def run(x, wp, out, z, bias, scratch, taps, dims, epi, counter, me):
        # pragma: no cover - compiled
        ic_n, oc8, oh, ow, rows, bands = dims[1], dims[4], dims[5], dims[6], dims[7], dims[8]
        hq, wq, ng, hf, size = dims[9], dims[10], dims[11], dims[12] != 0, dims[17]
        cs = dims[13] * dims[14] * hq * wq
        ohw8 = oh * ow * CB
        wgroup = ic_n * taps.size * (B * BLOCK)
        xp = scratch[me * size : (me + 1) * size]
        nt = (ow + R - 1) // R
        while True:
            u = take(counter, me)
            if u < 0:
                break
            n = u // bands
            r0 = (u % bands) * rows
            r1 = min(oh, r0 + rows)
            pack(x, xp, dims, n, r0)
            for g in range(ng):
                w0 = g * wgroup
                b0 = g * B * BLOCK
                last = hf and g == ng - 1
                for i in range(r0, r1):
                    q = (i - r0) * wq
                    o = ((n * oc8 + 2 * g * B) * oh + i) * ow * CB
                    for k in range(nt):
                        j = min(k * R, ow - R)
                        skip = k * R - j
                        if last:
                            tile(R, B, 1, xp, q + j, cs, ic_n, taps, wp, w0, out, o + j * CB,
                                 ohw8, z, bias, b0, skip, epi)  # fmt: skip
                        else:
                            tile(R, B, 0, xp, q + j, cs, ic_n, taps, wp, w0, out, o + j * CB,
                                 ohw8, z, bias, b0, skip, epi)  # fmt: skip

    return run


@functools.cache
def compiled_units(R: int, B: int):
    """The compiled units of tiles ``R x B`` (compiled on first use): ``units(x, wp, out,
    z, bias, scratch, taps, dims, epi, counter, me)``, the flat read-only source, packed
    filter ``(NG, IC, FH, FW, B, 16)``, ``z`` (laid out as ``out``) and bias, the flat
    output, the threads' scratch (``SCRATCH`` values each), the taps' plane offsets
    (:func:`tap_offsets`), the int64 geometry (:data:`DIMS`), the epilogue bits, the units'
    counter (:func:`megbrain.kernels.tiled_jit.take_unit`) and the thread's index."""
    fr = t.Array(t.float32, 1, "C", readonly=True)
    f1, ints, i8 = t.float32[::1], t.int64[::1], t.int64
    run = _units_py(R, B)
    # a name of its own per variant: Numba's cache keeps one index per name
    run.__qualname__ = run.__name__ = f"hybrid88_units_{R}x{B}"
    return tiled_jit.compile_tiled(run, [t.void(fr, fr, f1, fr, fr, f1, ints, ints, i8, ints,
                                                i8)])  # fmt: skip
