"""The compile-time fusion of a BatchedMatrixMul with the bias and elementwise tail after
it (``fuse_matmul_tail``, BatchedMatrixMulTail: a Linear layer's bias and GELU): what it
computes (float64, and the unfused graph), where it fuses (and where not), graph files never
see it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import erf

import megbrain as mgb
from megbrain.errors import SerializationError
from megbrain.opr.basic_arith import elemwise

CN = "cpu0"
F32 = np.float32


def _gelu(v):
    return v * (elemwise(v * (1 / math.sqrt(2)), mode="ERF") + 1.0) * 0.5


def _net(lead, k, n, tail, seed=0, bias_first=True, read_product=False):
    """x (lead..., k) -> (1, rows, k) @ w -> (lead..., n) + bias -> tail, as ONNX's MatMul of
    an N-d input by a weight: the graph, outputs, a feed and the float64 result."""
    rng = np.random.default_rng(seed)
    g = mgb.comp_graph(check_env_var=False)
    g.set_option("log_level", 0)
    g.set_option("graph_opt.weight_preprocess", 1)
    x = mgb.make_arg(CN, g, name="x", shape=(*lead, k))
    wv = (rng.uniform(-2, 2, (k, n)) / math.sqrt(k)).astype(F32)
    bv = rng.uniform(-1, 1, n).astype(F32)
    w = mgb.make_shared(CN, value=wv[None], comp_graph=g, name="w")
    b = mgb.make_shared(CN, value=bv, comp_graph=g, name="b")
    rows = math.prod(lead)
    prod = mgb.opr.batched_matrix_mul(x.reshape((1, rows, k)), w).reshape((*lead, n))
    y = b + prod if bias_first else prod + b
    outs = [tail(y) if tail else y]
    if read_product:
        outs.append(prod * 2.0)
    xv = rng.uniform(-1, 1, (*lead, k)).astype(F32)
    pre = xv.astype(np.float64) @ wv + bv
    return g, outs, xv, pre


def _compiled(g, outs, jit):
    g.set_option("graph_opt.jit", jit)
    f = g.compile(None, [mgb.copy_output(v) for v in outs])
    return f, list(f._func.iter_opr_seq())


@settings(max_examples=10, deadline=None)
@given(lead=st.sampled_from([(1, 3, 3), (2, 7), (1, 5, 4)]), k=st.sampled_from([1, 16, 40]),
       n=st.sampled_from([8, 33, 96]), gelu=st.booleans(), bias_first=st.booleans())  # fmt: skip
def test_fused_matches_float64_and_the_unfused_graph(lead, k, n, gelu, bias_first):
    g, outs, xv, pre = _net(lead, k, n, _gelu if gelu else None, bias_first=bias_first)
    f0, seq0 = _compiled(g, outs, 0)
    unfused = f0(x=xv)[0]
    f1, seq1 = _compiled(g, outs, 1)
    fused = f1(x=xv)[0]
    assert not any(o.type_name == "BatchedMatrixMulTail" for o in seq0)
    (opr,) = [o for o in seq1 if o.type_name == "BatchedMatrixMulTail"]
    assert bool(opr.param.tail) == gelu
    assert not any(o.type_name in ("JITExecutor", "Elemwise", "BatchedMatrixMul") for o in seq1)
    want = 0.5 * pre * (1 + erf(pre / math.sqrt(2))) if gelu else pre
    np.testing.assert_allclose(fused, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fused, unfused, rtol=1e-5, atol=1e-6)


def test_a_product_read_elsewhere_or_a_tail_it_cannot_compute_is_not_fused():
    g, outs, xv, pre = _net((2, 6), 8, 16, _gelu, read_product=True)
    _, seq = _compiled(g, outs, 1)
    assert not any(o.type_name == "BatchedMatrixMulTail" for o in seq)
    g, outs, xv, pre = _net((2, 6), 8, 16, lambda v: elemwise(v, mode="EXP"))
    f, seq = _compiled(g, outs, 1)
    assert not any(o.type_name == "BatchedMatrixMulTail" for o in seq)
    np.testing.assert_allclose(f(x=xv)[0], np.exp(pre), rtol=1e-4, atol=1e-5)


def test_graph_files_never_hold_it(tmp_path):
    g, outs, xv, pre = _net((2, 6), 8, 16, _gelu)
    path = str(tmp_path / "g.mgb")
    mgb.serialize_comp_graph_to_file(path, outs)
    _, _, loaded = mgb.load_comp_graph_from_file(path)
    types = {o.type for o in mgb.cgtools.get_oprs_seq(loaded)}
    assert "BatchedMatrixMulTail" not in types and "BatchedMatrixMul" in types
    _, seq = _compiled(g, outs, 1)
    fused = next(o for o in seq if o.type_name == "BatchedMatrixMulTail")
    with pytest.raises(SerializationError, match=r"BatchedMatrixMulTail.*before compile-time"):
        mgb.serialize_comp_graph_to_file(str(tmp_path / "f.mgb"),
                                         [mgb.SymbolVar(fused.outputs[0])])  # fmt: skip


def test_bad_operands_are_refused():
    from megbrain.graph import OperatorNodeConfig
    from megbrain.opr.blas import BatchedMatrixMulTail, BatchedMatrixMulTailParam

    g = mgb.comp_graph(check_env_var=False)
    a = mgb.make_arg(CN, g, name="a", shape=(1, 4, 8))
    w = mgb.make_shared(CN, value=np.ones((1, 8, 16), F32), comp_graph=g)
    b = mgb.make_shared(CN, value=np.ones(8, F32), comp_graph=g)
    with pytest.raises(mgb.MegBrainError, match=r"bias \{8\} must be \(16,\)"):
        g.insert_opr(BatchedMatrixMulTail([a.node, w.node, b.node], BatchedMatrixMulTailParam(),
                                          OperatorNodeConfig(comp_node=CN)))  # fmt: skip
