"""Graph files in MegBrain v0.6.0's own FlatBuffers format: dump (:func:`dump_graph`) and
load (:func:`load_graph`, :func:`iter_graphs`), with the format's checks.

Operators are dumped and loaded through the registry of :mod:`megbrain.serialization.sereg`, which
each operator family fills; the user API is ``megbrain.serialize_comp_graph_to_file`` and
``megbrain.load_comp_graph_from_file``.
"""

from .dumper import DumpConfig, DumpResult, TensorValueDumperContext, dep_oprs, dump_graph
from .format import FILE_IDENTIFIER, MGB_MAGIC, MGB_VERSION, content_hash
from .loader import (
    LoadConfig,
    LoadResult,
    TensorValueLoaderContext,
    is_graph_file,
    iter_graphs,
    load_graph,
)

__all__ = [
    "DumpConfig",
    "DumpResult",
    "FILE_IDENTIFIER",
    "LoadConfig",
    "LoadResult",
    "MGB_MAGIC",
    "MGB_VERSION",
    "TensorValueDumperContext",
    "TensorValueLoaderContext",
    "content_hash",
    "dep_oprs",
    "dump_graph",
    "is_graph_file",
    "iter_graphs",
    "load_graph",
]
