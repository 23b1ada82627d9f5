"""TAPWISE_SGEMM (megbrain.kernels.conv.tapwise) and the backward data that runs it, against
float64 references."""

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
@given(c=cases(), threads=st.integers(1, 3))
def test_forward_matches_float64(c, threads):
    # taps over the padding skipped at the borders (a pad past the filter: rows with no tap),
    # partial panels of output channels, rows shared out to the threads
    x, w, _ = _arrays(c)
    out = np.full((c["n"], c["ocg"], *c["oshape"]), np.nan, np.float32)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(parallel, "num_threads", lambda: threads)
        fn = tapwise.bind_tapwise(x, w, out, *_geometry(c))
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
