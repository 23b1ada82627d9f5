"""SharedND: values, copies, sub-copies, memory sharing, lazy init, pickling."""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest

import megbrain as mgb

CN = "cpu0"


def _snd(value=None, dtype=np.float32, cn=CN):
    s = mgb.SharedND(cn, dtype)
    if value is not None:
        s.set_value(np.asarray(value))
    return s


# ---- set_value / get_value ------------------------------------------------------------------
def test_empty_get_value_is_none():
    s = mgb.SharedND(CN, np.float32)
    assert s.get_value() is None
    assert s.shape == ()
    assert s.dtype == np.float32
    assert s.comp_node == mgb.comp_node(CN)


def test_set_value_from_array_converts_dtype_and_returns_self():
    s = mgb.SharedND(CN, np.float32)
    assert s.set_value(np.arange(6, dtype=np.int64).reshape(2, 3)) is s
    v = s.get_value()
    assert v.dtype == np.float32 and v.shape == (2, 3)
    np.testing.assert_array_equal(v, np.arange(6).reshape(2, 3))
    s.set_value([[1, 2], [3, 4]])  # array-like, new shape
    np.testing.assert_array_equal(s.get_value(), [[1, 2], [3, 4]])
    assert s.shape == (2, 2)


def test_get_value_is_a_copy():
    s = _snd(np.ones(3))
    v = s.get_value()
    v[:] = 5
    np.testing.assert_array_equal(s.get_value(), np.ones(3))


def test_set_value_self_is_noop():
    s = _snd(np.arange(3))
    ptr = s.dev_ptr
    assert s.set_value(s) is s
    assert s.dev_ptr == ptr
    np.testing.assert_array_equal(s.get_value(), np.arange(3))


def test_set_value_from_shared_copies_and_may_resize():
    src = _snd(np.arange(6).reshape(2, 3))
    dst = _snd(np.zeros(4))
    dst.set_value(src)
    np.testing.assert_array_equal(dst.get_value(), np.arange(6).reshape(2, 3))
    assert dst.dev_ptr != src.dev_ptr  # a copy, not an alias
    src.set_value(np.zeros((2, 3)))
    np.testing.assert_array_equal(dst.get_value(), np.arange(6).reshape(2, 3))


def test_set_value_inplace_keeps_buffer():
    src = _snd(np.arange(6).reshape(2, 3))
    dst = _snd(np.zeros((2, 3)))
    ptr = dst.dev_ptr
    dst.set_value(src, inplace=True)
    assert dst.dev_ptr == ptr
    np.testing.assert_array_equal(dst.get_value(), np.arange(6).reshape(2, 3))
    with pytest.raises(mgb.MegBrainError):
        _snd(np.zeros(4)).set_value(src, inplace=True)  # fixed layout: shape must match


def test_set_value_inplace_only_from_shared():
    s = _snd(np.zeros(3))
    with pytest.raises(mgb.MegBrainError, match="inplace"):
        s.set_value(np.ones(3), inplace=True)


def test_set_value_share_requires_proxy():
    s = _snd(np.zeros(3))
    with pytest.raises(mgb.MegBrainError):
        s.set_value(np.ones(3), share=True)


@pytest.mark.parametrize("sync", [True, False])
def test_set_value_sync_flag(sync):
    s = mgb.SharedND(CN, np.float32)
    for i in range(5):
        arr = np.full((4, 4), i, np.float32)
        s.set_value(arr, sync=sync)
        np.testing.assert_array_equal(s.get_value(), arr)


def test_set_value_async_keeps_host_source_alive():
    s = mgb.SharedND(CN, np.float32)
    s.set_value(np.arange(1000, dtype=np.float32), sync=False)
    assert s._refkeeper is not None  # the host buffer lives until the async copy is done
    np.testing.assert_array_equal(s.get_value(), np.arange(1000))
    s.set_value(np.arange(10, dtype=np.float32))  # sync=True drops it
    assert s._refkeeper is None


def test_set_value_from_proxy_copy_and_share():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    copied, shared, ptr = mgb.SharedND(CN), mgb.SharedND(CN), {}

    def cb(v):
        copied.set_value(v)
        shared.set_value(v, share=True)
        ptr["p"] = v.dev_ptr

    f = g.compile([x], [(x * 2, mgb.callback_lazycopy(cb))])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # lazy proxies give no eager-copy warning
        f(np.arange(3))
    np.testing.assert_array_equal(copied.get_value(), [0, 2, 4])
    np.testing.assert_array_equal(shared.get_value(), [0, 2, 4])
    assert shared.dev_ptr == ptr["p"]  # zero copy
    assert copied.dev_ptr != ptr["p"]


@pytest.mark.parametrize("level", [0, 0b100])
def test_set_value_from_proxy_copies_before_memory_reuse(level):
    g = mgb.comp_graph()
    g.set_option("async_exec_level", level)  # 0b100: the callback runs on cpu0's worker
    x = mgb.make_arg(CN, g, name="x", shape=(16,))
    dst = mgb.SharedND(CN)
    h = x * 2
    later = mgb.opr.matrix_mul(x.reshape(4, 4), x.reshape(4, 4))  # may reuse h's memory
    f = g.compile([x], [(h, mgb.callback_lazycopy(dst.set_value)), mgb.copy_output(later)])
    for i in range(3):
        f(np.full(16, i))
        np.testing.assert_array_equal(dst.get_value(), np.full(16, 2 * i))


def test_set_value_from_proxy_dtype_mismatch():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    dst = mgb.SharedND(CN, np.int32)
    f = g.compile([x], [(x * 2, mgb.callback_lazycopy(dst.set_value))])
    with pytest.raises(mgb.MegBrainError, match="dtype"):
        f(np.ones(3))


def test_set_value_from_eager_proxy_warns():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    dst = mgb.SharedND(CN)
    f = g.compile([x], [(x * 3, dst.set_value)])
    with pytest.warns(UserWarning, match="consider using callback_lazycopy"):
        f(np.arange(3))
    np.testing.assert_array_equal(dst.get_value(), [0, 3, 6])


# ---- resize / reset_zero ----------------------------------------------------------------------
@pytest.mark.parametrize("args", [(2, 3), ((2, 3),), ([2, 3],)])
def test_resize_forms(args):
    s = mgb.SharedND(CN, np.int32)
    assert s.resize(*args) is s
    assert s.shape == (2, 3)
    assert s.get_value().shape == (2, 3) and s.get_value().dtype == np.int32


def test_reset_zero():
    s = _snd(np.arange(1, 7).reshape(2, 3))
    s.reset_zero()
    np.testing.assert_array_equal(s.get_value(), np.zeros((2, 3)))


# ---- sub copies -------------------------------------------------------------------------------
def test_copy_to_sub_from_shared_axis0():
    big = _snd(np.zeros((4, 3)))
    small = _snd(np.arange(6).reshape(2, 3))
    big.copy_to_sub_from_shared(0, 1, 3, 1, small)
    exp = np.zeros((4, 3))
    exp[1:3] = np.arange(6).reshape(2, 3)
    np.testing.assert_array_equal(big.get_value(), exp)


def test_copy_to_sub_from_shared_axis1_step():
    big = _snd(np.zeros((2, 5)))
    small = _snd(np.arange(6).reshape(2, 3) + 1)
    big.copy_to_sub_from_shared(1, 0, 5, 2, small)
    exp = np.zeros((2, 5))
    exp[:, 0:5:2] = np.arange(6).reshape(2, 3) + 1
    np.testing.assert_array_equal(big.get_value(), exp)


def test_copy_to_sub_shape_mismatch_raises():
    big = _snd(np.zeros((4, 3)))
    with pytest.raises(mgb.MegBrainError):
        big.copy_to_sub_from_shared(0, 0, 3, 1, _snd(np.zeros((2, 3))))


def test_copy_from_shared_sub_axis_codes():
    src = _snd(np.arange(12).reshape(4, 3))
    # -2: whole tensor, may resize
    dst = _snd(np.zeros(2))
    dst.copy_from_shared_sub(src, -2, -1, -1, -1)
    np.testing.assert_array_equal(dst.get_value(), np.arange(12).reshape(4, 3))
    # -3: whole tensor into the fixed layout, no reallocation
    dst2 = _snd(np.zeros((4, 3)))
    ptr = dst2.dev_ptr
    dst2.copy_from_shared_sub(src, -3, -1, -1, -1)
    assert dst2.dev_ptr == ptr
    np.testing.assert_array_equal(dst2.get_value(), np.arange(12).reshape(4, 3))
    with pytest.raises(mgb.MegBrainError):
        _snd(np.zeros(5)).copy_from_shared_sub(src, -3, -1, -1, -1)


@pytest.mark.parametrize(
    "axis,begin,end,step",
    [(0, 1, 3, 1), (0, 0, 4, 2), (1, 0, 2, 1), (1, 2, 3, 1), (0, -2, None, None)],
)
def test_copy_from_shared_sub_real_axis_slices_source(axis, begin, end, step):
    a = np.arange(12).reshape(4, 3)
    src = _snd(a)
    dst = mgb.SharedND(CN)
    dst.copy_from_shared_sub(src, axis, begin, end, step)
    idx = [slice(None)] * 2
    idx[axis] = slice(begin, end, step)
    np.testing.assert_array_equal(dst.get_value(), a[tuple(idx)])


def test_sub_copies_check_dtype_not_comp_node():
    a = _snd(np.zeros(3))
    with pytest.raises(mgb.MegBrainError):
        a.copy_from_shared_sub(_snd(np.zeros(3, np.int32), np.int32), -2, -1, -1, -1)
    a.copy_from_shared_sub(_snd(np.ones(3), cn="cpu1"), -2, -1, -1, -1)  # peer to peer
    np.testing.assert_array_equal(a.get_value(), [1, 1, 1])


# ---- memory sharing ---------------------------------------------------------------------------
@pytest.mark.parametrize("offset", [0, 2, 5])
def test_share_memory_from_element_offset(offset):
    base = _snd(np.arange(10))
    view = _snd(np.zeros((2, 2)))
    view.share_memory_from(base, offset)
    assert view.shape == (2, 2)
    np.testing.assert_array_equal(view.get_value().ravel(), np.arange(offset, offset + 4))
    assert view.dev_ptr == base.dev_ptr + 4 * offset
    # writes through one are seen through the other
    view.set_value(np.full((2, 2), -1.0), inplace=False)
    exp = np.arange(10, dtype=np.float32)
    exp[offset : offset + 4] = -1
    np.testing.assert_array_equal(base.get_value(), exp)


def test_share_memory_from_checks():
    base = _snd(np.arange(10))
    with pytest.raises(mgb.MegBrainError):
        base.share_memory_from(base, 0)
    with pytest.raises(mgb.MegBrainError):
        _snd(np.zeros(2, np.int32), np.int32).share_memory_from(base, 0)
    with pytest.raises(mgb.MegBrainError):
        _snd(np.zeros(2), cn="cpu1").share_memory_from(base, 0)
    with pytest.raises(mgb.MegBrainError):
        _snd(np.zeros(4)).share_memory_from(base, 8)  # past the end


def test_reset_dev_tensor_shares_storage_and_layout():
    a = _snd(np.arange(6).reshape(2, 3))
    b = _snd(np.zeros(1))
    b.reset_dev_tensor(a)
    assert b.shape == (2, 3) and b.dev_ptr == a.dev_ptr
    a.set_value(np.ones((2, 3)), inplace=False)
    np.testing.assert_array_equal(b.get_value(), np.ones((2, 3)))
    with pytest.raises(mgb.MegBrainError):
        a.reset_dev_tensor(a)
    with pytest.raises(mgb.MegBrainError):
        _snd(np.zeros(1), np.int32).reset_dev_tensor(a)


# ---- lazy initializer -------------------------------------------------------------------------
class _Init(mgb.SharedNDLazyInitializer):
    def __init__(self, value):
        self.value = np.asarray(value, np.float32)
        self.nr_get = 0

    def get_shape(self):
        return self.value.shape

    def get_value(self):
        self.nr_get += 1
        return self.value


def _lazy(value):
    s = mgb.SharedND(CN)
    init = _Init(value)
    s.lazy_initializer = init
    return s, init


def test_lazy_init_shape_without_value():
    s, init = _lazy(np.ones((2, 3)))
    assert s.lazy_initializer is init
    assert s.shape == (2, 3)
    assert init.nr_get == 0


def test_lazy_init_applied_on_get_value():
    s, init = _lazy(np.full((2, 2), 7))
    np.testing.assert_array_equal(s.get_value(), np.full((2, 2), 7))
    s.get_value()
    assert init.nr_get == 1


def test_lazy_init_applied_on_symvar():
    s, init = _lazy(np.arange(3))
    g = mgb.comp_graph()
    v = s.symvar(g)
    assert init.nr_get == 1
    f = g.compile(None, mgb.copy_output(v + 1))
    np.testing.assert_array_equal(f(), [1, 2, 3])


def test_lazy_init_applied_as_source():
    s, init = _lazy(np.arange(3))
    dst = mgb.SharedND(CN)
    dst.set_value(s)
    assert init.nr_get == 1
    np.testing.assert_array_equal(dst.get_value(), [0, 1, 2])


def test_lazy_init_dropped_by_array_set_value():
    s, init = _lazy(np.arange(3))
    s.set_value(np.ones(5))
    assert s.lazy_initializer is None
    np.testing.assert_array_equal(s.get_value(), np.ones(5))
    assert init.nr_get == 0


def test_lazy_init_only_on_uninitialised():
    s = _snd(np.ones(2))
    with pytest.raises(mgb.MegBrainError):
        s.lazy_initializer = _Init(np.ones(2))


# ---- pickling ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.uint8])
def test_pickle_roundtrip(dtype):
    s = _snd(np.arange(6).reshape(3, 2), dtype=dtype, cn="cpu1")
    t = pickle.loads(pickle.dumps(s))
    assert isinstance(t, mgb.SharedND) and t is not s
    assert t.dtype == dtype and t.comp_node == mgb.comp_node("cpu1")
    np.testing.assert_array_equal(t.get_value(), np.arange(6).reshape(3, 2))
    assert t.dev_ptr != s.dev_ptr


def test_pickle_empty():
    t = pickle.loads(pickle.dumps(mgb.SharedND(CN, np.int32)))
    assert t.get_value() is None and t.dtype == np.int32


# ---- graph vars -------------------------------------------------------------------------------
def test_symvar_needs_shape():
    with pytest.raises(mgb.MegBrainError, match="initial shape must be available"):
        mgb.SharedND(CN).symvar(mgb.comp_graph())


def test_symvar_volatile_flag_and_opr_type():
    g = mgb.comp_graph()
    s = _snd(np.ones(3))
    v = s.symvar(g, name="w")
    assert not v.volatile and mgb.cgtools.get_type(v) == "SharedDeviceTensor"
    assert v.name == "w"
    vv = s.symvar(g, volatile=True)
    assert vv.volatile and mgb.cgtools.get_type(vv) == "VolatileSharedDeviceTensor"


def test_symvar_reads_current_value():
    g = mgb.comp_graph()
    s = _snd(np.ones(3))
    f = g.compile(None, mgb.copy_output(s.symvar(g) * 2))
    np.testing.assert_array_equal(f(), [2, 2, 2])
    s.set_value(np.arange(3))  # same shape: same buffer
    np.testing.assert_array_equal(f(), [0, 2, 4])


def test_non_volatile_change_raises_then_recovers():
    g = mgb.comp_graph()
    s = _snd(np.ones(3))
    f = g.compile(None, mgb.copy_output(s.symvar(g) + 1))
    np.testing.assert_array_equal(f(), [2, 2, 2])
    dev = s.dev_tensor
    storage, layout = dev.storage, dev.layout
    s.set_value(np.ones(5))  # new shape (and a bigger buffer)
    with pytest.raises(mgb.MegBrainError):
        f()
    dev.reset(storage, layout)  # restored: runs again
    np.testing.assert_array_equal(f(), [2, 2, 2])
    s.reset_dev_tensor(_snd(np.zeros(3)))  # same shape, another buffer
    with pytest.raises(mgb.MegBrainError):
        f()
    dev.reset(storage, layout)
    np.testing.assert_array_equal(f(), [2, 2, 2])


def test_volatile_shape_change_allowed():
    g = mgb.comp_graph()
    s = _snd(np.ones(3))
    f = g.compile(None, mgb.copy_output(s.symvar(g, volatile=True) + 1))
    np.testing.assert_array_equal(f(), [2, 2, 2])
    s.set_value(np.arange(5))
    np.testing.assert_array_equal(f(), np.arange(5) + 1)
    other = _snd(np.full(2, 9))
    s.reset_dev_tensor(other)
    np.testing.assert_array_equal(f(), [10, 10])


def test_from_symvar_aliases():
    g = mgb.comp_graph()
    s = _snd(np.arange(3))
    for volatile in (False, True):
        alias = mgb.SharedND._from_symvar(s.symvar(g, volatile=volatile))
        assert alias.dev_ptr == s.dev_ptr
        np.testing.assert_array_equal(alias.get_value(), [0, 1, 2])


def test_from_symvar_error():
    g = mgb.comp_graph()
    v = _snd(np.arange(3)).symvar(g) + 1
    with pytest.raises(mgb.MegBrainError, match="cannot convert from Elemwise"):
        mgb.SharedND._from_symvar(v)


# ---- make_shared ------------------------------------------------------------------------------
def test_make_shared_without_graph():
    s = mgb.make_shared(CN, value=np.arange(3, dtype=np.float64))
    assert type(s) is mgb.SharedND and s.dtype == np.float32  # float64 -> float32
    assert mgb.make_shared(CN, value=np.arange(3)).dtype == np.int32  # int64 -> int32
    e = mgb.make_shared(CN, shape=(2, 4))
    assert e.shape == (2, 4) and e.dtype == np.float32
    assert mgb.make_shared(CN, dtype=np.int8).get_value() is None
    with pytest.raises(mgb.MegBrainError):
        mgb.make_shared(CN, value=np.ones(2), shape=(2,))
    with pytest.raises(mgb.MegBrainError):
        mgb.make_shared(CN, value=np.ones(2), name="x")
    with pytest.raises(mgb.MegBrainError):
        mgb.make_shared(CN, value=np.ones(2), volatile=True)


def test_make_shared_with_graph_proxy():
    g = mgb.comp_graph()
    w = mgb.make_shared(CN, value=np.ones(3), comp_graph=g, name="w")
    assert isinstance(w, mgb.ProxySharedNDAndSymbolVar) and isinstance(w, mgb.SymbolVar)
    assert w.name == "w" and not w.volatile
    f = g.compile(None, mgb.copy_output(w * 2))
    np.testing.assert_array_equal(f(), [2, 2, 2])
    w.set_value(np.arange(3))
    np.testing.assert_array_equal(w.get_value(), [0, 1, 2])
    np.testing.assert_array_equal(f(), [0, 2, 4])
    w.reset_zero()
    np.testing.assert_array_equal(f(), [0, 0, 0])
    assert mgb.make_shared(CN, value=np.ones(3), comp_graph=g, volatile=True).volatile
