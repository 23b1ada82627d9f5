"""IndexingOneHot / IndexingSetOneHot, the vector indexing families (multi-axis, mesh, batched
mesh, with set / incr), IndexingRemap and ParamPackSplit / ParamPackConcat: forward against
NumPy, static shapes, gradients against finite differences, and errors."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opr_harness import check_grad, check_opr, inputs, make_graph, run

from megbrain.errors import MegBrainError
from megbrain.graph import infer_shape
from megbrain.opr import make_immutable
from megbrain.opr.grad import grad
from megbrain.opr.indexing import SubtensorIndexError
from megbrain.opr.indexing_adv import (
    advanced_indexing,
    batched_incr_mesh_indexing,
    batched_mesh_indexing,
    batched_set_mesh_indexing,
    incr_advanced_indexing,
    incr_mesh_indexing,
    indexing_one_hot,
    indexing_remap,
    indexing_set_one_hot,
    mesh_indexing,
    set_advanced_indexing,
    set_mesh_indexing,
)
from megbrain.opr.param_pack import param_pack_concat, param_pack_offsets, param_pack_split

shapes = st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple)


def _arr(shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _graph(*arrays):
    g = make_graph()
    xs, hosts = inputs(g, *arrays)
    return g, xs


# ---- IndexingOneHot / IndexingSetOneHot -------------------------------------------------------
@settings(max_examples=40, deadline=None, derandomize=True)
@given(data=st.data(), shape=shapes, keepdims=st.booleans())
def test_indexing_one_hot_matches_numpy(data, shape, keepdims):
    axis = data.draw(st.integers(0, len(shape) - 1))
    rng = np.random.default_rng(len(shape) * 10 + axis)
    idx = rng.integers(0, shape[axis], shape[:axis] + shape[axis + 1 :]).astype(np.int32)

    def ref(a):
        out = np.take_along_axis(a, np.expand_dims(idx, axis), axis)
        return out if keepdims or out.ndim == 1 else np.squeeze(out, axis)

    check_opr(lambda x: indexing_one_hot(x, axis, idx, keepdims), ref, [_arr(shape)])


def test_indexing_one_hot_grad_and_set_one_hot():
    a = _arr((3, 4, 2), np.float64)
    idx = np.array([[0, 3], [1, 1], [2, 0]], np.int32)
    check_grad(lambda x: indexing_one_hot(x, 1, idx), [a])
    v = _arr((3, 2), np.float64, seed=1)

    def ref(a, v):
        out = a.copy()
        np.put_along_axis(out, idx[:, None], v[:, None], 1)
        return out

    check_opr(lambda x, y: indexing_set_one_hot(x, 1, idx, y), ref, [a, v])
    check_opr(lambda x, y: indexing_set_one_hot(x, 1, idx, y.reshape(3, 1, 2)), ref, [a, v])
    check_grad(lambda x, y: indexing_set_one_hot(x, 1, idx, y), [a, v])


def test_indexing_one_hot_errors():
    g, (x,) = _graph(_arr((3, 4)))
    with pytest.raises(MegBrainError, match=r"IndexingOneHot.*index shape \{4\}.*\{3,4\}"):
        indexing_one_hot(x, 1, np.zeros(4, np.int32))
    with pytest.raises(MegBrainError, match=r"IndexingSetOneHot.*value shape \{3,2\}.*\{3,1\}"):
        indexing_set_one_hot(x, 1, np.zeros(3, np.int32), np.zeros((3, 2), np.float32))
    y = indexing_one_hot(x, 1, np.array([0, 4, 1], np.int32))
    with pytest.raises(SubtensorIndexError, match=r"IndexingOneHot.*out of range \[0, 4\)"):
        run([y])


# ---- IndexingMultiAxisVec and its set / incr ---------------------------------------------------
I = np.array([2, 0, 2], np.int32)  # noqa: E741
J = np.array([1, -1, 3], np.int32)
ADV_CASES = [
    (I,),
    (slice(None), J),
    (I, J),
    (I, slice(1, None), J[:, None]),
    (slice(0, 2), I[:2], J[:2]),
    (1, J),
    (I, 0),
    (Ellipsis, J),
    (np.array([[0, 1], [2, 1]]),),
    (slice(None, None, -1), I, slice(1, 3)),
]


@pytest.mark.parametrize("idx", ADV_CASES, ids=range(len(ADV_CASES)))
def test_advanced_indexing_matches_numpy(idx):
    a = _arr((3, 5, 4))
    check_opr(lambda x: advanced_indexing(x)[idx], lambda a: a[idx], [a])


def test_advanced_indexing_int_keeps_axis_and_index_vars():
    a = _arr((3, 4))
    check_opr(lambda x: advanced_indexing(x)[1], lambda a: a[1:2], [a])
    g, (x, i) = _graph(a, np.array([3, 0], np.int32))
    y = advanced_indexing(x)[:, i]
    assert infer_shape(y.node) == (3, 2)
    np.testing.assert_array_equal(run([y])[0], a[:, [3, 0]])


@pytest.mark.parametrize("idx", [ADV_CASES[2], ADV_CASES[3], ADV_CASES[4]], ids=range(3))
def test_advanced_indexing_grads(idx):
    dup = (np.array([0, 2, 0]), slice(None), np.array([1, 1, 1]))
    a, v = _arr((3, 5, 4), np.float64), _arr((3, 5), np.float64, seed=1)
    check_grad(lambda x: advanced_indexing(x)[idx], [a])
    check_grad(lambda x: advanced_indexing(x)[dup], [a])
    shp = a[idx].shape
    v = _arr(shp, np.float64, seed=2)
    check_grad(lambda x, y: incr_advanced_indexing(x, y)[idx], [a, v])
    if idx is ADV_CASES[3]:  # set with a repeated index: the last write wins
        idx = (I[:2], slice(1, None), J[:2, None])
        v = _arr(a[idx].shape, np.float64, seed=3)
    check_grad(lambda x, y: set_advanced_indexing(x, y)[idx], [a, v])
    # a broadcast value gets the summed gradient
    check_grad(lambda x, y: incr_advanced_indexing(x, y)[idx], [a, v[..., :1]])


def test_set_and_incr_advanced_indexing_match_numpy():
    a, v = _arr((4, 5)), _arr((3,), seed=1)
    i = np.array([1, 3, 1])

    def set_ref(a, v):
        out = a.copy()
        out[i, 2] = v
        return out

    def incr_ref(a, v):
        out = a.copy()
        np.add.at(out, (i, 2), v)  # repeated index 1 accumulates
        return out

    check_opr(lambda x, y: set_advanced_indexing(x, y)[i, 2], set_ref, [a, v])
    check_opr(lambda x, y: incr_advanced_indexing(x, y)[i, 2], incr_ref, [a, v])

    def incr_cols(a):
        out = a.copy()
        np.add.at(out, (slice(None), i), 1)
        return out

    check_opr(lambda x: incr_advanced_indexing(x, 1.0)[:, i], incr_cols, [a])


def test_advanced_indexing_errors():
    g, (x,) = _graph(_arr((3, 4)))
    y = advanced_indexing(x)[np.array([0, 3])]
    with pytest.raises(SubtensorIndexError, match=r"IndexingMultiAxisVec.*out of range"):
        run([y])
    with pytest.raises(MegBrainError, match=r"IndexingSetMultiAxisVec.*value shape \{3\}.*\{2\}"):
        set_advanced_indexing(x, np.zeros(3, np.float32))[np.array([0, 1]), 1]
    with pytest.raises(MegBrainError, match=r"can not be broadcast.*\{2\}, \{3\}"):
        advanced_indexing(x)[np.array([0, 1]), np.array([0, 1, 2])]
    with pytest.raises(IndexError):
        advanced_indexing(x)[1:2]


@st.composite
def vector_index(draw, shape, mesh):
    """An index of ``shape`` mixing int arrays (at least one), ints and slices."""
    idx, n_arr = [], 0
    length = draw(st.integers(1, 4))
    for d in shape:
        kind = draw(st.sampled_from(["array", "array", "int", "slice", "full"]))
        if kind == "array" or (kind == "int" and mesh):
            size = draw(st.integers(1, 4)) if mesh else length
            idx.append(
                np.array(draw(st.lists(st.integers(-d, d - 1), min_size=size, max_size=size)))
            )
            n_arr += 1
        elif kind == "int":
            idx.append(draw(st.integers(-d, d - 1)))
        elif kind == "slice":
            idx.append(slice(draw(st.integers(0, d - 1)), None, draw(st.sampled_from([1, 2]))))
        else:
            idx.append(slice(None))
    if not n_arr:
        idx[0] = np.array([0, shape[0] - 1])
    return tuple(idx)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(data=st.data(), shape=shapes, mesh=st.booleans())
def test_vector_indexing_matches_numpy(data, shape, mesh):
    idx = data.draw(vector_index(shape, mesh))

    def ref(a):
        if mesh:  # each array on its own axis: the open mesh over every axis
            parts = [
                np.arange(n)[i] if not isinstance(i, np.ndarray) else i
                for i, n in zip(idx, a.shape)
            ]
            parts = [np.atleast_1d(p) for p in parts] + [np.arange(n) for n in a.shape[len(idx) :]]
            return a[np.ix_(*parts)]
        # ints index like one-element arrays (MegBrain): they broadcast with the arrays
        return a[tuple(np.array([i]) if isinstance(i, int) else i for i in idx)]

    fn = mesh_indexing if mesh else advanced_indexing
    check_opr(lambda x: fn(x)[idx], ref, [_arr(shape)])


def test_incr_advanced_indexing_in_place_and_without_mem_opt():
    a, v = _arr((4, 5)), _arr((2, 5), seed=1)
    i = np.array([3, 1])
    want = a * 2
    want[i] += v
    for opt in (True, False):
        g = make_graph(seq_opt__enable_mem_plan_opt=opt)
        (x, y), _ = inputs(g, a, v)
        out = incr_advanced_indexing(x * 2, y)[i]
        got = {}
        f = g.compile([(out.node, lambda r, got=got: got.__setitem__("r", np.array(r)))])
        f.execute().wait()
        np.testing.assert_allclose(got["r"], want, rtol=1e-6)
        assert (f._plan.decisions[out.node][0] == "inplace") == opt


# ---- MeshIndexing ----------------------------------------------------------------------------
def test_mesh_indexing_forward_set_incr():
    a = _arr((3, 5, 4))
    i, k = np.array([2, 0, 2]), np.array([3, 1])
    v = _arr((3, 2, 2), seed=1)
    check_opr(lambda x: mesh_indexing(x)[i, 1:3, k], lambda a: a[np.ix_(i, [1, 2], k)], [a])

    def set_ref(a, v):
        out = a.copy()
        out[np.ix_(i, [1, 2], k)] = v
        return out

    def incr_ref(a, v):
        out = a.copy()
        np.add.at(out, np.ix_(i, [1, 2], k), v)
        return out

    check_opr(lambda x, y: set_mesh_indexing(x, y)[i, 1:3, k], set_ref, [a, v])
    check_opr(lambda x, y: incr_mesh_indexing(x, y)[i, 1:3, k], incr_ref, [a, v])


def test_mesh_indexing_grads():
    a = _arr((3, 5, 4), np.float64)
    i, k = np.array([2, 0, 2]), np.array([3, 1])
    v = _arr((3, 5, 2), np.float64, seed=1)
    check_grad(lambda x: mesh_indexing(x)[i, :, k], [a])
    check_grad(lambda x, y: set_mesh_indexing(x, y)[i[1:], :, k], [a, v[1:]])
    check_grad(lambda x, y: incr_mesh_indexing(x, y)[i, :, k], [a, v])


def test_mesh_indexing_error():
    g, (x,) = _graph(_arr((3, 4)))
    with pytest.raises(MegBrainError, match=r"MeshIndexing.*index of axis 0 must be 1-d.*\{1,2\}"):
        mesh_indexing(x)[np.array([[0, 1]])]


# ---- BatchedMeshIndexing ---------------------------------------------------------------------
def _batched_ref(a, i, k):
    return np.stack([a[b][np.ix_(np.arange(a.shape[1]), i[b], k[b])] for b in range(len(a))])


def test_batched_mesh_indexing_forward_set_incr():
    a = _arr((2, 3, 5, 4))
    rng = np.random.default_rng(5)
    i, k = rng.integers(0, 5, (2, 3)), rng.integers(0, 4, (2, 2))
    v = _arr((2, 3, 3, 2), seed=1)
    check_opr(lambda x: batched_mesh_indexing(x)[:, :, i, k], lambda a: _batched_ref(a, i, k), [a])

    def modify_ref(op):
        def ref(a, v):
            out = a.copy()
            for b in range(2):
                t = np.ix_(np.arange(3), i[b], k[b])
                if op == "set":
                    out[b][t] = v[b]
                else:
                    np.add.at(out[b], t, v[b])
            return out

        return ref

    check_opr(lambda x, y: batched_set_mesh_indexing(x, y)[:, :, i, k], modify_ref("set"), [a, v])
    i[0, 1] = i[0, 0]  # a repeated index accumulates
    check_opr(lambda x, y: batched_incr_mesh_indexing(x, y)[:, :, i, k], modify_ref("incr"), [a, v])


def test_batched_mesh_indexing_grads():
    a = _arr((2, 4, 3), np.float64)
    i = np.array([[0, 3, 3], [2, 1, 0]])
    v = _arr((2, 3, 3), np.float64, seed=1)
    check_grad(lambda x: batched_mesh_indexing(x)[:, i], [a])
    check_grad(lambda x, y: batched_incr_mesh_indexing(x, y)[:, i], [a, v])
    i2 = np.array([[0, 3], [2, 1]])
    check_grad(lambda x, y: batched_set_mesh_indexing(x, y)[:, i2], [a, v[:, :2]])


def test_batched_mesh_indexing_errors():
    g, (x,) = _graph(_arr((2, 4, 3)))
    with pytest.raises(MegBrainError, match=r"BatchedMeshIndexing.*batch axis"):
        batched_mesh_indexing(x)[np.array([[0]])]
    with pytest.raises(MegBrainError, match=r"BatchedMeshIndexing.*\(batch=2, k\).*\{3,1\}"):
        batched_mesh_indexing(x)[:, np.zeros((3, 1), np.int32)]


# ---- IndexingRemap ---------------------------------------------------------------------------
def test_indexing_remap_forward_and_grad():
    a = _arr((3, 4), np.float64)
    rng = np.random.default_rng(2)
    m = np.stack([rng.integers(0, 3, (5, 2)), rng.integers(0, 4, (5, 2))], -1).astype(np.int32)
    check_opr(lambda x: indexing_remap(x, m), lambda a: a[m[..., 0], m[..., 1]], [a])
    check_grad(lambda x: indexing_remap(x, m), [a])


def test_indexing_remap_errors():
    g, (x,) = _graph(_arr((3, 4)))
    with pytest.raises(MegBrainError, match=r"IndexingRemap.*map shape \{5,3\}.*ndim 2"):
        indexing_remap(x, np.zeros((5, 3), np.int32))
    y = indexing_remap(x, np.array([[0, 4]], np.int32))
    with pytest.raises(SubtensorIndexError, match=r"IndexingRemap.*out of range \[0, 4\)"):
        run([y])


# ---- ParamPackSplit / ParamPackConcat ----------------------------------------------------------
def test_param_pack_split_views_at_aligned_offsets():
    shapes = [(3, 2), (5,), (2, 2, 2)]
    g = make_graph()
    from megbrain.device import CompNode

    offs = param_pack_offsets(shapes, np.float32, CompNode.load("cpu0"))
    align = CompNode.load("cpu0").mem_align // 4
    assert all(b % align == 0 for b in offs[::2]) and offs[1] == 6
    packed = np.arange(offs[-1], dtype=np.float32)
    (x,), _ = inputs(g, packed)
    parts = param_pack_split(x, shapes)
    assert [infer_shape(p.node) for p in parts] == shapes
    got = {}
    f = g.compile(
        [(p.node, lambda a, i=i: got.__setitem__(i, np.array(a))) for i, p in enumerate(parts)]
    )
    f.execute().wait()
    for i, (b, e, s) in enumerate(zip(offs[::2], offs[1::2], shapes)):
        np.testing.assert_array_equal(got[i], packed[b:e].reshape(s))
        assert f._plan.decisions[parts[i].node][0] == "fwd"


def test_param_pack_split_copies_without_mem_opt():
    g = make_graph(seq_opt__enable_mem_plan_opt=False)
    (x,), _ = inputs(g, np.arange(40, dtype=np.float32))
    a, b = param_pack_split(x, [(2, 3), (4,)])
    got_a, got_b = run([a, b], g)
    np.testing.assert_array_equal(got_a, np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(got_b, np.arange(16, 20))


def test_param_pack_split_grad_and_concat():
    shapes = [(3, 2), (5,)]
    g = make_graph()
    from megbrain.device import CompNode

    offs = param_pack_offsets(shapes, np.float64, CompNode.load("cpu0"))
    (x,), _ = inputs(g, np.zeros(offs[-1] + 3))
    a, b = param_pack_split(x, shapes)
    ra, rb = _arr((3, 2), np.float64), _arr((5,), np.float64, seed=1)
    loss = (a * make_immutable("cpu0", g, ra, dtype=np.float64)).sum() + (
        b * make_immutable("cpu0", g, rb, dtype=np.float64)
    ).sum()
    (gx,) = grad(loss, [x])
    want = np.zeros(offs[-1] + 3)
    want[offs[0] : offs[1]], want[offs[2] : offs[3]] = ra.ravel(), rb
    np.testing.assert_allclose(run([gx])[0], want)
    packed = param_pack_concat([make_immutable("cpu0", g, ra, dtype=np.float64), b])
    assert infer_shape(packed.node) == (offs[-1],)


def test_param_pack_split_error():
    g, (x,) = _graph(np.zeros(10, np.float32))
    with pytest.raises(MegBrainError, match=r"ParamPackSplit.*at least 21 elements.*\{10\}"):
        param_pack_split(x, [(2,), (5,)])
    (i,), _ = inputs(g, np.zeros(3, np.int32))
    with pytest.raises(MegBrainError, match=r"ParamPackConcat.*one dtype, got float32, int32"):
        param_pack_concat([x, i])
