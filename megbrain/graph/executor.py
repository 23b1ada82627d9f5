"""AsyncExecutable: the compiled function (see "Compile pipeline" in docs/architecture.md).

Compiling fixes the comp seq. A *plan* (static shapes, memory, the bound program) is built
before the first run and rebuilt only when a watched source changes (an input's shape, a
volatile shared tensor's buffer, an input value that shape inference read). Running the
plan is a loop over prebound closures: no lookups, allocation or inference.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable

import numpy as np

from ..device.worker import dispatch_lock
from ..errors import GraphError, MegBrainError, MemAllocError, is_user_exception
from ..kernels import workspace
from .comp_seq import data_inputs, topo_order
from .mem_plan import StaticAllocator
from .operator import fmt_shape
from .static_infer import Inferer, rt_static_source_deps
from .var import VarNode

__all__ = ["AsyncExecutable", "PartExecutable"]


class _Plan:
    """Everything derived from the current static shapes: arrays and bound steps."""

    def __init__(self):
        self.arrays: dict[VarNode, np.ndarray] = {}
        self.static_values: dict[VarNode, np.ndarray] = {}
        self.dynamic: set = set()
        self.states: list = []  # (opr, state) of watched sources
        self.steps: list[Callable[[], None]] = []
        self.step_oprs: list = []
        self.node_steps: dict = {}  # comp node -> [(fn, opr)] for threaded runs
        self.events: list[threading.Event] = []
        #: per part: whether a threaded function runs it on the caller's thread (one comp
        #: node has work in it: nothing to overlap, no hand-offs)
        self.inline: list[bool] = []
        self.sizes: dict = {}  # comp node -> arena bytes
        self.lower_bound: dict = {}
        self.arenas: dict = {}
        self.chunks: dict = {}  # root var -> (comp node, offset, nbytes)
        #: var -> ("fwd", out index) | ("inplace", input index) | ("alloc", seq position)
        self.decisions: dict = {}
        self.last_read: dict = {}
        #: operator -> workspace bytes planned for it (placed in the arena like a var)
        self.workspaces: dict = {}
        #: var -> the var owning its memory (None: a view of memory the plan does not own)
        self.roots: dict = {}


class AsyncExecutable:
    """A compiled function of a :class:`~megbrain.graph.cg.ComputingGraph`.

    ``execute()`` enqueues one run and returns; ``wait()`` blocks until it is done and raises
    the first error of the run as :class:`~megbrain.errors.MegBrainError` naming the operator.
    """

    def __init__(self, graph, outspec: list[tuple[VarNode, Callable | None]], parts=None):
        self.graph = graph
        #: the output specs of each part (one part unless compiled with compile_multi_part)
        self.parts = [list(p) for p in parts] if parts is not None else [list(outspec)]
        self.outspec = [item for p in self.parts for item in p]
        for v, _ in self.outspec:
            if v.graph is not graph:
                raise GraphError(f"output var {v.name!r} does not belong to graph #{graph.id}")
        opts = graph.options
        # each part runs what its outputs need beyond what earlier parts computed
        self.seq, self.part_bounds = [], []
        done: set = set()
        for part in self.parts:
            start = len(self.seq)
            for opr in topo_order([v for v, _ in part], opts.extra_vardeps):
                if opr not in done:
                    done.add(opr)
                    self.seq.append(opr)
            self.part_bounds.append((start, len(self.seq)))
        self._seq_pos = {opr: pos for pos, opr in enumerate(self.seq)}
        self._rt_static_deps: dict = {}  # part (None: all) -> get_rt_static_source_deps()
        self._next_part = 0
        self._valid = True
        self._plan: _Plan | None = None
        self._error: BaseException | None = None
        self._running = False
        self._threads_pending: list = []
        self._lock = threading.Lock()
        self.prev_exec_time = 0.0
        self._slots: dict[VarNode, np.ndarray] = {}
        #: the plugins attached when compiled; without any, steps run unwrapped
        self._observers = tuple(getattr(graph, "plugins", ()))
        cns = {o.comp_node for o in self.seq}
        level = opts.async_exec_level
        self.comp_nodes = sorted(cns, key=str)
        self._threaded = (
            level != 0
            and ((len(cns) > 1 and level & 1) or level & 0b110)
            and not all(getattr(cn, "is_inline", False) for cn in cns)
        )
        if opts.allocate_static_mem_after_graph_compile:
            self._ensure_plan()

    # ---- public ---------------------------------------------------------------------------
    def execute(self, part: int = 0) -> AsyncExecutable:
        """Start one run of ``part`` (asynchronous when dispatched to comp node workers).

        Parts run in order; running part 0 again starts a new sequence.
        """
        if not self._valid:
            raise GraphError(
                "this function has been invalidated: only the most recently compiled function "
                "of a graph can be executed"
            )
        if self._running:
            self.wait()
        nparts = len(self.parts)
        if part != 0 and part != self._next_part:
            raise GraphError(
                f"multi-part function: part {part} executed out of order; "
                f"expected part {self._next_part} (or 0 to restart)"
            )
        if part == 0:
            if self._slots:  # a sequence restarted before its last part
                self._slots.clear()
            plan = self._ensure_plan()
        else:
            plan = self._plan
            if plan is None or self._states_changed(plan):
                plan = self._replan_between_parts(part)
        self._next_part = (part + 1) % nparts
        self._running = True
        if self._observers:
            for ob in self._observers:
                ob.on_run_start(self, part)
        if self._threaded and not plan.inline[part]:
            self._run_threaded(plan, part)
        else:
            t0 = time.perf_counter()
            steps = plan.steps[part]
            i = 0
            try:
                for i in range(len(steps)):  # noqa: B007 - i names the failing step
                    steps[i]()
            except BaseException as exc:  # noqa: BLE001 - surfaced by wait()
                self._error = self._wrap_error(plan.step_oprs[part][i], exc)
                self._next_part = 0
            if self._next_part == 0:
                self._slots.clear()  # dynamic memory is freed after the last part
            self.prev_exec_time = time.perf_counter() - t0
        return self

    def wait(self) -> AsyncExecutable:
        """Block until the current run finishes; re-raise its first error."""
        if self._running:
            if self._threads_pending:
                for cn in self._threads_pending:
                    cn.sync()
                self._threads_pending = []
                if self._next_part == 0:
                    self._slots.clear()  # inline runs clear at the end of execute()
            self._running = False
        err, self._error = self._error, None
        if err is not None:
            raise err
        return self

    def iter_opr_seq(self):
        return iter(self.seq)

    def get_rt_static_source_deps(self, part: int | None = None) -> list[tuple[VarNode, bool]]:
        """The sources whose current shape or value the static inference of this function
        reads: the shapes of the vars it computes and the values read only statically (a
        Reshape target, an index).

        A source read this way may be outside the comp seq (``x.reshape(b.shape)`` never
        runs ``b``), yet it is an input of the function: a new shape or value re-plans.

        Parameters
        ----------
        part:
            Only what that part of a multi-part function reads (vars computed by earlier
            parts count as given); None for the whole function.

        Returns
        -------
        list of (VarNode, bool)
            Each source's output var, and whether its value (not only its shape) is read.
        """
        deps = self._rt_static_deps.get(part)
        if deps is None:
            start, end = (0, len(self.seq)) if part is None else self.part_bounds[part]
            found = rt_static_source_deps(
                _static_requests(self.seq[start:end]), set(self.seq[:start])
            )
            deps = self._rt_static_deps[part] = list(found.items())
        return list(deps)

    def clear_device_memory(self) -> None:
        """Free the static memory arena; the next run allocates it again."""
        self.wait()
        if self._plan is not None:
            self._plan = None

    def update_static_alloc_plan_and_get_size(self) -> dict:
        """``{comp_node: bytes}`` of the static plan, computed without allocating."""
        plan = self._build_plan(allocate=False)
        return dict(plan.sizes)

    def static_alloc_lower_bound(self) -> dict:
        """``{comp_node: bytes}``: the most bytes simultaneously live in the static plan."""
        plan = self._build_plan(allocate=False)
        return dict(plan.lower_bound)

    def mem_alloc_info(self) -> list[dict]:
        """Each var of the current plan: id, name, comp node, bytes, address and kind
        ("static" planned, "forward" a view of another var, "inplace", or "dynamic")."""
        plan = self._ensure_plan()
        out = []
        for opr in self.seq:
            for v in opr.outputs:
                arr = plan.arrays.get(v)
                kind = (
                    "dynamic"
                    if arr is None
                    else {"alloc": "static", "fwd": "forward", "inplace": "inplace"}[
                        plan.decisions[v][0]
                    ]
                )
                out.append(
                    {
                        "id": v.id,
                        "name": v.name,
                        "comp_node": str(v.comp_node),
                        "size": 0 if arr is None else int(arr.nbytes),
                        "addr": 0 if arr is None else int(arr.__array_interface__["data"][0]),
                        "kind": kind,
                    }
                )
        for opr, nb in plan.workspaces.items():
            cn, off, _ = plan.chunks.get(opr, (opr.comp_node, 0, nb))
            arena = plan.arenas.get(cn)
            addr = 0 if arena is None else int(arena.__array_interface__["data"][0]) + off
            out.append(
                {
                    "id": None,
                    "opr": opr.id,
                    "name": f"{opr.name}:workspace",
                    "comp_node": str(cn),
                    "size": int(nb),
                    "addr": addr,
                    "kind": "workspace",
                }
            )
        return out

    def var_arrays(self) -> dict[VarNode, np.ndarray]:
        """The arrays of the current plan (for memory introspection)."""
        return dict(self._ensure_plan().arrays)

    def to_json(self) -> dict:
        return {
            "graph": self.graph.id,
            "seq": [o.to_json() for o in self.seq],
            "vars": {
                v.id: {"name": v.name, "dtype": str(v.dtype), "owner": o.id}
                for o in self.seq
                for v in o.outputs
            },
            "outputs": [v.id for v, _ in self.outspec],
        }

    def _invalidate(self) -> None:
        if self._running:
            try:
                self.wait()
            except MegBrainError:
                pass
        self._valid = False
        self._plan = None

    # ---- planning -------------------------------------------------------------------------
    def _states_changed(self, plan: _Plan) -> bool:
        """Whether a watched source changed since ``plan`` was built (raises for a source
        that refuses to change)."""
        for opr, watch_value, state in plan.states:
            cur = opr.runtime_state(watch_value)
            if cur != state:
                if not opr.replan_on_change:
                    raise opr.state_change_error(state, cur)
                return True
        return False

    def _replan_between_parts(self, part: int) -> _Plan:
        """Re-plan before ``part`` of a multi-part sequence (an input of a later part got a
        new shape, or a new value that its static inference reads), moving the values that
        earlier parts computed and later parts read into the new plan's memory."""
        old = self._plan
        start = self.part_bounds[part][0]
        if old is None:
            raise GraphError(
                f"multi-part function: part {part} executed after the device memory was "
                "cleared; run the sequence again from part 0"
            )
        new = self._build_plan(allocate=True)
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
        self._plan = new
        return new

    def _ensure_plan(self) -> _Plan:
        plan = self._plan
        if plan is not None and not self._states_changed(plan):
            return plan
        self._plan = plan = self._build_plan(allocate=True)
        return plan

    def _build_plan(self, allocate: bool) -> _Plan:
        opts = self.graph.options
        plan = _Plan()
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
                last_read[v] = max(last_read.get(v, -1), self._pos_of(v), self.part_bounds[k][0])
        mem_opt = opts.seq_opt.enable_mem_plan_opt and not opts.force_dynamic_alloc
        decisions = plan.decisions
        root: dict[VarNode, VarNode | None] = {}
        group: dict[VarNode, list[VarNode]] = {}
        arrays = plan.arrays
        in_arrays = functools.partial(_bound_inputs, plan=plan)
        self._mark_dynamic(plan, last_read)
        plan.last_read = last_read
        plan.roots = root
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
                shape, dt = inf.shape(out), out.dtype
                view = views[k] if views is not None else None
                if view is not None:
                    src = self._view_source(opr, iarr, view)
                    decisions[out] = ("fwd", k)
                    arrays[out] = view
                    root[out] = None if src is None else root.get(src)
                    if root[out] is not None:
                        group[root[out]].append(out)
                    continue
                ip = opr.inplace_input() if (mem_opt and k == 0) else None
                if ip is not None and self._can_inplace(
                    opr, ip, shape, dt, pos, arrays, root, group, last_read
                ):
                    src = opr.inputs[ip]
                    decisions[out] = ("inplace", ip)
                    arrays[out] = arrays[src]
                    root[out] = root[src]
                    group[root[out]].append(out)
                    continue
                decisions[out] = ("alloc", pos)
                arrays[out] = _host_empty(shape, dt, f"var {out.name!r} of {opr.type_name}")
                root[out] = out
                group[out] = [out]
        # the static memory plan: one arena per comp node
        reuse = opts.seq_opt.enable_mem_reuse_alloc and not opts.force_dynamic_alloc
        allocs: dict = {}
        for r, members in group.items():
            cn = r.comp_node
            end = max(last_read.get(m, decisions[r][1]) for m in members) + 1
            begin = decisions[r][1]
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
                else sum(arrays[r].nbytes for r in group if r.comp_node == cn)
            )
        if not allocate:
            return plan
        if reuse:
            for cn, alloc in allocs.items():
                arena = (
                    cn.alloc(alloc.tot_alloc())
                    if hasattr(cn, "alloc")
                    else _host_empty(alloc.tot_alloc(), np.uint8, f"the static arena of {cn}")
                )
                plan.arenas[cn] = arena
                for r in group:
                    if r.comp_node == cn:
                        off = alloc.offset(r)
                        nb = arrays[r].nbytes
                        plan.chunks[r] = (cn, off, nb)
            for opr, nb in plan.workspaces.items():
                off = allocs[opr.comp_node].offset(opr)
                plan.chunks[opr] = (opr.comp_node, off, nb)
            # walk 2: place chunks in the arenas and redo views over them
            for opr in seq:
                if opr.outputs[0] in plan.dynamic:
                    continue
                iarr = None
                for out in opr.outputs:
                    kind, arg = decisions[out]
                    if kind == "alloc":
                        cn, off, nb = plan.chunks[out]
                        old = arrays[out]
                        arrays[out] = (
                            plan.arenas[cn][off : off + nb].view(old.dtype).reshape(old.shape)
                        )
                    elif kind == "inplace":
                        arrays[out] = arrays[opr.inputs[arg]]
                    else:
                        if iarr is None:
                            iarr = in_arrays(opr)
                            views = opr.fwd_views(iarr)
                        arrays[out] = views[arg]
        self._bind_program(plan)
        return plan

    def _mark_dynamic(self, plan: _Plan, last_read: dict) -> None:
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

    def _pos_of(self, var: VarNode) -> int:
        """Position of ``var``'s operator in the comp seq (-1 if not in it)."""
        return self._seq_pos.get(var.owner, -1)

    @staticmethod
    def _view_source(opr, iarr, view) -> VarNode | None:
        for v, a in zip(opr.inputs, iarr):
            if a is not None and np.may_share_memory(a, view):
                return v
        return None

    @staticmethod
    def _can_inplace(opr, ip, shape, dt, pos, arrays, root, group, last_read) -> bool:
        src = opr.inputs[ip]
        r = root.get(src)
        if r is None or src not in arrays:
            return False
        a = arrays[src]
        if a.shape != tuple(shape) or a.dtype != dt or not a.flags.c_contiguous:
            return False
        if not a.flags.writeable:
            return False
        return all(last_read.get(m, -1) <= pos for m in group[r])

    # ---- binding --------------------------------------------------------------------------
    def _bind_program(self, plan: _Plan) -> None:
        """Bind every operator into a step list per part (and per comp node if threaded)."""
        arrays, slots = plan.arrays, self._slots
        plan.steps, plan.step_oprs, plan.node_steps = [], [], []
        # dynamic vars are dropped after their last reader (views keep their base alive)
        free_after: dict = {}
        nseq = len(self.seq)
        for v in plan.dynamic:
            pos = plan.last_read.get(v, -1)
            if pos < 0:
                pos = self._pos_of(v)
            if pos < nseq:
                free_after.setdefault(self.seq[pos], []).append(v)
        for k, part in enumerate(self.parts):
            start, end = self.part_bounds[k]
            callbacks: dict[VarNode, list] = {}
            early = []  # outputs computed by an earlier part: called at this part's start
            for v, cb in part:
                if cb is None:
                    continue
                if self._pos_of(v) < start:
                    early.append((v, cb))
                else:
                    callbacks.setdefault(v, []).append(cb)
            steps, step_oprs, per_node = [], [], {}

            def add(fn, opr, steps=steps, step_oprs=step_oprs, per_node=per_node):
                mask = getattr(opr, "exec_mask", None)
                if mask is not None:  # conditional execution: skipped while masked off
                    fn = _masked(fn, mask)
                steps.append(fn)
                step_oprs.append(opr)
                per_node.setdefault(opr.comp_node, []).append((fn, opr))

            for v, cb in early:
                add(self._callback_step(cb, v, plan), v.owner)
            for opr in self.seq[start:end]:
                fn = None
                if opr.outputs[0] in plan.dynamic:
                    fn = self._dynamic_step(opr, plan)
                elif opr.has_side_effect or not all(
                    plan.decisions[o][0] == "fwd" for o in opr.outputs
                ):
                    ins = _bound_inputs(opr, plan)
                    outs = [arrays[o] for o in opr.outputs]
                    chunk = plan.chunks.get(opr)
                    if chunk is not None:
                        cn, off, nb = chunk
                        with workspace.allocating(
                            workspace.Carver(plan.arenas[cn][off : off + nb])
                        ):
                            fn = opr.bind(ins, outs)
                    else:
                        fn = opr.bind(ins, outs)
                if self._observers:
                    fn = _observed(self, plan, opr, fn)
                if fn is not None:
                    add(fn, opr)
                elif self._threaded:
                    per_node.setdefault(opr.comp_node, [])
                for out in opr.outputs:
                    for cb in callbacks.get(out, ()):
                        add(self._callback_step(cb, out, plan), opr)
                for v in free_after.get(opr, ()):
                    add(functools.partial(slots.pop, v, None), opr)
            plan.steps.append(steps)
            plan.step_oprs.append(step_oprs)
            plan.node_steps.append(per_node)
        if self._threaded:
            plan.events, plan.inline = [], []
            for k in range(len(self.parts)):
                self._add_cross_node_sync(plan, k)

    def _callback_step(self, cb, var: VarNode, plan: _Plan):
        if var in plan.dynamic:
            return _slot_callback(cb, self._slots, var)
        return _static_callback(cb, plan.arrays[var])

    def _dynamic_step(self, opr, plan: _Plan) -> Callable[[], None]:
        slots, arrays = self._slots, plan.arrays
        # inputs read only through static inference are fixed for the plan; the others are
        # looked up when the step runs (dynamic vars live in the slots)
        fixed = _bound_inputs(opr, plan)
        static = _static_input_indices(opr)
        inputs = [None if i in static else v for i, v in enumerate(opr.inputs)]

        def run():
            ins = []
            for v, a in zip(inputs, fixed):
                if v is not None:
                    a = slots.get(v)
                    if a is None:
                        a = arrays.get(v)
                ins.append(a)
            outs = opr.run_dynamic(ins)
            for v, a in zip(opr.outputs, outs):
                slots[v] = a

        return run

    def _add_cross_node_sync(self, plan: _Plan, part: int) -> None:
        """Make each comp node wait for vars it reads from another node (one Event per var).

        A var is ready before the run when nothing in the part computes it: its operator
        has no step and reads only such vars (a shared or immutable tensor and views of
        it); its readers need no Event. A part whose work is then on one comp node runs on
        the caller's thread (``plan.inline``), unless the async level asks for threads."""
        events: dict[VarNode, threading.Event] = {}
        waits: dict = {}
        start, end = self.part_bounds[part]
        seq = self.seq[start:end]
        in_part = set(seq)
        by_opr: dict = {}
        for lst in plan.node_steps[part].values():
            for fn, opr in lst:
                by_opr.setdefault(opr, []).append(fn)
        ready = set()  # operators of the part whose outputs are ready before the run
        for opr in seq:
            if opr not in by_opr and all(
                v.owner in ready or v.owner not in in_part for v in data_inputs(opr)
            ):
                ready.add(opr)
        for opr in seq:
            for v in data_inputs(opr):
                if v.comp_node != opr.comp_node and v.owner in in_part and v.owner not in ready:
                    ev = events.setdefault(v, threading.Event())
                    waits.setdefault(opr, []).append(ev)
        node_steps: dict = {}
        for opr in seq:
            lst = node_steps.setdefault(opr.comp_node, [])
            for ev in waits.get(opr, ()):
                lst.append((_waiter(ev, self), opr))
            for fn in by_opr.get(opr, ()):
                lst.append((fn, opr))
            for o in opr.outputs:
                ev = events.get(o)
                if ev is not None:
                    lst.append((ev.set, opr))
        plan.node_steps[part] = node_steps
        plan.events.append(list(events.values()))
        busy = sum(1 for lst in node_steps.values() if lst)
        plan.inline.append(busy <= 1 and not self.graph.options.async_exec_level & 0b110)

    def _run_threaded(self, plan: _Plan, part: int) -> None:
        events = plan.events[part]
        for ev in events:
            ev.clear()
        self._abort = False
        t0 = time.perf_counter()
        self._t0 = t0
        self._t_end = t0
        tasks = [(cn, lst) for cn, lst in plan.node_steps[part].items() if lst]
        self._threads_pending = [cn for cn, _ in tasks]
        task = self._node_task
        try:
            # all of a run's tasks enter the queues at once (see device.worker.dispatch_lock)
            with dispatch_lock:
                for cn, lst in tasks:
                    cn.dispatch(task, lst, events)
        except BaseException:
            # interrupted between two nodes (Ctrl-C): the tasks already queued must not wait
            # for events of tasks never queued
            self._abort = True
            for ev in events:
                ev.set()
            raise

    def _node_task(self, lst, events) -> None:
        opr = None
        try:
            for fn, opr in lst:  # noqa: B007 - opr names the failing operator
                if self._abort:
                    break
                fn()
        except _Aborted:
            pass
        except BaseException as exc:  # noqa: BLE001 - surfaced by wait()
            with self._lock:
                self._abort = True
                if self._error is None:
                    self._error = self._wrap_error(opr, exc)
                self._next_part = 0
            for ev in events:
                ev.set()
        with self._lock:
            self._t_end = max(self._t_end, time.perf_counter())
            self.prev_exec_time = self._t_end - self._t0

    @staticmethod
    def _wrap_error(opr, exc: BaseException) -> BaseException:
        if is_user_exception(exc) or not isinstance(exc, Exception):
            # the user's own exception, already noted with where it was raised; or an
            # interruption (KeyboardInterrupt, SystemExit) that callers catch by its type
            return exc
        if isinstance(exc, MegBrainError) and opr is not None and opr.name in str(exc):
            if exc.tracker is None:
                exc.tracker = opr.tracker
            return exc
        if opr is None:
            return exc
        err = MegBrainError(
            f"error while executing operator {opr.type_name} {opr.name!r}: "
            f"{type(exc).__name__}: {exc}",
            tracker=opr.tracker,
        )
        err.__cause__ = exc
        return err


def _static_input_indices(opr) -> tuple[int, ...]:
    """Indices of the inputs of ``opr`` read only through static inference: not computed
    before it runs (the complement of :func:`~megbrain.graph.comp_seq.data_inputs`)."""
    return tuple(
        i
        for i, v in enumerate(opr.inputs)
        if (i in opr.static_only_inputs and v.value_static)
        or (i in opr.shape_only_inputs and v.shape_static)
    )


def _bound_inputs(opr, plan: _Plan) -> list:
    """The input arrays ``opr`` is bound to under ``plan``.

    An input read only through static inference gets its inferred value (or the shape
    stand-in), never its array: that array is filled later in the run if at all, and
    binding may read it (a Broadcast's target shape). Dynamic inputs are None.
    """
    static = _static_input_indices(opr)
    values, arrays, dyn = plan.static_values, plan.arrays, plan.dynamic
    return [
        values[v] if i in static else None if v in dyn else arrays.get(v, values.get(v))
        for i, v in enumerate(opr.inputs)
    ]


def _static_requests(seq):
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


def _observed(func: AsyncExecutable, plan: _Plan, opr, fn):
    """``fn`` (None: an operator with nothing to run) wrapped by the function's plugins,
    the first attached outermost; ``value_of(var)`` gives a var's current array."""
    slots, arrays, values = func._slots, plan.arrays, plan.static_values

    def value_of(v):
        a = slots.get(v)
        if a is None:
            a = arrays.get(v)
        return values.get(v) if a is None else a

    fn = fn or _noop
    for ob in reversed(func._observers):
        fn = ob.wrap_step(func, opr, fn, value_of)
    return fn


def _noop() -> None:
    pass


def _static_callback(cb, arr):
    return lambda: cb(arr)


def _slot_callback(cb, slots, var):
    return lambda: cb(slots[var])


def _host_empty(shape, dtype, what: str) -> np.ndarray:
    """``np.empty`` whose failure names the var (or arena) and its size as a MemAllocError."""
    try:
        return np.empty(shape, dtype)
    except (MemoryError, ValueError) as exc:
        n = int(np.prod(shape, dtype=object)) * np.dtype(dtype).itemsize
        raise MemAllocError(
            f"can not allocate {what}: shape {fmt_shape(np.atleast_1d(shape))}, {n} bytes "
            f"({n / 2**30:.4g} GiB)"
        ) from exc


def _masked(fn, mask):
    """``fn`` run only while ``mask.enabled`` (an ExecutionMask of opr/cond.py, set by its
    predicate operator earlier in the run); graphs without conditional execution have none."""

    def run():
        if mask.enabled:
            fn()

    return run


def _waiter(ev: threading.Event, func: AsyncExecutable):
    def wait():
        ev.wait()
        if func._abort:
            raise _Aborted()

    return wait


class _Aborted(Exception):
    pass


class PartExecutable:
    """One part of a multi-part function: runs its slice of the shared comp seq."""

    def __init__(self, core: AsyncExecutable, part: int):
        self.core = core
        self.part = part

    def execute(self) -> PartExecutable:
        self.core.execute(self.part)
        return self

    def wait(self) -> PartExecutable:
        self.core.wait()
        return self

    @property
    def prev_exec_time(self) -> float:
        return self.core.prev_exec_time

    @property
    def graph(self):
        return self.core.graph

    def iter_opr_seq(self):
        start, end = self.core.part_bounds[self.part]
        return iter(self.core.seq[start:end])

    def get_rt_static_source_deps(self) -> list[tuple[VarNode, bool]]:
        """The sources this part's static inference reads (see
        :meth:`AsyncExecutable.get_rt_static_source_deps`)."""
        return self.core.get_rt_static_source_deps(self.part)

    def to_json(self) -> dict:
        d = self.core.to_json()
        start, end = self.core.part_bounds[self.part]
        d["seq"] = d["seq"][start:end]
        d["part"] = self.part
        return d

    def clear_device_memory(self) -> None:
        self.core.clear_device_memory()

    def update_static_alloc_plan_and_get_size(self) -> dict:
        return self.core.update_static_alloc_plan_and_get_size()

    def mem_alloc_info(self) -> list[dict]:
        return self.core.mem_alloc_info()

    def _invalidate(self) -> None:
        self.core._invalidate()
