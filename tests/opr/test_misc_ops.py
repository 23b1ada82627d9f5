"""Argmax, Argmin, Argsort, TopK, Cumsum and CondTake: forward against NumPy, static (and,
for CondTake, dynamic) shapes, gradients against finite differences, and errors."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opr_harness import check_grad, check_opr, inputs, make_graph, run

from megbrain.errors import MegBrainError
from megbrain.graph import infer_shape
from megbrain.opr import make_immutable
from megbrain.opr.grad import grad
from megbrain.opr.misc import argmax, argmin, argsort, cond_take, cumsum, top_k

shapes = st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple)


def _arr(shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _distinct(shape, seed=0):
    """Values without ties (a shuffled range), so orders are unique."""
    n = int(np.prod(shape))
    return np.random.default_rng(seed).permutation(n).reshape(shape).astype(np.float64) / n


# ---- Argmax / Argmin -----------------------------------------------------------------------
@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    data=st.data(),
    shape=shapes,
    keepdims=st.booleans(),
    dtype=st.sampled_from([np.float32, np.int32, np.int8]),
)
def test_argmax_argmin_match_numpy(data, shape, keepdims, dtype):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    a = (_arr(shape) * 3).astype(dtype)
    for fn, ref in ((argmax, np.argmax), (argmin, np.argmin)):
        (got,) = check_opr(
            lambda x, fn=fn: fn(x, axis, keepdims),
            lambda a, ref=ref: np.atleast_1d(ref(a, axis=axis, keepdims=keepdims)),
            [a],
        )
        assert got.dtype == np.int32


def test_argmax_none_axis_flattens():
    a = _arr((3, 4))
    check_opr(lambda x: argmax(x), lambda a: np.array([np.argmax(a)]), [a])
    check_opr(lambda x: argmin(x), lambda a: np.array([np.argmin(a)]), [a])


def test_argmax_operator_keeps_axis_and_errors():
    g = make_graph()
    (x,), _ = inputs(g, _arr((2, 3, 4)))
    assert infer_shape(argmax(x, 1, keepdims=True).node) == (2, 1, 4)
    with pytest.raises(MegBrainError, match=r"Argmax.*axis 3 out of range.*\{2,3,4\}"):
        argmax(x, 3, keepdims=True)


# ---- Argsort ---------------------------------------------------------------------------------
@pytest.mark.parametrize("order", ["ASCENDING", "descending"])
@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (4, 17)])
def test_argsort_matches_numpy(order, shape):
    a = _distinct(shape).astype(np.float32)
    desc = order.upper() == "DESCENDING"

    def ref(a):
        idx = np.argsort(-a if desc else a, axis=1)
        return np.take_along_axis(a, idx, 1), idx

    val, idx = check_opr(lambda x: argsort(x, order), ref, [a])
    assert idx.dtype == np.int32


def test_argsort_ties_are_stable():
    a = np.array([[1, 0, 1, 0, 1]], np.int32)
    _, asc = check_opr(lambda x: argsort(x), lambda a: (np.sort(a), [[1, 3, 0, 2, 4]]), [a])
    check_opr(lambda x: argsort(x, "DESCENDING"), lambda a: (-np.sort(-a), [[0, 2, 4, 1, 3]]), [a])


@pytest.mark.parametrize("order", ["ASCENDING", "DESCENDING"])
def test_argsort_grad(order):
    check_grad(lambda x: argsort(x, order)[0], [_distinct((3, 4))])


# ---- TopK ------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 3, 6, -1, -4, -6])
def test_top_k_modes(k):
    a = _distinct((4, 6), seed=k + 10).astype(np.float32)
    kk = abs(k)
    s = np.sort(a, axis=1)
    want = s[:, :kk] if k > 0 else s[:, ::-1][:, :kk]
    (kth, empty) = check_opr(lambda x: top_k(x, k), lambda a: (want[:, -1], np.zeros(0)), [a])
    assert kth.shape == (4,) and empty.shape == (0,)
    val, idx = check_opr(
        lambda x: top_k(x, k, "VALUE_IDX_SORTED"),
        lambda a: (want, np.argsort(a if k > 0 else -a, axis=1)[:, :kk]),
        [a],
    )
    assert idx.dtype == np.int32
    g = make_graph()
    (x,), _ = inputs(g, a)
    val, idx = run(top_k(x, k, mode="VALUE_IDX_NOSORT"))
    np.testing.assert_array_equal(np.sort(val, 1), np.sort(want, 1))
    np.testing.assert_array_equal(np.take_along_axis(a, idx, 1), val)


def test_top_k_with_k_var_replans():
    a = _distinct((3, 8)).astype(np.float32)
    g = make_graph()
    (x, k), hosts = inputs(g, a, np.array([2], np.int32))
    val, _ = top_k(x, k, "VALUE_IDX_SORTED")
    assert infer_shape(val.node) == (3, 2)
    got = {}
    f = g.compile([(val.node, lambda v: got.__setitem__("v", np.array(v)))])
    f.execute().wait()
    np.testing.assert_array_equal(got["v"], np.sort(a, 1)[:, :2])
    hosts[1].arr = np.array([-3], np.int32)
    f.execute().wait()
    np.testing.assert_array_equal(got["v"], -np.sort(-a, 1)[:, :3])


@pytest.mark.parametrize("mode", ["KTH_ONLY", "VALUE_IDX_SORTED", "VALUE_IDX_NOSORT"])
@pytest.mark.parametrize("k", [2, -3])
def test_top_k_grad(mode, k):
    check_grad(lambda x: top_k(x, k, mode)[0], [_distinct((3, 5), seed=1)])


def test_top_k_kth_grad_splits_ties():
    a = np.array([[1.0, 2.0, 2.0, 3.0]])
    g = make_graph()
    (x,), _ = inputs(g, a)
    (gx,) = grad(top_k(x, -2)[0].sum(), [x], warn_mid_wrt=False)
    np.testing.assert_allclose(run([gx])[0], [[0, 0.5, 0.5, 0]])


def test_top_k_errors():
    g = make_graph()
    (x, y), _ = inputs(g, _arr((3, 4)), _arr((2, 3, 4)))
    with pytest.raises(MegBrainError, match=r"TopK.*k=5 out of range.*\{3,4\}"):
        top_k(x, 5)
    with pytest.raises(MegBrainError, match=r"TopK.*must be 2-d.*\{2,3,4\}"):
        top_k(y, 1)
    with pytest.raises(MegBrainError, match=r"Argsort.*must be 2-d.*\{2,3,4\}"):
        argsort(y)


# ---- Cumsum ----------------------------------------------------------------------------------
def _np_cumsum(a, axis, exclusive, reverse):
    if reverse:
        a = np.flip(a, axis)
    c = np.cumsum(a, axis=axis, dtype=a.dtype)
    if exclusive:
        c = c - a
    return np.flip(c, axis) if reverse else c


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    data=st.data(),
    shape=shapes,
    exclusive=st.booleans(),
    reverse=st.booleans(),
    dtype=st.sampled_from([np.float32, np.int32]),
)
def test_cumsum_matches_numpy(data, shape, exclusive, reverse, dtype):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    a = (_arr(shape) * 4).astype(dtype)
    check_opr(
        lambda x: cumsum(x, axis, exclusive, reverse),
        lambda a: _np_cumsum(a, axis, exclusive, reverse),
        [a],
        rtol=1e-5,
        atol=1e-5,
    )


def test_cumsum_default_flattens_and_is_exclusive():
    a = _arr((2, 3))
    (got,) = check_opr(lambda x: cumsum(x), lambda a: _np_cumsum(a.ravel(), 0, True, False), [a])
    assert got.shape == (6,) and got[0] == 0


@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
def test_cumsum_grad(exclusive, reverse):
    check_grad(lambda x: cumsum(x, 1, exclusive, reverse), [_arr((2, 4, 3))])
    check_grad(lambda x: cumsum(x, exclusive=exclusive, reverse=reverse), [_arr((2, 3))])


def test_cumsum_axis_error():
    g = make_graph()
    (x,), _ = inputs(g, _arr((2, 3)))
    with pytest.raises(MegBrainError, match=r"Cumsum.*axis 2 out of range.*\{2,3\}"):
        cumsum(x, 2)


# ---- CondTake --------------------------------------------------------------------------------
_CMP = {
    "EQ": lambda m, v, e: np.abs(m - v) < e,
    "NEQ": lambda m, v, e: ~(np.abs(m - v) < e),
    "LT": lambda m, v, e: m < v,
    "LEQ": lambda m, v, e: m <= v,
    "GT": lambda m, v, e: m > v,
    "GEQ": lambda m, v, e: m >= v,
}


@pytest.mark.parametrize("mode", list(_CMP))
def test_cond_take_matches_numpy(mode):
    rng = np.random.default_rng(3)
    data = _arr((3, 4, 5))
    mask = rng.integers(-2, 3, (3, 4, 5)).astype(np.float32)
    mask[0, 0, 0] = 1 + 1e-8
    cond = _CMP[mode](mask, 1.0, 1e-6).ravel()
    g = make_graph()
    (x, m), _ = inputs(g, data, mask)
    val, idx = cond_take(x, m, mode, val=1)
    assert not val.node.shape_static and not idx.node.shape_static
    got_val, got_idx = run([val, idx])
    np.testing.assert_array_equal(got_idx, np.nonzero(cond)[0])
    np.testing.assert_array_equal(got_val, data.ravel()[cond])
    assert got_idx.dtype == np.int32


def test_cond_take_int_mask_and_rerun_changes_length():
    data = np.arange(6, dtype=np.float32)
    g = make_graph()
    (x, m), hosts = inputs(g, data, np.array([0, 1, 0, 1, 1, 0], np.int32))
    val, idx = cond_take(x, m, "EQ", val=1)
    got = {}
    f = g.compile(
        [
            (val.node, lambda v: got.__setitem__("v", np.array(v))),
            (idx.node, lambda v: got.__setitem__("i", np.array(v))),
        ]
    )
    f.execute().wait()
    np.testing.assert_array_equal(got["v"], [1, 3, 4])
    hosts[1].arr = np.array([1, 0, 0, 0, 0, 0], np.int32)
    f.execute().wait()
    np.testing.assert_array_equal(got["i"], [0])
    hosts[1].arr = np.zeros(6, np.int32)
    f.execute().wait()
    assert got["v"].shape == (0,)


def test_cond_take_grad():
    data = _arr((3, 4), np.float64)
    mask = np.random.default_rng(1).integers(0, 2, (3, 4)).astype(np.float64)
    g = make_graph()
    (x, m), _ = inputs(g, data, mask)
    val, _ = cond_take(x, m, "GT", val=0.5)
    w = make_immutable("cpu0", g, np.arange(12.0).reshape(3, 4), dtype=np.float64)
    (w_taken, _) = cond_take(w, m, "GT", val=0.5)
    loss = (val * val * w_taken).sum()
    (gx,) = grad(loss, [x], warn_mid_wrt=False)
    got = run([gx])[0]
    np.testing.assert_allclose(got, 2 * data * (mask > 0.5) * np.arange(12.0).reshape(3, 4))


def test_cond_take_shape_error():
    g = make_graph()
    (x, m), _ = inputs(g, _arr((3, 4)), _arr((4, 3)))
    with pytest.raises(MegBrainError, match=r"CondTake.*data \{3,4\} and mask \{4,3\}"):
        cond_take(x, m)
