"""The computing-graph core: graph, vars, operator contract, static inference, comp seq,
memory plan and executor. Knows operators only through the contract."""

from .cg import ComputingGraph
from .executor import AsyncExecutable
from .operator import (
    OPR_REGISTRY,
    OperatorNodeBase,
    OperatorNodeConfig,
    ParamBase,
    register_opr,
    table_param,
)
from .options import GraphOptions
from .static_infer import (
    DynamicShapeError,
    Inferer,
    InferPending,
    infer_shape,
    infer_value,
    static_shape,
)
from .var import InferType, VarNode

__all__ = [
    "AsyncExecutable",
    "ComputingGraph",
    "DynamicShapeError",
    "GraphOptions",
    "InferPending",
    "InferType",
    "Inferer",
    "OPR_REGISTRY",
    "OperatorNodeBase",
    "OperatorNodeConfig",
    "ParamBase",
    "table_param",
    "VarNode",
    "infer_shape",
    "infer_value",
    "register_opr",
    "static_shape",
]
