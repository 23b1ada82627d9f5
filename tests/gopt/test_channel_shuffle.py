"""ShuffleNet's concatenation and channel shuffle as one operator (``fuse_channel_shuffle``,
ChannelShuffleConcat): the values equal a float64 NumPy reference of the unfused graph, the
ConvBias inputs are written in place as strided parts of its output (only the other inputs
are copied), the fusion happens only where the intermediate vars have no other reader, an
ONNX model's shuffle computes what onnxruntime does, and graph files never see the fused
operator."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_pool_end_padding import dumped_refits_and_fused_is_refused

import megbrain as mgb
from megbrain.opr import tensor_manip
from megbrain.opr.dnn_conv_bias import conv_bias_activation

CN = "cpu0"
F32 = np.float32


def _shuffle_ref(parts: list[np.ndarray]) -> np.ndarray:
    """The concatenation of ``parts`` along the channels, channel-shuffled in groups of
    ``len(parts)``."""
    cat = np.concatenate(parts, axis=1)
    n, c, h, w = cat.shape
    g = len(parts)
    return cat.reshape(n, g, c // g, h, w).transpose(0, 2, 1, 3, 4).reshape(n, c, h, w)


def _conv_ref(x, w, b, relu):
    y = np.einsum("oc,nchw->nohw", w.astype(np.float64), x.astype(np.float64))
    y += b.reshape(1, -1, 1, 1)
    return np.maximum(y, 0) if relu else y


def _build(n, c, h, w, g, viewed, extra_reader=None, seed=0):
    """x (n, 2c, h, w) -> ``g`` parts of c channels, each a 1x1 ConvBias of x's second half,
    or, for the indices in ``viewed``, x's first half itself (a Subtensor view) -> the
    concatenation shuffled; the graph, its output vars, the feed and the float64
    reference. ``extra_reader``: "concat" or "dimshuffle" also outputs that var."""
    rng = np.random.default_rng(seed)
    graph = mgb.comp_graph(check_env_var=False)
    graph.set_option("log_level", 0)
    x = mgb.make_arg(CN, graph, name="x", shape=(n, 2 * c, h, w))
    xv = rng.uniform(-1, 1, (n, 2 * c, h, w)).astype(F32)
    first, second = x[:, :c], x[:, c:]
    parts, refs = [], []
    for i in range(g):
        if i in viewed:
            parts.append(first)
            refs.append(xv[:, :c].astype(np.float64))
            continue
        wv = rng.uniform(-1, 1, (c, c)).astype(F32)
        bv = rng.uniform(-1, 1, (1, c, 1, 1)).astype(F32)
        wvar = mgb.make_shared(CN, value=wv.reshape(c, c, 1, 1), comp_graph=graph)
        bvar = mgb.make_shared(CN, value=bv, comp_graph=graph)
        parts.append(conv_bias_activation(second, wvar, bvar, nonlineMode="RELU"))
        refs.append(_conv_ref(xv[:, c:], wv, bv, True))
    cat = mgb.opr.concat(*parts, axis=1)
    five = cat.reshape(n, g, c, h, w)
    swapped = five.dimshuffle(0, 2, 1, 3, 4)
    out = swapped.reshape(n, g * c, h, w)
    outs = [out, out[:, : g * c // 2] * 1.0]
    ref = _shuffle_ref(refs)
    extra = {"concat": (cat, np.concatenate(refs, axis=1)),
             "dimshuffle": (swapped, ref.reshape(n, c, g, h, w))}.get(extra_reader)  # fmt: skip
    refs_out = [ref, ref[:, : g * c // 2]]
    if extra is not None:
        outs.append(extra[0])
        refs_out.append(extra[1])
    return graph, outs, xv, refs_out


def _compiled(graph, outs):
    f = graph.compile(None, [mgb.copy_output(v) for v in outs])
    return f, [o.type_name for o in f._func.iter_opr_seq()]


def _fused_step(f):
    """(the ChannelShuffleConcat, its bound step)."""
    plan = f._func._plan
    for fn, opr in zip(plan.steps[0], plan.step_oprs[0]):
        if opr.type_name == tensor_manip.ChannelShuffleConcat.type_name:
            return opr, fn
    raise AssertionError("no ChannelShuffleConcat step")


@settings(max_examples=15, deadline=None)
@given(
    n=st.integers(1, 2), c=st.integers(1, 24), h=st.integers(1, 9), w=st.integers(1, 9),
    g=st.integers(2, 3), viewed=st.sets(st.integers(0, 2), max_size=2),
)  # fmt: skip
def test_fused_shuffle_equals_the_float64_reference(n, c, h, w, g, viewed):
    graph, outs, xv, refs = _build(n, c, h, w, g, viewed)
    f, types = _compiled(graph, outs)
    assert "ChannelShuffleConcat" in types and "Concat" not in types
    assert "Dimshuffle" not in types
    got = f(x=xv)
    for a, r in zip(got, refs):
        np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-5)
    opr, fn = _fused_step(f)
    plan = f._func._plan
    kinds = [plan.decisions[v][0] for v in opr.inputs]
    # the ConvBias outputs are strided parts of the output, written in place
    convs = [i for i, v in enumerate(opr.inputs) if v.owner.type_name == "ConvBiasForward"]
    assert all(kinds[i] == "part" for i in convs)
    assert isinstance(fn, functools.partial) and fn.func is tensor_manip._copy_parts
    assert len(fn.args[0]) == g - len(convs)


@pytest.mark.parametrize("reader", ["concat", "dimshuffle"])
def test_an_intermediate_read_elsewhere_keeps_the_shuffle(reader):
    graph, outs, xv, refs = _build(1, 6, 5, 5, 2, {0}, extra_reader=reader)
    f, types = _compiled(graph, outs)
    assert "ChannelShuffleConcat" not in types and "Concat" in types
    for a, r in zip(f(x=xv), refs):
        np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-5)


def test_the_graph_dumps_the_unfused_operators_and_a_fused_one_is_refused(tmp_path):
    graph, outs, xv, refs = _build(1, 4, 3, 3, 2, set())
    f = dumped_refits_and_fused_is_refused(tmp_path, outs, "ChannelShuffleConcat", "Concat")
    np.testing.assert_allclose(f(x=xv)[0], refs[0], rtol=1e-4, atol=1e-5)


def test_an_onnx_shuffle_unit_equals_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    import megbrain.onnx as mo

    c, h = 6, 5
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.uniform(-1, 1, (c, c, 1, 1)).astype(F32), "w"),
             numpy_helper.from_array(np.array([c, c], np.int64), "split"),
             numpy_helper.from_array(np.array([1, 2, c, h, h], np.int64), "s5"),
             numpy_helper.from_array(np.array([1, 2 * c, h, h], np.int64), "s4")]  # fmt: skip
    nodes = [
        helper.make_node("Split", ["x", "split"], ["a", "b"], axis=1),
        helper.make_node("Conv", ["b", "w"], ["bc"], kernel_shape=[1, 1]),
        helper.make_node("Relu", ["bc"], ["br"]),
        helper.make_node("Concat", ["a", "br"], ["cat"], axis=1),
        helper.make_node("Reshape", ["cat", "s5"], ["r5"]),
        helper.make_node("Transpose", ["r5"], ["t5"], perm=[0, 2, 1, 3, 4]),
        helper.make_node("Reshape", ["t5", "s4"], ["y"]),
    ]
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 2 * c, h, h])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)  # fmt: skip
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    f = mo.load_inference(model.SerializeToString())
    x = rng.uniform(-1, 1, (1, 2 * c, h, h)).astype(F32)
    (got,) = f(x=x)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got, sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)
    types = [o.type_name for o in f.function._func.iter_opr_seq()]
    assert "ChannelShuffleConcat" in types and "Dimshuffle" not in types


def _reference_nchw88_shuffle(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The shuffled concatenation of two NCHW88 arrays, through NCHW."""

    def nchw(x):
        n, cb, h, w, _ = x.shape
        return x.transpose(0, 1, 4, 2, 3).reshape(n, cb * 8, h, w)

    y = _shuffle_ref([nchw(a), nchw(b)])
    n, c, h, w = y.shape
    return y.reshape(n, c // 8, 8, h, w).transpose(0, 1, 3, 4, 2)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 2), cb=st.integers(1, 5), h=st.integers(1, 6), w=st.integers(1, 6),
       sliced=st.booleans())  # fmt: skip
def test_the_nchw88_shuffle_kernel_equals_the_nchw_reference(n, cb, h, w, sliced):
    from megbrain.kernels.channel_shuffle import bind_shuffle_nchw88

    rng = np.random.default_rng(n * 1000 + cb * 100 + h * 10 + w)
    a, b = (rng.standard_normal((n, cb + sliced, h, w, 8)).astype(F32) for _ in range(2))
    if sliced:  # inputs that are block ranges of a larger var (views, as in the network)
        a, b = a[:, 1:], b[:, :-1]
    out = np.full((n, 2 * cb, h, w, 8), np.nan, F32)
    bind_shuffle_nchw88(a, b, out)()
    np.testing.assert_array_equal(out, _reference_nchw88_shuffle(a, b))


def _onnx_two_units(c: int, h: int, expose_middle: bool):
    """Two ShuffleNet v2 units (split, 1x1 Conv + Relu on the second half, concatenation,
    shuffle) on x (1, 2c, h, h); the second unit reads the first's shuffled output, which
    ``expose_middle`` also makes a model output."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(np.array([c, c], np.int64), "split"),
             numpy_helper.from_array(np.array([1, 2, c, h, h], np.int64), "s5"),
             numpy_helper.from_array(np.array([1, 2 * c, h, h], np.int64), "s4")]  # fmt: skip
    nodes, src = [], "x"
    for u in range(2):
        w = numpy_helper.from_array(rng.uniform(-1, 1, (c, c, 1, 1)).astype(F32), f"w{u}")
        inits.append(w)
        nodes += [
            helper.make_node("Split", [src, "split"], [f"a{u}", f"b{u}"], axis=1),
            helper.make_node("Conv", [f"b{u}", f"w{u}"], [f"c{u}"], kernel_shape=[1, 1]),
            helper.make_node("Relu", [f"c{u}"], [f"r{u}"]),
            helper.make_node("Concat", [f"a{u}", f"r{u}"], [f"cat{u}"], axis=1),
            helper.make_node("Reshape", [f"cat{u}", "s5"], [f"f{u}"]),
            helper.make_node("Transpose", [f"f{u}"], [f"t{u}"], perm=[0, 2, 1, 3, 4]),
            helper.make_node("Reshape", [f"t{u}", "s4"], [f"y{u}"]),
        ]
        src = f"y{u}"
    outs = ["y1", "y0"] if expose_middle else ["y1"]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2 * c, h, h])]
    outputs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs]
    g = helper.make_graph(nodes, "m", inputs, outputs, inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return model.SerializeToString()


@pytest.mark.parametrize("expose_middle", [False, True])
def test_nchw88_shuffle_units_stay_blocked_and_equal_onnxruntime(expose_middle):
    """Channels in whole blocks: the shuffles run in NCHW88, with no conversion to NCHW and
    back between the units (a shuffled var also read in NCHW is converted back once), and
    the outputs are onnxruntime's."""
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    import megbrain.onnx as mo

    c, h = 16, 5
    model = _onnx_two_units(c, h, expose_middle)
    f = mo.load_inference(model)
    x = np.random.default_rng(6).uniform(-1, 1, (1, 2 * c, h, h)).astype(F32)
    got = f(x=x)
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for a, r in zip(got, sess.run(None, {"x": x})):
        np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-5)
    types = [o.type_name for o in f.function._func.iter_opr_seq()]
    assert types.count("ChannelShuffleConcat") == 2
    assert not {"Dimshuffle", "Reshape", "Concat"} & set(types)
    # the input's halves converted in, the output back, and, where the first unit's
    # shuffle is an output too, that one back once: no conversion between the units
    assert types.count("RelayoutFormat") == 3 + expose_middle
