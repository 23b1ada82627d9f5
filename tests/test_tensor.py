"""Tests of megbrain.tensor: shapes, layouts, slices, storage views, host/device tensors."""

import threading

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megbrain import dtype as D
from megbrain.device import CompNode
from megbrain.errors import ConversionError, MegBrainError
from megbrain.tensor import (
    DeviceTensorND,
    HostTensorND,
    Slice,
    Storage,
    SubTensorSpec,
    TensorLayout,
    TensorShape,
)

FAST = settings(max_examples=40, deadline=None)
shapes = st.lists(st.integers(0, 5), min_size=1, max_size=4).map(tuple)
nonempty_shapes = st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple)
DTYPES = [
    np.float32,
    np.float16,
    np.int8,
    np.int16,
    np.int32,
    np.uint8,
    np.bool_,
    ml_dtypes.bfloat16,
]


def _arange(shape, dtype=np.float32):
    return np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape).astype(dtype)


# ---------------------------------------------------------------- TensorShape / TensorLayout


@FAST
@given(shapes)
def test_shape_accepts_ints(shape):
    s = TensorShape(shape)
    assert s == shape and isinstance(s, tuple) and s.ndim == len(shape)
    assert s.total_nr_elems == int(np.prod(shape))
    assert TensorShape(np.array(shape, dtype=np.int64)) == shape
    assert all(type(d) is int for d in TensorShape([np.int32(d) for d in shape]))


def test_shape_scalar_and_empty():
    assert TensorShape(3) == (3,)
    assert TensorShape().total_nr_elems == 0  # ndim 0 means "not set", as in MegBrain
    assert TensorShape((1,)).is_scalar()


@pytest.mark.parametrize("bad", [(2, -1), (2.0, 3), (True, 2), ("2",), None, (2, None)])
def test_shape_rejects_bad_dims(bad):
    with pytest.raises(MegBrainError, match="invalid tensor shape") as info:
        TensorShape(bad)
    assert repr(bad) in str(info.value)


@FAST
@given(shapes, st.sampled_from(DTYPES))
def test_contiguous_layout_matches_numpy(shape, dtype):
    lay = TensorLayout(shape, dtype)
    ref = np.empty(shape, dtype)
    assert lay.ndim == ref.ndim and lay.total_nr_elems == ref.size
    assert lay.is_contiguous()
    assert lay.span_bytes() == ref.nbytes
    if ref.size:
        assert lay.byte_strides == ref.strides


def test_layout_strides_span_and_equality():
    lay = TensorLayout((3, 4), np.float32, strides=(8, -2))
    assert not lay.is_contiguous()
    assert lay.span() == (-6, 17)
    assert lay.span_bytes() == 23 * 4
    assert TensorLayout((3, 1), "float32", (1, 5)) == TensorLayout((3, 1), np.float32)
    assert TensorLayout((3, 4), np.float32) != TensorLayout((3, 4), np.int32)
    assert TensorLayout((3, 4), np.int8) != TensorLayout((3, 4), D.qint8(0.5))
    assert TensorLayout((0, 4), np.float32).span_bytes() == 0
    with pytest.raises(MegBrainError, match="strides"):
        TensorLayout((3, 4), np.float32, strides=(1,))
    with pytest.raises(ConversionError):
        TensorLayout((3,), np.float64)


# ---------------------------------------------------------------- Slice


slice_args = st.tuples(
    st.one_of(st.none(), st.integers(-7, 7)),
    st.one_of(st.none(), st.integers(-7, 7)),
    st.one_of(st.none(), st.integers(-3, 3).filter(bool)),
)


@FAST
@given(nonempty_shapes, st.data(), slice_args)
def test_slice_apply_matches_numpy(shape, data, args):
    arr = _arange(shape)
    t = HostTensorND.from_ndarray(arr)
    axis = data.draw(st.integers(0, len(shape) - 1))
    spec = Slice(*args).apply(t.layout, axis)
    idx = [slice(None)] * len(shape)
    idx[axis] = slice(*args)
    np.testing.assert_array_equal(t.sub(spec).as_ndarray(), arr[tuple(idx)])
    # axis -1: the flattened array
    flat = t.sub(Slice(*args).apply(t.layout, -1)).as_ndarray()
    np.testing.assert_array_equal(flat, arr.reshape(-1)[slice(*args)])


def test_slice_errors():
    lay = TensorLayout((3, 4), np.float32)
    with pytest.raises(MegBrainError, match="zero"):
        Slice(0, 2, 0).apply(lay, 0)
    with pytest.raises(MegBrainError, match="axis"):
        Slice().apply(lay, 2)
    strided = Slice(None, None, 2).apply(lay, 1).layout
    with pytest.raises(MegBrainError, match="non-contiguous"):
        Slice(0, 2).apply(strided, -1)
    assert Slice(-2).apply(lay, -2).offset_elem == 4  # other negative axes count from the end
    spec = Slice(1, 3).apply(lay, 0)
    assert spec.offset_bytes == 16 and tuple(spec.layout.shape) == (2, 4)
    merged = spec.merge_with(Slice(1, None).apply(spec.layout, 1))
    assert merged.offset_elem == 5


# ---------------------------------------------------------------- Storage


def test_storage_views_share_the_buffer():
    cn = CompNode.load("cpu0")
    s = Storage(cn, 100)
    assert s.size == 100 and s.ptr % 64 == 0 and not s.empty() and s.comp_node == cn
    v = s.sub(40)
    assert v.size == 60 and v.ptr == s.ptr + 40 and v.offset == 40
    s.buffer[40] = 7
    assert v.buffer[v.offset] == 7
    assert v.sub(-40).ptr == s.ptr  # negative offsets within the buffer are fine
    assert s.sub(100).empty()
    with pytest.raises(MegBrainError, match="101 bytes from a view of 100 bytes"):
        s.sub(101)
    with pytest.raises(MegBrainError, match="out of range"):
        v.sub(-41)


def test_storage_ensure_size():
    s = Storage("cpu0", 16)
    v = s.sub(8)
    old = s.buffer
    assert s.ensure_size(16) is s and s.buffer is old
    s.ensure_size(1000)
    assert s.size == 1000 and s.buffer is not old
    assert v.buffer is old  # old views keep the old buffer
    with pytest.raises(MegBrainError, match="can not grow a storage view to 9 bytes: 8"):
        v.ensure_size(9)
    with pytest.raises(MegBrainError):
        Storage(None, 8)
    with pytest.raises(MegBrainError):
        Storage("cpu0", -1)
    assert Storage().empty() and Storage().ptr == 0


def test_storage_from_ndarray_borrows():
    arr = np.arange(10, dtype=np.int32)
    s = Storage.from_ndarray(arr, "cpu0")
    assert s.ptr == arr.ctypes.data and s.size == 40
    arr[0] = 99
    assert s.buffer.view(np.int32)[0] == 99
    with pytest.raises(MegBrainError, match="contiguous"):
        Storage.from_ndarray(np.zeros((4, 4))[:, ::2])


# ---------------------------------------------------------------- TensorND basics


@FAST
@given(shapes, st.sampled_from(DTYPES), st.sampled_from([HostTensorND, DeviceTensorND]))
def test_construct_resize_and_view(shape, dtype, cls):
    t = cls("cpu0", shape, dtype)
    assert type(t) is cls and t.shape == shape and t.dtype == np.dtype(dtype)
    assert t.comp_node == CompNode.load("cpu0") and t.shape_valid()
    a = t.as_ndarray()
    assert a.shape == shape and a.dtype == np.dtype(dtype)
    assert t.storage.size >= a.nbytes and t.empty() == (a.nbytes == 0)
    if a.size:
        assert a.ctypes.data == t.raw_ptr == t.dev_ptr
        a[...] = _arange(shape, dtype)
        np.testing.assert_array_equal(t.to_ndarray(), _arange(shape, dtype))


def test_default_comp_nodes_and_unset_state():
    h, d = HostTensorND(), DeviceTensorND()
    assert h.comp_node is None and not h.shape_valid() and h.empty()
    assert h.resize((2,)).comp_node == CompNode.default_cpu()
    assert d.resize((2,)).comp_node == CompNode.load("xpux")
    with pytest.raises(MegBrainError, match="no shape"):
        HostTensorND().as_ndarray()
    with pytest.raises(MegBrainError, match="dtype is not set"):
        HostTensorND(dtype=None).resize((2,))
    assert "HostTensorND(shape=(2,), dtype=float32" in repr(h)


@pytest.mark.parametrize("bad", [(-1, 2), (2.5,), ("a",)])
def test_bad_shapes_raise(bad):
    with pytest.raises(MegBrainError, match="invalid tensor shape"):
        DeviceTensorND("cpu0", bad)
    with pytest.raises(MegBrainError, match="invalid tensor shape"):
        DeviceTensorND("cpu0", (2,)).resize(bad)


def test_resize_keeps_storage_when_large_enough():
    t = DeviceTensorND("cpu0", (4, 5))
    storage, ptr = t.storage, t.raw_ptr
    t.resize((2, 3))
    assert t.storage is storage and t.raw_ptr == ptr and t.layout.is_contiguous()
    assert t.resize((4, 5)).storage is storage
    t.resize((10, 10))
    assert t.storage is not storage and t.storage.size >= 400


def test_resize_of_a_view_can_not_grow():
    t = DeviceTensorND("cpu0", (4, 4))
    v = t.sub(Slice(2, None).apply(t.layout, 0))
    v.resize((8,))
    with pytest.raises(MegBrainError, match="can not grow"):
        v.resize((9,))


def test_reset_checks_span():
    st_ = Storage("cpu0", 24)
    t = DeviceTensorND().reset(st_, TensorLayout((2, 3), np.float32))
    assert t.storage is st_ and t.shape == (2, 3)
    with pytest.raises(MegBrainError, match="outside its storage"):
        t.reset(st_, TensorLayout((7,), np.float32))
    assert t.shape == (2, 3)


def test_sub_views_share_storage():
    t = HostTensorND.from_ndarray(_arange((4, 6)), "cpu0", borrow=False)
    v = t.sub(Slice(1, 5, 2).apply(t.layout, 1))
    assert type(v) is HostTensorND and v.storage.buffer is t.storage.buffer
    v.as_ndarray()[...] = -1
    expected = _arange((4, 6))
    expected[:, 1:5:2] = -1
    np.testing.assert_array_equal(t.as_ndarray(), expected)
    d = DeviceTensorND("cpu0", (3,))
    assert type(d.sub(Slice(1).apply(d.layout, 0))) is DeviceTensorND


def test_sub_past_the_end_raises():
    t = DeviceTensorND("cpu0", (4, 4))
    spec = SubTensorSpec(TensorLayout((3, 4), np.float32), offset_elem=8)
    with pytest.raises(MegBrainError, match="outside its storage"):
        t.sub(spec)
    with pytest.raises(MegBrainError, match="out of range"):
        t.sub(SubTensorSpec(TensorLayout((1,), np.float32), offset_elem=17))


# ---------------------------------------------------------------- numpy interop


def test_from_ndarray_borrow_and_copy():
    arr = _arange((3, 4))
    borrowed = HostTensorND.from_ndarray(arr)
    copied = HostTensorND.from_ndarray(arr, borrow=False)
    assert borrowed.raw_ptr == arr.ctypes.data and borrowed.comp_node == CompNode.default_cpu()
    arr[1, 2] = 100
    assert borrowed.as_ndarray()[1, 2] == 100
    assert copied.as_ndarray()[1, 2] == 6
    strided = HostTensorND.from_ndarray(arr[:, ::2])  # can not borrow: copied
    arr[0, 0] = -5
    assert strided.as_ndarray()[0, 0] == 0 and strided.layout.is_contiguous()
    dev = DeviceTensorND.from_ndarray(arr, "cpu1")
    assert dev.comp_node == CompNode.load("cpu1") and dev.raw_ptr == arr.ctypes.data


def test_from_ndarray_dtypes():
    assert HostTensorND.from_ndarray(np.float32(3)).shape == (1,)  # no 0-d tensors
    with pytest.raises(ConversionError, match="float64"):
        HostTensorND.from_ndarray(np.zeros(3))
    t = HostTensorND.from_ndarray(np.arange(3.0), dtype=np.float32)
    assert t.dtype == np.float32 and t.to_ndarray().tolist() == [0, 1, 2]
    bf = HostTensorND.from_ndarray(np.ones(5, ml_dtypes.bfloat16))
    assert bf.dtype.itemsize == 2 and bf.storage.size == 10
    q = HostTensorND.from_ndarray(np.array([1, -2], np.int8), dtype=D.qint8(0.25))
    assert D.get_scale(q.dtype) == 0.25 and D.get_scale(q.to_ndarray().dtype) == 0.25
    b4 = HostTensorND.from_ndarray(np.array([1, -2, 7], np.int8), dtype=D.intb4)
    assert b4.dtype.itemsize == 1 and D.dtype_name(b4.as_ndarray().dtype) == "IntB4"


def test_to_ndarray_is_a_copy():
    t = DeviceTensorND.from_ndarray(_arange((2, 2)), "cpu0", borrow=False)
    a = t.to_ndarray()
    a[0, 0] = 50
    assert t.numpy()[0, 0] == 0


# ---------------------------------------------------------------- copies


@FAST
@given(shapes, st.sampled_from(DTYPES))
def test_copy_from_between_nodes(shape, dtype):
    src = HostTensorND.from_ndarray(_arange(shape, dtype), "cpu0")
    dst = DeviceTensorND("cpu1", dtype=dtype).copy_from(src)
    assert dst.shape == shape and dst.layout.is_contiguous()
    back = HostTensorND("cpu:default", dtype=dtype).copy_from(dst)
    np.testing.assert_array_equal(back.as_ndarray(), _arange(shape, dtype))


def test_copy_from_is_async_and_waits_for_the_source_node():
    a, b = CompNode.load("cpu0"), CompNode.load("cpu1")
    src = DeviceTensorND(a, (256,))
    gate = threading.Event()
    a.dispatch(gate.wait, 10)
    a.dispatch(src.as_ndarray().fill, 3.0)  # pending write on the source node
    dst = DeviceTensorND(b)
    assert dst.copy_from(src) is dst
    assert dst.shape == (256,)  # resized at once, data not yet copied
    gate.set()
    dst.sync()
    assert (dst.as_ndarray() == 3).all()


def test_copy_to_host_on_cpu_default_is_synchronous():
    a = CompNode.load("cpu0")
    src = DeviceTensorND(a, (64,))
    a.dispatch(lambda: (threading.Event().wait(0.05), src.as_ndarray().fill(2.0)))
    host = HostTensorND().copy_from(src)  # comp node and dtype taken from src
    assert host.comp_node == a
    host2 = HostTensorND("cpu:default").copy_from(src)
    assert (host2.as_ndarray() == 2).all()


def test_copy_from_adopts_unset_dtype():
    src = HostTensorND.from_ndarray(np.arange(4, dtype=np.int16))
    dst = HostTensorND(dtype=None).copy_from(src)
    assert dst.dtype == np.int16 and dst.to_ndarray().tolist() == [0, 1, 2, 3]


def test_copy_from_errors_leave_destination_untouched():
    dst = DeviceTensorND.from_ndarray(_arange((2, 3)), "cpu0", borrow=False)
    storage = dst.storage
    with pytest.raises(MegBrainError, match="dtype mismatch"):
        dst.copy_from(HostTensorND.from_ndarray(np.zeros(4, np.int32)))
    with pytest.raises(ConversionError):
        dst.copy_from(np.zeros(3, np.float32))
    view = dst.sub(Slice(0, 1).apply(dst.layout, 0))
    with pytest.raises(MegBrainError, match="can not grow"):
        view.copy_from(HostTensorND.from_ndarray(np.zeros(100, np.float32)))
    assert view.shape == (1, 3)
    assert dst.storage is storage and dst.shape == (2, 3)
    np.testing.assert_array_equal(dst.to_ndarray(), _arange((2, 3)))


def test_copy_from_fixlayout():
    dst = DeviceTensorND.from_ndarray(_arange((3, 4)), "cpu0", borrow=False)
    col = dst.sub(Slice(1, 2).apply(dst.layout, 1))
    storage = dst.storage
    col.copy_from_fixlayout(HostTensorND.from_ndarray(np.full((3, 1), -1, np.float32)))
    expected = _arange((3, 4))
    expected[:, 1] = -1
    np.testing.assert_array_equal(dst.to_ndarray(), expected)
    with pytest.raises(MegBrainError, match=r"destination \(3, 4\), source \(4, 3\)"):
        dst.copy_from_fixlayout(HostTensorND.from_ndarray(np.zeros((4, 3), np.float32)))
    with pytest.raises(MegBrainError, match="dtype mismatch"):
        dst.copy_from_fixlayout(HostTensorND.from_ndarray(np.zeros((3, 4), np.int8)))
    assert dst.storage is storage
    np.testing.assert_array_equal(dst.to_ndarray(), expected)


def test_copy_from_reversed_view():
    src = HostTensorND.from_ndarray(_arange((5,)))
    rev = src.sub(Slice(None, None, -1).apply(src.layout, 0))
    dst = DeviceTensorND("cpu1").copy_from(rev)
    assert dst.to_ndarray().tolist() == [4, 3, 2, 1, 0]


def test_copy_error_raised_by_sync():
    ro = np.zeros(4, np.float32)
    ro.flags.writeable = False
    dst = DeviceTensorND.from_ndarray(ro, "cpu0")
    dst.copy_from_fixlayout(HostTensorND.from_ndarray(np.ones(4, np.float32)))
    with pytest.raises(ValueError, match="read-only"):
        dst.sync()
    assert (ro == 0).all()
