"""Quantized ConvBias and Convolution (NCHW: dense, group, depthwise) against the integer
reference of MegDNN's naive kernels, bit for bit; and their dtype checks."""

from __future__ import annotations

import numpy as np
import pytest
import quantized_ref as ref
from hypothesis import given, settings
from hypothesis import strategies as st
from opr_harness import build_and_run

import megbrain as mgb
from megbrain.opr import conv_bias_activation, convolution
from megbrain.opr.base import build_opr
from megbrain.opr.dnn_conv_bias import ConvBias, ConvBiasParam

qint8, qint32, quint8 = mgb.dtype.qint8, mgb.dtype.qint32, mgb.dtype.quint8


_SCALES = st.sampled_from([0.5, 0.25, 0.1, 0.0173, 0.003, 1.7])


@st.composite
def _cases(draw, with_z=False, asymm=False):
    kind = draw(st.sampled_from(["dense", "group", "depthwise"]))
    g = 1 if kind == "dense" else draw(st.integers(2, 3))
    icg = 1 if kind == "depthwise" else draw(st.integers(1, 3))
    ocg = 1 if kind == "depthwise" else draw(st.integers(1, 3))
    fh, fw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    sh, sw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    ph, pw = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    h = draw(st.integers(dh * (fh - 1) + 1, 9))
    w = draw(st.integers(dw * (fw - 1) + 1, 9))
    n = draw(st.integers(1, 2))
    ss, sf = draw(_SCALES), draw(_SCALES)
    if asymm:
        sdt, fdt = quint8(ss, draw(st.integers(0, 255))), quint8(sf, draw(st.integers(0, 255)))
    else:
        sdt, fdt = qint8(ss), qint8(sf)
    bscale = float(np.float32(ss) * np.float32(sf))
    out8 = draw(st.booleans())
    src_kind = "Quantized8Asymm" if asymm else "QuantizedS8"
    out_dt = (quint8(draw(_SCALES) * 4, draw(st.integers(0, 255))) if asymm else
              qint8(draw(_SCALES) * 4)) if out8 else qint32(bscale)  # fmt: skip
    modes = ["IDENTITY", "RELU", "H_SWISH"] + (["SIGMOID"] if with_z else [])
    return {
        "src": ref.random_q(np.random.default_rng(draw(st.integers(0, 2**16))),
                            (n, g * icg, h, w), sdt),
        "filt_shape": ((g, ocg, icg, fh, fw) if kind != "dense" else (ocg, icg, fh, fw)),
        "fdt": fdt, "bias_dt": qint32(bscale), "out_dt": out_dt, "src_kind": src_kind,
        "per_channel_bias": draw(st.booleans()), "mode": draw(st.sampled_from(modes)),
        "group": kind != "dense", "stride": (sh, sw), "pad": (ph, pw), "dilate": (dh, dw),
        "flip": draw(st.booleans()), "seed": draw(st.integers(0, 2**16)),
    }  # fmt: skip


def _params(c):
    return {
        "sparse": "GROUP" if c["group"] else "DENSE",
        "mode": "CONVOLUTION" if c["flip"] else "CROSS_CORRELATION",
        "stride_h": c["stride"][0], "stride_w": c["stride"][1],
        "pad_h": c["pad"][0], "pad_w": c["pad"][1],
        "dilate_h": c["dilate"][0], "dilate_w": c["dilate"][1],
    }  # fmt: skip


def _conv_kw(c):
    return {k: c[k] for k in ("stride", "pad", "dilate", "group", "flip")}


def _run_case(c, with_z):
    rng = np.random.default_rng(c["seed"])
    x = c["src"]
    filt = ref.random_q(rng, c["filt_shape"], c["fdt"])
    acc_shape = ref.conv2d_int(x, filt, **_conv_kw(c)).shape
    bshape = (1, acc_shape[1], 1, 1) if c["per_channel_bias"] else acc_shape
    bias = ref.random_q(rng, bshape, c["bias_dt"])
    arrays = [x, filt, bias]
    z = None
    if with_z:
        z = ref.random_q(rng, acc_shape, c["out_dt"])
        arrays.append(z)
    p = _params(c)

    def build(*vs):
        return conv_bias_activation(*vs[:3], nonlineMode=c["mode"], dtype=c["out_dt"], **p) if (
            len(vs) == 3) else _conv_bias_z(*vs, c["mode"], c["out_dt"], p)  # fmt: skip

    _, got = build_and_run(build, *arrays)
    want = ref.conv_bias(x, filt, bias, z, c["out_dt"], c["mode"], **_conv_kw(c))
    ref.assert_same(got, want)


def _conv_bias_z(x, w, b, z, mode, dtype, p):
    return build_opr(ConvBias, [x, w, b, z], ConvBiasParam(nonlineMode=mode, **p), dtype,
                     None, None, None, None)  # fmt: skip


@settings(max_examples=12, deadline=None)
@given(_cases())
def test_conv_bias_qint8_equals_the_integer_reference(c):
    _run_case(c, with_z=False)


@settings(max_examples=30, deadline=None)
@given(_cases(with_z=True))
def test_conv_bias_with_z_equals_the_integer_reference(c):
    _run_case(c, with_z=True)


@settings(max_examples=8, deadline=None)
@given(_cases(asymm=True))
def test_conv_bias_quint8_subtracts_zero_points(c):
    _run_case(c, with_z=False)


@settings(max_examples=12, deadline=None)
@given(_cases())
def test_convolution_on_quantized_gives_exact_int32_sums(c):
    rng = np.random.default_rng(c["seed"])
    filt = ref.random_q(rng, c["filt_shape"], c["fdt"])
    out, got = build_and_run(lambda a, b: convolution(a, b, **_params(c)), c["src"], filt)
    assert mgb.dtype.dtype_name(out.dtype) == "QuantizedS32"
    assert mgb.dtype.get_scale(out.dtype) == pytest.approx(
        float(np.float32(mgb.dtype.get_scale(c["src"].dtype)) * np.float32(
            mgb.dtype.get_scale(filt.dtype)))  # fmt: skip
    )
    np.testing.assert_array_equal(got.view(np.int32), ref.conv2d_int(c["src"], filt,
                                                                      **_conv_kw(c)))


def test_convolution_to_qint8_requantizes_the_sums():
    rng = np.random.default_rng(1)
    x, w = ref.random_q(rng, (1, 4, 6, 6), qint8(0.5)), ref.random_q(rng, (3, 4, 3, 3), qint8(0.1))
    od = qint8(7.0)
    _, got = build_and_run(lambda a, b: convolution(a, b, pad_h=1, pad_w=1, dtype=od), x, w)
    sums = ref.conv2d_int(x, w, pad=(1, 1)).view(qint32(float(np.float32(0.5) *
                                                              np.float32(0.1))))  # fmt: skip
    ref.assert_same(got, ref.quantize(ref.dequantize(sums), od))


def test_int8_sums_are_exact_where_float32_would_round():
    # 576 products of 127 * 127 = 9290304 exceeds float32's 2**24: only integer sums are exact
    x = np.full((1, 64, 3, 3), 127, np.int8).view(qint8(1.0))
    w = np.full((1, 64, 3, 3), 127, np.int8).view(qint8(1.0))
    w.view(np.int8)[0, 0, 0, 0] = 126
    _, got = build_and_run(lambda a, b: convolution(a, b), x, w)
    assert int(got.view(np.int32)[0, 0, 0, 0]) == 127 * 127 * 576 - 127


def _err(build, *arrays):
    with pytest.raises(mgb.MegBrainError) as info:
        build_and_run(build, *arrays)
    return str(info.value)


def _trio():
    rng = np.random.default_rng(2)
    x, w = ref.random_q(rng, (1, 4, 5, 5), qint8(0.5)), ref.random_q(rng, (2, 4, 3, 3), qint8(0.25))
    return x, w, ref.random_q(rng, (1, 2, 1, 1), qint32(0.125))


def test_float_src_into_a_quantized_conv_bias_names_the_operator_var_and_dtypes():
    x, w, b = _trio()
    msg = _err(lambda a, c, d: conv_bias_activation(a, c, d), x.view(np.int8).astype("f4"), w, b)
    assert "ConvBiasForward" in msg and "src 'x0' float32" in msg
    assert "filter 'x1' QuantizedS8(scale=0.25)" in msg


def test_bias_scale_must_be_the_product_of_the_scales():
    x, w, b = _trio()
    msg = _err(lambda a, c, d: conv_bias_activation(a, c, d), x, w,
               b.view(np.int32).view(qint32(0.2)))  # fmt: skip
    assert "bias scale must be src scale * filter scale" in msg and "'x2'" in msg
    assert "QuantizedS32(scale=0.2)" in msg and "QuantizedS8(scale=0.5)" in msg


def test_bias_must_be_qint32_and_kinds_must_match():
    x, w, b = _trio()
    msg = _err(lambda a, c, d: conv_bias_activation(a, c, d), x, w, b.view(np.int32))
    assert "bias of a quantized convolution must be QuantizedS32" in msg and "int32" in msg
    wa = w.view(np.int8).astype(np.uint8).view(quint8(0.25, 3))
    msg = _err(lambda a, c, d: conv_bias_activation(a, c, d), x, wa, b)
    assert "Quantized8Asymm(scale=0.25, zero_point=3)" in msg


def test_output_dtype_must_be_qint32_of_the_product_or_the_source_kind():
    x, w, b = _trio()
    msg = _err(lambda a, c, d: conv_bias_activation(a, c, d, dtype=qint32(0.3)), x, w, b)
    assert "unsupported output dtype QuantizedS32(scale=0.3)" in msg
    msg = _err(lambda a, c, d: conv_bias_activation(a, c, d, dtype="float32"), x, w, b)
    assert "unsupported output dtype float32" in msg


def test_sigmoid_without_z_is_refused_for_quantized_outputs():
    x, w, b = _trio()
    msg = _err(lambda a, c, d: conv_bias_activation(a, c, d, nonlineMode="SIGMOID",
                                                    dtype=qint8(1.0)), x, w, b)  # fmt: skip
    assert "SIGMOID needs a z" in msg

