"""The fast call of a compiled function (bound once per plan) behaves as the general call:
each check pairs a call on the general path (the first, or one after a change) with the same
call on the fast path (a repeated one)."""

from __future__ import annotations

import numpy as np
import pytest

import megbrain as mgb
from megbrain.errors import MegBrainError


def _add_function(borrow_mem=False, n=4):
    g = mgb.comp_graph()
    a = mgb.make_arg("cpu0", g, name="a", shape=(n,))
    b = mgb.make_arg("cpu0", g, name="b", shape=(n,))
    f = g.compile([a, b], mgb.copy_output(a + b, borrow_mem=borrow_mem))
    return g, a, b, f


def _vals(n=4, k=0.0):
    return np.arange(n, dtype=np.float32) + k, np.full(n, 2, np.float32)


def test_repeated_calls_are_bound_once_and_right():
    _, _, _, f = _add_function()
    assert f._fast is None
    for k in range(4):
        av, bv = _vals(k=k)
        np.testing.assert_array_equal(f(av, bv), av + bv)
    assert f._fast is not None


@pytest.mark.parametrize("borrow_mem", [False, True])
def test_output_lifetime(borrow_mem):
    """Without borrow_mem every call returns a new array; with it, the one buffer again."""
    _, _, _, f = _add_function(borrow_mem)
    r1 = f(*_vals(k=1))
    first = r1.copy()
    r2 = f(*_vals(k=2))  # binds after the general call r1 ... r2 is the first fast one
    r3 = f(*_vals(k=3))
    assert (r1 is r2) == (r2 is r3) == borrow_mem
    if not borrow_mem:
        np.testing.assert_array_equal(r1, first)  # a later call never writes into it
    np.testing.assert_array_equal(r3, _vals(k=3)[0] + 2)


def test_shape_change_replans_and_back():
    _, _, _, f = _add_function()
    for n in (4, 4, 7, 7, 4, 4, 1):
        av, bv = _vals(n)
        np.testing.assert_array_equal(f(av, bv), av + bv)


def test_inputs_that_convert_or_fail():
    _, _, _, f = _add_function()
    f(*_vals())
    f(*_vals())
    np.testing.assert_array_equal(f(np.arange(4.0), [1, 1, 1, 1]), np.arange(4) + 1)
    strided = np.arange(8, dtype=np.float32)[::2]
    np.testing.assert_array_equal(f(strided, strided), strided * 2)
    f(*_vals())
    with pytest.raises(MegBrainError, match="input 'a'") as fast_err:
        f("abc", _vals()[1])
    g2 = _add_function()[3]
    with pytest.raises(MegBrainError) as general_err:
        g2("abc", _vals()[1])
    assert str(fast_err.value) == str(general_err.value)
    with pytest.raises(TypeError):
        f(*_vals(), _vals()[0])
    np.testing.assert_array_equal(f(*_vals(k=5)), _vals(k=5)[0] + 2)


def test_step_error_as_the_general_call():
    """An operator failing in a run: the same error, naming it, on both paths; the function
    stays usable."""
    g = mgb.comp_graph()
    x = mgb.make_arg("cpu0", g, shape=(4,), name="x")
    y = mgb.make_arg("cpu0", g, shape=(4,), name="y")
    f = g.compile([x, y], mgb.copy_output(mgb.opr.assert_equal(x, y, name="check") * 2))
    good, bad = np.ones(4, np.float32), np.full(4, 3, np.float32)
    errors = []
    for _ in range(3):
        with pytest.raises(mgb.AssertionError, match="check") as info:
            f(good, bad)
        errors.append((type(info.value), str(info.value)))
        np.testing.assert_array_equal(f(good, good), np.full(4, 2))
        assert f.prev_exec_time > 0
    assert f._fast is not None
    assert errors[0] == errors[1] == errors[2]


def test_changes_after_binding():
    g, a, b, f = _add_function()
    f(*_vals())
    f(*_vals())
    calls = []
    f.callbefore_func = lambda: calls.append("before")
    f.callback_func = lambda: calls.append("after")
    f(*_vals())
    assert calls == ["before", "after"]
    f.callbefore_func = f.callback_func = None
    f(*_vals())
    assert f._fast is not None
    f.execute()  # a run left pending: the next call waits for it first
    np.testing.assert_array_equal(f(*_vals(k=1)), _vals(k=1)[0] + 2)
    f.clear_device_memory()
    np.testing.assert_array_equal(f(*_vals(k=2)), _vals(k=2)[0] + 2)
    g.compile([a, b], mgb.copy_output(a * b))  # in place: f is invalidated
    with pytest.raises(MegBrainError, match="invalidated"):
        f(*_vals())


def test_outputs_reordered_and_no_wait_after_binding():
    g = mgb.comp_graph()
    a = mgb.make_arg("cpu0", g, name="a", shape=(4,))
    s, p = a + 1, a * 3
    f = g.compile([a], [mgb.copy_output(s), mgb.copy_output(p)])
    av = np.arange(4, dtype=np.float32)
    f(av)
    f(av)
    f.outputs = [p, s, p]
    got = f(av)
    np.testing.assert_array_equal(got[0], av * 3)
    np.testing.assert_array_equal(got[1], av + 1)
    f(av)
    f.disable_auto_wait()
    savers = f(av + 1)
    f.wait()
    np.testing.assert_array_equal(savers[0].get(), (av + 1) * 3)


def test_user_callbacks_and_borrowed_inputs_take_the_general_call():
    g = mgb.comp_graph()
    a = mgb.make_arg("cpu0", g, name="a", shape=(4,))
    seen = []
    f = g.compile([a], [(a * 2, lambda v: seen.append(v.get_value().copy())), a + 1])
    av = np.arange(4, dtype=np.float32)
    for _ in range(3):
        f(av)
    assert f._fast is None and len(seen) == 3
    _, _, _, h = _add_function()
    h.enable_borrow_on_cpu(True)
    av, bv = _vals()
    for _ in range(3):
        np.testing.assert_array_equal(h(av, bv), av + bv)
    assert h._fast is None
