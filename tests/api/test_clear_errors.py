"""Bad inputs found by fuzzing that raised unclear errors, and two fidelity details.

Each call raises a MegBrainError, TypeError or ValueError whose message names the function,
the argument and what was expected.  ``SharedND.dtype`` is the NumPy scalar type, as the
reference's ``_get_dtype`` gives it, and a graph's ``user_data`` holds only the user's keys.
"""

from __future__ import annotations

import numpy as np
import pytest

import megbrain as mgb

CLEAR = (mgb.MegBrainError, TypeError, ValueError)


@pytest.fixture
def g():
    return mgb.comp_graph()


@pytest.fixture
def x(g):
    return mgb.make_arg("cpu0", g, shape=(2,), name="x")


CASES = {
    # name: (call(graph, var), words the message must hold)
    "SharedScalar(str)": (lambda g, x: mgb.SharedScalar("a"), ["SharedScalar", "val", "number"]),
    "SharedScalar(None)": (lambda g, x: mgb.SharedScalar(None), ["SharedScalar", "val", "None"]),
    "SharedScalar.set(str)": (
        lambda g, x: mgb.SharedScalar(1.0).set("b"),
        ["SharedScalar.set", "val", "number"],
    ),
    "get_dep_vars(str)": (
        lambda g, x: mgb.cgtools.get_dep_vars("abc"),
        ["get_dep_vars", "var", "SymbolVar", "'abc'"],
    ),
    "get_oprs_seq(None)": (
        lambda g, x: mgb.cgtools.get_oprs_seq(None),
        ["get_oprs_seq", "outputs", "SymbolVar", "None"],
    ),
    "graph_traversal(None)": (
        lambda g, x: mgb.cgtools.graph_traversal([None]),
        ["graph_traversal", "outputs", "SymbolVar"],
    ),
    "replace_vars(str)": (
        lambda g, x: mgb.cgtools.replace_vars([x], "abc"),
        ["replace_vars", "varmap", "(old, new) pairs"],
    ),
    "replace_vars(bad pair)": (
        lambda g, x: mgb.cgtools.replace_vars([x], [(x, "y")]),
        ["replace_vars", "varmap's values", "SymbolVar"],
    ),
    "replace_oprs(str)": (
        lambda g, x: mgb.cgtools.replace_oprs([x], "abc"),
        ["replace_oprs", "oprmap", "Operators"],
    ),
    "compile_multi_part(str)": (
        lambda g, x: g.compile_multi_part("abc"),
        ["compile_multi_part", "io_specs", "(inputs, outspec) pairs"],
    ),
    "function(str)": (
        lambda g, x: g.compile([x], [mgb.copy_output(x * 2)])("abc"),
        ["input 'x'", "float32", "'abc'"],
    ),
    "function(kw=str)": (
        lambda g, x: g.compile(None, [mgb.copy_output(x * 2)])(x="abc"),
        ["input 'x'", "float32", "'abc'"],
    ),
    "SharedND.resize(huge)": (
        lambda g, x: mgb.SharedND(mgb.comp_node("cpu0"), np.float32).resize((2**40, 2**40)),
        ["SharedND.resize", "shape", "elements"],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_raises_a_clear_error(case, g, x):
    call, words = CASES[case]
    with pytest.raises(CLEAR) as info:
        call(g, x)
    msg = str(info.value)
    for w in words:
        assert w in msg, (w, msg)


def test_shared_nd_dtype_is_the_numpy_scalar_type():
    s = mgb.SharedND(mgb.comp_node("cpu0"), np.float32)
    assert s.dtype is np.float32 and s.dtype is s._get_dtype()
    t = mgb.make_shared("cpu0", value=np.zeros(3, np.int32))
    assert t.dtype is np.int32
    # a dtype carrying parameters is the dtype object
    q = mgb.SharedND(mgb.comp_node("cpu0"), mgb.dtype.qint8(0.5))
    assert isinstance(q.dtype, np.dtype) and q.dtype.metadata
    assert "float32" in repr(s)


def test_user_data_holds_only_the_users_keys(g, x):
    h = x * 2
    mgb.config.set_opr_sublinear_memory_endpoint(h)
    mgb.opr.persistent_output_storage(h)
    pred = mgb.make_arg("cpu0", g, shape=(1,), name="p")
    mgb.opr.cond_exec_pred(pred, np.array([1.0], np.float32))  # the cond-exec registry
    g.user_data["mine"] = 1
    f = g.compile([x], [mgb.copy_output(mgb.opr.persistent_output_storage(h))])
    f(np.ones(2, np.float32))
    assert g.user_data == {"mine": 1}
    assert any(o.outputs[0] is h.node for o in g.sublinear_endpoints)
