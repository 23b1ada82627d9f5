"""The packed GEMM of a constant matrix (megbrain.kernels.packed_gemm): against the float64
reference over drawn shapes (1, odd, non-multiples of 16), strides and epilogues; the same
bits at 1 and 2 threads and over tilings; nothing allocated at run time; MatrixMul and
BatchedMatrixMul by a constant weight taking it; the tile's sums zmm FMAs on registers."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit
from numba import types as nt
from test_conv_algos import assert_allocates_nothing

import megbrain as mgb
from megbrain.graph import ComputingGraph
from megbrain.kernels import blas, gemm_loops, packed_gemm, parallel
from megbrain.kernels.conv.constant_operands import constant_filter
from megbrain.kernels.conv.pointwise88 import PointwiseTiles
from megbrain.kernels.tiled_jit import vector_width

RTOL, ATOL = 1e-4, 1e-5
_ACTS = {"none": 0, "bias": 1, "relu": 1 | 4, "hswish": 1 | 8}


def _operands(m, k, n, seed):
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    b = (rng.uniform(-1, 1, (k, n)) / np.sqrt(k)).astype(np.float32)  # sums of order 1
    bias = rng.uniform(-1, 1, n).astype(np.float32)
    return a, b, bias


def _want(a, b, bias, act):
    y = a.astype(np.float64) @ b.astype(np.float64)
    if act != "none":
        y = y + bias
    if act == "relu":
        y = np.maximum(y, 0)
    elif act == "hswish":
        y = y * np.clip(y + 3, 0, 6) / 6
    return y


def _check_product(m, k, n, trans_b, strided, act, seed):
    a, b, bias = _operands(m, k, n, seed)
    if trans_b:  # a transposed view, as a Gemm's transB weight
        b = np.ascontiguousarray(b.T).T
    if strided:  # rows of a wider matrix, written into rows of a wider one
        a = np.concatenate([a, a[:, :1]], axis=1)[:, :k]
        out = np.full((m, n + 3), np.nan, np.float32)[:, :n]
    else:
        out = np.full((m, n), np.nan, np.float32)
    assert packed_gemm.usable_packed_matmul(a, b, out)
    step = packed_gemm.bind_packed_matmul(a, b, out, True, bias=bias, epi=_ACTS[act])
    step()
    np.testing.assert_allclose(out, _want(a, b, bias, act), rtol=RTOL, atol=ATOL)
    want = _want(2 * a, b, bias, act)
    a *= 2  # the left operand is read at every run; the constant one was packed once
    b *= 0
    step()
    np.testing.assert_allclose(out, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("m,k,n,trans_b,strided,act", [
    (1, 1, 1, False, False, "none"), (1, 96, 100, True, False, "bias"),
    (7, 17, 33, False, True, "relu"), (49, 3, 48, True, True, "hswish"),
    (100, 16, 5, False, False, "relu"),
])  # fmt: skip
def test_matches_float64(m, k, n, trans_b, strided, act):
    _check_product(m, k, n, trans_b, strided, act, seed=m + n)


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(m=st.sampled_from([1, 2, 3, 7, 13, 16, 49, 100]), k=st.sampled_from([1, 3, 16, 17, 96]),
       n=st.sampled_from([1, 5, 16, 17, 33, 48, 100]), trans_b=st.booleans(),
       strided=st.booleans(), act=st.sampled_from(sorted(_ACTS)), seed=st.integers(0, 9))
def test_matches_float64_drawn(m, k, n, trans_b, strided, act, seed):
    # every drawn tiling compiles a kernel variant on a cold cache: slow
    _check_product(m, k, n, trans_b, strided, act, seed)


def test_a_non_constant_matrix_is_packed_at_every_run():
    a, b, _ = _operands(20, 24, 40, 0)
    out = np.empty((20, 40), np.float32)
    step = packed_gemm.bind_packed_matmul(a, b, out, False)
    step()
    b *= 2
    step()
    np.testing.assert_allclose(out, 2 * (a.astype(np.float64) @ b / 2), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("shape", [(100, 96, 384), (49, 300, 77), (1, 1280, 1000), (3, 8, 16)])
def test_bits_do_not_depend_on_threads_or_tiling(monkeypatch, shape):
    a, b, bias = _operands(*shape, seed=1)
    monkeypatch.setattr(packed_gemm, "MIN_SPLIT_MACS", 0)
    outs = []
    for threads in (1, 2, 3):
        monkeypatch.setattr(parallel, "num_threads", lambda t=threads: t)
        outs.append(np.empty(shape[::2], np.float32))
        packed_gemm.bind_packed_matmul(a, b, outs[-1], True, bias=bias, epi=5)()
    nblk = -(-shape[2] // 16)
    outs.append(np.empty(shape[::2], np.float32))
    tiles = PointwiseTiles(1, 1, nblk, 1, shape[0])  # one row by one block a tile
    packed_gemm.bind_packed_matmul(a, b, outs[-1], True, bias=bias, epi=5, tiles=tiles)()
    for o in outs[1:]:
        assert np.array_equal(outs[0], o)


@pytest.mark.parametrize("constant", [False, True])
def test_a_run_allocates_nothing(monkeypatch, constant):
    monkeypatch.setattr(parallel, "num_threads", lambda: 2)
    a, b, bias = _operands(60, 64, 96, 2)
    out = np.empty((60, 96), np.float32)
    step = packed_gemm.bind_packed_matmul(a, b, out, constant, bias=bias, epi=5)
    step()
    assert_allocates_nothing(step)


def test_the_tiling_fits_the_registers_and_the_columns():
    for m, k, n in ((3136, 96, 384), (49, 3072, 768), (1, 1280, 1000), (5, 7, 33), (1, 3, 1)):
        tl = packed_gemm.packed_tiles(m, k, n, 2)
        assert tl.r <= m and tl.r * tl.b <= 24 and tl.ng * tl.b == -(-n // 16)


def _graph_product(batched, trans_b, constant_b, m=37, k=20, n=45):
    a, b, _ = _operands(m, k, n, 3)
    bt = np.ascontiguousarray(b.T) if trans_b else b
    cn, g = "cpu0", ComputingGraph()
    # shared tensors (parameters) are not constant without weight_preprocess
    x = mgb.make_shared(cn, value=a[None] if batched else a, comp_graph=g)
    wv = bt[None] if batched else bt
    w = (mgb.make_immutable(cn, g, wv) if constant_b
         else mgb.make_shared(cn, value=wv, comp_graph=g))  # fmt: skip
    mm = mgb.opr.batched_matrix_mul if batched else mgb.opr.matrix_mul
    got = {}
    f = g.compile([(mm(x, w, transposeB=trans_b).node, lambda v: got.setdefault("y", np.array(v)))])
    f.execute().wait()
    return got["y"].reshape(m, n), a, b


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("constant_b", [False, True])
def test_matrix_mul_by_a_constant_weight_takes_it(monkeypatch, batched, trans_b, constant_b):
    taken = []
    bind = packed_gemm.bind_packed_matmul
    monkeypatch.setattr(packed_gemm, "bind_packed_matmul",
                        lambda *a, **kw: taken.append(1) or bind(*a, **kw))  # fmt: skip
    y, a, b = _graph_product(batched, trans_b, constant_b)
    np.testing.assert_allclose(y, a.astype(np.float64) @ b, rtol=RTOL, atol=ATOL)
    assert bool(taken) == constant_b


def test_a_broadcast_batch_by_one_constant_matrix_is_one_product():
    a, b, _ = _operands(4 * 9, 12, 20, 4)
    a3, out = a.reshape(4, 9, 12), np.empty((4, 9, 20), np.float32)
    with constant_filter(True):
        step = blas.bind_batched_matmul(a3, np.broadcast_to(b, (4, 12, 20)), out)
    step()
    np.testing.assert_allclose(out.reshape(36, 20), a.astype(np.float64) @ b, rtol=RTOL,
                               atol=ATOL)  # fmt: skip


@pytest.mark.skipif(vector_width() != 16, reason="a tile of 24 accumulators: AVX-512")
def test_the_sums_are_zmm_fmas_on_registers():
    # compiled afresh (a kernel loaded from Numba's cache keeps no assembly): 8 rows by 3
    # blocks, in the tile and its masked twin, all zmm, none spilled to the stack
    fr = nt.Array(nt.float32, 1, "C", readonly=True)
    run = gemm_loops._units_py(8, 3, 5, 1 | 4)
    asm = "\n".join(njit([nt.void(fr, fr, nt.float32[::1], fr, fr, fr, nt.int64[::1],
                                   nt.int64[::1], nt.int64)], error_model="numpy",
                          fastmath={"contract"})(run).inspect_asm().values())  # fmt: skip
    assert len(re.findall(r"vfmadd\w*ps\s+%zmm", asm)) >= 2 * 8 * 3
    assert not re.search(r"vfmadd\w*ps\s+%[xy]mm", asm)
    assert not re.search(r"zmm\d+, -?\w*\(%rsp\)", asm)


def test_the_benchmark_runs_and_agrees_with_onnxruntime(benchmark_module):
    # benchmarks/constant_gemm.py on two small products, so that it cannot rot; times unchecked
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    bench = benchmark_module("constant_gemm")

    assert len(bench.main(["--smoke"])) == 2


@pytest.mark.slow
def test_the_tiling_sweep_runs(benchmark_module):
    # --sweep's timing of a product's tilings (a variant compiled per tiling: slow)
    bench = benchmark_module("constant_gemm")

    model, t, ranked = bench.sweep_tilings((30, 8, 48), 1)
    assert t > 0 and any(tl == model or (tl.r, tl.b) == (model.r, model.b) for _, tl in ranked)


def test_operands_it_cannot_read_in_place_are_left_to_blas():
    a, b, _ = _operands(6, 8, 20, 5)
    out = np.empty((6, 20), np.float32)
    usable = packed_gemm.usable_packed_matmul
    assert usable(a, b, out)
    assert not usable(np.asfortranarray(a), b, out)  # a transposed A: columns strided
    assert not usable(a[::-1], b, out)
    assert not usable(a.astype(np.float64), b.astype(np.float64), out.astype(np.float64))
    square = np.ones((6, 6), np.float32)
    assert not usable(square, np.ones((6, 6), np.float32), square)  # in place
    c = np.ones((6, 0), np.float32)
    assert not usable(c, np.ones((0, 20), np.float32), out)  # k = 0: zeros, BLAS's
