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


# ---- fuse_bn_activation -------------------------------------------------------------------
def _bn_step(x0, c0, tail, *, fuse=True, extra=None, steps=2):
    """Two SGD steps of ``sum(tail(bn(conv(x))) * c)`` (plus ``extra(y)`` of the BatchNorm
    output when given): the losses, the parameters and running statistics after them, and
    the operators of the compiled step."""
    from megbrain import nn, optim

    nn.init.default_rng(0)
    conv, bn = nn.Conv2d(x0.shape[1], 6, 3, padding=1, bias=False), nn.BatchNorm2d(6)
    act = {"RELU6": nn.ReLU6, "RELU": nn.ReLU}[tail]()
    g = mgb.comp_graph(check_env_var=False)
    x = mgb.make_arg(CN, g, shape=x0.shape, name="x")
    c = mgb.make_arg(CN, g, shape=c0.shape, name="c")
    y = bn(conv(x))
    loss = (act(y) * c).sum()
    if extra is not None:
        loss = loss + extra(y)
    opt = optim.SGD(conv.parameters() + bn.parameters(), lr=0.05, momentum=0.9)
    names = [p for p in gopt.PRESET if fuse or p != "fuse_bn_activation"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gopt.passes, "PRESET", names)
        f = g.compile([x, c], [mgb.copy_output(loss)] + opt.minimize(loss))
    losses = [float(f(x0, c0)[0][0]) for _ in range(steps)]
    state = {**{f"conv.{k}": v for k, v in conv.state_dict().items()},
             **{f"bn.{k}": v for k, v in bn.state_dict().items()}}  # fmt: skip
    return losses, {k: np.array(v) for k, v in state.items()}, list(f._func.iter_opr_seq())


def _types(seq):
    return [o.type_name for o in seq]


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**31), tail=st.sampled_from(["RELU", "RELU6"]),
       shape=st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(2, 6),
                       st.integers(2, 6)))  # fmt: skip
def test_fuse_bn_activation_equals_unfused(seed, tail, shape):
    """The fused forward and backward give the unfused graph's losses, parameters and
    running statistics bit for bit (random values: no normalized output exactly 6.0)."""
    if shape[0] * shape[2] * shape[3] < 2:
        return
    rng = np.random.default_rng(seed)
    x0 = (rng.standard_normal(shape) * 4).astype(F32)
    c0 = rng.standard_normal((shape[0], 6, *shape[2:])).astype(F32)
    got, gstate, seq = _bn_step(x0, c0, tail)
    want, wstate, seq0 = _bn_step(x0, c0, tail, fuse=False)
    assert got == want
    for k in wstate:
        np.testing.assert_array_equal(gstate[k], wstate[k], err_msg=k)
    assert "BatchNormTail" in _types(seq) and "BatchNormTailBackward" in _types(seq)
    assert "BatchNormForward" not in _types(seq) and "BatchNormBackward" not in _types(seq)
    gone = {"RELU", "MIN", "SWITCH_GT0", "COND_LEQ_MOV"}
    assert not [o for o in seq if o.type_name == "Elemwise" and o.param.mode in gone]
    assert [o for o in seq0 if o.type_name == "Elemwise" and o.param.mode in gone]


def test_fuse_bn_activation_clamps_past_six():
    """Values past 0 and 6 on both sides (a wide input): the gradient of ReLU6 is zero
    there, in the fused graph as in the unfused one."""
    rng = np.random.default_rng(3)
    x0 = (rng.standard_normal((2, 3, 5, 5)) * 50).astype(F32)
    c0 = rng.standard_normal((2, 6, 5, 5)).astype(F32)
    got, gstate, _ = _bn_step(x0, c0, "RELU6")
    want, wstate, _ = _bn_step(x0, c0, "RELU6", fuse=False)
    assert got == want
    for k in wstate:
        np.testing.assert_array_equal(gstate[k], wstate[k], err_msg=k)


def test_fuse_bn_activation_leaves_other_readers():
    """A BatchNorm output read besides its activation keeps the unfused operators (the
    gradient sums the two readers' parts), and the result is still the plain graph's."""
    rng = np.random.default_rng(4)
    x0 = rng.standard_normal((2, 3, 4, 4)).astype(F32)
    c0 = rng.standard_normal((2, 6, 4, 4)).astype(F32)
    extra = lambda y: (y * y).sum()  # noqa: E731
    got, gstate, seq = _bn_step(x0, c0, "RELU6", extra=extra)
    want, wstate, _ = _bn_step(x0, c0, "RELU6", extra=extra, fuse=False)
    assert "BatchNormTail" not in _types(seq)
    assert got == want


def test_fuse_bn_activation_forward_only():
    """Without a gradient the forward alone is fused, and the running statistics update
    once per run."""
    from megbrain import nn

    rng = np.random.default_rng(5)
    x0 = rng.standard_normal((2, 4, 3, 3)).astype(F32) * 5
    outs = []
    for fuse in (True, False):
        nn.init.default_rng(0)
        bn = nn.BatchNorm2d(4)
        g = mgb.comp_graph(check_env_var=False)
        x = mgb.make_arg(CN, g, shape=x0.shape, name="x")
        z = nn.ReLU6()(bn(x))
        names = [p for p in gopt.PRESET if fuse or p != "fuse_bn_activation"]
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(gopt.passes, "PRESET", names)
            f = g.compile([x], [mgb.copy_output(z)])
        got = [np.array(f(x0)[0]) for _ in range(2)]
        stats = {k: np.array(v) for k, v in bn.state_dict().items()}
        outs.append((got, stats, _types(f._func.iter_opr_seq())))
    (got, stats, types), (want, wstats, _) = outs
    assert "BatchNormTail" in types
    for a, w in zip(got, want):
        np.testing.assert_array_equal(a, w)
    for k in wstats:
        np.testing.assert_array_equal(stats[k], wstats[k], err_msg=k)
