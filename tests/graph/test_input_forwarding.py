"""A graph input on CPU is read in place: Host2DeviceCopy's output is a read-only view of the
host tensor in the static plan (no copy step, no arena bytes), never written by an operator,
re-planned when the host tensor's memory changes, and copied where a view would be wrong (an
input given a shape but no value, eager values)."""

from __future__ import annotations

import numpy as np
import pytest

import megbrain as mgb
from megbrain.errors import MegBrainError

CN = "cpu0"


def _kinds(g) -> dict:
    return {d["name"]: d["kind"] for d in g.current_exec.mem_alloc_info()}


def _host(x) -> np.ndarray:
    """The memory of input ``x``'s host tensor (what its Host2DeviceCopy holds)."""
    return x.node.owner.tensor.as_ndarray()


def _step_types(f) -> list[str]:
    return [opr.type_name for opr in f._func._plan.step_oprs[0]]


def test_input_is_a_view_of_the_host_tensor_and_has_no_copy_step():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(4, 8))
    f = g.compile([x], mgb.copy_output(mgb.opr.elem.exp(x) + 1.0))
    xv = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    np.testing.assert_allclose(f(xv), np.exp(xv) + 1.0, rtol=1e-6)
    assert "Host2DeviceCopy" not in _step_types(f)
    assert _kinds(g)["x"] == "forward"
    plan = f._func._plan
    (h2d,) = [v for v in plan.arrays if v.owner.type_name == "Host2DeviceCopy"]
    assert np.shares_memory(plan.arrays[h2d], _host(x))
    # a later call's value reaches the same plan through the host tensor
    yv = xv * 2.0
    np.testing.assert_allclose(f(yv), np.exp(yv) + 1.0, rtol=1e-6)
    assert f._func._plan is plan


@pytest.mark.parametrize("borrow", [False, True])
def test_no_operator_writes_into_the_input(borrow):
    """Elementwise chains that would run in place on a planned input leave the host tensor
    (and a borrowed caller's array) as fed."""
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(64,))
    y = mgb.opr.elem.exp(x * -1.0 + 2.0) * 3.0
    f = g.compile([x], mgb.copy_output(y))
    if borrow:
        f.enable_borrow_on_cpu(True)
    xv = np.arange(64, dtype=np.float32) / 64
    kept = xv.copy()
    for _ in range(2):
        np.testing.assert_allclose(f(xv), np.exp(-kept + 2.0) * 3.0, rtol=1e-6)
        np.testing.assert_array_equal(xv, kept)
        np.testing.assert_array_equal(_host(x), kept)


def test_a_new_shape_replans_onto_the_new_memory():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(2, 3))
    f = g.compile([x], mgb.copy_output(x * 2.0))
    np.testing.assert_array_equal(f(np.ones((2, 3), np.float32)), np.full((2, 3), 2.0))
    first = f._func._plan
    big = np.arange(20, dtype=np.float32).reshape(4, 5)
    np.testing.assert_array_equal(f(big), big * 2.0)
    assert f._func._plan is not first
    np.testing.assert_array_equal(f(big + 1), (big + 1) * 2.0)


def test_shape_only_input_still_refuses_to_run():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    f = g.compile(None, mgb.copy_output(x + 1.0))
    with pytest.raises(MegBrainError, match="given a shape but never a value"):
        f()
    x.set_value(np.ones(3, np.float32))
    np.testing.assert_array_equal(f(), np.full(3, 2.0))


def test_eager_value_is_a_copy():
    """An eager graph's input value is its own memory: a value taken before the input is set
    again (here a reshape, a view of the input's value) keeps the old numbers."""
    g = mgb.comp_graph()
    g.set_option("eager_evaluation", True)
    x = mgb.make_arg(CN, g, name="x", value=np.ones(4, np.float32))
    assert not np.shares_memory(x.node.eager_value, _host(x))
    r = x.reshape(2, 2)
    taken = r.node.eager_value
    y = x * 2.0
    x.set_value(np.full(4, 3.0, np.float32))
    np.testing.assert_array_equal(np.asarray(y.eager_val.get_value()), np.full(4, 6.0))
    np.testing.assert_array_equal(taken, np.ones((2, 2)))
