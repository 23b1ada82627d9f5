"""DEPTHWISE_POINTWISE_NCHW88 (megbrain.kernels.conv.pointwise88_dw): the depthwise NCHW88
convolution and the 1x1 one reading it, as one kernel: against the float64 reference over
drawn batches, planes, filters, strides, padding, dilation, channel counts and both
epilogues, and bit for bit the two kernels it replaces (CHANNELWISE_NCHW88, then
POINTWISE_NCHW88), at one thread and split over two; the output sharing ``z``'s memory;
nothing allocated at run time."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_conv_algos import ATOL, RTOL, assert_allocates_nothing
from test_conv_channelwise88 import _ref as dw_ref
from test_conv_pointwise88 import _silu64

from megbrain.kernels.conv import common as conv_common
from megbrain.kernels.conv import nchw88 as conv_nchw88
from megbrain.kernels.conv import pointwise88_dw
from megbrain.kernels.conv.constant_operands import constant_filter
from megbrain.kernels.conv.epilogue import Epilogue

_ACTS = ["none", "IDENTITY", "RELU", "H_SWISH", "RELU6", "SILU"]


def _act64(y, act):
    if act == "RELU":
        return np.maximum(y, 0)
    if act == "H_SWISH":
        return y * np.clip(y + 3, 0, 6) / 6
    if act == "RELU6":
        return np.clip(y, 0, 6)
    if act == "SILU":
        return _silu64(y)
    return y


def _epilogue(act, bias):
    if act == "none":
        return None
    return Epilogue(bias, act == "RELU", act == "H_SWISH", relu6=act == "RELU6",
                    silu=act == "SILU")  # fmt: skip


@st.composite
def cases(draw):
    f = draw(st.sampled_from([3, 5]))
    stride, dilate = draw(st.integers(1, 2)), draw(st.sampled_from([1, 1, 2]))
    pad = draw(st.integers(0, (f - 1) * dilate))
    lo = max(1, dilate * (f - 1) + 1 - 2 * pad)
    return dict(n=draw(st.integers(1, 2)), c=8 * draw(st.integers(1, 5)),
                oc=8 * draw(st.sampled_from([1, 2, 3, 5, 12])), f=f, stride=stride, pad=pad,
                dilate=dilate, h=draw(st.integers(lo, 17)), w=draw(st.integers(lo, 17)),
                flip=draw(st.booleans()), seed=draw(st.integers(0, 2**16)))  # fmt: skip


def _operands(c):
    rng = np.random.default_rng(c["seed"])
    x = rng.uniform(-1, 1, (c["n"], c["c"], c["h"], c["w"])).astype(np.float32)
    wd = rng.uniform(-1, 1, (c["c"], c["f"], c["f"])).astype(np.float32)
    bd = rng.uniform(-1, 1, c["c"]).astype(np.float32)
    wp = (rng.uniform(-1, 1, (c["oc"], c["c"])) / np.sqrt(c["c"])).astype(np.float32)
    bp = rng.uniform(-1, 1, c["oc"]).astype(np.float32)
    src = np.ascontiguousarray(conv_nchw88.to_nchw88(x))
    fd = np.ascontiguousarray(wd.reshape(c["c"] // 8, 8, c["f"], c["f"]).transpose(0, 2, 3, 1))
    fp = np.ascontiguousarray(wp.reshape(c["oc"] // 8, 8, c["c"] // 8, 8).transpose(0, 2, 3, 1))
    return x, wd, bd, wp, bp, src, fd[:, None, None], fp[:, :, None, None]


def _geometry(c):
    s, p, d = (c["stride"],) * 2, (c["pad"],) * 2, (c["dilate"],) * 2
    oh, ow = (conv_common.conv_out_size(v, c["f"], c["stride"], c["pad"], c["dilate"])
              for v in (c["h"], c["w"]))  # fmt: skip
    return s, p, d, oh, ow


def _want(c, x, wd, bd, wp, bp, z, dw_act, act):
    s, p, d, _, _ = _geometry(c)
    mid = dw_ref(x, wd, s, p, d, c["flip"])
    if dw_act != "none":
        mid = _act64(mid + bd[None, :, None, None], dw_act)
    y = np.einsum("oi,nihw->nohw", wp.astype(np.float64), mid)
    if act != "none":
        y = y + bp[None, :, None, None]
    if z is not None:
        y = y + z
    return _act64(y, act)


def _run(c, dw_act, act, with_z, constant, threads, monkeypatch):
    """``(fused output, the two kernels' output, float64 reference)``, NCHW."""
    x, wd, bd, wp, bp, src, fd, fp = _operands(c)
    s, p, d, oh, ow = _geometry(c)
    shape = (c["n"], c["oc"] // 8, oh, ow, 8)
    z = np.random.default_rng(c["seed"] + 1).uniform(-1, 1, shape).astype(np.float32)
    z = z if with_z else None
    out, ref = np.full(shape, np.nan, np.float32), np.full(shape, np.nan, np.float32)
    mid = np.full((c["n"], c["c"] // 8, oh, ow, 8), np.nan, np.float32)
    monkeypatch.setattr(conv_common, "THREADS", threads)
    monkeypatch.setattr(pointwise88_dw, "MIN_SPLIT_MACS", 0)
    with constant_filter(constant):
        step = pointwise88_dw.bind_depthwise_pointwise88(
            src, fd, s, p, d, _epilogue(dw_act, bd), fp, out, _epilogue(act, bp), z, c["flip"]
        )
        _, a = conv_nchw88.bind_nchw88_forward(src, fd, mid, s, p, d, c["flip"], group=True,
                                               epilogue=_epilogue(dw_act, bd))  # fmt: skip
        _, b = conv_nchw88.bind_nchw88_forward(mid, fp, ref, (1, 1), (0, 0), (1, 1),
                                               epilogue=_epilogue(act, bp), z=z)  # fmt: skip
    for _ in range(2):  # the second run reuses a constant filter's packed copies
        step()
    a()
    b()
    z64 = None if z is None else conv_nchw88.to_nchw(z).astype(np.float64)
    want = _want(c, x, wd, bd, wp, bp, z64, dw_act, act)
    return conv_nchw88.to_nchw(out), conv_nchw88.to_nchw(ref), want


@settings(max_examples=40, deadline=None)
@given(c=cases(), dw_act=st.sampled_from(_ACTS), act=st.sampled_from(["none", "IDENTITY", "RELU"]),
       with_z=st.booleans(), constant=st.booleans(), threads=st.sampled_from([1, 2]))  # fmt: skip
def test_matches_float64_and_the_two_kernels_bit_for_bit(c, dw_act, act, with_z, constant,
                                                         threads):  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        got, two, want = _run(c, dw_act, act, with_z, constant, threads, mp)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(got, two)


def test_the_output_may_share_zs_memory(monkeypatch):
    c = dict(n=1, c=24, oc=24, f=3, stride=1, pad=1, dilate=1, h=7, w=7, flip=False, seed=5)
    x, wd, bd, wp, bp, src, fd, fp = _operands(c)
    z = np.random.default_rng(9).uniform(-1, 1, (1, 3, 7, 7, 8)).astype(np.float32)
    want = _want(c, x, wd, bd, wp, bp, conv_nchw88.to_nchw(z).astype(np.float64), "RELU", "none")
    monkeypatch.setattr(pointwise88_dw, "MIN_SPLIT_MACS", 0)
    step = pointwise88_dw.bind_depthwise_pointwise88(
        src, fd, (1, 1), (1, 1), (1, 1), _epilogue("RELU", bd), fp, z, None, z
    )
    step()
    np.testing.assert_allclose(conv_nchw88.to_nchw(z), want, rtol=RTOL, atol=ATOL)


def test_nothing_is_allocated_at_run_time(monkeypatch):
    c = dict(n=1, c=40, oc=16, f=5, stride=2, pad=2, dilate=1, h=14, w=14, flip=False, seed=2)
    _, _, bd, _, bp, src, fd, fp = _operands(c)
    out = np.empty((1, 2, 7, 7, 8), np.float32)
    monkeypatch.setattr(conv_common, "THREADS", 1)
    with constant_filter(True):
        step = pointwise88_dw.bind_depthwise_pointwise88(
            src, fd, (2, 2), (2, 2), (1, 1), _epilogue("RELU6", bd), fp, out,
            _epilogue("IDENTITY", bp))  # fmt: skip
    step()
    assert_allocates_nothing(step)


def test_usable_takes_float32_depthwise_then_dense_1x1_only():
    c = dict(n=1, c=16, oc=8, f=3, stride=1, pad=1, dilate=1, h=5, w=5, flip=False, seed=1)
    _, _, _, _, _, src, fd, fp = _operands(c)
    out = np.empty((1, 1, 5, 5, 8), np.float32)
    assert pointwise88_dw.usable(src, fd, fp, out)
    assert not pointwise88_dw.usable(src.astype(np.float64), fd, fp, out)
    assert not pointwise88_dw.usable(src, fd, fp[:1, :1], out)  # 8 input channels, not 16
    assert not pointwise88_dw.usable(src, fd, fp, out[..., ::2, :])
