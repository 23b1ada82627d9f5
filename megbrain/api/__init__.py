"""The Python-facing objects of the binding: shared tensors, CompGraph, AsyncExec,
callbacks and value proxies."""

from .callback import (
    CompGraphCallbackValueProxy,
    FuncOutputSaver,
    SharedNDLazyInitializer,
    callback_lazycopy,
    copy_output,
)
from .comp_graph import AsyncExec, CompGraph, comp_graph
from .shared import (
    ProxySharedNDAndSymbolVar,
    SharedND,
    SharedScalar,
    _HostSharedND,
    from_dlpack,
    make_arg,
    make_immutable,
    make_shared,
)

__all__ = [
    "AsyncExec",
    "CompGraph",
    "CompGraphCallbackValueProxy",
    "FuncOutputSaver",
    "ProxySharedNDAndSymbolVar",
    "SharedND",
    "SharedNDLazyInitializer",
    "SharedScalar",
    "_HostSharedND",
    "callback_lazycopy",
    "comp_graph",
    "copy_output",
    "from_dlpack",
    "make_arg",
    "make_immutable",
    "make_shared",
]
