"""make_loop: a do-while loop over a sub graph, its output modes, gradients and bad bodies."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opr_harness import check_grad, inputs, make_graph, run

import megbrain as mgb
from megbrain.errors import GraphError, MegBrainError
from megbrain.opr.io import make_immutable

CN = "cpu0"
XS = np.array([0.5, 1.0, -2.0, 0.1], np.float64)


def _series_body(x, n, record=("last",)):
    """sum_{k<n} x^k / k! with a term and a running sum as assigned states."""

    def body(d):
        xi = d.add_input(x)
        ni = d.add_input(n)
        term = d.add_input_assignable(mgb.opr.fill_retain_dtype(x, 1))
        s = d.add_input_assignable(mgb.opr.fill_retain_dtype(x, 0))
        k = d.get_counter_var()
        s_next = s + term
        d.assign(term, term * xi / mgb.opr.typecvt(k + 1, x.dtype))
        d.assign(s, s_next)
        d.set_loop_condition(k + 1 < ni)
        for mode in record:
            d.add_output(s_next if mode == "last" else term, mode)

    return body


def _series(x, n):
    return sum(x**k / math.factorial(k) for k in range(n))


def test_power_series_and_its_gradient_against_numpy():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(4,))
    n = mgb.make_arg(CN, g, name="n", shape=(1,), dtype=np.int32)
    y, allt, sumt = mgb.opr.make_loop(_series_body(x, n, ("last", "all", "sum")))
    gx = mgb.grad(y.sum(), x)
    f = g.compile([x, n], [mgb.copy_output(v) for v in (y, allt, sumt, gx)])
    xv = XS.astype(np.float32)
    for nv in (1, 3, 7):
        got_y, got_all, got_sum, got_g = f(xv, np.array([nv], np.int32))
        np.testing.assert_allclose(got_y, _series(XS, nv), rtol=1e-5)
        # 'all' records every iteration's term (before the update), stacked on axis 0
        terms = np.stack([XS**k / math.factorial(k) for k in range(nv)])
        np.testing.assert_allclose(got_all, terms, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(got_sum, terms.sum(0), rtol=1e-5)
        dseries = sum(k * XS ** (k - 1) / math.factorial(k) for k in range(1, nv))
        np.testing.assert_allclose(got_g, dseries + 0 * XS, rtol=1e-5, atol=1e-6)


def _n_const(ref, n):
    return make_immutable(ref.comp_node, ref.node.graph, np.array([n], np.int32))


@pytest.mark.parametrize("mode", ["last", "sum"])
def test_gradients_match_finite_differences_in_float64(mode):
    def build(x):
        (out,) = mgb.opr.make_loop(_series_body(x, _n_const(x, 5), (mode,)))
        return out

    check_grad(build, [XS], rtol=1e-5)


def test_all_mode_gradient_matches_finite_differences_in_float64():
    from megbrain.opr.grad import grad

    weights = np.random.default_rng(0).standard_normal((5, 4))

    def loss_and_grad(xv):
        g = make_graph()
        (x,), _ = inputs(g, xv)
        (out,) = mgb.opr.make_loop(_series_body(x, _n_const(x, 5), ("all",)))
        loss = (out * make_immutable(x.comp_node, g, weights)).sum()
        (gx,) = grad(loss, [x])
        return run([loss, gx], g)

    _, got = loss_and_grad(XS)
    eps = 1e-6
    num = np.zeros_like(XS)
    for i in range(XS.size):
        d = np.zeros_like(XS)
        d[i] = eps
        num[i] = (loss_and_grad(XS + d)[0][0] - loss_and_grad(XS - d)[0][0]) / (2 * eps)
    np.testing.assert_allclose(got, num, rtol=1e-5, atol=1e-8)


def test_gradient_of_a_loop_constant_through_every_iteration():
    # y = x * w^n (n iterations multiplying by w): dy/dw sums over iterations
    def build(x, w):
        def body(d):
            wi = d.add_input(w)
            acc = d.add_input_assignable(x)
            k = d.get_counter_var()
            d.assign(acc, acc * wi)
            d.set_loop_condition(k + 1 < 4)
            d.add_output(acc * wi, "last")

        return mgb.opr.make_loop(body)[0]

    check_grad(build, [np.array([1.5, -0.5]), np.array([0.9, 1.1])], rtol=1e-5)


def test_last_and_sum_outputs_have_static_shapes():
    g = make_graph()
    (x,), _ = inputs(g, XS.astype(np.float32))
    y, s = mgb.opr.make_loop(_series_body(x, _n_const(x, 3), ("last", "sum")))
    assert y.node.shape_static and s.node.shape_static
    from megbrain.graph.static_infer import infer_shape

    assert infer_shape(y.node) == (4,) and infer_shape(s.node) == (4,)
    got_y, got_s = run([y, s])
    np.testing.assert_allclose(got_y, _series(XS, 3), rtol=1e-5)


def test_counter_starts_at_zero_and_body_runs_at_least_once():
    g = make_graph()
    (x,), _ = inputs(g, np.zeros(2, np.float32))

    def body(d):
        d.add_input(x)
        k = d.get_counter_var()
        d.set_loop_condition(k * 0)  # false at once
        d.add_output(k, "all")

    (ks,) = mgb.opr.make_loop(body)
    (got,) = run([ks])
    np.testing.assert_array_equal(got, [[0]])
    assert ks.dtype == np.int32


def test_output_shapes_are_dynamic_and_compile_twice_works():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(4,))
    n = mgb.make_arg(CN, g, name="n", shape=(1,), dtype=np.int32)
    (allt,) = mgb.opr.make_loop(_series_body(x, n, ("all",)))
    assert not allt.node.shape_static
    xv = XS.astype(np.float32)
    for _ in range(2):
        f = g.compile([x, n], [mgb.copy_output(allt * 2)])
        assert f(xv, np.array([2], np.int32))[0].shape == (2, 4)
        assert f(xv, np.array([5], np.int32))[0].shape == (5, 4)


def test_multi_part_compile():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(4,))
    n = mgb.make_arg(CN, g, name="n", shape=(1,), dtype=np.int32)
    (y,) = mgb.opr.make_loop(_series_body(x, n))
    f0, f1 = g.compile_multi_part(
        [([x, n], [mgb.copy_output(y)]), (None, [mgb.copy_output(y * 2)])]
    )
    xv = XS.astype(np.float32)
    (a,) = f0(xv, np.array([4], np.int32))
    (b,) = f1()
    np.testing.assert_allclose(a, _series(XS, 4), rtol=1e-5)
    np.testing.assert_allclose(b, 2 * a, rtol=1e-6)


def test_a_non_scalar_loop_condition_is_an_error():
    g = make_graph()
    (x,), _ = inputs(g, np.zeros(3, np.float32))

    def body(d):
        xi = d.add_input(x)
        d.set_loop_condition(xi)
        d.add_output(xi, "last")

    with pytest.raises(GraphError, match=r"loop 'myloop'.*must be a scalar, got shape \{3\}"):
        mgb.opr.make_loop(body, name="myloop")


def test_a_dynamic_non_scalar_loop_condition_fails_at_run_time():
    g = make_graph()
    (x,), _ = inputs(g, np.array([1.0, 2.0], np.float32))
    vals, _ = mgb.opr.cond_take(x, x, mode="GT", val=0.0)

    def body(d):
        vi = d.add_input(vals)
        d.set_loop_condition(vi * 0)
        d.add_output(vi, "last")

    (y,) = mgb.opr.make_loop(body, name="dyn")
    with pytest.raises(MegBrainError, match=r"Loop 'dyn'.*must be a scalar, got shape \{2\}"):
        run([y])


@pytest.mark.parametrize(
    "bad,match",
    [
        ("mode", "unrecognized loop output mode 'product'"),
        ("assign", "is not an input added with has_assign=True"),
        ("outer", "outer graph; .*add_input|only\\s+through desc.add_input"),
        ("nocond", "never called set_loop_condition"),
        ("dtype", "of dtype int32"),
    ],
)
def test_bad_bodies_raise_naming_the_loop(bad, match):
    g = make_graph()
    (x, y), _ = inputs(g, np.zeros(3, np.float32), np.ones(3, np.float32))

    def body(d):
        xi = d.add_input(x)
        k = d.get_counter_var()
        if bad == "mode":
            d.add_output(xi, "product")
        if bad == "assign":
            d.assign(xi, xi + 1)
        if bad == "outer":
            xi = xi + y  # y was never passed through add_input
        if bad == "dtype":
            s = d.add_input_assignable(x)
            d.assign(s, k)
        if bad != "nocond":
            d.set_loop_condition(k * 0)
        d.add_output(xi, "last")

    with pytest.raises(GraphError, match=match) as info:
        mgb.opr.make_loop(body, name="bad_loop")
    assert "bad_loop" in str(info.value)


@pytest.mark.parametrize("how", ["copy", "eager", "opt3"])
def test_loop_and_gradient_in_copies_eager_graphs_and_optimized_graphs(how):
    g = mgb.comp_graph()
    if how == "opt3":
        g.set_option("graph_opt_level", 3)
    if how == "eager":
        g.set_option("eager_evaluation", True)
        g.set_option("graph_opt_level", 0)  # gradients built at once, not as VirtualGrad
        x = mgb.make_shared(CN, value=XS.astype(np.float32), comp_graph=g, name="x")
        n = mgb.make_shared(CN, value=np.array([4], np.int32), comp_graph=g, name="n")
    else:
        x = mgb.make_arg(CN, g, name="x", shape=(4,))
        n = mgb.make_arg(CN, g, name="n", shape=(1,), dtype=np.int32)
    (y,) = mgb.opr.make_loop(_series_body(x * 1, n))
    gx = mgb.grad(y.sum(), x)
    expect_y = _series(XS, 4)
    expect_g = sum(k * XS ** (k - 1) / math.factorial(k) for k in range(1, 4))
    if how == "eager":
        np.testing.assert_allclose(y.node.eager_value, expect_y, rtol=1e-5)
        np.testing.assert_allclose(gx.node.eager_value, expect_g, rtol=1e-5)
        return
    args = (XS.astype(np.float32), np.array([4], np.int32))
    if how == "copy":
        g.compile([x], [mgb.copy_output(x)])  # a current function: copy=True copies
    f = g.compile([x, n], [mgb.copy_output(y), mgb.copy_output(gx)], copy=how == "copy")
    got_y, got_g = f(*args)
    np.testing.assert_allclose(got_y, expect_y, rtol=1e-5)
    np.testing.assert_allclose(got_g, expect_g, rtol=1e-5)


def test_make_loop_signature():
    import inspect

    params = inspect.signature(mgb.opr.make_loop).parameters
    assert list(params)[0] == "desc_maker"
    assert {"swap_interval", "name", "comp_node", "config"} <= set(params)
    assert params["swap_interval"].default == -5
    with pytest.raises(mgb.errors.ArgumentError):
        mgb.opr.make_loop(lambda d: None, swap_interval=1.5)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    shape=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple),
    n=st.integers(1, 6),
    dtype=st.sampled_from([np.float32, np.float64]),
)
def test_running_product_over_shapes_and_dtypes(shape, n, dtype):
    # acc_{t+1} = acc_t * w + 1: n iterations see acc_0 .. acc_{n-1}
    rng = np.random.default_rng(len(shape) * 7 + n)
    xv = rng.uniform(-1, 1, shape).astype(dtype)
    wv = rng.uniform(0.5, 1.5, shape).astype(dtype)
    g = make_graph()
    (x, w), _ = inputs(g, xv, wv)

    def body(d):
        wi = d.add_input(w)
        acc = d.add_input_assignable(x)
        k = d.get_counter_var()
        d.assign(acc, acc * wi + 1)
        d.set_loop_condition(k + 1 < n)
        d.add_output(acc, "last")
        d.add_output(acc, "all")
        d.add_output(acc, "sum")

    last, every, total = mgb.opr.make_loop(body)
    assert last.dtype == dtype and every.dtype == dtype
    got_last, got_all, got_sum = run([last, every, total])
    ref = [xv.astype(np.float64)]
    for _ in range(n - 1):
        ref.append(ref[-1] * wv + 1)
    ref = np.stack(ref)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got_all, ref, rtol=tol, atol=tol)
    np.testing.assert_allclose(got_last, ref[-1], rtol=tol, atol=tol)
    np.testing.assert_allclose(got_sum, ref.sum(0), rtol=tol, atol=tol)


def test_dumping_a_loop_raises_naming_it():
    from megbrain.errors import SerializationError
    from megbrain.serialization.dumper import dump_graph

    g = make_graph()
    (x,), _ = inputs(g, XS.astype(np.float32))
    (y,) = mgb.opr.make_loop(_series_body(x, _n_const(x, 3)), name="series")
    with pytest.raises(SerializationError, match="'series'.*Loop opr not implemented"):
        dump_graph([y.node])


def test_conditional_execution_inside_a_loop_body_and_a_loop_inside_a_branch():
    from megbrain.opr import cond

    g = mgb.comp_graph()
    n0 = mgb.make_arg(CN, g, name="n0", shape=(1,), dtype=np.int32)
    runs = []

    def collatz(d):
        n = d.add_input_assignable(n0)
        even, odd = cond.cond_exec_pred(n % 2, 0, 1)
        (ne,) = mgb.opr.cond_exec_mark(even, n)
        (no,) = mgb.opr.cond_exec_mark(odd, n)
        half = mgb.opr.callback_injector(ne // 2, lambda v: runs.append("even"))
        triple = mgb.opr.callback_injector(no * 3 + 1, lambda v: runs.append("odd"))
        (nxt,) = mgb.opr.cond_exec_merge([half, triple], mode="EXACT_ONE_SAME_SHAPE")
        d.assign(n, nxt)
        d.set_loop_condition(nxt > 1)
        d.add_output(nxt, "all")

    (steps,) = mgb.opr.make_loop(collatz)
    # the whole loop sits in a branch taken only for a positive n0
    p = mgb.make_arg(CN, g, name="p", shape=(1,), dtype=np.int32)
    (on,) = cond.cond_exec_pred(p, 1)
    (n_on,) = mgb.opr.cond_exec_mark(on, n0)
    loop_runs = []
    (inner,) = mgb.opr.make_loop(
        lambda d: (
            d.add_output(d.add_input(n_on) * 1, "last"),
            d.set_loop_condition(d.get_counter_var() * 0),
        )
    )
    gated = mgb.opr.callback_injector(inner, lambda v: loop_runs.append(1))
    (y,) = mgb.opr.cond_exec_merge([gated], mode="SUM")
    f = g.compile([n0, p], [mgb.copy_output(steps), mgb.copy_output(y)])
    got_steps, got_y = f(np.array([6], np.int32), np.array([1], np.int32))
    np.testing.assert_array_equal(got_steps.reshape(-1), [3, 10, 5, 16, 8, 4, 2, 1])
    assert runs.count("odd") == 2 and runs.count("even") == 6
    assert got_y[0] == 6 and loop_runs == [1]
    _, got_y = f(np.array([6], np.int32), np.array([0], np.int32))
    assert got_y[0] == 0 and loop_runs == [1]  # the branch with the loop did not run
