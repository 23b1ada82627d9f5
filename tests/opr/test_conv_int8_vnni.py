"""The 8-bit convolution kernels, both paths (the AVX-512 VNNI tiles where the CPU has them,
the portable int8/int16 loops everywhere), against the integer reference bit for bit: shapes
whose reduction is no multiple of 4 and whose channels are no multiple of a tile's rows,
groups, depthwise, zero points, saturating values, and the requantizing epilogue fused into
the kernels; the quantized MatrixMul on the same tiles, and the one-pass quantized residual
add."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import quantized_ref as ref
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

import megbrain as mgb
from megbrain.kernels import blas, parallel
from megbrain.kernels import elemwise_multi_type as emt
from megbrain.kernels.conv import quantized
from megbrain.kernels.conv.constant_operands import constant_filter
from megbrain.kernels.conv.loops import depthwise_bytes, requant_ir, vnni, vnni_channels

qint8, qint32, quint8 = mgb.dtype.qint8, mgb.dtype.qint32, mgb.dtype.quint8

_PATHS = [
    pytest.param(False, id="portable"),
    pytest.param(True, id="vnni", marks=pytest.mark.skipif(
        not vnni.available(), reason="the CPU has no AVX-512 VNNI")),
]  # fmt: skip


@contextlib.contextmanager
def _path(on: bool):
    saved = quantized.VNNI, quantized.DEPTHWISE_BYTES
    quantized.VNNI, quantized.DEPTHWISE_BYTES = on, on and depthwise_bytes.vnni_bytes()
    try:
        yield
    finally:
        quantized.VNNI, quantized.DEPTHWISE_BYTES = saved


@contextlib.contextmanager
def _no_byte_loop():
    """The depthwise loops the 3x3 byte loop stands beside, on the shapes it takes too."""
    saved, quantized.DEPTHWISE_BYTES = quantized.DEPTHWISE_BYTES, False
    try:
        yield
    finally:
        quantized.DEPTHWISE_BYTES = saved


@st.composite
def _convs(draw):
    if draw(st.booleans()):  # depthwise (a direct loop on both paths)
        g, icg, ocg = draw(st.integers(2, 20)), 1, 1
    else:
        g = draw(st.sampled_from([1, 1, 2, 3]))
        icg, ocg = draw(st.integers(1, 21)), draw(st.integers(1, 27))
    fh, fw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    stride = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    pad = (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
    dil = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    h = draw(st.integers(dil[0] * (fh - 1) + 1, 19))
    w = draw(st.integers(dil[1] * (fw - 1) + 1, 23))
    asymm = draw(st.booleans())
    extreme = draw(st.booleans())
    return {"shape": (draw(st.integers(1, 2)), g * icg, h, w), "filt": (g, ocg, icg, fh, fw),
            "stride": stride, "pad": pad, "dilate": dil, "flip": draw(st.booleans()),
            "asymm": asymm, "zx": draw(st.integers(0, 255)), "extreme": extreme,
            "seed": draw(st.integers(0, 2**16))}  # fmt: skip


def _operands(c):
    rng = np.random.default_rng(c["seed"])
    if c["asymm"]:  # a filter zero point of 128 keeps the filter signed bytes (VNNI)
        sdt, fdt = quint8(0.5, c["zx"]), quint8(0.25, 128)
    else:
        sdt, fdt = qint8(0.5), qint8(0.25)
    x, f = ref.random_q(rng, c["shape"], sdt), ref.random_q(rng, c["filt"], fdt)
    if c["extreme"]:  # the ends of the range: -128 * -128 products, 255 - 0 shifts
        lo, hi = (0, 255) if c["asymm"] else (-128, 127)
        x.view(x.dtype.str)[...] = rng.choice([lo, hi], x.shape)
        f.view(f.dtype.str)[...] = rng.choice([lo, hi], f.shape)
    return x, f


def _sums(c, x, f, constant=False):
    want = ref.conv2d_int(x, f, stride=c["stride"], pad=c["pad"], dilate=c["dilate"],
                          group=True, flip=c["flip"])  # fmt: skip
    out = np.empty(want.shape, np.int32).view(qint32(0.125))
    with constant_filter(constant):
        step = quantized.bind_quantized_convolution(x, f, out, c["stride"], c["pad"],
                                                    c["dilate"], c["flip"])  # fmt: skip
    return step, out, want


@pytest.mark.parametrize("on", _PATHS)
@settings(max_examples=40, deadline=None)
@given(c=_convs())
def test_int32_sums_equal_the_reference(on, c):
    x, f = _operands(c)
    with _path(on):
        step, out, want = _sums(c, x, f)
    step()
    np.testing.assert_array_equal(out.view(np.int32), want)


@pytest.mark.parametrize("on", _PATHS)
@settings(max_examples=8, deadline=None)
@given(c=_convs(), mode=st.sampled_from(["IDENTITY", "RELU"]),
       out_scale=st.sampled_from([0.3, 2.0, 40.0, 900.0]))  # fmt: skip
def test_requantized_conv_bias_equals_the_reference(on, c, mode, out_scale):
    x, f = _operands(c)
    rng = np.random.default_rng(c["seed"] + 1)
    o = c["filt"][0] * c["filt"][1]
    bias = ref.random_q(rng, (1, o, 1, 1), qint32(0.125))
    odt = quint8(out_scale, 7) if c["asymm"] else qint8(out_scale)
    want = ref.conv_bias(x, f, bias, None, odt, mode, stride=c["stride"], pad=c["pad"],
                         dilate=c["dilate"], group=True, flip=c["flip"])  # fmt: skip
    out = np.empty(want.shape, want.dtype)
    with _path(on):
        step = quantized.bind_quantized_conv_bias(x, f, bias, None, out, c["stride"], c["pad"],
                                                  c["dilate"], c["flip"], mode)  # fmt: skip
    step()
    ref.assert_same(out, want)


@pytest.mark.skipif(not vnni.available(), reason="the CPU has no AVX-512 VNNI")
@settings(max_examples=40, deadline=None)
@given(mode=st.sampled_from(["IDENTITY", "RELU"]), asymm=st.booleans(),
       s_in=st.sampled_from([0.125, 1e-3, 0.0123, 3.0, 1e-30, 1e30]),
       ratio=st.one_of(st.sampled_from([64.0, 256.0, 1000 / 3]), st.floats(20, 3000)),
       seed=st.integers(0, 2**16))  # fmt: skip
def test_the_tiles_requantize_by_a_product_equals_the_dividing_chain(mode, asymm, s_in,
                                                                     ratio, seed):
    # the VNNI epilogue multiplies by the scales' ratio and runs MegDNN's division only for
    # vectors with a value near a tie; ratios of powers of two make ties of most odd sums,
    # scales past the normal binades take the division everywhere (sums of about 2^15,
    # ratios putting most quotients inside the 8-bit range)
    out_scale = float(np.float32(s_in) * np.float32(ratio))
    c = _case((1, 20, 6, 11), (1, 13, 20, 1, 1), (0, 0), seed)
    c.update(asymm=asymm, zx=seed % 256)
    x, f = _operands(c)
    rng = np.random.default_rng(seed)
    bias = ref.random_q(rng, (1, 13, 1, 1), qint32(s_in))
    bias.view(np.int32)[...] = rng.integers(-(1 << 16), 1 << 16, bias.shape)
    odt = quint8(out_scale, 7) if asymm else qint8(out_scale)
    want = ref.conv_bias(x, f, bias, None, odt, mode, group=True)
    out = np.empty(want.shape, want.dtype)
    with _path(True):
        quantized.bind_quantized_conv_bias(x, f, bias, None, out, (1, 1), (0, 0), (1, 1),
                                           False, mode)()  # fmt: skip
    ref.assert_same(out, want)


@st.composite
def _depthwise_convs(draw):
    c = draw(_convs())
    g = draw(st.integers(2, 40))  # up to three blocks of 16 channels, the last one partial
    n, _, h, w = c["shape"]
    fh, fw = c["filt"][3:]
    c.update(shape=(n, g, h, w), filt=(g, 1, 1, fh, fw))
    return c


@settings(max_examples=40, deadline=None)
@given(c=_depthwise_convs(), mode=st.sampled_from([None, "IDENTITY", "RELU"]),
       out_scale=st.sampled_from([0.3, 2.0, 40.0, 900.0]))  # fmt: skip
def test_depthwise_with_channels_along_the_vectors_equals_the_reference(c, mode, out_scale):
    # the loop that takes short output rows, run here on every shape it can take
    x, f = _operands(c)
    saved, quantized.CHANNELS_ROW_SCALE = quantized.CHANNELS_ROW_SCALE, 1 << 20
    try:
        with _no_byte_loop():
            if mode is None:  # the int32 sums
                step, out, want = _sums(c, x, f)
                step()
                np.testing.assert_array_equal(out.view(np.int32), want)
                return
            rng = np.random.default_rng(c["seed"] + 1)
            bias = ref.random_q(rng, (1, c["filt"][0], 1, 1), qint32(0.125))
            odt = quint8(out_scale, 7) if c["asymm"] else qint8(out_scale)
            want = ref.conv_bias(x, f, bias, None, odt, mode, stride=c["stride"], pad=c["pad"],
                                 dilate=c["dilate"], group=True, flip=c["flip"])  # fmt: skip
            out = np.empty(want.shape, want.dtype)
            quantized.bind_quantized_conv_bias(x, f, bias, None, out, c["stride"], c["pad"],
                                               c["dilate"], c["flip"], mode)()  # fmt: skip
            ref.assert_same(out, want)
    finally:
        quantized.CHANNELS_ROW_SCALE = saved


def _case(shape, filt, pad, seed):
    return {"shape": shape, "filt": filt, "stride": (1, 1), "pad": pad, "dilate": (1, 1),
            "flip": False, "asymm": False, "zx": 0, "extreme": False, "seed": seed}  # fmt: skip


@pytest.mark.skipif(not vnni.available(), reason="the CPU has no AVX-512 VNNI")
@pytest.mark.parametrize("stride", [(1, 1), (2, 2), (1, 2)])
def test_wide_rows_dropped_and_relaid_at_stride_2_equal_the_reference(stride):
    # output rows of more than 64 bytes (the drop's masked vectors), source rows relaid
    # through the row scratch at column stride 2, odd widths and a channel block short
    c = _case((1, 7, 5, 151), (1, 9, 7, 3, 3), (1, 1), 5)
    c["stride"] = stride
    x, f = _operands(c)
    with _path(True):
        step, out, want = _sums(c, x, f)
    step()
    np.testing.assert_array_equal(out.view(np.int32), want)


@pytest.mark.skipif(not vnni.available(), reason="the CPU has no AVX-512 VNNI")
@settings(max_examples=15, deadline=None)
@given(c=_convs(), bands=st.booleans(), threads=st.integers(2, 3),
       band_min=st.sampled_from([1, 40, 1 << 30]), mode=st.sampled_from([None, "RELU"]))
def test_a_layer_split_in_bands_or_channel_chunks_equals_the_reference(c, bands, threads,
                                                                       band_min, mode):
    # every layer split as if it were large: into bands of output rows (each thread relaying
    # a band's source rows into its own buffer, the taps' reach past the band, the columns
    # dropped per band), or chunks of output channels where the plane has too few positions;
    # and the split per phase they replaced
    if c["filt"][1] < 4 and c["filt"][0] > 1:
        c["filt"] = (c["filt"][0], 4, *c["filt"][2:])  # (a depthwise shape: no GEMM)
        c["shape"] = (c["shape"][0], c["filt"][0] * c["filt"][2], *c["shape"][2:])
    x, f = _operands(c)
    saved = quantized.VNNI_BANDS, quantized._MIN_BAND_POSITIONS
    quantized.VNNI_BANDS, quantized._MIN_BAND_POSITIONS = bands, band_min
    try:
        with _path(True), _threads(threads):
            step, out, want = _bound(c, x, f, mode)
    finally:
        quantized.VNNI_BANDS, quantized._MIN_BAND_POSITIONS = saved
    _run_twice(step, out, want, mode)


def _bound(c, x, f, mode):
    """``(step, out, want)``: the case's int32 sums (``mode`` None), else its ConvBias with
    ``mode`` requantized to an 8-bit output, and the reference's."""
    if mode is None:
        return _sums(c, x, f)
    rng = np.random.default_rng(c["seed"] + 1)
    bias = ref.random_q(rng, (1, c["filt"][0] * c["filt"][1], 1, 1), qint32(0.125))
    odt = quint8(3.0, 7) if c["asymm"] else qint8(3.0)
    want = ref.conv_bias(x, f, bias, None, odt, mode, stride=c["stride"], pad=c["pad"],
                         dilate=c["dilate"], group=True, flip=c["flip"])  # fmt: skip
    out = np.empty(want.shape, want.dtype)
    step = quantized.bind_quantized_conv_bias(x, f, bias, None, out, c["stride"], c["pad"],
                                              c["dilate"], c["flip"], mode)  # fmt: skip
    return step, out, want


def _run_twice(step, out, want, mode):
    """Run ``step`` twice (its band buffers reused), checking ``out`` each time."""
    for _ in range(2):
        step()
        if mode is None:
            np.testing.assert_array_equal(out.view(np.int32), want)
        else:
            ref.assert_same(out, want)


@contextlib.contextmanager
def _tile(shape):
    """Every VNNI layer bound inside takes the tile ``shape`` (rows, vectors)."""
    saved = vnni.tile_shape
    vnni.tile_shape = lambda channels, positions: shape
    try:
        yield
    finally:
        vnni.tile_shape = saved


@pytest.mark.skipif(not vnni.available(), reason="the CPU has no AVX-512 VNNI")
@pytest.mark.parametrize("shape", sorted(vnni.TILES.items()))
@settings(max_examples=12, deadline=None)
@given(h=st.integers(1, 7), w=st.integers(1, 21), k=st.sampled_from([1, 3]),
       ocg=st.integers(1, 19), mode=st.sampled_from([None, "RELU"]), seed=st.integers(0, 2**16))
def test_each_tile_shape_with_every_tail_of_vectors_equals_the_reference(shape, h, w, k, ocg,
                                                                         mode, seed):  # fmt: skip
    # a row of positions (or a band's) ends in a tile of 1 to ``vectors`` vectors, which
    # computes only those; channels no multiple of the rows leave the last tile short
    c = _case((1, 9, h, w), (1, ocg, 9, k, k), (k // 2, k // 2), seed)
    x, f = _operands(c)
    with _path(True), _tile(shape):
        if mode is None:
            step, out, want = _sums(c, x, f)
            step()
            np.testing.assert_array_equal(out.view(np.int32), want)
            return
        bias = ref.random_q(np.random.default_rng(seed), (1, ocg, 1, 1), qint32(0.125))
        want = ref.conv_bias(x, f, bias, None, qint8(3.0), mode, pad=c["pad"], group=True)
        out = np.empty(want.shape, want.dtype)
        quantized.bind_quantized_conv_bias(x, f, bias, None, out, (1, 1), c["pad"], (1, 1),
                                           False, mode)()  # fmt: skip
        ref.assert_same(out, want)


def test_the_tile_shape_pads_the_fewest_products():
    # 64 channels: 6 rows pad them to 66, 8 rows not; 30 channels: 8 rows pad them to 32
    assert vnni.tile_shape(64, 812) == (8, 3)
    assert vnni.tile_shape(30, 64) == (6, 4)
    # 96 channels over 196 positions pad alike (208 positions either way): 8 rows
    assert vnni.tile_shape(96, 196) == (8, 3)
    # 36 channels over 64 positions: 36 x 64 against 40 x 64
    assert vnni.tile_shape(36, 64) == (6, 4)


@contextlib.contextmanager
def _channel_tiles(shape):
    """Every VNNI band layer bound inside takes the channel tile ``shape`` (positions,
    vectors of 16 channels) wherever its output allows, or with None the tiles of
    positions everywhere."""
    saved = (quantized.CHANNEL_TILES, quantized.CHANNEL_TILE_GAIN, quantized.CHANNEL_STORE_SUMS,
             vnni_channels.tile_shape)  # fmt: skip
    if shape is None:
        quantized.CHANNEL_TILES = False
    else:
        quantized.CHANNEL_TILE_GAIN, quantized.CHANNEL_STORE_SUMS = float("inf"), 0
        vnni_channels.tile_shape = lambda channels, runs: shape
    try:
        yield
    finally:
        (quantized.CHANNEL_TILES, quantized.CHANNEL_TILE_GAIN, quantized.CHANNEL_STORE_SUMS,
         vnni_channels.tile_shape) = saved  # fmt: skip


@contextlib.contextmanager
def _threads(n: int):
    """Layers bound inside split for ``n`` threads however small they are."""
    saved = quantized._MIN_MACS_PER_THREAD, parallel.num_threads
    quantized._MIN_MACS_PER_THREAD, parallel.num_threads = 1, lambda: n
    try:
        yield
    finally:
        quantized._MIN_MACS_PER_THREAD, parallel.num_threads = saved


@st.composite
def _channel_tile_convs(draw):
    # channels past one tile's 16 V and short of the next; half the layers 1x1 at stride 1
    # without padding (their planes one run of positions)
    c = draw(_convs())
    g, _, icg, fh, fw = c["filt"]
    if draw(st.booleans()):
        fh = fw = 1
        c.update(stride=(1, 1), pad=(0, 0), dilate=(1, 1))
    c["filt"] = (g, draw(st.integers(1, 70)), icg, fh, fw)
    return c


@pytest.mark.skipif(not vnni.available(), reason="the CPU has no AVX-512 VNNI")
@pytest.mark.parametrize("shape", sorted(vnni_channels.TILES.items()))
@settings(max_examples=15, deadline=None)
@given(c=_channel_tile_convs(), threads=st.integers(1, 3), mode=st.sampled_from([None, "RELU"]))
def test_each_channel_tile_shape_equals_the_reference(shape, c, threads, mode):
    # a row's (or a plane's) positions in runs of P, the last one short; the channels in
    # vectors of 16, the last tile's short; split for the threads into chunks of channel
    # tiles, and into bands of rows where there are fewer tiles than units
    x, f = _operands(c)
    with _path(True), _channel_tiles(shape), _threads(threads):
        step, out, want = _bound(c, x, f, mode)
    _run_twice(step, out, want, mode)


def test_channel_tiles_are_taken_where_they_compute_fewer_products():
    # (o, oh, ow, the phase planes' row, band rows, the position tile's rows, k groups)
    # 7x7 planes: rows of 9 phase-plane positions, 64 lanes computed for 49 outputs
    assert quantized._channel_tile(512, 7, 7, 9, 7, 8, 1152, True) == (7, 4)
    # 56x56 in two bands: 3264 lanes for 3136 outputs, under the gain asked
    assert quantized._channel_tile(64, 56, 56, 58, 28, 8, 144, True) is None
    # a 14x14 plane as one run: 196 outputs for 208 lanes; the NCHW output's byte stores
    # outweigh the sums saved at 16 k groups, not at 240
    assert quantized._channel_tile(384, 14, 14, 14, 14, 8, 16, True) == (7, 4)
    assert quantized._channel_tile(384, 14, 14, 14, 14, 8, 16, False) is None
    assert quantized._channel_tile(320, 7, 7, 7, 7, 8, 240, False) == (7, 4)
    # a 28x28 plane the position tiles would split in chunks of channels, as many products
    # either way: NCHW4 takes the channel tiles where the reduction is long enough
    assert quantized._channel_tile(32, 28, 28, 28, 28, 8, 48, True, chunked=True) == (14, 2)
    assert quantized._channel_tile(32, 28, 28, 28, 28, 8, 8, True, chunked=True) is None
    assert quantized._channel_tile(32, 28, 28, 28, 28, 8, 48, True, chunked=False) is None
    assert quantized._channel_tile(32, 28, 28, 28, 28, 8, 48, False, chunked=True) is None
    # 160 channels: two vectors pad none of them (three or four pad to 192)
    assert vnni_channels.tile_shape(160, [49]) == (14, 2)


@pytest.mark.skipif(not vnni.available(), reason="the CPU has no AVX-512 VNNI")
@pytest.mark.parametrize("shape", sorted(vnni_channels.TILES.items()))
def test_the_channel_tile_keeps_its_sums_in_registers(shape):
    npos, nv = shape
    tile, epi = vnni_channels.vnni_ctile(), vnni.EPI_INT32

    def run(a, offs, w, init, out, q, kg, count, nch):
        tile(a, 0, offs, 0, w, 0, kg * 64, kg, init, 0, out, 0, 1, npos, count, nch, q, npos,
             nv, epi, 0)  # fmt: skip

    # compiled afresh: the assembly of a kernel loaded from Numba's cache is not kept
    fn = njit(nogil=True, error_model="numpy")(run)
    kg, width = 3, 16 * nv
    a = np.random.default_rng(0).integers(0, 256, 4 * npos * kg + 64, np.uint8)
    offs = np.arange(kg, dtype=np.int64) * 4 * npos
    w = np.random.default_rng(1).integers(-128, 128, kg * 64 * nv, np.int8)
    init = np.arange(width, dtype=np.int32)
    out = np.zeros(width * npos, np.int32)
    fn(a, offs, w, init, out, np.zeros(7, np.float32), kg, npos, width)
    # position p, channel c of vector v: init plus each k group's 4 bytes by the filter's
    words = a[: 4 * npos * kg].reshape(kg, npos, 4).astype(np.int64)
    filt = w.reshape(nv, kg, 16, 4).transpose(1, 0, 2, 3).reshape(kg, width, 4)
    want = init[:, None] + np.einsum("kpj,kcj->cp", words, filt.astype(np.int64))
    np.testing.assert_array_equal(out.reshape(width, npos), want)
    asm = "\n".join(fn.inspect_asm().values()).splitlines()
    dots = [i for i, line in enumerate(asm) if "vpdpbusd" in line]
    assert len(dots) >= npos * nv
    # between the first and the last vpdpbusd (the reduction loop), no stack access
    assert not any("(%rsp)" in line for line in asm[dots[0] : dots[-1]])


@pytest.mark.skipif(not vnni.available(), reason="the CPU has no AVX-512 VNNI")
def test_a_constant_filter_is_packed_once():
    c = _case((1, 20, 9, 9), (1, 13, 20, 3, 3), (1, 1), 3)
    x, f = _operands(c)
    with _path(True):
        step, out, want = _sums(c, x, f, constant=True)
    step()
    f.view(np.int8)[...] = 0  # a constant filter's later values are not read
    step()
    np.testing.assert_array_equal(out.view(np.int32), want)


@pytest.mark.skipif(not vnni.available(), reason="the CPU has no AVX-512 VNNI")
def test_vnni_tile_keeps_its_accumulators_in_registers():
    c = _case((1, 16, 8, 8), (1, 16, 16, 1, 1), (0, 0), 4)
    x, f = _operands(c)
    with _path(True):
        step, out, want = _sums(c, x, f)
    step()
    np.testing.assert_array_equal(out.view(np.int32), want)
    # compiled afresh: the assembly of a kernel loaded from Numba's cache is not kept
    fn = njit(nogil=True, error_model="numpy")(vnni._make_gemm(6, 4, vnni.EPI_INT32))
    lanes = vnni.LANES
    # 64 positions, 16 output channels, 4 k groups (one plane of 64 words each), one chunk
    geom = np.array([64, 16, 4, 1, 0, 0, 0, 0, 256, 512, 768], np.int64)
    fn(np.zeros(4 * 64 * 4, np.uint8), np.zeros(18 * 16, np.int8), np.zeros(18, np.int32),
       np.zeros(16 * 64, np.int32), np.zeros(7, np.float32), geom, 0,
       64 // (4 * lanes))  # fmt: skip
    asm = "\n".join(fn.inspect_asm().values())
    loop = [line for line in asm.splitlines() if "vpdpbusd" in line]
    assert len(loop) >= 6 * 4
    # the accumulators are registers: no vpdpbusd reads or writes one from the stack
    assert not any("(%rsp)" in line for line in loop)


@pytest.mark.parametrize("mode", ["ADD", "FUSE_ADD_RELU"])
@pytest.mark.parametrize("asymm", [False, True])
def test_a_residual_add_in_one_pass_equals_the_reference(mode, asymm):
    # large enough to be split over the kernel threads
    rng = np.random.default_rng(7)
    kinds = [quint8(s, z) for s, z in ((0.07, 3), (0.013, 250), (0.05, 128))] if asymm else [
        qint8(s) for s in (0.07, 0.013, 0.05)]  # fmt: skip
    a, b = (ref.random_q(rng, (1, 24, 56, 56), d) for d in kinds[:2])
    a.view(a.dtype.str)[0, 0, 0, :2] = [0, 255] if asymm else [-128, 127]
    out = np.empty(a.shape, kinds[2])
    emt.bind_quantized(mode, [a, b], out)()
    relu = mode == "FUSE_ADD_RELU"
    want = ref.elemwise_q(lambda u, v: ref.relu((u + v).astype(ref.F32)) if relu else
                          (u + v).astype(ref.F32), [a, b], kinds[2])  # fmt: skip
    ref.assert_same(out, want)


@pytest.mark.parametrize("on", _PATHS)
@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 9), k=st.integers(1, 70), n=st.integers(1, 40), asymm=st.booleans(),
       ta=st.booleans(), tb=st.booleans(), seed=st.integers(0, 2**16))  # fmt: skip
def test_quantized_matmul_equals_the_integer_product(on, m, k, n, asymm, ta, tb, seed):
    rng = np.random.default_rng(seed)
    da, db = (quint8(0.5, 128), quint8(0.25, 9)) if asymm else (qint8(0.5), qint8(0.25))
    a = ref.random_q(rng, (k, m) if ta else (m, k), da)
    b = ref.random_q(rng, (n, k) if tb else (k, n), db)
    out = np.empty((m, n), np.int32).view(qint32(0.125))
    with _path(on):
        step = blas.bind_matmul(a, b, out, ta, tb)
    step()
    av, bv = ref.ints(a) - (128 if asymm else 0), ref.ints(b) - (9 if asymm else 0)
    want = ref.wrap_i32((av.T if ta else av) @ (bv.T if tb else bv))
    np.testing.assert_array_equal(out.view(np.int32), want)


@pytest.mark.skipif(not vnni.available(), reason="the CPU has no AVX-512 VNNI")
@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("m", [1, 50])
def test_a_constant_matmul_b_is_packed_once_and_a_read_every_run(tb, m):
    # a classifier's weight (one row of a), transposed or not, is the tiles' filter, packed
    # once when constant; with more rows of a than columns of b, b is read every run
    rng = np.random.default_rng(5)
    a = ref.random_q(rng, (m, 70), qint8(0.5))
    b = ref.random_q(rng, (40, 70) if tb else (70, 40), qint8(0.25))
    out = np.empty((m, 40), np.int32).view(qint32(0.125))
    with _path(True), constant_filter(True):
        step = blas.bind_matmul(a, b, out, False, tb)
    step()
    bv = ref.ints(b)
    a.view(np.int8)[...] = 1
    if m == 1:
        b.view(np.int8)[...] = 0  # a constant filter's later values are not read
    step()
    want = ref.wrap_i32(np.ones((m, 70), np.int64) @ (bv.T if tb else bv))
    np.testing.assert_array_equal(out.view(np.int32), want)


@settings(max_examples=30, deadline=None)
@given(c=st.integers(1, 6), h=st.integers(3, 40), w=st.integers(3, 40), pad=st.integers(0, 2),
       dil=st.integers(1, 2), asymm=st.booleans(), extreme=st.booleans(),
       mode=st.sampled_from(["IDENTITY", "RELU"]),
       bias_at=st.sampled_from([0, (1 << 23) - 1, 1 << 23, (1 << 31) - 1]),
       out_scale=st.sampled_from([0.3, 40.0, 1e6]), seed=st.integers(0, 2**16))  # fmt: skip
def test_a_requantized_3x3_depthwise_in_one_pass_equals_the_reference(
        c, h, w, pad, dil, asymm, extreme, mode, bias_at, out_scale, seed):  # fmt: skip
    # the stride-1 3x3 depthwise loop requantizes as it sums: a bias below 2^23 starts the
    # float32 sum, a larger one (to the int32 wrap) is added in int32; its whole-vector
    # passes cover rows of any width
    h, w = max(h, 2 * dil + 1), max(w, 2 * dil + 1)
    cs = _case((1, c, h, w), (c, 1, 1, 3, 3), (pad, pad), seed)
    cs.update(dilate=(dil, dil), asymm=asymm, zx=seed % 256, extreme=extreme)
    x, f = _operands(cs)
    rng = np.random.default_rng(seed)
    bias = ref.random_q(rng, (1, c, 1, 1), qint32(0.125))
    sign = rng.choice([-1, 1], c)
    bias.view(np.int32)[0, :, 0, 0] += (sign * bias_at).astype(np.int32) - sign * 5000
    odt = quint8(out_scale, 7) if asymm else qint8(out_scale)
    want = ref.conv_bias(x, f, bias, None, odt, mode, stride=(1, 1), pad=(pad, pad),
                         dilate=(dil, dil), group=True, flip=False)  # fmt: skip
    out = np.empty(want.shape, want.dtype)
    with _no_byte_loop():
        quantized.bind_quantized_conv_bias(x, f, bias, None, out, (1, 1), (pad, pad),
                                           (dil, dil), False, mode)()  # fmt: skip
    ref.assert_same(out, want)


def test_rounding_by_the_float_below_one_half_is_c_roundf():
    # the requantize's rounding (loops.int8._quantize, requant_ir's exact chain): for |v| <= 256,
    # trunc(v + copysign(0.49999997, v)) is C roundf (half away from zero); here every
    # float32 within 2^12 ulps of each half-integer and integer, and random ones
    below = np.nextafter(np.float32(0.5), np.float32(0))
    assert below == np.float32(requant_ir._BELOW_HALF)
    ks = np.arange(-512, 513, dtype=np.float32) / 2
    near = ks.view(np.int32)[:, None] + np.arange(-(1 << 12), 1 << 12, dtype=np.int32)
    v = near.view(np.float32).reshape(-1)
    v = np.concatenate([v, np.random.default_rng(0).uniform(-256, 256, 1 << 20)
                        .astype(np.float32)])  # fmt: skip
    v = v[np.isfinite(v) & (np.abs(v) <= 256)]
    t = np.trunc(v)
    d = np.abs(v - t)
    want = t + np.copysign(np.float32(1), v) * (d >= np.float32(0.5))
    got = np.trunc(v + np.copysign(below, v))
    np.testing.assert_array_equal(got, want)
