"""torchvision's classification models exported to ONNX (opset 17, random weights, eval mode),
for ``onnx_zoo.py`` and ``tests/onnx/test_torchvision_models.py``.

torchvision and torch are benchmark peers (``requirements-peers.txt``), never dependencies:
:func:`import_torchvision` raises ImportError when they are missing or unusable.
"""

from __future__ import annotations

import io
import os
import re
import sys
import tempfile
import warnings

#: the models of the issue-32 table: one or two per family, the light ones
DEFAULT_MODELS = (
    "mnasnet0_5", "mobilenet_v3_small", "regnet_y_400mf", "convnext_tiny",
    "shufflenet_v2_x1_0", "mobilenet_v2", "efficientnet_b0", "squeezenet1_1", "googlenet",
    "resnet18", "densenet121", "resnet50",
)  # fmt: skip

_LIB = []  # the torch.library declarations live as long as the process


def import_torchvision():
    """torchvision, imported.  A torchvision built for another torch fails at import
    ("operator torchvision::nms does not exist") while registering its fake kernels; the
    classification models need none of its compiled operators, so each missing one is declared
    (no kernel) and the import retried.

    Raises
    ------
    ImportError
        Without torch or torchvision, or when torchvision still does not import.
    """
    import torch

    for _ in range(20):
        try:
            import torchvision
        except RuntimeError as exc:
            m = re.search(r"operator torchvision::(\w+) does not exist", str(exc))
            if m is None:
                raise ImportError(f"torchvision does not import: {exc}") from exc
            if not _LIB:
                _LIB.append(torch.library.Library("torchvision", "FRAGMENT"))
            _LIB[0].define(f"{m.group(1)}(Tensor x) -> Tensor")
            for name in [k for k in sys.modules if k.startswith("torchvision")]:
                del sys.modules[name]
        else:
            return torchvision
    raise ImportError("torchvision does not import")


def classification_models(tv) -> list[str]:
    """The names of torchvision's classification models."""
    return tv.models.list_models(module=tv.models)


def build(tv, name: str, seed: int = 0):
    """Model ``name`` with random weights (seeded), in eval mode; a parameter that starts at
    zero (vit_b_16's head) gets small random values, so the output depends on the input."""
    import torch

    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # googlenet's and inception's init warnings
        model = getattr(tv.models, name)(weights=None).eval()
    with torch.no_grad():
        for p in model.parameters():
            if not p.abs().sum():
                p.normal_(0, 0.02)
    return model


def export(model, x):
    """``model`` at input ``x`` as an ``onnx.ModelProto`` (opset 17, TorchScript exporter),
    input "x", output "y"."""
    import onnx
    import torch

    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model, (x,), buf, dynamo=False, opset_version=17, input_names=["x"],
            output_names=["y"],
        )  # fmt: skip
    return onnx.load_from_string(buf.getvalue())


def cached_export(tv, name: str, shape=(1, 3, 224, 224)) -> str:
    """The path of model ``name`` exported at input shape ``shape``, exported on first use
    into a cache under the temp directory (keyed by torchvision's version)."""
    import onnx

    cache = os.path.join(tempfile.gettempdir(), "megbrain_onnx_zoo")
    os.makedirs(cache, exist_ok=True)
    dims = "x".join(map(str, shape))
    path = os.path.join(cache, f"{name}-tv{tv.__version__}-{dims}-opset17.onnx")
    if not os.path.exists(path):
        import torch

        torch.manual_seed(0)
        proto = export(build(tv, name), torch.randn(*shape))
        tmp = f"{path}.{os.getpid()}.tmp"
        onnx.save(proto, tmp)
        os.replace(tmp, path)  # another process never reads half a file
    return path
