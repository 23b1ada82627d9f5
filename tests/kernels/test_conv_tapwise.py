"""TAPWISE_SGEMM (megbrain.kernels.conv.tapwise), the backward data that runs it and its
filter gradient, against float64 references (the filter gradient also against finite
differences through the operator)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_conv_algos import (
    ATOL,
    RTOL,
    _arrays,
    _carved,
    assert_allocates_nothing,
    ref_backward_data,
    ref_backward_filter,
    ref_forward,
)

from megbrain.kernels import parallel, tiled_jit
from megbrain.kernels.conv import common as conv_common
from megbrain.kernels.conv import registry, tapwise

pytestmark = pytest.mark.skipif(tiled_jit.vector_width() != 16,
                                reason="TAPWISE_SGEMM needs AVX-512")  # fmt: skip


@st.composite
def cases(draw):
    fshape = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    pad = tuple(draw(st.integers(0, f + 1)) for f in fshape)
    sshape = tuple(draw(st.integers(max(1, f - 2 * p), 7)) for f, p in zip(fshape, pad))
    oshape = tuple(conv_common.conv_out_size(s, f, 1, p, 1)
                   for s, f, p in zip(sshape, fshape, pad))  # fmt: skip
    return dict(n=draw(st.integers(1, 5)), g=1, icg=draw(st.sampled_from([1, 3, 16, 70])),
                ocg=draw(st.sampled_from([1, 5, 64, 65, 130])), fshape=fshape, stride=(1, 1),
                pad=pad, dilate=(1, 1), sshape=sshape, oshape=oshape,
                flip=draw(st.booleans()), seed=draw(st.integers(0, 2**16)))  # fmt: skip


def _geometry(c):
    return c["stride"], c["pad"], c["dilate"], c["flip"]


@settings(max_examples=40, deadline=None)
@given(c=cases(), threads=st.integers(1, 3), swapped=st.booleans())
def test_forward_matches_float64(c, threads, swapped):
    # taps over the padding skipped at the borders (a pad past the filter: rows with no tap),
    # partial panels of output channels, rows shared out to the threads; the filter C-ordered
    # or with its channel axes swapped in memory (the data gradient's transposed filter)
    x, w, _ = _arrays(c)
    wv = np.ascontiguousarray(w.swapaxes(1, 2)).swapaxes(1, 2) if swapped else w
    out = np.full((c["n"], c["ocg"], *c["oshape"]), np.nan, np.float32)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(parallel, "num_threads", lambda: threads)
        fn = tapwise.bind_tapwise(x, wv, out, *_geometry(c))
    fn()
    np.testing.assert_allclose(out, ref_forward(c, x, w), rtol=RTOL, atol=ATOL)


def test_non_contiguous_operands():
    c = dict(n=3, g=1, icg=5, ocg=7, fshape=(3, 2), stride=(1, 1), pad=(1, 1), dilate=(1, 1),
             sshape=(5, 4), oshape=(5, 5), flip=True, seed=3)  # fmt: skip
    x, w, _ = _arrays(c)
    xs = np.full(x.shape[:-1] + (2 * x.shape[-1],), np.nan, np.float32)
    xs[..., ::2] = x
    ws = np.asfortranarray(w)
    base = np.full((3, 7, 5, 9), 7.0, np.float32)
    out = base[..., 2:7]
    tapwise.bind_tapwise(xs[..., ::2], ws, out, *_geometry(c))()
    np.testing.assert_allclose(out, ref_forward(c, x, w), rtol=RTOL, atol=ATOL)
    assert (base[..., :2] == 7).all() and (base[..., 7:] == 7).all()


def test_refuses_what_it_does_not_compute():
    x = np.zeros((2, 4, 5, 5), np.float32)
    w = np.zeros((1, 4, 4, 3, 3), np.float32)
    y = np.zeros((2, 4, 3, 3), np.float32)
    assert not tapwise.usable_tapwise(x, w, y, (2, 2), (1, 1), (1, 1))
    assert not tapwise.usable_tapwise(x.astype(np.float64), w.astype(np.float64),
                                      y.astype(np.float64), (1, 1), (0, 0), (1, 1))  # fmt: skip
    with pytest.raises(ValueError, match="TAPWISE_SGEMM"):
        tapwise.bind_tapwise(x, w, y, (2, 2), (1, 1), (1, 1))


@pytest.mark.parametrize("threads", [1, 2])
def test_workspace_is_written_before_read_and_nothing_is_allocated(threads):
    c = dict(n=4, g=1, icg=6, ocg=9, fshape=(3, 3), stride=(1, 1), pad=(1, 1), dilate=(1, 1),
             sshape=(4, 5), oshape=(4, 5), flip=False, seed=7)  # fmt: skip
    x, w, _ = _arrays(c)
    out = np.empty((4, 9, 4, 5), np.float32)
    want = ref_forward(c, x, w)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(parallel, "num_threads", lambda: threads)
        fn, buf = _carved(lambda: tapwise.bind_tapwise(x, w, out, *_geometry(c)))
    for _ in range(2):
        buf[:] = 0xFF  # NaN as float32
        fn()
        np.testing.assert_allclose(out, want, rtol=RTOL, atol=ATOL)
    if threads == 1:  # no pool hand-over objects: NumPy's allocations are traced, none
        assert_allocates_nothing(fn)


def test_resnet_shapes_choose_it_forward_and_backward_data():
    # ResNet-18's deep 3x3 layers at batch 32 (fewer channels here): the forward and the
    # stride-1 data gradient (AS_FORWARD_CONV, the transposed, flipped filter) both run it
    c = dict(n=32, g=1, icg=64, ocg=64, fshape=(3, 3), stride=(1, 1), pad=(1, 1),
             dilate=(1, 1), sshape=(4, 4), oshape=(4, 4), flip=False, seed=1)  # fmt: skip
    x, w, dy = _arrays(c)
    y, gx = np.empty(dy.shape, np.float32), np.empty(x.shape, np.float32)
    geom = _geometry(c)
    assert registry.select("forward", x, w, y, *geom).name == "TAPWISE_SGEMM"
    assert registry.select("backward_data", w, dy, gx, *geom).name == "AS_FORWARD_CONV"
    registry.bind("forward", x, w, y, *geom)()
    registry.bind("backward_data", w, dy, gx, *geom)()
    np.testing.assert_allclose(y, ref_forward(c, x, w), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(gx, ref_backward_data(c, w, dy), rtol=RTOL, atol=ATOL)
    # the data gradient is the forward's adjoint: <conv(x), dy> = <x, grad(dy)>
    lhs = float(np.vdot(y.astype(np.float64), dy))
    assert lhs == pytest.approx(float(np.vdot(x.astype(np.float64), gx)), rel=1e-4)


def test_small_batches_and_large_planes_keep_the_other_algorithms():
    w = np.zeros((1, 256, 256, 3, 3), np.float32)
    one = np.zeros((1, 256, 7, 7), np.float32)  # batch 1, 7 positions a row
    assert not tapwise.tapwise_preferred(one, w, one, (1, 1), (1, 1), (1, 1))
    big = np.zeros((8, 256, 32, 32), np.float32)
    assert not tapwise.tapwise_preferred(big, w, big, (1, 1), (1, 1), (1, 1))


# ---- the filter gradient ---------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(c=cases(), threads=st.integers(1, 3), by_rows=st.booleans())
def test_filter_gradient_matches_float64(c, threads, by_rows):
    # taps with no row or no column inside the image (a pad past the filter), whole-row taps
    # in one product, partial panels and row tiles, panels or rows shared out to the threads,
    # the products tap by tap or row by row
    x, w, dy = _arrays(c)
    gw = np.full(w.shape, np.nan, np.float32)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(parallel, "num_threads", lambda: threads)
        mp.setattr(tapwise, "FILTER_ROW_ORDER_POSITIONS", 0 if by_rows else 1 << 30)
        fn = tapwise.bind_tapwise_filter(x, dy, gw, *_geometry(c))
    fn()
    np.testing.assert_allclose(gw, ref_backward_filter(c, x, dy, w.shape), rtol=RTOL, atol=ATOL)


def test_filter_gradient_of_strided_operands_and_rows_of_4_kb():
    # 32 samples of 32 columns: source rows of 1024 items, stored 16 items longer
    c = dict(n=32, g=1, icg=6, ocg=70, fshape=(3, 3), stride=(1, 1), pad=(1, 1),
             dilate=(1, 1), sshape=(1, 32), oshape=(1, 32), flip=True, seed=5)  # fmt: skip
    x, w, dy = _arrays(c)
    xs = np.full(x.shape[:-1] + (2 * x.shape[-1],), np.nan, np.float32)
    xs[..., ::2] = x
    base = np.full((1, 70, 6, 3, 5), 7.0, np.float32)
    gw = base[..., 1:4]
    tapwise.bind_tapwise_filter(xs[..., ::2], np.asfortranarray(dy), gw, *_geometry(c))()
    np.testing.assert_allclose(gw, ref_backward_filter(c, x, dy, w.shape), rtol=RTOL, atol=ATOL)
    assert (base[..., 0] == 7).all() and (base[..., 4] == 7).all()


@pytest.mark.parametrize("threads", [1, 2])
def test_filter_gradient_workspace_is_written_before_read_and_nothing_is_allocated(threads):
    c = dict(n=4, g=1, icg=9, ocg=70, fshape=(3, 3), stride=(1, 1), pad=(1, 1), dilate=(1, 1),
             sshape=(4, 5), oshape=(4, 5), flip=False, seed=8)  # fmt: skip
    x, w, dy = _arrays(c)
    gw = np.empty(w.shape, np.float32)
    want = ref_backward_filter(c, x, dy, w.shape)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(parallel, "num_threads", lambda: threads)
        fn, buf = _carved(lambda: tapwise.bind_tapwise_filter(x, dy, gw, *_geometry(c)))
    for _ in range(2):
        buf[:] = 0xFF  # NaN as float32
        fn()
        np.testing.assert_allclose(gw, want, rtol=RTOL, atol=ATOL)
    if threads == 1:
        assert_allocates_nothing(fn)


@pytest.mark.parametrize("ocg", [130, 40])
@pytest.mark.parametrize("by_rows", [False, True])
def test_filter_gradient_is_the_same_bits_at_any_thread_count(by_rows, ocg, monkeypatch):
    # tap by tap (whole-row taps in one product) or output row by output row; panels of
    # output channels to the threads, or (40: one panel) runs of positions
    monkeypatch.setattr(tapwise, "FILTER_ROW_ORDER_POSITIONS", 0 if by_rows else 1 << 30)
    c = dict(n=8, g=1, icg=64, ocg=ocg, fshape=(3, 3), stride=(1, 1), pad=(1, 1),
             dilate=(1, 1), sshape=(6, 6), oshape=(6, 6), flip=False, seed=2)  # fmt: skip
    x, w, dy = _arrays(c)
    want = ref_backward_filter(c, x, dy, w.shape)
    got = []
    for threads in (1, 2, 3):
        gw = np.empty(w.shape, np.float32)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(parallel, "num_threads", lambda t=threads: t)
            tapwise.bind_tapwise_filter(x, dy, gw, *_geometry(c))()
        got.append(gw)
    assert all(np.array_equal(got[0], g) for g in got[1:])
    np.testing.assert_allclose(got[0], want, rtol=RTOL, atol=ATOL)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 50), min_size=1, max_size=30), parts=st.integers(1, 4))
def test_position_runs_keep_the_products_in_order_in_even_runs(sizes, parts):
    plan = [(k % 9, 0, 0, size) for k, size in enumerate(sizes)]
    runs = tapwise._position_runs(plan, parts)
    assert [item for run in runs for item in run] == plan and all(runs)
    assert len(runs) == min(parts, len(plan))
    total, most = sum(sizes), max(sizes)
    for run in runs:  # each within one product of an even share
        assert abs(sum(k for *_, k in run) - total / len(runs)) <= most


def test_filter_gradient_heuristic_and_refusals():
    w = np.zeros((1, 64, 64, 3, 3), np.float32)
    small = np.zeros((32, 64, 8, 8), np.float32)
    assert registry.select("backward_filter", small, small, w, (1, 1), (1, 1), (1, 1)).name \
        == "TAPWISE_SGEMM"  # fmt: skip
    big = np.zeros((8, 64, 64, 64), np.float32)  # planes past 32x32 keep IM2COL_GEMM_BLOCKED
    assert not tapwise.tapwise_filter_preferred(big, big, w, (1, 1), (1, 1), (1, 1))
    one = np.zeros((1, 64, 7, 7), np.float32)
    assert not tapwise.tapwise_filter_preferred(one, one, w, (1, 1), (1, 1), (1, 1))
    x = np.zeros((2, 64, 8, 8), np.float32)
    y = np.zeros((2, 64, 4, 4), np.float32)
    assert not tapwise.usable_tapwise_filter(x, y, w, (2, 2), (1, 1), (1, 1))
    with pytest.raises(ValueError, match="TAPWISE_SGEMM"):
        tapwise.bind_tapwise_filter(x, y, w, (2, 2), (1, 1), (1, 1))


def test_filter_gradient_through_the_operator_matches_finite_differences(monkeypatch):
    """float32 through the operator, TAPWISE_SGEMM chosen (its thresholds lowered): central
    differences in float64 of the loss the float32 gradient belongs to."""
    import megbrain as mgb
    import megbrain.opr as O

    monkeypatch.setattr(tapwise, "MIN_CHANNELS", 1)
    monkeypatch.setattr(tapwise, "MIN_ROW_POSITIONS", 1)
    rng = np.random.default_rng(12)
    x0 = rng.uniform(-1, 1, (3, 4, 5, 4)).astype(np.float32)
    w0 = rng.uniform(-1, 1, (6, 4, 3, 3)).astype(np.float32)
    c0 = rng.uniform(-1, 1, (3, 6, 5, 4))
    g = mgb.comp_graph(check_env_var=False)
    x = mgb.make_shared("cpu0", value=x0, comp_graph=g)
    w = mgb.make_shared("cpu0", value=w0, comp_graph=g)
    loss = (O.convolution(x, w, pad_h=1, pad_w=1) * c0.astype(np.float32)).sum()
    f = g.compile(None, [mgb.copy_output(mgb.grad(loss, w))])
    got = np.asarray(f()[0])
    assert "TAPWISE_SGEMM" in [getattr(o, "chosen_algorithm", None)
                               for o in f._func.iter_opr_seq()
                               if o.type_name == "ConvolutionBackwardFilter"]  # fmt: skip
    c = dict(n=3, g=1, icg=4, ocg=6, fshape=(3, 3), stride=(1, 1), pad=(1, 1), dilate=(1, 1),
             sshape=(5, 4), oshape=(5, 4), flip=False, seed=0)  # fmt: skip

    def fn(wv):
        y = ref_forward(c, x0, wv.reshape(1, 6, 4, 3, 3))
        return float((y * c0).sum())

    h = 1e-6
    v = rng.standard_normal(w0.shape)
    num = (fn(w0.astype(np.float64) + h * v) - fn(w0.astype(np.float64) - h * v)) / (2 * h)
    np.testing.assert_allclose(float((got * v).sum()), num, rtol=1e-4, atol=1e-4)
