"""Operators defined in Python (MegBrain's craniotome): :class:`CraniotomeBase` and the
:class:`Craniotome` operator that runs one.

A subclass of :class:`CraniotomeBase` describes an operator: its input and output counts,
``infer_shape``, ``execute``, optionally ``grad``, ``init_output_dtype`` and flags.
``Subclass.make(*inputs)`` inserts a :class:`Craniotome` operator holding an instance of it
(the *descriptor*). To the graph the operator is an ordinary one of the contract in
:mod:`megbrain.graph.operator`, and opaque: no value inference, so constant folding and the
other rewrites never run or look into ``execute``.

Outputs. With static shapes (``infer_shape``), outputs are vars of the static memory plan like
any other: ``execute`` gets one :class:`CraniotomeOutput` per output wrapping the planned array
and copies results into it with ``set_value``; a different shape is an error. With
``__is_dynamic_output_shape__`` the outputs start unset and ``set_value`` / ``resize``
allocate them (the executor's dynamic path). ``CraniotomeOutput`` lives here rather than
reusing the API's SharedND because operators sit below the API layer; it offers the part of
SharedND's interface an operator needs (``set_value``, ``get_value``, ``resize``, ``shape``,
``dtype``, ``comp_node``, ``reset_zero``, ``dev_ptr``).

Errors. An exception raised by a user hook is the user's own exception, with a note (PEP 678)
naming the operator; hooks whose results are malformed raise :class:`GraphError` naming the
operator and what was wrong.
"""

from __future__ import annotations

import abc
import copy as _copy
import functools
import operator as _operator
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..dtype import canonize_dtype, convert_array, fmt_dtype, same_dtype
from ..errors import (
    GraphError,
    MegBrainError,
    SerializationError,
    mark_user_exception,
    user_exception_note,
)
from ..graph import ComputingGraph, InferType, OperatorNodeBase, VarNode, register_opr, sereg
from ..graph.operator import fmt_shape
from ..graph.static_infer import static_shape
from ..graph.value_proxy import CompGraphCallbackValueProxy
from .base import SymbolVar, _merge_config, canonize_input_vars
from .tensor_manip import get_var_shape, reshape

__all__ = [
    "Craniotome",
    "CraniotomeBase",
    "CraniotomeClassError",
    "CraniotomeOutput",
    "make_opr",
    "register_loader",
]


class CraniotomeClassError(GraphError, AssertionError):
    """A :class:`CraniotomeBase` subclass overrides a name it must not.

    Also an ``AssertionError``: the reference checked these rules with ``assert``.
    """


def _note(exc: BaseException, where: str, tracker: object = None) -> None:
    """Mark a user hook's exception to reach the caller as it is, with a note naming the
    operator (the executor re-raises marked exceptions unwrapped)."""
    if isinstance(exc, Exception):
        mark_user_exception(exc, user_exception_note(where, tracker))


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


class _DescState:
    """The descriptor's link to its operator, stored in the descriptor's ``__dict__``.

    Copies of a descriptor (``copy()``, ``copy.deepcopy`` of its ``__dict__``) get a blank
    state, and all states compare equal, so user ``copy``/``__eq__`` implementations working
    on ``__dict__`` neither copy the graph nor see the link.
    """

    __slots__ = ("owner",)

    def __init__(self):
        self.owner: Callable[[], Craniotome | None] | None = None

    def __deepcopy__(self, memo):
        return _DescState()

    def __copy__(self):
        return _DescState()

    def __eq__(self, other):
        return isinstance(other, _DescState)

    def __hash__(self):
        return 0

    def __repr__(self):
        return "<craniotome state>"


_STATE = "_craniotome_state"


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


def _desc_counts(desc: CraniotomeBase) -> tuple[int, int]:
    """``(__nr_inputs__, __nr_outputs__)`` of a set-up descriptor, checked."""
    vals = []
    for attr, low in (("__nr_inputs__", 0), ("__nr_outputs__", 1)):
        v = getattr(desc, attr)
        try:
            n = _operator.index(v)
        except TypeError:
            n = None
        if n is None or isinstance(v, bool) or n < low:
            raise GraphError(f"{desc!r}: {attr} must be an int >= {low}, got {v!r}")
        vals.append(n)
    return vals[0], vals[1]


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


# ---- outputs as execute() sees them -----------------------------------------------------
class CraniotomeOutput:
    """One output of a running craniotome operator, with SharedND's interface.

    With a static shape it wraps the planned array, whose shape is fixed; a dynamic output
    starts unset and takes the shape of what is set. Valid only while ``execute`` runs.
    """

    __slots__ = ("_opr", "_idx", "_arr", "_fixed", "_dtype", "_cn", "_active")

    def __init__(self, opr: Craniotome, idx: int, arr: np.ndarray | None, dtype, comp_node):
        self._opr = opr
        self._idx = idx
        self._arr = arr
        self._fixed = arr is not None
        self._dtype = dtype
        self._cn = comp_node
        self._active = False

    def _check(self) -> None:
        if not self._active:
            raise GraphError(
                f"{self._opr.describe()}: output {self._idx} used outside execute(); output "
                "handles are only valid while execute() runs"
            )

    @property
    def shape(self) -> tuple:
        """The current shape (``()`` while a dynamic output is unset)."""
        return () if self._arr is None else tuple(self._arr.shape)

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def comp_node(self):
        return self._cn

    @property
    def dev_ptr(self) -> int:
        self._check()
        return 0 if self._arr is None else int(self._arr.__array_interface__["data"][0])

    pubapi_dev_tensor_ptr = dev_ptr

    def _storage(self, shape: tuple) -> np.ndarray:
        """The array to write ``shape`` into: the planned one (same shape) or a new one."""
        if self._fixed:
            if tuple(shape) != self._arr.shape:
                raise GraphError(
                    f"{self._opr.describe()}: execute() changed output {self._idx} from its "
                    f"inferred shape {fmt_shape(self._arr.shape)} to {fmt_shape(shape)}; "
                    "operators whose output shapes are known only when running set "
                    "__is_dynamic_output_shape__ = True"
                )
            return self._arr
        if self._arr is None or self._arr.shape != tuple(shape):
            self._arr = np.empty(tuple(shape), self._dtype)
        return self._arr

    def resize(self, *shape) -> CraniotomeOutput:
        """Set the shape (contents undefined); ``resize(2, 3)`` or ``resize((2, 3))``."""
        self._check()
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = tuple(shape[0])
        self._storage(tuple(int(s) for s in shape))
        return self

    def set_value(self, w, *, sync: bool = True, inplace: bool = False, share: bool = False):
        """Write ``w`` (an array-like, a callback value proxy, a SharedND or another output).

        ``sync`` and ``share`` are accepted for SharedND compatibility (the value is always
        copied); ``inplace`` requires ``w`` to have the current shape.
        """
        self._check()
        if isinstance(w, CompGraphCallbackValueProxy):
            src = w.get_value(borrow_mem=True)
            if not same_dtype(src.dtype, self._dtype):
                raise GraphError(
                    f"{self._opr.describe()}: output {self._idx} has dtype "
                    f"{fmt_dtype(self._dtype)}, the value given has {fmt_dtype(src.dtype)}"
                )
        else:
            if isinstance(w, CraniotomeOutput):
                w._check()
                src = w._arr
                if src is None:
                    raise GraphError(f"{self._opr.describe()}: set_value from an unset output")
            elif hasattr(w, "get_value") and hasattr(w, "dev_tensor"):
                src = w.get_value()  # a SharedND
                if src is None:
                    raise GraphError(f"{self._opr.describe()}: set_value from an empty SharedND")
            else:
                src = w
            src = convert_array(src, self._dtype)
        if src.ndim == 0:
            src = src.reshape(1)
        if inplace and src.shape != self.shape:
            raise GraphError(
                f"{self._opr.describe()}: set_value(inplace=True) of shape "
                f"{fmt_shape(src.shape)} into output {self._idx} of shape {fmt_shape(self.shape)}"
            )
        np.copyto(self._storage(src.shape), src, casting="unsafe")
        return self

    def get_value(self) -> np.ndarray | None:
        """A copy of the current value (None while unset)."""
        self._check()
        return None if self._arr is None else self._arr.copy()

    def reset_zero(self) -> None:
        """Fill with zeros."""
        self._check()
        if self._arr is not None:
            self._arr[...] = 0

    def __repr__(self) -> str:
        return (
            f"CraniotomeOutput({self._opr.describe()}, output {self._idx}, "
            f"shape={self.shape}, dtype={self._dtype})"
        )


# ---- the operator -------------------------------------------------------------------------
class _DescKey:
    """The descriptor in a deduplication key: same class and ``==``, hashed by ``hash``."""

    __slots__ = ("desc", "_hash")

    def __init__(self, desc: CraniotomeBase):
        self.desc = desc
        try:
            self._hash = hash((type(desc), desc))
        except TypeError as exc:
            raise GraphError(
                f"{desc!r} is unhashable: a class defining __eq__ must define __hash__ too"
            ) from exc

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        if not isinstance(other, _DescKey):
            return NotImplemented
        a, b = self.desc, other.desc
        return a is b or (type(a) is type(b) and bool(a == b))


@register_opr
class Craniotome(OperatorNodeBase):
    """An operator whose behaviour is a :class:`CraniotomeBase` descriptor.

    Inputs are the descriptor's ``__nr_inputs__`` value inputs followed by the
    ``dev_comp_order_deps`` (computed first, not passed to ``execute``). Never value
    inferable: ``execute`` only runs when the graph runs.
    """

    value_inferable = False

    def __init__(
        self,
        inputs: Sequence[VarNode],
        desc: CraniotomeBase,
        nr_value_inputs: int,
        nr_outputs: int,
        config=None,
    ):
        super().__init__(inputs, None, config)
        self.desc = desc
        self.nr_value_inputs = nr_value_inputs
        self.nr_outputs = nr_outputs
        self._read_flags()
        self._check_hooks()
        self._link()

    def _read_flags(self) -> None:
        d = self.desc
        self.is_dynamic = bool(d.__is_dynamic_output_shape__)
        self.allow_empty = bool(d.__allow_empty_out__)
        self.no_sys_mem_alloc = bool(d.__disable_sys_mem_alloc__)
        self.allow_duplicate = bool(d.__allow_duplicate__)
        # without any input a dynamic operator's shape is asked before each run (a source
        # whose shape may change between runs); with inputs it is known only by running
        self.dynamic_output_shape = self.is_dynamic and bool(self.inputs)
        self._grad_cache: tuple | None = None
        self._compiled = _Compiled()

    def _check_hooks(self) -> None:
        cls = type(self.desc)
        if (not self.is_dynamic or not self.inputs) and (
            cls.infer_shape is CraniotomeBase.infer_shape
        ):
            raise GraphError(
                f"{self.desc!r}: infer_shape() must be implemented unless "
                "__is_dynamic_output_shape__ is True (and the operator has inputs)"
            )
        if not self.nr_value_inputs and cls.init_output_dtype is CraniotomeBase.init_output_dtype:
            raise GraphError(
                f"{self.desc!r}: init_output_dtype() must be implemented when there is no input"
            )

    def _link(self) -> None:
        state = self.desc.__dict__.get(_STATE)
        if state is None:  # a copy() that bypassed __init__
            state = self.desc.__dict__[_STATE] = _DescState()
        state.owner = weakref.ref(self)

    @property
    def __allow_duplicate__(self) -> bool:  # read by the sublinear-memory pass
        return self.allow_duplicate

    def describe(self) -> str:
        """``craniotome:Class 'name'`` for messages."""
        return f"{self.desc!r} {self.name!r}" if self.name else repr(self.desc)

    def _mark(self, exc: BaseException, hook: str) -> None:
        cls = type(self.desc).__name__
        _note(exc, f"raised by {hook} of craniotome operator {self.name!r} ({cls})", self.tracker)

    # ---- contract ---------------------------------------------------------------------------
    def default_name(self) -> str:
        args = ",".join(v.name for v in self.inputs[: self.nr_value_inputs])
        if len(args) > 48:
            args = args[:45] + "..."
        return f"{type(self.desc).__name__}({args})"

    def hash_key(self) -> tuple:
        return (
            type(self),
            _DescKey(self.desc),
            self.nr_value_inputs,
            tuple(v.id for v in self.inputs),
            tuple(v.id for v in self.extra_deps),
            self.config.hash_key(),
        )

    def infer_dtypes(self, in_dtypes):
        n = self.nr_value_inputs
        try:
            got = self.desc.init_output_dtype(list(in_dtypes[:n]))
        except Exception as exc:
            self._mark(exc, "init_output_dtype()")
            raise
        if got is None:
            if not n:
                raise GraphError(
                    f"{self.describe()}: init_output_dtype() returned None; operators without "
                    "inputs must return the output dtypes"
                )
            return super().infer_dtypes(in_dtypes)
        if not isinstance(got, (list, tuple)) or len(got) != self.nr_outputs:
            raise GraphError(
                f"{self.describe()}: init_output_dtype() must return None or a list of "
                f"{self.nr_outputs} dtypes, got {got!r}"
            )
        out = []
        for k, dt in enumerate(got):
            try:
                out.append(canonize_dtype(dt))
            except (TypeError, MegBrainError) as exc:
                raise GraphError(
                    f"{self.describe()}: init_output_dtype() gave an invalid dtype {dt!r} for "
                    f"output {k}: {exc}"
                ) from exc
        return out

    def source_infer(self):
        st = InferType.RT_STATIC if self.is_dynamic else InferType.CONST
        return [(st, InferType.MISSING)] * self.nr_outputs

    def runtime_state(self, watch_value: bool = False):
        # a dynamic source: its shapes are asked again before each run (a change re-plans)
        if self.is_dynamic and not self.inputs:
            return tuple(self._user_shapes([]))
        return None

    def infer_shapes(self, in_shapes, in_values):
        return self._user_shapes(in_shapes)

    def _user_shapes(self, in_shapes) -> list[tuple[int, ...]]:
        """``infer_shape`` of the descriptor on the value inputs' shapes, checked."""
        shapes = tuple(tuple(int(d) for d in s) for s in in_shapes[: self.nr_value_inputs])
        try:
            got = self.desc.infer_shape(shapes)
        except Exception as exc:
            self._mark(exc, "infer_shape()")
            raise
        if isinstance(got, (str, bytes)) or not isinstance(got, (list, tuple)):
            raise GraphError(
                f"{self.describe()}: infer_shape() must return a list of {self.nr_outputs} "
                f"shapes, got {got!r}"
            )
        if len(got) != self.nr_outputs:
            raise GraphError(
                f"{self.describe()}: infer_shape() returned {len(got)} shapes for "
                f"{self.nr_outputs} outputs: {got!r}"
            )
        return [self._check_shape(k, s, "infer_shape() returned") for k, s in enumerate(got)]

    def _check_shape(self, k: int, shp, what: str) -> tuple[int, ...]:
        bad = isinstance(shp, (str, bytes)) or not hasattr(shp, "__iter__")
        dims = [] if bad else list(shp)
        if not bad:
            for d in dims:
                if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)):
                    bad = True
        if bad or not dims:
            raise GraphError(
                f"{self.describe()}: {what} {shp!r} for output {k}; a shape is a non-empty "
                "sequence of ints"
            )
        dims = [int(d) for d in dims]
        low = 0 if self.allow_empty else 1
        if any(d < low for d in dims):
            hint = "" if self.allow_empty else " (set __allow_empty_out__ = True for empty outputs)"
            raise GraphError(
                f"{self.describe()}: {what} {tuple(dims)} for output {k}; dims must be "
                f"{'>= 0' if self.allow_empty else 'positive'}{hint}"
            )
        return tuple(dims)

    def bind(self, ins, outs):
        proxies = [CompGraphCallbackValueProxy(self.comp_node) for _ in range(self.nr_value_inputs)]
        handles = [
            CraniotomeOutput(self, k, a, v.dtype, v.comp_node)
            for k, (a, v) in enumerate(zip(outs, self.outputs))
        ]
        vals = ins[: self.nr_value_inputs]
        return lambda: self._execute(proxies, vals, handles)

    def run_dynamic(self, ins):
        graph = self.graph
        if graph is not None and graph.options.eager_evaluation and not self._compiled.active:
            self._eager_compiled()
        vals = ins[: self.nr_value_inputs]
        proxies = [CompGraphCallbackValueProxy(self.comp_node) for _ in vals]
        if self.dynamic_output_shape:
            arrs = [None] * self.nr_outputs
        else:
            shapes = self._user_shapes([a.shape for a in ins])
            arrs = [np.empty(s, v.dtype) for s, v in zip(shapes, self.outputs)]
        handles = [
            CraniotomeOutput(self, k, a, v.dtype, v.comp_node)
            for k, (a, v) in enumerate(zip(arrs, self.outputs))
        ]
        self._execute(proxies, vals, handles)
        out = []
        for h in handles:
            a = h._arr
            if a is None:
                if not self.allow_empty:
                    raise GraphError(
                        f"{self.describe()}: execute() did not set output {h._idx} (set "
                        "__allow_empty_out__ = True to allow empty outputs)"
                    )
                a = np.empty((0,), h.dtype)
            elif a.size == 0 and not self.allow_empty:
                raise GraphError(
                    f"{self.describe()}: execute() set output {h._idx} to the empty shape "
                    f"{fmt_shape(a.shape)} (set __allow_empty_out__ = True to allow it)"
                )
            out.append(a)
        return out

    def _execute(self, proxies, vals, handles) -> None:
        for p, a in zip(proxies, vals):
            p.setup(a, False)
        for h in handles:
            h._active = True
        try:
            self.desc.execute(tuple(proxies), tuple(handles))
        except Exception as exc:
            self._mark(exc, "execute()")
            raise
        finally:
            for h in handles:
                h._active = False
            for p in proxies:
                p.on_finished()

    def grad(self, wrt_idx, out_grads):
        n = self.nr_value_inputs
        if wrt_idx >= n:
            return None  # a comp-order dependency
        key = tuple(out_grads)
        cache = self._grad_cache
        if (
            cache is not None
            and len(cache[0]) == len(key)
            and all(a is b for a, b in zip(cache[0], key))
        ):
            return cache[1][wrt_idx]
        ins = tuple(SymbolVar(v) for v in self.inputs[:n])
        outs = tuple(SymbolVar(v) for v in self.outputs)
        ogs = tuple(None if g is None else SymbolVar(g) for g in out_grads)
        try:
            got = self.desc.grad(int(wrt_idx), ins, outs, ogs)
        except Exception as exc:
            self._mark(exc, "grad()")
            raise
        if isinstance(got, (list, tuple)):
            if len(got) != n:
                raise GraphError(
                    f"{self.describe()}: grad() returned {len(got)} gradients for {n} inputs"
                )
            res = [self._grad_var(i, g) for i, g in enumerate(got)]
            # one call gives every input's gradient: keep it for the other inputs
            self._grad_cache = (key, res)
            return res[wrt_idx]
        return self._grad_var(wrt_idx, got)

    def _grad_var(self, i: int, g) -> VarNode | None:
        if g is None or (isinstance(g, (int, np.integer)) and not isinstance(g, bool) and g == 0):
            return None
        if isinstance(g, SymbolVar):
            g = g.node
        if not isinstance(g, VarNode):
            raise GraphError(
                f"{self.describe()}: grad() must give a SymbolVar or 0 for input {i}, got "
                f"{type(g).__name__} {g!r}"
            )
        if g.graph is not self.graph:
            raise GraphError(
                f"{self.describe()}: grad() gave var {g.name!r} of another graph for input {i}"
            )
        inp = self.inputs[i]
        ishp = static_shape(inp)
        if ishp is not None:
            gshp = static_shape(g)
            if gshp is None:
                # give the gradient its input's shape statically, as the reference does
                return reshape(SymbolVar(g), get_var_shape(SymbolVar(inp))).node
            if gshp != ishp:
                raise GraphError(
                    f"{self.describe()}: grad() gave shape {fmt_shape(gshp)} for input {i} "
                    f"of shape {fmt_shape(ishp)}"
                )
        return g

    def clone(self, inputs):
        try:
            desc = self.desc.copy()
        except Exception as exc:
            self._mark(exc, "copy()")
            raise
        if type(desc) is not type(self.desc) or desc is self.desc:
            raise GraphError(
                f"{self.describe()}: copy() must return a new {type(self.desc).__name__}, "
                f"got {desc!r}"
            )
        new = super().clone(inputs)
        new.desc = desc
        new._read_flags()
        new._link()
        return new

    def serialize_params(self) -> tuple[str, bytes | None]:
        """``(loader name, extra param bytes or None)`` from ``get_serialize_params``."""
        val = list(self.desc.get_serialize_params())
        if len(val) not in (1, 2) or not isinstance(val[0], str):
            raise GraphError(
                f"{self.describe()}: get_serialize_params() must return [name] or "
                f"[name, bytes], got {val!r}"
            )
        return val[0], (bytes(val[1]) if len(val) == 2 else None)

    def to_json(self) -> dict[str, Any]:
        d = super().to_json()
        d["craniotome"] = type(self.desc).__qualname__
        return d

    # ---- compile notifications --------------------------------------------------------------
    def on_func_compiled(self, func, used_outputs):
        if self._compiled.active or not used_outputs:
            return None
        self._call_compiled(tuple(used_outputs))
        # the release callback holds neither the operator nor its graph: it may outlive the
        # function it belongs to only until that is freed
        return functools.partial(_release, self.desc, self._compiled)

    def _call_compiled(self, used: tuple) -> None:
        try:
            self.desc.on_graph_compiled(used)
        except Exception as exc:
            self._mark(exc, "on_graph_compiled()")
            raise
        self._compiled.active = True

    def _eager_compiled(self) -> None:
        # an eager graph has no function: the operator's own lifetime stands for it
        self._call_compiled(tuple(range(self.nr_outputs)))
        weakref.finalize(self, _release, self.desc, self._compiled)


class _Compiled:
    """Whether ``on_graph_compiled`` was called and its ``on_compiled_func_deleted`` not yet."""

    __slots__ = ("active",)

    def __init__(self):
        self.active = False


def _release(desc: CraniotomeBase, state: _Compiled) -> None:
    if state.active:
        state.active = False
        desc.on_compiled_func_deleted()


# ---- serialization (megbrain/graph/sereg.py) ------------------------------------------------
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
