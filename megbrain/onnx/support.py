"""What the ONNX import claims, in one place.

``model_is_claimed`` says whether every node of a model has a converter (the backend's
``is_compatible``); ``EXCLUDED_CASES`` lists the cases of claimed operators that are left out
of ONNX's backend test suite, each with its reason.
"""

from __future__ import annotations

import onnx

from .registry import claimed_op_types, lookup

__all__ = [
    "claimed_op_types",
    "model_is_claimed",
    "unclaimed_op_types",
    "EXCLUDED_CASES",
    "KNOWN_GAPS",
]


def _opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    return 0


def unclaimed_op_types(model: onnx.ModelProto) -> list[str]:
    """The op types of ``model`` without a converter at its opset (sorted)."""
    opset = _opset(model)
    return sorted(
        {
            n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
            for n in model.graph.node
            if n.domain not in ("", "ai.onnx") or lookup(n.op_type, opset) is None
        }
    )


def model_is_claimed(model: onnx.ModelProto) -> bool:
    """Whether every node of ``model`` (default domain) has a converter at its opset."""
    return not unclaimed_op_types(model)


#: backend-test cases of claimed op types needing a dtype megbrain lacks (regex -> reason)
EXCLUDED_CASES: dict[str, str] = {
    r"(?i)uint16|uint32|uint64": "megbrain has no uint16/uint32/uint64 dtype",
    r"(?i)float8|float4e2m1|e8m0": "megbrain has no 8-bit or 4-bit float dtype",
    r"(?i)_u?int[24]_|_u?int[24]$|to_u?int[24]_": "no ONNX-compatible int2/int4 dtype",
    r"(?i)string": "megbrain has no string dtype",
    r"_opt_|_optional|identity_sequence": "optional and sequence types are not supported",
}

#: cases of claimed op types that fail today: known gaps, to be fixed (regex -> what is missing)
KNOWN_GAPS: dict[str, str] = {
}
