"""The int8 networks' small operators on their compiled paths against the integer reference:
the classifier's matrix-vector product on VNNI (:mod:`megbrain.kernels.conv.loops.vnni_gemv`)
and the 8-bit global average pooling in one pass."""

from __future__ import annotations

import numpy as np
import pytest
import quantized_ref as ref
from hypothesis import given, settings
from hypothesis import strategies as st

import megbrain as mgb
from megbrain.kernels import blas
from megbrain.kernels.conv import quantized
from megbrain.kernels.conv.constant_operands import constant_filter
from megbrain.kernels.conv.loops import vnni, vnni_gemv
from megbrain.kernels.pool import binds as pool_binds

qint8, qint32, quint8 = mgb.dtype.qint8, mgb.dtype.qint32, mgb.dtype.quint8

_VNNI = pytest.mark.skipif(not vnni.available(), reason="the CPU has no AVX-512 VNNI")


def _operands(rng, m, k, n, asymm, extreme):
    da, db = (quint8(0.5, 77), quint8(0.25, 128)) if asymm else (qint8(0.5), qint8(0.25))
    x, w = ref.random_q(rng, (m, k), da), ref.random_q(rng, (n, k), db)
    if extreme:  # the ends of the range: -128 * -128 products, 255 - 0 shifts
        lo, hi = (0, 255) if asymm else (-128, 127)
        for a in (x, w):
            a.view(a.dtype.str)[...] = rng.choice([lo, hi], a.shape)
    want = ref.wrap_i32((ref.ints(x) - (77 if asymm else 0))
                        @ (ref.ints(w) - (128 if asymm else 0)).T)  # fmt: skip
    return x, w, want


@_VNNI
@settings(max_examples=20, deadline=None)
@given(m=st.integers(1, 4), k=st.integers(1, 300), n=st.integers(1, 150), asymm=st.booleans(),
       extreme=st.booleans(), constant=st.booleans(), seed=st.integers(0, 2**16))  # fmt: skip
def test_the_matrix_vector_product_equals_the_integer_product(m, k, n, asymm, extreme,
                                                              constant, seed):  # fmt: skip
    # K not a multiple of 4 (a last group of 1-3 bytes), N not of 16 nor of 64 (masked
    # blocks), a few rows of the source
    x, w, want = _operands(np.random.default_rng(seed), m, k, n, asymm, extreme)
    out = np.empty((m, n), np.int32).view(qint32(0.125))
    step = quantized._bind_gemv(x, w, out, constant)
    step()
    np.testing.assert_array_equal(out.view(np.int32), want)
    if constant:  # packed once: the weights' later values are not read
        w.view(w.dtype.str)[...] = 0
        step()
        np.testing.assert_array_equal(out.view(np.int32), want)


@_VNNI
@pytest.mark.parametrize("tb, constant", [(False, True), (True, False), (True, True)])
def test_a_classifier_takes_the_matrix_vector_product(tb, constant, monkeypatch):
    # one row of activations by a weight of 2000 outputs, constant or stored (N, K): split
    # over the threads by blocks of output rows
    monkeypatch.setattr(quantized, "_MIN_GEMV_BYTES", 1)
    x, w, want = _operands(np.random.default_rng(3), 1, 333, 2000, False, False)
    b = np.ascontiguousarray(w) if tb else np.ascontiguousarray(w.T)
    out = np.empty((1, 2000), np.int32).view(qint32(0.125))
    parts = []
    real = vnni_gemv.gemv_loop()
    monkeypatch.setattr(vnni_gemv, "gemv_loop",
                        lambda: lambda *a: parts.append(a[-2:]) or real(*a))  # fmt: skip
    with constant_filter(constant):
        step = blas.bind_matmul(x, b, out, False, tb)
    step()
    assert parts and sum(t1 - t0 for t0, t1 in parts) == 32  # 125 blocks of 16, by 4
    np.testing.assert_array_equal(out.view(np.int32), want)


@settings(max_examples=20, deadline=None)
@given(dt=st.sampled_from([qint8(0.3), quint8(0.2, 7), quint8(0.1, 200)]),
       planes=st.sampled_from([5, 3000]), h=st.integers(1, 9), w=st.integers(1, 9),
       extreme=st.booleans(), seed=st.integers(0, 2**16))  # fmt: skip
def test_the_8bit_global_average_in_one_pass_equals_the_integer_reference(dt, planes, h, w,
                                                                          extreme, seed):
    # 3000 planes: split over the threads
    rng = np.random.default_rng(seed)
    x = ref.random_q(rng, (2, planes, h, w), dt)
    if extreme:
        info = np.iinfo(x.dtype.str)
        x.view(x.dtype.str)[...] = rng.choice([info.min, info.max], x.shape)
    for mode in ("AVERAGE", "AVERAGE_COUNT_EXCLUDE_PADDING"):
        out = np.empty((2, planes, 1, 1), dt)
        pool_binds.bind_pooling(x, out, mode, (h, w), (1, 1), (0, 0))()
        ref.assert_same(out, ref.pool2d_int(x, mode, (h, w), (1, 1), (0, 0)))


@pytest.mark.skipif(not quantized.DEPTHWISE_BYTES, reason="the CPU has no AVX-512 VNNI / VBMI")
@pytest.mark.parametrize("asymm", [False, True])
def test_a_constant_depthwise_filter_is_packed_once_and_the_bias_read_every_run(asymm):
    # the 3x3 byte loop packs a constant filter's words once; the bias enters in the loop
    rng = np.random.default_rng(11)
    sdt, fdt = (quint8(0.5, 9), quint8(0.25, 128)) if asymm else (qint8(0.5), qint8(0.25))
    x, f = ref.random_q(rng, (1, 20, 9, 9), sdt), ref.random_q(rng, (20, 1, 1, 3, 3), fdt)
    bias = ref.random_q(rng, (1, 20, 1, 1), qint32(0.125))
    odt = quint8(0.7, 7) if asymm else qint8(0.7)
    out = np.empty((1, 20, 9, 9), odt)
    with constant_filter(True):
        step = quantized.bind_quantized_conv_bias(x, f, bias, None, out, (1, 1), (1, 1),
                                                  (1, 1), False, "RELU")  # fmt: skip
    for run in range(2):
        if run:  # the filter's later values are not read, the bias's are
            want_f = f.copy()
            f.view(f.dtype.str)[...] = 128 if asymm else 0
            bias.view(np.int32)[...] = rng.integers(-(1 << 31), 1 << 31, bias.shape)
        want = ref.conv_bias(x, want_f if run else f, bias, None, odt, "RELU", stride=(1, 1),
                             pad=(1, 1), dilate=(1, 1), group=True, flip=False)  # fmt: skip
        step()
        ref.assert_same(out, want)


@pytest.mark.parametrize("w", [9, 1022, 1023, 1500])
def test_the_3x3_stride_2_max_pooling_of_rows_past_its_stack_tile_equals_the_reference(w):
    # the column maxima of rows up to 1022 columns on the stack, of wider ones in memory
    x = ref.random_q(np.random.default_rng(w), (1, 2, 5, w), qint8(0.3))
    out = np.empty((1, 2, 3, (w - 1) // 2 + 1), qint8(0.3))
    pool_binds.bind_pooling(x, out, "MAX", (3, 3), (2, 2), (1, 1))()
    ref.assert_same(out, ref.pool2d_int(x, "MAX", (3, 3), (2, 2), (1, 1)))
