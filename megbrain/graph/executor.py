"""AsyncExecutable: the compiled function (see "Compile pipeline" in docs/architecture.md).

Compiling fixes the comp seq. A *plan* (static shapes, memory, the bound program) is built
before the first run and rebuilt only when a watched source changes (an input's shape, a
volatile shared tensor's buffer, an input value that shape inference read). Running the
plan is a loop over prebound closures: no lookups, allocation or inference. The plan comes
from the var memory manager (:mod:`~megbrain.graph.mem_planner`), its binding and threaded
dispatch from the exec environment (:mod:`~megbrain.graph.exec_env`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from ..errors import GraphError, MegBrainError
from .comp_seq import topo_order
from .exec_env import ExecEnv
from .mem_planner import MemPlanner, Plan, gc_paused, static_requests
from .static_infer import rt_static_source_deps
from .var import VarNode

__all__ = ["AsyncExecutable", "PartExecutable", "MISS"]

#: what a fast call (:meth:`AsyncExecutable.fast_runner`) returns where it did not run
MISS = object()
#: mem_alloc_info's kind of each memory plan decision
_MEM_KINDS = {"alloc": "static", "fwd": "forward", "inplace": "inplace", "part": "part"}


def _none() -> None:
    return None


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
        for opr in self.seq:
            opr.add_input_layout_constraint()
        self._rt_static_deps: dict = {}  # part (None: all) -> get_rt_static_source_deps()
        self._next_part = 0
        self._valid = True
        self._plan: Plan | None = None
        self._error: BaseException | None = None
        self._running = False
        self._threads_pending: list = []
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
        self._planner = MemPlanner(graph, self.seq, self.parts, self.part_bounds)
        self._env = ExecEnv(self, self._planner.pos_of)
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
            self._env._run_threaded(plan, part)
        else:
            t0 = time.perf_counter()
            steps = plan.steps[part]
            i = 0
            try:
                for i in range(len(steps)):  # noqa: B007 - i names the failing step
                    steps[i]()
            except BaseException as exc:  # noqa: BLE001 - surfaced by wait()
                self._error = self._env._wrap_error(plan.step_oprs[part][i], exc)
                self._next_part = 0
            if self._next_part == 0:
                self._slots.clear()  # dynamic memory is freed after the last part
            self.prev_exec_time = time.perf_counter() - t0
        return self

    def fast_runner(self, fed=(), feed=None, result=None):
        """A call of the current plan bound once, for the common case: one part, no
        plugins, run on the caller's thread; None where the function needs :meth:`execute`.

        ``run(args)`` feeds ``args``, checks what :meth:`execute` checks, bound once (the
        plan, the watched sources), runs the steps and returns ``result()``; or returns
        :data:`MISS`, having run nothing, where the function must go through
        :meth:`execute` and :meth:`wait` (invalidated, a run pending, a source changed, an
        input ``feed`` refuses). A step's error is raised as :meth:`wait` raises it.

        Parameters
        ----------
        fed : collection of HostTensorND
            Host tensors of inputs that ``feed`` checks itself (their memory is the one the
            plan was built for, and values are copied into it): their sources are not
            checked again.
        feed : callable, optional
            ``feed(args) -> bool``: sets the inputs, or returns False where it can not.
        result : callable, optional
            What ``run`` returns after the steps ran.
        """
        plan = self._plan
        if (
            plan is None
            or not self._valid
            or self._running
            or len(self.parts) != 1
            or self._observers
            or (self._threaded and not plan.inline[0])
        ):
            return None
        steps = tuple(plan.steps[0])
        if len({id(s) for s in steps}) != len(steps):
            return None  # a step's error is traced to its operator by the step's identity
        fed = {id(t) for t in fed}
        others = []
        for opr, watch_value, state in plan.states:
            t = getattr(opr, "tensor", None)
            if opr.runtime_state(watch_value) != state:
                return None
            if watch_value or id(t) not in fed or state != t.memory_state:
                others.append((opr, watch_value, state))
        others = tuple(others)
        step_oprs, slots, env = plan.step_oprs[0], self._slots, self._env
        # dynamic vars live in the slots during a run (one part: empty between runs)
        dynamic = bool(plan.dynamic)
        feed = feed or (lambda args: not args)
        result = result or _none
        clock = time.perf_counter

        def run(args):
            if self._plan is not plan or not self._valid or self._running or not feed(args):
                return MISS
            # after the feed: a fed input whose value static inference read is watched here
            for opr, watch_value, state in others:
                if opr.runtime_state(watch_value) != state:
                    return MISS
            err = None
            t0 = clock()
            try:
                for step in steps:
                    step()
            except BaseException as exc:  # noqa: BLE001 - raised below as wait() does
                i = next(i for i, s in enumerate(steps) if s is step)
                err = env._wrap_error(step_oprs[i], exc)
            if dynamic:
                slots.clear()  # dynamic memory is freed after the run
            self.prev_exec_time = clock() - t0
            if err is not None:
                raise err
            return result()

        return run

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
                static_requests(self.seq[start:end]), set(self.seq[:start])
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
        ("static" planned, "forward" a view of another var, "inplace", "part" a range of a
        Concat's output its producer writes in place, or "dynamic")."""
        plan = self._ensure_plan()
        out = []
        for opr in self.seq:
            for v in opr.outputs:
                arr = plan.arrays.get(v)
                kind = "dynamic" if arr is None else _MEM_KINDS[plan.decisions[v][0]]
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

    # ---- planning (the var memory manager) and binding (the exec environment) -------------
    def _states_changed(self, plan: Plan) -> bool:
        return self._planner.states_changed(plan)

    def _replan_between_parts(self, part: int) -> Plan:
        """Re-plan before ``part`` of a multi-part sequence (an input of a later part got a
        new shape, or a new value that its static inference reads), moving the values that
        earlier parts computed and later parts read into the new plan's memory."""
        old = self._plan
        if old is None:
            raise GraphError(
                f"multi-part function: part {part} executed after the device memory was "
                "cleared; run the sequence again from part 0"
            )
        new = self._build_plan(allocate=True)
        self._planner.move_part_values(old, new, part)
        self._plan = new
        return new

    def _ensure_plan(self) -> Plan:
        plan = self._plan
        if plan is not None and not self._planner.states_changed(plan):
            return plan
        self._plan = plan = self._build_plan(allocate=True)
        return plan

    @gc_paused()
    def _build_plan(self, allocate: bool) -> Plan:
        plan = self._planner.build(allocate)
        if allocate:
            self._env.bind(plan)
        return plan

    def _bind_program(self, plan: Plan) -> None:
        """Bind every operator into a step list per part (and per comp node if threaded)."""
        self._env.bind(plan)


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
