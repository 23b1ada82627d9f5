"""Eager evaluation (graph option ``eager_evaluation``, ``ProxySharedNDAndSymbolVar``):
values at insertion, re-evaluation of only the dependents of a changed source, failed
insertions, compiling a non-eager copy, and bounded memory in long loops."""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pytest

import megbrain as mgb

CN = "cpu0"


def _eager_graph():
    g = mgb.comp_graph()
    g.set_option("eager_evaluation", True)
    assert g.is_eager()
    return g


def _val(v):
    return np.asarray(v.eager_val.get_value())


def _f32(*xs):
    return np.asarray(xs, np.float32)


# ---- values at insertion ---------------------------------------------------------------------
def test_values_are_computed_at_insertion():
    g = _eager_graph()
    x = mgb.make_shared(CN, value=_f32(1, 2, 3), comp_graph=g, name="x")
    a = mgb.make_arg(CN, g, value=np.arange(6, dtype=np.float32).reshape(2, 3), name="a")
    np.testing.assert_array_equal(_val(x), [1, 2, 3])
    y = a * x + 1.0
    np.testing.assert_array_equal(_val(y), np.arange(6).reshape(2, 3) * [1, 2, 3] + 1)
    s = y.sum(axis=1)
    np.testing.assert_array_equal(_val(s), (np.arange(6).reshape(2, 3) * [1, 2, 3] + 1).sum(1))
    m = mgb.opr.matrix_mul(a, a.dimshuffle(1, 0))
    av = np.arange(6.0).reshape(2, 3)
    np.testing.assert_allclose(_val(m), av @ av.T)
    r = y.reshape(3, 2)
    assert _val(r).shape == (3, 2)
    assert _val(mgb.opr.elem.exp(x)).dtype == np.float32


def test_non_eager_graph_has_no_eager_value():
    g = mgb.comp_graph()
    x = mgb.make_shared(CN, value=_f32(1, 2), comp_graph=g)
    assert (x * 2.0).eager_val is None


def test_callbacks_run_at_insertion():
    g = _eager_graph()
    x = mgb.make_shared(CN, value=_f32(1, 2), comp_graph=g)
    seen = []
    out = mgb.opr.callback_injector(x * 3.0, lambda v: seen.append(v.get_value().copy()))
    assert len(seen) == 1
    np.testing.assert_array_equal(seen[0], [3, 6])
    np.testing.assert_array_equal(_val(out), [3, 6])


def test_gradients_evaluate_eagerly():
    g = _eager_graph()
    x = mgb.make_shared(CN, value=_f32(0, 1, 2), comp_graph=g)
    loss = (x * x * x).sum()
    gx = mgb.grad(loss, x, use_virtual_grad=False)
    np.testing.assert_allclose(_val(gx), 3 * np.array([0, 1, 2]) ** 2)
    (ggx,) = mgb.grad(gx.sum(), [x], use_virtual_grad=False)
    np.testing.assert_allclose(_val(ggx), 6 * np.array([0, 1, 2]))
    x.set_value(_f32(1, 1, 1))
    np.testing.assert_allclose(_val(gx), [3, 3, 3])
    np.testing.assert_allclose(_val(ggx), [6, 6, 6])


# ---- re-evaluation ---------------------------------------------------------------------------
def test_set_value_reruns_only_the_dependents():
    g = _eager_graph()
    x = mgb.make_shared(CN, value=_f32(1, 2), comp_graph=g, name="x")
    z = mgb.make_shared(CN, value=_f32(10, 20), comp_graph=g, name="z")
    calls = {"x": 0, "z": 0, "both": 0}

    def count(key):
        def cb(v):
            calls[key] += 1

        return cb

    bx = mgb.opr.callback_injector(x * 2.0, count("x"))
    bz = mgb.opr.callback_injector(z * 3.0, count("z"))
    both = mgb.opr.callback_injector(bx + bz, count("both"))
    deep = both * 2.0 + 1.0
    assert calls == {"x": 1, "z": 1, "both": 1}
    x.set_value(_f32(5, 6))
    assert calls == {"x": 2, "z": 1, "both": 2}  # z's branch is not recomputed
    np.testing.assert_array_equal(_val(bx), [10, 12])
    np.testing.assert_array_equal(_val(deep), (np.array([10, 12]) + [30, 60]) * 2 + 1)
    z.set_value(_f32(0, 0))
    assert calls == {"x": 2, "z": 2, "both": 3}
    np.testing.assert_array_equal(_val(deep), np.array([10, 12]) * 2 + 1)


def test_set_value_on_make_arg_reevaluates():
    g = _eager_graph()
    a = mgb.make_arg(CN, g, value=_f32(1, 2, 3), name="a")
    y = (a * a).sum()
    np.testing.assert_array_equal(_val(y), [14])
    a.set_value(_f32(2, 2, 2))
    np.testing.assert_array_equal(_val(y), [12])
    a.set_value(_f32(1, 1, 1, 1))  # a new shape propagates too
    np.testing.assert_array_equal(_val(y), [4])
    assert _val(a * 1.5).shape == (4,)


def test_reeval_if_eager_eval_after_writing_the_tensor():
    g = _eager_graph()
    x = mgb.make_shared(CN, value=_f32(1, 2), comp_graph=g)
    y = x + 1.0
    mgb.SharedND._from_symvar(x).set_value(_f32(7, 8))  # bypasses the proxy: y is stale
    np.testing.assert_array_equal(_val(y), [2, 3])
    x._reeval_if_eager_eval()
    np.testing.assert_array_equal(_val(y), [8, 9])


def test_dedup_returns_the_existing_value():
    g = _eager_graph()
    x = mgb.make_shared(CN, value=_f32(1, 2), comp_graph=g)
    y1, y2 = x * 2.0, x * 2.0
    assert y1 == y2
    np.testing.assert_array_equal(_val(y2), [2, 4])


# ---- failed insertion ------------------------------------------------------------------------
def test_failed_insertion_raises_and_graph_stays_usable():
    g = _eager_graph()
    x = mgb.make_shared(CN, value=_f32(1, 2, 3), comp_graph=g, name="x")
    y = x * 2.0
    bad = mgb.make_arg(CN, g, value=np.ones(4, np.float32), name="bad")
    y2, bad2 = y.reshape(1, 3), bad.reshape(1, 4)
    nr_oprs = len(g.all_oprs())
    with pytest.raises(mgb.MegBrainError, match="broadcast"):
        y + bad
    with pytest.raises(mgb.MegBrainError):
        mgb.opr.matrix_mul(y2, bad2)
    assert len(g.all_oprs()) == nr_oprs  # the failed operators were not added
    # earlier values are still readable, new work is still possible
    np.testing.assert_array_equal(_val(y), [2, 4, 6])
    z = y + bad[:3]
    np.testing.assert_array_equal(_val(z), [3, 5, 7])
    x.set_value(_f32(0, 0, 0))
    np.testing.assert_array_equal(_val(z), [1, 1, 1])
    f = g.compile(None, mgb.copy_output(z * 10.0))
    np.testing.assert_array_equal(f(), [10, 10, 10])


def test_virtual_grad_in_eager_graph_fails_cleanly():
    # VirtualGrad is expanded only at compile: an eager graph needs use_virtual_grad=False
    g = _eager_graph()
    x = mgb.make_shared(CN, value=_f32(1, 2), comp_graph=g)
    loss = (x * x).sum()
    with pytest.raises(mgb.MegBrainError, match="VirtualGrad"):
        mgb.grad(loss, x)
    np.testing.assert_array_equal(_val(mgb.grad(loss, x, use_virtual_grad=False)), [2, 4])


def test_failed_reevaluation_recovers_after_a_good_value():
    g = _eager_graph()
    x = mgb.make_shared(CN, value=_f32(1, 2, 3), comp_graph=g)
    a = mgb.make_arg(CN, g, value=_f32(1, 1, 1))
    y = a + x
    with pytest.raises(mgb.MegBrainError, match="broadcast"):
        x.set_value(np.ones(4, np.float32))
    x.set_value(_f32(2, 2, 2))
    np.testing.assert_array_equal(_val(y), [3, 3, 3])
    np.testing.assert_array_equal(_val(y * 2.0), [6, 6, 6])


# ---- compile ---------------------------------------------------------------------------------
def test_compile_copies_into_a_non_eager_graph():
    g = _eager_graph()
    w = mgb.make_shared(CN, value=_f32(1, 2, 3), comp_graph=g, name="w")
    a = mgb.make_arg(CN, g, value=_f32(1, 1, 1), name="a")
    y = a * w + 1.0
    f = g.compile([a], mgb.copy_output(y))
    assert f.graph is not g and not f.graph.is_eager()
    assert g.is_eager()
    assert len(f.inputs) == 1 and f.inputs[0] == a  # the user's var, not the copy's
    np.testing.assert_array_equal(f(_f32(2, 3, 4)), [3, 7, 13])
    np.testing.assert_array_equal(f(a=_f32(0, 0, 0)), [1, 1, 1])  # keyword by var name
    # the shared tensor is shared with the copy
    w.set_value(_f32(10, 10, 10))
    np.testing.assert_array_equal(f(_f32(1, 2, 3)), [11, 21, 31])
    # the eager graph keeps working, and a second function leaves the first usable
    s = y.sum()
    assert _val(s).shape == (1,)
    f2 = g.compile([a], [mgb.copy_output(s), mgb.copy_output(y)])
    got_s, got_y = f2(_f32(1, 1, 1))
    np.testing.assert_array_equal(got_s, [33])
    np.testing.assert_array_equal(f(_f32(1, 1, 1)), [11, 11, 11])


def test_compile_with_virtual_grad_on_eager_graph():
    # the copy is non-eager, so a gradient built there can be expanded at compile
    g = _eager_graph()
    w = mgb.make_shared(CN, value=_f32(1, 2, 3), comp_graph=g, name="w")
    a = mgb.make_arg(CN, g, value=_f32(1, 1, 1), name="a")
    loss = (a * w * w).sum()
    gw = mgb.grad(loss, w, use_virtual_grad=False)
    f = g.compile([a], mgb.copy_output(gw))
    np.testing.assert_allclose(f(_f32(1, 2, 3)), 2 * np.array([1, 2, 3]) * [1, 2, 3])


def test_compile_copy_keeps_extra_vardeps():
    g = _eager_graph()
    a = mgb.make_arg(CN, g, value=_f32(1, 1, 1), name="a")
    calls = []
    dep = mgb.opr.callback_injector(a * 5.0, lambda v: calls.append(1))
    y = a * 3.0
    mgb.config.add_extra_vardep(y, dep)
    calls.clear()  # the eager evaluation at insertion
    f = g.compile([a], mgb.copy_output(y))
    f(_f32(1, 2, 3))
    assert len(calls) == 1


def test_multi_part_compile_is_rejected():
    g = _eager_graph()
    a = mgb.make_arg(CN, g, value=_f32(1), name="a")
    with pytest.raises(mgb.MegBrainError, match="eager"):
        g.compile_multi_part([([a], [mgb.copy_output(a * 2.0)])])


# ---- memory ----------------------------------------------------------------------------------
def _loop_memory(g, w, n, mark):
    """Traced bytes after ``mark`` and after ``n`` iterations of fresh inputs and operators."""
    rng = np.random.default_rng(0)
    at_mark = None
    tracemalloc.start()
    try:
        for i in range(n):
            a = mgb.make_arg(CN, g, value=rng.standard_normal(4).astype(np.float32))
            y = (a * w + 1.0).sum()
            assert _val(y).shape == (1,)
            if i == mark:
                del a, y
                gc.collect()
                at_mark = tracemalloc.get_traced_memory()[0]
        del a, y
        gc.collect()
        end = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return end - at_mark


def test_long_eager_loop_memory_is_bounded():
    g = _eager_graph()
    w = mgb.make_shared(CN, value=np.ones(4, np.float32), comp_graph=g, name="w")
    growth = _loop_memory(g, w, 3000, 500)
    # holding on to each iteration's operators, vars or values would take several MB
    assert growth < 1_000_000, growth
    assert len(g.all_oprs()) < 20


def test_long_lived_var_keeps_no_per_iteration_state():
    g = _eager_graph()
    w = mgb.make_shared(CN, value=np.ones(4, np.float32), comp_graph=g, name="w")
    growth = _loop_memory(g, w, 2200, 200)
    # a leak of one entry per iteration is ~180 KB here; without it, a few KB of noise
    assert growth < 80_000, growth


def test_static_inference_answers_from_evaluated_values(monkeypatch):
    """Shape queries on an eager graph read evaluated values instead of re-inferring the
    graph behind them (a fresh inference per query was quadratic in the graph size)."""
    from megbrain.graph import static_infer

    g = _eager_graph()
    x = mgb.make_shared("cpu0", value=np.ones((2, 3), np.float32), comp_graph=g)
    y = x
    for _ in range(50):
        y = y * 1.5 + 1
    computed = []
    orig = static_infer.Inferer._compute
    monkeypatch.setattr(
        static_infer.Inferer,
        "_compute",
        lambda self, opr, v: (computed.append(opr), orig(self, opr, v)),
    )
    assert static_infer.infer_shape(y.node) == (2, 3)
    assert static_infer.infer_value(y.node) is not None
    z = mgb.opr.reduce_(y, "SUM", 1)  # inference of the new operator reads y's value only
    assert z.imm_shape == (2,)
    assert len(computed) <= 3
