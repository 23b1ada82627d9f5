"""The reference's inference preset: marker removal, fused arithmetic expanded and fused
again, chains reordered by size, parameters merged into one MultipleDeviceTensorHolder;
each pass keeps the numbers of the unoptimized graph."""

from __future__ import annotations

import numpy as np
import pytest

import megbrain as mgb
from megbrain.errors import MegBrainError
from megbrain.gopt.inference import INFERENCE_PASSES, InferenceOptions
from megbrain.graph import InferType, static_shape
from megbrain.graph.replace import dep_oprs, replace_vars
from megbrain.opr.dnn import convolution
from megbrain.opr.io import MultipleDeviceTensorHolder, multiple_device_tensor_holder
from megbrain.opr.utility import identity, mark_no_broadcast_elemwise
from megbrain.tensor import DeviceTensorND

CN = "cpu0"
F32 = np.float32


def _graph():
    g = mgb.comp_graph(check_env_var=False)
    g.set_option("log_level", 0)
    return g


def _shared(g, value, name):
    return mgb.make_shared(CN, value=np.asarray(value, F32), comp_graph=g, name=name)


def _run(ys, feed):
    g = ys[0].owner_graph
    f = g.compile(None, [mgb.copy_output(v) for v in ys])
    names = {v.name for v in f.inputs}
    return f(**{k: v for k, v in feed.items() if k in names})


def _same(before, after, feed):
    for a, b in zip(_run([before], feed), _run([after], feed)):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def _pass(name, y):
    varmap = INFERENCE_PASSES[name](y.node.graph, [y.node], InferenceOptions())
    (new,) = replace_vars([y.node], {k: v for k, v in varmap.items() if k is not v})
    return mgb.SymbolVar(new)


def _oprs(v):
    """The operators ``v`` depends on (graph-level objects)."""
    return dep_oprs([v.node if hasattr(v, "node") else v])


def _kind(v):
    o = v.node.owner if hasattr(v, "node") else v.owner
    return o.param.mode if o.type_name == "Elemwise" else o.type_name


def _conv_bn_relu(seed=0):
    """conv (no bias) -> marker -> BatchNorm INFERENCE -> relu, as a traced client net."""
    rng = np.random.default_rng(seed)
    g = _graph()
    x = mgb.make_arg(CN, g, name="x", shape=(1, 3, 8, 8))
    w = _shared(g, rng.standard_normal((4, 3, 3, 3)), "w")
    y = mark_no_broadcast_elemwise(convolution(x, w, pad_h=1, pad_w=1))
    p = [
        _shared(g, rng.standard_normal((1, 4, 1, 1)), "scale"),
        _shared(g, rng.standard_normal((1, 4, 1, 1)), "bias"),
        _shared(g, rng.standard_normal((1, 4, 1, 1)), "mean"),
        _shared(g, rng.uniform(0.5, 2, (1, 4, 1, 1)), "var"),
    ]
    y = mgb.opr.batch_norm(y, *p, param_dim="DIM_1C11", fwd_mode="INFERENCE")[-1]
    y = mgb.opr.elem.relu(y)
    return g, y, {"x": rng.standard_normal((1, 3, 8, 8)).astype(F32)}


def test_conv_bn_relu_becomes_fuse_add_relu_of_holder_and_conv():
    g, y, feed = _conv_bn_relu()
    (y2,) = mgb.optimize_for_inference([y])
    _same(y, y2, feed)
    o = y2.node.owner
    assert o.type_name == "Elemwise" and o.param.mode == "FUSE_ADD_RELU"
    bias, conv = o.inputs
    assert bias.owner.type_name == "MultipleDeviceTensorHolder"
    assert conv.owner.type_name == mgb.opr.dnn.Convolution.type_name
    assert conv.owner.inputs[1].owner is bias.owner  # the folded filter: the same holder
    assert len(bias.owner.outputs) == 2


def test_remove_non_computing_pass():
    g = _graph()
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    y = identity(mark_no_broadcast_elemwise(x * 2)) + 1
    y2 = _pass("remove_non_computing", y)
    types = {o.type_name for o in _oprs(y2)}
    assert not types & {"Identity", "MarkNoBroadcastElemwise"}
    assert "Identity" in {o.type_name for o in _oprs(y)}
    _same(y, y2, {"x": np.arange(3, dtype=F32)})


@pytest.mark.parametrize(
    "mode,n,want",
    [("FUSE_MUL_ADD3", 3, "ADD"), ("FUSE_MUL_ADD4", 4, "ADD"), ("FUSE_ADD_RELU", 2, "RELU")],
)
def test_expand_fused_arith_pass(mode, n, want):
    g = _graph()
    rng = np.random.default_rng(1)
    xs = [mgb.make_arg(CN, g, name=f"x{i}", shape=(5,)) for i in range(n)]
    y = mgb.opr.elemwise(*xs, mode=mode)
    y2 = _pass("expand_fused_arith", y)
    assert _kind(y2) == want
    _same(y, y2, {f"x{i}": rng.standard_normal(5).astype(F32) for i in range(n)})


def test_reorder_arith_chain_puts_small_terms_first_and_merges_params():
    g = _graph()
    rng = np.random.default_rng(2)
    x = mgb.make_arg(CN, g, name="x", shape=(2, 4, 3, 3))
    b1 = _shared(g, rng.standard_normal((1, 4, 1, 1)), "b1")
    b2 = _shared(g, rng.standard_normal((1, 4, 1, 1)), "b2")
    y = (x + b1) + b2
    y2 = _pass("reorder_arith_chain", y)
    a, b = y2.node.owner.inputs
    assert _kind(a) == "ADD" and set(a.owner.inputs) == {b1.node, b2.node}
    assert b is x.node
    _same(y, y2, {"x": rng.standard_normal((2, 4, 3, 3)).astype(F32)})


def test_arith_fuse_add_activation_and_mul_add():
    g = _graph()
    rng = np.random.default_rng(3)
    a, b, c, d, e = (mgb.make_arg(CN, g, name=n, shape=(6,)) for n in "abcde")
    relu = mgb.opr.elem.relu(a + b)
    fma3 = a * b + c
    fma4 = a * b + c * d + e
    feed = {n: rng.standard_normal(6).astype(F32) for n in "abcde"}
    r = _pass("arith_fuse", relu)
    assert _kind(r) == "FUSE_ADD_RELU" and r.node.owner.inputs == [a.node, b.node]
    f3 = _pass("arith_fuse", fma3)
    assert _kind(f3) == "FUSE_MUL_ADD3"
    f4 = _pass("arith_fuse", fma4)
    kinds = {_kind(v) for v in f4.node.owner.inputs} | {_kind(f4)}
    assert "FUSE_MUL_ADD4" in kinds
    for before, after in ((relu, r), (fma3, f3), (fma4, f4)):
        _same(before, after, feed)


def test_arith_fuse_prefers_mul_add_over_add_activation():
    g = _graph()
    rng = np.random.default_rng(6)
    a, b, c = (mgb.make_arg(CN, g, name=n, shape=(6,)) for n in "abc")
    y = mgb.opr.elem.relu(a * b + c)
    y2 = _pass("arith_fuse", y)
    assert _kind(y2) == "RELU" and _kind(y2.node.owner.inputs[0]) == "FUSE_MUL_ADD3"
    _same(y, y2, {n: rng.standard_normal(6).astype(F32) for n in "abc"})


def test_arith_fuse_keeps_a_sum_read_twice():
    g = _graph()
    a, b = (mgb.make_arg(CN, g, name=n, shape=(4,)) for n in "ab")
    s = a + b
    y = mgb.opr.elem.relu(s) * s
    y2 = _pass("arith_fuse", y)
    assert "FUSE_ADD_RELU" not in {_kind(o.outputs[0]) for o in _oprs(y2)}


def test_param_merge_keeps_given_names_and_values():
    g = _graph()
    rng = np.random.default_rng(4)
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    w1 = _shared(g, rng.standard_normal(3), "w1")
    w2 = _shared(g, rng.standard_normal(3), "w2")
    y = x * w1 + w2
    y2 = _pass("param_merge", y)
    holders = [o for o in _oprs(y2) if o.type_name.startswith("Multiple")]
    assert len(holders) == 1
    assert sorted(v.name for v in holders[0].outputs) == ["w1", "w2"]
    assert "SharedDeviceTensor" not in {o.type_name for o in _oprs(y2)}
    _same(y, y2, {"x": rng.standard_normal(3).astype(F32)})


def _holder_graph():
    g = _graph()
    rng = np.random.default_rng(5)
    vals = [rng.standard_normal((2, 3)).astype(F32), rng.standard_normal((3,)).astype(F32)]
    tensors = [DeviceTensorND.from_ndarray(v, comp_node=mgb.comp_node(CN)) for v in vals]
    a, b = multiple_device_tensor_holder(g, tensors)
    a.rename("pa")
    b.rename("pb")
    x = mgb.make_arg(CN, g, name="x", shape=(2, 3))
    return g, vals, x * a + b


def test_holder_outputs_shapes_const_values_not_inferable():
    g, vals, y = _holder_graph()
    holder = y.node.owner.inputs[1].owner
    assert isinstance(holder, MultipleDeviceTensorHolder)
    assert [static_shape(v) for v in holder.outputs] == [(2, 3), (3,)]
    assert all(v.shape_type == InferType.CONST for v in holder.outputs)
    assert all(v.value_type == InferType.MISSING for v in holder.outputs)
    x = np.ones((2, 3), F32)
    (got,) = _run([y], {"x": x})
    np.testing.assert_allclose(got, x * vals[0] + vals[1])


def test_holder_round_trip(tmp_path):
    g, vals, y = _holder_graph()
    path = str(tmp_path / "h.mge")
    mgb.serialize_comp_graph_to_file(path, [y], keep_var_name=2)
    _, _, (out,) = mgb.load_comp_graph_from_file(path)
    holders = [o for o in _oprs(out) if o.type_name.startswith("Multiple")]
    assert len(holders) == 1 and [v.name for v in holders[0].outputs] == ["pa", "pb"]
    (inp,) = [o for o in _oprs(out) if o.type_name == "Host2DeviceCopy"]
    x = np.arange(6, dtype=F32).reshape(2, 3)
    f = out.owner_graph.compile(None, [mgb.copy_output(out)])
    (got,) = f(**{inp.outputs[0].name: x})
    np.testing.assert_allclose(got, x * vals[0] + vals[1])


def test_holder_refuses_no_tensors():
    g = _graph()
    with pytest.raises(MegBrainError, match="MultipleDeviceTensorHolder"):
        multiple_device_tensor_holder(g, [])


def test_optimized_and_dumped_bn_net_loads_with_holder(tmp_path):
    g, y, feed = _conv_bn_relu(seed=7)
    path = str(tmp_path / "bn.mge")
    mgb.serialize_comp_graph_to_file(path, mgb.optimize_for_inference([y]))
    _, _, (out,) = mgb.load_comp_graph_from_file(path)
    ins = [mgb.cgtools.get_type(v) for v in mgb.cgtools.get_inputs(out)]
    assert ins == ["MultipleDeviceTensorHolder", mgb.opr.dnn.Convolution.type_name]
    f = out.owner_graph.compile(None, [mgb.copy_output(out)])
    (h2d,) = [o for o in _oprs(out) if o.type_name == "Host2DeviceCopy"]
    (got,) = f(**{h2d.outputs[0].name: feed["x"]})
    (want,) = _run([y], feed)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
