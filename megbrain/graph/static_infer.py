"""Static inference of var shapes and values (MegBrain's StaticInferManager).

Infer types are fixed when an operator is inserted (:func:`init_infer_types`); shapes and values
are evaluated on demand by :class:`Inferer`, iteratively (deep graphs do not hit the recursion
limit). CONST results are cached on the var; RT_STATIC ones are recomputed per query, and an
``Inferer`` records which source operators' shapes and values a query read, so a compiled
function knows what to watch for re-planning.
"""

from __future__ import annotations

from collections.abc import Container, Iterable

import numpy as np

from ..errors import MegBrainError
from ..tensor import TensorND
from .var import InferType, VarNode

__all__ = [
    "DynamicShapeError",
    "InferPending",
    "Inferer",
    "infer_shape",
    "infer_value",
    "init_infer_types",
    "rt_static_source_deps",
    "static_shape",
]

CONST, RT_STATIC, MISSING = InferType.CONST, InferType.RT_STATIC, InferType.MISSING


class DynamicShapeError(MegBrainError):
    """Asked for a static shape or value that can only be known by running the graph."""


class InferPending(DynamicShapeError):
    """A source (e.g. an input without a value yet) can not answer; try again before running."""


def init_infer_types(opr) -> None:
    """Decide the shape and value infer types of ``opr``'s outputs from its inputs."""
    if not opr.inputs:
        for v, (st, vt) in zip(opr.outputs, opr.source_infer()):
            v.shape_type, v.value_type = st, vt
        return
    shape_t = CONST
    for i, v in enumerate(opr.inputs):
        shape_t = max(shape_t, v.shape_type)
        if i in opr.value_deps:
            shape_t = max(shape_t, v.value_type)
    if opr.dynamic_output_shape:
        shape_t = MISSING
    if opr.value_inferable and shape_t != MISSING:
        value_t = CONST
        for i, v in enumerate(opr.inputs):
            value_t = max(value_t, v.shape_type if i in opr.shape_only_inputs else v.value_type)
    else:
        value_t = MISSING
    for v in opr.outputs:
        v.shape_type, v.value_type = InferType(shape_t), InferType(value_t)


class Inferer:
    """One round of static inference; memoizes within the round and records watched sources."""

    def __init__(self):
        self.shapes: dict[VarNode, tuple] = {}
        self.values: dict[VarNode, np.ndarray] = {}
        #: source operators whose current shape / value an answer depended on
        self.watch_shape: set = set()
        self.watch_value: set = set()
        #: each value-watched source's ``runtime_state(watch_value=True)`` when it was read
        #: (None where the source can not tell a changed value)
        self.value_states: dict = {}
        #: ``TensorND.layout_epoch`` when the watched shapes were last checked, and whether
        #: a watched source's shape can change without a bump
        self.epoch = TensorND.layout_epoch
        self.untracked = False

    # dependencies of one request: a list of (var, want_value)
    @staticmethod
    def _deps(var: VarNode, want_value: bool):
        opr = var.owner
        deps = []
        for i, inp in enumerate(opr.inputs):
            deps.append((inp, False))
            if want_value:
                if i not in opr.shape_only_inputs:
                    deps.append((inp, True))
            elif i in opr.value_deps:
                deps.append((inp, True))
        return deps

    def _have(self, var: VarNode, want_value: bool) -> bool:
        if want_value:
            return (
                var in self.values
                or var.const_value is not None
                or (var.eager_value is not None and var.value_type != MISSING)
            )
        return var in self.shapes or var.const_shape is not None or var.eager_value is not None

    def shape(self, var: VarNode) -> tuple:
        """The static shape of ``var``; raises DynamicShapeError when it is not inferable."""
        if var.const_shape is not None:
            return var.const_shape
        if var.eager_value is not None:
            # an evaluated var of an eager graph: its current value answers directly, so
            # inference never walks back through the (ever growing) eager graph
            return var.eager_value.shape
        got = self.shapes.get(var)
        if got is None:
            self._run(var, False)
            got = self.shapes[var] if var.const_shape is None else var.const_shape
        return got

    def value(self, var: VarNode) -> np.ndarray:
        """The static value of ``var`` (do not modify it); raises when not inferable."""
        if var.const_value is not None:
            return var.const_value
        if var.eager_value is not None and var.value_type != MISSING:
            return var.eager_value
        got = self.values.get(var)
        if got is None:
            self._run(var, True)
            got = self.values[var] if var.const_value is None else var.const_value
        return got

    def _check(self, var: VarNode, want_value: bool):
        t = var.value_type if want_value else var.shape_type
        if t == MISSING:
            what = "value" if want_value else "shape"
            raise DynamicShapeError(
                f"{what} of var {var.name!r} (produced by {var.owner.type_name} "
                f"{var.owner.name!r}) can not be statically inferred"
            )

    def _run(self, root: VarNode, root_value: bool) -> None:
        self._check(root, root_value)
        stack = [(root, root_value, False)]
        while stack:
            var, want_value, expanded = stack.pop()
            if self._have(var, want_value):
                continue
            if not expanded:
                self._check(var, want_value)
                stack.append((var, want_value, True))
                for dep in self._deps(var, want_value):
                    if not self._have(*dep):
                        stack.append((dep[0], dep[1], False))
                continue
            self._compute(var.owner, want_value)

    def _compute(self, opr, want_value: bool) -> None:
        ins = opr.inputs
        if not ins:
            for v in opr.outputs:
                if v.shape_type == RT_STATIC and opr not in self.watch_shape:
                    self.watch_shape.add(opr)
                    self.untracked = self.untracked or not opr.shape_tracked()
                if want_value and v.value_type == RT_STATIC and opr not in self.watch_value:
                    self.watch_value.add(opr)
                    self.value_states[opr] = _value_state(opr)
        in_shapes = [self.shape(v) for v in ins]
        if want_value:
            in_values = [
                # shape-only inputs get a zero-stride stand-in with the right shape
                np.broadcast_to(np.empty((), v.dtype), in_shapes[i])
                if i in opr.shape_only_inputs
                else self.value(v)
                for i, v in enumerate(ins)
            ]
            shapes = self._out_shapes(opr, in_shapes)
            vals = opr.infer_value(in_values, shapes)
            for v, val in zip(opr.outputs, vals):
                val = np.asarray(val)
                if val.dtype != v.dtype:
                    val = val.astype(v.dtype)
                val.flags.writeable = False
                if v.value_type == CONST:
                    v.const_value = val
                else:
                    self.values[v] = val
        else:
            self._out_shapes(opr, in_shapes)

    def _out_shapes(self, opr, in_shapes) -> list[tuple]:
        if all(self._have(v, False) for v in opr.outputs):
            return [self.shape(v) for v in opr.outputs]
        in_values = {i: self.value(opr.inputs[i]) for i in opr.value_deps if i < len(opr.inputs)}
        shapes = opr.infer_shapes(in_shapes, in_values)
        shapes = [tuple(int(s) for s in shp) for shp in shapes]
        for v, shp in zip(opr.outputs, shapes):
            if v.shape_type == CONST:
                v.const_shape = shp
            else:
                self.shapes[v] = shp
        return shapes


def infer_shape(var: VarNode) -> tuple:
    """The static shape of ``var`` now (raises DynamicShapeError when not inferable)."""
    if var.const_shape is not None:
        return var.const_shape
    return _graph_inferer(var.graph).shape(var)


def static_shape(var: VarNode) -> tuple | None:
    """The static shape of ``var``, or None when it is only known at run time."""
    try:
        return infer_shape(var)
    except DynamicShapeError:
        return None


def _graph_inferer(graph) -> Inferer:
    """A per-graph Inferer reused while the input shapes it read are unchanged.

    Building a graph queries shapes at every insertion; a fresh Inferer per query walks back
    to the inputs each time (quadratic in graph size). The cached one is dropped when a
    watched source changed shape or value (a detector's ``gt_boxes[:, :im_info[4]]`` makes
    shapes depend on an input's value), and is never used for eager graphs (which hold
    operators weakly).
    """
    if graph.options.eager_evaluation:
        return Inferer()
    inf = getattr(graph, "_shape_inferer", None)
    if inf is not None:
        for opr in inf.watch_value:
            old = inf.value_states.get(opr)
            if old is None or _value_state(opr) != old:
                inf = None
                break
        epoch = TensorND.layout_epoch
        if inf is not None and (inf.untracked or epoch != inf.epoch):
            for opr in inf.watch_shape:
                try:
                    cur = tuple(opr.infer_shapes([], {})[0])
                except MegBrainError:
                    cur = None
                if cur != inf.shapes.get(opr.outputs[0]):
                    inf = None
                    break
            else:
                inf.epoch = epoch
    if inf is None:
        inf = graph._shape_inferer = Inferer()
    return inf


def _value_state(opr):
    """What tells whether source ``opr``'s value changed; None when nothing does."""
    try:
        return opr.runtime_state(watch_value=True)
    except MegBrainError:  # no value yet
        return None


def infer_value(var: VarNode) -> np.ndarray | None:
    """A copy of the statically inferred value of ``var``, or None when not inferable.

    Follows ``get_symvar_inferred_value``: only CONST and RT_STATIC values are answered, and a
    failure while inferring yields None.
    """
    if var.value_type == MISSING:
        return None
    try:
        return np.array(Inferer().value(var))
    except MegBrainError:
        return None


def rt_static_source_deps(requests: Iterable[tuple[VarNode, bool]], stop: Container = ()) -> dict:
    """The sources whose current shape or value the given static-inference requests depend
    on (MegBrain's ``get_rt_static_source_deps``).

    Found from the graph's structure alone, without inferring anything: a function must
    know its inputs at compile time, before every input has a value.

    Parameters
    ----------
    requests:
        ``(var, want_value)`` pairs: the shapes (``False``) or values (``True``) asked for.
    stop:
        Operators whose outputs count as given (those an earlier part of a multi-part
        function computed): the walk does not pass through them.

    Returns
    -------
    dict
        ``{output var of a source operator: whether its value (not only its shape) is
        read}``, in the order the walk met them.
    """
    found: dict = {}
    seen: set = set()
    stack = list(requests)
    while stack:
        var, want_value = stack.pop()
        if (var, want_value) in seen:
            continue
        seen.add((var, want_value))
        t = var.value_type if want_value else var.shape_type
        # a CONST answer reads no source; a MISSING one is never asked by a plan
        if t != RT_STATIC or var.owner in stop:
            continue
        if not var.owner.inputs:
            found[var] = found.get(var, False) or want_value
            continue
        stack.extend(Inferer._deps(var, want_value))
    return found
