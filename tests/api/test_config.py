"""``mgb.config``: priority and tracker scopes, extra var deps, device maps."""

from __future__ import annotations

import numpy as np
import pytest

import megbrain as mgb
from megbrain.device import comp_node as _cn

CN = "cpu0"


def _order_graph():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(2,))
    order = []

    def tag(name):
        return lambda v: order.append(name)

    return g, x, order, tag


def _run(g, x, outs):
    f = g.compile([x], outs)
    f(np.ones(2))


# ---- opr_priority_scope -----------------------------------------------------------------------
def test_default_order_is_creation_order():
    g, x, order, tag = _order_graph()
    p = mgb.opr.callback_injector(x, tag("first"))
    q = mgb.opr.callback_injector(x + 1, tag("second"))
    _run(g, x, [p + q])
    assert order == ["first", "second"]


def test_priority_scope_changes_order():
    g, x, order, tag = _order_graph()
    with mgb.config.opr_priority_scope(g, 10):
        p = mgb.opr.callback_injector(x, tag("late"))
    with mgb.config.opr_priority_scope(g, -10):
        q = mgb.opr.callback_injector(x + 1, tag("early"))
    _run(g, x, [p + q])
    assert order == ["early", "late"]


def test_priority_extremes_and_plain():
    g, x, order, tag = _order_graph()
    with mgb.config.opr_priority_scope(g, mgb.config.LOWEST_PRIORITY):
        a = mgb.opr.callback_injector(x, tag("lowest"))
    b = mgb.opr.callback_injector(x * 2, tag("plain"))
    with mgb.config.opr_priority_scope(g, mgb.config.HIGHEST_PRIORITY):
        c = mgb.opr.callback_injector(x * 3, tag("highest"))
    _run(g, x, [a + b + c])
    assert order == ["highest", "plain", "lowest"]
    assert mgb.config.HIGHEST_PRIORITY == -(2**31 - 1)


def test_priority_respects_dependencies():
    g, x, order, tag = _order_graph()
    p = mgb.opr.callback_injector(x, tag("producer"))
    with mgb.config.opr_priority_scope(g, -100):
        q = mgb.opr.callback_injector(p * 2, tag("consumer"))
    _run(g, x, [q])
    assert order == ["producer", "consumer"]


def test_nested_priority_scopes_innermost_wins_and_restore():
    g, x, order, tag = _order_graph()
    with mgb.config.opr_priority_scope(g, -10):
        with mgb.config.opr_priority_scope(g, 5):
            inner = mgb.opr.callback_injector(x, tag("inner"))
        outer = mgb.opr.callback_injector(x * 2, tag("outer"))
    plain = mgb.opr.callback_injector(x * 3, tag("plain"))
    assert inner.owner_opr.opr.priority == 5
    assert outer.owner_opr.opr.priority == -10
    assert plain.owner_opr.opr.priority == 0
    _run(g, x, [inner + outer + plain])
    assert order == ["outer", "plain", "inner"]


def test_priority_scope_keeps_min_of_existing():
    g, x, order, tag = _order_graph()
    with mgb.config.opr_priority_scope(g, -3):
        a = x * 7
    assert a.owner_opr.opr.priority == -3
    with mgb.config.opr_priority_scope(g, 4):
        b = x * 7  # deduplicated: the existing operator is not re-inserted
    assert b == a and a.owner_opr.opr.priority == -3


def test_scopes_are_per_graph():
    g1, x1, _, _ = _order_graph()
    g2, x2, _, _ = _order_graph()
    with mgb.config.opr_priority_scope(g1, 7):
        a = x1 + 1
        b = x2 + 1
    assert a.owner_opr.opr.priority == 7 and b.owner_opr.opr.priority == 0


# ---- exc_opr_tracker_scope --------------------------------------------------------------------
class _Tracker:
    def __repr__(self):
        return "<my tracker>"


def test_tracker_on_raised_error():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(2,))
    tracker = _Tracker()

    def bad(v):
        raise ValueError("tracked failure")

    with mgb.config.exc_opr_tracker_scope(g, tracker):
        y = mgb.opr.callback_injector(x, bad)
    z = y + 1  # outside the scope: no tracker
    f = g.compile([x], mgb.copy_output(z))
    with pytest.raises(ValueError, match="tracked failure") as ei:  # the callback's own error
        f(np.ones(2))
    assert "Exception tracker:\n  <my tracker>" in "\n".join(ei.value.__notes__)
    assert mgb.config.get_opr_tracker(g, y.id)[1] is tracker
    assert mgb.config.get_opr_tracker(g, z.id) is None


def test_tracker_on_megbrain_error_from_kernel():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(2,))
    tracker = _Tracker()
    with mgb.config.exc_opr_tracker_scope(g, tracker):
        y = mgb.opr.assert_equal(x, x * 2)
    f = g.compile([x], mgb.copy_output(y))
    with pytest.raises(mgb.MegBrainError) as ei:
        f(np.ones(2))
    assert ei.value.tracker is tracker


def test_nested_tracker_scopes():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(2,))
    with mgb.config.exc_opr_tracker_scope(g, "outer"):
        a = x + 1
        with mgb.config.exc_opr_tracker_scope(g, "inner"):
            b = x + 2
        c = x + 3
    assert a.owner_opr.opr.tracker == "outer"
    assert b.owner_opr.opr.tracker == "inner"
    assert c.owner_opr.opr.tracker == "outer"
    assert (x + 4).owner_opr.opr.tracker is None


# ---- add_extra_vardep -------------------------------------------------------------------------
def test_add_extra_vardep_runs_dep():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    ran = []
    dep = mgb.opr.callback_injector(x * 3, lambda v: ran.append(v.get_value()))
    out = x + 1
    f = g.compile([x], mgb.copy_output(out))
    f(np.ones(3))
    assert ran == []  # not needed by out
    mgb.config.add_extra_vardep(out, dep)
    f = g.compile([x], mgb.copy_output(out))
    np.testing.assert_array_equal(f(np.ones(3)), [2, 2, 2])
    assert len(ran) == 1
    np.testing.assert_array_equal(ran[0], [3, 3, 3])


def test_add_extra_vardep_on_intermediate_var():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    ran = []
    mid = x * 2
    dep = mgb.opr.callback_injector(x - 1, lambda v: ran.append(1))
    mgb.config.add_extra_vardep(mid, dep)
    f = g.compile([x], mgb.copy_output(mid + 1))  # mid is computed: so is dep
    f(np.ones(3))
    assert ran == [1]


def test_add_extra_vardep_needs_same_graph():
    g1, g2 = mgb.comp_graph(), mgb.comp_graph()
    a = mgb.make_arg(CN, g1, name="a", shape=(1,))
    b = mgb.make_arg(CN, g2, name="b", shape=(1,))
    with pytest.raises(mgb.MegBrainError):
        mgb.config.add_extra_vardep(a, b)


# ---- devices ----------------------------------------------------------------------------------
@pytest.fixture
def reset_devices():
    yield
    _cn._reset_device_config()


@pytest.mark.parametrize(
    "loc,expect",
    [
        ("cpu0", (2, 0, 0)),
        ("cpu3:2", (2, 3, 2)),
        ("gpu1", (1, 1, 0)),
        ("xpux", (0, -1, 0)),
        ("cpux", (2, -1, 0)),
        ("xpu2:1", (0, 2, 1)),
    ],
)
def test_parse_locator(loc, expect):
    assert mgb.config.parse_locator(loc) == expect


def test_parse_locator_bad():
    with pytest.raises(mgb.MegBrainError):
        mgb.config.parse_locator("tpu0")


def test_set_device_map_cpu(reset_devices):
    mgb.config.set_device_map(7, 2, "CPU")
    cn = mgb.CompNode.load("cpu7")
    assert cn.locator_physical[:2] == (2, 2)
    assert cn.locator_logical[:2] == (2, 7)
    mgb.config.set_device_map("cpu6", "cpu1")  # the type comes from the strings
    assert mgb.CompNode.load("cpu6").locator_physical[:2] == (2, 1)
    # a graph on the mapped node runs
    g = mgb.comp_graph()
    x = mgb.make_arg("cpu7", g, name="x", shape=(2,))
    f = g.compile([x], mgb.copy_output(x + 1))
    np.testing.assert_array_equal(f(np.ones(2)), [2, 2])


def test_set_default_device(reset_devices):
    mgb.config.set_default_device("cpu3")
    assert mgb.CompNode.load("xpux").locator_physical[:2] == (2, 3)


def test_misc_config():
    assert mgb.config.max_size_t() == 2**64 - 1
    assert mgb.config.is_compiled_with_cuda() is False
    reg = mgb.config.dump_registered_oprs()
    assert "Elemwise" in reg.values() and "AddUpdate" in reg.values()
    assert mgb.config.get_device_count("cpu") >= 1
