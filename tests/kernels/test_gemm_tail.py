"""The packed GEMM's elementwise tail (``gemm_loops.emit_tail``: a Linear layer's GELU in
the tiles' write-out) and ``blas.bind_batched_matmul_tail``: float64 references, the JIT's
own kernel as the fallback, clear errors."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit
from numba import types as nt
from scipy.special import erf
from test_conv_algos import assert_allocates_nothing

from megbrain.kernels import blas, gemm_loops, packed_gemm, parallel
from megbrain.kernels.conv.constant_operands import constant_filter
from megbrain.kernels.tiled_jit import vector_width

RTOL, ATOL = 1e-4, 1e-5
_X = ("i", 0)
#: name -> (JIT expression of one input, its float64 reference)
TAILS = {
    "gelu": (  # ONNX's erf form, as the optimizer leaves it
        (("MUL", (("c", 0.7071067690849304), _X)), ("ERF", (("t", 0),)),
         ("ADD", (("c", 1.0), ("t", 1))), ("MUL", (_X, ("t", 2))),
         ("MUL", (("c", 0.5), ("t", 3)))),
        lambda y: 0.5 * y * (1 + erf(y / math.sqrt(2))),
    ),
    "gelu_tanh": (
        (("MUL", (_X, _X)), ("MUL", (("t", 0), _X)),
         ("FUSE_MUL_ADD3", (("t", 1), ("c", 0.044715), _X)),
         ("MUL", (("t", 2), ("c", math.sqrt(2 / math.pi)))), ("TANH", (("t", 3),)),
         ("ADD", (("t", 4), ("c", 1.0))), ("MUL", (_X, ("t", 5))),
         ("MUL", (("t", 6), ("c", 0.5)))),
        lambda y: 0.5 * y * (1 + np.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y**3))),
    ),
    "clip": (
        (("MAX", (_X, ("c", -1.0))), ("MIN", (("c", 2.0), ("t", 0)))),
        lambda y: np.clip(y, -1, 2),
    ),
    "arith": (
        (("RELU", (_X,)), ("SUB", (("t", 0), ("c", 0.25))), ("TRUE_DIV", (("t", 1), ("c", 3.0))),
         ("NEGATE", (("t", 2),))),
        lambda y: -(np.maximum(y, 0) - 0.25) / 3,
    ),
    "none": ((), lambda y: y),
}  # fmt: skip


def _operands(m, k, n, seed):
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    b = (rng.uniform(-3, 3, (k, n)) / np.sqrt(k)).astype(np.float32)  # sums of order 1-3
    bias = rng.uniform(-1, 1, n).astype(np.float32)
    return a, b, bias


def _check(m, k, n, name, seed):
    a, b, bias = _operands(m, k, n, seed)
    expr, ref = TAILS[name]
    out = np.full((m, n), np.nan, np.float32)
    packed_gemm.bind_packed_matmul(a, b, out, True, bias=bias, epi=1, tail=expr)()
    want = ref(a.astype(np.float64) @ b.astype(np.float64) + bias)
    np.testing.assert_allclose(out, want, rtol=RTOL, atol=ATOL)
    return a, b, bias, out


@pytest.mark.parametrize("name", sorted(TAILS))
def test_each_tail_matches_float64(name):
    _check(37, 40, 50, name, seed=len(name))


@settings(max_examples=10, deadline=None)
@given(m=st.sampled_from([1, 3, 16, 49]), k=st.sampled_from([1, 17, 96]),
       n=st.sampled_from([5, 16, 33, 100]), name=st.sampled_from(sorted(TAILS)),
       seed=st.integers(0, 9))  # fmt: skip
def test_tails_over_shapes(m, k, n, name, seed):
    # each example compiles a tiling's variant at most: few examples
    _check(m, k, n, name, seed)


def test_nan_passes_through_the_erf_and_the_clip():
    a = np.array([[np.nan, 1.0], [1.0, 2.0]], np.float32)  # NaN in the first row's sums
    b = np.eye(2, dtype=np.float32)
    for name in ("gelu", "clip"):
        out = np.zeros((2, 2), np.float32)
        packed_gemm.bind_packed_matmul(a, b, out, True, bias=np.zeros(2, np.float32), epi=1,
                                       tail=TAILS[name][0])()  # fmt: skip
        assert np.isnan(out[0]).all() and np.isfinite(out[1]).all()


@pytest.mark.parametrize("constant", [True, False])
def test_the_binding_takes_the_tiles_or_runs_the_jit_after(constant):
    # a constant weight: the packed tiles; any other: OpenBLAS, then the JIT's kernel in place
    a, b, bias = _operands(3 * 20, 24, 40, 3)
    a3, out = a.reshape(3, 20, 24), np.empty((3, 20, 40), np.float32)
    expr, ref = TAILS["gelu"]
    with constant_filter(constant):
        step = blas.bind_batched_matmul_tail(a3, np.broadcast_to(b, (3, 24, 40)), bias, out,
                                             False, False, expr)  # fmt: skip
    step()
    want = ref(a.astype(np.float64) @ b + bias).reshape(out.shape)
    np.testing.assert_allclose(out, want, rtol=RTOL, atol=ATOL)


def test_a_run_allocates_nothing(monkeypatch):
    monkeypatch.setattr(parallel, "num_threads", lambda: 2)
    monkeypatch.setattr(packed_gemm, "MIN_SPLIT_MACS", 0)
    a, b, bias = _operands(60, 64, 96, 2)
    out = np.empty((1, 60, 96), np.float32)
    with constant_filter(True):
        step = blas.bind_batched_matmul_tail(a[None], b[None], bias, out, False, False,
                                             TAILS["gelu"][0])  # fmt: skip
    step()
    assert_allocates_nothing(step)


def test_a_bias_not_of_the_columns_is_refused():
    a, b, bias = _operands(4, 8, 16, 0)
    with pytest.raises(ValueError, match="bias .* float32 vector of the output's 16 columns"):
        blas.bind_batched_matmul_tail(a[None], b[None], bias[:8], np.empty((1, 4, 16), np.float32),
                                      False, False, ())  # fmt: skip


@pytest.mark.skipif(vector_width() != 16, reason="zmm vectors: AVX-512")
def test_the_tail_is_zmm_code():
    # compiled afresh (a cached kernel keeps no assembly): GELU's erf as 16-lane divisions
    # and multiply-adds, no scalar division
    fr = nt.Array(nt.float32, 1, "C", readonly=True)
    run = gemm_loops._units_py(4, 2, 16, 1, TAILS["gelu"][0])
    asm = "\n".join(njit([nt.void(fr, fr, nt.float32[::1], fr, fr, fr, nt.int64[::1],
                                   nt.int64[::1], nt.int64)], error_model="numpy",
                          fastmath={"contract"})(run).inspect_asm().values())  # fmt: skip
    assert len(re.findall(r"vdivps\s+%zmm", asm)) >= 4 * 2
    assert not re.search(r"vdivss", asm)


def _residual(m, n, seed, row_pad=0):
    """A layer scale of ``n`` values and an (m, n) shortcut whose rows are ``row_pad`` wider
    (a view)."""
    rng = np.random.default_rng(seed + 100)
    scale = rng.uniform(-2, 2, n).astype(np.float32)
    addend = rng.uniform(-1, 1, (m, n + row_pad)).astype(np.float32)[:, :n]
    return scale, addend


@settings(max_examples=10, deadline=None)
@given(m=st.sampled_from([1, 5, 16, 49]), k=st.sampled_from([1, 24, 96]),
       n=st.sampled_from([5, 16, 40, 96]), name=st.sampled_from(["none", "gelu"]),
       pad=st.sampled_from([0, 3]), seed=st.integers(0, 9))  # fmt: skip
def test_the_scaled_residual_in_the_write_out_matches_float64(m, k, n, name, pad, seed):
    # ConvNeXt's layer scale and shortcut: out = tail(a @ b + bias) * scale + addend
    a, b, bias = _operands(m, k, n, seed)
    scale, addend = _residual(m, n, seed, pad)
    expr, ref = TAILS[name]
    out = np.full((m, n), np.nan, np.float32)
    assert packed_gemm.usable_residual(scale, addend, out)
    packed_gemm.bind_packed_matmul(a, b, out, True, bias=bias, epi=1, tail=expr,
                                   residual=(scale, addend))()  # fmt: skip
    want = ref(a.astype(np.float64) @ b.astype(np.float64) + bias) * scale + addend
    np.testing.assert_allclose(out, want, rtol=RTOL, atol=ATOL)
    # one rounding after the tail's: a fused multiply-add
    plain = np.full((m, n), np.nan, np.float32)
    packed_gemm.bind_packed_matmul(a, b, plain, True, bias=bias, epi=1, tail=expr)()
    fused = (plain.astype(np.float64) * scale + addend).astype(np.float32)
    np.testing.assert_array_max_ulp(out, fused, 1)  # float64's sum may round twice


@pytest.mark.parametrize("constant", [True, False])
def test_the_binding_takes_the_residual_in_the_tiles_or_in_the_jit_after(constant):
    a, b, bias = _operands(3 * 20, 24, 40, 4)
    scale, addend = _residual(3 * 20, 40, 4)
    a3, out = a.reshape(3, 20, 24), np.empty((3, 20, 40), np.float32)
    expr, ref = TAILS["gelu"]
    with constant_filter(constant):
        step = blas.bind_batched_matmul_tail(a3, np.broadcast_to(b, (3, 24, 40)), bias, out,
                                             False, False, expr,
                                             (scale, addend.reshape(3, 20, 40)))  # fmt: skip
    step()
    want = (ref(a.astype(np.float64) @ b + bias) * scale + addend).reshape(out.shape)
    np.testing.assert_allclose(out, want, rtol=RTOL, atol=ATOL)


def test_a_residual_run_allocates_nothing(monkeypatch):
    monkeypatch.setattr(parallel, "num_threads", lambda: 2)
    monkeypatch.setattr(packed_gemm, "MIN_SPLIT_MACS", 0)
    a, b, bias = _operands(60, 64, 96, 2)
    scale, addend = _residual(60, 96, 2)
    out = np.empty((1, 60, 96), np.float32)
    with constant_filter(True):
        step = blas.bind_batched_matmul_tail(a[None], b[None], bias, out, False, False, (),
                                             (scale, addend[None]))  # fmt: skip
    step()
    np.testing.assert_allclose(out[0], (a.astype(np.float64) @ b + bias) * scale + addend,
                               rtol=RTOL, atol=ATOL)  # fmt: skip
    assert_allocates_nothing(step)


def test_a_residual_not_of_the_output_is_refused():
    a, b, bias = _operands(4, 8, 16, 0)
    scale, addend = _residual(4, 16, 0)
    out = np.empty((1, 4, 16), np.float32)
    with pytest.raises(ValueError, match=r"scale \(8,\) float32 and addend \(1, 4, 16\)"):
        blas.bind_batched_matmul_tail(a[None], b[None], bias, out, False, False, (),
                                      (scale[:8], addend[None]))  # fmt: skip
    with pytest.raises(ValueError, match=r"must be float32 of shapes \(16,\) and \(1, 4, 16\)"):
        blas.bind_batched_matmul_tail(a[None], b[None], bias, out, False, False, (),
                                      (scale, addend[None, :2]))  # fmt: skip
    # an addend the product would overwrite is not the tiles' (and an output sharing it is
    # never planned: the operator declares no in-place)
    assert not packed_gemm.usable_residual(scale, out[0], out[0])
