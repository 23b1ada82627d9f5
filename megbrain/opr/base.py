"""Shared plumbing of the ``mgb.opr`` functions: SymbolVar (its operator methods are bound by
``symbolvar_methods`` once the families are loaded), input canonization, constants, configs.

Every operator function has the common signature ``f(inputs..., *, <params>, name=None,
comp_node=None, config=None, comp_graph=None, dtype=None)`` and inserts its operator through
:func:`insert_opr`, the same path the deserializer uses.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Iterable, Sequence

import numpy as np

from ..device import CompNode
from ..dtype import canonize_dtype, convert_array, to_mgb_supported_dtype
from ..errors import ConversionError, GraphError, MegBrainError, set_entry_point_resolver
from ..graph import (
    OPR_REGISTRY,
    ComputingGraph,
    OperatorNodeBase,
    OperatorNodeConfig,
    VarNode,
    infer_shape,
    infer_value,
)

__all__ = [
    "SymbolVar",
    "as_var",
    "canonize_input_vars",
    "check_graph",
    "entry_point_name",
    "input_list",
    "make_immutable",
    "make_opr_config",
    "insert_opr",
    "create_opr",
]


class SymbolVar:
    """The Python handle of a var: properties, operator overloads, methods.

    ``==`` and ``hash`` compare (graph, var id): they do **not** build an elementwise EQ.
    """

    __slots__ = ("node", "__weakref__")

    # A NumPy array or scalar on the left of an operator would otherwise take over
    # (``ndarray + var`` became an object array of per-element vars): this makes NumPy's
    # operators return NotImplemented, so Python calls the reflected method of the var, and
    # ufuncs (``np.add(a, var)``) refuse vars instead of iterating them.
    __array_ufunc__ = None
    __array_priority__ = 1000

    def __init__(self, node: VarNode):
        if isinstance(node, SymbolVar):
            node = node.node
        self.node = node

    # ---- identity -------------------------------------------------------------------------
    def __eq__(self, other) -> bool:
        if isinstance(other, SymbolVar):
            return self.node is other.node
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.node.graph.id, self.node.id))

    def __repr__(self) -> str:
        return f"SymbolVar(id={self.node.id},name={self.node.name})"

    def __iter__(self):
        raise NotImplementedError("SymbolVar can not be iterated")

    # No __bool__ and no __len__: a SymbolVar is always true, like any object of the reference's
    # binding, and MegEngine's layer writes ``if var:`` for "is not None".

    # ---- properties -----------------------------------------------------------------------
    @property
    def owner_graph(self):
        return self.node.graph.api_graph()

    @property
    def comp_node(self):
        return self.node.comp_node

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def id(self) -> int:
        return self.node.id

    @property
    def dtype(self) -> np.dtype:
        return self.node.dtype

    @property
    def valid(self) -> bool:
        return self.node is not None

    @property
    def volatile(self) -> bool:
        return self.node.owner.type_name != "SharedDeviceTensor"

    @property
    def imm_shape(self) -> tuple:
        """The var's current shape, as MegBrain's ``_get_imm_shape``: the statically inferred
        one, else the shape the last run computed, else ``()`` (never raises)."""
        try:
            shp = infer_shape(self.node)
        except MegBrainError:  # dynamic, or an input without a value yet
            shp = self.node.rt_shape
        return () if shp is None else tuple(shp)

    @property
    def inferred_value(self) -> np.ndarray | None:
        """A copy of the statically inferred value, or None."""
        return infer_value(self.node)

    @property
    def ndim(self) -> int:
        return len(self.imm_shape)

    @property
    def eager_val(self):
        ev = self.node.graph.eager_evaluator
        return None if ev is None else ev.value_proxy(self.node)

    def rename(self, name: str) -> SymbolVar:
        self.node.name = str(name)
        self.node.name_given = True
        return self

    def _is_shared_device_tensor(self) -> bool:
        return self.node.owner.type_name == "SharedDeviceTensor"


def make_opr_config(name=None, comp_node=None, output_dtype=None) -> OperatorNodeConfig:
    """An :class:`OperatorNodeConfig`; ``comp_node`` may be a str, CompNode or an iterable."""
    cfg = OperatorNodeConfig()
    if name is not None:
        cfg.name(name)
    if comp_node is not None:
        if isinstance(comp_node, Iterable) and not isinstance(comp_node, str):
            cfg.comp_node_arr(list(comp_node))
        else:
            cfg.comp_node(comp_node)
    if output_dtype is not None:
        cfg.output_dtype(output_dtype)
    return cfg


def _merge_config(name, comp_node, config, dtype=None) -> OperatorNodeConfig:
    if config is None:
        return make_opr_config(name, comp_node, dtype)
    if name is not None:
        config.name(name)
    if comp_node is not None:
        config.comp_node(comp_node)
    if dtype is not None:
        config.output_dtype(dtype)
    return config


def as_var(x, graph=None, config: OperatorNodeConfig | None = None) -> VarNode | None:
    """The VarNode ``x`` is or carries, else None (a plain value).

    Besides SymbolVar and VarNode, objects that carry a var are resolved: ``__mgb_symvar__``
    (MegEngine's Tensor) and a ``symvar`` property; with ``graph`` given also
    ``symvar(graph)`` (SharedND). Without ``graph`` an object gives the var it already has.
    """
    if isinstance(x, SymbolVar):
        return x.node
    if isinstance(x, VarNode):
        return x
    if x is None or isinstance(x, (int, float, np.ndarray, np.generic, str, list, tuple)):
        return None
    api_graph = None if graph is None else graph.api_graph()
    if hasattr(x, "__mgb_symvar__"):
        cn = config.comp_nodes[0] if config is not None and config.comp_nodes else None
        return as_var(x.__mgb_symvar__(comp_graph=api_graph, comp_node=cn))
    sv = getattr(type(x), "symvar", None)
    if isinstance(sv, property):
        return as_var(x.symvar)
    if callable(sv) and api_graph is not None:
        return as_var(x.symvar(api_graph))
    return None


def _graph_of(x):
    v = as_var(x)
    if v is not None:
        return v.graph
    return None


# ---- naming the call in error messages ----------------------------------------------------
# Arguments of every operator function that configure it rather than feed it; never named as
# the bad input (they default to None, as a bad None input does).
_CONFIG_ARGS = frozenset({"name", "comp_node", "config", "comp_graph", "dtype", "param", "self"})
# Public functions and methods of the binding that reach canonize_input_vars or a graph
# check; with the mgb.opr functions they are the names an error may blame.
# Methods are matched by qualified name: internal code calls methods of the same short name
# (``TensorND.resize``) that must not be blamed.
_API_ENTRY_POINTS = frozenset(
    {
        "make_shared", "make_arg", "make_immutable", "grad", "virtual_grad",
        "current_grad_target", "inter_graph_trans_var", "mark_as_input",
        "get_opr_fp_graph_exec", "CompGraph.compile", "CompGraph.compile_outonly",
        "CompGraph.compile_multi_part", "AsyncExec.__call__", "SharedND.symvar",
        "SharedND.set_value", "SharedND.resize", "SharedND.reset_zero",
        "SharedND.copy_from_shared_sub", "SharedND.copy_to_sub_from_shared",
        "SharedND.share_memory_from", "SharedND.reset_dev_tensor", "_HostSharedND.symvar",
        "_HostSharedND.as_sym_var", "_HostSharedND.set_value",
    }
)  # fmt: skip
_entry_names: frozenset[str] | None = None


def _public_entry_names() -> frozenset[str]:
    global _entry_names
    if _entry_names is None:
        # the package's namespace is complete by the first call: it is read, not imported
        opr = sys.modules[__package__]
        fns = {n for n in opr.__all__ if inspect.isfunction(getattr(opr, n, None))}
        # the plumbing every operator function goes through blames the function above it
        fns -= {"canonize_input_vars", "insert_opr", "create_opr", "make_opr_config"}
        _entry_names = frozenset(fns | _API_ENTRY_POINTS)
    return _entry_names


def _entry_frame():
    """The frame of the outermost public megbrain function on the stack: the one the user
    called (``mean`` rather than the ``reduce_general`` it delegates to)."""
    names = _public_entry_names()
    f, best = sys._getframe(1), None
    # stop at the first frame outside megbrain: the user's code
    while f is not None and f.f_globals.get("__name__", "").partition(".")[0] == "megbrain":
        if _code_name(f.f_code) in names:
            best = f
        f = f.f_back
    return best


def _code_name(code) -> str:
    # co_qualname (Python 3.11+) tells ``SharedND.resize`` from ``TensorND.resize``
    return getattr(code, "co_qualname", code.co_name)


def entry_point_name(default: str = "operator") -> str:
    """The name of the public megbrain function the user called, for error messages.

    Parameters
    ----------
    default : str
        The name when no public function is on the stack (a call from internal code).

    Returns
    -------
    str
        For instance ``"convolution"`` while ``mgb.opr.convolution`` canonizes its inputs.
    """
    f = _entry_frame()
    return default if f is None else _code_name(f.f_code)


set_entry_point_resolver(entry_point_name)  # dtypes and tensors name the call through it


def _arg_label(frame, x, pos: int) -> str:
    """``input <pos>`` and, when the entry frame holds ``x`` in one argument, its name."""
    if frame is None:
        return f"input {pos}"
    code = frame.f_code
    params = list(code.co_varnames[: code.co_argcount])
    if code.co_flags & 0x04:  # CO_VARARGS: ``*inputs`` follows the named arguments
        params.append(code.co_varnames[code.co_argcount + code.co_kwonlyargcount])
    loc = frame.f_locals
    exact, inside = [], []
    for i, p in enumerate(params):
        if p in _CONFIG_ARGS:
            continue
        val = loc.get(p, _MISSING)
        if val is x:
            exact.append((i, p))
        elif isinstance(val, (list, tuple)):
            inside += [f"{p}[{j}]" for j, e in enumerate(val) if e is x]
    if exact:
        # a None may sit in several arguments: prefer the one at the input's position
        name = next((p for i, p in exact if i == pos), exact[0][1])
        return f"input {pos} ({name})"
    if inside:
        return f"input {pos} ({inside[0]})"
    return f"input {pos}"


_MISSING = object()
_EXPECTED_INPUT = "expected a SymbolVar, a number or a numeric array"


def _describe(x) -> str:
    """``x`` for a message: its type, and its value when short (a str)."""
    if x is None:
        return "None"
    if isinstance(x, (str, bytes)):
        return f"a {type(x).__name__} ({x!r:.40})"
    t = type(x)
    name = t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
    return f"{'an' if name[0] in 'aeiouAEIOU' else 'a'} {name}"


def _non_numeric(x) -> bool:
    """Whether ``x`` can not be an operator input (no var, no numeric array): None, a str, a
    dict or an arbitrary object."""
    if x is None or isinstance(x, (str, bytes, dict, set, frozenset)):
        return True
    if isinstance(x, (int, float, complex, np.ndarray, np.generic)):
        return False
    try:
        return np.asarray(x).dtype == object
    except Exception:  # noqa: BLE001 - anything numpy can not take is not an input
        return True


def _bad_input_error(what: str, label: str, x, cause: Exception | None = None):
    msg = f"{what}: {label} is {_describe(x)}; {_EXPECTED_INPUT}"
    if cause is not None:
        msg += f" ({cause})"
    return ConversionError(msg)


def check_graph(graph, what: str | None = None, arg: str = "comp_graph"):
    """``graph`` if it is a computing graph, else a TypeError naming the call and argument.

    Parameters
    ----------
    graph
        The value given for a graph argument.
    what : str, optional
        The function to blame; by default the public function on the call stack.
    arg : str
        The argument's name in the function checking; when the public function called is
        another one (``make_shared`` reaching ``shared_device_tensor``), the message says
        ``comp_graph``, the name every public function gives it.

    Returns
    -------
    ComputingGraph
        ``graph`` itself.

    Raises
    ------
    TypeError
        When ``graph`` is not a ComputingGraph (the API's CompGraph is one).
    """
    if isinstance(graph, ComputingGraph):
        return graph
    if what is None:
        caller = sys._getframe(1).f_code.co_name
        what = entry_point_name(caller)
        if what != caller:
            arg = "comp_graph"
    raise TypeError(
        f"{what}: {arg} must be a CompGraph (from mgb.comp_graph()), got {_describe(graph)}"
    )


def canonize_input_vars(
    inputs: Sequence,
    *,
    comp_graph=None,
    config: OperatorNodeConfig | None = None,
    dtype=None,
    what: str | None = None,
    names: Sequence[str] | None = None,
) -> list[VarNode]:
    """Turn operator inputs into vars of one graph.

    SymbolVars pass through; objects carrying a var (``__mgb_symvar__``, a ``symvar``
    property, ``symvar(graph)`` of SharedND, ``_as_sym_var`` of SharedScalar) give theirs;
    numbers and arrays become ImmutableTensors with the dtype of the first var input
    (``to_mgb_supported_dtype`` otherwise). The graph is ``comp_graph``, else that of the
    first SymbolVar, else that of the first object already carrying a var; with none of
    these it must be given, with a comp node in ``config``.

    Parameters
    ----------
    inputs : sequence
        The inputs, in the operator's order.
    comp_graph : CompGraph, optional
        The graph, when no input carries one.
    config : OperatorNodeConfig, optional
        The operator's config; its comp node places constants made from plain values.
    dtype : optional
        The dtype of constants made from plain values.
    what : str, optional
        The function named in error messages; by default the public megbrain function on the
        call stack (the one the user called).
    names : sequence of str, optional
        The argument names of ``inputs``, for error messages; by default found by matching
        the arguments of that function.

    Raises
    ------
    ConversionError
        When an input is None, a str, a dict or another value that is neither a var nor
        numeric; the message names the function, the input's position and argument.
    TypeError
        When ``comp_graph`` is not a computing graph.
    GraphError
        When the graph can not be inferred, or inputs belong to different graphs.
    """
    if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Iterable):
        what = what or entry_point_name("canonize_input_vars")
        raise TypeError(f"{what}: inputs must be a sequence of vars, got {_describe(inputs)}")
    inputs = list(inputs)
    graph = comp_graph
    if graph is not None:
        check_graph(graph, what or entry_point_name("canonize_input_vars"))
    ref = None
    for x in inputs:
        if isinstance(x, (SymbolVar, VarNode)):
            ref = as_var(x)
            if graph is None:
                graph = ref.graph
            break
    if graph is None:
        for x in inputs:
            v = as_var(x, None, config)
            if v is not None:
                graph = v.graph
                break
    if graph is None:
        _raise_no_graph(inputs, what, names)
    out = []
    for x in inputs:
        v = as_var(x, graph, config)
        if v is None and hasattr(x, "_as_sym_var"):
            cn = ref.comp_node if ref is not None else _config_cn(config, what)
            v = as_var(x._as_sym_var(graph.api_graph(), cn))
        if v is not None and ref is None:
            ref = v
        out.append(v)
    for i, (x, v) in enumerate(zip(inputs, out)):
        if v is None:
            if _non_numeric(x):
                raise _bad_input(inputs, i, what, names)
            cn = ref.comp_node if ref is not None else _config_cn(config, what)
            dt = dtype if dtype is not None else (ref.dtype if ref is not None else None)
            try:
                v = out[i] = make_immutable(cn, graph, x, dtype=dt).node
            except (ConversionError, TypeError, ValueError, OverflowError) as exc:
                # make_immutable's own message names the call again: give numpy's reason
                raise _bad_input(inputs, i, what, names, exc.__cause__ or exc) from exc
        if v.graph is not graph:
            what = what or entry_point_name("canonize_input_vars")
            raise GraphError(
                f"{what}: input {i} (var {v.name!r}) belongs to graph #{v.graph.id}, expected "
                f"#{graph.id}; every input must be a var of one graph"
            )
    return out


_WIDE_DTYPES = (np.dtype(np.float64), np.dtype(np.int64))


def make_immutable(comp_node, comp_graph, value, *, dtype=None, name=None, config=None):
    """An ImmutableTensor holding ``value`` (constant, deduplicated, value-inferable).

    A scalar becomes shape (1,), as MegBrain has no 0-d tensors.

    Raises
    ------
    TypeError
        When ``comp_graph`` is not a computing graph.
    ConversionError
        When ``value`` is not numeric (None, a str, a dict, an object); the message names
        the public function called.
    """
    check_graph(comp_graph)
    try:
        if dtype is not None:
            dt = np.dtype(dtype)
            if dt in _WIDE_DTYPES:
                # 64-bit vars exist inside graphs built below the API (float64 gradient checks)
                arr = np.asarray(value, dtype=dt)
            else:
                arr = convert_array(value, canonize_dtype(dtype))
        else:
            arr = np.asarray(value)
            arr = convert_array(arr, to_mgb_supported_dtype(arr.dtype))
    except (ConversionError, TypeError, ValueError, OverflowError) as exc:
        what = entry_point_name("make_immutable")
        # for None, a str or an object the type says it all; else say why it was refused
        why = "" if _non_numeric(value) else f" ({str(exc).removeprefix(what + ': ')})"
        raise ConversionError(
            f"{what}: value is {_describe(value)}; expected a number or a numeric array{why}"
        ) from exc
    if arr.ndim == 0:
        arr = arr.reshape(1)  # MegBrain has no 0-d tensors: a scalar is shape (1,)
    cfg = _merge_config(name, None, config)
    # by registry name, as the deserializer creates operators: io registers ImmutableTensor,
    # and the constants every family makes from plain inputs start here, below the families
    opr = OPR_REGISTRY["ImmutableTensor"](arr, CompNode.load(comp_node), cfg)
    return SymbolVar(comp_graph.insert_opr(opr)[0])


def input_list(x, arg: str, what: str | None = None) -> list:
    """``list(x)`` for an argument that takes a list of vars; a TypeError naming the function
    and ``arg`` when ``x`` is not one (None, a str, a single object).

    Parameters
    ----------
    x
        The value given.
    arg : str
        The argument's name.
    what : str, optional
        The function named in the message; by default the public function on the stack.

    Returns
    -------
    list
    """
    if isinstance(x, (list, tuple)):
        return list(x)
    if isinstance(x, (str, bytes, dict)) or not isinstance(x, Iterable):
        what = what or entry_point_name(sys._getframe(1).f_code.co_name)
        raise TypeError(f"{what}: {arg} must be a list of vars, got {_describe(x)}")
    return list(x)


def _bad_input(inputs, i: int, what, names, cause=None):
    frame = _entry_frame()
    what = what or (_code_name(frame.f_code) if frame is not None else "canonize_input_vars")
    if names is not None and i < len(names):
        label = f"input {i} ({names[i]})"
    else:
        label = _arg_label(frame, inputs[i], i)
    del frame  # a frame kept alive would keep every local of the call alive
    return _bad_input_error(what, label, inputs[i], cause)


def _raise_no_graph(inputs, what, names):
    # a None or a str among the inputs is the likelier mistake than a forgotten comp_graph=
    for i, x in enumerate(inputs):
        if _non_numeric(x):
            raise _bad_input(inputs, i, what, names)
    what = what or entry_point_name("canonize_input_vars")
    raise GraphError(
        f"{what}: can not infer the computing graph: no input is a SymbolVar or carries one; "
        "pass comp_graph= and comp_node="
    )


def _config_cn(config, what: str | None = None):
    if config is None or not config.comp_nodes:
        what = what or entry_point_name("canonize_input_vars")
        raise GraphError(f"{what}: no input is a SymbolVar, so comp_node= must be given")
    return config.comp_nodes[0]


def insert_opr(opr) -> list[SymbolVar]:
    """Insert an operator built on vars of one graph; return its outputs as SymbolVars."""
    if not isinstance(opr, OperatorNodeBase):
        raise TypeError(f"insert_opr: opr must be an operator node, got {_describe(opr)}")
    if not opr.inputs:
        raise GraphError(f"{opr.type_name}: source operators must be inserted into a graph")
    graph = opr.inputs[0].graph
    return [SymbolVar(v) for v in graph.insert_opr(opr)]


def build_opr(
    cls, inputs, param, dtype=None, name=None, comp_node=None, config=None, comp_graph=None
) -> SymbolVar:
    """The output of a new ``cls(inputs, param)``: the step every operator function ends with.

    Parameters
    ----------
    cls : type
        The operator class.
    inputs : list
        Its inputs, canonized onto one graph (vars, or values made constants).
    param : ParamBase or None
        Its param.
    dtype, name, comp_node, config, comp_graph
        The operator config from the function's keywords (``dtype`` the output dtype).

    Returns
    -------
    SymbolVar
        The operator's first output.
    """
    cfg = _merge_config(name, comp_node, config, dtype)
    vars_ = canonize_input_vars(inputs, comp_graph=comp_graph, config=cfg)
    return insert_opr(cls(vars_, param, cfg))[0]


def create_opr(type_name: str, inputs: Sequence[VarNode], param, config) -> list[SymbolVar]:
    """Create an operator by registry name, exactly as the deserializer does."""
    cls = OPR_REGISTRY.get(type_name)
    if cls is None:
        raise MegBrainError(f"unknown operator type {type_name!r}")
    return insert_opr(cls(list(inputs), param, config))
