"""The requantized 3x3 depthwise convolution's byte loop (AVX-512 VNNI and VBMI), its
masked-vector loop (AVX-512 byte masks) and the portable loops they stand beside, against the
integer reference bit for bit: every row width and padding at strides 1 to 3, dilations, zero
points, saturating values, biases up to the int32 wrap, and output scales whose quotients land
on half-integers (where the loops' products by a reciprocal or a ratio give way to the
division) or whose reciprocal leaves the normal range."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import quantized_ref as ref
from hypothesis import given, settings
from hypothesis import strategies as st

import megbrain as mgb
from megbrain.kernels import parallel
from megbrain.kernels.conv import quantized
from megbrain.kernels.conv.loops import depthwise_bytes
from megbrain.kernels.conv.loops import int8 as int8_loops

qint8, qint32, quint8 = mgb.dtype.qint8, mgb.dtype.qint32, mgb.dtype.quint8

_LOOPS = [
    pytest.param("portable", id="portable"),
    pytest.param("masked", id="masked", marks=pytest.mark.skipif(
        not int8_loops.masked_vectors(), reason="the CPU has no AVX-512 byte masks")),
    pytest.param("bytes", id="bytes", marks=pytest.mark.skipif(
        not depthwise_bytes.vnni_bytes(), reason="the CPU has no AVX-512 VNNI and VBMI")),
]  # fmt: skip


@contextlib.contextmanager
def _loop(kind: str):
    """The byte loop, the masked-vector loop on every shape it takes (no row-width limits),
    or the portable loops."""
    saved = (quantized.MASKED_VECTORS, quantized.MASKED_ROW_MAX, quantized.CHANNELS_ROW_SCALE,
             quantized.DEPTHWISE_BYTES)  # fmt: skip
    quantized.MASKED_VECTORS, quantized.DEPTHWISE_BYTES = kind == "masked", kind == "bytes"
    if kind == "masked":
        quantized.MASKED_ROW_MAX, quantized.CHANNELS_ROW_SCALE = 1 << 20, 0
    try:
        yield
    finally:
        (quantized.MASKED_VECTORS, quantized.MASKED_ROW_MAX, quantized.CHANNELS_ROW_SCALE,
         quantized.DEPTHWISE_BYTES) = saved  # fmt: skip


@pytest.mark.parametrize("loop", _LOOPS)
@settings(max_examples=20, deadline=None)
@given(c=st.integers(1, 5), h=st.integers(1, 40), w=st.integers(1, 70), stride=st.sampled_from(
           [1, 2, 3]), pad=st.integers(0, 2), dil=st.integers(1, 3), asymm=st.booleans(),
       extreme=st.booleans(), mode=st.sampled_from(["IDENTITY", "RELU"]),
       bias_at=st.sampled_from([0, (1 << 23) - 1, 1 << 23, (1 << 31) - 1]),
       out_scale=st.sampled_from([0.0625, 0.3, 2.0, 40.0, 1e6, 1e-35]),
       seed=st.integers(0, 2**16))  # fmt: skip
def test_requantized_3x3_depthwise_equals_the_reference(loop, c, h, w, stride, pad, dil, asymm,
                                                        extreme, mode, bias_at, out_scale,
                                                        seed):  # fmt: skip
    # scales 0.0625 and 2.0 put many quotients exactly on half-integers (the sums times the
    # bias scale 1/8): ties round away from zero; 1e-35 has no normal float32 reciprocal
    h, w = max(h, 2 * dil + 1 - 2 * pad), max(w, 2 * dil + 1 - 2 * pad)
    rng = np.random.default_rng(seed)
    if asymm:  # a filter zero point of 128, as a deployed Quantized8Asymm filter has
        sdt, fdt, odt = quint8(0.5, seed % 256), quint8(0.25, 128), quint8(out_scale, 7)
    else:
        sdt, fdt, odt = qint8(0.5), qint8(0.25), qint8(out_scale)
    x, f = ref.random_q(rng, (2, c, h, w), sdt), ref.random_q(rng, (c, 1, 1, 3, 3), fdt)
    if extreme:  # the ends of the range: the largest products and zero-point shifts
        lo, hi = (0, 255) if asymm else (-128, 127)
        x.view(x.dtype.str)[...] = rng.choice([lo, hi], x.shape)
        f.view(f.dtype.str)[...] = rng.choice([lo, hi], f.shape)
    bias = ref.random_q(rng, (1, c, 1, 1), qint32(0.125))
    sign = rng.choice([-1, 1], c)
    bias.view(np.int32)[0, :, 0, 0] += (sign * bias_at).astype(np.int32) - sign * 5000
    conv = {"stride": (stride, stride), "pad": (pad, pad), "dilate": (dil, dil)}
    want = ref.conv_bias(x, f, bias, None, odt, mode, group=True, flip=False, **conv)
    out = np.empty(want.shape, want.dtype)
    with _loop(loop):
        step = quantized.bind_quantized_conv_bias(x, f, bias, None, out, *conv.values(), False,
                                                  mode)  # fmt: skip
    step()
    ref.assert_same(out, want)


@pytest.mark.skipif(not depthwise_bytes.vnni_bytes(), reason="the CPU has no AVX-512 VNNI and VBMI")
@settings(max_examples=25, deadline=None)
@given(c=st.integers(2, 40), n=st.integers(1, 2), h=st.integers(3, 40), w=st.integers(3, 40),
       stride=st.sampled_from([1, 2]), threads=st.integers(2, 3),
       per_thread=st.sampled_from([1, 2, 4, 64]), mode=st.sampled_from([None, "RELU"]),
       seed=st.integers(0, 2**16))  # fmt: skip
def test_the_byte_loop_split_in_units_equals_the_reference(c, n, h, w, stride, threads,
                                                           per_thread, mode, seed):  # fmt: skip
    # every layer split as if it were large: bands of output rows (a multiple of the row
    # plan's, paired rows included), then chunks of planes across samples, taken as they go
    rng = np.random.default_rng(seed)
    x, f = ref.random_q(rng, (n, c, h, w), qint8(0.5)), ref.random_q(rng, (c, 1, 1, 3, 3),
                                                                     qint8(0.25))  # fmt: skip
    bias = ref.random_q(rng, (1, c, 1, 1), qint32(0.125))
    conv = {"stride": (stride, stride), "pad": (1, 1), "dilate": (1, 1)}
    saved = (quantized._MIN_MACS_PER_THREAD, quantized._DW_UNITS_PER_THREAD,
             parallel.num_threads)  # fmt: skip
    quantized._MIN_MACS_PER_THREAD, quantized._DW_UNITS_PER_THREAD = 1, per_thread
    parallel.num_threads = lambda: threads
    try:
        with _loop("bytes"):
            if mode is None:  # the int32 sums
                want = ref.conv2d_int(x, f, group=True, **conv)
                out = np.empty(want.shape, np.int32)
                step = quantized.bind_quantized_convolution(x, f, out, *conv.values())
            else:
                want = ref.conv_bias(x, f, bias, None, qint8(3.0), mode, group=True, flip=False,
                                     **conv)  # fmt: skip
                out = np.empty(want.shape, want.dtype)
                step = quantized.bind_quantized_conv_bias(x, f, bias, None, out, *conv.values(),
                                                          False, mode)  # fmt: skip
    finally:
        (quantized._MIN_MACS_PER_THREAD, quantized._DW_UNITS_PER_THREAD,
         parallel.num_threads) = saved  # fmt: skip
    step()
    out.view(out.dtype.str)[...] = 0
    step()  # (the counter reset)
    if mode is None:
        np.testing.assert_array_equal(out, want)
    else:
        ref.assert_same(out, want)
