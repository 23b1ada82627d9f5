"""Shared plumbing of the ``mgb.opr`` functions: SymbolVar, input canonization, configs.

Every operator function has the common signature ``f(inputs..., *, <params>, name=None,
comp_node=None, config=None, comp_graph=None, dtype=None)`` and inserts its operator through
:func:`insert_opr`, the same path the deserializer uses.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from ..errors import GraphError, MegBrainError
from ..graph import OPR_REGISTRY, OperatorNodeConfig, VarNode, infer_shape, infer_value

__all__ = [
    "SymbolVar",
    "as_var",
    "canonize_input_vars",
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
    def owner_opr(self):
        from .operator_handle import Operator

        return Operator(self.node.owner)

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
        """The statically inferred shape as a tuple (raises if it is dynamic)."""
        return infer_shape(self.node)

    @property
    def inferred_value(self) -> np.ndarray | None:
        """A copy of the statically inferred value, or None."""
        return infer_value(self.node)

    @property
    def shape(self) -> SymbolVar:
        """The shape as a symbolic var (GetVarShape)."""
        from .tensor_manip import get_var_shape

        return get_var_shape(self)

    @property
    def ndim(self) -> int:
        return len(self.imm_shape)

    @property
    def eager_val(self):
        ev = self.node.graph.eager_evaluator
        return None if ev is None else ev.value_proxy(self.node)

    def axis_shape(self, axis: int) -> SymbolVar:
        from .tensor_manip import get_var_shape

        return get_var_shape(self, axis=axis)

    def rename(self, name: str) -> SymbolVar:
        self.node.name = str(name)
        self.node.name_given = True
        return self

    def _is_shared_device_tensor(self) -> bool:
        return self.node.owner.type_name == "SharedDeviceTensor"

    # ---- methods --------------------------------------------------------------------------
    def reshape(self, *shape) -> SymbolVar:
        from .tensor_manip import reshape

        return reshape(self, _unpack_shape(shape))

    def broadcast(self, *shape) -> SymbolVar:
        from .tensor_manip import broadcast

        return broadcast(self, _unpack_shape(shape))

    def flatten(self) -> SymbolVar:
        return self.reshape(-1)

    def dimshuffle(self, *pattern, ndim: int = 0) -> SymbolVar:
        from .tensor_manip import dimshuffle

        if len(pattern) == 1 and isinstance(pattern[0], (list, tuple)):
            pattern = tuple(pattern[0])
        return dimshuffle(self, pattern, ndim=ndim)

    def astype(self, dtype) -> SymbolVar:
        from .basic_arith import typecvt

        return typecvt(self, dtype)

    def fill_retain_dtype(self, value) -> SymbolVar:
        from .basic_arith import fill_retain_dtype

        return fill_retain_dtype(self, value)

    def _reduce(self, mode, axis, keepdims):
        from .basic_arith import reduce_

        return reduce_(self, mode, axis, keepdims)

    def sum(self, axis=None, keepdims=False):
        return self._reduce("SUM", axis, keepdims)

    def max(self, axis=None, keepdims=False):
        return self._reduce("MAX", axis, keepdims)

    def min(self, axis=None, keepdims=False):
        return self._reduce("MIN", axis, keepdims)

    def prod(self, axis=None, keepdims=False):
        return self._reduce("PRODUCT", axis, keepdims)

    def mean(self, axis=None, keepdims=False):
        from .basic_arith import mean

        return mean(self, axis, keepdims)

    def __getitem__(self, idx):
        from .indexing import subtensor_getitem

        return subtensor_getitem(self, idx)

    # ---- arithmetic -----------------------------------------------------------------------
    def _ew(self, mode, *others, rev=False):
        from .basic_arith import elemwise

        args = (*others, self) if rev else (self, *others)
        return elemwise(*args, mode=mode)

    def _binary_opr(self, mode, rhs):
        """``elemwise([self, rhs], mode)``; the binding's entry point behind the operators."""
        return self._ew(mode, rhs)

    def _binary_opr_lhs(self, mode, lhs):
        """``elemwise([lhs, self], mode)``."""
        return self._ew(mode, lhs, rev=True)

    def __add__(self, o):
        return self._ew("ADD", o)

    def __radd__(self, o):
        return self._ew("ADD", o, rev=True)

    def __sub__(self, o):
        return self._ew("SUB", o)

    def __rsub__(self, o):
        return self._ew("SUB", o, rev=True)

    def __mul__(self, o):
        return self._ew("MUL", o)

    def __rmul__(self, o):
        return self._ew("MUL", o, rev=True)

    def __truediv__(self, o):
        return self._ew("TRUE_DIV", o)

    def __rtruediv__(self, o):
        return self._ew("TRUE_DIV", o, rev=True)

    def __floordiv__(self, o):
        return self._ew("FLOOR_DIV", o)

    def __rfloordiv__(self, o):
        return self._ew("FLOOR_DIV", o, rev=True)

    def __mod__(self, o):
        return self._ew("MOD", o)

    def __rmod__(self, o):
        return self._ew("MOD", o, rev=True)

    def __pow__(self, o):
        return self._ew("POW", o)

    def __rpow__(self, o):
        return self._ew("POW", o, rev=True)

    def __lshift__(self, o):
        return self._ew("SHL", o)

    def __rshift__(self, o):
        return self._ew("SHR", o)

    def __rlshift__(self, o):
        return self._ew("SHL", o, rev=True)

    def __rrshift__(self, o):
        return self._ew("SHR", o, rev=True)

    def __lt__(self, o):
        return self._ew("LT", o)

    def __le__(self, o):
        return self._ew("LEQ", o)

    def __gt__(self, o):
        return self._ew("LT", o, rev=True)

    def __ge__(self, o):
        return self._ew("LEQ", o, rev=True)

    def __neg__(self):
        return self._ew("NEGATE")

    def __abs__(self):
        return self._ew("ABS")

    def __matmul__(self, o):
        from .blas import matrix_mul

        return matrix_mul(self, o)

    def __rmatmul__(self, o):
        from .blas import matrix_mul

        return matrix_mul(o, self)


def _unpack_shape(shape):
    if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
        return shape[0]
    return shape


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


def canonize_input_vars(
    inputs: Sequence, *, comp_graph=None, config: OperatorNodeConfig | None = None, dtype=None
) -> list[VarNode]:
    """Turn operator inputs into vars of one graph.

    SymbolVars pass through; objects carrying a var (``__mgb_symvar__``, a ``symvar``
    property, ``symvar(graph)`` of SharedND, ``_as_sym_var`` of SharedScalar) give theirs;
    numbers and arrays become ImmutableTensors with the dtype of the first var input
    (``to_mgb_supported_dtype`` otherwise). The graph is ``comp_graph``, else that of the
    first SymbolVar, else that of the first object already carrying a var; with none of
    these it must be given, with a comp node in ``config``.
    """
    graph = comp_graph
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
        raise GraphError(
            "can not infer the computing graph: no input is a SymbolVar or carries one; pass "
            "comp_graph="
        )
    out = []
    for x in inputs:
        v = as_var(x, graph, config)
        if v is None and hasattr(x, "_as_sym_var"):
            cn = ref.comp_node if ref is not None else _config_cn(config)
            v = as_var(x._as_sym_var(graph.api_graph(), cn))
        if v is not None and ref is None:
            ref = v
        out.append(v)
    for i, (x, v) in enumerate(zip(inputs, out)):
        if v is None:
            cn = ref.comp_node if ref is not None else _config_cn(config)
            dt = dtype if dtype is not None else (ref.dtype if ref is not None else None)
            from .io import make_immutable

            v = out[i] = make_immutable(cn, graph, x, dtype=dt).node
        if v.graph is not graph:
            raise GraphError(
                f"input var {v.name!r} belongs to graph #{v.graph.id}, expected #{graph.id}"
            )
    return out


def _config_cn(config):
    if config is None or not config.comp_nodes:
        raise GraphError("no input is a SymbolVar: comp_node must be given")
    return config.comp_nodes[0]


def insert_opr(opr) -> list[SymbolVar]:
    """Insert an operator built on vars of one graph; return its outputs as SymbolVars."""
    if not opr.inputs:
        raise GraphError(f"{opr.type_name}: source operators must be inserted into a graph")
    graph = opr.inputs[0].graph
    return [SymbolVar(v) for v in graph.insert_opr(opr)]


def create_opr(type_name: str, inputs: Sequence[VarNode], param, config) -> list[SymbolVar]:
    """Create an operator by registry name, exactly as the deserializer does."""
    cls = OPR_REGISTRY.get(type_name)
    if cls is None:
        raise MegBrainError(f"unknown operator type {type_name!r}")
    return insert_opr(cls(list(inputs), param, config))
