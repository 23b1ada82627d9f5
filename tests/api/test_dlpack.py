"""Zero-copy interop: SharedND and callback value proxies export DLPack and the NumPy array
protocol; mgb.from_dlpack imports NumPy/torch/JAX arrays without copying."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import megbrain as mgb
from megbrain.errors import ConversionError, MegBrainError

DTYPES = [np.float32, np.float16, np.int32, np.int16, np.int8, np.uint8, np.bool_]


@settings(max_examples=25, deadline=None)
@given(
    shape=st.lists(st.integers(1, 4), min_size=0, max_size=3).map(tuple),
    dtype=st.sampled_from(DTYPES),
)
def test_numpy_round_trip_shares_memory(shape, dtype):
    rng = np.random.default_rng(0)
    src = np.asarray(rng.standard_normal(shape) * 10).astype(dtype)
    snd = mgb.from_dlpack(src)
    view = np.asarray(snd)
    assert view.dtype == np.dtype(dtype)
    assert view.shape == (src.shape or (1,))
    assert np.shares_memory(view, src)
    back = np.from_dlpack(snd)
    assert np.shares_memory(back, src)
    np.testing.assert_array_equal(back.reshape(src.shape), src)


def test_writes_are_seen_both_ways_and_by_graphs():
    src = np.arange(6, dtype=np.float32).reshape(2, 3)
    snd = mgb.from_dlpack(src)
    g = mgb.comp_graph()
    f = g.compile([], mgb.copy_output(snd.symvar(g) * 2))
    np.testing.assert_array_equal(f(), src * 2)
    src[0, 0] = 100
    assert f()[0, 0] == 200
    np.asarray(snd)[1, 2] = -1
    assert src[1, 2] == -1
    snd.set_value(np.full((2, 3), 7, np.float32))  # same shape: written in place
    assert (src == 7).all()


def test_asarray_of_shared_nd_does_not_copy():
    snd = mgb.make_shared("cpu0", value=np.ones((3, 4), np.float32))
    a, b = np.asarray(snd), np.asarray(snd)
    assert np.shares_memory(a, b)
    a[0, 0] = 5
    assert snd.get_value()[0, 0] == 5
    c = np.array(snd)  # copy=True by default for np.array
    assert not np.shares_memory(a, c)
    assert np.asarray(snd, dtype=np.float64).dtype == np.float64
    assert snd.__dlpack_device__() == (1, 0)


def test_empty_shared_nd_refuses_export():
    snd = mgb.SharedND("cpu0", np.float32)
    with pytest.raises(MegBrainError, match="empty"):
        np.asarray(snd)
    with pytest.raises(MegBrainError, match="empty"):
        snd.__dlpack__()


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda: np.arange(6, dtype=np.float32).reshape(2, 3).T, "not C-contiguous"),
        (lambda: np.arange(8, dtype=np.float32)[::2], "not C-contiguous"),
        (lambda: np.arange(3, dtype=np.float64), "float64 is not supported"),
        (lambda: np.zeros(3, np.complex64), "complex64 is not supported"),
    ],
)
def test_unshareable_sources_raise_unless_copy(make, reason):
    src = make()
    with pytest.raises(ConversionError, match=reason) as info:
        mgb.from_dlpack(src)
    assert "copy=True" in str(info.value)
    with pytest.raises(ConversionError, match=reason):
        mgb.from_dlpack(src, copy=False)
    if src.dtype == np.complex64:
        with pytest.raises(ConversionError, match="complex64"):
            mgb.from_dlpack(src, copy=True)
        return
    snd = mgb.from_dlpack(src, copy=True)
    assert not np.shares_memory(np.asarray(snd), src)
    np.testing.assert_allclose(snd.get_value(), src)


def test_read_only_source_raises_unless_copy():
    src = np.arange(4, dtype=np.int32)
    src.flags.writeable = False
    with pytest.raises(ConversionError, match="read-only"):
        mgb.from_dlpack(src)
    snd = mgb.from_dlpack(src, copy=True)
    np.testing.assert_array_equal(snd.get_value(), src)
    np.asarray(snd)[0] = 9  # the copy is ours to write
    assert src[0] == 0


def test_copy_true_always_copies():
    src = np.ones(3, np.float32)
    snd = mgb.from_dlpack(src, copy=True)
    assert not np.shares_memory(np.asarray(snd), src)


def test_non_dlpack_object_raises():
    with pytest.raises(ConversionError, match="list has no __dlpack__"):
        mgb.from_dlpack([1.0, 2.0])


def test_callback_value_proxy_exports():
    g = mgb.comp_graph()
    x = mgb.make_arg("cpu0", g, shape=(2, 2), name="x")
    seen = {}

    def cb(proxy):
        seen["device"] = proxy.__dlpack_device__()
        seen["dl"] = np.from_dlpack(proxy).copy()
        a = np.asarray(proxy)
        seen["shares"] = np.shares_memory(a, proxy.get_value(borrow_mem=True))

    f = g.compile([x], [(x * 3, mgb.callback_lazycopy(cb))])
    f(np.ones((2, 2), np.float32))
    f.wait()
    assert seen["device"] == (1, 0)
    assert seen["shares"]
    np.testing.assert_array_equal(seen["dl"], np.full((2, 2), 3, np.float32))


def test_torch_round_trip():
    torch = pytest.importorskip("torch")
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    snd = mgb.from_dlpack(t)
    assert np.shares_memory(np.asarray(snd), t.numpy())
    t[0, 0] = 42
    assert snd.get_value()[0, 0] == 42
    back = torch.from_dlpack(snd)
    back[1, 1] = -5
    assert t[1, 1].item() == -5
    with pytest.raises(ConversionError, match="not C-contiguous"):
        mgb.from_dlpack(t.t())
    np.testing.assert_array_equal(mgb.from_dlpack(t.t(), copy=True).get_value(), t.t().numpy())
    with pytest.raises(ConversionError, match="complex128 is not supported"):
        mgb.from_dlpack(torch.zeros(2, dtype=torch.complex128))
    with pytest.raises(ConversionError, match="through DLPack"):
        mgb.from_dlpack(torch.zeros(2, dtype=torch.bfloat16))  # NumPy's DLPack lacks bfloat16


def test_jax_round_trip():
    jnp = pytest.importorskip("jax.numpy")
    a = jnp.arange(4, dtype=jnp.float32)
    # JAX arrays are immutable: sharing them would let megbrain write into them
    snd = mgb.from_dlpack(a, copy=True)
    np.testing.assert_array_equal(snd.get_value(), np.arange(4, dtype=np.float32))
