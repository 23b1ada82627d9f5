"""MatrixMul, BatchedMatrixMul and Dot: forward against NumPy, dtypes, shape errors."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opr_harness import check_opr, inputs, make_graph, run

from megbrain.errors import MegBrainError
from megbrain.graph import InferType
from megbrain.opr import batched_matrix_mul, broadcast, dot, make_immutable, matrix_mul

dims = st.integers(1, 6)
float_dtypes = st.sampled_from([np.float32, np.float16])


def _mat(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def _op(x, transpose):
    return np.swapaxes(x, -1, -2) if transpose else x


@settings(max_examples=40, deadline=None, derandomize=True)
@given(m=dims, k=dims, n=dims, ta=st.booleans(), tb=st.booleans(), dtype=float_dtypes)
def test_matrix_mul_matches_numpy(m, k, n, ta, tb, dtype):
    rng = np.random.default_rng(m * 100 + k * 10 + n)
    a = _mat(rng, (k, m) if ta else (m, k), dtype)
    b = _mat(rng, (n, k) if tb else (k, n), dtype)
    tol = 1e-5 if dtype == np.float32 else 2e-3  # float16: products rounded once
    (got,) = check_opr(
        lambda x, y: matrix_mul(x, y, ta, tb),
        lambda x, y: _op(x, ta).astype(np.float64) @ _op(y, tb),
        [a, b],
        rtol=tol,
        atol=tol,
    )
    assert got.dtype == dtype and got.shape == (m, n)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(bt=dims, m=dims, k=dims, n=dims, ta=st.booleans(), tb=st.booleans())
def test_batched_matrix_mul_matches_numpy(bt, m, k, n, ta, tb):
    rng = np.random.default_rng(bt + 7 * m + 49 * k + 343 * n)
    a = _mat(rng, (bt, k, m) if ta else (bt, m, k), np.float32)
    b = _mat(rng, (bt, n, k) if tb else (bt, k, n), np.float32)
    (got,) = check_opr(
        lambda x, y: batched_matrix_mul(x, y, transposeA=ta, transposeB=tb),
        lambda x, y: np.matmul(_op(x, ta), _op(y, tb)),
        [a, b],
        atol=1e-5,
    )
    assert got.shape == (bt, m, n)


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
def test_batched_matrix_mul_by_a_broadcast_matrix_is_one_gemm(ta, tb, monkeypatch):
    import megbrain.kernels.blas as kernels

    def per_matrix(products):
        assert ta, "a broadcast weight's batch ran as one product per matrix"
        return products_step(products)

    products_step = kernels.products_step
    monkeypatch.setattr(kernels, "products_step", per_matrix)
    rng = np.random.default_rng(1)
    a = _mat(rng, (6, 9, 7) if ta else (6, 7, 9), np.float32)
    w = _mat(rng, (5, 9) if tb else (9, 5), np.float32)
    (got,) = check_opr(
        lambda x, y: batched_matrix_mul(x, broadcast(y, (6,) + w.shape), ta, tb),
        lambda x, y: np.matmul(_op(x.astype(np.float64), ta), _op(y, tb)),
        [a, w],
        value_infer=False,  # static inference materializes the broadcast
    )
    assert got.shape == (6, 7, 5)


@pytest.mark.parametrize("compute_mode", ["DEFAULT", "FLOAT32"])
def test_matrix_mul_float16(compute_mode):
    rng = np.random.default_rng(0)
    a, b = _mat(rng, (5, 7), np.float16), _mat(rng, (7, 3), np.float16)
    ref = (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)
    (got,) = check_opr(
        lambda x, y: matrix_mul(x, y, compute_mode=compute_mode),
        lambda x, y: ref,
        [a, b],
        rtol=1e-2,
        atol=1e-2,
    )
    assert got.dtype == np.float16


def test_batched_matrix_mul_float16():
    rng = np.random.default_rng(1)
    a, b = _mat(rng, (2, 4, 6), np.float16), _mat(rng, (2, 6, 3), np.float16)
    ref = np.matmul(a.astype(np.float32), b.astype(np.float32))
    (got,) = check_opr(batched_matrix_mul, lambda x, y: ref, [a, b], rtol=1e-2, atol=1e-2)
    assert got.dtype == np.float16


@pytest.mark.parametrize("dtype", [None, "int32"])
def test_matrix_mul_int8_accumulates_in_int32(dtype):
    a = np.full((3, 8), 100, np.int8)
    b = np.full((8, 2), -100, np.int8)
    (got,) = check_opr(
        lambda x, y: matrix_mul(x, y, dtype=dtype),
        lambda x, y: x.astype(np.int32) @ y.astype(np.int32),
        [a, b],
    )
    assert got.dtype == np.int32
    assert (got == -80000).all()


def test_dot_int8_gives_int32():
    a = np.full(6, 100, np.int8)
    (got,) = check_opr(
        lambda x, y: dot(x, y, dtype="int32"), lambda x, y: np.array([60000], np.int32), [a, a]
    )
    assert got.dtype == np.int32


@settings(max_examples=25, deadline=None, derandomize=True)
@given(n=st.integers(1, 40), dtype=float_dtypes)
def test_dot_matches_numpy(n, dtype):
    rng = np.random.default_rng(n)
    a, b = _mat(rng, n, dtype), _mat(rng, n, dtype)
    tol = 1e-5 if dtype == np.float32 else 2e-3
    (got,) = check_opr(
        dot, lambda x, y: np.dot(x.astype(np.float64), y).reshape(1), [a, b], rtol=tol, atol=tol * n
    )
    assert got.shape == (1,) and got.dtype == dtype


@pytest.mark.parametrize("scalar_first", [True, False])
def test_dot_broadcasts_length_one(scalar_first):
    v, s = np.arange(5, dtype=np.float32), np.array([2.5], np.float32)
    arrays = [s, v] if scalar_first else [v, s]
    check_opr(dot, lambda x, y: np.array([2.5 * v.sum()]), arrays)


def test_dot_float16():
    rng = np.random.default_rng(3)
    a, b = _mat(rng, 9, np.float16), _mat(rng, 9, np.float16)
    ref = np.dot(a.astype(np.float32), b.astype(np.float32)).reshape(1)
    (got,) = check_opr(dot, lambda x, y: ref, [a, b], rtol=1e-2, atol=1e-2)
    assert got.dtype == np.float16


def test_matmul_operator_constant_operand_and_dedup():
    g = make_graph()
    (x,), _ = inputs(g, np.arange(6, dtype=np.float32).reshape(2, 3))
    w = np.arange(12, dtype=np.float64).reshape(3, 4)  # the constant takes x's dtype
    y = x @ w
    assert y == matrix_mul(x, w)  # an identical insertion returns the existing var
    assert y != matrix_mul(x, w, name="other", comp_node="cpu1")
    (got,) = run([y], g)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, np.arange(6).reshape(2, 3) @ w)


def test_inferred_value_over_constants_is_const():
    g = make_graph()
    a = np.arange(6, dtype=np.float32).reshape(3, 2)
    b = np.arange(4, dtype=np.float32).reshape(2, 2)
    y = matrix_mul(make_immutable("cpu0", g, a), make_immutable("cpu0", g, b), transposeB=True)
    assert y.node.value_type == InferType.CONST
    np.testing.assert_array_equal(y.inferred_value, a @ b.T)
    d = dot(make_immutable("cpu0", g, a[:, 0]), make_immutable("cpu0", g, a[:, 1]))
    np.testing.assert_array_equal(d.inferred_value, [a[:, 0] @ a[:, 1]])


def test_input_shape_change_replans():
    g = make_graph()
    (x, w), (hx, _) = inputs(g, np.ones((2, 3), np.float32), np.ones((3, 4), np.float32))
    got = {}
    f = g.compile([(matrix_mul(x, w).node, lambda a: got.__setitem__("y", np.array(a)))])
    f.execute().wait()
    assert got["y"].shape == (2, 4)
    hx.arr = np.full((5, 3), 2, np.float32)
    f.execute().wait()
    np.testing.assert_array_equal(got["y"], np.full((5, 4), 6, np.float32))


def _build(builder, *arrays, **kw):
    g = make_graph()
    xs, _ = inputs(g, *arrays)
    return builder(*xs, **kw)


@pytest.mark.parametrize(
    ("fn", "shapes", "kw", "needles"),
    [
        (matrix_mul, [(2, 3), (4, 5)], {}, ["{2,3}", "{4,5}", "transposeA=False"]),
        (
            matrix_mul,
            [(2, 3), (2, 3)],
            {"transposeB": True, "transposeA": True},
            ["{2,3}", "transposeA=True", "transposeB=True"],
        ),
        (matrix_mul, [(2, 3, 4), (4, 5)], {}, ["2-d", "{2,3,4}", "{4,5}"]),
        (batched_matrix_mul, [(2, 3, 4), (3, 4, 5)], {}, ["batch", "{2,3,4}", "{3,4,5}"]),
        (batched_matrix_mul, [(2, 3, 4), (2, 5, 4)], {}, ["{2,3,4}", "{2,5,4}"]),
        (batched_matrix_mul, [(3, 4), (4, 5)], {}, ["3-d", "{3,4}"]),
        (dot, [(3,), (4,)], {}, ["{3}", "{4}"]),
        (dot, [(3, 1), (3,)], {}, ["{3,1}", "{3}"]),
    ],
)
def test_bad_shapes_raise_naming_operator_and_shapes(fn, shapes, kw, needles):
    arrays = [np.zeros(s, np.float32) for s in shapes]
    with pytest.raises(MegBrainError) as info:
        _build(fn, *arrays, name="bad_opr", **kw)
    msg = str(info.value)
    assert "bad_opr" in msg
    assert ("Dot" if fn is dot else "MatrixMul") in msg
    for needle in needles:
        assert needle in msg


@pytest.mark.parametrize("fn", [matrix_mul, batched_matrix_mul, dot])
def test_mixed_dtypes_raise(fn):
    shape = {dot: (3,), matrix_mul: (3, 3), batched_matrix_mul: (2, 3, 3)}[fn]
    with pytest.raises(MegBrainError, match="'mixed'.*float32 and float16"):
        _build(fn, np.zeros(shape, np.float32), np.zeros(shape, np.float16), name="mixed")


def test_unsupported_output_dtype_and_format_raise():
    a = np.zeros((2, 2), np.float32)
    with pytest.raises(MegBrainError, match="MatrixMul.*output dtype int32"):
        _build(matrix_mul, a, a, dtype="int32")
    with pytest.raises(MegBrainError, match="format MK4"):
        _build(matrix_mul, a, a, format="MK4")
    with pytest.raises(MegBrainError, match="compute_mode"):
        _build(matrix_mul, a, a, compute_mode="FLOAT64")


def test_matrix_mul_of_strided_views():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.arange(15, dtype=np.float32).reshape(5, 3)
    check_opr(
        lambda x, y: matrix_mul(x.dimshuffle(1, 0), y, transposeB=True),
        lambda x, y: x.T @ y.T,
        [a, b],
    )
    check_opr(
        lambda x, y: batched_matrix_mul(x.reshape(1, 3, 4), y.reshape(1, 5, 3), True, True),
        lambda x, y: (x.T @ y.T)[None],
        [a, b],
    )
