"""The backward-filter algorithms of megbrain.kernels.conv_bwd_filter (IM2COL_GEMM_BLOCKED)
against the float64 reference: drawn shapes, strides, paddings, dilations, groups and flips,
with blocks of one row up to whole batches; float16/bfloat16/float64; strided operands; the
workspace contract; reproducibility; the HEURISTIC choice; the filter gradient through the
convolution operator against finite differences."""

from __future__ import annotations

import functools
import os
import sys

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_conv_algos import ATOL, RTOL, _arrays, _carved, _geometry, conv_cases
from test_conv_algos import ref_backward_filter as ref

from megbrain.kernels import parallel
from megbrain.kernels.conv import bwd_filter as conv_bwd_filter
from megbrain.kernels.conv import common as conv_common
from megbrain.kernels.conv import registry as conv_algos

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "opr"))
from opr_harness import check_grad  # noqa: E402

_BLOCKED = conv_bwd_filter.bind_blocked


def _case(n=2, g=1, icg=3, ocg=4, sshape=(7, 6), fshape=(3, 3), stride=(1, 1), pad=(1, 1),
          dilate=(1, 1), flip=False, seed=3):  # fmt: skip
    oshape = tuple(
        conv_common.conv_out_size(*a) for a in zip(sshape, fshape, stride, pad, dilate)
    )
    return dict(n=n, g=g, icg=icg, ocg=ocg, fshape=fshape, stride=stride, pad=pad,
                dilate=dilate, sshape=sshape, oshape=oshape, flip=flip, seed=seed)  # fmt: skip


def _run(bind, c, x, dy, dtype=None):
    gw = np.full((c["g"], c["ocg"], c["icg"], *c["fshape"]), np.nan, dtype or x.dtype)
    assert conv_bwd_filter.usable_blocked(x, dy, gw, c["stride"], c["pad"], c["dilate"])
    bind(x, dy, gw, *_geometry(c))()
    return gw


@settings(max_examples=80, deadline=None)
@given(c=conv_cases(nsp=2), block=st.sampled_from([1, 2, 5, 1024]), trans=st.booleans())
def test_blocked_matches_float64(c, block, trans):
    # a block of ``block`` positions is one output row, or whole samples; either GEMM
    x, w, dy = _arrays(c)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv_bwd_filter, "BLOCK_POSITIONS", block)
        mp.setattr(conv_bwd_filter, "BLOCK_CACHE_BYTES", 0)
        mp.setattr(conv_bwd_filter, "TRANSPOSED_MIN_POSITIONS", 0 if trans else 1 << 30)
        mp.setattr(conv_bwd_filter, "BAND_MAX_POSITIONS", 0)
        gw = _run(_BLOCKED, c, x, dy)
    np.testing.assert_allclose(gw, ref(c, x, dy, w.shape), rtol=RTOL, atol=ATOL)


@settings(max_examples=40, deadline=None)
@given(c=conv_cases(nsp=2), block=st.sampled_from([1, 3, 1024]), threads=st.integers(2, 3),
       trans=st.booleans())  # fmt: skip
def test_thread_splits_match_float64(c, block, threads, trans):
    # each thread its blocks (partial sums added at the end), or its column rows of each block
    x, w, dy = _arrays(c)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv_bwd_filter, "BLOCK_POSITIONS", block)
        mp.setattr(conv_bwd_filter, "BLOCK_CACHE_BYTES", 0)
        mp.setattr(conv_bwd_filter, "TRANSPOSED_MIN_POSITIONS", 0 if trans else 1 << 30)
        mp.setattr(conv_bwd_filter, "BAND_MAX_POSITIONS", 0)
        mp.setattr(conv_bwd_filter, "_MIN_THREAD_FLOPS", 0)
        mp.setattr(parallel, "num_threads", lambda: threads)
        gw = _run(_BLOCKED, c, x, dy)
    np.testing.assert_allclose(gw, ref(c, x, dy, w.shape), rtol=RTOL, atol=ATOL)


def test_threads_on_blocks_of_unequal_widths_keep_their_own_columns(monkeypatch):
    # two blocks of 3 and 2 output rows, three threads on their column rows of each: a
    # thread a block ahead of another once wrote its rows where the other's block-0 rows
    # were (one shared column buffer, viewed with each block's width); a part of three runs
    # after another on the calling thread, so the worker is often a block ahead
    c = _case(n=1, g=2, icg=3, ocg=1, sshape=(3, 3), fshape=(1, 3), stride=(1, 2), pad=(1, 0))
    x, w, dy = _arrays(c)
    monkeypatch.setattr(conv_bwd_filter, "BLOCK_POSITIONS", 3)
    monkeypatch.setattr(conv_bwd_filter, "BLOCK_CACHE_BYTES", 0)
    monkeypatch.setattr(conv_bwd_filter, "TRANSPOSED_MIN_POSITIONS", 1 << 30)
    monkeypatch.setattr(conv_bwd_filter, "_MIN_THREAD_FLOPS", 0)
    monkeypatch.setattr(parallel, "num_threads", lambda: 3)
    gw = np.full(w.shape, np.nan, x.dtype)
    step = _BLOCKED(x, dy, gw, *_geometry(c))
    expected = ref(c, x, dy, w.shape)
    for _ in range(300):  # ~25% of the runs went wrong
        step()
        np.testing.assert_allclose(gw, expected, rtol=RTOL, atol=ATOL)


def test_blocks_cover_the_batch_in_rows_or_whole_samples(monkeypatch):
    monkeypatch.setattr(conv_bwd_filter, "BLOCK_POSITIONS", 100)
    monkeypatch.setattr(conv_bwd_filter, "BLOCK_CACHE_BYTES", 0)
    # 10-position rows: 3 blocks of at most 10 rows inside one sample (batch 1 blocks too),
    # as even as whole rows allow
    assert conv_bwd_filter._blocks(1, 25, 10, 40) == [(0, 9), (9, 18), (18, 25)]
    # 4x4 samples: at most 6 whole samples (96 positions) per block, 2 even blocks of 4
    assert conv_bwd_filter._blocks(8, 4, 4, 16) == [(0, 16), (16, 32)]
    # the byte cap wins over the position target, at least one row per block
    monkeypatch.setattr(conv_bwd_filter, "BLOCK_BYTES", 100)
    assert conv_bwd_filter._blocks(1, 3, 10, 40) == [(0, 2), (2, 3)]
    assert conv_bwd_filter._blocks(1, 2, 10, 1000) == [(0, 1), (1, 2)]
    # for 2 threads: an even number of blocks (7 rows of 10 positions -> 4 blocks of 2 rows;
    # 5 samples of 16 positions, at most 6 a block -> blocks of 3 and 2; one sample that fits
    # a block stays one: the threads split its column rows)
    monkeypatch.setattr(conv_bwd_filter, "BLOCK_BYTES", 1 << 20)
    monkeypatch.setattr(conv_bwd_filter, "BLOCK_POSITIONS", 30)
    assert conv_bwd_filter._blocks(1, 7, 10, 40, 2) == [(0, 2), (2, 4), (4, 6), (6, 7)]
    monkeypatch.setattr(conv_bwd_filter, "BLOCK_POSITIONS", 100)
    assert conv_bwd_filter._blocks(5, 4, 4, 16, 2) == [(0, 12), (12, 20)]
    assert conv_bwd_filter._blocks(1, 4, 4, 16, 2) == [(0, 4)]


def test_large_reduction_and_batch_one_row_blocks_match_float64():
    # 64 channels, 3x3: 576 products per filter tap row, one sample in several row blocks
    c = _case(n=1, icg=64, ocg=8, sshape=(40, 37))
    x, w, dy = _arrays(c)
    gw = _run(_BLOCKED, c, x, dy)
    assert len(conv_bwd_filter._blocks(1, 40, 37, (64 * 9 + 8) * 37 * 4)) > 1
    np.testing.assert_allclose(gw, ref(c, x, dy, w.shape), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float64])
def test_other_dtypes(dtype):
    c = _case(n=3, g=2, icg=2, ocg=3, stride=(2, 1), flip=True)
    x, w, dy = _arrays(c, dtype)
    gw = _run(_BLOCKED, c, x, dy)
    assert gw.dtype == dtype
    want = ref(c, x, dy, w.shape)
    if dtype == np.float64:
        np.testing.assert_allclose(gw, want, rtol=1e-10, atol=1e-12)
    else:  # float32 compute, one rounding to the narrow dtype at the end
        np.testing.assert_allclose(gw.astype(np.float64), want, rtol=1e-2, atol=5e-2)


@settings(max_examples=30, deadline=None)
@given(c=conv_cases(nsp=2), dtype=st.sampled_from([np.float16, ml_dtypes.bfloat16, np.float64]))
def test_drawn_shapes_in_other_dtypes(c, dtype):
    x, w, dy = _arrays(c, dtype)
    gw = _run(_BLOCKED, c, x, dy)
    assert gw.dtype == dtype
    want = ref(c, x, dy, w.shape)
    # float16/bfloat16: float32 compute, one rounding to the narrow dtype at the end
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == np.float64 else dict(rtol=1e-2, atol=5e-2)
    np.testing.assert_allclose(gw.astype(np.float64), want, **tol)


def test_strided_operands():
    c = _case(n=3, g=2, icg=2, ocg=3, sshape=(6, 7), pad=(0, 2), dilate=(2, 1))
    x, w, dy = _arrays(c)
    xs = np.asfortranarray(x)  # not C-contiguous
    dys = np.concatenate([dy, dy], axis=3)[..., ::2]  # a strided view of other values
    dys[:] = dy
    gws = np.full((*w.shape[:4], 6), np.nan, np.float32)[..., ::2]  # a strided result
    assert not gws.flags.c_contiguous and gws.shape == w.shape
    _BLOCKED(xs, dys, gws, *_geometry(c))()
    np.testing.assert_allclose(gws, ref(c, x, dy, w.shape), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("block,trans", [(3, False), (1024, True)])
def test_workspace_is_written_before_read(block, trans, monkeypatch):
    monkeypatch.setattr(conv_bwd_filter, "BLOCK_POSITIONS", block)
    monkeypatch.setattr(conv_bwd_filter, "BLOCK_CACHE_BYTES", 0)
    monkeypatch.setattr(conv_bwd_filter, "TRANSPOSED_MIN_POSITIONS", 0 if trans else 1 << 30)
    monkeypatch.setattr(conv_bwd_filter, "BAND_MAX_POSITIONS", 0)
    c = _case(n=3, g=2, icg=2, ocg=3, sshape=(6, 5), stride=(2, 1), pad=(0, 2), flip=True)
    _assert_workspace_written_before_read(c)


# column rows split, blocks split, or bands of the whole batch
@pytest.mark.parametrize("n,bands", [(1, False), (6, False), (1, True), (2, True)])
def test_runs_are_reproducible(n, bands, monkeypatch):
    monkeypatch.setattr(parallel, "num_threads", lambda: 2)
    monkeypatch.setattr(conv_bwd_filter, "BAND_MAX_POSITIONS", 1 << 30 if bands else 0)
    monkeypatch.setattr(conv_bwd_filter, "BAND_BYTES", 8192)
    c = _case(n=n, icg=16, ocg=16, sshape=(40, 40), seed=5)
    x, _, dy = _arrays(c)
    gw = np.empty((1, 16, 16, 3, 3), np.float32)
    _assert_reproducible(_BLOCKED(x, dy, gw, *_geometry(c)), gw)


@settings(max_examples=40, deadline=None)
@given(c=conv_cases(nsp=2), band=st.sampled_from([1, 200, 1 << 20]), threads=st.integers(1, 3))
def test_bands_match_float64(c, band, threads):
    # the whole batch reduced per band of column rows (a row, a few rows not on a channel's
    # boundary, all rows), the bands split over the threads; several groups still block
    x, w, dy = _arrays(c)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv_bwd_filter, "BAND_MAX_POSITIONS", 1 << 30)
        mp.setattr(conv_bwd_filter, "BAND_BYTES", band)
        mp.setattr(conv_bwd_filter, "_MIN_THREAD_FLOPS", 0)
        mp.setattr(parallel, "num_threads", lambda: threads)
        gw = _run(_BLOCKED, c, x, dy)
    np.testing.assert_allclose(gw, ref(c, x, dy, w.shape), rtol=RTOL, atol=ATOL)


def test_bands_workspace_is_written_before_read(monkeypatch):
    monkeypatch.setattr(conv_bwd_filter, "BAND_MAX_POSITIONS", 1 << 30)
    monkeypatch.setattr(conv_bwd_filter, "BAND_BYTES", 100)
    monkeypatch.setattr(conv_bwd_filter, "_MIN_THREAD_FLOPS", 0)
    monkeypatch.setattr(parallel, "num_threads", lambda: 2)
    c = _case(n=3, icg=3, ocg=4, sshape=(6, 5), stride=(2, 1), pad=(0, 2), flip=True)
    _assert_workspace_written_before_read(c)


@pytest.mark.parametrize("threads", [1, 2])
def test_blocks_of_1024_columns_in_padded_rows(threads, monkeypatch):
    """Blocks of one 32x32 sample (1024 columns, 4 KB a float32 row): the columns' rows are
    written 1040 items apart (sgemm's tiles read them in place), the padding never read."""
    assert conv_bwd_filter._row_stride(1024, True) == 1040
    assert conv_bwd_filter._row_stride(1024, False) == 1024
    assert conv_bwd_filter._row_stride(1000, True) == 1000
    monkeypatch.setattr(parallel, "num_threads", lambda: threads)
    monkeypatch.setattr(conv_bwd_filter, "BLOCK_CACHE_BYTES", 1)  # one sample a block
    c = _case(n=3, icg=3, ocg=5, sshape=(32, 32), seed=12)
    x, w, dy = _arrays(c)
    np.testing.assert_allclose(_run(_BLOCKED, c, x, dy), ref(c, x, dy, w.shape), rtol=RTOL,
                               atol=ATOL)  # fmt: skip
    _assert_workspace_written_before_read(c)


def _assert_workspace_written_before_read(c) -> None:
    """The blocked filter gradient of case ``c`` right with its workspace filled with NaN
    before each of two runs, in float32 and in float16 (its conversion buffers too)."""
    x, w, dy = _arrays(c)
    x16, dy16 = x.astype(np.float16), dy.astype(np.float16)  # conversion buffers too
    for xs, dys in ((x, dy), (x16, dy16)):
        gw = np.empty(w.shape, np.float32)
        fn, buf = _carved(functools.partial(_BLOCKED, xs, dys, gw, *_geometry(c)))
        assert buf.nbytes > 1
        for _ in range(2):
            buf[:] = 0xFF  # NaN as float32
            fn()
            tol = dict(rtol=RTOL, atol=ATOL) if xs is x else dict(rtol=1e-2, atol=5e-2)
            np.testing.assert_allclose(gw, ref(c, xs, dys, w.shape), **tol)


def _assert_reproducible(fn, gw):
    fn()
    first = gw.copy()
    for _ in range(3):
        fn()
        assert np.array_equal(gw, first)


def test_empty_batch_gives_zero():
    x = np.zeros((0, 2, 4, 4), np.float32)
    dy = np.zeros((0, 3, 4, 4), np.float32)
    gw = np.full((1, 3, 2, 3, 3), np.nan, np.float32)
    _BLOCKED(x, dy, gw, (1, 1), (1, 1), (1, 1))()
    assert not gw.any()


def test_refuses_what_it_does_not_compute():
    x = np.zeros((1, 2, 4, 4, 4), np.float32)  # 3-d
    dy = np.zeros((1, 3, 4, 4, 4), np.float32)
    gw = np.zeros((1, 3, 2, 3, 3, 3), np.float32)
    assert not conv_bwd_filter.usable_blocked(x, dy, gw, (1,) * 3, (1,) * 3, (1,) * 3)
    with pytest.raises(ValueError, match="ConvolutionBackwardFilter"):
        _BLOCKED(x, dy, gw, (1,) * 3, (1,) * 3, (1,) * 3)
    with pytest.raises(ValueError, match="do not give"):  # shapes that do not match
        _BLOCKED(x[..., 0], dy[..., 0], gw[..., 0], (1, 1), (0, 0), (1, 1))


def _select(c):
    x, w, dy = _arrays(c)
    return conv_algos.select("backward_filter", x, dy, np.empty_like(w), *_geometry(c)).name


def test_registered_and_heuristic_choice():
    names = [a.name for a in conv_algos.algorithms("backward_filter")]
    assert "IM2COL_GEMM_BLOCKED" in names
    assert _select(_case()) == "IM2COL_GEMM_BLOCKED"
    c3 = dict(_case(), fshape=(3, 3, 3), stride=(1,) * 3, pad=(1,) * 3, dilate=(1,) * 3,
              sshape=(4, 4, 4), oshape=(4, 4, 4))  # fmt: skip
    assert _select(c3) == "IM2COL_GEMM_DIFF_NHWC"  # 3-d stays with the n-d algorithm


def test_filter_gradient_through_the_operator_matches_finite_differences():
    import megbrain.opr as O

    rng = np.random.default_rng(8)
    x = rng.uniform(-1, 1, (2, 3, 5, 6))
    w = rng.uniform(-1, 1, (4, 3, 3, 3))
    check_grad(lambda a, b: O.convolution(a, b, pad_h=1, pad_w=0, stride_w=2), [x, w], wrt=[1])


# ---- POINTWISE_BATCHED_GEMM -------------------------------------------------------------------
_POINTWISE = conv_bwd_filter.bind_pointwise_batched


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 5), g=st.integers(1, 3), icg=st.integers(1, 9), ocg=st.integers(1, 9),
       h=st.integers(1, 7), w=st.integers(1, 7), threads=st.integers(1, 3),
       seed=st.integers(0, 99))  # fmt: skip
def test_pointwise_batched_matches_float64(n, g, icg, ocg, h, w, threads, seed):
    c = _case(n=n, g=g, icg=icg, ocg=ocg, sshape=(h, w), fshape=(1, 1), pad=(0, 0), seed=seed)
    x, wt, dy = _arrays(c)
    gw = np.full(wt.shape, np.nan, np.float32)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(parallel, "num_threads", lambda: threads)
        _POINTWISE(x, dy, gw, *_geometry(c))()
    np.testing.assert_allclose(gw, ref(c, x, dy, wt.shape), rtol=RTOL, atol=ATOL)


def _assert_into_strided_grad(bind, c) -> None:
    """``bind`` right into a gradient that is not C-contiguous (the result copied in), the
    memory beside it untouched."""
    x, wt, dy = _arrays(c)
    big = np.full((*wt.shape[:-1], 2), np.nan, np.float32)
    gw = big[..., :1]
    bind(x, dy, gw, *_geometry(c))()
    np.testing.assert_allclose(gw, ref(c, x, dy, wt.shape), rtol=RTOL, atol=ATOL)
    assert np.isnan(big[..., 1]).all()


def test_pointwise_batched_large_planes_and_strided_grad_match_float64():
    c = _case(n=8, icg=96, ocg=24, sshape=(32, 32), fshape=(1, 1), pad=(0, 0), seed=4)
    _assert_into_strided_grad(_POINTWISE, c)


def test_pointwise_batched_is_reproducible_and_refuses_other_convolutions(monkeypatch):
    monkeypatch.setattr(parallel, "num_threads", lambda: 2)
    c = _case(n=6, icg=16, ocg=8, sshape=(16, 16), fshape=(1, 1), pad=(0, 0), seed=6)
    x, wt, dy = _arrays(c)
    gw = np.empty_like(wt)
    _assert_reproducible(_POINTWISE(x, dy, gw, *_geometry(c)), gw)
    c3 = _case()  # 3x3
    x3, w3, dy3 = _arrays(c3)
    assert not conv_bwd_filter.usable_pointwise_batched(x3, dy3, w3, *_geometry(c3)[:3])
    with pytest.raises(ValueError, match="POINTWISE_BATCHED_GEMM"):
        _POINTWISE(x3, dy3, np.empty_like(w3), *_geometry(c3))
    assert not conv_bwd_filter.usable_pointwise_batched(
        x.astype(np.float16), dy.astype(np.float16), wt.astype(np.float16), (1, 1), (0, 0),
        (1, 1))  # fmt: skip


def test_pointwise_heuristic_takes_large_planes_only():
    """(More output than input channels: POINTWISE_SGEMM_SUM's rule leaves them.)"""
    big = _case(n=2, icg=4, ocg=8, sshape=(16, 16), fshape=(1, 1), pad=(0, 0))
    small = _case(n=2, icg=4, ocg=8, sshape=(8, 8), fshape=(1, 1), pad=(0, 0))
    assert _select(big) == "POINTWISE_BATCHED_GEMM"
    assert _select(small) == "IM2COL_GEMM_BLOCKED"


def test_pointwise_filter_gradient_through_the_operator_matches_finite_differences(monkeypatch):
    import megbrain.opr as O

    monkeypatch.setattr(conv_bwd_filter, "POINTWISE_MIN_POSITIONS", 1)
    rng = np.random.default_rng(9)
    x = rng.uniform(-1, 1, (2, 3, 4, 5))  # float64, as check_grad runs it
    w = rng.uniform(-1, 1, (4, 3, 1, 1))
    x64 = x.reshape(2, 3, 4, 5)
    assert conv_algos.select("backward_filter", x64, np.zeros((2, 4, 4, 5)),
                             np.zeros((1, 4, 3, 1, 1)), (1, 1), (0, 0),
                             (1, 1)).name == "POINTWISE_BATCHED_GEMM"  # fmt: skip
    check_grad(lambda a, b: O.convolution(a, b), [x, w], wrt=[1])


# ---- POINTWISE_SGEMM_SUM ----------------------------------------------------------------------
_SUM = conv_bwd_filter.bind_pointwise_sum
_AVX512 = conv_bwd_filter.tiled_jit.vector_width() == 16
needs_avx512 = pytest.mark.skipif(not _AVX512, reason="sgemm's tile needs AVX-512")


@needs_avx512
@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 5), icg=st.sampled_from([1, 5, 16, 63, 64, 65, 130]),
       ocg=st.sampled_from([1, 6, 7, 13, 64, 70]), h=st.integers(1, 9), w=st.integers(1, 9),
       threads=st.integers(1, 3), seed=st.integers(0, 99))  # fmt: skip
def test_pointwise_sum_matches_float64(n, icg, ocg, h, w, threads, seed):
    c = _case(n=n, icg=icg, ocg=ocg, sshape=(h, w), fshape=(1, 1), pad=(0, 0), seed=seed)
    x, wt, dy = _arrays(c)
    gw = np.full(wt.shape, np.nan, np.float32)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(parallel, "num_threads", lambda: threads)
        mp.setattr(conv_bwd_filter.sgemm, "SPLIT_MIN_FLOPS", 1)  # split even small ones
        _SUM(x, dy, gw, *_geometry(c))()
    np.testing.assert_allclose(gw, ref(c, x, dy, wt.shape), rtol=RTOL, atol=ATOL)


@needs_avx512
def test_pointwise_sum_strided_grad_reproducible_and_refusals(monkeypatch):
    c = _case(n=8, icg=96, ocg=24, sshape=(8, 8), fshape=(1, 1), pad=(0, 0), seed=4)
    _assert_into_strided_grad(_SUM, c)
    x, wt, dy = _arrays(c)
    monkeypatch.setattr(parallel, "num_threads", lambda: 2)
    one = np.empty_like(wt)
    _SUM(x, dy, one, *_geometry(c))()
    _assert_reproducible(_SUM(x, dy, one, *_geometry(c)), one)
    monkeypatch.setattr(parallel, "num_threads", lambda: 1)
    single = np.empty_like(wt)
    _SUM(x, dy, single, *_geometry(c))()
    np.testing.assert_array_equal(one, single)  # the same bits at 1 and 2 threads
    for other in (_case(), _case(g=2, fshape=(1, 1), pad=(0, 0))):  # 3x3; grouped
        xo, wo, dyo = _arrays(other)
        assert not conv_bwd_filter.usable_pointwise_sum(xo, dyo, wo, *_geometry(other)[:3])
        with pytest.raises(ValueError, match="POINTWISE_SGEMM_SUM"):
            _SUM(xo, dyo, np.empty_like(wo), *_geometry(other))
    x64, dy64, w64 = (a.astype(np.float64) for a in (x, dy, wt))
    assert not conv_bwd_filter.usable_pointwise_sum(x64, dy64, w64, *_geometry(c)[:3])


@needs_avx512
def test_pointwise_sum_heuristic_takes_small_planes_of_projecting_layers():
    assert _select(_case(n=2, icg=8, ocg=4, sshape=(16, 16), fshape=(1, 1), pad=(0, 0))) \
        == "POINTWISE_SGEMM_SUM"  # fmt: skip
    assert _select(_case(n=2, icg=8, ocg=4, sshape=(4, 4), fshape=(1, 1), pad=(0, 0))) \
        == "POINTWISE_SGEMM_SUM"  # fmt: skip
    assert _select(_case(n=2, icg=8, ocg=4, sshape=(32, 32), fshape=(1, 1), pad=(0, 0))) \
        == "POINTWISE_BATCHED_GEMM"  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv_bwd_filter.sgemm, "ENABLED", False)
        assert _select(_case(n=2, icg=8, ocg=4, sshape=(4, 4), fshape=(1, 1), pad=(0, 0))) \
            == "IM2COL_GEMM_BLOCKED"  # fmt: skip


@needs_avx512
def test_pointwise_sum_filter_gradient_through_the_operator_matches_finite_differences():
    """float32 operands through the operator (POINTWISE_SGEMM_SUM takes float32 only):
    central differences in float64 of the loss the float32 gradient belongs to."""
    import megbrain as mgb
    import megbrain.opr as O

    rng = np.random.default_rng(10)
    x0 = rng.uniform(-1, 1, (3, 8, 4, 4)).astype(np.float32)
    w0 = rng.uniform(-1, 1, (5, 8, 1, 1)).astype(np.float32)
    c0 = rng.uniform(-1, 1, (3, 5, 4, 4))
    g = mgb.comp_graph(check_env_var=False)
    x = mgb.make_shared("cpu0", value=x0, comp_graph=g)
    w = mgb.make_shared("cpu0", value=w0, comp_graph=g)
    loss = (O.convolution(x, w) * c0.astype(np.float32)).sum()
    f = g.compile(None, [mgb.copy_output(mgb.grad(loss, w))])
    got = np.asarray(f()[0])
    assert "POINTWISE_SGEMM_SUM" in [getattr(o, "chosen_algorithm", None)
                                     for o in f._func.iter_opr_seq()]  # fmt: skip

    def fn(wv):
        return float((np.einsum("ncl,oc->nol", x0.reshape(3, 8, 16).astype(np.float64),
                                wv.reshape(5, 8)) * c0.reshape(3, 5, 16)).sum())  # fmt: skip

    h = 1e-6
    v = rng.standard_normal(w0.shape)
    num = (fn(w0 + h * v) - fn(w0 - h * v)) / (2 * h)
    np.testing.assert_allclose(float((got * v).sum()), num, rtol=1e-4, atol=1e-4)
