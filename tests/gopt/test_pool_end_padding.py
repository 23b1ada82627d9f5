"""The compile-time fusion of ceil mode's end padding into the NCHW88 max pooling
(``fuse_pool_end_padding``, PoolingEndPad): an ONNX MaxPool with ``ceil_mode`` computes what
onnxruntime does without the padding's Concats, the fusion happens only where the padded
var has no other reader, and graph files never see the fused operator."""

from __future__ import annotations

import numpy as np
import pytest

import megbrain as mgb
from megbrain.errors import SerializationError
from megbrain.opr.dnn import convolution

CN = "cpu0"
F32 = np.float32


def _onnx_model(c, h, k, s, p):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = [numpy_helper.from_array(rng.standard_normal((c, c, 1, 1)).astype(F32), n)
         for n in ("w", "w2")]  # fmt: skip
    g = helper.make_graph([
        helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[1, 1]),
        helper.make_node("MaxPool", ["y"], ["z"], kernel_shape=[k, k], strides=[s, s],
                         pads=[p] * 4, ceil_mode=1),
        helper.make_node("Conv", ["z", "w2"], ["r"], kernel_shape=[1, 1]),
    ], "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, h])],
        [helper.make_tensor_value_info("r", TensorProto.FLOAT, None)], w)  # fmt: skip
    return onnx, helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("c, h, k, s, p", [(16, 14, 3, 2, 0), (16, 13, 2, 2, 0),
                                           (8, 10, 3, 2, 1), (24, 11, 3, 3, 0)])  # fmt: skip
def test_ceil_mode_max_pooling_equals_onnxruntime_without_the_concats(c, h, k, s, p):
    ort = pytest.importorskip("onnxruntime")
    import megbrain.onnx as mo

    _, model = _onnx_model(c, h, k, s, p)
    f = mo.load_inference(model.SerializeToString())
    x = np.random.default_rng(1).standard_normal((1, c, h, h)).astype(F32)
    (got,) = f(x=x)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got, sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)
    types = [o.type_name for o in f.function._func.iter_opr_seq()]
    assert "PoolingEndPad" in types and "Concat" not in types


def _net(shared: bool):
    """x -> convolution (NCHW88 after the pass) -> padded at the end of H and W with -inf ->
    MAX pooling 3x3/s2; with ``shared`` the padded var is an output too."""
    rng = np.random.default_rng(2)
    g = mgb.comp_graph(check_env_var=False)
    g.set_option("log_level", 0)
    x = mgb.make_arg(CN, g, name="x", shape=(1, 16, 12, 12))
    w = mgb.make_shared(CN, value=rng.standard_normal((16, 16, 1, 1)).astype(F32), comp_graph=g)
    y = convolution(x, w)
    low = mgb.make_immutable(CN, g, np.full((1, 16, 1, 12), -np.inf, F32))
    yh = mgb.opr.concat(y, low, axis=2)
    low_w = mgb.make_immutable(CN, g, np.full((1, 16, 13, 1), -np.inf, F32))
    yp = mgb.opr.concat(yh, low_w, axis=3)
    z = mgb.opr.pooling(yp, mode="MAX", window_h=3, window_w=3, stride_h=2, stride_w=2)
    outs = mgb.optimize_for_inference([z, yp] if shared else [z], use_nchw88=True)
    xv = rng.standard_normal((1, 16, 12, 12)).astype(F32)
    return g, outs, xv


def _compiled(g, outs):
    f = g.compile(None, [mgb.copy_output(v) for v in outs])
    return f, [o.type_name for o in f._func.iter_opr_seq()]


def test_a_padded_var_read_elsewhere_keeps_its_concats():
    g, outs, xv = _net(True)
    f0, types = _compiled(g, outs)
    assert "PoolingEndPad" not in types and types.count("Concat") == 2
    z, yp = f0(x=xv)
    g1, outs1, _ = _net(False)
    f1, types1 = _compiled(g1, outs1)
    assert "PoolingEndPad" in types1 and "Concat" not in types1
    np.testing.assert_array_equal(f1(x=xv)[0], z)
    assert np.isneginf(yp[:, :, -1]).all() and np.isneginf(yp[:, :, :, -1]).all()


def dumped_refits_and_fused_is_refused(tmp_path, outs, fused: str, unfused: str):
    """Dump ``outs`` (an optimized graph) and load it back: the file holds ``unfused``
    operators and no ``fused`` one, compiling fuses them again, and dumping the fused
    operator's output is refused. Returns the compiled function of the loaded graph."""
    path = str(tmp_path / "g.mgb")
    mgb.serialize_comp_graph_to_file(path, outs)
    _, _, loaded = mgb.load_comp_graph_from_file(path)
    types = {o.type for o in mgb.cgtools.get_oprs_seq(loaded)}
    assert fused not in types and unfused in types
    f, seq = _compiled(loaded[0].owner_graph, loaded)
    assert fused in seq  # fused again when compiled
    opr = next(o for o in f._func.iter_opr_seq() if o.type_name == fused)
    with pytest.raises(SerializationError, match=fused + r".*before compile-time fusion"):
        mgb.serialize_comp_graph_to_file(str(tmp_path / "f.mgb"), [mgb.SymbolVar(opr.outputs[0])])
    return f


def test_the_optimized_graph_dumps_the_concats_and_a_fused_pooling_is_refused(tmp_path):
    g, outs, xv = _net(False)
    dumped_refits_and_fused_is_refused(tmp_path, outs, "PoolingEndPad", "Concat")
