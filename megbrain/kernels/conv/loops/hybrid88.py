"""Compiled (Numba) loops of the hybrid NCHW88 convolution (:mod:`..hybrid88`): a network's
first layer, an NCHW source of at most 8 channels, written straight into the NCHW88 output
with the ConvBias epilogue.

A unit is a sample and a band of output rows. Per output row, tiles of ``R`` consecutive
positions by ``B`` blocks of 16 output channels keep their ``R B`` accumulator vectors in
registers over the whole reduction (input channels, then filter rows, then filter columns,
in that order, whoever computes it), apply bias, ``z`` and the activation to the registers
and store each vector as two blocks of 8 channels of the output (:func:`stem_tile`). Each
source value is broadcast to a vector on its own, so a tile reads the source where it lies,
``S`` values apart at stride ``S``; only a tile whose window leaves the source (the padding
at the edges) reads a zero-padded copy of its window from its thread's scratch (of the
whole row where the window's rows leave the source). A row's last tile starts ``R``
positions before its end and stores only the positions not stored yet. Threads take the
units as they go (:func:`megbrain.kernels.tiled_jit.take_unit`).
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

# Numba's cache keys this file's kernels on its time stamp alone: a change to the
# activations of .pointwise88 they inline goes with an edit here (this line)
__all__ = ["BLOCK", "CB", "DIMS", "compiled_units", "scratch_pitch", "stem_tile",
           "tap_offsets"]  # fmt: skip

#: channels of a block of the output (its innermost dim)
CB = 8
#: output channels of a filter vector (a tile's column)
BLOCK = 16
#: the fields of the int64 geometry the units read, in order
DIMS = ("N", "IC", "H", "W", "OC8", "OH", "OW", "ROWS", "BANDS", "NG", "HALF", "SH", "SW",
        "PH", "PW", "DH", "DW", "FH", "FW", "PITCH", "SCRATCH")  # fmt: skip


@functools.cache
def stem_tile():
    """The ``stem_tile(R, B, half, S, xp, x0, cstride, icn, taps, wp, w0, out, o0, ohw8, z,
    bias, b0, skip, epi)`` Numba intrinsic: one tile (the module's docstring). Literals
    ``R``, ``B``, ``half`` (the last block's upper 8 channels are padding) and ``S``;
    position ``p`` adds, for input channel ``ic < icn`` and tap ``k``, ``xp[x0 + ic cstride
    + taps[k] + S p]`` times the filter vectors ``wp[w0 + ((ic len(taps) + k) B + b) 16:]``;
    then, by the run-time epilogue bits ``epi`` (1 bias, 2 ``z``, 4 ReLU, 8 H_SWISH, 16
    ReLU6), ``+ bias[b0 + 16 b:]``, ``+ z`` (laid out as ``out``) and the activation; it
    writes ``out[o0 + (2 b + h) ohw8 + 8 p:][:8]`` for positions ``p >= skip``. No index
    is checked."""

    @intrinsic
    def stem_tile(typingctx, npos, nblk, half, step, xp, x0, cstride, icn, taps, wp, w0, out,
                  o0, ohw8, z, bias, b0, skip, epi):  # fmt: skip
        literals = (npos, nblk, half, step)
        if not all(isinstance(v, t.IntegerLiteral) for v in literals):
            return None
        R, B, hf, S = (v.literal_value for v in literals)

        def codegen(context, builder, signature, args):
            (_, _, _, _, xp_v, x0_v, cs_v, icn_v, taps_v, wp_v, w0_v, out_v, o0_v, ohw8_v, z_v,
             bias_v, b0_v, skip_v, epi_v) = args  # fmt: skip
            i64, f32, i32 = ir.IntType(64), ir.FloatType(), ir.IntType(32)
            vec, half_vec = ir.VectorType(f32, BLOCK), ir.VectorType(f32, CB)

            def const(v):
                return ir.Constant(i64, v)

            def array(k):
                return context.make_array(signature.args[k])(context, builder, args[k])

            xdata, wdata, odata = array(4).data, array(9).data, array(11).data
            zdata, bdata, tarr = array(14).data, array(15).data, array(8)
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
                        xptr = builder.gep(xdata, [builder.add(xt, const(p * S))], inbounds=True)
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

        sig = t.void(npos, nblk, half, step, xp, x0, cstride, icn, taps, wp, w0, out, o0, ohw8,
                     z, bias, b0, skip, epi)  # fmt: skip
        return sig, codegen

    return stem_tile


def _fill_py(x, sc, xb, top, c0, ncols, dims):
    # pragma: no cover - compiled
    # rows (ic, ky) of the scratch, PITCH values apart: source row top + ky DH of channel
    # ic of the sample at xb, columns c0 .. c0 + ncols - 1, zeros outside the source
    ic_n, h_, w_, fh, dh, pitch = dims[1], dims[2], dims[3], dims[17], dims[15], dims[19]
    lo = min(ncols, max(0, -c0))
    hi = max(lo, min(ncols, w_ - c0))
    for ic in range(ic_n):
        for ky in range(fh):
            sr = top + ky * dh
            d = (ic * fh + ky) * pitch
            if sr < 0 or sr >= h_:
                for q in range(ncols):
                    sc[np.uintp(d + q)] = np.float32(0.0)
                continue
            row = xb + (ic * h_ + sr) * w_ + c0
            for q in range(lo):
                sc[np.uintp(d + q)] = np.float32(0.0)
            for q in range(lo, hi):
                sc[np.uintp(d + q)] = x[np.uintp(row + q)]
            for q in range(hi, ncols):
                sc[np.uintp(d + q)] = np.float32(0.0)


def scratch_pitch(ow: int, fw: int, sw: int, dw: int) -> int:
    """Values a scratch row holds: the source columns of a whole output row ``ow``
    positions long (filter ``fw`` wide, stride ``sw``, dilation ``dw``), which also holds
    those of any one tile."""
    return sw * (ow - 1) + (fw - 1) * dw + 1


def tap_offsets(w: int, pitch: int, fshape, dilate) -> np.ndarray:
    """The filter taps' offsets, row-major: in the source (rows ``w`` values apart), then in
    the scratch (rows ``pitch`` apart, one per filter row)."""
    (fh, fw), (dh, dw) = fshape, dilate
    return np.array([a * dh * w + b * dw for a in range(fh) for b in range(fw)]
                    + [a * pitch + b * dw for a in range(fh) for b in range(fw)],
                    np.int64)  # fmt: skip


#: the tile intrinsic, the scratch filler and the take-next-unit function, bound before
#: compiling (module globals, not closure cells: Numba's cache keys a closure by its cells'
#: pickled bytes, which for these objects differ from one process to the next)
tile = take = fill = None


def _units_py(R, B, S):
    """The units of a layer of tiles ``R x B`` at stride ``S`` along the rows (compile-time
    constants of the returned function, its only closure cells)."""
    global tile, take, fill
    tile, take = stem_tile(), tiled_jit.take_unit()
    fill = tiled_jit.compile_tiled(_fill_py, [t.void(
        t.Array(t.float32, 1, "C", readonly=True), t.float32[::1], t.int64, t.int64, t.int64,
        t.int64, t.int64[::1])])  # fmt: skip

    def run(x, wp, out, z, bias, scratch, scr, taps, dims, epi, counter, me):
        # pragma: no cover - compiled
        ic_n, h_, w_, oc8, oh, ow = dims[1], dims[2], dims[3], dims[4], dims[5], dims[6]
        rows, bands, ng, hf = dims[7], dims[8], dims[9], dims[10] != 0
        sh, ph, pw, dh, dw = dims[11], dims[13], dims[14], dims[15], dims[16]
        fh, fw, pitch, size = dims[17], dims[18], dims[19], dims[20]
        nk = fh * fw
        t_in, t_sc = taps[:nk], taps[nk:]
        cs_in, cs_sc = h_ * w_, fh * pitch
        ohw8 = oh * ow * CB
        wgroup = ic_n * nk * (B * BLOCK)
        sc = scratch[me * size : (me + 1) * size]  # written here, read through scr
        s0 = me * size
        span = S * (R - 1) + (fw - 1) * dw + 1  # source columns a tile reads
        whole = S * (ow - 1) + (fw - 1) * dw + 1  # those of a row
        nt = (ow + R - 1) // R
        while True:
            u = take(counter, me)
            if u < 0:
                break
            n = u // bands
            r0 = (u % bands) * rows
            r1 = min(oh, r0 + rows)
            xb = n * ic_n * h_ * w_
            for i in range(r0, r1):
                top = sh * i - ph
                edge_row = top < 0 or top + (fh - 1) * dh >= h_
                if edge_row:  # the row's source, padded, in the scratch
                    fill(x, sc, xb, top, -pw, whole, dims)
                o = (n * oc8 * oh + i) * ow * CB
                for k in range(nt):
                    j = min(k * R, ow - R)
                    skip = k * R - j
                    c0 = S * j - pw
                    inside = not edge_row and c0 >= 0 and c0 + span <= w_
                    if not inside and not edge_row:  # the tile's source, padded
                        fill(x, sc, xb, top, c0, span, dims)
                    for g in range(ng):
                        w0 = g * wgroup
                        b0 = g * B * BLOCK
                        og = o + (2 * g * B * oh * ow + j) * CB
                        last = hf and g == ng - 1
                        if inside:
                            src, x0, cs, tp = x, xb + top * w_ + c0, cs_in, t_in
                        else:
                            src, x0, cs, tp = scr, s0 + (S * j if edge_row else 0), cs_sc, t_sc
                        if last:
                            tile(R, B, 1, S, src, x0, cs, ic_n, tp, wp, w0, out, og, ohw8, z,
                                 bias, b0, skip, epi)  # fmt: skip
                        else:
                            tile(R, B, 0, S, src, x0, cs, ic_n, tp, wp, w0, out, og, ohw8, z,
                                 bias, b0, skip, epi)  # fmt: skip

    return run


@functools.cache
def compiled_units(R: int, B: int, S: int):
    """The compiled units of tiles ``R x B`` at stride ``S`` along the rows (compiled on
    first use): ``units(x, wp, out, z, bias, scratch, scr, taps, dims, epi, counter, me)``,
    the flat read-only source, packed filter ``(NG, IC, FH, FW, B, 16)``, ``z`` (laid out as
    ``out``) and bias, the flat output, the threads' scratch (``SCRATCH`` values each) and a
    read-only view of it, the taps' offsets (:func:`tap_offsets`), the int64 geometry
    (:data:`DIMS`), the epilogue bits, the units' counter
    (:func:`megbrain.kernels.tiled_jit.take_unit`) and the thread's index."""
    fr = t.Array(t.float32, 1, "C", readonly=True)
    f1, ints, i8 = t.float32[::1], t.int64[::1], t.int64
    run = _units_py(R, B, S)
    # a name of its own per variant: Numba's cache keeps one index per name
    run.__qualname__ = run.__name__ = f"hybrid88_units_{R}x{B}s{S}"
    return tiled_jit.compile_tiled(run, [t.void(fr, fr, f1, fr, fr, f1, fr, ints, ints, i8,
                                                ints, i8)])  # fmt: skip
