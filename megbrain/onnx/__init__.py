"""ONNX import: ``megbrain.onnx.load_inference`` compiles an ONNX model into a fast inference
function; ``megbrain.onnx.load`` builds megbrain operators for an ONNX graph.

Each ONNX op type has one small converter registered by op type and opset range
(``registry.converter``); ``support.claimed_op_types()`` lists them.
"""

from __future__ import annotations

try:
    import onnx as _onnx  # noqa: F401
except ImportError as _e:  # pragma: no cover - depends on the environment
    raise ImportError("megbrain.onnx needs the onnx package: pip install 'megbrain[onnx]'") from _e

from . import (  # noqa: F401 - the converters register themselves
    ops_attention,
    ops_einsum,
    ops_elemwise,
    ops_index,
    ops_loss,
    ops_nn,
    ops_qlinear,
    ops_quant,
    ops_reduce,
    ops_resize,
    ops_signal,
    ops_tensor,
)
from .exporter import export
from .inference import InferenceFunction, load_inference
from .loader import LoadResult, load
from .registry import ONNXConversionError, claimed_op_types

__all__ = [
    "export",
    "load",
    "load_inference",
    "InferenceFunction",
    "LoadResult",
    "ONNXConversionError",
    "claimed_op_types",
]
