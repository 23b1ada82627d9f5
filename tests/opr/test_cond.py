"""Conditional execution: cond_exec_pred / pred_logical / mark / mark_if_need / merge.

Every branch carries a callback operator counting its runs, so the tests prove that a branch
not taken does not execute."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import megbrain as mgb
from megbrain.errors import GraphError, MegBrainError
from megbrain.opr import cond

CN = "cpu0"
X = np.array([1.0, -2.0, 3.0], np.float32)
KEYS = (0.0, 1.0)


def _branch_flags(mode: str, p: float) -> list[bool]:
    """The reference's activation rule for keys KEYS."""
    if mode == "PIECEWISE":
        k0, k1 = KEYS
        return [p < k0, k0 <= p < k1, p >= k1]
    flags = [abs(p - k) < 1e-4 for k in KEYS]
    if mode == "CASE_FALLBACK":
        flags.append(not any(flags))
    return flags


def _build(pred_mode, merge_mode, opt_level=2, grad=True):
    g = mgb.comp_graph()
    g.set_option("graph_opt_level", opt_level)
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    p = mgb.make_arg(CN, g, name="p", shape=(1,))
    ppvs = cond.cond_exec_pred(p, *KEYS, mode=pred_mode)
    counts = [0] * len(ppvs)
    outs = []
    for i, ppv in enumerate(ppvs):
        (a,) = mgb.opr.cond_exec_mark(ppv, x)

        def cb(_v, i=i):
            counts[i] += 1

        outs.append(mgb.opr.callback_injector(a * a * (i + 1), cb))
    (y,) = mgb.opr.cond_exec_merge(outs, mode=merge_mode)
    spec = [mgb.copy_output(y)]
    if grad:
        spec.append(mgb.copy_output(mgb.grad((y * y).sum(), x)))
    return g.compile([x, p], spec), counts


@pytest.mark.parametrize("merge_mode", ["EXACT_ONE", "EXACT_ONE_SAME_SHAPE", "SUM"])
@pytest.mark.parametrize("pred_mode", ["CASE", "CASE_FALLBACK", "PIECEWISE"])
@pytest.mark.parametrize("opt_level", [0, 2])
def test_untaken_branches_do_not_run_and_gradients_flow(pred_mode, merge_mode, opt_level):
    f, counts = _build(pred_mode, merge_mode, opt_level)
    expect_counts = [0] * len(counts)
    for p in (-1.0, 0.0, 0.5, 1.0, 3.0):
        flags = _branch_flags(pred_mode, p)
        if merge_mode != "SUM" and sum(flags) != 1:
            with pytest.raises(MegBrainError, match="active in mode EXACT_ONE"):
                f(X, np.array([p], np.float32))
            continue
        y, gx = f(X, np.array([p], np.float32))
        coef = sum(i + 1 for i, fl in enumerate(flags) if fl)
        np.testing.assert_allclose(y, coef * X * X, rtol=1e-6)
        # d/dx sum((c x^2)^2) = 4 c^2 x^3
        np.testing.assert_allclose(gx, 4 * coef * coef * X**3, rtol=1e-5)
        expect_counts = [c + int(fl) for c, fl in zip(expect_counts, flags)]
        assert counts == expect_counts


def test_sum_cond_out_runs_only_when_a_branch_is_active():
    f, counts = _build("CASE", "SUM_COND_OUT", grad=False)
    (y,) = f(X, np.array([1.0], np.float32))
    np.testing.assert_allclose(y, 2 * X * X)
    assert counts == [0, 1]
    # no branch: the merge itself is masked off, so its output is never produced
    f2, counts2 = _build("CASE", "SUM_COND_OUT", grad=False)
    with pytest.raises(MegBrainError, match="not available"):
        f2(X, np.array([7.0], np.float32))
    assert counts2 == [0, 0]
    assert counts == [0, 1]


def test_exact_one_with_two_active_branches_raises():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    p = mgb.make_arg(CN, g, name="p", shape=(1,))
    ppvs = cond.cond_exec_pred(p, 1.0, 1.0)  # both keys match
    outs = [mgb.opr.cond_exec_mark(v, x)[0] * (i + 1) for i, v in enumerate(ppvs)]
    (y,) = mgb.opr.cond_exec_merge(outs, mode="EXACT_ONE")
    f = g.compile([x, p], [mgb.copy_output(y)])
    with pytest.raises(GraphError, match=r"branches \[0, 1\] are active"):
        f(X, np.array([1.0], np.float32))


def test_exact_one_branches_of_different_shapes_give_the_active_shape():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    p = mgb.make_arg(CN, g, name="p", shape=(1,), dtype=np.int32)
    a, b = cond.cond_exec_pred(p, 0, 1)
    (xa,) = mgb.opr.cond_exec_mark(a, x)
    (xb,) = mgb.opr.cond_exec_mark(b, x)
    ya = xa * 2
    yb = mgb.opr.concat([xb, xb], axis=0)
    (y,) = mgb.opr.cond_exec_merge([ya, yb], mode="EXACT_ONE")
    gx = mgb.grad(y.sum(), x)
    f = g.compile([x, p], [mgb.copy_output(y), mgb.copy_output(gx)])
    y0, g0 = f(X, np.array([0], np.int32))
    np.testing.assert_allclose(y0, 2 * X)
    np.testing.assert_allclose(g0, [2, 2, 2])
    y1, g1 = f(X, np.array([1], np.int32))
    np.testing.assert_allclose(y1, np.concatenate([X, X]))
    np.testing.assert_allclose(g1, [2, 2, 2])
    with pytest.raises(GraphError, match="needs branches of one shape"):
        mgb.opr.cond_exec_merge([ya, yb], mode="EXACT_ONE_SAME_SHAPE")


@pytest.mark.parametrize(
    "mode,fn",
    [
        ("OR", lambda a, b: a or b),
        ("AND", lambda a, b: a and b),
        ("XOR", lambda a, b: a != b),
        ("NOR", lambda a, b: not (a or b)),
        ("NAND", lambda a, b: not (a and b)),
        ("XNOR", lambda a, b: a == b),
    ],
)
def test_pred_logical_modes(mode, fn):
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    p = mgb.make_arg(CN, g, name="p", shape=(1,), dtype=np.int32)
    q = mgb.make_arg(CN, g, name="q", shape=(1,), dtype=np.int32)
    (pa,) = cond.cond_exec_pred(p, 1)
    (qa,) = cond.cond_exec_pred(q, 1)
    ppv = mgb.opr.cond_exec_pred_logical(pa, qa, mode=mode)
    runs = []
    (xm,) = mgb.opr.cond_exec_mark(ppv, x)
    z = mgb.opr.callback_injector(xm + 1, lambda v: runs.append(1))
    (y,) = mgb.opr.cond_exec_merge([z], mode="SUM")
    f = g.compile([x, p, q], [mgb.copy_output(y)])
    for pv in (0, 1):
        for qv in (0, 1):
            before = len(runs)
            (got,) = f(X, np.array([pv], np.int32), np.array([qv], np.int32))
            active = bool(fn(bool(pv), bool(qv)))
            np.testing.assert_allclose(got, X + 1 if active else np.zeros(3))
            assert len(runs) - before == int(active)


def test_single_ppv_logical_is_the_ppv_itself():
    g = mgb.comp_graph()
    p = mgb.make_arg(CN, g, name="p", shape=(1,))
    (a,) = cond.cond_exec_pred(p, 0.0)
    assert mgb.opr.cond_exec_pred_logical(a, mode="AND").node is a.node
    assert mgb.opr.cond_exec_pred_logical([a], mode="NOR").node is not a.node


def test_nested_branches_are_off_when_the_outer_one_is():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    p = mgb.make_arg(CN, g, name="p", shape=(1,), dtype=np.int32)
    q = mgb.make_arg(CN, g, name="q", shape=(1,), dtype=np.int32)
    (outer,) = cond.cond_exec_pred(p, 1)
    (xo, qo) = mgb.opr.cond_exec_mark(outer, [x, q])
    (inner,) = cond.cond_exec_pred(qo, 1)
    (xi,) = mgb.opr.cond_exec_mark(inner, xo)
    runs = []
    zi = mgb.opr.callback_injector(xi * 3, lambda v: runs.append("inner"))
    (zin,) = mgb.opr.cond_exec_merge([zi], mode="SUM")  # under the outer mask
    zo = mgb.opr.callback_injector(zin + xo, lambda v: runs.append("outer"))
    (y,) = mgb.opr.cond_exec_merge([zo], mode="SUM")
    f = g.compile([x, p, q], [mgb.copy_output(y)])
    i32 = lambda v: np.array([v], np.int32)  # noqa: E731
    np.testing.assert_allclose(f(X, i32(1), i32(1))[0], 4 * X)
    assert runs == ["inner", "outer"]
    np.testing.assert_allclose(f(X, i32(1), i32(0))[0], X)
    assert runs == ["inner", "outer", "outer"]
    np.testing.assert_allclose(f(X, i32(0), i32(1))[0], 0 * X)
    assert runs == ["inner", "outer", "outer"]


def test_mark_if_need_marks_only_conditional_vars():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    p = mgb.make_arg(CN, g, name="p", shape=(1,))
    (a,) = cond.cond_exec_pred(p, 0.0)
    (xa,) = mgb.opr.cond_exec_mark(a, x)
    assert mgb.opr.cond_exec_mark_if_need(x, x).node is x.node
    m = mgb.opr.cond_exec_mark_if_need(xa * 2, x)
    assert isinstance(m.node.owner, cond.CondExecMark)
    assert m.node.owner.inputs[-1] is a.node
    m2 = mgb.opr.cond_exec_mark_if_need(a, x)
    assert m2.node.owner.inputs[-1] is a.node


def test_bad_graphs_raise_naming_the_operator():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    p = mgb.make_arg(CN, g, name="p", shape=(1,))
    pv = mgb.make_arg(CN, g, name="pv", shape=(2,))
    a, b = cond.cond_exec_pred(p, 0.0, 1.0)
    with pytest.raises(GraphError, match="predicate proxy var"):
        a + 1
    with pytest.raises(GraphError, match="not a predicate proxy var"):
        mgb.opr.cond_exec_mark(x, x)
    (xa,) = mgb.opr.cond_exec_mark(a, x)
    (xb,) = mgb.opr.cond_exec_mark(b, x)
    with pytest.raises(GraphError, match="different branches"):
        xa + xb
    with pytest.raises(GraphError, match="not conditional"):
        mgb.opr.cond_exec_merge([xa, x])
    with pytest.raises(GraphError, match="must be a scalar"):
        cond.cond_exec_pred(pv, 0.0)
    with pytest.raises(GraphError, match="dtype mismatch"):
        cond.cond_exec_pred(p, mgb.make_arg(CN, g, name="ik", shape=(1,), dtype=np.int32))
    with pytest.raises(GraphError, match="nr_output"):
        mgb.opr.cond_exec_merge([xa, xb, xa], nr_output=2)
    with pytest.raises(GraphError, match="only for mode SUM"):
        mgb.opr.cond_exec_merge([xa, xb], [x.shape], mode="EXACT_ONE")


def test_a_dynamic_non_scalar_pred_raises_at_run_time():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    vals, _ = mgb.opr.cond_take(x, x, mode="GT", val=0.0)  # dynamic shape
    (a,) = cond.cond_exec_pred(vals, 1.0)
    (y,) = mgb.opr.cond_exec_merge([mgb.opr.cond_exec_mark(a, x)[0]], [x.shape], mode="SUM")
    f = g.compile([x], [mgb.copy_output(y)])
    np.testing.assert_allclose(f(np.array([1.0, -1, -1], np.float32))[0], [1, -1, -1])
    with pytest.raises(MegBrainError, match="must be a scalar"):
        f(X)


def test_compile_twice_and_multi_part():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    p = mgb.make_arg(CN, g, name="p", shape=(1,))
    a, b = cond.cond_exec_pred(p, 0.0, 1.0)
    runs = []
    ya = mgb.opr.callback_injector(mgb.opr.cond_exec_mark(a, x)[0] + 1, lambda v: runs.append(0))
    yb = mgb.opr.callback_injector(mgb.opr.cond_exec_mark(b, x)[0] - 1, lambda v: runs.append(1))
    (y,) = mgb.opr.cond_exec_merge([ya, yb], mode="EXACT_ONE_SAME_SHAPE")
    for _ in range(2):
        f = g.compile([x, p], [mgb.copy_output(y)])
        np.testing.assert_allclose(f(X, np.array([1.0], np.float32))[0], X - 1)
    assert runs == [1, 1]
    f0, f1 = g.compile_multi_part(
        [([x], [mgb.copy_output(x * 2)]), ([p], [mgb.copy_output(y)])]
    )
    np.testing.assert_allclose(f0(X)[0], 2 * X)
    np.testing.assert_allclose(f1(np.array([0.0], np.float32))[0], X + 1)
    assert runs == [1, 1, 0]


def test_params_from_param_defs():
    from megbrain import opr_param_defs as P

    g = mgb.comp_graph()
    p = mgb.make_arg(CN, g, name="p", shape=(1,))
    ppvs = cond.cond_exec_pred(p, 0.0, param=P.CondExecPred(mode=P.CondExecPred.Mode.PIECEWISE))
    assert len(ppvs) == 2  # (-inf, k0) and [k0, inf)
    assert ppvs[0].node.owner.param.mode == "PIECEWISE"


def test_dump_and_load_keep_the_cond_operators():
    from megbrain.serialization.dumper import dump_graph
    from megbrain.serialization.loader import load_graph

    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    p = mgb.make_arg(CN, g, name="p", shape=(1,))
    a, b = cond.cond_exec_pred(p, 0.0, 1.0, mode="CASE_FALLBACK")[:2]
    ya = mgb.opr.cond_exec_mark(a, x, grad_mode="SUM_COND_OUT")[0] * 2
    yb = mgb.opr.cond_exec_mark(b, x)[0] + 1
    (y,) = mgb.opr.cond_exec_merge([ya, yb], mode="EXACT_ONE", name="y")
    (z,) = mgb.opr.cond_exec_merge([ya, yb], mode="SUM_COND_OUT", name="z")
    data, _ = dump_graph([y.node, z.node])
    got = load_graph(data)

    def conds(oprs):
        return [(o.type_name, o.param) for o in oprs if o.type_name.startswith("CondExec")]

    assert conds(got.graph.all_oprs()) == conds(g.all_oprs())
    assert [v.owner.param.mode for v in got.output_var_list] == ["EXACT_ONE", "SUM_COND_OUT"]


@pytest.mark.parametrize("how", ["copy", "eager", "opt3", "threaded"])
def test_copies_eager_optimized_and_threaded_graphs(how):
    g = mgb.comp_graph()
    if how == "opt3":
        g.set_option("graph_opt_level", 3)
    if how == "threaded":
        g.set_option("async_exec_level", 0b110)  # steps run on the comp node's worker
    xv, pv = np.array([1.0, 2.0, 3.0], np.float32), np.array([1.0], np.float32)
    if how == "eager":
        g.set_option("eager_evaluation", True)
        g.set_option("graph_opt_level", 0)
        x = mgb.make_shared(CN, value=xv, comp_graph=g, name="x")
        p = mgb.make_shared(CN, value=pv, comp_graph=g, name="p")
    else:
        x = mgb.make_arg(CN, g, name="x", shape=(3,))
        p = mgb.make_arg(CN, g, name="p", shape=(1,))
    runs = []
    a, b = cond.cond_exec_pred(p, 0.0, 1.0)
    (xa,) = mgb.opr.cond_exec_mark(a, x * 1)
    (xb,) = mgb.opr.cond_exec_mark(b, x * 1)
    ya = mgb.opr.callback_injector(xa * 2, lambda v: runs.append(0))
    yb = mgb.opr.callback_injector(xb + 1, lambda v: runs.append(1))
    (y,) = mgb.opr.cond_exec_merge([ya, yb], mode="EXACT_ONE")
    gx = mgb.grad((y * y).sum(), x)
    if how == "eager":
        # eager graphs evaluate every operator at insertion: both branches ran, the merge
        # picked the active one
        np.testing.assert_allclose(y.node.eager_value, xv + 1)
        np.testing.assert_allclose(gx.node.eager_value, 2 * (xv + 1))
        assert sorted(runs) == [0, 1]
        return
    if how == "copy":
        g.compile([x], [mgb.copy_output(x)])  # a current function: copy=True copies
    f = g.compile([x, p], [mgb.copy_output(y), mgb.copy_output(gx)], copy=how == "copy")
    got_y, got_g = f(xv, pv)
    np.testing.assert_allclose(got_y, xv + 1)
    np.testing.assert_allclose(got_g, 2 * (xv + 1))
    assert runs == [1]


REFERENCE_SIGNATURES = {
    "cond_exec_pred": (("pred", "*keys"), "param mode eps"),
    "cond_exec_pred_logical": (("*ppvs",), "param mode"),
    "cond_exec_mark": (("ppv", "*inputs"), "param grad_mode static_infer"),
    "cond_exec_mark_if_need": (("maybe_ppv", "input"), "param grad_mode static_infer"),
    "cond_exec_merge": (("inputs", "out_shapes"), "param nr_output mode"),
    "timestamp": (("input", "dest", "dest_off"), ""),
    "persistent_output_storage": (("inp",), "param share_key"),
    "require_input_dynamic_storage": (("inp",), "param"),
}


@pytest.mark.parametrize("fname", sorted(REFERENCE_SIGNATURES))
def test_reference_signatures(fname):
    import inspect

    inputs, keywords = REFERENCE_SIGNATURES[fname]
    params = list(inspect.signature(getattr(mgb.opr, fname)).parameters.values())
    positional = [
        ("*" if p.kind == p.VAR_POSITIONAL else "") + p.name
        for p in params
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
    ]
    assert tuple(positional[: len(inputs)]) == inputs
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    missing = set(keywords.split() + "name comp_node config comp_graph".split()) - named
    assert not missing


@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    shape=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple),
    pdtype=st.sampled_from([np.int32, np.float32]),
    p=st.integers(-2, 4),
    nbranch=st.integers(1, 4),
)
def test_case_fallback_over_shapes_and_pred_dtypes(shape, pdtype, p, nbranch):
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=shape)
    pv = mgb.make_arg(CN, g, name="p", shape=(1,), dtype=pdtype)
    ppvs = cond.cond_exec_pred(pv, *[pdtype(k) for k in range(nbranch)], mode="CASE_FALLBACK")
    runs = []
    outs = []
    for i, ppv in enumerate(ppvs):
        (xm,) = mgb.opr.cond_exec_mark(ppv, x)
        outs.append(mgb.opr.callback_injector(xm * (i + 1), lambda v, i=i: runs.append(i)))
    (y,) = mgb.opr.cond_exec_merge(outs, mode="EXACT_ONE_SAME_SHAPE")
    xv = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    (got,) = g.compile([x, pv], [mgb.copy_output(y)])(xv, np.array([p], pdtype))
    taken = p if 0 <= p < nbranch else nbranch
    np.testing.assert_allclose(got, xv * (taken + 1), rtol=1e-6)
    assert runs == [taken]


def test_sum_cond_out_gradients_of_sibling_branches_merge_into_one():
    g = mgb.comp_graph()
    g.set_option("graph_opt_level", 0)
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    p = mgb.make_arg(CN, g, name="p", shape=(1,))
    a, b = cond.cond_exec_pred(p, 0.0, 1.0)
    (xa,) = mgb.opr.cond_exec_mark(a, x, grad_mode="SUM_COND_OUT")
    (xb,) = mgb.opr.cond_exec_mark(b, x, grad_mode="SUM_COND_OUT")
    (y,) = mgb.opr.cond_exec_merge([xa * xa, xb * 3], mode="EXACT_ONE_SAME_SHAPE")
    (gx,) = mgb.opr.grad.grad(y.sum(), [x])
    merge = gx.owner  # one merge, not an ADD of two merges from sibling branches
    assert isinstance(merge, cond.CondExecMerge) and merge.param.mode == "SUM_COND_OUT"
    assert merge.nr_branch == 2
    f = g.compile([x, p], [mgb.copy_output(mgb.SymbolVar(gx) * 1)])
    np.testing.assert_allclose(f(X, np.array([0.0], np.float32))[0], 2 * X)
    np.testing.assert_allclose(f(X, np.array([1.0], np.float32))[0], [3, 3, 3])


def test_static_shapes_of_marks_and_merges():
    from megbrain.graph.static_infer import infer_shape

    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(2, 3))
    p = mgb.make_arg(CN, g, name="p", shape=(1,))
    a, b = cond.cond_exec_pred(p, 0.0, 1.0)
    assert infer_shape(a.node) == (1,) and a.dtype == np.int32
    (xa,) = mgb.opr.cond_exec_mark(a, x)
    (xb,) = mgb.opr.cond_exec_mark(b, x)
    assert infer_shape(xa.node) == (2, 3)
    (dyn,) = mgb.opr.cond_exec_mark(a, x, static_infer="NONE")
    assert not dyn.node.shape_static
    for mode in ("EXACT_ONE_SAME_SHAPE", "SUM", "SUM_COND_OUT"):
        (y,) = mgb.opr.cond_exec_merge([xa, xb], mode=mode)
        assert infer_shape(y.node) == (2, 3), mode
    (y,) = mgb.opr.cond_exec_merge([xa, xb], mode="EXACT_ONE")
    assert not y.node.shape_static  # the active branch's shape, known when it runs
    (y,) = mgb.opr.cond_exec_merge([xa, xb], [(4, 1)], mode="SUM")
    assert infer_shape(y.node) == (4, 1)
