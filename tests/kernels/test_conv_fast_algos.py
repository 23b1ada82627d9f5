"""The fast convolution algorithms (Winograd F(2x2, 3x3): megbrain.kernels.conv.winograd)
against the float64 reference: drawn batches, channels, groups, sizes, paddings, flips and
dtypes; batch chunks and thread splits; the workspace contract (every workspace byte written
before it is read, nothing allocated per run); their registration and HEURISTIC rule; the
gradients through the operators."""

from __future__ import annotations

import os
import sys
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_conv_algos import ATOL, RTOL, ref_backward_data, ref_forward

from megbrain.kernels import workspace
from megbrain.kernels.conv import common as conv_common
from megbrain.kernels.conv import direct as conv_direct
from megbrain.kernels.conv import registry as conv_algos
from megbrain.kernels.conv import winograd as conv_winograd

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "opr"))
from opr_harness import check_grad  # noqa: E402

_FWD = conv_winograd.bind_winograd_forward
_BWD = conv_winograd.bind_winograd_backward_data
_ONE = (1, 1)


@st.composite
def winograd_cases(draw, max_pad=3):
    pad = (draw(st.integers(0, max_pad)), draw(st.integers(0, max_pad)))
    sshape = tuple(draw(st.integers(max(1, 3 - 2 * p), 9)) for p in pad)
    return dict(
        n=draw(st.integers(1, 3)),
        g=draw(st.integers(1, 2)),
        icg=draw(st.integers(1, 5)),
        ocg=draw(st.integers(1, 5)),
        fshape=(3, 3),
        stride=_ONE,
        pad=pad,
        dilate=_ONE,
        sshape=sshape,
        oshape=tuple(conv_common.conv_out_size(s, 3, 1, p, 1) for s, p in zip(sshape, pad)),
        flip=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
    )


def _arrays(c, dtype=np.float32):
    rng = np.random.default_rng(c["seed"])
    x = rng.uniform(-1, 1, (c["n"], c["g"] * c["icg"], *c["sshape"])).astype(dtype)
    w = rng.uniform(-1, 1, (c["g"], c["ocg"], c["icg"], 3, 3)).astype(dtype)
    dy = rng.uniform(-1, 1, (c["n"], c["g"] * c["ocg"], *c["oshape"])).astype(dtype)
    return x, w, dy


def _geometry(c):
    return c["stride"], c["pad"], c["dilate"], c["flip"]


def _tol(dtype):
    # float16 operands are rounded to float16 at the end (the compute is float32)
    return dict(rtol=RTOL, atol=ATOL) if dtype != np.float16 else dict(rtol=2e-3, atol=2e-2)


_DTYPES = st.sampled_from([np.float32, np.float32, np.float64, np.float16])


@settings(max_examples=60, deadline=None)
@given(c=winograd_cases(), dtype=_DTYPES)
def test_forward_matches_float64(c, dtype):
    x, w, dy = _arrays(c, dtype)
    y = np.full(dy.shape, np.nan, dtype)
    assert conv_winograd.usable_winograd_forward(x, w, y, *_geometry(c))
    _FWD(x, w, y, *_geometry(c))()
    np.testing.assert_allclose(y, ref_forward(c, x, w), **_tol(dtype))


@settings(max_examples=60, deadline=None)
@given(c=winograd_cases(max_pad=2), dtype=_DTYPES)
def test_backward_data_matches_float64(c, dtype):
    x, w, dy = _arrays(c, dtype)
    gx = np.full(x.shape, np.nan, dtype)
    assert conv_winograd.usable_winograd_backward_data(w, dy, gx, *_geometry(c))
    _BWD(w, dy, gx, *_geometry(c))()
    np.testing.assert_allclose(gx, ref_backward_data(c, w, dy), **_tol(dtype))


@settings(max_examples=20, deadline=None)
@given(c=winograd_cases(max_pad=2), band=st.integers(1, 12), threads=st.integers(1, 3))
def test_bands_and_thread_splits_match_float64(c, band, threads):
    c = dict(c, n=3)
    x, w, dy = _arrays(c)
    y, gx = np.full(dy.shape, np.nan, np.float32), np.full(x.shape, np.nan, np.float32)
    with pytest.MonkeyPatch.context() as mp:
        # bands of one to three tile rows (a short last band) or of whole samples (two and
        # one), split over threads
        per_tile = 16 * c["g"] * (c["icg"] + c["ocg"]) * 4
        tw = (c["oshape"][1] + 1) // 2
        mp.setattr(conv_winograd, "BAND_BYTES", per_tile * tw * band)
        mp.setattr(conv_winograd, "MIN_BAND_TILES", 1)
        mp.setattr(conv_common, "THREADS", threads)
        _FWD(x, w, y, *_geometry(c))()
        _BWD(w, dy, gx, *_geometry(c))()
    np.testing.assert_allclose(y, ref_forward(c, x, w), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(gx, ref_backward_data(c, w, dy), rtol=RTOL, atol=ATOL)


def _case(n=2, icg=3, ocg=4, sshape=(7, 6), pad=(1, 1), g=1, flip=False, seed=3):
    oshape = tuple(conv_common.conv_out_size(s, 3, 1, p, 1) for s, p in zip(sshape, pad))
    return dict(n=n, g=g, icg=icg, ocg=ocg, fshape=(3, 3), stride=_ONE, pad=pad, dilate=_ONE,
                sshape=sshape, oshape=oshape, flip=flip, seed=seed)  # fmt: skip


def test_wide_reduction_matches_float64():
    # 64 input channels: 576 products per output, as in the benchmarks' 8x64x56x56 layer
    c = _case(n=1, icg=64, ocg=8, sshape=(10, 9))
    x, w, dy = _arrays(c)
    y = np.empty(dy.shape, np.float32)
    _FWD(x, w, y, *_geometry(c))()
    np.testing.assert_allclose(y, ref_forward(c, x, w), rtol=RTOL, atol=ATOL)


def test_strided_operands_match_float64():
    # a strided source and output (the output goes through a staging buffer), a transposed
    # filter view
    c = _case(icg=2, ocg=3)
    x, w, dy = _arrays(c)
    xs = np.repeat(x, 2, axis=1)[:, ::2]
    ws = np.ascontiguousarray(w.swapaxes(1, 2)).swapaxes(1, 2)
    base = np.full((c["n"], 6, *c["oshape"]), np.nan, np.float32)
    y = base[:, ::2]
    _FWD(xs, ws, y, *_geometry(c))()
    np.testing.assert_allclose(y, ref_forward(c, x, w), rtol=RTOL, atol=ATOL)
    assert np.isnan(base[:, 1::2]).all()


@pytest.mark.parametrize(
    "change",
    [dict(stride=(2, 1)), dict(dilate=(1, 2)), dict(fshape=(5, 5)), dict(dtype=np.int32),
     dict(ndim=3)],  # fmt: skip
)
def test_unusable_geometry_is_refused(change):
    dtype = change.get("dtype", np.float32)
    fshape = change.get("fshape", (3, 3))
    stride, dilate = change.get("stride", _ONE), change.get("dilate", _ONE)
    if change.get("ndim") == 3:
        x, w = np.zeros((1, 2, 5), dtype), np.zeros((1, 2, 2, 3), dtype)
        y, stride, pad, dilate = np.zeros((1, 2, 5), dtype), (1,), (1,), (1,)
    else:
        x, w = np.zeros((1, 2, 9, 9), dtype), np.zeros((1, 2, 2, *fshape), dtype)
        pad = (1, 1)
        oshape = [
            conv_common.conv_out_size(9, f, s, 1, d) for f, s, d in zip(fshape, stride, dilate)
        ]
        y = np.zeros((1, 2, *oshape), dtype)
    assert not conv_winograd.usable_winograd_forward(x, w, y, stride, pad, dilate)
    assert not conv_winograd.usable_winograd_backward_data(w, y, x, stride, pad, dilate)
    with pytest.raises(ValueError, match="winograd"):
        _FWD(x, w, y, stride, pad, dilate)
    with pytest.raises(ValueError, match="winograd"):
        _BWD(w, y, x, stride, pad, dilate)


def test_backward_data_refuses_a_padding_over_two():
    c = _case(pad=(3, 1), sshape=(4, 6))
    x, w, dy = _arrays(c)
    assert not conv_winograd.usable_winograd_backward_data(w, dy, x, *_geometry(c))
    with pytest.raises(ValueError, match="pad <= 2"):
        _BWD(w, dy, x, *_geometry(c))


def test_mismatched_shapes_are_refused():
    c = _case()
    x, w, dy = _arrays(c)
    with pytest.raises(ValueError, match="Convolution: src"):
        _FWD(x, w, dy[:, :, 1:], *_geometry(c))


def _carved(bind):
    rec = workspace.Recorder()
    with workspace.allocating(rec):
        bind()
    buf = np.empty(max(rec.nbytes, 1), np.uint8)
    with workspace.allocating(workspace.Carver(buf)):
        fn = bind()
    return fn, buf


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_workspace_is_written_before_read_and_nothing_is_allocated(dtype):
    c = _case(n=3, g=2, icg=2, ocg=3, flip=True)
    x, w, dy = _arrays(c, dtype)
    y, gx = np.empty(dy.shape, dtype), np.empty(x.shape, dtype)
    carved = [
        _carved(lambda: _FWD(x, w, y, *_geometry(c))),
        _carved(lambda: _BWD(w, dy, gx, *_geometry(c))),
    ]
    for fn, _ in carved:
        fn()  # compiles
    tracemalloc.start()
    try:
        for _ in range(2):
            for fn, buf in carved:
                buf[:] = 0xFF  # NaN
                before = tracemalloc.get_traced_memory()[0]
                tracemalloc.reset_peak()
                fn()
                # NumPy's allocations are traced: a run allocates no array
                assert tracemalloc.get_traced_memory()[1] - before < 4096
            np.testing.assert_allclose(y, ref_forward(c, x, w), **_tol(dtype))
            np.testing.assert_allclose(gx, ref_backward_data(c, w, dy), **_tol(dtype))
    finally:
        tracemalloc.stop()


def test_empty_batch():
    c = _case(n=0)
    x, w, dy = _arrays(c)
    _FWD(x, w, np.empty(dy.shape, np.float32), *_geometry(c))()
    _BWD(w, dy, np.empty(x.shape, np.float32), *_geometry(c))()


def test_runs_are_bitwise_reproducible():
    # the same bands give the same bits on every run and over any number of threads (each
    # band's GEMMs run on one thread); the band size is fixed at bind time
    c = _case(n=4, icg=8, ocg=8, sshape=(12, 12))
    x, w, dy = _arrays(c)
    ys = [np.empty(dy.shape, np.float32) for _ in range(3)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv_winograd, "BAND_BYTES", 1)
        mp.setattr(conv_winograd, "MIN_BAND_TILES", 1)
        for y, threads in zip(ys, (2, 3, 3)):
            mp.setattr(conv_common, "THREADS", threads)
            _FWD(x, w, y, *_geometry(c))()
    assert np.array_equal(ys[0], ys[1]) and np.array_equal(ys[1], ys[2])


# ---- registration and HEURISTIC ------------------------------------------------------------
def _select(kind, c):
    x, w, dy = _arrays(c)
    args = (x, w, dy) if kind == "forward" else (w, dy, x)
    return conv_algos.select(kind, *args, *_geometry(c)).name


@pytest.mark.parametrize("kind", ["forward", "backward_data"])
def test_heuristic_takes_winograd_from_16_or_32_channels_and_1024_positions(kind):
    big = dict(n=4, sshape=(56, 56))
    least = 16 if kind == "forward" else 32
    assert _select(kind, _case(icg=least, ocg=64, **big)) == "WINOGRAD_F23"
    assert _select(kind, _case(icg=64, ocg=least, **big)) == "WINOGRAD_F23"
    assert _select(kind, _case(icg=least // 2, ocg=64, **big)) != "WINOGRAD_F23"
    assert _select(kind, _case(icg=64, ocg=least // 2, **big)) != "WINOGRAD_F23"
    # small planes in a batch, one large plane: the bands keep the GEMMs long enough
    assert _select(kind, _case(icg=32, ocg=32, n=64, sshape=(14, 14))) == "WINOGRAD_F23"
    assert _select(kind, _case(icg=64, ocg=64, n=1, sshape=(56, 56))) == "WINOGRAD_F23"
    # too few positions in all (ResNet50's batch-1 28x28 and 14x14 layers): the filter
    # transform and the thin GEMMs do not pay
    assert _select(kind, _case(icg=32, ocg=32, n=1, sshape=(28, 28))) != "WINOGRAD_F23"
    assert _select(kind, _case(icg=64, ocg=64, n=4, sshape=(14, 14))) != "WINOGRAD_F23"
    strided = dict(_case(icg=32, ocg=32, **big), stride=(2, 2))
    strided["oshape"] = (28, 28)
    assert _select(kind, strided) != "WINOGRAD_F23"


def test_heuristic_takes_winograd_forward_from_min_plane_positions():
    # ahead of TAPWISE_SGEMM on its small planes of many channels, from a 12x12 plane on
    from megbrain.kernels.conv import winograd as conv_winograd

    assert conv_winograd.MIN_PLANE_POSITIONS == 12 * 12
    batch = dict(n=32, icg=128, ocg=128)
    assert _select("forward", _case(sshape=(12, 12), **batch)) == "WINOGRAD_F23"
    assert _select("forward", _case(sshape=(16, 16), **batch)) == "WINOGRAD_F23"
    assert _select("forward", _case(sshape=(11, 11), **batch)) != "WINOGRAD_F23"
    assert _select("forward", _case(sshape=(8, 8), **batch)) != "WINOGRAD_F23"


@pytest.mark.parametrize("kind", ["forward", "backward_data"])
def test_heuristic_leaves_winograd_above_max_channels(kind):
    # the channels a value sums over: ICg forward, OCg backward data
    from megbrain.kernels.conv import winograd as conv_winograd

    top = conv_winograd.MAX_CHANNELS
    wide = dict(n=4, sshape=(28, 28), icg=2 * top, ocg=2 * top)
    assert _select(kind, _case(**wide)) != "WINOGRAD_F23"
    summed = "icg" if kind == "forward" else "ocg"
    assert _select(kind, _case(**dict(wide, **{summed: top}))) == "WINOGRAD_F23"


# ---- through the operators -----------------------------------------------------------------
def test_gradient_through_the_operators_matches_float64(monkeypatch):
    from opr_harness import inputs, make_graph, run

    from megbrain.kernels.conv import winograd as conv_winograd

    monkeypatch.setattr(conv_winograd, "MIN_POSITIONS", 1)  # HEURISTIC takes small shapes
    monkeypatch.setattr(conv_winograd, "MIN_PLANE_POSITIONS", 1)
    monkeypatch.setattr(conv_winograd, "MIN_CHANNELS_BACKWARD_DATA", 16)

    import megbrain.opr as O
    from megbrain.opr.grad import grad as graph_grad
    from megbrain.opr.io import make_immutable

    c = _case(n=2, icg=16, ocg=16, sshape=(6, 5))
    x, w, r = _arrays(c)
    g = make_graph()
    (xv, wv), _ = inputs(g, x, w[0])
    y = O.convolution(xv, wv, pad_h=1, pad_w=1)
    loss = (y * make_immutable("cpu0", g, r, dtype=np.float32)).sum()
    (gx,) = graph_grad(loss, [xv], warn_mid_wrt=False)
    got_y, got_gx = run([y, gx], g)
    assert y.node.owner.chosen_algorithm == "WINOGRAD_F23"
    gnode = getattr(gx, "node", gx)
    assert gnode.owner.chosen_algorithm == "WINOGRAD_F23"
    np.testing.assert_allclose(got_y, ref_forward(c, x, w), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(got_gx, ref_backward_data(c, w, r), rtol=RTOL, atol=ATOL)


def test_gradient_matches_finite_differences():
    import megbrain.opr as O

    rng = np.random.default_rng(8)
    x = rng.uniform(-1, 1, (1, 16, 3, 4))
    w = rng.uniform(-1, 1, (16, 16, 3, 3))
    check_grad(lambda a, b: O.convolution(a, b, pad_h=1, pad_w=1), [x, w], wrt=[0])


# ---- direct convolution --------------------------------------------------------------------
@st.composite
def direct_cases(draw):
    fshape = (draw(st.integers(1, 5)), draw(st.integers(1, 5)))
    dilate = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    pad = tuple(draw(st.integers(0, f)) for f in fshape)
    sshape = tuple(
        draw(st.integers(max(1, d * (f - 1) + 1 - 2 * p), 9))
        for f, d, p in zip(fshape, dilate, pad)
    )
    return dict(
        n=draw(st.integers(1, 3)),
        g=draw(st.integers(1, 2)),
        icg=draw(st.integers(1, 3)),
        ocg=draw(st.integers(1, 4)),
        fshape=fshape,
        stride=_ONE,
        pad=pad,
        dilate=dilate,
        sshape=sshape,
        oshape=tuple(conv_common.conv_out_size(*a) for a in zip(sshape, fshape, _ONE, pad, dilate)),
        flip=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
    )


def _direct_arrays(c, dtype=np.float32):
    rng = np.random.default_rng(c["seed"])
    x = rng.uniform(-1, 1, (c["n"], c["g"] * c["icg"], *c["sshape"])).astype(dtype)
    w = rng.uniform(-1, 1, (c["g"], c["ocg"], c["icg"], *c["fshape"])).astype(dtype)
    return x, w


@settings(max_examples=60, deadline=None)
@given(c=direct_cases(), dtype=_DTYPES, threads=st.integers(1, 3))
def test_direct_forward_matches_float64(c, dtype, threads):
    x, w = _direct_arrays(c, dtype)
    y = np.full((c["n"], c["g"] * c["ocg"], *c["oshape"]), np.nan, dtype)
    assert conv_direct.usable_direct_forward(x, w, y, *_geometry(c))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv_common, "THREADS", threads)
        mp.setattr(conv_direct, "_MIN_SPLIT_PLANES", 1)
        conv_direct.bind_direct_forward(x, w, y, *_geometry(c))()
    np.testing.assert_allclose(y, ref_forward(c, x, w), **_tol(dtype))


@settings(max_examples=40, deadline=None)
@given(c=direct_cases(), dtype=_DTYPES)
def test_direct_backward_data_matches_float64(c, dtype):
    tpad = tuple(d * (f - 1) - p for f, p, d in zip(c["fshape"], c["pad"], c["dilate"]))
    x, w = _direct_arrays(c, dtype)
    dy = np.random.default_rng(c["seed"] + 1).uniform(-1, 1, (c["n"], c["g"] * c["ocg"],
                                                              *c["oshape"])).astype(dtype)
    gx = np.full(x.shape, np.nan, dtype)
    usable = conv_direct.usable_direct_backward_data(w, dy, gx, *_geometry(c))
    assert usable == all(p >= 0 for p in tpad)
    if not usable:
        with pytest.raises(ValueError, match="direct"):
            conv_direct.bind_direct_backward_data(w, dy, gx, *_geometry(c))
        return
    conv_direct.bind_direct_backward_data(w, dy, gx, *_geometry(c))()
    np.testing.assert_allclose(gx, ref_backward_data(c, w, dy), **_tol(dtype))


@pytest.mark.parametrize("icg,fshape", [(64, (3, 3)), (20, (5, 5)), (13, (3, 3))])
def test_direct_long_reductions_match_float64(icg, fshape):
    # channel blocks of 8 summed apart, then added (13: a short last block)
    c = dict(_case(n=1, icg=icg, ocg=3, sshape=(9, 8), pad=(1, 1)), fshape=fshape)
    c["oshape"] = tuple(conv_common.conv_out_size(s, f, 1, 1, 1) for s, f in zip((9, 8), fshape))
    x, w = _direct_arrays(c)
    y = np.empty((1, 3, *c["oshape"]), np.float32)
    conv_direct.bind_direct_forward(x, w, y, *_geometry(c))()
    np.testing.assert_allclose(y, ref_forward(c, x, w), rtol=RTOL, atol=ATOL)


def test_direct_forward_strided_operands_and_workspace():
    c = _case(n=3, icg=1, ocg=4, sshape=(9, 8), pad=(1, 2))
    x, w = _direct_arrays(c)
    xs = np.repeat(x, 2, axis=1)[:, ::2]
    base = np.full((c["n"], 8, *c["oshape"]), np.nan, np.float32)
    y = base[:, ::2]
    fn, buf = _carved(lambda: conv_direct.bind_direct_forward(xs, w, y, *_geometry(c)))
    fn()
    tracemalloc.start()
    try:
        for _ in range(2):
            buf[:] = 0xFF
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            fn()
            assert tracemalloc.get_traced_memory()[1] - before < 4096
            np.testing.assert_allclose(y, ref_forward(c, x, w), rtol=RTOL, atol=ATOL)
    finally:
        tracemalloc.stop()
    assert np.isnan(base[:, 1::2]).all()


def test_direct_forward_refuses_strides_and_long_reductions():
    x, w = np.zeros((1, 1, 9, 9), np.float32), np.zeros((1, 2, 1, 3, 3), np.float32)
    y = np.zeros((1, 2, 4, 4), np.float32)
    assert not conv_direct.usable_direct_forward(x, w, y, (2, 2), (0, 0), _ONE)
    with pytest.raises(ValueError, match="direct"):
        conv_direct.bind_direct_forward(x, w, y, (2, 2), (0, 0), _ONE)
    wide = np.zeros((1, 2, 256, 3, 3), np.float32)
    xw = np.zeros((1, 256, 9, 9), np.float32)
    assert not conv_direct.usable_direct_forward(xw, wide, np.zeros((1, 2, 7, 7)), _ONE, (0, 0),
                                                 _ONE)  # fmt: skip


def test_heuristic_takes_direct_for_one_channel_3x3_and_5x5():
    assert _select("forward", _case(icg=1, ocg=16, sshape=(28, 28))) == "DIRECT"
    c = dict(_case(icg=1, ocg=20, sshape=(28, 28), pad=(0, 0)), fshape=(5, 5), oshape=(24, 24))
    x, w = _direct_arrays(c)
    y = np.empty((c["n"], 20, 24, 24), np.float32)
    assert conv_algos.select("forward", x, w, y, *_geometry(c)).name == "DIRECT"
    assert _select("forward", _case(icg=2, ocg=16, sshape=(28, 28))) != "DIRECT"


def test_direct_gradient_through_the_operator_matches_finite_differences():
    import megbrain.opr as O

    rng = np.random.default_rng(9)
    x = rng.uniform(-1, 1, (2, 1, 5, 4))
    w = rng.uniform(-1, 1, (3, 1, 3, 3))
    check_grad(lambda a, b: O.convolution(a, b, pad_h=1, pad_w=1), [x, w])


@pytest.mark.parametrize("algo", ["winograd", "direct"])
def test_bfloat16_operands_compute_in_float32(algo):
    import ml_dtypes

    c = _case(n=2, icg=3, ocg=4, sshape=(6, 7))
    x, w, dy = _arrays(c, ml_dtypes.bfloat16)
    y = np.full(dy.shape, np.nan, ml_dtypes.bfloat16)
    bind = _FWD if algo == "winograd" else conv_direct.bind_direct_forward
    bind(x, w, y, *_geometry(c))()
    want = ref_forward(c, x.astype(np.float64), w.astype(np.float64))
    np.testing.assert_allclose(y.astype(np.float64), want, rtol=1e-2, atol=5e-2)
