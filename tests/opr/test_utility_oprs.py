"""Graph utility operators (with ``current_grad_target``): set_grad, zero_grad,
virtual_loss, virtual_dep, callback_injector, assert_equal, mark_no_broadcast_elemwise,
identity, and add_extra_vardep together with gradients."""

from __future__ import annotations

import numpy as np
import pytest
from opr_harness import check_grad

import megbrain as mgb

CN = "cpu0"
RNG = np.random.default_rng(0)


def _graph(opt_level=0):
    g = mgb.comp_graph()
    g.set_option("graph_opt_level", opt_level)
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    w = mgb.make_shared(CN, value=np.array([1.0, -2.0, 3.0], np.float32), comp_graph=g, name="w")
    return g, x, w


def _eval(g, x, outs, xval):
    single = not isinstance(outs, (list, tuple))
    outs = [outs] if single else list(outs)
    f = g.compile([x] if x is not None else None, [mgb.copy_output(o) for o in outs])
    got = f(xval) if x is not None else f()
    got = [np.asarray(v) for v in (got if isinstance(got, (list, tuple)) else [got])]
    return got[0] if single else got


X = np.array([0.5, 1.5, -2.0], np.float32)


# ---- set_grad / zero_grad / current_grad_target ----------------------------------------------
@pytest.mark.parametrize("virtual", [False, True])
def test_set_grad_with_one_arg_getter_replaces_the_gradient(virtual):
    g, x, w = _graph(2 if virtual else 0)
    seen = []

    def getter(graph):
        seen.append(graph)
        return mgb.make_immutable(CN, graph, np.array([10.0, 20.0, 30.0], np.float32))

    y = mgb.opr.set_grad(x * w, getter)
    loss = (y * 2.0).sum()
    gw = mgb.grad(loss, w)
    assert gw.owner_opr.name.startswith("VirtualGrad") == virtual
    np.testing.assert_allclose(_eval(g, x, gw, X), np.array([10.0, 20.0, 30.0]) * X)
    assert seen and seen[0] is g
    # forward: set_grad is the identity
    np.testing.assert_allclose(_eval(g, x, y, X), X * w.get_value())


def test_set_grad_with_zero_arg_getter():
    g, x, w = _graph()
    const = mgb.make_immutable(CN, g, np.full(3, 7.0, np.float32))
    y = mgb.opr.set_grad(x * w, lambda: const)
    gw = mgb.grad(y.sum(), w)
    np.testing.assert_allclose(_eval(g, x, gw, X), 7.0 * X)


def test_set_grad_none_and_zero_grad_block_the_gradient():
    g, x, w = _graph()
    for blocked in (mgb.opr.set_grad(w * 3.0, None), mgb.opr.zero_grad(w * 3.0)):
        loss = (blocked * x).sum() + (w * w).sum()  # only the second term reaches w
        np.testing.assert_allclose(_eval(g, None, mgb.grad(loss, w), None), 2 * w.get_value())
        only = mgb.grad((blocked * x).sum(), w, return_zero_for_nodep=False)
        assert only is None
        np.testing.assert_array_equal(
            _eval(g, None, mgb.grad((blocked * x).sum(), w), None), np.zeros(3)
        )


def test_set_grad_getter_returning_none_gives_zero_grad():
    g, x, w = _graph()
    y = mgb.opr.set_grad(w * 1.0, lambda graph: None)
    np.testing.assert_array_equal(_eval(g, None, mgb.grad((y * x).sum(), w), None), np.zeros(3))


def test_set_grad_getter_must_return_a_var():
    g, x, w = _graph()
    y = mgb.opr.set_grad(w * 1.0, lambda graph: np.ones(3))
    with pytest.raises(mgb.MegBrainError, match="SymbolVar"):
        mgb.grad(y.sum(), w)


def test_set_grad_getter_can_use_the_original_gradient_path():
    # a gradient clip: the custom gradient is built from the forward vars
    g, x, w = _graph()
    y = w * x
    clipped = mgb.opr.set_grad(y, lambda graph: mgb.opr.elem.tanh(y))
    gw = mgb.grad(clipped.sum(), w)
    np.testing.assert_allclose(_eval(g, x, gw, X), np.tanh(w.get_value() * X) * X, rtol=1e-6)


@pytest.mark.parametrize("virtual", [False, True])
def test_current_grad_target_inside_the_getter(virtual):
    g, x, w = _graph(2 if virtual else 0)
    assert mgb.current_grad_target(g) is None
    seen = []

    def getter(graph):
        seen.append(mgb.current_grad_target(graph))
        return mgb.make_immutable(CN, graph, np.ones(3, np.float32))

    y = mgb.opr.set_grad(w * x, getter)
    loss = (y * y).sum() + 0.0
    gw = mgb.grad(loss, w)
    _eval(g, x, gw, X)
    assert len(seen) == 1 and seen[0] is not None
    target = seen[0]
    if virtual:  # the target as the optimizer left it
        assert target == mgb.get_graph_optimizer_replaced_var(loss) or target == loss
    else:
        assert target == loss
    assert mgb.current_grad_target(g) is None  # only while a gradient is being built


def test_current_grad_target_nested_grads():
    # a getter that itself takes a gradient sees its own target, then the outer one again
    g, x, w = _graph()
    inner_loss = (w * w).sum()
    seen = []

    def getter(graph):
        seen.append(mgb.current_grad_target(graph))
        gi = mgb.grad(inner_loss, w)
        seen.append(mgb.current_grad_target(graph))
        return gi

    y = mgb.opr.set_grad(w * 1.0, getter)
    outer = (y * x).sum()
    gw = mgb.grad(outer, w)
    np.testing.assert_allclose(_eval(g, None, gw, None), 2 * w.get_value())
    assert seen == [outer, outer]


# ---- virtual_loss ----------------------------------------------------------------------------
def test_virtual_loss_grads_are_the_given_y_grads():
    g, x, w = _graph()
    y1 = x * w
    y2 = mgb.opr.elem.exp(w)
    gy1 = mgb.make_immutable(CN, g, np.array([1.0, 2.0, 3.0], np.float32))
    gy2 = mgb.make_immutable(CN, g, np.array([-1.0, 0.5, 2.0], np.float32))
    loss = mgb.opr.virtual_loss([y1, y2], [gy1, gy2])
    gw, gx, g_gy = mgb.grad(loss, [w, x, gy1], return_zero_for_nodep=False)
    assert g_gy is None  # the given gradients are not differentiated
    got_w, got_x = _eval(g, x, [gw, gx], X)
    wv = w.get_value()
    np.testing.assert_allclose(got_w, [1, 2, 3] * X + [-1.0, 0.5, 2.0] * np.exp(wv), rtol=1e-6)
    np.testing.assert_allclose(got_x, [1, 2, 3] * wv)
    assert _eval(g, x, loss, X).shape == (1,)


def test_virtual_loss_with_virtual_grad():
    g, x, w = _graph(2)
    gy = mgb.make_immutable(CN, g, np.array([1.0, 2.0, 3.0], np.float32))
    gw = mgb.grad(mgb.opr.virtual_loss([x * w], [gy]), w)
    np.testing.assert_allclose(_eval(g, x, gw, X), [1, 2, 3] * X)


def test_virtual_loss_shape_mismatch_raises():
    g, x, w = _graph()
    with pytest.raises(mgb.MegBrainError, match="shape"):
        mgb.opr.virtual_loss([x], [mgb.make_immutable(CN, g, np.ones(4, np.float32))])
    with pytest.raises(mgb.MegBrainError):
        mgb.opr.virtual_loss([x, w], [x])


# ---- virtual_dep -----------------------------------------------------------------------------
def test_virtual_dep_runs_the_other_inputs_first():
    g, x, w = _graph()
    order = []

    def tag(name):
        return lambda v: order.append((name, v.get_value().copy()))

    side1 = mgb.opr.callback_injector(x * 2.0, tag("side1"))
    side2 = mgb.opr.callback_injector(w + 1.0, tag("side2"))
    out = mgb.opr.virtual_dep([x * 3.0, side1, side2])
    after = mgb.opr.callback_injector(out, tag("after"))
    got = _eval(g, x, after, X)
    np.testing.assert_allclose(got, 3 * X)  # the value is symvars[0]
    names = [n for n, _ in order]
    assert sorted(names[:2]) == ["side1", "side2"] and names[2] == "after"
    np.testing.assert_allclose(order[names.index("side1")][1], 2 * X)
    # without the virtual dep nothing forces the side branches to run
    order.clear()
    _eval(g, x, mgb.opr.callback_injector(x * 3.0, tag("alone")), X)
    assert [n for n, _ in order] == ["alone"]


def test_virtual_dep_gradient_goes_to_the_first_input_only():
    g, x, w = _graph()
    out = mgb.opr.virtual_dep([w * 2.0, x * w])
    gw, gx = mgb.grad(out.sum(), [w, x], return_zero_for_nodep=False)
    assert gx is None
    np.testing.assert_allclose(_eval(g, None, gw, None), np.full(3, 2.0))


# ---- callback_injector -----------------------------------------------------------------------
def test_callback_injector_called_once_per_run_with_values():
    g, x, w = _graph()
    calls = []
    y = x * 2.0
    inj = mgb.opr.callback_injector(y, lambda v: calls.append(v.get_value().copy()))
    out = inj * 1.0 + inj  # used twice downstream, still one call per run
    f = g.compile([x], mgb.copy_output(out))
    for k in range(3):
        np.testing.assert_allclose(f(X + k), 4 * (X + k))
    assert len(calls) == 3
    for k, c in enumerate(calls):
        np.testing.assert_allclose(c, 2 * (X + k))


def test_callback_injector_multi_input_proxies():
    g, x, w = _graph()
    got = []

    def cb(vs):
        got.append([(v.shape, v.dtype, v.get_value().copy()) for v in vs])

    inj = mgb.opr.callback_injector([x, w, x * w], cb)
    np.testing.assert_allclose(_eval(g, x, inj, X), X)  # forwards input 0
    ((s0, d0, v0), (s1, _, v1), (_, _, v2)) = got[0]
    assert len(got) == 1 and tuple(s0) == (3,) and d0 == np.float32
    np.testing.assert_allclose(v1, w.get_value())
    np.testing.assert_allclose(v2, X * w.get_value())


def test_callback_injector_grad_passes_through():
    g, x, w = _graph()
    inj = mgb.opr.callback_injector([w * w, x], lambda vs: None)
    gw, gx = mgb.grad(inj.sum(), [w, x], return_zero_for_nodep=False)
    assert gx is None
    np.testing.assert_allclose(_eval(g, None, gw, None), 2 * w.get_value())


def test_callback_injectors_are_not_deduplicated():
    g, x, w = _graph()
    calls = []
    cb = calls.append
    a = mgb.opr.callback_injector(x, cb)
    b = mgb.opr.callback_injector(x, cb)
    assert a.owner_opr.id != b.owner_opr.id
    _eval(g, x, [a, b], X)
    assert len(calls) == 2


# ---- assert_equal ----------------------------------------------------------------------------
def test_assert_equal_passes_within_maxerr():
    g, x, w = _graph()
    out = mgb.opr.assert_equal(x * 2.0, x + x + 1e-6, maxerr=1e-4)
    np.testing.assert_allclose(_eval(g, x, out, X), 2 * X + 1e-6, rtol=1e-6)
    # relative to max(1, |expect|): 1000 vs 1000.05 is within 1e-4
    big = mgb.opr.assert_equal(x * 0.0 + 1000.0, x * 0.0 + 1000.05, maxerr=1e-4)
    _eval(g, x, big, X)


def test_assert_equal_raises_naming_the_operator():
    g, x, w = _graph()
    out = mgb.opr.assert_equal(x * 2.0, x * 2.0 + 0.01, maxerr=1e-4, name="check_double")
    f = g.compile([x], mgb.copy_output(out))
    with pytest.raises(mgb.AssertionError, match="check_double") as info:
        f(X)
    assert isinstance(info.value, mgb.MegBrainError)
    # with a larger maxerr the same graph passes
    loose = mgb.opr.assert_equal(x * 2.0, x * 2.0 + 0.01, maxerr=0.1)
    _eval(g, x, loose, X)


def test_assert_equal_verbose_shows_values():
    g, x, w = _graph()
    out = mgb.opr.assert_equal(x, x + 1.0, verbose=True)
    with pytest.raises(mgb.AssertionError, match="expect"):
        _eval(g, x, out, X)


def test_assert_equal_shape_mismatch_raises_at_insertion():
    g, x, w = _graph()
    with pytest.raises(mgb.MegBrainError, match="shape"):
        mgb.opr.assert_equal(x, mgb.make_immutable(CN, g, np.ones(4, np.float32)))


def test_assert_equal_grad_goes_to_get():
    g, x, w = _graph()
    out = mgb.opr.assert_equal(w * 2.0, w + w)
    ge, gw = mgb.grad(out.sum(), [x, w], return_zero_for_nodep=False)
    assert ge is None
    np.testing.assert_allclose(_eval(g, None, gw, None), np.full(3, 2.0))


# ---- mark_no_broadcast_elemwise, identity ----------------------------------------------------
@pytest.mark.parametrize("fn", ["identity", "mark_no_broadcast_elemwise"])
def test_pass_through_values_and_grads(fn):
    op = getattr(mgb.opr, fn)
    g, x, w = _graph()
    y = op(x * w)
    assert y.owner_opr.name != (x * w).owner_opr.name
    np.testing.assert_allclose(_eval(g, x, y, X), X * w.get_value())
    gw = mgb.grad((y * y).sum(), w)
    np.testing.assert_allclose(_eval(g, x, gw, X), 2 * X * X * w.get_value(), rtol=1e-6)
    # finite differences in float64 below the API
    check_grad(lambda v: op(v * v) * v, [RNG.standard_normal((2, 3))])


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
def test_identity_blocks_arithmetic_simplification():
    # x / x is simplified to 1 at graph_opt_level 1; through identity it is not
    g = mgb.comp_graph()
    g.set_option("graph_opt_level", 1)
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    plain = x / x
    kept = mgb.opr.identity(x) / x
    assert kept.owner_opr.name != plain.owner_opr.name
    got = _eval(g, x, kept, np.array([1.0, 0.0, 2.0], np.float32))
    assert np.isnan(got[1]) and got[0] == 1 and got[2] == 1


# ---- add_extra_vardep ------------------------------------------------------------------------
@pytest.mark.parametrize("virtual", [False, True])
def test_add_extra_vardep_on_a_gradient(virtual):
    g, x, w = _graph(2 if virtual else 0)
    calls = []
    dep = mgb.opr.callback_injector(x * 5.0, lambda v: calls.append(v.get_value().copy()))
    gw = mgb.grad((x * w * w).sum(), w)
    mgb.config.add_extra_vardep(gw, dep)
    np.testing.assert_allclose(_eval(g, x, gw, X), 2 * X * w.get_value())
    assert len(calls) == 1
    np.testing.assert_allclose(calls[0], 5 * X)


def test_add_extra_vardep_on_a_forward_var_under_virtual_grad():
    # the dependency is on a forward var that the gradient reads; it runs once per call
    g, x, w = _graph(2)
    calls = []
    h = x * w
    dep = mgb.opr.callback_injector(w * 7.0, lambda v: calls.append(1))
    mgb.config.add_extra_vardep(h, dep)
    gw = mgb.grad((h * h).sum(), w)
    f = g.compile([x], mgb.copy_output(gw))
    f(X)
    f(X)
    assert len(calls) == 2
