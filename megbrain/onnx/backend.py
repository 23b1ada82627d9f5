"""An ``onnx.backend.base.Backend`` running ONNX models with megbrain."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep

import megbrain as mgb

from .loader import load
from .support import model_is_claimed

__all__ = ["MegBrainBackend", "MegBrainRep", "prepare", "run_model"]


def _expected_np_dtype(elem_type: int):
    try:
        return helper.tensor_dtype_to_np_dtype(elem_type)
    except Exception:  # noqa: BLE001
        return None


class MegBrainRep(BackendRep):
    """A prepared model; each run builds and compiles it for the given inputs.

    The inputs' values are known to the build (``load(static_inputs=...)``), so models whose
    shapes are computed from their inputs (Reshape's shape given as an input) run as well.
    """

    def __init__(self, model: onnx.ModelProto, device: str = "CPU") -> None:
        self.model = model
        init = {t.name for t in model.graph.initializer}
        self.input_names = [vi.name for vi in model.graph.input if vi.name not in init]
        self.output_types = [vi.type.tensor_type.elem_type for vi in model.graph.output]
        self.output_ranks = [
            len(vi.type.tensor_type.shape.dim) if vi.type.tensor_type.HasField("shape") else None
            for vi in model.graph.output
        ]

    def run(self, inputs: Any, **kwargs: Any) -> tuple:
        """Run the model on ``inputs`` (a list in the model's input order, or a dict by name).

        Returns the outputs as NumPy arrays with the model's declared dtypes (INT64, DOUBLE
        and BOOL outputs are converted back from megbrain's int32/float32/bool).
        """
        if isinstance(inputs, dict):
            feed = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            feed = dict(zip(self.input_names, inputs))
        feed = {k: np.asarray(v) for k, v in feed.items()}
        res = load(self.model, static_inputs=feed)
        outs = list(res.outputs.values())
        # the inputs already hold their values; those read at build time are not inputs of
        # the function, so let compile find the ones it needs
        func = res.graph.compile(None, [mgb.copy_output(v) for v in outs])
        vals = func()
        if not isinstance(vals, (list, tuple)):
            vals = [vals]
        result = []
        for v, et, rank in zip(vals, self.output_types, self.output_ranks):
            dt = _expected_np_dtype(et)
            v = np.asarray(v)
            if rank == 0 and v.size == 1:
                v = v.reshape(())  # megbrain holds scalars as shape (1,)
            result.append(v.astype(dt) if dt is not None and v.dtype != dt else v)
        return tuple(result)


class MegBrainBackend(Backend):
    """The megbrain ONNX backend (CPU)."""

    @classmethod
    def is_compatible(cls, model, device: str = "CPU", **kwargs: Any) -> bool:
        """Whether every node's op type has a converter (other models are skipped)."""
        return device == "CPU" and model_is_claimed(model)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """Only ``"CPU"``."""
        return device == "CPU"

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs: Any) -> MegBrainRep:
        """Check ``model`` (``onnx.checker``) and wrap it in a :class:`MegBrainRep`."""
        """Convert ``model`` (an ``onnx.ModelProto``) into a :class:`MegBrainRep` whose
        ``run(inputs)`` evaluates it; only the ``"CPU"`` device is supported."""
        super().prepare(model, device, **kwargs)
        return MegBrainRep(model, device)

    @classmethod
    def run_node(cls, node, inputs, device: str = "CPU", outputs_info=None, **kwargs):
        """Not supported: megbrain runs whole models (:meth:`prepare`), not single nodes."""
        raise NotImplementedError("run_node: use prepare() on a model")


prepare = MegBrainBackend.prepare


def run_model(model, inputs, device: str = "CPU", **kwargs: Any):
    """Run ``model`` once on ``inputs`` (a list of arrays, in the model's input order) and
    return its outputs: :meth:`MegBrainBackend.run_model`."""
    return MegBrainBackend.run_model(model, inputs, device, **kwargs)
