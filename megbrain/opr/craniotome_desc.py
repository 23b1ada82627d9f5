"""The descriptor side of operators defined in Python: :class:`CraniotomeBase`, whose
subclasses describe an operator (counts, ``infer_shape``, ``execute``, optional ``grad``), and
the :func:`make_opr` decorator, and their serialization (:func:`register_loader`). The
operator running a descriptor is :class:`megbrain.opr.craniotome.Craniotome`.
"""

from __future__ import annotations

import abc
import copy as _copy
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import GraphError, MegBrainError, SerializationError
from ..graph import ComputingGraph
from ..serialization import sereg
from .base import SymbolVar, _merge_config, canonize_input_vars
from .craniotome import (
    _STATE,
    Craniotome,
    CraniotomeClassError,
    _default_hook,
    _desc_counts,
    _DescState,
)

__all__ = ["CraniotomeBase", "make_opr", "register_loader"]


# ---- the descriptor base class ----------------------------------------------------------
# names a subclass may define although the base does not have them
_KEY_WHITELIST = frozenset(
    {
        "__classcell__",
        "__annotations__",
        "__annotate__",
        "__firstlineno__",
        "__static_attributes__",
        "__orig_bases__",
        "__type_params__",
        "__parameters__",
    }
)


class _CraniotomeMeta(abc.ABCMeta):
    """Checks subclasses of :class:`CraniotomeBase` when they are defined."""

    def __init__(cls, name, bases, member_dict):
        if any(isinstance(b, _CraniotomeMeta) for b in bases):
            base = _base_class()
            if "__init__" in member_dict:
                raise CraniotomeClassError(
                    f"craniotome class {name}: operators must not override __init__; "
                    "use setup() to take the arguments of make()"
                )
            forbidden = {k for k in dir(base) if k.startswith("_") and not k.startswith("__")}
            forbidden.add("get_io_vars")
            check_key = member_dict.get("__check_key__", True)
            for k in member_dict:
                if k in forbidden:
                    raise CraniotomeClassError(
                        f"craniotome class {name}: {k} belongs to CraniotomeBase and can not "
                        "be overridden"
                    )
                if (
                    check_key
                    and k.startswith("__")
                    and k.endswith("__")
                    and k not in _KEY_WHITELIST
                    and not hasattr(base, k)
                ):
                    # a misspelled flag (__nr_input__) would otherwise be silently ignored
                    raise KeyError(
                        f"name {k} in craniotome class {name} does not exist in CraniotomeBase "
                        "(set __check_key__ = False to allow it)"
                    )
        super().__init__(name, bases, member_dict)


def _base_class():
    return CraniotomeBase


class CraniotomeBase(metaclass=_CraniotomeMeta):
    """Base class of operators implemented in Python.

    A subclass defines ``__nr_inputs__``, ``__nr_outputs__`` (class attributes, or instance
    attributes set in :meth:`setup`) and :meth:`execute`, plus :meth:`infer_shape` unless
    ``__is_dynamic_output_shape__``. :meth:`make` (or :func:`make_opr`) inserts the operator.

    Subclasses may not override ``__init__`` (use :meth:`setup`), :meth:`get_io_vars` or
    the base's private ``_x`` names. A name of the form ``__x__`` that the base does not have
    raises KeyError at class definition (a misspelled flag), unless the class sets
    ``__check_key__ = False``.

    Deduplication: two insertions with equal inputs whose descriptors are of the same class
    and compare equal (``==``, with a matching ``__hash__``) give one operator. The default
    (identity) makes each :meth:`make` a new operator.
    """

    #: whether :meth:`make` returns a single var (not a 1-tuple) for one output
    __expand_single_outputs__: bool = True
    #: the output shapes are only known after :meth:`execute` (then ``infer_shape`` is not
    #: needed, except for operators without inputs, where it is asked before each run)
    __is_dynamic_output_shape__: bool = False
    #: the reference's outputs not allocated by the system; accepted, but outputs still live
    #: in the static memory plan and what ``set_value`` writes is copied there
    __disable_sys_mem_alloc__: bool = False
    #: whether graph optimizations may duplicate the operator (sublinear memory)
    __allow_duplicate__: bool = True
    #: whether outputs may be empty (a zero dimension, or left unset when dynamic)
    __allow_empty_out__: bool = False
    #: check ``__x__`` names of subclasses against the base (see the class docstring)
    __check_key__: bool = True

    @property
    @abc.abstractmethod
    def __nr_inputs__(self) -> int:
        """Number of input vars."""

    @property
    @abc.abstractmethod
    def __nr_outputs__(self) -> int:
        """Number of output vars."""

    def __init__(self):
        self.__dict__[_STATE] = _DescState()

    # ---- to be overridden -------------------------------------------------------------------
    @abc.abstractmethod
    def execute(self, inputs: tuple, outputs: tuple) -> None:
        """Compute the outputs.

        Parameters
        ----------
        inputs : tuple of CompGraphCallbackValueProxy
            The input values (``get_value()``), valid while ``execute`` runs.
        outputs : tuple of CraniotomeOutput
            The outputs: write them with ``set_value`` (SharedND's interface). With static
            shapes each already has its inferred shape, which must not change.
        """

    def setup(self, **kwargs) -> None:
        """Take the keyword arguments given to :meth:`make`; may set ``__nr_inputs__`` etc."""
        if kwargs:
            raise TypeError(
                f"{self!r}: make() got keyword arguments {sorted(kwargs)} but setup() takes none"
            )

    @_default_hook
    def infer_shape(self, inp_shapes: tuple) -> Sequence[Sequence[int]]:
        """Output shapes from input shapes.

        Parameters
        ----------
        inp_shapes : tuple of tuple of int
            The shape of each input.

        Returns
        -------
        sequence of sequence of int
            One shape per output; dims are positive ints (zero with ``__allow_empty_out__``).
        """
        raise NotImplementedError(
            f"{self!r}: infer_shape() not implemented; operators with dynamic output shapes "
            "set __is_dynamic_output_shape__ = True"
        )

    def grad(self, wrt_idx: int, inputs: tuple, outputs: tuple, out_grad: tuple):
        """The symbolic gradient of input ``wrt_idx``.

        Parameters
        ----------
        wrt_idx : int
            The input the gradient is asked for.
        inputs, outputs : tuple of SymbolVar
            The operator's input and output vars.
        out_grad : tuple of (SymbolVar or None)
            The loss's gradient w.r.t. each output; None where the loss does not depend on it
            (at least one is not None).

        Returns
        -------
        SymbolVar, 0 or list
            The gradient of input ``wrt_idx`` (0 or None: zero), or a list with the
            gradients of all inputs (then called once for all of them).
        """
        raise MegBrainError(f"grad for {self!r} not implemented")

    @_default_hook
    def init_output_dtype(self, input_dtypes: list) -> list | None:
        """Output dtypes from input dtypes; None keeps the default (input 0's dtype, or the
        config's). Must be implemented for operators without inputs.

        Parameters
        ----------
        input_dtypes : list of numpy.dtype
            The dtype of each input.

        Returns
        -------
        list of dtype-like, or None
        """
        return None

    def get_serialize_params(self) -> Sequence:
        """``[name]`` or ``[name, bytes]`` for graph serialization: the loader's name and
        optional extra params."""
        raise NotImplementedError(f"get_serialize_params() for {self!r} not implemented")

    def copy(self) -> CraniotomeBase:
        """A copy of this descriptor (graph copies and rewrites use it); by default a new
        instance with a deep copy of ``__dict__``."""
        ret = type(self)()
        d0 = self.__dict__.copy()
        d0.pop(_STATE, None)
        ret.__dict__.update(_copy.deepcopy(d0))
        return ret

    def on_graph_compiled(self, used_outputs: tuple) -> None:
        """Called when a function running this operator is set up (compiled, or the first
        evaluation in an eager graph); always followed by :meth:`on_compiled_func_deleted`.

        Parameters
        ----------
        used_outputs : tuple of int
            Indices of the outputs the function needs.
        """

    def on_compiled_func_deleted(self) -> None:
        """Called when the function of the matching :meth:`on_graph_compiled` is gone (a
        later compile invalidated it, or it was freed; in eager graphs: the operator)."""

    # ---- helpers ----------------------------------------------------------------------------
    def get_io_vars(self) -> dict:
        """The operator's vars: ``{"input": [...], "comp_order": [...], "output": [...]}``
        (the ``dev_comp_order_deps`` of :meth:`make` are ``comp_order``)."""
        opr = self._owner()
        n = opr.nr_value_inputs
        return {
            "input": [SymbolVar(v) for v in opr.inputs[:n]],
            "comp_order": [SymbolVar(v) for v in opr.inputs[n:]],
            "output": [SymbolVar(v) for v in opr.outputs],
        }

    @property
    def owner_opr_id(self) -> int:
        """Id of the operator holding this descriptor."""
        return self._owner().id

    @property
    def comp_node(self):
        """The comp node the operator runs on."""
        return self._owner().comp_node

    def _owner(self) -> Craniotome:
        state = self.__dict__.get(_STATE)
        opr = state.owner() if state is not None and state.owner is not None else None
        if opr is None:
            raise GraphError(f"{self!r} is not the descriptor of an operator in a graph")
        return opr

    def __repr__(self) -> str:
        return f"craniotome:{type(self).__name__}"

    @classmethod
    def make(
        cls,
        *inputs,
        comp_graph=None,
        name: str | None = None,
        comp_node=None,
        config=None,
        dev_comp_order_deps: Sequence = (),
        **kwargs,
    ):
        """Insert this operator and return its output vars.

        Parameters
        ----------
        *inputs
            Input vars; numbers and arrays become constants (some input or ``comp_graph``
            must give the graph).
        comp_graph : CompGraph, optional
            The graph; required when there are no inputs.
        name : str, optional
            The operator name.
        comp_node : optional
            The comp node (required without inputs).
        config : OperatorNodeConfig, optional
            Name, comp node and output dtype at once.
        dev_comp_order_deps : sequence of SymbolVar
            Vars computed before the operator runs, not passed to it.
        **kwargs
            Passed to :meth:`setup`.

        Returns
        -------
        SymbolVar or tuple of SymbolVar
            One var when there is one output and ``__expand_single_outputs__``.
        """
        deps = list(dev_comp_order_deps)
        if not inputs and not deps and not isinstance(comp_graph, ComputingGraph):
            raise GraphError(f"craniotome:{cls.__name__}: comp_graph must be given without inputs")
        desc = cls()
        desc.setup(**kwargs)
        nr_in, nr_out = _desc_counts(desc)
        if len(inputs) != nr_in:
            raise GraphError(f"{desc!r}: expected {nr_in} inputs, got {len(inputs)}")
        cfg = _merge_config(name, comp_node, config)
        all_in = list(inputs) + deps
        if all_in:
            vs = canonize_input_vars(all_in, comp_graph=comp_graph, config=cfg)
            graph = vs[0].graph
        else:
            vs, graph = [], comp_graph
            if not cfg.comp_nodes:
                raise GraphError(f"{desc!r}: comp_node must be given without inputs")
        opr = Craniotome(vs, desc, nr_in, nr_out, cfg)
        outs = tuple(SymbolVar(v) for v in graph.insert_opr(opr))
        if bool(desc.__expand_single_outputs__) and len(outs) == 1:
            return outs[0]
        return outs


def make_opr(cls: type) -> Callable:
    """Class decorator: ``cls.make`` of a :class:`CraniotomeBase` subclass.

    Parameters
    ----------
    cls : type
        A subclass of :class:`CraniotomeBase`.

    Returns
    -------
    callable
        ``cls.make``.
    """
    if not (isinstance(cls, type) and issubclass(cls, CraniotomeBase)):
        raise TypeError(f"make_opr: expected a CraniotomeBase subclass, got {cls!r}")
    return cls.make


# ---- serialization (megbrain/serialization/sereg.py) -------------------------------------
# As the reference: a craniotome is written with the type id of the registry's "dynamic"
# entry and two blobs, the loader name its get_serialize_params() gives and the optional
# param bytes; at load the name selects a loader registered with register_loader.
_LOADERS: dict[str, Callable[[bytes | None], CraniotomeBase]] = {}


def register_loader(name: str, loader: Callable[[bytes | None], CraniotomeBase]) -> None:
    """Make graph files load craniotome operators dumped under ``name``.

    A descriptor is dumped when its class defines :meth:`CraniotomeBase.get_serialize_params`,
    returning ``[name]`` or ``[name, params]``; loading calls ``loader(params)`` (``params``
    the bytes, or None when none were dumped) and runs the descriptor it returns on the
    loaded inputs.

    Parameters
    ----------
    name : str
        The name ``get_serialize_params`` returns.
    loader : callable
        ``loader(params: bytes | None) -> CraniotomeBase`` instance, set up (for a class
        whose ``setup`` takes no arguments, ``lambda params: Cls()`` will do).

    Raises
    ------
    MegBrainError
        For a name that is not a non-empty str or a loader that is not callable.
    """
    if not isinstance(name, str) or not name:
        raise MegBrainError(
            f"craniotome register_loader: name must be a non-empty str, got {name!r}"
        )
    if not callable(loader):
        raise MegBrainError(f"craniotome register_loader: loader must be callable, got {loader!r}")
    _LOADERS[name] = loader


def _dump(ctx, opr: Craniotome) -> None:
    try:
        name, params = opr.serialize_params()
    except NotImplementedError:
        raise sereg.NotSerializable(
            f"serialization as FlatBuffers is not supported for operator {opr.name!r} "
            f"(Craniotome): {type(opr.desc).__qualname__} does not define "
            "get_serialize_params()"
        ) from None
    ctx.dump_buf(name.encode("utf-8"))
    if params is not None:
        ctx.dump_buf(params)


def _load(ctx, inputs: list, config) -> Any:
    raw = ctx.load_buf()
    try:
        name = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SerializationError(f"craniotome: loader name {raw[:40]!r} is not UTF-8") from None
    try:
        params = ctx.load_buf()
    except SerializationError:  # no param blob was dumped
        params = None
    loader = _LOADERS.get(name)
    if loader is None:
        raise SerializationError(
            f"craniotome {name!r}: no loader is registered for it (call "
            f"megbrain.craniotome.register_loader({name!r}, loader) before loading)"
        )
    desc = loader(params)
    if not isinstance(desc, CraniotomeBase):
        raise SerializationError(
            f"craniotome {name!r}: the loader returned {desc!r}, not a CraniotomeBase instance"
        )
    nr_in, nr_out = _desc_counts(desc)
    if len(inputs) < nr_in:
        raise SerializationError(
            f"craniotome {name!r}: {desc!r} takes {nr_in} inputs, the file gives {len(inputs)}"
        )
    return ctx.graph.insert_opr(Craniotome(list(inputs), desc, nr_in, nr_out, config))


sereg.register_serializer(Craniotome, dump=_dump, load=_load, name="dynamic")
