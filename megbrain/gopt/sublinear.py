"""Sublinear memory (graph option ``enable_sublinear_memory_opt``): recompute forward
values for their late (backward) readers instead of keeping them alive, after Chen et al.
2016, "Training Deep Nets with Sublinear Memory Cost".

What is recomputed. In the comp seq the graph would otherwise get, a var whose readers are
split by a gap of more than :data:`LATE_GAP` steps has *late readers* (in a training step: the
backward operators reading a forward activation). Vars are visited in seq order; the late
readers of ``v`` read a *clone* of ``v``'s operator when ``v`` can be recomputed at its first
late reader from vars that are live there anyway: inputs still read at or after that step,
free sources (shared and constant tensors, graph inputs read from the host tensor), clones
already made, or - recursively - vars that can themselves be recomputed so. ``v`` then dies
after its last early reader. Which operators may be cloned:

* by default the cheap ones: Elemwise, TypeCvt and the shape/view operators. Outputs of
  matmul, convolution, reductions... stay alive as checkpoints; recomputation costs at most one
  extra evaluation of each cheap forward operator;
* when operators were marked by ``set_opr_sublinear_memory_endpoint``, any deterministic
  operator except the marked ones, whose outputs are the checkpoints: the whole segment between
  two endpoints is recomputed once, at the start of its backward (Chen's segment strategy, at
  most one extra forward pass).

Never cloned: sources, operators with side effects or without value inference (random), dynamic
output shapes, ``__allow_duplicate__ = False``, and operators that would read a var after an
operator in the seq overwrote it (AddUpdate).

How clones run late. The pass fixes the order of everything from the first late reader on:
those operators are re-inserted (inputs rewired to the clones where they read recomputed vars)
with ``opr.priority`` set to their rank in the original seq, and every clone gets the rank just
before its first consumer. The comp seq honours priorities (smaller first) among ready
operators, and all earlier operators keep their lower priorities, so the new seq is the
original one with each recomputation placed right before its reader. The pass returns
``{old var: re-inserted var}``, which the optimizer applies as every other pass's replacement.
It acts only when the option is set, at ``graph_opt_level >= 2`` (where PRESET runs); not at a
negative (debug) level, whose check of replaced outputs would run the original side effects
(AddUpdate) a second time.
"""

from __future__ import annotations

import logging

from ..graph import OperatorNodeBase, VarNode
from ..graph.comp_seq import data_inputs, topo_order
from .passes import register_pass

__all__ = ["CHEAP_OPRS", "LATE_GAP", "sublinear_memory"]

logger = logging.getLogger("megbrain")

#: readers more than this many seq steps after the previous reader (or the producer) are late
LATE_GAP = 8
#: operator types cheap enough to recompute without endpoints (elementwise and shape/view)
CHEAP_OPRS = frozenset(
    {
        "Elemwise",
        "TypeCvt",
        "Reshape",
        "Broadcast",
        "Dimshuffle",
        "AxisAddRemove",
        "Subtensor",
        "Identity",
        "MarkNoBroadcastElemwise",
        "GetVarShape",
    }
)
_MAX_DEPTH = 256  # recursion limit of one recomputation chain


def _free_source(opr: OperatorNodeBase) -> bool:
    """A source whose output is a view of memory outside the arena (shared, constant, a host
    input on CPU)."""
    return not opr.inputs and type(opr).fwd_views is not OperatorNodeBase.fwd_views


def _clonable(opr: OperatorNodeBase) -> bool:
    return bool(
        opr.inputs
        and not opr.has_side_effect
        and not opr.has_runtime_state
        and opr.value_inferable
        and not opr.dynamic_output_shape
        and getattr(opr, "__allow_duplicate__", True)
        and all(v.shape_static for v in opr.outputs)
    )


class _Planner:
    """Decides which vars are recomputed and which operators are cloned for them."""

    def __init__(self, seq: list, endpoints: set):
        self.seq = seq
        self.pos = {o: i for i, o in enumerate(seq)}
        self.endpoints = endpoints
        self.readers: dict[VarNode, list[int]] = {}
        for i, opr in enumerate(seq):
            for v in dict.fromkeys(data_inputs(opr)):
                self.readers.setdefault(v, []).append(i)
        self.last = {v: rs[-1] for v, rs in self.readers.items()}
        # var -> step at which an operator of the seq overwrites it in place
        self.overwritten: dict[VarNode, int] = {}
        for i, opr in enumerate(seq):
            for w in opr.overwritten_inputs():
                self.overwritten[w] = min(i, self.overwritten.get(w, i))
        #: var -> its late reader steps (they read the clone)
        self.late: dict[VarNode, list[int]] = {}
        #: operator -> [input source]: True reads the input's clone, False the original
        self.clones: dict[OperatorNodeBase, list[bool]] = {}

    def may_clone(self, opr) -> bool:
        if opr in self.endpoints or not _clonable(opr):
            return False
        return bool(self.endpoints) or opr.type_name in CHEAP_OPRS

    def late_readers(self, v: VarNode) -> list[int]:
        prev = self.pos[v.owner]
        rs = self.readers.get(v, [])
        for k, r in enumerate(rs):
            if r - prev > LATE_GAP:
                return rs[k:]
            prev = r
        return []

    def live_at(self, v: VarNode, q: int) -> bool:
        return _free_source(v.owner) or self.pos[v.owner] <= q <= self.last.get(v, -1)

    def chain(self, opr, q: int, new: dict, depth: int = 0) -> bool:
        """Whether ``opr`` can be recomputed at step ``q``; adds the clones it needs to ``new``."""
        if opr in self.clones or opr in new:
            return True
        if depth > _MAX_DEPTH or not self.may_clone(opr):
            return False
        if any(self.overwritten.get(v, q + 1) <= q for v in opr.inputs):
            return False  # the value read was overwritten before q
        srcs = []
        data = set(data_inputs(opr))
        for v in opr.inputs:
            if v not in data or self.live_at(v, q):
                srcs.append(False)
            elif self.chain(v.owner, q, new, depth + 1):
                srcs.append(True)
            else:
                return False
        new[opr] = srcs
        return True

    def run(self) -> None:
        for opr in self.seq:
            for v in opr.outputs:
                late = self.late_readers(v)
                if not late:
                    continue
                new: dict = {}
                if opr in self.clones or self.chain(opr, late[0], new):
                    self.clones.update(new)
                    self.late[v] = late
                    early = [r for r in self.readers[v] if r < late[0]]
                    self.last[v] = early[-1] if early else self.pos[opr]


@register_pass("sublinear_memory")
def sublinear_memory(graph, dest: list[VarNode]) -> dict:
    """Recompute cheap forward values for their late readers (see the module docstring)."""
    opts = graph.options
    if not opts.enable_sublinear_memory_opt or opts.graph_opt_level < 0 or not dest:
        return {}
    seq = topo_order(dest, opts.extra_vardeps)
    endpoints = graph.sublinear_endpoints & set(seq)
    plan = _Planner(seq, endpoints)
    plan.run()
    if not plan.late:
        return {}
    return _rewrite(graph, plan)


def _rewrite(graph, plan: _Planner) -> dict:
    """Re-insert the seq from the first late reader on with clones placed before readers."""
    seq, pos = plan.seq, plan.pos
    start = min(rs[0] for rs in plan.late.values())
    # the step each clone is first needed at: its late readers, then through other clones
    need: dict = {}
    for v, rs in plan.late.items():
        need[v.owner] = min(need.get(v.owner, rs[0]), rs[0])
    for opr in sorted(plan.clones, key=pos.get, reverse=True):
        for v, from_clone in zip(opr.inputs, plan.clones[opr]):
            if from_clone:
                need[v.owner] = min(need.get(v.owner, need[opr]), need[opr])
    before: dict[int, list] = {}
    for opr in sorted(plan.clones, key=pos.get):
        before.setdefault(need[opr], []).append(opr)

    base = max((o.priority for o in seq[:start]), default=0) + 1
    rank = iter(range(base, base + 2 * len(seq) + 1))
    recreated: dict[VarNode, VarNode] = {}  # late-part var -> its re-inserted twin
    cloned: dict[VarNode, VarNode] = {}  # recomputed var -> its clone's output

    def insert(opr, inputs, extra):
        new = opr.clone(inputs)
        new.extra_deps = extra
        new.dedup = False  # a twin, not the existing operator
        outs = graph.insert_opr(new)
        new.priority = next(rank)
        return outs

    def plain(v: VarNode) -> VarNode:
        return recreated.get(v, v)

    for i in range(start, len(seq)):
        for opr in before.get(i, ()):
            srcs = plan.clones[opr]
            ins = [cloned[v] if c else plain(v) for v, c in zip(opr.inputs, srcs)]
            for old, new in zip(opr.outputs, insert(opr, ins, [plain(v) for v in opr.extra_deps])):
                cloned[old] = new
        opr = seq[i]
        if not opr.inputs:
            continue  # sources stay: they run whenever ready and carry the user's inputs
        ins = [cloned[v] if i in plan.late.get(v, ()) else plain(v) for v in opr.inputs]
        outs = insert(opr, ins, [plain(v) for v in opr.extra_deps])
        recreated.update(zip(opr.outputs, outs))
    extra = graph.options.extra_vardeps  # add_extra_vardep entries follow their vars
    for k in [k for k in extra if k in recreated]:
        extra.setdefault(recreated[k], []).extend(plain(d) for d in extra[k])
    _log(graph, plan)
    return recreated


def _log(graph, plan: _Planner) -> None:
    level = graph.options.log_level
    if level >= 1:
        logger.info(
            "sublinear memory: %d vars recomputed for late readers by %d duplicated oprs%s",
            len(plan.late),
            len(plan.clones),
            f" ({len(plan.endpoints)} endpoints)" if plan.endpoints else "",
        )
    if level >= 2:
        for opr in plan.clones:
            logger.info("sublinear memory: duplicated %s %s", opr.type_name, opr.name)
