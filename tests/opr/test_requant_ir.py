"""The 8-bit kernels' shared requantize (``loops/requant_ir.requantize16``) on 16 int32 sums at
a time against MegDNN's float32 chain (the integer reference's dequantize, ReLU and quantize)
bit for bit: ratios of powers of two that put many quotients on half-integers (the
fast product then gives way to the division), scales past the normal binades (the division
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
def _requantize_block(typingctx, out, acc, q, relu):
    """``out[:16]`` = :func:`requant_ir.requantize16` of ``acc[:16]`` with the 7 float32
    ``q`` (the literal ``relu``)."""
    if not isinstance(relu, types.IntegerLiteral):
        return None

    def codegen(context, builder, signature, args):
        i32, f32 = ir.IntType(32), ir.FloatType()
        v32 = ir.VectorType(i32, 16)

        def data(k, elt):
            ary = context.make_array(signature.args[k])(context, builder, args[k])
            return builder.bitcast(ary.data, elt.as_pointer())

        qd = data(2, f32)
        qs = [requant_ir.splat16(builder, builder.load(builder.gep(qd, [ir.Constant(i32, k)])))
              for k in range(7)]  # fmt: skip
        acc = builder.load(builder.bitcast(data(1, i32), v32.as_pointer()), align=4)
        res = requant_ir.requantize16(builder, acc, qs, bool(relu.literal_value))
        builder.store(res, builder.bitcast(data(0, i32), v32.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.void(out, acc, q, relu), codegen


@njit(cache=False)
def _run(out, acc, q, relu):
    for k in range(0, acc.size, 16):
        if relu:
            _requantize_block(out[k:], acc[k:], q, 1)
        else:
            _requantize_block(out[k:], acc[k:], q, 0)



@settings(max_examples=60, deadline=None)
@given(relu=st.booleans(), asymm=st.booleans(),
       s_in=st.sampled_from([0.125, 1e-3, 0.0123, 3.0, 1e-30, 1e30]),
       ratio=st.one_of(st.sampled_from([64.0, 256.0, 1000 / 3, 0.5]), st.floats(0.01, 3000)),
       spread=st.sampled_from([1 << 8, 1 << 15, 1 << 31]), seed=st.integers(0, 2**16))
def test_requantize16_equals_megdnn_chain(relu, asymm, s_in, ratio, spread, seed):
    rng = np.random.default_rng(seed)
    out_scale = float(np.float32(s_in) * np.float32(ratio))
    odt = mgb.dtype.quint8(out_scale, seed % 256) if asymm else mgb.dtype.qint8(out_scale)
    sums = rng.integers(-spread, spread, 16 * 8, dtype=np.int64).astype(np.int32)
    sums[:4] = [np.iinfo(np.int32).min, np.iinfo(np.int32).max, 0, -1]
    if ratio in (64.0, 256.0):  # multiples of half the ratio: quotients on half-integers
        sums[8:40] = (rng.integers(-300, 300, 32) * int(ratio) // 2).astype(np.int32)
    src = sums.view(mgb.dtype.qint32(s_in))
    val = ref.dequantize(src)
    if relu:
        val = ref.relu(val)
    want = ref.ints(ref.quantize(val, odt))
    _, _, zp = ref.qinfo(odt)
    lo, hi = (0, 255) if asymm else (-128, 127)
    q = vnni.requant_params(np.array([s_in, out_scale, zp, lo, hi], np.float32))
    got = np.empty_like(sums)
    _run(got, sums, q, relu)
    np.testing.assert_array_equal(got, want)
