"""NumRangeChecker: the first operator with a NaN, Inf or out-of-bound float value."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from plugin_util import arange

import megbrain as mgb
from megbrain import plugin


def _graph(bound=100.0):
    g = mgb.comp_graph()
    chk = plugin.NumRangeChecker(g, bound)
    x = mgb.make_arg("cpu0", g, shape=(4,), name="x")
    a = mgb.opr.elemwise(x, mode="log", name="logx")  # NaN for negative, -inf for 0
    b = mgb.opr.elemwise(a * 2.0, mode="exp", name="big")
    return g, chk, x, b


def test_good_values_pass():
    g, chk, x, b = _graph()
    f = g.compile([x], mgb.copy_output(b))
    np.testing.assert_allclose(f(arange(4) + 1), (arange(4) + 1) ** 2, rtol=1e-5)


@pytest.mark.parametrize(
    "value, opr_name, what",
    [
        (np.array([1, 2, -1, 3], "f4"), "logx", "value=nan"),
        (np.array([1, 2, 0, 3], "f4"), "logx", "value=-inf"),
        (np.array([1, 2, 11, 3], "f4"), "big", "value=121"),
    ],
)
def test_catches_nan_inf_and_bound_at_the_right_operator(value, opr_name, what):
    g, chk, x, b = _graph()
    f = g.compile([x], mgb.copy_output(b))
    with pytest.raises(plugin.NumRangeCheckerError) as info, np.errstate(all="ignore"):
        f(value)
    msg = str(info.value)
    assert f"operator Elemwise {opr_name!r}" in msg
    assert what in msg and "range=100" in msg and "index={2}/{4}" in msg
    assert "inputs:" in msg and "[i0]" in msg
    # the next good run works (nothing half-applied)
    np.testing.assert_allclose(f(arange(4) + 1), (arange(4) + 1) ** 2, rtol=1e-5)


def test_reports_input_ranges_even_when_overwritten_in_place():
    g, chk, x, b = _graph()
    f = g.compile([x], mgb.copy_output(b))
    with pytest.raises(plugin.NumRangeCheckerError) as info:
        f(np.array([1, 2, 11, 3], "f4"))
    inputs = str(info.value).split("inputs:")[1]
    # the input of exp is 2*log(x): max 2*log(11) = 4.796
    assert "max=4.79579" in inputs


def test_bound_is_exclusive_as_the_reference():
    g = mgb.comp_graph()
    plugin_ = plugin.NumRangeChecker(g, 4.0)
    x = mgb.make_arg("cpu0", g, shape=(2,), name="x")
    f = g.compile([x], mgb.copy_output(x * 1.0))
    f(np.array([3.5, -3.5], "f4"))
    with pytest.raises(plugin.NumRangeCheckerError):
        f(np.array([4.0, 0], "f4"))
    del plugin_


def test_int_outputs_are_ignored():
    g = mgb.comp_graph()
    chk = plugin.NumRangeChecker(g, 10.0)
    x = mgb.make_arg("cpu0", g, shape=(3,), dtype=np.int32, name="xi")
    y = x * 1000
    f = g.compile([x], mgb.copy_output(y))
    np.testing.assert_array_equal(f(np.array([1, 2, 3], "i4")), [1000, 2000, 3000])
    del chk


def test_wait_raises_on_threaded_run():
    g = mgb.comp_graph()
    chk = plugin.NumRangeChecker(g, 1e3)
    x = mgb.make_arg("cpu0", g, shape=(4,), name="x")
    a = mgb.opr.copy(x, comp_node="cpu1", name="oncpu1")
    f = g.compile([x], mgb.copy_output(a * a + 1.0))
    assert f(arange(4)).tolist() == [1, 2, 5, 10]
    with pytest.raises(plugin.NumRangeCheckerError, match="operator Elemwise 'MUL"):
        f(arange(4) * 100)  # the square runs on cpu1's worker thread
    del chk


def test_detach_stops_checking():
    g, chk, x, b = _graph()
    f = g.compile([x], mgb.copy_output(b))
    chk.detach()
    with np.errstate(all="ignore"):
        r = f(np.array([1, 2, -1, 3], "f4"))
    assert np.isnan(r[2])


def test_bad_bound():
    g = mgb.comp_graph()
    with pytest.raises(ValueError, match="max_abs_val must be positive"):
        plugin.NumRangeChecker(g, -1)
    with pytest.raises(TypeError, match="max_abs_val must be a number"):
        plugin.NumRangeChecker(g, "big")


@settings(max_examples=25, deadline=None)
@given(
    st.sampled_from(["float32", "float16"]),
    st.lists(st.floats(-1e3, 1e3, width=16), min_size=1, max_size=8),
    st.integers(0, 7),
    st.sampled_from([np.nan, np.inf, -np.inf, 5e3]),
)
def test_random_values(dtype, vals, pos, bad):
    g = mgb.comp_graph()
    chk = plugin.NumRangeChecker(g, 2e3)
    x = mgb.make_arg("cpu0", g, shape=(len(vals),), dtype=dtype, name="x")
    f = g.compile([x], mgb.copy_output(x + 0.0))
    v = np.array(vals, dtype)
    f(v)
    v[pos % len(vals)] = bad
    with pytest.raises(plugin.NumRangeCheckerError, match=rf"index=\{{{pos % len(vals)}\}}"):
        f(v)
    del chk
