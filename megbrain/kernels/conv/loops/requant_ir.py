"""The 8-bit kernels' requantize of 16 int32 sums as LLVM IR: MegDNN's float32 chain
(``handle_z_inp_and_activation`` without a ``z``) computed as one product by the scales'
ratio plus the zero point, checked near ties, for the intrinsics that sum in zmm registers
(:mod:`.depthwise_bytes`; :mod:`.vnni`'s tiles compute the same chain inline).

The operands are :func:`.vnni.requant_params`'s seven float32: input scale, output scale,
zero point, qmin, qmax, the scales' ratio and the fast path's bound, each splat over 16
lanes (:func:`splat16`).
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

from .int8 import _BELOW_HALF

__all__ = ["requantize16", "requantize16_group", "splat16"]

_I16, _I32, _F32 = ir.IntType(16), ir.IntType(32), ir.FloatType()
_V32, _VF = ir.VectorType(_I32, 16), ir.VectorType(_F32, 16)


def splat16(builder: ir.IRBuilder, scalar: ir.Value) -> ir.Value:
    """IR: the float32 ``scalar`` in each of 16 lanes."""
    one = builder.insert_element(ir.Constant(_VF, ir.Undefined), scalar, ir.Constant(_I32, 0))
    return builder.shuffle_vector(one, ir.Constant(_VF, ir.Undefined), ir.Constant(_V32, None))


def _fn(builder, name, ret, args):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, args), name)


def _clamp(builder, v, lo, hi):  # NaN to the lower end, as fmax sends it to qmin
    v = builder.select(builder.fcmp_ordered(">", v, lo), v, lo)
    return builder.select(builder.fcmp_ordered("<", v, hi), v, hi)


def _exact(builder, total, qs, relu):
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
    return builder.add(builder.fptosi(val, _V32), builder.fptosi(zp, _V32))


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
    with builder.if_else(clear, likely=True) as (then, otherwise):
        with then:
            bb_fast = builder.basic_block
        with otherwise:
            slow = [_exact(builder, t, qs, relu) for t in totals]
            bb_slow = builder.basic_block
    out = []
    for r, e in zip(rounded, slow):
        res = builder.phi(_V32)
        res.add_incoming(r, bb_fast)
        res.add_incoming(e, bb_slow)
        out.append(res)
    return out
