"""SharedScalar: dtype lock, updates reaching compiled functions, pickling."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import megbrain as mgb

CN = "cpu0"


@pytest.mark.parametrize(
    "val,dtype",
    [
        (1.5, np.float32),
        (3, np.int32),
        (np.float64(2), np.float32),
        (np.int8(4), np.int8),
        (np.array([2.5], np.float32), np.float32),
        (np.array(7, np.int16), np.int16),
    ],
)
def test_construct_dtype(val, dtype):
    s = mgb.SharedScalar(val)
    assert s.dtype == dtype
    assert s.get() == np.asarray(val).reshape(-1)[0].astype(dtype)
    assert not s.dtype_locked


@pytest.mark.parametrize("bad", [[1, 2], np.zeros((2, 2)), []])
def test_needs_scalar(bad):
    with pytest.raises(mgb.MegBrainError):
        mgb.SharedScalar(bad)
    s = mgb.SharedScalar(1.0)
    with pytest.raises(mgb.MegBrainError):
        s.set(bad)


def test_set_before_lock_may_change_dtype():
    s = mgb.SharedScalar(1.5)
    s.set(np.int32(3))
    assert s.dtype == np.int32 and s.get() == 3


def test_lock_dtype_and_error_message():
    s = mgb.SharedScalar(1.5)
    s.lock_dtype()
    assert s.dtype_locked
    s.set(2.5)  # a Python float stays float32
    assert s.dtype == np.float32 and s.get() == 2.5
    with pytest.raises(
        mgb.MegBrainError,
        match="dtype for SharedScalar has been locked as float32, but attempt to set it to int32",
    ):
        s.set(np.int32(1))
    assert s.get() == 2.5


def test_graph_use_locks_dtype():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    s = mgb.SharedScalar(2.0)
    x * s
    assert s.dtype_locked
    with pytest.raises(mgb.MegBrainError, match="locked"):
        s.set(np.int32(1))


def test_updates_reach_compiled_function_without_recompile():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    s = mgb.SharedScalar(2.0)
    f = g.compile([x], mgb.copy_output(x * s + s))
    a = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(f(a), a * 2 + 2)
    for v in (3.0, -1.0, 0.5):
        s.set(v)
        np.testing.assert_array_equal(f(a), a * v + v)


def test_one_scalar_in_two_graphs_and_comp_nodes():
    s = mgb.SharedScalar(1.0)
    funcs = []
    for cn in ("cpu0", "cpu1"):
        g = mgb.comp_graph()
        x = mgb.make_arg(cn, g, name="x", shape=(2,))
        funcs.append(g.compile([x], mgb.copy_output(x + s)))
    s.set(5.0)
    for f in funcs:
        np.testing.assert_array_equal(f(np.zeros(2)), [5, 5])


def test_var_is_shared_device_tensor():
    g = mgb.comp_graph()
    s = mgb.SharedScalar(3)
    v = s._as_sym_var(g, mgb.comp_node(CN))
    assert mgb.cgtools.get_type(v) == "SharedDeviceTensor"
    assert v.name.startswith("SharedScalar@")
    assert v.dtype == np.int32


@pytest.mark.parametrize("locked", [False, True])
def test_pickle_keeps_value_and_lock(locked):
    s = mgb.SharedScalar(4.25)
    if locked:
        s.lock_dtype()
    t = pickle.loads(pickle.dumps(s))
    assert t.get() == 4.25 and t.dtype == np.float32
    assert t.dtype_locked is locked
    if locked:
        with pytest.raises(mgb.MegBrainError):
            t.set(np.int32(1))
    # the copy is independent and usable in a graph
    t.set(1.0)
    assert s.get() == 4.25
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(1,))
    f = g.compile([x], mgb.copy_output(x + t))
    t.set(2.0)
    np.testing.assert_array_equal(f(np.zeros(1)), [2])


def test_repr():
    assert repr(mgb.SharedScalar(1.5)) == "SharedScalar(1.5)"
    assert repr(mgb.SharedScalar(3)) == "SharedScalar(3)"
