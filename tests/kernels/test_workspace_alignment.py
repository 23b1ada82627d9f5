"""Workspace buffers: alignment of the arrays kernels keep and of the default scratch."""

import numpy as np
import pytest

from megbrain.kernels import workspace


@pytest.mark.parametrize("shape", [(0,), (1,), (7, 3), (1000, 17), (4096,)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8])
def test_aligned_arrays_start_on_a_cache_line(shape, dtype):
    for _ in range(8):  # whatever the allocator returns underneath
        a = workspace.aligned(shape, dtype)
        assert a.shape == shape and a.dtype == dtype and a.flags.c_contiguous
        assert a.ctypes.data % workspace.ALIGN == 0
        a[...] = 1  # writable, exactly its own size
        assert a.size == int(np.prod(shape))


def test_default_scratch_is_aligned_and_carved_pieces_too():
    assert workspace.empty((1001,), np.float32).ctypes.data % workspace.ALIGN == 0
    buf = workspace.aligned((4096,), np.uint8)
    carve = workspace.Carver(buf)
    pieces = [carve((n,), np.dtype(np.float32)) for n in (3, 17, 64)]
    assert all(p.ctypes.data % workspace.ALIGN == 0 for p in pieces)


def test_a_constant_packed_filter_is_aligned():
    # the direct convolution's 64-byte filter vectors must not span two cache lines
    from megbrain.kernels.conv import nchw88 as conv_nchw88
    from megbrain.kernels.conv.constant_operands import constant_filter
    from megbrain.kernels.conv.loops.nchw8c import conv_units_blocked

    seen = []

    def spy(xp, wp, *args, **kw):
        seen.append(wp.ctypes.data % workspace.ALIGN)
        return conv_units_blocked(xp, wp, *args, **kw)

    rng = np.random.default_rng(0)
    src = rng.random((1, 2, 6, 6, 8), dtype=np.float32)
    filt = rng.random((2, 2, 3, 3, 8, 8), dtype=np.float32)
    out = np.empty((1, 2, 6, 6, 8), np.float32)
    mp = pytest.MonkeyPatch()
    mp.setattr(conv_nchw88.loops, "conv_units_blocked", spy)
    try:
        with constant_filter(True):
            for _ in range(4):
                algo, step = conv_nchw88.bind_nchw88_forward(src, filt, out, (1, 1), (1, 1),
                                                             (1, 1))  # fmt: skip
                step()
    finally:
        mp.undo()
    assert algo == "DIRECT_NCHW88" and seen and set(seen) == {0}
