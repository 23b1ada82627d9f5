"""Output callbacks and value proxies: threads, lifetime, warnings."""

from __future__ import annotations

import threading
import time
import warnings

import numpy as np
import pytest

import megbrain as mgb

CN = "cpu0"


def _x(cn=CN, shape=(3,)):
    g = mgb.comp_graph()
    return g, mgb.make_arg(cn, g, name="x", shape=shape)


def test_eager_callback_runs_on_another_thread():
    g, x = _x()
    seen = {}

    def cb(v):
        seen["thread"] = threading.get_ident()
        seen["value"] = v.get_value()

    f = g.compile([x], [(x + 1, cb)])
    f(np.arange(3))
    assert seen["thread"] != threading.get_ident()
    np.testing.assert_array_equal(seen["value"], [1, 2, 3])


def test_lazy_callback_runs_inline():
    g, x = _x()
    seen = {}

    def cb(v):
        seen["thread"] = threading.get_ident()
        seen["value"] = v.get_value()

    f = g.compile([x], [(x + 1, mgb.callback_lazycopy(cb))])
    f(np.arange(3))
    assert seen["thread"] == threading.get_ident()  # single CPU node: runs on the caller
    np.testing.assert_array_equal(seen["value"], [1, 2, 3])


def test_callback_lazycopy_needs_callable():
    with pytest.raises(TypeError):
        mgb.callback_lazycopy(3)


@pytest.mark.parametrize("lazy", [False, True])
def test_proxy_properties(lazy):
    g, x = _x(shape=(2, 3))
    seen = {}

    def cb(v):
        seen.update(shape=v.shape, dtype=v.dtype, cn=v.comp_node, val=v.get_value())
        borrowed = v.get_value(borrow_mem=True)
        seen["borrow_equal"] = np.array_equal(borrowed, seen["val"])

    fn = mgb.callback_lazycopy(cb) if lazy else cb
    f = g.compile([x], [(x * 2, fn)])
    f(np.ones((2, 3)))
    assert seen["shape"] == (2, 3) and seen["dtype"] == np.float32
    assert seen["cn"] == mgb.comp_node(CN)
    assert seen["borrow_equal"]


@pytest.mark.parametrize("lazy", [False, True])
def test_proxy_invalid_after_callback(lazy):
    g, x = _x()
    kept = []
    fn = mgb.callback_lazycopy(kept.append) if lazy else (lambda v: (kept.append(v), v.get_value()))
    f = g.compile([x], [(x + 1, fn)])
    f(np.ones(3))
    (p,) = kept
    for access in (
        lambda: p.get_value(),
        lambda: p.shape,
        lambda: p.dtype,
        lambda: p.comp_node,
        lambda: p.dev_ptr,
    ):
        with pytest.raises(mgb.MegBrainError, match="outside its callback"):
            access()


def test_get_value_copy_unaffected_by_next_run():
    g, x = _x()
    vals = []
    f = g.compile([x], [(x + 1, lambda v: vals.append(v.get_value()))])
    f(np.zeros(3))
    f(np.ones(3))
    np.testing.assert_array_equal(vals[0], [1, 1, 1])
    np.testing.assert_array_equal(vals[1], [2, 2, 2])


def test_warning_when_eager_value_not_read():
    g, x = _x()
    f = g.compile([x], [(x + 1, lambda v: None)])
    with pytest.warns(UserWarning, match="did not read the value"):
        f(np.ones(3))


def test_no_warning_when_lazy_value_not_read():
    g, x = _x()
    f = g.compile([x], [(x + 1, mgb.callback_lazycopy(lambda v: None))])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f(np.ones(3))


def test_error_in_eager_callback_surfaces_from_wait():
    g, x = _x()

    def bad(v):
        v.get_value()
        raise ValueError("callback boom")

    f = g.compile([x], [(x + 1, bad)])
    f.disable_auto_wait()
    f(np.ones(3))
    with pytest.raises(ValueError, match="callback boom"):  # the callback's own exception
        f.wait()
    f.wait()  # the error is reported once
    f2 = g.compile([x], [(x + 1, bad)])
    with pytest.raises(ValueError, match="callback boom"):
        f2(np.ones(3))  # auto wait: raised from the call


def test_error_in_lazy_callback_surfaces_from_call():
    g, x = _x()

    def bad(v):
        raise KeyError("lazy boom")

    f = g.compile([x], [(x + 1, mgb.callback_lazycopy(bad))])
    with pytest.raises(KeyError, match="lazy boom"):
        f(np.ones(3))


def test_function_usable_after_callback_error():
    g, x = _x()
    state = {"fail": True}
    got = []

    def cb(v):
        got.append(v.get_value())
        if state["fail"]:
            raise RuntimeError("once")

    f = g.compile([x], [(x + 1, cb)])
    with pytest.raises(RuntimeError, match="once"):
        f(np.ones(3))
    state["fail"] = False
    f(np.zeros(3))
    np.testing.assert_array_equal(got[-1], [1, 1, 1])


def test_wait_drains_eager_callbacks_of_unwaited_runs():
    g = mgb.comp_graph()
    a = mgb.make_arg("cpu0", g, name="a", shape=(4,))
    b = mgb.make_arg("cpu1", g, name="b", shape=(4,))
    seen = []

    def cb(v):
        time.sleep(0.001)
        seen.append(float(v.get_value()[0]))

    c = mgb.opr.copy(a, comp_node="cpu1") + b
    f = g.compile([a, b], [(c, cb)])
    f.disable_auto_wait()
    for _ in range(3):
        seen.clear()
        for i in range(5):
            f(np.full(4, i), np.zeros(4))  # not waited: must not clobber a running input
        f.wait()
        assert seen == [0, 1, 2, 3, 4]


def test_eager_callbacks_in_order_with_values():
    g, x = _x()
    seen = []
    f = g.compile(
        [x],
        [
            (x * 2, lambda v: seen.append(("a", v.get_value()[0]))),
            (x * 3, lambda v: seen.append(("b", v.get_value()[0]))),
        ],
    )
    for i in range(4):
        f(np.full(3, i))
    assert sorted(seen) == sorted(
        [("a", 2 * i) for i in range(4)] + [("b", 3 * i) for i in range(4)]
    )


def test_callback_injector_single_and_multi_input():
    g, x = _x()
    y = x * 10
    got = {}

    def one(v):
        got["one"] = v.get_value()

    def many(vs):
        assert isinstance(vs, list) and len(vs) == 2
        got["many"] = [v.get_value() for v in vs]

    r1 = mgb.opr.callback_injector(x, one)
    r2 = mgb.opr.callback_injector([x, y], many)
    f = g.compile([x], mgb.copy_output(r1 + r2))
    out = f(np.arange(3))
    np.testing.assert_array_equal(out, 2 * np.arange(3))  # both forward their first input
    np.testing.assert_array_equal(got["one"], np.arange(3))
    np.testing.assert_array_equal(got["many"][0], np.arange(3))
    np.testing.assert_array_equal(got["many"][1], 10 * np.arange(3))


def test_callback_injector_runs_inline_and_proxy_expires():
    g, x = _x()
    seen = {}

    def cb(v):
        seen["thread"] = threading.get_ident()
        seen["proxy"] = v

    f = g.compile([x], [mgb.opr.callback_injector(x, cb)])
    f(np.ones(3))
    assert seen["thread"] == threading.get_ident()
    with pytest.raises(mgb.MegBrainError):
        seen["proxy"].get_value()


def test_func_output_saver_as_callback():
    g, x = _x()
    saver = mgb.FuncOutputSaver()
    f = g.compile([x], [(x + 1, saver)])
    f(np.arange(3))
    np.testing.assert_array_equal(saver.get(), [1, 2, 3])
    borrow = mgb.FuncOutputSaver(borrow_mem=True)
    f = g.compile([x], [(x + 2, borrow)])
    f(np.arange(3))
    np.testing.assert_array_equal(borrow.get(), [2, 3, 4])


def test_callback_on_second_comp_node():
    g = mgb.comp_graph()
    a = mgb.make_arg("cpu0", g, name="a", shape=(3,))
    b = mgb.make_arg("cpu1", g, name="b", shape=(3,))
    got = []
    c = mgb.opr.copy(a, comp_node="cpu1") * b
    f = g.compile([a, b], [(c, lambda v: got.append((v.comp_node, v.get_value())))])
    f(np.ones(3), np.full(3, 4))
    assert got[0][0] == mgb.comp_node("cpu1")
    np.testing.assert_array_equal(got[0][1], [4, 4, 4])
