"""megbrain: a Python implementation of MegBrain's computing-graph runtime.

``import megbrain as mgb`` gives the API that MegEngine 0.x exposed as ``megengine._internal``.
"""

from __future__ import annotations

import sys as _sys

# The modules of the reference's package (``megengine._internal.X``), as facades.
from . import (
    craniotome,
    dtype,
    exc,
    global_init,
    helper,
    logconf,
    mgb,
    mgb_helper,
    opr,
    opr_extra,
    opr_param_defs,
    persistent_cache,
    plugin,
    version,
)
from .api import (
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
    from_dlpack,
    make_arg,
    make_immutable,
    make_shared,
)
from .api.functions import (
    _add_update_fastpath,
    current_grad_target,
    get_graph_optimizer_replaced_var,
    get_opr_fp_graph_exec,
    grad,
    inter_graph_trans_var,
    mark_as_input,
    return_free_memory,
)
from .api.serialization import (
    CompGraphLoadResult,
    CompGraphSerializationResult,
    TensorValueDumperContext,
    TensorValueLoaderContext,
    iter_comp_graphs_from_file,
    load_comp_graph_from_file,
    serialize_comp_graph_to_file,
)
from .device import CompNode, add_device_map, as_comp_node, del_device_map
from .dtype import to_mgb_supported_dtype
from .exc import *  # noqa: F403 - the binding's exception classes, listed in exc.__all__
from .gopt import optimize_for_inference
from .graph import OperatorNodeConfig
from .logconf import get_logger
from .mgb import _get_mgb_version
from .opr.base import SymbolVar, make_opr_config
from .opr.basic_arith import fill_retain_dtype
from .version import __version__, version_info

comp_node = as_comp_node
comp_graph_tools = cgtools

# ``config`` and ``comp_graph_tools`` (= ``cgtools``) live in api/; make them importable by
# their reference names too (``import megbrain.config``), as the same module objects.
_sys.modules[__name__ + ".config"] = config
_sys.modules[__name__ + ".cgtools"] = cgtools
_sys.modules[__name__ + ".comp_graph_tools"] = cgtools

__all__ = [
    "__version__",
    "_get_mgb_version",
    "global_init",
    "logconf",
    "version",
    "version_info",
    "AsyncExec",
    "CompGraph",
    "CompGraphCallbackValueProxy",
    "CompNode",
    "FuncOutputSaver",
    "OperatorNodeConfig",
    "ProxySharedNDAndSymbolVar",
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
    "craniotome",
    "comp_node",
    "comp_graph_tools",
    "exc",
    "get_logger",
    "get_opr_fp_graph_exec",
    "helper",
    "mgb",
    "mgb_helper",
    "opr_extra",
    "opr_param_defs",
    "persistent_cache",
    "plugin",
    "return_free_memory",
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
    "from_dlpack",
    "make_immutable",
    "make_opr_config",
    "make_shared",
    "opr",
    "optimize_for_inference",
    "to_mgb_supported_dtype",
    "CompGraphLoadResult",
    "CompGraphSerializationResult",
    "TensorValueDumperContext",
    "TensorValueLoaderContext",
    "iter_comp_graphs_from_file",
    "load_comp_graph_from_file",
    "serialize_comp_graph_to_file",
    *exc.__all__,
]
