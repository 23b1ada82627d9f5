"""The NCHW88 format of Convolution and ConvBias, ConvBias's fourth input ``z`` and
RelayoutFormat: values against NumPy references, static shapes, the algorithm recorded,
gradients (of ``z``; none for NCHW88), serialization, and bad inputs."""

import numpy as np
import pytest
from opr_harness import check_grad, check_opr, inputs, make_graph, run
from test_dnn_conv import ref_conv

import megbrain as mgb
from megbrain.errors import MegBrainError
from megbrain.graph import static_shape
from megbrain.opr import relayout_format
from megbrain.opr.base import create_opr
from megbrain.opr.dnn import ConvolutionParam, convolution
from megbrain.opr.dnn_conv_bias import ConvBiasParam
from megbrain.opr.grad import grad as graph_grad


def _rand(rng, *shape):
    return rng.uniform(-1, 1, shape).astype(np.float32)


def _to88(x):
    n, c, h, w = x.shape
    return np.ascontiguousarray(x.reshape(n, c // 8, 8, h, w).transpose(0, 1, 3, 4, 2))


def _from88(y):
    n, cb, h, w, p = y.shape
    return y.transpose(0, 1, 4, 2, 3).reshape(n, cb * p, h, w)


def _dense88(w):
    oc, ic, fh, fw = w.shape
    blocks = w.reshape(oc // 8, 8, ic // 8, 8, fh, fw)
    return np.ascontiguousarray(blocks.transpose(0, 2, 4, 5, 3, 1))


def _conv_bias(ins, param):
    return create_opr("ConvBiasForward", [v.node for v in ins], param, None)[0]


# ---- ConvBias's z --------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["IDENTITY", "RELU", "SIGMOID", "H_SWISH"])
def test_conv_bias_adds_z_before_the_activation(mode):
    rng = np.random.default_rng(1)
    x, w, b = _rand(rng, 2, 3, 6, 5), _rand(rng, 4, 3, 3, 3), _rand(rng, 1, 4, 1, 1)
    z = _rand(rng, 2, 4, 6, 5)
    act = {
        "IDENTITY": lambda v: v,
        "RELU": lambda v: np.maximum(v, 0),
        "SIGMOID": lambda v: 1 / (1 + np.exp(-v)),
        "H_SWISH": lambda v: v * np.clip(v + 3, 0, 6) / 6,
    }[mode]
    param = ConvBiasParam(pad_h=1, pad_w=1, nonlineMode=mode)
    check_opr(
        lambda *vs: _conv_bias(vs, param),
        lambda a, f, c, d: act(ref_conv(a, f, (1, 1), (1, 1), (1, 1)) + c + d),
        [x, w, b, z],
        rtol=1e-4,
        atol=1e-5,
    )


@pytest.mark.parametrize("mode", ["IDENTITY", "RELU", "H_SWISH"])
def test_conv_bias_grad_with_z(mode):
    rng = np.random.default_rng(2)
    arrays = [rng.standard_normal(s) for s in [(1, 2, 4, 4), (3, 2, 3, 3), (1, 3, 1, 1),
                                               (1, 3, 4, 4)]]  # fmt: skip
    param = ConvBiasParam(pad_h=1, pad_w=1, nonlineMode=mode)
    check_grad(lambda *vs: _conv_bias(vs, param), arrays)


def test_z_of_another_shape_is_refused():
    rng = np.random.default_rng(3)
    g = make_graph()
    xs, _ = inputs(g, _rand(rng, 1, 2, 4, 4), _rand(rng, 3, 2, 3, 3), _rand(rng, 1, 3, 1, 1),
                   _rand(rng, 1, 3, 2, 2))  # fmt: skip
    with pytest.raises(MegBrainError, match=r"ConvBias.*z \{1,3,2,2\} must have the output "
                                            r"shape \{1,3,4,4\}"):  # fmt: skip
        _conv_bias(xs, ConvBiasParam(pad_h=1, pad_w=1))


# ---- the NCHW88 format ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "ic, oc, fshape, kw",
    [
        (16, 32, (3, 3), dict(pad_h=1, pad_w=1)),
        (16, 16, (1, 1), dict()),
        (8, 32, (1, 1), dict(stride_h=2, stride_w=2)),
        (24, 8, (3, 2), dict(stride_h=2, dilate_w=2, mode="CONVOLUTION")),
    ],
)
def test_nchw88_convolution_matches_nchw(ic, oc, fshape, kw):
    rng = np.random.default_rng(4)
    x, w = _rand(rng, 2, ic, 9, 8), _rand(rng, oc, ic, *fshape)
    p = ConvolutionParam(**kw)
    flip = kw.get("mode") == "CONVOLUTION"
    want = ref_conv(x, w, p.stride, p.pad, p.dilate, flip=flip)
    check_opr(
        lambda a, b: convolution(a, b, format="NCHW88", **kw),
        lambda a, b: _to88(want),
        [_to88(x), _dense88(w)],
        rtol=1e-4,
        atol=1e-5,
    )


def test_nchw88_grouped_and_channel_wise_filters():
    rng = np.random.default_rng(5)
    x = _rand(rng, 1, 32, 6, 6)
    wg = _rand(rng, 2, 16, 16, 3, 3)  # 2 groups of 16 -> 16
    g88 = np.ascontiguousarray(wg.reshape(2, 2, 8, 2, 8, 3, 3).transpose(0, 1, 3, 5, 6, 4, 2))
    check_opr(
        lambda a, b: convolution(a, b, format="NCHW88", sparse="GROUP", pad_h=1, pad_w=1),
        lambda a, b: _to88(ref_conv(x, wg, (1, 1), (1, 1), (1, 1), group=True)),
        [_to88(x), g88],
        rtol=1e-4,
        atol=1e-5,
    )
    wc = _rand(rng, 32, 1, 1, 3, 3)  # channel-wise
    c88 = np.ascontiguousarray(wc.reshape(4, 8, 3, 3).transpose(0, 2, 3, 1))[:, None, None]
    check_opr(
        lambda a, b: convolution(a, b, format="NCHW88", sparse="GROUP"),
        lambda a, b: _to88(ref_conv(x, wc, (1, 1), (0, 0), (1, 1), group=True)),
        [_to88(x), c88],
        rtol=1e-4,
        atol=1e-5,
    )


def test_nchw88_hybrid_first_layer():
    rng = np.random.default_rng(6)
    x, w = _rand(rng, 1, 3, 9, 9), _rand(rng, 16, 3, 3, 3)
    w88 = np.ascontiguousarray(w.reshape(2, 8, 3, 3, 3).transpose(0, 3, 4, 2, 1))
    check_opr(
        lambda a, b: convolution(a, b, format="NCHW88", stride_h=2, stride_w=2),
        lambda a, b: _to88(ref_conv(x, w, (2, 2), (0, 0), (1, 1))),
        [x, w88],
        rtol=1e-4,
        atol=1e-5,
    )


@pytest.mark.parametrize("with_z", [False, True])
@pytest.mark.parametrize("mode", ["RELU", "SIGMOID", "H_SWISH"])
def test_nchw88_conv_bias(with_z, mode):
    rng = np.random.default_rng(7)
    x, w, b = _rand(rng, 1, 16, 7, 7), _rand(rng, 32, 16, 3, 3), _rand(rng, 1, 32, 1, 1)
    z = _rand(rng, 1, 32, 7, 7)
    act = {
        "RELU": lambda v: np.maximum(v, 0),
        "SIGMOID": lambda v: 1 / (1 + np.exp(-v)),
        "H_SWISH": lambda v: v * np.clip(v + 3, 0, 6) / 6,
    }[mode]
    want = ref_conv(x, w, (1, 1), (1, 1), (1, 1)) + b + (z if with_z else 0)
    arrays = [_to88(x), _dense88(w), _to88(b)] + ([_to88(z)] if with_z else [])
    param = ConvBiasParam(pad_h=1, pad_w=1, nonlineMode=mode, format="NCHW88")
    check_opr(lambda *vs: _conv_bias(vs, param), lambda *a: _to88(act(want)), arrays,
              rtol=1e-4, atol=1e-5)  # fmt: skip


@pytest.mark.parametrize("mode", ["RELU", "H_SWISH"])
def test_nchw88_channel_wise_conv_bias_applies_the_activation_in_its_kernel(monkeypatch, mode):
    import types

    from megbrain.opr import dnn_conv_bias

    def no_pass(*args, **kwargs):
        raise AssertionError("the bias and activation went to an elementwise pass")

    monkeypatch.setattr(dnn_conv_bias, "ew_kernels", types.SimpleNamespace(bind=no_pass))
    rng = np.random.default_rng(9)
    x, wc, b = _rand(rng, 1, 16, 9, 9), _rand(rng, 16, 1, 1, 3, 3), _rand(rng, 1, 16, 1, 1)
    act = {
        "RELU": lambda v: np.maximum(v, 0),
        "H_SWISH": lambda v: v * np.clip(v + 3, 0, 6) / 6,
    }[mode]
    want = act(ref_conv(x * 4, wc, (1, 1), (1, 1), (1, 1), group=True) + b)
    c88 = np.ascontiguousarray(wc.reshape(2, 8, 3, 3).transpose(0, 2, 3, 1))[:, None, None]
    param = ConvBiasParam(pad_h=1, pad_w=1, nonlineMode=mode, format="NCHW88", sparse="GROUP")
    g = make_graph()
    ins, _ = inputs(g, _to88(x * 4), c88, _to88(b))
    y = _conv_bias(ins, param)
    (got,) = run([y], g)
    assert y.node.owner.chosen_algorithm == "CHANNELWISE_NCHW88"
    np.testing.assert_allclose(_from88(got), want, rtol=1e-4, atol=1e-5)


def test_nchw88_records_its_algorithm_and_refuses_gradients():
    rng = np.random.default_rng(8)
    g = make_graph()
    (x, w), _ = inputs(g, _to88(_rand(rng, 1, 16, 5, 5)), _dense88(_rand(rng, 16, 16, 3, 3)))
    y = convolution(x, w, format="NCHW88", pad_h=1, pad_w=1)
    assert static_shape(y.node) == (1, 2, 5, 5, 8)
    run([y], g)
    assert y.node.owner.chosen_algorithm == "DIRECT_NCHW88"
    (x8, w8), _ = inputs(g, _to88(_rand(rng, 1, 16, 5, 5)), _dense88(_rand(rng, 8, 16, 1, 1)))
    y8 = convolution(x8, w8, format="NCHW88")
    run([y8], g)  # 8 output channels, 1x1: a tile of half a block of 16
    assert y8.node.owner.chosen_algorithm == "POINTWISE_NCHW88"
    w3 = _rand(rng, 16, 3, 3, 3).reshape(2, 8, 3, 3, 3).transpose(0, 3, 4, 2, 1)
    (x3, w3), _ = inputs(g, _rand(rng, 1, 3, 9, 9), np.ascontiguousarray(w3))
    y3 = convolution(x3, w3, format="NCHW88")
    run([y3], g)  # a hybrid first layer: the direct kernel writing NCHW88
    assert y3.node.owner.chosen_algorithm == "DIRECT_NCHW_NCHW88"
    (gx,) = graph_grad(y.sum(), x)  # an InvalidGrad: building never fails, compiling does
    with pytest.raises(MegBrainError, match="NCHW88 format has no gradient"):
        run([gx], g)


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda x, w: convolution(x, w, format="NCHW88"), "dense filter is"),
        (lambda x, w: convolution(x, w, format="NCHW44"), "only NCHW, NCHW88 and NCHW4"),
    ],
)
def test_nchw88_bad_inputs_name_the_operator_and_shapes(build, match):
    g = make_graph()
    (x, w), _ = inputs(g, np.zeros((1, 2, 5, 5, 8), np.float32), np.zeros((16, 16, 3, 3),
                                                                          np.float32))  # fmt: skip
    with pytest.raises(MegBrainError, match=match) as info:
        build(x, w)
    assert "Convolution" in str(info.value)


def test_nchw88_graph_dumps_and_loads(tmp_path):
    rng = np.random.default_rng(9)
    x, w = _rand(rng, 1, 16, 6, 6), _rand(rng, 16, 16, 3, 3)
    g = mgb.comp_graph()
    cn = mgb.comp_node("cpu0")
    xv = mgb.make_arg(cn, g, shape=x.shape, name="x")
    wv = mgb.make_shared(cn, value=w, comp_graph=g)
    y = relayout_format(
        convolution(relayout_format(xv, mode="NCHW_NCHW88"),
                    relayout_format(wv, mode="NCHW_NCHW88_CONV_DENSE_WEIGHT"),
                    format="NCHW88", pad_h=1, pad_w=1),  # fmt: skip
        mode="NCHW88_NCHW",
    )
    path = str(tmp_path / "g.mge")
    mgb.serialize_comp_graph_to_file(path, [y])
    cg, _, outputs = mgb.load_comp_graph_from_file(path)
    (inp,) = mgb.cgtools.get_dep_vars(outputs, "Host2DeviceCopy")
    f = cg.compile([inp], mgb.copy_output(outputs[0]))
    np.testing.assert_allclose(f(x), ref_conv(x, w, (1, 1), (1, 1), (1, 1)), rtol=1e-4,
                               atol=1e-5)  # fmt: skip


# ---- RelayoutFormat ------------------------------------------------------------------------
def _ref_relayout(a, mode):
    def pad(a, axis):
        width = [(0, 0)] * a.ndim
        width[axis] = (0, -a.shape[axis] % 8)
        return np.pad(a, width)

    if mode == "NCHW_NCHW88":
        return _to88(pad(a, 1))
    if mode == "NCHW88_NCHW":
        return _from88(a)
    if mode == "NCHW_NCHW88_CONV_DENSE_WEIGHT":
        return _dense88(pad(a, 1))
    if mode == "NCHW_NCHW88_CONV_GROUP_WEIGHT":
        a = pad(a, 2)
        g, oc, ic, fh, fw = a.shape
        return a.reshape(g, oc // 8, 8, ic // 8, 8, fh, fw).transpose(0, 1, 3, 5, 6, 4, 2)
    a = pad(a, 0)  # CHAN_WEIGHT (G, 1, 1, FH, FW)
    g, _, _, fh, fw = a.shape
    return a.reshape(g // 8, 8, 1, 1, fh, fw).transpose(0, 2, 3, 4, 5, 1)


@pytest.mark.parametrize(
    "mode, shape",
    [
        ("NCHW_NCHW88", (2, 16, 3, 4)),
        ("NCHW_NCHW88", (1, 5, 3, 2)),  # channels padded with zeros
        ("NCHW88_NCHW", (2, 2, 3, 4, 8)),
        ("NCHW_NCHW88_CONV_DENSE_WEIGHT", (16, 12, 3, 3)),
        ("NCHW_NCHW88_CONV_GROUP_WEIGHT", (2, 8, 3, 1, 1)),
        ("NCHW_NCHW88_CONV_CHAN_WEIGHT", (12, 1, 1, 3, 3)),
    ],
)
def test_relayout_format_modes(mode, shape):
    a = _rand(np.random.default_rng(10), *shape)
    # twice: the padding of a private buffer stays zero from run to run
    check_opr(lambda v: relayout_format(v, mode=mode), lambda v: _ref_relayout(v, mode), [a])


@pytest.mark.parametrize("mode, shape", [("NCHW_NCHW88", (1, 16, 2, 3)),
                                         ("NCHW88_NCHW", (1, 2, 2, 3, 8)),
                                         ("NCHW_NCHW4", (1, 8, 2, 3)),
                                         ("NCHW4_NCHW", (1, 2, 2, 3, 4))])  # fmt: skip
def test_relayout_format_grad_is_the_inverse(mode, shape):
    check_grad(lambda v: relayout_format(v, mode=mode),
               [np.random.default_rng(11).standard_normal(shape)])  # fmt: skip


@pytest.mark.parametrize(
    "mode, shape, match",
    [
        ("NHWC_NHWCD4", (1, 2, 3, 4), "mode NHWC_NHWCD4 is not implemented"),
        ("NCHW_NCHW88", (2, 3, 4), "needs a 4-d source"),
        ("NCHW88_NCHW", (1, 2, 3, 4, 4), r"\(N, C/8, H, W, 8\)"),
        ("NCHW_NCHW88_CONV_DENSE_WEIGHT", (12, 8, 3, 3), "must be a multiple of 8"),
        ("NCHW_NCHW88_CONV_CHAN_WEIGHT", (8, 2, 1, 3, 3), r"\(G, 1, 1, FH, FW\)"),
    ],
)
def test_relayout_format_refuses_what_it_does_not_do(mode, shape, match):
    g = make_graph()
    (x,), _ = inputs(g, np.zeros(shape, np.float32))
    with pytest.raises(MegBrainError, match=match) as info:
        relayout_format(x, mode=mode)
    assert "RelayoutFormat" in str(info.value)


def test_relayout_format_of_a_padded_source_has_no_gradient():
    g = make_graph()
    (x,), _ = inputs(g, np.zeros((1, 5, 2, 2), np.float32))
    y = relayout_format(x, mode="NCHW_NCHW88")
    (gx,) = graph_grad(y.sum(), x)
    with pytest.raises(MegBrainError, match="no gradient"):
        run([gx], g)


def _plan_run(outs, g):
    got = {}
    spec = [(o.node, (lambda a, i=i: got.__setitem__(i, np.array(a)))) for i, o in enumerate(outs)]
    f = g.compile(spec)
    f.execute().wait()
    return f, [got[i] for i in range(len(outs))]


@pytest.mark.parametrize("mode", ["RELU", "H_SWISH"])
@pytest.mark.parametrize("fshape", [(1, 1), (3, 3)])
def test_nchw88_conv_bias_output_takes_z_memory(fshape, mode):
    # the residual z is read once, by this ConvBias: the output may overwrite it, and the
    # kernel reads each position's z before writing it
    rng = np.random.default_rng(12)
    x, w, b = _rand(rng, 1, 16, 9, 9), _rand(rng, 32, 16, *fshape), _rand(rng, 1, 32, 1, 1)
    zsrc = _rand(rng, 1, 32, 9, 9)
    g = make_graph()
    (xv, wv, bv, zv), _ = inputs(g, _to88(x), _dense88(w), _to88(b), _to88(zsrc))
    z = mgb.opr.elem.exp(zv)  # a var of the plan's own (an input's copy is not overwritten)
    pad = fshape[0] // 2
    param = ConvBiasParam(pad_h=pad, pad_w=pad, nonlineMode=mode, format="NCHW88")
    y = _conv_bias([xv, wv, bv, z], param)
    f, (got,) = _plan_run([y], g)
    assert f._plan.decisions[y.node] == ("inplace", 3)
    want = ref_conv(x, w, (1, 1), (pad, pad), (1, 1)) + b + np.exp(zsrc)
    want = np.maximum(want, 0) if mode == "RELU" else want * np.clip(want + 3, 0, 6) / 6
    np.testing.assert_allclose(_from88(got), want, rtol=1e-4, atol=1e-5)


def test_z_read_again_or_as_the_source_keeps_its_memory():
    rng = np.random.default_rng(13)
    g = make_graph()
    (xv, wv, bv), _ = inputs(g, _to88(_rand(rng, 1, 16, 6, 6)), _dense88(_rand(rng, 16, 16, 1, 1)),
                             _to88(_rand(rng, 1, 16, 1, 1)))  # fmt: skip
    src = mgb.opr.elem.exp(xv)
    param = ConvBiasParam(nonlineMode="RELU", format="NCHW88")
    y = _conv_bias([src, wv, bv, src], param)  # z is the source: no in-place
    f, (got,) = _plan_run([y], g)
    assert f._plan.decisions[y.node][0] == "alloc"
    assert y.node.owner.inplace_input() is None


def test_z_memory_given_to_the_output_is_kept_when_the_bias_is_a_strided_view():
    # the plan gives the output z's memory; a non-contiguous bias keeps the kernel from
    # applying the epilogue, so the bias and z are added after: z must be kept first
    rng = np.random.default_rng(14)
    x, w = _rand(rng, 1, 16, 5, 5), _rand(rng, 16, 16, 3, 3)
    b, zsrc = _rand(rng, 1, 16, 1, 1), _rand(rng, 1, 16, 5, 5)
    g = make_graph()
    bt = np.ascontiguousarray(_to88(b).transpose(0, 4, 2, 3, 1))  # (1, 8, 1, 1, 2)
    (xv, wv, btv, zv), _ = inputs(g, _to88(x), _dense88(w), bt, _to88(zsrc))
    bias = btv.dimshuffle(0, 4, 2, 3, 1)  # a strided view of shape (1, 2, 1, 1, 8)
    z = mgb.opr.elem.exp(zv)
    param = ConvBiasParam(pad_h=1, pad_w=1, nonlineMode="RELU", format="NCHW88")
    y = _conv_bias([xv, wv, bias, z], param)
    f, (got,) = _plan_run([y], g)
    assert f._plan.decisions[y.node] == ("inplace", 3)
    want = np.maximum(ref_conv(x, w, (1, 1), (1, 1), (1, 1)) + b + np.exp(zsrc), 0)
    np.testing.assert_allclose(_from88(got), want, rtol=1e-4, atol=1e-5)
