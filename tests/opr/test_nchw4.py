"""The NCHW4 layout (``use_nchw4``): RelayoutFormat's NCHW_NCHW4, NCHW4_NCHW and
NCHW_NCHW4_WEIGHT against NumPy, and the quantized ConvBias, Convolution and Pooling in
``format=NCHW4`` bit for bit against the integer reference of the NCHW operator relaid."""

from __future__ import annotations

import numpy as np
import pytest
import quantized_ref as ref
from hypothesis import given, settings
from hypothesis import strategies as st
from opr_harness import check_opr, inputs, make_graph
from test_conv_int8_vnni import _PATHS, _channel_tiles, _path, _threads

import megbrain as mgb
from megbrain.errors import MegBrainError
from megbrain.kernels import parallel
from megbrain.kernels.conv import quantized
from megbrain.kernels.conv.loops import vnni, vnni_channels
from megbrain.opr import relayout_format
from megbrain.opr.base import build_opr
from megbrain.opr.dnn_conv_bias import ConvBias, ConvBiasParam

qint8, qint32, quint8 = mgb.dtype.qint8, mgb.dtype.qint32, mgb.dtype.quint8


def _to4(a: np.ndarray, pad_value: int = 0) -> np.ndarray:
    """(N, C, H, W) -> (N, ceil(C/4), H, W, 4), the channels padded with ``pad_value``."""
    n, c, h, w = a.shape
    cp = -(-c // 4) * 4
    b = np.full((n, cp, h, w), pad_value, a.dtype)
    b[:, :c] = a
    return b.reshape(n, cp // 4, 4, h, w).transpose(0, 1, 3, 4, 2)


def _from4(a: np.ndarray) -> np.ndarray:
    n, c4, h, w, k = a.shape
    return a.transpose(0, 1, 4, 2, 3).reshape(n, c4 * k, h, w)


def _weight4(f: np.ndarray) -> np.ndarray:
    """NCHW_NCHW4_WEIGHT: (OC, IC, FH, FW) or (G, OCg, ICg, FH, FW), both channel counts
    zero-padded to multiples of 4, the input channels blocked innermost."""
    lead = f.shape[:-4]
    oc, ic, fh, fw = f.shape[-4:]
    op, ip = -(-oc // 4) * 4, -(-ic // 4) * 4
    b = np.zeros((*lead, op, ip, fh, fw), f.dtype)
    b[..., :oc, :ic, :, :] = f
    b = b.reshape(*lead, op, ip // 4, 4, fh, fw)
    k = len(lead)
    return b.transpose(*range(k), k, k + 1, k + 3, k + 4, k + 2)


@pytest.mark.parametrize(
    "mode, shape, ref_fn",
    [
        ("NCHW_NCHW4", (2, 8, 3, 5), _to4),
        ("NCHW_NCHW4", (1, 3, 4, 2), _to4),  # channels padded with zeros
        ("NCHW4_NCHW", (2, 3, 3, 2, 4), _from4),
        ("NCHW_NCHW4_WEIGHT", (8, 12, 3, 3), _weight4),
        ("NCHW_NCHW4_WEIGHT", (6, 3, 1, 2), _weight4),  # both counts padded
        ("NCHW_NCHW4_WEIGHT", (2, 4, 8, 3, 3), _weight4),
        ("NCHW_NCHW4_WEIGHT", (3, 5, 2, 1, 1), _weight4),
    ],
)
def test_relayout_format_nchw4_modes(mode, shape, ref_fn):
    a = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    # twice: the padding of a private buffer stays zero from run to run
    check_opr(lambda v: relayout_format(v, mode=mode), ref_fn, [a])


@pytest.mark.parametrize("dt", [qint8(0.5), quint8(0.25, 9)])
def test_relayout_format_nchw4_keeps_quantized_dtypes(dt):
    rng = np.random.default_rng(2)
    a = ref.random_q(rng, (1, 5, 3, 4), dt)
    g = mgb.comp_graph()
    xv = mgb.make_arg("cpu0", g, name="x", shape=a.shape, dtype=dt)
    y = relayout_format(xv, mode="NCHW_NCHW4")
    back = relayout_format(y, mode="NCHW4_NCHW")
    assert y.dtype == dt and back.dtype == dt
    got, again = g.compile([xv], [mgb.copy_output(y), mgb.copy_output(back)])(a)
    zp = ref.qinfo(dt)[2]  # a Quantized8Asymm tensor is padded with its zero point
    plain = a.view(a.dtype.str)
    np.testing.assert_array_equal(np.asarray(got).view(a.dtype.str), _to4(plain, zp))
    np.testing.assert_array_equal(np.asarray(again).view(a.dtype.str)[:, :5], plain)


@pytest.mark.parametrize(
    "mode, shape, match",
    [
        ("NCHW4_NCHW", (1, 2, 3, 4, 8), r"\(N, C/4, H, W, 4\)"),
        ("NCHW_NCHW4", (2, 3, 4), "needs a 4-d source"),
        ("NCHW_NCHW4_WEIGHT", (2, 3, 4), "needs a 4-d or 5-d source"),
        ("NCHW_NCHW64", (1, 2, 3, 4), "mode NCHW_NCHW64 is not implemented|NCHW_NCHW64"),
    ],
)
def test_relayout_format_nchw4_refuses_what_it_does_not_do(mode, shape, match):
    g = make_graph()
    (x,), _ = inputs(g, np.zeros(shape, np.float32))
    with pytest.raises((MegBrainError, KeyError, ValueError), match=match):
        relayout_format(x, mode=mode)


# ---- ConvBias / Convolution / Pooling in NCHW4 ---------------------------------------------
@st.composite
def _convs(draw):
    g = draw(st.sampled_from([1, 1, 2, 3]))
    icg = draw(st.integers(1, 12)) if g == 1 else 4 * draw(st.integers(1, 3))
    ocg = 4 * draw(st.integers(1, 6))
    fh, fw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    stride = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    pad = (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
    h, w = draw(st.integers(fh, 17)), draw(st.integers(fw, 21))
    return {"shape": (draw(st.integers(1, 2)), g * icg, h, w), "filt": (g, ocg, icg, fh, fw),
            "stride": stride, "pad": pad, "seed": draw(st.integers(0, 2**16)),
            "mode": draw(st.sampled_from(["IDENTITY", "RELU"])),
            "out_scale": draw(st.sampled_from([0.3, 2.0, 40.0, 900.0])),
            "z": draw(st.booleans()), "full_bias": draw(st.integers(0, 4)) == 0}  # fmt: skip


def _conv_kw(c) -> dict:
    (sh, sw), (ph, pw) = c["stride"], c["pad"]
    g = c["filt"][0]
    return dict(stride_h=sh, stride_w=sw, pad_h=ph, pad_w=pw,
                sparse="GROUP" if g > 1 else "DENSE")  # fmt: skip


def _filter_nchw4(f: np.ndarray, g: int) -> np.ndarray:
    """The NCHW4 filter of a (G, OCg, ICg, FH, FW) one: dense (OC, ceil(IC/4), FH, FW, 4)
    when ``g == 1``."""
    return _weight4(f[0] if g == 1 else f)


@pytest.mark.parametrize("on", _PATHS)  # the blocked VNNI bands, or the relayout fallback
@settings(max_examples=30, deadline=None)
@given(c=_convs())
def test_conv_bias_nchw4_equals_the_nchw_reference(on, c):
    rng = np.random.default_rng(c["seed"])
    sx, sw = 0.5, 0.25
    x = ref.random_q(rng, c["shape"], qint8(sx))
    f = ref.random_q(rng, c["filt"], qint8(sw))
    g, ocg = c["filt"][:2]
    oc = g * ocg
    odt = qint8(c["out_scale"])
    kw = _conv_kw(c)
    want0 = ref.conv2d_int(x, f, stride=c["stride"], pad=c["pad"], group=True)
    bshape = want0.shape if c["full_bias"] else (1, oc, 1, 1)
    bias = ref.random_q(rng, bshape, qint32(sx * sw))
    z = ref.random_q(rng, want0.shape, odt) if c["z"] else None
    want = ref.conv_bias(x, f, bias, z, odt, c["mode"], stride=c["stride"], pad=c["pad"],
                         group=True)  # fmt: skip
    plain = x.view(x.dtype.str)
    x4 = _to4(plain).copy().view(x.dtype)
    f4 = _filter_nchw4(f.view(f.dtype.str), g).copy().view(f.dtype)
    b4 = _to4(bias.view(np.int32)).copy().view(bias.dtype)
    gr = mgb.comp_graph()
    xv = mgb.make_arg("cpu0", gr, name="x", shape=x4.shape, dtype=x4.dtype)
    ins = [xv, mgb.make_immutable("cpu0", gr, f4), mgb.make_immutable("cpu0", gr, b4)]
    if z is not None:
        ins.append(mgb.make_immutable("cpu0", gr, _to4(z.view(np.int8)).copy().view(odt)))
    if z is None:
        y = mgb.opr.conv_bias_activation(*ins, nonlineMode=c["mode"], dtype=odt,
                                         format="NCHW4", **kw)  # fmt: skip
    else:
        param = ConvBiasParam(nonlineMode=c["mode"], format="NCHW4", **kw)
        y = build_opr(ConvBias, ins, param, odt, None, None, None, None)
    assert y.imm_shape == (want.shape[0], oc // 4, *want.shape[2:], 4)
    with _path(on):  # (bound at the first call)
        run = gr.compile([xv], [mgb.copy_output(y)])
        for _ in range(2):  # a constant filter is relaid once
            (got,) = run(x4)
            np.testing.assert_array_equal(_from4(np.asarray(got).view(np.int8)),
                                          want.view(np.int8))  # fmt: skip


@settings(max_examples=15, deadline=None)
@given(c=_convs(), requant=st.booleans())
def test_convolution_nchw4_equals_the_nchw_reference(c, requant):
    rng = np.random.default_rng(c["seed"])
    x = ref.random_q(rng, c["shape"], qint8(0.5))
    f = ref.random_q(rng, c["filt"], qint8(0.25))
    g = c["filt"][0]
    sums = ref.conv2d_int(x, f, stride=c["stride"], pad=c["pad"], group=True)
    gr = mgb.comp_graph()
    x4 = _to4(x.view(np.int8)).copy().view(x.dtype)
    xv = mgb.make_arg("cpu0", gr, name="x4", shape=x4.shape, dtype=x4.dtype)
    fv = mgb.make_immutable("cpu0", gr, _filter_nchw4(f.view(np.int8), g).copy().view(f.dtype))
    odt = qint8(c["out_scale"]) if requant else None
    y = mgb.opr.convolution(xv, fv, dtype=odt, format="NCHW4", **_conv_kw(c))
    (got,) = gr.compile([xv], [mgb.copy_output(y)])(x4)
    if requant:
        want = ref.quantize(sums.astype(np.float32) * np.float32(0.125), odt)
        np.testing.assert_array_equal(_from4(np.asarray(got).view(np.int8)), want.view(np.int8))
    else:
        np.testing.assert_array_equal(_from4(np.asarray(got).view(np.int32)), sums)


@pytest.mark.parametrize("mode, window, stride, pad", [("MAX", 3, 2, 1), ("AVERAGE", 7, 1, 0),
                                                       ("AVERAGE", 2, 2, 0)])  # fmt: skip
def test_pooling_nchw4_equals_the_nchw_reference(mode, window, stride, pad):
    x = ref.random_q(np.random.default_rng(4), (1, 8, 7, 9), qint8(0.5))
    want = ref.pool2d_int(x, mode, (window, window), (stride, stride), (pad, pad))
    gr = mgb.comp_graph()
    x4 = _to4(x.view(np.int8)).copy().view(x.dtype)
    xv = mgb.make_arg("cpu0", gr, name="x", shape=x4.shape, dtype=x4.dtype)
    y = mgb.opr.pooling(xv, mode=mode, window_h=window, window_w=window, stride_h=stride,
                        stride_w=stride, pad_h=pad, pad_w=pad, format="NCHW4")  # fmt: skip
    assert y.dtype == x.dtype
    (got,) = gr.compile([xv], [mgb.copy_output(y)])(x4)
    np.testing.assert_array_equal(_from4(np.asarray(got).view(np.int8)), want.view(np.int8))


@pytest.mark.parametrize(
    "x_shape, f_shape, kw, match",
    [
        ((1, 2, 5, 5, 4), (8, 3, 3, 3, 4), {}, "channel mismatch: src"),
        ((1, 2, 5, 5, 4), (6, 2, 3, 3, 4), {}, "multiple of 4"),
        ((1, 2, 5, 5, 4), (8, 2, 3, 3, 4), {"dilate_h": 2}, "no dilation"),
        ((1, 2, 5, 5), (8, 2, 3, 3, 4), {}, r"\(N, C/4, H, W, 4\) src"),
        ((1, 2, 5, 5, 4), (8, 8, 3, 3), {}, "dense"),
    ],
)
def test_conv_bias_nchw4_checks_name_the_operator_and_shapes(x_shape, f_shape, kw, match):
    gr = mgb.comp_graph()
    xv = mgb.make_arg("cpu0", gr, name="x", shape=x_shape, dtype=qint8(0.5))
    fv = mgb.make_immutable("cpu0", gr, np.zeros(f_shape, np.int8).view(qint8(0.25)))
    bv = mgb.make_immutable("cpu0", gr, np.zeros((1, 2, 1, 1, 4), np.int32).view(qint32(0.125)))
    with pytest.raises(MegBrainError, match=match) as info:
        mgb.opr.conv_bias_activation(xv, fv, bv, dtype=qint8(1.0), format="NCHW4", **kw)
    assert "ConvBias" in str(info.value)


def test_conv_bias_nchw4_takes_quantized_operands_only():
    gr = mgb.comp_graph()
    xv = mgb.make_arg("cpu0", gr, name="x", shape=(1, 2, 5, 5, 4), dtype=np.float32)
    fv = mgb.make_immutable("cpu0", gr, np.zeros((8, 2, 3, 3, 4), np.float32))
    bv = mgb.make_immutable("cpu0", gr, np.zeros((1, 2, 1, 1, 4), np.float32))
    with pytest.raises(MegBrainError, match="8-bit quantized operands, src 'x'"):
        mgb.opr.conv_bias_activation(xv, fv, bv, format="NCHW4")


@pytest.mark.skipif(not vnni.available(), reason="the CPU has no AVX-512 VNNI")
@settings(max_examples=40, deadline=None)
@given(c=_convs(), threads=st.integers(1, 3), band_min=st.sampled_from([1, 40, 1 << 30]),
       flip=st.booleans(), tile=st.sampled_from([None, *sorted(vnni_channels.TILES.items())]))
def test_the_blocked_vnni_bands_equal_the_reference(c, threads, band_min, flip, tile):
    # every layer split as if it were large: bands of output rows (each thread relaying a
    # band's rows of the blocked source, writing its rows of the blocked output), or chunks
    # of the output channels (a block of 4 channels shared by two chunks written bytewise);
    # on the tiles of positions, or on a shape of the channel tiles (each position's words
    # of 4 channels written in place)
    _check_blocked_vnni(c, threads, band_min, flip, tile)


@pytest.mark.skipif(not vnni.available(), reason="the CPU has no AVX-512 VNNI")
@pytest.mark.parametrize("n, h, w, threads, band_min, tile", [
    (1, 8, 16, 2, 1, None), (2, 5, 7, 3, 40, None), (1, 9, 9, 2, 1 << 30, None),
    (1, 7, 7, 2, 1, (7, 4)), (2, 6, 14, 3, 1, (14, 2))])  # fmt: skip
def test_a_1x1_blocked_layer_relays_its_bands_as_runs(n, h, w, threads, band_min, tile):
    # at stride 1 without padding a band's rows of each 4-channel block are one run of
    # words, relaid by one loop; the last band shorter than the others
    c = {"shape": (n, 12, h, w), "filt": (1, 20, 12, 1, 1), "stride": (1, 1), "pad": (0, 0),
         "seed": h * w + n, "mode": "RELU", "out_scale": 2.0}  # fmt: skip
    _check_blocked_vnni(c, threads, band_min, False, tile)


def _check_blocked_vnni(c, threads, band_min, flip, tile):
    """The blocked VNNI bands on case ``c`` against the NCHW reference, split for
    ``threads`` with bands of at least ``band_min`` positions, on the channel tile ``tile``
    (None: the position tiles)."""
    rng = np.random.default_rng(c["seed"])
    x = ref.random_q(rng, c["shape"], qint8(0.5))
    f = ref.random_q(rng, c["filt"], qint8(0.25))
    oc = c["filt"][0] * c["filt"][1]
    b = ref.random_q(rng, (1, oc, 1, 1), qint32(0.125))
    odt = qint8(c["out_scale"])
    want = ref.conv_bias(x, f, b, None, odt, c["mode"], stride=c["stride"], pad=c["pad"],
                         group=True, flip=flip)  # fmt: skip
    x4 = _to4(x.view(np.int8)).copy().view(x.dtype)
    icp = x4.shape[1] * 4 // c["filt"][0]  # a dense filter's channels padded as the source's
    fp = np.zeros((*c["filt"][:2], icp, *c["filt"][3:]), np.int8)
    fp[:, :, : c["filt"][2]] = f.view(np.int8)
    b4 = _to4(b.view(np.int32)).copy().view(b.dtype)
    out = np.empty((want.shape[0], oc // 4, *want.shape[2:], 4), np.int8).view(odt)
    saved, quantized._MIN_BAND_POSITIONS = quantized._MIN_BAND_POSITIONS, band_min
    try:
        with _threads(threads), _channel_tiles(tile):
            step = quantized.bind_vnni_blocked(x4, fp.view(f.dtype), b4, None, out,
                                               c["stride"], c["pad"], (1, 1), flip,
                                               c["mode"])  # fmt: skip
    finally:
        quantized._MIN_BAND_POSITIONS = saved
    assert step is not None
    for _ in range(2):  # (the band buffers reused)
        step()
        np.testing.assert_array_equal(_from4(out.view(np.int8)), want.view(np.int8))


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 2), c4=st.integers(1, 9), h=st.integers(1, 13), w=st.integers(1, 70),
       threads=st.integers(1, 3), kind=st.sampled_from(["int8", "uint8", "float32"]))  # fmt: skip
def test_blocked_copies_equal_numpy(n, c4, h, w, threads, kind):
    # the compiled 8-bit loops (64-word steps, the last one masked) and NumPy's copy for
    # other dtypes, split over the blocks
    from megbrain.kernels.conv import nchw4

    a = np.random.default_rng(c4 * h * w).integers(-128, 128, (n, 4 * c4, h, w)).astype(kind)
    b = np.empty((n, c4, h, w, 4), kind)
    back = np.empty_like(a)
    saved = nchw4._MIN_RELAYOUT_BYTES, parallel.num_threads
    nchw4._MIN_RELAYOUT_BYTES, parallel.num_threads = 1, lambda: threads
    try:
        to, fro = nchw4.bind_blocked_copy(a, b), nchw4.bind_blocked_copy(b, back)
    finally:
        nchw4._MIN_RELAYOUT_BYTES, parallel.num_threads = saved
    to()
    fro()
    np.testing.assert_array_equal(b, _to4(a))
    np.testing.assert_array_equal(back, a)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 2), c4=st.integers(1, 5), h=st.integers(1, 19), w=st.integers(1, 23),
       threads=st.integers(1, 3), asymm=st.booleans())  # fmt: skip
def test_nchw4_stem_max_pooling_equals_the_reference(n, c4, h, w, threads, asymm):
    # 3x3/s2/p1 of int8 blocked (the padding rows and columns the lowest value), any size;
    # Quantized8Asymm between relayouts
    from megbrain.kernels.pool import nchw4 as pool_nchw4

    dt = quint8(0.5, 3) if asymm else qint8(0.5)
    x = ref.random_q(np.random.default_rng(h * w + c4), (n, 4 * c4, h, w), dt)
    want = ref.pool2d_int(x, "MAX", (3, 3), (2, 2), (1, 1))
    x4 = _to4(x.view(x.dtype.str)).copy().view(dt)
    out = np.empty((n, c4, *want.shape[2:], 4), dt.str).view(dt)
    saved = pool_nchw4._MIN_BYTES, parallel.num_threads
    pool_nchw4._MIN_BYTES, parallel.num_threads = 1, lambda: threads
    try:
        step = pool_nchw4.bind_pooling_nchw4(x4, out, "MAX", (3, 3), (2, 2), (1, 1))
    finally:
        pool_nchw4._MIN_BYTES, parallel.num_threads = saved
    step()
    np.testing.assert_array_equal(_from4(out.view(dt.str)), want.view(dt.str))


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 2), c4=st.integers(1, 5), h=st.integers(1, 9), w=st.integers(1, 9),
       threads=st.integers(1, 3), asymm=st.booleans(),
       mode=st.sampled_from(["AVERAGE", "AVERAGE_COUNT_EXCLUDE_PADDING"]))  # fmt: skip
def test_nchw4_global_average_pooling_equals_the_reference(n, c4, h, w, threads, asymm, mode):
    from megbrain.kernels.pool import nchw4 as pool_nchw4

    dt = quint8(0.5, 3) if asymm else qint8(0.5)
    x = ref.random_q(np.random.default_rng(h * w + c4), (n, 4 * c4, h, w), dt)
    want = ref.pool2d_int(x, mode, (h, w), (1, 1), (0, 0))
    x4 = _to4(x.view(x.dtype.str)).copy().view(dt)
    out = np.empty((n, c4, 1, 1, 4), dt.str).view(dt)
    saved = pool_nchw4._MIN_BYTES, parallel.num_threads
    pool_nchw4._MIN_BYTES, parallel.num_threads = 1, lambda: threads
    try:
        step = pool_nchw4.bind_pooling_nchw4(x4, out, mode, (h, w), (1, 1), (0, 0))
    finally:
        pool_nchw4._MIN_BYTES, parallel.num_threads = saved
    step()
    np.testing.assert_array_equal(_from4(out.view(dt.str)), want.view(dt.str))
