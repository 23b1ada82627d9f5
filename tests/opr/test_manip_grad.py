"""Gradients of the shape and indexing operators (GetVarShape, Reshape, Broadcast, Dimshuffle,
AxisAddRemove, Concat, Subtensor, SetSubtensor, IncrSubtensor) against finite differences,
with dynamic shapes, re-runs after a shape change, second order, and ``mgb.grad``."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opr_harness import check_grad, inputs, make_graph, run

import megbrain as mgb
from megbrain.opr import make_immutable
from megbrain.opr.grad import grad
from megbrain.opr.indexing import IncrSubtensor, SetSubtensor, incr_subtensor, set_subtensor
from megbrain.opr.tensor_manip import (
    add_axis,
    broadcast,
    concat,
    dimshuffle,
    get_var_shape,
    remove_axis,
    reshape,
)


def _arr(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def _compile(graph, outs):
    got = {}
    outs = [getattr(o, "node", o) for o in outs]
    spec = [(o, (lambda a, i=i: got.__setitem__(i, np.array(a)))) for i, o in enumerate(outs)]
    return graph.compile(spec), got


def _grads(loss, wrts):
    return grad(loss, wrts, warn_mid_wrt=False)


# ---- GetVarShape / Reshape -------------------------------------------------------------------
def test_get_var_shape_has_no_gradient():
    # the shape path (GetVarShape, Broadcast's target) contributes nothing: the result is 2 * r
    def build(x):
        two = make_immutable("cpu0", x.node.graph, np.array([2.0]), dtype=np.float64)
        return broadcast(two, get_var_shape(x)) * x

    got = check_grad(build, [_arr((3, 2))])
    np.testing.assert_allclose(got[0], 2 * np.random.default_rng(0).standard_normal((3, 2)))
    g = make_graph()
    (x,), _ = inputs(g, _arr((3, 2)))
    shp = get_var_shape(x)
    assert shp.node.owner.grad(0, [shp.node]) is None


@pytest.mark.parametrize(
    "shape, target",
    [((2, 3), (3, 2)), ((2, 3, 4), (-1,)), ((6,), (2, 1, 3)), ((1,), (1, 1)), ((4, 3), (2, -1))],
)
def test_reshape_grad(shape, target):
    check_grad(lambda x: x.reshape(*target), [_arr(shape)])


def test_reshape_grad_of_non_contiguous_input():
    check_grad(lambda x: x.dimshuffle(1, 0).reshape(2, 6), [_arr((4, 3))])


def test_reshape_grad_by_target_var_and_dynamic_shape():
    g = make_graph()
    (x, t), hosts = inputs(g, _arr((2, 6)), np.array([4, 3], np.int32), value_infer=False)
    w = make_immutable("cpu0", g, _arr((3,), seed=1), dtype=np.float64)
    y = reshape(x, t)
    assert not y.node.shape_static
    loss = (y * w).sum()
    gx, gt = _grads(loss, [x, t])
    f, got = _compile(g, [gx])
    f.execute().wait()
    np.testing.assert_allclose(got[0], np.broadcast_to(_arr((3,), seed=1), (4, 3)).reshape(2, 6))
    hosts[0].arr, hosts[1].arr = _arr((3, 5)), np.array([5, 3], np.int32)
    f.execute().wait()
    np.testing.assert_allclose(got[0], np.broadcast_to(_arr((3,), seed=1), (5, 3)).reshape(3, 5))
    # the target shape gets no gradient: zeros of its shape
    np.testing.assert_array_equal(run([gt], g)[0], [0, 0])


# ---- Broadcast -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "shape, target",
    [
        ((3,), (2, 3)),
        ((1, 3), (4, 3)),
        ((2, 1), (2, 5)),
        ((2, 1, 3), (5, 2, 4, 3)),
        ((1,), (2, 3)),
        ((2, 3), (2, 3)),
        ((1, 1), (1, 4, 1, 2)),
    ],
)
def test_broadcast_grad(shape, target):
    check_grad(lambda x: broadcast(x, target), [_arr(shape)])


def test_broadcast_grad_to_var_shape():
    check_grad(lambda x, y: broadcast(x, y.shape) * y, [_arr((3, 1)), _arr((2, 3, 4))])


# ---- Dimshuffle / AxisAddRemove --------------------------------------------------------------
@pytest.mark.parametrize(
    "shape, pattern, ndim",
    [
        ((2, 3), (1, 0), 0),
        ((2, 3, 4), (2, 0, 1), 0),
        ((2, 3), ("x", 1, "x", 0), 0),
        ((2, 1, 3), (2, 0), 3),  # drops the size-1 axis 1
        ((1, 4), ("x", 1), 2),
    ],
)
def test_dimshuffle_grad(shape, pattern, ndim):
    check_grad(lambda x: dimshuffle(x, pattern, ndim), [_arr(shape)])


@pytest.mark.parametrize(
    "shape, fn",
    [
        ((2, 3), lambda x: add_axis(x, 0)),
        ((2, 3), lambda x: add_axis(x, [-1, 1])),
        ((2, 1, 3, 1), lambda x: remove_axis(x, [3, 1])),
        ((2, 1, 3), lambda x: remove_axis(x, -2)),
        ((1,), lambda x: remove_axis(x, 0)),  # keeps shape (1,)
        ((1, 1), lambda x: remove_axis(x, [0, 0])),
        ((2, 3), lambda x: remove_axis(add_axis(x, [0, -1]), 0)),
    ],
)
def test_axis_add_remove_grad(shape, fn):
    check_grad(fn, [_arr(shape)])


def test_sum_over_axis_grad():
    # Reduce (axis kept) followed by remove_axis
    check_grad(lambda x: x.sum(axis=1), [_arr((3, 4, 2))])
    check_grad(lambda x: x.sum(axis=-1) * 2, [_arr((3, 4))])
    check_grad(lambda x: x.max(axis=[0, 2]), [_arr((3, 4, 2))])
    check_grad(lambda x: x.sum(axis=0), [_arr((5,))])


# ---- Concat ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "shapes, axis",
    [
        ([(2, 3), (4, 3)], 0),
        ([(2, 3), (2, 1), (2, 2)], 1),
        ([(2, 3, 1), (2, 3, 2)], -1),
        ([(1, 2, 3), (3, 2, 3), (2, 2, 3)], -3),
        ([(3,)], 0),
    ],
)
def test_concat_grad(shapes, axis):
    check_grad(lambda *xs: concat(list(xs), axis=axis), [_arr(s, i) for i, s in enumerate(shapes)])


def test_concat_grad_same_input_twice():
    check_grad(lambda x, y: concat([x, y, x], axis=0), [_arr((2, 2)), _arr((1, 2))])


def test_concat_grad_dynamic_shape_and_rerun():
    g = make_graph()
    (x, y, t), hosts = inputs(
        g, _arr((2, 3)), _arr((4, 3), 1), np.array([3, 2], np.int32), value_infer=False
    )
    xr = reshape(x, t)  # dynamic shape
    w = make_immutable("cpu0", g, np.arange(3, dtype=np.float64) + 1, dtype=np.float64)
    c = concat([xr, dimshuffle(y, (1, 0)), xr], axis=1)
    loss = (c * w.reshape(3, 1)).sum()
    gx, gy = _grads(loss, [x, y])
    f, got = _compile(g, [gx, gy])
    for n in (2, 5):
        hosts[0].arr, hosts[1].arr = _arr((n, 3)), _arr((n + 1, 3), 1)
        hosts[2].arr = np.array([3, n], np.int32)
        f.execute().wait()
        rows = np.broadcast_to((np.arange(3.0) + 1)[:, None], (3, n))
        np.testing.assert_allclose(got[0], (2 * rows).reshape(n, 3))
        np.testing.assert_allclose(got[1], np.broadcast_to(np.arange(3.0) + 1, (n + 1, 3)))


# ---- Subtensor -------------------------------------------------------------------------------
@st.composite
def basic_index(draw, shape):
    n = draw(st.integers(1, len(shape)))
    idx = []
    for d in shape[:n]:
        if draw(st.booleans()):
            idx.append(draw(st.integers(-d, d - 1)))
        else:
            bound = st.none() | st.integers(-d - 2, d + 2)
            step = st.none() | st.integers(-3, 3).filter(bool)
            idx.append(slice(draw(bound), draw(bound), draw(step)))
    return tuple(idx)


def _nonempty(shape, idx):
    return np.empty(shape)[idx].size > 0


@settings(max_examples=40, deadline=None)
@given(data=st.data(), shape=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple))
def test_subtensor_grad(data, shape):
    idx = data.draw(basic_index(shape).filter(lambda i: _nonempty(shape, i)))
    check_grad(lambda x: x[idx], [_arr(shape)])


@pytest.mark.parametrize(
    "idx",
    [
        (slice(None, None, -1),),
        (slice(None), slice(3, 0, -2)),
        (1, slice(None, None, -1)),
        (Ellipsis, -1),
        (None, 1, slice(1, None)),
        (-1, -1),
    ],
)
def test_subtensor_grad_negative_step_newaxis(idx):
    check_grad(lambda x: x[idx], [_arr((3, 4))])


def test_subtensor_grad_overlapping_reads():
    check_grad(lambda x: x[1:] * x[:-1] + x[::-1][1:], [_arr((5, 2))])


def test_subtensor_grad_index_by_var():
    def build(x):
        g = x.node.graph
        i = make_immutable("cpu0", g, np.array([2], np.int32))
        j = make_immutable("cpu0", g, np.array([-1], np.int32))
        return x[i, j::-1] + x[:i, 0].sum()

    check_grad(build, [_arr((4, 3))])


def test_subtensor_grad_dynamic_index_var():
    g = make_graph()
    (x, i), hosts = inputs(g, _arr((5, 3)), np.array([1], np.int32), value_infer=False)
    w = make_immutable("cpu0", g, np.array([1.0, 2.0, 3.0]), dtype=np.float64)
    y = x[i:, ::-1]
    assert not y.node.shape_static
    (gx,) = _grads((y * w).sum(), [x])
    f, got = _compile(g, [gx])
    for k in (1, 3):
        hosts[1].arr = np.array([k], np.int32)
        f.execute().wait()
        ref = np.zeros((5, 3))
        ref[k:] = [3.0, 2.0, 1.0]
        np.testing.assert_allclose(got[0], ref)


# ---- SetSubtensor / IncrSubtensor ------------------------------------------------------------
@pytest.mark.parametrize("modify", [set_subtensor, incr_subtensor])
@pytest.mark.parametrize(
    "src_shape, value_shape, idx",
    [
        ((4, 3), (2, 3), (slice(1, 3),)),
        ((4, 3), (3,), (slice(None, None, -2),)),  # value broadcast over a leading axis
        ((4, 3), (1,), (1, slice(None, None, -1))),
        ((4, 3), (1,), (2, 0)),
        ((3, 4, 2), (2, 1), (1, slice(3, 0, -2))),
        ((3, 4, 2), (3, 1, 2), (slice(None), slice(1, 2))),
    ],
)
def test_modify_subtensor_grad(modify, src_shape, value_shape, idx):
    check_grad(
        lambda src, value: modify(src, value)[idx] * 1.5,
        [_arr(src_shape), _arr(value_shape, 1)],
    )


def test_modify_subtensor_grad_index_by_var():
    def build(src, value):
        i = make_immutable("cpu0", src.node.graph, np.array([-2], np.int32))
        a = set_subtensor(src, value)[i:]
        return incr_subtensor(a, value * 2)[:i]

    check_grad(build, [_arr((4, 3)), _arr((3,), 1)])


def test_modify_subtensor_grad_of_index_input_is_none():
    g = make_graph()
    (x, v), _ = inputs(g, _arr((4, 3)), _arr((3,)))
    for cls, fn in ((SetSubtensor, set_subtensor), (IncrSubtensor, incr_subtensor)):
        opr = fn(x, v)[1].node.owner
        assert isinstance(opr, cls)
        assert opr.grad(2, [x.node]) is None
        assert opr.grad(0, [None]) is None
    sub = x[1:2].node.owner
    assert sub.grad(1, [x.node]) is None


# ---- second order ----------------------------------------------------------------------------
def test_second_order_through_reshape():
    a = _arr((2, 3))
    g = make_graph()
    (x,), _ = inputs(g, a)
    loss = (x.reshape(3, 2) ** 3).sum()
    (g1,) = _grads(loss, [x])
    (g2,) = _grads(mgb.SymbolVar(g1).sum(), [x])
    got = run([g1, g2], g)
    np.testing.assert_allclose(got[0], 3 * a**2)
    np.testing.assert_allclose(got[1], 6 * a)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.reshape(3, 2) ** 3,
        lambda x: broadcast(x, (2, 2, 3)) ** 3,
        lambda x: dimshuffle(x, (1, "x", 0)) ** 3,
        lambda x: remove_axis(add_axis(x, [0, 2]), 0) ** 3,
        lambda x: concat([x, x[:, ::-1]], axis=1) ** 3,
        lambda x: x[1:, ::-2] ** 3,
        lambda x: set_subtensor(x, x[0] * x[1])[1] ** 3,
        lambda x: incr_subtensor(x * x, x[1, 1:])[0, 1:] ** 3,
    ],
)
def test_grad_of_grad(fn):
    """Finite differences of the first gradient (a graph of these operators) check the
    second-order gradient."""

    def first_grad(x):
        r = make_immutable("cpu0", x.node.graph, _arr((2, 3), 7), dtype=np.float64)
        (gx,) = _grads((fn(x) * 1.0).sum() + (x * r).sum(), [x])
        return mgb.SymbolVar(gx) * r

    check_grad(first_grad, [_arr((2, 3))], rtol=1e-4, atol=1e-5)


# ---- mgb.grad through a user-level graph -----------------------------------------------------
def _user_graph(use_virtual_grad):
    g = mgb.comp_graph()
    a, b = _arr((2, 3)).astype(np.float32), _arr((4, 3), 1).astype(np.float32)
    x = mgb.make_shared("cpu0", value=a, comp_graph=g)
    y = mgb.make_shared("cpu0", value=b, comp_graph=g)
    c = concat([x, y[::-1]], axis=0)  # CONST shapes: constant slice offsets
    z = c.reshape(3, 6).dimshuffle(1, 0)
    z = set_subtensor(z, broadcast(x[0, 1:], (2,)))[0, 1:]
    loss = (add_axis(z, 0) ** 2).sum() + incr_subtensor(y, x[1])[2].sum()
    gx, gy = mgb.grad(loss, [x, y], use_virtual_grad=use_virtual_grad)
    return g, gx, gy


def test_mgb_grad_virtual_grad_matches_direct():
    g, gx, gy = _user_graph(None)
    assert g.options.graph_opt_level == 2
    assert gx.node.owner.type_name == "VirtualGrad"
    got_v = g.compile(None, [mgb.copy_output(gx), mgb.copy_output(gy)])()
    g2, gx2, gy2 = _user_graph(False)
    assert gx2.node.owner.type_name != "VirtualGrad"
    got_d = g2.compile(None, [mgb.copy_output(gx2), mgb.copy_output(gy2)])()
    for v, d in zip(got_v, got_d):
        np.testing.assert_allclose(v, d, rtol=1e-6)
    # and against NumPy
    a, b = _arr((2, 3)).astype(np.float32), _arr((4, 3), 1).astype(np.float32)
    gz = 2 * np.concatenate([a, b[::-1]]).reshape(3, 6).T
    gz[0, 1:] = 0  # overwritten by a[0, 1:]
    gc = gz.T.reshape(6, 3)
    ga, gb = gc[:2].copy(), gc[2:][::-1].copy()
    ga[0, 1:] += 2 * a[0, 1:]
    ga[1] += 1
    gb += 1  # the whole incremented tensor is summed
    np.testing.assert_allclose(got_d[0], ga, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_d[1], gb, rtol=1e-5, atol=1e-6)


# ---- re-runs after a (statically inferred) input shape change ---------------------------------
_RERUN_CASES = {
    "concat": (lambda x, y: concat([x, y * 2, x], axis=0) ** 2, lambda n: [(n, 3), (n + 1, 3)]),
    "broadcast": (lambda x, y: broadcast(x, (2, get_var_shape(x, 0))) * y, lambda n: [(n,), (1,)]),
    "subtensor": (lambda x, y: x[1:, ::-1] * y, lambda n: [(n, 2), (1, 2)]),
    "set_subtensor": (lambda x, y: set_subtensor(x, y)[::2] ** 2, lambda n: [(n, 2), (2,)]),
}


def _grad_values(build, hosts_arrays):
    g = make_graph()
    (x, y), hosts = inputs(g, *hosts_arrays)
    gx, gy = _grads((build(x, y) * 1.0).sum(), [x, y])
    return g, hosts, gx, gy


@pytest.mark.parametrize(
    "case",
    [
        "concat",
        "broadcast",
        "subtensor",
        "set_subtensor",
    ],
)
def test_grad_rerun_after_shape_change(case):
    """A compiled gradient follows a changed input shape like a freshly built graph."""
    build, shapes = _RERUN_CASES[case]
    g, hosts, gx, gy = _grad_values(build, [_arr(s) for s in shapes(2)])
    f, got = _compile(g, [gx, gy])
    for n in (2, 4, 3):
        arrs = [_arr(s, n) for s in shapes(n)]
        hosts[0].arr, hosts[1].arr = arrs
        f.execute().wait()
        g2, _, gx2, gy2 = _grad_values(build, arrs)
        want = run([gx2, gy2], g2)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-6)


def test_grad_compiled_alone_follows_shape_change():
    """The gradient of a linear loss reads only the input's shape (GetVarShape), not its
    value: the compiled function must still re-plan when that shape changes."""
    g = make_graph()
    (x,), hosts = inputs(g, _arr((2, 3)))
    (gx,) = _grads((x.reshape(-1) * 2.0).sum(), [x])
    f, got = _compile(g, [gx])
    f.execute().wait()
    np.testing.assert_array_equal(got[0], np.full((2, 3), 2.0))
    hosts[0].arr = _arr((4, 3))
    f.execute().wait()
    np.testing.assert_array_equal(got[0], np.full((4, 3), 2.0))


def test_axis_add_remove_and_dimshuffle_grad_dynamic_shape():
    g = make_graph()
    (x, t), hosts = inputs(g, _arr((2, 3)), np.array([3, 1, 2], np.int32), value_infer=False)
    y = reshape(x, t)  # dynamic shape (3, 1, 2): the inverse steps fall back to a reshape
    z = dimshuffle(remove_axis(add_axis(y, -1), [1, -1]), ("x", 1, 0))
    w = make_immutable("cpu0", g, np.array([[1.0], [2.0]]), dtype=np.float64)
    (gx,) = _grads((z * w).sum(), [x])
    f, got = _compile(g, [gx])
    f.execute().wait()
    np.testing.assert_allclose(got[0], np.tile([1.0, 2.0], 3).reshape(2, 3))
    hosts[0].arr, hosts[1].arr = _arr((2, 4)), np.array([4, 1, 2], np.int32)
    f.execute().wait()
    np.testing.assert_allclose(got[0], np.tile([1.0, 2.0], 4).reshape(2, 4))


def test_mean_over_axis_grad_float64():
    check_grad(lambda x: x.mean(axis=[0, 2]), [_arr((3, 4, 2))])
