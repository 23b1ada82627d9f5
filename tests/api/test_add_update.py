"""AddUpdate through the API: in-place updates, SharedScalar
coefficients, ordering, the fast path, and an SGD-with-momentum loop."""

from __future__ import annotations

import numpy as np
import pytest

import megbrain as mgb

CN = "cpu0"


def _setup(value=(1.0, 1.0, 1.0), shape=(3,)):
    g = mgb.comp_graph()
    w = mgb.make_shared(CN, value=np.asarray(value, np.float32), comp_graph=g, name="w")
    x = mgb.make_arg(CN, g, name="x", shape=shape)
    return g, w, x


def test_update_in_place():
    g, w, x = _setup()
    ptr = mgb.SharedND._from_symvar(w).dev_ptr
    u = mgb.opr.add_update(w, x)
    f = g.compile([x], mgb.copy_output(u))
    np.testing.assert_array_equal(f(np.arange(3)), [1, 2, 3])
    np.testing.assert_array_equal(w.get_value(), [1, 2, 3])
    np.testing.assert_array_equal(f(np.arange(3)), [1, 3, 5])  # accumulates
    assert mgb.SharedND._from_symvar(w).dev_ptr == ptr


def test_constant_coefficients():
    g, w, x = _setup(np.full(3, 2.0))
    u = mgb.opr.add_update(w, x, alpha=0.5, beta=3.0, bias=1.0)
    f = g.compile([x], [u])
    f(np.ones(3))
    np.testing.assert_allclose(w.get_value(), 0.5 * 2 + 3 * 1 + 1)


def test_shared_scalar_coefficients_change_without_recompile():
    g, w, x = _setup(np.full(3, 2.0))
    alpha, beta, bias = mgb.SharedScalar(1.0), mgb.SharedScalar(1.0), mgb.SharedScalar(0.0)
    u = mgb.opr.add_update(w, x, alpha=alpha, beta=beta, bias=bias)
    f = g.compile([x], [u])
    ref = np.full(3, 2.0, np.float32)
    xv = np.arange(3, dtype=np.float32)
    for a, b, c in [
        (1.0, 1.0, 0.0),
        (0.5, 2.0, 0.0),
        (0.0, 1.0, 0.0),
        (2.0, -1.0, 0.25),
        (1.0, 0.0, 3.0),
    ]:
        alpha.set(a)
        beta.set(b)
        bias.set(c)
        f(xv)
        ref = a * ref + b * xv + c
        np.testing.assert_allclose(w.get_value(), ref, rtol=1e-6)


def test_disable():
    g, w, x = _setup()
    off = mgb.SharedScalar(0)
    u = mgb.opr.add_update(w, x, disable=off)
    f = g.compile([x], [u])
    f(np.ones(3))
    np.testing.assert_array_equal(w.get_value(), [2, 2, 2])
    off.set(1)
    f(np.ones(3))
    f(np.ones(3))
    np.testing.assert_array_equal(w.get_value(), [2, 2, 2])
    off.set(0)
    f(np.ones(3))
    np.testing.assert_array_equal(w.get_value(), [3, 3, 3])


def test_broadcast_delta():
    g = mgb.comp_graph()
    w = mgb.make_shared(CN, value=np.zeros((2, 3), np.float32), comp_graph=g)
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    f = g.compile([x], [mgb.opr.add_update(w, x)])
    f(np.arange(3))
    np.testing.assert_array_equal(w.get_value(), [[0, 1, 2], [0, 1, 2]])
    with pytest.raises(mgb.MegBrainError):
        mgb.opr.add_update(w, mgb.make_arg(CN, g, name="y", shape=(4,)))


def test_dest_must_be_shared():
    g, w, x = _setup()
    with pytest.raises(mgb.MegBrainError):
        mgb.opr.add_update(x, w)


def test_reads_old_and_new_value():
    g, w, x = _setup(np.full(3, 10.0))
    old = w * 1  # reads w: runs before the update
    u = mgb.opr.add_update(w, x)
    new = u * 1  # reads the updated value
    f = g.compile([x], [mgb.copy_output(old), mgb.copy_output(new)])
    o, n = f(np.ones(3))
    np.testing.assert_array_equal(o, [10, 10, 10])
    np.testing.assert_array_equal(n, [11, 11, 11])
    o, n = f(np.ones(3))
    np.testing.assert_array_equal(o, [11, 11, 11])
    np.testing.assert_array_equal(n, [12, 12, 12])


def test_reader_ordered_before_update_regardless_of_creation():
    g, w, x = _setup(np.full(3, 5.0))
    u = mgb.opr.add_update(w, x)  # created first
    old = w * 2  # created after, still reads the old value
    f = g.compile([x], [mgb.copy_output(old), u])
    np.testing.assert_array_equal(f(np.ones(3))[0], [10, 10, 10])
    np.testing.assert_array_equal(w.get_value(), [6, 6, 6])


def test_one_operator_reading_old_and_new_is_a_compile_error():
    g, w, x = _setup()
    u = mgb.opr.add_update(w, x)
    both = u + w
    with pytest.raises(mgb.GraphError, match="reads both"):
        g.compile([x], mgb.copy_output(both))


def test_update_seen_by_next_function():
    g, w, x = _setup()
    f = g.compile([x], [mgb.opr.add_update(w, x)])
    f(np.full(3, 4))
    g2 = mgb.comp_graph()
    v = mgb.SharedND._from_symvar(w).symvar(g2)
    np.testing.assert_array_equal(g2.compile(None, mgb.copy_output(v))(), [5, 5, 5])


# ---- _add_update_fastpath ---------------------------------------------------------------------
def _snd(v, dtype=np.float32, cn=CN):
    return mgb.make_shared(cn, value=np.asarray(v, dtype), dtype=dtype)


@pytest.mark.parametrize(
    "alpha,beta,bias", [(1, 1, 0), (0.5, 2, 1), (0, 1, 0), (0, 3, 0), (2, 0, -1), (1, -1, 0)]
)
def test_fastpath_values(alpha, beta, bias):
    d0 = np.arange(6, dtype=np.float32).reshape(2, 3)
    dv = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    dest, delta = _snd(d0), _snd(dv)
    ptr = dest.dev_ptr
    mgb._add_update_fastpath(dest, delta, alpha, beta, bias)
    np.testing.assert_allclose(dest.get_value(), alpha * d0 + beta * dv + bias, rtol=1e-6)
    assert dest.dev_ptr == ptr
    np.testing.assert_array_equal(delta.get_value(), dv)


def test_fastpath_copy_ignores_old_dest():
    dest = _snd(np.array([np.nan, np.inf, 1.0]))
    mgb._add_update_fastpath(dest, _snd([1.0, 2.0, 3.0]), 0, 1, 0)
    np.testing.assert_array_equal(dest.get_value(), [1, 2, 3])


def test_fastpath_broadcast():
    dest = _snd(np.zeros((2, 3)))
    mgb._add_update_fastpath(dest, _snd([1.0, 2.0, 3.0]), 1, 2, 0)
    np.testing.assert_array_equal(dest.get_value(), [[2, 4, 6], [2, 4, 6]])
    mgb._add_update_fastpath(dest, _snd([5.0]), 0, 1, 0)  # broadcast copy
    np.testing.assert_array_equal(dest.get_value(), np.full((2, 3), 5))
    with pytest.raises(mgb.MegBrainError):
        mgb._add_update_fastpath(dest, _snd(np.ones(4)), 1, 1, 0)


def test_fastpath_int_dtype():
    dest = _snd([1, 2, 3], np.int32)
    mgb._add_update_fastpath(dest, _snd([10, 10, 10], np.int32), 2, 1, 1)
    np.testing.assert_array_equal(dest.get_value(), [13, 15, 17])
    assert dest.dtype == np.int32


def test_fastpath_checks():
    dest = _snd(np.zeros(3))
    with pytest.raises(mgb.MegBrainError):
        mgb._add_update_fastpath(dest, _snd(np.zeros(3), np.int32), 1, 1, 0)
    with pytest.raises(mgb.MegBrainError):
        mgb._add_update_fastpath(dest, _snd(np.zeros(3), cn="cpu1"), 1, 1, 0)
    with pytest.raises(mgb.MegBrainError):
        mgb._add_update_fastpath(np.zeros(3), _snd(np.zeros(3)), 1, 1, 0)


def test_fastpath_from_value_proxy():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    acc = _snd(np.zeros(3))

    def cb(v):
        mgb._add_update_fastpath(acc, v, 1, 0.5, 0)

    f = g.compile([x], [(x * 2, mgb.callback_lazycopy(cb))])
    f(np.arange(3))
    f(np.arange(3))
    np.testing.assert_array_equal(acc.get_value(), [0, 2, 4])


def test_fastpath_proxy_comp_node_checked():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    other = _snd(np.zeros(3), cn="cpu1")
    f = g.compile(
        [x], [(x * 2, mgb.callback_lazycopy(lambda v: mgb._add_update_fastpath(other, v, 1, 1, 0)))]
    )
    with pytest.raises(mgb.MegBrainError, match="comp node"):
        f(np.ones(3))


def test_fastpath_on_second_comp_node():
    dest = _snd(np.ones(4), cn="cpu1")
    for _ in range(3):
        mgb._add_update_fastpath(dest, _snd(np.ones(4), cn="cpu1"), 1, 1, 0)
    np.testing.assert_array_equal(dest.get_value(), np.full(4, 4))


# ---- SGD with momentum ------------------------------------------------------------------------
@pytest.mark.parametrize("use_virtual_grad", [False, True])
def test_sgd_momentum_matches_numpy(use_virtual_grad):
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((3, 8, 4)).astype(np.float32)
    ys = rng.standard_normal((3, 8, 2)).astype(np.float32)
    w0 = rng.standard_normal((4, 2)).astype(np.float32)
    b0 = rng.standard_normal((2,)).astype(np.float32)
    lr_v, mom_v = 0.1, 0.9

    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(8, 4))
    y = mgb.make_arg(CN, g, name="y", shape=(8, 2))
    w = mgb.make_shared(CN, value=w0, comp_graph=g, name="w")
    b = mgb.make_shared(CN, value=b0, comp_graph=g, name="b")
    lr, mom = mgb.SharedScalar(lr_v), mgb.SharedScalar(mom_v)
    pred = mgb.opr.matrix_mul(x, w) + b
    diff = pred - y
    loss = (diff * diff).mean()
    grads = mgb.grad(loss, [w, b], use_virtual_grad=use_virtual_grad)
    updates = []
    for p, gp, shape in zip((w, b), grads, ((4, 2), (2,))):
        buf = mgb.make_shared(CN, value=np.zeros(shape, np.float32), comp_graph=g)
        new_buf = mgb.opr.add_update(buf, gp, alpha=mom, beta=1.0)
        updates.append(mgb.opr.add_update(p, new_buf * lr, beta=-1.0))
    f = g.compile([x, y], [mgb.copy_output(loss), *updates])

    wn, bn = w0.astype(np.float64), b0.astype(np.float64)
    mw, mb = np.zeros_like(wn), np.zeros_like(bn)
    for step in range(3):
        xv, yv = xs[step].astype(np.float64), ys[step].astype(np.float64)
        d = xv @ wn + bn - yv
        ref_loss = (d * d).mean()
        gw = xv.T @ (2 * d / d.size)
        gb = (2 * d / d.size).sum(axis=0)
        mw = mom_v * mw + gw
        mb = mom_v * mb + gb
        wn = wn - lr_v * mw
        bn = bn - lr_v * mb
        got = f(xs[step], ys[step])
        np.testing.assert_allclose(np.asarray(got).reshape(-1), [ref_loss], rtol=1e-5)
        np.testing.assert_allclose(w.get_value(), wn, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(b.get_value(), bn, rtol=1e-5, atol=1e-6)


def test_grad_api_forms():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    w = mgb.make_shared(CN, value=np.ones(3, np.float32), comp_graph=g, name="w")
    u = mgb.make_shared(CN, value=np.ones(3, np.float32), comp_graph=g, name="u")
    loss = (x * w).sum()
    single = mgb.grad(loss, w, use_virtual_grad=False)
    assert isinstance(single, mgb.SymbolVar)
    assert mgb.grad(loss, u, use_virtual_grad=False, return_zero_for_nodep=False) is None
    with pytest.raises(mgb.MegBrainError):
        mgb.grad(loss, u, use_virtual_grad=True, return_zero_for_nodep=False)
    gw, gu = mgb.grad(loss, [w, u])  # default: VirtualGrad at graph_opt_level 2
    f = g.compile([x], [mgb.copy_output(gw), mgb.copy_output(gu), mgb.copy_output(single)])
    rw, ru, rs = f(np.arange(3))
    np.testing.assert_array_equal(rw, [0, 1, 2])
    np.testing.assert_array_equal(ru, [0, 0, 0])
    np.testing.assert_array_equal(rs, [0, 1, 2])
