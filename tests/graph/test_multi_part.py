"""Multi-part compile (``compile_multi_part``): each part runs only what its
outputs need and reuses what earlier parts computed; parts run in order; priorities,
callbacks, dynamic memory, errors and inputs per part."""

from __future__ import annotations

import numpy as np
import pytest

import megbrain as mgb
from megbrain.api.config import exc_opr_tracker_scope, opr_priority_scope

CN = "cpu0"
F32 = np.float32


def _graph(**opts):
    g = mgb.comp_graph(check_env_var=False)
    g.set_option("log_level", 0)
    for k, v in opts.items():
        g.set_option(k, v)
    return g


class Counter:
    """Counts runs of vars wrapped by :meth:`wrap` (callback_injector), by key."""

    def __init__(self):
        self.n: dict = {}
        self.order: list = []

    def wrap(self, var, key):
        def cb(_):
            self.n[key] = self.n.get(key, 0) + 1
            self.order.append(key)

        return mgb.opr.callback_injector(var, cb)


def _two_parts():
    g = _graph()
    x = mgb.make_arg(CN, g, name="x", shape=(4,))
    cnt = Counter()
    a = cnt.wrap(mgb.opr.elem.exp(x), "a")
    b = cnt.wrap(a * 2.0, "b")
    c = cnt.wrap(b + a, "c")
    f0, f1 = g.compile_multi_part([([x], [mgb.copy_output(a)]), (None, [mgb.copy_output(c)])])
    return g, x, cnt, f0, f1


XV = np.arange(4, dtype=F32)


def test_parts_run_what_they_need_and_reuse_earlier_values():
    g, x, cnt, f0, f1 = _two_parts()
    (a,) = f0(XV)
    assert cnt.n == {"a": 1}  # b and c are not computed by part 0
    np.testing.assert_allclose(a, np.exp(XV), rtol=1e-6)
    (c,) = f1()
    assert cnt.n == {"a": 1, "b": 1, "c": 1}  # a reused, not recomputed
    np.testing.assert_allclose(c, 3 * np.exp(XV), rtol=1e-6)


def test_part_out_of_order_raises():
    g, x, cnt, f0, f1 = _two_parts()
    with pytest.raises(mgb.GraphError, match="out of order"):
        f1()
    f0(XV)
    f1()
    with pytest.raises(mgb.GraphError, match="out of order"):
        f1()  # the sequence ended: part 0 comes next


def test_rerunning_part_0_restarts_the_sequence():
    g, x, cnt, f0, f1 = _two_parts()
    f0(XV)
    f0(XV + 1)  # cancels the first sequence
    (c,) = f1()
    np.testing.assert_allclose(c, 3 * np.exp(XV + 1), rtol=1e-6)
    assert cnt.n == {"a": 2, "b": 1, "c": 1}


def test_three_parts_and_skipping_one():
    g = _graph()
    x = mgb.make_arg(CN, g, name="x", shape=(2,))
    y1, y2, y3 = x + 1.0, x * 3.0, x - 4.0
    fs = g.compile_multi_part([(None, [mgb.copy_output(v)]) for v in (y1, y2, y3)])
    fs[0](x=np.ones(2, F32))
    with pytest.raises(mgb.GraphError, match="expected part 1"):
        fs[2]()
    assert [f()[0][0] for f in fs[1:]] == [3.0, -3.0]


def test_priorities_honoured_within_a_part():
    g = _graph()
    x = mgb.make_arg(CN, g, name="x", shape=(2,))
    cnt = Counter()
    early = x * 2.0
    a = cnt.wrap(x + 1.0, "low")
    with opr_priority_scope(g, -5):
        b = cnt.wrap(x - 1.0, "high")
    f0, f1 = g.compile_multi_part([(None, [mgb.copy_output(early)]), (None, [a, b])])
    f0(x=np.ones(2, F32))
    f1()
    assert cnt.order == ["high", "low"]
    seq1 = [o for o in f1._func.iter_opr_seq() if o.type_name == "CallbackInjector"]
    assert seq1[0].priority == -5


def test_callbacks_bound_to_their_part():
    g = _graph()
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    a = x * 2.0
    b = a + 1.0
    seen = []
    f0, f1 = g.compile_multi_part(
        [
            (None, [(a, lambda v: seen.append(("part0", v.get_value().copy())))]),
            (None, [(b, lambda v: seen.append(("part1", v.get_value().copy()))),
                    (a, lambda v: seen.append(("part1-a", v.get_value().copy())))]),
        ]
    )  # fmt: skip
    f0(x=np.ones(3, F32))
    assert [k for k, _ in seen] == ["part0"]
    f1()
    assert sorted(k for k, _ in seen) == ["part0", "part1", "part1-a"]
    vals = dict(seen)
    np.testing.assert_array_equal(vals["part1-a"], [2.0] * 3)  # a from part 0, called by part 1
    np.testing.assert_array_equal(vals["part1"], [3.0] * 3)


def test_dynamic_memory_freed_after_last_part():
    g = _graph()
    x = mgb.make_arg(CN, g, name="x", shape=(6,))
    taken, _ = mgb.opr.cond_take(x, x, mode="LT", val=2.0)
    total = taken.sum()
    f0, f1 = g.compile_multi_part([(None, [taken]), (None, [mgb.copy_output(total)])])
    core = f0._func.core
    f0(x=np.arange(6, dtype=F32))
    assert taken.node in core._slots  # the dynamic var lives until its reader's part ran
    (s,) = f1()
    assert float(s[0]) == 1.0  # 0 + 1
    assert not core._slots


def test_error_in_a_part_surfaces_on_wait():
    g = _graph()
    x = mgb.make_arg(CN, g, name="x", shape=(2,))
    tracker = object()
    with exc_opr_tracker_scope(g, tracker):
        bad = mgb.opr.assert_equal(x, x + 1.0)
    f0, f1 = g.compile_multi_part([(None, [mgb.copy_output(x * 2.0)]), (None, [bad])])
    f0(x=np.zeros(2, F32))
    f1.disable_auto_wait()
    f1.execute()
    with pytest.raises(mgb.MegBrainError, match="AssertEqual") as info:
        f1.wait()
    assert info.value.tracker is tracker
    with pytest.raises(mgb.GraphError, match="out of order"):
        f1()  # the failed sequence ended
    f0(x=np.zeros(2, F32))  # part 0 still runs
    with pytest.raises(mgb.MegBrainError, match="AssertEqual"):
        f1.execute().wait()


def test_inputs_per_part():
    g = _graph()
    x = mgb.make_arg(CN, g, name="x", shape=(2,))
    y = mgb.make_arg(CN, g, name="y", shape=(2,))
    a = x * 2.0
    f0, f1 = g.compile_multi_part([([x], [mgb.copy_output(a)]), (None, [mgb.copy_output(a + y)])])
    assert f0.inputs == (x,)
    assert f1.inputs == (y,)  # x is read by part 0 only
    f0(np.ones(2, F32))
    np.testing.assert_array_equal(f1(y=np.full(2, 5.0, F32))[0], [7.0, 7.0])


def test_training_step_in_two_parts():
    """Loss in part 0, gradients (VirtualGrad, expanded at compile) and updates in part 1:
    the forward pass runs once per step."""
    g = _graph()
    x = mgb.make_arg(CN, g, name="x", shape=(3, 2))
    w = mgb.make_shared(CN, value=np.ones((2,), F32), comp_graph=g, name="w")
    cnt = Counter()
    h = cnt.wrap(x * w, "fwd")
    loss = (h * h).sum()
    gw = mgb.grad(loss, w)
    assert gw.node.owner.type_name == "VirtualGrad"
    up = mgb.opr.add_update(w, gw, beta=-0.1)
    f0, f1 = g.compile_multi_part([(None, [mgb.copy_output(loss)]), (None, [up])])
    xv = np.arange(6, dtype=F32).reshape(3, 2)
    for step in range(2):
        wv = w.get_value().copy()
        (lv,) = f0(x=xv)
        np.testing.assert_allclose(lv, [((xv * wv) ** 2).sum()], rtol=1e-5)
        f1()
        np.testing.assert_allclose(
            w.get_value(), wv - 0.1 * (2 * xv * xv * wv).sum(axis=0), rtol=1e-5
        )
        assert cnt.n == {"fwd": step + 1}


def test_two_comp_nodes_async_parts():
    g = _graph(async_exec_level=0b10)
    x = mgb.make_arg(CN, g, name="x", shape=(4,))
    a = mgb.opr.copy(x * 2.0, comp_node="cpu1")
    b = mgb.opr.copy(a + 1.0, comp_node=CN)
    f0, f1 = g.compile_multi_part([(None, [mgb.copy_output(a)]), (None, [mgb.copy_output(b)])])
    for k in range(3):
        (av,) = f0(x=np.full(4, k, F32))
        (bv,) = f1()
        np.testing.assert_array_equal(av, [2.0 * k] * 4)
        np.testing.assert_array_equal(bv, [2.0 * k + 1] * 4)


def test_recompile_invalidates_every_part():
    g, x, cnt, f0, f1 = _two_parts()
    f0(XV)
    g.compile(None, [mgb.copy_output(x + 1.0)])
    with pytest.raises(mgb.GraphError, match="invalidated"):
        f0(XV)
    with pytest.raises(mgb.GraphError, match="invalidated"):
        f1()


def test_multi_part_on_eager_graph_refused():
    g = _graph(eager_evaluation=1)
    x = mgb.make_arg(CN, g, name="x", value=np.ones(2, F32))
    with pytest.raises(mgb.MegBrainError, match="eager"):
        g.compile_multi_part([(None, [x + 1.0]), (None, [x * 2.0])])
