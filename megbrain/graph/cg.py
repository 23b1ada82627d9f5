"""ComputingGraph: owns vars and operators, inserts (and deduplicates) operators, compiles."""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Sequence

from ..errors import GraphError
from .eager import EagerEvaluator
from .executor import AsyncExecutable, PartExecutable
from .operator import OperatorNodeBase
from .options import GraphOptions
from .static_infer import InferPending, infer_shape, init_infer_types
from .var import VarNode

__all__ = ["ComputingGraph"]

_graph_ids = itertools.count(1)


class ComputingGraph:
    """A computing graph: a DAG of operators connected by vars.

    Operators are inserted with :meth:`insert_opr`, which deduplicates identical operators,
    decides static-inference types and checks shapes as far as they are statically known.
    :meth:`compile` turns output specs into an :class:`~megbrain.graph.executor.AsyncExecutable`;
    only the most recently compiled one may run.
    """

    def __init__(self, options: GraphOptions | None = None):
        self.id = next(_graph_ids)
        self.options = options if options is not None else GraphOptions()
        #: the user's own per-graph values; megbrain keeps nothing of its own here
        self.user_data: dict = {}
        #: operators marked by ``set_opr_sublinear_memory_endpoint``: sublinear memory
        #: splits only there (gopt carries a mark over to an operator's replacement)
        self.sublinear_endpoints: set = set()
        #: megbrain's own per-graph state, keyed by its owner (the conditional-execution
        #: registry, the persistent output storage pool, the training layer's updates)
        self.internal_data: dict = {}
        #: ``UserInputVars``: id(host tensor) -> the Host2DeviceCopy var the user made for it
        self.user_input_vars: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self.oprs: list[OperatorNodeBase] = []
        self._dedup: dict[tuple, OperatorNodeBase] = {}
        self._id_counter = itertools.count(0)  # node ids start at 0, as in the reference
        #: callables ``f(opr)`` run on every inserted operator (priority / tracker scopes)
        self.opr_insert_hooks: list[Callable[[OperatorNodeBase], None]] = []
        #: rewrite hooks ``f(graph, opr) -> list[VarNode] | None`` run before insertion
        #: (graph_opt_level 1 simplifications); a non-None result replaces the operator
        self.insert_rewriters: list[Callable] = []
        self.current_exec = None
        self._exec_ref = None
        self.eager_evaluator = None
        #: observers of the functions compiled from now on (``megbrain.plugin``), each with
        #: ``wrap_step(func, opr, fn, value_of) -> fn`` and ``on_run_start(func, part)``;
        #: a function keeps the list it was compiled with (see ``AsyncExecutable``)
        self.plugins: list = []

    def _next_id(self) -> int:
        return next(self._id_counter)

    def __repr__(self) -> str:
        return f"<CompGraph #{self.id} at {id(self):#x}>"

    # ---- insertion ------------------------------------------------------------------------
    def insert_opr(self, opr: OperatorNodeBase) -> list[VarNode]:
        """Insert ``opr`` (or find its existing twin) and return its outputs."""
        for v in opr.inputs:
            if not isinstance(v, VarNode):
                raise GraphError(f"{opr.type_name}: input {v!r} is not a var")
            if v.graph is not self:
                raise GraphError(
                    f"{opr.type_name}: input var {v.name!r} belongs to another graph "
                    f"(#{v.graph.id}, this is #{self.id})"
                )
        for rw in self.insert_rewriters:
            replaced = rw(self, opr)
            if replaced is not None:
                return replaced
        key = None
        if opr.dedup and not opr.has_side_effect:
            key = opr.hash_key()
            twin = self._dedup.get(key)
            if twin is not None:
                if self.options.eager_evaluation:
                    self._eager().on_reinsert(twin)
                return twin.outputs
        opr.graph = self
        opr.id = self._next_id()
        if opr.order_key < 0:
            opr.order_key = opr.id
        opr.name = opr.config.name_value or opr.default_name()
        in_dtypes = [v.dtype for v in opr.inputs]
        dtypes = opr.infer_dtypes(in_dtypes)
        cn = opr.infer_comp_node()
        outputs = []
        for i, dt in enumerate(dtypes):
            vname = opr.name if len(dtypes) == 1 else f"{opr.name}:{i}"
            outputs.append(VarNode(self, opr, i, dt, cn, vname))
        opr.outputs = outputs
        init_infer_types(opr)
        self._check_static(opr)
        for hook in self.opr_insert_hooks:
            hook(opr)
        if self.options.eager_evaluation:
            self._eager().on_insert(opr)  # raises before the operator is registered
            self._weak_oprs.add(opr)
        else:
            self.oprs.append(opr)
        if key is not None:
            self._dedup[key] = opr
        return outputs

    def _eager(self):
        """The eager evaluator; switching to eager mode makes the graph hold oprs weakly."""
        ev = self.eager_evaluator
        if ev is None:
            ev = self.eager_evaluator = EagerEvaluator(self)
            self._dedup = weakref.WeakValueDictionary(self._dedup)
            self._weak_oprs = weakref.WeakSet()
        return ev

    def all_oprs(self) -> list[OperatorNodeBase]:
        """Every live operator, in insertion order."""
        weak = list(getattr(self, "_weak_oprs", ()))
        return self.oprs + sorted(weak, key=lambda o: o.id)

    def _check_static(self, opr: OperatorNodeBase) -> None:
        """Run shape inference now when it is possible, so bad shapes fail at insertion."""
        if not all(v.shape_static for v in opr.outputs):
            return
        try:
            infer_shape(opr.outputs[0])
        except InferPending:
            pass  # an input without a value yet: checked when it first runs

    # ---- compile ---------------------------------------------------------------------------
    def compile(self, outspec: Sequence[tuple[VarNode, Callable | None]]):
        """Compile ``[(var, callback or None), ...]`` into an AsyncExecutable.

        Compiling invalidates the previously compiled function of this graph.
        """
        if self.current_exec is not None:
            self.current_exec._invalidate()
        self._release_func_hooks()
        func = AsyncExecutable(self, list(outspec))
        self.current_exec = func
        self._notify_compiled(func)
        return func

    def compile_multi_part(self, specs: Sequence[Sequence[tuple[VarNode, Callable | None]]]):
        """Compile parts that run in order, each reusing what earlier parts computed.

        Returns one :class:`~megbrain.graph.executor.PartExecutable` per spec; they share
        one comp seq and memory plan, and compiling again invalidates all of them.
        """
        if len(specs) < 1:
            raise GraphError("compile_multi_part needs at least one part")
        if self.current_exec is not None:
            self.current_exec._invalidate()
        self._release_func_hooks()
        core = AsyncExecutable(self, [], parts=[list(s) for s in specs])
        self.current_exec = core
        self._notify_compiled(core)
        return [PartExecutable(core, k) for k in range(len(specs))]

    def _release_func_hooks(self) -> None:
        """Run the release callbacks of the previous function (just invalidated)."""
        fin = self.__dict__.pop("_func_release", None)
        if fin is not None:
            fin()

    def _notify_compiled(self, func) -> None:
        """Call ``on_func_compiled`` of the function's operators that define it; their
        release callbacks run when the function is invalidated or freed, whichever is first."""
        base = OperatorNodeBase.on_func_compiled
        hooked = [o for o in func.seq if type(o).on_func_compiled is not base]
        if not hooked:
            return
        used = {v for v, _ in func.outspec}
        for o in func.seq:
            used.update(o.inputs)
            used.update(o.extra_deps)
        for deps in self.options.extra_vardeps.values():
            used.update(deps)
        releases: list = []
        self._func_release = weakref.finalize(func, _run_all, releases)
        for o in hooked:
            rel = o.on_func_compiled(func, [k for k, v in enumerate(o.outputs) if v in used])
            if rel is not None:
                releases.append(rel)

    def api_graph(self):
        """The graph object handed to users (the API's CompGraph subclasses this class)."""
        return self

    def var_by_id(self, var_id: int) -> VarNode | None:
        for o in self.all_oprs():
            for v in o.outputs:
                if v.id == var_id:
                    return v
        return None


def _run_all(callbacks: list) -> None:
    """Run every callback, then raise the first error (all run even if one fails)."""
    err = None
    for cb in callbacks:
        try:
            cb()
        except Exception as exc:  # noqa: BLE001 - re-raised below
            err = err or exc
    if err is not None:
        raise err
