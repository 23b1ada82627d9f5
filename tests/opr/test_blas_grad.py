"""Gradients of MatrixMul, BatchedMatrixMul and Dot against finite differences."""

import numpy as np
import pytest
from opr_harness import check_grad

from megbrain.opr import broadcast
from megbrain.opr.blas import batched_matrix_mul, dot, matrix_mul

RNG = np.random.default_rng(0)


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
def test_matrix_mul_grad(ta, tb):
    a = RNG.standard_normal((4, 3) if ta else (3, 4))
    b = RNG.standard_normal((5, 4) if tb else (4, 5))
    check_grad(lambda x, y: matrix_mul(x, y, transposeA=ta, transposeB=tb), [a, b])


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
def test_batched_matrix_mul_grad(ta, tb):
    a = RNG.standard_normal((2, 4, 3) if ta else (2, 3, 4))
    b = RNG.standard_normal((2, 5, 4) if tb else (2, 4, 5))
    check_grad(lambda x, y: batched_matrix_mul(x, y, transposeA=ta, transposeB=tb), [a, b])


@pytest.mark.parametrize("tb", [False, True])
def test_batched_matrix_mul_by_a_broadcast_matrix_grad(tb):
    # forward and the data gradient run as one GEMM over the rows; the weight's gradient
    # sums the batch through the broadcast
    a = RNG.standard_normal((3, 2, 4))
    w = RNG.standard_normal((5, 4) if tb else (4, 5))
    check_grad(lambda x, y: batched_matrix_mul(x, broadcast(y, (3,) + w.shape), transposeB=tb),
               [a, w])  # fmt: skip


def test_dot_grad_with_broadcast():
    check_grad(dot, [RNG.standard_normal(6), RNG.standard_normal(6)])
    check_grad(dot, [RNG.standard_normal(1), RNG.standard_normal(6)])


def test_matmul_second_order():
    from megbrain.opr import SymbolVar
    from megbrain.opr.grad import grad

    def first_grad(x, y):
        c = matrix_mul(x, y)
        return SymbolVar(grad((c * c).sum(), [x])[0])

    check_grad(first_grad, [RNG.standard_normal((2, 3)), RNG.standard_normal((3, 2))])
