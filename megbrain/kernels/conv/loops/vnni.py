"""Compiled (Numba) loops of the 8-bit convolution's AVX-512 VNNI path (:mod:`..quantized`):
``vpdpbusd`` sums four unsigned-byte by signed-byte products into each of 16 int32 lanes,
64 multiply-adds per instruction, exactly (wrapping int32, as the reference's sums do).

The operands ``vpdpbusd`` takes (``u`` unsigned, ``w`` signed):

- the activations shifted to unsigned bytes, ``u = x + 128`` for a QuantizedS8 source, ``u
  = x`` for a Quantized8Asymm one; with ``u0`` the shifted zero point (``zx + 128`` or
  ``zx``), ``sum w (x - zx) = sum w u - u0 sum w``, the second term one int32 per output
  channel (``init``, with the bias), and padding filled with ``u0`` adds nothing;
- the filter minus its zero point as signed bytes (QuantizedS8 with no zero point, or
  Quantized8Asymm with zero point 128; others take :mod:`.int8`'s loops).

Layouts (flat uint8 / int8 buffers, one group of one sample at a time):

- relaid source ``x4``: per block of 4 input channels ``cg``, the ``HP x WP`` padded
  positions of 4 bytes (the 4 channels innermost, missing channels ``u0``) split into the
  stride's phase planes, position (hp, wp) into the plane of phase ``(hp % SH, wp % SW)``
  at ``(hp // SH, wp // SW)`` of its ``HPh x WPh`` (only the phases some tap reads are
  kept), the block ``plane`` words long. A tap ``(a, b)`` of output (oh, ow) is then
  position ``(oh + a DH // SH, ow + b DW // SW)`` of phase ``(a DH % SH, b DW % SW)``: each
  ``k`` group ``(cg, a, b)`` reads the planes in place at its offset, the convolution
  computed over the positions of the phase planes' rows (``OH x WPh``), written to an
  output of rows of ``WPh`` whose columns past ``OW`` are then dropped
  (:func:`drop_columns`; none at stride 1 without padding, a 1x1 convolution's plane then
  read as it is). No im2col at any stride;
- packed filter ``w``: ``(G, OP, KG * 4)`` signed bytes, ``OP`` the output channels
  rounded up to the tile's rows (zero rows), each row's ``k`` groups ``(cg, a, b)``
  row-major.

A tile (:func:`vnni_tile`) is ``R`` output channels by ``V`` vectors of 16 positions, its
``R V`` accumulators in zmm registers across the whole reduction; each ``k`` group loads
``V`` activation vectors and broadcasts one 4-byte filter word per row, then issues the
``R V`` ``vpdpbusd`` (:mod:`.vnni_channels` has the tile with output channels along the
vectors instead, for small planes). The positions lie along the vectors, so that each row of
the tile is a contiguous run of the NCHW output: stored as int32 sums, or requantized on
the way (MegDNN's float32 chain, exact: the sum converted to float32, times the scale, ReLU,
divided by the output scale, rounded half away from zero, shifted, saturated; computed
as one product by the scales' ratio, the division run only near ties: :mod:`.requant_ir`).

A layer runs as :func:`bands`: each thread takes units (a band of output rows, or a chunk
of the output channels) as it goes, relays the band's source rows into a buffer of its own,
runs the band's tiles and drops its rows' columns, so that no thread waits for another's
phase. An NCHW4 source (``use_nchw4``) is relaid by a word copy (:func:`_relayout4_py`:
its positions are 4-channel words already) and an NCHW4 output written by interleaving each
band's rows of 4 output channels into words (:func:`_cut4_py`), the tiles unchanged;
:func:`relayout_blocked` converts 8-bit tensors between NCHW and NCHW4. The per-phase
loops (:func:`relayout`, :func:`gemm_tiles`, :func:`drop_columns`)
take ``[begin, end)`` ranges for :func:`megbrain.kernels.parallel.split`. All are GIL-free
and allocate nothing.
"""

from __future__ import annotations

import functools

import numpy as np
from llvmlite import binding, ir
from numba import njit
from numba.core import cgutils, config, types
from numba.extending import intrinsic

from ... import tiled_jit
from . import requant_ir

__all__ = [
    "EPI_INT32",
    "EPI_QUANT",
    "EPI_QUANT_RELU",
    "available",
    "drop_columns",
    "bands",
    "bands_kernel",
    "gemm_tiles",
    "pack_filter",
    "relayout",
    "relayout_blocked",
    "requant_params",
    "tile_shape",
]

#: what a tile writes: the int32 sums, or them requantized to 8 bits (then ReLU'd)
EPI_INT32, EPI_QUANT, EPI_QUANT_RELU = 0, 1, 2
#: positions of a vector (16 int32 lanes)
LANES = 16
#: the entries of :func:`gemm_tiles`'s ``geom`` before the taps' offsets
_GEOM = 7
#: the tiles' shapes, output-channel rows to vectors of positions: ``R V`` accumulators of
#: the 32 zmm registers, enough to hide ``vpdpbusd``'s latency, with room for the V loads
#: and a broadcast filter word; :func:`tile_shape` takes the one with the least padding
TILES = {6: 4, 8: 3}
#: the fast requantize's values nearer than ``1/2 - _NEAR`` to a half-integer take the
#: exact chain: 2^-12, three times the two chains' largest difference
_NEAR = 0.5 - 2.0**-12
#: scales (and their ratio) in these binades keep every intermediate of both chains a normal
#: float32 for int32 sums, the ground of that bound; others always take the exact chain
_SCALES, _RATIOS = (2.0**-90, 2.0**90), (2.0**-120, 2.0**120)


def available() -> bool:
    """Whether the compiler targets AVX-512 with VNNI (``NUMBA_CPU_FEATURES``, else the
    host's features)."""
    features = config.CPU_FEATURES
    if features is None:
        features = binding.get_host_cpu_features().flatten()
    have = set(features.split(","))
    return {"+avx512f", "+avx512bw", "+avx512vnni"} <= have


def tile_shape(channels: int, positions: int) -> tuple[int, int]:
    """``(rows, vecs)`` of the tile (:data:`TILES`) that computes the fewest padded products
    for ``channels`` output channels over runs of ``positions`` positions: the channels
    rounded up to its rows (the packed filter's zero rows), the positions to whole vectors
    (a run's last tile computes only the vectors it reaches); 8 rows where both pad alike
    (its tiles ran 0-8% faster on MobileNetV2's and ResNet-18's layers, one thread). E.g.
    64 or 128 channels take 8 rows (6 pad them to 66 and 132), 30 channels 6 rows (8 pad
    them to 32)."""

    def padded(rows: int) -> int:
        vecs = TILES[rows]
        whole = positions // (LANES * vecs) * LANES * vecs
        return -(-channels // rows) * rows * (whole + -(-(positions - whole) // LANES) * LANES)

    return min(TILES.items(), key=lambda t: (padded(t[0]), -t[0]))


@functools.cache
def vnni_tile():
    """The ``vnni_tile(a, a0, pstride, kstride, offs, offs0, w, w0, wstride, kg, init, i0,
    out, o0, ostride, count, nrows, q, rows, vecs, epi, taps)`` Numba intrinsic: one tile
    of ``rows x vecs`` vectors (literals) of int32 sums, or of ``rows x ceil(count / 16)``
    where ``count`` ends within fewer vectors (a row's or a band's last positions: the
    vectors past it are neither loaded nor summed).

    Row ``r`` starts at ``init[i0 + r]`` and adds, for each ``k`` group ``kk < kg``, the
    ``vpdpbusd`` of the 64 unsigned bytes at ``a[a0 + v pstride + kk kstride:]`` (vector
    ``v``; with the literal ``taps`` 1, at ``a[a0 + v pstride + offs[offs0 + kk]:]``, the
    int64 table of each group's offset) with the 4 signed bytes at ``w[w0 + r wstride + 4
    kk:]`` broadcast. Rows
    ``r < nrows`` are stored, their lanes ``v * 16 + j < count``, to ``out[o0 + r ostride +
    16 v + j]``: with the literal ``epi`` :data:`EPI_INT32` as int32; else requantized to
    one byte with ``q`` (float32, :func:`requant_params`), :data:`EPI_QUANT_RELU`
    clamping at 0 after the input scale. No index is checked.
    """

    @intrinsic
    def vnni_tile(typingctx, a, a0, pstride, kstride, offs, offs0, w, w0, wstride, kg, init,
                  i0, out, o0, ostride, count, nrows, q, rows, vecs, epi, taps):  # fmt: skip
        literals = (rows, vecs, epi, taps)
        if not all(isinstance(v, types.IntegerLiteral) for v in literals):
            return None
        nr, mv, mode, by_table = (v.literal_value for v in literals)
        out_ty = types.int32 if mode == EPI_INT32 else types.uint8
        if not (isinstance(out, types.Array) and out.dtype == out_ty):
            return None

        def codegen(context, builder, signature, args):
            (a_v, a0_v, ps_v, ks_v, offs_v, offs0_v, w_v, w0_v, ws_v, kg_v, init_v, i0_v, out_v,
             o0_v, os_v, count_v, nrows_v, q_v) = args[:18]  # fmt: skip
            i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
            v32 = ir.VectorType(i32, LANES)
            v1 = ir.VectorType(ir.IntType(1), LANES)

            def const(v, ty=i64):
                return ir.Constant(ty, v)

            data = array_data(context, builder, signature, args)
            adata = builder.bitcast(data(0), i8.as_pointer())
            wdata = builder.bitcast(data(6), i8.as_pointer())
            idata, odata, qdata, tdata = data(10), data(12), data(17), data(4)
            splat0 = ir.Constant(v32, None)

            def splat(scalar, vty):
                one = builder.insert_element(ir.Constant(vty, ir.Undefined), scalar, const(0))
                return builder.shuffle_vector(one, ir.Constant(vty, ir.Undefined), splat0)

            dot = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(v32, [v32] * 3), "llvm.x86.avx512.vpdpbusd.512")

            def tile(nv):
                """The tile of ``nv`` vectors: its sums, then their store."""
                regs = cgutils.alloca_once(builder, ir.ArrayType(v32, nr * nv))
                slots = [builder.gep(regs, [const(0), const(i)], inbounds=True)
                         for i in range(nr * nv)]  # fmt: skip
                for r in range(nr):
                    start = builder.load(builder.gep(idata, [builder.add(i0_v, const(r))]))
                    sv = splat(start, v32)
                    for v in range(nv):
                        builder.store(sv, slots[r * nv + v])
                with cgutils.for_range(builder, kg_v, intp=i64) as loop:
                    kk = loop.index
                    if by_table:
                        step = builder.load(builder.gep(tdata, [builder.add(offs0_v, kk)]))
                    else:
                        step = builder.mul(kk, ks_v)
                    abase = builder.add(a0_v, step)
                    avs = []
                    for v in range(nv):
                        off = builder.add(abase, builder.mul(ps_v, const(v)))
                        ptr = builder.bitcast(builder.gep(adata, [off], inbounds=True),
                                              v32.as_pointer())  # fmt: skip
                        avs.append(builder.load(ptr, align=1))
                    wbase = builder.add(w0_v, builder.mul(kk, const(4)))
                    for r in range(nr):
                        off = builder.add(wbase, builder.mul(ws_v, const(r)))
                        ptr = builder.bitcast(builder.gep(wdata, [off], inbounds=True),
                                              i32.as_pointer())  # fmt: skip
                        wv = splat(builder.load(ptr, align=1), v32)
                        for v in range(nv):
                            slot = slots[r * nv + v]
                            builder.store(builder.call(dot, [builder.load(slot), avs[v], wv]),
                                          slot)  # fmt: skip
                if mode == EPI_INT32:
                    store_int32(nv, slots)
                else:
                    store_bytes(nv, slots)

            def store_int32(nv, slots):
                lane = ir.Constant(v32, [ir.Constant(i32, j) for j in range(LANES)])
                cnt = splat(builder.trunc(count_v, i32), v32)
                masks = [builder.icmp_signed("<", builder.add(lane, ir.Constant(v32, [
                    ir.Constant(i32, v * LANES)] * LANES)), cnt) for v in range(nv)]  # fmt: skip
                store = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
                    ir.VoidType(), [v32, v32.as_pointer(), i32, v1]),
                    "llvm.masked.store.v16i32.p0")  # fmt: skip
                optr = builder.bitcast(odata, i32.as_pointer())
                for r in range(nr):
                    with builder.if_then(builder.icmp_signed("<", const(r), nrows_v)):
                        row = builder.add(o0_v, builder.mul(os_v, const(r)))
                        for v in range(nv):
                            ptr = builder.gep(optr, [builder.add(row, const(v * LANES))])
                            builder.call(store, [builder.load(slots[r * nv + v]),
                                                 builder.bitcast(ptr, v32.as_pointer()),
                                                 ir.Constant(i32, 1), masks[v]])  # fmt: skip

            def store_bytes(nv, slots):
                # a row's vectors requantized together into its 16 nv result bytes, one store
                relu = mode == EPI_QUANT_RELU
                qs = [requant_ir.splat16(builder, builder.load(builder.gep(qdata, [const(i)])))
                      for i in range(7)]  # fmt: skip
                ops = requant_ir.bytes_operands(builder, qs, relu)
                nb = LANES * nv
                vb, vm = ir.VectorType(i8, nb), ir.VectorType(ir.IntType(1), nb)
                store = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
                    ir.VoidType(), [vb, vb.as_pointer(), i32, vm]),
                    f"llvm.masked.store.v{nb}i8.p0")  # fmt: skip
                # the first min(count, nb) bytes
                n = builder.select(builder.icmp_signed("<", count_v, const(nb)), count_v,
                                   const(nb))  # fmt: skip
                bty = ir.IntType(nb)
                bits = builder.lshr(ir.Constant(bty, -1),
                                    builder.trunc(builder.sub(const(nb), n), bty))  # fmt: skip
                bmask = builder.bitcast(bits, vm)
                optr = builder.bitcast(odata, i8.as_pointer())
                for r in range(nr):
                    with builder.if_then(builder.icmp_signed("<", const(r), nrows_v)):
                        row = builder.add(o0_v, builder.mul(os_v, const(r)))
                        accs = [builder.load(slots[r * nv + v]) for v in range(nv)]
                        val = requant_ir.requantize_bytes(builder, accs, qs, ops, relu)
                        ptr = builder.bitcast(builder.gep(optr, [row]), vb.as_pointer())
                        builder.call(store, [val, ptr, ir.Constant(i32, 1), bmask])

            # a tile whose positions end within fewer vectors runs as a tile of those
            # vectors alone: the positions past a row's end (or a band's) are not computed
            nvec = builder.sdiv(builder.add(count_v, const(LANES - 1)), const(LANES))
            end = builder.append_basic_block("tile.end")
            full = builder.append_basic_block("tile.full")
            switch = builder.switch(nvec, full)
            for nv in range(1, mv):
                case = builder.append_basic_block(f"tile.{nv}")
                switch.add_case(const(nv), case)
                builder.position_at_end(case)
                tile(nv)
                builder.branch(end)
            builder.position_at_end(full)
            tile(mv)
            builder.branch(end)
            builder.position_at_end(end)
            return context.get_dummy_value()

        sig = types.void(a, a0, pstride, kstride, offs, offs0, w, w0, wstride, kg, init, i0,
                         out, o0, ostride, count, nrows, q, rows, vecs, epi, taps)  # fmt: skip
        return sig, codegen

    return vnni_tile


def array_data(context, builder, signature, args):
    """``data(k)``: IR, the data pointer of an intrinsic's array argument ``k``."""

    def data(k):
        return context.make_array(signature.args[k])(context, builder, args[k]).data

    return data


def requant_params(q: np.ndarray) -> np.ndarray:
    """The tiles' requantize operands from ``q`` = (input scale, output scale, zero point,
    qmin, qmax): those, the ratio of the scales and the fast path's bound (float32, 7).

    MegDNN's chain divides: ``roundf(float32(float32(s) * s_in) / s_out)`` (ReLU'd between),
    for an int32 sum ``s``. The requantize computes ``float32(s) * float32(s_in / s_out)``
    instead, one multiply (fused with the zero point's add): its relative difference from
    the chain's quotient is at most four float32 roundings (2^-22), under 2^-13.7 where
    either can still round into [-255, 255] (and equal after the clamp elsewhere), the
    add's rounding under 2^-15 more, so the two round to the same integer unless the fast
    value lies within that of a half-integer; a vector with a value within 2^-12 of one
    runs the chain (:func:`.requant_ir.requantize16_group`; the tiles'
    :func:`.requant_ir.requantize_bytes` checks the fraction of an offset value against
    its own margin and reads only the bound's sign). Scales outside normal binades (where
    a product could round to a subnormal or overflow in one chain only) set the bound to
    -1: every vector exact.
    """
    q = np.asarray(q, np.float32)
    s_in, s_out = q[0], q[1]
    with np.errstate(all="ignore"):
        ratio = np.float32(s_in / s_out)
    normal = all(_SCALES[0] <= v <= _SCALES[1] for v in (s_in, s_out))
    fast = normal and _RATIOS[0] <= ratio <= _RATIOS[1]
    return np.array([*q[:5], ratio if fast else 1, _NEAR if fast else -1], np.float32)


@njit(inline="always")
def _word(x, s0, s1, s2, s3, o, flip):
    """The 4 channels' bytes at ``o`` of the planes from ``s0 ... s3``, xor ``flip``."""
    return (np.uint32(x[s0 + o] ^ flip) | (np.uint32(x[s1 + o] ^ flip) << 8)
            | (np.uint32(x[s2 + o] ^ flip) << 16) | (np.uint32(x[s3 + o] ^ flip) << 24))


@intrinsic
def _words64(typingctx, out, d, x, s0, s1, s2, s3, n, flip, keep, pad):
    """``out[d + j] = _word(x, s0, s1, s2, s3, j, flip) & keep | pad`` for ``j < n`` (1 to
    64; ``out`` uint32, ``x`` uint8, flat): four masked 64-byte loads, the four channels'
    bytes interleaved by two shuffles (bytes into pairs, pairs into words: two-source byte
    and word permutes), four masked 16-word stores. 1.5-1.7x the 16-word form's speed on
    whole planes (LLVM's vectorizer had left a row's last words to its scalar remainder,
    most of a 14- to 56-word row). No index is checked."""
    if not (isinstance(out, types.Array) and isinstance(x, types.Array)):
        return None

    def codegen(context, builder, signature, args):
        out_v, d_v, x_v, s0_v, s1_v, s2_v, s3_v, n_v, flip_v, keep_v, pad_v = args
        i1, i8, i16, i32, i64 = (ir.IntType(b) for b in (1, 8, 16, 32, 64))
        vb, vm = ir.VectorType(i8, 64), ir.VectorType(i1, 64)
        vw, vm16 = ir.VectorType(i32, 16), ir.VectorType(i1, 16)
        xa = context.make_array(signature.args[2])(context, builder, x_v)
        oa = context.make_array(signature.args[0])(context, builder, out_v)
        xp = builder.bitcast(xa.data, i8.as_pointer())
        load = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
            vb, [vb.as_pointer(), i32, vm, vb]), "llvm.masked.load.v64i8.p0")
        store = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
            ir.VoidType(), [vw, vw.as_pointer(), i32, vm16]), "llvm.masked.store.v16i32.p0")

        def splat(v, vty):
            one = builder.insert_element(ir.Constant(vty, ir.Undefined), v, ir.Constant(i64, 0))
            return builder.shuffle_vector(one, ir.Constant(vty, ir.Undefined),
                                          ir.Constant(ir.VectorType(i32, vty.count), None))

        n64 = builder.sext(n_v, i64) if n_v.type.width < 64 else n_v
        bits = builder.lshr(ir.Constant(i64, -1), builder.sub(ir.Constant(i64, 64), n64))
        mask = builder.bitcast(bits, vm)
        fl = splat(builder.trunc(flip_v, i8) if flip_v.type.width > 8 else flip_v, vb)
        planes = []
        for s in (s0_v, s1_v, s2_v, s3_v):
            ptr = builder.bitcast(builder.gep(xp, [s]), vb.as_pointer())
            planes.append(builder.xor(builder.call(load, [ptr, ir.Constant(i32, 1), mask,
                                                          ir.Constant(vb, None)]), fl))

        def interleave(a, b, count):
            idx = [ir.Constant(i32, k // 2 + (k % 2) * count) for k in range(2 * count)]
            return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(i32, 2 * count), idx))

        pairs = [builder.bitcast(interleave(planes[0], planes[1], 64), ir.VectorType(i16, 64)),
                 builder.bitcast(interleave(planes[2], planes[3], 64), ir.VectorType(i16, 64))]
        words = builder.bitcast(interleave(*pairs, 64), ir.VectorType(i32, 64))
        kp = splat(builder.trunc(keep_v, i32), vw)
        pd = splat(builder.trunc(pad_v, i32), vw)
        optr = builder.gep(builder.bitcast(oa.data, i32.as_pointer()), [d_v])
        for q in range(4):
            part = builder.shuffle_vector(words, ir.Constant(ir.VectorType(i32, 64), None),
                                          ir.Constant(ir.VectorType(i32, 16), [
                                              ir.Constant(i32, 16 * q + j) for j in range(16)]))
            part = builder.or_(builder.and_(part, kp), pd)
            qbits = builder.lshr(bits, ir.Constant(i64, 16 * q))
            qmask = builder.bitcast(builder.trunc(qbits, i16), vm16)
            ptr = builder.bitcast(builder.gep(optr, [ir.Constant(i64, 16 * q)]), vw.as_pointer())
            builder.call(store, [part, ptr, ir.Constant(i32, 1), qmask])
        return context.get_dummy_value()

    sig = types.void(out, d, x, s0, s1, s2, s3, n, flip, keep, pad)
    return sig, codegen


@intrinsic
def _evens16(typingctx, out, d, src, s, n):
    """``out[d + j] = src[s + 2 j]`` for ``j < n`` (1 to 16; flat uint32 arrays): two masked
    16-word loads and one two-source permute (the scalar loop of a stride-2 row's words was
    most of its relayout). No index is checked."""
    if not (isinstance(out, types.Array) and isinstance(src, types.Array)):
        return None

    def codegen(context, builder, signature, args):
        out_v, d_v, src_v, s_v, n_v = args
        i1, i16, i32, i64 = (ir.IntType(b) for b in (1, 16, 32, 64))
        vw, vm = ir.VectorType(i32, 16), ir.VectorType(i1, 16)
        sa = context.make_array(signature.args[2])(context, builder, src_v)
        oa = context.make_array(signature.args[0])(context, builder, out_v)
        load = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
            vw, [vw.as_pointer(), i32, vm, vw]), "llvm.masked.load.v16i32.p0")
        store = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
            ir.VoidType(), [vw, vw.as_pointer(), i32, vm]), "llvm.masked.store.v16i32.p0")
        n64 = builder.sext(n_v, i64) if n_v.type.width < 64 else n_v
        # the 2n - 1 words read: bits [0, 2n - 1) over the two vectors
        bits = builder.lshr(ir.Constant(i64, -1), builder.sub(ir.Constant(i64, 65),
                                                             builder.add(n64, n64)))
        sp = builder.gep(builder.bitcast(sa.data, i32.as_pointer()), [s_v])
        halves = []
        for h in range(2):
            m = builder.bitcast(builder.trunc(builder.lshr(bits, ir.Constant(i64, 16 * h)), i16),
                                vm)  # fmt: skip
            ptr = builder.bitcast(builder.gep(sp, [ir.Constant(i64, 16 * h)]), vw.as_pointer())
            halves.append(builder.call(load, [ptr, ir.Constant(i32, 4), m,
                                              ir.Constant(vw, None)]))  # fmt: skip
        evens = builder.shuffle_vector(halves[0], halves[1], ir.Constant(
            ir.VectorType(i32, 16), [ir.Constant(i32, 2 * j) for j in range(16)]))
        obits = builder.lshr(ir.Constant(i64, 0xFFFF), builder.sub(ir.Constant(i64, 16), n64))
        om = builder.bitcast(builder.trunc(obits, i16), vm)
        optr = builder.gep(builder.bitcast(oa.data, i32.as_pointer()), [d_v])
        builder.call(store, [evens, builder.bitcast(optr, vw.as_pointer()), ir.Constant(i32, 4),
                             om])  # fmt: skip
        return context.get_dummy_value()

    return types.void(out, d, src, s, n), codegen


@njit(inline="always")
def _words(out, d, x, s0, s1, s2, s3, n, flip, keep, pad):
    """``out[d + j] = _word(x, s0, s1, s2, s3, j, flip) & keep | pad`` for ``j < n``, 64
    words a step (:func:`_words64`)."""
    # (int64 throughout: uint64 mixed with int64 types as float64)
    d, s0, s1, s2, s3, n = np.int64(d), np.int64(s0), np.int64(s1), np.int64(s2), \
        np.int64(s3), np.int64(n)  # fmt: skip
    fl, kp, pd = np.int64(flip), np.int64(keep), np.int64(pad)
    for j in range(0, n, 64):
        _words64(out, d + j, x, s0 + j, s1 + j, s2 + j, s3 + j, min(64, n - j), fl, kp, pd)


def _relayout_py(x, x4, tmp, xoff, hw, ci, geo, flip, u0, cg0, cg1, k0):
    """Blocks [cg0, cg1) of 4 channels of ``x4`` (flat uint32 words, a position's 4 channels
    in its bytes) from the channels ``0 ... ci - 1`` of the flat uint8 ``x`` from ``xoff``
    (``hw`` = (H, W) planes), each value xor ``flip`` (128 turns int8 into int8 + 128);
    ``u0`` outside the source and for channels ``>= ci``. ``geo`` (int64): PH, PW, SH, SW,
    the phase planes' HPh, WPh, their count per block ``nr x nc``, the block's ``plane``
    words, then the ``nr`` row phases kept and the ``nc`` column phases kept: padded
    position (hp, wp) of row phase ``rows[i] = hp % SH`` and column phase ``cols[j] = wp %
    SW`` goes to plane ``i nc + j`` of the block, at ``(hp // SH - k0) WPh + wp // SW``
    (the phase planes' rows ``[k0, k0 + HPh)``: a band of them). At column stride 2, ``tmp``
    (uint32, ``H W`` words per block) holds the source rows' words."""
    h_, w_ = hw[0], hw[1]
    ph, pw, sh, sw, hph, wph, nr, nc, plane = geo[0], geo[1], geo[2], geo[3], geo[4], \
        geo[5], geo[6], geo[7], geo[8]  # fmt: skip
    pplane = hph * wph
    whole = ph == 0 and pw == 0 and sh == 1 and sw == 1
    fill = np.uint32(u0 * 0x01010101)
    ones = np.uint32(0xFFFFFFFF)
    for cg in range(cg0, cg1):
        base = cg * plane
        # each channel's byte of the word (a missing channel reads the last one, and its
        # byte is then replaced by u0)
        c = cg * 4
        s0 = np.uintp(xoff + c * h_ * w_)
        s1 = np.uintp(xoff + min(c + 1, ci - 1) * h_ * w_)
        s2 = np.uintp(xoff + min(c + 2, ci - 1) * h_ * w_)
        s3 = np.uintp(xoff + min(c + 3, ci - 1) * h_ * w_)
        keep = np.uint32(0xFFFFFFFF >> (8 * max(0, c + 4 - ci)))
        pad = fill & (keep ^ ones)
        if whole:  # unpadded, stride 1: the band's rows are one run
            r = np.uintp(k0 * w_)
            n = (min(h_, k0 + hph) - k0) * w_
            _words(x4, base, x, s0 + r, s1 + r, s2 + r, s3 + r, n, flip, keep, pad)
        for i in range(0 if whole else nr):
            pr = geo[9 + i]
            for j in range(nc):
                pc = geo[9 + nr + j]
                # the columns q whose source column q sw + pc - pw lies in [0, W)
                lo = min(max(0, (pw - pc + sw - 1) // sw), wph)
                hi = min(max(lo, (w_ + pw - pc + sw - 1) // sw), wph)
                dst = np.uintp(base + (i * nc + j) * pplane)
                for k in range(hph):
                    h = (k + k0) * sh + pr - ph
                    row = dst + np.uintp(k * wph)
                    # columns [q0, q1) from the source, the others u0 (a row outside: all)
                    inside = 0 <= h < h_
                    q0, q1 = (lo, hi) if inside else (wph, wph)
                    for q in range(np.uintp(q0)):
                        x4[row + q] = fill
                    for q in range(np.uintp(q1), np.uintp(wph)):
                        x4[row + q] = fill
                    r = np.uintp(h * w_ + pc - pw)
                    if sw == 1:  # (contiguous: vectorized)
                        _words(x4, row + np.uintp(q0), x, s0 + r + np.uintp(q0),
                               s1 + r + np.uintp(q0), s2 + r + np.uintp(q0),
                               s3 + r + np.uintp(q0), q1 - q0, flip, keep, pad)  # fmt: skip
                    elif sw == 2 and inside:
                        # the source row's words in a vectorized pass (by the first column
                        # phase; the second reads them again), then every other one (byte
                        # loads at a stride stayed scalar: about 2x slower)
                        t0 = np.uintp((cg * h_ + h) * w_)
                        if j == 0:
                            r0 = np.uintp(h * w_)
                            _words(tmp, t0, x, s0 + r0, s1 + r0, s2 + r0, s3 + r0, w_, flip,
                                   keep, pad)  # fmt: skip
                        t1 = (cg * h_ + h) * w_ + pc - pw
                        for q in range(q0, q1, 16):
                            _evens16(x4, row + np.uintp(q), tmp, np.uintp(t1 + 2 * q),
                                     np.int64(min(16, q1 - q)))  # fmt: skip
                    else:
                        for q in range(np.uintp(q0), np.uintp(q1)):
                            o = r + q * np.uintp(sw)
                            x4[row + q] = _word(x, s0, s1, s2, s3, o, flip) & keep | pad
        for j in range(np.uintp(nr * nc * pplane), np.uintp(plane)):  # (read by dropped lanes)
            x4[base + j] = fill


def _relayout4_py(x, x4, tmp, xoff, hw, ci, geo, flip, u0, cg0, cg1, k0):
    """:func:`_relayout_py` of a channel-blocked source: ``x`` (flat uint8) holds NCHW4
    ``(N, C/4, H, W, 4)``, a position's 4 channels already one word, so each word is copied
    (xor ``flip`` in every byte) into the padded phase planes with no transpose; ``xoff`` is
    the byte offset of the group's first block, ``ci``/``tmp`` are unused (the padded
    channels of a block are zero, and the filter's rows are zero there)."""
    xw = x.view(np.uint32)
    h_, w_ = hw[0], hw[1]
    ph, pw, sh, sw, hph, wph, nr, nc, plane = geo[0], geo[1], geo[2], geo[3], geo[4], \
        geo[5], geo[6], geo[7], geo[8]  # fmt: skip
    pplane = hph * wph
    fill = np.uint32(u0 * 0x01010101)
    fl = np.uint32(np.uint32(flip) * np.uint32(0x01010101))
    whole = ph == 0 and pw == 0 and sh == 1 and sw == 1
    for cg in range(cg0, cg1):
        base = cg * plane
        src0 = xoff // 4 + cg * h_ * w_
        if whole:  # unpadded, stride 1: the band's rows are one run (one vectorized loop)
            r = src0 + k0 * w_
            for q in range((min(h_, k0 + hph) - k0) * w_):
                x4[np.uintp(base + q)] = xw[np.uintp(r + q)] ^ fl
        for i in range(0 if whole else nr):
            pr = geo[9 + i]
            for j in range(nc):
                pc = geo[9 + nr + j]
                lo = min(max(0, (pw - pc + sw - 1) // sw), wph)
                hi = min(max(lo, (w_ + pw - pc + sw - 1) // sw), wph)
                dst = base + (i * nc + j) * pplane
                for k in range(hph):
                    h = (k + k0) * sh + pr - ph
                    row = dst + k * wph
                    q0, q1 = (lo, hi) if 0 <= h < h_ else (wph, wph)
                    for q in range(q0):
                        x4[np.uintp(row + q)] = fill
                    for q in range(q1, wph):
                        x4[np.uintp(row + q)] = fill
                    r = src0 + h * w_ + pc - pw
                    if sw == 1:  # (contiguous: vectorized)
                        for q in range(q0, q1):
                            x4[np.uintp(row + q)] = xw[np.uintp(r + q)] ^ fl
                    else:
                        for q in range(q0, q1):
                            x4[np.uintp(row + q)] = xw[np.uintp(r + q * sw)] ^ fl
        for j in range(nr * nc * pplane, plane):  # (read by dropped lanes)
            x4[np.uintp(base + j)] = fill


def _cut4_py(src, dst, rows, wp, ow, p0, p1, r0, r1):
    """Rows [r0, r1) of output channels [p0, p1) (counted over the samples) of ``dst``
    (flat uint8, NCHW4 ``(N, C/4, rows, ow, 4)`` bytes) from ``src``'s planes (flat uint8,
    ``rows x wp`` each, the columns past ``ow`` dropped): whole blocks of 4 channels a
    row of words at a time (:func:`_words`), a block's channels outside [p0, p1) left."""
    dw = dst.view(np.uint32)
    full = np.uint32(0xFFFFFFFF)
    for b in range(p0 // 4, (p1 + 3) // 4):
        c0, c1 = max(p0, 4 * b), min(p1, 4 * b + 4)
        for r in range(r0, r1):
            d = (b * rows + r) * ow
            if c1 - c0 == 4:
                s = (4 * b * rows + r) * wp
                step = rows * wp
                _words(dw, d, src, s, s + step, s + 2 * step, s + 3 * step, ow, 0, full, 0)
            else:
                for c in range(c0, c1):
                    s = (c * rows + r) * wp
                    for q in range(ow):
                        dst[np.uintp((d + q) * 4 + c - 4 * b)] = src[np.uintp(s + q)]


def _to_blocked_py(x, y, hw, b0, b1):
    """Blocks [b0, b1) of 4 channels of the flat 8-bit NCHW4 ``y`` from the flat 8-bit
    NCHW ``x`` (planes of ``hw`` bytes): each block's 4 planes interleaved into words."""
    yw = y.view(np.uint32)
    full = np.uint32(0xFFFFFFFF)
    for b in range(b0, b1):
        s = b * 4 * hw
        _words(yw, b * hw, x, s, s + hw, s + 2 * hw, s + 3 * hw, hw, 0, full, 0)


def _from_blocked_py(y, x, hw, b0, b1):
    """Blocks [b0, b1) of the flat 8-bit NCHW ``x`` from the flat 8-bit NCHW4 ``y``: each
    word's 4 bytes to its block's 4 planes (a plane a pass, vectorized)."""
    yw = y.view(np.uint32)
    for b in range(b0, b1):
        s = b * hw
        for k in range(4):
            d = (b * 4 + k) * hw
            sh = np.uint32(8 * k)
            for p in range(hw):
                x[np.uintp(d + p)] = np.uint8((yw[np.uintp(s + p)] >> sh) & np.uint32(0xFF))


#: the VNNI tile, relayout, column drop and unit taker the GEMM and band loops call: module
#: globals, not closure cells (Numba keys a cached closure by its cells' pickles, and a
#: compiled function's or an intrinsic's differs in every process)
_vnni_tile_g = _relay_g = _cut_g = _take_g = _relay4_g = _cut4_g = None


def _make_gemm(rows: int, nv: int, epi: int):
    global _vnni_tile_g
    _vnni_tile_g = vnni_tile()

    def gemm(x4, w, init, out, q, geom, t0, t1):
        """Items [t0, t1) (tile of positions ``t // noc``, chunk of output-channel tiles
        ``t % noc``) of one group of one sample; see :func:`gemm_tiles`."""
        p_, o_, kg_, noc, out0, w0, i0 = geom[0], geom[1], geom[2], geom[3], geom[4], \
            geom[5], geom[6]  # fmt: skip
        obn = (o_ + rows - 1) // rows
        per = (obn + noc - 1) // noc
        wstride = kg_ * 4
        for t in range(t0, t1):
            pt, oc = t // noc, t % noc
            p0 = pt * nv * LANES
            count = p_ - p0
            for ob in range(oc * per, min(obn, (oc + 1) * per)):
                o = ob * rows
                # each k group's taps at its offset into the relaid planes, from geom[7]
                _vnni_tile_g(x4, p0 * 4, LANES * 4, 0, geom, _GEOM, w, w0 + o * wstride, wstride,
                     kg_, init, i0 + o, out, out0 + o * p_ + p0, p_, count,
                     min(rows, o_ - o), q, rows, nv, epi, 1)  # fmt: skip

    return gemm


def _pack_filter_py(filt, w, init, flip, zf, u0, kg_, op, vec):
    """``w`` (G, OP, KG * 4) int8: ``filt`` (G, O, I, FH, FW) minus ``zf`` (flipped when
    ``flip``), its k groups ``(cg, a, b)`` row-major, zero past I and O; with ``vec`` > 0,
    each block of ``vec`` rows interleaved by k group instead, ``(G, OP / vec, KG, vec,
    4)`` (:mod:`.vnni_channels`' vectors of output channels); ``init`` (G * OP) int32:
    ``-u0`` times each row's sum (wrapping, as the sums do)."""
    g_, o_, i_, fh, fw = filt.shape
    for g in range(g_):
        for o in range(op):
            total = 0
            if vec:  # the row's 4 bytes of each k group at its place in the block's vector
                row, kstep = ((g * op + o - o % vec) * kg_ + o % vec) * 4, 4 * (vec - 1)
            else:
                row, kstep = (g * op + o) * kg_ * 4, 0
            k = 0
            for cg in range(kg_ // (fh * fw)):
                for a in range(fh):
                    for b in range(fw):
                        for c4 in range(4):
                            c = cg * 4 + c4
                            v = 0
                            if o < o_ and c < i_:
                                if flip:
                                    v = np.int32(filt[g, o, c, fh - 1 - a, fw - 1 - b]) - zf
                                else:
                                    v = np.int32(filt[g, o, c, a, b]) - zf
                            w[row + k + k // 4 * kstep] = np.int8(v)
                            total += v
                            k += 1
            init[g * op + o] = np.int32(np.int64(-u0 * total) & 0xFFFFFFFF)


@intrinsic
def _copy_bytes(typingctx, dst, d0, src, s0, n):
    """``dst[d0 : d0 + n] = src[s0 : s0 + n]`` (flat uint8 arrays) in 64-byte vectors, the
    last one masked (a row of an output plane: 7 to 112 bytes, which LLVM's loop vectorizer
    leaves mostly to its scalar remainder). No index is checked."""
    if not (isinstance(dst, types.Array) and isinstance(src, types.Array)):
        return None

    def codegen(context, builder, signature, args):
        dst_v, d0_v, src_v, s0_v, n_v = args
        i1, i8, i64 = ir.IntType(1), ir.IntType(8), ir.IntType(64)
        vb = ir.VectorType(i8, 64)
        vm = ir.VectorType(i1, 64)
        arrs = [context.make_array(signature.args[k])(context, builder, args[k]) for k in (0, 2)]
        dptr = builder.gep(builder.bitcast(arrs[0].data, i8.as_pointer()), [d0_v])
        sptr = builder.gep(builder.bitcast(arrs[1].data, i8.as_pointer()), [s0_v])
        load = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
            vb, [vb.as_pointer(), ir.IntType(32), vm, vb]), "llvm.masked.load.v64i8.p0")
        store = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
            ir.VoidType(), [vb, vb.as_pointer(), ir.IntType(32), vm]),
            "llvm.masked.store.v64i8.p0")  # fmt: skip
        one = ir.Constant(ir.IntType(32), 1)
        full = builder.sdiv(builder.sub(n_v, ir.Constant(i64, 1)), ir.Constant(i64, 64))
        with cgutils.for_range(builder, full, intp=i64) as loop:
            off = builder.mul(loop.index, ir.Constant(i64, 64))
            val = builder.load(builder.bitcast(builder.gep(sptr, [off]), vb.as_pointer()),
                               align=1)  # fmt: skip
            builder.store(val, builder.bitcast(builder.gep(dptr, [off]), vb.as_pointer()),
                          align=1)  # fmt: skip
        off = builder.mul(full, ir.Constant(i64, 64))
        rem = builder.sub(n_v, off)  # 1 .. 64 bytes: the mask's low ``rem`` bits
        with builder.if_then(builder.icmp_signed(">", rem, ir.Constant(i64, 0))):
            bits = builder.lshr(ir.Constant(i64, -1), builder.sub(ir.Constant(i64, 64), rem))
            mask = builder.bitcast(bits, vm)
            sp = builder.bitcast(builder.gep(sptr, [off]), vb.as_pointer())
            val = builder.call(load, [sp, one, mask, ir.Constant(vb, None)])
            builder.call(store, [val, builder.bitcast(builder.gep(dptr, [off]), vb.as_pointer()),
                                 one, mask])  # fmt: skip
        return context.get_dummy_value()

    return types.void(dst, d0, src, s0, n), codegen


def _drop_columns_py(src, dst, rows, wp, ow, p0, p1, r0, r1):
    """Rows [r0, r1) of planes [p0, p1) of ``dst`` (flat uint8, planes of ``rows`` rows of
    ``ow`` bytes): the first ``ow`` bytes of ``src``'s rows of ``wp`` (flat uint8, planes of
    ``rows x wp``)."""
    for p in range(p0, p1):
        for r in range(r0, r1):
            _copy_bytes(dst, (p * rows + r) * ow, src, (p * rows + r) * wp, ow)


#: the entries of :func:`bands`'s ``geom`` before the taps' offsets
_BAND_GEOM = 13


def _make_bands(rows: int, nv: int, epi: int, drop: bool, blocked: bool = False):
    global _vnni_tile_g, _relay_g, _cut_g, _take_g, _relay4_g, _cut4_g
    _vnni_tile_g = vnni_tile()
    _relay_g, _cut_g, _take_g = _compiled("relayout"), _compiled("drop"), tiled_jit.take_unit()
    _relay4_g, _cut4_g = _compiled("relayout4"), _compiled("cut4")

    def bands(x, x4w, tmp, xoff, hw, ci, geo, flip, u0, x4, w, init, out, q, geom, src8, dst8,
              counter, me):  # fmt: skip
        """The units thread ``me`` takes; see :func:`bands`."""
        rb, oh, wph, nchunk, o_, kg_, cg_, out0, pg, w0, i0, isz, ow = geom[0], geom[1], \
            geom[2], geom[3], geom[4], geom[5], geom[6], geom[7], geom[8], geom[9], \
            geom[10], geom[11], geom[12]  # fmt: skip
        obn = (o_ + rows - 1) // rows
        per = (obn + nchunk - 1) // nchunk
        wstride = kg_ * 4
        plane0 = out0 // pg
        relaid = -1  # the band in this thread's buffer
        while True:
            u = _take_g(counter, me)
            if u < 0:
                break
            b, c = u // nchunk, u % nchunk
            r0 = b * rb
            if b != relaid:  # the band's phase-plane rows into this thread's buffer
                if blocked:
                    _relay4_g(x, x4w, tmp, xoff, hw, ci, geo, flip, u0, 0, cg_, r0)
                else:
                    _relay_g(x, x4w, tmp, xoff, hw, ci, geo, flip, u0, 0, cg_, r0)
                relaid = b
            pb = (min(oh, r0 + rb) - r0) * wph
            ob0, ob1 = c * per, min(obn, (c + 1) * per)
            for p0 in range(0, pb, nv * LANES):
                for ob in range(ob0, ob1):
                    o = ob * rows
                    _vnni_tile_g(x4, p0 * 4, LANES * 4, 0, geom, _BAND_GEOM, w, w0 + o * wstride,
                         wstride, kg_, init, i0 + o, out, out0 + o * pg + r0 * wph + p0, pg,
                         pb - p0, min(rows, o_ - o), q, rows, nv, epi, 1)  # fmt: skip
            if blocked and ob0 < ob1:  # (8-bit outputs only)
                _cut4_g(src8, dst8, oh, wph, ow, plane0 + ob0 * rows,
                        plane0 + min(o_, ob1 * rows), r0, min(oh, r0 + rb))  # fmt: skip
            elif drop and ob0 < ob1:
                _cut_g(src8, dst8, oh, wph * isz, ow * isz, plane0 + ob0 * rows,
                    plane0 + min(o_, ob1 * rows), r0, min(oh, r0 + rb))  # fmt: skip

    return bands


@functools.cache
def _compiled(name: str):
    opts = dict(nogil=True, cache=True, error_model="numpy", fastmath=False)
    if name.startswith("bands"):
        _, rows, vecs, epi, drop, blocked = name.split(",")
        return njit(**opts)(_make_bands(int(rows), int(vecs), int(epi), drop == "1",
                                        blocked == "1"))  # fmt: skip
    plain = {
        "relayout": _relayout_py, "relayout4": _relayout4_py, "cut4": _cut4_py,
        "to_blocked": _to_blocked_py, "from_blocked": _from_blocked_py,
        "pack": _pack_filter_py, "drop": _drop_columns_py,
    }  # fmt: skip
    if name in plain:
        return njit(**opts)(plain[name])
    rows, vecs, epi = name.split(",")
    return njit(**opts)(_make_gemm(int(rows), int(vecs), int(epi)))


def relayout(x, x4, tmp, xoff, hw, ci, geo, flip, u0, cg0, cg1) -> None:
    """Blocks [cg0, cg1) of 4 channels of the relaid source ``x4`` (flat uint32; see the
    module's layouts): the ``ci`` channels of the flat uint8 ``x`` from ``xoff``, planes
    of ``hw`` = (H, W), padded and split into the stride's phase planes as ``geo`` says
    (:func:`_relayout_py`), each value xor ``flip``, ``u0`` where there is no source
    value; ``tmp`` (uint32, H W words per block at column stride 2) is scratch."""
    _compiled("relayout")(x, x4, tmp, int(xoff), hw, int(ci), geo, np.uint8(flip), int(u0),
                          int(cg0), int(cg1), 0)  # fmt: skip


def pack_filter(filt, w, init, flip: bool, zf: int, u0: int, kg: int, op: int,
                vec: int = 0) -> None:  # fmt: skip
    """Pack ``filt`` (G, O, I, FH, FW) 8-bit into ``w`` (G * OP * KG * 4 int8; with ``vec``,
    blocks of ``vec`` rows interleaved by k group) and its row sums times ``-u0`` into
    ``init`` (G * OP int32); see :func:`_pack_filter_py`."""
    _compiled("pack")(filt, w, init, bool(flip), int(zf), int(u0), int(kg), int(op), int(vec))


def gemm_tiles(rows, vecs, x4, w, init, out, q, geom, epi, t0, t1) -> None:
    """Work items [t0, t1) of one group of one sample with tiles of ``rows`` output
    channels by ``vecs`` vectors of positions (a shape of :data:`TILES`).

    ``geom`` (int64): P (the positions computed: OH times the phase planes' row WPh),
    O, KG, chunks of output channels per tile of positions, the output's first index, the
    packed filter's first byte, ``init``'s first index, then each k group's byte offset
    into ``x4`` (its tap's phase plane and place in it). ``out`` is flat, int32 for
    ``epi`` :data:`EPI_INT32`, else uint8, rows of P positions.
    """
    _compiled(f"{rows},{vecs},{epi}")(x4, w, init, out, q, geom, int(t0), int(t1))


def drop_columns(src, dst, rows: int, wp: int, ow: int, p0: int, p1: int) -> None:
    """Planes [p0, p1) of the flat uint8 ``dst`` (planes of ``rows`` rows of ``ow`` bytes)
    from the flat uint8 ``src`` (rows of ``wp`` bytes, those past ``ow`` dropped): the
    output of :func:`gemm_tiles`, computed over whole rows of the phase planes."""
    _compiled("drop")(src, dst, int(rows), int(wp), int(ow), int(p0), int(p1), 0, int(rows))


def relayout_blocked(src, dst, hw: int, to_blocked: bool, b0: int, b1: int) -> None:
    """Blocks [b0, b1) of 4 channels between the flat uint8 NCHW (planes of ``hw`` bytes)
    and NCHW4 arrays: ``src`` NCHW into ``dst`` NCHW4 with ``to_blocked``, else ``src``
    NCHW4 into ``dst`` NCHW (RelayoutFormat's NCHW_NCHW4 and NCHW4_NCHW of 8-bit values;
    10-80x NumPy's strided copies)."""
    name = "to_blocked" if to_blocked else "from_blocked"
    _compiled(name)(src, dst, int(hw), int(b0), int(b1))


def bands(rows, vecs, epi, drop, x, x4w, tmp, xoff, hw, ci, geo, flip, u0, x4, w, init, out, q,
          geom, src8, dst8, counter, me) -> None:  # fmt: skip
    """Thread ``me``'s share of one group of one sample computed by bands of output rows, with
    tiles of ``rows`` output channels by ``vecs`` vectors of positions: the units it takes
    from ``counter`` (:func:`megbrain.kernels.tiled_jit.take_unit`), unit ``u`` being band
    ``u // chunks`` (output rows ``[b RB, b RB + RB)``) by chunk ``u % chunks`` of the
    output channels' tiles. The band's source rows are relaid (:func:`relayout`'s arguments
    ``x`` to ``u0``; ``geo`` with the band's ``RB`` plus the taps' reach as its phase-plane
    rows) into ``x4w`` / ``x4`` (the thread's own buffer as words and bytes) when its last
    unit was of another band, then its tiles run and, with ``drop``, its rows' columns are
    dropped from ``src8`` (``out``'s bytes) into ``dst8``. ``geom`` (int64): RB, OH, WPh,
    chunks, O, KG, CG, the output's index of the group's first position, the positions P of
    a plane of ``out`` (``OH WPh``), the packed filter's first byte, ``init``'s first index,
    ``out``'s item size, OW, then each k group's byte offset into the band's buffer. No unit
    waits for another's: a layer is one hand-off to the pool, and a thread the OS holds back
    delays only the unit it has."""
    bands_kernel(rows, vecs, epi, drop)(x, x4w, tmp, int(xoff), hw, int(ci), geo,
                                        np.uint8(flip), int(u0), x4, w, init, out, q, geom,
                                        src8, dst8, counter, int(me))  # fmt: skip


def bands_kernel(rows: int, vecs: int, epi: int, drop: bool, blocked: bool = False):
    """The compiled :func:`bands` of ``rows``, ``vecs``, ``epi`` and ``drop``, called with
    those four left out and ``xoff``, ``ci``, ``u0``, ``me`` Python ints, ``flip`` a numpy
    uint8 (a bound call then skips :func:`bands`'s conversions). With ``blocked``, the source is
    NCHW4 (relaid by :func:`_relayout4_py`: words copied, no transpose) and the 8-bit
    output is written NCHW4 (:func:`_cut4_py`: four channels' rows interleaved into words),
    ``dst8`` the blocked output's bytes."""
    return _compiled(f"bands,{rows},{vecs},{epi},{int(bool(drop))},{int(bool(blocked))}")
