"""The operator contract: base class, params, config and registry (docs/architecture.md)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar

import numpy as np

from ..device import CompNode
from ..dtype import canonize_dtype, dtype_key
from ..errors import GraphError, MegBrainError
from . import static_infer
from .param_def import members_of
from .var import InferType, VarNode

__all__ = [
    "OPR_REGISTRY",
    "OperatorNodeBase",
    "NoGradient",
    "OperatorNodeConfig",
    "ParamBase",
    "table_param",
    "register_opr",
    "fmt_shape",
]

class NoGradient(MegBrainError):
    """Raised by an operator's ``grad`` where the gradient is not defined; the gradient walk
    puts an InvalidGrad operator in its place, which fails only when a function needs it."""


#: registry name -> operator class; the name the serializer writes.
OPR_REGISTRY: dict[str, type[OperatorNodeBase]] = {}


def register_opr(cls: type[OperatorNodeBase]) -> type[OperatorNodeBase]:
    """Class decorator: register ``cls`` under ``cls.type_name`` (default: the class name)."""
    if "type_name" not in cls.__dict__:
        cls.type_name = cls.__name__
    if cls.type_name in OPR_REGISTRY and OPR_REGISTRY[cls.type_name] is not cls:
        raise MegBrainError(f"operator {cls.type_name} registered twice")
    OPR_REGISTRY[cls.type_name] = cls
    return cls


def fmt_shape(shape) -> str:
    """``(2, 3)`` -> ``{2,3}``, MegBrain's shape notation; None -> ``<dynamic>``."""
    if shape is None:
        return "<dynamic>"
    return "{" + ",".join(str(int(s)) for s in shape) + "}"


class ParamBase:
    """Base of operator param records: frozen dataclasses whose enum fields accept names.

    A subclass lists its enum fields in ``_choices = {"field": ("NAME0", "NAME1", ...)}``; a
    value may then be given as the name in any case, as an int index, or as an object with a
    ``.name``. The stored value is the upper-case name, so params are hashable and JSON-able.
    A Param that is the operator's view of a param-def table is declared with
    :func:`table_param`, which fills in the table's fields and ``_choices``.
    """

    _choices: ClassVar[dict[str, tuple[str, ...]]] = {}
    #: the param-def table the Param is derived from (:func:`table_param`), or None
    _table: ClassVar[type | None] = None
    #: the table's fields the Param leaves out (a file must hold their defaults)
    _table_skip: ClassVar[frozenset[str]] = frozenset()

    def __post_init__(self):
        for fname, names in self._choices.items():
            v = getattr(self, fname)
            if hasattr(v, "name") and not isinstance(v, str):
                v = v.name
            if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
                if not 0 <= int(v) < len(names):
                    raise MegBrainError(
                        f"{type(self).__qualname__}: {fname}={v} out of range 0..{len(names) - 1}"
                    )
                v = names[int(v)]
            if not isinstance(v, str) or v.upper() not in names:
                raise MegBrainError(
                    f"{type(self).__qualname__}: invalid {fname}={v!r}; expected one of "
                    f"{', '.join(names)}"
                )
            object.__setattr__(self, fname, v.upper())

    def to_json(self) -> dict:
        """The param as a JSON-serializable dict."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, np.dtype):
                v = v.name
            elif isinstance(v, tuple):
                v = list(v)
            out[f.name] = v
        return out


#: the annotation of a derived field, per C type of the table (as the hand-written Params')
_FIELD_TYPES = {
    **dict.fromkeys(("int32", "uint32", "uint64"), "int"),
    **dict.fromkeys(("float32", "float64"), "float"),
    **{"bool": "bool", "dtype": "np.dtype", "enum": "str"},
}


def _table_default(field: Any) -> Any:
    """A table field's default as a Param holds it: an enum member's name, a dtype as
    ``np.dtype``, a number converted by the table's converter."""
    if field.ctype == "enum":
        return field.default
    if field.ctype == "dtype":
        return canonize_dtype(field.default)
    return field.convert(field.default)


def table_param(
    table: type, *, skip: Iterable[str] = (), **defaults: Any
) -> Callable[[type], type]:
    """Class decorator deriving a Param's fields from the param-def class ``table``.

    Applied under ``@dataclass(frozen=True)``, it adds the table's fields to the class
    before the dataclass machinery runs, in table order: each with the table's default and
    an annotation of its kind (``str`` for an enum, whose names go to ``_choices`` from
    :func:`~megbrain.graph.param_def.members_of`; ``int``, ``float``, ``bool``; a ``dtype``
    field's default as ``np.dtype``). The class body keeps what is the operator's own:

    * ``defaults`` give other defaults than the table's to some of its fields;
    * a table field annotated in the body overrides the table's (its default, its type; no
      ``_choices`` entry is added for it) and keeps its table position;
    * fields the table lacks, annotated in the body, follow the table's;
    * fields a dataclass base already has are inherited, not added again;
    * ``_choices`` of the body and of the bases are kept (the body's win).

    The table and the skipped fields are kept as ``_table`` and ``_table_skip``.

    Parameters
    ----------
    table:
        A param-def class (``megbrain.opr.param_defs.Pooling``): its ``FIELDS`` give the
        fields.
    skip:
        Table fields the Param does not have (a loaded file must hold their defaults).
    **defaults:
        ``field=default`` for table fields whose default the Param changes (an enum
        field's default by its member name).

    Returns
    -------
    callable
        The decorator; it returns the class it is given.

    Raises
    ------
    TypeError
        When ``table`` is no param-def class, ``skip`` or ``defaults`` name no field of it,
        an enum default names no member, the class is
        already a dataclass (the decorator was applied above ``@dataclass``), or the body
        sets a table field without annotating it.
    """
    fields = getattr(table, "FIELDS", None)
    if fields is None:
        raise TypeError(f"table_param: {table!r} is not a param-def class")
    skip = frozenset(skip)
    unknown = (skip | set(defaults)) - {f.name for f in fields}
    if unknown:
        raise TypeError(f"table_param: {table.__name__} has no field {', '.join(sorted(unknown))}")
    for f in fields:
        if f.enum is not None and f.name in defaults and defaults[f.name] not in members_of(f.enum):
            raise TypeError(
                f"table_param: {defaults[f.name]!r} is no member of {table.__name__}.{f.name}"
            )

    def derive(cls: type) -> type:
        if "__dataclass_fields__" in cls.__dict__:
            raise TypeError(f"{cls.__qualname__}: apply table_param under @dataclass")
        own = dict(cls.__dict__.get("__annotations__", {}))
        inherited = {n for b in cls.__mro__[1:] for n in getattr(b, "__dataclass_fields__", ())}
        annotations: dict[str, Any] = {}
        choices: dict[str, tuple[str, ...]] = {}
        for f in fields:
            if f.name in skip or f.name in inherited:
                continue
            if f.name in own:
                annotations[f.name] = own.pop(f.name)
                continue
            if f.name in cls.__dict__:
                raise TypeError(
                    f"{cls.__qualname__}: {f.name} overrides {table.__name__}.{f.name} without "
                    "an annotation"
                )
            annotations[f.name] = _FIELD_TYPES[f.ctype]
            setattr(cls, f.name, defaults[f.name] if f.name in defaults else _table_default(f))
            if f.enum is not None:
                choices[f.name] = members_of(f.enum)
        cls.__annotations__ = {**annotations, **own}
        own_choices = cls.__dict__.get("_choices", {})
        cls._choices = {**super(cls, cls)._choices, **choices, **own_choices}
        cls._table = table
        cls._table_skip = skip
        return cls

    return derive


class OperatorNodeConfig:
    """Per-operator configuration: name, comp node(s) and output dtype.

    The setters return ``self`` so they chain, as in the reference binding.
    """

    def __init__(self, name: str | None = None, comp_node=None, output_dtype=None):
        self._name = name
        self._comp_nodes: tuple = ()
        self._output_dtype = None
        if comp_node is not None:
            self.comp_node(comp_node)
        if output_dtype is not None:
            self.output_dtype(output_dtype)

    def name(self, name: str) -> OperatorNodeConfig:
        self._name = str(name)
        return self

    def comp_node(self, cn) -> OperatorNodeConfig:
        self._comp_nodes = (CompNode.load(cn),)
        return self

    def comp_node_arr(self, cns: Sequence) -> OperatorNodeConfig:
        self._comp_nodes = tuple(CompNode.load(c) for c in cns)
        return self

    def require_comp_node(self):
        """The single comp node of this config; raises unless exactly one is set."""
        if len(self._comp_nodes) != 1:
            raise MegBrainError(
                f"operator config requires exactly one comp node, got {len(self._comp_nodes)}"
            )
        return self._comp_nodes[0]

    def output_dtype(self, dtype) -> OperatorNodeConfig:
        self._output_dtype = canonize_dtype(dtype)
        return self

    @property
    def name_value(self) -> str | None:
        return self._name

    @property
    def comp_nodes(self) -> tuple:
        return self._comp_nodes

    @property
    def dtype_value(self):
        return self._output_dtype

    def hash_key(self) -> tuple:
        # dtype_key: numpy's dtype equality ignores quantization parameters
        return (self._comp_nodes, dtype_key(self._output_dtype))


class OperatorNodeBase:
    """Base class of every operator.

    Subclasses set ``type_name`` (via :func:`register_opr`), ``Param`` and override:

    * :meth:`infer_dtypes` -- output dtypes from input dtypes (default: input 0's dtype);
    * :meth:`infer_shapes` -- static shape inference from input shapes, plus the values of the
      inputs listed in ``value_deps``;
    * :meth:`bind` -- return a zero-argument closure computing into the given output arrays;
    * optionally :meth:`fwd_views` -- outputs that are read-only views of inputs (no memory,
      no work at run time), :meth:`inplace_input`, :meth:`input_parts`, :meth:`infer_value`
      and :meth:`grad`.

    Class attributes describing how inputs are used:

    * ``value_deps``: inputs whose *values* the shape inference needs;
    * ``static_only_inputs``: inputs that :meth:`bind` never reads (their value only decides
      the output shape), so they are not computed at run time when statically inferable;
    * ``shape_only_inputs``: inputs of which only the shape is used (GetVarShape);
    * ``value_inferable``: whether outputs' values may be inferred by running the kernel on
      inferred input values (False for random or side-effecting operators);
    * ``dynamic_output_shape``: the output shape is only known after running (CondTake);
    * ``dedup``: whether an identical insertion returns the existing operator.
    """

    type_name: ClassVar[str] = ""
    Param: ClassVar[type | None] = None
    value_deps: ClassVar[tuple[int, ...]] = ()
    static_only_inputs: ClassVar[tuple[int, ...]] = ()
    shape_only_inputs: ClassVar[tuple[int, ...]] = ()
    value_inferable: ClassVar[bool] = True
    dynamic_output_shape: ClassVar[bool] = False
    dedup: ClassVar[bool] = True
    nr_outputs: ClassVar[int] = 1
    #: operators writing into memory they do not own (AddUpdate): never pruned or deduplicated
    has_side_effect: ClassVar[bool] = False
    #: sources whose buffers may change between runs: the executor compares
    #: :meth:`runtime_state` before each run and re-plans when it changed
    has_runtime_state: ClassVar[bool] = False
    #: the kernel asks for scratch memory (``kernels.workspace.empty``) when bound; the
    #: executor measures it and places it in the static memory plan
    uses_workspace: ClassVar[bool] = False
    #: False: a changed runtime state is an error (:meth:`state_change_error`), not a re-plan
    replan_on_change: ClassVar[bool] = True
    #: output 0 holds the inputs side by side (Concat): see :meth:`input_parts`
    has_input_parts: ClassVar[bool] = False
    #: eager graphs: the value may be stale (an input operator re-ran since) / the operator is
    #: or reads a source whose value changes outside the graph (re-run at every re-insertion)
    eager_stale: bool = False
    eager_always_rerun: bool = False

    def __init__(self, inputs: Sequence[VarNode], param=None, config: OperatorNodeConfig = None):
        self.inputs: list[VarNode] = list(inputs)
        self.param = param
        self.config = config if config is not None else OperatorNodeConfig()
        self.outputs: list[VarNode] = []
        self.graph = None
        self.id = -1
        self.name = ""
        self.priority = 0
        self.tracker = None
        self.extra_deps: list[VarNode] = []
        #: position in the comp seq order among equal priorities; clones keep the original's
        self.order_key = -1

    # ---- hooks for subclasses -------------------------------------------------------------
    def infer_dtypes(self, in_dtypes: list[np.dtype]) -> list[np.dtype]:
        """Output dtypes. Default: every output has input 0's dtype (or the config dtype)."""
        dt = self.config.dtype_value
        if dt is None:
            if not in_dtypes:
                raise MegBrainError(f"{self.type_name}: output dtype must be given")
            dt = in_dtypes[0]
        return [dt] * self.nr_outputs

    def infer_comp_node(self):
        """The comp node outputs live on: the config's, else input 0's."""
        if self.config.comp_nodes:
            return self.config.comp_nodes[0]
        if not self.inputs:
            raise MegBrainError(f"{self.type_name}: comp node must be given for a source opr")
        return self.inputs[0].comp_node

    def infer_shapes(self, in_shapes: list[tuple], in_values: dict[int, np.ndarray]) -> list:
        """Output shapes from input shapes (and values of ``value_deps``)."""
        raise NotImplementedError

    def bind(self, ins: list[np.ndarray], outs: list[np.ndarray]) -> Callable[[], None]:
        """A closure computing the outputs into ``outs`` from ``ins`` (run on every execution)."""
        raise NotImplementedError

    def fwd_views(self, ins: list[np.ndarray]) -> list[np.ndarray | None] | None:
        """Outputs that are views of inputs (memory forwarding); None where not forwarded."""
        return None

    def inplace_input(self) -> int | None:
        """Index of an input output 0 may overwrite when it is that memory's last reader."""
        return None

    def input_parts(self, in_shapes: list[tuple], out_shape: tuple) -> list[int | None] | None:
        """For operators with ``has_input_parts``: where each input's values lie in output 0,
        as the element offset of one C-contiguous range of it (None where they do not form
        one). The static memory plan may then make an input a view of its range, its
        producer writing there; :meth:`bind` must skip copying an input that already is its
        range. Default: None."""
        return None

    def run_dynamic(self, ins: list) -> list[np.ndarray]:
        """Run once on concrete input arrays (shapes inferred from them), allocating outputs.

        The path for operators whose shapes are only known at run time, and for eager
        evaluation; forwarded outputs are views of the inputs.
        """
        in_shapes = [None if a is None else a.shape for a in ins]
        in_values = {i: ins[i] for i in self.value_deps if i < len(ins)}
        shapes = self.infer_shapes(in_shapes, in_values)
        views = self.fwd_views(ins)
        outs = []
        for k, (shp, v) in enumerate(zip(shapes, self.outputs)):
            view = None if views is None else views[k]
            outs.append(view if view is not None else np.empty(tuple(shp), v.dtype))
        if self.has_side_effect or views is None or any(x is None for x in views):
            self.bind(ins, outs)()
        return outs

    def infer_value(self, in_values: list[np.ndarray], out_shapes: list[tuple]) -> list:
        """Static value inference; default: run the kernel on the inferred input values."""
        outs = [np.empty(s, d) for s, d in zip(out_shapes, self.out_dtypes)]
        views = self.fwd_views(in_values)
        if views is not None and all(v is not None for v in views):
            return [np.array(v) for v in views]
        self.bind(in_values, outs)()
        return outs

    def grad(self, wrt_idx: int, out_grads: list):
        """Symbolic gradient w.r.t. input ``wrt_idx``; None means no gradient (zero).

        Raises :class:`NoGradient` where the gradient is not defined (the default).
        """
        raise NoGradient(f"operator {self.type_name} ({self.name}) has no gradient")

    def add_input_layout_constraint(self) -> None:
        """Called for each operator of a function's comp seq when it is compiled, before
        anything is planned; raising refuses the compile (InvalidGrad). Default: nothing."""

    def shape_tracked(self) -> bool:
        """For sources: whether every change of the output shape bumps
        ``TensorND.layout_epoch`` (static inference then re-reads the shape only after a
        bump). Default: False (re-read at every check)."""
        return False

    def source_infer(self) -> list[tuple[InferType, InferType]]:
        """For operators without inputs: (shape type, value type) of each output."""
        return [(InferType.CONST, InferType.CONST)] * self.nr_outputs

    def overwrites(self) -> VarNode | None:
        """An input whose memory this operator updates in place (AddUpdate's dest).

        The comp seq runs every other reader of that var first, and refuses an operator that
        would read both the old and the updated value. Operators updating several inputs
        override :meth:`overwritten_inputs` instead.
        """
        return None

    def overwritten_inputs(self) -> tuple[VarNode, ...]:
        """Every input whose memory this operator updates in place (BatchNorm's running
        statistics); by default the one :meth:`overwrites` names. The outputs holding the
        updated values are :meth:`fwd_views` of those inputs, and the operator must set
        ``has_side_effect`` so that it is bound whatever the memory options."""
        w = self.overwrites()
        return () if w is None else (w,)

    def clone(self, inputs: list[VarNode]) -> OperatorNodeBase:
        """A copy of this operator (same param, config and state) over ``inputs``."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.inputs = list(inputs)
        new.outputs = []
        new.graph = None
        new.id = -1
        new.name = "" if self.config.name_value is None else self.name
        new.extra_deps = list(self.extra_deps)
        return new

    def on_func_compiled(self, func, used_outputs: list[int]) -> Callable[[], None] | None:
        """Called by ``ComputingGraph.compile`` for each operator of the new function, with
        the indices of the outputs it needs; may return a callable that the graph runs once
        when that function is invalidated (a later compile) or freed; it must not hold the
        function or its graph (that would keep the function alive). Default: nothing."""
        return None

    def runtime_state(self, watch_value: bool = False):
        """What a plan bound into closures from this source (shape, buffer, watched value).

        May raise to refuse a change (a non-volatile SharedDeviceTensor).
        """
        return None

    def state_change_error(self, old, new) -> MegBrainError:
        """The error raised when a source with ``replan_on_change=False`` changed."""
        return MegBrainError(f"{self.type_name} {self.name!r}: runtime state changed")

    def default_name(self) -> str:
        """The operator name when the config gives none."""
        mode = getattr(self.param, "mode", None)
        head = str(mode) if isinstance(mode, str) else self.type_name
        args = ",".join(v.name for v in self.inputs)
        if len(args) > 48:
            args = args[:45] + "..."
        return f"{head}({args})"

    # ---- helpers --------------------------------------------------------------------------
    @property
    def out_dtypes(self) -> list[np.dtype]:
        return [v.dtype for v in self.outputs]

    @property
    def comp_node(self):
        return self.outputs[0].comp_node if self.outputs else self.infer_comp_node()

    def hash_key(self) -> tuple:
        """Identity for deduplication: type, param and inputs (and comp node / dtype config)."""
        return (
            type(self),
            self.param,
            tuple(v.id for v in self.inputs),
            tuple(v.id for v in self.extra_deps),
            self.config.hash_key(),
        )

    def error(self, msg: str, cls=MegBrainError) -> MegBrainError:
        """An error naming this operator and its inputs' shapes and dtypes."""
        parts = []
        for i, v in enumerate(self.inputs):
            try:
                shp = fmt_shape(static_infer.infer_shape(v))
            except Exception:  # noqa: BLE001 - describing the error must not raise
                shp = "<unknown>"
            parts.append(f"  input {i}: {v.name} {shp} {v.dtype}")
        desc = "\n".join(parts)
        full = f"{self.type_name} {self.name!r}: {msg}" + (f"\n{desc}" if desc else "")
        err = cls(full)
        err.tracker = self.tracker
        return err

    def check_input_count(self, n: int | tuple[int, int]):
        lo, hi = (n, n) if isinstance(n, int) else n
        if not lo <= len(self.inputs) <= hi:
            raise GraphError(f"{self.type_name}: expected {n} inputs, got {len(self.inputs)}")

    def __repr__(self) -> str:
        return f"Operator(id={self.id},name={self.name})"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": self.type_name,
            "name": self.name,
            "param": self.param.to_json() if isinstance(self.param, ParamBase) else None,
            "inputs": [v.id for v in self.inputs],
            "outputs": [v.id for v in self.outputs],
            "priority": self.priority,
        }
