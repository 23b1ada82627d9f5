"""timestamp, persistent_output_storage and require_input_dynamic_storage."""

from __future__ import annotations

import numpy as np
import pytest

import megbrain as mgb
from megbrain.errors import GraphError

CN = "cpu0"
X = np.array([1.0, -2.0, 3.0], np.float32)


def _x():
    g = mgb.comp_graph()
    return g, mgb.make_arg(CN, g, name="x", shape=(3,))


def test_timestamp_forwards_and_writes_increasing_times():
    g, x = _x()
    dest = np.full(3, -1.0, np.float32)
    a = mgb.opr.timestamp(x * 2, dest, 0)
    b = mgb.opr.timestamp(mgb.opr.elem.exp(a) + a, dest, 2)
    f = g.compile([x], [mgb.copy_output(b)])
    (got,) = f(X)
    np.testing.assert_allclose(got, np.exp(2 * X) + 2 * X, rtol=1e-6)
    assert dest[1] == -1.0  # untouched
    assert 0 <= dest[0] <= dest[2] < 60
    first = dest.copy()
    f(X)
    assert dest[2] >= first[2]  # relative to the function's fixed point, so later runs grow


def test_timestamp_refuses_bad_dest():
    g, x = _x()
    with pytest.raises(TypeError, match="float32"):
        mgb.opr.timestamp(x, np.zeros(3, np.float64), 0)
    with pytest.raises(TypeError, match="1-dimensional"):
        mgb.opr.timestamp(x, np.zeros((2, 2), np.float32), 0)
    with pytest.raises(GraphError, match="out of range"):
        mgb.opr.timestamp(x, np.zeros(2, np.float32), 2)


def test_persistent_output_storage_keeps_its_memory_across_runs():
    g, x = _x()
    y = mgb.opr.persistent_output_storage(x * 3)
    z = y + 1
    f = g.compile([x], [mgb.copy_output(z)])
    buf = y.node.owner._storage((3,), np.dtype(np.float32))
    for k in range(2):
        (got,) = f(X + k)
        np.testing.assert_allclose(got, 3 * (X + k) + 1)
        np.testing.assert_allclose(buf, 3 * (X + k))  # the value stays in its storage
    gx = mgb.grad(mgb.opr.persistent_output_storage(x * 3).sum(), x)
    f2 = g.compile([x], [mgb.copy_output(gx)])
    np.testing.assert_allclose(f2(X)[0], [3, 3, 3])


def test_persistent_output_storage_shares_by_key():
    from megbrain.opr.utility import PersistentOutputStorage

    g, x = _x()
    a = mgb.opr.persistent_output_storage(x * 2, share_key=7)
    b = mgb.opr.persistent_output_storage(x * 5, share_key=7)
    c = mgb.opr.persistent_output_storage(x * 5)
    oa, ob, oc = (v.node.owner for v in (a, b, c))
    assert all(isinstance(o, PersistentOutputStorage) for o in (oa, ob, oc))
    shape, dt = (3,), np.dtype(np.float32)
    assert oa._storage(shape, dt) is ob._storage(shape, dt)
    assert oc._storage(shape, dt) is not oa._storage(shape, dt)
    f = g.compile([x], [mgb.copy_output(c)])
    np.testing.assert_allclose(f(X)[0], 5 * X)


def test_require_input_dynamic_storage_is_the_input():
    g, x = _x()
    y = mgb.opr.require_input_dynamic_storage(x) * 2
    gx = mgb.grad(y.sum(), x)
    f = g.compile([x], [mgb.copy_output(y), mgb.copy_output(gx)])
    got_y, got_g = f(X)
    np.testing.assert_allclose(got_y, 2 * X)
    np.testing.assert_allclose(got_g, [2, 2, 2])
