"""The 8-bit kernels' requantize of 16 int32 sums as LLVM IR: MegDNN's float32 chain
(``handle_z_inp_and_activation`` without a ``z``) computed as one product by the scales'
ratio plus the zero point, checked near ties, for the intrinsics that sum in zmm registers:
into int32 lanes (:func:`requantize16_group`, :mod:`.depthwise_bytes`) or straight into a
row's result bytes (:func:`requantize_bytes`, :mod:`.vnni`'s tiles).

The operands are :func:`.vnni.requant_params`'s seven float32: input scale, output scale,
zero point, qmin, qmax, the scales' ratio and the fast path's bound, each splat over 16
lanes (:func:`splat16`).
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

from .int8 import _BELOW_HALF

__all__ = ["bytes_operands", "requantize16", "requantize16_group", "requantize_bytes",
           "splat16"]

_I1, _I8, _I16, _I32 = (ir.IntType(b) for b in (1, 8, 16, 32))
_F32 = ir.FloatType()
_V32, _VF, _VB = ir.VectorType(_I32, 16), ir.VectorType(_F32, 16), ir.VectorType(_I8, 64)
#: :func:`requantize_bytes`'s offset of the fast value: 1536 puts every value that can
#: round into [-512, 512) in the binade [1024, 2048) (ulp 2^-13, the integer part's low
#: byte in bits 13..20 of the word), one half turns rounding to nearest into the floor the
#: word's bits give, 2^-12 past it is the margin for the two chains' difference
_SHIFT = 1536.0 + 0.5 + 2.0**-12
#: the fractional bits (the low 13 of the word) that are zero where the fast value's
#: fraction is under 4 ulps (2^-11): within the margin past a half-integer, a near tie
_NEAR_BITS = 0x1FFC


def splat16(builder: ir.IRBuilder, scalar: ir.Value) -> ir.Value:
    """IR: the float32 ``scalar`` in each of 16 lanes."""
    one = builder.insert_element(ir.Constant(_VF, ir.Undefined), scalar, ir.Constant(_I32, 0))
    return builder.shuffle_vector(one, ir.Constant(_VF, ir.Undefined), ir.Constant(_V32, None))


def _fn(builder, name, ret, args):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, args), name)


def _clamp(builder, v, lo, hi):  # NaN to the lower end, as fmax sends it to qmin
    v = builder.select(builder.fcmp_ordered(">", v, lo), v, lo)
    return builder.select(builder.fcmp_ordered("<", v, hi), v, hi)


def _exact(builder, total, qs, relu, zpi):
    """IR: MegDNN's chain itself on the float32 sums ``total``: times the input scale,
    ReLU'd (NaN stays NaN), divided by the output scale, clamped to the integers the zero
    point leaves in range, rounded half away from zero (C ``roundf``: plus the float32
    below one half with the value's sign, truncated), the zero point added."""
    s_in, s_out, zp, qmin, qmax = qs[:5]
    zero = ir.Constant(_VF, None)
    val = builder.fmul(total, s_in)
    if relu:
        val = builder.select(builder.fcmp_ordered("<", val, zero), zero, val)
    val = _clamp(builder, builder.fdiv(val, s_out), builder.fsub(qmin, zp),
                 builder.fsub(qmax, zp))  # fmt: skip
    half = ir.Constant(_VF, [ir.Constant(_F32, float(_BELOW_HALF))] * 16)
    val = builder.fadd(val, builder.call(_fn(builder, "llvm.copysign.v16f32", _VF, [_VF, _VF]),
                                         [half, val]))  # fmt: skip
    return builder.add(builder.fptosi(val, _V32), zpi)


def requantize16(builder: ir.IRBuilder, acc: ir.Value, qs: list, relu: bool) -> ir.Value:
    """IR: the 16 int32 sums ``acc`` requantized as MegDNN's float32 chain does, each result
    in its int32 lane (qmin..qmax; truncate for the bytes); :func:`requantize16_group` of
    the one vector."""
    return requantize16_group(builder, [acc], qs, relu)[0]


def requantize16_group(builder: ir.IRBuilder, accs: list, qs: list, relu: bool) -> list:
    """IR: each vector of 16 int32 sums of ``accs`` requantized as MegDNN's float32 chain
    does, each result in its int32 lane (qmin..qmax; truncate for the bytes).

    ``qs`` are the seven operands of :func:`.vnni.requant_params` splat over 16 lanes. The
    fast path is ``fma(float32(acc), ratio, zp)`` clamped to [qmin, qmax] (with ``relu``,
    to [max(zp, qmin), qmax]: a ReLU'd value's lower end is the zero point) and converted
    to nearest; where a lane of any of the vectors lies within ``1/2 - bound`` of a
    half-integer (``vreduceps`` gives its distance from the nearest integer, ``vrangeps``
    the largest such distance of two vectors, so that the group takes one compare and one
    branch), every vector of the group runs the chain itself (its division and rounding
    half away from zero): both round alike elsewhere."""
    s_in, s_out, zp, qmin, qmax, ratio, near = qs
    zero, all_lanes = ir.Constant(_VF, None), ir.Constant(_I16, 0xFFFF)
    fma = _fn(builder, "llvm.fma.v16f32", _VF, [_VF] * 3)
    reduce = _fn(builder, "llvm.x86.avx512.mask.reduce.ps.512", _VF,
                 [_VF, _I32, _VF, _I16, _I32])  # fmt: skip
    vrange = _fn(builder, "llvm.x86.avx512.mask.range.ps.512", _VF,
                 [_VF, _VF, _I32, _VF, _I16, _I32])  # fmt: skip
    cvt = _fn(builder, "llvm.x86.avx512.mask.cvtps2dq.512", _V32, [_VF, _V32, _I16, _I32])
    lo_fast = builder.select(builder.fcmp_ordered(">", zp, qmin), zp, qmin) if relu else qmin
    totals = [builder.sitofp(acc, _VF) for acc in accs]
    fasts = [_clamp(builder, builder.call(fma, [t, ratio, zp]), lo_fast, qmax) for t in totals]
    # each lane's distance from its nearest integer, then the larger magnitude of two
    # vectors' (imm 11: the larger absolute value, its sign cleared) down to one vector
    far = [builder.call(reduce, [f, ir.Constant(_I32, 8), zero, all_lanes, ir.Constant(_I32, 4)])
           for f in fasts]  # fmt: skip
    if len(far) == 1:
        far = [builder.call(_fn(builder, "llvm.fabs.v16f32", _VF, [_VF]), far)]
    while len(far) > 1:
        far = [builder.call(vrange, [far[k], far[k + 1], ir.Constant(_I32, 11), zero, all_lanes,
                                     ir.Constant(_I32, 4)]) if k + 1 < len(far) else far[k]
               for k in range(0, len(far), 2)]  # fmt: skip
    ok = builder.fcmp_ordered("<", far[0], near)
    clear = builder.icmp_unsigned("==", builder.bitcast(ok, _I16), all_lanes)
    rounded = [builder.call(cvt, [f, ir.Constant(_V32, None), all_lanes, ir.Constant(_I32, 8)])
               for f in fasts]  # fmt: skip
    return _unless(builder, clear, rounded,
                   lambda: [_exact(builder, t, qs, relu, builder.fptosi(zp, _V32))
                            for t in totals])  # fmt: skip


def _unless(builder, clear, fasts, slow):
    """IR: the vectors ``fasts`` where ``clear`` (likely), else those ``slow()`` builds in a
    branch of its own, merged by one phi each."""
    with builder.if_else(clear, likely=True) as (then, otherwise):
        with then:
            bb_fast = builder.basic_block
        with otherwise:
            exact = slow()
            bb_slow = builder.basic_block
    out = []
    for f, e in zip(fasts, exact):
        res = builder.phi(f.type)
        res.add_incoming(f, bb_fast)
        res.add_incoming(e, bb_slow)
        out.append(res)
    return out


def bytes_operands(builder: ir.IRBuilder, qs: list, relu: bool) -> list:
    """IR: :func:`requantize_bytes`'s operands, computed once ahead of a tile's rows from the
    seven splat ``qs``: the zero point, the lower end (with ``relu`` the zero point or qmin,
    whichever is larger) and qmax, each plus the fast value's offset, and whether the scales
    leave no fast path (:func:`.vnni.requant_params`'s bound below zero; an i1)."""
    zp, qmin, qmax = qs[2:5]
    shift = ir.Constant(_VF, [ir.Constant(_F32, _SHIFT)] * 16)
    lo = builder.select(builder.fcmp_ordered(">", zp, qmin), zp, qmin) if relu else qmin
    none = builder.fcmp_ordered("<", builder.extract_element(qs[6], ir.Constant(_I32, 0)),
                                ir.Constant(_F32, 0.0))  # fmt: skip
    return [builder.fadd(zp, shift), builder.fadd(lo, shift), builder.fadd(qmax, shift), none]


def requantize_bytes(builder: ir.IRBuilder, accs: list, qs: list, ops: list,
                     relu: bool) -> ir.Value:  # fmt: skip
    """IR: the 2 or 4 vectors of 16 int32 sums ``accs`` (consecutive positions)
    requantized as MegDNN's float32 chain does, as their 32 or 64 result bytes in order
    (``qs`` splat as for :func:`requantize16_group`, ``ops`` from :func:`bytes_operands`).

    The fast value is ``fma(float32(acc), ratio, zp + S)`` clamped to [lo + S, qmax + S],
    ``S = 1536 + 1/2 + 2^-12``: every such value lies in [1024, 2048), where a float32's
    word holds its integer part's low byte in bits 13..20 and its fraction in the 13 bits
    below, so that the word itself is the result: its bits 13..20 are ``floor(v + 1/2 +
    2^-12)``, the integer nearest ``v`` (the exact chain's quotient plus the zero point)
    unless ``v`` lies within 2^-12 below a half-integer. The product differs from the
    chain's quotient by under 2^-13.7 (:func:`.vnni.requant_params`), its rounding to the
    binade's ulp (2^-13) by 2^-14 more: where the chain's quotient lies within 2^-12 below
    a half-integer, or on one, the word's fraction is under 2^-12 + 2^-12.9, 3 ulps at
    most; where a lane of
    the group has its word's fraction bits under 4 (``vptestnmd`` against 0x1FFC, one mask
    or-ed over the group, one branch) every vector of the group runs the chain itself
    (its division, rounding half away from zero) and takes its result shifted into bits
    13..20. ``vpmultishiftqb`` copies each word's bits 13..20 into bytes ``2v, 2v + 1``
    of its quadword for vector ``v`` (merged), one byte permute puts them in order: no
    conversion back to int32, no narrowing by saturation, one compare per vector for the
    check (against ``vreduceps``, a fold and a compare)."""
    zpm, lom, him, none = ops
    fma = _fn(builder, "llvm.fma.v16f32", _VF, [_VF] * 3)
    totals = [builder.sitofp(acc, _VF) for acc in accs]
    words = []
    for t in totals:
        v = _clamp(builder, builder.call(fma, [t, qs[5], zpm]), lom, him)
        words.append(builder.bitcast(v, _V32))
    frac = ir.Constant(_V32, [ir.Constant(_I32, _NEAR_BITS)] * 16)
    near = None
    for w in words:
        m = builder.icmp_unsigned("==", builder.and_(w, frac), ir.Constant(_V32, None))
        m = builder.bitcast(m, _I16)
        near = m if near is None else builder.or_(near, m)
    clear = builder.and_(builder.icmp_unsigned("==", near, ir.Constant(_I16, 0)),
                         builder.not_(none))  # fmt: skip
    at13 = ir.Constant(_V32, [ir.Constant(_I32, 13)] * 16)
    vals = _unless(builder, clear, words,
                   lambda: [builder.shl(_exact(builder, t, qs, relu, builder.fptosi(qs[2], _V32)),
                                        at13) for t in totals])  # fmt: skip
    # each word's bits 13..20 into bytes 2v, 2v + 1 of its quadword (vector v), then in order
    shift = _fn(builder, "llvm.x86.avx512.pmultishift.qb.512", _VB, [_VB, _VB])
    ctrl = ir.Constant(_VB, [ir.Constant(_I8, 13 + 32 * (k % 2)) for k in range(64)])
    merged = None
    for v, w in enumerate(vals):
        part = builder.call(shift, [ctrl, builder.bitcast(w, _VB)])
        if merged is None:
            merged = part
        else:
            sel = ir.Constant(ir.VectorType(_I1, 64),
                              [ir.Constant(_I1, int(k % 8 // 2 == v)) for k in range(64)])
            merged = builder.select(sel, part, merged)
    n = len(vals)
    order = [8 * (p % 16 // 2) + 2 * (p // 16) + p % 2 for p in range(16 * n)]
    return builder.shuffle_vector(merged, ir.Constant(_VB, ir.Undefined), ir.Constant(
        ir.VectorType(_I32, 16 * n), [ir.Constant(_I32, k) for k in order]))
