"""The binding's own edge cases, each checked against what the reference binding does:
sharing a callback value into a SharedND, copies across comp nodes, user exceptions raised
inside a function, AsyncExec teardown, released graphs, compile(copy=True) without a current
function, AddUpdate's dtype semantics, and the scalar/shape/dtype rules of the small helpers."""

from __future__ import annotations

import gc
import time

import numpy as np
import pytest

import megbrain as mgb
from megbrain.dtype import qint8

CN = "cpu0"
F32 = np.float32


def _x(g=None, shape=(3,), dtype=F32):
    g = mgb.comp_graph() if g is None else g
    return g, mgb.make_arg(CN, g, name="x", shape=shape, dtype=dtype)


def _notes(exc: BaseException) -> str:
    return "\n".join(getattr(exc, "__notes__", ()))


# ---- set_value(proxy, share=True) ----------------------------------------------------------
def test_share_from_value_proxy_shares_into_the_same_shared_nd():
    g, x = _x()
    dst = mgb.make_shared(CN, value=np.zeros(3, F32))
    dev = dst.dev_tensor
    g2 = mgb.comp_graph()
    sym = dst.symvar(g2, volatile=True)  # a graph built on dst
    alias = mgb.SharedND._from_symvar(sym)  # an alias of dst
    reader = g2.compile(None, mgb.copy_output(sym * 1))
    seen = {}

    def cb(p):
        dst.set_value(p, share=True)
        seen["ptr"] = p.dev_ptr

    f = g.compile([x], [(x * 2, mgb.callback_lazycopy(cb))])
    f(np.arange(3, dtype=F32))
    assert dst.dev_tensor is dev  # the same tensor object, now over the callback's buffer
    assert dst.dev_ptr == seen["ptr"] and alias.dev_ptr == seen["ptr"]
    np.testing.assert_array_equal(alias.get_value(), [0, 2, 4])
    np.testing.assert_array_equal(reader(), [0, 2, 4])


# ---- copies across comp nodes ------------------------------------------------------------------
def test_copy_from_shared_sub_across_comp_nodes():
    src = mgb.make_shared("cpu0", value=np.arange(6, dtype=F32).reshape(2, 3))
    dst = mgb.SharedND("cpu1", F32)
    dst.copy_from_shared_sub(src, 0, 1, 2, 1)
    assert dst.comp_node == mgb.comp_node("cpu1")
    np.testing.assert_array_equal(dst.get_value(), [[3, 4, 5]])
    dst.set_value(src)  # the whole tensor (axis -2)
    np.testing.assert_array_equal(dst.get_value(), src.get_value())
    dst.set_value(mgb.make_shared("cpu0", value=np.ones((2, 3), F32)), inplace=True)  # axis -3
    np.testing.assert_array_equal(dst.get_value(), np.ones((2, 3)))
    row = mgb.make_shared("cpu0", value=np.full((1, 3), 7, F32))
    dst.copy_to_sub_from_shared(0, 1, 2, 1, row)
    np.testing.assert_array_equal(dst.get_value(), [[1, 1, 1], [7, 7, 7]])
    with pytest.raises(mgb.MegBrainError, match="dtype"):
        dst.set_value(mgb.make_shared("cpu0", value=np.ones(3, np.int32)))


# ---- user exceptions inside a function ---------------------------------------------------------
@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("level", [0, 0b100])
def test_output_callback_exception_is_reraised_as_it_is(lazy, level):
    g, x = _x()
    g.set_option("async_exec_level", level)
    y = (x + 1).rename("y")
    raised = []

    def bad(v):
        v.get_value()
        exc = ValueError("callback boom")
        raised.append(exc)
        raise exc

    f = g.compile([x], [(y, mgb.callback_lazycopy(bad) if lazy else bad)])
    with pytest.raises(ValueError, match="callback boom") as info:
        f(np.ones(3, F32))
    assert info.value is raised[0]
    assert not isinstance(info.value, mgb.MegBrainError)
    assert "'y'" in _notes(info.value) and "Elemwise" in _notes(info.value)
    with pytest.raises(ValueError):  # the function stays usable; each error gets one note
        f(np.ones(3, F32))
    assert info.value.__notes__ == raised[1].__notes__ and len(raised[1].__notes__) == 1


def test_eager_callback_exception_from_wait():
    g, x = _x()

    def bad(v):
        v.get_value()
        raise KeyError("eager boom")

    f = g.compile([x], [(x * 2, bad)])
    f.disable_auto_wait()
    f(np.ones(3, F32))
    with pytest.raises(KeyError, match="eager boom"):
        f.wait()
    f.wait()  # reported once


@pytest.mark.parametrize("eager", [0, 1])
def test_callback_injector_exception_is_reraised_with_the_operator_name(eager):
    g = mgb.comp_graph()
    g.set_option("eager_evaluation", eager)
    x = mgb.make_arg(CN, g, name="x", value=np.ones(3, F32))

    class MyError(Exception):
        pass

    def bad(v):
        raise MyError("injected")

    if eager:
        with pytest.raises(MyError) as info:
            mgb.opr.callback_injector(x, bad, name="inj")
    else:
        out = mgb.opr.callback_injector(x, bad, name="inj")
        f = g.compile(None, mgb.copy_output(out))
        with pytest.raises(MyError) as info:
            f(x=np.ones(3, F32))
    assert "CallbackInjector" in _notes(info.value) and "'inj'" in _notes(info.value)


def test_kernel_errors_stay_megbrain_errors_naming_the_operator():
    g, x = _x()
    chk = mgb.opr.assert_equal(x, x + 1, name="chk")
    f = g.compile([x], mgb.copy_output(chk))
    with pytest.raises(mgb.MegBrainError, match="chk"):
        f(np.ones(3, F32))


# ---- AsyncExec teardown ------------------------------------------------------------------------
def test_deleting_an_async_exec_waits_for_pending_callbacks():
    g, x = _x()
    seen = []

    def slow(v):
        time.sleep(0.02)
        seen.append(float(v.get_value()[0]))

    f = g.compile([x], [(x + 1, slow)])
    f.disable_auto_wait()
    for i in range(4):
        f(np.full(3, i, F32))
    del f
    gc.collect()
    assert seen == [1, 2, 3, 4]


def test_deleting_an_async_exec_reports_a_pending_callback_error():
    g, x = _x()

    def bad(v):
        v.get_value()
        raise ValueError("late boom")

    f = g.compile([x], [(x + 1, bad)])
    f.disable_auto_wait()
    f(np.ones(3, F32))
    with pytest.warns(RuntimeWarning, match="late boom"):
        del f
        gc.collect()


# ---- CompGraph.release() -----------------------------------------------------------------------
def test_released_graph_refuses_vars_and_compiles():
    g, x = _x()
    y = x + 1
    f = g.compile([x], mgb.copy_output(y))
    assert g.release() == 1
    assert g.release() == 0  # nothing left to release
    with pytest.raises(mgb.MegBrainError):
        g.get()
    with pytest.raises(mgb.MegBrainError, match="released"):
        x * 2
    with pytest.raises(mgb.MegBrainError, match="released"):
        mgb.make_arg(CN, g, name="z", shape=(3,))
    with pytest.raises(mgb.MegBrainError, match="released"):
        mgb.make_shared(CN, value=np.ones(3, F32), comp_graph=g)
    with pytest.raises(mgb.MegBrainError, match="released"):
        g.compile([x], mgb.copy_output(y))
    with pytest.raises(mgb.MegBrainError, match="released"):
        g.compile_multi_part([([x], mgb.copy_output(y))])
    with pytest.raises(mgb.GraphError, match="invalidated"):
        f(np.ones(3, F32))


# ---- compile(copy=True) ------------------------------------------------------------------------
def test_copy_compile_without_a_current_function_compiles_in_place():
    g, x = _x()
    f = g.compile([x], mgb.copy_output(x + 1), copy=True)
    assert f.graph is g and g.current_exec is f._func
    fc = g.compile([x], mgb.copy_output(x * 3), copy=True)  # now there is one: copy
    assert fc.graph is not g
    np.testing.assert_array_equal(f(np.ones(3, F32)), [2, 2, 2])
    np.testing.assert_array_equal(fc(np.ones(3, F32)), [3, 3, 3])


# ---- AddUpdate dtype semantics ---------------------------------------------------------------
def _run_add_update(dest, delta, **coefs):
    g = mgb.comp_graph()
    w = mgb.make_shared(CN, value=np.asarray(dest), comp_graph=g, name="w")
    d = mgb.make_arg(CN, g, name="d", value=np.asarray(delta), dtype=np.asarray(delta).dtype)
    f = g.compile(None, [mgb.opr.add_update(w, d, **coefs)])
    f(d=np.asarray(delta))
    return w.get_value()


def _fastpath(dest, delta, *coefs):
    w = mgb.make_shared(CN, value=np.asarray(dest))
    mgb._add_update_fastpath(w, mgb.make_shared(CN, value=np.asarray(delta)), *coefs)
    return w.get_value()


def test_add_update_int_dest_converts_delta_and_computes_in_int():
    # delta converted to the dest's dtype (2.5 -> 2) first: 1 + 2*2, not 1 + 2*2.5
    got = _run_add_update(np.ones(3, np.int32), np.full(3, 2.5, F32), beta=2)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, [5, 5, 5])


def test_add_update_int_arithmetic_wraps_in_the_dest_dtype():
    dest, delta = np.full(3, 2**30, np.int32), np.ones(3, np.int32)
    want = (dest * np.int32(4) + delta).astype(np.int32)  # int32 arithmetic: wraps
    np.testing.assert_array_equal(_run_add_update(dest, delta, alpha=4), want)
    np.testing.assert_array_equal(_fastpath(dest, delta, 4, 1, 0), want)


@pytest.mark.parametrize("coef", [{"beta": 2.5}, {"alpha": 0.5}, {"bias": 0.25}])
def test_add_update_int_dest_refuses_inexact_coefficients(coef):
    dest, delta = np.ones(3, np.int32), np.full(3, 2, np.int32)
    with pytest.raises(mgb.MegBrainError, match="int32"):
        _run_add_update(dest, delta, **coef)
    args = [coef.get("alpha", 1), coef.get("beta", 1), coef.get("bias", 0)]
    with pytest.raises(mgb.MegBrainError, match="int32"):
        _fastpath(dest, delta, *args)


def test_add_update_shared_scalar_coefficient_checked_at_run():
    g = mgb.comp_graph()
    w = mgb.make_shared(CN, value=np.ones(3, np.int32), comp_graph=g, name="w")
    beta = mgb.SharedScalar(np.float32(2))
    f = g.compile(None, [mgb.opr.add_update(w, np.full(3, 3, np.int32), beta=beta)])
    f()
    np.testing.assert_array_equal(w.get_value(), [7, 7, 7])
    beta.set(np.float32(0.5))
    with pytest.raises(mgb.MegBrainError, match="beta"):
        f()


def test_add_update_float16_computes_in_float16():
    dest = np.linspace(-3, 3, 7).astype(np.float16)
    delta = np.linspace(0.1, 0.7, 7).astype(np.float16)
    h = np.float16
    want = h(0.3) * dest + h(0.7) * delta + h(0.1)
    np.testing.assert_array_equal(_run_add_update(dest, delta, alpha=0.3, beta=0.7, bias=0.1), want)
    np.testing.assert_array_equal(_fastpath(dest, delta, 0.3, 0.7, 0.1), want)


def test_add_update_float32_does_not_overflow_through_a_rescaling():
    dest, delta = np.full(3, 1e10, F32), np.ones(3, F32)
    want = dest + F32(1e-30) * delta
    np.testing.assert_array_equal(_run_add_update(dest, delta, beta=1e-30), want)
    np.testing.assert_array_equal(_fastpath(dest, delta, 1, 1e-30, 0), want)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_add_update_alpha_zero_still_multiplies():
    dest = np.array([np.nan, 1, np.inf], F32)
    delta = np.array([1, 2, 3], F32)
    want = F32(0) * dest + F32(2) * delta  # 0*nan and 0*inf are nan
    np.testing.assert_array_equal(_run_add_update(dest, delta, alpha=0, beta=2), want)
    np.testing.assert_array_equal(_fastpath(dest, delta, 0, 2, 0), want)
    # beta=0 multiplies too: 0*inf is nan
    want = dest[[1]] + F32(0) * np.array([np.inf], F32)
    np.testing.assert_array_equal(_fastpath(dest[[1]], np.array([np.inf], F32), 1, 0, 0), want)
    # alpha=0, beta=1, bias=0 is the reference's plain copy
    np.testing.assert_array_equal(_run_add_update(dest, delta, alpha=0), delta)
    np.testing.assert_array_equal(_fastpath(dest, delta, 0, 1, 0), delta)


def test_add_update_large_broadcast_matches_the_formula():
    rng = np.random.default_rng(0)
    dest = rng.standard_normal((3, 40000)).astype(F32)
    delta = rng.standard_normal((40000,)).astype(F32)
    want = F32(0.9) * dest + F32(-0.01) * delta + F32(0.5)
    got = _run_add_update(dest, delta, alpha=0.9, beta=-0.01, bias=0.5)
    np.testing.assert_array_equal(got, want)


def test_add_update_keeps_the_dest_buffer():
    g = mgb.comp_graph()
    w = mgb.make_shared(CN, value=np.ones((4, 5), F32), comp_graph=g, name="w")
    ptr = mgb.SharedND._from_symvar(w).dev_ptr
    f = g.compile(None, [mgb.opr.add_update(w, np.ones(5, F32), alpha=0.5, beta=3)])
    f()
    np.testing.assert_array_equal(w.get_value(), np.full((4, 5), 3.5))
    assert mgb.SharedND._from_symvar(w).dev_ptr == ptr


# ---- fill_retain_dtype, SharedScalar, _resize, _get_dtype ---------------------------------------
def test_fill_retain_dtype_value_rules():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", value=np.zeros(3, np.int32), dtype=np.int32)
    f = g.compile(
        None,
        [
            mgb.copy_output(mgb.fill_retain_dtype(x, np.array([3.7], F32))),
            mgb.copy_output(mgb.fill_retain_dtype(x, 2)),
        ],
    )
    a, b = f()
    assert a.dtype == np.int32
    np.testing.assert_array_equal(a, [3, 3, 3])
    np.testing.assert_array_equal(b, [2, 2, 2])
    for bad in (True, np.bool_(False), np.array([True])):
        with pytest.raises(mgb.ConversionError, match="bool"):
            mgb.fill_retain_dtype(x, bad)
    for bad in (np.ones((1, 1)), [1, 2], np.zeros(0)):
        with pytest.raises(mgb.ConversionError, match="scalar"):
            mgb.fill_retain_dtype(x, bad)


@pytest.mark.parametrize("val", [2.5, 3, np.float32(1), np.array(4, np.int16), [2.0]])
def test_shared_scalar_accepts_scalars(val):
    s = mgb.SharedScalar(val)
    assert s.get() == np.asarray(val).reshape(-1)[0]


@pytest.mark.parametrize("bad", [np.ones((1, 1)), [[1.0]], np.ones((1, 1, 1), np.int32)])
def test_shared_scalar_refuses_non_scalar_shapes(bad):
    with pytest.raises(mgb.MegBrainError, match="scalar"):
        mgb.SharedScalar(bad)
    s = mgb.SharedScalar(1.0)
    with pytest.raises(mgb.MegBrainError, match="scalar"):
        s.set(bad)


@pytest.mark.parametrize(
    "init,other", [(np.float32(1), np.float16(2)), (np.int32(1), np.int8(2)), (1.5, 2)]
)
def test_shared_scalar_dtype_lock_refuses_another_dtype(init, other):
    s = mgb.SharedScalar(init)
    s.lock_dtype()
    with pytest.raises(mgb.MegBrainError, match="locked"):
        s.set(other)
    assert s.get() == np.asarray(init).reshape(-1)[0]
    s.set(np.asarray(init).dtype.type(5) if not isinstance(init, float) else 5.0)
    assert s.get() == 5


@pytest.mark.parametrize("shape", [(0,), (2, 0), ()])
def test_resize_refuses_zero_sized_dims(shape):
    h = mgb._HostSharedND(CN, F32)
    with pytest.raises(mgb.MegBrainError, match="shape"):
        h._resize(shape)
    s = mgb.SharedND(CN, F32)
    with pytest.raises(mgb.MegBrainError, match="shape"):
        s.resize(shape)
    with pytest.raises(mgb.MegBrainError, match="shape"):
        s._set_init_shape(shape)


def test_get_dtype_returns_the_numpy_scalar_type():
    assert mgb._HostSharedND(CN, np.int16)._get_dtype() is np.int16
    assert mgb.SharedND(CN, F32)._get_dtype() is np.float32
    q = qint8(0.25)
    got = mgb.SharedND(CN, q)._get_dtype()  # parametrized dtypes keep their parameters
    assert isinstance(got, np.dtype) and got == q and got.metadata == q.metadata


# ---- pubapi_dev_tensor_ptr ---------------------------------------------------------------------
def test_pubapi_dev_tensor_ptr_versions():
    s = mgb.make_shared(CN, value=np.arange(3, dtype=F32))
    assert s._pubapi_dev_tensor_ptr(0) == s.dev_ptr == s.dev_tensor.raw_ptr
    for get in (lambda: s.pubapi_dev_tensor_ptr, lambda: s._pubapi_dev_tensor_ptr(1)):
        with pytest.raises(mgb.MegBrainError, match="pubapi::DeviceTensor"):
            get()
    with pytest.raises(mgb.MegBrainError, match="version"):
        s._pubapi_dev_tensor_ptr(2)
    g, x = _x()
    got = {}

    def cb(p):
        got["ptr0"] = p._pubapi_dev_tensor_ptr(0)
        got["dev_ptr"] = p.dev_ptr
        try:
            p.pubapi_dev_tensor_ptr  # noqa: B018 - the access raises
        except mgb.MegBrainError as exc:
            got["err"] = str(exc)

    g.compile([x], [(x * 2, mgb.callback_lazycopy(cb))])(np.ones(3, F32))
    assert got["ptr0"] == got["dev_ptr"] and "pubapi::DeviceTensor" in got["err"]
