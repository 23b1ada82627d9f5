"""Winograd F(2x2, 3x3) (megbrain.kernels.conv.winograd): the band plan, the widest reductions
it accepts against the float64 reference, the refusal beyond them, and the single-threaded
BLAS its pipelines run under. (Drawn shapes, dtypes, workspace, HEURISTIC and gradients are in
test_conv_fast_algos.py.)"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_conv_algos import ATOL, RTOL, ref_backward_data, ref_forward

from megbrain.kernels import parallel
from megbrain.kernels.conv import common as conv_common
from megbrain.kernels.conv import winograd as conv_winograd
from megbrain.kernels.conv.loops import winograd as winograd_loops

_ONE = (1, 1)


def _case(n, icg, ocg, sshape, pad, g=1, flip=False, seed=0):
    oshape = tuple(conv_common.conv_out_size(s, 3, 1, p, 1) for s, p in zip(sshape, pad))
    return dict(n=n, g=g, icg=icg, ocg=ocg, fshape=(3, 3), stride=_ONE, pad=pad, dilate=_ONE,
                sshape=sshape, oshape=oshape, flip=flip, seed=seed)  # fmt: skip


def _arrays(c):
    rng = np.random.default_rng(c["seed"])
    x = rng.uniform(-1, 1, (c["n"], c["g"] * c["icg"], *c["sshape"])).astype(np.float32)
    w = rng.uniform(-1, 1, (c["g"], c["ocg"], c["icg"], 3, 3)).astype(np.float32)
    dy = rng.uniform(-1, 1, (c["n"], c["g"] * c["ocg"], *c["oshape"])).astype(np.float32)
    return x, w, dy


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 5),
    th=st.integers(1, 30),
    tw=st.integers(1, 30),
    per_tile=st.integers(1, 1 << 16),
    nt=st.integers(1, 4),
    band_bytes=st.integers(1, 1 << 22),
    min_tiles=st.integers(1, 512),
)
def test_bands_cover_every_tile_row_once(n, th, tw, per_tile, nt, band_bytes, min_tiles):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv_winograd, "BAND_BYTES", band_bytes)
        mp.setattr(conv_winograd, "MIN_BAND_TILES", min_tiles)
        bands = conv_winograd._bands(n, th, tw, per_tile, nt)
    seen = np.zeros((n, th), int)
    most = max(min_tiles, band_bytes // per_tile)
    for band in bands:
        offset = 0
        for k, r0, r1, off in band:
            assert 0 <= r0 < r1 <= th and off == offset  # parts follow each other in the band
            seen[k, r0:r1] += 1
            offset += (r1 - r0) * tw
        # within the size bound, or a single tile row when even one is larger
        assert offset <= max(most, tw)
        if len(band) > 1:
            assert all((r0, r1) == (0, th) for _, r0, r1, _ in band)  # whole samples
    assert (seen == 1).all()


@pytest.mark.parametrize("pad,sshape,flip", [((1, 1), (11, 13), False), ((0, 2), (9, 6), True)])
def test_the_widest_reductions_match_float64(pad, sshape, flip):
    # MAX_CHANNELS channels summed per value: forward over ICg, backward data over OCg
    top = conv_winograd.MAX_CHANNELS
    for icg, ocg in ((top, 5), (5, top)):
        c = _case(n=2, icg=icg, ocg=ocg, sshape=sshape, pad=pad, g=2, flip=flip, seed=icg)
        x, w, dy = _arrays(c)
        geo = (c["stride"], c["pad"], c["dilate"], c["flip"])
        y, gx = np.full(dy.shape, np.nan, np.float32), np.full(x.shape, np.nan, np.float32)
        if icg == top:
            conv_winograd.bind_winograd_forward(x, w, y, *geo)()
            np.testing.assert_allclose(y, ref_forward(c, x, w), rtol=RTOL, atol=ATOL)
        if ocg == top and max(pad) <= 2:
            conv_winograd.bind_winograd_backward_data(w, dy, gx, *geo)()
            np.testing.assert_allclose(gx, ref_backward_data(c, w, dy), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("flip", [False, True])
def test_filter_transform_reads_a_transposed_filter_through_its_original(dtype, flip):
    # the backward data's (G, I, O, 3, 3) filter is passed as its contiguous original with
    # ``swap``: the same bits as transforming a contiguous copy of the transpose
    w = np.random.default_rng(4).standard_normal((2, 5, 3, 3, 3)).astype(dtype)
    want = np.empty((16, 2, 3, 5), dtype)
    got = np.empty_like(want)
    winograd_loops.filter_transform(np.ascontiguousarray(w.swapaxes(1, 2)), want, flip, 0, 6)
    ffilter = winograd_loops.compiled()[0]
    ffilter(w, got, flip, True, 0, 6)
    np.testing.assert_array_equal(got, want)


@given(size=st.integers(1, 1 << 20), itemsize=st.sampled_from([4, 8]))
@settings(max_examples=200, deadline=None)
def test_the_transformed_filters_planes_start_in_16_cache_sets(size, itemsize):
    # 64-byte lines, 64 sets of an L1 way (4 KiB): planes a multiple of 4 KiB apart share one
    stride = conv_winograd.plane_stride(size, itemsize)
    assert size <= stride < size + 2 * 64 // itemsize
    assert stride * itemsize % 64 == 0
    assert len({e * stride * itemsize % 4096 // 64 for e in range(16)}) == 16


def _error_over_tolerance(got, want):
    return float(np.max(np.abs(got - want) / (ATOL + RTOL * np.abs(want))))


@pytest.mark.parametrize("direction", ["forward", "backward_data"])
def test_the_widest_reduction_sums_its_channels_in_chunks(direction):
    # one product over all MAX_CHANNELS channels leaves 1.1-1.7x the tolerance at the worst
    # of this many outputs; the chunks of SUM_CHANNELS keep it inside (0.6-0.9)
    top = conv_winograd.MAX_CHANNELS
    assert top > conv_winograd.ONE_PRODUCT_CHANNELS
    c = _case(n=8, icg=top, ocg=top, sshape=(16, 16), pad=(1, 1), seed=7)
    x, w, dy = _arrays(c)
    geo = (c["stride"], c["pad"], c["dilate"], c["flip"])

    def run(sum_channels):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(conv_winograd, "SUM_CHANNELS", sum_channels)
            mp.setattr(conv_winograd, "ONE_PRODUCT_CHANNELS", min(top, sum_channels))
            if direction == "forward":
                got = np.full(dy.shape, np.nan, np.float32)
                conv_winograd.bind_winograd_forward(x, w, got, *geo)()
                return got, ref_forward(c, x, w)
            got = np.full(x.shape, np.nan, np.float32)
            conv_winograd.bind_winograd_backward_data(w, dy, got, *geo)()
            return got, ref_backward_data(c, w, dy)

    chunked, want = run(conv_winograd.SUM_CHANNELS)
    whole, _ = run(top)
    assert _error_over_tolerance(chunked, want) < 1
    # the chunking is what keeps it there: the RMS error of one product is 1.7x the chunks'
    # (stable across draws, where the worst output is not)
    rms = [float(np.sqrt(np.mean((got - want) ** 2))) for got in (chunked, whole)]
    assert rms[0] < 0.75 * rms[1]


def test_wider_reductions_are_refused():
    wide = conv_winograd.MAX_CHANNELS + 1
    c = _case(n=1, icg=wide, ocg=wide, sshape=(6, 6), pad=(1, 1))
    x, w, dy = _arrays(c)
    geo = (c["stride"], c["pad"], c["dilate"])
    assert not conv_winograd.usable_winograd_forward(x, w, dy, *geo)
    assert not conv_winograd.usable_winograd_backward_data(w, dy, x, *geo)
    with pytest.raises(ValueError, match=f"at most {wide - 1} input channels"):
        conv_winograd.bind_winograd_forward(x, w, dy, *geo)
    with pytest.raises(ValueError, match=f"at most {wide - 1} output channels"):
        conv_winograd.bind_winograd_backward_data(w, dy, x, *geo)
    # the other channel count may be as large as it likes
    c = _case(n=1, icg=8, ocg=wide, sshape=(6, 6), pad=(1, 1))
    x, w, dy = _arrays(c)
    y = np.empty(dy.shape, np.float32)
    conv_winograd.bind_winograd_forward(x, w, y, *geo)()
    np.testing.assert_allclose(y, ref_forward(c, x, w), rtol=RTOL, atol=ATOL)


@pytest.mark.skipif(not parallel.can_single_thread_blas(), reason="needs threadpoolctl")
def test_blas_single_threaded_counts_nested_blocks_and_restores():
    before = parallel.blas_thread_counts()  # the BLAS libraries loaded when first asked
    with parallel.blas_single_threaded():
        assert parallel.blas_thread_counts() == [1] * len(before)
        with parallel.blas_single_threaded():
            pass
        assert parallel.blas_thread_counts() == [1] * len(before)  # still inside one
    assert parallel.blas_thread_counts() == before
    with pytest.raises(RuntimeError), parallel.blas_single_threaded():
        raise RuntimeError
    assert parallel.blas_thread_counts() == before


def test_pipelines_leave_the_blas_thread_count_as_they_found_it():
    c = _case(n=4, icg=16, ocg=16, sshape=(12, 12), pad=(1, 1))
    x, w, dy = _arrays(c)
    y = np.empty(dy.shape, np.float32)
    before = parallel.blas_thread_counts()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv_common, "THREADS", 2)
        mp.setattr(conv_winograd, "MIN_BAND_TILES", 1)
        mp.setattr(conv_winograd, "BAND_BYTES", 1)
        conv_winograd.bind_winograd_forward(x, w, y, _ONE, (1, 1), _ONE)()
    np.testing.assert_allclose(y, ref_forward(c, x, w), rtol=RTOL, atol=ATOL)
    assert parallel.blas_thread_counts() == before
