"""megbrain.nn.quantization: fake quantization against TypeCvt (values and the
straight-through gradient), observers, QAT training, and the int8 network from quantize():
its logits against the QAT network's, int8 throughout between its stubs, dumped, reloaded and
run by ``python -m megbrain run``; the errors that name the module."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import megbrain as mgb
from megbrain import nn, optim
from megbrain.nn import quantization as Q

qint8 = mgb.dtype.qint8


def run(build, *arrays):
    """``build(*vars)`` on ``arrays`` in a fresh graph; its outputs (a var or a list)."""
    g = mgb.comp_graph()
    vs = [mgb.make_arg("cpu0", g, shape=a.shape, dtype=a.dtype, name=f"x{i}")
          for i, a in enumerate(arrays)]  # fmt: skip
    out = build(*vs)
    outs = out if isinstance(out, list) else [out]
    res = g.compile(vs, [mgb.copy_output(v) for v in outs] + nn.pending_updates(g))(*arrays)
    return res if isinstance(out, list) else res[0]


# ---- fake quantization and observers --------------------------------------------------------
def test_fake_quant_equals_the_dequantized_typecvt():
    rng = np.random.default_rng(0)
    scale = np.float32(0.037)
    # ties (k + 0.5) * scale, saturating values and NaN-free randoms
    x = np.concatenate([rng.uniform(-6, 6, 500), (np.arange(-20, 20) + 0.5) * scale,
                        [1e3, -1e3]]).astype(np.float32)  # fmt: skip
    got = run(lambda v: Q.fake_quant(v, float(scale)), x)
    dt = qint8(float(scale))
    want = run(lambda v: mgb.opr.typecvt(mgb.opr.typecvt(v, dt), np.float32), x)
    np.testing.assert_array_equal(got, want)
    q = Q.quantize_value(x, dt)
    np.testing.assert_array_equal(q.view(np.int8).astype(np.float32) * scale, want)
    assert (q.view(np.int8)[[-2, -1]] == [127, -128]).all()


def test_fake_quant_gradient_is_straight_through_inside_the_range():
    x = np.array([0.01, -0.26, 0.5, 1.27, 1.3, -1.29, -2.0], np.float32)

    def build(v):
        y = Q.fake_quant(v, 0.01, -127, 127)
        return [mgb.grad((y * y).sum(), v)]

    (gx,) = run(build, x)
    y = run(lambda v: Q.fake_quant(v, 0.01, -127, 127), x)
    inside = np.abs(x / np.float32(0.01)) <= 127
    np.testing.assert_allclose(gx, np.where(inside, 2 * y, 0), rtol=1e-6)


def test_observers_track_the_range_and_give_its_scale():
    mm, ema = Q.MinMaxObserver(), Q.ExponentialMovingAverageObserver(momentum=0.5)
    assert not mm.calibrated()
    for x in (np.array([-1.0, 2.0], np.float32), np.array([-3.0, 1.0], np.float32)):
        scales = run(lambda v: [mm(v), ema(v)], x)
    assert (mm.min_val.get_value(), mm.max_val.get_value()) == (-3.0, 2.0)
    assert (ema.min_val.get_value(), ema.max_val.get_value()) == (-2.0, 1.5)
    assert mm.get_scale() == np.float32(3.0) / np.float32(127.5) == scales[0].item()
    assert ema.get_scale() == scales[1].item()
    assert mm.get_dtype() == qint8(mm.get_scale())
    mm.eval()
    run(lambda v: [mm(v), v * 2], np.array([-9.0], np.float32))
    assert mm.min_val.get_value() == -3.0  # eval mode reads the range, never updates it
    narrow = Q.MinMaxObserver(narrow_range=True)
    run(lambda v: narrow(v), np.array([0.5, 2.54], np.float32))
    assert narrow.get_scale() == np.float32(2.54) / np.float32(127)


# ---- a small network through QAT, quantize, dump and run ------------------------------------
class Net(nn.Module):
    """Conv-BN-ReLU, a grouped Conv-BN and a 1x1 conv added (FUSE_ADD_RELU), pooling and a
    Linear, between the stubs."""

    def __init__(self):
        super().__init__()
        self.quant = nn.QuantStub()
        self.c1 = nn.ConvBnRelu2d(1, 8, 3, padding=1)
        self.c2 = nn.ConvBn2d(8, 8, 3, padding=1, groups=2)
        self.skip = nn.Conv2d(8, 8, 1)
        self.add = nn.Elemwise("FUSE_ADD_RELU")
        self.pool = nn.MaxPool2d(2)
        self.flat = nn.Flatten()
        self.fc = nn.Linear(8 * 4 * 4, 4)
        self.dequant = nn.DequantStub()

    def forward(self, x):
        x = self.c1(self.quant(x))
        x = self.add(self.c2(x), self.skip(x))
        return self.dequant(self.fc(self.flat(self.pool(x))))


def blobs(rng, n):
    """8x8 images with a bright quadrant; the label is the quadrant."""
    labels = rng.integers(0, 4, n)
    x = rng.standard_normal((n, 1, 8, 8)).astype(np.float32) * 0.3
    for i, lab in enumerate(labels):
        r, c = divmod(int(lab), 2)
        x[i, 0, r * 4 : r * 4 + 4, c * 4 : c * 4 + 4] += 1.0
    return x, labels.astype(np.int32)


def logits(module, x):
    return run(lambda v: module(v), x)


@pytest.fixture(scope="module")
def trained():
    """A QAT network trained for 20 steps, its losses and its eval logits on 64 inputs."""
    nn.init.default_rng(0)
    rng = np.random.default_rng(0)
    net = Q.quantize_qat(Net())
    g = mgb.comp_graph()
    x = mgb.make_arg("cpu0", g, shape=(32, 1, 8, 8), name="x")
    y = mgb.make_arg("cpu0", g, shape=(32,), dtype=np.int32, name="y")
    loss = nn.functional.cross_entropy(net(x), y)
    opt = optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    step = g.compile([x, y], [mgb.copy_output(loss)] + opt.minimize(loss) + nn.pending_updates(g))
    losses = [step(*blobs(rng, 32))[0].item() for _ in range(20)]
    net.eval()
    inputs = rng.standard_normal((64, 1, 8, 8)).astype(np.float32)
    return net, losses, inputs, logits(net, inputs)


def test_quantize_qat_swaps_the_units_and_shares_the_parameters():
    nn.init.default_rng(0)
    net = Net()
    w = net.c2.conv.weight
    names = [n for n, _ in net.named_parameters()]
    q = Q.quantize_qat(net)
    assert q is net and q.c2.conv.weight is w
    assert type(q.c1) is Q.qat.ConvBnRelu2d and type(q.skip) is Q.qat.Conv2d
    assert type(q.fc) is Q.qat.Linear and type(q.pool) is nn.MaxPool2d
    assert [n for n, _ in q.named_parameters()] == names
    assert "c1.act_observer.min_val" in q.state_dict()
    assert Q.quantize_qat(q).c1 is q.c1  # QAT modules are not converted again


def test_qat_trains(trained):
    _, losses, _, _ = trained
    assert np.mean(losses[-4:]) < 0.5 * np.mean(losses[:4])


@pytest.fixture(scope="module")
def int8_net(trained):
    net = trained[0]
    return Q.quantize(net)


def test_int8_logits_agree_with_the_qat_logits(trained, int8_net):
    _, _, inputs, want = trained
    got = logits(int8_net, inputs)
    assert got.dtype == np.float32
    assert np.mean(got.argmax(1) == want.argmax(1)) >= 0.95
    # within a few steps of the output scale (the QuantizedS32 biases round)
    step = mgb.dtype.get_scale(int8_net.fc.output_dtype)
    np.testing.assert_allclose(got, want, atol=3 * step)


def _int8_graph(net, n=4):
    g = mgb.comp_graph()
    x = mgb.make_arg("cpu0", g, shape=(n, 1, 8, 8), name="x")
    return x, net(x)


def test_int8_graph_is_int8_between_its_stubs(int8_net):
    x, y = _int8_graph(int8_net)
    oprs = mgb.cgtools.get_oprs_seq([y])
    assert [o.type for o in oprs].count("ConvBiasForward") == 3
    assert {o.type for o in oprs} <= {
        "Host2DeviceCopy", "TypeCvt", "SharedDeviceTensor", "ImmutableTensor",
        "ConvBiasForward", "ElemwiseMultiType", "PoolingForward", "Reshape", "MatrixMul",
        "Elemwise",
    }  # fmt: skip
    stubs = [o for o in oprs if o.type == "TypeCvt"]
    assert [o.outputs[0].dtype for o in (stubs[0], stubs[-1])] == [int8_net.quant.output_dtype,
                                                                   np.float32]  # fmt: skip
    for o in oprs:
        if o is stubs[0] or o is stubs[-1] or o.type == "Host2DeviceCopy":
            continue
        for v in list(o.inputs) + list(o.outputs):  # quantized, or a Reshape's int32 shape
            assert v.dtype.kind != "f", (o.type, v.name, v.dtype)
        assert all(mgb.dtype.is_quantize(v.dtype) for v in o.outputs), o.type


def test_int8_graph_dumps_reloads_and_runs(int8_net, tmp_path):
    x, y = _int8_graph(int8_net)
    xs = np.random.default_rng(1).standard_normal((4, 1, 8, 8)).astype(np.float32)
    f = x.owner_graph.compile([x], [mgb.copy_output(y)])
    ref = f(xs)[0]
    path = tmp_path / "int8.mge"
    mgb.serialize_comp_graph_to_file(str(path), {"logits": y}, keep_param_name=True)
    loaded = mgb.load_comp_graph_from_file(str(path))
    (y2,) = loaded.output_vars_list
    (x2,) = mgb.cgtools.get_dep_vars(y2, "Host2DeviceCopy")
    types = [o.type for o in mgb.cgtools.get_oprs_seq([y2])]
    assert types.count("ConvBiasForward") == 3
    np.testing.assert_array_equal(loaded.graph.compile([x2], [mgb.copy_output(y2)])(xs)[0], ref)
    np.save(tmp_path / "x.npy", xs)
    proc = subprocess.run(
        [sys.executable, "-m", "megbrain", "run", str(path), "--input", f"x={tmp_path / 'x.npy'}",
         "--iters", "2", "--no-progress", "--output", str(tmp_path / "out.npz")],
        capture_output=True, text=True, timeout=300,
        env=dict(os.environ, PYTHONWARNINGS="ignore"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "out.npz")["logits"], ref)


def test_int8_modules_hold_int8_weights(int8_net):
    assert type(int8_net.c2) is Q.quantized.Conv2d and int8_net.c2.groups == 2
    state = int8_net.state_dict()
    assert mgb.dtype.dtype_name(state["c1.weight"].dtype) == "QuantizedS8"
    assert mgb.dtype.dtype_name(state["fc.weight"].dtype) == "QuantizedS8"
    assert int8_net.c1.nonlinearity == "RELU" and int8_net.c2.nonlinearity == "IDENTITY"


def test_conv_relu_becomes_one_conv_bias_with_relu():
    nn.init.default_rng(4)
    net = Q.quantize_qat(nn.Sequential(nn.QuantStub(), nn.ConvRelu2d(2, 3, 3), nn.DequantStub()))
    x = np.random.default_rng(5).standard_normal((2, 2, 5, 5)).astype(np.float32)
    logits(net, x)
    want = logits(net.eval(), x)
    q = Q.quantize(net)
    assert type(q[1]) is Q.quantized.Conv2d and q[1].nonlinearity == "RELU"
    got = logits(q, x)
    assert got.min() == 0
    np.testing.assert_allclose(got, want, atol=mgb.dtype.get_scale(q[1].output_dtype) + 1e-6)


def test_sequential_runs_fuse_into_units():
    nn.init.default_rng(6)
    net = nn.Sequential(
        nn.QuantStub(), nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 1),
        nn.BatchNorm2d(4), nn.Conv2d(4, 4, 1), nn.ReLU(), nn.MaxPool2d(2), nn.DequantStub(),
    )  # fmt: skip
    x = np.random.default_rng(7).standard_normal((2, 1, 6, 6)).astype(np.float32)
    float_out = logits(net.eval(), x)
    Q.fuse_sequential(net)
    assert [type(m).__name__ for m in net._modules.values()] == [
        "QuantStub", "ConvBnRelu2d", "Fused", "Fused", "ConvBn2d", "Fused", "ConvRelu2d",
        "Fused", "MaxPool2d", "DequantStub",
    ]  # fmt: skip
    np.testing.assert_allclose(logits(net, x), float_out, rtol=1e-6)
    net = Q.quantize_qat(net.train())
    assert type(net[1]) is Q.qat.ConvBnRelu2d and type(net[6]) is Q.qat.ConvRelu2d
    logits(net, x)
    want = logits(net.eval(), x)
    got = logits(Q.quantize(net), x)
    assert [type(m).__name__ for m in net._modules.values()][4:7] == ["Conv2d", "Fused", "Conv2d"]
    np.testing.assert_allclose(got, want, atol=2 * mgb.dtype.get_scale(net[6].output_dtype))


def test_qat_state_with_its_ranges_saves_and_loads(tmp_path):
    nn.init.default_rng(8)
    a = Q.quantize_qat(Net())
    x = blobs(np.random.default_rng(9), 8)[0]
    logits(a, x)
    nn.save_weights(a.eval(), tmp_path / "qat.npz")
    b = Q.quantize_qat(Net()).eval()
    nn.load_weights(b, tmp_path / "qat.npz")
    np.testing.assert_array_equal(logits(b, x), logits(a, x))
    np.testing.assert_array_equal(logits(Q.quantize(b), x), logits(Q.quantize(a), x))


# ---- calibration and errors -------------------------------------------------------------------
def test_calibration_observes_a_float_forward():
    nn.init.default_rng(1)
    net = Net()
    x = np.random.default_rng(2).standard_normal((8, 1, 8, 8)).astype(np.float32)
    float_out = logits(net.eval(), x)
    net = Q.quantize_qat(net, Q.calibration_qconfig)
    # no fake quantization: the float network, BatchNorm folded into the convolutions
    np.testing.assert_allclose(logits(net, x), float_out, rtol=1e-5, atol=1e-6)
    logits(net.train(), x)  # the observers take the ranges in (and BatchNorm its statistics)
    want = logits(net.eval(), x)
    q = Q.quantize(net)
    assert np.mean(logits(q, x).argmax(1) == want.argmax(1)) >= 0.75


def test_quantize_of_a_module_never_calibrated_names_it():
    net = Q.quantize_qat(Net())
    with pytest.raises(mgb.MegBrainError, match=r"QuantStub module 'quant': the output's "
                                                 r"ExponentialMovingAverageObserver has seen no "
                                                 r"value: run the network in training mode"):
        Q.quantize(net)


def test_int8_module_fed_a_float_var_names_itself_and_the_dtype(int8_net):
    g = mgb.comp_graph()
    x = mgb.make_arg("cpu0", g, shape=(1, 1, 8, 8), name="img")
    with pytest.raises(mgb.MegBrainError, match=r"quantized Conv2d 'c1': the input 'img' must "
                                                 r"be QuantizedS8.*got float32"):  # fmt: skip
        int8_net.c1(x)


def test_switches_freeze_observers_and_fake_quantization():
    nn.init.default_rng(3)
    net = Q.quantize_qat(nn.Sequential(nn.QuantStub(), nn.Linear(4, 3), nn.DequantStub()))
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    Q.disable_fake_quant(net)
    float_net_out = logits(net, x)
    assert net[0].act_observer.calibrated()
    Q.disable_observer(net)
    lo = net[0].act_observer.min_val.get_value()
    logits(net, x * 3)
    assert net[0].act_observer.min_val.get_value() == lo
    Q.enable_fake_quant(net)
    Q.enable_observer(net)
    assert not np.array_equal(logits(net, x), float_net_out)
