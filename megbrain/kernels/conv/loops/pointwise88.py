"""Compiled loops of POINTWISE_NCHW88 (:mod:`..pointwise88`): the 1x1, stride-1 NCHW88
convolution as register tiles whose whole reduction and epilogue stay in registers.

Layouts (float32, flat C-contiguous):

- source ``(N, C/8, H W, 8)``, read in place: per block of 8 input channels a contiguous run
  of positions;
- packed filter ``(NG, K, B, 16)``: output channels padded to a multiple of 16, cut into
  ``NG`` groups of ``B`` blocks of 16; a tile's ``B`` filter vectors of one input channel
  are contiguous, and a group's whole filter is one stream;
- output (and ``z``) ``(N, OC/8, H W, 8)``.

A tile is ``R`` consecutive positions by ``B`` blocks of 16 output channels (``R B``
accumulator vectors, at most 24 of AVX-512's 32 registers): per input channel ``B`` filter
vectors and one broadcast of the source per position, ``R B`` fused multiply-adds, summed
over the input channel blocks and the 8 channels of a block in that order (the order of
:func:`megbrain.kernels.tiled_jit.fma_tile`: the sums equal DIRECT_NCHW88's bit for bit).
The epilogue (bias, ``z``, activation) is applied to the registers and each vector stored as
two blocks of 8 channels of the output. A plane's last partial tile starts ``R`` positions
before the plane's end and stores only the positions not stored yet (it may read ``z`` at
positions already written when the output shares ``z``'s memory: those sums are dropped).
A block of 16 that is half padding (``OC % 16 == 8``) is computed, loaded and stored in
vectors of 8 lanes: its padding costs no multiply-adds.
"""

from __future__ import annotations

import functools

import numpy as np
from llvmlite import ir
from numba import types as t
from numba.core import cgutils
from numba.extending import intrinsic

from ... import tiled_jit

__all__ = ["ACTIVATIONS", "BLOCK", "CB", "GATE", "PREACT", "SILU_EXP_POLY", "activate",
           "compiled_units",
           "filter_packer", "silu8", "units"]

#: output channels of a filter vector (a tile's column)
BLOCK = 16
#: channels of a source or output block
CB = 8
#: the bit of ``epi`` scaling the source's channels by a gate per sample (the
#: squeeze-and-excitation multiply folded in: each filter vector by its input channel's gate)
GATE = 64
#: the bit of ``epi`` reading the source through ``relu(x scale + shift)`` per input channel
#: (the pre-activation BatchNorm and ReLU of a DenseNet layer folded in: ``gate`` holds the
#: scales, ``shift`` the shifts, for every sample)
PREACT = 128


def _relu(builder, v, const):
    zero = ir.Constant(v.type, None)  # v < 0 is false for NaN: NaN stays NaN
    return builder.select(builder.fcmp_ordered("<", v, zero), zero, v)


def _hswish(builder, v, const):
    # min(max(v + 3, 0), 6) v / 6 in that order; w > 0 is false for NaN: w = 0, 0 v is NaN
    zero = ir.Constant(v.type, None)
    w = builder.fadd(v, const(3.0))
    w = builder.select(builder.fcmp_ordered(">", w, zero), w, zero)
    w = builder.select(builder.fcmp_ordered("<", w, const(6.0)), w, const(6.0))
    return builder.fmul(builder.fmul(w, v), const(float(np.float32(1 / 6))))


def _relu6(builder, v, const):
    # as the JIT's MIN(6, MAX(0, v)): both comparisons false for NaN, which stays NaN
    v = _relu(builder, v, const)
    return builder.select(builder.fcmp_ordered(">", v, const(6.0)), const(6.0), v)


#: exp(r) ~ 1 + r (c1 + r (c2 + ... c5 r)) on |r| <= ln2 / 2 (:func:`_silu`): the minimax
#: polynomial of degree 5 for the relative error (9.3e-8; the JIT's exp takes degree 7)
SILU_EXP_POLY = (0.9999997036702879, 0.49999142755120685, 0.16667643945752364,
                 0.041898851533313415, 0.00829014401268782)  # fmt: skip
#: ``1.5 2^23 + 127``: ``x + SHIFTER`` rounds ``x`` to an integer ``n`` held in the low bits
#: of its float, biased by 127 (the exponent field of ``2^n`` once shifted by 23 bits)
_SHIFTER = 12582912.0 + 127.0


def _silu(builder, v, const):
    # x sigmoid(x) = x / (1 + exp(-x)), 17 vector operations (the JIT's way took 23, and
    # more than the sums of a 16-channel 1x1 layer): x clipped to [-88, 88] (exp stays
    # finite and normal; 1 + exp(-88) is 1 already); -x = n ln2 + r by the shifter, whose
    # low bits hold n + 127, the exponent field of 2^n by one shift; r' = -r = x + n ln2 by
    # one float32 ln2 (its error, 2e-9 n, is ~1e-7 relative at |n| <= 127); exp(r) as the
    # polynomial in r' with alternating signs. NaN: the clip makes it 88, the final product
    # NaN. Within 3.8e-7 relative of float64 over [-100, 100]
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v.type, [v.type] * 3),
                                         f"llvm.fmuladd.v{v.type.count}f32")  # fmt: skip
    ivec = ir.VectorType(ir.IntType(32), v.type.count)
    x = builder.select(builder.fcmp_ordered("<", v, const(88.0)), v, const(88.0))
    x = builder.select(builder.fcmp_ordered(">", x, const(-88.0)), x, const(-88.0))
    k = builder.call(fma, [x, const(-1.4426950408889634), const(_SHIFTER)])
    n = builder.fsub(k, const(_SHIFTER))
    r = builder.call(fma, [n, const(float(np.float32(np.log(2)))), x])
    coeffs = [c if i % 2 else -c for i, c in enumerate(SILU_EXP_POLY)]  # of r' = -r
    p = const(coeffs[-1])
    for c in coeffs[-2::-1]:
        p = builder.call(fma, [p, r, const(c)])
    p = builder.call(fma, [p, r, const(1.0)])
    bits = builder.shl(builder.bitcast(k, ivec), ir.Constant(ivec, [23] * ivec.count))
    e = builder.fmul(p, builder.bitcast(bits, v.type))
    # 1 / (1 + e), both finite (ninf holds): a reciprocal estimate and a Newton step, ~2^-27
    # (not a division's 10-16 cycles a vector); then times x, which may be infinite
    q = builder.fdiv(const(1.0), builder.fadd(const(1.0), e))
    q.flags.extend(["arcp", "ninf"])
    return builder.fmul(v, q)


#: the activations by epilogue bit (:mod:`..epilogue`): one line per mode
ACTIVATIONS = {4: _relu, 8: _hswish, 16: _relu6, 32: _silu}


def activate(builder, v, epi: int):
    """The LLVM vector ``v`` with the activation of the epilogue bits ``epi`` applied (the
    identity when none is set)."""
    lanes = v.type.count

    def const(x):
        return ir.Constant(v.type, [ir.Constant(ir.FloatType(), x)] * lanes)

    for bit, fn in ACTIVATIONS.items():
        if epi & bit:
            v = fn(builder, v, const)
    return v


@functools.cache
def silu8():
    """The ``silu8(a, e)`` Numba intrinsic: the 8 float32 of the 1-d ``a`` from ``e`` on
    replaced by their SiLU (the epilogues' vector SiLU, :data:`ACTIVATIONS`), in place (for
    the compiled loops that apply it to values just stored). No index is checked."""

    @intrinsic
    def silu8(typingctx, a, e):
        def codegen(context, builder, signature, args):
            vec = ir.VectorType(ir.FloatType(), CB)
            data = context.make_array(signature.args[0])(context, builder, args[0]).data
            ptr = builder.bitcast(builder.gep(data, [args[1]], inbounds=True), vec.as_pointer())
            v = builder.load(ptr, align=4)
            builder.store(activate(builder, v, 32), ptr, align=4)
            return context.get_dummy_value()

        return t.void(a, e), codegen

    return silu8


@functools.cache
def pw_tile():
    """The ``pw_tile(R, B, half, epi, xp, x0, cstride, icb, wp, w0, out, o0, ohw8, z, bias,
    b0, skip, gate, g0, shift)`` Numba intrinsic: one tile (the module's docstring).
    Literals ``R``, ``B``, ``half`` (the last block's upper 8 channels are padding, not
    computed: that block's vectors are 8 lanes) and
    ``epi`` (bits 1 bias, 2 ``z``, 4 ReLU, 8 H_SWISH, 16 ReLU6, 32 SiLU); position ``p``
    reads ``xp[x0 + cb cstride + 8 p:]`` for ``cb < icb``, the filter ``wp[w0 + (8 cb +
    ic) 16 B + 16 b:]``, and writes (as reads ``z``) ``out[o0 + (2 b + h) ohw8 + 8
    p:][:8]``, bias ``bias[b0 + 16 b:]``; positions ``p < skip`` are not stored. With
    ``epi`` bit :data:`GATE` the filter vectors of input channel ``k`` are multiplied by
    ``gate[g0 + k]``; with bit :data:`PREACT` the source value of input channel ``k`` is
    read as ``relu(x gate[k] + shift[k])``, computed 8 channels of a position at a time
    into a stack buffer the broadcasts load from (not a vector's lane shuffled out: one
    shuffle per position and channel, on the port the fused multiply-adds use). No index
    is checked."""

    @intrinsic
    def pw_tile(typingctx, npos, nblk, half, epi, xp, x0, cstride, icb, wp, w0, out, o0, ohw8,
                z, bias, b0, skip, gate, g0, shift):  # fmt: skip
        literals = (npos, nblk, half, epi)
        if not all(isinstance(v, t.IntegerLiteral) for v in literals):
            return None
        R, B, hf, ep = (v.literal_value for v in literals)

        def codegen(context, builder, signature, args):
            (_, _, _, _, xp_v, x0_v, cs_v, icb_v, wp_v, w0_v, out_v, o0_v, ohw8_v, z_v,
             bias_v, b0_v, skip_v, _, g0_v, _) = args  # fmt: skip
            i64, f32, i32 = ir.IntType(64), ir.FloatType(), ir.IntType(32)
            vec, half_vec = ir.VectorType(f32, BLOCK), ir.VectorType(f32, CB)

            def const(v):
                return ir.Constant(i64, v)

            def data(k):
                return context.make_array(signature.args[k])(context, builder, args[k]).data

            xdata, wdata, odata, zdata, bdata = data(4), data(8), data(10), data(13), data(14)
            gdata, sdata = data(17), data(19)
            # the last block's padding (``half``) is not computed: its vectors are 8 lanes
            lanes = [CB if hf and b == B - 1 else BLOCK for b in range(B)]
            vty = [ir.VectorType(f32, n) for n in lanes]
            fmas = [tiled_jit.vector_fmas(builder, ty) for ty in vty]
            slots = [tiled_jit.zeroed_slots(builder, vty[b], 1)[0] for _ in range(R)
                     for b in range(B)]  # fmt: skip
            undef = ir.Constant(vec, ir.Undefined)
            splat = ir.Constant(ir.VectorType(i32, BLOCK), None)
            splats = [ir.Constant(ir.VectorType(i32, n), None) for n in lanes]

            def load(base, off, ty):
                ptr = builder.gep(base[0], [builder.add(base[1], off)], inbounds=True)
                return builder.load(builder.bitcast(ptr, ty.as_pointer()), align=4)

            def mask(idx):
                return ir.Constant(ir.VectorType(i32, len(idx)), [ir.Constant(i32, m)
                                                                  for m in idx])  # fmt: skip

            if ep & PREACT:
                # the buffer's address passed through an empty asm: LLVM promoted the buffer
                # to registers (its broadcasts became shuffles and spills) as long as it saw
                # where it points. Two halves, by the channel block's parity: block cb + 1 is
                # computed while block cb is summed, so its broadcasts load values stored an
                # iteration before (not forwarded from stores just issued: 1.2-1.4x the time)
                pbuf = cgutils.alloca_once(builder, f32, size=const(2 * R * CB))
                pbuf = builder.asm(ir.FunctionType(pbuf.type, [pbuf.type]), "", "=r,0",
                                   [pbuf], side_effect=False)  # fmt: skip
                dup = mask([*range(CB), *range(CB)])

                def prologue(cbv):
                    # relu(x scale + shift) of block cbv's R positions, two a vector; x < 0
                    # is false for NaN: NaN stays NaN
                    xb = builder.add(x0_v, builder.mul(cbv, cs_v))
                    c8 = builder.mul(cbv, const(CB))
                    sc8 = load((gdata, builder.add(g0_v, c8)), const(0), half_vec)
                    sh8 = load((sdata, c8), const(0), half_vec)
                    pb = builder.mul(builder.and_(cbv, const(1)), const(R * CB))
                    for p in range(0, R, 2):
                        ty, sc, sh = ((vec, builder.shuffle_vector(sc8, sc8, dup),
                                       builder.shuffle_vector(sh8, sh8, dup)) if p + 1 < R
                                      else (half_vec, sc8, sh8))  # fmt: skip
                        a = builder.fadd(builder.fmul(load((xdata, xb), const(p * CB), ty), sc),
                                         sh)  # fmt: skip
                        zero = ir.Constant(ty, None)
                        a = builder.select(builder.fcmp_ordered("<", a, zero), zero, a)
                        ptr = builder.gep(pbuf, [builder.add(pb, const(p * CB))], inbounds=True)
                        builder.store(a, builder.bitcast(ptr, ty.as_pointer()), align=4)

                prologue(const(0))
            with cgutils.for_range(builder, icb_v, intp=i64) as loop:
                cb = loop.index
                xb = builder.add(x0_v, builder.mul(cb, cs_v))
                wb = builder.add(w0_v, builder.mul(cb, const(CB * BLOCK * B)))
                gb = builder.add(g0_v, builder.mul(cb, const(CB)))
                if ep & PREACT:  # the next block's (the last one's again at the end)
                    nxt = builder.add(cb, const(1))
                    prologue(builder.select(builder.icmp_signed("<", nxt, icb_v), nxt, cb))
                    pb = builder.mul(builder.and_(cb, const(1)), const(R * CB))
                for ic in range(CB):
                    ws = [load((wdata, wb), const((ic * B + b) * BLOCK), vty[b])
                          for b in range(B)]  # fmt: skip
                    if ep & GATE:  # the filter's input channel scaled: B products, not R
                        gptr = builder.gep(gdata, [builder.add(gb, const(ic))], inbounds=True)
                        one = builder.insert_element(undef, builder.load(gptr), const(0))
                        ws = [builder.fmul(wv, builder.shuffle_vector(one, undef, splats[b]))
                              for b, wv in enumerate(ws)]  # fmt: skip
                    for p in range(R):
                        if ep & PREACT:
                            xptr = builder.gep(pbuf, [builder.add(pb, const(p * CB + ic))],
                                               inbounds=True)  # fmt: skip
                        else:
                            xptr = builder.gep(xdata, [builder.add(xb, const(p * CB + ic))],
                                               inbounds=True)  # fmt: skip
                        one = builder.insert_element(undef, builder.load(xptr), const(0))
                        xv = builder.shuffle_vector(one, undef, splat)
                        xh = builder.shuffle_vector(one, undef, splats[-1]) if hf else xv
                        for b in range(B):
                            s = slots[p * B + b]
                            xb_ = xh if lanes[b] == CB else xv
                            builder.store(builder.call(fmas[b], [xb_, ws[b], builder.load(s)]), s)

            lo, hi, both = mask(range(CB)), mask(range(CB, BLOCK)), mask(range(BLOCK))

            def load_z(off, b):  # block b's z at position offset off: its two halves
                parts = [load((zdata, o0_v), builder.add(off, builder.mul(ohw8_v, const(h))),
                              half_vec) for h in range(lanes[b] // CB)]  # fmt: skip
                return parts[0] if len(parts) == 1 else builder.shuffle_vector(*parts, both)

            biases = []
            if ep & 1:
                biases = [load((bdata, b0_v), const(b * BLOCK), vty[b]) for b in range(B)]
            for p in range(R):
                vs = []
                for b in range(B):
                    v = builder.load(slots[p * B + b])
                    off = builder.add(builder.mul(ohw8_v, const(2 * b)), const(p * CB))
                    if ep & 1:
                        v = builder.fadd(v, biases[b])
                    if ep & 2:
                        v = builder.fadd(v, load_z(off, b))
                    vs.append((activate(builder, v, ep), off))
                store = builder.icmp_signed("<=", skip_v, const(p))
                with builder.if_then(store, likely=True):
                    for b, (v, off) in enumerate(vs):
                        for h in range(lanes[b] // CB):
                            part = v if lanes[b] == CB else builder.shuffle_vector(
                                v, undef, lo if h == 0 else hi)  # fmt: skip
                            ptr = builder.gep(odata, [builder.add(o0_v, builder.add(
                                off, builder.mul(ohw8_v, const(h))))], inbounds=True)
                            builder.store(part, builder.bitcast(ptr, half_vec.as_pointer()),
                                          align=4)  # fmt: skip
            return context.get_dummy_value()

        sig = t.void(npos, nblk, half, epi, xp, x0, cstride, icb, wp, w0, out, o0, ohw8, z,
                     bias, b0, skip, gate, g0, shift)  # fmt: skip
        return sig, codegen

    return pw_tile


#: the tile intrinsic and the take-next-unit function, bound before compiling (module
#: globals, not closure cells: Numba's cache keys a closure by its cells' pickled bytes,
#: which for these objects differ from one process to the next)
tile = take = None


def _units_py(R, B, EPI):
    """The units of a layer of tiles ``R x B`` and epilogue bits ``EPI`` (compile-time
    constants of the returned function, its only closure cells)."""
    global tile, take
    tile, take = pw_tile(), tiled_jit.take_unit()

    def run(xp, wp, out, z, bias, gate, shift, geom, counter, me):
        # pragma: no cover - compiled
        # geom: HW, ICB, NG (groups of B blocks of 16), HALF (the last group's last block is
        # half padding), OCB8 (output blocks of 8), NB (bands of a plane), TPB (tiles per band),
        # BY_GROUP (the units' order: groups slowest), N (samples)
        hw, icb, ng, hf, ocb8, nb, tpb = (geom[0], geom[1], geom[2], geom[3] != 0, geom[4],
                                          geom[5], geom[6])  # fmt: skip
        by_group, ns = geom[7] != 0, geom[8]
        cs = hw * CB
        ohw8 = hw * CB
        nt = hw // R  # whole tiles
        while True:
            u = take(counter, me)
            if u < 0:
                break
            if by_group:  # a range of units is a range of groups: of the filter's vectors
                band = u % nb
                rest = u // nb
                n = rest % ns
                g = rest // ns
            else:  # groups fastest: a range of units is a range of positions
                g = u % ng
                rest = u // ng
                band = rest % nb
                n = rest // nb
            x0 = n * icb * cs
            g0 = 0 if EPI & PREACT else n * icb * CB  # the pre-activation's per channel
            w0 = g * icb * (CB * BLOCK * B)
            o0 = (n * ocb8 + g * 2 * B) * ohw8
            b0 = g * B * BLOCK
            last = hf and g == ng - 1
            if nt == 0:  # a plane smaller than a tile: tiles of one position
                for q in range(hw):
                    if last:
                        tile(1, B, 1, EPI, xp, x0 + q * CB, cs, icb, wp, w0, out, o0 + q * CB,
                             ohw8, z, bias, b0, 0, gate, g0, shift)  # fmt: skip
                    else:
                        tile(1, B, 0, EPI, xp, x0 + q * CB, cs, icb, wp, w0, out, o0 + q * CB,
                             ohw8, z, bias, b0, 0, gate, g0, shift)  # fmt: skip
                continue
            t0 = band * tpb
            t1 = nt if band == nb - 1 else t0 + tpb
            tail = band == nb - 1 and hw % R != 0
            for k in range(t0, t1 + 1 if tail else t1):
                q = k * R if k < nt else hw - R
                skip = 0 if k < nt else nt * R - q
                if last:
                    tile(R, B, 1, EPI, xp, x0 + q * CB, cs, icb, wp, w0, out, o0 + q * CB,
                         ohw8, z, bias, b0, skip, gate, g0, shift)  # fmt: skip
                else:
                    tile(R, B, 0, EPI, xp, x0 + q * CB, cs, icb, wp, w0, out, o0 + q * CB,
                         ohw8, z, bias, b0, skip, gate, g0, shift)  # fmt: skip

    return run


@functools.cache
def _compiled_units(R: int, B: int, epi: int):
    fr = t.Array(t.float32, 1, "C", readonly=True)
    f1, ints = t.float32[::1], t.int64[::1]
    run = _units_py(R, B, epi)
    # a name of its own per variant: Numba's cache keeps one index per name, and variants
    # sharing one index could be given the same data file by two processes compiling at once
    run.__qualname__ = run.__name__ = f"pointwise88_units_{R}x{B}_e{epi}"
    return tiled_jit.compile_tiled(run, [t.void(fr, fr, f1, fr, fr, fr, fr, ints, ints,
                                                t.int64)])  # fmt: skip


def compiled_units(R: int, B: int, epi: int):
    """The compiled units of tiles ``R x B`` with epilogue bits ``epi`` (compiled on first
    use): ``units(xp, wp, out, z, bias, gate, shift, geom, counter, me)``, the flat
    read-only source, packed filter, ``z`` (laid out as ``out``), bias, gate (``(N, IC)``:
    bit :data:`GATE` scales the source's channels; ``(IC,)`` scales of bit :data:`PREACT`)
    and shift (``(IC,)``, bit :data:`PREACT`), the flat output, the int64 geometry
    (see the source), the units' counter (:func:`megbrain.kernels.tiled_jit.take_unit`) and
    the thread's index."""
    return _compiled_units(R, B, epi)


def units(R, B, epi, xp, wp, out, z, bias, gate, shift, geom, counter, me) -> None:
    """Thread ``me``'s share of the units (:func:`compiled_units`)."""
    _compiled_units(R, B, epi)(xp, wp, out, z, bias, gate, shift, geom, counter, me)


def filter_packer(filt: np.ndarray, wp: np.ndarray, B: int):
    """A step packing the dense NCHW88 1x1 filter ``(OC/8, IC/8, 1, 1, 8 ic, 8 oc)`` into
    the flat ``wp`` laid out ``(NG, K, B, 16)``, output channels padded with zeros to
    ``NG B 16`` (views made here: the step allocates nothing)."""
    ocb8, icb8 = filt.shape[:2]
    per = 2 * B  # blocks of 8 output channels per group
    ng = -(-ocb8 // per)
    dst = wp.reshape(ng, icb8, CB, per, CB)
    src = filt[:, :, 0, 0]  # (OC/8, IC/8, 8i, 8o)
    pairs = []
    for g in range(ng):
        o0, o1 = g * per, min(ocb8, (g + 1) * per)
        pairs.append((dst[g, :, :, : o1 - o0], src[o0:o1].transpose(1, 2, 0, 3)))
    pad = dst[ng - 1, :, :, ocb8 - (ng - 1) * per :]

    def pack() -> None:
        for d, s in pairs:
            np.copyto(d, s)
        pad.fill(0)

    return pack
