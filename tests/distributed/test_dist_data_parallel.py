"""Data-parallel training over the MPI job equals one process training on the concatenated
batch: losses and weights within float32 tolerance (an MLP without dropout, and the digits CNN
with SyncBatchNorm against BatchNorm2d)."""

from __future__ import annotations

import numpy as np
import pytest
from mpi_harness import ctx

import megbrain as mgb
from megbrain import nn, optim
from megbrain.distributed import data_parallel

pytestmark = pytest.mark.mpi(min_size=2)


def _mlp(seed: int):
    nn.init.default_rng(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def _cnn(seed: int, bn):
    nn.init.default_rng(seed)
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), bn(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(8 * 4 * 4, 10),
    )  # fmt: skip


def _step(model, batch: int, opt_cls, dp: bool, **kw):
    g = mgb.comp_graph()
    x = mgb.make_arg("cpu0", g, shape=(batch, 1, 8, 8), name="x")
    y = mgb.make_arg("cpu0", g, shape=(batch, 10), name="y")
    model.train()
    loss = nn.functional.cross_entropy(model(x), y)
    opt = opt_cls(model.parameters(), **kw)
    if dp:
        data_parallel(opt, pack_max_size=2048)  # small buckets: several all-reduces
    updates = opt.minimize(loss) + nn.pending_updates(g)
    return g.compile([x, y], [mgb.copy_output(loss)] + updates)


def _batches(steps: int, batch: int):
    rng = np.random.RandomState(7)
    xs = rng.uniform(0, 1, (steps, batch, 1, 8, 8)).astype("float32")
    ys = np.eye(10, dtype="float32")[rng.randint(0, 10, (steps, batch))]
    return xs, ys


def _compare(make_dp, make_ref, opt_cls, steps=4, global_batch=16, **kw):
    from mpi4py import MPI

    r, n = ctx()
    b = global_batch // n
    global_batch = b * n
    xs, ys = _batches(steps, global_batch)
    dp_model, ref_model = make_dp(seed=100 + r), make_ref(seed=100)  # rank 0's init wins
    dp_step = _step(dp_model, b, opt_cls, True, **kw)
    ref_step = _step(ref_model, global_batch, opt_cls, False, **kw)
    for s in range(steps):
        sl = slice(r * b, (r + 1) * b)
        (loss,) = dp_step(xs[s, sl], ys[s, sl])[:1]
        (ref_loss,) = ref_step(xs[s], ys[s])[:1]
        mean_loss = MPI.COMM_WORLD.allreduce(float(loss[0])) / n
        np.testing.assert_allclose(mean_loss, float(ref_loss[0]), rtol=1e-5)
    dp_state, ref_state = dp_model.state_dict(), ref_model.state_dict()
    assert dp_state.keys() == ref_state.keys()
    for k in dp_state:
        np.testing.assert_allclose(dp_state[k], ref_state[k], rtol=1e-4, atol=1e-5, err_msg=k)


def test_mlp_sgd_momentum():
    _compare(_mlp, _mlp, optim.SGD, lr=0.1, momentum=0.9)


def test_mlp_adam():
    _compare(_mlp, _mlp, optim.Adam, lr=1e-2)


def test_cnn_sync_batch_norm():
    # SGD: the conv bias before a BatchNorm has a zero gradient up to rounding, which Adam
    # would scale up to steps of size lr
    _compare(lambda seed: _cnn(seed, nn.SyncBatchNorm), lambda seed: _cnn(seed, nn.BatchNorm2d),
             optim.SGD, lr=0.1, momentum=0.9)


def test_params_broadcast_from_rank_0():
    r, n = ctx()
    model = _mlp(seed=r)
    opt = optim.SGD(model.parameters(), lr=0.1)
    data_parallel(opt)
    ref = _mlp(seed=0)
    for (k, v), (_, w) in zip(model.state_dict().items(), ref.state_dict().items()):
        np.testing.assert_array_equal(v, w, err_msg=k)


def test_limit_threads_per_rank(monkeypatch):
    """Ranks sharing a machine get its cores split between them (BLAS and the kernels'
    threads), unless the environment sets a thread count."""
    import os

    from threadpoolctl import threadpool_info, threadpool_limits

    from megbrain.distributed import limit_threads_per_rank
    from megbrain.distributed.parallel import THREAD_ENV, _local_ranks
    from megbrain.kernels import parallel

    def blas():
        return {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}

    before = max(blas(), default=1)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert limit_threads_per_rank() is None
    for v in THREAD_ENV:
        monkeypatch.delenv(v, raising=False)
    try:
        n = limit_threads_per_rank()
        assert n == max(1, len(os.sched_getaffinity(0)) // _local_ranks())
        assert blas() <= {n}
        assert parallel.num_threads() == n or not blas()
    finally:
        threadpool_limits(limits=before)
        parallel.num_threads.cache_clear()
