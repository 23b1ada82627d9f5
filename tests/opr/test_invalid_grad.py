"""InvalidGrad: an undefined gradient builds, and fails only where a function needs it."""

import numpy as np
import pytest
from opr_harness import inputs, make_graph, run

import megbrain as mgb
from megbrain.graph import OPR_REGISTRY, OperatorNodeBase, static_shape
from megbrain.graph.operator import NoGradient
from megbrain.graph.static_infer import DynamicShapeError, Inferer
from megbrain.opr import add_update, zero_grad
from megbrain.opr.grad import InvalidGrad, grad


def _state(g, value):
    return mgb.make_shared(mgb.comp_node("cpu0"), value=value, comp_graph=g, name="state")


def test_add_update_gradient_builds_and_compiling_it_names_the_operator_and_input():
    g = make_graph()
    (w,), _ = inputs(g, np.ones(3, np.float32))
    u = add_update(_state(g, np.zeros(3, np.float32)), w * 2)
    (gw,) = grad((u * w).sum(), [w], warn_mid_wrt=False)
    assert any(isinstance(o, InvalidGrad) for o in g.all_oprs())
    with pytest.raises(mgb.GraphError, match=r"invalid grad: .*input 1 .*operator AddUpdate"):
        run([gw], g)


def test_an_observer_update_behind_zero_grad_trains():
    # QAT's observers: the statistics are updated in place from zero_grad(x), and the loss
    # reads the updated value; the InvalidGrad is built but no parameter gradient needs it
    g = make_graph()
    (w,), (hw,) = inputs(g, np.array([1.0, -2.0, 3.0], np.float32))
    x = w * 3
    obs = add_update(
        _state(g, np.zeros(1, np.float32)), zero_grad(x).max(), alpha=0.0, beta=1.0, bias=0.0
    )
    (gw,) = grad((x * obs).sum(), [w], warn_mid_wrt=False)
    assert any(isinstance(o, InvalidGrad) for o in g.all_oprs())
    (got,) = run([gw], g)
    np.testing.assert_allclose(got, np.full(3, 3 * 9.0, np.float32))


def test_invalid_grad_has_its_input_shape_and_no_value():
    g = make_graph()
    (w,), _ = inputs(g, np.ones((2, 3), np.float32))
    u = add_update(_state(g, np.zeros((2, 3), np.float32)), w)
    (gw,) = grad(u.sum(), [w], warn_mid_wrt=False)
    inv = next(o for o in g.all_oprs() if isinstance(o, InvalidGrad)).outputs[0]
    assert static_shape(inv) == (2, 3)
    assert static_shape(gw) == (2, 3)
    with pytest.raises(DynamicShapeError, match="InvalidGrad"):
        Inferer().value(inv)


def test_a_raising_gradient_becomes_an_invalid_grad():
    g = make_graph()
    (a, b), _ = inputs(g, np.full(3, 0.5, np.float32), np.full(3, 2.0, np.float32))
    y = mgb.opr.elemwise(a, b, mode="MOD").sum()
    (ga, gb) = grad(y, [a, b], warn_mid_wrt=False)
    np.testing.assert_allclose(run([ga], g)[0], np.ones(3))
    with pytest.raises(mgb.GraphError, match=r"input 1 .*Elemwise.*MOD has no gradient"):
        run([gb], g)


def test_the_default_gradient_raises_no_gradient():
    defaults = [c for c in OPR_REGISTRY.values() if c.grad is OperatorNodeBase.grad]
    assert "AddUpdate" in {c.type_name for c in defaults}
    opr = object.__new__(OPR_REGISTRY["AddUpdate"])
    opr.name = "x"
    with pytest.raises(NoGradient, match="AddUpdate .* has no gradient"):
        opr.grad(0, [None])
