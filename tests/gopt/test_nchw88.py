"""optimize_for_inference's use_nchw88 (the channel-blocked layout between the convolutions)
and the four-input ConvBias of fuse_conv_bias_with_z: the rewritten graphs compute what the
original ones do, with the operators converted that should be and the others read back."""

from __future__ import annotations

import numpy as np
import pytest

import megbrain as mgb
from megbrain.opr.dnn import convolution

CN = "cpu0"
F32 = np.float32


def _shared(g, rng, shape, name):
    return mgb.make_shared(CN, value=rng.standard_normal(shape).astype(F32) * 0.3, comp_graph=g,
                           name=name)  # fmt: skip


def _oprs(outs):
    g = outs[0].owner_graph
    f = g.compile(None, [mgb.copy_output(v) for v in outs])
    return f, list(f._func.iter_opr_seq())


def _results(outs, feed):
    f, _ = _oprs(outs)
    names = {v.name for v in f.inputs}
    return f(**{k: v for k, v in feed.items() if k in names})


def _residual_net(seed=0, c=16, mid=16, groups=1):
    """A ResNet bottleneck (1x1, 3x3 (grouped), 1x1 + the input, ReLU), a strided 3x3 with a
    channel count that is no multiple of 8, max pooling and a sigmoid gate, the outputs in
    NCHW: what the NCHW88 rewrite must keep."""
    rng = np.random.default_rng(seed)
    g = mgb.comp_graph(check_env_var=False)
    g.set_option("log_level", 0)
    x = mgb.make_arg(CN, g, name="x", shape=(2, c, 10, 9))
    relu = mgb.opr.elem.relu

    def conv(v, ic, oc, k, name, **kw):
        w = _shared(g, rng, (oc, ic, k, k), name)
        y = convolution(v, w, pad_h=k // 2, pad_w=k // 2, **kw)
        return y + _shared(g, rng, (1, oc, 1, 1), name + "_b")

    h = relu(conv(x, c, mid, 1, "a"))
    if groups > 1:
        wg = _shared(g, rng, (groups, mid // groups, mid // groups, 3, 3), "bg")
        h = relu(convolution(h, wg, pad_h=1, pad_w=1, sparse="GROUP")
                 + _shared(g, rng, (1, mid, 1, 1), "bg_b"))  # fmt: skip
    else:
        h = relu(conv(h, mid, mid, 3, "b"))
    y = relu(conv(h, mid, c, 1, "c") + x)
    odd = conv(y, c, 12, 3, "d", stride_h=2, stride_w=2)  # 12 channels: stays NCHW
    pooled = mgb.opr.pooling(y, window_h=2, window_w=2)
    gate = mgb.opr.elem.sigmoid(y) * y * 0.5  # a scalar operand broadcasts in NCHW88 too
    feed = {"x": rng.standard_normal((2, c, 10, 9)).astype(F32)}
    return g, [y, odd, pooled, gate], feed


@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("fuse", [False, True])
def test_use_nchw88_computes_the_same(groups, fuse):
    _, outs, feed = _residual_net(groups=groups)
    want = _results(outs, feed)
    opts = dict(fuse_conv_bias_nonlinearity=fuse, fuse_conv_bias_with_z=fuse)
    new = mgb.optimize_for_inference(outs, use_nchw88=True, **opts)
    got = _results(new, feed)
    for a, b in zip(want, got):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
    _, seq = _oprs(new)
    convs = [o for o in seq if o.type_name.startswith("Conv")]
    formats = sorted(o.param.format for o in convs)
    assert formats == ["NCHW", "NCHW88", "NCHW88", "NCHW88"]  # the 12-channel one stays
    assert any(o.type_name == "RelayoutFormat" for o in seq)
    # the filters were converted once, at optimization (param_fuse): no relayout of a
    # parameter runs
    for o in seq:
        if o.type_name == "RelayoutFormat":
            assert o.inputs[0].owner.type_name not in ("SharedDeviceTensor",
                                                       "MultipleDeviceTensorHolder",
                                                       "ImmutableTensor")  # fmt: skip


def test_use_nchw88_fuses_the_residual_into_the_last_convolution():
    _, outs, feed = _residual_net()
    new = mgb.optimize_for_inference(
        outs[:1], use_nchw88=True, fuse_conv_bias_nonlinearity=True, fuse_conv_bias_with_z=True
    )
    np.testing.assert_allclose(_results(new, feed)[0], _results(outs[:1], feed)[0], rtol=1e-4,
                               atol=1e-5)  # fmt: skip
    _, seq = _oprs(new)
    types = [o.type_name for o in seq]
    assert "Elemwise" not in types  # bias, residual and ReLUs all inside the ConvBias ops
    last = [o for o in seq if o.type_name == "ConvBiasForward"][-1]
    assert len(last.inputs) == 4 and last.param.nonlineMode == "RELU"
    assert last.param.format == "NCHW88" and last.chosen_algorithm == "POINTWISE_NCHW88"


def test_use_nchw88_leaves_a_graph_without_convertible_convolutions():
    rng = np.random.default_rng(1)
    g = mgb.comp_graph(check_env_var=False)
    x = mgb.make_arg(CN, g, name="x", shape=(1, 3, 6, 6))
    y = mgb.opr.elem.relu(convolution(x, _shared(g, rng, (5, 3, 3, 3), "w")))
    new = mgb.optimize_for_inference([y], use_nchw88=True)
    _, seq = _oprs(new)
    assert not any(o.type_name == "RelayoutFormat" for o in seq)


@pytest.mark.parametrize("order", ["conv+b+z", "conv+z+b"])
def test_fuse_conv_bias_with_z_builds_the_four_input_conv_bias(order):
    rng = np.random.default_rng(2)
    g = mgb.comp_graph(check_env_var=False)
    x = mgb.make_arg(CN, g, name="x", shape=(2, 4, 6, 6))
    z = mgb.make_arg(CN, g, name="z", shape=(2, 8, 6, 6))
    c = convolution(x, _shared(g, rng, (8, 4, 3, 3), "w"), pad_h=1, pad_w=1)
    b = _shared(g, rng, (1, 8, 1, 1), "b")
    y = mgb.opr.elem.relu((c + b) + z if order == "conv+b+z" else (c + z) + b)
    feed = {"x": rng.standard_normal((2, 4, 6, 6)).astype(F32),
            "z": rng.standard_normal((2, 8, 6, 6)).astype(F32)}  # fmt: skip
    new = mgb.optimize_for_inference(
        [y], fuse_conv_bias_nonlinearity=True, fuse_conv_bias_with_z=True
    )
    np.testing.assert_allclose(_results(new, feed)[0], _results([y], feed)[0], rtol=1e-5,
                               atol=1e-5)  # fmt: skip
    _, seq = _oprs(new)
    (cb,) = [o for o in seq if o.type_name == "ConvBiasForward"]
    assert len(cb.inputs) == 4 and cb.param.nonlineMode == "RELU"
    assert not any(o.type_name == "Elemwise" for o in seq)


def _inverted_residual_net(seed=3, c=16, expand=3):
    """Two MobileNetV2 blocks (1x1 expansion, ReLU6, depthwise 3x3 at stride 1 or 5x5 at
    stride 2, ReLU6, 1x1 projection, the residual of the first) between an NCHW input and
    output."""
    rng = np.random.default_rng(seed)
    g = mgb.comp_graph(check_env_var=False)
    g.set_option("log_level", 0)
    x = mgb.make_arg(CN, g, name="x", shape=(1, c, 11, 12))
    relu = mgb.opr.elem.relu

    def relu6(v):
        return mgb.opr.elem.min(relu(v), 6.0)

    def pointwise(v, ic, oc, name):
        y = convolution(v, _shared(g, rng, (oc, ic, 1, 1), name))
        return y + _shared(g, rng, (1, oc, 1, 1), name + "_b")

    def depthwise(v, ch, k, stride, name):
        w = _shared(g, rng, (ch, 1, 1, k, k), name)
        y = convolution(v, w, pad_h=k // 2, pad_w=k // 2, stride_h=stride, stride_w=stride,
                        sparse="GROUP")  # fmt: skip
        return y + _shared(g, rng, (1, ch, 1, 1), name + "_b")

    mid = c * expand
    h = relu6(pointwise(x, c, mid, "e1"))
    h = relu6(depthwise(h, mid, 3, 1, "d1"))
    y = pointwise(h, mid, c, "p1") + x
    h = relu6(pointwise(y, c, mid, "e2"))
    h = relu6(depthwise(h, mid, 5, 2, "d2"))
    y = pointwise(h, mid, 2 * c, "p2")
    feed = {"x": rng.standard_normal((1, c, 11, 12)).astype(F32)}
    return [y], feed


@pytest.mark.parametrize("fuse", [False, True])
def test_use_nchw88_keeps_inverted_residual_blocks_blocked_through_the_depthwise_layers(fuse):
    outs, feed = _inverted_residual_net()
    want = _results(outs, feed)
    opts = dict(fuse_conv_bias_nonlinearity=fuse, fuse_conv_bias_with_z=fuse)
    new = mgb.optimize_for_inference(outs, use_nchw88=True, **opts)
    np.testing.assert_allclose(_results(new, feed)[0], want[0], rtol=1e-4, atol=1e-5)
    _, seq = _oprs(new)
    convs = [o for o in seq if o.type_name.startswith("Conv")]
    assert len(convs) == 6 and all(o.param.format == "NCHW88" for o in convs)
    depthwise = [o for o in convs if o.param.sparse == "GROUP"]
    assert [o.chosen_algorithm for o in depthwise] == ["CHANNELWISE_NCHW88"] * 2
    # the input converted once, the output read back once: nothing in between
    relayouts = [o.param.mode for o in seq if o.type_name == "RelayoutFormat"]
    assert relayouts == ["NCHW_NCHW88", "NCHW88_NCHW"]


def _se_net(mode="MEAN", squeeze=8, seed=4, extra_reader=False):
    """A depthwise layer, then squeeze-and-excitation (global ``mode`` pooling as ONNX's
    GlobalAveragePool imports: reshape, Reduce over axis 2, reshape; two 1x1 convolutions
    through ``squeeze`` channels; a sigmoid; the broadcast multiply), then a projection."""
    rng = np.random.default_rng(seed)
    g = mgb.comp_graph(check_env_var=False)
    g.set_option("log_level", 0)
    x = mgb.make_arg(CN, g, name="x", shape=(1, 16, 10, 9))
    relu = mgb.opr.elem.relu

    def pointwise(v, ic, oc, name):
        y = convolution(v, _shared(g, rng, (oc, ic, 1, 1), name))
        return y + _shared(g, rng, (1, oc, 1, 1), name + "_b")

    h = relu(pointwise(x, 16, 32, "e"))
    dw = _shared(g, rng, (32, 1, 1, 3, 3), "d")
    h = relu(convolution(h, dw, pad_h=1, pad_w=1, sparse="GROUP"))
    flat = mgb.opr.reshape(h, (1, 32, 90))
    pooled = mgb.opr.reshape(mgb.opr.reduce_general(flat, mode=mode, axis=2), (1, 32, 1, 1))
    s = mgb.opr.elem.sigmoid(pointwise(relu(pointwise(pooled, 32, squeeze, "s1")), squeeze, 32,
                                       "s2"))  # fmt: skip
    outs = [pointwise(h * s, 32, 16, "p")]
    if extra_reader:  # the flattened tensor read by something else too: stays NCHW
        outs.append(flat * 2.0)
    feed = {"x": rng.standard_normal((1, 16, 10, 9)).astype(F32)}
    return outs, feed


@pytest.mark.parametrize("mode", ["MEAN", "SUM", "MAX"])
@pytest.mark.parametrize("squeeze", [8, 4])  # the squeeze convolutions in NCHW88 or NCHW
def test_use_nchw88_keeps_squeeze_and_excitation_blocked(mode, squeeze):
    outs, feed = _se_net(mode, squeeze)
    want = _results(outs, feed)
    new = mgb.optimize_for_inference(outs, use_nchw88=True, fuse_conv_bias_nonlinearity=True)
    np.testing.assert_allclose(_results(new, feed)[0], want[0], rtol=1e-4, atol=1e-5)
    _, seq = _oprs(new)
    relayouts = [o.param.mode for o in seq if o.type_name == "RelayoutFormat"]
    assert relayouts == ["NCHW_NCHW88", "NCHW88_NCHW"]
    (red,) = [o for o in seq if o.type_name == "Reduce"]
    assert mgb.graph.static_shape(red.inputs[0]) == (1, 4, 90, 8)


def test_a_pooled_tensor_read_elsewhere_stays_nchw():
    outs, feed = _se_net(extra_reader=True)
    want = _results(outs, feed)
    new = mgb.optimize_for_inference(outs, use_nchw88=True)
    for a, b in zip(_results(new, feed), want):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    _, seq = _oprs(new)
    (red,) = [o for o in seq if o.type_name == "Reduce"]
    assert mgb.graph.static_shape(red.inputs[0]) == (1, 32, 90)


@pytest.mark.parametrize("axes", [(2, 3), (3, 2)])
def test_use_nchw88_reduces_over_h_and_w_blocked(axes):
    # torch's x.mean([2, 3]) head (MnasNet): two Reduces, then a flatten for the classifier
    rng = np.random.default_rng(5)
    g = mgb.comp_graph(check_env_var=False)
    x = mgb.make_arg(CN, g, name="x", shape=(2, 8, 5, 7))
    h = mgb.opr.elem.relu(convolution(x, _shared(g, rng, (16, 8, 3, 3), "w"), pad_h=1, pad_w=1))
    for axis in axes:
        h = mgb.opr.reduce_general(h, mode="MEAN", axis=axis)
    y = mgb.opr.reshape(h, (2, 16))
    feed = {"x": rng.standard_normal((2, 8, 5, 7)).astype(F32)}
    new = mgb.optimize_for_inference([y], use_nchw88=True)
    np.testing.assert_allclose(_results(new, feed)[0], _results([y], feed)[0], rtol=1e-4,
                               atol=1e-5)  # fmt: skip
    _, seq = _oprs(new)
    assert [o.param.mode for o in seq if o.type_name == "RelayoutFormat"] == ["NCHW_NCHW88"]
    assert all(len(mgb.graph.static_shape(o.inputs[0])) == 5 for o in seq
               if o.type_name == "Reduce")  # fmt: skip


def _concat_net(kind, seed=6):
    """A GoogLeNet inception block (1x1, 1x1 -> 3x3, 3x3/s1 max pool -> 1x1 branches,
    concatenated, then a 3x3/s2 max pool in ceil mode: its end padding a concatenation of
    ``-inf`` rows and columns, as the ONNX importer writes it) or a DenseNet block (each
    layer's BN-like scale and shift, ReLU, 1x1, ReLU, 3x3 concatenated to its input, then
    the transition's 2x2 average pool), between an NCHW input and output."""
    rng = np.random.default_rng(seed)
    g = mgb.comp_graph(check_env_var=False)
    g.set_option("log_level", 0)
    x = mgb.make_arg(CN, g, name="x", shape=(1, 8, 12, 12))
    relu = mgb.opr.elem.relu

    def conv(v, ic, oc, k, name):
        y = convolution(v, _shared(g, rng, (oc, ic, k, k), name), pad_h=k // 2, pad_w=k // 2)
        return relu(y + _shared(g, rng, (1, oc, 1, 1), name + "_b"))

    h = conv(x, 8, 16, 3, "stem")
    if kind == "inception":
        pooled = mgb.opr.pooling(h, window_h=3, window_w=3, stride_h=1, stride_w=1, pad_h=1,
                                 pad_w=1)  # fmt: skip
        y = mgb.opr.concat([conv(h, 16, 8, 1, "b1"), conv(conv(h, 16, 8, 1, "b2"), 8, 16, 3, "b3"),
                            conv(pooled, 16, 8, 1, "b4")], axis=1)  # fmt: skip
        c = 32
        inf = np.full((1, c, 1, 12), -np.inf, F32)
        y = mgb.opr.concat([y, mgb.make_immutable(CN, g, inf)], axis=2)
        inf = np.full((1, c, 13, 1), -np.inf, F32)
        y = mgb.opr.concat([y, mgb.make_immutable(CN, g, inf)], axis=3)
        y = mgb.opr.pooling(y, window_h=3, window_w=3, stride_h=2, stride_w=2)
    else:
        y, c = h, 16
        for i in range(2):
            scale, shift = (_shared(g, rng, (1, c, 1, 1), f"bn{i}{k}") for k in "ab")
            new = conv(conv(relu(y * scale + shift), c, 16, 1, f"l{i}a"), 16, 8, 3, f"l{i}b")
            y, c = mgb.opr.concat([y, new], axis=1), c + 8
        y = mgb.opr.pooling(y, mode="AVERAGE", window_h=2, window_w=2)
    feed = {"x": rng.standard_normal((1, 8, 12, 12)).astype(F32)}
    return [y], feed


@pytest.mark.parametrize("kind", ["inception", "dense"])
@pytest.mark.parametrize("fuse", [False, True])
def test_use_nchw88_keeps_pooling_and_concatenations_blocked(kind, fuse):
    outs, feed = _concat_net(kind)
    want = _results(outs, feed)
    opts = dict(fuse_conv_bias_nonlinearity=fuse, fuse_conv_bias_with_z=fuse)
    new = mgb.optimize_for_inference(outs, use_nchw88=True, **opts)
    np.testing.assert_allclose(_results(new, feed)[0], want[0], rtol=1e-5, atol=1e-6)
    _, seq = _oprs(new)
    assert all(o.param.format == "NCHW88" for o in seq if o.type_name.startswith(("Conv", "Pool")))
    assert all(len(mgb.graph.static_shape(o.outputs[0])) == 5 for o in seq
               if o.type_name == "Concat")  # fmt: skip
    # the input converted once, the output read back once: nothing in between
    relayouts = [o.param.mode for o in seq if o.type_name == "RelayoutFormat"]
    assert relayouts == ["NCHW_NCHW88", "NCHW88_NCHW"]


@pytest.mark.parametrize("ic, oc, k", [(3, 16, 3), (3, 24, 7), (1, 8, 3)])
@pytest.mark.parametrize("fuse", [False, True])
def test_use_nchw88_converts_the_hybrid_first_layer(ic, oc, k, fuse):
    # a network's stem (an NCHW source of fewer than 8 channels, strided) and the max
    # pooling after it: both NCHW88, the input read as it is, no relayout but the output's
    rng = np.random.default_rng(7)
    g = mgb.comp_graph(check_env_var=False)
    g.set_option("log_level", 0)
    x = mgb.make_arg(CN, g, name="x", shape=(2, ic, 19, 17))
    w = _shared(g, rng, (oc, ic, k, k), "stem")
    h = convolution(x, w, stride_h=2, stride_w=2, pad_h=k // 2, pad_w=k // 2)
    h = mgb.opr.elem.relu(h + _shared(g, rng, (1, oc, 1, 1), "stem_b"))
    y = mgb.opr.pooling(h, window_h=3, window_w=3, stride_h=2, stride_w=2, pad_h=1, pad_w=1)
    y = convolution(y, _shared(g, rng, (16, oc, 1, 1), "next"))
    feed = {"x": rng.standard_normal((2, ic, 19, 17)).astype(F32)}
    want = _results([y], feed)
    opts = dict(fuse_conv_bias_nonlinearity=fuse, fuse_conv_bias_with_z=fuse)
    new = mgb.optimize_for_inference([y], use_nchw88=True, **opts)
    np.testing.assert_allclose(_results(new, feed)[0], want[0], rtol=1e-4, atol=1e-5)
    _, seq = _oprs(new)
    convs = [o for o in seq if o.type_name.startswith("Conv")]
    assert all(o.param.format == "NCHW88" for o in seq if o.type_name.startswith(("Conv", "Pool")))
    assert convs[0].chosen_algorithm == "DIRECT_NCHW_NCHW88"
    assert len(mgb.graph.static_shape(convs[0].inputs[0])) == 4  # the NCHW input itself
    assert [o.param.mode for o in seq if o.type_name == "RelayoutFormat"] == ["NCHW88_NCHW"]
    # the filter converted at optimization (param_fuse): no operator of it runs
    assert not any(o.type_name in ("Dimshuffle", "Reshape") for o in seq)


def test_an_nchw88_pooling_has_no_gradient():
    g = mgb.comp_graph(check_env_var=False)
    x = mgb.make_arg(CN, g, name="x", shape=(1, 2, 6, 6, 8))
    y = mgb.opr.pooling(x, format="NCHW88")
    assert mgb.graph.static_shape(y.node) == (1, 2, 3, 3, 8)
    gx = mgb.grad(mgb.opr.reduce_general(y, mode="SUM"), x)  # compiling it fails
    with pytest.raises(mgb.MegBrainError, match="NCHW88 format has no gradient"):
        g.compile(None, [mgb.copy_output(gx)])
