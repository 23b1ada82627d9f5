"""The direct grouped convolution (megbrain.kernels.conv.grouped, DIRECT_GROUPED) against the
float64 reference: drawn batches, groups (depthwise included), channels, sizes, strides,
paddings, dilations and flips; its epilogue (bias, ReLU); thread splits; no allocation per run;
never less accurate than the default it replaces; HEURISTIC's choice; through ConvBias."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_conv_algos import ATOL, RTOL, assert_allocates_nothing, ref_forward
from test_conv_nchw8c import _arrays as _source_and_filter
from test_conv_nchw8c import _geometry

from megbrain.kernels import workspace
from megbrain.kernels.conv import common as conv_common
from megbrain.kernels.conv import grouped as conv_grouped
from megbrain.kernels.conv import registry as conv_algos
from megbrain.kernels.conv.epilogue import Epilogue

_FWD = conv_grouped.bind_grouped_forward


@st.composite
def grouped_cases(draw, depthwise=None):
    dw = draw(st.booleans()) if depthwise is None else depthwise
    fshape = (draw(st.integers(1, 7)), draw(st.integers(1, 7)))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dilate = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    pad = (draw(st.integers(0, 3)), draw(st.integers(0, 3)))
    reach = [d * (f - 1) + 1 for f, d in zip(fshape, dilate)]
    sshape = tuple(draw(st.integers(max(1, r - 2 * p), 16)) for r, p in zip(reach, pad))
    oshape = tuple(conv_common.conv_out_size(s, f, t, p, d)
                   for s, f, t, p, d in zip(sshape, fshape, stride, pad, dilate))  # fmt: skip
    return dict(
        n=draw(st.integers(1, 2)),
        g=draw(st.integers(1, 12)),
        icg=1 if dw else draw(st.integers(1, 4)),
        ocg=1 if dw else draw(st.integers(1, 3)),
        fshape=fshape,
        stride=stride,
        pad=pad,
        dilate=dilate,
        sshape=sshape,
        oshape=oshape,
        flip=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
    )


def _arrays(c):
    x, w = _source_and_filter(c)
    return x, w, np.full((c["n"], c["g"] * c["ocg"], *c["oshape"]), np.nan, np.float32)


@settings(max_examples=80, deadline=None)
@given(c=grouped_cases())
def test_forward_matches_float64(c):
    x, w, y = _arrays(c)
    _FWD(x, w, y, *_geometry(c))()
    np.testing.assert_allclose(y, ref_forward(c, x, w), rtol=RTOL, atol=ATOL)


@settings(max_examples=30, deadline=None)
@given(c=grouped_cases(depthwise=True), relu=st.booleans(), threads=st.integers(1, 3))
def test_epilogue_and_thread_splits_match_float64(c, relu, threads):
    x, w, y = _arrays(c)
    bias = np.random.default_rng(c["seed"] + 1).uniform(-1, 1, y.shape[1]).astype(np.float32)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv_common, "THREADS", threads)
        mp.setattr(conv_grouped, "_MIN_SPLIT_PLANES", 1)
        _FWD(x, w, y, *_geometry(c), epilogue=Epilogue(bias, relu))()
    want = ref_forward(c, x, w) + bias[:, None, None]
    if relu:
        want = np.maximum(want, 0)
    np.testing.assert_allclose(y, want, rtol=RTOL, atol=ATOL)


def _case(**kw):
    c = dict(n=2, g=16, icg=1, ocg=1, fshape=(3, 3), stride=(2, 2), pad=(1, 1), dilate=(1, 1),
             sshape=(14, 13), flip=False, seed=5)  # fmt: skip
    c.update(kw)
    c["oshape"] = tuple(conv_common.conv_out_size(s, f, t, p, d) for s, f, t, p, d in zip(
        c["sshape"], c["fshape"], c["stride"], c["pad"], c["dilate"]))  # fmt: skip
    return c


@pytest.mark.parametrize("stride", [(1, 1), (2, 2)])
@pytest.mark.parametrize("fshape", [(3, 3), (5, 5), (7, 7)])
def test_never_less_accurate_than_the_default(stride, fshape):
    # the algorithm HEURISTIC took before (im2col + GEMM, or DIRECT at stride 1)
    c = _case(g=32, sshape=(28, 28), fshape=fshape, stride=stride,
              pad=(fshape[0] // 2,) * 2)  # fmt: skip
    x, w, y = _arrays(c)
    want = ref_forward(c, x, w)
    _FWD(x, w, y, *_geometry(c))()
    others = [a for a in conv_algos.usable_algorithms("forward", x, w, y, *_geometry(c))
              if a.name != "DIRECT_GROUPED"]  # fmt: skip
    default = max(others, key=lambda a: a.priority if a.heuristic is None or
                  a.heuristic(x, w, y, *_geometry(c)) else -1)  # fmt: skip
    y0 = np.empty_like(y)
    default.bind(x, w, y0, *_geometry(c))()
    assert np.abs(y - want).max() <= np.abs(y0 - want).max() * 1.5 + 1e-7, default.name


def test_strided_operands_match_float64():
    c = _case(pad=(0, 0))
    x, w, y = _arrays(c)
    xs = np.swapaxes(np.swapaxes(x, 0, 1).copy(), 0, 1)  # a channel-major source
    ys = np.swapaxes(np.empty((y.shape[1], y.shape[0], *y.shape[2:]), np.float32), 0, 1)
    _FWD(xs, w[..., ::-1, :].copy()[..., ::-1, :], ys, *_geometry(c))()
    np.testing.assert_allclose(ys, ref_forward(c, x, w), rtol=RTOL, atol=ATOL)


def test_unusable_geometry_is_refused():
    c = _case(icg=64, fshape=(3, 3), g=1)  # ICg * FH * FW = 576 > MAX_K
    x, w, y = _arrays(c)
    assert not conv_grouped.usable_grouped_forward(x, w, y, *_geometry(c))
    with pytest.raises(ValueError, match="DIRECT_GROUPED"):
        _FWD(x, w, y, *_geometry(c))
    c = _case()
    x, w, y = _arrays(c)
    assert not conv_grouped.usable_grouped_forward(x.astype(np.float64), w, y, *_geometry(c))


def test_nothing_is_allocated_per_run_and_runs_are_reproducible():
    c = _case(n=3, g=24, sshape=(20, 20))
    x, w, y = _arrays(c)
    rec = workspace.Recorder()
    with workspace.allocating(rec):
        _FWD(x, w, y, *_geometry(c))
    buf = np.full(max(rec.nbytes, 1), 0xFF, np.uint8)
    with workspace.allocating(workspace.Carver(buf)):
        fn = _FWD(x, w, y, *_geometry(c))
    fn()
    first = y.copy()
    assert_allocates_nothing(fn)
    assert np.array_equal(y, first)
    np.testing.assert_allclose(y, ref_forward(c, x, w), rtol=RTOL, atol=ATOL)


def test_empty_batch():
    c = _case(n=0)
    x, w, y = _arrays(c)
    _FWD(x, w, y, *_geometry(c))()


@pytest.mark.parametrize(
    "kw, chosen",
    [
        (dict(stride=(2, 2), ocg=2), True),  # two outputs per channel (a depth multiplier)
        (dict(fshape=(5, 5), pad=(2, 2), stride=(2, 1), ocg=2), True),
        (dict(fshape=(7, 7), pad=(3, 3), stride=(1, 1), ocg=2), True),
        (dict(stride=(2, 2)), False),  # one output per channel: CHANNELWISE_NCHW's
        (dict(stride=(1, 1), ocg=2), False),  # DIRECT's
        (dict(fshape=(9, 9), pad=(4, 4)), False),  # 81 taps
        (dict(icg=2, ocg=2), False),  # grouped, not depthwise: GEMMs sum it
    ],
)
def test_heuristic_takes_depthwise_convolutions(kw, chosen):
    c = _case(**kw)
    x, w, y = _arrays(c)
    name = conv_algos.select("forward", x, w, y, *_geometry(c)).name
    assert (name == "DIRECT_GROUPED") == chosen, name


def test_conv_bias_depthwise_matches_float64():
    import megbrain as mgb

    c = _case(n=1, g=16, sshape=(9, 9))
    x, w, _ = _arrays(c)
    b = np.linspace(-1, 1, 16, dtype=np.float32).reshape(1, 16, 1, 1)
    cn = mgb.comp_node("cpu0")
    g = mgb.comp_graph()
    xv = mgb.make_arg(cn, g, dtype=np.float32, shape=x.shape)
    wv, bv = mgb.make_shared(cn, value=w, comp_graph=g), mgb.make_shared(cn, value=b, comp_graph=g)
    y = mgb.opr.conv_bias_activation(xv, wv, bv, sparse="GROUP", stride_h=2, stride_w=2,
                                     pad_h=1, pad_w=1, nonlineMode="RELU")  # fmt: skip
    f = g.compile([xv], [mgb.copy_output(y)])
    (got,) = f(x)
    want = np.maximum(ref_forward(c, x, w) + b, 0)
    np.testing.assert_allclose(np.asarray(got), want, rtol=RTOL, atol=ATOL)
