"""Dumping computing graphs to files and loading them back, as ``megengine._internal`` did
(``serialize_comp_graph_to_file``, ``load_comp_graph_from_file``), in MegBrain v0.6.0's own
FlatBuffers format (see :mod:`megbrain.serialization`)."""

from __future__ import annotations

import collections
import json
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

from ..dtype import dtype_name
from ..errors import ArgumentError, GraphError, SerializationError
from ..opr.base import SymbolVar, as_var
from ..serialization import (
    DumpConfig,
    LoadConfig,
    LoadResult,
    TensorValueDumperContext,
    TensorValueLoaderContext,
    dep_oprs,
    dump_graph,
    iter_graphs,
    load_graph,
    sereg,
)

__all__ = [
    "CompGraphSerializationResult",
    "CompGraphLoadResult",
    "TensorValueDumperContext",
    "TensorValueLoaderContext",
    "serialize_comp_graph_to_file",
    "load_comp_graph_from_file",
    "iter_comp_graphs_from_file",
]

_log = logging.getLogger("megbrain")

CompGraphSerializationResult = collections.namedtuple(
    "CompGraphSerializationResult",
    ["nr_opr", "tot_bytes", "tensor_value_bytes", "content_hash", "inputs", "outputs", "params"],
)
CompGraphSerializationResult.__doc__ = """What :func:`serialize_comp_graph_to_file` wrote:
the number of operators, the bytes of the graph and of its tensor values, the content hash,
and the names of the input tensors, output vars and (named) params."""

CompGraphLoadResult = collections.namedtuple(
    "CompGraphLoadResult", ["graph", "output_vars_dict", "output_vars_list"]
)
CompGraphLoadResult.__doc__ = """A loaded graph: the CompGraph, its output vars by name and in
the order they were dumped."""

_FORMATS = {None: "fbs", "fbs": "fbs"}


def _fspath(fpath: Any, func: str) -> str:
    if not isinstance(fpath, (str, os.PathLike)):
        raise ArgumentError(f"{func}: bad file path: {fpath!r}")
    return os.fspath(fpath)


def _output_vars(output_vars: Any) -> list:
    func = "serialize_comp_graph_to_file"
    if isinstance(output_vars, dict):
        used: set[int] = set()
        out = []
        for name, var in output_vars.items():
            node = as_var(var)
            if node is None:
                raise ArgumentError(f"{func}: bad output var for {name!r}: {var!r}")
            if id(node) in used:
                raise ArgumentError(
                    f"{func}: var name is associated with a var object, so we can not have two "
                    f"names given to the same var: {node.name!r} (renamed to {name!r})"
                )
            used.add(id(node))
            out.append((node, str(name)))
        # rename only once every entry was checked: nothing half-applied on error
        for node, name in out:
            SymbolVar(node).rename(name)
        return [node for node, _ in out]
    if isinstance(output_vars, (SymbolVar,)) or as_var(output_vars) is not None:
        output_vars = [output_vars]
    out = []
    for v in output_vars:
        node = as_var(v)
        if node is None:
            raise ArgumentError(f"{func}: bad output var: {v!r}")
        out.append(node)
    return out


def _strip_info(output_vars: list, content_hash: int) -> dict:
    """The reference's ``_get_info_for_strip``: the operator types, dtypes and elemwise modes
    a loader of the graph needs."""
    opr_types, dtypes, modes = set(), set(), set()
    for opr in dep_oprs(output_vars):
        if sereg.is_removed_in_dump(opr):
            continue
        opr_types.add(opr.type_name)
        for v in opr.outputs:
            dtypes.add(dtype_name(v.dtype))
        if opr.type_name == "Elemwise":
            modes.add(opr.param.mode)
    return {
        "opr_types": sorted(opr_types),
        "dtypes": sorted(dtypes),
        "elemwise_modes": sorted(modes),
        "hash": content_hash,
    }


def serialize_comp_graph_to_file(
    fpath: str | os.PathLike,
    output_vars: Any,
    *,
    keep_var_name: int = 1,
    keep_param_name: bool = False,
    keep_opr_priority: bool = False,
    tensor_value_dumper: Callable[[TensorValueDumperContext], None] | None = None,
    output_strip_info: bool = False,
    append: bool = False,
    format: str | None = None,  # noqa: A002 - the reference's name
    **kwargs: Any,
) -> CompGraphSerializationResult:
    """Serialize the graph computing ``output_vars`` and write it to a file.

    Parameters
    ----------
    fpath:
        The output file.
    output_vars:
        The vars to retrieve after loading: a list, or a dict ``{name: var}`` (the vars are
        renamed to the given names).
    keep_var_name:
        0: no var names are kept; 1: the output vars' names; 2: every var's name.
    keep_param_name:
        Whether parameters (shared tensors) keep their names, so that their values can be
        found after loading.
    keep_opr_priority:
        Whether operator priorities are kept.
    tensor_value_dumper:
        ``f(ctx)`` writing each tensor value (without layout) through
        :class:`TensorValueDumperContext` (``ctx.write(bytes)``, ``ctx.write_default()``);
        None writes the raw bytes.
    output_strip_info:
        Also write ``fpath + ".json"``: the operator types, dtypes and elemwise modes used,
        and the content hash.
    append:
        Append the graph to the file instead of replacing it (see
        :func:`iter_comp_graphs_from_file`).
    format:
        ``"fbs"`` or None (the default, FlatBuffers).
    **kwargs:
        The deprecated ``mangle_opr_name`` and ``mangle_param_name``.

    Returns
    -------
    CompGraphSerializationResult

    Raises
    ------
    ValueError
        For an unknown ``format``.
    SerializationError
        For an operator that can not be dumped (named), duplicated output names; nothing is
        written to the file then.
    """
    func = "serialize_comp_graph_to_file"
    fpath = _fspath(fpath, func)
    if format not in _FORMATS:
        raise ValueError(
            f"unknown format {format} requested, supported ones are {[k for k in _FORMATS if k]}"
        )
    if tensor_value_dumper is not None and not callable(tensor_value_dumper):
        raise ArgumentError(f"{func}: tensor_value_dumper must be callable")
    if "mangle_opr_name" in kwargs:
        _log.warning("mangle_opr_name is deprecated; use keep_var_name instead")
        keep_var_name = 1 if kwargs.pop("mangle_opr_name") else 2
    if "mangle_param_name" in kwargs:
        _log.warning("mangle_param_name is deprecated; use keep_param_name instead")
        keep_param_name = not kwargs.pop("mangle_param_name")
    if kwargs:
        raise ArgumentError(f"extra kwargs provided to {func}: {kwargs}")
    if isinstance(keep_var_name, bool) or keep_var_name not in (0, 1, 2):
        raise ArgumentError(f"{func}: keep_var_name must be 0, 1 or 2, got {keep_var_name!r}")
    outs = _output_vars(output_vars)
    config = DumpConfig(
        keep_var_name=keep_var_name,
        keep_param_name=bool(keep_param_name),
        keep_opr_priority=bool(keep_opr_priority),
        tensor_value_dumper=tensor_value_dumper,
    )
    data, res = dump_graph(outs, config)
    with open(fpath, "ab" if append else "wb") as f:
        f.write(data)
    ret = CompGraphSerializationResult(
        res.nr_opr,
        res.tot_bytes,
        res.tensor_value_bytes,
        res.content_hash,
        list(res.inputs),
        list(res.outputs),
        list(res.params),
    )
    if output_strip_info:
        with open(fpath + ".json", "w") as fout:
            json.dump(_strip_info(outs, res.content_hash), fout)
    return ret


def _read_file(fpath: str) -> bytes:
    try:
        with open(fpath, "rb") as f:
            return f.read()
    except OSError as exc:
        raise SerializationError(f"can not read graph file {fpath!r}: {exc}") from exc


def _load_config(comp_node_mapper: Any, tensor_value_loader: Any, func: str) -> LoadConfig:
    from .comp_graph import comp_graph

    for arg, val in (
        ("comp_node_mapper", comp_node_mapper),
        ("tensor_value_loader", tensor_value_loader),
    ):
        if val is not None and not callable(val):
            raise ArgumentError(f"{func}: {arg} must be callable, got {val!r}")
    mapper = None
    if comp_node_mapper is not None:

        def mapper(loc: str, _f=comp_node_mapper) -> str:
            return str(_f(loc))

    return LoadConfig(
        comp_node_mapper=mapper,
        tensor_value_loader=tensor_value_loader,
        graph_factory=comp_graph,
    )


def _finish(res: LoadResult) -> CompGraphLoadResult:
    """Name the loaded Host2DeviceCopy vars after their tensors and mark them as inputs of
    functions, as the reference's binding does."""
    from .functions import mark_as_input

    # the dict is keyed by the names the outputs were loaded with, as the reference's
    out_dict = {name: SymbolVar(v) for name, v in res.output_var_map.items()}
    names = {id(t): n for n, t in res.tensor_map.items()}
    for opr in dep_oprs(res.output_var_list):
        if opr.type_name != "Host2DeviceCopy":
            continue
        name = names.get(id(opr.tensor))
        if name is None:
            raise GraphError(f"unbound Host2DeviceCopy {opr.name!r} in loaded graph")
        opr.outputs[0].name = name
        opr.outputs[0].name_given = True
        opr.name = name
        mark_as_input(res.graph, opr.outputs[0])
    return CompGraphLoadResult(res.graph, out_dict, [SymbolVar(v) for v in res.output_var_list])


def load_comp_graph_from_file(
    fpath: str | os.PathLike,
    *,
    comp_node_mapper: Callable[[str], str] | None = None,
    tensor_value_loader: Callable[[TensorValueLoaderContext], Any] | None = None,
) -> CompGraphLoadResult:
    """Load the (first) graph of a file written by :func:`serialize_comp_graph_to_file`.

    Parameters
    ----------
    fpath:
        The file.
    comp_node_mapper:
        ``f(locator) -> locator`` changing the comp node of every operator and tensor.
    tensor_value_loader:
        ``f(ctx) -> ndarray`` reading each tensor value of ``ctx.shape`` and ``ctx.dtype``
        through :class:`TensorValueLoaderContext` (``ctx.read(n)``); None reads raw bytes.

    Returns
    -------
    CompGraphLoadResult
        ``(graph, output_vars_dict, output_vars_list)``; the graph's Host2DeviceCopy vars
        carry their input names and are inputs of the functions compiled from it.

    Raises
    ------
    SerializationError
        For a file that is not a valid graph file; nothing is returned half loaded.
    """
    func = "load_comp_graph_from_file"
    data = _read_file(_fspath(fpath, func))
    config = _load_config(comp_node_mapper, tensor_value_loader, func)
    return _finish(load_graph(data, 0, config))


def iter_comp_graphs_from_file(
    fpath: str | os.PathLike,
    *,
    comp_node_mapper: Callable[[str], str] | None = None,
    tensor_value_loader: Callable[[TensorValueLoaderContext], Any] | None = None,
) -> Iterator[CompGraphLoadResult]:
    """Every graph of a file, in order: those written with ``append=True`` after the first.

    Parameters
    ----------
    fpath, comp_node_mapper, tensor_value_loader:
        As for :func:`load_comp_graph_from_file`; each graph is loaded into its own
        CompGraph.

    Yields
    ------
    CompGraphLoadResult

    Raises
    ------
    SerializationError
        When a graph of the file is malformed (the graphs before it were yielded).
    """
    func = "iter_comp_graphs_from_file"
    data = _read_file(_fspath(fpath, func))
    config = _load_config(comp_node_mapper, tensor_value_loader, func)
    for res in iter_graphs(data, config):
        yield _finish(res)
