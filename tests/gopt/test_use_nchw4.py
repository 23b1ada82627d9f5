"""optimize_for_inference's use_nchw4 (int8 activations in the channel-blocked NCHW4 layout
between the quantized convolutions): small int8 networks (a first layer of 3 channels,
residual blocks, grouped and depthwise layers, pooling, the classifier's dequantize) give
the unconverted graph's outputs bit for bit, the convolutions converted that should be and
the others read back."""

from __future__ import annotations

import numpy as np
import pytest
from test_nchw88 import _oprs

import megbrain as mgb

CN = "cpu0"
qint8, qint32 = mgb.dtype.qint8, mgb.dtype.qint32


def _results(outs, x):
    f, _ = _oprs(outs)
    return [np.asarray(a).view(np.dtype(a.dtype.str)) for a in f(x=x)]


class _Net:
    """Int8 layers over one graph, random weights; each output of scale ``s``."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.g = mgb.comp_graph(check_env_var=False)
        self.g.set_option("log_level", 0)

    def conv(self, x, oc, k, *, stride=1, group=1, act="RELU", scale=0.05):
        ic = x.imm_shape[1]
        sx, sw = mgb.dtype.get_scale(x.dtype), 0.01
        shape = (oc, ic // group, k, k) if group == 1 else (group, oc // group, ic // group, k, k)
        w = self.rng.integers(-127, 128, shape).astype(np.int8).view(qint8(sw))
        sb = float(np.float32(sx) * np.float32(sw))
        b = self.rng.integers(-2000, 2000, (1, oc, 1, 1)).astype(np.int32).view(qint32(sb))
        return mgb.opr.conv_bias_activation(
            x, mgb.make_immutable(CN, self.g, w), mgb.make_immutable(CN, self.g, b),
            nonlineMode=act, dtype=qint8(scale), stride_h=stride, stride_w=stride,
            pad_h=k // 2, pad_w=k // 2, sparse="GROUP" if group > 1 else "DENSE",
        )  # fmt: skip

    def add(self, a, b, relu=True, scale=0.06):
        return mgb.opr.elemwise_multi_type(a, b, mode="QFUSE_ADD_RELU" if relu else "QADD",
                                           dtype=qint8(scale))  # fmt: skip


def _pool(x, mode, window, stride, pad):
    return mgb.opr.pooling(x, mode=mode, window_h=window, window_w=window, stride_h=stride,
                           stride_w=stride, pad_h=pad, pad_w=pad)  # fmt: skip


def _resnet_like(seed=0, depthwise=False, group=1):
    """Quantize, a 3-channel 7x7/2 first layer, max pooling, a residual block (one of its
    convolutions grouped or followed by a depthwise one), a strided block with a 1x1
    shortcut, global average pooling, the classifier's dequantize: the outputs are the
    logits (float) and an int8 activation in NCHW."""
    n = _Net(seed)
    x = mgb.make_arg(CN, n.g, name="x", shape=(1, 3, 30, 26))
    q = mgb.opr.typecvt(x, qint8(0.02))
    h = _pool(n.conv(q, 16, 7, stride=2), "MAX", 3, 2, 1)
    a = n.conv(h, 16, 3, group=group)
    if depthwise:
        a = n.conv(a, 16, 3, group=16)
    a = n.conv(a, 16, 3, act="IDENTITY")
    h = n.add(a, h)
    b = n.conv(n.conv(h, 32, 3, stride=2), 32, 3, act="IDENTITY")
    h2 = n.add(b, n.conv(h, 32, 1, stride=2, act="IDENTITY"), relu=False)
    pooled = _pool(h2, "AVERAGE", h2.imm_shape[2], 1, 0)
    w = n.rng.integers(-127, 128, (32, 10)).astype(np.int8).view(qint8(0.01))
    logits = mgb.opr.matrix_mul(pooled.reshape(1, 32), mgb.make_immutable(CN, n.g, w))
    logits = mgb.opr.typecvt(logits, np.float32)
    feed = n.rng.standard_normal((1, 3, 30, 26)).astype(np.float32)
    return [logits, h2], feed


@pytest.mark.parametrize("depthwise, group", [(False, 1), (True, 1), (False, 2)])
@pytest.mark.parametrize("fuse", [False, True])
def test_use_nchw4_computes_the_same(depthwise, group, fuse):
    outs, x = _resnet_like(depthwise=depthwise, group=group)
    want = _results(outs, x)
    opts = dict(fuse_conv_bias_nonlinearity=fuse, fuse_conv_bias_with_z=fuse)
    new = mgb.optimize_for_inference(outs, use_nchw4=True, **opts)
    assert [v.dtype for v in new] == [v.dtype for v in outs]
    got = _results(new, x)
    for a, b in zip(want, got):
        assert a.shape == b.shape
        np.testing.assert_array_equal(b, a)
    _, seq = _oprs(new)
    convs = [o for o in seq if o.type_name == "ConvBiasForward"]
    formats = [o.param.format for o in convs]
    assert formats.count("NCHW") == int(depthwise)  # the depthwise one stays NCHW
    assert formats.count("NCHW4") == len(formats) - int(depthwise)
    pools = [o for o in seq if o.type_name == "PoolingForward"]
    assert [o.param.format for o in pools] == ["NCHW4", "NCHW4"]
    relayouts = [o for o in seq if o.type_name == "RelayoutFormat"]
    # the input's, the output h2's (and around the depthwise layer): no filter's at run time
    assert len(relayouts) == 2 + 2 * int(depthwise)
    for o in relayouts:
        assert o.inputs[0].owner.type_name not in ("MultipleDeviceTensorHolder",
                                                   "ImmutableTensor")  # fmt: skip


def test_use_nchw4_leaves_a_float_graph():
    g = mgb.comp_graph(check_env_var=False)
    x = mgb.make_arg(CN, g, name="x", shape=(1, 8, 6, 6))
    w = mgb.make_immutable(CN, g, np.ones((8, 8, 3, 3), np.float32))
    y = mgb.opr.elem.relu(mgb.opr.convolution(x, w))
    (new,) = mgb.optimize_for_inference([y], use_nchw4=True)
    _, seq = _oprs([new])
    assert not any(o.type_name == "RelayoutFormat" for o in seq)


@pytest.mark.parametrize("vnni", [False, True])
def test_layout_flag_chooses_nchw4_where_every_int8_convolution_converts(vnni, monkeypatch):
    from megbrain.gopt.nchw4 import layout_flag
    from megbrain.kernels.conv import quantized

    monkeypatch.setattr(quantized, "VNNI", vnni)
    dense, _ = _resnet_like()
    depthwise, _ = _resnet_like(depthwise=True)
    assert layout_flag(dense) == ("use_nchw4" if vnni else "use_nchw88")
    assert layout_flag(depthwise) == "use_nchw88"  # its depthwise layer would stay NCHW
    g = mgb.comp_graph(check_env_var=False)
    x = mgb.make_arg(CN, g, name="x", shape=(1, 8, 6, 6))
    w = mgb.make_immutable(CN, g, np.ones((8, 8, 3, 3), np.float32))
    assert layout_flag(mgb.opr.convolution(x, w)) == "use_nchw88"  # a float graph


def test_an_nchw4_graph_round_trips_through_serialization(tmp_path):
    # the NCHW4 ConvBias and Pooling params, RelayoutFormat's NCHW4 modes
    outs, x = _resnet_like()
    new = mgb.optimize_for_inference(outs, use_nchw4=True, fuse_conv_bias_nonlinearity=True)
    want = _results(new, x)
    path = str(tmp_path / "nchw4.mge")
    mgb.serialize_comp_graph_to_file(path, new)
    _, _, loaded = mgb.load_comp_graph_from_file(path)
    (inp,) = mgb.cgtools.get_dep_vars(loaded, "Host2DeviceCopy")
    f = loaded[0].owner_graph.compile([inp], [mgb.copy_output(v) for v in loaded])
    got = [np.asarray(a).view(np.dtype(a.dtype.str)) for a in f(x)]
    for a, b in zip(want, got):
        np.testing.assert_array_equal(b, a)
