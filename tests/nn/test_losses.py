"""megbrain.nn.functional: log-softmax, softmax, cross-entropy (stable for large logits),
MSE and accuracy, values and gradients against NumPy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import megbrain as mgb
from megbrain.nn import functional as F


def evaluate(fn, *arrays, grad_of_first=False):
    """``fn(*vars)`` computed on ``arrays``; with ``grad_of_first`` also d fn / d arrays[0]."""
    g = mgb.comp_graph()
    vs = [mgb.make_arg("cpu0", g, shape=a.shape, dtype=a.dtype, name=f"a{i}")
          for i, a in enumerate(arrays)]  # fmt: skip
    out = fn(*vs)
    spec = [mgb.copy_output(out)]
    if grad_of_first:
        spec.append(mgb.copy_output(mgb.grad(out, vs[0])))
    res = g.compile(vs, spec)(*arrays)
    return res if grad_of_first else res[0]


def np_log_softmax(x, axis=1):
    x = x.astype(np.float64)
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(1, 6),
    k=st.integers(1, 9),
    scale=st.sampled_from([1.0, 30.0, 1e4]),
    seed=st.integers(0, 2**16),
)
def test_log_softmax_matches_numpy(n, k, scale, seed):
    x = (np.random.default_rng(seed).standard_normal((n, k)) * scale).astype(np.float32)
    got = evaluate(F.log_softmax, x)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, np_log_softmax(x), rtol=1e-5, atol=1e-5 * max(1, scale / 100))


def test_log_softmax_other_axis_and_softmax():
    x = np.random.default_rng(1).standard_normal((3, 4, 5)).astype(np.float32)
    np.testing.assert_allclose(
        evaluate(lambda v: F.log_softmax(v, axis=2), x), np_log_softmax(x, 2), atol=1e-5
    )
    s = evaluate(F.softmax, x)
    np.testing.assert_allclose(s.sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(s, np.exp(np_log_softmax(x, 1)), rtol=1e-5, atol=1e-7)


def ce_reference(x, labels):
    lp = np_log_softmax(x)
    n = len(labels)
    loss = -lp[np.arange(n), labels].mean()
    grad = np.exp(lp)
    grad[np.arange(n), labels] -= 1
    return loss, grad / n


@pytest.mark.parametrize("scale", [1.0, 100.0, 1e4, 1e6])
def test_cross_entropy_onehot_value_and_grad_stable(scale):
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((8, 10)) * scale).astype(np.float32)
    labels = rng.integers(0, 10, 8)
    onehot = np.eye(10, dtype=np.float32)[labels]
    loss, grad = evaluate(F.cross_entropy, x, onehot, grad_of_first=True)
    want_loss, want_grad = ce_reference(x, labels)
    assert np.isfinite(loss).all() and np.isfinite(grad).all()
    np.testing.assert_allclose(loss[0], want_loss, rtol=1e-5)
    np.testing.assert_allclose(grad, want_grad, atol=1e-6)


def test_cross_entropy_int_labels_equals_onehot():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((6, 4)) * 5).astype(np.float32)
    labels = rng.integers(0, 4, 6).astype(np.int32)
    onehot = np.eye(4, dtype=np.float32)[labels]
    l_int, g_int = evaluate(F.cross_entropy, x, labels, grad_of_first=True)
    l_hot, g_hot = evaluate(F.cross_entropy, x, onehot, grad_of_first=True)
    np.testing.assert_allclose(l_int, l_hot, rtol=1e-6)
    np.testing.assert_allclose(g_int, g_hot, atol=1e-7)
    np.testing.assert_allclose(l_int[0], ce_reference(x, labels)[0], rtol=1e-5)


def test_cross_entropy_soft_targets():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((5, 3)).astype(np.float32)
    t = rng.random((5, 3)).astype(np.float32)
    t /= t.sum(axis=1, keepdims=True)
    want = -(np_log_softmax(x) * t).sum(axis=1).mean()
    np.testing.assert_allclose(evaluate(F.cross_entropy, x, t)[0], want, rtol=1e-5)


def test_cross_entropy_of_huge_correct_logit_is_zero():
    x = np.array([[1e30, 0.0, -1e30]], np.float32)
    loss = evaluate(F.cross_entropy, x, np.array([[1, 0, 0]], np.float32))
    assert loss[0] == 0.0


def test_mse_loss_value_and_grad():
    rng = np.random.default_rng(5)
    p = rng.standard_normal((4, 3)).astype(np.float32)
    t = rng.standard_normal((4, 3)).astype(np.float32)
    loss, grad = evaluate(F.mse_loss, p, t, grad_of_first=True)
    np.testing.assert_allclose(loss[0], np.mean((p - t) ** 2), rtol=1e-6)
    np.testing.assert_allclose(grad, 2 * (p - t) / p.size, rtol=1e-5)


def test_accuracy():
    logits = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]], np.float32)
    assert F.accuracy(logits, np.array([1, 0, 0, 1])) == 0.5
    assert F.accuracy(logits, [1, 0, 1, 0]) == 1.0
