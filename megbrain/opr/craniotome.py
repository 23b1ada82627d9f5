"""Operators defined in Python (MegBrain's craniotome): the :class:`Craniotome` operator that
runs a descriptor, a :class:`CraniotomeBase` (in :mod:`megbrain.opr.craniotome_desc`).

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

import functools
import operator as _operator
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..dtype import canonize_dtype, convert_array, fmt_dtype, same_dtype
from ..errors import (
    GraphError,
    MegBrainError,
    mark_user_exception,
    user_exception_note,
)
from ..graph import InferType, OperatorNodeBase, VarNode, register_opr
from ..graph.operator import fmt_shape
from ..graph.static_infer import static_shape
from ..graph.value_proxy import CompGraphCallbackValueProxy
from .base import SymbolVar
from .tensor_manip import get_var_shape, reshape

if TYPE_CHECKING:
    from .craniotome_desc import CraniotomeBase

__all__ = [
    "Craniotome",
    "CraniotomeClassError",
    "CraniotomeOutput",
]


class CraniotomeClassError(GraphError, AssertionError):
    """A :class:`CraniotomeBase` subclass overrides a name it must not.

    Also an ``AssertionError``: the reference checked these rules with ``assert``.
    """


def _default_hook(fn: Callable) -> Callable:
    """Mark a hook of :class:`CraniotomeBase` as its default, which a subclass may keep."""
    fn._craniotome_default = True
    return fn


def _is_default(hook: Callable) -> bool:
    """Whether a descriptor class kept the base's default ``hook`` (did not override it)."""
    return getattr(hook, "_craniotome_default", False)


def _note(exc: BaseException, where: str, tracker: object = None) -> None:
    """Mark a user hook's exception to reach the caller as it is, with a note naming the
    operator (the executor re-raises marked exceptions unwrapped)."""
    if isinstance(exc, Exception):
        mark_user_exception(exc, user_exception_note(where, tracker))


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
        if (not self.is_dynamic or not self.inputs) and _is_default(cls.infer_shape):
            raise GraphError(
                f"{self.desc!r}: infer_shape() must be implemented unless "
                "__is_dynamic_output_shape__ is True (and the operator has inputs)"
            )
        if not self.nr_value_inputs and _is_default(cls.init_output_dtype):
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
