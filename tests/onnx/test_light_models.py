"""The light models shipped in the onnx wheel (weights built by ConstantOfShape) run on
megbrain and match onnxruntime."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from megbrain.onnx.backend import MegBrainBackend  # noqa: E402

_LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
_MODELS = sorted(
    f[: -len(".onnx")]
    for f in (os.listdir(_LIGHT) if os.path.isdir(_LIGHT) else ())
    if f.endswith(".onnx")
)
#: known bugs, to be fixed (none today)
_KNOWN_BAD: dict[str, str] = {}
#: models that take over ~10 s here
_SLOW = {
    "light_vgg19",
    "light_densenet121",
    "light_inception_v2",
    "light_resnet50",
    "light_zfnet512",
}


def _inputs(model, rng):
    init = {t.name for t in model.graph.initializer}
    feed = {}
    for vi in model.graph.input:
        if vi.name in init:
            continue
        shape = [d.dim_value or 1 for d in vi.type.tensor_type.shape.dim]
        feed[vi.name] = rng.random(shape, dtype=np.float32)
    return feed


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(m, marks=[pytest.mark.slow] if m in _SLOW else [])
        if m not in _KNOWN_BAD
        else pytest.param(m, marks=pytest.mark.xfail(reason=_KNOWN_BAD[m], strict=True))
        for m in _MODELS
    ],
)
def test_light_model_matches_onnxruntime(name):
    path = os.path.join(_LIGHT, name + ".onnx")
    model = onnx.load(path)
    last = model.graph.node[-1]
    if last.op_type == "Softmax":
        # the constant weights drive the logits to ~1e10, where one float32 ulp (1024) between
        # two channels changes the softmax completely: compare the logits as well
        vi = onnx.ValueInfoProto()
        vi.CopyFrom(model.graph.output[0])  # Softmax keeps its input's shape and dtype
        vi.name = last.input[0]
        model.graph.output.append(vi)
        path = model.SerializeToString()
    feed = _inputs(model, np.random.default_rng(0))
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    want = sess.run(None, feed)
    t0 = time.perf_counter()
    got = MegBrainBackend.prepare(model).run(feed)
    elapsed = time.perf_counter() - t0
    assert len(got) == len(want)
    logits = got[-1] if last.op_type == "Softmax" else None
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape
        if i == 0 and logits is not None and np.ptp(logits) < 1e-3 * np.abs(logits).max():
            continue  # softmax of logits equal to float32 precision: ill-conditioned
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-4 * max(1.0, np.abs(w).max()))
    print(f"{name}: {elapsed:.1f} s")
