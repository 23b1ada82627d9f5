"""torchvision's vit_b_16 and swin_t (random weights, exported at opset 17) load with
``megbrain.onnx.load`` and match onnxruntime.

Slow (each export takes seconds, each model runs a 224x224 image); skipped without torch,
torchvision or onnxruntime, which are benchmark peers here, never dependencies.  Both models
hold 0-d values (a Gather with a scalar index at vit_b_16's head, Unsqueezed scalars
concatenated into swin_t's attention-mask shapes).
"""

from __future__ import annotations

import io
import re
import sys
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import megbrain as mgb  # noqa: E402
from megbrain.onnx import load  # noqa: E402

pytestmark = pytest.mark.slow


def _torchvision():
    """torchvision, or a skip.  A torchvision built for another torch fails at import
    ("operator torchvision::nms does not exist") while registering its fake kernels; the
    models used here need none of its compiled operators, so each missing one is declared
    (no kernel) and the import retried."""
    lib = None
    for _ in range(20):
        try:
            import torchvision
        except RuntimeError as exc:
            m = re.search(r"operator torchvision::(\w+) does not exist", str(exc))
            if m is None:
                pytest.skip(f"torchvision does not import: {exc}")
            if lib is None:
                lib = torch.library.Library("torchvision", "FRAGMENT")
            lib.define(f"{m.group(1)}(Tensor x) -> Tensor")
            for name in [k for k in sys.modules if k.startswith("torchvision")]:
                del sys.modules[name]
        except ImportError:
            pytest.skip("torchvision is not installed")
        else:
            _torchvision.lib = lib  # the declarations live as long as the library object
            return torchvision
    pytest.skip("torchvision does not import")


def _export(model, x) -> onnx.ModelProto:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model, (x,), buf, dynamo=False, opset_version=17, input_names=["x"],
            output_names=["y"],
        )  # fmt: skip
    return onnx.load_from_string(buf.getvalue())


@pytest.mark.parametrize("name", ["vit_b_16", "swin_t"])
def test_torchvision_transformer_matches_onnxruntime(name):
    tv = _torchvision()
    torch.manual_seed(0)
    model = getattr(tv.models, name)(weights=None).eval()
    with torch.no_grad():
        for p in model.parameters():
            if not p.abs().sum():  # vit_b_16's head starts at zero: give it values
                p.normal_(0, 0.02)
    x = torch.randn(1, 3, 224, 224)
    proto = _export(model, x)
    res = load(proto)
    func = res.graph.compile(list(res.inputs.values()), [mgb.copy_output(res.outputs["y"])])
    got = np.asarray(func(x.numpy())[0])
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = sess.run(None, {"x": x.numpy()})
    assert got.shape == want.shape == (1, 1000)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
