"""The NCHW88 forward convolution (megbrain.kernels.conv_nchw88) against the float64
reference: drawn batches, groups, channel counts, filter sizes, strides, paddings,
dilations and flips, in the dense, grouped, channel-wise and hybrid filter layouts; the
algorithms (DIRECT_NCHW88, CHANNELWISE_NCHW88, DIRECT_NCHW_NCHW88 and NCHW88_AS_NCHW); the
epilogue (bias, residual ``z``, ReLU keeping NaN, the SiLU tail); DIRECT_NCHW88 equal bit for bit to
DIRECT_NCHW8C; the workspace contract; the constant filter packed once; the errors."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_conv_algos import ATOL, RTOL, ref_forward

from megbrain.kernels import workspace
from megbrain.kernels.conv import common as conv_common
from megbrain.kernels.conv import nchw8c as conv_nchw8c
from megbrain.kernels.conv import nchw88 as conv_nchw88
from megbrain.kernels.conv.constant_operands import constant_filter
from megbrain.kernels.conv.epilogue import Epilogue
from megbrain.kernels.conv.loops import nchw8c as loops_nchw8c

_BIND = conv_nchw88.bind_nchw88_forward


def _to88(x):
    """An NCHW array's (N, C/8, H, W, 8) copy."""
    return np.ascontiguousarray(conv_nchw88.to_nchw88(x))


def _filter88(w, kind):
    """The NCHW88 filter of grouped ``w`` (G, OCg, ICg, FH, FW) in layout ``kind``."""
    g, ocg, icg, fh, fw = w.shape
    if kind == "dense":  # (O8, I8, FH, FW, 8i, 8o)
        return np.ascontiguousarray(
            w[0].reshape(ocg // 8, 8, icg // 8, 8, fh, fw).transpose(0, 2, 4, 5, 3, 1)
        )
    if kind == "group":  # (G, O8, I8, FH, FW, 8i, 8o)
        return np.ascontiguousarray(
            w.reshape(g, ocg // 8, 8, icg // 8, 8, fh, fw).transpose(0, 1, 3, 5, 6, 4, 2)
        )
    if kind == "chan":  # (G/8, 1, 1, FH, FW, 8)
        return np.ascontiguousarray(w.reshape(g // 8, 8, fh, fw).transpose(0, 2, 3, 1))[
            :, None, None
        ]
    # hybrid (O8, FH, FW, IC, 8o)
    return np.ascontiguousarray(w[0].reshape(ocg // 8, 8, icg, fh, fw).transpose(0, 3, 4, 2, 1))


@st.composite
def cases(draw, kind=None):
    kind = kind or draw(st.sampled_from(["dense", "group", "chan", "hybrid"]))
    fshape = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dilate = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    pad = (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
    sshape = tuple(
        draw(st.integers(max(1, d * (f - 1) + 1 - 2 * p), 12))
        for f, p, d in zip(fshape, pad, dilate)
    )
    if kind == "dense":
        g, icg, ocg = 1, 8 * draw(st.integers(1, 3)), 8 * draw(st.integers(1, 4))
    elif kind == "group":
        g, icg, ocg = draw(st.integers(2, 3)), 8 * draw(st.integers(1, 2)), 8 * draw(
            st.integers(1, 3)
        )
    elif kind == "chan":
        g, icg, ocg = 8 * draw(st.integers(1, 2)), 1, 1
    else:
        g, icg, ocg = 1, draw(st.integers(1, 8)), 8 * draw(st.integers(1, 3))
    return dict(
        kind=kind,
        n=draw(st.integers(1, 2)),
        g=g,
        icg=icg,
        ocg=ocg,
        fshape=fshape,
        stride=stride,
        pad=pad,
        dilate=dilate,
        sshape=sshape,
        oshape=tuple(
            conv_common.conv_out_size(*a) for a in zip(sshape, fshape, stride, pad, dilate)
        ),
        flip=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
    )


def _operands(c):
    rng = np.random.default_rng(c["seed"])
    x = rng.uniform(-1, 1, (c["n"], c["g"] * c["icg"], *c["sshape"])).astype(np.float32)
    w = rng.uniform(-1, 1, (c["g"], c["ocg"], c["icg"], *c["fshape"])).astype(np.float32)
    src = x if c["kind"] == "hybrid" else _to88(x)
    return x, w, src, _filter88(w, c["kind"])


def _out88(c):
    oc = c["g"] * c["ocg"]
    return np.full((c["n"], oc // 8, *c["oshape"], 8), np.nan, np.float32)


def _bind(c, src, filt, out, **kw):
    return _BIND(src, filt, out, c["stride"], c["pad"], c["dilate"], c["flip"],
                 group=c["kind"] in ("group", "chan"), **kw)  # fmt: skip


def _direct(c):
    """The algorithm of a dense or grouped case: POINTWISE_NCHW88 for a dense 1x1 stride-1
    unpadded one, DIRECT_NCHW88 for the others."""
    pointwise = (c["kind"] == "dense" and tuple(c["fshape"]) == (1, 1)
                 and tuple(c["stride"]) == (1, 1) and tuple(c["pad"]) == (0, 0))  # fmt: skip
    return "POINTWISE_NCHW88" if pointwise else "DIRECT_NCHW88"


@pytest.fixture
def direct_only(monkeypatch):
    """DIRECT_NCHW88 for the pointwise cases too (the tests of its own tiles)."""
    monkeypatch.setattr(conv_nchw88, "preferred_pointwise88", lambda geo: False)


def _case(kind="dense", n=1, g=1, icg=16, ocg=32, sshape=(9, 7), fshape=(3, 3), pad=(1, 1),
          stride=(1, 1), seed=3):  # fmt: skip
    oshape = tuple(conv_common.conv_out_size(s, f, t, p, 1)
                   for s, f, t, p in zip(sshape, fshape, stride, pad))  # fmt: skip
    return dict(kind=kind, n=n, g=g, icg=icg, ocg=ocg, fshape=fshape, stride=stride, pad=pad,
                dilate=(1, 1), sshape=sshape, oshape=oshape, flip=False, seed=seed)  # fmt: skip


@settings(max_examples=80, deadline=None)
@given(c=cases(), constant=st.booleans())
def test_forward_matches_float64(c, constant):
    x, w, src, filt = _operands(c)
    out = _out88(c)
    with constant_filter(constant):
        name, step = _bind(c, src, filt, out)
    direct = c["kind"] in ("dense", "group")  # any OCg: tiles of 16 channels, then one of 8
    chan = c["kind"] == "chan"
    assert name == (_direct(c) if direct else "CHANNELWISE_NCHW88" if chan
                    else "DIRECT_NCHW_NCHW88")  # fmt: skip
    want = ref_forward(c, x, w)
    for _ in range(2):  # the second run reuses a constant filter's packed copy
        step()
        np.testing.assert_allclose(conv_nchw88.to_nchw(out), want, rtol=RTOL, atol=ATOL)


@settings(max_examples=60, deadline=None)
@given(c=cases(kind="dense"), act=st.sampled_from(["IDENTITY", "RELU", "H_SWISH", "SILU"]),
       with_z=st.booleans(), strided_out=st.booleans())  # fmt: skip
def test_the_epilogue_adds_bias_and_z_then_applies_the_activation(c, act, with_z, strided_out):
    # a strided output: NCHW88_AS_NCHW, which applies the epilogue after the NCHW algorithm
    x, w, src, filt = _operands(c)
    rng = np.random.default_rng(c["seed"] + 1)
    oc = c["g"] * c["ocg"]
    bias = rng.uniform(-1, 1, oc).astype(np.float32)
    want = ref_forward(c, x, w) + bias[None, :, None, None]
    z = None
    if with_z:
        zn = rng.uniform(-1, 1, want.shape).astype(np.float32)
        z, want = _to88(zn), want + zn
    if act == "RELU":
        want = np.maximum(want, 0)
    elif act == "H_SWISH":
        want = want * np.clip(want + 3, 0, 6) / 6
    elif act == "SILU":  # a tail after the identity: the dense algorithms apply it too
        want = want / (1 + np.exp(-want))
    out = _out88(c)
    if strided_out:
        out = np.full(out.shape[:-1] + (16,), np.nan, np.float32)[..., ::2]
    ep = Epilogue(bias, act == "RELU", act == "H_SWISH", silu=act == "SILU")
    name, step = _bind(c, src, filt, out, epilogue=ep, z=z)
    assert name == ("NCHW88_AS_NCHW" if strided_out else _direct(c))
    step()
    np.testing.assert_allclose(conv_nchw88.to_nchw(out), want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    "ocg, algo",
    [(16, "DIRECT_NCHW88"), (24, "DIRECT_NCHW88"), (24, "NCHW88_AS_NCHW")],  # 24: a tile of 8
)
def test_relu_keeps_nan_and_a_strided_z_is_read(ocg, algo):
    c = _case(ocg=ocg)
    _, _, src, filt = _operands(c)
    src = src.copy()
    src[0, 0, 4, 3, 0] = np.nan  # reaches the 3x3 window around (4, 3)
    bias = np.full(ocg, -100, np.float32)  # every finite sum negative: ReLU gives 0
    zbig = np.zeros((c["n"], ocg // 8, *c["oshape"], 16), np.float32)
    z = zbig[..., ::2]  # not contiguous
    out = _out88(c)
    if algo == "NCHW88_AS_NCHW":  # a strided output: DIRECT_NCHW88 writes C-contiguous ones
        out = np.full(out.shape[:-1] + (16,), np.nan, np.float32)[..., ::2]
    name, step = _bind(c, src, filt, out, epilogue=Epilogue(bias, True), z=z)
    assert name == algo
    step()
    y = conv_nchw88.to_nchw(out)
    assert np.isnan(y[0, :, 3:6, 2:5]).all()
    y[0, :, 3:6, 2:5] = 0
    assert (y == 0).all()


@pytest.mark.parametrize(
    "geometry",
    [dict(), dict(fshape=(1, 1), pad=(0, 0)), dict(fshape=(1, 1), pad=(0, 0), stride=(2, 2)),
     dict(stride=(2, 1))],
)  # fmt: skip
def test_direct_equals_direct_nchw8c_bit_for_bit(direct_only, geometry):
    c = _case(n=2, icg=24, ocg=32, sshape=(11, 13), **geometry)
    x, w, src, filt = _operands(c)
    out = _out88(c)
    _, step = _bind(c, src, filt, out)
    step()
    y = np.empty((c["n"], c["ocg"], *c["oshape"]), np.float32)
    conv_nchw8c.bind_nchw8c_forward(x, w, y, c["stride"], c["pad"], c["dilate"])()
    assert np.array_equal(conv_nchw88.to_nchw(out), y)


@pytest.mark.parametrize(
    "geometry",
    [dict(), dict(fshape=(1, 1), pad=(0, 0)), dict(fshape=(1, 1), pad=(0, 0), sshape=(5, 6)),
     dict(fshape=(1, 1), pad=(0, 0), stride=(2, 2)), dict(stride=(2, 2), g=2)],
)  # fmt: skip
@pytest.mark.parametrize("ocg", [8, 24, 40])
def test_a_block_of_8_channels_equals_a_block_of_16_bit_for_bit(direct_only, geometry, ocg):
    # OCg % 16 == 8: a group's last 8 channels are a tile of 8 (vectors of 8 lanes); its sums
    # are those of the same channels in a tile of 16 (OCg + 8, the filter's first OCg
    # channels the same), epilogue included
    geometry = {"n": 2, "icg": 16, "sshape": (11, 13), **geometry}
    wide = _case(kind="group" if geometry.get("g", 1) > 1 else "dense", ocg=ocg + 8,
                 **geometry)  # fmt: skip
    narrow = {**wide, "ocg": ocg}
    x, w, src, filt = _operands(wide)
    rng = np.random.default_rng(5)
    bias = rng.uniform(-1, 1, (wide["g"], ocg + 8)).astype(np.float32)
    zw = rng.uniform(-1, 1, (2, wide["g"], ocg + 8, *wide["oshape"])).astype(np.float32)
    ys = []
    for c in (wide, narrow):
        oc = c["g"] * c["ocg"]
        wc = np.ascontiguousarray(w[:, : c["ocg"]])
        z = _to88(zw[:, :, : c["ocg"]].reshape(2, oc, *c["oshape"]))
        out = _out88(c)
        epi = Epilogue(np.ascontiguousarray(bias[:, : c["ocg"]]).reshape(-1), True)
        name, step = _bind(c, src, _filter88(wc, c["kind"]), out, epilogue=epi, z=z)
        assert name == "DIRECT_NCHW88"
        step()
        ys.append(conv_nchw88.to_nchw(out).reshape(2, c["g"], c["ocg"], *c["oshape"]))
    assert np.array_equal(ys[0][:, :, :ocg], ys[1])
    want = ref_forward(narrow, x, w[:, :ocg]).reshape(ys[1].shape) + zw[:, :, :ocg]
    want = np.maximum(want + bias[None, :, :ocg, None, None], 0)
    np.testing.assert_allclose(ys[1], want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("fshape, pad, stride", [((3, 3), (1, 1), (1, 1)), ((1, 1), (0, 0), (1, 1)),
                                                ((3, 3), (1, 1), (2, 2)), ((1, 1), (0, 0), (2, 2)),
                                                ((1, 1), (0, 0), (2, 1))])  # fmt: skip
def test_a_strided_source_is_read(fshape, pad, stride):
    c = _case(n=2, fshape=fshape, pad=pad, stride=stride)
    x, w, src, filt = _operands(c)
    wide = np.zeros(src.shape[:-1] + (16,), np.float32)
    wide[..., ::2] = src
    strided = wide[..., ::2]
    assert not strided.flags.c_contiguous
    out = _out88(c)
    _, step = _bind(c, strided, filt, out)
    step()
    np.testing.assert_allclose(conv_nchw88.to_nchw(out), ref_forward(c, x, w), rtol=RTOL,
                               atol=ATOL)  # fmt: skip


@pytest.mark.parametrize("sshape", [(2, 3), (1, 6), (7, 7), (14, 14), (30, 5)])
def test_pointwise_read_in_place_covers_every_position(sshape):
    # the last tile of a plane starts P positions before its end (overlapping the previous
    # one): every position is written once with the right sum, nothing is read past the end
    c = _case(icg=16, ocg=16, sshape=sshape, fshape=(1, 1), pad=(0, 0))
    x, w, src, filt = _operands(c)
    src = src[..., :]  # a view: the source buffer ends right after the last position
    out = _out88(c)
    _, step = _bind(c, src, filt, out)
    step()
    np.testing.assert_allclose(conv_nchw88.to_nchw(out), ref_forward(c, x, w), rtol=RTOL,
                               atol=ATOL)  # fmt: skip


@pytest.mark.parametrize("kind, ocg", [("dense", 32), ("dense", 24), ("hybrid", 32)])
@pytest.mark.parametrize("constant", [False, True])
def test_workspace_is_written_before_read_and_nothing_is_allocated(kind, ocg, constant):
    c = _case(kind=kind, n=2, icg=16 if kind == "dense" else 3, ocg=ocg, stride=(2, 1))
    x, w, src, filt = _operands(c)
    bias = np.linspace(-1, 1, c["ocg"], dtype=np.float32)
    out = _out88(c)

    def bind():
        with constant_filter(constant):
            return _bind(c, src, filt, out, epilogue=Epilogue(bias, True))[1]

    rec = workspace.Recorder()
    with workspace.allocating(rec):
        bind()
    buf = np.empty(max(rec.nbytes, 1), np.uint8)
    with workspace.allocating(workspace.Carver(buf)):
        step = bind()
    step()
    want = np.maximum(ref_forward(c, x, w) + bias[None, :, None, None], 0)
    tracemalloc.start()
    try:
        for _ in range(2):
            buf[:] = 0xFF  # NaN in every workspace byte
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            step()
            assert tracemalloc.get_traced_memory()[1] - before < 64 << 10
            np.testing.assert_allclose(conv_nchw88.to_nchw(out), want, rtol=RTOL, atol=ATOL)
    finally:
        tracemalloc.stop()


def test_a_constant_filter_is_packed_once_and_another_read_every_run():
    c = _case()
    x, w, src, filt = _operands(c)
    out = _out88(c)
    with constant_filter(True):
        _, packed_once = _bind(c, src, filt, out)
    _, every_run = _bind(c, src, filt, _out88(c))
    packed_once()
    filt *= -1
    packed_once()
    np.testing.assert_allclose(conv_nchw88.to_nchw(out), ref_forward(c, x, w), rtol=RTOL,
                               atol=ATOL)  # fmt: skip
    out2 = _out88(c)
    _, every_run = _bind(c, src, filt, out2)
    every_run()
    np.testing.assert_allclose(conv_nchw88.to_nchw(out2), -ref_forward(c, x, w), rtol=RTOL,
                               atol=ATOL)  # fmt: skip


@pytest.mark.parametrize(
    "geometry",
    [dict(), dict(fshape=(1, 1), pad=(0, 0)), dict(fshape=(1, 1), pad=(0, 0), sshape=(5, 6)),
     dict(stride=(2, 2), g=2)],
)  # fmt: skip
def test_wide_units_equal_units_of_16_channels_bit_for_bit(direct_only, monkeypatch, geometry):
    # 32 output channels a tile (AVX-512 hosts) or 16 (the others), either forced here
    geometry = {"n": 2, "icg": 16, "ocg": 64, "sshape": (11, 13), **geometry}
    c = _case(kind="group" if geometry.get("g", 1) > 1 else "dense", **geometry)
    _, _, src, filt = _operands(c)
    rng = np.random.default_rng(5)
    oc = c["g"] * c["ocg"]
    bias = rng.uniform(-1, 1, oc).astype(np.float32)
    z = rng.uniform(-1, 1, _out88(c).shape).astype(np.float32)
    outs = []
    for wide in (False, True):
        monkeypatch.setattr(conv_nchw88, "wide_units", lambda ocb, w=wide: w)
        outs.append(_out88(c))
        name, step = _bind(c, src, filt, outs[-1], epilogue=Epilogue(bias, True), z=z)
        assert name == "DIRECT_NCHW88"
        step()
    assert np.array_equal(outs[0], outs[1])


@settings(max_examples=12, deadline=None)
@given(blocks=st.sampled_from([1, 3, 5, 7]), rem=st.integers(0, 1), g=st.integers(1, 2),
       fsize=st.sampled_from([1, 3]), side=st.integers(1, 15),
       seed=st.integers(0, 2**16))  # fmt: skip
def test_odd_blocks_of_16_in_wide_units_match_float64(blocks, rem, g, fsize, side, seed):
    # GoogLeNet's 208, 112, 144 and 48 output channels: wide units but for the last block of
    # 16 (and the block of 8 after it), bit for bit the units of 16, within float64's bounds
    ocg = 16 * blocks + 8 * rem
    c = _case(kind="group" if g > 1 else "dense", g=g, icg=16, ocg=ocg, sshape=(side, side + 2),
              fshape=(fsize, fsize), pad=(fsize // 2,) * 2, seed=seed)  # fmt: skip
    x, w, src, filt = _operands(c)
    bias = np.random.default_rng(seed).uniform(-1, 1, g * ocg).astype(np.float32)
    outs = []
    for wide in (False, True):
        with pytest.MonkeyPatch.context() as mp:  # DIRECT_NCHW88 for the 1x1 ones too
            mp.setattr(conv_nchw88, "preferred_pointwise88", lambda geo: False)
            mp.setattr(conv_nchw88, "wide_units", lambda ocb, w=wide: w)
            outs.append(_out88(c))
            name, step = _bind(c, src, filt, outs[-1], epilogue=Epilogue(bias, False))
            assert name == "DIRECT_NCHW88"
            step()
    assert np.array_equal(outs[0], outs[1])
    want = ref_forward(c, x, w) + bias.astype(np.float64)[None, :, None, None]
    np.testing.assert_allclose(conv_nchw88.to_nchw(outs[1]), want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    "geometry", [dict(icg=16, ocg=32), dict(kind="chan", g=24, icg=1, ocg=1, sshape=(17, 30))]
)  # DIRECT_NCHW88, CHANNELWISE_NCHW88 (its units' row bands depend on the thread count)
def test_runs_are_bitwise_reproducible_over_thread_counts(monkeypatch, geometry):
    from megbrain.kernels import parallel

    c = _case(n=2, **{"sshape": (12, 13), **geometry})
    _, _, src, filt = _operands(c)
    outs = []
    for threads in (1, 2, 3):
        monkeypatch.setattr(parallel, "num_threads", lambda t=threads: t)
        outs.append(_out88(c))
        _bind(c, src, filt, outs[-1])[1]()
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[1], outs[2])


@pytest.mark.parametrize("ocg", [16, 24, 40, 48])
def test_a_plane_of_one_position_equals_that_position_of_a_larger_plane(direct_only, ocg):
    # a squeeze-and-excitation layer (1x1 positions) sums in tiles of one position, in the
    # order of the tiles of P: bit for bit what position (0, 0) of a 5x5 plane gets
    rng = np.random.default_rng(ocg)
    big = _case(icg=72, ocg=ocg, sshape=(5, 5), fshape=(1, 1), pad=(0, 0))
    one = {**big, "sshape": (1, 1), "oshape": (1, 1)}
    x, w, src, filt = _operands(big)
    bias = rng.uniform(-1, 1, ocg).astype(np.float32)
    zb = rng.uniform(-1, 1, (1, ocg, 5, 5)).astype(np.float32)
    ys = []
    for c, xs, zs in ((big, src, zb), (one, src[:, :, :1, :1], zb[:, :, :1, :1])):
        out = _out88(c)
        name, step = _bind(c, np.ascontiguousarray(xs), filt, out, z=_to88(zs),
                           epilogue=Epilogue(bias, False, True))  # fmt: skip
        assert name == "DIRECT_NCHW88"
        step()
        ys.append(conv_nchw88.to_nchw(out))
    assert np.array_equal(ys[0][:, :, :1, :1], ys[1])
    want = ref_forward(one, x[:, :, :1, :1], w) + bias[None, :, None, None] + zb[:, :, :1, :1]
    np.testing.assert_allclose(ys[1], want * np.clip(want + 3, 0, 6) / 6, rtol=RTOL, atol=ATOL)


def test_a_small_convolution_runs_its_units_on_one_thread(direct_only, monkeypatch):
    # a squeeze-and-excitation layer (1x1 positions) waited for a second thread longer than
    # its work took
    seen = []
    real = conv_nchw88.units_as_they_go

    def spy(units, bind_part, max_threads=None):
        seen.append(max_threads)
        return real(units, bind_part, max_threads)

    monkeypatch.setattr(conv_nchw88, "units_as_they_go", spy)
    for sshape, icg in (((1, 1), 64), ((40, 40), 64)):
        c = _case(icg=icg, ocg=48, sshape=sshape, fshape=(1, 1), pad=(0, 0))
        x, w, src, filt = _operands(c)
        out = _out88(c)
        _bind(c, src, filt, out)[1]()
        np.testing.assert_allclose(conv_nchw88.to_nchw(out), ref_forward(c, x, w), rtol=RTOL,
                                   atol=ATOL)  # fmt: skip
    assert seen == [1, None]


@pytest.mark.parametrize(
    "src_shape, filt_shape, group, match",
    [
        ((1, 2, 5, 5, 4), (2, 2, 3, 3, 8, 8), False, "last dim must be 8"),
        ((1, 2, 5, 5, 8), (2, 3, 3, 3, 8, 8), False, "16 channels, the filter expects 24"),
        ((1, 2, 5, 5, 8), (2, 2, 3, 3, 8), False, "dense filter"),
        ((1, 2, 5, 5, 8), (2, 2, 1, 3, 3, 4, 8), True, "grouped filter"),
        ((1, 2, 5, 5, 8), (2, 1, 2, 3, 3, 8), True, "channel-wise filter"),
        ((1, 9, 5, 5), (2, 3, 3, 9, 8), False, "at most 8 channels"),
        ((1, 2, 2, 2, 8), (2, 2, 3, 3, 8, 8), False, "not positive"),
    ],
)
def test_bad_shapes_are_refused_naming_them(src_shape, filt_shape, group, match):
    with pytest.raises(ValueError, match=match) as info:
        conv_nchw88.nchw88_geometry(src_shape, filt_shape, group, (1, 1), (0, 0), (1, 1))
    assert "NCHW88" in str(info.value) and str(src_shape) in str(info.value)


def test_a_wrong_output_or_z_shape_is_refused():
    c = _case()
    _, _, src, filt = _operands(c)
    with pytest.raises(ValueError, match="out .* must be"):
        _bind(c, src, filt, _out88(c)[:, :, 1:])
    with pytest.raises(ValueError, match="z .* must have the output's shape"):
        _bind(c, src, filt, _out88(c), z=_out88(c)[:, :1])


def test_small_planes_are_cut_into_bands_where_whole_planes_leave_a_thread_idle():
    # DenseNet's 128->32 at 14x14: one wide unit, one thread, as whole planes; GoogLeNet's
    # 112->224 at 14x14: 7 wide units over 2 threads
    widths = [2.0]
    assert conv_nchw88.unit_rows(14, 15, 14, 1, widths, 1) == (14, False)
    assert conv_nchw88.unit_rows(14, 15, 14, 1, widths, 2) == (7, True)
    assert conv_nchw88.unit_rows(14, 15, 14, 1, [2.0] * 7, 2) == (7, True)
    # evenly split whole planes stay whole (ResNet's 512->512 at 7x7: 16 units)
    assert conv_nchw88.unit_rows(7, 8, 7, 1, [2.0] * 16, 2) == (7, False)
    # a larger plane: bands of ROW_POSITIONS positions, split by rows
    assert conv_nchw88.unit_rows(56, 57, 56, 1, widths, 2) == (4, False)


@settings(max_examples=12, deadline=None)
@given(side=st.integers(3, 16), icg=st.sampled_from([8, 16, 24]),
       ocg=st.sampled_from([16, 24, 32, 48, 112]), g=st.integers(1, 2), n=st.integers(1, 2),
       fsize=st.sampled_from([3, 5]), stride=st.integers(1, 2), threads=st.integers(2, 3),
       seed=st.integers(0, 2**16))  # fmt: skip
def test_bands_of_small_planes_match_float64_and_one_thread(side, icg, ocg, g, n, fsize,
                                                            stride, threads, seed):  # fmt: skip
    # every split (whole planes or bands, either order) sums each position as one thread does
    from megbrain.kernels import parallel

    c = _case(kind="group" if g > 1 else "dense", n=n, g=g, icg=icg, ocg=ocg,
              sshape=(side, side + 1), fshape=(fsize, fsize), pad=(fsize // 2,) * 2,
              stride=(stride, stride), seed=seed)  # fmt: skip
    x, w, src, filt = _operands(c)
    bias = np.random.default_rng(seed).uniform(-1, 1, g * ocg).astype(np.float32)
    outs = []
    for t in (1, threads):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(conv_nchw88, "MIN_SPLIT_MACS", 0)
            mp.setattr(parallel, "num_threads", lambda t=t: t)
            outs.append(_out88(c))
            name, step = _bind(c, src, filt, outs[-1], epilogue=Epilogue(bias, True))
            assert name == "DIRECT_NCHW88"
            step()
    assert np.array_equal(outs[0], outs[1])
    want = np.maximum(ref_forward(c, x, w) + bias.astype(np.float64)[None, :, None, None], 0)
    np.testing.assert_allclose(conv_nchw88.to_nchw(outs[1]), want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    "ocg, icg, sshape, stride",
    [(32, 48, (7, 7), 1), (48, 16, (14, 14), 1), (40, 24, (5, 14), 1), (112, 8, (3, 7), 1),
     (64, 40, (14, 14), 2), (32, 16, (9, 14), 1), (32, 24, (5, 28), 1), (64, 16, (56, 56), 2),
     (64, 16, (13, 13), 1), (48, 24, (4, 27), 1)],
)  # fmt: skip
def test_row_tiles_equal_tiles_of_p_positions_bit_for_bit(monkeypatch, ocg, icg, sshape, stride):
    # rows of 7, 13, 14, 27 (14 + 13) or 28 output positions (AVX-512's wide units) in tiles
    # of their own: the same sums as the tiles of P plane positions, the bias, z and ReLU on
    # the way
    c = _case(n=2, icg=icg, ocg=ocg, sshape=sshape, stride=(stride, stride), seed=ocg)
    x, w, src, filt = _operands(c)
    rng = np.random.default_rng(1)
    bias = rng.uniform(-1, 1, ocg).astype(np.float32)
    zn = rng.uniform(-1, 1, (2, ocg, *c["oshape"])).astype(np.float32)
    real = conv_nchw88.row_tiles
    outs = []
    for rule in (lambda ow, wq, wide: 0, real):
        monkeypatch.setattr(conv_nchw88, "row_tiles", rule)
        outs.append(_out88(c))
        name, step = _bind(c, src, filt, outs[-1], epilogue=Epilogue(bias, True), z=_to88(zn))
        assert name == "DIRECT_NCHW88"
        step()
    assert np.array_equal(outs[0], outs[1])
    want = np.maximum(ref_forward(c, x, w) + bias[None, :, None, None] + zn, 0)
    np.testing.assert_allclose(conv_nchw88.to_nchw(outs[1]), want, rtol=RTOL, atol=ATOL)
    ow = c["oshape"][1]
    assert real(ow, ow + 1, True) == (ow if ow in loops_nchw8c.ROW_TILES else 14)


def test_row_tiles_only_where_the_plane_rows_have_a_gap():
    # a strided pointwise convolution's subsampled plane (wq == ow) keeps the tiles of P
    assert conv_nchw88.row_tiles(14, 14, True) == 0
    assert conv_nchw88.row_tiles(7, 7, True) == 0
    assert conv_nchw88.row_tiles(14, 15, True) == 14
    assert conv_nchw88.row_tiles(28, 29, True) == 14  # two a row
    assert conv_nchw88.row_tiles(28, 28, True) == 0
    assert conv_nchw88.row_tiles(56, 57, True) == 0
    assert conv_nchw88.row_tiles(7, 8, False) == 0
    assert conv_nchw88.row_tiles(13, 14, True) == 13  # SqueezeNet's 13x13 planes
    assert conv_nchw88.row_tiles(27, 28, True) == 14  # 14 + 13
    assert conv_nchw88.row_tiles(55, 56, True) == 0


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([7, 13, 14, 27, 28]), st.integers(1, 5), st.integers(1, 3),
       st.integers(1, 4), st.integers(1, 2), st.integers(0, 1), st.sampled_from([1, 3]),
       st.integers(0, 2**16))  # fmt: skip
def test_row_tiles_of_any_geometry_equal_the_tiles_of_p(ow, oh, icb, ocu, g, pad, fsize, seed):
    # the row tiles (7, 13, 14 and 14 + 13 positions) under drawn heights, channel counts
    # (odd counts of blocks of 16 included), groups, paddings and filter sizes, with the
    # bias, z and ReLU: bit for bit the tiles of P's sums, within the float64 reference
    pad = min(pad, fsize // 2)
    sshape = (oh + fsize - 1 - 2 * pad, ow + fsize - 1 - 2 * pad)
    c = _case(kind="group" if g > 1 else "dense", g=g, icg=8 * icb, ocg=16 * ocu + 16,
              sshape=sshape, fshape=(fsize, fsize), pad=(pad, pad), seed=seed)  # fmt: skip
    assert c["oshape"] == (oh, ow)
    x, w, src, filt = _operands(c)
    rng = np.random.default_rng(seed + 1)
    oc = g * c["ocg"]
    bias = rng.uniform(-1, 1, oc).astype(np.float32)
    zn = rng.uniform(-1, 1, (1, oc, oh, ow)).astype(np.float32)
    real = conv_nchw88.row_tiles
    outs = []
    for rule in (lambda ow, wq, wide: 0, real):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(conv_nchw88, "row_tiles", rule)
            outs.append(_out88(c))
            name, step = _bind(c, src, filt, outs[-1], epilogue=Epilogue(bias, True),
                               z=_to88(zn))  # fmt: skip
            assert name == _direct(c)
            step()
    assert np.array_equal(outs[0], outs[1])
    want = np.maximum(ref_forward(c, x, w) + bias[None, :, None, None] + zn, 0)
    np.testing.assert_allclose(conv_nchw88.to_nchw(outs[1]), want, rtol=RTOL, atol=ATOL)


def test_the_dense_benchmark_runs_and_agrees_with_onnxruntime(benchmark_module, capsys):
    # benchmarks/dense88.py on two small layers, so that it cannot rot; times unchecked
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    bench = benchmark_module("dense88")

    rows = bench.main(["--smoke"])
    assert [r["name"] for r in rows] == ["DIRECT_NCHW88"] * 2
    assert all(min(r["ours"], r["ort"], r["ort_run"]) > 0 for r in rows)
    bench.main(["--smoke", "--whole-planes"])  # checks the two splits' outputs equal
    assert "sum" in capsys.readouterr().out
    bench.main(["--smoke", "--cold"])
    assert bench.peak(1, 10)[(12, 32)] > 0


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 2), cbs=st.integers(1, 3), h=st.integers(1, 9), w=st.integers(1, 9),
       sh=st.integers(1, 3), sw=st.integers(1, 3), pad=st.integers(0, 2),
       extra=st.integers(0, 2), cut=st.integers(0, 2), subsampled=st.booleans())  # fmt: skip
def test_blocked_packing_writes_the_phase_planes(n, cbs, h, w, sh, sw, pad, extra, cut,
                                                 subsampled):  # fmt: skip
    # every value of the phase planes (all sh * sw, or phase (0, 0) alone) against their
    # definition: plane (rho, phi) holds x[sh r + rho - pad, sw c + phi - col_off] at (r, c),
    # zero outside the source (planes cut short by ``cut`` columns drop the source's last);
    # then SLACK zero positions after a sample's blocks
    col_off = pad + extra
    hq, wq = -(-(h + 2 * pad) // sh), max(1, -(-(w + col_off + pad) // sw) + extra - cut)
    phases = 1 if subsampled else sh * sw
    x = np.random.default_rng(h * w).uniform(-1, 1, (n, cbs, h, w, 8)).astype(np.float32)
    sample = cbs * phases * hq * wq * 8 + loops_nchw8c.SLACK * 8
    buf = np.full(n * sample, np.nan, np.float32)
    loops_nchw8c.pack_blocked_input(loops_nchw8c.readonly_view(x), buf, (sh, sw), pad, col_off,
                                    hq, wq, 0, n * cbs, phases=phases)  # fmt: skip
    padded = np.zeros((n, cbs, sh * hq + sh, sw * wq + sw, 8), np.float32)
    padded[:, :, pad:pad + h, col_off:col_off + w] = x[:, :, :sh * hq + sh - pad,
                                                       :sw * wq + sw - col_off]  # fmt: skip
    for s in range(n):
        got = buf[s * sample:(s + 1) * sample]
        planes = got[:-loops_nchw8c.SLACK * 8].reshape(cbs, phases, hq, wq, 8)
        for ph in range(phases):
            rho, phi = divmod(ph, sw)
            want = padded[s, :, rho::sh, phi::sw][:, :hq, :wq]
            np.testing.assert_array_equal(planes[:, ph], want)
        assert not got[-loops_nchw8c.SLACK * 8:].any()


@pytest.mark.parametrize("fshape, stride", [((3, 3), 1), ((3, 3), 2), ((1, 1), 2)])
def test_channel_chunks_give_the_same_sums_bit_for_bit(monkeypatch, fshape, stride):
    # a tile's channel blocks summed a chunk at a time (the partial sums kept in the row
    # buffer) or all at once: the same order of additions, the same output
    c = _case(n=1, icg=160, ocg=48, sshape=(9, 9), fshape=fshape, stride=(stride, stride),
              pad=tuple(f // 2 for f in fshape), seed=7)  # fmt: skip
    x, w, src, filt = _operands(c)
    bias = np.random.default_rng(2).uniform(-1, 1, 48).astype(np.float32)
    outs = []
    for chunk in (1, 3, 64):
        monkeypatch.setattr(conv_nchw88, "_chunk", lambda taps, chunk=chunk: chunk)
        outs.append(_out88(c))
        name, step = _bind(c, src, filt, outs[-1], epilogue=Epilogue(bias, True))
        assert name == "DIRECT_NCHW88"
        step()
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])
    want = np.maximum(ref_forward(c, x, w) + bias[None, :, None, None], 0)
    np.testing.assert_allclose(conv_nchw88.to_nchw(outs[0]), want, rtol=RTOL, atol=ATOL)
