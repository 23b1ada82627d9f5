"""GEMMs run on megbrain's kernel threads with BLAS single-threaded, never on BLAS's own."""

import os
import threading
import time

import numpy as np
import pytest

from megbrain.kernels import blas, gemm, parallel

needs_blas_control = pytest.mark.skipif(
    not parallel.can_single_thread_blas(), reason="needs threadpoolctl and a known BLAS"
)


@pytest.mark.parametrize(
    "m,k,n", [(300, 70, 60), (60, 70, 300), (16, 9, 17), (1, 1, 1), (0, 5, 4), (257, 3, 255)]
)
def test_matmul_step_equals_one_product(m, k, n):
    rng = np.random.default_rng(m * 7 + n)
    a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
    out = np.full((m, n), np.nan, np.float32)
    step = gemm.matmul_step(a, b, out)
    step()
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    first = out.copy()
    a *= 2  # the step reads the operands' current contents, the same way each run
    step()
    np.testing.assert_array_equal(out, 2 * first)


@pytest.mark.parametrize("m,k,n", [(300, 70, 60), (60, 70, 300), (16, 9, 17)])
def test_then_runs_on_each_part_after_its_product(m, k, n):
    rng = np.random.default_rng(m + n)
    a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
    outs = np.full((4, m, n), np.nan, np.float32)  # one for matmul_step, 3 for products
    ref = a.astype(np.float64) @ b
    seen = []

    def then(block, rows):
        assert block.shape[0] == rows.stop - rows.start
        out = next(o for o in outs if np.shares_memory(o, block))
        c0 = (block.ctypes.data - out[rows.start].ctypes.data) // out.itemsize

        def step():  # the part's product is done: its block is final
            np.testing.assert_allclose(block, ref[rows, c0 : c0 + block.shape[1]], rtol=1e-5,
                                       atol=1e-5)  # fmt: skip
            seen.append(block.size)
            np.multiply(block, 2, out=block)

        return step

    gemm.matmul_step(a, b, outs[0], then=then)()
    assert sum(seen) == m * n  # the parts cover the output once
    np.testing.assert_allclose(outs[0], 2 * ref, rtol=1e-5, atol=1e-5)
    seen.clear()
    # products of their own outputs: one per thread at a time, or each split
    gemm.products_step([(a, b, o) for o in outs[1:]], [then] * 3)()
    assert sum(seen) == 3 * m * n
    np.testing.assert_allclose(outs[1:], 2 * np.broadcast_to(ref, (3, m, n)), rtol=1e-5,
                               atol=1e-5)  # fmt: skip


def test_matmul_step_writes_a_strided_result_in_place():
    rng = np.random.default_rng(1)
    a = rng.uniform(-1, 1, (40, 300)).astype(np.float32)
    b = rng.uniform(-1, 1, (300, 200)).astype(np.float32)
    big = np.zeros((40, 260), np.float32)
    out = big[:, 30:230]  # a column block: rows 260 apart
    gemm.matmul_step(a, b, out)()
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-4)
    assert not big[:, :30].any() and not big[:, 230:].any()


def _after_a_pool_thread(fn):
    """``fn``, whose calls on the caller's thread wait until a pool thread has called it:
    a caller done with its own part first takes the parts no pool thread has begun back,
    and a test of the split would then see one thread."""
    met = threading.Event()

    def waiting(*args, **kwargs):
        if threading.current_thread().name.startswith("mgb-kernel"):
            met.set()
        else:
            assert met.wait(30), "no pool thread took a part"
        return fn(*args, **kwargs)

    return waiting


@needs_blas_control
@pytest.mark.parametrize("shape", [(512, 256, 64), (64, 256, 512), (512, 256, 512)])
@pytest.mark.parametrize("bind", [gemm.matmul_step, blas.bind_matmul])
def test_a_large_product_is_split_over_the_kernel_threads_blas_single_threaded(
    shape, bind, monkeypatch
):
    # a MatrixMul of an MLP's size (2**27 flops) too: BLAS's own threads are not pinned, and
    # the scheduler kept OpenBLAS's spinning worker on its caller's core for seconds
    m, k, n = shape
    monkeypatch.setattr(parallel, "num_threads", lambda: 2)
    seen = []
    real = np.matmul

    @_after_a_pool_thread
    def recording(x, y, out):
        seen.append((threading.current_thread().name, parallel.blas_thread_counts(), out.shape))
        return real(x, y, out=out)

    monkeypatch.setattr(np, "matmul", recording)
    a, b = np.ones((m, k), np.float32), np.ones((k, n), np.float32)
    out = np.empty((m, n), np.float32)
    before = parallel.blas_thread_counts()
    bind(a, b, out)()
    assert np.all(out == k)
    assert len(seen) == 2 and len({name for name, _, _ in seen}) == 2  # two threads
    assert all(counts == [1] * len(before) for _, counts, _ in seen)
    halves = [(m // 2, n), (m // 2, n)] if m >= n else [(m, n // 2), (m, n // 2)]
    assert sorted(s for _, _, s in seen) == halves
    assert parallel.blas_thread_counts() == before  # restored


def test_a_small_product_is_one_single_threaded_call(monkeypatch):
    seen = []
    real = np.matmul

    def recording(x, y, out):
        seen.append(parallel.blas_thread_counts())
        return real(x, y, out=out)

    monkeypatch.setattr(np, "matmul", recording)
    a, b = np.ones((8, 8), np.float32), np.ones((8, 8), np.float32)
    out = np.empty((8, 8), np.float32)
    blas.bind_matmul(a, b, out)()
    assert len(seen) == 1 and seen[0] == [1] * len(seen[0])


def _thread_cpu_ticks() -> dict[int, int]:
    ticks = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks[int(tid)] = int(fields[11]) + int(fields[12])  # utime + stime
    return ticks


def _thread_names() -> dict[int, str]:
    return {t.native_id: t.name for t in threading.enumerate()}


@needs_blas_control
@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux's /proc")
def test_blas_worker_threads_get_no_work_from_megbrain():
    if parallel.num_threads() < 2 or max(parallel.blas_thread_counts()) < 2:
        pytest.skip("BLAS runs one thread here")
    a = np.random.default_rng(0).random((768, 768), dtype=np.float32)
    out = np.empty_like(a)
    matmul = gemm.matmul_step(a, a, out)
    matmul()  # starts the kernel pool
    mine = {tid for tid, name in _thread_names().items()
            if name == "MainThread" or name.startswith("mgb-kernel")}  # fmt: skip
    mine.add(threading.get_native_id())
    time.sleep(0.5)  # OpenBLAS's workers spin ~0.1 s after the tests' own NumPy products
    before = _thread_cpu_ticks()
    for _ in range(40):
        matmul()
    after = _thread_cpu_ticks()
    others = {tid: after[tid] - before.get(tid, 0) for tid in after if tid not in mine}
    used = sum(after[t] - before.get(t, 0) for t in after if t in mine)
    assert used > 0  # the products ran (ticks are 10 ms)
    # BLAS's own workers (and any other thread) did none of it
    assert sum(others.values()) <= 1, others


def _vector_product_cases():
    rng = np.random.default_rng(5)
    for rows, k in [(1000, 2048), (37, 19), (300, 16), (5, 1), (0, 7), (4, 0)]:
        w = rng.uniform(-1, 1, (rows, k)).astype(np.float32)
        x = rng.uniform(-1, 1, k).astype(np.float32)
        yield x[None, :], w.T, (1, rows)  # a row times the transpose of a matrix
        yield w, x[:, None], (rows, 1)  # a matrix times a column


@pytest.mark.parametrize("a,b,shape", list(_vector_product_cases()),
                         ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else None)
def test_a_matrix_vector_product_is_split_over_rows_and_exact_to_float32(a, b, shape,
                                                                         monkeypatch):  # fmt: skip
    ref = a.astype(np.float64) @ b
    outs = []
    for threads in (1, 2, 3):
        monkeypatch.setattr(parallel, "num_threads", lambda t=threads: t)
        out = np.full(shape, np.nan, np.float32)
        step = gemm.matmul_step(a, b, out)
        step()
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * np.sqrt(a.shape[1]))
        outs.append(out)
    for out in outs[1:]:  # the sums' order does not depend on the split
        np.testing.assert_array_equal(out, outs[0])


def test_a_large_matrix_vector_product_runs_its_rows_on_several_threads(monkeypatch):
    from megbrain.kernels import gemv_loops

    monkeypatch.setattr(parallel, "num_threads", lambda: 2)
    seen = []
    real = gemv_loops.dot_rows()
    monkeypatch.setattr(gemv_loops, "dot_rows", lambda: _after_a_pool_thread(lambda *a: seen.append(
        (threading.current_thread().name, a[3:])) or real(*a)))  # fmt: skip
    w = np.ones((1000, 2048), np.float32)
    out = np.empty((1, 1000), np.float32)
    gemm.matmul_step(np.ones((1, 2048), np.float32), w.T, out)()
    assert np.all(out == 2048)
    assert sorted(r for _, r in seen) == [(0, 500), (500, 1000)]
    assert len({name for name, _ in seen}) == 2


@pytest.mark.parametrize("k, rows, parts", [(576, 1024, 2), (1024, 1000, 2), (1280, 1000, 2),
                                            (96, 1000, 1), (576, 72, 1)])  # fmt: skip
def test_a_matrix_vector_product_splits_by_the_bytes_of_its_matrix(k, rows, parts, monkeypatch):
    # memory-bound: MobileNetV3-Small's classifier layers split, its small SE layers do not
    monkeypatch.setattr(parallel, "num_threads", lambda: 2)
    split = parallel.split
    seen = []
    monkeypatch.setattr(parallel, "split", lambda fn, n, m: seen.append(
        len(parallel.ranges(n, 2, m))) or split(fn, n, m))  # fmt: skip
    x = np.random.default_rng(1).uniform(-1, 1, (1, k)).astype(np.float32)
    w = np.random.default_rng(2).uniform(-1, 1, (rows, k)).astype(np.float32)
    out = np.empty((1, rows), np.float32)
    gemm.matmul_step(x, w.T, out)()
    assert seen == [parts]
    np.testing.assert_allclose(out, x.astype(np.float64) @ w.T, rtol=1e-4, atol=1e-4)


def test_a_matrix_vector_product_propagates_nan_and_inf():
    w = np.ones((40, 64), np.float32)
    x = np.ones((1, 64), np.float32)
    w[3, 10] = np.nan
    w[7, 63] = np.inf
    w[9, 0], w[9, 1] = np.inf, -np.inf
    out = np.empty((1, 40), np.float32)
    gemm.matmul_step(x, w.T, out)()
    assert np.isnan(out[0, 3]) and out[0, 7] == np.inf and np.isnan(out[0, 9])
    assert np.all(out[0, [0, 1, 2, 4, 5, 6, 8]] == 64)


def test_other_matrix_vector_products_stay_blas_calls(monkeypatch):
    seen = []
    real = np.matmul
    monkeypatch.setattr(np, "matmul", lambda x, y, out: seen.append(x.dtype) or real(x, y, out=out))
    rng = np.random.default_rng(2)
    a = rng.random((1, 50))
    b = rng.random((50, 30))  # float64; and float32 with strided matrix rows below
    for x, y in [(a, b), (a.astype(np.float32), b.astype(np.float32))]:
        out = np.empty((1, 30), x.dtype)
        gemm.matmul_step(x, y, out)()
        np.testing.assert_allclose(out, a @ b, rtol=1e-5)
    assert len(seen) == 2
    w = rng.random((8, 8)).astype(np.float32)  # the output overlapping an operand
    want = w[:1] @ w.T
    gemm.matmul_step(w[:1], w.T, w[:1])()
    np.testing.assert_allclose(w[:1], want, rtol=1e-6)
    assert len(seen) == 3
