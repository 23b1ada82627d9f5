"""Training-graph passes (gopt/training.py): ``mask_pool_grad`` moves the ReLU gradient's
mask before a MAX pooling gradient; the gradients equal those of the unrewritten graph."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import megbrain as mgb
from megbrain import gopt

CN = "cpu0"
F32 = np.float32
POOLS = [(2, 2, 0), (3, 2, 1), (3, 1, 1), (2, 1, 0)]  # window, stride, padding


def _grads(x0, b0, c, pool, act, *, rewrite=True, extra_reader=False, mode="MAX"):
    """Gradients w.r.t. x and b of ``sum(pool(act(x + b)) * c)``, and the compiled seq."""
    g = mgb.comp_graph(check_env_var=False)
    x = mgb.make_shared(CN, value=x0, comp_graph=g, name="x")
    b = mgb.make_shared(CN, value=b0, comp_graph=g, name="b")
    if act == "fused":  # relu(x + b): one FUSE_ADD_RELU, whose gradient reads its output
        y = mgb.opr.elem.relu(x + b)
    else:  # a plain RELU: its gradient reads its input
        y = mgb.opr.elem.relu(x * b)
    win, stride, pad = pool
    p = mgb.opr.pooling(
        y, mode=mode, window_h=win, window_w=win, stride_h=stride, stride_w=stride,
        pad_h=pad, pad_w=pad,
    )
    loss = (p * c).sum()
    if extra_reader:  # y's gradient is a sum: the pooling gradient has another reader
        loss = loss + (y * y).sum()
    gx, gb = mgb.grad(loss, [x, b])
    f = g.compile(None, [mgb.copy_output(gx), mgb.copy_output(gb)])
    return [np.asarray(v) for v in f()], list(f._func.iter_opr_seq())


def _switches(seq):
    return [o for o in seq if o.type_name == "Elemwise" and o.param.mode == "SWITCH_GT0"]


def _without_pass(monkeypatch):
    monkeypatch.setattr(gopt.passes, "PRESET", [p for p in gopt.PRESET if p != "mask_pool_grad"])


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    shape=st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(3, 9), st.integers(3, 9)),
    pool=st.sampled_from(POOLS),
    act=st.sampled_from(["fused", "plain"]),
    ties=st.booleans(),
)
def test_mask_pool_grad_equals_unrewritten_gradients(seed, shape, pool, act, ties):
    rng = np.random.default_rng(seed)
    if ties:  # small integers: equal maxima in a window, zero and all-negative windows
        x0 = rng.integers(-2, 3, shape).astype(F32)
    else:
        x0 = rng.uniform(-1, 1, shape).astype(F32)
    b0 = rng.uniform(0.5, 1.5, (1, shape[1], 1, 1)).astype(F32)
    if act == "fused":
        b0 -= 1.0  # a bias around 0
    win, stride, pad = pool
    out_hw = [(n + 2 * pad - win) // stride + 1 for n in shape[2:]]
    c = rng.uniform(-1, 1, (shape[0], shape[1], *out_hw)).astype(F32)
    got, seq = _grads(x0, b0, c, pool, act)
    with pytest.MonkeyPatch.context() as mp:
        _without_pass(mp)
        want, seq0 = _grads(x0, b0, c, pool, act)
    for a, w in zip(got, want):
        np.testing.assert_array_equal(a, w)  # equal values (a zero's sign may differ)
    # the mask runs on the pooled tensor now
    (sw,) = _switches(seq)
    assert sw.inputs[0].owner.type_name == "PoolingForward"
    (sw0,) = _switches(seq0)
    assert sw0.inputs[1].owner.type_name == "PoolingBackward"


@pytest.mark.parametrize("case", ["extra_reader", "average"])
def test_mask_pool_grad_leaves_other_graphs(case):
    rng = np.random.default_rng(0)
    x0 = rng.uniform(-1, 1, (2, 3, 6, 6)).astype(F32)
    b0 = rng.uniform(-0.5, 0.5, (1, 3, 1, 1)).astype(F32)
    c = rng.uniform(-1, 1, (2, 3, 3, 3)).astype(F32)
    kw = dict(extra_reader=True) if case == "extra_reader" else dict(mode="AVERAGE")
    got, seq = _grads(x0, b0, c, POOLS[0], "fused", **kw)
    (sw,) = _switches(seq)
    assert sw.inputs[0].owner.type_name != "PoolingForward"  # not rewritten
    # and the gradient is still right: against NumPy for the AVERAGE case's b gradient
    if case == "average":
        y = np.maximum(x0 + b0, 0)
        dy = np.repeat(np.repeat(c, 2, axis=2), 2, axis=3) / 4
        np.testing.assert_allclose(got[1], (dy * (y > 0)).sum(axis=(0, 2, 3), keepdims=True),
                                   rtol=1e-5, atol=1e-6)  # fmt: skip


def test_mask_pool_grad_gradient_against_numpy():
    """2x2 MAX pooling after relu(x + b): the rewritten gradient is the NumPy one."""
    rng = np.random.default_rng(1)
    x0 = rng.uniform(-1, 1, (2, 3, 4, 4)).astype(F32)
    b0 = np.zeros((1, 3, 1, 1), F32)
    c = rng.uniform(-1, 1, (2, 3, 2, 2)).astype(F32)
    (gx, gb), seq = _grads(x0, b0, c, POOLS[0], "fused")
    y = np.maximum(x0, 0)
    win = y.reshape(2, 3, 2, 2, 2, 2).transpose(0, 1, 2, 4, 3, 5)  # n c i j di dj
    m = win.max(axis=(4, 5), keepdims=True)
    d = (win == m) * c[:, :, :, :, None, None] * (m > 0)
    want = d.transpose(0, 1, 2, 4, 3, 5).reshape(x0.shape)
    np.testing.assert_allclose(gx, want, rtol=1e-6)
    np.testing.assert_allclose(gb, want.sum(axis=(0, 2, 3), keepdims=True), rtol=1e-5)
