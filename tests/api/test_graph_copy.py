"""Graph copying (``_do_compile`` with ``copy``, ``inter_graph_trans_var``, ``mark_as_input``,
``_find_mutable_input``) and the graph-editing cgtools (``replace_vars``, ``replace_oprs``,
``set_priority_to_id``, ``get_oprs_seq``) with the ``mgb.config`` scopes
(``opr_priority_scope``, ``exc_opr_tracker_scope``)."""

from __future__ import annotations

import numpy as np
import pytest

import megbrain as mgb
from megbrain import cgtools
from megbrain.api.config import exc_opr_tracker_scope, opr_priority_scope
from megbrain.tensor import HostTensorND

CN = "cpu0"
F32 = np.float32


def _graph(**opts):
    g = mgb.comp_graph(check_env_var=False)
    g.set_option("log_level", 0)
    for k, v in opts.items():
        g.set_option(k, v)
    return g


def _xy(g):
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    y = mgb.make_arg(CN, g, name="y", shape=(3,))
    return x, y


def _seq(f):
    return list(f._func.iter_opr_seq())


# ---- compile(copy=True) ------------------------------------------------------------------
def test_copy_compile_leaves_the_current_function_valid():
    g = _graph()
    x, y = _xy(g)
    f = g.compile([x, y], mgb.copy_output(x + y))
    fc = g.compile([x, y], mgb.copy_output(x * y), copy=True)
    assert fc.graph is not g and all(o.graph is fc.graph for o in _seq(fc))
    a, b = np.arange(3, dtype=F32), np.full(3, 2.0, F32)
    np.testing.assert_array_equal(f(a, b), a + b)  # not invalidated
    np.testing.assert_array_equal(fc(a, b), a * b)
    assert g.current_exec is f._func


def test_copy_compile_without_copy_invalidates():
    g = _graph()
    x, y = _xy(g)
    f = g.compile([x, y], mgb.copy_output(x + y))
    g.compile([x, y], mgb.copy_output(x * y))
    with pytest.raises(mgb.GraphError, match="invalidated"):
        f(np.ones(3, F32), np.ones(3, F32))


def test_inputs_of_a_copy_are_the_users_vars():
    g = _graph()
    x, y = _xy(g)
    unused = mgb.make_arg(CN, g, name="unused", shape=(3,))
    g.compile(None, mgb.copy_output(x))  # a current function: compile(copy=True) copies
    f = g.compile(None, mgb.copy_output(x - y), copy=True)
    assert f.graph is not g
    assert set(f.inputs) == {x, y} and unused not in f.inputs
    assert f._find_mutable_input() == {x, y}
    np.testing.assert_array_equal(f(x=np.full(3, 5.0, F32), y=np.ones(3, F32)), [4.0] * 3)
    f.inputs = [y, x]  # reorder with the original vars
    np.testing.assert_array_equal(f(np.ones(3, F32), np.full(3, 5.0, F32)), [4.0] * 3)


def test_eager_graph_compiles_a_copy_with_user_inputs():
    g = _graph(eager_evaluation=1)
    x = mgb.make_arg(CN, g, name="x", value=np.ones(3, F32))
    y = x * 4.0
    f = g.compile(None, mgb.copy_output(y))
    assert not f.graph.is_eager() and f.graph is not g
    assert f.inputs == (x,)
    np.testing.assert_array_equal(f(x=np.full(3, 2.0, F32)), [8.0] * 3)


def test_copy_keeps_priorities_and_trackers():
    g = _graph()
    x, y = _xy(g)
    tracker = ("layer", 3)
    order = []
    a = mgb.opr.callback_injector(x + 1.0, lambda v: order.append("a"))
    with opr_priority_scope(g, -3):
        b = mgb.opr.callback_injector(y + 1.0, lambda v: order.append("b"))
    with exc_opr_tracker_scope(g, tracker):
        bad = mgb.opr.assert_equal(x, x + 1.0)
    g.compile(None, mgb.copy_output(x))  # a current function: compile(copy=True) copies
    f = g.compile(None, [a, b], copy=True)
    assert f.graph is not g
    f(x=np.ones(3, F32), y=np.ones(3, F32))
    assert order == ["b", "a"]
    fbad = g.compile(None, [bad], copy=True)
    with pytest.raises(mgb.MegBrainError) as info:
        fbad(x=np.ones(3, F32))
    assert info.value.tracker is tracker


def test_copy_compile_multiple_times_reuses_one_translation():
    g = _graph()
    x, y = _xy(g)
    f1 = g.compile(None, mgb.copy_output(x + y), copy=True)
    f2 = g.compile(None, mgb.copy_output(x * y), copy=True)
    assert f1.graph is not f2.graph
    a, b = np.full(3, 2.0, F32), np.full(3, 3.0, F32)
    np.testing.assert_array_equal(f1(x=a, y=b), a + b)
    np.testing.assert_array_equal(f2(x=a, y=b), a * b)


# ---- inter_graph_trans_var ---------------------------------------------------------------
def test_inter_graph_trans_var():
    g = _graph(graph_opt_level=0)
    x, y = _xy(g)
    h = mgb.opr.elem.exp(x) + y
    g.compile(None, mgb.copy_output(x))  # a current function: compile(copy=True) copies
    f = g.compile(None, mgb.copy_output(h), copy=True)
    dst = f.graph
    th = mgb.inter_graph_trans_var(dst, h)
    tx = mgb.inter_graph_trans_var(dst, x)
    assert th.owner_graph is dst and th.node.owner in _seq(f)
    assert cgtools.get_type(th) == "Elemwise" and cgtools.get_type(tx) == "Host2DeviceCopy"
    assert mgb.inter_graph_trans_var(dst, th) == th  # a var of dst itself
    other = x * 9.0  # not copied
    with pytest.raises(mgb.MegBrainError, match="no counterpart"):
        mgb.inter_graph_trans_var(dst, other)


def test_inter_graph_trans_var_without_copy():
    g, g2 = _graph(), _graph()
    x, _ = _xy(g)
    with pytest.raises(mgb.MegBrainError, match="has not been setup"):
        mgb.inter_graph_trans_var(g2, x)


# ---- mark_as_input -----------------------------------------------------------------------
def test_mark_as_input():
    g = _graph()
    host = HostTensorND.from_ndarray(np.ones(3, F32))
    v = mgb.opr.host2device_copy(g, host, name="loaded")
    y = v * 2.0
    f = g.compile(None, mgb.copy_output(y))
    assert f.inputs == ()  # not a user input yet: it reads the host tensor as it is
    np.testing.assert_array_equal(f(), [2.0] * 3)
    mgb.mark_as_input(g, v)
    f = g.compile(None, mgb.copy_output(y))
    assert f.inputs == (v,)
    np.testing.assert_array_equal(f(loaded=np.full(3, 4.0, F32)), [8.0] * 3)
    fc = g.compile(None, mgb.copy_output(y), copy=True)
    assert fc.inputs == (v,)  # through a copy, too


def test_mark_as_input_checks():
    g, g2 = _graph(), _graph()
    x, _ = _xy(g)
    with pytest.raises(mgb.MegBrainError, match="another graph"):
        mgb.mark_as_input(g2, x)
    with pytest.raises(mgb.MegBrainError, match="Elemwise"):
        mgb.mark_as_input(g, x + 1.0)


# ---- _find_mutable_input through parts ---------------------------------------------------
def test_find_mutable_input_through_parts():
    g = _graph()
    x, y = _xy(g)
    f0, f1 = g.compile_multi_part(
        [(None, [mgb.copy_output(x + 1.0)]), (None, [mgb.copy_output(x + y)])]
    )
    assert f0._find_mutable_input() == {x}
    assert f1._find_mutable_input() == {y}


# ---- cgtools -----------------------------------------------------------------------------
def test_replace_vars_rebuilds_only_the_dependent_part():
    g = _graph(graph_opt_level=0)
    x, y = _xy(g)
    a = mgb.opr.elem.exp(y)  # does not depend on x
    h = (x * 2.0) + a
    (h2,) = cgtools.replace_vars([h], [(x, y)])
    assert h2 != h and h2.node.owner.inputs[1] is a.node  # the unchanged part is shared
    f = g.compile(None, [mgb.copy_output(h), mgb.copy_output(h2)])
    r, r2 = f(x=np.zeros(3, F32), y=np.ones(3, F32))
    np.testing.assert_allclose(r, np.e * np.ones(3), rtol=1e-6)
    np.testing.assert_allclose(r2, (2 + np.e) * np.ones(3), rtol=1e-6)


def test_replace_vars_refuses_a_dtype_change():
    g = _graph()
    x, _ = _xy(g)
    i = mgb.make_arg(CN, g, name="i", shape=(3,), dtype=np.int32)
    with pytest.raises(mgb.GraphError, match="replaced by"):
        cgtools.replace_vars([x + 1.0], {x: i})


def test_replace_oprs_output_count_checked():
    g = _graph()
    x, _ = _xy(g)
    single = x + 1.0
    multi = mgb.opr.cond_take(x, x, mode="LT", val=0.0)[0]
    with pytest.raises(mgb.MegBrainError, match="outputs"):
        cgtools.replace_oprs([single], {single.owner_opr: multi.owner_opr})


def test_set_priority_to_id_fixes_the_order():
    g = _graph()
    x, _ = _xy(g)
    order = []
    branches = [
        mgb.opr.callback_injector(x * float(k), lambda v, k=k: order.append(k)) for k in (3, 1, 2)
    ]
    out = branches[0] + branches[1] + branches[2]
    with opr_priority_scope(g, 10**6):
        late = mgb.opr.callback_injector(x - 1.0, lambda v: order.append("late"))
    cgtools.set_priority_to_id([out, late])
    f = g.compile(None, [out, late])
    f(x=np.ones(3, F32))
    assert order == [3, 1, 2, "late"]  # creation (id) order, then the set priority
    assert late.node.owner.priority == 10**6  # a set priority is kept
    for o in cgtools.get_oprs_seq([out]):
        assert o.opr.priority == o.id


def test_get_oprs_seq_prune_reshape_drops_shape_sources():
    g = _graph()
    x = mgb.make_arg(CN, g, name="x", shape=(2, 3))
    z = mgb.make_arg(CN, g, name="z", shape=(3, 2))
    y = x.reshape(z.shape) + 1.0  # z is read for its shape only
    full = [cgtools.get_opr_type(o) for o in cgtools.get_oprs_seq(y)]
    pruned = cgtools.get_oprs_seq(y, prune_reshape=True)
    names = [o.name for o in pruned]
    assert "z" in [o.name for o in cgtools.get_oprs_seq(y)] and "z" not in names
    assert "GetVarShape" in full and "GetVarShape" not in [cgtools.get_opr_type(o) for o in pruned]
