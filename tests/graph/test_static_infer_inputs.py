"""Inputs read only through static inference: a var whose shape, or whose value as an index
or a target shape, is all the function reads is still an input of the function, and a new
shape or value re-infers and re-plans before the run (RT_STATIC sources of the comp seq)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import megbrain as mgb

CN = "cpu0"
F32 = np.float32
I32 = np.int32
X = np.arange(20, dtype=F32).reshape(5, 4)


def _graph(**opts) -> mgb.CompGraph:
    g = mgb.comp_graph()
    for k, v in opts.items():
        g.set_option(k.replace("__", "."), v)
    return g


def _index_graph(g):
    x = mgb.make_arg(CN, g, name="x", value=X)
    i = mgb.make_arg(CN, g, name="i", dtype=I32, value=np.array([1], I32))
    return x, i


def _names(f) -> list[str]:
    return [v.name for v in f.inputs]


# ---- indexing by a var --------------------------------------------------------------------
@pytest.mark.parametrize("opts", [{}, {"async_exec_level": 0b110}, {"force_dynamic_alloc": 1}])
def test_index_var_is_an_input_and_each_value_is_read(opts):
    g = _graph(**opts)
    x, i = _index_graph(g)
    f = g.compile(None, mgb.copy_output(x[i]))
    assert _names(f) == ["x", "i"]
    for k in (2, 3, 1, 0, -1, -5):
        np.testing.assert_array_equal(f(x=X, i=np.array([k], I32)), X[k])


def test_index_var_positional_inputs():
    g = _graph()
    x, i = _index_graph(g)
    f = g.compile([x, i], mgb.copy_output(x[i]))
    np.testing.assert_array_equal(f(X, np.array([4], I32)), X[4])
    np.testing.assert_array_equal(f(X * 2, np.array([2], I32)), X[2] * 2)


@pytest.mark.parametrize("bad", [5, 7, -6])
def test_index_out_of_range_names_the_operator(bad):
    g = _graph()
    x, i = _index_graph(g)
    f = g.compile([x, i], mgb.copy_output(x[i]))
    with pytest.raises(
        mgb.MegBrainError, match=rf"Subtensor .*index {bad} out of range.*\{{5,4\}}"
    ):
        f(X, np.array([bad], I32))
    # the function still runs with a good index afterwards
    np.testing.assert_array_equal(f(X, np.array([3], I32)), X[3])
    with pytest.raises(mgb.MegBrainError, match="out of range"):
        f(X, np.array([bad], I32))
    np.testing.assert_array_equal(f(X, np.array([1], I32)), X[1])


def test_slice_by_var_follows_the_value():
    g = _graph()
    x, i = _index_graph(g)
    f = g.compile([x, i], mgb.copy_output(x[i:]))
    for k in (1, 3, 0, 4):
        got = f(X, np.array([k], I32))
        assert got.shape == X[k:].shape
        np.testing.assert_array_equal(got, X[k:])


def test_index_var_without_an_initial_value():
    g = _graph()
    x = mgb.make_arg(CN, g, name="x", shape=(5, 4))
    i = mgb.make_arg(CN, g, name="i", dtype=I32, shape=(1,))
    f = g.compile([x, i], [mgb.copy_output(x[i]), mgb.copy_output(x[i:])])
    for k in (2, 4):
        row, rest = f(X, np.array([k], I32))
        np.testing.assert_array_equal(row, X[k])
        np.testing.assert_array_equal(rest, X[k:])


def test_index_var_without_a_value_or_shape():
    g = _graph()
    x = mgb.make_arg(CN, g, name="x", dtype=F32)
    i = mgb.make_arg(CN, g, name="i", dtype=I32)
    f = g.compile(None, mgb.copy_output(x[i]))
    assert _names(f) == ["x", "i"]
    np.testing.assert_array_equal(f(x=X, i=np.array([3], I32)), X[3])


# ---- shapes of other inputs ---------------------------------------------------------------
def test_reshape_to_the_shape_of_another_input():
    g = _graph()
    c = mgb.make_arg(CN, g, name="c", value=np.arange(6, dtype=F32))
    b = mgb.make_arg(CN, g, name="b", value=np.zeros((2, 3), F32))
    f = g.compile([c, b], mgb.copy_output(c.reshape(b.shape)))
    assert _names(f) == ["c", "b"]
    for shape in [(3, 2), (6,), (1, 2, 3), (2, 3)]:
        got = f(np.arange(6, dtype=F32), np.zeros(shape, F32))
        np.testing.assert_array_equal(got, np.arange(6, dtype=F32).reshape(shape))
    with pytest.raises(mgb.MegBrainError, match=r"Reshape .*can not reshape \{6\}.* to \{4\}"):
        f(np.arange(6, dtype=F32), np.zeros(4, F32))


def test_reshape_keyword_inputs_are_not_ignored():
    g = _graph()
    c = mgb.make_arg(CN, g, name="c", value=np.arange(6, dtype=F32))
    b = mgb.make_arg(CN, g, name="b", value=np.zeros((2, 3), F32))
    f = g.compile(None, mgb.copy_output(c.reshape(b.shape)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "extra inputs ignored"
        got = f(c=np.arange(6, dtype=F32), b=np.zeros((3, 2), F32))
    assert got.shape == (3, 2)


def test_gradient_reading_only_the_shape_of_an_input():
    g = _graph()
    x = mgb.make_arg(CN, g, name="x", value=np.ones((2, 3), F32))
    b = mgb.make_shared(CN, value=np.ones(3, F32), comp_graph=g, name="b")
    f = g.compile([x], mgb.copy_output(mgb.grad(((x + b) * 2).sum(), b)))
    assert _names(f) == ["x"]
    for rows in (2, 5, 1):
        np.testing.assert_array_equal(f(np.zeros((rows, 3), F32)), np.full(3, 2.0 * rows))


def test_x_div_x_simplified_to_a_fill_of_its_shape():
    g = _graph(graph_opt_level=1)
    x = mgb.make_arg(CN, g, name="x", value=np.ones((2, 3), F32))
    f = g.compile([x], mgb.copy_output(x / x))
    assert [o.type_name for o in f._func.iter_opr_seq()] == ["ImmutableTensor", "Broadcast"]
    for shape in [(2, 3), (4,), (1, 5, 2)]:
        np.testing.assert_array_equal(f(np.full(shape, 3, F32)), np.ones(shape, F32))


def test_fill_retain_dtype_follows_the_input_shape():
    g = _graph()
    x = mgb.make_arg(CN, g, name="x", value=np.ones((2, 3), F32))
    f = g.compile([x], mgb.copy_output(x.fill_retain_dtype(7)))
    for shape in [(2, 3), (7,)]:
        np.testing.assert_array_equal(f(np.zeros(shape, F32)), np.full(shape, 7, F32))


# ---- what is watched ----------------------------------------------------------------------
def test_rt_static_source_deps_say_what_is_read():
    g = _graph()
    x, i = _index_graph(g)
    b = mgb.make_arg(CN, g, name="b", value=np.zeros((4, 5), F32))
    f = g.compile(None, [mgb.copy_output(x[i]), mgb.copy_output(x.reshape(b.shape))])
    deps = {v.name: value for v, value in f._func.get_rt_static_source_deps()}
    # x's shape decides every output shape; i's value is an index; only b's shape is read
    assert deps == {"x": False, "i": True, "b": False}
    assert _names(f) == ["x", "i", "b"]


def test_a_new_value_of_a_shape_only_input_keeps_the_plan():
    g = _graph()
    c = mgb.make_arg(CN, g, name="c", value=np.arange(6, dtype=F32))
    b = mgb.make_arg(CN, g, name="b", value=np.zeros((2, 3), F32))
    f = g.compile([c, b], mgb.copy_output(c.reshape(b.shape)))
    f(np.arange(6, dtype=F32), np.zeros((2, 3), F32))
    plan = f._func._plan
    f(np.arange(6, dtype=F32), np.ones((2, 3), F32))  # same shape: nothing to re-plan
    assert f._func._plan is plan
    f(np.arange(6, dtype=F32), np.ones((3, 2), F32))
    assert f._func._plan is not plan


def test_multi_part_inputs_read_through_static_inference():
    g = _graph()
    x, i = _index_graph(g)
    b = mgb.make_arg(CN, g, name="b", value=np.zeros((4, 5), F32))
    f0, f1 = g.compile_multi_part(
        [(None, [mgb.copy_output(x * 2.0)]), (None, [mgb.copy_output((x * 2.0).reshape(b.shape))])]
    )
    assert _names(f0) == ["x"]
    assert _names(f1) == ["b"]  # x * 2 was computed by part 0
    np.testing.assert_array_equal(f0(x=X)[0], X * 2)
    np.testing.assert_array_equal(f1(b=np.zeros((2, 10), F32))[0], (X * 2).reshape(2, 10))


@pytest.mark.parametrize("how", ["copy", "eager"])
def test_inputs_through_a_graph_copy(how):
    g = _graph(eager_evaluation=1) if how == "eager" else _graph()
    x, i = _index_graph(g)
    b = mgb.make_arg(CN, g, name="b", value=np.zeros((4, 5), F32))
    f = g.compile(
        [x, i, b],
        [mgb.copy_output(x[i]), mgb.copy_output(x.reshape(b.shape))],
        copy=how == "copy",
    )
    row, resh = f(X, np.array([3], I32), np.zeros((10, 2), F32))
    np.testing.assert_array_equal(row, X[3])
    np.testing.assert_array_equal(resh, X.reshape(10, 2))


def test_multi_part_later_input_changes_shape_between_parts():
    g = _graph()
    x = mgb.make_arg(CN, g, name="x", value=np.ones(3, F32))
    y = mgb.make_arg(CN, g, name="y", value=np.ones(3, F32))
    f0, f1 = g.compile_multi_part(
        [(None, [mgb.copy_output(x + 1.0)]), (None, [mgb.copy_output(y * 2.0 + (x + 1.0).sum())])]
    )
    for n in (3, 5, 2):
        np.testing.assert_array_equal(f0(x=np.ones(3, F32))[0], np.full(3, 2, F32))
        got = f1(y=np.arange(n, dtype=F32))[0]
        np.testing.assert_array_equal(got, np.arange(n, dtype=F32) * 2 + 6)


def test_multi_part_earlier_input_changed_before_a_later_part():
    g = _graph()
    x = mgb.make_arg(CN, g, name="x", value=np.ones(3, F32))
    f0, f1 = g.compile_multi_part(
        [(None, [mgb.copy_output(x + 1.0)]), (None, [mgb.copy_output((x + 1.0) * 2.0)])]
    )
    f0(x=np.ones(3, F32))
    x.set_value(np.ones(4, F32))  # x + 1 of part 0 had shape (3,)
    with pytest.raises(mgb.GraphError, match=r"computed by an earlier part has shape \{3\}"):
        f1()
    # a sequence started again from part 0 sees the new shape
    f0()
    np.testing.assert_array_equal(f1()[0], np.full(4, 4, F32))


def test_shapes_depending_on_an_input_value_keep_the_graph_inferer_while_it_is_unchanged():
    # a detector's gt_boxes[:, :im_info[4]]: every later insertion infers a shape that reads
    # the input's value; the graph's inferer is kept until that value changes (a fresh one
    # per insertion re-walked the whole graph: RetinaNet's first training step took minutes)
    from megbrain.graph import static_infer

    g = _graph()
    x = mgb.make_arg(CN, g, name="x", value=X)
    n = mgb.make_arg(CN, g, name="n", dtype=I32, value=np.array([3], I32))
    y = x[:, : n[0]]
    assert y.imm_shape == (5, 3)
    inf = g._shape_inferer
    for _ in range(20):
        y = y * 2 + 1
    assert y.imm_shape == (5, 3)
    assert g._shape_inferer is inf
    n.set_value(np.array([2], I32))
    assert y.imm_shape == (5, 2)
    assert g._shape_inferer is not inf
    assert static_infer.infer_shape(y.node) == (5, 2)


def test_source_shapes_are_re_read_only_after_a_layout_change(monkeypatch):
    # QAT graphs watch hundreds of volatile shared tensors: re-reading every watched shape at
    # each insertion was quadratic; TensorND.layout_epoch says when a shape may have changed
    from megbrain.opr.io import VolatileSharedDeviceTensor

    g = _graph()
    shared = [mgb.SharedND(CN, F32) for _ in range(3)]
    for s in shared:
        s.set_value(np.ones(4, F32))
    vs = [s.symvar(g, volatile=True) for s in shared]
    y = vs[0] + vs[1] + vs[2]
    assert y.imm_shape == (4,)
    reads = []
    orig = VolatileSharedDeviceTensor.infer_shapes
    monkeypatch.setattr(
        VolatileSharedDeviceTensor,
        "infer_shapes",
        lambda self, *a: (reads.append(self), orig(self, *a))[1],
    )
    for _ in range(10):
        y = y * 2
    assert y.imm_shape == (4,)
    assert reads == []
    shared[1].set_value(np.ones(4, F32))  # same shape: re-read once, the inferer kept
    inf = g._shape_inferer
    assert (y * 3).imm_shape == (4,)
    assert g._shape_inferer is inf and reads
    for s in shared:
        s.set_value(np.ones(5, F32))
    assert y.imm_shape == (5,)
