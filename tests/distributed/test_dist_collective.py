"""collective_comm's modes and gradients against NumPy, over every rank of the MPI job.

Run with ``mpiexec -n 2 python -m pytest -p no:randomly tests/distributed`` (3 ranks:
``-n 3 ... -m slow`` for the slow variants, which check the same with every size)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from mpi_harness import ctx as _ctx
from mpi_harness import mpi_size

import megbrain as mgb
from megbrain.errors import MegBrainError

pytestmark = pytest.mark.mpi(min_size=2)

_key = itertools.count()


def _data(r: int, shape, seed: int = 0):
    rng = np.random.RandomState(1000 * seed + r)
    return rng.uniform(0.5, 2.0, shape).astype("float32")


def _expected(mode: str, xs: list, n: int):
    """Outputs of every rank (root 0)."""
    k = xs[0].shape[0] // n
    blk = lambda a, i: a[i * k : (i + 1) * k]  # noqa: E731
    z = np.zeros((1,), "float32")
    if mode.startswith("ALL_REDUCE_"):
        f = {"SUM": np.sum, "MAX": np.max, "MIN": np.min, "PROD": np.prod}[mode[11:]]
        return [f(np.stack(xs), axis=0)] * n
    if mode == "BROADCAST":
        return [xs[0]] * n
    if mode == "REDUCE_SUM":
        return [np.sum(xs, axis=0)] + [z] * (n - 1)
    if mode == "ALL_GATHER":
        return [np.concatenate(xs)] * n
    if mode == "REDUCE_SCATTER_SUM":
        return [blk(np.sum(xs, axis=0), i) for i in range(n)]
    if mode == "GATHER":
        return [np.concatenate(xs)] + [z] * (n - 1)
    if mode == "SCATTER":
        return [blk(xs[0], i) for i in range(n)]
    if mode == "ALL_TO_ALL":
        return [np.concatenate([blk(xs[j], i) for j in range(n)]) for i in range(n)]
    raise AssertionError(mode)


def _expected_grads(mode: str, xs: list, ws: list, n: int):
    """d(sum_r sum(out_r * w_r)) / d x_r of every rank, by the chain rule in NumPy."""
    k = xs[0].shape[0] // n
    blk = lambda a, i: a[i * k : (i + 1) * k]  # noqa: E731
    sw = np.sum(ws, axis=0) if all(w.shape == xs[0].shape for w in ws) else None
    m = xs[0].shape[0]  # the rows of each rank's block in a gathered output
    zero = np.zeros_like(xs[0])
    if mode == "ALL_REDUCE_SUM":
        return [sw] * n
    if mode in ("ALL_REDUCE_MAX", "ALL_REDUCE_MIN"):
        y = _expected(mode, xs, n)[0]
        return [np.where(x == y, sw, 0) for x in xs]
    if mode == "ALL_REDUCE_PROD":
        y = _expected(mode, xs, n)[0]
        return [sw * y / x for x in xs]
    if mode == "BROADCAST":
        return [sw] + [zero] * (n - 1)
    if mode == "REDUCE_SUM":
        return [ws[0]] * n
    if mode == "ALL_GATHER":
        tot = np.sum(ws, axis=0)
        return [tot[i * m : (i + 1) * m] for i in range(n)]
    if mode == "REDUCE_SCATTER_SUM":
        return [np.concatenate(ws)] * n
    if mode == "GATHER":
        return [ws[0][i * m : (i + 1) * m] for i in range(n)]
    if mode == "SCATTER":
        return [np.concatenate(ws)] + [zero] * (n - 1)
    if mode == "ALL_TO_ALL":
        return [np.concatenate([blk(ws[i], j) for i in range(n)]) for j in range(n)]
    raise AssertionError(mode)


MODES = [
    "ALL_REDUCE_SUM",
    "ALL_REDUCE_MAX",
    "ALL_REDUCE_MIN",
    "ALL_REDUCE_PROD",
    "BROADCAST",
    "REDUCE_SUM",
    "ALL_GATHER",
    "REDUCE_SCATTER_SUM",
    "GATHER",
    "SCATTER",
    "ALL_TO_ALL",
]


def _check_mode(mode: str, rows_per_rank: int = 2):
    r, n = _ctx()
    shape = (rows_per_rank * n, 3)
    xs = [_data(i, shape, seed=1) for i in range(n)]
    outs = _expected(mode, xs, n)
    ws = [_data(i, o.shape, seed=2) for i, o in enumerate(outs)]
    g = mgb.comp_graph()
    x = mgb.make_shared("cpu0", value=xs[r], comp_graph=g)
    y = mgb.opr.collective_comm(
        x, key=f"t{next(_key)}", nr_devices=n, is_root=r == 0, rank=r, mode=mode
    )
    w = mgb.make_shared("cpu0", value=ws[r], comp_graph=g)
    loss = (y * w).sum()
    gx = mgb.grad(loss, x)
    f = g.compile(None, [mgb.copy_output(y), mgb.copy_output(gx)])
    got_y, got_g = f()
    np.testing.assert_allclose(got_y, outs[r], rtol=1e-5)
    np.testing.assert_allclose(got_g, _expected_grads(mode, xs, ws, n)[r], rtol=1e-5)
    # a second run gives the same (communicators and plans are reused)
    again = f()
    np.testing.assert_allclose(again[0], outs[r], rtol=1e-5)


@pytest.mark.parametrize("mode", MODES)
def test_mode_and_grad(mode):
    _check_mode(mode)


@pytest.mark.parametrize("policy", ["busy", "poll", "yield"])
def test_every_mode_under_each_wait_policy(monkeypatch, policy):
    """``busy`` runs MPI's blocking collectives, ``poll`` and ``yield`` non-blocking ones
    completed by polling: the same results, then a shape change on one rank after runs
    that passed raises on every rank, before any data moves (the next run is fine)."""
    from megbrain.device import mpi_comm

    monkeypatch.setattr(mpi_comm, "wait_policy", lambda: policy)
    for mode in MODES:
        _check_mode(mode)
    f, n = _shape_change_after_good_runs_raises()
    np.testing.assert_array_equal(f(np.full((2, 3), 2, "float32"))[0], np.full((2, 3), 2 * n))


def _shape_change_after_good_runs_raises():
    """Two good runs of an ALL_REDUCE_SUM function, then rank 1's input changes shape: every
    rank raises, naming the shapes. Returns the function and the job's size."""
    r, n = _ctx()
    g = mgb.comp_graph()
    x = mgb.make_arg("cpu0", g, shape=(2, 3), dtype="float32")
    y = mgb.opr.collective_comm(x, key=f"t{next(_key)}", nr_devices=n, is_root=r == 0,
                                rank=r, mode="ALL_REDUCE_SUM")
    f = g.compile([x], [mgb.copy_output(y)])
    for _ in range(2):
        np.testing.assert_array_equal(f(np.ones((2, 3), "float32"))[0], np.full((2, 3), n))
    with pytest.raises(MegBrainError, match=r"input shapes differ.*rank 1: \{3,3\}"):
        f(np.ones((2 + (r == 1), 3), "float32"))
    return f, n


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_mode_and_grad_more_rows(mode):
    _check_mode(mode, rows_per_rank=5)


@pytest.mark.parametrize("mode", ["ALL_REDUCE_SUM", "ALL_GATHER", "REDUCE_SCATTER_SUM",
                                  "ALL_TO_ALL"])
def test_local_grad(mode):
    """local_grad: the reference's communication-free gradients."""
    r, n = _ctx()
    xs = [_data(i, (2 * n, 3), seed=3) for i in range(n)]
    outs = _expected(mode, xs, n)
    ws = [_data(i, o.shape, seed=4) for i, o in enumerate(outs)]
    g = mgb.comp_graph()
    x = mgb.make_shared("cpu0", value=xs[r], comp_graph=g)
    y = mgb.opr.collective_comm(x, key=f"t{next(_key)}", nr_devices=n, is_root=r == 0,
                                rank=r, local_grad=True, mode=mode)
    w = mgb.make_shared("cpu0", value=ws[r], comp_graph=g)
    gx = mgb.grad((y * w).sum(), x)
    got = g.compile(None, [mgb.copy_output(gx)])()[0]
    k = 2
    if mode == "ALL_REDUCE_SUM":
        want = ws[r]
    elif mode == "ALL_GATHER":
        want = ws[r][r * 2 * n : (r + 1) * 2 * n]
    elif mode == "REDUCE_SCATTER_SUM":
        want = np.concatenate([ws[r] if i == r else np.zeros_like(ws[r]) for i in range(n)])
    else:
        want = np.zeros_like(ws[r])
        want[r * k : (r + 1) * k] = ws[r][r * k : (r + 1) * k]
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_broadcast_without_input_on_non_roots():
    """Non-root ranks of BROADCAST may give a graph instead of an input: the shape is the
    root's, known at run time."""
    r, n = _ctx()
    g = mgb.comp_graph()
    val = np.arange(6, dtype="float32").reshape(2, 3) + 7
    if r == 0:
        x = mgb.make_shared("cpu0", value=val, comp_graph=g)
        y = mgb.opr.collective_comm(x, key="bcast_noinp", nr_devices=n, is_root=True, rank=0,
                                    mode="BROADCAST")
    else:
        y = mgb.opr.collective_comm(g, key="bcast_noinp", nr_devices=n, is_root=False,
                                    rank=r, mode="BROADCAST", dtype="float32",
                                    comp_node="cpu0:1024")
    got = g.compile(None, [mgb.copy_output(y)])()[0]
    np.testing.assert_array_equal(got, val)


def test_shapes_differ_raises_on_every_rank():
    r, n = _ctx()
    g = mgb.comp_graph()
    x = mgb.make_shared("cpu0", value=np.ones((2 + r, 3), "float32"), comp_graph=g)
    y = mgb.opr.collective_comm(x, key="badshape", nr_devices=n, is_root=r == 0, rank=r,
                                mode="ALL_REDUCE_SUM")
    f = g.compile(None, [mgb.copy_output(y)])
    want = r"input shapes differ.*rank 0: root \{2,3\}.*rank 1: \{3,3\}"
    with pytest.raises(MegBrainError, match=want):
        f()


def test_rank_must_agree_with_the_job():
    r, n = _ctx()
    g = mgb.comp_graph()
    x = mgb.make_shared("cpu0", value=np.ones((2, 3), "float32"), comp_graph=g)
    y = mgb.opr.collective_comm(x, key="badrank", nr_devices=n, is_root=r == 0, rank=0,
                                mode="ALL_REDUCE_SUM")
    f = g.compile(None, [mgb.copy_output(y)])
    with pytest.raises(MegBrainError, match="distinct rank"):
        f()


def test_nccl_backend_raises_without_cuda():
    g = mgb.comp_graph()
    x = mgb.make_shared("cpu0", value=np.ones((2,), "float32"), comp_graph=g)
    with pytest.raises(MegBrainError, match="nccl.*CUDA"):
        mgb.opr.collective_comm(x, key="n", nr_devices=2, is_root=True, rank=0,
                                mode="ALL_REDUCE_SUM", backend="nccl")


def test_runs_on_its_own_comp_node():
    r, n = _ctx()
    g = mgb.comp_graph()
    x = mgb.make_shared("cpu0", value=np.ones((2,), "float32"), comp_graph=g)
    y = mgb.opr.collective_comm(x, key=f"t{next(_key)}", nr_devices=n, is_root=r == 0,
                                rank=r, mode="ALL_REDUCE_SUM")
    assert str(y.comp_node) == "cpu0:1024"
    z = y * 2  # computed on cpu0 again
    got = g.compile(None, [mgb.copy_output(z)])()[0]
    np.testing.assert_array_equal(got, np.full((2,), 2.0 * n))


@pytest.mark.skipif(mpi_size() != 2, reason="a send/recv pair needs exactly 2 ranks")
def test_remote_send_recv():
    r, _ = _ctx()
    g = mgb.comp_graph()
    val = np.arange(12, dtype="int32").reshape(3, 4)
    if r == 0:
        x = mgb.make_shared("cpu0", value=val, comp_graph=g)
        s = mgb.opr.remote_send("127.0.0.1", 1234, "pair", x)
        g.compile(None, [s])()
    else:
        y = mgb.opr.remote_recv("127.0.0.1", 1234, "pair", g, (3, 4), "int32")
        got = g.compile(None, [mgb.copy_output(y)])()[0]
        np.testing.assert_array_equal(got, val)


def test_config_server_and_barrier():
    assert mgb.config.create_mm_server("0.0.0.0", 2333) == 2333
    mgb.config.group_barrier("127.0.0.1", 2333, _ctx()[1], _ctx()[0])


@pytest.mark.skipif(mpi_size() != 2, reason="a send/recv pair needs exactly 2 ranks")
def test_remote_send_gradient_comes_back_from_the_receiver():
    """is_grad: the sender's gradient is what the receiver sends back on key + ':grad'."""
    r, _ = _ctx()
    g = mgb.comp_graph()
    w = _data(5, (2, 3))
    if r == 0:
        x = mgb.make_shared("cpu0", value=_data(4, (2, 3)), comp_graph=g)
        s = mgb.opr.remote_send(None, None, "act", x, is_grad=True)
        gx = mgb.grad(s.sum(), x)
        (got,) = g.compile(None, [s, mgb.copy_output(gx)])()
        np.testing.assert_allclose(got, w)
    else:
        y = mgb.opr.remote_recv(None, None, "act", g, (2, 3), "float32")
        gy = mgb.grad((y * mgb.make_shared("cpu0", value=w, comp_graph=g)).sum(), y)
        back = mgb.opr.remote_send(None, None, "act:grad", gy)
        got = g.compile(None, [mgb.copy_output(y), back])()[0]
        np.testing.assert_allclose(got, _data(4, (2, 3)))


@pytest.mark.parametrize("mode", ["ALL_REDUCE_SUM", "ALL_REDUCE_MAX", "BROADCAST"])
def test_in_place_on_a_computed_input(mode):
    """A computed input on the communication node, read by nothing else: the output takes its
    memory (MPI_IN_PLACE, no copy of the send buffer) and the values are still right, on the
    first run (header first) and the later ones (header overlapped with the transfer)."""
    r, n = _ctx()
    g = mgb.comp_graph()
    xs = [_data(i, (3, 5), seed=7) for i in range(n)]
    x = mgb.make_shared("cpu0", value=xs[r], comp_graph=g)
    two = mgb.make_immutable("cpu0:1024", g, np.asarray([2.0], "float32"))
    t = mgb.opr.elemwise(x, two, mode="MUL", comp_node="cpu0:1024")
    y = mgb.opr.collective_comm(t, key=f"ip{next(_key)}", nr_devices=n, is_root=r == 0,
                                rank=r, mode=mode)
    f = g.compile(None, [mgb.copy_output(y)])
    want = _expected(mode, [2 * a for a in xs], n)[r]
    for _ in range(3):
        np.testing.assert_allclose(f()[0], want, rtol=1e-6)
    kinds = {d["id"]: d["kind"] for d in g.current_exec.mem_alloc_info()}
    assert kinds[y.node.id] == "inplace"


def test_shapes_differ_after_a_good_run_raises_on_every_rank():
    """The header is exchanged on every run: a rank whose input changes shape after good
    runs fails, and so do the others (under the default wait)."""
    _shape_change_after_good_runs_raises()


def test_waiting_for_a_late_rank_does_not_spin(monkeypatch):
    """Under the ``poll`` wait (``auto`` with more ranks than cores, where a polling rank
    would take a core from a computing one), the rank waiting in a collective for a late
    peer uses almost no CPU time."""
    import time

    from megbrain.device import mpi_comm

    monkeypatch.setattr(mpi_comm, "wait_policy", lambda: "poll")
    r, n = _ctx()
    g = mgb.comp_graph()
    x = mgb.make_shared("cpu0", value=np.ones((1000,), "float32"), comp_graph=g)
    y = mgb.opr.collective_comm(x, key=f"t{next(_key)}", nr_devices=n, is_root=r == 0,
                                rank=r, mode="ALL_REDUCE_SUM")
    f = g.compile(None, [mgb.copy_output(y)])
    f()
    for _ in range(2):  # the first run (which learns the root) and a later one
        if r != 0:
            time.sleep(0.5)
        c0, t0 = time.process_time(), time.perf_counter()
        got = f()[0]
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        np.testing.assert_array_equal(got, np.full((1000,), float(n)))
        if r == 0:
            assert wall > 0.4
            assert cpu < 0.1 * wall, (cpu, wall)


def test_keys_first_used_in_different_orders_on_the_ranks():
    """A function's collectives run on several comp nodes' threads, so their first uses
    (which create the keys' communicators) come in a different order on each rank: every
    rank must still get the same communicators."""
    import threading
    import time

    from megbrain.device import mpi_comm

    r, n = _ctx()
    keys = [f"order-{next(_key)}-{i}" for i in range(3)]
    mine = keys if r % 2 == 0 else keys[::-1]
    got, errors = {}, []

    def use(key):
        try:
            got[key] = mpi_comm.get_comm(key, n, r)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = []
    for key in mine:
        threads.append(threading.Thread(target=use, args=(key,)))
        threads[-1].start()
        time.sleep(0.05)  # each rank's first key is asked for well before its others
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    for key in keys:
        comm = got[key]
        assert (comm.Get_size(), comm.Get_rank()) == (n, r)
        assert comm.allreduce(r) == n * (n - 1) // 2
