"""Sublinear memory (graph option ``enable_sublinear_memory_opt``,
``set_opr_sublinear_memory_endpoint``): recomputation for late readers, identical results,
a smaller static plan, and what is never duplicated."""

from __future__ import annotations

import logging
from contextlib import nullcontext

import numpy as np
import pytest

import megbrain as mgb
from megbrain.api.config import opr_priority_scope, set_opr_sublinear_memory_endpoint
from megbrain.gopt import sublinear
from megbrain.graph.operator import OperatorNodeBase
from megbrain.opr.blas import MatrixMul

CN = "cpu0"


def _ensure_matmul_grad():
    """Until MatrixMul declares its gradient, give the training-step tests one."""
    if MatrixMul.grad is not OperatorNodeBase.grad:
        return

    def grad(self, i, out_grads):
        a, b = self.inputs
        if i == 0:
            return mgb.opr.matrix_mul(out_grads[0], b, transposeB=True).node
        return mgb.opr.matrix_mul(a, out_grads[0], transposeA=True).node

    MatrixMul.grad = grad


def mlp_step(sub=False, every=0, early=False, layers=4, batch=16, width=32, opts=None):
    """A training step; ``every``: mark every ``every``-th layer output as an endpoint;
    ``early``: updates as soon as their gradient exists (priority scopes)."""
    _ensure_matmul_grad()
    g = mgb.comp_graph()
    g.set_option("enable_sublinear_memory_opt", int(sub))
    for k, v in (opts or {}).items():
        g.set_option(k, v)
    rng = np.random.RandomState(3)
    x = mgb.make_arg(CN, g, name="x", shape=(batch, width))
    y = mgb.make_arg(CN, g, name="y", shape=(batch, width))
    params, h, acts = [], x, []
    for i in range(layers):
        w = mgb.make_shared(
            CN, value=(rng.randn(width, width) / 5).astype(np.float32), comp_graph=g, name=f"w{i}"
        )
        b = mgb.make_shared(
            CN, value=rng.randn(1, width).astype(np.float32) / 10, comp_graph=g, name=f"b{i}"
        )
        params += [w, b]
        h = mgb.opr.matrix_mul(h, w)
        if i < layers - 1:
            # the bias after the activation: relu(matmul + b) would become one FUSE_ADD_RELU
            # (arith_fuse), whose gradient reads its output and leaves nothing to recompute
            h = mgb.opr.elem.relu(h)
            acts.append(h)
            if every and (i + 1) % every == 0:
                set_opr_sublinear_memory_endpoint(h)
        h = h + b
    d = h - y
    loss = mgb.opr.reduce_(d * d, "SUM") / (batch * width)
    with opr_priority_scope(g, -1) if early else nullcontext():
        grads = mgb.grad(loss, params, use_virtual_grad=not early)
    with opr_priority_scope(g, -2) if early else nullcontext():
        ups = [mgb.opr.add_update(p, gr, beta=-0.05) for p, gr in zip(params, grads)]
    f = g.compile(None, [mgb.copy_output(loss)] + ups)
    feed = {
        "x": rng.randn(batch, width).astype(np.float32),
        "y": rng.randn(batch, width).astype(np.float32),
    }
    return g, f, feed, params, acts


def _run(f, feed, params, steps=2):
    out = []
    for _ in range(steps):
        out.append(f(**feed)[0])
    return out + [p.get_value().copy() for p in params]


def _arena(f) -> int:
    return sum(f.update_static_alloc_plan_and_get_size().values())


def _count(f, type_name, mode=None):
    return sum(
        1
        for o in f._func.seq
        if o.type_name == type_name and (mode is None or o.param.mode == mode)
    )


# ---- results and memory ------------------------------------------------------------------
@pytest.mark.parametrize("every", [0, 1, 2])
@pytest.mark.parametrize("early", [False, True])
def test_results_identical_to_option_off(every, early):
    _, f0, feed, p0, _ = mlp_step(False, every, early)
    ref = _run(f0, feed, p0)
    _, f1, feed, p1, _ = mlp_step(True, every, early)
    got = _run(f1, feed, p1)
    for a, b in zip(got, ref):
        np.testing.assert_array_equal(a, b)
    assert _arena(f1) <= _arena(f0)


def test_cheap_recompute_duplicates_activations_only():
    _, f0, *_ = mlp_step(False)
    _, f1, *_, acts = mlp_step(True)
    # every hidden ReLU is recomputed for its weight-gradient reader; no matmul is
    assert _count(f1, "Elemwise", "RELU") == _count(f0, "Elemwise", "RELU") + len(acts)
    assert _count(f1, "MatrixMul") == _count(f0, "MatrixMul")


def test_cheap_recompute_shrinks_arena_when_activations_make_the_peak():
    _, f0, *_ = mlp_step(False, early=True, layers=6, batch=64, width=32)
    _, f1, *_ = mlp_step(True, early=True, layers=6, batch=64, width=32)
    assert _arena(f1) < 0.9 * _arena(f0)


def test_endpoints_recompute_segments_and_shrink_arena():
    _, f0, *_ = mlp_step(False, layers=6)
    _, f1, *_ = mlp_step(True, every=3, layers=6)
    assert _count(f1, "MatrixMul") > _count(f0, "MatrixMul")  # segments are recomputed
    assert _arena(f1) < 0.9 * _arena(f0)


def test_endpoints_are_never_duplicated():
    g, f, feed, params, acts = mlp_step(True, every=1)
    marked = {a.node.owner for a in acts}
    seq = f._func.seq
    assert marked <= set(seq)
    assert _count(f, "Elemwise", "RELU") == len(acts)  # only the marked ones
    assert _count(f, "Elemwise", "ADD") > 4  # while the rest of each layer is recomputed


def test_clones_run_right_before_their_first_reader():
    _, f, *_ = mlp_step(True)
    seq = f._func.seq
    pos = {o: i for i, o in enumerate(seq)}
    loss_pos = max(
        i
        for i, o in enumerate(seq)
        if o.type_name == "Reduce" and o.outputs[0].name.startswith("SUM(MUL(SUB")
    )
    relus = [o for o in seq if o.type_name == "Elemwise" and o.param.mode == "RELU"]
    clones = [o for o in relus if pos[o] > loss_pos]
    assert clones
    for c in clones:
        readers = [o for o in seq if c.outputs[0] in o.inputs]
        assert readers and min(pos[r] for r in readers) == pos[c] + 1


# ---- when the pass acts --------------------------------------------------------------------
def test_option_off_leaves_graph_alone():
    g, f, *_ = mlp_step(False)
    assert sublinear.sublinear_memory(g, [v for v, _ in f._func.outspec]) == {}


def test_inactive_below_graph_opt_level_2():
    _, f0, *_ = mlp_step(False, opts={"graph_opt_level": 1})
    _, f1, *_ = mlp_step(True, opts={"graph_opt_level": 1})
    assert len(f1._func.seq) == len(f0._func.seq)


def test_short_lifetimes_are_not_recomputed():
    g = mgb.comp_graph()
    g.set_option("enable_sublinear_memory_opt", 1)
    x = mgb.make_arg(CN, g, name="x", shape=(8,))
    a = mgb.opr.elem.exp(x)
    b = (a + 1) * (a - 1)  # every reader of a is near
    f = g.compile(None, mgb.copy_output(b))
    assert _count(f, "Elemwise", "EXP") == 1
    xv = np.linspace(-1, 1, 8, dtype=np.float32)
    np.testing.assert_allclose(f(x=xv), (np.exp(xv) + 1) * (np.exp(xv) - 1), rtol=1e-6)


def _far_reader_graph(late_gap_ops=12, computed_source=False):
    """``a = exp(x)`` read at once and again after a long chain: a late reader. With
    ``computed_source``, ``a``'s input is ``x`` rotated by a Concat (not cheap enough to
    recompute), whose memory can die; the graph input never does: it is the host tensor's
    memory."""
    g = mgb.comp_graph()
    g.set_option("enable_sublinear_memory_opt", 1)
    x = mgb.make_arg(CN, g, name="x", shape=(8,))
    a = mgb.opr.elem.exp(mgb.opr.concat([x[4:], x[:4]], axis=0) if computed_source else x)
    c = a * 2.0
    for _ in range(late_gap_ops):  # unary steps: nothing folds the chain
        c = mgb.opr.elem.sin(c)
    return g, x, a, c


def test_far_reader_gets_a_recomputed_copy():
    g, x, a, c = _far_reader_graph()
    out = c * a + x  # x stays live: a can be recomputed from it
    f = g.compile(None, mgb.copy_output(out))
    assert _count(f, "Elemwise", "EXP") == 2
    xv = np.linspace(-1, 1, 8, dtype=np.float32)
    e = np.exp(xv)
    ref = e * 2.0
    for _ in range(12):
        ref = np.sin(ref)
    np.testing.assert_allclose(f(x=xv), ref * e + xv, rtol=1e-6)


def test_not_recomputed_when_inputs_are_dead():
    g, x, a, c = _far_reader_graph(computed_source=True)
    f = g.compile(None, mgb.copy_output(c * a))  # the rotation is dead at the late reader
    assert _count(f, "Elemwise", "EXP") == 1


def test_recomputed_from_the_graph_input():
    """The graph input lives through the run (its memory is the host tensor's), so a late
    reader of exp(x) gets a recomputed copy even where nothing else reads x late."""
    g, x, a, c = _far_reader_graph()
    f = g.compile(None, mgb.copy_output(c * a))
    assert _count(f, "Elemwise", "EXP") == 2
    xv = np.linspace(-1, 1, 8, dtype=np.float32)
    ref = np.exp(xv) * 2.0
    for _ in range(12):
        ref = np.sin(ref)
    np.testing.assert_allclose(f(x=xv), ref * np.exp(xv), rtol=1e-6)


def test_value_overwritten_by_add_update_is_not_recomputed():
    g = mgb.comp_graph()
    g.set_option("enable_sublinear_memory_opt", 1)
    w = mgb.make_shared(CN, value=np.ones(8, np.float32), comp_graph=g, name="w")
    a = mgb.opr.elem.exp(w * 0.5)  # read now and (late) after w was updated
    c = a * 2.0
    for _ in range(12):
        c = mgb.opr.elem.sin(c)
    with opr_priority_scope(g, 5):
        late = c * a
    up = mgb.opr.add_update(w, np.full(8, 1.0, np.float32))
    f = g.compile(None, [mgb.copy_output(late), up])
    seq = f._func.seq
    pos = {o: i for i, o in enumerate(seq)}
    upd = [o for o in seq if o.type_name == "AddUpdate"][0]
    assert pos[upd] < pos[late.node.owner]  # the update really runs before the late reader
    e = np.exp(0.5) * np.ones(8, np.float32)
    ref = e * 2.0
    for _ in range(12):
        ref = np.sin(ref)
    np.testing.assert_allclose(f()[0], ref * e, rtol=1e-6)
    for o in seq:  # any copy of exp reads w before it is updated
        if o.type_name == "Elemwise" and o.param.mode == "EXP":
            assert pos[o] < pos[upd]


def test_never_duplicated_kinds():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(4,))
    w = mgb.make_shared(CN, value=np.ones(4, np.float32), comp_graph=g)
    up = mgb.opr.add_update(w, x)
    mm = mgb.opr.matrix_mul(mgb.opr.reshape(x, (2, 2)), mgb.opr.reshape(x, (2, 2)))
    clonable = sublinear._clonable
    assert not clonable(x.node.owner)  # a source
    assert not clonable(up.node.owner)  # a side effect
    assert clonable((x + 1).node.owner) and clonable(mm.node.owner)
    plan = sublinear._Planner([x.node.owner, (x + 1).node.owner, mm.node.owner], set())
    assert plan.may_clone((x + 1).node.owner) and not plan.may_clone(mm.node.owner)
    seg = sublinear._Planner([x.node.owner, mm.node.owner], {x.node.owner})
    assert seg.may_clone(mm.node.owner)  # with endpoints, matmuls are recomputed too


def test_extra_vardeps_follow_recreated_vars():
    g, x, a, c = _far_reader_graph()
    out = c * a + x
    side = []
    dep = mgb.opr.callback_injector(x * 7.0, lambda v: side.append(v.get_value().copy()))
    mgb.config.add_extra_vardep(out, dep)
    f = g.compile(None, mgb.copy_output(out))
    f(x=np.ones(8, np.float32))
    assert len(side) == 1 and np.allclose(side[0], 7.0)


def test_log_levels(caplog):
    with caplog.at_level(logging.INFO, logger="megbrain"):
        mlp_step(True, opts={"log_level": 2})
    msgs = [r.getMessage() for r in caplog.records if "sublinear" in r.getMessage()]
    assert any("recomputed" in m for m in msgs)
    assert any("duplicated Elemwise" in m for m in msgs)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="megbrain"):
        mlp_step(True, opts={"log_level": 0})
    assert not [r for r in caplog.records if "sublinear" in r.getMessage()]


def test_inactive_at_negative_graph_opt_level():
    g, f, *_ = mlp_step(False)
    dest = [v for v, _ in f._func.outspec]
    g.set_option("enable_sublinear_memory_opt", 1)
    g.set_option("graph_opt_level", -2)
    assert sublinear.sublinear_memory(g, dest) == {}
    g.set_option("graph_opt_level", 2)
    varmap = sublinear.sublinear_memory(g, dest)
    assert varmap
    # applied once, the rewritten graph has no late readers left: a second pass is a no-op
    new = [varmap.get(v, v) for v in dest]
    assert sublinear.sublinear_memory(g, new) == {}


def test_sublinear_runs_after_virtual_grad_expansion():
    """Gradients are built before recomputation clones exist: a float16 round trip read by
    two paths is summed once, exactly as without sublinear memory (found by the fuzzer)."""
    feed = {
        "v0": np.array([[-1.2608193, 0.7824957, -1.3799989, 0.7664790, 1.8345354]], np.float32),
        "v1": np.array([0.07118568], np.float32),
        "v6": np.array([[[-1.2607422, 0.7827148, -1.3798828, 0.7666016, 1.8349609]]], np.float32),
    }
    v7v = np.array([[[0.0062082, 0.5405602, 0.9117743]]], np.float32)
    rng = np.random.default_rng(0)
    ws = [rng.standard_normal(s).astype(np.float32) for s in [(1,), (1, 5), (1, 4), (1, 5, 3)]]

    def run(**opts):
        g = mgb.comp_graph()
        for k, v in opts.items():
            g.set_option(k, v)
        v0 = mgb.make_arg("cpu0", g, shape=(1, 5), dtype=np.float32, name="v0")
        v1 = mgb.make_arg("cpu0", g, shape=(1,), dtype=np.float32, name="v1")
        v3 = mgb.opr.typecvt(mgb.opr.typecvt(v0, np.float16), np.float32)
        v4 = mgb.opr.elemwise(v3, mode="EXP")
        v5 = mgb.opr.top_k(v3, -4, "VALUE_IDX_SORTED")[0]
        v6 = mgb.make_arg("cpu0", g, shape=(1, 1, 5), dtype=np.float32, name="v6")
        v7 = mgb.make_shared("cpu0", value=v7v, comp_graph=g, name="v7")
        v8 = mgb.opr.batched_matrix_mul(v6, v7, transposeA=True)
        outs = [v1[0], v4, v5, v8]
        loss = sum(mgb.opr.reduce_(o * w, "SUM") for o, w in zip(outs, ws))
        grads = mgb.grad(loss, [v0])  # VirtualGrad at graph_opt_level 2
        f = g.compile(None, [mgb.copy_output(v) for v in outs + grads])
        return f(**feed)

    for a, b in zip(run(enable_sublinear_memory_opt=1), run()):
        np.testing.assert_array_equal(a, b)
