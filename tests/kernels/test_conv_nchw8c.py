"""The direct NCHW8c convolution (megbrain.kernels.conv_nchw8c) against the float64
reference: drawn batches, groups, channel blocks, filter sizes, strides, paddings,
dilations and flips; strided and read-only operands; the workspace contract; the constant
filter packed once (and a changing filter followed on every run otherwise); sources of
fewer than 8 channels (planes of one channel); its HEURISTIC rule; the
operator telling it which filters are constant (ImmutableTensor, weight_preprocess); the
ConvBias epilogues (bias and ReLU applied as the output is written) of DIRECT_NCHW8C and
CONV1X1_GEMM."""

from __future__ import annotations

import os
import sys
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_conv_algos import ATOL, RTOL, ref_forward

import megbrain as mgb
from megbrain.kernels import workspace
from megbrain.kernels.conv import common as conv_common
from megbrain.kernels.conv import epilogue as conv_epilogue
from megbrain.kernels.conv import im2col as conv_im2col
from megbrain.kernels.conv import nchw8c as conv_nchw8c
from megbrain.kernels.conv import registry as conv_algos
from megbrain.kernels.conv.constant_operands import constant_filter, filter_is_constant

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "opr"))

_BIND = conv_nchw8c.bind_nchw8c_forward
_ONE = (1, 1)


@st.composite
def cases(draw):
    fshape = (draw(st.integers(1, 5)), draw(st.integers(1, 5)))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dilate = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    pad = (draw(st.integers(0, 3)), draw(st.integers(0, 3)))
    # at least one output position: size + 2 pad >= dilate (f - 1) + 1
    sshape = tuple(
        draw(st.integers(max(1, d * (f - 1) + 1 - 2 * p), 13))
        for f, p, d in zip(fshape, pad, dilate)
    )
    return dict(
        n=draw(st.integers(1, 3)),
        g=draw(st.integers(1, 2)),
        icg=draw(st.sampled_from([8, 16, 1, 3, 5])),  # not a multiple of 8: planes of 1
        ocg=16 * draw(st.integers(1, 2)),
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


def _arrays(c):
    rng = np.random.default_rng(c["seed"])
    x = rng.uniform(-1, 1, (c["n"], c["g"] * c["icg"], *c["sshape"])).astype(np.float32)
    w = rng.uniform(-1, 1, (c["g"], c["ocg"], c["icg"], *c["fshape"])).astype(np.float32)
    return x, w


def _geometry(c):
    return c["stride"], c["pad"], c["dilate"], c["flip"]


def _out(c):
    return np.full((c["n"], c["g"] * c["ocg"], *c["oshape"]), np.nan, np.float32)


def _case(n=2, g=1, icg=8, ocg=16, sshape=(7, 9), fshape=(3, 3), pad=(1, 1), flip=False, seed=5,
          stride=_ONE):  # fmt: skip
    oshape = tuple(conv_common.conv_out_size(s, f, t, p, 1)
                   for s, f, t, p in zip(sshape, fshape, stride, pad))  # fmt: skip
    return dict(n=n, g=g, icg=icg, ocg=ocg, fshape=fshape, stride=stride, pad=pad, dilate=_ONE,
                sshape=sshape, oshape=oshape, flip=flip, seed=seed)  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(c=cases(), constant=st.booleans())
def test_forward_matches_float64(c, constant):
    x, w = _arrays(c)
    y = _out(c)
    assert conv_nchw8c.usable_nchw8c_forward(x, w, y, *_geometry(c))
    with constant_filter(constant):
        step = _BIND(x, w, y, *_geometry(c))
    step()
    np.testing.assert_allclose(y, ref_forward(c, x, w), rtol=RTOL, atol=ATOL)
    step()  # a second run (the constant filter is not packed again) gives the same bits
    np.testing.assert_allclose(y, ref_forward(c, x, w), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("stride", [(1, 1), (2, 2)])
def test_a_wide_layer_matches_float64(stride):
    # several units per thread, full and partial row bands, four channel blocks
    c = _case(n=1, icg=32, ocg=48, sshape=(30, 17), stride=stride)
    x, w = _arrays(c)
    y = _out(c)
    _BIND(x, w, y, *_geometry(c))()
    np.testing.assert_allclose(y, ref_forward(c, x, w), rtol=RTOL, atol=ATOL)


def test_strided_and_read_only_operands():
    c = _case(g=2)
    x, w = _arrays(c)
    xs = np.repeat(x, 2, axis=1)[:, ::2]  # channel stride 2 planes
    ws = np.moveaxis(np.ascontiguousarray(np.moveaxis(w, 2, 4)), 4, 2)  # non-contiguous
    assert not xs.flags.c_contiguous and not ws.flags.c_contiguous
    xs.flags.writeable = ws.flags.writeable = False
    y = _out(c)
    _BIND(xs, ws, y, *_geometry(c))()
    np.testing.assert_allclose(y, ref_forward(c, x, w), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("stride", [(1, 1), (2, 2), (1, 2), (3, 2)])
def test_a_first_layer_reads_a_contiguous_and_a_strided_source_alike(stride):
    # planes of one channel: a C-contiguous source is read flat (stride 1 or 2 along rows),
    # another through its row views; the packed planes, and so the sums, are the same
    c = _case(n=2, icg=3, ocg=16, sshape=(11, 13), stride=stride, pad=(1, 2))
    x, w = _arrays(c)
    strided = np.repeat(x, 2, axis=3)[..., ::2]
    assert not strided.flags.c_contiguous
    ys = []
    for src in (x, strided):
        ys.append(_out(c))
        _BIND(src, w, ys[-1], *_geometry(c))()
    assert np.array_equal(ys[0], ys[1])
    np.testing.assert_allclose(ys[0], ref_forward(c, x, w), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("constant", [False, True])
def test_workspace_is_written_before_read_and_nothing_is_allocated(constant):
    c = _case(n=3, g=2, pad=(2, 1), flip=True, stride=(2, 1))
    x, w = _arrays(c)
    y = np.empty((c["n"], c["g"] * c["ocg"], *c["oshape"]), np.float32)

    def bind():
        with constant_filter(constant):
            return _BIND(x, w, y, *_geometry(c))

    rec = workspace.Recorder()
    with workspace.allocating(rec):
        bind()
    buf = np.empty(max(rec.nbytes, 1), np.uint8)
    with workspace.allocating(workspace.Carver(buf)):
        step = bind()
    step()  # compiles; packs a constant filter
    tracemalloc.start()
    try:
        for _ in range(2):
            buf[:] = 0xFF  # NaN in every workspace byte, the packed input's borders too
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            step()
            assert tracemalloc.get_traced_memory()[1] - before < 4096
            np.testing.assert_allclose(y, ref_forward(c, x, w), rtol=RTOL, atol=ATOL)
    finally:
        tracemalloc.stop()


def test_a_constant_filter_is_packed_at_the_first_run_only():
    c = _case()
    x, w = _arrays(c)
    first = ref_forward(c, x, w)
    y = _out(c)
    with constant_filter(True):
        step = _BIND(x, w, y, *_geometry(c))
    w[:] = 0  # before the first run: the first run's values are the ones packed
    step()
    np.testing.assert_allclose(y, 0, atol=0)
    w[:] = _arrays(c)[1]
    step()
    np.testing.assert_allclose(y, 0, atol=0)  # not packed again
    assert not np.allclose(first, 0)


def test_a_filter_not_declared_constant_is_read_on_every_run():
    c = _case()
    x, w = _arrays(c)
    y = _out(c)
    step = _BIND(x, w, y, *_geometry(c))
    step()
    np.testing.assert_allclose(y, ref_forward(c, x, w), rtol=RTOL, atol=ATOL)
    w *= -2
    step()
    np.testing.assert_allclose(y, ref_forward(c, x, w), rtol=RTOL, atol=ATOL)


def test_runs_are_bitwise_reproducible_over_thread_counts(monkeypatch):
    from megbrain.kernels import parallel

    c = _case(n=3, icg=16, ocg=32, sshape=(12, 13))
    x, w = _arrays(c)
    ys = []
    for threads in (1, 2, 3):
        monkeypatch.setattr(parallel, "num_threads", lambda t=threads: t)
        ys.append(_out(c))
        _BIND(x, w, ys[-1], *_geometry(c))()
    assert np.array_equal(ys[0], ys[1]) and np.array_equal(ys[1], ys[2])


@pytest.mark.parametrize("icg,stride,g", [(3, (2, 2), 1), (8, (1, 1), 2), (16, (2, 1), 1)])
def test_wide_units_equal_units_of_16_channels_bit_for_bit(monkeypatch, icg, stride, g):
    # 32 output channels a unit (AVX-512 hosts) or 16 (the others), either forced here; a
    # source of 3 channels is packed as planes of one channel
    c = _case(n=2, g=g, icg=icg, ocg=64, sshape=(13, 11), stride=stride)
    x, w = _arrays(c)
    outs = []
    for wide in (False, True):
        monkeypatch.setattr(conv_nchw8c, "wide_units", lambda ocb, v=wide: v)
        outs.append(_out(c))
        _BIND(x, w, outs[-1], *_geometry(c))()
    assert np.array_equal(outs[0], outs[1])
    np.testing.assert_allclose(outs[1], ref_forward(c, x, w), rtol=RTOL, atol=ATOL)


def test_each_thread_takes_its_own_range_of_units_first_then_the_others():
    from megbrain.kernels.conv.loops import nchw8c as loops

    loops._compiled()
    # two ranges, [0, 3) and [3, 7), as (next, end) pairs
    counter = np.array([0, 3, 3, 7], np.int64)
    got = [loops._take(counter, 1) for _ in range(8)]
    assert got == [3, 4, 5, 6, 0, 1, 2, -1]
    assert loops._take(counter, 0) == -1


def test_units_as_they_go_gives_every_unit_to_exactly_one_part(monkeypatch):
    from megbrain.kernels import parallel

    monkeypatch.setattr(parallel, "num_threads", lambda: 3)
    counters, seen = [], []

    def bind_part(counter, me):
        counters.append(counter)

        def part():
            while (u := int(counter[2 * me])) < counter[2 * me + 1]:
                counter[2 * me] += 1  # one thread per range here: no race to guard
                seen.append((me, u))

        return part

    step = conv_nchw8c.units_as_they_go(10, bind_part)
    for _ in range(2):  # the counter is reset at every run
        seen.clear()
        step()
        assert sorted(u for _, u in seen) == list(range(10))
        assert {me for me, u in seen if u < 3} == {0} and {me for me, u in seen if u >= 6} == {2}
    assert all(c is counters[0] for c in counters)


@pytest.mark.parametrize(
    "change",
    [
        dict(dtype=np.float64),
        dict(reach=True),
        dict(ocg=8),
        dict(pad=(conv_nchw8c.MAX_PAD + 1, 0)),
        dict(out_view=True),
    ],
)
def test_unusable_geometry_is_refused(change):
    icg, ocg = change.get("icg", 8), change.get("ocg", 16)
    stride, pad = change.get("stride", _ONE), change.get("pad", (1, 1))
    dt = change.get("dtype", np.float32)
    f, dil = (3, conv_nchw8c.MAX_PAD // 2 + 1) if change.get("reach") else (3, 1)
    x = np.zeros((1, icg, 6 * dil, 6), dt)
    w = np.zeros((1, ocg, icg, f, f), dt)
    dilate = (dil, 1)
    oshape = tuple(conv_common.conv_out_size(x.shape[2 + i], f, stride[i], pad[i], dilate[i])
                   for i in range(2))  # fmt: skip
    y = np.zeros((1, ocg, *oshape), dt)
    if change.get("out_view"):
        y = np.zeros((1, ocg, oshape[0], oshape[1] + 1), dt)[..., 1:]
    assert not conv_nchw8c.usable_nchw8c_forward(x, w, y, stride, pad, dilate)
    with pytest.raises(ValueError, match=r"DIRECT_NCHW8C.*src \(1, "):
        _BIND(x, w, y, stride, pad, dilate)


def test_mismatched_shapes_are_refused():
    c = _case()
    x, w = _arrays(c)
    with pytest.raises(ValueError, match="Convolution: src"):
        _BIND(x, w, _out(c)[:, :, 1:], *_geometry(c))


# ---- HEURISTIC and the operator ------------------------------------------------------------
def _chosen(c, constant):
    x, w = _arrays(c)
    with constant_filter(constant):
        return conv_algos.select("forward", x, w, _out(c), *_geometry(c)).name


def test_heuristic_takes_it_for_constant_filters_only():
    c = _case(icg=16, ocg=32, sshape=(14, 14))
    assert _chosen(c, True) == "DIRECT_NCHW8C"
    assert _chosen(c, False) != "DIRECT_NCHW8C"
    assert not filter_is_constant()  # the block restored the default
    # pointwise convolutions go to the direct NCHW pointwise kernel, strided ones and 1x1
    # ones with padding to im2col
    assert _chosen(_case(fshape=(1, 1), pad=(0, 0)), True) == "DIRECT_POINTWISE"
    assert _chosen(_case(icg=16, ocg=32, sshape=(14, 14), stride=(2, 2)), True) != "DIRECT_NCHW8C"
    assert _chosen(_case(fshape=(1, 1), pad=(1, 1)), True) != "DIRECT_NCHW8C"
    # a first layer (3 channels) takes it at stride 2 too: its im2col copies the source
    # once per filter tap
    stem = _case(icg=3, ocg=16, sshape=(32, 32), fshape=(7, 7), pad=(3, 3), stride=(2, 2))
    assert _chosen(stem, True) == "DIRECT_NCHW8C"


def test_profile_keys_tell_constant_filters_apart():
    c = _case()
    x, w = _arrays(c)
    keys = []
    for constant in (False, True):
        with constant_filter(constant):
            keys.append(conv_algos.choice_key("forward", x, w, _out(c), *_geometry(c), []))
    assert keys[0] != keys[1]


CN = "cpu0"


def _graph_conv(filter_kind, weight_preprocess=False):
    c = _case(n=1, icg=16, ocg=16, sshape=(9, 9))
    x, w = _arrays(c)
    g = mgb.comp_graph()
    if weight_preprocess:
        g.set_option("graph_opt.weight_preprocess", 1)
    xv = mgb.make_arg(CN, g, name="x", shape=x.shape)
    if filter_kind == "immutable":
        wv = mgb.make_immutable(CN, g, w[0])
    else:
        wv = mgb.make_shared(CN, value=w[0], comp_graph=g, name="w")
    y = mgb.opr.convolution(xv, wv, pad_h=1, pad_w=1)
    f = g.compile([xv], [mgb.copy_output(y)])
    got = f(x)[0]
    return c, x, w, y, got, wv, f


@pytest.mark.parametrize(
    "filter_kind, weight_preprocess, expected",
    [("immutable", False, True), ("shared", False, False), ("shared", True, True)],
)
def test_the_operator_declares_constant_filters(filter_kind, weight_preprocess, expected):
    c, x, w, y, got, _, _ = _graph_conv(filter_kind, weight_preprocess)
    np.testing.assert_allclose(np.asarray(got), ref_forward(c, x, w), rtol=RTOL, atol=ATOL)
    assert (y.node.owner.chosen_algorithm == "DIRECT_NCHW8C") == expected


def test_a_shared_filter_without_weight_preprocess_follows_its_updates():
    c, x, w, _, _, wv, f = _graph_conv("shared")
    wv.set_value(-w[0])
    np.testing.assert_allclose(np.asarray(f(x)[0]), -ref_forward(c, x, w), rtol=RTOL, atol=ATOL)


# ---- epilogues: act(conv + bias) as the output is written ----------------------------------
def _epilogue(c, mode, nan_at=None):
    bias = np.random.default_rng(c["seed"] + 1).uniform(-1, 1, (1, c["g"] * c["ocg"], 1, 1))
    bias = bias.astype(np.float32)
    if nan_at is not None:
        bias[0, nan_at] = np.nan
    out = _out(c)
    ep = conv_epilogue.for_conv_bias(mode, bias, out)
    return bias, out, ep


def _ref_act(v, mode):
    if mode == "RELU":
        return np.maximum(v, 0)
    return v * np.clip(v + 3, 0, 6) / 6 if mode == "H_SWISH" else v


def _ref_epilogue(c, x, w, bias, mode):
    return _ref_act(ref_forward(c, x, w) + bias.astype(np.float64), mode)


@pytest.mark.parametrize("mode", ["IDENTITY", "RELU", "H_SWISH"])
@pytest.mark.parametrize("stride", [(1, 1), (2, 1)])
# rows of whole vector blocks (written back transposed) and of a few last columns; planes of
# one channel (3) in units of 32 channels, as a network's first layer
@pytest.mark.parametrize("icg, ocg, sshape", [(8, 16, (7, 9)), (8, 16, (5, 37)),
                                              (3, 64, (6, 75))])  # fmt: skip
def test_direct_epilogue_matches_float64(mode, stride, icg, ocg, sshape):
    c = _case(n=2, g=2, icg=icg, ocg=ocg, stride=stride, sshape=sshape)
    x, w = _arrays(c)
    bias, y, ep = _epilogue(c, mode, nan_at=3)
    step = _BIND(x, w, y, *_geometry(c), epilogue=ep)
    step()
    ref = _ref_epilogue(c, x, w, bias, mode)
    np.testing.assert_allclose(y, ref, rtol=RTOL, atol=ATOL)  # NaN where ref is (channel 3)
    assert np.isnan(y[:, 3]).all()
    bias[0, 5] += 10  # read at every run
    step()
    np.testing.assert_allclose(y, _ref_epilogue(c, x, w, bias, mode), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("mode", ["IDENTITY", "RELU"])
@pytest.mark.parametrize("n, g", [(1, 1), (1, 2), (3, 2)])  # split products; one per thread
def test_1x1_gemm_epilogue_matches_float64(mode, n, g):
    c = _case(n=n, g=g, icg=24, ocg=40, sshape=(20, 30), fshape=(1, 1), pad=(0, 0))
    x, w = _arrays(c)
    bias, y, ep = _epilogue(c, mode, nan_at=g * 40 - 1)
    assert conv_im2col.fwd_1x1_usable(x, w, y, *_geometry(c))
    conv_im2col.fwd_1x1_gemm(x, w, y, *_geometry(c), epilogue=ep)()
    np.testing.assert_allclose(y, _ref_epilogue(c, x, w, bias, mode), rtol=RTOL, atol=ATOL)


def test_only_per_channel_identity_relu_or_hswish_epilogues_exist():
    out = np.zeros((2, 16, 3, 3), np.float32)
    per_channel = np.zeros((1, 16, 1, 1), np.float32)
    assert conv_epilogue.for_conv_bias("RELU", per_channel, out) is not None
    assert conv_epilogue.for_conv_bias("H_SWISH", per_channel, out).hswish
    assert conv_epilogue.for_conv_bias("SIGMOID", per_channel, out) is None
    assert conv_epilogue.for_conv_bias("RELU", np.zeros(out.shape, np.float32), out) is None
    assert conv_epilogue.for_conv_bias("RELU", per_channel.astype(np.float64), out) is None
    strided = np.zeros((1, 32, 1, 1), np.float32)[:, ::2]
    assert conv_epilogue.for_conv_bias("RELU", strided, out) is not None  # a strided view


@pytest.mark.parametrize("mode", ["IDENTITY", "RELU", "SIGMOID", "H_SWISH"])
@pytest.mark.parametrize("fshape", [(1, 1), (3, 3)])
def test_conv_bias_operator_matches_float64(mode, fshape):
    # H_SWISH: in DIRECT_NCHW8C's epilogue (3x3) and DIRECT_POINTWISE's (1x1)
    pad = fshape[0] // 2
    c = _case(n=1, icg=16, ocg=32, sshape=(9, 9), fshape=fshape, pad=(pad, pad))
    x, w = _arrays(c)
    bias = np.random.default_rng(2).uniform(-1, 1, (1, 32, 1, 1)).astype(np.float32)
    g = mgb.comp_graph()
    xv = mgb.make_arg(CN, g, name="x", shape=x.shape)
    y = mgb.opr.conv_bias_activation(
        xv, mgb.make_immutable(CN, g, w[0]), mgb.make_immutable(CN, g, bias),
        pad_h=pad, pad_w=pad, nonlineMode=mode,
    )  # fmt: skip
    got = np.asarray(g.compile([xv], [mgb.copy_output(y)])(x)[0])
    pre = ref_forward(c, x, w) + bias
    ref = 1 / (1 + np.exp(-pre)) if mode == "SIGMOID" else _ref_act(pre, mode)
    np.testing.assert_allclose(got, ref, rtol=RTOL, atol=ATOL)
    expected = "DIRECT_POINTWISE" if fshape == (1, 1) else "DIRECT_NCHW8C"
    assert y.node.owner.chosen_algorithm == expected
