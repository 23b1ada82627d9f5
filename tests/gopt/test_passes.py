"""Graph optimizer passes (graph option ``graph_opt_level``): level-1 simplification at
insertion, the level-2 PRESET passes before compile (each rewrites and keeps the results),
level 0, the negative-level check, log_level 2 logs and get_graph_optimizer_replaced_var."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import megbrain as mgb
from megbrain import gopt
from megbrain.api.config import exc_opr_tracker_scope, opr_priority_scope
from megbrain.gopt.passes import PASSES, PRESET, Rewriter

CN = "cpu0"
F32 = np.float32


def _graph(level=2, log_level=0):
    g = mgb.comp_graph(check_env_var=False)
    g.set_option("graph_opt_level", level)
    g.set_option("log_level", log_level)
    return g


def _seq(f):
    return list(f._func.iter_opr_seq())


def _modes(f):
    """Elemwise modes and other operator types of the compiled seq."""
    return [o.param.mode if o.type_name == "Elemwise" else o.type_name for o in _seq(f)]


def _both(build, values, shapes):
    """Results and seqs of ``build(*inputs)`` compiled at level 0 and level 2."""
    out = []
    for level in (0, 2):
        g = _graph(level)
        xs = [mgb.make_arg(CN, g, name=f"x{i}", shape=s) for i, s in enumerate(shapes)]
        f = g.compile(None, mgb.copy_output(build(*xs)))
        out.append((_call(f, {f"x{i}": v for i, v in enumerate(values)}), _modes(f)))
    return out


def _call(f, feed: dict):
    """Call ``f`` with the values of the inputs it needs (optimization may drop some)."""
    names = {v.name for v in f.inputs}
    return f(**{k: v for k, v in feed.items() if k in names})


# ---- level 1: at insertion ---------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning")
def test_x_div_x_is_one_at_level_1_even_for_zero():
    xv = np.array([0.0, 2.0, -3.0], F32)
    res = {}
    for level in (0, 1):
        g = _graph(level)
        x = mgb.make_arg(CN, g, name="x", shape=(3,))
        y = x / x
        f = g.compile(None, mgb.copy_output(y))
        res[level] = (_call(f, {"x": xv}), _modes(f))
    assert np.isnan(res[0][0][0]) and "TRUE_DIV" in res[0][1]
    np.testing.assert_array_equal(res[1][0], np.ones(3, F32))
    assert "TRUE_DIV" not in res[1][1]


@pytest.mark.parametrize(
    "expr",
    [
        lambda x: x * 1,
        lambda x: 1 * x,
        lambda x: x + 0,
        lambda x: 0 + x,
        lambda x: x - 0,
        lambda x: x / 1,
        lambda x: mgb.opr.elemwise(-x, mode="NEGATE"),
    ],
    ids=["x*1", "1*x", "x+0", "0+x", "x-0", "x/1", "--x"],
)
def test_identities_removed_at_level_1(expr):
    g = _graph(1)
    x = mgb.make_arg(CN, g, name="x", shape=(4,))
    assert expr(x).node is x.node
    g0 = _graph(0)
    x0 = mgb.make_arg(CN, g0, name="x", shape=(4,))
    assert expr(x0).node is not x0.node


def test_identity_kept_when_it_broadcasts():
    g = _graph(1)
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    y = x * np.ones((2, 3), F32)
    assert y.node is not x.node and y.imm_shape == (2, 3)


def test_constant_subexpression_folded_at_insertion():
    g = _graph(1)
    a = mgb.make_immutable(CN, g, np.array([1.0, 2.0], F32))
    b = mgb.make_immutable(CN, g, np.array([3.0, 4.0], F32))
    c = (a + b) * 2.0
    assert c.node.owner.type_name == "ImmutableTensor"
    np.testing.assert_array_equal(c.inferred_value, [8.0, 12.0])
    t = a.astype(np.int32)
    assert t.node.owner.type_name == "ImmutableTensor" and t.dtype == np.int32
    g0 = _graph(0)
    a0 = mgb.make_immutable(CN, g0, np.array([1.0, 2.0], F32))
    assert (a0 + a0).node.owner.type_name == "Elemwise"


def test_bad_constant_expression_still_raises_at_insertion():
    g = _graph(1)
    a = mgb.make_immutable(CN, g, np.ones(3, F32))
    b = mgb.make_immutable(CN, g, np.ones(4, F32))
    with pytest.raises(mgb.MegBrainError, match="broadcast"):
        a + b


def test_negative_level_simplifies_too():
    g = _graph(-1)
    x = mgb.make_arg(CN, g, name="x", shape=(4,))
    assert (x * 1).node is x.node


def test_level_1_runs_no_global_pass():
    g = _graph(1)
    x = mgb.make_arg(CN, g, name="x", shape=(4,))
    y = (x + 1.0) + 2.0
    f = g.compile([x], mgb.copy_output(y))
    assert _modes(f).count("ADD") == 2


# ---- level 2: the PRESET -----------------------------------------------------------------
def test_preset_order_reads_top_to_bottom():
    assert PRESET[:5] == [
        "merge_common_subexpr",
        "reorder_arith_chain",
        "fold_constants",
        "remove_redundant_typecvt",
        "arith_fuse",
    ]
    assert set(PRESET) <= set(PASSES)


def test_merge_common_subexpr_merges_commutative_twins():
    def build(a, b):
        return (a * b) + mgb.opr.elem.exp(b * a)

    (r0, m0), (r2, m2) = _both(build, [np.arange(4, dtype=F32), np.full(4, 0.5, F32)], [(4,)] * 2)
    assert m0.count("MUL") == 2 and m2.count("MUL") == 1
    np.testing.assert_allclose(r2, r0, rtol=1e-6)


def test_merge_common_subexpr_pass_directly():
    g = _graph(0)
    a = mgb.make_arg(CN, g, name="a", shape=(3,))
    b = mgb.make_arg(CN, g, name="b", shape=(3,))
    y = mgb.opr.elemwise(a * b, b * a, mode="MAX")
    varmap = PASSES["merge_common_subexpr"](g, [y.node])
    new = varmap[y.node].owner
    assert new.inputs[0] is new.inputs[1]
    assert varmap.reasons  # the merge itself is logged with its reason


def test_merge_keeps_side_effects_apart():
    g = _graph(2)
    x = mgb.make_arg(CN, g, name="x", shape=(2,))
    calls = []
    a = mgb.opr.callback_injector(x, lambda v: calls.append(1))
    b = mgb.opr.callback_injector(x, lambda v: calls.append(2))
    f = g.compile([x], [mgb.copy_output(a + b)])
    f(np.ones(2, F32))
    assert sorted(calls) == [1, 2]


@pytest.mark.parametrize("mode", ["ADD", "MUL"])
def test_reorder_arith_chain_gathers_constants(mode):
    def build(x):
        y = x
        for c in (1.5, 2.0, 3.0):
            y = mgb.opr.elemwise(y, c, mode=mode)
        return y

    xv = np.linspace(-1, 1, 5).astype(F32)
    (r0, m0), (r2, m2) = _both(build, [xv], [(5,)])
    assert m0.count(mode) == 3 and m2.count(mode) == 1
    np.testing.assert_allclose(r2, r0, rtol=1e-6)


def test_reorder_mixed_chain_with_vars_in_between():
    def build(x, y):
        return ((x + 1.0) + y) + 2.0

    vals = [np.arange(3, dtype=F32), np.full(3, 10.0, F32)]
    (r0, m0), (r2, m2) = _both(build, vals, [(3,), (3,)])
    assert m0.count("ADD") == 3 and m2.count("ADD") == 2
    np.testing.assert_allclose(r2, r0)


def test_reorder_keeps_an_intermediate_read_elsewhere():
    def build(x):
        a = x + 1.0
        return (a + 2.0) * a

    xv = np.arange(4, dtype=F32)
    (r0, _), (r2, m2) = _both(build, [xv], [(4,)])
    assert m2.count("ADD") == 2  # x + 1 is needed by the MUL: nothing to gain
    np.testing.assert_allclose(r2, r0)


def test_reorder_broadcasting_constants():
    def build(x):
        return (x * np.full((1, 3), 2.0, F32)) * np.full((2, 1), 3.0, F32)

    xv = np.arange(6, dtype=F32).reshape(2, 3)
    (r0, _), (r2, m2) = _both(build, [xv], [(2, 3)])
    assert m2.count("MUL") == 1
    np.testing.assert_allclose(r2, r0)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["ADD", "MUL", "SUB", "x"]), st.floats(-2, 2, width=32)),
        min_size=1,
        max_size=8,
    )
)
def test_chains_equal_before_and_after(ops):
    """Random chains of constants and an input var: level 2 gives level 0's results."""

    def build(x, y):
        h = x
        for mode, c in ops:
            h = h * y if mode == "x" else mgb.opr.elemwise(h, c, mode=mode)
        return h

    vals = [np.linspace(-1, 1, 4).astype(F32), np.full(4, 0.75, F32)]
    (r0, _), (r2, _) = _both(build, vals, [(4,), (4,)])
    np.testing.assert_allclose(r2, r0, rtol=1e-5, atol=1e-5)


def test_fold_constants():
    def build(x):
        c = mgb.make_immutable(CN, x.owner_graph, np.arange(6, dtype=F32))
        return x + c.reshape(2, 3).sum(axis=1, keepdims=True)

    xv = np.ones((2, 3), F32)
    (r0, m0), (r2, m2) = _both(build, [xv], [(2, 3)])
    assert "Reduce" in m0 and "Reshape" in m0
    assert "Reduce" not in m2 and "Reshape" not in m2
    np.testing.assert_allclose(r2, r0)


def test_fold_constants_pass_directly():
    g = _graph(0)
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    c = mgb.make_immutable(CN, g, np.arange(3, dtype=F32)).reshape(3, 1).reshape(3)
    y = x + c
    varmap = PASSES["fold_constants"](g, [y.node])
    assert varmap[c.node].owner.type_name == "ImmutableTensor"
    np.testing.assert_array_equal(varmap[c.node].owner.value, [0, 1, 2])


def test_remove_redundant_typecvt():
    def build(x):
        return x.astype(np.float32) * 2.0

    xv = np.arange(3, dtype=F32)
    (r0, m0), (r2, m2) = _both(build, [xv], [(3,)])
    assert "TypeCvt" in m0 and "TypeCvt" not in m2
    np.testing.assert_array_equal(r2, r0)


def test_virtual_grad_expanded_and_equal_to_direct_grad():
    xv = np.linspace(-1, 1, 6).astype(F32).reshape(2, 3)
    res = []
    for level, virtual in ((0, False), (2, True)):
        g = _graph(level)
        x = mgb.make_arg(CN, g, name="x", shape=(2, 3))
        w = mgb.make_shared(CN, value=np.full((3,), 0.5, F32), comp_graph=g, name="w")
        loss = (mgb.opr.elem.tanh(x * w + 1.0) * 3.0).sum()
        gw = mgb.grad(loss, w, use_virtual_grad=virtual)
        assert (gw.node.owner.type_name == "VirtualGrad") == virtual
        f = g.compile([x], mgb.copy_output(gw))
        assert "VirtualGrad" not in [o.type_name for o in _seq(f)]
        res.append(f(xv))
    np.testing.assert_allclose(res[1], res[0], rtol=1e-5)


def test_level_0_disables_every_pass():
    g = _graph(0)
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    y = ((x.astype(np.float32) + 1.0) + 2.0) * 1
    f = g.compile([x], mgb.copy_output(y))
    assert _modes(f).count("ADD") == 2 and "TypeCvt" in _modes(f) and "MUL" in _modes(f)
    assert mgb.get_graph_optimizer_replaced_var(y).node is y.node


def test_rewrites_keep_priority_and_tracker():
    g = _graph(2)
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    tracker = object()
    with opr_priority_scope(g, -7), exc_opr_tracker_scope(g, tracker):
        y = (x + 1.0) + 2.0
    f = g.compile(None, mgb.copy_output(y))
    new = mgb.get_graph_optimizer_replaced_var(y).node.owner
    assert new is not y.node.owner and new in _seq(f)
    assert new.priority == -7 and new.tracker is tracker


# ---- the rewrite engine --------------------------------------------------------------------
def test_rewriter_rebuilds_readers_of_replaced_vars():
    g = _graph(0)
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    z = mgb.make_arg(CN, g, name="z", shape=(3,))
    a = mgb.opr.elem.exp(x)
    y = a * 2.0 + 1.0
    rw = Rewriter(g, [y.node])

    def rule(opr):
        return [z.node] if opr.outputs[0] is a.node else None

    varmap = rw.apply(rule, "test")
    new = varmap[y.node]
    assert varmap.reasons == {a.node: "test"}
    assert rw.sole_reader(new.owner.inputs[0])  # answered for the rebuilt var
    f = g.compile([z], mgb.copy_output(mgb.SymbolVar(new)))
    np.testing.assert_allclose(f(np.ones(3, F32)), np.full(3, 3.0))


def test_rewriter_refuses_a_dtype_change():
    g = _graph(0)
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    y = x + 1.0
    rw = Rewriter(g, [y.node])
    with pytest.raises(mgb.GraphError, match="replaced by"):
        rw.apply(lambda o: [x.astype(np.int32).node] if o is y.node.owner else None, "bad")


# ---- negative level ----------------------------------------------------------------------
def test_negative_level_checks_replaced_outputs():
    g = _graph(-2)
    x = mgb.make_arg(CN, g, name="x", shape=(4,))
    y = (x + 1.0) + 2.0
    f = g.compile([x], mgb.copy_output(y))
    types = [o.type_name for o in _seq(f)]
    assert "AssertEqual" in types
    np.testing.assert_allclose(f(np.arange(4, dtype=F32)), np.arange(4) + 3.0)


def test_negative_level_catches_a_wrong_pass(monkeypatch):
    def wrong(graph, dest):  # replaces x + 1 by x + 2
        out = {}
        for o in gopt.passes.dep_oprs(dest):
            if o.type_name == "Elemwise" and o.param.mode == "ADD":
                out[o.outputs[0]] = (mgb.SymbolVar(o.inputs[0]) + 2.0).node
        return out

    monkeypatch.setitem(PASSES, "wrong", wrong)
    monkeypatch.setattr(gopt.passes, "PRESET", PRESET + ["wrong"])
    results = {}
    for level in (2, -2):
        g = _graph(level)
        x = mgb.make_arg(CN, g, name="x", shape=(2,))
        f = g.compile([x], mgb.copy_output(x + 1.0))
        if level > 0:
            results[level] = f(np.zeros(2, F32))
        else:
            with pytest.raises(mgb.MegBrainError, match="AssertEqual"):
                f(np.zeros(2, F32))
    np.testing.assert_array_equal(results[2], [2.0, 2.0])  # wrong, and unchecked at level 2


# ---- logs and replaced vars --------------------------------------------------------------
def test_log_level_2_logs_each_replacement(caplog):
    g = _graph(2, log_level=2)
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    with caplog.at_level(logging.INFO, logger="megbrain"):
        y = (x * 1) + 0
        z = ((x + 1.0) + 2.0).astype(np.float32)
        g.compile([x], [mgb.copy_output(y), mgb.copy_output(z)])
    msgs = [r.getMessage() for r in caplog.records if r.name == "megbrain"]
    assert any("simplified to x" in m for m in msgs)
    assert any("reorder_arith_chain" in m and "arith chain reorder" in m for m in msgs)
    assert any("remove_redundant_typecvt" in m for m in msgs)


def test_log_level_0_is_silent(caplog):
    g = _graph(2, log_level=0)
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    with caplog.at_level(logging.DEBUG, logger="megbrain"):
        g.compile([x], mgb.copy_output(((x + 1.0) + 2.0) * 1))
    assert not [r for r in caplog.records if r.name == "megbrain"]


def test_get_graph_optimizer_replaced_var():
    g = _graph(2)
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    a = x + 1.0
    y = mgb.opr.elem.exp(a + 2.0)
    f = g.compile([x], mgb.copy_output(y))
    seq = _seq(f)
    ry = mgb.get_graph_optimizer_replaced_var(y)
    assert ry.node is not y.node and ry.node.owner in seq
    # an intermediate var replaced by the chain pass: answered too, by a var of the seq
    ra = mgb.get_graph_optimizer_replaced_var(a + 2.0)
    assert ra.node.owner in seq and ra.node.owner.param.mode == "ADD"
    assert mgb.get_graph_optimizer_replaced_var(x).node is x.node
    np.testing.assert_allclose(f(np.zeros(3, F32)), np.exp(np.full(3, 3.0)), rtol=1e-6)


# ---- arith_fuse in the compile preset ------------------------------------------------------
def test_arith_fuse_at_compile_fuses_bias_relu_and_mul_add():
    rng = np.random.default_rng(0)
    shapes = [(4, 3, 5, 5), (1, 3, 1, 1), (4, 3, 5, 5)]
    values = [rng.uniform(-1, 1, s).astype(F32) for s in shapes]

    def build(x, b, z):
        return mgb.opr.elem.relu(x + b) + x * z + b

    (r0, m0), (r2, m2) = _both(build, values, shapes)
    assert "RELU" in m0 and "FUSE_ADD_RELU" not in m0
    assert "FUSE_ADD_RELU" in m2 and "RELU" not in m2 and "FUSE_MUL_ADD3" in m2
    np.testing.assert_allclose(r2, r0, rtol=1e-6, atol=1e-6)


def test_arith_fuse_keeps_a_sum_read_elsewhere():
    shapes = [(6,), (6,)]
    values = [np.linspace(-1, 1, 6, dtype=F32), np.full(6, 0.1, F32)]

    def build(x, b):
        s = x + b
        return mgb.opr.elem.relu(s) * s

    (r0, _), (r2, m2) = _both(build, values, shapes)
    assert "FUSE_ADD_RELU" not in m2 and "RELU" in m2
    np.testing.assert_array_equal(r2, r0)


@pytest.mark.parametrize("level", [0, 2])
def test_training_step_with_fused_bias_relu_matches_unfused(level):
    """conv + bias + ReLU, cross entropy, SGD with momentum: the step at level 2 (ArithFuse,
    ReLU's gradient from the fused output) gives the weights of level 0 (no passes)."""
    from megbrain import nn, optim

    def run(lvl):
        nn.init.default_rng(3)
        model = nn.Sequential(
            nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5)
        )
        g = _graph(lvl)
        x = mgb.make_arg(CN, g, shape=(8, 2, 6, 6), name="x")
        y = mgb.make_arg(CN, g, shape=(8, 5), name="y")
        loss = nn.functional.cross_entropy(model(x), y)
        opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        f = g.compile([x, y], [mgb.copy_output(loss)] + opt.minimize(loss))
        rng = np.random.default_rng(4)
        xv = rng.standard_normal((8, 2, 6, 6)).astype(F32)
        yv = np.eye(5, dtype=F32)[rng.integers(0, 5, 8)]
        losses = [float(f(xv, yv)[0][0]) for _ in range(3)]
        modes = _modes(f)
        return losses, {k: np.array(v) for k, v in model.state_dict().items()}, modes

    l0, w0, _ = run(0)
    lv, wv, modes = run(level)
    if level == 2:
        assert "FUSE_ADD_RELU" in modes and "RELU" not in modes
    np.testing.assert_allclose(lv, l0, rtol=1e-5)
    for k in w0:
        np.testing.assert_allclose(wv[k], w0[k], rtol=1e-4, atol=1e-6, err_msg=k)


def test_sublinear_endpoint_follows_its_replacement():
    from megbrain.api.config import set_opr_sublinear_memory_endpoint
    g = _graph(2)
    x = mgb.make_arg(CN, g, name="x", shape=(4, 3))
    b = mgb.make_shared(CN, value=np.ones((1, 3), F32), comp_graph=g, name="b")
    h = mgb.opr.elem.relu(x + b)
    set_opr_sublinear_memory_endpoint(h)
    out = gopt.optimize_for_compile(g, [(h * 2.0).node])
    fused = out[0].owner.inputs[0].owner
    assert fused.param.mode == "FUSE_ADD_RELU"
    assert fused in g.sublinear_endpoints
