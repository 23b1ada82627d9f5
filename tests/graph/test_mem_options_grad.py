"""Gradient graphs under every memory and execution option give the default's results.

Gradients read shapes through static inference (GetVarShape of a MEAN's input, the source
shape of a ConvolutionBackwardData/Filter, a Reshape target): those reads must see the
inferred shapes whatever the memory plan (no forwarding, no reuse, everything dynamic,
threads, sublinear memory, fusion, eager evaluation, several comp nodes).
"""

from __future__ import annotations

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

import megbrain as mgb

CN = "cpu0"
F32 = np.float32
I32 = np.int32

CONFIGS = {
    "default": {},
    "no_mem_plan_opt": {"seq_opt.enable_mem_plan_opt": 0},
    "no_mem_reuse": {"seq_opt.enable_mem_reuse_alloc": 0},
    "plan_off": {"seq_opt.enable_mem_plan_opt": 0, "seq_opt.enable_mem_reuse_alloc": 0},
    "no_seq_comp_node_opt": {"seq_opt.enable_seq_comp_node_opt": 0},
    "force_dynamic": {"force_dynamic_alloc": 1},
    "force_dynamic_no_plan_opt": {"force_dynamic_alloc": 1, "seq_opt.enable_mem_plan_opt": 0},
    "async_0": {"async_exec_level": 0},
    "async_threads": {"async_exec_level": 0b110},
    "sublinear": {"enable_sublinear_memory_opt": 1},
    "opt_level_0": {"graph_opt_level": 0},
    "opt_level_1": {"graph_opt_level": 1},
    "opt_level_3": {"graph_opt_level": 3},
    "jit_1": {"graph_opt.jit": 1},
    "jit_2": {"graph_opt.jit": 2},
    "eager": {"eager_evaluation": 1},
    "alloc_after_compile": {"allocate_static_mem_after_graph_compile": 1},
    "two_comp_nodes": {},  # the loss is computed on cpu1
}


def _graph(config: str) -> mgb.CompGraph:
    g = mgb.comp_graph()
    for k, v in CONFIGS[config].items():
        g.set_option(k, v)
    return g


def _grad(loss, wrt):
    # VirtualGrad is expanded by compile, which an eager graph never reaches
    eager = loss.node.graph.options.eager_evaluation
    return mgb.grad(loss, wrt, use_virtual_grad=False if eager else None)


def _loss(config: str, v):
    if config == "two_comp_nodes":
        v = mgb.opr.copy(v, comp_node="cpu1")
    return (v * v).sum() * 0.5


def _run(config: str, build, feeds: list[dict]) -> list[list[np.ndarray]]:
    """Build with ``build(g, config) -> outputs``, compile, and run once per feed."""
    g = _graph(config)
    outs = build(g, config)
    f = g.compile(None, [mgb.copy_output(o) for o in outs])
    names = {v.name for v in f.inputs}  # a random graph may not read every input
    return [[np.array(a) for a in f(**{k: feed[k] for k in names})] for feed in feeds]


#: results of the default configuration, per case: each config is compared with them
_DEFAULT: dict = {}


def _default(key, build, feeds) -> list[list[np.ndarray]]:
    if key not in _DEFAULT:
        _DEFAULT[key] = _run("default", build, feeds)
    return _DEFAULT[key]


def _check(config, key, build, feeds, expected, rtol=1e-5, atol=1e-5):
    got = _run(config, build, feeds)
    for call, (g_call, e_call) in enumerate(zip(got, expected)):
        for k, (a, b) in enumerate(zip(g_call, e_call)):
            np.testing.assert_allclose(
                a, b, rtol=rtol, atol=atol, err_msg=f"{config}: call {call}, output {k}"
            )
    if config != "default":
        ref = _default(key, build, feeds)
        for g_call, r_call in zip(got, ref):
            for a, b in zip(g_call, r_call):
                np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6, err_msg=config)


configs = pytest.mark.parametrize("config", list(CONFIGS))
rs = np.random.RandomState(0)


# ---- MEAN: its gradient divides by the input's element count (GetVarShape) ------------------
X34 = rs.uniform(-1, 1, (3, 4)).astype(F32)
W34 = rs.uniform(-1, 1, (3, 4)).astype(F32)


@configs
@pytest.mark.parametrize("axis,keepdims", [(-1, False), (0, True), (None, False)])
def test_mean_gradient(config, axis, keepdims):
    def build(g, config):
        x = mgb.make_arg(CN, g, name="x", value=X34)
        w = mgb.make_shared(CN, value=W34, comp_graph=g, name="w")
        m = (x * w).mean(axis=axis, keepdims=keepdims)
        return [_grad(_loss(config, m), w)]

    def expected(x):
        m = (x * W34).mean(axis=axis, keepdims=True)
        n = x.size if axis is None else x.shape[axis]
        return [np.broadcast_to(m, x.shape) * x / n]

    x2 = X34 * 2
    feeds = [{"x": X34}, {"x": x2}]
    _check(config, ("mean", axis, keepdims), build, feeds, [expected(X34), expected(x2)])


# ---- convolution gradients: the output shape of backward data/filter is a shape-only input --
def _conv_np(x, w, stride, pad):
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = sliding_window_view(xp, w.shape[2:], axis=(2, 3))[:, :, ::stride, ::stride]
    return xp, win, np.einsum("nchwij,ocij->nohw", win, w)


def _conv_grads_np(x, w, stride, pad):
    """Gradients of 0.5 * sum(conv(x, w) ** 2) w.r.t. x and w."""
    xp, win, y = _conv_np(x, w, stride, pad)
    dw = np.einsum("nchwij,nohw->ocij", win, y)
    dxp = np.zeros_like(xp)
    oh, ow = y.shape[2:]
    for i in range(w.shape[2]):
        for j in range(w.shape[3]):
            dxp[:, :, i : i + stride * oh : stride, j : j + stride * ow : stride] += np.einsum(
                "nohw,oc->nchw", y, w[:, :, i, j]
            )
    dx = dxp[:, :, pad : xp.shape[2] - pad, pad : xp.shape[3] - pad]
    return dx, dw


# an 8x8 input with stride 2 and pad 1 gives 4x4, as a 7x7 one does: the gradient w.r.t. the
# input needs the input's shape, not only the diff's
XC = rs.uniform(-1, 1, (2, 3, 8, 8)).astype(F32)
WC = rs.uniform(-1, 1, (4, 3, 3, 3)).astype(F32)


@configs
@pytest.mark.parametrize("wrt", ["data", "filter"])
def test_convolution_gradients(config, wrt):
    def build(g, config):
        # both operands are inputs: only the operator of the requested gradient reads them
        x = mgb.make_arg(CN, g, name="x", value=XC)
        w = mgb.make_arg(CN, g, name="w", value=WC)
        y = mgb.opr.convolution(x, w, stride_h=2, stride_w=2, pad_h=1, pad_w=1)
        return [_grad(_loss(config, y), x if wrt == "data" else w)]

    def expected(x, w):
        dx, dw = _conv_grads_np(x, w, 2, 1)
        return [dx if wrt == "data" else dw]

    x2 = XC[:, :, :7, :7].copy()  # another input shape: the gradients re-plan
    feeds = [{"x": XC, "w": WC}, {"x": x2, "w": WC * 0.5}]
    want = [expected(XC, WC), expected(x2, WC * 0.5)]
    _check(config, ("conv", wrt), build, feeds, want, rtol=1e-4)


def test_conv_numpy_reference_matches_forward():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", value=XC)
    w = mgb.make_shared(CN, value=WC, comp_graph=g, name="w")
    y = mgb.opr.convolution(x, w, stride_h=2, stride_w=2, pad_h=1, pad_w=1)
    got = g.compile(None, mgb.copy_output(y))(x=XC)
    np.testing.assert_allclose(got, _conv_np(XC, WC, 2, 1)[2], rtol=1e-4, atol=1e-5)


# ---- reshape to the shape of another var ---------------------------------------------------
C6 = np.arange(6, dtype=F32)


@configs
def test_reshape_to_a_shape_gradient(config):
    def build(g, config):
        c = mgb.make_arg(CN, g, name="c", value=C6)
        b = mgb.make_arg(CN, g, name="b", value=np.ones((2, 3), F32))
        w = mgb.make_shared(CN, value=C6 * 0.5, comp_graph=g, name="w")
        r = (c * w).reshape(b.shape) * 3.0
        flat = mgb.opr.elem.tanh(r).reshape(-1).reshape(r.shape)  # back to its own shape
        return [r, _grad(_loss(config, flat), w)]

    def expected(shape):
        r = (C6 * C6 * 0.5 * 3.0).reshape(shape)
        t = np.tanh(r)
        return [r, (t * (1 - t * t) * 3.0).reshape(-1) * C6]

    feeds = [{"c": C6, "b": np.ones(s, F32)} for s in [(2, 3), (3, 2), (6,)]]
    _check(config, "reshape", build, feeds, [expected(s) for s in [(2, 3), (3, 2), (6,)]])


# ---- indexing by a var -----------------------------------------------------------------------
X54 = rs.uniform(-1, 1, (5, 4)).astype(F32)


@configs
def test_indexing_by_a_var_gradient(config):
    def build(g, config):
        x = mgb.make_arg(CN, g, name="x", value=X54)
        i = mgb.make_arg(CN, g, name="i", dtype=I32, value=np.array([1], I32))
        w = mgb.make_shared(CN, value=X54 * 2, comp_graph=g, name="w")
        v = x * w
        return [v[i], _grad(_loss(config, v[i] + v[i:].sum()), w)]

    def expected(k):
        v = X54 * X54 * 2
        s = v[k:].sum()
        d = np.zeros_like(v)
        d[k] += v[k] + s
        d[k:] += (v[k] + s).sum()
        return [v[k], d * X54]

    feeds = [{"x": X54, "i": np.array([k], I32)} for k in (1, 3, 0, -1)]
    _check(config, "index", build, feeds, [expected(k) for k in (1, 3, 0, -1)], rtol=1e-4)


# ---- random gradient graphs ----------------------------------------------------------------
def _random_graph(seed: int):
    """A small random chain of shape-changing operators over x * w, and its gradients."""
    r = np.random.RandomState(seed)
    x0 = r.uniform(-1, 1, (2, 3, 6, 6)).astype(F32)
    w0 = r.uniform(-1, 1, (2, 3, 6, 6)).astype(F32)
    k0 = r.uniform(-0.5, 0.5, (3, 3, 3, 3)).astype(F32)
    ops = [int(o) for o in r.randint(0, 10, r.randint(3, 7))]

    def build(g, config):
        x = mgb.make_arg(CN, g, name="x", value=x0)
        i = mgb.make_arg(CN, g, name="i", dtype=I32, value=np.array([1], I32))
        w = mgb.make_shared(CN, value=w0, comp_graph=g, name="w")
        k = mgb.make_shared(CN, value=k0, comp_graph=g, name="k")
        v = x * w
        for op in ops:
            shape = v.imm_shape
            nd = len(shape)
            if op == 0:
                v = mgb.opr.elem.tanh(v)
            elif op == 1:
                v = v.mean(axis=-1, keepdims=nd > 2)
            elif op == 2:
                v = v.sum(axis=0, keepdims=True) + v
            elif op == 3:
                v = (v.reshape(-1) * 2.0).reshape(v.shape)
            elif op == 4 and nd > 1:
                v = v.dimshuffle(*reversed(range(nd)))
            elif op == 5 and shape[0] > 1 and nd > 1:
                v = v[i:]
            elif op == 6 and nd == 4 and shape[1] == 3 and min(shape[2:]) >= 3:
                v = mgb.opr.convolution(v, k, pad_h=1, pad_w=1)
            elif op == 7 and nd == 4 and min(shape[2:]) >= 2:
                v = mgb.opr.pooling(v, mode="AVERAGE")
            elif op == 8 and nd >= 2:
                v = v.reshape((shape[0], -1))
                v = mgb.opr.matrix_mul(v, v.dimshuffle(1, 0))
            elif op == 9:
                v = mgb.opr.concat(v, v * 0.5, axis=0)
        loss = _loss(config, v)
        return [loss, _grad(loss, w), _grad(loss, k)]

    feeds = [{"x": x0, "i": np.array([1], I32)}, {"x": x0 * 0.5, "i": np.array([0], I32)}]
    return build, feeds


@pytest.mark.parametrize("config", [c for c in CONFIGS if c != "default"])
def test_random_gradient_graphs_match_the_default(config):
    for seed in range(5):
        build, feeds = _random_graph(seed)
        ref = _default(("random", seed), build, feeds)
        got = _run(config, build, feeds)
        for g_call, r_call in zip(got, ref):
            for a, b in zip(g_call, r_call):
                np.testing.assert_allclose(
                    a, b, rtol=1e-4, atol=1e-5, err_msg=f"{config}, seed {seed}"
                )
