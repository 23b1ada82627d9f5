"""The direct NCHW pointwise convolution (megbrain.kernels.conv.pointwise, DIRECT_POINTWISE)
against the float64 reference: drawn batches, groups, channel counts (odd ones, not multiples
of the tile), plane sizes (whole tiles, a last tile overlapping the one before, one vector);
its epilogue (bias, ReLU, H_SWISH); strided operands; thread splits; no allocation per run;
HEURISTIC's choice; through ConvBias."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_conv_algos import ATOL, RTOL, assert_allocates_nothing, ref_forward
from test_conv_nchw8c import _arrays as _source_and_filter
from test_conv_nchw8c import _geometry, _ref_act

from megbrain.kernels import tiled_jit, workspace
from megbrain.kernels.conv import common as conv_common
from megbrain.kernels.conv import pointwise as conv_pointwise
from megbrain.kernels.conv import registry as conv_algos
from megbrain.kernels.conv.epilogue import Epilogue

_FWD = conv_pointwise.bind_pointwise_forward
_MODES = ("IDENTITY", "RELU", "H_SWISH")


def _case(n=1, g=1, icg=24, ocg=58, sshape=(7, 9), seed=5):
    return dict(n=n, g=g, icg=icg, ocg=ocg, fshape=(1, 1), stride=(1, 1), pad=(0, 0),
                dilate=(1, 1), sshape=sshape, oshape=sshape, flip=False, seed=seed)  # fmt: skip


@st.composite
def pointwise_cases(draw):
    lanes = tiled_jit.vector_width()
    h = draw(st.integers(1, 12))
    w = draw(st.integers(-(-lanes // h), 40))  # at least one vector of positions
    return _case(n=draw(st.integers(1, 3)), g=draw(st.integers(1, 3)),
                 icg=draw(st.integers(1, 70)), ocg=draw(st.integers(1, 37)), sshape=(h, w),
                 seed=draw(st.integers(0, 2**16)))  # fmt: skip


def _arrays(c):
    x, w = _source_and_filter(c)
    return x, w, np.full((c["n"], c["g"] * c["ocg"], *c["oshape"]), np.nan, np.float32)


def _epilogue(c, y, mode):
    bias = np.random.default_rng(c["seed"] + 1).uniform(-1, 1, y.shape[1]).astype(np.float32)
    ep = None if mode is None else Epilogue(bias, mode == "RELU", mode == "H_SWISH")
    return ep, bias


def _want(c, x, w, bias, mode):
    got = ref_forward(c, x, w)
    return got if mode is None else _ref_act(got + bias[:, None, None], mode)


@settings(max_examples=80, deadline=None)
@given(c=pointwise_cases(), mode=st.sampled_from((None, *_MODES)), threads=st.integers(1, 3))
def test_forward_and_epilogue_match_float64(c, mode, threads):
    x, w, y = _arrays(c)
    ep, bias = _epilogue(c, y, mode)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv_common, "THREADS", threads)
        mp.setattr(conv_pointwise, "_MIN_SPLIT_BLOCKS", 1)
        _FWD(x, w, y, *_geometry(c), epilogue=ep)()
    np.testing.assert_allclose(y, _want(c, x, w, bias, mode), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("mode", _MODES)
@pytest.mark.parametrize("shape", [(24, 58, (56, 56)), (116, 116, (14, 14)), (232, 232, (7, 7))])
def test_shufflenet_layers_match_float64(shape, mode):
    icg, ocg, sshape = shape
    c = _case(icg=icg, ocg=ocg, sshape=sshape)
    x, w, y = _arrays(c)
    ep, bias = _epilogue(c, y, mode)
    _FWD(x, w, y, *_geometry(c), epilogue=ep)()
    np.testing.assert_allclose(y, _want(c, x, w, bias, mode), rtol=RTOL, atol=ATOL)


def test_strided_operands_match_float64():
    # the channel split of a ShuffleNet block: a slice of a larger source's channels, an
    # output into a slice of a larger array's channels, a batch-major or channel-major layout
    c = _case(n=2, icg=29, ocg=13, sshape=(6, 7))
    x, w, _ = _arrays(c)
    big = np.zeros((2, 70, 6, 7), np.float32)
    big[:, 3:61:2] = x
    ybig = np.full((13, 2, 6, 7), np.nan, np.float32)
    ys = np.swapaxes(ybig, 0, 1)
    _FWD(big[:, 3:61:2], w, ys, *_geometry(c))()
    np.testing.assert_allclose(ys, ref_forward(c, x, w), rtol=RTOL, atol=ATOL)
    wt = np.swapaxes(np.swapaxes(w, 1, 2).copy(), 1, 2)  # a non-contiguous filter
    y2 = np.empty_like(ys)
    _FWD(x, wt, y2, *_geometry(c))()
    np.testing.assert_array_equal(y2, ys)


def test_nan_propagates_through_the_epilogue():
    c = _case(icg=3, ocg=5, sshape=(4, 8))
    x, w, y = _arrays(c)
    x[0, 1, 2, 3] = np.nan
    for mode in _MODES:
        ep, _ = _epilogue(c, y, mode)
        _FWD(x, w, y, *_geometry(c), epilogue=ep)()
        assert np.isnan(y[0, :, 2, 3]).all()
        assert np.isfinite(np.delete(y.reshape(5, -1), 2 * 8 + 3, 1)).all()


def test_unusable_geometry_is_refused():
    x, w, y = _arrays(_case(icg=3, ocg=4, sshape=(3, 3)))  # fewer positions than a vector
    assert not conv_pointwise.usable_pointwise_forward(x, w, y, *_geometry(_case()))
    with pytest.raises(ValueError, match="DIRECT_POINTWISE"):
        _FWD(x, w, y, *_geometry(_case()))
    c = _case()
    x, w, y = _arrays(c)
    assert not conv_pointwise.usable_pointwise_forward(x.astype(np.float64), w, y, *_geometry(c))
    assert not conv_pointwise.usable_pointwise_forward(x[..., ::2], w, y[..., ::2],
                                                       *_geometry(c))  # fmt: skip
    c3 = dict(c, fshape=(3, 3), pad=(1, 1))
    x3, w3 = _source_and_filter(c3)
    assert not conv_pointwise.usable_pointwise_forward(x3, w3, y, *_geometry(c3))


def test_nothing_is_allocated_per_run_and_runs_are_reproducible():
    c = _case(n=2, icg=58, ocg=58, sshape=(28, 28))
    x, w, y = _arrays(c)
    ep, bias = _epilogue(c, y, "RELU")
    fn = bound_in_a_plan(lambda: _FWD(x, w, y, *_geometry(c), epilogue=ep))
    fn()
    first = y.copy()
    assert_allocates_nothing(fn)
    assert np.array_equal(y, first)
    np.testing.assert_allclose(y, _want(c, x, w, bias, "RELU"), rtol=RTOL, atol=ATOL)


def bound_in_a_plan(bind):
    """``bind()``'s step, its workspace carved from one buffer of 0xFF bytes (as a memory
    plan gives it: every byte it reads must have been written by the step first)."""
    rec = workspace.Recorder()
    with workspace.allocating(rec):
        bind()
    buf = np.full(max(rec.nbytes, 1), 0xFF, np.uint8)
    with workspace.allocating(workspace.Carver(buf)):
        return bind()


@pytest.mark.parametrize(
    "kw, chosen",
    [
        (dict(icg=24, ocg=58, sshape=(56, 56)), True),
        (dict(icg=232, ocg=232, sshape=(7, 7)), True),
        (dict(icg=512, ocg=512, sshape=(7, 7)), False),  # a long reduction: the GEMM's
        (dict(icg=16, ocg=16, sshape=(2, 3)), False),  # fewer positions than a vector
    ],
)
def test_heuristic_takes_short_reductions(kw, chosen):
    c = _case(**kw)
    x, w, y = _arrays(c)
    name = conv_algos.select("forward", x, w, y, *_geometry(c)).name
    assert (name == "DIRECT_POINTWISE") == chosen, name


@pytest.mark.parametrize("mode", _MODES)
def test_conv_bias_applies_its_epilogue(mode):
    import megbrain as mgb

    c = _case(icg=29, ocg=58, sshape=(9, 9))
    x, w, _ = _arrays(c)
    b = np.linspace(-1, 1, 58, dtype=np.float32).reshape(1, 58, 1, 1)
    g = mgb.comp_graph()
    xv = mgb.make_arg(mgb.comp_node("cpu0"), g, dtype=np.float32, shape=x.shape)
    consts = [mgb.make_immutable(mgb.comp_node("cpu0"), g, v) for v in (w[0], b)]
    y = mgb.opr.conv_bias_activation(xv, *consts, nonlineMode=mode)
    got = np.asarray(g.compile([xv], [mgb.copy_output(y)])(x)[0])
    want = _ref_act(ref_forward(c, x, w) + b, mode)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    assert y.node.owner.chosen_algorithm == "DIRECT_POINTWISE"


def test_a_strided_filter_is_read_at_every_run():
    c = _case(icg=5, ocg=7, sshape=(4, 8))
    x, w, y = _arrays(c)
    wt = np.swapaxes(np.swapaxes(w, 1, 2).copy(), 1, 2)  # not C-contiguous: copied per run
    fn = _FWD(x, wt, y, *_geometry(c))
    wt *= -2
    fn()
    np.testing.assert_allclose(y, ref_forward(c, x, wt), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("tile", sorted({t for ts in conv_pointwise.TILES.values() for t in ts}))
def test_every_tile_matches_float64(tile):
    # each tile of the menu, on a plane with a last tile overlapping the one before and a
    # channel count leaving padded rows; ReLU6 after ReLU
    if tile not in conv_pointwise.TILES[tiled_jit.vector_width()]:
        pytest.skip("not a tile of this host's vector width")
    c = _case(n=2, g=2, icg=19, ocg=29, sshape=(5, 2 * tiled_jit.vector_width() * tile[1] // 5))
    x, w, y = _arrays(c)
    bias = np.random.default_rng(3).uniform(-1, 1, y.shape[1]).astype(np.float32)
    x *= 8
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(conv_pointwise.TILES, tiled_jit.vector_width(), (tile,))
        _FWD(x, w, y, *_geometry(c), epilogue=Epilogue(bias, True, relu6=True))()
    want = np.clip(ref_forward(c, x, w) + bias[:, None, None], 0, 6)
    assert (want == 6).any() and (want == 0).any()
    np.testing.assert_allclose(y, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("shape", [(58, 58, (28, 28)), (232, 232, (7, 7))])
def test_one_and_two_threads_give_the_same_bits(shape):
    icg, ocg, sshape = shape
    c = _case(icg=icg, ocg=ocg, sshape=sshape)
    x, w, y = _arrays(c)
    ep, _ = _epilogue(c, y, "H_SWISH")
    one, two = outputs_by_threads(lambda: _FWD(x, w, y, *_geometry(c), epilogue=ep)(), y,
                                  (conv_pointwise, "_MIN_SPLIT_BLOCKS", 0))  # fmt: skip
    np.testing.assert_array_equal(one, two)


def outputs_by_threads(run, y, *splits) -> list:
    """``y`` after ``run()`` at 1 and at 2 threads, each of ``splits`` (module, name, value)
    set so that even a small layer is split."""
    got = []
    for threads in (1, 2):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(conv_common, "THREADS", threads)
            for split in splits:
                mp.setattr(*split)
            run()
        got.append(y.copy())
    return got


def test_tiles_cover_the_channels_and_positions():
    for n, g, ocg, k, positions, threads in [(1, 1, 58, 24, 3136, 2), (1, 1, 232, 232, 49, 2),
                                             (2, 3, 5, 7, 16, 1), (1, 1, 1, 1, 17, 3)]:  # fmt: skip
        tl = conv_pointwise.tiles_for(n, g, ocg, k, positions, threads)
        assert (tl.r, tl.b) in conv_pointwise.TILES[tiled_jit.vector_width()]
        assert tl.nr * tl.r >= ocg > (tl.nr - 1) * tl.r
        npos = tl.b * tiled_jit.vector_width()
        assert npos <= positions
        assert tl.nb * tl.tpb >= -(-positions // npos) > (tl.nb - 1) * tl.tpb


def test_the_benchmark_runs_and_agrees_with_onnxruntime(benchmark_module):
    # benchmarks/shufflenet_nchw.py on a 1x1 and a depthwise layer, so that it cannot rot
    # (it checks each output against onnxruntime's); times unchecked
    for peer in ("onnx", "onnxruntime"):
        pytest.importorskip(peer)
    rows = benchmark_module("shufflenet_nchw").main(["--smoke"])
    assert [(r["name"], min(r["ours"], r["ort"], r["ort_run"]) > 0) for r in rows] == [
        ("DIRECT_POINTWISE", True), ("CHANNELWISE_NCHW", True)]
