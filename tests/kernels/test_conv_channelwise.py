"""The direct channel-wise NCHW convolution (megbrain.kernels.conv.channelwise,
CHANNELWISE_NCHW) against the float64 reference: drawn batches, channel counts (odd ones),
plane sizes, filter sizes, strides, paddings, dilations and flips; its epilogue (bias, ReLU,
H_SWISH); strided operands; thread splits; no allocation per run; never less accurate than the
algorithms it replaces; HEURISTIC's choice; through ConvBias."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_conv_algos import ATOL, RTOL, assert_allocates_nothing, ref_forward
from test_conv_grouped import _arrays, _case, grouped_cases
from test_conv_nchw8c import _geometry, _ref_act
from test_conv_pointwise import bound_in_a_plan, outputs_by_threads

from megbrain.kernels.conv import channelwise as conv_channelwise
from megbrain.kernels.conv import common as conv_common
from megbrain.kernels.conv import registry as conv_algos
from megbrain.kernels.conv.epilogue import Epilogue

_FWD = conv_channelwise.bind_channelwise_forward
_MODES = ("IDENTITY", "RELU", "H_SWISH")


def _want(c, x, w, bias, mode):
    got = ref_forward(c, x, w)
    return got if mode is None else _ref_act(got + bias[:, None, None], mode)


@settings(max_examples=80, deadline=None)
@given(c=grouped_cases(depthwise=True), mode=st.sampled_from((None, *_MODES)),
       threads=st.integers(1, 3))  # fmt: skip
def test_forward_and_epilogue_match_float64(c, mode, threads):
    x, w, y = _arrays(c)
    bias = np.random.default_rng(c["seed"] + 1).uniform(-1, 1, y.shape[1]).astype(np.float32)
    ep = None if mode is None else Epilogue(bias, mode == "RELU", mode == "H_SWISH")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv_common, "THREADS", threads)
        mp.setattr(conv_channelwise, "_MIN_SPLIT_PLANES", 1)
        _FWD(x, w, y, *_geometry(c), epilogue=ep)()
    np.testing.assert_allclose(y, _want(c, x, w, bias, mode), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("stride", [(1, 1), (2, 2)])
@pytest.mark.parametrize("fshape", [(3, 3), (5, 5), (7, 7)])
def test_never_less_accurate_than_the_algorithms_it_replaces(stride, fshape):
    c = _case(g=58, sshape=(28, 28), fshape=fshape, stride=stride,
              pad=(fshape[0] // 2,) * 2)  # fmt: skip
    x, w, y = _arrays(c)
    want = ref_forward(c, x, w)
    _FWD(x, w, y, *_geometry(c))()
    err = np.abs(y - want).max()
    for name in ("DIRECT_GROUPED", "DIRECT"):
        algo = conv_algos.algorithms("forward")
        algo = next(a for a in algo if a.name == name)
        if not algo.usable(x, w, y, *_geometry(c)):
            continue
        y0 = np.empty_like(y)
        algo.bind(x, w, y0, *_geometry(c))()
        assert err <= np.abs(y0 - want).max() * 1.5 + 1e-7, name


def test_strided_operands_match_float64():
    # a slice of a larger source's channels (ShuffleNet's channel split), a channel-major
    # output
    c = _case(n=2, g=29, pad=(1, 1))
    x, w, _ = _arrays(c)
    big = np.zeros((2, 70, *c["sshape"]), np.float32)
    big[:, 3:61:2] = x
    ys = np.swapaxes(np.full((29, 2, *c["oshape"]), np.nan, np.float32), 0, 1)
    _FWD(big[:, 3:61:2], w, ys, *_geometry(c))()
    np.testing.assert_allclose(ys, ref_forward(c, x, w), rtol=RTOL, atol=ATOL)


def test_nan_propagates_through_the_epilogue():
    c = _case(n=1, g=3, stride=(1, 1))
    x, w, y = _arrays(c)
    x[0, 1] = np.nan
    bias = np.zeros(3, np.float32)
    for mode in _MODES:
        _FWD(x, w, y, *_geometry(c), epilogue=Epilogue(bias, mode == "RELU", mode == "H_SWISH"))()
        assert np.isnan(y[0, 1]).all() and np.isfinite(y[0, [0, 2]]).all()


def test_unusable_geometry_is_refused():
    c = _case(icg=2, ocg=1, g=4)  # two input channels per group
    x, w, y = _arrays(c)
    assert not conv_channelwise.usable_channelwise_forward(x, w, y, *_geometry(c))
    with pytest.raises(ValueError, match="CHANNELWISE_NCHW"):
        _FWD(x, w, y, *_geometry(c))
    c = _case()
    x, w, y = _arrays(c)
    assert not conv_channelwise.usable_channelwise_forward(x.astype(np.float64), w, y,
                                                           *_geometry(c))  # fmt: skip
    c9 = _case(fshape=(9, 9), pad=(4, 4))  # 81 taps
    x, w, y = _arrays(c9)
    assert not conv_channelwise.usable_channelwise_forward(x, w, y, *_geometry(c9))


def test_nothing_is_allocated_per_run_and_runs_are_reproducible():
    c = _case(n=3, g=24, sshape=(20, 20))
    x, w, y = _arrays(c)
    ep = Epilogue(np.linspace(-1, 1, 24, dtype=np.float32), True)
    fn = bound_in_a_plan(lambda: _FWD(x, w, y, *_geometry(c), epilogue=ep))
    fn()
    first = y.copy()
    assert_allocates_nothing(fn)
    assert np.array_equal(y, first)
    want = np.maximum(ref_forward(c, x, w) + ep.bias[:, None, None], 0)
    np.testing.assert_allclose(y, want, rtol=RTOL, atol=ATOL)


def test_empty_batch():
    c = _case(n=0)
    x, w, y = _arrays(c)
    _FWD(x, w, y, *_geometry(c))()


@pytest.mark.parametrize("mode", _MODES)
def test_conv_bias_applies_its_epilogue(mode):
    import megbrain as mgb

    c = _case(n=1, g=58, sshape=(9, 9))
    x, w, _ = _arrays(c)
    b = np.linspace(-1, 1, 58, dtype=np.float32).reshape(1, 58, 1, 1)
    g = mgb.comp_graph()
    xv = mgb.make_arg(mgb.comp_node("cpu0"), g, dtype=np.float32, shape=x.shape)
    consts = [mgb.make_immutable(mgb.comp_node("cpu0"), g, v) for v in (w, b)]
    y = mgb.opr.conv_bias_activation(xv, *consts, sparse="GROUP", stride_h=2, stride_w=2,
                                     pad_h=1, pad_w=1, nonlineMode=mode)  # fmt: skip
    got = np.asarray(g.compile([xv], [mgb.copy_output(y)])(x)[0])
    np.testing.assert_allclose(got, _ref_act(ref_forward(c, x, w) + b, mode), rtol=RTOL,
                               atol=ATOL)  # fmt: skip
    assert y.node.owner.chosen_algorithm == "CHANNELWISE_NCHW"


def test_a_flipped_filter_is_read_at_every_run():
    c = dict(_case(n=1, g=5, stride=(1, 1)), flip=True)
    x, w, y = _arrays(c)
    fn = _FWD(x, w, y, *_geometry(c))
    w *= -2
    fn()
    np.testing.assert_allclose(y, ref_forward(c, x, w), rtol=RTOL, atol=ATOL)


@st.composite
def rows3_cases(draw):
    # the 3x3, padding-1, stride-1-or-2 layers the loop reading the source in place computes:
    # planes from 1x1 up to wider than two vectors, odd channel counts
    s = draw(st.sampled_from((1, 2)))
    return _case(n=draw(st.integers(1, 2)), g=draw(st.integers(1, 70)), stride=(s, s),
                 sshape=(draw(st.integers(1, 16)), draw(st.integers(1, 40))),
                 flip=draw(st.booleans()), seed=draw(st.integers(0, 2**16)))  # fmt: skip


@settings(max_examples=25, deadline=None)
@given(c=rows3_cases(), mode=st.sampled_from((None, *_MODES, "RELU6")),
       threads=st.integers(1, 2))  # fmt: skip
def test_3x3_layers_read_in_place_match_float64(c, mode, threads):
    x, w, y = _arrays(c)
    x *= 4
    bias = np.random.default_rng(c["seed"] + 1).uniform(-1, 1, y.shape[1]).astype(np.float32)
    ep = None if mode is None else Epilogue(bias, mode in ("RELU", "RELU6"), mode == "H_SWISH",
                                            relu6=mode == "RELU6")  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv_common, "THREADS", threads)
        mp.setattr(conv_channelwise, "_MIN_SPLIT_PLANES", 1)
        mp.setattr(conv_channelwise, "_MIN_SPLIT_MACS", 0)
        _FWD(x, w, y, *_geometry(c), epilogue=ep)()
    if mode == "RELU6":
        want = np.clip(ref_forward(c, x, w) + bias[:, None, None], 0, 6)
    else:
        want = _want(c, x, w, bias, mode)
    np.testing.assert_allclose(y, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("case", [dict(g=116, sshape=(14, 14), stride=(1, 1)),
                                  dict(g=58, sshape=(56, 56), stride=(2, 2)),
                                  dict(g=232, sshape=(7, 7), stride=(1, 1))])  # fmt: skip
def test_shufflenet_3x3_layers_one_and_two_threads_give_the_same_bits(case):
    c = _case(n=1, **case)
    x, w, y = _arrays(c)
    ep = Epilogue(np.linspace(-1, 1, y.shape[1], dtype=np.float32), False, True)
    got = outputs_by_threads(lambda: _FWD(x, w, y, *_geometry(c), epilogue=ep)(), y,
                             (conv_channelwise, "_MIN_SPLIT_PLANES", 1),
                             (conv_channelwise, "_MIN_SPLIT_MACS", 0))  # fmt: skip
    np.testing.assert_array_equal(got[0], got[1])
    want = _ref_act(ref_forward(c, x, w) + ep.bias[:, None, None], "H_SWISH")
    np.testing.assert_allclose(got[0], want, rtol=RTOL, atol=ATOL)


def test_a_silu_tail_on_a_3x3_layer_matches_float64():
    # the loop reading in place applies no SiLU: the phase-split loop computes such a layer
    c = _case(g=13, sshape=(9, 11), stride=(1, 1))
    x, w, y = _arrays(c)
    bias = np.linspace(-1, 1, 13, dtype=np.float32)
    _FWD(x, w, y, *_geometry(c), epilogue=Epilogue(bias, False, silu=True))()
    v = ref_forward(c, x, w) + bias[:, None, None]
    np.testing.assert_allclose(y, v / (1 + np.exp(-v)), rtol=RTOL, atol=ATOL)
