"""GetVarShape, Reshape, Broadcast, Dimshuffle, AxisAddRemove and Concat: forward against
NumPy, static shape / value inference, dynamic shapes, re-runs after a shape change, memory
forwarding and errors."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opr_harness import check_opr, inputs, make_graph, run

from megbrain.errors import GraphError, MegBrainError
from megbrain.opr import make_immutable
from megbrain.opr.tensor_manip import (
    add_axis,
    broadcast,
    concat,
    dimshuffle,
    get_var_shape,
    remove_axis,
    reshape,
    shape_to_var,
)

shapes = st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple)


def _arr(shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _compile(graph, outs):
    """Compile ``outs`` with callbacks storing copies; returns (function, results dict)."""
    got = {}
    spec = [(o.node, (lambda a, i=i: got.__setitem__(i, np.array(a)))) for i, o in enumerate(outs)]
    return graph.compile(spec), got


# ---- GetVarShape -----------------------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(shape=shapes, data=st.data())
def test_get_var_shape(shape, data):
    axis = data.draw(st.none() | st.integers(-len(shape), len(shape) - 1))
    ref = np.array(shape if axis is None else [shape[axis]], np.int32)
    (got,) = check_opr(lambda x: get_var_shape(x, axis), lambda a: ref, [_arr(shape)])
    assert got.dtype == np.int32


def test_get_var_shape_dynamic_and_bad_axis():
    g = make_graph()
    (x, t), _ = inputs(g, _arr((2, 6)), np.array([3, 4], np.int32), value_infer=False)
    y = reshape(x, t)
    s = y.shape
    assert not s.node.shape_static
    np.testing.assert_array_equal(run([s])[0], [3, 4])
    with pytest.raises(MegBrainError, match=r"GetVarShape.*axis 2 out of range.*\{2,6\}"):
        get_var_shape(x, 2)


# ---- Reshape ---------------------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(shape=shapes, data=st.data())
def test_reshape(shape, data):
    target = list(data.draw(st.permutations(shape)))
    if data.draw(st.booleans()):
        target[data.draw(st.integers(0, len(target) - 1))] = -1
    ref = lambda a: a.reshape(target)  # noqa: E731
    (got,) = check_opr(lambda x: x.reshape(*target), ref, [_arr(shape)])
    assert got.shape == ref(_arr(shape)).shape


def test_reshape_forwards_and_copies_non_contiguous():
    g = make_graph()
    (x,), _ = inputs(g, _arr((3, 4)))
    y = x.reshape(4, 3)
    z = x.dimshuffle(1, 0).reshape(12)  # a transposed view can not be reshaped in place
    f, got = _compile(g, [y, z])
    f.execute().wait()
    assert f._plan.decisions[y.node][0] == "fwd"
    assert f._plan.decisions[z.node][0] == "alloc"
    a = _arr((3, 4))
    np.testing.assert_array_equal(got[0], a.reshape(4, 3))
    np.testing.assert_array_equal(got[1], a.T.reshape(12))


def test_reshape_mixed_symbolic_target_and_inferred_value():
    g = make_graph()
    (x,), _ = inputs(g, _arr((2, 3, 4)))
    y = reshape(x, (x.shape[0], -1))
    z = reshape(x, (x.shape[2], 2, x.shape[1]))
    a = _arr((2, 3, 4))
    got = run([y, z], g)
    np.testing.assert_array_equal(got[0], a.reshape(2, 12))
    np.testing.assert_array_equal(got[1], a.reshape(4, 2, 3))
    assert y.imm_shape == (2, 12)
    c = reshape(make_immutable("cpu0", g, np.arange(6, dtype=np.int32)), (3, 2))
    np.testing.assert_array_equal(c.inferred_value, np.arange(6).reshape(3, 2))
    assert reshape(x, x.shape) == x  # reshape to its own shape is the var itself


def test_reshape_dynamic_target_and_rerun():
    g = make_graph()
    (x, t), hosts = inputs(g, _arr((2, 6)), np.array([4, 3], np.int32), value_infer=False)
    y = reshape(x, t) * 2
    assert not y.node.shape_static
    f, got = _compile(g, [y])
    f.execute().wait()
    np.testing.assert_allclose(got[0], _arr((2, 6)).reshape(4, 3) * 2)
    hosts[0].arr = _arr((5, 2), seed=1)
    hosts[1].arr = np.array([2, 5], np.int32)
    f.execute().wait()
    np.testing.assert_allclose(got[0], _arr((5, 2), seed=1).reshape(2, 5) * 2)


def test_reshape_rerun_after_input_shape_change():
    g = make_graph()
    (x,), hosts = inputs(g, _arr((2, 6)))
    y = x.reshape(-1, 3)
    f, got = _compile(g, [y])
    f.execute().wait()
    assert got[0].shape == (4, 3)
    hosts[0].arr = _arr((3, 5, 3), seed=2)
    f.execute().wait()
    np.testing.assert_array_equal(got[0], _arr((3, 5, 3), seed=2).reshape(-1, 3))
    assert f._plan.decisions[y.node][0] == "fwd"


def test_reshape_errors():
    g = make_graph()
    (x,), _ = inputs(g, _arr((2, 3)))
    with pytest.raises(MegBrainError, match=r"Reshape.*can not reshape \{2,3\}.*\{4\}"):
        x.reshape(4)
    with pytest.raises(MegBrainError, match=r"Reshape.*\{2,3\}.*\{4,\?\}"):
        x.reshape(4, -1)
    with pytest.raises(GraphError, match="more than one unknown"):
        x.reshape(-1, -1)


# ---- Broadcast -------------------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(target=shapes, data=st.data())
def test_broadcast(target, data):
    ndim = data.draw(st.integers(1, len(target)))
    src = tuple(1 if data.draw(st.booleans()) else t for t in target[len(target) - ndim :])
    (got,) = check_opr(
        lambda x: broadcast(x, target), lambda a: np.broadcast_to(a, target), [_arr(src)]
    )
    assert got.shape == target


def test_broadcast_forwards_and_dynamic_target():
    g = make_graph()
    (x, t), hosts = inputs(g, _arr((3, 1)), np.array([2, 3, 4], np.int32), value_infer=False)
    y = broadcast(x, (2, 3, 4))
    z = broadcast(x, t)
    assert y.node.shape_static and not z.node.shape_static
    f, got = _compile(g, [y, z])
    f.execute().wait()
    assert f._plan.decisions[y.node][0] == "fwd"
    for k in (0, 1):
        np.testing.assert_array_equal(got[k], np.broadcast_to(_arr((3, 1)), (2, 3, 4)))
    hosts[1].arr = np.array([3, 5], np.int32)
    f.execute().wait()
    np.testing.assert_array_equal(got[1], np.broadcast_to(_arr((3, 1)), (3, 5)))


def test_broadcast_error():
    g = make_graph()
    (x,), _ = inputs(g, _arr((2, 3)))
    with pytest.raises(MegBrainError, match=r"Broadcast.*can not broadcast \{2,3\} to \{4,3\}"):
        broadcast(x, (4, 3))


# ---- Dimshuffle ------------------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(shape=shapes, data=st.data())
def test_dimshuffle(shape, data):
    perm = data.draw(st.permutations(range(len(shape))))
    pattern = list(perm)
    for _ in range(data.draw(st.integers(0, 2))):
        pattern.insert(data.draw(st.integers(0, len(pattern))), "x")

    def ref(a):
        out = a.transpose(perm)
        for i, p in enumerate(pattern):
            if p == "x":
                out = np.expand_dims(out, i)
        return out

    check_opr(lambda x: x.dimshuffle(*pattern), ref, [_arr(shape)])


def test_dimshuffle_drops_unit_axis_and_forwards():
    g = make_graph()
    (x,), _ = inputs(g, _arr((3, 1, 4)))
    y = dimshuffle(x, (2, "x", 0), ndim=3)
    f, got = _compile(g, [y])
    f.execute().wait()
    assert f._plan.decisions[y.node][0] == "fwd"
    np.testing.assert_array_equal(got[0], _arr((3, 1, 4))[:, 0, :].T[:, None, :])


def test_dimshuffle_errors():
    g = make_graph()
    (x,), _ = inputs(g, _arr((3, 2, 4)))
    with pytest.raises(MegBrainError, match=r"Dimshuffle.*non-1 axis 1 of shape \{3,2,4\}"):
        dimshuffle(x, (2, 0), ndim=3)
    with pytest.raises(MegBrainError, match=r"Dimshuffle.*ndim 2.*\{3,2,4\}"):
        dimshuffle(x, (1, 0))
    with pytest.raises(GraphError, match="bad Dimshuffle pattern"):
        dimshuffle(x, (3, 0), ndim=3)


# ---- AxisAddRemove ---------------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(shape=shapes, data=st.data())
def test_add_then_remove_axis(shape, data):
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)))
    check_opr(lambda x: add_axis(x, axis), lambda a: np.expand_dims(a, axis), [_arr(shape)])
    unit = [i for i, s in enumerate(shape) if s == 1]
    if unit and len(shape) > 1:
        ax = data.draw(st.sampled_from(unit))
        check_opr(lambda x: remove_axis(x, ax), lambda a: np.squeeze(a, ax), [_arr(shape)])


def test_axis_add_remove_lists_rerun_and_errors():
    g = make_graph()
    (x,), hosts = inputs(g, _arr((3, 4)))
    y = add_axis(x, [0, 2])
    z = remove_axis(y, [2, 0])
    one = remove_axis(make_immutable("cpu0", g, np.ones(1, np.float32)), 0)
    f, got = _compile(g, [y, z])
    f.execute().wait()
    assert got[0].shape == (1, 3, 1, 4) and got[1].shape == (3, 4)
    assert f._plan.decisions[z.node][0] == "fwd"
    assert one.imm_shape == (1,)
    hosts[0].arr = _arr((5, 2), seed=3)
    f.execute().wait()
    np.testing.assert_array_equal(got[0], _arr((5, 2), seed=3)[None, :, None])
    with pytest.raises(MegBrainError, match=r"AxisAddRemove.*remove axis 1.*\{5,2\}"):
        remove_axis(x, 1)


# ---- Concat ----------------------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(shape=shapes, data=st.data())
def test_concat(shape, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    n = data.draw(st.integers(1, 3))
    arrays = []
    for i in range(n):
        s = list(shape)
        s[axis] = data.draw(st.integers(1, 4))
        arrays.append(_arr(tuple(s), seed=i))
    check_opr(lambda *xs: concat(*xs, axis=axis), lambda *a: np.concatenate(a, axis), arrays)


def test_concat_dynamic_list_and_errors():
    g = make_graph()
    (x, t), hosts = inputs(g, _arr((2, 3)), np.array([3, 2], np.int32), value_infer=False)
    y = concat([x, reshape(x, t).dimshuffle(1, 0)], axis=0)
    assert not y.node.shape_static
    f, got = _compile(g, [y])
    f.execute().wait()
    a = _arr((2, 3))
    np.testing.assert_array_equal(got[0], np.concatenate([a, a.reshape(3, 2).T]))
    hosts[0].arr = _arr((2, 4), seed=4)
    hosts[1].arr = np.array([4, 2], np.int32)
    f.execute().wait()
    b = _arr((2, 4), seed=4)
    np.testing.assert_array_equal(got[0], np.concatenate([b, b.reshape(4, 2).T]))
    (f, i, u), _ = inputs(g, *(np.zeros((2, 3), t) for t in (np.float32, np.int32, np.uint8)))
    assert concat(f, i, axis=0).dtype == np.float32  # promoted, as MegBrain's Concat::make
    with pytest.raises(MegBrainError, match="concat: .*different signedness"):
        concat(u, i, axis=0)
    with pytest.raises(MegBrainError, match=r"Concat.*except on axis 1.*\{2,4\}, \{4,2\}"):
        concat(x, x.dimshuffle(1, 0), axis=1)


# ---- shape_to_var ----------------------------------------------------------------------------
def test_shape_to_var():
    g = make_graph()
    (x,), _ = inputs(g, _arr((2, 5)))
    np.testing.assert_array_equal(shape_to_var((3, 4), x).inferred_value, [3, 4])
    np.testing.assert_array_equal(shape_to_var(7, x).inferred_value, [7])
    mixed = shape_to_var((1, x.shape[1], 2, x.axis_shape(0)), x)
    assert mixed.dtype == np.int32
    np.testing.assert_array_equal(mixed.inferred_value, [1, 5, 2, 2])
    assert shape_to_var(x.shape, x) == x.shape
    with pytest.raises(GraphError, match="bad shape element"):
        shape_to_var((2, 1.5), x)
    assert math.prod(run([mixed])[0]) == 20


def test_view_oprs_copy_when_forwarding_is_off():
    a = _arr((2, 3, 1))
    g = make_graph(seq_opt__enable_mem_plan_opt=False)
    (x,), _ = inputs(g, a)
    outs = [
        x.shape,
        x.reshape(3, 2),
        x.dimshuffle(1, 0, 2).reshape(6),
        broadcast(x, (4, 2, 3, 5)),
        dimshuffle(x, (1, "x", 0), ndim=3),
        remove_axis(add_axis(x, 0), 3),
        x[1, ::-1],
    ]
    refs = [
        np.array([2, 3, 1]),
        a.reshape(3, 2),
        a.transpose(1, 0, 2).reshape(6),
        np.broadcast_to(a, (4, 2, 3, 5)),
        a[:, :, 0].T[:, None, :],
        a[None, :, :, 0],
        a[1, ::-1],
    ]
    f, got = _compile(g, outs)
    f.execute().wait()
    for i, (o, r) in enumerate(zip(outs, refs)):
        assert f._plan.decisions[o.node][0] == "alloc"
        np.testing.assert_array_equal(got[i], r)
