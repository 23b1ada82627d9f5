"""megbrain.kernels.tiled_jit: the stack tile, the compiler switch restored, fetch_add
sharing work items between threads (each taken exactly once), and the tile intrinsics."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from megbrain.kernels import tiled_jit


def _kernels():
    from numba import carray
    from numba import types as t

    stack_tile, fetch_add = tiled_jit.stack_tile(), tiled_jit.fetch_add()

    def tile_sum(x):
        acc = carray(stack_tile(8, np.float32), 8)
        for i in range(8):
            acc[i] = 0.0
        for r in range(x.shape[0] // 8):
            for i in range(8):
                acc[i] += x[r * 8 + i]
        s = np.float32(0.0)
        for i in range(8):
            s += acc[i]
        return s

    def take_py(counter, items, mark, owner, me):
        while True:
            k = fetch_add(counter, 0, 1)
            if k >= items:
                return
            mark[k] += 1
            owner[k] = me
            for _ in range(200):  # some work, so that the threads overlap
                owner[k] += 0

    f1, i8 = t.float32[::1], t.int64[::1]
    ts = tiled_jit.compile_tiled(tile_sum, [t.float32(f1)], cache=False)
    tk = tiled_jit.compile_tiled(take_py, [t.void(i8, t.int64, i8, i8, t.int64)], cache=False)
    return ts, tk


def test_stack_tile_sums_and_the_compiler_switch_is_restored():
    from numba.core import config

    before = config.SLP_VECTORIZE
    tile_sum, _ = _kernels()
    assert config.SLP_VECTORIZE == before
    x = np.arange(64, dtype=np.float32)
    assert tile_sum(x) == x.sum()


def test_fetch_add_gives_each_item_to_exactly_one_thread():
    _, take = _kernels()
    items = 20000
    counter = np.zeros(1, np.int64)
    mark = np.zeros(items, np.int64)
    owner = np.full(items, -1, np.int64)
    threads = [threading.Thread(target=take, args=(counter, items, mark, owner, i))
               for i in range(3)]  # fmt: skip
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert (mark == 1).all()  # no item lost or taken twice
    assert counter[0] >= items and set(np.unique(owner)) <= {0, 1, 2}


def _fma_tile_kernel(positions: int, width: int, channels: int):
    from numba import carray
    from numba import types as t

    stack_tile, fma_tile = tiled_jit.stack_tile(), tiled_jit.fma_tile()
    size = positions * width

    def tile_py(xp, x0, wp, w0, cbn, cstride, taps, wnext, out):
        acc = stack_tile(size, np.float32)
        a = carray(acc, size)
        for i in range(size):
            a[i] = out[i]  # the sums continue from out
        fma_tile(acc, positions, width, channels, xp, x0, wp, w0, cbn, cstride, taps, wnext)
        for i in range(size):
            out[i] = a[i]

    f1, i8 = t.float32[::1], t.int64
    sig = t.void(f1, i8, f1, i8, i8, i8, t.int64[::1], i8, f1)
    return tiled_jit.compile_tiled(tile_py, [sig], cache=False)


@pytest.mark.parametrize("positions,width,channels", [(12, 16, 8), (6, 16, 8), (5, 32, 1)])
def test_fma_tile_sums_as_the_scalar_loops_in_their_order(positions, width, channels):
    rng = np.random.default_rng(3)
    tile = _fma_tile_kernel(positions, width, channels)
    cbn, cstride, taps = 3, 200, np.array([0, 1, 9, 11], np.int64)
    wnext = 1000  # the second block of 16 filter values of a 32-wide row
    xp = rng.uniform(-1, 1, 2000).astype(np.float32)
    wp = rng.uniform(-1, 1, 4000).astype(np.float32)
    x0, w0 = 7, 5
    start = rng.uniform(-1, 1, positions * width).astype(np.float32)
    got = start.copy()
    tile(xp, x0, wp, w0, cbn, cstride, taps, wnext, got)
    want = start.reshape(positions, width).astype(np.float64)
    for cb in range(cbn):
        for t_, tap in enumerate(taps):
            for ic in range(channels):
                row = ((cb * len(taps) + t_) * channels + ic) * 16
                w = np.concatenate([wp[w0 + b * wnext + row:][:16] for b in range(width // 16)])
                for p in range(positions):
                    want[p] += xp[x0 + cb * cstride + (tap + p) * channels + ic] * w
    np.testing.assert_allclose(got.reshape(positions, width), want, rtol=1e-5, atol=1e-5)


def test_fma_tile_computes_with_vectors_of_the_target_width():
    tile = _fma_tile_kernel(tiled_jit.tile_positions(), 16, 8)
    llvm = tile.inspect_llvm(tile.signatures[0])
    lanes = tiled_jit.vector_width()
    assert lanes in (8, 16)
    assert f"llvm.fmuladd.v{lanes}f32" in llvm
    assert tiled_jit.tile_positions() == (12 if lanes == 16 else 6)


def _transpose_kernel():
    from numba import types as t

    ts = tiled_jit.transpose_store()

    def run(src, s0, ss, dst, d0, ds, bias, b0, epi):  # pragma: no cover - compiled
        if epi == 0:
            ts(src, s0, ss, dst, d0, ds, bias, b0, 0)
        elif epi == 1:
            ts(src, s0, ss, dst, d0, ds, bias, b0, 1)
        elif epi == 2:
            ts(src, s0, ss, dst, d0, ds, bias, b0, 2)
        else:
            ts(src, s0, ss, dst, d0, ds, bias, b0, 3)

    f1, i8 = t.float32[::1], t.int64
    b1 = t.Array(t.float32, 1, "A", readonly=True)
    return tiled_jit.compile_tiled(run, [t.void(f1, i8, i8, f1, i8, i8, b1, i8, i8)], cache=False)


@pytest.mark.parametrize("epi", [0, 1, 2, 3])
def test_transpose_store_writes_the_block_transposed_with_its_epilogue(epi):
    lanes = tiled_jit.vector_width()
    run = _transpose_kernel()
    rng = np.random.default_rng(epi)
    src = rng.standard_normal(40 * 32).astype(np.float32)
    src[3 + 32 * 2 + 5] = np.nan  # row 2, column 5: NaN at (5, 2), kept by the ReLU
    src[3 + 32 * 4 + 1] = -0.0  # kept as is without a bias
    bias = rng.standard_normal(2 * lanes + 9).astype(np.float32)[::2]  # a strided view
    bias.flags.writeable = False
    dst = np.full(lanes * 50 + 9, 7.0, np.float32)
    run(src, 3, 32, dst, 7, 50, bias, 4, epi)
    want = src[3 : 3 + 32 * lanes].reshape(lanes, 32)[:, :lanes].T.astype(np.float32)
    if epi:
        want = want + bias[4 : 4 + lanes, None]
    if epi == 2:
        want = np.where(want < 0, np.float32(0), want)
    if epi == 3:  # H_SWISH in the elementwise kernels' order, float32 all along
        w = np.fmin(np.fmax(want + np.float32(3), np.float32(0)), np.float32(6))
        want = w * want * np.float32(1 / 6)
    got = dst[7 : 7 + 50 * lanes].reshape(lanes, 50)
    np.testing.assert_array_equal(got[:, :lanes], want)  # NaN where want has it
    assert np.isnan(got[5, 2])
    if epi == 0:
        assert np.signbit(got[1, 4])
    assert np.all(got[:, lanes:] == 7) and np.all(dst[:7] == 7)  # nothing else written


@pytest.mark.parametrize("rows, width", [(7, 32), (14, 32), (3, 8), (2, 16)])
def test_add_rows_adds_the_vector_to_every_row_of_the_tile(rows, width):
    from numba import carray
    from numba import types as t

    stack_tile, add_rows = tiled_jit.stack_tile(), tiled_jit.add_rows()
    size = rows * width

    def run(x, vec, v0, out):
        tile = stack_tile(size, np.float32)
        acc = carray(tile, size)
        for i in range(size):
            acc[i] = x[i]
        add_rows(tile, rows, width, vec, v0)
        for i in range(size):
            out[i] = acc[i]

    f1, i8 = t.float32[::1], t.int64
    fr = t.Array(t.float32, 1, "C", readonly=True)
    kernel = tiled_jit.compile_tiled(run, [t.void(f1, fr, i8, f1)], cache=False)
    rng = np.random.default_rng(rows)
    x = rng.standard_normal(size).astype(np.float32)
    x[3] = np.nan
    vec = rng.standard_normal(width + 5).astype(np.float32)
    vec.flags.writeable = False
    out = np.empty(size, np.float32)
    kernel(x, vec, 5, out)
    want = (x.reshape(rows, width) + vec[5:]).reshape(-1)
    np.testing.assert_array_equal(out, want)  # float32 adds, NaN kept


def _cells(fn) -> list:
    py = getattr(fn, "py_func", fn)
    return [c.cell_contents for c in (py.__closure__ or ())]


def test_cached_kernels_close_over_plain_values_only():
    """Numba keys a cached closure by the pickles of its cells, and a compiled function's
    or an intrinsic's pickle differs in every process: a kernel closing over one compiles
    again in every process. The register-tile kernels call theirs as module globals."""
    from megbrain.kernels import tiled_jit
    from megbrain.kernels.conv.loops import channelwise88, depthwise_bytes, nchw8c, vnni

    kernels = [tiled_jit.take_unit(), nchw8c._tile_out_py(8, 1), vnni._make_gemm(8, 3, 0),
               vnni._make_bands(8, 3, 0, True), channelwise88._make_kernel(3, 1),
               depthwise_bytes._make_depthwise_vnni(2, 1)]  # fmt: skip
    for k in kernels:
        bad = [c for c in _cells(k) if not isinstance(c, (bool, int, float, str, tuple))]
        assert not bad, f"{getattr(k, '__qualname__', k)} closes over {bad}"
