"""Subtensor, SetSubtensor and IncrSubtensor and ``SymbolVar.__getitem__``: forward against
NumPy basic indexing, static shape / value inference, dynamic indices, re-runs after a shape
change, memory forwarding and in-place modification, and errors."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opr_harness import check_opr, inputs, make_graph, run

from megbrain.errors import MegBrainError
from megbrain.opr import make_immutable
from megbrain.opr.indexing import SubtensorIndexError, incr_subtensor, set_subtensor

shapes = st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple)


def _arr(shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _np_getitem(a, idx):
    out = a[idx]
    return np.asarray(out).reshape(1) if np.ndim(out) == 0 else out


def _compile(graph, outs):
    got = {}
    spec = [(o.node, (lambda a, i=i: got.__setitem__(i, np.array(a)))) for i, o in enumerate(outs)]
    return graph.compile(spec), got


@st.composite
def basic_index(draw, shape):
    """A tuple of ints and slices (possibly negative, out-of-range bounds) for ``shape``."""
    n = draw(st.integers(1, len(shape)))
    idx = []
    for d in shape[:n]:
        if draw(st.booleans()):
            idx.append(draw(st.integers(-d, d - 1)))
        else:
            bound = st.none() | st.integers(-d - 2, d + 2)
            step = st.none() | st.integers(-3, 3).filter(bool)
            idx.append(slice(draw(bound), draw(bound), draw(step)))
    return tuple(idx)


# ---- Subtensor -------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(data=st.data(), shape=shapes)
def test_subtensor_matches_numpy(data, shape):
    idx = data.draw(basic_index(shape))
    check_opr(lambda x: x[idx], lambda a: _np_getitem(a, idx), [_arr(shape)])


@pytest.mark.parametrize(
    "idx",
    [
        (None, 0),
        (Ellipsis, 1),
        (Ellipsis, None, 0),
        (1, Ellipsis, None),
        (slice(None), None, slice(1, None)),
        (None, Ellipsis, slice(None, None, -1), None),
        (Ellipsis,),
        (slice(None),),
        (-1, -1, -1),
    ],
)
def test_subtensor_newaxis_and_ellipsis(idx):
    check_opr(lambda x: x[idx], lambda a: _np_getitem(a, idx), [_arr((3, 4, 5))])


def test_subtensor_forwards_and_infers_value():
    g = make_graph()
    (x,), _ = inputs(g, _arr((4, 5)))
    y = x[1:3, ::-2]
    f, got = _compile(g, [y])
    f.execute().wait()
    assert f._plan.decisions[y.node][0] == "fwd"
    np.testing.assert_array_equal(got[0], _arr((4, 5))[1:3, ::-2])
    c = make_immutable("cpu0", g, np.arange(12, dtype=np.int32).reshape(3, 4))
    np.testing.assert_array_equal(c[1, 2:].inferred_value, [6, 7])
    np.testing.assert_array_equal(c[2, 3].inferred_value, [11])
    assert x[:] == x


def test_subtensor_symbolic_index_static_and_dynamic():
    a = _arr((5, 3))
    g = make_graph()
    (x,), _ = inputs(g, a)
    (i, j), hosts = inputs(g, np.array([3], np.int32), np.array([1], np.int32))
    (k,), hk = inputs(g, np.array([2], np.int32), value_infer=False)
    y_static = x[i, j:]
    y_dyn = x[:k]
    y_shape = x[x.shape[1] :]  # the index comes from the input's own shape
    assert y_static.node.shape_static and not y_dyn.node.shape_static
    assert y_static.imm_shape == (2,)
    f, got = _compile(g, [y_static, y_dyn, y_shape])
    f.execute().wait()
    np.testing.assert_array_equal(got[0], a[3, 1:])
    np.testing.assert_array_equal(got[1], a[:2])
    np.testing.assert_array_equal(got[2], a[3:])
    hosts[0].arr = np.array([-1], np.int32)
    hk[0].arr = np.array([4], np.int32)
    f.execute().wait()
    np.testing.assert_array_equal(got[0], a[-1, 1:])
    np.testing.assert_array_equal(got[1], a[:4])


def test_subtensor_rerun_after_shape_change():
    g = make_graph()
    (x,), hosts = inputs(g, _arr((4, 5)))
    y = x[1, ::2]
    f, got = _compile(g, [y])
    f.execute().wait()
    assert got[0].shape == (3,)
    b = _arr((3, 7, 2), seed=5)
    hosts[0].arr = b
    f.execute().wait()
    np.testing.assert_array_equal(got[0], b[1, ::2])


def test_subtensor_errors():
    g = make_graph()
    (x,), _ = inputs(g, _arr((3, 4)))
    with pytest.raises(IndexError, match=r"too many indices.*\{3,4\}"):
        x[0, 0, 0]
    with pytest.raises(SubtensorIndexError, match=r"Subtensor.*index 4 out of range.*\{3,4\}"):
        x[:, 4]
    with pytest.raises(IndexError, match="only one ellipsis"):
        x[..., 0, ...]
    with pytest.raises(IndexError, match="advanced_indexing"):
        x[[0, 1]]
    with pytest.raises(MegBrainError, match="step must not be 0"):
        x[::0]
    (k,), hk = inputs(g, np.array([1], np.int32), value_infer=False)
    y = x[k]
    hk[0].arr = np.array([7], np.int32)
    with pytest.raises(MegBrainError, match=r"Subtensor.*index 7 out of range.*\{3,4\}"):
        run([y], g)


def test_subtensor_takes_integral_float_index_vars():
    # the reference casts index values with static_cast_dtype_safe: RPN's per_level_gt slices
    # gt_boxes[:im_info[4]] by a float32 count; a fractional value is refused
    g = make_graph()
    (x, n), hn = inputs(g, _arr((5, 4)), np.array([3.0], np.float32))
    y = x[: n[0]]
    z = set_subtensor(x, np.zeros((1, 4), np.float32))[n[0] : n[0] + 1]
    got = run([y, z], g)
    np.testing.assert_array_equal(got[0], _arr((5, 4))[:3])
    want = _arr((5, 4))
    want[3] = 0
    np.testing.assert_array_equal(got[1], want)
    hn[1].arr = np.array([2.5], np.float32)
    with pytest.raises(MegBrainError, match=r"index value 2.5 \(float32\) is not an integer"):
        run([y], g)


# ---- SetSubtensor / IncrSubtensor ------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(data=st.data(), shape=shapes, incr=st.booleans())
def test_modify_subtensor_matches_numpy(data, shape, incr):
    idx = data.draw(basic_index(shape))
    sub_shape = _np_getitem(np.empty(shape), idx).shape
    # the value: the subtensor's shape or a broadcastable one
    # (size 1 where the part is empty: a zero-size host input reads as "no value")
    vshape = tuple(1 if s == 0 or data.draw(st.booleans()) else s for s in sub_shape)

    def ref(a, v):
        out = a.copy()
        view = out[(*idx, Ellipsis)]
        view = view.reshape(1) if view.ndim == 0 else view
        if incr:
            view += v
        else:
            view[...] = v
        return out

    fn = incr_subtensor if incr else set_subtensor
    check_opr(lambda x, v: fn(x, v)[idx], ref, [_arr(shape), _arr(vshape, seed=1)])


def test_modify_subtensor_inplace_and_copy():
    a, v = _arr((4, 3)), _arr((3,), seed=1)
    g = make_graph()
    (x, y), _ = inputs(g, a, v)
    doubled = x * 2
    s_inplace = set_subtensor(doubled, y)[1]
    f, got = _compile(g, [s_inplace])
    f.execute().wait()
    assert f._plan.decisions[s_inplace.node] == ("inplace", 0)
    ref = a * 2
    ref[1] = v
    np.testing.assert_array_equal(got[0], ref)

    g = make_graph()
    (x, y), _ = inputs(g, a, v)
    doubled = x * 2
    inc = incr_subtensor(doubled, y)[::2]
    later = doubled * 3  # reads doubled after the IncrSubtensor ran: no in-place
    f, got = _compile(g, [inc, later])
    f.execute().wait()
    assert f._plan.decisions[inc.node][0] == "alloc"
    ref = a * 2
    ref[::2] += v
    np.testing.assert_allclose(got[0], ref)
    np.testing.assert_allclose(got[1], a * 6)


def test_modify_subtensor_dynamic_index_scalar_value_and_rerun():
    a = _arr((4, 3))
    g = make_graph()
    (x,), hx = inputs(g, a)
    (k,), hk = inputs(g, np.array([2], np.int32), value_infer=False)
    y = set_subtensor(x, 5.0)[k:, 1]
    assert y.node.shape_static  # the output shape is src's, whatever the index
    f, got = _compile(g, [y])
    f.execute().wait()
    ref = a.copy()
    ref[2:, 1] = 5
    np.testing.assert_array_equal(got[0], ref)
    b = _arr((6, 2), seed=2)
    hx[0].arr = b
    hk[0].arr = np.array([-1], np.int32)
    f.execute().wait()
    ref = b.copy()
    ref[-1:, 1] = 5
    np.testing.assert_array_equal(got[0], ref)
    c = make_immutable("cpu0", g, np.zeros((2, 2), np.float32))
    np.testing.assert_array_equal(incr_subtensor(c, 1.0)[0, 1].inferred_value, [[0, 1], [0, 0]])


def test_modify_subtensor_errors():
    g = make_graph()
    (x, v), _ = inputs(g, _arr((4, 3)), _arr((2,)))
    with pytest.raises(MegBrainError, match=r"SetSubtensor.*\{2\}.*subtensor shape \{3\}"):
        set_subtensor(x, v)[0]
    with pytest.raises(MegBrainError, match=r"IncrSubtensor.*\{2\}.*subtensor shape \{4\}"):
        incr_subtensor(x, v)[:, 1]
    (k,), _ = inputs(g, np.array([1], np.int32), value_infer=False)
    y = set_subtensor(x, v)[k]  # the index is only known when running
    with pytest.raises(MegBrainError, match=r"SetSubtensor.*\{2\}.*subtensor shape \{3\}"):
        run([y], g)
    (i,), _ = inputs(g, np.zeros(3, np.int32))
    with pytest.raises(MegBrainError, match="SetSubtensor.*dtype of src.*float32, int32"):
        set_subtensor(x, i)[0]
    with pytest.raises(IndexError, match="newaxis"):
        set_subtensor(x, v)[None, 0]
