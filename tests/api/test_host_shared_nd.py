"""_HostSharedND and make_arg: host inputs, borrowing, static inference."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import megbrain as mgb

CN = "cpu0"


def _ptr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


# ---- set_value and borrowing ------------------------------------------------------------------
def test_set_value_copies_by_default():
    h = mgb._HostSharedND(CN, np.float32)
    a = np.arange(4, dtype=np.float32)
    assert h.set_value(a) is h
    assert h.tensor.raw_ptr != _ptr(a)
    a[:] = 9
    np.testing.assert_array_equal(h.get_value(), [0, 1, 2, 3])


def test_borrow_is_off_on_cpu_unless_enabled():
    h = mgb._HostSharedND(CN, np.float32)
    a = np.arange(4, dtype=np.float32)
    h.set_value(a, borrow=True)
    assert h.tensor.raw_ptr != _ptr(a)  # forced off on a CPU comp node
    h.enable_borrow_on_cpu(True)
    h.set_value(a, borrow=True)
    assert h.tensor.raw_ptr == _ptr(a)  # zero copy
    a[0] = 42
    assert h.get_value()[0] == 42


def test_after_borrow_next_copy_reallocates():
    h = mgb._HostSharedND(CN, np.float32)
    h.enable_borrow_on_cpu(True)
    a = np.arange(4, dtype=np.float32)
    h.set_value(a, borrow=True)
    h.set_value(np.ones(4, np.float32))  # a copy: must not write into the borrowed array
    np.testing.assert_array_equal(a, [0, 1, 2, 3])
    assert h.tensor.raw_ptr != _ptr(a)
    np.testing.assert_array_equal(h.get_value(), np.ones(4))


def test_resize_after_borrow_owns_storage():
    h = mgb._HostSharedND(CN, np.float32)
    h.enable_borrow_on_cpu(True)
    a = np.arange(4, dtype=np.float32)
    h.set_value(a, borrow=True)
    h._resize((2, 2))
    assert h.tensor.raw_ptr != _ptr(a)
    assert h.tensor.shape == (2, 2)
    h.set_value(np.ones((2, 2), np.float32))
    np.testing.assert_array_equal(a, [0, 1, 2, 3])


def test_borrow_needs_contiguous_and_dtype():
    h = mgb._HostSharedND(CN, np.float32)
    h.enable_borrow_on_cpu(True)
    a = np.arange(8, dtype=np.float32)[::2]
    h.set_value(a, borrow=True)
    np.testing.assert_array_equal(h.get_value(), [0, 2, 4, 6])
    b = np.arange(3, dtype=np.int32)
    h.set_value(b, borrow=True)
    assert h.get_value().dtype == np.float32
    np.testing.assert_array_equal(h.get_value(), [0, 1, 2])


def test_set_value_from_list_and_scalar():
    h = mgb._HostSharedND(CN, np.int32)
    h.set_value([[1, 2], [3, 4]])
    v = h.get_value()
    assert v.dtype == np.int32 and v.shape == (2, 2)
    h.set_value(7)
    assert h.get_value().shape == (1,) and h.get_value()[0] == 7


def test_slow_set_value_warnings(monkeypatch):
    monkeypatch.delenv("MGB_DISABLE_SET_VALUE_WARN", raising=False)
    h = mgb._HostSharedND(CN, np.float32)
    with pytest.warns(UserWarning, match="slow"):
        h.set_value([0.0] * 1024)
    with pytest.warns(UserWarning):
        h.set_value(np.zeros(2048, np.float64))  # dtype mismatch on a big array
    with pytest.warns(UserWarning):
        h.set_value(np.zeros(4096, np.float32)[::2])  # not contiguous
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        h.set_value([0.0] * 10)  # small: no warning
        h.set_value(np.zeros(10, np.float64))
        monkeypatch.setenv("MGB_DISABLE_SET_VALUE_WARN", "1")
        h.set_value([0.0] * 1024)


def test_repr_and_dtype():
    h = mgb._HostSharedND(CN, np.int16)
    assert repr(h).startswith("<HostSharedND at 0x")
    assert h._get_dtype() == np.int16
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="xin", shape=(2,))
    p = mgb._HostSharedND.make_proxy(x)
    assert repr(p).startswith("<HostSharedND proxy at 0x") and repr(p).endswith("for xin>")


# ---- make_proxy -------------------------------------------------------------------------------
def test_make_proxy_feeds_the_graph():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    f = g.compile(None, mgb.copy_output(x + 1))
    p = mgb._HostSharedND.make_proxy(x)
    p.set_value(np.arange(3))
    np.testing.assert_array_equal(f(), [1, 2, 3])
    x.set_value(np.zeros(3))  # the ProxySharedNDAndSymbolVar feeds the same tensor
    np.testing.assert_array_equal(p.get_value(), np.zeros(3))
    np.testing.assert_array_equal(f(), [1, 1, 1])


def test_make_proxy_needs_host2devicecopy():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    with pytest.raises(mgb.MegBrainError, match="Elemwise"):
        mgb._HostSharedND.make_proxy(x * 2)
    with pytest.raises(mgb.MegBrainError):
        mgb._HostSharedND.make_proxy(mgb.make_shared(CN, value=np.ones(2), comp_graph=g))


# ---- make_arg and static inference ------------------------------------------------------------
def test_make_arg_with_value_infers_right_away():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", value=np.arange(3))
    assert isinstance(x, mgb.ProxySharedNDAndSymbolVar)
    assert x.dtype == np.float32 and x.name == "x"
    np.testing.assert_array_equal(x.inferred_value, [0, 1, 2])
    np.testing.assert_array_equal((x * 2).inferred_value, [0, 2, 4])
    assert x.imm_shape == (3,)
    np.testing.assert_array_equal(x.get_value(), [0, 1, 2])


def test_make_arg_dtype():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, dtype=np.int32, value=[1.7, 2.2])
    assert x.dtype == np.int32
    np.testing.assert_array_equal(x.get_value(), [1, 2])


def test_make_arg_value_and_shape_must_agree():
    g = mgb.comp_graph()
    with pytest.raises((AssertionError, mgb.MegBrainError)):
        mgb.make_arg(CN, g, shape=(2,), value=np.ones(3))
    x = mgb.make_arg(CN, g, shape=(3,), value=np.ones(3))
    assert x.imm_shape == (3,)


def test_make_arg_no_value_defers_inference():
    g = mgb.comp_graph()
    g.set_option("allocate_static_mem_after_graph_compile", True)
    x = mgb.make_arg(CN, g, name="x")
    assert x.inferred_value is None
    assert (x + 1).inferred_value is None
    # an empty input turns static allocation at compile off for the graph
    assert g.options.allocate_static_mem_after_graph_compile is False
    f = g.compile([x], mgb.copy_output(x + 1))
    np.testing.assert_array_equal(f(np.arange(2)), [1, 2])
    np.testing.assert_array_equal(x.inferred_value, [0, 1])  # known after a run


def test_make_arg_shape_hint():
    g = mgb.comp_graph()
    g.set_option("allocate_static_mem_after_graph_compile", True)
    x = mgb.make_arg(CN, g, name="x", shape=(2, 5))
    assert x.imm_shape == (2, 5)
    assert (x.sum(axis=1)).imm_shape == (2,)
    assert g.options.allocate_static_mem_after_graph_compile is True  # not empty


def test_make_arg_shape_hint_has_no_inferred_value():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(4,))
    assert x.inferred_value is None


def test_make_arg_without_static_value_infer():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, value=np.ones(3), enable_static_infer=False)
    assert x.inferred_value is None
    assert x.imm_shape == (3,)  # shape is still inferred
    f = g.compile([x], mgb.copy_output(x * 3))
    np.testing.assert_array_equal(f(np.arange(3)), [0, 3, 6])


def test_make_arg_registers_user_input():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(2,))
    h = mgb._HostSharedND(CN, np.float32)
    h.set_value(np.ones(2))
    y = h.symvar(g, name="y")  # not through make_arg, still a user input
    f = g.compile(None, mgb.copy_output(x + y))
    assert {v.name for v in f.inputs} == {"x", "y"}


def test_function_borrows_inputs_with_enable_borrow_on_cpu():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    f = g.compile([x], mgb.copy_output(x * 2))
    p = mgb._HostSharedND.make_proxy(x)
    a = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(f(a), [0, 2, 4])
    assert p.tensor.raw_ptr != _ptr(a)  # CPU: copied by default
    f.enable_borrow_on_cpu(True)
    b = np.arange(3, dtype=np.float32) + 1
    np.testing.assert_array_equal(f(b), [2, 4, 6])
    assert p.tensor.raw_ptr == _ptr(b)  # auto-wait call: borrowed
    c = np.arange(3, dtype=np.float32) + 2
    np.testing.assert_array_equal(f(c), [4, 6, 8])
    np.testing.assert_array_equal(b, [1, 2, 3])  # the earlier borrowed array untouched
