"""megbrain.optim: every optimizer against a NumPy reference for 3 steps, hyper-parameters
changed between steps without recompiling, and the optimizer state_dict round trip."""

from __future__ import annotations

import numpy as np
import pytest

import megbrain as mgb
from megbrain import nn, optim

RNG = np.random.default_rng(0)
P0 = [RNG.standard_normal((3, 4)).astype(np.float32), RNG.standard_normal(5).astype(np.float32)]
C = [RNG.standard_normal((3, 4)).astype(np.float32), RNG.standard_normal(5).astype(np.float32)]


def np_grad(p, c):
    """Gradient of the test loss ``sum(p * c) + 0.5 * sum(p ** 3)``."""
    return c + 1.5 * p * p


def build(cls, **kw):
    """Parameters, optimizer and the compiled step of the test loss."""
    ps = [nn.Parameter(v) for v in P0]
    g = mgb.comp_graph()
    loss = sum(
        (p.symvar(g) * c).sum() + 0.5 * (p.symvar(g) * p.symvar(g) * p.symvar(g)).sum()
        for p, c in zip(ps, C)
    )
    opt = cls(ps, **kw)
    func = g.compile(None, [mgb.copy_output(loss)] + opt.minimize(loss))
    func.callbefore_func = opt.before_step
    return ps, opt, func


def run(cls, steps=3, **kw):
    ps, _, func = build(cls, **kw)
    out = []
    for _ in range(steps):
        func()
        out.append([p.get_value() for p in ps])
    return out


# ---- NumPy references (float64), PyTorch's formulations ------------------------------------
def ref_sgd(lr, momentum=0.0, nesterov=False, weight_decay=0.0, steps=3):
    ps, bufs, out = [v.astype(np.float64) for v in P0], [None, None], []
    for _ in range(steps):
        for i in range(2):
            d = np_grad(ps[i], C[i]) + weight_decay * ps[i]
            if momentum:
                bufs[i] = d if bufs[i] is None else momentum * bufs[i] + d
                d = d + momentum * bufs[i] if nesterov else bufs[i]
            ps[i] = ps[i] - lr * d
        out.append([p.copy() for p in ps])
    return out


def ref_adam(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, steps=3):
    ps, m, v, out = [x.astype(np.float64) for x in P0], [0, 0], [0, 0], []
    for t in range(1, steps + 1):
        for i in range(2):
            d = np_grad(ps[i], C[i]) + weight_decay * ps[i]
            m[i] = betas[0] * m[i] + (1 - betas[0]) * d
            v[i] = betas[1] * v[i] + (1 - betas[1]) * d * d
            mh, vh = m[i] / (1 - betas[0] ** t), v[i] / (1 - betas[1] ** t)
            ps[i] = ps[i] - lr * mh / (np.sqrt(vh) + eps)
        out.append([p.copy() for p in ps])
    return out


def ref_adagrad(lr=1e-2, eps=1e-10, weight_decay=0.0, steps=3):
    ps, s, out = [x.astype(np.float64) for x in P0], [0, 0], []
    for _ in range(steps):
        for i in range(2):
            d = np_grad(ps[i], C[i]) + weight_decay * ps[i]
            s[i] = s[i] + d * d
            ps[i] = ps[i] - lr * d / (np.sqrt(s[i]) + eps)
        out.append([p.copy() for p in ps])
    return out


def ref_adadelta(lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.0, steps=3):
    ps, sq, acc, out = [x.astype(np.float64) for x in P0], [0, 0], [0, 0], []
    for _ in range(steps):
        for i in range(2):
            d = np_grad(ps[i], C[i]) + weight_decay * ps[i]
            sq[i] = rho * sq[i] + (1 - rho) * d * d
            delta = np.sqrt(acc[i] + eps) / np.sqrt(sq[i] + eps) * d
            acc[i] = rho * acc[i] + (1 - rho) * delta * delta
            ps[i] = ps[i] - lr * delta
        out.append([p.copy() for p in ps])
    return out


def assert_trajectory(got, want, rtol=1e-5, atol=1e-6):
    for step, (gs, ws) in enumerate(zip(got, want)):
        for i, (gv, wv) in enumerate(zip(gs, ws)):
            np.testing.assert_allclose(gv, wv, rtol=rtol, atol=atol, err_msg=f"step {step} p{i}")


CASES = [
    (optim.SGD, ref_sgd, {"lr": 0.1}),
    (optim.SGD, ref_sgd, {"lr": 0.1, "weight_decay": 0.05}),
    (optim.SGD, ref_sgd, {"lr": 0.1, "momentum": 0.9}),
    (optim.SGD, ref_sgd, {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
    (optim.SGD, ref_sgd, {"lr": 0.05, "momentum": 0.8, "nesterov": True, "weight_decay": 0.01}),
    (optim.Adam, ref_adam, {"lr": 0.1}),
    (optim.Adam, ref_adam, {"lr": 0.05, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1}),
    (optim.Adagrad, ref_adagrad, {"lr": 0.1}),
    (optim.Adagrad, ref_adagrad, {"lr": 0.1, "eps": 1e-6, "weight_decay": 0.05}),
    (optim.Adadelta, ref_adadelta, {}),
    (optim.Adadelta, ref_adadelta, {"lr": 0.5, "rho": 0.8, "eps": 1e-4, "weight_decay": 0.05}),
]


@pytest.mark.parametrize("cls,ref,kw", CASES, ids=[f"{c.__name__}-{k}" for c, _, k in CASES])
def test_matches_numpy_reference_for_3_steps(cls, ref, kw):
    assert_trajectory(run(cls, **kw), ref(**kw))


def test_adam_needs_no_callbefore():
    """The bias correction's step count lives in the graph: plain calls are corrected."""
    ps, opt, func = build(optim.Adam, lr=0.1)
    func.callbefore_func = None
    got = []
    for _ in range(3):
        func()
        got.append([p.get_value() for p in ps])
    assert_trajectory(got, ref_adam(lr=0.1))
    assert opt.slots["step"].get_value()[0] == 3


@pytest.mark.parametrize("cls", [optim.SGD, optim.Adam, optim.Adagrad, optim.Adadelta])
def test_lr_change_between_steps_without_recompiling(cls, monkeypatch):
    ps, opt, func = build(cls, lr=0.1)
    compiles = []
    orig = mgb.CompGraph.compile
    monkeypatch.setattr(
        mgb.CompGraph, "compile", lambda *a, **k: compiles.append(1) or orig(*a, **k)
    )
    func()
    before = [p.get_value() for p in ps]
    opt.lr = 0.0  # the step must now leave parameters alone
    assert opt.lr == 0.0
    func()
    for b, p in zip(before, ps):
        np.testing.assert_array_equal(p.get_value(), b)
    opt.set_hyper("lr", 0.1)
    func()
    assert any(not np.array_equal(b, p.get_value()) for b, p in zip(before, ps))
    assert compiles == []


def test_sgd_lr_schedule_matches_reference():
    """lr 0.1, then 0.05, then 0.025: the same function follows each new value."""
    ps, opt, func = build(optim.SGD, lr=0.1, momentum=0.9)
    want = [v.astype(np.float64) for v in P0]
    bufs = [np.zeros_like(w) for w in want]
    for lr in (0.1, 0.05, 0.025):
        opt.lr = lr
        func()
        for i in range(2):
            bufs[i] = 0.9 * bufs[i] + np_grad(want[i], C[i])
            want[i] = want[i] - lr * bufs[i]
    for p, w in zip(ps, want):
        np.testing.assert_allclose(p.get_value(), w, rtol=1e-5, atol=1e-6)


def test_unknown_hyper_parameter():
    _, opt, _ = build(optim.SGD, lr=0.1)
    with pytest.raises(mgb.MegBrainError, match="no hyper-parameter 'beta'"):
        opt.set_hyper("beta", 1.0)


def test_no_parameters():
    with pytest.raises(mgb.MegBrainError, match="no parameters"):
        optim.SGD([], lr=0.1)


@pytest.mark.parametrize(
    "cls,kw",
    [
        (optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
        (optim.Adam, {"lr": 0.1}),
        (optim.Adagrad, {"lr": 0.1}),
        (optim.Adadelta, {"lr": 0.5}),
    ],
)
def test_state_dict_round_trip(cls, kw):
    """Train 2 steps, move parameters and optimizer state to a fresh optimizer: the next
    steps of both agree exactly, and the state dicts round-trip every value."""
    ps_a, opt_a, f_a = build(cls, **kw)
    f_a()
    f_a()
    state = opt_a.state_dict()
    assert state["step"] == 2 and state["slots"]

    ps_b, opt_b, f_b = build(cls, **kw)
    opt_b.set_hyper("lr", 123.0)  # overwritten by the load
    for pa, pb in zip(ps_a, ps_b):
        pb.set_value(pa.get_value())
    opt_b.load_state_dict(state)
    again = opt_b.state_dict()
    assert again["hyper"] == state["hyper"] and again["step"] == 2
    for k, v in state["slots"].items():
        np.testing.assert_array_equal(again["slots"][k], v)

    f_a()
    f_b()
    for pa, pb in zip(ps_a, ps_b):
        np.testing.assert_array_equal(pa.get_value(), pb.get_value())


def test_load_state_dict_mismatch_leaves_optimizer_unchanged():
    _, opt, func = build(optim.Adam, lr=0.1)
    func()
    good = opt.state_dict()

    bad_shape = {**good, "slots": {**good["slots"], "0.exp_avg": np.zeros((2, 2), np.float32)}}
    bad_shape["hyper"] = {**good["hyper"], "lr": 9.0}
    with pytest.raises(mgb.MegBrainError, match="slot '0.exp_avg' has shape"):
        opt.load_state_dict(bad_shape)
    missing = {**good, "slots": {k: v for k, v in good["slots"].items() if k != "1.exp_avg_sq"}}
    with pytest.raises(mgb.MegBrainError, match="slots .* do not match"):
        opt.load_state_dict(missing)
    with pytest.raises(mgb.MegBrainError, match="hyper-parameters"):
        opt.load_state_dict({**good, "hyper": {"lr": 1.0}})
    with pytest.raises(mgb.MegBrainError, match="expected keys"):
        opt.load_state_dict({"slots": good["slots"]})

    now = opt.state_dict()
    assert now["hyper"] == good["hyper"] and now["step"] == good["step"]
    for k, v in good["slots"].items():
        np.testing.assert_array_equal(now["slots"][k], v)


def test_parameter_not_in_loss_is_left_alone():
    used, unused = nn.Parameter(np.ones(3, np.float32)), nn.Parameter(np.ones(2, np.float32))
    g = mgb.comp_graph()
    loss = (used.symvar(g) * used.symvar(g)).sum()
    opt = optim.SGD([used, unused], lr=0.25, momentum=0.5)
    func = g.compile(None, [mgb.copy_output(loss)] + opt.minimize(loss))
    func()
    np.testing.assert_allclose(used.get_value(), np.full(3, 0.5, np.float32))
    np.testing.assert_array_equal(unused.get_value(), np.ones(2, np.float32))


def test_updates_see_gradients_of_the_old_weights():
    """In a 2-layer net the gradient of layer 1 reads layer 2's weight: every update must use
    the weights from before the step (add_update runs after all readers)."""
    nn.init.default_rng(3)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))
    w1, b1, w2, b2 = (p.get_value().astype(np.float64) for p in model.parameters())
    x = RNG.standard_normal((5, 4)).astype(np.float32)
    t = RNG.standard_normal((5, 3)).astype(np.float32)
    g = mgb.comp_graph()
    xv = mgb.make_arg("cpu0", g, shape=x.shape, name="x")
    tv = mgb.make_arg("cpu0", g, shape=t.shape, name="t")
    loss = nn.functional.mse_loss(model(xv), tv)
    opt = optim.SGD(model.parameters(), lr=0.5)
    func = g.compile([xv, tv], [mgb.copy_output(loss)] + opt.minimize(loss))
    func(x, t)

    h = np.tanh(x @ w1.T + b1)
    y = h @ w2.T + b2
    dy = 2 * (y - t) / y.size
    dw2, db2 = dy.T @ h, dy.sum(0)
    dh = (dy @ w2) * (1 - h * h)
    dw1, db1 = dh.T @ x, dh.sum(0)
    for p, w, d in zip(model.parameters(), (w1, b1, w2, b2), (dw1, db1, dw2, db2)):
        np.testing.assert_allclose(p.get_value(), w - 0.5 * d, rtol=1e-5, atol=1e-6)


def test_zero_momentum_or_weight_decay_is_left_out_of_the_step():
    _, opt, func = build(optim.SGD, lr=0.1)
    with pytest.raises(mgb.MegBrainError, match="momentum was 0 at construction"):
        opt.momentum = 0.9
    with pytest.raises(mgb.MegBrainError, match="weight_decay was 0 at construction"):
        opt.set_hyper("weight_decay", 0.1)
    opt.weight_decay = 0.0  # setting it to 0 again is fine
    with pytest.raises(mgb.MegBrainError, match="nesterov needs a non-zero momentum"):
        optim.SGD([nn.Parameter(np.zeros(2))], lr=0.1, nesterov=True)


def test_weight_decay_changeable_when_non_zero():
    ps, opt, func = build(optim.SGD, lr=0.1, weight_decay=0.5)
    opt.weight_decay = 0.01
    func()
    for p, w in zip(ps, ref_sgd(lr=0.1, weight_decay=0.01, steps=1)[0]):
        np.testing.assert_allclose(p.get_value(), w, rtol=1e-5, atol=1e-6)
