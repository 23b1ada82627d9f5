"""Eager evaluation: each operator is run as soon as it is inserted (``eager_evaluation``).

Values live on the vars (``VarNode.eager_value``) and the graph keeps operators only through
weak references, so a loop that builds fresh operators every iteration frees them once the
user drops their vars. Re-evaluation after a source changes (``reeval``) re-runs only the
operators that depend on it, in insertion order (which is topological).

Inserting an operator that already exists (deduplication) re-runs it when its value may be
stale, as the reference's version tracking does: a source whose value can change outside the
graph (a shared tensor or a host input: ``SharedND.set_value`` does not tell the graph) and
its direct readers re-run on every re-insertion, and one whose input operator re-ran since its
own evaluation re-runs once.
"""

from __future__ import annotations

import weakref

from .value_proxy import CompGraphCallbackValueProxy
from .var import VarNode

__all__ = ["EagerEvaluator"]


class EagerEvaluator:
    """Runs operators of an eager graph at insertion and on demand."""

    def __init__(self, graph):
        self.graph = weakref.ref(graph)
        #: var -> the operators reading it (both held weakly)
        self.receivers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def on_insert(self, opr) -> None:
        """Evaluate ``opr`` now; raises (and the caller drops ``opr``) on failure."""
        # a source whose value changes outside the graph, or a direct reader of one
        opr.eager_always_rerun = (not opr.inputs and opr.has_runtime_state) or any(
            not v.owner.inputs and v.owner.has_runtime_state for v in opr.inputs
        )
        self.evaluate(opr)
        for v in opr.inputs:
            self.receivers.setdefault(v, weakref.WeakSet()).add(opr)

    def on_reinsert(self, opr) -> None:
        """``opr`` was inserted again (deduplicated): re-run it if its value may be stale."""
        if opr.eager_always_rerun or opr.eager_stale:
            self.evaluate(opr)

    def evaluate(self, opr) -> None:
        outs = opr.run_dynamic([v.eager_value for v in opr.inputs])
        for v, a in zip(opr.outputs, outs):
            v.eager_value = a
        opr.eager_stale = False
        for out in opr.outputs:
            for r in self.receivers.get(out, ()):
                r.eager_stale = True

    def reeval(self, var: VarNode) -> None:
        """Re-run ``var``'s operator and every operator depending on it."""
        todo = {var.owner}
        frontier = [var.owner]
        while frontier:
            opr = frontier.pop()
            for out in opr.outputs:
                for r in list(self.receivers.get(out, ())):
                    if r not in todo:
                        todo.add(r)
                        frontier.append(r)
        for opr in sorted(todo, key=lambda o: o.id):
            self.evaluate(opr)
        for opr in todo:
            opr.eager_stale = False

    def value_proxy(self, var: VarNode):
        """A (lazy, always active) value proxy over the var's current value."""
        p = CompGraphCallbackValueProxy(var.comp_node)
        p.setup(var.eager_value, False)
        return p
