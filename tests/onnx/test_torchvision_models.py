"""torchvision's vit_b_16 and swin_t (random weights, exported at opset 17) load with
``megbrain.onnx.load`` and match onnxruntime (models built and exported by
benchmarks/torchvision_models.py, which onnx_zoo.py uses too).

Slow (each export takes seconds, each model runs a 224x224 image); skipped without torch,
torchvision or onnxruntime, which are benchmark peers here, never dependencies.  Both models
hold 0-d values (a Gather with a scalar index at vit_b_16's head, Unsqueezed scalars
concatenated into swin_t's attention-mask shapes).
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import megbrain as mgb  # noqa: E402
from megbrain.onnx import load  # noqa: E402

pytestmark = pytest.mark.slow


def _zoo():
    """benchmarks/torchvision_models.py (torchvision imported by it), or a skip."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.path.join(root, "benchmarks", "torchvision_models.py")
    spec = importlib.util.spec_from_file_location("torchvision_models", path)
    zoo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(zoo)
    try:
        return zoo, zoo.import_torchvision()
    except ImportError as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize("name", ["vit_b_16", "swin_t"])
def test_torchvision_transformer_matches_onnxruntime(name):
    zoo, tv = _zoo()
    model = zoo.build(tv, name)  # vit_b_16's head, zero at init, gets random values
    x = torch.randn(1, 3, 224, 224)
    proto = zoo.export(model, x)
    res = load(proto)
    func = res.graph.compile(list(res.inputs.values()), [mgb.copy_output(res.outputs["y"])])
    got = np.asarray(func(x.numpy())[0])
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = sess.run(None, {"x": x.numpy()})
    assert got.shape == want.shape == (1, 1000)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
