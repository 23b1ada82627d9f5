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
    g2, outs2, _, _ = _block_end(3, 3, 8, 16, "view")  # with the layer scale and shortcut
    for graph, ys, inputs in ((g, outs, 3), (g2, outs2, 5)):
        _, seq = _compiled(graph, ys, 1)
        fused = next(o for o in seq if o.type_name == "BatchedMatrixMulTail")
        assert len(fused.inputs) == inputs
        with pytest.raises(SerializationError,
                           match=r"BatchedMatrixMulTail.*before compile-time"):  # fmt: skip
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
    # the residual form's scale and addend
    b = mgb.make_shared(CN, value=np.ones(16, F32), comp_graph=g)
    ok = mgb.make_arg(CN, g, name="r", shape=(1, 4, 16))
    bad = mgb.make_arg(CN, g, name="q", shape=(1, 4, 8))
    cfg, param = OperatorNodeConfig(comp_node=CN), BatchedMatrixMulTailParam()
    with pytest.raises(mgb.MegBrainError, match=r"scale \{1,4,8\} must be \(16,\)"):
        g.insert_opr(BatchedMatrixMulTail([a.node, w.node, b.node, bad.node, ok.node], param,
                                          cfg))  # fmt: skip
    with pytest.raises(mgb.MegBrainError, match=r"addend \{1,4,8\} must have the product's"):
        g.insert_opr(BatchedMatrixMulTail([a.node, w.node, b.node, b.node, bad.node], param,
                                          cfg))  # fmt: skip
    with pytest.raises(mgb.MegBrainError, match=r"then scale and addend"):
        g.insert_opr(BatchedMatrixMulTail([a.node, w.node, b.node, b.node], param, cfg))



def _block_end(h, w, k, c, shortcut, blocks=1, seed=0):
    """The end of ``blocks`` ConvNeXt blocks: ``ls * T(x @ w + b) + s`` with ``x`` an input
    (1, h, w, k), ``T`` the Transpose to NCHW and the shortcut ``s`` the block's input: the
    NCHW view of a channels-last input (``shortcut="view"``) or an NCHW88 input's
    RelayoutFormat to NCHW (``"nchw88"``); each next block's ``x`` is the channels-last view
    of the last one's output and its shortcut that output. Returns the graph, outputs, feed
    and the float64 result."""
    from megbrain.opr.relayout import relayout_format

    rng = np.random.default_rng(seed)
    g = mgb.comp_graph(check_env_var=False)
    g.set_option("log_level", 0)
    g.set_option("graph_opt.weight_preprocess", 1)
    feed = {"x": rng.uniform(-1, 1, (1, h, w, k)).astype(F32)}
    x = mgb.make_arg(CN, g, name="x", shape=(1, h, w, k))
    if shortcut == "view":
        feed["s"] = rng.uniform(-1, 1, (1, h, w, c)).astype(F32)
        s = mgb.make_arg(CN, g, name="s", shape=(1, h, w, c)).dimshuffle(0, 3, 1, 2)
        want = feed["s"].transpose(0, 3, 1, 2).astype(np.float64)
    else:
        feed["s"] = rng.uniform(-1, 1, (1, c // 8, h, w, 8)).astype(F32)
        s = relayout_format(mgb.make_arg(CN, g, name="s", shape=(1, c // 8, h, w, 8)),
                            mode="NCHW88_NCHW")  # fmt: skip
        want = feed["s"].transpose(0, 1, 4, 2, 3).reshape(1, c, h, w).astype(np.float64)
    xv = feed["x"].astype(np.float64)
    for i in range(blocks):
        if i:
            x, k, xv = s.dimshuffle(0, 2, 3, 1), c, want.transpose(0, 2, 3, 1)
        wv = (rng.uniform(-2, 2, (k, c)) / math.sqrt(k)).astype(F32)
        bv, lv = rng.uniform(-1, 1, c).astype(F32), rng.uniform(0.5, 2, (c, 1, 1)).astype(F32)
        wt = mgb.make_shared(CN, value=wv[None], comp_graph=g, name=f"w{i}")
        b = mgb.make_shared(CN, value=bv, comp_graph=g, name=f"b{i}")
        ls = mgb.make_shared(CN, value=lv, comp_graph=g, name=f"ls{i}")
        y = (mgb.opr.batched_matrix_mul(x.reshape((1, h * w, k)), wt).reshape((1, h, w, c))
             + b)  # fmt: skip
        s = ls * y.dimshuffle(0, 3, 1, 2) + s
        pre = xv.reshape(h * w, k) @ wv + bv
        want = lv * pre.reshape(1, h, w, c).transpose(0, 3, 1, 2) + want
    return g, [s], feed, want


@settings(max_examples=8, deadline=None)
@given(hw=st.sampled_from([(2, 3), (4, 4), (7, 1)]), k=st.sampled_from([8, 24]),
       c=st.sampled_from([8, 40]), shortcut=st.sampled_from(["view", "nchw88"]),
       blocks=st.sampled_from([1, 2]))  # fmt: skip
def test_the_layer_scale_and_shortcut_fuse_into_the_last_product(hw, k, c, shortcut, blocks):
    g, outs, feed, want = _block_end(*hw, k, c, shortcut, blocks)
    f0, seq0 = _compiled(g, outs, 0)
    unfused = f0(**feed)[0]
    f1, seq1 = _compiled(g, outs, 1)
    fused = f1(**feed)[0]
    assert any(o.type_name == "Elemwise" for o in seq0)
    oprs = [o for o in seq1 if o.type_name == "BatchedMatrixMulTail"]
    assert len(oprs) == blocks and all(len(o.inputs) == 5 for o in oprs)
    assert not any(o.type_name in ("Elemwise", "JITExecutor", "RelayoutFormat") for o in seq1)
    np.testing.assert_allclose(fused, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fused, unfused, rtol=1e-5, atol=1e-6)


def test_a_shortcut_in_plain_nchw_or_a_product_read_elsewhere_is_not_fused():
    rng = np.random.default_rng(1)
    g = mgb.comp_graph(check_env_var=False)
    g.set_option("log_level", 0)
    g.set_option("graph_opt.weight_preprocess", 1)
    xv, sv = (rng.uniform(-1, 1, s).astype(F32) for s in ((1, 3, 3, 8), (1, 16, 3, 3)))
    x = mgb.make_arg(CN, g, name="x", shape=xv.shape)
    s = mgb.make_arg(CN, g, name="s", shape=sv.shape)  # a contiguous NCHW shortcut
    wv = rng.uniform(-1, 1, (1, 8, 16)).astype(F32)
    w = mgb.make_shared(CN, value=wv, comp_graph=g)
    b = mgb.make_shared(CN, value=np.ones(16, F32), comp_graph=g)
    ls = mgb.make_shared(CN, value=np.full((16, 1, 1), 0.5, F32), comp_graph=g)
    y = (mgb.opr.batched_matrix_mul(x.reshape((1, 9, 8)), w).reshape((1, 3, 3, 16)) + b)
    t = y.dimshuffle(0, 3, 1, 2)
    pre = (xv.reshape(9, 8).astype(np.float64) @ wv[0] + 1).reshape(1, 3, 3, 16)
    want = 0.5 * pre.transpose(0, 3, 1, 2) + sv
    for outs in ([ls * t + s], [ls * t + s.dimshuffle(0, 2, 3, 1).dimshuffle(0, 3, 1, 2), t * 2]):
        f, seq = _compiled(g, outs, 1)
        assert not any(len(o.inputs) == 5 for o in seq if o.type_name == "BatchedMatrixMulTail")
        np.testing.assert_allclose(f(x=xv, s=sv)[0], want, rtol=1e-4, atol=1e-5)
