"""Semantics that code written against the reference binding (MegEngine 0.6's layer) relies
on: truthiness, var-carrying objects, scalars as shape (1,), shape descriptors, eager
re-evaluation of deduplicated operators and the memory-allocation report."""

import json

import numpy as np
import pytest

import megbrain as mgb


def _graph(**opts):
    g = mgb.comp_graph()
    for k, v in opts.items():
        g.set_option(k, v)
    return g


def _run(g, *vars_):
    f = g.compile([], [mgb.copy_output(v) for v in vars_])
    return f()


class _Carrier:
    """Carries a var the way MegEngine's Tensor does (``__mgb_symvar__``)."""

    def __init__(self, var):
        self.var = var
        self.calls = 0

    def __mgb_symvar__(self, comp_graph=None, **_):
        self.calls += 1
        return self.var


def test_symbolvar_is_always_true():
    g = _graph()
    x = mgb.make_immutable("cpu0", g, np.zeros(3, np.float32))
    assert bool(x) is True
    assert (x or None) is x


def test_var_carrying_objects_give_the_graph_when_no_input_is_a_symbolvar():
    g = _graph()
    x = mgb.make_shared("cpu0", value=np.arange(3, dtype=np.float32), comp_graph=g)
    c = _Carrier(x)
    y = mgb.opr.elemwise(c, 2.0, mode="MUL")
    assert y.owner_graph is g
    np.testing.assert_array_equal(_run(g, y)[0], [0, 2, 4])
    # several carriers, and the concat of carried vars
    z = mgb.opr.concat([c, _Carrier(y)], axis=0)
    np.testing.assert_array_equal(_run(g, z)[0], [0, 1, 2, 0, 2, 4])


def test_var_carrying_shape_inputs_are_not_baked_into_constants():
    g = _graph()
    num = mgb.SharedND(mgb.comp_node("cpu0"), np.int32)
    num.set_value(np.array([5], np.int32))
    nv = num.symvar(g, volatile=True)
    y = mgb.opr.linspace(0.0, 1.0, _Carrier(nv), comp_graph=g, comp_node="cpu0")
    f = g.compile([], mgb.copy_output(y))
    assert f().shape == (5,)
    num.set_value(np.array([3], np.int32))
    np.testing.assert_allclose(f(), [0, 0.5, 1])


def test_scalars_have_shape_1():
    g = _graph()
    c = mgb.make_immutable("cpu0", g, 3.0)
    assert c.imm_shape == (1,)
    x = mgb.make_shared("cpu0", value=np.arange(6, dtype=np.float32).reshape(2, 3), comp_graph=g)
    assert x.sum().imm_shape == (1,)
    assert x[1, 2].imm_shape == (1,)
    assert c.inferred_value[0] == 3.0
    # a 1-d src indexes with a (1,) index
    v = mgb.make_shared("cpu0", value=np.array([4.0, 5.0], np.float32), comp_graph=g)
    one = mgb.opr.indexing_one_hot(v, 0, np.array([1], np.int32))
    np.testing.assert_array_equal(_run(g, one)[0], [5.0])


def test_shape_descriptors_mix_ints_scalar_and_vector_vars():
    g = _graph()
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    x = mgb.make_shared("cpu0", value=a, comp_graph=g)
    vec = mgb.make_shared("cpu0", value=np.array([4, 4], np.int32), comp_graph=g)
    two = mgb.make_shared("cpu0", value=np.array([2], np.int32), comp_graph=g)
    assert x.reshape(vec, 1).imm_shape == (4, 4, 1)
    assert x.reshape([two, 2, two * 2, 1]).imm_shape == (2, 2, 4, 1)
    b = mgb.opr.broadcast(mgb.make_immutable("cpu0", g, 1.0), [vec, two])
    assert b.imm_shape == (4, 4, 2)
    r = _run(g, x.reshape(vec, 1))[0]
    np.testing.assert_array_equal(r, a.reshape(4, 4, 1))


@pytest.mark.parametrize("bad", [[(2, 2)], [1.5], ["a"]])
def test_bad_shape_descriptor_is_an_assertion_error(bad):
    g = _graph()
    x = mgb.make_shared("cpu0", value=np.zeros(4, np.float32), comp_graph=g)
    with pytest.raises(AssertionError, match="bad shape element") as info:
        x.reshape(bad)
    assert isinstance(info.value, mgb.ShapeDescError)
    assert isinstance(info.value, mgb.MegBrainError)


def test_reduce_along_an_axis_of_a_var_without_static_ndim():
    g = _graph()
    x = mgb.make_shared("cpu0", value=np.arange(6, dtype=np.float32), comp_graph=g)
    mask = mgb.make_shared("cpu0", value=np.array([1, 0, 1, 1, 0, 1], np.float32), comp_graph=g)
    taken, _ = mgb.opr.cond_take(x, mask, mode="EQ", val=1)
    s = mgb.opr.reduce_(taken, "SUM", 0)
    neg = mgb.opr.reduce_(taken, "MAX", -1, keepdims=True)
    got_s, got_neg = _run(g, s, neg)
    np.testing.assert_array_equal(got_s, [0 + 2 + 3 + 5])
    np.testing.assert_array_equal(got_neg, [5])


@pytest.mark.parametrize(
    "idx",
    [
        ([0, 1], None, slice(1, 3)),
        (None, [1, 0]),
        (Ellipsis, None, [0, 3]),
        ([1], Ellipsis, None),
    ],
)
def test_advanced_indexing_with_newaxis(idx):
    g = _graph()
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    x = mgb.make_shared("cpu0", value=a, comp_graph=g)
    got = _run(g, mgb.opr.advanced_indexing(x)[idx])[0]
    np.testing.assert_array_equal(got, a[idx])


def test_setting_by_index_rejects_newaxis():
    g = _graph()
    x = mgb.make_shared("cpu0", value=np.zeros((2, 3), np.float32), comp_graph=g)
    v = mgb.make_shared("cpu0", value=np.ones((1, 2, 3), np.float32), comp_graph=g)
    with pytest.raises(IndexError, match="newaxis"):
        mgb.opr.set_advanced_indexing(x, v)[None, [0, 1]]


def test_eager_dedup_reruns_after_shared_value_changed():
    g = _graph(eager_evaluation=True)
    snd = mgb.SharedND(mgb.comp_node("cpu0"), np.int32)
    snd.set_value(np.array([0], np.int32))

    def sym():
        return snd.symvar(g, volatile=True)

    y = sym() * 2
    np.testing.assert_array_equal(y.eager_val.get_value(), [0])
    snd.set_value(np.array([1, 1], np.int32))  # the graph is not told
    np.testing.assert_array_equal((sym() * 2).eager_val.get_value(), [2, 2])
    # a reader of a re-run operator re-runs once when inserted again
    np.testing.assert_array_equal((sym() * 2 + 1).eager_val.get_value(), [3, 3])
    snd.set_value(np.array([5, 6], np.int32))  # same shape: copied in place
    np.testing.assert_array_equal((sym() * 2 + 1).eager_val.get_value(), [11, 13])


def test_node_ids_start_at_zero():
    g = _graph()
    x = mgb.make_immutable("cpu0", g, np.zeros(2, np.float32))
    assert x.owner_opr.id == 0


def _entries(info: str) -> dict:
    out = {}
    for e in json.loads(info):
        ((k, body),) = e.items()
        out[int(k)] = body
    return out


def test_mem_allocation_info_of_an_eager_graph_shows_add_update_in_place():
    g = _graph(eager_evaluation=True)
    x = mgb.make_shared("cpu0", value=np.arange(16, dtype=np.float32), comp_graph=g)
    y = mgb.opr.elem.relu(x)
    before = _entries(g.get_mem_allocation_info())
    assert before[x.owner_opr.id]["output"][0]["memory"] == 64
    assert before[y.owner_opr.id]["name"] == y.owner_opr.name
    up = mgb.opr.add_update(x, y, alpha=0.5, beta=mgb.SharedScalar(2.0))
    after = _entries(g.get_mem_allocation_info())
    new = set(after) - set(before)
    assert new == {up.owner_opr.id}  # one operator: the coefficients are no vars
    out = after[up.owner_opr.id]["output"][0]
    assert out["memory"] == 64
    assert out["dev_ptr"] == before[x.owner_opr.id]["output"][0]["dev_ptr"]
    np.testing.assert_array_equal(x.get_value(), np.arange(16) * 2.5)


def test_mem_allocation_info_of_a_compiled_function():
    g = _graph()
    x = mgb.make_arg("cpu0", g, shape=(4, 8), name="x")
    y = mgb.opr.elem.exp(x) * 2
    assert all(
        b["output"][0]["memory"] is None for b in _entries(g.get_mem_allocation_info()).values()
    )
    f = g.compile([x], mgb.copy_output(y))
    f(np.ones((4, 8), np.float32))
    info = _entries(g.get_mem_allocation_info())
    assert info[y.owner_opr.id]["output"][0]["memory"] == 4 * 8 * 4
    assert info[y.owner_opr.id]["output"][0]["dev_ptr"]


def test_add_update_coefficients():
    g = _graph()
    w = mgb.make_shared("cpu0", value=np.ones(3, np.float32), comp_graph=g)
    lr = mgb.SharedScalar(0.5)
    half = mgb.make_immutable("cpu0", g, np.array([0.5], np.float32))
    up = mgb.opr.add_update(w, np.full(3, 2, np.float32), alpha=half * 4, beta=lr, bias=1)
    assert [v.name for v in mgb.cgtools.get_inputs(up)][0] == w.name
    f = g.compile([], [up])
    f()
    np.testing.assert_allclose(w.get_value(), 1 * 2 + 2 * 0.5 + 1)
    lr.set(0.0)  # no recompile
    f()
    np.testing.assert_allclose(w.get_value(), 4 * 2 + 1)
    with pytest.raises(mgb.GraphError, match="alpha must be a number or a SharedScalar"):
        mgb.opr.add_update(w, w, alpha="x")


def test_reduce_to_a_scalar_target_shape_of_any_ndim():
    """A (1,) target reduces everything, as the reference's Reduce allows; gradients through
    dynamic shapes build such reductions."""
    g = _graph()
    a = np.array([[1, -2, 3], [-4, 5, 6]], np.float32)
    x = mgb.make_shared("cpu0", value=a, comp_graph=g)
    r = mgb.opr.reduce_general(x, [1], mode="SUM")
    assert r.imm_shape == (1,)
    t = mgb.opr.cond_take(x, x, mode="GT", val=0.0)[0]
    gx = mgb.grad((x * t.sum()).sum(), x, use_virtual_grad=False)
    got_r, got_g = _run(g, r, gx)
    np.testing.assert_array_equal(got_r, [a.sum()])
    np.testing.assert_array_equal(got_g, a[a > 0].sum() + a.sum() * (a > 0))


def test_imm_shape_is_the_current_shape_and_never_raises():
    # MegBrain's _get_imm_shape: the node's shape, empty while unknown (MegEngine's F.argsort
    # asks len(imm_shape) of a var of run-time shape)
    g = _graph()
    cn = mgb.comp_node("cpu0")
    x = mgb.make_shared(cn, value=np.array([1, 0, 2, 0], np.float32), comp_graph=g)
    taken, _ = mgb.opr.cond_take(x, x, mode="EQ", val=0)
    assert x.imm_shape == (4,)
    assert taken.imm_shape == ()
    assert taken.ndim == 0
    pending = mgb.make_arg(cn, g, dtype=np.float32)  # an input without a value yet
    assert pending.imm_shape == ()
    _run(g, taken)
    assert taken.imm_shape == (2,)
