"""VarNode: one output of an operator in a computing graph, with its static-inference state."""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .cg import ComputingGraph
    from .operator import OperatorNodeBase

__all__ = ["InferType", "VarNode"]


class InferType(IntEnum):
    """How a var's shape or value can be known before running (``StaticInferManager``).

    ``CONST``: fixed once the graph is built. ``RT_STATIC``: known before each run from the
    current shapes/values of the graph's inputs. ``MISSING``: only known by running (a dynamic
    shape, or a value that can not be inferred).
    """

    CONST = 0
    RT_STATIC = 1
    MISSING = 2


class VarNode:
    """A var: the graph edge carrying one tensor.

    The static-inference types are decided when the owner operator is inserted; shapes and values
    themselves are computed on demand by :mod:`megbrain.graph.static_infer`.
    """

    __slots__ = (
        "graph",
        "id",
        "name",
        "owner",
        "out_idx",
        "dtype",
        "comp_node",
        "shape_type",
        "value_type",
        "const_shape",
        "const_value",
        "name_given",
        "eager_value",
        "rt_shape",
        "__weakref__",
    )

    def __init__(
        self,
        graph: ComputingGraph,
        owner: OperatorNodeBase,
        out_idx: int,
        dtype: np.dtype,
        comp_node,
        name: str,
    ):
        self.graph = graph
        self.id = graph._next_id()
        self.owner = owner
        self.out_idx = out_idx
        self.dtype = dtype
        self.comp_node = comp_node
        self.name = name
        self.name_given = False
        self.shape_type = InferType.MISSING
        self.value_type = InferType.MISSING
        self.const_shape: tuple | None = None
        self.const_value: np.ndarray | None = None
        #: the value computed at insertion in an eager graph
        self.eager_value: np.ndarray | None = None
        #: the shape a run last computed for a var without a static shape (None before)
        self.rt_shape: tuple | None = None

    def __repr__(self) -> str:
        return f"VarNode(id={self.id},name={self.name})"

    @property
    def shape_static(self) -> bool:
        """Whether the shape is known before running (CONST or RT_STATIC)."""
        return self.shape_type != InferType.MISSING

    @property
    def value_static(self) -> bool:
        """Whether the value can be inferred before running (CONST or RT_STATIC)."""
        return self.value_type != InferType.MISSING
