"""UniformRNG and GaussianRNG (ranges, moments, seeding, no value inference, no dedup) and
Alloc, Linspace and Eye (values, static shape and value inference, Linspace's gradient)."""

import numpy as np
import pytest
from opr_harness import check_grad, check_opr, inputs, make_graph, run

import megbrain as mgb
from megbrain.errors import MegBrainError
from megbrain.graph import infer_shape
from megbrain.opr.gen import alloc, eye, linspace
from megbrain.opr.rand import gaussian_rng, uniform_rng


def _runner(graph, var):
    got = {}
    f = graph.compile([(var.node, lambda a: got.__setitem__("v", np.array(a)))])

    def call():
        f.execute().wait()
        return got["v"]

    return call


# ---- random ----------------------------------------------------------------------------------
def test_uniform_rng_range_shape_and_moments():
    g = make_graph()
    u = uniform_rng((200, 500), seed=3, comp_node="cpu0", comp_graph=g)
    assert infer_shape(u.node) == (200, 500) and u.dtype == np.float32
    assert u.inferred_value is None
    (v,) = run([u])
    assert v.shape == (200, 500) and v.min() > 0 and v.max() <= 1
    assert abs(v.mean() - 0.5) < 0.01 and abs(v.var() - 1 / 12) < 0.005


def test_gaussian_rng_moments():
    g = make_graph()
    x = gaussian_rng([100000], seed=1, mean=2.0, std=3.0, comp_node="cpu0", comp_graph=g)
    (v,) = run([x])
    assert abs(v.mean() - 2) < 0.05 and abs(v.std() - 3) < 0.05


@pytest.mark.parametrize("fn", [uniform_rng, gaussian_rng])
def test_rng_seeding(fn):
    def fresh(seed):
        g = make_graph()
        return _runner(g, fn((4, 5), seed=seed, comp_node="cpu0", comp_graph=g))

    a, b, c = fresh(7), fresh(7), fresh(8)
    first = a()
    np.testing.assert_array_equal(first, b())  # same seed, fresh graph: same sequence
    assert not np.array_equal(first, c())
    second = a()
    assert not np.array_equal(first, second)  # successive runs advance the generator
    np.testing.assert_array_equal(second, b())


def test_rng_not_deduplicated_and_shape_from_var():
    g = make_graph()
    (x,), hosts = inputs(g, np.zeros((2, 3), np.float32))
    u1, u2 = uniform_rng(x.shape, seed=1), uniform_rng(x.shape, seed=1)
    assert u1.node is not u2.node
    a, b = run([u1, u2], g)
    np.testing.assert_array_equal(a, b)
    f = _runner(g, gaussian_rng(x.shape, seed=2) + x)
    assert f().shape == (2, 3)
    hosts[0].arr = np.zeros((4, 1), np.float32)
    assert f().shape == (4, 1)


def test_rng_dtype_and_errors():
    g = make_graph()
    h = uniform_rng((3,), dtype="float16", comp_node="cpu0", comp_graph=g)
    (v,) = run([h])
    assert v.dtype == np.float16 and 0 < v.min() and v.max() <= 1
    with pytest.raises(MegBrainError, match=r"UniformRNG.*must be a float dtype, got int32"):
        uniform_rng((3,), dtype="int32", comp_node="cpu0", comp_graph=g)
    with pytest.raises(MegBrainError, match=r"gaussian_rng\(\) shape: bad shape \(2, -1\)"):
        gaussian_rng((2, -1), comp_node="cpu0", comp_graph=g)
    neg = mgb.make_immutable("cpu0", g, np.array([2, -1], np.int32))
    with pytest.raises(MegBrainError, match=r"GaussianRNG.*bad output shape \[2, -1\]"):
        gaussian_rng(neg)
    with pytest.raises(MegBrainError, match="comp_graph= and comp_node="):
        uniform_rng((3,))


# ---- Alloc / Linspace / Eye ------------------------------------------------------------------
def test_alloc_zeros_with_static_value():
    g = make_graph()
    a = alloc((2, 3), "int32", comp_node="cpu0", comp_graph=g)
    assert infer_shape(a.node) == (2, 3) and a.dtype == np.int32
    np.testing.assert_array_equal(a.inferred_value, np.zeros((2, 3)))
    np.testing.assert_array_equal(run([a])[0], np.zeros((2, 3)))
    with pytest.raises(MegBrainError, match=r"alloc\(\) shape: bad shape \(-2,\)"):
        alloc((-2,), comp_node="cpu0", comp_graph=g)
    with pytest.raises(MegBrainError, match=r"Alloc.*bad output shape \[-2\]"):
        alloc(mgb.make_immutable("cpu0", g, np.array([-2], np.int32)))


@pytest.mark.parametrize("endpoint", [True, False])
@pytest.mark.parametrize("num", [1, 2, 7])
def test_linspace_matches_numpy(endpoint, num):
    g = make_graph()
    y = linspace(-1.5, 2.0, num, endpoint, comp_node="cpu0", comp_graph=g)
    want = np.linspace(-1.5, 2.0, num, endpoint=endpoint).astype(np.float32)
    assert infer_shape(y.node) == (num,) and y.dtype == np.float32
    np.testing.assert_allclose(y.inferred_value, want, rtol=1e-6)
    np.testing.assert_allclose(run([y])[0], want, rtol=1e-6)


def test_linspace_from_vars_and_grad():
    check_opr(
        lambda a, b: linspace(a, b, 5),
        lambda a, b: np.linspace(a[0], b[0], 5),
        [np.array([1.0], np.float32), np.array([3.0], np.float32)],
    )
    for endpoint in (True, False):
        check_grad(
            lambda a, b, e=endpoint: linspace(a, b, 6, e), [np.array([0.5]), np.array([-2.0])]
        )


def test_linspace_errors():
    g = make_graph()
    with pytest.raises(MegBrainError, match=r"Linspace.*num must be positive, got 0"):
        linspace(0, 1, 0, comp_node="cpu0", comp_graph=g)
    (x,), _ = inputs(g, np.zeros(2, np.float32))
    with pytest.raises(MegBrainError, match=r"Linspace.*start must hold one value, got \{2\}"):
        linspace(x, 1.0, 3)


@pytest.mark.parametrize("shape,k", [(3, 0), ((3, 5), 1), ((4, 2), -1), ((2, 3), 5)])
def test_eye_matches_numpy(shape, k):
    g = make_graph()
    e = eye(shape, k, "float32", comp_node="cpu0", comp_graph=g)
    rows, cols = (shape, shape) if isinstance(shape, int) else shape
    want = np.eye(rows, cols, k)
    np.testing.assert_array_equal(e.inferred_value, want)
    np.testing.assert_array_equal(run([e])[0], want)


def test_eye_error():
    g = make_graph()
    with pytest.raises(MegBrainError, match=r"Eye.*must be \(rows, cols\), got \{2,2,2\}"):
        eye((2, 2, 2), comp_node="cpu0", comp_graph=g)
