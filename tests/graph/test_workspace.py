"""Operator workspaces are declared to the static memory plan and shared between steps."""


import numpy as np

import megbrain as mgb
from megbrain.kernels import workspace


def _conv_chain(g, n=2):
    rng = np.random.default_rng(0)
    x = mgb.make_arg("cpu0", g, shape=(2, 3, 8, 8), name="x")
    h = x
    for i in range(n):
        w = mgb.make_shared(
            "cpu0",
            value=rng.standard_normal((3, 3, 3, 3)).astype(np.float32),
            comp_graph=g,
            name=f"w{i}",
        )
        h = mgb.opr.elem.relu(mgb.opr.convolution(h, w, pad_h=1, pad_w=1))
    return x, h


def _reference(xv, ws):
    def conv(a, w):
        ap = np.pad(a, ((0, 0), (0, 0), (1, 1), (1, 1)))
        out = np.zeros((a.shape[0], w.shape[0], 8, 8), np.float64)
        for i in range(3):
            for j in range(3):
                out += np.einsum("nchw,oc->nohw", ap[:, :, i : i + 8, j : j + 8], w[:, :, i, j])
        return out

    h = xv.astype(np.float64)
    for w in ws:
        h = np.maximum(conv(h, w.astype(np.float64)), 0)
    return h


def test_conv_workspace_is_planned_and_results_match():
    g = mgb.comp_graph()
    x, y = _conv_chain(g)
    f = g.compile([x], mgb.copy_output(y))
    xv = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)
    got = f(xv)
    info = g.current_exec.mem_alloc_info()
    wss = [d for d in info if d["kind"] == "workspace"]
    # each im2col buffer holds (N, C*3*3, H*W) float32 columns
    assert len(wss) == 2 and all(d["size"] >= 2 * 27 * 64 * 4 for d in wss)
    (arena,) = f._func._plan.arenas.values()
    lo = arena.__array_interface__["data"][0]
    assert all(lo <= d["addr"] and d["addr"] + d["size"] <= lo + arena.nbytes for d in wss)
    weights = [
        v.owner.tensor.as_ndarray()
        for v in (o for o in g.all_oprs() for o in o.outputs)
        if v.owner.type_name == "SharedDeviceTensor"
    ]
    np.testing.assert_allclose(got, _reference(xv, weights), rtol=1e-4, atol=1e-4)


def test_workspace_off_without_mem_reuse_gives_same_result():
    xv = np.random.default_rng(2).standard_normal((2, 3, 8, 8)).astype(np.float32)
    results = []
    for reuse in (1, 0):
        g = mgb.comp_graph()
        g.set_option("seq_opt.enable_mem_reuse_alloc", reuse)
        x, y = _conv_chain(g)
        results.append(g.compile([x], mgb.copy_output(y))(xv))
        kinds = {d["kind"] for d in g.current_exec.mem_alloc_info()}
        assert ("workspace" in kinds) == bool(reuse)
    np.testing.assert_array_equal(results[0], results[1])


def test_recorder_and_carver():
    rec = workspace.Recorder()
    with workspace.allocating(rec):
        a = workspace.empty((3, 5), np.float32)
        workspace.empty((7,), np.int8)
    assert a.shape == (3, 5) and rec.nbytes == 64 + 64
    buf = np.zeros(rec.nbytes, np.uint8)
    carver = workspace.Carver(buf)
    with workspace.allocating(carver):
        a = workspace.empty((3, 5), np.float32)
        b = workspace.empty((7,), np.int8)
    assert np.shares_memory(a, buf) and np.shares_memory(b, buf)
    assert not np.shares_memory(a, b)
    outside = workspace.empty((2,), np.float32)  # outside: a fresh aligned array of its own
    assert not np.shares_memory(outside, buf) and outside.ctypes.data % workspace.ALIGN == 0
