"""Compiled (Numba) loops of the quantized (8-bit) convolution of :mod:`..quantized`: an
im2col of the zero-point-shifted source into one row per output position (int8 when no zero
point shifts the values, else int16) and an integer GEMM of dot products accumulating the
products exactly in int32, as MegDNN's kernels do (no float emulation).

Every loop is single-threaded and GIL-free (``nogil``) and takes a ``[begin, end)`` range of
its outermost items, so that a caller may split one call over a few Python threads. The loops
are compiled on first use and allocate nothing.
"""

from __future__ import annotations

import functools

import numpy as np
from llvmlite import binding, ir
from numba import carray, njit
from numba.core import cgutils, config, types
from numba.extending import intrinsic

from ...tiled_jit import stack_tile, zmm_vectors

_stack_tile = stack_tile()
_zmm_vectors = zmm_vectors()

__all__ = [
    "CHANNEL_LANES",
    "depthwise",
    "depthwise_band_rows",
    "depthwise_channel_rows",
    "depthwise_channels",
    "depthwise_masked_rows",
    "gemm_blocks",
    "masked_vectors",
    "int8_gemm",
    "int8_im2col",
    "quantized_add",
    "quantize_8bit",
]

#: output positions filled together by the im2col (their rows stay in the L1 cache)
_ROWS = 32
#: the largest float32 below 0.5 (rounding half away from zero by one add, :func:`_quantize`)
_BELOW_HALF = np.nextafter(np.float32(0.5), np.float32(0))


def masked_vectors() -> bool:
    """Whether the compiler targets AVX-512 with byte and word masks (``NUMBA_CPU_FEATURES``,
    else the host's features): there the depthwise loop's short runs of bytes are masked
    vector loads and stores (:func:`_masked_fill`, :func:`_taps9_q16`); elsewhere LLVM
    would split those into a branch per lane, and the loops' plain forms are kept."""
    features = config.CPU_FEATURES
    if features is None:
        features = binding.get_host_cpu_features().flatten()
    return {"+avx512f", "+avx512bw"} <= set(features.split(","))


def _data(context, builder, ty, value):
    return context.make_array(ty)(context, builder, value).data


def _lane_mask(builder, lanes, lo, hi, step=1):
    """The ``<lanes x i1>`` mask (``lanes`` <= 64) of the lanes ``k`` with ``lo <= k < hi``
    (i64 values) and ``k % step == 0``, made as the bits of one integer (a k-register move)."""
    i64 = ir.IntType(64)

    def ones(k):  # the low min(max(k, 0), lanes) bits set
        k = builder.select(builder.icmp_signed("<", k, ir.Constant(i64, 0)),
                           ir.Constant(i64, 0), k)  # fmt: skip
        low = builder.sub(builder.shl(ir.Constant(i64, 1), k), ir.Constant(i64, 1))
        full = builder.icmp_signed(">=", k, ir.Constant(i64, lanes))
        return builder.select(full, ir.Constant(i64, (1 << lanes) - 1 if lanes < 64 else -1), low)

    bits = builder.and_(ones(hi), builder.not_(ones(lo)))
    if step > 1:
        bits = builder.and_(bits, ir.Constant(i64, sum(1 << k for k in range(0, lanes, step))))
    if lanes < 64:
        bits = builder.trunc(bits, ir.IntType(lanes))
    return builder.bitcast(bits, ir.VectorType(ir.IntType(1), lanes))


@intrinsic
def _masked_fill(typingctx, xp, doff, x, soff, lo, hi, cnt, zxf, step):
    """Sixteen float32 of a depthwise band's padded row: ``xp[doff + k] = float32(x[soff +
    step k]) - zxf`` for the lanes ``lo <= k < hi`` (a source value), 0 for the others, for
    ``k < cnt``; ``x`` bytes (signed or not), ``step`` a literal 1 or 2 (2: every other
    byte, one parity of the columns of a stride-2 row). Only the bytes read are touched:
    ``soff`` may point before ``x`` or ``hi`` past its end."""
    if not (isinstance(step, types.IntegerLiteral) and isinstance(x, types.Array)
            and x.dtype.bitwidth == 8 and isinstance(xp, types.Array)
            and xp.dtype == types.float32):
        return None  # fmt: skip
    st_ = step.literal_value
    signed = x.dtype.signed

    def codegen(context, builder, signature, args):
        xp_v, do_v, x_v, so_v, lo_v, hi_v, cnt_v, z_v = args[:8]
        i8, i32, i64, f32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()
        do_, so_, lo_, hi_, cnt_ = (context.cast(builder, v, signature.args[k], types.int64)
                                    for k, v in ((1, do_v), (3, so_v), (4, lo_v), (5, hi_v),
                                                 (6, cnt_v)))  # fmt: skip
        nb = 16 * st_
        bty = ir.VectorType(i8, nb)
        bmask = _lane_mask(builder, nb, builder.mul(lo_, ir.Constant(i64, st_)),
                           builder.mul(hi_, ir.Constant(i64, st_)), st_)
        load = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(bty, [bty.as_pointer(), i32, bmask.type, bty]),
            f"llvm.masked.load.v{nb}i8.p0")
        xd = builder.bitcast(_data(context, builder, signature.args[2], x_v), i8.as_pointer())
        ptr = builder.bitcast(builder.gep(xd, [so_]), bty.as_pointer())
        one = ir.Constant(i32, 1)
        raw = builder.call(load, [ptr, one, bmask, ir.Constant(bty, None)])
        if st_ > 1:
            raw = builder.shuffle_vector(raw, ir.Constant(bty, ir.Undefined), ir.Constant(
                ir.VectorType(i32, 16), [ir.Constant(i32, st_ * k) for k in range(16)]))
        v32 = ir.VectorType(i32, 16)
        wide = builder.sext(raw, v32) if signed else builder.zext(raw, v32)
        fty = ir.VectorType(f32, 16)
        zv = builder.insert_element(ir.Constant(fty, ir.Undefined),
                                    context.cast(builder, z_v, signature.args[7],
                                                 types.float32), ir.Constant(i32, 0))
        zv = builder.shuffle_vector(zv, ir.Constant(fty, ir.Undefined), ir.Constant(v32, None))
        val = builder.fsub(builder.sitofp(wide, fty), zv)
        val = builder.select(_lane_mask(builder, 16, lo_, hi_), val, ir.Constant(fty, None))
        smask = _lane_mask(builder, 16, ir.Constant(i64, 0), cnt_)
        store = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [fty, fty.as_pointer(), i32,
                                                            smask.type]),
            "llvm.masked.store.v16f32.p0")  # fmt: skip
        xpd = _data(context, builder, signature.args[0], xp_v)
        builder.call(store, [val, builder.bitcast(builder.gep(xpd, [do_]), fty.as_pointer()),
                             ir.Constant(i32, 4), smask])  # fmt: skip
        return context.get_dummy_value()

    return types.void(xp, doff, x, soff, lo, hi, cnt, zxf, step), codegen


@intrinsic
def _taps9_q16(typingctx, dst, d0, f0, r0, r1, pitch, ow, xp, x0, row, col1, col2, ws, bc, q,
               relu):  # fmt: skip
    """:func:`_taps9_requantize` of the 16 positions ``f0 ... f0 + 15`` of a band (rows of
    ``pitch`` positions, the first ``ow`` of each an output) whose taps start at ``xp[x0]``,
    as explicit vectors (a loop of 16 is unrolled before LLVM's loop vectorizer sees it, and
    Numba's pipeline has no SLP vectorizer to take the copies): nine multiply-adds by the
    tuple ``ws``, the bias (below 2^23 as the sum's start, else added in int32), the
    requantize of :func:`_quantize` (ReLU when the literal ``relu`` is 1; ``q`` its five
    values and the output scale's reciprocal (0: none), by which the vector is multiplied;
    divided instead where a lane comes within 2^-10 of a half-integer), then per band row
    ``r0 <= r < r1`` that the positions meet, its output columns stored by one masked store
    to ``dst[d0 + r ow + column]``."""
    if not (isinstance(relu, types.IntegerLiteral) and isinstance(dst, types.Array)
            and dst.dtype.bitwidth == 8 and ws == types.UniTuple(types.float32, 9)
            and q == types.UniTuple(types.float32, 6)):
        return None  # fmt: skip
    with_relu = relu.literal_value == 1

    def codegen(context, builder, signature, args):
        (dst_v, d0_v, f0_v, r0_v, r1_v, pitch_v, ow_v, xp_v, x0_v, row_v, c1_v, c2_v, ws_v,
         bc_v, q_v) = args[:15]  # fmt: skip
        i8, i32, i64, f32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()
        v32, vf = ir.VectorType(i32, 16), ir.VectorType(f32, 16)

        def i64_of(k, v):
            return context.cast(builder, v, signature.args[k], types.int64)

        def splat(scalar, vty):
            one = builder.insert_element(ir.Constant(vty, ir.Undefined), scalar,
                                         ir.Constant(i32, 0))  # fmt: skip
            return builder.shuffle_vector(one, ir.Constant(vty, ir.Undefined),
                                          ir.Constant(v32, None))  # fmt: skip

        xd = _data(context, builder, signature.args[7], xp_v)
        x0, row, c1, c2 = (i64_of(k, v) for k, v in ((8, x0_v), (9, row_v), (10, c1_v),
                                                     (11, c2_v)))  # fmt: skip
        bc = context.cast(builder, bc_v, signature.args[13], types.int32)
        big = ir.Constant(i32, 1 << 23)
        small = builder.and_(builder.icmp_signed("<", builder.neg(big), bc),
                             builder.icmp_signed("<", bc, big))
        bf = builder.select(small, builder.sitofp(bc, f32), ir.Constant(f32, 0))
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vf, [vf] * 3),
                                             "llvm.fmuladd.v16f32")  # fmt: skip
        acc = splat(bf, vf)
        for a in range(3):
            ra = builder.add(x0, builder.mul(row, ir.Constant(i64, a)))
            for b, cb in enumerate((ir.Constant(i64, 0), c1, c2)):
                ptr = builder.bitcast(builder.gep(xd, [builder.add(ra, cb)]), vf.as_pointer())
                wv = splat(builder.extract_value(ws_v, 3 * a + b), vf)
                acc = builder.call(fma, [wv, builder.load(ptr, align=4), acc])
        wrapped = builder.sitofp(builder.add(builder.fptosi(acc, v32), splat(bc, v32)), vf)
        acc = builder.select(small, acc, wrapped)
        s_in, s_out, zp, qmin, qmax = (splat(builder.extract_value(q_v, k), vf)
                                       for k in range(5))
        inv = builder.extract_value(q_v, 5)
        zero = ir.Constant(vf, None)
        val = builder.fmul(acc, s_in)
        if with_relu:  # NaN stays NaN, as _quantize's select
            val = builder.select(builder.fcmp_ordered("<", val, zero), zero, val)
        lo, hi = builder.fsub(qmin, zp), builder.fsub(qmax, zp)

        def clamped(v):
            v = builder.select(builder.fcmp_ordered(">", v, lo), v, lo)
            return builder.select(builder.fcmp_ordered("<", v, hi), v, hi)

        # the quotient by the reciprocal: within 2^-22 |v| of the division's, so that both
        # round alike unless within 2^-10 of a half-integer (after the clamp: beyond it both
        # saturate); there, or with no reciprocal (inv 0), the division itself
        fv1 = ir.FunctionType(vf, [vf])
        vtrunc = cgutils.get_or_insert_function(builder.module, fv1, "llvm.trunc.v16f32")
        vabs = cgutils.get_or_insert_function(builder.module, fv1, "llvm.fabs.v16f32")
        fast = clamped(builder.fmul(val, splat(inv, vf)))
        frac = builder.call(vabs, [builder.fsub(fast, builder.call(vtrunc, [fast]))])
        off = builder.call(vabs, [builder.fsub(frac, ir.Constant(vf, [ir.Constant(f32, 0.5)]
                                                                   * 16))])  # fmt: skip
        near = builder.fcmp_ordered("<", off, ir.Constant(vf, [ir.Constant(f32, 2.0**-10)]
                                                          * 16))  # fmt: skip
        need = builder.or_(builder.icmp_unsigned("!=", builder.bitcast(near, ir.IntType(16)),
                                                 ir.Constant(ir.IntType(16), 0)),
                           builder.fcmp_ordered("==", inv, ir.Constant(f32, 0)))  # fmt: skip
        entry = builder.block
        with builder.if_then(need, likely=False):
            exact = clamped(builder.fdiv(val, s_out))
            slow = builder.block
        val = builder.phi(vf)
        val.add_incoming(fast, entry)
        val.add_incoming(exact, slow)
        half = ir.Constant(vf, [ir.Constant(f32, float(_BELOW_HALF))] * 16)
        sign = builder.select(builder.fcmp_ordered(">=", val, zero), half, builder.fneg(half))
        res = builder.add(builder.fptosi(builder.fadd(val, sign), v32), builder.fptosi(zp, v32))
        bty = ir.VectorType(i8, 16)
        res = builder.trunc(res, bty)
        dd = builder.bitcast(_data(context, builder, signature.args[0], dst_v), i8.as_pointer())
        d0, f0, pitch, ow = (i64_of(k, v) for k, v in ((1, d0_v), (2, f0_v), (5, pitch_v),
                                                       (6, ow_v)))  # fmt: skip
        mtype = ir.VectorType(ir.IntType(1), 16)
        store = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [bty, bty.as_pointer(), i32, mtype]),
            "llvm.masked.store.v16i8.p0")
        r0, r1 = i64_of(3, r0_v), i64_of(4, r1_v)
        with cgutils.for_range_slice(builder, r0, r1, ir.Constant(i64, 1)) as (r, _):
            lo = builder.sub(builder.mul(r, pitch), f0)  # the row's first lane
            mask = _lane_mask(builder, 16, lo, builder.add(lo, ow))
            at = builder.sub(builder.add(d0, builder.mul(r, ow)), lo)
            ptr = builder.bitcast(builder.gep(dd, [at]), bty.as_pointer())
            builder.call(store, [res, ptr, ir.Constant(i32, 1), mask])
        return context.get_dummy_value()

    return types.void(dst, d0, f0, r0, r1, pitch, ow, xp, x0, row, col1, col2, ws, bc, q,
                      relu), codegen


def _im2col_py(x, col, n, fh, fw, sh, sw, ph, pw, dh, dw, ow, zx, g0, g1):  # pragma: no cover
    """Rows of sample ``n`` for the groups [g0, g1): ``col[g, r * OW + q, (i, a, b)]`` =
    ``x[n, g * I + i, r sh - ph + a dh, q sw - pw + b dw] - zx``, 0 outside the image (each
    output position's window is one contiguous row, the operand of the GEMM's dots).

    Blocks of :data:`_ROWS` positions are filled one (i, a, b) column at a time: the source
    is read along its rows and the block's rows stay in cache while they are written
    across."""
    p_, k_ = col.shape[1], col.shape[2]
    i_ = k_ // (fh * fw)
    h, w = x.shape[2], x.shape[3]
    for g in range(g0, g1):
        for p0 in range(0, p_, _ROWS):
            p1 = min(p0 + _ROWS, p_)
            for i in range(i_):
                plane = x[n, g * i_ + i]
                for a in range(fh):
                    for b in range(fw):
                        k = (i * fh + a) * fw + b
                        r, q = p0 // ow, p0 % ow
                        for p in range(p0, p1):
                            ih = r * sh - ph + a * dh
                            iw = q * sw - pw + b * dw
                            if ih < 0 or ih >= h or iw < 0 or iw >= w:
                                col[g, p, k] = 0
                            else:
                                col[g, p, k] = plane[ih, iw] - zx
                            q += 1
                            if q == ow:
                                q = 0
                                r += 1


def _gemm_py(col, w, y, n, t0, t1):  # pragma: no cover - compiled
    """Row blocks t in [t0, t1) of sample ``n`` (block t = g * ceil(O / 4) + j holds the
    output channels o = 4 j ... 4 j + 3 of group g): ``y[n, g * O + o, p] = sum_k w[g, o, k]
    * col[g, p, k]``, exact in int32 (y is (N, G*O, P) int32; w (G, O, K) and col (G, P, K)
    8- or 16-bit).

    Each output is a dot product over the contiguous K values of a window, which LLVM turns
    into widening multiply-adds (``vpmaddwd``); four output channels share each window's
    loads."""
    p_, k_ = col.shape[1], col.shape[2]
    o_ = w.shape[1]
    ob = (o_ + 3) // 4
    for t in range(t0, t1):
        g, o0 = t // ob, (t % ob) * 4
        rows = min(4, o_ - o0)
        base = g * o_ + o0
        if rows == 4:
            w0, w1, w2, w3 = w[g, o0], w[g, o0 + 1], w[g, o0 + 2], w[g, o0 + 3]
            for p in range(p_):
                c = col[g, p]
                s0 = np.int32(0)
                s1 = np.int32(0)
                s2 = np.int32(0)
                s3 = np.int32(0)
                for k in range(k_):
                    v = np.int32(c[k])
                    s0 += np.int32(w0[k]) * v
                    s1 += np.int32(w1[k]) * v
                    s2 += np.int32(w2[k]) * v
                    s3 += np.int32(w3[k]) * v
                y[n, base, p] = s0
                y[n, base + 1, p] = s1
                y[n, base + 2, p] = s2
                y[n, base + 3, p] = s3
            continue
        for r in range(rows):
            wr = w[g, o0 + r]
            for p in range(p_):
                c = col[g, p]
                s = np.int32(0)
                for k in range(k_):
                    s += np.int32(wr[k]) * np.int32(c[k])
                y[n, base + r, p] = s


@njit(nogil=True, cache=True, error_model="numpy", inline="always")
def _taps9(acc, o, xp, ws, n, base, row, col1, col2):  # pragma: no cover - compiled
    """A 3x3 filter's nine taps in one pass: ``acc[o + j] = sum_ab ws[3 a + b] xp[base + a
    row + col_b + j]`` for j < n, with column offsets ``col_0 = 0``, ``col1``, ``col2``
    (unsigned offsets; each sum stays in a register)."""
    w0, w1, w2, w3, w4, w5, w6, w7, w8 = ws[0], ws[1], ws[2], ws[3], ws[4], ws[5], ws[6], \
        ws[7], ws[8]  # fmt: skip
    r0 = base
    r1 = base + row
    r2 = r1 + row
    for j in range(n):
        acc[o + j] = (w0 * xp[r0 + j] + w1 * xp[r0 + col1 + j] + w2 * xp[r0 + col2 + j]
                      + w3 * xp[r1 + j] + w4 * xp[r1 + col1 + j] + w5 * xp[r1 + col2 + j]
                      + w6 * xp[r2 + j] + w7 * xp[r2 + col1 + j] + w8 * xp[r2 + col2 + j])


@njit(nogil=True, cache=True, error_model="numpy", inline="always")
def _taps9_requantize(dst, o, xp, ws, n, base, row, col1, col2, bc, q, relu):  # pragma: no cover
    """:func:`_taps9`'s nine-tap sums for j < n requantized as they are made, ``dst[o + j]``
    = the 8-bit value MegDNN's float32 chain gives for ``sum + bc`` (``q`` as for
    :func:`_depthwise_py`): one pass, no sum stored. A bias below 2^23 starts the float32
    sum (the integer ``sum + bc`` then stays exact in float32: its conversions drop out);
    a larger one is added in int32, wrapping as the reference's sum does."""
    w0, w1, w2, w3, w4, w5, w6, w7, w8 = ws[0], ws[1], ws[2], ws[3], ws[4], ws[5], ws[6], \
        ws[7], ws[8]  # fmt: skip
    s_in, s_out, zp, qmin, qmax = q[0], q[1], q[2], q[3], q[4]
    zero = np.float32(0)
    r0 = base
    r1 = base + row
    r2 = r1 + row
    small = -(1 << 23) < bc < 1 << 23
    bf = np.float32(bc) if small else zero
    for j in range(n):
        s = (bf + w0 * xp[r0 + j] + w1 * xp[r0 + col1 + j] + w2 * xp[r0 + col2 + j]
             + w3 * xp[r1 + j] + w4 * xp[r1 + col1 + j] + w5 * xp[r1 + col2 + j]
             + w6 * xp[r2 + j] + w7 * xp[r2 + col1 + j] + w8 * xp[r2 + col2 + j])
        if not small:
            s = np.float32(np.int32(np.int32(s) + bc))
        v = s * s_in
        if relu:
            v = zero if v < zero else v
        dst[o + j] = _quantize(v, s_out, zp, qmin, qmax)


@njit(nogil=True, cache=True, error_model="numpy", inline="always")
def _quantize(v, scale, zp, qmin, qmax):  # pragma: no cover - compiled
    """MegDNN's ``quantize`` of the float32 ``v``: divided by ``scale``, rounded half away
    from zero (C ``roundf``), plus ``zp``, then ``fmin(fmax(qmin, v), qmax)`` (NaN gives
    qmin), as an int32. The quotient is clamped to ``[qmin - zp, qmax - zp]`` instead
    (integers: rounding is monotone, so the same values saturate, NaN going to the lower
    end), so that the rounding is one add and a truncating conversion; selects, not
    branches, so that a loop of it vectorizes."""
    lo, hi = qmin - zp, qmax - zp
    v = v / scale
    v = v if v > lo else lo
    v = v if v < hi else hi
    # C roundf of a value of at most 255 in magnitude: plus the float32 below one half,
    # signed as the value, truncated (checked over every float32 of magnitude <= 256)
    h = _BELOW_HALF if v >= np.float32(0) else -_BELOW_HALF
    return np.int32(v + h) + np.int32(zp)


def _add_py(a, b, out, q, relu, lo, hi):  # pragma: no cover - compiled
    """Values [lo, hi) of MegDNN's quantized ADD (FUSE_ADD_RELU when ``relu``) of the flat
    8-bit ``a`` and ``b`` into the flat 8-bit ``out``: each input dequantized (``(float32(v)
    - zero point) * scale``), added, ReLU'd, quantized; ``q`` = float32 (a's scale, a's zero
    point, b's, b's, the output's scale, zero point, qmin, qmax)."""
    sa, za, sb, zb = q[0], q[1], q[2], q[3]
    so, zo, qmin, qmax = q[4], q[5], q[6], q[7]
    zero = np.float32(0)
    for j in range(np.uintp(lo), np.uintp(hi)):
        v = (np.float32(a[j]) - za) * sa + (np.float32(b[j]) - zb) * sb
        if relu:
            v = zero if v < zero else v
        out[j] = _quantize(v, so, zo, qmin, qmax)


def quantized_add(a, b, out, q, relu: bool):
    """The quantized ADD / FUSE_ADD_RELU of flat 8-bit arrays (see :func:`_add_py`) as the
    compiled loop bound to its arguments: called with ``(lo, hi)``, it computes values
    [lo, hi) (a call the kernel pool hands its threads as a C call)."""
    return functools.partial(_compiled("add"), a, b, out, q, bool(relu))


def _quantize_8bit_py(src, out, q, lo, hi):  # pragma: no cover - compiled
    """Values [lo, hi) of MegDNN's quantize of the flat float32 ``src`` into the flat 8-bit
    ``out`` (a TypeCvt); ``q`` = float32 (scale, zero point, qmin, qmax)."""
    _zmm_vectors()
    scale, zp, qmin, qmax = q[0], q[1], q[2], q[3]
    for j in range(np.uintp(lo), np.uintp(hi)):
        out[j] = _quantize(src[j], scale, zp, qmin, qmax)


def quantize_8bit(src, out, q):
    """The quantize of flat float32 values into 8 bits (see :func:`_quantize_8bit_py`) as the
    compiled loop bound to its arguments: called with ``(lo, hi)``, it computes values
    [lo, hi) (a call the kernel pool hands its threads as a C call)."""
    return functools.partial(_compiled("quantize"), src, out, q)


#: float32 values of a depthwise band's padded source rows and of its sums (stack tiles)
_BAND_IN, _BAND_OUT = 8192, 4096
#: float32 values past a band's source rows that a tap loop rounded up to whole vectors reads
_BAND_PAD = 64
#: the sizes of the tiles for them (literals for the stack tiles): the source rows with that
#: tail, and the bytes of a band's requantized positions rounded up to whole vectors
_BAND_XP, _BAND_BYTES = _BAND_IN + _BAND_PAD, _BAND_OUT + 16


def _depthwise_py(x, w, bias, out, q, geom, epi, c0, c1):  # pragma: no cover - compiled
    """Planes [c0, c1) (``n * C + c``) of a depthwise convolution (one input and one output
    channel per group), ``x`` (N, C, H, W) and ``out`` (N, C, OH, OW) flat: ``out[n, c, r,
    q] = bias[c] + sum_ab (x[n, c, r sh - ph + a dh, q sw - pw + b dw] - zx) (w[c, a, b] -
    zf)`` in int32, taps outside the source adding 0; ``epi`` 0 writes the int32 sums, 1 (2:
    with ReLU) requantizes them with ``q`` into the 8-bit ``out``.

    The products and their sums are exact in float32 (the caller keeps ``FH FW 255^2 <
    2^24``), which LLVM vectorizes (Numba widens int32 products to int64). A band of output
    rows at a time: its source rows, zero-point shifted and zero-padded, into one stack
    tile (with a column stride of 2, each row's even columns then its odd ones, so that a
    tap reads a run), then per tap one multiply-add over the band's positions (with a
    stride, over each row's columns) into another; ``geom`` holds the stride, padding,
    dilation, zero points, H, W, OH, OW, FH, FW and the output rows of a band
    (:data:`_BAND_IN`, :data:`_BAND_OUT`)."""
    _zmm_vectors()
    sh, sw, ph, pw, dh, dw, zx, zf = geom[0], geom[1], geom[2], geom[3], geom[4], geom[5], \
        geom[6], geom[7]  # fmt: skip
    rows, h_, w_, oh, ow, fh, fw, c_ = geom[8], geom[9], geom[10], geom[11], geom[12], \
        geom[13], geom[14], geom[15]  # fmt: skip
    wp_ = w_ + 2 * pw
    # a row's padded values (stride 2: its even columns, then its odd ones, wh each)
    wh = (wp_ + 1) // 2
    wr = 2 * wh if sw == 2 else wp_
    xp = carray(_stack_tile(_BAND_XP, np.float32), _BAND_XP)
    acc = carray(_stack_tile(_BAND_OUT, np.float32), _BAND_OUT)
    ws = carray(_stack_tile(64, np.float32), 64)
    ob = carray(_stack_tile(_BAND_BYTES, np.uint8), _BAND_BYTES)
    s_in, s_out, zp, qmin, qmax = q[0], q[1], q[2], q[3], q[4]
    relu = epi == 2
    zero = np.float32(0)
    zxf = np.float32(zx)  # (8-bit values and their differences are exact in float32)
    for t in range(c0, c1):
        c = t % c_
        xbase, obase = t * h_ * w_, t * oh * ow
        for k in range(fh * fw):
            ws[k] = np.float32(np.int32(w[c * fh * fw + k]) - zf)
        bc = bias[c]
        for r0 in range(0, oh, rows):
            r1 = min(r0 + rows, oh)
            top = r0 * sh - ph
            # the band's source rows, and sh more: a flat tap loop reads past the last one
            for i in range((r1 - 1 - r0) * sh + (fh - 1) * dh + 1 + sh):
                ih = top + i
                base = np.uintp(i * wr)
                for j in range(np.uintp(wr)):
                    xp[base + j] = zero
                if ih < 0 or ih >= h_:
                    continue
                src = np.uintp(xbase + ih * w_)
                if sw == 2:  # even padded columns, then odd ones: each tap reads a run
                    for par in range(2):
                        # padded columns 2 k + par, source columns 2 k + par - pw
                        k0 = (pw - par + 1) // 2
                        k1 = (w_ + pw - par + 1) // 2
                        dst = base + np.uintp(par * wh)
                        first = src + np.uintp(2 * k0 + par - pw)
                        two = np.uintp(2)
                        for k in range(np.uintp(k1 - k0)):
                            xp[dst + np.uintp(k0) + k] = np.float32(x[first + two * k]) - zxf
                else:
                    inner = base + np.uintp(pw)
                    for j in range(np.uintp(w_)):
                        xp[inner + j] = np.float32(x[src + j]) - zxf
            if sh == sw == 1:
                # one loop per tap over the band: position v = rr WP + q reads the source at
                # v + tap (the columns q >= OW are computed and dropped)
                n = np.uintp((r1 - r0) * wr)
                if fh == fw == 3 and epi != 0 and ow > 16:
                    # taps and requantize in one pass into bytes, then each row's columns
                    # < OW out; whole vectors (no scalar remainder: zeros past the band's
                    # rows, their bytes dropped). Rows of 16 or fewer columns ran slower so
                    # (a copy per short row), and keep the passes below
                    end = np.uintp(((r1 - 1 - r0) + 2 * dh + 2) * wr)
                    if 16 + 2 * dw <= _BAND_PAD:
                        n = (n + np.uintp(15)) & ~np.uintp(15)
                        for j in range(np.uintp(_BAND_PAD)):
                            xp[end + j] = zero
                    _taps9_requantize(ob, np.uintp(0), xp, ws, n, np.uintp(0),
                                      np.uintp(dh * wr), np.uintp(dw), np.uintp(2 * dw), bc, q,
                                      relu)  # fmt: skip
                    for rr in range(r1 - r0):
                        o, v = np.uintp(obase + (r0 + rr) * ow), np.uintp(rr * wr)
                        for j in range(np.uintp(ow)):
                            out[o + j] = ob[v + j]
                    continue
                if fh == fw == 3:  # the nine taps in one pass (the sums stay in registers)
                    _taps9(acc, np.uintp(0), xp, ws, n, np.uintp(0), np.uintp(dh * wr),
                           np.uintp(dw), np.uintp(2 * dw))  # fmt: skip
                else:
                    for j in range(n):
                        acc[j] = zero
                    for a in range(fh):
                        for b in range(fw):
                            wv = ws[a * fw + b]
                            s0 = np.uintp(a * dh * wr + b * dw)
                            for j in range(n):
                                acc[j] += wv * xp[s0 + j]
                for rr in range(r1 - r0):  # the rows' columns < OW, in place
                    o, v = np.uintp(rr * ow), np.uintp(rr * wr)
                    for j in range(np.uintp(ow)):
                        acc[o + j] = acc[v + j]
            else:
                for j in range(np.uintp((r1 - r0) * ow)):
                    acc[j] = zero
                for rr in range(r1 - r0):
                    o = np.uintp(rr * ow)
                    if fh == fw == 3 and sw == 2 and dw == 1:
                        # columns 2q, 2q + 1, 2q + 2: the even run, the odd one, the even one
                        # shifted by one
                        _taps9(acc, o, xp, ws, np.uintp(ow), np.uintp(rr * sh * wr),
                               np.uintp(dh * wr), np.uintp(wh), np.uintp(1))
                        continue
                    for a in range(fh):
                        for b in range(fw):
                            wv = ws[a * fw + b]
                            row = (rr * sh + a * dh) * wr
                            if sw == 2:
                                col = b * dw
                                s0 = np.uintp(row + (col & 1) * wh + (col >> 1))
                                for j in range(np.uintp(ow)):
                                    acc[o + j] += wv * xp[s0 + j]
                            else:
                                s0, step = np.uintp(row + b * dw), np.uintp(sw)
                                for j in range(np.uintp(ow)):
                                    acc[o + j] += wv * xp[s0 + step * j]
            n = np.uintp((r1 - r0) * ow)
            dst = np.uintp(obase + r0 * ow)
            if epi == 0:
                for j in range(n):
                    out[dst + j] = np.int32(acc[j]) + bc
                continue
            # MegDNN's float32 chain: times the input scale, ReLU, then quantized
            for j in range(n):
                v = np.float32(np.int32(np.int32(acc[j]) + bc)) * s_in
                if relu:
                    v = zero if v < zero else v
                out[dst + j] = _quantize(v, s_out, zp, qmin, qmax)


@njit(nogil=True, cache=True, error_model="numpy", inline="always")
def _reciprocal(scale):  # pragma: no cover - compiled
    """``1 / scale`` in float32 for a requantize by multiplication (:func:`_taps9_q16`);
    0 (divide) for a scale whose reciprocal would leave the normal range."""
    ok = np.float32(2.0**-100) < abs(scale) < np.float32(2.0**100)
    return np.float32(1) / scale if ok else np.float32(0)


def _depthwise_masked_py(x, w, bias, out, q, geom, epi, c0, c1):  # pragma: no cover
    """Planes [c0, c1) of :func:`_depthwise_py`'s convolution for a 3x3 filter at stride 1,
    or 2 without column dilation, requantized (``epi`` 1 or 2), in masked vectors
    (``geom[16]`` 1; ``geom[8]`` the rows of :func:`depthwise_masked_rows`). A band's
    padded source rows are filled by masked vector loads (:func:`_masked_fill`): at stride
    1 at a pitch of ``W + PW`` (a row's right padding is the next one's left, both zeros),
    so that the taps run over the band's positions; at stride 2 as each row's even columns
    then its odd ones, each half whole vectors. Each vector of 16 positions is then nine
    multiply-adds, the requantize and a masked store per output row it meets
    (:func:`_taps9_q16`): whatever the row width, no scalar remainder and no copy."""
    _zmm_vectors()
    ph, pw, dh, dw, zx, zf = geom[2], geom[3], geom[4], geom[5], geom[6], geom[7]
    rows, h_, w_, oh, ow, c_ = geom[8], geom[9], geom[10], geom[11], geom[12], geom[15]
    s2 = geom[0] == 2
    xp = carray(_stack_tile(_BAND_XP, np.float32), _BAND_XP)
    zxf = np.float32(zx)
    # the filter and the requantize's values as tuples: in registers across the stores
    qt = (q[0], q[1], q[2], q[3], q[4], _reciprocal(q[1]))
    if s2:  # a row's even and odd halves; the band's positions are each row's OWP
        half = (((w_ + 2 * pw + 1) // 2) + 15) & ~15
        pitch, opitch = 2 * half, (ow + 15) & ~15
        row, col1, col2 = dh * pitch, half, 1
    else:
        half, pitch = 0, w_ + pw
        opitch, row, col1, col2 = pitch, dh * pitch, dw, 2 * dw
    le, he, lo_, ho = (pw + 1) // 2, (pw + w_ + 1) // 2, pw // 2, (pw + w_) // 2
    for t in range(c0, c1):
        c = t % c_
        xbase, obase = t * h_ * w_, t * oh * ow
        wc = w[c * 9:c * 9 + 9]
        ws = (np.float32(np.int32(wc[0]) - zf), np.float32(np.int32(wc[1]) - zf),
              np.float32(np.int32(wc[2]) - zf), np.float32(np.int32(wc[3]) - zf),
              np.float32(np.int32(wc[4]) - zf), np.float32(np.int32(wc[5]) - zf),
              np.float32(np.int32(wc[6]) - zf), np.float32(np.int32(wc[7]) - zf),
              np.float32(np.int32(wc[8]) - zf))  # fmt: skip
        bc = bias[c]
        for r0 in range(0, oh, rows):
            r1 = min(r0 + rows, oh)
            top = r0 * (2 if s2 else 1) - ph
            nin = (r1 - 1 - r0) * (2 if s2 else 1) + 2 * dh + 1
            for i in range(nin):
                ih = top + i
                base = i * pitch
                inside = 0 <= ih < h_
                src = xbase + ih * w_ - pw if inside else 0
                if s2:
                    e0, e1 = (le, he) if inside else (0, 0)
                    o0, o1 = (lo_, ho) if inside else (0, 0)
                    for k in range(0, half, 16):
                        _masked_fill(xp, base + k, x, src + 2 * k, e0 - k, e1 - k, 16, zxf, 2)
                        _masked_fill(xp, base + half + k, x, src + 1 + 2 * k, o0 - k, o1 - k,
                                     16, zxf, 2)  # fmt: skip
                else:
                    lo, hi = (pw, pw + w_) if inside else (0, 0)
                    for k in range(0, pitch, 16):
                        _masked_fill(xp, base + k, x, src + k, lo - k, hi - k,
                                     min(16, pitch - k), zxf, 1)  # fmt: skip
            n = (r1 - r0) * opitch
            if not s2:  # zeros past the rows, as far as the last vector's taps read
                for k in range(nin * pitch, ((n + 15) & ~15) + 2 * row + 2 * dw, 16):
                    _masked_fill(xp, k, x, 0, 0, 0, 16, zxf, 1)
            # each vector of positions: the band rows [r, re) it meets, stored to out
            r, o0 = 0, obase + r0 * ow
            for f0 in range(0, n, 16):
                while (r + 1) * opitch <= f0:
                    r += 1
                re = r + 1
                while re < r1 - r0 and re * opitch < f0 + 16:
                    re += 1
                # at stride 2 a band row of outputs reads from two source rows down
                x0 = f0 + r * (2 * pitch - opitch) if s2 else f0
                if epi == 2:
                    _taps9_q16(out, o0, f0, r, re, opitch, ow, xp, x0, row, col1, col2, ws,
                               bc, qt, 1)  # fmt: skip
                else:
                    _taps9_q16(out, o0, f0, r, re, opitch, ow, xp, x0, row, col1, col2, ws,
                               bc, qt, 0)  # fmt: skip


def depthwise_masked_rows(w: int, ow: int, fh: int, fw: int, sh: int, sw: int, dh: int,
                          dw: int, pw: int) -> int:
    """Output rows of a band of :func:`depthwise`'s masked-vector form (``geom[16]`` 1): a
    3x3 filter at stride 1, or at stride 2 without column dilation; 0 where it does not
    take the convolution."""
    if not (fh == fw == 3 and (sh == sw == 1 or (sh == sw == 2 and dw == 1))):
        return 0
    if sh == 1:
        pitch = w + pw
        rows = min((_BAND_IN - 2 * dw - 32) // pitch - 2 * dh, _BAND_OUT // pitch)
    else:
        pitch = 2 * ((((w + 2 * pw + 1) // 2) + 15) & ~15)
        rows = (_BAND_IN // pitch - 2 * dh - 1) // 2 + 1
    return max(0, rows)


#: channels of an item of :func:`depthwise_channels` (one vector of float32 lanes)
CHANNEL_LANES = 16
#: float32 values of its tile of padded source rows (each position's channels innermost)
_CH_TILE = 16384


def _depthwise_channels_py(x, w, bias, out, q, geom, epi, t0, t1):  # pragma: no cover
    """Items [t0, t1) (``n * ceil(C / 16) + block``) of :func:`_depthwise_py`'s convolution,
    16 channels at a time along the vectors: a band of source rows of 16 channels,
    zero-point shifted and zero-padded, transposed into a stack tile of (row, column, channel)
    float32 values, then each output position of the 16 channels is one vector of sums (its
    taps are loads at the tap's offset, whatever the stride or dilation), requantized as a
    vector and written to the 16 planes. The sums are the same exact integers; ``geom`` as
    for :func:`_depthwise_py`, its ``rows`` those of :func:`depthwise_channel_rows`."""
    _zmm_vectors()
    sh, sw, ph, pw, dh, dw, zx, zf = geom[0], geom[1], geom[2], geom[3], geom[4], geom[5], \
        geom[6], geom[7]  # fmt: skip
    rows, h_, w_, oh, ow, fh, fw, c_ = geom[8], geom[9], geom[10], geom[11], geom[12], \
        geom[13], geom[14], geom[15]  # fmt: skip
    lanes = CHANNEL_LANES
    wr = (ow - 1) * sw + (fw - 1) * dw + 1  # the padded columns read
    xp = carray(_stack_tile(_CH_TILE, np.float32), _CH_TILE)
    ws = carray(_stack_tile(49 * 16, np.float32), 49 * 16)
    bs = carray(_stack_tile(16, np.int32), 16)
    acc = carray(_stack_tile(16, np.float32), 16)
    res = carray(_stack_tile(16, np.int32), 16)
    srcs = carray(_stack_tile(16, np.uintp), 16)
    s_in, s_out, zp, qmin, qmax = q[0], q[1], q[2], q[3], q[4]
    relu = epi == 2
    zero = np.float32(0)
    zxf = np.float32(zx)
    blocks = (c_ + lanes - 1) // lanes
    ohw = np.uintp(oh * ow)
    j0, j1 = min(pw, wr), min(pw + w_, wr)  # the padded columns inside the source
    for t in range(t0, t1):
        n, cb = t // blocks, t % blocks
        c0 = cb * lanes
        nl = min(lanes, c_ - c0)
        for k in range(fh * fw):
            for l in range(lanes):
                ws[k * lanes + l] = zero
        for l in range(lanes):
            bs[l] = 0
        for l in range(nl):
            for k in range(fh * fw):
                ws[k * lanes + l] = np.float32(np.int32(w[(c0 + l) * fh * fw + k]) - zf)
            bs[l] = bias[c0 + l]
        xbase = (n * c_ + c0) * h_ * w_
        obase = np.uintp((n * c_ + c0) * oh * ow)
        for r0 in range(0, oh, rows):
            r1 = min(r0 + rows, oh)
            top = r0 * sh - ph
            nin = (r1 - 1 - r0) * sh + (fh - 1) * dh + 1
            u = np.uintp(lanes)
            for i in range(nin):
                ih = top + i
                row = np.uintp(i * wr * lanes)
                if ih < 0 or ih >= h_:
                    for j in range(np.uintp(wr * lanes)):
                        xp[row + j] = zero
                    continue
                for j in range(np.uintp(j0 * lanes)):
                    xp[row + j] = zero
                for j in range(np.uintp(j1 * lanes), np.uintp(wr * lanes)):
                    xp[row + j] = zero
                for l in range(lanes):  # (lanes past the channels read the last one)
                    srcs[l] = np.uintp(xbase + (min(l, nl - 1) * h_ + ih) * w_ - pw)
                for j in range(np.uintp(j0), np.uintp(j1)):
                    dst = row + j * u
                    for l in range(u):
                        xp[dst + l] = np.float32(x[srcs[l] + j]) - zxf
            for rr in range(r1 - r0):
                for qq in range(ow):
                    base = np.uintp(((rr * sh) * wr + qq * sw) * lanes)
                    if fh == fw == 3:
                        r1o = np.uintp(dh * wr * lanes)
                        r2o = r1o + r1o
                        c1o = np.uintp(dw * lanes)
                        c2o = c1o + c1o
                        for l in range(u):
                            b0 = base + l
                            acc[l] = (ws[l] * xp[b0] + ws[u + l] * xp[b0 + c1o]
                                      + ws[2 * u + l] * xp[b0 + c2o]
                                      + ws[3 * u + l] * xp[b0 + r1o]
                                      + ws[4 * u + l] * xp[b0 + r1o + c1o]
                                      + ws[5 * u + l] * xp[b0 + r1o + c2o]
                                      + ws[6 * u + l] * xp[b0 + r2o]
                                      + ws[7 * u + l] * xp[b0 + r2o + c1o]
                                      + ws[8 * u + l] * xp[b0 + r2o + c2o])
                    else:
                        for l in range(u):
                            acc[l] = zero
                        for a in range(fh):
                            for b in range(fw):
                                off = base + np.uintp((a * dh * wr + b * dw) * lanes)
                                k = np.uintp((a * fw + b) * lanes)
                                for l in range(u):
                                    acc[l] += ws[k + l] * xp[off + l]
                    o = obase + np.uintp((r0 + rr) * ow + qq)
                    if epi == 0:
                        for l in range(np.uintp(nl)):
                            out[o + l * ohw] = np.int32(acc[l]) + bs[l]
                        continue
                    for l in range(u):
                        v = np.float32(np.int32(np.int32(acc[l]) + bs[l])) * s_in
                        if relu:
                            v = zero if v < zero else v
                        res[l] = _quantize(v, s_out, zp, qmin, qmax)
                    for l in range(np.uintp(nl)):
                        out[o + l * ohw] = res[l]


def depthwise_channel_rows(w: int, ow: int, fh: int, fw: int, sh: int, sw: int, dh: int,
                           dw: int, oh: int) -> int:
    """Output rows of a band of :func:`depthwise_channels`; 0 where not even one fits (or
    the filter has more than 49 taps)."""
    wr = (ow - 1) * sw + (fw - 1) * dw + 1
    if fh * fw > 49:
        return 0
    rows = (_CH_TILE // (wr * CHANNEL_LANES) - (fh - 1) * dh - 1) // sh + 1
    return max(0, min(rows, oh))


def depthwise_channels(x, w, bias, out, q, geom, epi: int):
    """The depthwise 8-bit convolution of :func:`depthwise` (the same arguments) with the
    channels along the vectors (see :func:`_depthwise_channels_py`), bound as
    :func:`depthwise` is: called with ``(t0, t1)``, it computes items [t0, t1) (``n *
    ceil(C / 16) + block of 16 channels``)."""
    return functools.partial(_compiled("depthwise_channels"), x, w, bias, out, q, geom,
                             int(epi))  # fmt: skip


def depthwise_band_rows(w: int, ow: int, fh: int, sh: int, dh: int, pw: int) -> int:
    """Output rows of a band of :func:`depthwise` for a source row of ``w`` values and an
    output row of ``ow``; 0 where not even one fits."""
    wp = w + 2 * pw + 1  # (a row of even and odd columns)
    rows = min(_BAND_OUT // max(wp, ow), (_BAND_IN // wp - (fh - 1) * dh - 1 - sh) // sh + 1)
    return max(0, rows)


def depthwise(x, w, bias, out, q, geom, epi: int):
    """A depthwise 8-bit convolution as the compiled loop bound to its arguments: called
    with ``(c0, c1)``, it computes planes [c0, c1) (a call the kernel pool hands its threads
    as a C call). ``x`` (N, C, H, W), ``w`` (C, FH, FW) and ``out`` (N, C, OH, OW) all flat
    and C-ordered, ``bias`` (C,) int32, ``q`` the requantization's float32 (input scale,
    output scale, zero point, qmin, qmax), ``geom`` (int64) as :func:`_depthwise_py` reads
    it, ``geom[16]`` 1 for the masked-vector form (:func:`_depthwise_masked_py`)."""
    name = "depthwise_masked" if geom[16] else "depthwise"
    return functools.partial(_compiled(name), x, w, bias, out, q, geom, int(epi))


def int8_im2col(x, col, n, fsize, stride, pad, dilate, ow: int, zx: int, g0: int, g1: int):
    """Groups [g0, g1) of sample ``n``'s window rows ``col`` (G, OH*OW, I*FH*FW), int8 or
    int16, of the 8-bit ``x`` (N, G*I, H, W), its zero point ``zx`` subtracted."""
    _compiled("im2col")(x, col, int(n), int(fsize[0]), int(fsize[1]), int(stride[0]),
                        int(stride[1]), int(pad[0]), int(pad[1]), int(dilate[0]),
                        int(dilate[1]), int(ow), col.dtype.type(zx), int(g0), int(g1))  # fmt: skip


def int8_gemm(col, w, y, n: int, t0: int, t1: int) -> None:
    """Row blocks [t0, t1) (of four output channels each, :func:`gemm_blocks` in all) of
    sample ``n`` of the int32 ``y`` (N, G*O, P): the weights ``w`` (G, O, K) times the
    window rows ``col`` (G, P, K) (both int8 or both int16), exact in int32."""
    _compiled("gemm")(col, w, y, int(n), int(t0), int(t1))


def gemm_blocks(groups: int, out_channels: int) -> int:
    """The number of row blocks :func:`int8_gemm` takes for G groups of O output channels."""
    return groups * -(-out_channels // 4)


@functools.cache
def _compiled(name: str):
    fn = {"im2col": _im2col_py, "gemm": _gemm_py, "depthwise": _depthwise_py,
          "depthwise_channels": _depthwise_channels_py, "add": _add_py,
          "depthwise_masked": _depthwise_masked_py,
          "quantize": _quantize_8bit_py}[name]  # fmt: skip
    # the depthwise sums are exact in float32 (every product and partial sum an integer
    # below 2^24), so fused multiply-adds give the same bits; nothing else is contracted
    fastmath = {"contract"} if name.startswith("depthwise") else False
    return njit(nogil=True, cache=True, error_model="numpy", fastmath=fastmath)(fn)
