"""megbrain.nn modules: parameters as SharedND, naming, train/eval, state_dict, layers against
NumPy references (forward and gradients), BatchNorm running statistics, seeded Dropout and
initializations."""

from __future__ import annotations

import math

import numpy as np
import pytest

import megbrain as mgb
from megbrain import nn

HAS_CONV = hasattr(mgb.opr, "convolution") and hasattr(mgb.opr, "pooling")
needs_conv = pytest.mark.skipif(
    not HAS_CONV, reason="mgb.opr.convolution / mgb.opr.pooling are not available yet"
)
RNG = np.random.default_rng(0)


def forward(module, x, *, grads=False, upstream=None):
    """Run ``module`` on ``x`` in a fresh graph, with its pending state updates.

    With ``grads``, also returns d(sum(out * upstream))/dx and the gradient of every
    parameter (in ``module.parameters()`` order).
    """
    g = mgb.comp_graph()
    xv = mgb.make_arg("cpu0", g, shape=x.shape, name="x")
    y = module(xv)
    spec = [mgb.copy_output(y)]
    if grads:
        up = np.ones(y.imm_shape, np.float32) if upstream is None else upstream
        loss = (y * mgb.make_immutable("cpu0", g, up)).sum()
        wrt = [xv] + [p.symvar(g) for p in module.parameters()]
        spec += [mgb.copy_output(v) for v in mgb.grad(loss, wrt)]
    out = g.compile([xv], spec + nn.pending_updates(g))(x)
    return out if grads else out[0]


def mlp():
    nn.init.default_rng(0)
    return nn.Sequential(
        nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(),
        nn.Sequential(nn.Linear(8, 8), nn.Tanh()), nn.Linear(8, 3),
    )  # fmt: skip


# ---- Module ---------------------------------------------------------------------------------
def test_parameters_are_shared_nd_with_dotted_names():
    m = mlp()
    names = [n for n, _ in m.named_parameters()]
    assert names == [
        "0.weight", "0.bias", "1.weight", "1.bias", "3.0.weight", "3.0.bias", "4.weight",
        "4.bias",
    ]  # fmt: skip
    assert [n for n, _ in m.named_buffers()] == ["1.running_mean", "1.running_var"]
    assert all(isinstance(p, mgb.SharedND) and p.requires_grad for p in m.parameters())
    assert all(not b.requires_grad for _, b in m.named_buffers())
    assert m[0].weight.shape == (8, 4) and m[0].weight.dtype == np.float32
    assert len(m) == 5 and isinstance(m[3][0], nn.Linear)
    assert [n for n, _ in m.named_modules()][:5] == ["", "0", "1", "2", "3"]


def test_reassigning_attribute_replaces_registration():
    m = nn.Linear(2, 2)
    m.bias = None
    assert [n for n, _ in m.named_parameters()] == ["weight"]
    m.extra = nn.Parameter(np.zeros(1))
    assert [n for n, _ in m.named_parameters()] == ["weight", "extra"]


def test_train_eval_propagate():
    m = mlp()
    assert m.training and m[3][1].training
    assert m.eval() is m
    assert not m.training and not m[1].training and not m[3][1].training
    m.train()
    assert m[3][0].training


def test_state_dict_round_trip_is_exact():
    src = mlp()
    x = RNG.standard_normal((6, 4)).astype(np.float32)
    forward(src, x)  # a training run changes the BatchNorm buffers
    state = src.state_dict()
    assert list(state) == [n for n, _ in src.named_parameters()] + [
        "1.running_mean",
        "1.running_var",
    ]
    assert not np.array_equal(state["1.running_mean"], np.zeros(8, np.float32))

    nn.init.default_rng(99)
    dst = nn.Sequential(
        nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(),
        nn.Sequential(nn.Linear(8, 8), nn.Tanh()), nn.Linear(8, 3),
    )  # fmt: skip
    dst.load_state_dict(state)
    for k, v in dst.state_dict().items():
        np.testing.assert_array_equal(v, state[k], err_msg=k)
    state["0.weight"][...] = 0  # state_dict holds copies
    assert not np.array_equal(src[0].weight.get_value(), state["0.weight"])
    src.eval()
    dst.eval()
    np.testing.assert_array_equal(forward(src, x), forward(dst, x))


@pytest.mark.parametrize(
    "edit,match",
    [
        (lambda s: s.pop("4.bias"), r"missing keys \['4.bias'\]"),
        (lambda s: s.update(extra=np.zeros(1)), r"unexpected keys \['extra'\]"),
        (lambda s: s.update({"0.weight": np.zeros((4, 8))}), r"0.weight has shape \(4, 8\)"),
        (lambda s: s.update({"0.bias": np.array(["a"] * 8)}), "0.bias has dtype"),
    ],
)
def test_load_state_dict_errors_leave_module_unchanged(edit, match):
    m = mlp()
    before = m.state_dict()
    state = {k: v + 1 for k, v in before.items()}
    edit(state)
    with pytest.raises(mgb.MegBrainError, match=match):
        m.load_state_dict(state)
    for k, v in m.state_dict().items():
        np.testing.assert_array_equal(v, before[k])


def test_load_state_dict_not_strict():
    m = mlp()
    m.load_state_dict({"4.bias": np.full(3, 7.0), "extra": np.zeros(2)}, strict=False)
    np.testing.assert_array_equal(m[4].bias.get_value(), np.full(3, 7.0, np.float32))


# ---- Linear and activations ------------------------------------------------------------------
@pytest.mark.parametrize("bias", [True, False])
def test_linear_forward_and_grads(bias):
    nn.init.default_rng(1)
    m = nn.Linear(5, 3, bias=bias)
    x = RNG.standard_normal((4, 5)).astype(np.float32)
    up = RNG.standard_normal((4, 3)).astype(np.float32)
    y, dx, *dps = forward(m, x, grads=True, upstream=up)
    w = m.weight.get_value()
    b = m.bias.get_value() if bias else 0
    np.testing.assert_allclose(y, x @ w.T + b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dx, up @ w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dps[0], up.T @ x, rtol=1e-5, atol=1e-6)
    if bias:
        np.testing.assert_allclose(dps[1], up.sum(0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "layer,fn,dfn",
    [
        (nn.ReLU, lambda x: np.maximum(x, 0), lambda x: (x > 0).astype(np.float32)),
        (nn.Sigmoid, lambda x: 1 / (1 + np.exp(-x)),
         lambda x: np.exp(-x) / (1 + np.exp(-x)) ** 2),
        (nn.Tanh, np.tanh, lambda x: 1 - np.tanh(x) ** 2),
        (nn.ReLU6, lambda x: np.clip(x, 0, 6),
         lambda x: ((x > 0) & (x < 6)).astype(np.float32)),
    ],
)  # fmt: skip
def test_activations(layer, fn, dfn):
    x = RNG.standard_normal((3, 7)).astype(np.float32) * 3
    y, dx = forward(layer(), x, grads=True)
    np.testing.assert_allclose(y, fn(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dx, dfn(x), rtol=1e-4, atol=1e-6)


def test_flatten():
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    y, dx = forward(nn.Flatten(), x, grads=True)
    np.testing.assert_array_equal(y, x.reshape(2, 60))
    np.testing.assert_array_equal(dx, np.ones_like(x))


# ---- BatchNorm ---------------------------------------------------------------------------------
def np_bn_train(x, gamma, beta, eps):
    axes = tuple(a for a in range(x.ndim) if a != 1)
    shp = [1] * x.ndim
    shp[1] = -1
    mean = x.mean(axis=axes, keepdims=True)
    var = x.var(axis=axes, keepdims=True)
    xhat = (x - mean) / np.sqrt(var + eps)
    return xhat * gamma.reshape(shp) + beta.reshape(shp), xhat, var


@pytest.mark.parametrize(
    "cls,shape", [(nn.BatchNorm1d, (16, 5)), (nn.BatchNorm1d, (6, 5, 3)),
                  (nn.BatchNorm2d, (4, 5, 3, 3))],
)  # fmt: skip
def test_batchnorm_training_forward_grads_and_running_stats(cls, shape):
    bn = cls(5, eps=1e-3, momentum=0.2)
    bn.weight.set_value(RNG.uniform(0.5, 1.5, 5).astype(np.float32))
    bn.bias.set_value(RNG.standard_normal(5).astype(np.float32))
    gamma, beta = bn.weight.get_value(), bn.bias.get_value()
    axes = tuple(a for a in range(len(shape)) if a != 1)
    n = int(np.prod([shape[a] for a in axes]))
    ptr_mean, ptr_var = bn.running_mean.dev_ptr, bn.running_var.dev_ptr
    rm, rv = np.zeros(5), np.ones(5)
    for _ in range(2):
        x = (RNG.standard_normal(shape) * 2 + 1).astype(np.float32)
        up = RNG.standard_normal(shape).astype(np.float32)
        y, dx, dgamma, dbeta = forward(bn, x, grads=True, upstream=up)
        want, xhat, var = np_bn_train(x.astype(np.float64), gamma, beta, 1e-3)
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
        shp = [1] * len(shape)
        shp[1] = -1
        sdy, sdyx = up.sum(axis=axes, keepdims=True), (up * xhat).sum(axis=axes, keepdims=True)
        want_dx = gamma.reshape(shp) / np.sqrt(var + 1e-3) * (up - sdy / n - xhat * sdyx / n)
        np.testing.assert_allclose(dx, want_dx, rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(dgamma, sdyx.reshape(5), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(dbeta, sdy.reshape(5), rtol=1e-4, atol=1e-4)
        # running statistics: momentum 0.2, unbiased variance, updated in place
        rm = 0.8 * rm + 0.2 * x.mean(axis=axes)
        rv = 0.8 * rv + 0.2 * x.var(axis=axes, ddof=1)
        np.testing.assert_allclose(bn.running_mean.get_value(), rm, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(bn.running_var.get_value(), rv, rtol=1e-5, atol=1e-6)
        assert (bn.running_mean.dev_ptr, bn.running_var.dev_ptr) == (ptr_mean, ptr_var)

    bn.eval()
    x = RNG.standard_normal(shape).astype(np.float32)
    g = mgb.comp_graph()
    xv = mgb.make_arg("cpu0", g, shape=shape, name="x")
    bn(xv)
    assert nn.pending_updates(g) == []  # eval adds no state updates
    shp = [1] * len(shape)
    shp[1] = -1
    want = (x - rm.reshape(shp)) / np.sqrt(rv.reshape(shp) + 1e-3) * gamma.reshape(
        shp
    ) + beta.reshape(shp)
    np.testing.assert_allclose(forward(bn, x), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(bn.running_mean.get_value(), rm, rtol=1e-5, atol=1e-6)


def test_batchnorm_without_affine():
    bn = nn.BatchNorm1d(3, affine=False)
    assert [n for n, _ in bn.named_parameters()] == []
    x = RNG.standard_normal((10, 3)).astype(np.float32)
    np.testing.assert_allclose(
        forward(bn, x), (x - x.mean(0)) / np.sqrt(x.var(0) + 1e-5), rtol=1e-4, atol=1e-5
    )


def test_pending_updates_collects_every_batchnorm():
    m = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 4), nn.BatchNorm1d(4))
    g = mgb.comp_graph()
    m(mgb.make_arg("cpu0", g, shape=(5, 3), name="x"))
    assert len(nn.pending_updates(g)) == 4
    assert nn.pending_updates(mgb.comp_graph()) == []


# ---- Dropout -------------------------------------------------------------------------------------
def test_dropout_train_eval_and_seed():
    x = np.ones((64, 64), np.float32)
    d = nn.Dropout(0.25, seed=7)
    g = mgb.comp_graph()
    xv = mgb.make_arg("cpu0", g, shape=x.shape, name="x")
    f = g.compile([xv], mgb.copy_output(d(xv)))
    a, b = f(x), f(x)
    assert set(np.unique(a)) <= {0.0, np.float32(1 / 0.75)}
    assert abs((a == 0).mean() - 0.25) < 0.03
    assert not np.array_equal(a, b)  # each run draws a new mask
    np.testing.assert_array_equal(forward(nn.Dropout(0.25, seed=7), x), a)  # same seed
    d.eval()
    np.testing.assert_array_equal(forward(d, x), x)
    np.testing.assert_array_equal(forward(nn.Dropout(0.0), x), x)


def test_dropout_default_seeds_differ_and_follow_init_seed():
    nn.init.default_rng(5)
    s1, s2 = nn.Dropout().seed, nn.Dropout().seed
    nn.init.default_rng(5)
    assert s1 != s2 and nn.Dropout().seed == s1


def test_dropout_grad_uses_the_mask():
    x = RNG.standard_normal((8, 8)).astype(np.float32)
    y, dx = forward(nn.Dropout(0.5, seed=3), x, grads=True)
    np.testing.assert_array_equal(dx == 0, y == 0)
    np.testing.assert_allclose(dx[dx != 0], 2.0)


@pytest.mark.parametrize("p", [-0.1, 1.0])
def test_dropout_bad_p(p):
    with pytest.raises(mgb.MegBrainError, match="p must be in"):
        nn.Dropout(p)


# ---- initializations ----------------------------------------------------------------------------
def test_fan_in_out():
    assert nn.init.fan_in_out((8, 4)) == (4, 8)
    assert nn.init.fan_in_out((16, 3, 5, 5)) == (75, 400)


def test_kaiming_and_xavier_bounds_and_seeding():
    w = nn.init.kaiming_uniform((400, 300), rng=np.random.default_rng(0))
    bound = math.sqrt(1 / 3) * math.sqrt(3 / 300)  # PyTorch's default: a = sqrt(5)
    assert w.dtype == np.float32 and np.abs(w).max() <= bound
    assert np.abs(w).max() > 0.99 * bound
    np.testing.assert_allclose(w.std(), bound / math.sqrt(3), rtol=0.02)
    w = nn.init.kaiming_uniform((400, 300), a=0, rng=np.random.default_rng(0))
    np.testing.assert_allclose(w.std(), math.sqrt(2 / 300), rtol=0.02)  # He: var = 2/fan_in
    x = nn.init.xavier_uniform((400, 300, 1, 1), rng=np.random.default_rng(0))
    np.testing.assert_allclose(x.std(), math.sqrt(2 / 700), rtol=0.02)  # Glorot
    assert np.abs(x).max() <= math.sqrt(6 / 700)
    nn.init.default_rng(3)
    a = nn.Linear(6, 4).weight.get_value()
    nn.init.default_rng(3)
    np.testing.assert_array_equal(nn.Linear(6, 4).weight.get_value(), a)


# ---- convolution and pooling (need mgb.opr.convolution / pooling) ------------------------------
def np_conv2d(x, w, b, stride, pad, groups=1):
    n, c, h, wd = x.shape
    oc, icg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    out = np.zeros((n, oc, oh, ow))
    ocg = oc // groups
    for o in range(oc):
        gi = o // ocg
        for i in range(oh):
            for j in range(ow):
                patch = xp[:, gi * icg:(gi + 1) * icg, i * stride:i * stride + kh,
                           j * stride:j * stride + kw]  # fmt: skip
                out[:, o, i, j] = (patch * w[o]).sum(axis=(1, 2, 3))
    return out + b.reshape(1, -1, 1, 1)


@needs_conv
@pytest.mark.parametrize(
    "stride,pad,groups,ic,oc",
    [(1, 1, 1, 4, 6), (2, 0, 1, 4, 6), (1, 1, 2, 4, 6), (1, 1, 6, 6, 6), (2, 1, 6, 6, 6)],
)
def test_conv2d_forward_and_grads(stride, pad, groups, ic, oc):
    nn.init.default_rng(2)
    m = nn.Conv2d(ic, oc, 3, stride=stride, padding=pad, groups=groups)
    assert m.weight.shape == (oc, ic // groups, 3, 3) and m.bias.shape == (1, oc, 1, 1)
    x = RNG.standard_normal((2, ic, 7, 7)).astype(np.float32)
    y, dx, dw, db = forward(m, x, grads=True)
    w, b = m.weight.get_value(), m.bias.get_value()
    np.testing.assert_allclose(y, np_conv2d(x, w, b, stride, pad, groups), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(db.reshape(-1), np.full(oc, y[:, 0].size), rtol=1e-6)
    # d sum(conv(x, w)) / dw[o, c, i, j] = sum over the inputs the tap (i, j) touches
    e = 1e-2
    for idx in [(0, 0, 0, 0), (5, min(1, w.shape[1] - 1), 2, 1)]:
        wp = w.astype(np.float64).copy()
        wp[idx] += e
        num = (np_conv2d(x, wp, b, stride, pad, groups).sum() - y.astype(np.float64).sum()) / e
        np.testing.assert_allclose(dw[idx], num, rtol=1e-3, atol=1e-3)
    assert dx.shape == x.shape


def np_pool(x, k, s, pad, mode):
    n, c, h, w = x.shape
    oh, ow = (h + 2 * pad - k) // s + 1, (w + 2 * pad - k) // s + 1
    fill = -np.inf if mode == "max" else np.nan
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=fill)
    out = np.zeros((n, c, oh, ow), np.float64)
    for i in range(oh):
        for j in range(ow):
            win = xp[:, :, i * s:i * s + k, j * s:j * s + k]  # fmt: skip
            out[:, :, i, j] = (
                win.max(axis=(2, 3)) if mode == "max" else np.nanmean(win, axis=(2, 3))
            )
    return out


@needs_conv
@pytest.mark.parametrize(
    "cls,mode,k,s,pad",
    [(nn.MaxPool2d, "max", 2, None, 0), (nn.MaxPool2d, "max", 3, 2, 1),
     (nn.AvgPool2d, "avg", 2, None, 0), (nn.AvgPool2d, "avg", 3, 2, 1)],
)  # fmt: skip
def test_pooling(cls, mode, k, s, pad):
    x = RNG.standard_normal((2, 3, 6, 6)).astype(np.float32)
    y, dx = forward(cls(k, stride=s, padding=pad), x, grads=True)
    np.testing.assert_allclose(y, np_pool(x, k, s or k, pad, mode), rtol=1e-5, atol=1e-6)
    if mode == "max" and s is None:
        np.testing.assert_array_equal(dx.sum(axis=(2, 3)), np.full((2, 3), 9.0))
    if mode == "avg" and s is None:
        np.testing.assert_allclose(dx, np.full_like(x, 0.25))


@needs_conv
def test_small_cnn_state_dict_round_trip():
    nn.init.default_rng(4)
    m = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(4 * 4 * 4, 3),
    )  # fmt: skip
    x = RNG.standard_normal((3, 1, 8, 8)).astype(np.float32)
    forward(m, x)
    other = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(4 * 4 * 4, 3),
    )  # fmt: skip
    other.load_state_dict(m.state_dict())
    m.eval()
    other.eval()
    np.testing.assert_array_equal(forward(m, x), forward(other, x))
