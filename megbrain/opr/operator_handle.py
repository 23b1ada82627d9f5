"""``Operator``: the Python handle of an operator node."""

from __future__ import annotations

from ..graph import OperatorNodeBase
from .base import SymbolVar

__all__ = ["Operator"]


class Operator:
    """Wraps an operator: ``id``, ``name``, ``params``, ``inputs``, ``outputs``."""

    __slots__ = ("opr",)

    def __init__(self, opr: OperatorNodeBase):
        self.opr = opr

    @property
    def id(self) -> int:
        return self.opr.id

    @property
    def name(self) -> str:
        return self.opr.name

    @property
    def type(self) -> str:
        return self.opr.type_name

    @property
    def params(self) -> dict:
        p = self.opr.param
        return p.to_json() if hasattr(p, "to_json") else {}

    @property
    def inputs(self) -> tuple:
        return tuple(SymbolVar(v) for v in self.opr.inputs)

    @property
    def outputs(self) -> tuple:
        return tuple(SymbolVar(v) for v in self.opr.outputs)

    @property
    def owner_graph(self):
        return self.opr.graph.api_graph()

    def __eq__(self, other) -> bool:
        return isinstance(other, Operator) and other.opr is self.opr

    def __hash__(self) -> int:
        return hash(("Operator", id(self.opr)))

    def __repr__(self) -> str:
        return f"Operator(id={self.id},name={self.name})"
