"""Which thread runs a function of several comp nodes: the workers when more than one comp
node has work in the run, the caller when one has (nothing to overlap, no hand-offs)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import megbrain as mgb


def _recorder():
    seen: list[str] = []

    def cb(_value):
        seen.append(threading.current_thread().name)

    return seen, cb


def test_work_on_one_node_reading_a_shared_tensor_runs_on_the_caller():
    g = mgb.comp_graph()
    x = mgb.make_shared("cpu0", value=np.arange(6, dtype="float32"), comp_graph=g)
    seen, cb = _recorder()
    y = mgb.opr.callback_injector(mgb.opr.elemwise(x.reshape(2, 3), mode="RELU",
                                                   comp_node="cpu0:7"), cb)
    f = g.compile(None, [mgb.copy_output(y * 2)])
    for _ in range(2):
        np.testing.assert_array_equal(f()[0], 2 * np.arange(6, dtype="float32").reshape(2, 3))
    assert g.current_exec._threaded  # two comp nodes, but only cpu0:7 has work
    assert seen == [threading.current_thread().name] * 2


def test_work_on_two_nodes_runs_on_their_workers():
    g = mgb.comp_graph()
    a = mgb.make_arg("cpu0", g, name="a", shape=(4,))
    seen, cb = _recorder()
    b = mgb.opr.callback_injector(mgb.opr.copy(a * 2, comp_node="cpu0:7") + 1, cb)
    f = g.compile([a], mgb.copy_output(b))
    for i in range(3):
        np.testing.assert_array_equal(f(np.full(4, i, "float32")), np.full(4, 2 * i + 1))
    assert seen == ["mgb-cpu0:7"] * 3


@pytest.mark.parametrize("level", [0b10, 0b100])
def test_async_levels_asking_for_threads_keep_them(level):
    g = mgb.comp_graph()
    g.set_option("async_exec_level", level)
    x = mgb.make_shared("cpu0", value=np.ones(3, "float32"), comp_graph=g)
    seen, cb = _recorder()
    y = mgb.opr.callback_injector(mgb.opr.elemwise(x, mode="NEGATE", comp_node="cpu0:7"), cb)
    f = g.compile(None, [mgb.copy_output(y)])
    np.testing.assert_array_equal(f()[0], -np.ones(3))
    assert seen == ["mgb-cpu0:7"]


def test_error_of_an_inline_part_names_the_operator():
    g = mgb.comp_graph()
    x = mgb.make_shared("cpu0", value=np.ones(4, "float32"), comp_graph=g)
    z = mgb.make_shared("cpu0", value=np.zeros(4, "float32"), comp_graph=g)
    chk = mgb.opr.assert_equal(mgb.opr.copy(x, comp_node="cpu0:7"), z, name="inline_check")
    f = g.compile(None, mgb.copy_output(chk + 1))
    with pytest.raises(mgb.MegBrainError, match="inline_check"):
        f()
    z.set_value(np.ones(4, "float32"))
    np.testing.assert_array_equal(f(), np.full(4, 2))
