"""ONNX's own backend test suite (the node cases) run on megbrain's ONNX import.

Cases whose model uses an op type without a converter are skipped (the backend's
``is_compatible``); cases of claimed op types that are left out are listed with their reason
in ``megbrain.onnx.support.EXCLUDED_CASES``.
"""

from __future__ import annotations

import pytest

onnx_backend_test = pytest.importorskip("onnx.backend.test")

import unittest  # noqa: E402

from megbrain.onnx.backend import MegBrainBackend  # noqa: E402
from megbrain.onnx.support import EXCLUDED_CASES, KNOWN_GAPS, unclaimed_op_types  # noqa: E402


class _SuiteBackend(MegBrainBackend):
    """Skips (instead of failing) the cases of op types without a converter."""

    @classmethod
    def prepare(cls, model, device="CPU", **kwargs):
        missing = unclaimed_op_types(model)
        if missing:
            raise unittest.SkipTest(f"op types not claimed: {', '.join(missing)}")
        return super().prepare(model, device, **kwargs)


backend_test = onnx_backend_test.BackendTest(_SuiteBackend, __name__)
for pattern in {**EXCLUDED_CASES, **KNOWN_GAPS}:
    backend_test.exclude(pattern)
# the node cases only: the real/simple/pytorch models are tested elsewhere or need a download
globals()["OnnxBackendNodeModelTest"] = backend_test.test_cases["OnnxBackendNodeModelTest"]
