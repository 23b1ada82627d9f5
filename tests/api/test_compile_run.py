"""CompGraph.compile and AsyncExec: inputs, outputs, waits, errors."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import megbrain as mgb

CN = "cpu0"


def _ab(cn=CN, shape=(3,)):
    g = mgb.comp_graph()
    a = mgb.make_arg(cn, g, name="a", shape=shape)
    b = mgb.make_arg(cn, g, name="b", shape=shape)
    return g, a, b


def _f32(*xs):
    return [np.asarray(x, np.float32) for x in xs]


# ---- arguments --------------------------------------------------------------------------------
def test_positional_inputs():
    g, a, b = _ab()
    f = g.compile([a, b], mgb.copy_output(a - b))
    np.testing.assert_array_equal(f(np.ones(3), np.arange(3)), [1, 0, -1])
    assert f.inputs == (a, b)


def test_keyword_inputs_by_var_name():
    g, a, b = _ab()
    f = g.compile(None, mgb.copy_output(a - b))
    np.testing.assert_array_equal(f(b=np.arange(3), a=np.ones(3)), [1, 0, -1])
    assert {v.name for v in f.inputs} == {"a", "b"}


def test_keyword_missing_name_asserts():
    g, a, b = _ab()
    f = g.compile(None, mgb.copy_output(a - b))
    with pytest.raises(AssertionError, match="b"):
        f(a=np.ones(3))


def test_keyword_extra_key_warns_once():
    g, a, b = _ab()
    f = g.compile(None, mgb.copy_output(a + b))
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        f(a=np.ones(3), b=np.ones(3), zz=1)
        f(a=np.ones(3), b=np.ones(3), zz=1)
    msgs = [str(w.message) for w in rec if "zz" in str(w.message)]
    assert len(msgs) == 1


def test_positional_without_inputs_rejected():
    g, a, b = _ab()
    f = g.compile(None, mgb.copy_output(a + b))
    with pytest.raises(mgb.MegBrainError):
        f(np.ones(3), np.ones(3))


def test_positional_count_checked():
    g, a, b = _ab()
    f = g.compile([a, b], mgb.copy_output(a + b))
    with pytest.raises(TypeError):
        f(np.ones(3))


def test_call_without_args_uses_current_values():
    g = mgb.comp_graph()
    a = mgb.make_arg(CN, g, name="a", value=np.arange(3))
    f = g.compile(None, mgb.copy_output(a * 2))
    np.testing.assert_array_equal(f(), [0, 2, 4])
    a.set_value(np.ones(3))
    np.testing.assert_array_equal(f(), [2, 2, 2])


def test_shapes_change_between_calls():
    g, a, b = _ab()
    f = g.compile([a, b], [mgb.copy_output(a + b), mgb.copy_output((a * b).sum())])
    for n in (3, 7, 1, 7, 3):
        av, bv = _f32(np.arange(n), np.arange(n) + 1)
        s, t = f(av, bv)
        np.testing.assert_array_equal(s, av + bv)
        np.testing.assert_allclose(t.reshape(-1), [(av * bv).sum()])


def test_2d_shapes_change():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(2, 3))
    w = mgb.make_shared(CN, value=np.ones((3, 4)), comp_graph=g)
    f = g.compile([x], mgb.copy_output(mgb.opr.matrix_mul(x, w)))
    for m in (2, 5):
        xv = np.arange(3 * m, dtype=np.float32).reshape(m, 3)
        np.testing.assert_allclose(f(xv), xv @ np.ones((3, 4)))


# ---- outputs ----------------------------------------------------------------------------------
def test_single_copy_output_unwrapped_vs_list():
    g, a, b = _ab()
    f1 = g.compile([a, b], mgb.copy_output(a + b))
    r = f1(np.ones(3), np.ones(3))
    assert isinstance(r, np.ndarray)
    f2 = g.compile([a, b], [mgb.copy_output(a + b)])
    r = f2(np.ones(3), np.ones(3))
    assert isinstance(r, list) and len(r) == 1
    np.testing.assert_array_equal(r[0], [2, 2, 2])


def test_no_copy_output_returns_none():
    g, a, b = _ab()
    seen = []
    f = g.compile([a, b], [(a + b, lambda v: seen.append(v.get_value()))])
    assert f(np.ones(3), np.ones(3)) is None
    np.testing.assert_array_equal(seen[0], [2, 2, 2])
    f = g.compile([a, b], [a + b])  # compute only
    assert f(np.ones(3), np.ones(3)) is None


def test_output_values_are_fresh_arrays():
    g, a, b = _ab()
    f = g.compile([a, b], mgb.copy_output(a + b))
    r1 = f(np.ones(3), np.ones(3))
    r2 = f(np.zeros(3), np.zeros(3))
    np.testing.assert_array_equal(r1, [2, 2, 2])
    np.testing.assert_array_equal(r2, [0, 0, 0])


def test_borrow_mem_output():
    g, a, b = _ab()
    f = g.compile([a, b], [mgb.copy_output(a + b, borrow_mem=True)])
    (r,) = f(np.ones(3), np.ones(3))
    np.testing.assert_array_equal(r, [2, 2, 2])


def test_duplicated_copy_output():
    g, a, b = _ab()
    c = a + b
    f = g.compile([a, b], [mgb.copy_output(c), mgb.copy_output(a), mgb.copy_output(c)])
    r = f(np.ones(3), np.ones(3))
    assert len(r) == 3
    np.testing.assert_array_equal(r[0], r[2])
    assert f.available_outputs == (c, a)


def test_outputs_and_available_outputs():
    g, a, b = _ab()
    c, d = a + b, a * b
    f = g.compile([a, b], [mgb.copy_output(c), mgb.copy_output(d)])
    assert f.available_outputs == (c, d)
    assert f.outputs == (c, d)
    f.outputs = [d, c, d]
    r = f(np.full(3, 2), np.full(3, 3))
    assert [x[0] for x in r] == [6, 5, 6]
    f.outputs = [c]
    r = f(np.full(3, 2), np.full(3, 3))
    assert isinstance(r, list) and r[0][0] == 5
    with pytest.raises(mgb.MegBrainError):
        f.outputs = [a - b]


def test_outputs_are_user_vars_after_graph_copy():
    g, a, b = _ab()
    c, d = a + b, a * b
    f = g.compile([a, b], [mgb.copy_output(c), mgb.copy_output(d)], copy=True)
    assert f.available_outputs == (c, d) and f.outputs == (c, d)
    f.outputs = [d, c]
    r = f(np.full(3, 2), np.full(3, 3))
    assert [x[0] for x in r] == [6, 5]


def test_inputs_setter():
    g, a, b = _ab()
    c = mgb.make_arg(CN, g, name="c", shape=(3,))
    f = g.compile([a, b], mgb.copy_output(a - b))
    f.inputs = [b, a]
    np.testing.assert_array_equal(f(np.ones(3), np.zeros(3)), [-1, -1, -1])
    with pytest.raises(TypeError):
        f.inputs = [a, b, c]  # c is not an input of this function
    with pytest.raises(AssertionError):
        f.inputs = [a]  # b missing
    f.inputs = None  # keyword only
    with pytest.raises(mgb.MegBrainError):
        f(np.ones(3), np.zeros(3))
    np.testing.assert_array_equal(f(a=np.ones(3), b=np.zeros(3)), [1, 1, 1])


def test_inputs_only_those_needed():
    g, a, b = _ab()
    mgb.make_arg(CN, g, name="unused", shape=(3,))
    f = g.compile(None, mgb.copy_output(a * 2))
    assert f.inputs == (a,)
    assert f._find_mutable_input() == {a}
    f2 = g.compile(None, mgb.copy_output(a + b))
    assert f2._find_mutable_input() == {a, b}


def test_duplicated_input_names_assert():
    g = mgb.comp_graph()
    a = mgb.make_arg(CN, g, name="same", shape=(2,))
    b = mgb.make_arg(CN, g, name="same", shape=(2,))
    f = g.compile(None, mgb.copy_output(a + b))
    with pytest.raises(AssertionError, match="same"):
        f.inputs  # noqa: B018


# ---- async and waiting ------------------------------------------------------------------------
def test_disable_auto_wait_returns_savers():
    g, a, b = _ab()
    f = g.compile([a, b], [mgb.copy_output(a + b), mgb.copy_output(a * b)])
    f.disable_auto_wait()
    r = f(np.full(3, 2), np.full(3, 3))
    assert all(isinstance(s, mgb.FuncOutputSaver) for s in r)
    assert f.wait() is f
    np.testing.assert_array_equal(r[0].get(), [5, 5, 5])
    np.testing.assert_array_equal(r[1].get(), [6, 6, 6])
    single = g.compile([a, b], mgb.copy_output(a - b))
    single.disable_auto_wait()
    (s,) = single(np.ones(3), np.ones(3))  # the savers, not unwrapped
    single.wait()
    np.testing.assert_array_equal(s.get(), [0, 0, 0])


def test_func_output_saver_before_call():
    with pytest.raises(mgb.MegBrainError, match="unwaited async func"):
        mgb.FuncOutputSaver().get()


def test_prev_exec_time():
    g, a, b = _ab()
    f = g.compile([a, b], mgb.copy_output(a + b))
    f(np.ones(3), np.ones(3))
    assert f.prev_exec_time > 0


def test_callbefore_and_callback_func():
    g, a, b = _ab()
    f = g.compile([a, b], mgb.copy_output(a + b))
    order = []
    f.callbefore_func = lambda: order.append("before")
    f.callback_func = lambda: order.append("after")
    f(np.ones(3), np.ones(3))
    assert order == ["before", "after"]


def test_dump_json():
    g, a, b = _ab()
    f = g.compile([a, b], mgb.copy_output(a + b))
    d = f.dump()
    json.dumps(d)  # JSON-serializable
    assert isinstance(d, dict)
    text = json.dumps(d)
    assert "Host2DeviceCopy" in text and "Elemwise" in text


def test_recompile_invalidates_old_function():
    g, a, b = _ab()
    f1 = g.compile([a, b], mgb.copy_output(a + b))
    np.testing.assert_array_equal(f1(np.ones(3), np.ones(3)), [2, 2, 2])
    f2 = g.compile([a, b], mgb.copy_output(a * b))
    with pytest.raises(mgb.GraphError):
        f1(np.ones(3), np.ones(3))
    np.testing.assert_array_equal(f2(np.ones(3), np.full(3, 3)), [3, 3, 3])
    # another graph's function is untouched
    g2, c, d = _ab()
    f3 = g2.compile([c, d], mgb.copy_output(c + d))
    f3(np.ones(3), np.ones(3))
    np.testing.assert_array_equal(f2(np.ones(3), np.full(3, 3)), [3, 3, 3])


def test_compile_outonly():
    g, a, b = _ab()
    f = g.compile_outonly(a + b, inputs=[a, b])
    np.testing.assert_array_equal(f(np.ones(3), np.ones(3)), [2, 2, 2])
    f = g.compile_outonly([a + b, a - b], inputs=[a, b])
    r = f(np.ones(3), np.ones(3))
    assert len(r) == 2


# ---- errors -----------------------------------------------------------------------------------
def test_kernel_error_names_operator_and_function_survives():
    g, a, b = _ab()
    chk = mgb.opr.assert_equal(a, b, name="my_check")
    f = g.compile([a, b], mgb.copy_output(chk * 2))
    np.testing.assert_array_equal(f(np.ones(3), np.ones(3)), [2, 2, 2])
    with pytest.raises(mgb.MegBrainError, match="my_check"):
        f(np.ones(3), np.zeros(3))
    np.testing.assert_array_equal(f(np.full(3, 2), np.full(3, 2)), [4, 4, 4])


def test_runtime_shape_error_names_operator():
    g, a, b = _ab()
    c = a + b
    c.rename("the_sum")
    f = g.compile([a, b], mgb.copy_output(c))
    with pytest.raises(mgb.MegBrainError, match="the_sum|ADD"):
        f(np.ones(3), np.ones(4))
    np.testing.assert_array_equal(f(np.ones(2), np.ones(2)), [2, 2])


def test_python_error_in_opr_reraised_with_operator_note():
    g, a, b = _ab()

    def bad(v):
        raise ValueError("boom")

    c = mgb.opr.callback_injector(a, bad, name="injector")
    f = g.compile([a, b], mgb.copy_output(c + b))
    with pytest.raises(ValueError, match="boom") as ei:
        f(np.ones(3), np.ones(3))
    assert "injector" in "".join(ei.value.__notes__)


def test_input_without_value_raises():
    g, a, b = _ab()
    x = mgb.make_arg(CN, g, name="novalue")
    f = g.compile(None, mgb.copy_output(x + 1))
    with pytest.raises(mgb.MegBrainError):
        f()


# ---- several comp nodes -----------------------------------------------------------------------
def test_two_comp_nodes_async():
    g = mgb.comp_graph()
    a = mgb.make_arg("cpu0", g, name="a", shape=(16,))
    b = mgb.make_arg("cpu1", g, name="b", shape=(16,))
    a2 = mgb.opr.copy(a * 2, comp_node="cpu1")
    c = a2 + b  # on cpu1
    d = mgb.opr.copy(c, comp_node="cpu0") - a  # back on cpu0
    e = (a * a).sum()  # on cpu0, independent of cpu1
    f = g.compile([a, b], [mgb.copy_output(c), mgb.copy_output(d), mgb.copy_output(e)])
    assert c.comp_node == mgb.comp_node("cpu1") and d.comp_node == mgb.comp_node("cpu0")
    rng = np.random.default_rng(0)
    for _ in range(20):
        av, bv = _f32(rng.standard_normal(16), rng.standard_normal(16))
        rc, rd, re_ = f(av, bv)
        np.testing.assert_allclose(rc, 2 * av + bv, rtol=1e-6)
        np.testing.assert_allclose(rd, av + bv, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(re_.reshape(-1), [(av * av).sum()], rtol=1e-5)


def test_two_comp_nodes_cross_node_read_keeps_chunk_alive():
    import time

    g = mgb.comp_graph()
    a = mgb.make_arg("cpu0", g, name="a", shape=(16,))
    b = mgb.make_arg("cpu1", g, name="b", shape=(16,))
    slow = mgb.opr.callback_injector(a, lambda v: time.sleep(0.01))  # delays cpu0
    c = mgb.opr.copy(a, comp_node="cpu1") + b  # on cpu1, read by cpu0 below
    d = mgb.opr.copy(c, comp_node="cpu0") - slow
    e = (b * b).sum()  # on cpu1 after c: may take c's chunk once c's last reader ran
    f = g.compile([a, b], [mgb.copy_output(d), mgb.copy_output(e)])
    av, bv = _f32(np.arange(16), np.ones(16))
    for _ in range(3):
        rd, re_ = f(av, bv)
        np.testing.assert_array_equal(rd, bv)
        assert re_.reshape(-1)[0] == 16


def test_two_comp_nodes_no_auto_wait():
    g = mgb.comp_graph()
    a = mgb.make_arg("cpu0", g, name="a", shape=(4,))
    b = mgb.make_arg("cpu1", g, name="b", shape=(4,))
    c = mgb.opr.copy(a, comp_node="cpu1") * b
    f = g.compile([a, b], mgb.copy_output(c))
    f.disable_auto_wait()
    for i in range(5):
        (s,) = f(np.full(4, i), np.full(4, 2))
        f.wait()
        np.testing.assert_array_equal(s.get(), np.full(4, 2 * i))


def test_two_comp_nodes_error_surfaces():
    g = mgb.comp_graph()
    a = mgb.make_arg("cpu0", g, name="a", shape=(4,))
    b = mgb.make_arg("cpu1", g, name="b", shape=(4,))
    chk = mgb.opr.assert_equal(mgb.opr.copy(a, comp_node="cpu1"), b, name="xnode_check")
    f = g.compile([a, b], mgb.copy_output(chk + 1))
    with pytest.raises(mgb.MegBrainError, match="xnode_check"):
        f(np.ones(4), np.zeros(4))
    np.testing.assert_array_equal(f(np.ones(4), np.ones(4)), np.full(4, 2))


@pytest.mark.parametrize("level", [0, 0b10, 0b100])
def test_async_exec_levels_same_result(level):
    g, a, b = _ab()
    g.set_option("async_exec_level", level)
    f = g.compile([a, b], mgb.copy_output((a + b) * a))
    for i in range(3):
        np.testing.assert_array_equal(f(np.full(3, i), np.ones(3)), np.full(3, (i + 1) * i))
