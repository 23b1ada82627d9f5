"""The var memory manager of a compiled function: the static memory plan of its comp seq.

From the current static shapes it decides which vars are forwarded views, computed in place,
given a chunk or allocated at run time, and places the chunks (and the kernels' workspaces)
in one arena per comp node (see "Static memory plan" in docs/architecture.md).
"""

from __future__ import annotations

import functools
import gc
import threading
from collections.abc import Callable
from contextlib import contextmanager

import numpy as np

from ..errors import GraphError, MemAllocError
from ..kernels import workspace
from .comp_seq import data_inputs
from .mem_plan import StaticAllocator
from .operator import fmt_shape
from .static_infer import Inferer
from .var import VarNode

__all__ = ["MemPlanner", "Plan", "bound_inputs", "gc_paused", "host_empty", "static_requests"]


@contextmanager
def gc_paused():
    """Pause Python's cyclic garbage collector (a context manager and decorator).

    Compiling and planning create many long-lived objects (operators, vars, closures); each
    full collection on the way scans every one of them, which made large graphs' compile
    and planning grow faster than their size. Nothing built there is garbage until the
    graph goes, so collection waits until the end."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class Plan:
    """Everything derived from the current static shapes: arrays and bound steps."""

    def __init__(self):
        self.arrays: dict[VarNode, np.ndarray] = {}
        self.static_values: dict[VarNode, np.ndarray] = {}
        self.dynamic: set = set()
        self.states: list = []  # (opr, state) of watched sources
        self.steps: list[Callable[[], None]] = []
        self.step_oprs: list = []
        #: per part: comp node -> [(fn, opr)] while binding; once the cross-node events are
        #: added, the [(comp node, steps)] a threaded run dispatches (nodes with work only)
        self.node_steps: list = []
        self.events: list[threading.Event] = []
        #: per part: whether a threaded function runs it on the caller's thread (one comp
        #: node has work in it: nothing to overlap, no hand-offs)
        self.inline: list[bool] = []
        self.sizes: dict = {}  # comp node -> arena bytes
        self.lower_bound: dict = {}
        self.arenas: dict = {}
        self.chunks: dict = {}  # root var -> (comp node, offset, nbytes)
        #: var -> ("fwd", out index) | ("inplace", input index) | ("alloc", seq position) |
        #: ("part", var, element offset): a range of that var's memory (a Concat's input
        #: written in place by its producer; the offset a pair (offset, element strides)
        #: for a strided part, ChannelShuffleConcat's)
        self.decisions: dict = {}
        self.last_read: dict = {}
        #: operator -> workspace bytes planned for it (placed in the arena like a var)
        self.workspaces: dict = {}
        #: var -> the var owning its memory (None: a view of memory the plan does not own)
        self.roots: dict = {}


class MemPlanner:
    """Builds the :class:`Plan` of one comp seq (MegBrain's var node memory manager).

    Parameters
    ----------
    graph : ComputingGraph
        Its options (memory optimizations, forced dynamic allocation) are read per plan.
    seq : list
        The comp seq.
    parts : list
        The output specs of each part.
    part_bounds : list of (int, int)
        The slice of ``seq`` each part runs.
    """

    def __init__(self, graph, seq: list, parts: list, part_bounds: list):
        self.graph = graph
        self.seq = seq
        self.parts = parts
        self.part_bounds = part_bounds
        self._seq_pos = {opr: pos for pos, opr in enumerate(seq)}

    def states_changed(self, plan: Plan) -> bool:
        """Whether a watched source changed since ``plan`` was built (raises for a source
        that refuses to change)."""
        for opr, watch_value, state in plan.states:
            cur = opr.runtime_state(watch_value)
            if cur != state:
                if not opr.replan_on_change:
                    raise opr.state_change_error(state, cur)
                return True
        return False

    def build(self, allocate: bool) -> Plan:
        """Infer the static shapes, decide forwarding, in-place reuse and chunks, and place
        the chunks (and the kernels' workspaces) in one arena per comp node; with
        ``allocate=False`` only the sizes are computed. The plan is not bound yet."""
        opts = self.graph.options
        plan = Plan()
        inf = Inferer()
        seq = self.seq
        # static shapes and the values static inference reads
        for opr in seq:
            for v in opr.outputs:
                if v.shape_static:
                    inf.shape(v)
            for i, v in enumerate(opr.inputs):
                if i in opr.static_only_inputs and v.value_static:
                    plan.static_values[v] = inf.value(v)
                elif i in opr.shape_only_inputs and v.shape_static:
                    # only the shape is read, and the var's memory may be freed (or not yet
                    # computed) when the reader runs: bind a zero-stride stand-in (an
                    # inferred value, where there is one, has the right shape as well)
                    plan.static_values.setdefault(
                        v, np.broadcast_to(np.empty((), v.dtype), inf.shape(v))
                    )
        # sources read only through static inference (a Reshape target fed by an input)
        # are not in the seq but must be watched as well
        watched = [
            o for o in seq if o.has_runtime_state or o in inf.watch_shape or o in inf.watch_value
        ]
        in_seq = set(seq)
        watched += sorted(
            (o for o in inf.watch_shape | inf.watch_value if o not in in_seq), key=lambda o: o.id
        )
        for opr in watched:
            wv = opr in inf.watch_value
            plan.states.append((opr, wv, opr.runtime_state(wv)))
        # readers: last position at which each var is read
        last_read: dict[VarNode, int] = {}
        for pos, opr in enumerate(seq):
            for v in data_inputs(opr):
                # a reader on another comp node runs at an unknown time relative to the
                # producer's node: keep the memory for the whole run
                last_read[v] = (
                    len(seq) if v.comp_node != opr.comp_node else max(last_read.get(v, -1), pos)
                )
        for k, part in enumerate(self.parts):
            for v, _ in part:
                last_read[v] = max(last_read.get(v, -1), self.pos_of(v), self.part_bounds[k][0])
        mem_opt = opts.seq_opt.enable_mem_plan_opt and not opts.force_dynamic_alloc
        decisions = plan.decisions
        root: dict[VarNode, VarNode | None] = {}
        # root -> the last read of any var sharing its memory (kept as members join, so an
        # in-place check never rescans the group)
        group_end: dict[VarNode, int] = {}
        arrays = plan.arrays
        in_arrays = functools.partial(bound_inputs, plan=plan)
        self._mark_dynamic(plan, last_read)
        plan.last_read = last_read
        plan.roots = root
        # var -> (the var holding it, element offset): inputs written into a Concat's output
        claims = self._input_parts(plan, inf) if mem_opt else {}
        parts: list = []  # (var, holder, offset) in placement order: holders first
        # walk 1: forwarding, in-place and chunk decisions on fresh arrays
        for pos, opr in enumerate(seq):
            if opr.outputs[0] in plan.dynamic:
                continue
            iarr = in_arrays(opr)
            # side-effect operators (AddUpdate) define their output as a view of the input
            # they update, whatever the planning options
            views = (
                opr.fwd_views(iarr) if (mem_opt or not opr.inputs or opr.has_side_effect) else None
            )
            for k, out in enumerate(opr.outputs):
                if out in decisions:
                    continue  # a Concat's output, placed with its first input
                shape, dt = inf.shape(out), out.dtype
                view = views[k] if views is not None else None
                if view is not None:
                    src = self._view_source(opr, iarr, view)
                    decisions[out] = ("fwd", k)
                    arrays[out] = view
                    r = root[out] = None if src is None else root.get(src)
                    if r is not None:
                        group_end[r] = max(group_end[r], last_read.get(out, -1))
                    continue
                if k == 0 and parts and opr.has_input_parts:
                    if self._parts_side_by_side(opr, out, plan, inf, group_end, parts):
                        continue
                if out in claims:
                    self._place_part(out, pos, claims, plan, inf, group_end, parts)
                    continue
                ip = opr.inplace_input() if (mem_opt and k == 0) else None
                if ip is not None and self._can_inplace(
                    opr, ip, shape, dt, pos, arrays, root, group_end
                ):
                    src = opr.inputs[ip]
                    decisions[out] = ("inplace", ip)
                    arrays[out] = arrays[src]
                    r = root[out] = root[src]
                    group_end[r] = max(group_end[r], last_read.get(out, -1))
                    continue
                decisions[out] = ("alloc", pos)
                arrays[out] = host_empty(shape, dt, f"var {out.name!r} of {opr.type_name}")
                root[out] = out
                group_end[out] = last_read.get(out, -1)
        # the static memory plan: one arena per comp node
        reuse = opts.seq_opt.enable_mem_reuse_alloc and not opts.force_dynamic_alloc
        allocs: dict = {}
        for r, last in group_end.items():
            cn = r.comp_node
            begin = decisions[r][1]
            end = max(last, begin) + 1
            nbytes = arrays[r].nbytes
            alloc = allocs.setdefault(cn, StaticAllocator(getattr(cn, "mem_align", 64)))
            alloc.add(begin, max(end, begin + 1), nbytes, r)
        if reuse:
            # workspaces: declared by binding once with a recorder; live only at their step
            for pos, opr in enumerate(seq):
                if not opr.uses_workspace or opr.outputs[0] in plan.dynamic:
                    continue
                rec = workspace.Recorder()
                with workspace.allocating(rec):
                    opr.bind(in_arrays(opr), [arrays[o] for o in opr.outputs])
                if rec.nbytes:
                    cn = opr.comp_node
                    alloc = allocs.setdefault(cn, StaticAllocator(getattr(cn, "mem_align", 64)))
                    alloc.add(pos, pos + 1, rec.nbytes, opr)
                    plan.workspaces[opr] = rec.nbytes
        for cn, alloc in allocs.items():
            alloc.solve()
            plan.lower_bound[cn] = alloc.tot_alloc_lower_bound()
            plan.sizes[cn] = (
                alloc.tot_alloc()
                if reuse
                else sum(arrays[r].nbytes for r in group_end if r.comp_node == cn)
            )
        if not allocate:
            return plan
        if reuse:
            for cn, alloc in allocs.items():
                arena = (
                    cn.alloc(alloc.tot_alloc())
                    if hasattr(cn, "alloc")
                    else host_empty(alloc.tot_alloc(), np.uint8, f"the static arena of {cn}")
                )
                plan.arenas[cn] = arena
                for r in group_end:
                    if r.comp_node == cn:
                        off = alloc.offset(r)
                        old = arrays[r]
                        nb = old.nbytes
                        plan.chunks[r] = (cn, off, nb)
                        arrays[r] = arena[off : off + nb].view(old.dtype).reshape(old.shape)
            for opr, nb in plan.workspaces.items():
                off = allocs[opr.comp_node].offset(opr)
                plan.chunks[opr] = (opr.comp_node, off, nb)
            for v, holder, off in parts:
                arrays[v] = _part_view(arrays[holder], off, arrays[v].shape)
            # walk 2: redo the views and in-place outputs over the placed chunks
            for opr in seq:
                if opr.outputs[0] in plan.dynamic:
                    continue
                iarr = None
                for out in opr.outputs:
                    kind, arg = decisions[out][:2]
                    if kind == "alloc" or kind == "part":
                        continue
                    if kind == "inplace":
                        arrays[out] = arrays[opr.inputs[arg]]
                    else:
                        if iarr is None:
                            iarr = in_arrays(opr)
                            views = opr.fwd_views(iarr)
                        arrays[out] = views[arg]
        return plan

    def move_part_values(self, old: Plan, new: Plan, part: int) -> None:
        """Copy into ``new`` the values that the parts before ``part`` computed under
        ``old`` and later parts read (a re-plan between the parts of a sequence)."""
        start = self.part_bounds[part][0]
        moved = set()
        for pos in range(start):
            for v in self.seq[pos].outputs:
                if new.last_read.get(v, -1) < start or v in new.dynamic:
                    continue  # dead at the part boundary, or kept in the dynamic slots
                r = new.roots.get(v)
                if r is None or r in moved:
                    continue  # a view of a source's memory: the new plan views it too
                src, dst = old.arrays.get(r), new.arrays[r]
                if src is None or src.shape != dst.shape or src.dtype != dst.dtype:
                    raise GraphError(
                        f"multi-part function: var {r.name!r} computed by an earlier part "
                        f"has shape {fmt_shape(None if src is None else src.shape)}, but the "
                        f"inputs now give {fmt_shape(dst.shape)}: an input of an earlier "
                        f"part changed before part {part}; run the sequence again from part 0"
                    )
                np.copyto(dst, src)
                moved.add(r)

    def _mark_dynamic(self, plan: Plan, last_read: dict) -> None:
        """Decide which vars are allocated at run time, and keep static memory that dynamic
        vars may view alive until those views' last reader."""
        force = self.graph.options.force_dynamic_alloc
        dyn = plan.dynamic
        for opr in self.seq:
            if (
                (force and (opr.inputs or opr.fwd_views([]) is None))
                or any(v in dyn for v in data_inputs(opr))
                or not all(v.shape_static for v in opr.outputs)
            ):
                dyn.update(opr.outputs)
        # a dynamic output may be a view of any input: extend the inputs' lifetimes to the
        # last read of the outputs (and of further dynamic views of them)
        ext: dict[VarNode, int] = {}
        for opr in reversed(self.seq):
            if opr.outputs[0] not in dyn:
                continue
            end = max(ext.get(o, last_read.get(o, -1)) for o in opr.outputs)
            for v in data_inputs(opr):
                if v in dyn:
                    ext[v] = max(ext.get(v, last_read.get(v, -1)), end)
                else:
                    last_read[v] = max(last_read.get(v, -1), end)

    def pos_of(self, var: VarNode) -> int:
        """Position of ``var``'s operator in the comp seq (-1 if not in it)."""
        return self._seq_pos.get(var.owner, -1)

    def _input_parts(self, plan: Plan, inf: Inferer) -> dict:
        """The inputs of Concat-like operators (``has_input_parts``) that their producers
        may write straight into the operator's output: ``var -> (output, element offset)``.

        An input qualifies when its part is one contiguous range (``input_parts``), or a
        strided view (ChannelShuffleConcat's) and its producer's type is among the
        operator's ``strided_part_writers``, it is on the operator's comp node, computed
        earlier in the seq by an operator without side effects or an execution mask, and
        nothing updates it in place afterwards (an output that is itself a strided part
        holds no parts). A
        var read by several such operators goes to the last of them, twice by one to its
        first part: DenseNet's concatenations of all the features so far then lie in the
        block's last one, and the earlier ones are ranges of its prefixes. Whether
        the producer's output is forwarded from another var is only known in walk 1: such
        an input stays unplaced and is copied."""
        seq, seq_pos, dyn = self.seq, self._seq_pos, plan.dynamic
        claims: dict = {}
        for pos in range(len(seq) - 1, -1, -1):
            opr = seq[pos]
            if not opr.has_input_parts:
                continue
            out = opr.outputs[0]
            if out in dyn or getattr(opr, "exec_mask", None) is not None:
                continue
            if isinstance(claims.get(out, (None, 0))[1], tuple):
                continue  # a strided part of an outer operator's output holds no parts
            offs = opr.input_parts([inf.shape(v) for v in opr.inputs], inf.shape(out))
            writers = getattr(opr, "strided_part_writers", ())
            for v, off in zip(opr.inputs, offs or ()):
                owner = v.owner
                if (
                    off is None
                    or (isinstance(off, tuple) and owner.type_name not in writers)
                    or v in claims
                    or v.comp_node != opr.comp_node
                    or not 0 <= seq_pos.get(owner, -1) < pos
                    or owner.has_side_effect
                    or getattr(owner, "exec_mask", None) is not None
                ):
                    continue
                claims[v] = (out, off)
        if claims:
            for opr in seq:
                if opr.has_side_effect:
                    for v in opr.overwritten_inputs():
                        claims.pop(v, None)
        return claims

    @staticmethod
    def _place_part(v, pos, claims, plan, inf, group_end, parts) -> None:
        """Make ``v`` (produced at ``pos``) a view of its range of the output claiming it,
        placing that output first: a chunk from ``pos`` on, or in turn a range of the
        output of an outer Concat (a Concat of Concats)."""
        arrays, decisions, root = plan.arrays, plan.decisions, plan.roots
        chain = [v]
        while True:
            holder = claims[chain[-1]][0]
            if holder in decisions:
                break
            if holder in claims:
                chain.append(holder)
                continue
            decisions[holder] = ("alloc", pos)
            arrays[holder] = host_empty(
                inf.shape(holder), holder.dtype, f"var {holder.name!r} of {holder.owner.type_name}"
            )
            root[holder] = holder
            group_end[holder] = plan.last_read.get(holder, -1)
            break
        for w in reversed(chain):
            holder, off = claims[w]
            decisions[w] = ("part", holder, off)
            arrays[w] = _part_view(arrays[holder], off, inf.shape(w))
            r = root[w] = root[holder]
            group_end[r] = max(group_end[r], plan.last_read.get(w, -1))
            parts.append((w, holder, off))

    @staticmethod
    def _parts_side_by_side(opr, out, plan, inf, group_end, parts) -> bool:
        """Make ``out`` a range of the output holding ``opr``'s inputs where they lie there
        side by side, in order (DenseNet: each layer's Concat of the features so far is a
        prefix of the block's last one); its bind then finds nothing to copy."""
        decisions = plan.decisions
        first = decisions.get(opr.inputs[0])
        if first is None or first[0] != "part":
            return False
        holder, start = first[1], first[2]
        offs = opr.input_parts([inf.shape(v) for v in opr.inputs], inf.shape(out))
        if offs is None or isinstance(start, tuple):
            return False
        for v, off in zip(opr.inputs, offs):
            d = decisions.get(v)
            if not isinstance(off, int) or d is None or d[0] != "part" or d[1] is not holder:
                return False
            if d[2] != start + off:
                return False
        decisions[out] = ("part", holder, start)
        plan.arrays[out] = _part_view(plan.arrays[holder], start, inf.shape(out))
        r = plan.roots[out] = plan.roots[holder]
        group_end[r] = max(group_end[r], plan.last_read.get(out, -1))
        parts.append((out, holder, start))
        return True

    @staticmethod
    def _view_source(opr, iarr, view) -> VarNode | None:
        for v, a in zip(opr.inputs, iarr):
            if a is not None and np.may_share_memory(a, view):
                return v
        return None

    @staticmethod
    def _can_inplace(opr, ip, shape, dt, pos, arrays, root, group_end) -> bool:
        src = opr.inputs[ip]
        r = root.get(src)
        if r is None or src not in arrays:
            return False
        a = arrays[src]
        if a.shape != tuple(shape) or a.dtype != dt or not a.flags.c_contiguous:
            return False
        if not a.flags.writeable:
            return False
        return group_end[r] <= pos


def _part_view(arr: np.ndarray, off, shape) -> np.ndarray:
    """The C-contiguous ``shape`` at element ``off`` of the contiguous ``arr``; for ``off``
    a pair ``(offset, element strides)``, the view of ``shape`` with those strides there."""
    if isinstance(off, tuple):
        start, strides = off
        it = arr.itemsize
        return np.lib.stride_tricks.as_strided(
            arr.reshape(-1)[start:], tuple(shape), tuple(s * it for s in strides)
        )
    n = int(np.prod(shape, dtype=np.int64))
    return arr.reshape(-1)[off : off + n].reshape(shape)


def static_input_indices(opr) -> tuple[int, ...]:
    """Indices of the inputs of ``opr`` read only through static inference: not computed
    before it runs (the complement of :func:`~megbrain.graph.comp_seq.data_inputs`)."""
    return tuple(
        i
        for i, v in enumerate(opr.inputs)
        if (i in opr.static_only_inputs and v.value_static)
        or (i in opr.shape_only_inputs and v.shape_static)
    )


def bound_inputs(opr, plan: Plan) -> list:
    """The input arrays ``opr`` is bound to under ``plan``.

    An input read only through static inference gets its inferred value (or the shape
    stand-in), never its array: that array is filled later in the run if at all, and
    binding may read it (a Broadcast's target shape). Dynamic inputs are None.
    """
    static = static_input_indices(opr)
    values, arrays, dyn = plan.static_values, plan.arrays, plan.dynamic
    return [
        values[v] if i in static else None if v in dyn else arrays.get(v, values.get(v))
        for i, v in enumerate(opr.inputs)
    ]


def static_requests(seq):
    """The static-inference requests a plan of ``seq`` makes: ``(var, want_value)`` for the
    static shapes of the outputs and the inputs read only through static inference."""
    for opr in seq:
        for v in opr.outputs:
            if v.shape_static:
                yield v, False
        for i, v in enumerate(opr.inputs):
            if i in opr.static_only_inputs and v.value_static:
                yield v, True
            elif i in opr.shape_only_inputs and v.shape_static:
                yield v, False


def host_empty(shape, dtype, what: str) -> np.ndarray:
    """``np.empty`` whose failure names the var (or arena) and its size as a MemAllocError."""
    try:
        return np.empty(shape, dtype)
    except (MemoryError, ValueError) as exc:
        n = int(np.prod(shape, dtype=object)) * np.dtype(dtype).itemsize
        raise MemAllocError(
            f"can not allocate {what}: shape {fmt_shape(np.atleast_1d(shape))}, {n} bytes "
            f"({n / 2**30:.4g} GiB)"
        ) from exc
