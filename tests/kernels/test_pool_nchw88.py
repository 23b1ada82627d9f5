"""NCHW88 pooling (megbrain.kernels.pool.nchw88) against the NCHW pooling and the float64
reference: drawn windows, strides, paddings, sizes and modes (MAX equal to the NCHW loops,
NaN included; the averages within float32 rounding of float64), non-contiguous operands,
the split over threads, and the geometry checks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_conv_algos import assert_allocates_nothing
from test_conv_nchw88 import _to88
from test_pool_kernels import MODES, ref_forward

from megbrain.kernels import parallel
from megbrain.kernels.conv import nchw88 as conv_nchw88
from megbrain.kernels.pool import binds as pool_binds
from megbrain.kernels.pool import nchw88 as pool88


def _pool88(x, mode, window, stride, pad):
    """The NCHW result of pooling NCHW ``x`` in NCHW88."""
    src = _to88(x)
    out = np.full(pool88.pool_nchw88_shape(src.shape, window, stride, pad), np.nan, np.float32)
    pool88.bind_pooling_nchw88(src, out, mode, window, stride, pad)()
    return conv_nchw88.to_nchw(out)


def _pool_nchw(x, mode, window, stride, pad):
    osp = [pool_binds.pool_out_size(*a) for a in zip(x.shape[2:], window, stride, pad)]
    out = np.empty((*x.shape[:2], *osp), np.float32)
    pool_binds.bind_pooling(x, out, mode, window, stride, pad)()
    return out


@st.composite
def cases(draw):
    window = (draw(st.integers(1, 5)), draw(st.integers(1, 5)))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    pad = tuple(draw(st.integers(0, w - 1)) for w in window)
    sshape = tuple(draw(st.integers(max(1, w - 2 * p), 17)) for w, p in zip(window, pad))
    n, blocks = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    mode = draw(st.sampled_from(MODES))
    seed = draw(st.integers(0, 2**16))
    x = np.random.default_rng(seed).uniform(-2, 2, (n, 8 * blocks, *sshape)).astype(np.float32)
    return x, mode, window, stride, pad


@settings(max_examples=60, deadline=None)
@given(cases())
def test_pool_nchw88_equals_the_nchw_pooling(case):
    x, mode, window, stride, pad = case
    got = _pool88(x, mode, window, stride, pad)
    if mode == "MAX":
        np.testing.assert_array_equal(got, _pool_nchw(x, mode, window, stride, pad))
    else:
        np.testing.assert_allclose(got, ref_forward(x, mode, window, stride, pad), rtol=1e-5,
                                   atol=1e-6)  # fmt: skip


def test_max_propagates_nan_as_the_nchw_pooling():
    x = np.random.default_rng(0).standard_normal((1, 16, 9, 8)).astype(np.float32)
    x[0, 3, 4, 5] = np.nan
    x[0, 12, 0, 0] = np.nan
    geometry = ((3, 3), (2, 2), (1, 1))
    got = _pool88(x, "MAX", *geometry)
    np.testing.assert_array_equal(got, _pool_nchw(x, "MAX", *geometry))
    assert np.isnan(got).sum() == 2 + 1  # (4, 5) is in two windows, (0, 0) in one


def test_non_contiguous_operands_and_the_thread_split(monkeypatch):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 64, 30, 30)).astype(np.float32)
    src = np.empty((2, 8, 30, 31, 8), np.float32)[:, :, :, :30]
    src[...] = _to88(x)
    out = np.empty((2, 8, 15, 16, 8), np.float32)[:, :, :, :15]
    monkeypatch.setattr(pool88, "SPLIT_MIN_ELEMS", 1)
    monkeypatch.setattr(parallel, "num_threads", lambda: 3)
    pool88.bind_pooling_nchw88(src, out, "AVERAGE", (3, 3), (2, 2), (1, 1))()
    want = _pool_nchw(x, "AVERAGE", (3, 3), (2, 2), (1, 1))
    np.testing.assert_array_equal(conv_nchw88.to_nchw(np.ascontiguousarray(out)), want)


@pytest.mark.parametrize(
    "shape, window, pad",
    [((1, 2, 5, 5, 4), (2, 2), (0, 0)), ((1, 2, 5, 5), (2, 2), (0, 0)),
     ((1, 2, 5, 5, 8), (2, 2), (2, 0))],
)  # fmt: skip
def test_the_geometry_is_checked(shape, window, pad):
    with pytest.raises(ValueError):
        pool88.pool_nchw88_shape(shape, window, (1, 1), pad)


@settings(max_examples=30, deadline=None)
@given(cases(), st.integers(2, 5))
def test_the_row_split_is_bit_identical_for_any_thread_count(case, threads):
    x, mode, window, stride, pad = case
    one = _pool88(x, mode, window, stride, pad)
    if mode == "MAX":  # max is exact: the float64 reference's values
        np.testing.assert_array_equal(one, ref_forward(x, mode, window, stride, pad))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pool88, "SPLIT_MIN_ELEMS", 1)
        mp.setattr(parallel, "num_threads", lambda: threads)
        many = _pool88(x, mode, window, stride, pad)
    np.testing.assert_array_equal(many, one)


def test_three_planes_split_over_rows_and_nothing_is_allocated_per_run(monkeypatch):
    x = np.random.default_rng(2).standard_normal((1, 24, 57, 57)).astype(np.float32)
    src = _to88(x)
    out = np.empty(pool88.pool_nchw88_shape(src.shape, (3, 3), (2, 2), (0, 0)), np.float32)
    parts = []
    split = parallel.split
    monkeypatch.setattr(pool88, "SPLIT_MIN_ELEMS", 1)
    monkeypatch.setattr(parallel, "num_threads", lambda: 2)
    monkeypatch.setattr(parallel, "split", lambda fn, n, m: parts.append(n) or split(fn, n, m))
    fn = pool88.bind_pooling_nchw88(src, out, "MAX", (3, 3), (2, 2), (0, 0))
    assert parts == [3 * 28]  # rows, not the 3 planes
    monkeypatch.setattr(parallel, "num_threads", lambda: 1)  # the pool's hand-over allocates
    fn = pool88.bind_pooling_nchw88(src, out, "MAX", (3, 3), (2, 2), (0, 0))
    fn()
    assert_allocates_nothing(fn)
    np.testing.assert_array_equal(conv_nchw88.to_nchw(out),
                                  ref_forward(x, "MAX", (3, 3), (2, 2), (0, 0)))  # fmt: skip


@settings(max_examples=12, deadline=None)
@given(st.integers(2, 5), st.integers(1, 2), st.integers(0, 3), st.integers(240, 700),
       st.integers(0, 2**16))  # fmt: skip
def test_max_rows_wider_than_the_buffer_are_made_in_chunks(ww, sh, pw, width, seed):
    # the separable max makes a row's windows in chunks of ``_MAX_COLS`` source columns
    pw = min(pw, ww - 1)
    x = np.random.default_rng(seed).standard_normal((1, 8, 3, width)).astype(np.float32)
    x[0, 5, 1, width // 2] = np.nan
    geometry = ((3, ww), (sh, 1), (1, pw))
    np.testing.assert_array_equal(_pool88(x, "MAX", *geometry),
                                  _pool_nchw(x, "MAX", *geometry))  # fmt: skip


def test_a_max_window_wider_than_the_buffer_takes_the_tap_loop():
    cols = pool88._MAX_COLS + 3
    x = np.random.default_rng(3).standard_normal((1, 8, 2, cols + 4)).astype(np.float32)
    geometry = ((2, cols), (1, 1), (0, 1))
    np.testing.assert_array_equal(_pool88(x, "MAX", *geometry),
                                  ref_forward(x, "MAX", *geometry))  # fmt: skip


def test_the_separable_max_allocates_nothing_per_run(monkeypatch):
    x = np.random.default_rng(4).standard_normal((1, 16, 14, 300)).astype(np.float32)
    src = _to88(x)
    geometry = ((3, 3), (1, 1), (1, 1))
    out = np.empty(pool88.pool_nchw88_shape(src.shape, *geometry), np.float32)
    monkeypatch.setattr(parallel, "num_threads", lambda: 1)  # the pool's hand-over allocates
    fn = pool88.bind_pooling_nchw88(src, out, "MAX", *geometry)
    fn()
    assert_allocates_nothing(fn)
    np.testing.assert_array_equal(conv_nchw88.to_nchw(out), ref_forward(x, "MAX", *geometry))


@settings(max_examples=40, deadline=None)
@given(cases(), st.integers(0, 2), st.integers(0, 2))
def test_max_with_an_end_padding_equals_pooling_the_source_padded_with_minus_inf(case, eh, ew):
    # ceil mode's end padding (PoolingEndPad): as the NCHW pooling of the padded source
    x, _, window, stride, pad = case
    end = (eh, ew)
    src = _to88(x)
    try:
        shape = pool88.pool_nchw88_shape(src.shape, window, stride, pad, end)
    except ValueError:  # a last window entirely in the padding
        return
    padded = np.pad(x, [(0, 0), (0, 0), (0, eh), (0, ew)], constant_values=-np.inf)
    out = np.full(shape, np.nan, np.float32)
    step = pool88.bind_pooling_nchw88(src, out, "MAX", window, stride, pad, end)
    step()
    np.testing.assert_array_equal(conv_nchw88.to_nchw(out),
                                  _pool_nchw(padded, "MAX", window, stride, pad))  # fmt: skip


def test_an_end_padding_is_for_max_only_and_a_window_must_reach_the_image():
    src = np.zeros((1, 1, 5, 5, 8), np.float32)
    out = np.zeros(pool88.pool_nchw88_shape(src.shape, (2, 2), (2, 2), (0, 0), (1, 1)),
                   np.float32)  # fmt: skip
    assert out.shape[2:4] == (3, 3)
    with pytest.raises(ValueError, match="MAX only"):
        pool88.bind_pooling_nchw88(src, out, "AVERAGE", (2, 2), (2, 2), (0, 0), (1, 1))
    with pytest.raises(ValueError, match="entirely in the padding"):
        pool88.pool_nchw88_shape(src.shape, (2, 2), (2, 2), (0, 0), (3, 0))


def test_the_end_padded_max_allocates_nothing_per_run(monkeypatch):
    x = np.random.default_rng(5).standard_normal((1, 16, 13, 13)).astype(np.float32)
    src = _to88(x)
    geometry = ((3, 3), (2, 2), (0, 0), (1, 1))
    out = np.empty(pool88.pool_nchw88_shape(src.shape, *geometry), np.float32)
    monkeypatch.setattr(parallel, "num_threads", lambda: 1)
    fn = pool88.bind_pooling_nchw88(src, out, "MAX", *geometry)
    fn()
    assert_allocates_nothing(fn)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 3), st.integers(1, 2), st.integers(0, 1), st.integers(0, 1),
       st.integers(3, 20), st.integers(0, 2**16),
       st.sampled_from([np.nan, np.inf, -np.inf]))  # fmt: skip
def test_the_separable_max_keeps_nan_and_infinities_at_any_tap(sh, sw, pad, end, size, seed,
                                                                special):  # fmt: skip
    # overlapping 3-wide windows (stride 1 or 2, ceil mode's end padding) take the separable
    # max, whose maxima are one max instruction and a NaN test of one operand: a NaN, inf
    # or -inf at any tap of a window, on either side of each maximum, gives the NCHW
    # pooling's value
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, 16, size, size + 1)).astype(np.float32)
    hit = rng.random(x.shape) < 0.05
    x[hit] = special
    padded = np.pad(x, [(0, 0), (0, 0), (0, end), (0, end)], constant_values=-np.inf)
    geometry = ((3, 3), (sh, sw), (pad, pad))
    src = _to88(x)
    out = np.full(pool88.pool_nchw88_shape(src.shape, *geometry, (end, end)), 7, np.float32)
    pool88.bind_pooling_nchw88(src, out, "MAX", *geometry, (end, end))()
    np.testing.assert_array_equal(conv_nchw88.to_nchw(out),
                                  _pool_nchw(padded, "MAX", *geometry))  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 3), st.integers(0, 1), st.integers(0, 2),
       st.integers(0, 1), st.integers(1, 3), st.integers(1, 19), st.integers(0, 2**16))  # fmt: skip
def test_max_3_wide_at_column_stride_2_equals_the_nchw_pooling(wh, sh, pw, ph, end, blocks,
                                                                 width, seed):  # fmt: skip
    # the 3x3/s2 poolings (the separable loop's branch for strides above 1): any window
    # height and row stride, left and right edges (padding, ceil mode's end padding),
    # planes of 1-19 columns, NaN at taps
    ph = min(ph, wh - 1)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 8 * blocks, wh + 3, max(width, 3 - 2 * pw))).astype(np.float32)
    x[rng.random(x.shape) < 0.02] = np.nan
    geometry = ((wh, 3), (sh, 2), (ph, pw))
    src = _to88(x)
    try:
        shape = pool88.pool_nchw88_shape(src.shape, *geometry, (end, end))
    except ValueError:  # a last window entirely in the padding
        return
    padded = np.pad(x, [(0, 0), (0, 0), (0, end), (0, end)], constant_values=-np.inf)
    out = np.full(shape, 7, np.float32)
    pool88.bind_pooling_nchw88(src, out, "MAX", *geometry, (end, end))()
    np.testing.assert_array_equal(conv_nchw88.to_nchw(out),
                                  _pool_nchw(padded, "MAX", *geometry))  # fmt: skip

