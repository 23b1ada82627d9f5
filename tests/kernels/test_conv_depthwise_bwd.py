"""The depthwise backward passes (megbrain.kernels.conv.depthwise_bwd, DIRECT_DEPTHWISE)
against the float64 reference: drawn batches, channels, filter sizes, strides, paddings,
dilations and flips; the data gradient against finite differences of the forward; a long
reduction (batch 32); thread splits; no allocation per run; HEURISTIC's choice."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from test_conv_algos import (
    ATOL,
    RTOL,
    assert_allocates_nothing,
    ref_backward_data,
    ref_backward_filter,
    ref_forward,
)
from test_conv_grouped import grouped_cases
from test_conv_nchw8c import _arrays as _source_and_filter
from test_conv_nchw8c import _geometry

from megbrain.kernels.conv import common as conv_common
from megbrain.kernels.conv import depthwise_bwd
from megbrain.kernels.conv import registry as conv_algos


def _diff(c):
    rng = np.random.default_rng(c["seed"] + 1)
    return rng.uniform(-1, 1, (c["n"], c["g"], *c["oshape"])).astype(np.float32)


def _assert_close(got, ref):
    np.testing.assert_allclose(got, ref, rtol=RTOL, atol=ATOL * max(1.0, np.abs(ref).max()))


@settings(max_examples=160, deadline=None)
@given(c=grouped_cases(depthwise=True), kind=st.sampled_from(["filter", "data"]))
def test_gradients_match_float64(c, kind):
    x, w = _source_and_filter(c)
    dy = _diff(c)
    if kind == "filter":
        gw = np.full(w.shape, np.nan, np.float32)
        depthwise_bwd.bind_depthwise_filter_grad(x, dy, gw, *_geometry(c))()
        _assert_close(gw, ref_backward_filter(c, x, dy, w.shape))
    else:
        gx = np.full(x.shape, np.nan, np.float32)
        depthwise_bwd.bind_depthwise_data_grad(w, dy, gx, *_geometry(c))()
        _assert_close(gx, ref_backward_data(c, w, dy))


def _case(n=32, g=16, s=8, stride=(1, 1), pad=(1, 1), flip=False):
    fshape, dilate = (3, 3), (1, 1)
    oshape = tuple(conv_common.conv_out_size(s, f, t, p, d)
                   for f, t, p, d in zip(fshape, stride, pad, dilate))  # fmt: skip
    return dict(n=n, g=g, icg=1, ocg=1, fshape=fshape, stride=stride, pad=pad, dilate=dilate,
                sshape=(s, s), oshape=oshape, flip=flip, seed=3)  # fmt: skip


def test_gradients_against_finite_differences():
    """The convolution is linear in x and in w, so the directional derivative of
    ``sum(dy * conv(x, w))`` along v is exactly ``sum(dy * conv(v, w))`` (and likewise in w):
    both gradients must give it."""
    c = _case(n=3, g=5, s=7, stride=(2, 2), flip=True)
    x, w = _source_and_filter(c)
    dy = _diff(c).astype(np.float64)
    gx, gw = np.empty_like(x), np.empty_like(w)
    depthwise_bwd.bind_depthwise_data_grad(w, dy.astype(np.float32), gx, *_geometry(c))()
    depthwise_bwd.bind_depthwise_filter_grad(x, dy.astype(np.float32), gw, *_geometry(c))()
    rng = np.random.default_rng(9)
    vx, vw = rng.standard_normal(x.shape), rng.standard_normal(w.shape)
    h = 1e-3

    def f(xv, wv):
        return float((dy * ref_forward(c, xv, wv)).sum())

    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    num_x = (f(x64 + h * vx, w64) - f(x64 - h * vx, w64)) / (2 * h)
    num_w = (f(x64, w64 + h * vw) - f(x64, w64 - h * vw)) / (2 * h)
    np.testing.assert_allclose((gx * vx).sum(), num_x, rtol=1e-4)
    np.testing.assert_allclose((gw * vw).sum(), num_w, rtol=1e-4)


def test_long_reduction_batch_32():
    """MobileNetV2's shapes: the filter gradient sums 32 * 64 products per tap."""
    c = _case()
    x, w = _source_and_filter(c)
    dy = _diff(c)
    gw, gx = np.empty_like(w), np.empty_like(x)
    fg = depthwise_bwd.bind_depthwise_filter_grad(x, dy, gw, *_geometry(c))
    dg = depthwise_bwd.bind_depthwise_data_grad(w, dy, gx, *_geometry(c))
    fg()
    dg()
    _assert_close(gw, ref_backward_filter(c, x, dy, w.shape))
    _assert_close(gx, ref_backward_data(c, w, dy))
    assert_allocates_nothing(fg)
    assert_allocates_nothing(dg)


def test_filter_gradient_stacks_planes_in_chunks():
    """The filter gradient sums chunks of samples whose padded planes are stacked (two 42x42
    planes a chunk here, the last chunk one), at stride 1 and 2, as float64 does."""
    for stride in ((1, 1), (2, 2)):
        c = _case(n=5, g=6, s=40, stride=stride)
        x, w = _source_and_filter(c)
        dy = _diff(c)
        gw = np.full(w.shape, np.nan, np.float32)
        depthwise_bwd.bind_depthwise_filter_grad(x, dy, gw, *_geometry(c))()
        _assert_close(gw, ref_backward_filter(c, x, dy, w.shape))


def test_heuristic_chooses_it_for_depthwise_only():
    """The filter gradient at every stride, the data gradient at strides other than 1."""
    for stride, kind in (((1, 1), "backward_filter"), ((2, 2), "backward_filter"),
                         ((2, 2), "backward_data")):  # fmt: skip
        c = _case(n=2, g=8, s=6, stride=stride)
        x, w = _source_and_filter(c)
        dy = _diff(c)
        geo = _geometry(c)
        a, out = (x, w) if kind == "backward_filter" else (w, x)
        assert conv_algos.select(kind, a, dy, np.empty_like(out), *geo).name == ("DIRECT_DEPTHWISE")
    c = _case(n=2, g=8, s=6)
    dense = dict(c, g=1, icg=8, ocg=8)
    x, w = _source_and_filter(dense)
    dy = np.zeros((2, 8, *c["oshape"]), np.float32)
    assert not depthwise_bwd.usable_depthwise_bwd(x, dy, np.empty_like(w), *_geometry(c))


@settings(max_examples=40, deadline=None)
@given(c=grouped_cases(depthwise=True))
def test_stride_one_data_gradient_runs_as_the_channelwise_forward(c):
    """At stride 1 with a "same"-or-smaller padding HEURISTIC runs the depthwise data gradient
    as a forward convolution (AS_FORWARD_CONV, the channel-wise forward kernels), not as
    DIRECT's or col2im's; it matches float64 either way."""
    from megbrain.kernels.conv import binds

    c = dict(c, stride=(1, 1))
    c["oshape"] = tuple(conv_common.conv_out_size(s, f, 1, p, d) for s, f, p, d in
                        zip(c["sshape"], c["fshape"], c["pad"], c["dilate"]))  # fmt: skip
    if min(c["oshape"]) < 1:
        return
    x, w = _source_and_filter(c)
    dy = _diff(c)
    gx = np.full(x.shape, np.nan, np.float32)
    geo = _geometry(c)
    name = conv_algos.select("backward_data", w, dy, gx, *geo).name
    as_forward = all(p <= d * (f - 1) for p, d, f in zip(c["pad"], c["dilate"], c["fshape"]))
    if as_forward and c["g"] > 1:
        assert name == "AS_FORWARD_CONV"
    binds.bind_conv_backward_data(w, dy, gx, *geo)()
    _assert_close(gx, ref_backward_data(c, w, dy))


def test_pointwise_data_gradient_runs_as_forward_up_to_the_channel_bound():
    from megbrain.kernels.conv import bwd_data

    bound = bwd_data.AS_FORWARD_POINTWISE_MAX_CHANNELS
    for oc, name in ((24, "AS_FORWARD_CONV"), (bound, "AS_FORWARD_CONV"),
                     (bound + 1, "GEMM_COL2IM")):  # fmt: skip
        w = np.zeros((1, oc, 16, 1, 1), np.float32)
        dy = np.zeros((2, oc, 8, 8), np.float32)
        gx = np.zeros((2, 16, 8, 8), np.float32)
        got = conv_algos.select("backward_data", w, dy, gx, (1, 1), (0, 0), (1, 1)).name
        assert got == name, oc
