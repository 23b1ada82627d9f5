"""MatrixInverse and SVD over batches of matrices: forward against numpy.linalg, static shapes,
gradients against finite differences, and errors."""

import numpy as np
import pytest
from opr_harness import check_grad, check_opr, inputs, make_graph, run

from megbrain.errors import MegBrainError
from megbrain.graph import infer_shape
from megbrain.opr.grad import grad
from megbrain.opr.linalg import matrix_inverse, svd


def _well_conditioned(shape, dtype=np.float64, seed=0):
    n = shape[-1]
    a = np.random.default_rng(seed).standard_normal(shape) + n * np.eye(n)
    return a.astype(dtype)


# ---- MatrixInverse ---------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(1, 1), (4, 4), (3, 2, 2), (2, 3, 3, 3)])
def test_matrix_inverse_matches_numpy(shape):
    check_opr(
        matrix_inverse, np.linalg.inv, [_well_conditioned(shape, np.float32)], rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize("shape", [(3, 3), (2, 3, 3), (2, 1, 2, 2)])
def test_matrix_inverse_grad(shape):
    check_grad(matrix_inverse, [_well_conditioned(shape)])


def test_matrix_inverse_errors():
    g = make_graph()
    (x, y), _ = inputs(g, np.zeros((2, 3, 4), np.float32), np.zeros((2, 2), np.float32))
    with pytest.raises(MegBrainError, match=r"MatrixInverse.*must be square.*\{2,3,4\}"):
        matrix_inverse(x)
    with pytest.raises(MegBrainError, match=r"MatrixInverse.*[Ss]ingular.*\{2,2\}"):
        run([matrix_inverse(y)])


# ---- SVD -------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(3, 3), (4, 2), (2, 5), (2, 3, 4), (2, 2, 4, 3)])
@pytest.mark.parametrize("full", [False, True])
def test_svd_matches_numpy(shape, full):
    a = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    g = make_graph()
    (x,), _ = inputs(g, a)
    outs = svd(x, full_matrices=full)
    u, s, vt = run(outs)
    want_u, want_s, want_vt = np.linalg.svd(a, full_matrices=full)
    for o, got, want in zip(outs, (u, s, vt), (want_u, want_s, want_vt)):
        assert infer_shape(o.node) == got.shape == want.shape
    np.testing.assert_allclose(s, want_s, rtol=1e-5, atol=1e-5)
    k = s.shape[-1]
    rebuilt = (u[..., :k] * s[..., None, :]) @ vt[..., :k, :]
    np.testing.assert_allclose(rebuilt, a, rtol=1e-4, atol=1e-5)


def test_svd_without_uv():
    a = np.random.default_rng(2).standard_normal((2, 4, 3))
    u, s, vt = check_opr(
        lambda x: svd(x, compute_uv=False),
        lambda a: (np.zeros(0), np.linalg.svd(a, compute_uv=False), np.zeros(0)),
        [a],
    )
    assert u.shape == vt.shape == (0,)


@pytest.mark.parametrize("shape", [(3, 3), (4, 2), (2, 3, 4)])
@pytest.mark.parametrize("full,uv", [(False, True), (True, True), (False, False)])
def test_svd_grad_of_singular_values(shape, full, uv):
    a = np.random.default_rng(3).standard_normal(shape)
    check_grad(lambda x: svd(x, full_matrices=full, compute_uv=uv)[1], [a])


def test_svd_errors():
    g = make_graph()
    (x, i), _ = inputs(g, np.ones(3, np.float32), np.ones((2, 2), np.int32))
    with pytest.raises(MegBrainError, match=r"SVD.*must be \[\.\.\., m, n\], got \{3\}"):
        svd(x)
    with pytest.raises(MegBrainError, match=r"SVD.*float32 or float64, got int32"):
        svd(i)
    (y,), _ = inputs(g, np.eye(2, dtype=np.float32))
    u, s, vt = svd(y)
    (gy,) = grad((u * s).sum(), [y])
    with pytest.raises(MegBrainError, match=r"SVD.*only the gradient through the singular"):
        run([gy], g)
