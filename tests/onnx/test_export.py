"""megbrain.onnx.export: every exported family is checked by onnx.checker (full_check), run by
onnxruntime against megbrain, and loaded back with megbrain.onnx.load."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import megbrain as mgb  # noqa: E402
from megbrain.onnx import ONNXConversionError, export, load  # noqa: E402
from megbrain.onnx.exporter import exportable_operator_types, refused_operator_types  # noqa: E402

CN = "cpu0"


def _session(model):
    so = ort.SessionOptions()
    so.log_severity_level = 2  # warnings and worse reach stderr
    return ort.InferenceSession(
        model.SerializeToString(), so, providers=["CPUExecutionProvider"]
    )


def _assert_clean(model):
    """Every initializer is read by some node; every node output is used or an output."""
    read = {i for n in model.graph.node for i in n.input}
    unused = [t.name for t in model.graph.initializer if t.name not in read]
    assert not unused, f"unused initializers {unused}"
    outs = {o.name for o in model.graph.output}
    dead = [o for n in model.graph.node for o in n.output if o and o not in read | outs]
    # multi-output nodes (TopK) may leave one output unread; nothing else may be dead
    single = [n for n in model.graph.node if len(n.output) == 1]
    assert not [n.output[0] for n in single if n.output[0] in dead]


def _imported(model) -> bool:
    """Whether megbrain.onnx.load reads every op type of ``model`` (models using one it does
    not read yet, ScatterND, ScatterElements, GridSample..., are checked against onnxruntime
    only)."""
    from megbrain.onnx import claimed_op_types

    return {n.op_type for n in model.graph.node} <= set(claimed_op_types())


def _roundtrip(outs, feeds, *, rtol=1e-4, atol=1e-5, reload=True, **kw):
    """Export ``outs`` (feeds: [(make_arg var, value)]), compare onnxruntime and, with
    ``reload`` (where the importer reads every op type of the model), megbrain.onnx.load's
    graph with megbrain."""
    outs = list(outs)
    g = outs[0].owner_graph
    args = [v for v, _ in feeds]
    vals = [a for _, a in feeds]
    want = g.compile(args, [mgb.copy_output(o) for o in outs])(*vals)
    want = want if isinstance(want, (list, tuple)) else [want]
    model = export(outs, None, **kw)
    onnx.checker.check_model(model, full_check=True)
    _assert_clean(model)
    sess = _session(model)
    names = [i.name for i in model.graph.input]
    feed = dict(zip([v.name for v in args], vals))
    got = sess.run(None, {n: feed[n] for n in names})
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
    if reload and _imported(model):
        res = load(model)
        ins = [res.inputs[n] for n in names]
        back = res.graph.compile(
            ins, [mgb.copy_output(res.outputs[o.name]) for o in model.graph.output]
        )(*[feed[n] for n in names])
        back = back if isinstance(back, (list, tuple)) else [back]
        for a, b in zip(back, want):
            np.testing.assert_allclose(np.asarray(a), b, rtol=rtol, atol=atol)
    return model


def _arg(g, shape, name, dtype=np.float32):
    return mgb.make_arg(CN, g, dtype=dtype, shape=shape, name=name)


def _shared(g, value, name):
    return mgb.make_shared(CN, value=value, comp_graph=g, name=name)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def _cnn(graph, rng, batch=2):
    x = _arg(graph, (batch, 3, 8, 8), "x")
    w1 = _shared(graph, rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w1")
    wg = _shared(graph, rng.standard_normal((2, 3, 2, 3, 3)).astype(np.float32), "wg")
    h = mgb.opr.elem.relu(mgb.opr.convolution(x, w1, pad_h=1, pad_w=1))
    h = mgb.opr.convolution(h, wg, pad_h=1, pad_w=1, sparse="GROUP")
    h = mgb.opr.pooling(h, mode="MAX")
    h = mgb.opr.pooling(
        h,
        mode="AVERAGE_COUNT_EXCLUDE_PADDING",
        pad_h=1,
        pad_w=1,
        window_h=3,
        window_w=3,
        stride_h=1,
        stride_w=1,
    )
    f = h.reshape(batch, -1)
    wf = mgb.make_immutable(CN, graph, (0.1 * rng.standard_normal((96, 5))).astype(np.float32))
    y = mgb.opr.elem.sigmoid(mgb.opr.matrix_mul(f, wf) * 0.5 - 1)
    y = mgb.opr.concat(y, y.sum(axis=1, keepdims=True), axis=1).dimshuffle(1, 0)
    return x, y


def test_export_cnn_matches_onnxruntime(tmp_path, rng):
    g = mgb.comp_graph()
    x, y = _cnn(g, rng)
    xv = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    (want,) = g.compile([x], [mgb.copy_output(y)])(xv)
    path = tmp_path / "m.onnx"
    model = export([y], path, input_names=["data"], output_names=["prob"])
    _assert_clean(model)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (got,) = sess.run(None, {"data": xv})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    res = load(path)
    (back,) = res.graph.compile([res.inputs["data"]], [mgb.copy_output(res.outputs["prob"])])(xv)
    np.testing.assert_allclose(back, want, rtol=1e-4, atol=1e-5)


# ---- elementwise -----------------------------------------------------------------------------
_UNARY_MODES = [
    "RELU", "ABS", "CEIL", "COS", "EXP", "EXPM1", "FLOOR", "LOG", "LOG1P", "NEGATE",
    "SIGMOID", "SIN", "TANH", "ERF", "H_SWISH", "ROUND", "FAST_TANH", "ACOS", "ASIN", "ERFC",
    "ERFINV",
]  # fmt: skip
_BINARY_MODES = [
    "ADD", "SUB", "MUL", "TRUE_DIV", "POW", "MAX", "MIN", "FLOOR_DIV", "MOD", "LOG_SUM_EXP",
    "LT", "LEQ", "EQ", "ABS_GRAD", "SIGMOID_GRAD", "TANH_GRAD", "SWITCH_GT0", "ATAN2",
    "FUSE_ADD_RELU", "FUSE_ADD_SIGMOID", "FUSE_ADD_TANH", "FUSE_ADD_H_SWISH",
    "FAST_TANH_GRAD", "H_SWISH_GRAD",
]  # fmt: skip


def _operand(rng, shape, mode):
    v = rng.uniform(-4, 4, shape).astype(np.float32)
    if mode in ("LOG", "POW", "LOG1P"):
        v = np.abs(v) + 0.1
    if mode in ("ACOS", "ASIN"):
        v = v / 4.5
    if mode == "ERFINV":  # up to the last float32 below 1
        v = np.concatenate([rng.uniform(-1, 1, 12), [0.9999999, -0.99999, 0]]).astype(np.float32)
        v = v.reshape(shape)
    if mode == "ERFC":  # the tail too: erfc(9) ~ 4e-37, relative error is what counts
        v = rng.uniform(-3, 9, shape).astype(np.float32)
    if mode == "ROUND":
        v = np.round(v * 2) / 2 + np.where(v > 0, 1e-3, -1e-3).astype(np.float32) * (v > 1)
    if mode == "EXPM1" or mode == "LOG1P":
        v = np.concatenate([v.reshape(-1)[:-3], [1e-6, -3e-7, 0]]).astype(np.float32)
        v = v.reshape(shape)
        if mode == "LOG1P":
            v = np.abs(v)
    return v


@pytest.mark.parametrize("mode", _UNARY_MODES)
def test_export_elemwise_unary(mode, rng):
    g = mgb.comp_graph()
    x = _arg(g, (3, 5), "x")
    y = mgb.opr.elemwise(x, mode=mode)
    atol = 0 if mode in ("ERFC", "ERFINV") else 1e-6
    _roundtrip([y], [(x, _operand(rng, (3, 5), mode))], rtol=1e-4, atol=atol)


@pytest.mark.parametrize("mode", _BINARY_MODES)
def test_export_elemwise_binary_broadcast(mode, rng):
    g = mgb.comp_graph()
    a, b = _arg(g, (3, 5), "a"), _arg(g, (1, 5), "b")
    y = mgb.opr.elemwise(a, b, mode=mode)
    av, bv = _operand(rng, (3, 5), mode), _operand(rng, (1, 5), mode)
    if mode in ("TRUE_DIV", "FLOOR_DIV", "MOD"):
        bv = np.where(np.abs(bv) < 0.5, 1.5, bv).astype(np.float32)
    # the loaded-back graph needs importer support for every composed op: checked where sure
    _roundtrip([y], [(a, av), (b, bv)], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["FLOOR_DIV", "MOD", "ADD", "MAX", "LT"])
def test_export_elemwise_int32(mode, rng):
    g = mgb.comp_graph()
    a, b = _arg(g, (4, 6), "a", np.int32), _arg(g, (4, 6), "b", np.int32)
    y = mgb.opr.elemwise(a, b, mode=mode)
    av = rng.integers(-20, 20, (4, 6)).astype(np.int32)
    bv = rng.choice([-7, -3, -1, 1, 2, 5], (4, 6)).astype(np.int32)
    _roundtrip([y], [(a, av), (b, bv)])


@pytest.mark.parametrize("dtype", [np.int32, np.int8])
def test_export_elemwise_shifts(dtype, rng):
    g = mgb.comp_graph()
    a, k = _arg(g, (4, 6), "a", dtype), _arg(g, (4, 6), "k", dtype)
    bits = np.iinfo(dtype).bits
    av = rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max, (4, 6)).astype(dtype)
    kv = rng.integers(0, bits, (4, 6)).astype(dtype)
    outs = [mgb.opr.elemwise(a, k, mode=m) for m in ("SHL", "SHR", "RMULH")]
    # computed in int64 (and a UINT64 BitShift): megbrain.onnx.load holds INT64 as int32, so
    # these models are checked against onnxruntime only
    model = _roundtrip(outs, [(a, av), (k, kv)], reload=False)
    got = _session(model).run(None, {"a": av, "k": kv})
    np.testing.assert_array_equal(got[1], np.right_shift(av, kv))


@pytest.mark.parametrize("mode", ["FUSE_MUL_ADD3", "FUSE_MUL_ADD4", "COND_LEQ_MOV"])
def test_export_elemwise_fused_multi_input(mode, rng):
    g = mgb.comp_graph()
    n = 4 if mode == "FUSE_MUL_ADD4" else 3
    xs = [_arg(g, (2, 3), f"x{k}") for k in range(n)]
    y = mgb.opr.elemwise(*xs, mode=mode)
    _roundtrip([y], [(x, rng.standard_normal((2, 3)).astype(np.float32)) for x in xs])


def test_export_elemwise_multi_type_fixed_point(rng):
    g = mgb.comp_graph()
    a = _arg(g, (2, 5), "a", np.int16)
    b, c = _arg(g, (2, 5), "b", np.int32), _arg(g, (2, 5), "c", np.int32)
    y = mgb.opr.elemwise_multi_type(a, b, c, mode="FUSE_MUL_ADD3_INT16x32x32x32")
    x = _arg(g, (2, 5), "x", np.int32)
    k, d = _arg(g, (1, 5), "k"), _arg(g, (1, 5), "d")
    z = mgb.opr.elemwise_multi_type(x, k, d, mode="FUSE_MUL_ADD3_IXxF32xF32xI8")
    feeds = [
        (a, rng.integers(-300, 300, (2, 5)).astype(np.int16)),
        (b, rng.integers(-300, 300, (2, 5)).astype(np.int32)),
        (c, rng.integers(-300, 300, (2, 5)).astype(np.int32)),
        (x, rng.integers(-100, 100, (2, 5)).astype(np.int32)),
        (k, rng.uniform(-3, 3, (1, 5)).astype(np.float32)),
        (d, rng.uniform(-3, 3, (1, 5)).astype(np.float32)),
    ]
    _roundtrip([y, z], feeds)


def test_export_elemwise_multi_type_rounding_shifts(rng):
    g = mgb.comp_graph()
    shape = (3, 8)

    def ints(name, dtype, lo, hi):
        v = _arg(g, shape, name, dtype)
        return v, (v, rng.integers(lo, hi, shape).astype(dtype))

    x32, f1 = ints("x32", np.int32, -(2**20), 2**20)
    x16, f2 = ints("x16", np.int16, -(2**15), 2**15)
    k8, f3 = ints("k8", np.int8, 0, 14)
    a16, f4 = ints("a16", np.int16, -(2**15), 2**15)
    m16, f5 = ints("m16", np.int16, -(2**15), 2**15)
    a32, f6 = ints("a32", np.int32, -(2**31), 2**31)
    b32, f7 = ints("b32", np.int32, -(2**31), 2**31)
    m32, f8 = ints("m32", np.int32, -(2**31), 2**31)
    lo, f9 = ints("lo", np.int8, -128, -20)
    hi, f10 = ints("hi", np.int8, 20, 127)
    emt = mgb.opr.elemwise_multi_type
    outs = [
        emt(x32, k8, mode="ROUND_SHR_SATURATE_IXxI8xI8"),
        emt(x16, k8, mode="ROUND_SHR_SATURATE_IXxI8xI16"),
        emt(x32, k8, mode="ROUND_SHR_SATURATE_IXxI8xI16"),
        emt(a16, x16, m16, k8, lo, hi, mode="FUSE_ADD_RMULH_ROUND_SHR_SATURATE_INT16x16x16x8"),
        emt(a32, b32, m32, k8, lo, hi, mode="FUSE_ADD_RMULH_ROUND_SHR_SATURATE_INT32x32x32x8"),
    ]
    # int64 arithmetic: not reloaded (megbrain.onnx.load holds INT64 as int32)
    _roundtrip(outs, [f1, f2, f3, f4, f5, f6, f7, f8, f9, f10], rtol=0, atol=0, reload=False)


def test_export_refused_elemwise_mode_names_it():
    g = mgb.comp_graph()
    x = _arg(g, (3,), "x")
    with pytest.raises(ONNXConversionError, match="ERFCINV"):
        export([mgb.opr.elemwise(x, mode="ERFCINV")])


def test_export_typecvt_reduce(rng):
    g = mgb.comp_graph()
    x = _arg(g, (3, 4, 5), "x")
    outs = [
        mgb.opr.typecvt(x * 3, np.int32),
        x.sum(axis=1, keepdims=True),
        x.max(axis=2, keepdims=True),
        x.mean(axis=0, keepdims=True),
        mgb.opr.reduce_general(x, mode="SUM_SQR", axis=1),
        mgb.opr.reduce_general(x, mode="PRODUCT", axis=2),
        mgb.opr.reduce_general(x, mode="SUM", target_shape=(3, 1, 5)),
        x.sum(),
    ]
    _roundtrip(outs, [(x, rng.uniform(0.5, 1.5, (3, 4, 5)).astype(np.float32))])


# ---- nn --------------------------------------------------------------------------------------
@pytest.mark.parametrize("act", ["IDENTITY", "RELU", "SIGMOID", "H_SWISH"])
def test_export_conv_bias(act, rng):
    g = mgb.comp_graph()
    x = _arg(g, (2, 4, 7, 7), "x")
    w = _shared(g, rng.standard_normal((6, 4, 3, 3)).astype(np.float32), "w")
    b = _shared(g, rng.standard_normal((1, 6, 1, 1)).astype(np.float32), "b")
    y = mgb.opr.conv_bias_activation(x, w, b, nonlineMode=act, pad_h=1, pad_w=1, stride_h=2)
    _roundtrip([y], [(x, rng.standard_normal((2, 4, 7, 7)).astype(np.float32))])


def test_export_conv_bias_full_bias_grouped_flipped_and_average_pooling(rng):
    g = mgb.comp_graph()
    x = _arg(g, (2, 4, 6, 6), "x")
    w = _shared(g, rng.standard_normal((2, 3, 2, 3, 3)).astype(np.float32), "w")
    b = _arg(g, (2, 6, 6, 6), "b")
    y = mgb.opr.conv_bias_activation(x, w, b, sparse="GROUP", mode="CONVOLUTION", pad_h=1,
                                     pad_w=1, nonlineMode="SIGMOID")
    p = mgb.opr.pooling(y, mode="AVERAGE", window_h=3, window_w=2, stride_h=2, stride_w=1,
                        pad_h=1, pad_w=1)
    feeds = [(x, rng.standard_normal((2, 4, 6, 6)).astype(np.float32)),
             (b, rng.standard_normal((2, 6, 6, 6)).astype(np.float32))]
    _roundtrip([y, p], feeds)


def test_export_conv_bias_with_z(rng):
    g = mgb.comp_graph()
    x = _arg(g, (2, 4, 6, 6), "x")
    z = _arg(g, (2, 8, 6, 6), "z")
    w = _shared(g, rng.standard_normal((8, 4, 3, 3)).astype(np.float32), "w")
    b = _shared(g, rng.standard_normal((1, 8, 1, 1)).astype(np.float32), "b")
    y = mgb.opr.elem.relu(mgb.opr.convolution(x, w, pad_h=1, pad_w=1) + b + z)
    (fused,) = mgb.optimize_for_inference(
        [y], fuse_conv_bias_nonlinearity=True, fuse_conv_bias_with_z=True
    )
    (cb,) = [o for o in mgb.cgtools.get_oprs_seq([fused]) if o.type == "ConvBiasForward"]
    assert len(cb.inputs) == 4
    feeds = [(x, rng.standard_normal((2, 4, 6, 6)).astype(np.float32)),
             (z, rng.standard_normal((2, 8, 6, 6)).astype(np.float32))]  # fmt: skip
    _roundtrip([fused], feeds)


def test_export_refuses_the_nchw88_layout_saying_what_to_do(rng, tmp_path):
    g = mgb.comp_graph()
    x = _arg(g, (1, 16, 6, 6), "x")
    w = _shared(g, rng.standard_normal((16, 16, 3, 3)).astype(np.float32), "w")
    (y,) = mgb.optimize_for_inference([mgb.opr.convolution(x, w, pad_h=1, pad_w=1)],
                                      use_nchw88=True)  # fmt: skip
    with pytest.raises(ONNXConversionError, match="RelayoutFormat.*before optimize_for_inf"):
        export([y], str(tmp_path / "m.onnx"))


def test_export_conv_true_convolution_mode_and_dilation(rng):
    g = mgb.comp_graph()
    x = _arg(g, (1, 2, 9, 9), "x")
    w = _shared(g, rng.standard_normal((3, 2, 3, 2)).astype(np.float32), "w")
    y = mgb.opr.convolution(x, w, mode="CONVOLUTION", dilate_h=2, pad_w=1)
    _roundtrip([y], [(x, rng.standard_normal((1, 2, 9, 9)).astype(np.float32))])


@pytest.mark.parametrize("group", [1, 2])
def test_export_deconvolution(group, rng):
    g = mgb.comp_graph()
    x = _arg(g, (2, 4, 5, 5), "x")
    if group == 1:
        w = _shared(g, rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
        y = mgb.opr.deconvolution(x, w, stride_h=2, stride_w=2, pad_h=1, pad_w=1)
    else:
        w = _shared(g, rng.standard_normal((2, 2, 3, 3, 3)).astype(np.float32), "w")
        y = mgb.opr.deconvolution(x, w, stride_h=2, stride_w=1, sparse="GROUP")
    _roundtrip([y], [(x, rng.standard_normal((2, 4, 5, 5)).astype(np.float32))])


def test_export_convolution3d_and_deconvolution3d(rng):
    g = mgb.comp_graph()
    x = _arg(g, (1, 2, 5, 6, 5), "x")
    w = _shared(g, rng.standard_normal((3, 2, 3, 3, 3)).astype(np.float32), "w")
    y = mgb.opr.convolution3d(x, w, pad_d=1, pad_h=1, pad_w=1, stride_d=2)
    wd = _shared(g, rng.standard_normal((3, 2, 2, 2, 2)).astype(np.float32), "wd")
    z = mgb.opr.deconvolution3d(y, wd, stride_d=2, stride_h=2, stride_w=2)
    _roundtrip([y, z], [(x, rng.standard_normal((1, 2, 5, 6, 5)).astype(np.float32))])


@pytest.mark.parametrize("param_dim", ["DIM_1C11", "DIM_1CHW"])
def test_export_batch_norm_inference(param_dim, rng):
    g = mgb.comp_graph()
    x = _arg(g, (2, 3, 4, 4), "x")
    pshape = (1, 3, 1, 1) if param_dim == "DIM_1C11" else (1, 3, 4, 4)

    def p(name, lo=-1.0, hi=1.0):
        return _shared(g, rng.uniform(lo, hi, pshape).astype(np.float32), name)

    outs = mgb.opr.batch_norm(
        x, p("scale"), p("bias"), p("mean"), p("var", 0.5, 2.0),
        param_dim=param_dim, fwd_mode="INFERENCE", epsilon=1e-3,
    )  # fmt: skip
    _roundtrip([outs[-1]], [(x, rng.standard_normal((2, 3, 4, 4)).astype(np.float32))])


def test_export_training_batch_norm_is_refused(rng):
    g = mgb.comp_graph()
    x = _arg(g, (2, 3, 4, 4), "x")
    s = _shared(g, np.ones((1, 3, 1, 1), np.float32), "s")
    b = _shared(g, np.zeros((1, 3, 1, 1), np.float32), "b")
    outs = mgb.opr.batch_norm(x, s, b, param_dim="DIM_1C11")
    with pytest.raises(ONNXConversionError, match="BatchNorm.*TRAINING|TRAINING.*model.eval"):
        export([outs[-1]])


def test_export_lrn_matmul_dot(rng):
    g = mgb.comp_graph()
    x = _arg(g, (2, 5, 3, 3), "x")
    y = mgb.opr.lrn(x, n=3, k=1.5, alpha=1e-2, beta=0.75)
    a, b = _arg(g, (3, 4, 5), "a"), _arg(g, (3, 6, 4), "b")
    m = mgb.opr.batched_matrix_mul(a, b, transposeA=True, transposeB=True)
    u, v = _arg(g, (7,), "u"), _arg(g, (7,), "v")
    d = mgb.opr.dot(u, v)
    mm = mgb.opr.matrix_mul(u.reshape(1, 7), v.reshape(7, 1), transposeA=False)
    feeds = [
        (x, rng.standard_normal((2, 5, 3, 3)).astype(np.float32)),
        (a, rng.standard_normal((3, 4, 5)).astype(np.float32)),
        (b, rng.standard_normal((3, 6, 4)).astype(np.float32)),
        (u, rng.standard_normal(7).astype(np.float32)),
        (v, rng.standard_normal(7).astype(np.float32)),
    ]
    _roundtrip([y, m, d, mm], feeds)


def test_export_local_and_group_local(rng):
    g = mgb.comp_graph()
    x = _arg(g, (2, 4, 5, 5), "x")
    wl = _shared(g, rng.standard_normal((3, 3, 4, 3, 3, 2)).astype(np.float32), "wl")
    y = mgb.opr.local(x, wl, pad_h=1, pad_w=1, stride_h=2, stride_w=2)
    wg = _shared(g, rng.standard_normal((2, 5, 5, 2, 3, 3, 3)).astype(np.float32), "wg")
    z = mgb.opr.group_local(x, wg, pad_h=1, pad_w=1)
    _roundtrip([y, z], [(x, rng.standard_normal((2, 4, 5, 5)).astype(np.float32))])


@pytest.mark.parametrize("imode", ["LINEAR", "NEAREST"])
@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
def test_export_resize(imode, fmt, rng):
    g = mgb.comp_graph()
    shape = (1, 2, 5, 7) if fmt == "NCHW" else (1, 5, 7, 2)
    x = _arg(g, shape, "x")
    y = mgb.opr.resize(x, [8, 4], imode=imode, format=fmt)
    _roundtrip([y], [(x, rng.standard_normal(shape).astype(np.float32))])


@pytest.mark.parametrize(
    "imode,bmode,bval",
    [
        ("LINEAR", "REPLICATE", 0.0),
        ("LINEAR", "CONSTANT", 0.0),
        ("LINEAR", "CONSTANT", 0.7),
        ("LINEAR", "REFLECT_101", 0.0),
        ("NEAREST", "REPLICATE", 0.0),
        ("LINEAR", "REFLECT", 0.0),
        ("LINEAR", "WRAP", 0.0),
        ("NEAREST", "CONSTANT", -1.5),
        ("NEAREST", "WRAP", 0.0),
    ],
)
def test_export_warp_perspective(imode, bmode, bval, rng):
    g = mgb.comp_graph()
    x, m = _arg(g, (2, 3, 6, 7), "x"), _arg(g, (2, 3, 3), "m")
    y = mgb.opr.warp_perspective(x, m, [5, 8], imode=imode, bmode=bmode, border_val=bval)
    mv = np.tile(np.eye(3, dtype=np.float32), (2, 1, 1))
    mv[:, :2, :2] += rng.uniform(-0.3, 0.3, (2, 2, 2)).astype(np.float32)
    mv[:, :2, 2] = rng.uniform(-2, 2, (2, 2)).astype(np.float32)  # some pixels fall outside
    mv[:, 2, :2] = rng.uniform(-0.02, 0.02, (2, 2)).astype(np.float32)
    feeds = [(x, rng.standard_normal((2, 3, 6, 7)).astype(np.float32)), (m, mv)]
    model = _roundtrip([y], feeds, atol=1e-4)
    grid = bmode in ("REPLICATE", "CONSTANT", "REFLECT_101")
    assert ("GridSample" in {n.op_type for n in model.graph.node}) == grid
    _roundtrip([y], feeds, atol=1e-4, opset=15)  # no GridSample before 16: the explicit taps


@pytest.mark.parametrize("mode", ["AVERAGE", "MAX"])
def test_export_roi_align(mode, rng):
    g = mgb.comp_graph()
    x, r = _arg(g, (2, 3, 9, 8), "x"), _arg(g, (5, 5), "r")
    y = mgb.opr.roi_align(x, r, mode=mode, spatial_scale=0.5, offset=0.5, pooled_height=3,
                          pooled_width=2, sample_height=2, sample_width=3)
    rv = np.array(
        [[0, 1, 2, 10, 14], [1, 0, 0, 15, 17], [1, 5.3, 3.7, 6.1, 9.9], [0, -4, -2, 3, 30],
         [1, 12, 3, 2, 1]],
        np.float32,
    )  # fmt: skip
    feeds = [(x, rng.standard_normal((2, 3, 9, 8)).astype(np.float32)), (r, rv)]
    outs = [y] + ([y.owner_opr.outputs[1]] if mode == "MAX" else [])  # MAX's argmax too
    _roundtrip(outs, feeds, atol=1e-5)


def test_export_roi_pooling_max(rng):
    g = mgb.comp_graph()
    x, r = _arg(g, (2, 3, 9, 8), "x"), _arg(g, (4, 5), "r")
    y = mgb.opr.roi_pooling(x, r, [3, 2], mode="MAX", scale=0.5)
    rv = np.array(
        [[0, 1, 2, 10, 14], [1, 0, 0, 15, 17], [1, 5.3, 3.7, 6.1, 9.9], [0, -4, -2, 3, 30]],
        np.float32,
    )  # fmt: skip
    _roundtrip([y], [(x, rng.standard_normal((2, 3, 9, 8)).astype(np.float32)), (r, rv)])
    z = mgb.opr.roi_pooling(x, r, [3, 2], mode="AVERAGE")
    with pytest.raises(ONNXConversionError, match="AVERAGE"):
        export([z], None)


# ---- tensor manipulation ---------------------------------------------------------------------
def test_export_shapes_broadcast_axes(rng):
    g = mgb.comp_graph()
    x = _arg(g, (2, 3, 1), "x")
    outs = [
        mgb.opr.broadcast(x, (4, 2, 3, 5)),
        mgb.opr.get_var_shape(x),
        mgb.opr.get_var_shape(x, axis=1),
        mgb.opr.remove_axis(x, 2),
        mgb.opr.add_axis(x, 0),
        x.dimshuffle("x", 1, 0, 2),
        x.dimshuffle(1, "x", 0, 2),
        x.reshape(x.shape[0], -1) + 1,
        mgb.opr.identity(mgb.opr.copy(mgb.opr.mark_no_broadcast_elemwise(x))),
    ]
    _roundtrip(outs, [(x, rng.standard_normal((2, 3, 1)).astype(np.float32))])


def test_export_subtensor_family(rng):
    g = mgb.comp_graph()
    x = _arg(g, (5, 6, 4), "x")
    outs = [
        x[1:4],
        x[::-1, 2],
        x[-2, 1:5:2, ::-2],
        x[1, 2, 3],
        x[:, x.shape[1] - 1],
    ]
    v = _arg(g, (3, 4), "v")
    outs.append(mgb.opr.set_subtensor(x, v)[1:4, 2])
    outs.append(mgb.opr.incr_subtensor(x, v)[1:4, 3])
    feeds = [
        (x, rng.standard_normal((5, 6, 4)).astype(np.float32)),
        (v, rng.standard_normal((3, 4)).astype(np.float32)),
    ]
    _roundtrip(outs, feeds)


def test_export_indexing_family(rng):
    g = mgb.comp_graph()
    x = _arg(g, (4, 5, 3), "x")
    idx = _arg(g, (4, 3), "idx", np.int32)
    one = mgb.opr.indexing_one_hot(x, 1, idx, keepdims=True)
    val = _arg(g, (4, 1, 3), "val")
    setv = mgb.opr.indexing_set_one_hot(x, 1, idx, val)
    vec = _arg(g, (2, 3), "vec", np.int32)
    adv = mgb.opr.advanced_indexing(x)[:, vec]
    mesh = mgb.opr.mesh_indexing(x)[1:3, vec.reshape(-1)]
    rmap = _arg(g, (2, 2, 3), "rmap", np.int32)
    rem = mgb.opr.indexing_remap(x, rmap)
    feeds = [
        (x, rng.standard_normal((4, 5, 3)).astype(np.float32)),
        (idx, rng.integers(0, 5, (4, 3)).astype(np.int32)),
        (val, rng.standard_normal((4, 1, 3)).astype(np.float32)),
        (vec, rng.integers(0, 5, (2, 3)).astype(np.int32)),
        (rmap, np.stack([rng.integers(0, n, (2, 2)) for n in (4, 5, 3)], -1).astype(np.int32)),
    ]
    _roundtrip([one, setv, adv, mesh, rem], feeds)


@pytest.mark.parametrize(
    "index",
    [
        lambda a, b: (a, b),  # adjacent from axis 0
        lambda a, b: (slice(None), a, b),  # adjacent: in place
        lambda a, b: (a, slice(1, 3), b),  # apart: the index dims go first
    ],
)
def test_export_vector_indexing_several_axes(index, rng):
    g = mgb.comp_graph()
    x = _arg(g, (4, 5, 6), "x")
    a, b = _arg(g, (2, 1), "a", np.int32), _arg(g, (3,), "b", np.int32)
    y = mgb.opr.advanced_indexing(x)[index(a, b)]
    av, bv = rng.integers(0, 4, (2, 1)).astype(np.int32), rng.integers(0, 4, 3).astype(np.int32)
    xv = rng.standard_normal((4, 5, 6)).astype(np.float32)
    model = _roundtrip([y], [(x, xv), (a, av), (b, bv)])
    np.testing.assert_array_equal(
        _session(model).run(None, {"x": xv, "a": av, "b": bv})[0], xv[index(av, bv)]
    )


def _ints(g, name, value):
    return _arg(g, np.shape(value), name, np.int32), np.asarray(value, np.int32)


@pytest.mark.parametrize("incr", [False, True])
def test_export_vector_and_mesh_updates(incr, rng):
    g = mgb.comp_graph()
    x = _arg(g, (4, 5, 6), "x")
    (a, av), (b, bv) = _ints(g, "a", [[1], [-1]]), _ints(g, "b", [0, 2, 2])
    (c, cv) = _ints(g, "c", [4, 0, 4, -1])  # repeats: an increment adds each
    (r, rv) = _ints(g, "r", [[1, 3], [0, 0], [4, 2], [2, 2]])  # (batch, k) rows for axis 1
    kind = "incr" if incr else "set"
    adv = getattr(mgb.opr, f"{kind}_advanced_indexing")
    mesh = getattr(mgb.opr, f"{kind}_mesh_indexing")
    batched = getattr(mgb.opr, f"batched_{kind}_mesh_indexing")
    v1, v2 = _arg(g, (2, 3, 6), "v1"), _arg(g, (4, 4), "v2")
    v3, v4 = _arg(g, (2, 5, 4), "v3"), _arg(g, (4, 2, 6), "v4")
    outs = [
        adv(x, v1)[a, b],
        adv(x, v2)[:, 1, c],
        mesh(x, v3)[a.reshape(-1), :, c],
        batched(x, v4)[:, r],
        mgb.opr.batched_mesh_indexing(x)[:, r],
    ]
    feeds = [(x, rng.standard_normal((4, 5, 6)).astype(np.float32)), (a, av), (b, bv),
             (c, cv), (r, rv)]
    feeds += [(v, rng.standard_normal(v.imm_shape).astype(np.float32)) for v in (v1, v2, v3, v4)]
    model = _roundtrip(outs, feeds, opset=17)
    if incr:
        with pytest.raises(ONNXConversionError, match="opset 16"):
            export(outs[:1], None, opset=15)
    assert "ScatterND" in {n.op_type for n in model.graph.node}


@pytest.mark.parametrize("mode", ["EQ", "NEQ", "LT", "GEQ"])
def test_export_cond_take_has_data_dependent_length(mode, rng):
    g = mgb.comp_graph()
    x, m = _arg(g, (3, 4), "x"), _arg(g, (3, 4), "m", np.int32)
    vals, idx = mgb.opr.cond_take(x, m, mode=mode, val=1)
    xv = rng.standard_normal((3, 4)).astype(np.float32)
    mv = rng.integers(0, 3, (3, 4)).astype(np.int32)
    model = _roundtrip([vals, idx], [(x, xv), (m, mv)])
    assert model.graph.output[0].type.tensor_type.shape.dim[0].dim_param
    mv2 = np.ones((3, 4), np.int32)  # another count than at export
    got_v, got_i = _session(model).run(None, {"x": xv, "m": mv2})
    cond = {"EQ": mv2 == 1, "NEQ": mv2 != 1, "LT": mv2 < 1, "GEQ": mv2 >= 1}[mode].reshape(-1)
    np.testing.assert_array_equal(got_i, np.flatnonzero(cond))
    np.testing.assert_array_equal(got_v, xv.reshape(-1)[cond])


def test_export_sort_topk_arg_cumsum(rng):
    g = mgb.comp_graph()
    x = _arg(g, (3, 7), "x")
    outs = [
        *mgb.opr.argsort(x),
        *mgb.opr.argsort(x, "DESCENDING"),
        *mgb.opr.top_k(x, 3, "VALUE_IDX_SORTED"),
        *mgb.opr.top_k(x, -2, "VALUE_IDX_SORTED"),
        mgb.opr.top_k(x, 4)[0],
        mgb.opr.argmax(x, axis=1),
        mgb.opr.argmin(x, axis=0, keepdims=True),
        mgb.opr.cumsum(x, 1),
        mgb.opr.cumsum(x, 0, exclusive=False, reverse=True),
        mgb.opr.cumsum(x),
    ]
    outs = [o for o in outs if o.imm_shape != (0,)]
    _roundtrip(outs, [(x, rng.permutation(21).reshape(3, 7).astype(np.float32))])


def test_export_generators_and_param_packs(rng):
    g = mgb.comp_graph()
    x = _arg(g, (2, 3), "x")
    eye = mgb.opr.eye(x.shape, k=1, comp_graph=g, comp_node=CN)
    lin = mgb.opr.linspace(0.5, 2.0, 7, comp_graph=g, comp_node=CN)
    lin2 = mgb.opr.linspace(0.0, 1.0, 4, endpoint=False, comp_graph=g, comp_node=CN)
    zeros = mgb.opr.alloc(x.shape, comp_graph=g, comp_node=CN) * 0 + x
    packed = _arg(g, (40,), "packed")
    parts = mgb.opr.param_pack_split(packed, [(2, 3), (4,)])
    cat = mgb.opr.param_pack_concat([x * 2, parts[1]])
    feeds = [
        (x, rng.standard_normal((2, 3)).astype(np.float32)),
        (packed, rng.standard_normal(40).astype(np.float32)),
    ]
    _roundtrip([eye + x[0, 0], lin, lin2, zeros, parts[0] + x, cat], feeds)


# ---- whole models ----------------------------------------------------------------------------
def _digits_graph(batch=3):
    from megbrain.examples.digits import make_model

    m = make_model("cnn")
    m.eval()
    g = mgb.comp_graph()
    x = _arg(g, (batch, 1, 8, 8), "x")
    return x, m(x)


@pytest.mark.parametrize(
    "flags",
    [{}, {"fuse_conv_bias_nonlinearity": True}, {"f16_io_comp": True}],
    ids=["plain", "conv_bias", "f16"],
)
def test_export_optimized_digits_cnn_round_trips(flags, rng, capfd):
    x, y = _digits_graph()
    (z,) = mgb.optimize_for_inference([y], **flags)
    types = {o.type for o in mgb.cgtools.get_oprs_seq([z])}
    assert "MultipleDeviceTensorHolder" in types
    assert ("ConvBiasForward" in types) == bool(flags.get("fuse_conv_bias_nonlinearity"))
    xv = rng.standard_normal((3, 1, 8, 8)).astype(np.float32)
    tol = 1e-2 if flags.get("f16_io_comp") else 1e-4
    model = _roundtrip([z], [(x, xv)], output_names=["logits"], rtol=tol, atol=tol)
    capfd.readouterr()
    _session(model).run(None, {"x": xv})
    err = capfd.readouterr().err
    assert "not used by any node" not in err and "initializer" not in err.lower()


def test_export_jit_fused_graph(rng):
    from megbrain.gopt.jit import fuse_elemwise

    g = mgb.comp_graph()
    x, b = _arg(g, (4, 6), "x"), _arg(g, (1, 6), "b")
    y = mgb.opr.elem.tanh(x * 2 + b) * mgb.opr.elem.sigmoid(x) - b
    s = (y * y).sum(axis=1, keepdims=True)
    fused = fuse_elemwise(y.node.graph, [y.node, s.node], with_reduce=True)
    outs = [mgb.opr.SymbolVar(fused[v.node]) for v in (y, s)]
    assert {o.owner_opr.type for o in outs} == {"JITExecutor"}
    feeds = [
        (x, rng.standard_normal((4, 6)).astype(np.float32)),
        (b, rng.standard_normal((1, 6)).astype(np.float32)),
    ]
    _roundtrip(outs, feeds)


# ---- dynamic axes ----------------------------------------------------------------------------
def test_export_dynamic_axes_are_symbolic():
    g = mgb.comp_graph()
    x = _arg(g, (2, 3), "x")
    y = mgb.opr.elem.tanh(x) + 1
    model = export([y], None, dynamic_axes={"x": {0: "N"}, "output_0": {0: "N"}})
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    sess = _session(model)
    xv = np.linspace(-1, 1, 15, dtype=np.float32).reshape(5, 3)
    np.testing.assert_allclose(sess.run(None, {"x": xv})[0], np.tanh(xv) + 1, rtol=1e-6)


def test_export_dynamic_batch_through_shape_arithmetic(rng):
    g = mgb.comp_graph()
    x, y = _cnn(g, rng)
    # the CNN's reshape uses the number 2: the batch is fixed there, and export says so
    with pytest.raises(ONNXConversionError, match="dynamic"):
        export([y], None, dynamic_axes={"x": {0: "N"}, "output_0": {1: "N"}})
    g = mgb.comp_graph()
    x = _arg(g, (2, 3, 4, 4), "x")
    w = _shared(g, rng.standard_normal((5, 3, 3, 3)).astype(np.float32), "w")
    h = mgb.opr.pooling(mgb.opr.convolution(x, w, pad_h=1, pad_w=1), mode="MAX")
    f = h.reshape(h.shape[0], -1)
    out = mgb.opr.matrix_mul(f, _shared(g, np.ones((20, 2), np.float32), "fc"))
    model = export([out], None, dynamic_axes={"x": {0: "N"}})
    assert model.graph.output[0].type.tensor_type.shape.dim[0].dim_param  # symbolic
    sess = _session(model)
    for n in (1, 5):
        xv = rng.standard_normal((n, 3, 4, 4)).astype(np.float32)
        got = sess.run(None, {"x": xv})[0]
        g2 = mgb.comp_graph()
        x2 = _arg(g2, (n, 3, 4, 4), "x")
        w2 = mgb.make_immutable(CN, g2, w.inferred_value)
        h2 = mgb.opr.pooling(mgb.opr.convolution(x2, w2, pad_h=1, pad_w=1), mode="MAX")
        o2 = mgb.opr.matrix_mul(h2.reshape(n, -1), mgb.make_immutable(CN, g2, np.ones((20, 2),
                                                                                     np.float32)))
        (want,) = g2.compile([x2], [mgb.copy_output(o2)])(xv)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_export_dynamic_axis_into_a_baked_shape_is_refused():
    g = mgb.comp_graph()
    x, v = _arg(g, (4, 3), "x"), _arg(g, (3,), "v")
    y = mgb.opr.set_subtensor(x, v)[1]
    with pytest.raises(ONNXConversionError, match="static shape"):
        export([y], None, dynamic_axes={"x": {0: "N"}})


# ---- refusals --------------------------------------------------------------------------------
def test_export_refuses_operators_without_onnx_form():
    g = mgb.comp_graph()
    x = _arg(g, (4,), "x")
    y = mgb.opr.uniform_rng(x.shape, comp_graph=g, comp_node=CN) + x
    with pytest.raises(ONNXConversionError, match="UniformRNG.*has no ONNX form"):
        export([y], None)
    s = _shared(g, np.zeros(4, np.float32), "s")
    with pytest.raises(ONNXConversionError, match="AddUpdate.*in place"):
        export([mgb.opr.add_update(s, x)], None)


def test_every_operator_type_is_exported_or_refused():
    from megbrain.graph.operator import OPR_REGISTRY

    known = set(exportable_operator_types()) | set(refused_operator_types())
    # megbrain's own operators (tests register operator classes of their own)
    ours = {n for n, cls in OPR_REGISTRY.items() if cls.__module__.startswith("megbrain.")}
    missing = sorted(ours - known)
    assert not missing, f"operator types neither exported nor refused: {missing}"
    assert not set(exportable_operator_types()) & set(refused_operator_types())


def test_export_fixed_reshape_of_a_dynamic_dim_is_refused():
    g = mgb.comp_graph()
    x = _arg(g, (2, 3, 4), "x")
    y = mgb.opr.elem.relu(x).reshape(2, 12)
    with pytest.raises(ONNXConversionError, match=r"reshape\(RELU\(x\)\).*fixed shape \[2, 12\]"):
        export([y], None, dynamic_axes={"x": {0: "N"}})
    y = mgb.opr.elem.relu(x).reshape(2, -1)
    with pytest.raises(ONNXConversionError, match=r"fixes it to 2 at operator 'reshape"):
        export([y], None, dynamic_axes={"x": {0: "N"}, "output_0": {0: "N"}})


@pytest.mark.parametrize("opset", [13, 15, 18, 21])
def test_export_opsets(opset, rng):
    g = mgb.comp_graph()
    x, y = _cnn(g, rng)
    z = mgb.opr.elemwise(y, mode="H_SWISH").max(axis=0, keepdims=True)
    model = _roundtrip([z], [(x, rng.standard_normal((2, 3, 8, 8)).astype(np.float32))],
                       opset=opset)
    assert model.opset_import[0].version == opset


def test_export_rejects_bad_arguments():
    g = mgb.comp_graph()
    x = _arg(g, (2,), "x")
    with pytest.raises(ONNXConversionError, match="opset 12"):
        export([x + 1], None, opset=12)
    with pytest.raises(ONNXConversionError, match="2 output names for 1 outputs"):
        export([x + 1], None, output_names=["a", "b"])
    with pytest.raises(ONNXConversionError, match="dynamic axis 3 of input 'x'"):
        export([x + 1], None, dynamic_axes={"x": {3: "N"}})
    with pytest.raises(ONNXConversionError, match="repeated output names"):
        export([x + 1, x * 2], None, output_names=["y", "y"])
    with pytest.raises(ONNXConversionError, match="input name 'y' is an output's"):
        export([x + 1], None, input_names=["y"], output_names=["y"])


def test_export_model_names_win_over_var_names(rng):
    g = mgb.comp_graph()
    x = _arg(g, (2, 3), "x")
    w = _shared(g, rng.standard_normal((3, 3)).astype(np.float32), "logits")
    y = mgb.opr.matrix_mul(x, w)
    model = _roundtrip([y], [(x, rng.standard_normal((2, 3)).astype(np.float32))],
                       output_names=["logits"])
    assert [o.name for o in model.graph.output] == ["logits"]
    assert [t.name for t in model.graph.initializer] == ["logits_1"]


hyp = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@st.composite
def _index(draw):
    shape = draw(st.lists(st.integers(1, 5), min_size=1, max_size=3))
    idx = []
    for n in shape:
        if draw(st.booleans()) and draw(st.booleans()):
            idx.append(draw(st.integers(-n, n - 1)))
            continue
        bound = st.none() | st.integers(-7, 7)
        step = draw(st.none() | st.sampled_from([-3, -2, -1, 1, 2, 3]))
        idx.append(slice(draw(bound), draw(bound), step))
    return tuple(shape), tuple(idx)


@settings(max_examples=40, deadline=None)
@given(_index())
def test_export_subtensor_matches_numpy(case):
    shape, idx = case
    want = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)[idx]
    hyp.assume(want.size > 0)
    g = mgb.comp_graph()
    x = _arg(g, shape, "x")
    y = x[idx]
    model = export([y], None)
    xv = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    (got,) = _session(model).run(None, {"x": xv})
    np.testing.assert_array_equal(got, want.reshape(want.shape or (1,)))


def _dynamic_model(g, n):
    """A graph of many families whose shapes follow the batch ``n`` of its inputs."""
    wr = np.random.default_rng(7)

    def c(shape, scale=1.0):
        return mgb.make_immutable(CN, g, (scale * wr.standard_normal(shape)).astype(np.float32))

    x = _arg(g, (n, 3, 6, 6), "x")
    m = _arg(g, (n, 3, 3), "m")
    idx = _arg(g, (n, 6, 6), "idx", np.int32)
    h = mgb.opr.conv_bias_activation(x, c((4, 3, 3, 3)), c((1, 4, 1, 1)), nonlineMode="RELU",
                                     pad_h=1, pad_w=1)
    h = mgb.opr.batch_norm(h, c((1, 4, 1, 1)), c((1, 4, 1, 1)), c((1, 4, 1, 1)),
                           mgb.opr.elem.abs(c((1, 4, 1, 1))) + 0.5, param_dim="DIM_1C11",
                           fwd_mode="INFERENCE")[-1]
    h = mgb.opr.lrn(mgb.opr.deconvolution(h, c((4, 2, 2, 2)), stride_h=2, stride_w=2), n=3)
    h = mgb.opr.resize(h, [6, 6], format="NCHW")
    h = mgb.opr.concat(h, mgb.opr.warp_perspective(x, m, [6, 6]), axis=1)[:, 1:]  # 4 channels
    one = mgb.opr.indexing_one_hot(h, 1, mgb.opr.elem.abs(idx) % 4, keepdims=True)
    f = (h * one).reshape(h.shape[0], -1)  # (n, 144)
    top = mgb.opr.top_k(f, -3, "VALUE_IDX_SORTED")[0]
    cs = mgb.opr.cumsum(f, 1, exclusive=False)
    b = mgb.opr.broadcast(f.sum(axis=1, keepdims=True), f.shape) + cs
    arg = mgb.opr.typecvt(mgb.opr.argmax(b, axis=1, keepdims=True), np.float32)
    logits = mgb.opr.matrix_mul(b, c((144, 4), 0.05)) + arg * 0.01
    return [x, m, idx], [logits, top, f.dimshuffle(1, 0)[:3]]


def test_export_dynamic_batch_over_many_families(rng):
    def feeds(n):
        mv = np.tile(np.eye(3, dtype=np.float32), (n, 1, 1))
        mv[:, :2, 2] = rng.uniform(-1, 1, (n, 2))
        return [rng.standard_normal((n, 3, 6, 6)).astype(np.float32), mv,
                rng.integers(-9, 9, (n, 6, 6)).astype(np.int32)]

    g = mgb.comp_graph()
    ins, outs = _dynamic_model(g, 2)
    dyn = {"x": {0: "N"}, "m": {0: "N"}, "idx": {0: "N"}, "output_0": {0: "N"},
           "output_1": {0: "N"}, "output_2": {1: "N"}}
    model = export(outs, None, dynamic_axes=dyn)
    onnx.checker.check_model(model, full_check=True)
    _assert_clean(model)
    sess = _session(model)
    for n in (1, 3):
        vals = feeds(n)
        g2 = mgb.comp_graph()
        ins2, outs2 = _dynamic_model(g2, n)
        want = g2.compile(ins2, [mgb.copy_output(o) for o in outs2])(*vals)
        got = sess.run(None, dict(zip(["x", "m", "idx"], vals)))
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


@st.composite
def _shuffle_case(draw):
    shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    perm = draw(st.permutations(range(len(shape))))
    pattern = list(perm)
    for _ in range(draw(st.integers(0, 2))):
        pattern.insert(draw(st.integers(0, len(pattern))), "x")
    out = [1 if d == "x" else shape[d] for d in pattern]
    other = [draw(st.sampled_from([1, n])) for n in out]  # broadcasts against out
    dtype = draw(st.sampled_from([np.float32, np.int32]))
    mode = draw(st.sampled_from(["ADD", "MUL", "MAX", "SUB"]))
    return tuple(shape), pattern, tuple(other), dtype, mode


@settings(max_examples=30, deadline=None)
@given(_shuffle_case())
def test_export_dimshuffle_and_broadcast_elemwise(case):
    shape, pattern, other, dtype, mode = case
    rng = np.random.default_rng(1)
    g = mgb.comp_graph()
    x, y = _arg(g, shape, "x", dtype), _arg(g, other, "y", dtype)
    z = mgb.opr.elemwise(x.dimshuffle(*pattern), y, mode=mode)
    xv = rng.integers(-5, 5, shape).astype(dtype)
    yv = rng.integers(-5, 5, other).astype(dtype)
    _roundtrip([z], [(x, xv), (y, yv)], reload=False)


@pytest.mark.parametrize(
    "name",
    ["light_squeezenet", pytest.param("light_inception_v1", marks=pytest.mark.slow)],
)
def test_export_an_imported_model_round_trips(name):
    """An ONNX model loaded into megbrain and exported again runs in onnxruntime like
    megbrain runs it (logits compared: the light models' constant weights make their
    softmax ill-conditioned)."""
    import os

    path = os.path.join(
        os.path.dirname(onnx.__file__), "backend", "test", "data", "light", name + ".onnx"
    )
    if not os.path.exists(path):
        pytest.skip("the onnx wheel has no light models")
    model = onnx.load(path)
    last = model.graph.node[-1]
    if last.op_type == "Softmax":
        vi = onnx.ValueInfoProto()
        vi.CopyFrom(model.graph.output[0])
        vi.name = last.input[0]
        del model.graph.output[:]
        model.graph.output.append(vi)
        del model.graph.node[-1]
    res = load(model)
    names = list(res.inputs)
    rng = np.random.default_rng(0)
    feed = [rng.random(res.inputs[n].imm_shape, dtype=np.float32) for n in names]
    outs = list(res.outputs.values())
    want = res.graph.compile([res.inputs[n] for n in names], [mgb.copy_output(o) for o in outs])(
        *feed
    )
    want = want if isinstance(want, (list, tuple)) else [want]
    ex = export(outs, None, input_names=names)
    _assert_clean(ex)
    got = _session(ex).run(None, dict(zip(names, feed)))
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(b).max()))
