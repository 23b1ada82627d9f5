"""megbrain.kernels.tiled_jit: the stack tile, the compiler switch restored, and fetch_add
sharing work items between threads (each taken exactly once)."""

from __future__ import annotations

import threading

import numpy as np

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
