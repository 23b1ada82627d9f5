"""The 8-bit kernels' shared requantize (``loops/requant_ir``), on one vector of 16 int32 sums
and on groups of vectors sharing one check near ties, into int32 lanes and into a row's
result bytes (the VNNI tiles' form), against MegDNN's float32 chain (the integer
reference's dequantize, ReLU and quantize) bit for bit: ratios of powers of two that put
many quotients on half-integers and sums nearest the half-integers of any ratio (the fast
product then gives way to the division), scales past the normal binades (the division
everywhere), both 8-bit kinds' zero points and ranges, saturating sums."""

from __future__ import annotations

import numpy as np
import pytest
import quantized_ref as ref
from hypothesis import given, settings
from hypothesis import strategies as st
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

import megbrain as mgb
from megbrain.kernels.conv.loops import depthwise_bytes, requant_ir, vnni

pytestmark = pytest.mark.skipif(not depthwise_bytes.vnni_bytes(),
                                reason="the CPU has no AVX-512 VNNI and VBMI")  # fmt: skip


@intrinsic
def _requantize_block(typingctx, out, acc, q, relu, group):
    """``out[:16 group]`` = the ``group`` (a literal) vectors ``acc[:16 group]``
    requantized with the 7 float32 ``q`` (the literal ``relu``): into int32 lanes by
    :func:`requant_ir.requantize16_group` for an int32 ``out``, into their bytes by
    :func:`requant_ir.requantize_bytes` (2 or 4 vectors) for a uint8 one."""
    if not all(isinstance(v, types.IntegerLiteral) for v in (relu, group)):
        return None
    n, on = group.literal_value, bool(relu.literal_value)
    lanes = out.dtype == types.int32

    def codegen(context, builder, signature, args):
        i8, i32, f32 = ir.IntType(8), ir.IntType(32), ir.FloatType()
        v32 = ir.VectorType(i32, 16)

        def data(k, elt):
            ary = context.make_array(signature.args[k])(context, builder, args[k])
            return builder.bitcast(ary.data, elt.as_pointer())

        qd = data(2, f32)
        qs = [requant_ir.splat16(builder, builder.load(builder.gep(qd, [ir.Constant(i32, k)])))
              for k in range(7)]  # fmt: skip
        ptrs = [builder.bitcast(builder.gep(data(k, i32), [ir.Constant(i32, 16 * v)]),
                                v32.as_pointer()) for k in (0, 1) for v in range(n)]  # fmt: skip
        accs = [builder.load(p, align=4) for p in ptrs[n:]]
        if not lanes:
            ops = requant_ir.bytes_operands(builder, qs, on)
            res = requant_ir.requantize_bytes(builder, accs, qs, ops, on)
            builder.store(res, builder.bitcast(data(0, i8), res.type.as_pointer()), align=1)
            return context.get_dummy_value()
        if n == 1:
            res = [requant_ir.requantize16(builder, accs[0], qs, on)]
        else:
            res = requant_ir.requantize16_group(builder, accs, qs, on)
        for v, p in zip(res, ptrs[:n]):
            builder.store(v, p, align=4)
        return context.get_dummy_value()

    return types.void(out, acc, q, relu, group), codegen


@njit(cache=False)
def _run(out, acc, q, relu, group):
    for k in range(0, acc.size, 16 * group):
        if relu and group == 1:
            _requantize_block(out[k:], acc[k:], q, 1, 1)
        elif relu and group == 2:
            _requantize_block(out[k:], acc[k:], q, 1, 2)
        elif relu and group == 3:
            _requantize_block(out[k:], acc[k:], q, 1, 3)
        elif relu:
            _requantize_block(out[k:], acc[k:], q, 1, 4)
        elif group == 1:
            _requantize_block(out[k:], acc[k:], q, 0, 1)
        elif group == 2:
            _requantize_block(out[k:], acc[k:], q, 0, 2)
        elif group == 3:
            _requantize_block(out[k:], acc[k:], q, 0, 3)
        else:
            _requantize_block(out[k:], acc[k:], q, 0, 4)


def _misrounded(s_in: float, out_scale: float, rng) -> np.ndarray:
    """Up to 64 sums in [-2^20, 2^20) whose product by the scales' ratio, rounded to the
    nearest integer as the fast path's word would be without the margin (to a float32 of
    ulp 2^-13 past 1536.5, then the floor), differs from the chain's ``roundf``: the
    quotients a hair either side of a half-integer, where only the check keeps the result
    exact."""
    a, b = np.float32(s_in), np.float32(out_scale)
    with np.errstate(all="ignore"):
        ratio = np.float64(np.float32(a / b))
        s = np.arange(-(1 << 20), 1 << 20, dtype=np.int32)
        t = s.astype(np.float32)
        chain = (t * a) / b
        fast = np.floor((t.astype(np.float64) * ratio + 1536.5).astype(np.float32) - 1536)
    want = np.trunc(chain + np.copysign(np.float32(0.5) - np.float32(2**-25), chain))
    bad = s[np.isfinite(chain) & (np.abs(chain) < 300) & (fast != want)]
    return rng.permutation(bad)[:64]


def _check(relu, asymm, s_in, ratio, spread, group, seed, out_dtype):
    """12 vectors of sums (extremes, exact ties, sums nearest half-integers and one off,
    the misrounded ones) requantized ``group`` vectors at a time into ``out_dtype`` (int32
    lanes or uint8 bytes), against the reference chain."""
    rng = np.random.default_rng(seed)
    out_scale = float(np.float32(s_in) * np.float32(ratio))
    odt = mgb.dtype.quint8(out_scale, seed % 256) if asymm else mgb.dtype.qint8(out_scale)
    sums = rng.integers(-spread, spread, 16 * 12, dtype=np.int64).astype(np.int32)
    sums[:4] = [np.iinfo(np.int32).min, np.iinfo(np.int32).max, 0, -1]
    halves = (rng.integers(-300, 300, 64) + 0.5) * ratio + rng.integers(-1, 2, 64)
    sums[64:128] = np.clip(np.round(halves), -(2**31), 2**31 - 1).astype(np.int32)
    hard = _misrounded(s_in, out_scale, rng)
    sums[128 : 128 + hard.size] = hard
    if ratio in (64.0, 256.0):  # multiples of half the ratio: quotients on half-integers
        sums[8:40] = (rng.integers(-300, 300, 32) * int(ratio) // 2).astype(np.int32)
    val = ref.dequantize(sums.view(mgb.dtype.qint32(s_in)))
    if relu:
        val = ref.relu(val)
    want = ref.ints(ref.quantize(val, odt))
    _, _, zp = ref.qinfo(odt)
    lo, hi = (0, 255) if asymm else (-128, 127)
    q = vnni.requant_params(np.array([s_in, out_scale, zp, lo, hi], np.float32))
    got = np.empty(sums.size, out_dtype)
    _run(got, sums, q, relu, group)
    if out_dtype == np.uint8:  # the result's byte
        got = got.astype(np.int32) if asymm else got.view(np.int8).astype(np.int32)
    np.testing.assert_array_equal(got, want)


_SCALES = dict(relu=st.booleans(), asymm=st.booleans(),
               s_in=st.sampled_from([0.125, 1e-3, 0.0123, 3.0, 1e-30, 1e30]),
               ratio=st.one_of(st.sampled_from([64.0, 256.0, 1000 / 3, 0.5, 1.0]),
                               st.floats(0.01, 3000)),
               spread=st.sampled_from([1 << 8, 1 << 15, 1 << 31]),
               seed=st.integers(0, 2**16))  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(group=st.sampled_from([1, 3, 4]), **_SCALES)
def test_requantize16_equals_megdnn_chain(relu, asymm, s_in, ratio, spread, group, seed):
    # groups of vectors share one check near ties: a tie in one vector sends the whole
    # group down the division, the others' lanes included
    _check(relu, asymm, s_in, ratio, spread, group, seed, np.int32)


@settings(max_examples=80, deadline=None)
@given(group=st.sampled_from([2, 4]), **_SCALES)
def test_requantize_bytes_equals_megdnn_chain(relu, asymm, s_in, ratio, spread, group, seed):
    # the tiles' form: the fast value's word read as the result's byte, its fraction bits
    # checked near ties (a tie in one vector sends the whole group down the division)
    _check(relu, asymm, s_in, ratio, spread, group, seed, np.uint8)
