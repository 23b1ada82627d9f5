"""The hybrid NCHW88 convolution (DIRECT_NCHW_NCHW88, through
megbrain.kernels.conv.nchw88.bind_nchw88_forward: an NCHW source of 1-8 channels into an
NCHW88 output) against the float64 reference: drawn batches, channels, filter sizes,
strides, paddings, dilations and flips, with and without the epilogue (bias, residual ``z``,
ReLU, H_SWISH or ReLU6, NaN kept); strided operands; the same bits on any thread count; nothing
allocated at run time; the workspace written before it is read."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_conv_algos import ATOL, RTOL, assert_allocates_nothing
from test_conv_channelwise88 import _pair
from test_conv_fast_algos import _carved

from megbrain.kernels.conv import common as conv_common
from megbrain.kernels.conv import hybrid88
from megbrain.kernels.conv import nchw88 as conv_nchw88
from megbrain.kernels.conv.constant_operands import constant_filter
from megbrain.kernels.conv.epilogue import Epilogue

ALGO = "DIRECT_NCHW_NCHW88"


def _ref(x, w, stride, pad, dilate, flip):
    """float64 convolution of NCHW ``x`` with ``w`` (OC, IC, FH, FW)."""
    w = w.astype(np.float64)
    if flip:
        w = w[:, :, ::-1, ::-1]
    (sh, sw), (dh, dw) = stride, dilate
    xp = np.pad(x.astype(np.float64), [(0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])])
    fh, fw = w.shape[2:]
    oh = (xp.shape[2] - dh * (fh - 1) - 1) // sh + 1
    ow = (xp.shape[3] - dw * (fw - 1) - 1) // sw + 1
    out = np.zeros((x.shape[0], w.shape[0], oh, ow))
    for a in range(fh):
        for b in range(fw):
            win = xp[:, :, a * dh : a * dh + sh * (oh - 1) + 1 : sh,
                     b * dw : b * dw + sw * (ow - 1) + 1 : sw]  # fmt: skip
            out += np.einsum("nchw,oc->nohw", win, w[:, :, a, b])
    return out


def _case(**kw):
    c = dict(n=1, ic=3, oc=32, fshape=(3, 3), stride=(2, 2), pad=(1, 1), dilate=(1, 1),
             sshape=(17, 29), flip=False, seed=3)  # fmt: skip
    c.update(kw)
    return c


@st.composite
def cases(draw):
    fshape, stride, dilate = draw(_pair(1, 7)), draw(_pair(1, 3)), draw(_pair(1, 2))
    pad = tuple(draw(st.integers(0, (f - 1) * d + 1)) for f, d in zip(fshape, dilate))
    lows = [max(1, d * (f - 1) + 1 - 2 * p) for f, p, d in zip(fshape, pad, dilate)]
    # rows shorter and longer than a tile's positions (6 or 12)
    sshape = tuple(draw(st.integers(lo, 40)) for lo in lows)
    return _case(n=draw(st.integers(1, 2)), ic=draw(st.integers(1, 8)),
                 oc=8 * draw(st.integers(1, 5)), fshape=fshape, stride=stride, pad=pad,
                 dilate=dilate, sshape=sshape, flip=draw(st.booleans()),
                 seed=draw(st.integers(0, 2**16)))  # fmt: skip


def _operands(c):
    rng = np.random.default_rng(c["seed"])
    x = rng.uniform(-1, 1, (c["n"], c["ic"], *c["sshape"])).astype(np.float32)
    w = rng.uniform(-1, 1, (c["oc"], c["ic"], *c["fshape"])).astype(np.float32)
    filt = w.reshape(c["oc"] // 8, 8, c["ic"], *c["fshape"]).transpose(0, 3, 4, 2, 1)
    return x, w, np.ascontiguousarray(filt)


def _out(c):
    geometry = zip(c["sshape"], c["fshape"], c["stride"], c["pad"], c["dilate"])
    osp = tuple(conv_common.conv_out_size(*a) for a in geometry)
    return np.full((c["n"], c["oc"] // 8, *osp, 8), np.nan, np.float32)


def _bind(c, src, filt, out, **kw):
    return conv_nchw88.bind_nchw88_forward(src, filt, out, c["stride"], c["pad"], c["dilate"],
                                           c["flip"], **kw)  # fmt: skip


def _want(c, x, w):
    return _ref(x, w, c["stride"], c["pad"], c["dilate"], c["flip"])


@settings(max_examples=40, deadline=None)
@given(c=cases(), act=st.sampled_from(["none", "bias", "relu", "hswish", "relu6"]),
       with_z=st.booleans(), constant=st.booleans())  # fmt: skip
def test_matches_float64(c, act, with_z, constant):
    x, w, filt = _operands(c)
    out = _out(c)
    rng = np.random.default_rng(c["seed"] + 1)
    want = _want(c, x, w)
    kw = {}
    if act != "none":
        b = rng.uniform(-3, 3, c["oc"]).astype(np.float32)  # both ends of H_SWISH's ramp
        kw["epilogue"] = Epilogue(b, act == "relu", act == "hswish", act == "relu6")
        want = want + b[None, :, None, None]
    if with_z:
        zn = rng.uniform(-1, 1, want.shape).astype(np.float32)
        kw["z"] = np.ascontiguousarray(conv_nchw88.to_nchw88(zn))
        want = want + zn
    if act in ("relu", "relu6"):
        want = np.maximum(want, 0)
    if act == "relu6":
        want = np.minimum(want, 6)
    if act == "hswish":
        want = want * np.clip(want + 3, 0, 6) / 6
    with constant_filter(constant):
        name, step = _bind(c, x, filt, out, **kw)
    assert name == ALGO
    for _ in range(2):  # the second run reuses a constant filter's copy
        step()
        np.testing.assert_allclose(conv_nchw88.to_nchw(out), want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("oc", [32, 24])
def test_the_same_bits_on_any_thread_count(monkeypatch, oc):
    c = _case(n=2, oc=oc, fshape=(7, 7), pad=(3, 3), sshape=(64, 70))
    x, _, filt = _operands(c)
    bias = np.linspace(-1, 1, oc, dtype=np.float32)
    outs = []
    for t in (1, 2, 3):
        monkeypatch.setattr(conv_common, "THREADS", t)
        out = _out(c)
        _bind(c, x, filt, out, epilogue=Epilogue(bias, True))[1]()
        outs.append(out)
    assert all(np.array_equal(outs[0], o) for o in outs[1:])


def test_nan_is_kept_and_strided_operands_are_read():
    c = _case(n=2, ic=4, oc=24, fshape=(5, 5), pad=(2, 2), stride=(2, 1), sshape=(15, 23))
    x, w, filt = _operands(c)
    wide = np.zeros(x.shape[:-1] + (2 * x.shape[-1],), np.float32)
    wide[..., ::2] = x
    src = wide[..., ::2]
    src[0, 1, 6, 9] = np.nan
    out = _out(c)
    zbig = np.zeros(out.shape[:-1] + (16,), np.float32)
    bias = np.full(c["oc"], -100, np.float32)  # every finite sum negative: ReLU gives 0
    name, step = _bind(c, src, filt, out, epilogue=Epilogue(bias[::-1].copy()[::-1], True),
                       z=zbig[..., ::2])  # fmt: skip
    assert name == ALGO
    step()
    y = conv_nchw88.to_nchw(out)
    # source row 6 feeds output rows 2-4 (stride 2, pad 2), column 9 columns 7-11
    assert np.isnan(y[0, :, 2:5, 7:12]).all()
    y[0, :, 2:5, 7:12] = 0
    assert (y == 0).all()
    big = _out(c).repeat(2, axis=-1)
    strided_out = big[..., ::2]  # not contiguous: written through a copy
    src[0, 1, 6, 9] = 0
    x[0, 1, 6, 9] = 0
    _bind(c, src, filt, strided_out)[1]()
    np.testing.assert_allclose(conv_nchw88.to_nchw(np.ascontiguousarray(strided_out)),
                               _want(c, x, w), rtol=RTOL, atol=ATOL)  # fmt: skip


@pytest.mark.parametrize("constant", [False, True])
def test_workspace_is_written_before_read_and_nothing_is_allocated(monkeypatch, constant):
    c = _case(n=2, ic=3, oc=40, fshape=(3, 3), pad=(1, 1), stride=(2, 2), flip=True,
              sshape=(31, 45))  # fmt: skip
    x, w, filt = _operands(c)
    bias = np.linspace(-1, 1, c["oc"], dtype=np.float32)
    out = _out(c)
    z = np.zeros(out.shape[:-1] + (16,), np.float32)[..., ::2]  # copied into the workspace
    src = np.repeat(x, 2, axis=-1)[..., ::2]  # copied too

    def bind():
        with constant_filter(constant):
            return _bind(c, src, filt, out, epilogue=Epilogue(bias, True), z=z)[1]

    step, buf = _carved(bind)
    step()
    want = np.maximum(_want(c, x, w) + bias[None, :, None, None], 0)
    for _ in range(2):
        buf[:] = 0xFF  # NaN in every workspace byte
        step()
        np.testing.assert_allclose(conv_nchw88.to_nchw(out), want, rtol=RTOL, atol=ATOL)
    monkeypatch.setattr(conv_common, "THREADS", 1)  # the pool's hand-over objects would count
    step = bind()
    step()
    assert_allocates_nothing(step)


def test_the_stems_match_float64_at_their_size():
    # every stem shape of benchmarks/stem88.py at 224x224, bias + ReLU: tiles of several
    # lengths and groups, read in place at strides 2 and 4, padded copies at the edges
    for fs, s, p, oc in [(3, 2, 1, 24), (7, 2, 3, 64), (4, 4, 0, 96), (3, 2, 0, 64)]:
        c = _case(oc=oc, fshape=(fs, fs), stride=(s, s), pad=(p, p), sshape=(224, 224))
        x, w, filt = _operands(c)
        b = np.linspace(-1, 1, oc, dtype=np.float32)
        out = _out(c)
        name, step = _bind(c, x, filt, out, epilogue=Epilogue(b, True))
        assert name == ALGO
        step()
        want = np.maximum(_want(c, x, w) + b[None, :, None, None], 0)
        np.testing.assert_allclose(conv_nchw88.to_nchw(out), want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("fshape, stride, pad, dilate, sshape", [
    ((7, 7), (2, 2), (3, 3), (1, 1), (5, 6)),  # every window leaves the source: all copies
    ((5, 3), (1, 4), (4, 1), (2, 1), (3, 50)),  # every row's window leaves the source
    ((3, 3), (3, 3), (0, 2), (2, 2), (40, 90)),  # dilated, stride 3: in place but the ends
])  # fmt: skip
def test_tiles_in_place_and_on_padded_copies(fshape, stride, pad, dilate, sshape):
    c = _case(ic=5, oc=40, fshape=fshape, stride=stride, pad=pad, dilate=dilate, sshape=sshape)
    x, w, filt = _operands(c)
    out = _out(c)
    name, step = _bind(c, x, filt, out)
    assert name == ALGO
    step()
    np.testing.assert_allclose(conv_nchw88.to_nchw(out), _want(c, x, w), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("ow, k, oc", [(112, 27, 16), (112, 27, 24), (56, 48, 96), (3, 9, 40)])
def test_tiles_fit_the_registers_and_the_row(ow, k, oc):
    tl = hybrid88.tiles_for(ow, k, oc)
    assert tl.r <= max(1, ow) and tl.r * tl.b <= 24
    assert tl.ng * tl.b == -(-oc // 16)


def test_the_benchmark_runs_and_agrees_with_onnxruntime(benchmark_module):
    # benchmarks/stem88.py on two small stems, so that it cannot rot; times unchecked
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    bench = benchmark_module("stem88")

    rows = bench.main(["--smoke"])
    assert [r["name"] for r in rows] == [ALGO] * 2
    assert all(min(r["ours"], r["ort"], r["ort_run"]) > 0 for r in rows)
