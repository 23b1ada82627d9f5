"""megbrain: a Python implementation of MegBrain's computing-graph runtime.

``import megbrain as mgb`` gives the API that MegEngine 0.x exposed as ``megengine._internal``.
"""

from __future__ import annotations

from . import (
    dtype,
    opr,  # noqa: E402  (after the API objects it canonizes)
)
from .api import (  # noqa: E402
    AsyncExec,
    CompGraph,
    CompGraphCallbackValueProxy,
    FuncOutputSaver,
    ProxySharedNDAndSymbolVar,
    SharedND,
    SharedNDLazyInitializer,
    SharedScalar,
    _HostSharedND,
    callback_lazycopy,
    cgtools,
    comp_graph,
    config,
    copy_output,
    make_arg,
    make_immutable,
    make_shared,
)
from .api.functions import (  # noqa: E402
    _add_update_fastpath,
    current_grad_target,
    get_graph_optimizer_replaced_var,
    grad,
    inter_graph_trans_var,
    mark_as_input,
)
from .device import CompNode, add_device_map, as_comp_node, del_device_map
from .dtype import to_mgb_supported_dtype
from .errors import (
    AssertionError,  # noqa: A004
    ConversionError,
    GraphError,
    MegBrainError,
    SerializationError,
)
from .gopt import optimize_for_inference  # noqa: E402
from .graph import OperatorNodeConfig
from .opr.base import SymbolVar, make_opr_config
from .opr.basic_arith import fill_retain_dtype

comp_node = as_comp_node

__version__ = "0.1.0"
version_info = (0, 1, 0, False)

__all__ = [
    "AssertionError",
    "AsyncExec",
    "CompGraph",
    "CompGraphCallbackValueProxy",
    "CompNode",
    "ConversionError",
    "FuncOutputSaver",
    "GraphError",
    "MegBrainError",
    "OperatorNodeConfig",
    "ProxySharedNDAndSymbolVar",
    "SerializationError",
    "SharedND",
    "SharedNDLazyInitializer",
    "SharedScalar",
    "SymbolVar",
    "_HostSharedND",
    "add_device_map",
    "as_comp_node",
    "callback_lazycopy",
    "cgtools",
    "config",
    "comp_graph",
    "comp_node",
    "copy_output",
    "del_device_map",
    "dtype",
    "fill_retain_dtype",
    "_add_update_fastpath",
    "get_graph_optimizer_replaced_var",
    "inter_graph_trans_var",
    "mark_as_input",
    "grad",
    "current_grad_target",
    "make_arg",
    "make_immutable",
    "make_opr_config",
    "make_shared",
    "opr",
    "optimize_for_inference",
    "to_mgb_supported_dtype",
]
