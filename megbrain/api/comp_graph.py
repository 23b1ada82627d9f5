"""The binding's CompGraph and AsyncExec, and ``comp_graph()`` that creates a graph."""

from __future__ import annotations

import os
import sys
import threading
import warnings
from collections.abc import Sequence

import numpy as np

from .. import gopt
from ..errors import ArgumentError, GraphError, MegBrainError, is_user_exception
from ..graph import ComputingGraph, GraphOptions
from ..graph.executor import MISS, AsyncExecutable
from ..graph.mem_planner import gc_paused
from ..opr.base import SymbolVar, as_var
from .callback import CallbackWorker, FuncOutputSaver, copy_output, make_graph_callback
from .cgtools import _pair_list
from .shared import _fast_feeder

__all__ = ["CompGraph", "AsyncExec", "comp_graph"]


class CompGraph(ComputingGraph):
    """A computing graph as users see it: options, user data, compile."""

    def __init__(self, options: GraphOptions | None = None):
        super().__init__(options)
        self._released = False
        #: held by every call of a function compiled from this graph (copies and parts
        #: included: they share its input tensors), so concurrent calls take turns
        self._run_lock = threading.RLock()
        gopt.install(self)

    def __eq__(self, other) -> bool:
        return isinstance(other, CompGraph) and other.id == self.id

    def __hash__(self) -> int:
        return hash(("CompGraph", self.id))

    def __repr__(self) -> str:
        return f"<CompGraph #{self.id} at {id(self):#x}>"

    def _id(self) -> int:
        """The graph's id, unique in the process."""
        return self.id

    def set_option(self, name: str, val):
        """Set graph option ``name`` (a :class:`GraphOptions` field); returns the old value."""
        return self.options.set(name, val)

    def is_eager(self) -> bool:
        return bool(self.options.eager_evaluation)

    def release(self) -> int:
        """Release the graph, as the reference destroys it: its current function is
        invalidated, and from now on :meth:`get`, making vars and compiling on it raise.

        Returns
        -------
        int
            The use count before the release: 1 the first time (this object owned the
            graph), 0 once it has been released.
        """
        if self._released:
            return 0
        with self._run_lock:
            if self.current_exec is not None:
                self.current_exec._invalidate()
                self.current_exec = None
        self._released = True

        def refuse(graph, opr):
            raise GraphError(
                f"{opr.type_name}: can not add an operator to CompGraph #{graph.id}: the graph "
                "has been released"
            )

        # every operator insertion (vars, constants, shared tensors) runs the rewriters first
        self.insert_rewriters.insert(0, refuse)
        return 1

    def get(self):
        if self._released:
            raise MegBrainError("CompGraph has been destructed")
        return self

    # ---- compile ---------------------------------------------------------------------------
    @gc_paused()
    def compile(self, inputs, outspec, *, copy: bool = False, optimize_for_inference=False):
        """Compile ``outspec`` into an :class:`AsyncExec`.

        Parameters
        ----------
        inputs:
            Input vars in positional-argument order, or None for keyword arguments only.
        outspec:
            A ``copy_output``, or a list of ``copy_output``, bare vars (compute only) and
            ``(var, callback)`` pairs.
        copy:
            Compile a copy of the graph when it has a current function, which then stays
            valid; without one, compile in place (as the reference). Eager graphs always
            compile a non-eager copy.
        """
        if self._released:
            raise GraphError(f"compile: CompGraph #{self.id} has been released")
        expand_single = isinstance(outspec, copy_output)
        if not expand_single and not isinstance(outspec, (list, tuple)):
            raise TypeError(
                "CompGraph.compile: outspec must be a copy_output or a list of copy_output, "
                f"vars and (var, callback) pairs; got {type(outspec).__name__}"
            )
        items = [outspec] if expand_single else list(outspec)
        for item in items:
            _item_var(item)  # a bad entry raises here, before any copy or optimization
        user_outs = _user_copy_outputs(items)
        if optimize_for_inference:
            # gopt::optimize_for_inference with default options, before any graph copy
            items = _map_item_vars(items, gopt.optimize_nodes_for_inference)
        target, trans = self, {}
        if (copy and self.current_exec is not None) or self.is_eager():
            # compile a non-eager copy; this graph's current function stays valid
            opts = self.options.copy()
            opts.eager_evaluation = False
            target = CompGraph(opts)
            holder = {}

            def copier(vs):
                new, holder["trans"] = _copy_into(self, target, vs)
                return new

            items = _map_item_vars(items, copier)
            trans = holder.get("trans", {})
        items = _optimize_and_expand(target, items)
        func = AsyncExec(target, self._run_lock)
        func._input_trans = trans
        spec, copied = _process_outspec(func, items)
        with self._run_lock:  # compiling in place invalidates the function another call runs
            core = target.compile_graph_level(spec)
        func._bind(core, copied, expand_single, user_outs)
        if inputs is not None:
            func.inputs = inputs
        return func

    def compile_graph_level(self, spec):
        return ComputingGraph.compile(self, spec)

    def compile_outonly(self, outputs, *, inputs=None):
        """Compile with every var of ``outputs`` copied out."""
        if isinstance(outputs, (list, tuple)):
            return self.compile(inputs, [copy_output(v) for v in outputs])
        return self.compile(inputs, copy_output(outputs))

    @gc_paused()
    def compile_multi_part(self, io_specs):
        """Compile ``[(inputs, outspec), ...]`` into AsyncExecs that must run in order.

        Each part runs only what its outputs need and reuses values computed by earlier
        parts; running part 0 again starts a new sequence.
        """

        if self._released:
            raise GraphError(f"compile_multi_part: CompGraph #{self.id} has been released")
        if self.is_eager():
            raise MegBrainError("compile_multi_part is not supported on eager graphs")
        # optimize all parts together: rewrites then see every part's readers, so a later
        # part reuses values an earlier part computed instead of a rewritten copy
        parsed, all_items = [], []
        what = "a list of (inputs, outspec) pairs, one per part"
        for inputs, outspec in _pair_list(io_specs, "compile_multi_part", "io_specs", what):
            expand_single = isinstance(outspec, copy_output)
            items = [outspec] if expand_single else list(outspec)
            parsed.append((inputs, expand_single, _user_copy_outputs(items), len(items)))
            all_items.extend(items)
        all_items = _optimize_and_expand(self, all_items)
        funcs, specs, extra = [], [], []
        start = 0
        for inputs, expand_single, user_outs, n in parsed:
            items = all_items[start : start + n]
            start += n
            func = AsyncExec(self, self._run_lock)
            spec, copied = _process_outspec(func, items)
            funcs.append(func)
            specs.append(spec)
            extra.append((copied, expand_single, inputs, user_outs))
        with self._run_lock:
            parts = ComputingGraph.compile_multi_part(self, specs)
        for func, part, (copied, expand_single, inputs, user_outs) in zip(funcs, parts, extra):
            func._bind(part, copied, expand_single, user_outs)
            if inputs is not None:
                func.inputs = inputs
        return funcs

    # forwarders to the module functions
    def make_shared(self, comp_node, **kw):
        from .shared import make_shared

        return make_shared(comp_node, comp_graph=self, **kw)

    def make_immutable(self, comp_node, value, **kw):
        from .shared import make_immutable

        return make_immutable(comp_node, self, value, **kw)

    def make_arg(self, comp_node, **kw):
        from .shared import make_arg

        return make_arg(comp_node, self, **kw)

    def clear_device_memory(self) -> None:
        """Free the static memory of the current function (the next run re-allocates)."""
        if self.current_exec is not None:
            self.current_exec.clear_device_memory()

    def get_mem_allocation_info(self) -> str:
        """JSON list with one ``{opr_id: {"name", "output": [...]}}`` entry per operator of
        the graph, in insertion order; each output is ``{"name", "memory", "dev_ptr"}``
        (bytes and address, null when the var has no memory now) plus our ``id`` and
        ``kind`` (static, forward, inplace, dynamic). An operator with a planned workspace
        also has ``"workspace": {"memory", "dev_ptr"}``. For a compiled graph the numbers
        are those of the current function's plan; for an eager graph the vars' values.
        """
        import json

        planned, workspaces = {}, {}
        if self.current_exec is not None:
            for d in self.current_exec.mem_alloc_info():
                if d["kind"] == "workspace":
                    workspaces[d["opr"]] = {"memory": d["size"], "dev_ptr": d["addr"]}
                else:
                    planned[d["id"]] = d
        eager = self.options.eager_evaluation
        oprs = sorted(getattr(self, "_weak_oprs", ()), key=lambda o: o.id) if eager else self.oprs

        def var_info(v):
            d = planned.get(v.id)
            if d is not None and d["kind"] != "dynamic":
                mem, ptr, kind = d["size"], d["addr"], d["kind"]
            else:
                arr = getattr(v, "eager_value", None) if eager else None
                if arr is None:
                    mem = ptr = None
                else:
                    mem, ptr = int(arr.nbytes), int(arr.__array_interface__["data"][0])
                kind = "dynamic"
            return {"name": v.name, "memory": mem, "dev_ptr": ptr, "id": v.id, "kind": kind}

        out = []
        for opr in oprs:
            body = {"name": opr.name, "output": [var_info(v) for v in opr.outputs]}
            if opr.id in workspaces:
                body["workspace"] = workspaces[opr.id]
            out.append({str(opr.id): body})
        return json.dumps(out)

    def share_device_memory_with(self, other: CompGraph) -> None:
        """Accepted for compatibility: each function owns its arena here (no sharing)."""


def _process_outspec(func: AsyncExec, items):
    """Graph-level ``[(var, callback)]`` and the copy_output savers of outspec ``items``."""
    spec, savers, copied = [], {}, []
    for item in items:
        if isinstance(item, copy_output):
            v = _var_of(item.symvar)
            key = (v, item.borrow_mem)
            saver = savers.get(key)
            if saver is None:
                saver = savers[key] = FuncOutputSaver(item.borrow_mem)
                spec.append((v, saver.save_array))
            copied.append((v, saver))
        elif isinstance(item, (tuple, list)) and len(item) == 2 and callable(item[1]):
            v = _var_of(item[0])
            spec.append((v, make_graph_callback(item[1], v, func._cb_worker)))
        else:
            spec.append((_var_of(item), None))
    return spec, copied


def _user_copy_outputs(items) -> list:
    """The user's vars of the copy_output items, before any graph copy or optimization."""
    return [_var_of(it.symvar) for it in items if isinstance(it, copy_output)]


def _optimize_and_expand(graph, items):
    """Optimize the forward graph, expand VirtualGrads over it, then optimize the result
    (the gradient is built from the optimized forward graph, as in the reference)."""
    from ..opr.grad import expand_virtual_grads

    # memory passes (sublinear recomputation) run last, on the graph with its gradients:
    # gradients built through recomputed clones would be summed in another order
    def body(vs):
        return gopt.optimize_for_compile(graph, vs, skip=_MEMORY_PASSES)

    items = _map_item_vars(items, body)
    expanded = _map_item_vars(items, expand_virtual_grads)
    if expanded is not items:
        items = _map_item_vars(expanded, body)
    return _map_item_vars(
        items, lambda vs: gopt.optimize_for_compile(graph, vs, only=_MEMORY_PASSES)
    )


_MEMORY_PASSES = ("sublinear_memory",)


def _item_var(item):
    if isinstance(item, copy_output):
        return _var_of(item.symvar)
    if isinstance(item, (tuple, list)) and len(item) == 2 and callable(item[1]):
        return _var_of(item[0])
    return _var_of(item)


def _map_item_vars(items, mapper):
    """Apply ``mapper(list of VarNode) -> list of VarNode`` to the vars of outspec items."""
    old = [_item_var(it) for it in items]
    new = mapper(old)
    if all(a is b for a, b in zip(new, old)):
        return items
    out = []
    for item, v in zip(items, new):
        if isinstance(item, copy_output):
            out.append(copy_output(SymbolVar(v), borrow_mem=item.borrow_mem))
        elif isinstance(item, (tuple, list)) and len(item) == 2 and callable(item[1]):
            out.append((SymbolVar(v), item[1]))
        else:
            out.append(SymbolVar(v))
    return out


def _copy_into(src: CompGraph, dst: CompGraph, vars_):
    """Copy the subgraph of ``vars_`` into ``dst``; returns (new vars, new->original inputs)."""
    from ..graph.replace import replace_vars

    memo = dst.__dict__.setdefault("inter_graph_trans", {})
    new = replace_vars(vars_, {}, graph=dst, memo=memo)
    trans = {}
    for opr in dst.all_oprs():
        if opr.type_name == "Host2DeviceCopy":
            orig = src.user_input_vars.get(id(opr.tensor))
            if orig is not None:
                dst.user_input_vars[id(opr.tensor)] = opr.outputs[0]
                trans[opr.outputs[0]] = orig
    return new, trans


def _var_of(x):
    v = as_var(x)
    if v is None:
        raise TypeError(f"CompGraph.compile: expect a SymbolVar in outspec, got {x!r}")
    return v


def _feed(items, borrow: bool) -> None:
    """Set each ``((var, host proxy), value)`` input of a compiled function; a value that
    does not convert raises an ArgumentError naming the input."""
    for (var, proxy), val in items:
        try:
            proxy.set_value(val, borrow=borrow)
        except (TypeError, ValueError) as exc:
            if isinstance(exc, MegBrainError):
                raise
            shown = repr(val) if len(repr(val)) <= 60 else repr(val)[:57] + "..."
            raise ArgumentError(
                f"compiled function: input {var.name!r} takes an array of "
                f"{np.dtype(var.dtype).name}, got {type(val).__name__} {shown} ({exc})"
            ) from exc


class _CallHook:
    """A function called by every call (None: nothing); setting it drops the bound fast
    call, which runs without hooks."""

    def __set_name__(self, owner, name):
        self.attr = "_" + name

    def __get__(self, obj, owner=None):
        return self if obj is None else getattr(obj, self.attr)

    def __set__(self, obj, fn) -> None:
        setattr(obj, self.attr, fn)
        obj._drop_fast()


class AsyncExec:
    """A compiled function. Only the most recently compiled AsyncExec of a graph can be used.

    Calling it sets the inputs (positional in :attr:`inputs` order, or keyword by var name),
    runs, waits (unless :meth:`disable_auto_wait`) and returns the ``copy_output`` values.
    Calls from several threads take turns: a call holds ``lock`` (shared by the functions
    compiled from one graph) from setting the inputs to reading the outputs.
    """

    #: called at the start of every call
    callbefore_func = _CallHook()
    #: called by every call once its run started
    callback_func = _CallHook()

    def __init__(self, graph: CompGraph, lock=None):
        self.graph = graph
        #: held for a whole call; reentrant, so that a thread holding it may call
        self.lock = lock if lock is not None else threading.RLock()
        self._callbefore_func = None
        self._callback_func = None
        self._func = None
        self._cb_worker = CallbackWorker(f"func{id(self):x}")
        self._inputs = None  # list of (var, host proxy)
        self._inputs_explicit = False
        self._savers: list = []
        self._available: tuple = ()
        self._output_vars: list = []
        self._expand_single = False
        self._auto_wait = True
        self._borrow_on_cpu = False
        self._warned_keys = False
        #: input var of a copied graph -> the user's original input var
        self._input_trans: dict = {}
        #: the common call bound to the plan ``_fast_plan`` (see ``_make_fast``)
        self._fast = None
        self._fast_plan = None

    def _bind(self, func, copied, expand_single, user_outs=None):
        """``copied``: ``[(compiled var, saver)]`` per copy_output item; ``user_outs``: the
        user's vars of those items (they differ after a graph copy or an optimization)."""
        self._func = func
        if user_outs is None or len(user_outs) != len(copied):
            user_outs = [v for v, _ in copied]
        self._var2output_saver = dict(copied)
        self._var2output_saver.update(zip(user_outs, (s for _, s in copied)))
        self._savers = [s for _, s in copied]
        self._output_vars = [SymbolVar(v) for v in user_outs]
        self._available = tuple(dict.fromkeys(self._output_vars))
        self._expand_single = expand_single and len(copied) == 1

    def __del__(self):
        # as the reference's destructor: finish the run and the eager callbacks still pending
        # before the callback worker goes. Not from a callback dropping the last reference
        # (it can not wait for itself), nor while the interpreter finalizes (worker threads
        # no longer run). Nothing can be raised from here: a failed run becomes a warning.
        worker = getattr(self, "_cb_worker", None)
        if worker is None:
            return
        try:
            if self._func is not None and not worker.on_thread() and not sys.is_finalizing():
                self.wait()
        except BaseException as exc:  # noqa: BLE001 - reported, not raised, at teardown
            try:
                warnings.warn(
                    f"AsyncExec deleted after a failed run: {type(exc).__name__}: {exc}",
                    RuntimeWarning,
                    stacklevel=1,
                )
            except Exception:  # noqa: BLE001 - warnings may be gone at interpreter exit
                pass
        finally:
            worker.stop()

    # ---- inputs ----------------------------------------------------------------------------
    def _find_mutable_input(self) -> set:
        """The user input vars (made by make_arg) that this function actually reads.

        Those the comp seq copies in, and those read only through static inference (a
        reshape to ``b.shape``, an index var): a new shape or value of either re-plans.
        """
        found = set()
        user_vars, trans = self.graph.user_input_vars, self._input_trans
        oprs = list(self._func.iter_opr_seq())
        oprs += [v.owner for v, _ in self._func.get_rt_static_source_deps()]
        for opr in oprs:
            if opr.type_name == "Host2DeviceCopy":
                var = user_vars.get(id(opr.tensor))
                if var is not None:
                    found.add(SymbolVar(trans.get(var, var)))
        return found

    @property
    def inputs(self) -> tuple:
        if self._inputs is None:
            self._set_inputs(sorted(self._find_mutable_input(), key=lambda v: v.id), False)
        return tuple(v for v, _ in self._inputs)

    @inputs.setter
    def inputs(self, vars_):
        if vars_ is None:
            self._inputs = None
            self._inputs_explicit = False
            self._drop_fast()
            return
        needed = self._find_mutable_input()
        given = [SymbolVar(_var_of(v)) for v in vars_]
        extra = [v for v in given if v not in needed]
        if extra:
            raise TypeError(
                f"vars {[v.name for v in extra]} are not inputs of this function; "
                f"its inputs are {sorted(v.name for v in needed)}"
            )
        missing = needed - set(given)
        if missing:
            raise AssertionError(
                f"inputs {sorted(v.name for v in missing)} are needed by the function but not given"
            )
        self._set_inputs(given, True)

    def _set_inputs(self, vars_, explicit):
        from .shared import _HostSharedND

        names = [v.name for v in vars_]
        if len(set(names)) != len(names):
            raise AssertionError(f"duplicated input names: {names}")
        pairs = []
        for v in vars_:
            proxy = _HostSharedND.make_proxy(v)
            proxy.enable_borrow_on_cpu(self._borrow_on_cpu)
            pairs.append((v, proxy))
        self._inputs = pairs
        self._inputs_explicit = explicit
        self._drop_fast()

    def enable_borrow_on_cpu(self, flag: bool = True) -> None:
        """Let inputs on CPU borrow the caller's arrays instead of copying them."""
        self._borrow_on_cpu = bool(flag)
        self._drop_fast()
        if self._inputs is not None:
            for _, p in self._inputs:
                p.enable_borrow_on_cpu(flag)

    def _setup_args(self, args, kwargs):
        if args:
            if not self._inputs_explicit:
                raise MegBrainError(
                    "positional arguments are only allowed when inputs were given at compile"
                )
            pairs = self._inputs
            if len(args) != len(pairs):
                raise TypeError(f"function takes {len(pairs)} inputs, got {len(args)}")
            _feed(zip(pairs, args), self._auto_wait)
        if kwargs:
            if self._inputs is None:
                self.inputs  # noqa: B018 - computes the inputs
            by_name = {v.name: (v, p) for v, p in self._inputs}
            missing = set(by_name) - set(kwargs)
            if missing and not args:
                raise AssertionError(f"missing inputs: {sorted(missing)}")
            extra = set(kwargs) - set(by_name)
            if extra and not self._warned_keys:
                self._warned_keys = True
                warnings.warn(f"extra inputs ignored: {sorted(extra)}", stacklevel=3)
            _feed(((by_name[k], val) for k, val in kwargs.items() if k in by_name), self._auto_wait)

    # ---- run -------------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        with self.lock:  # another thread's call finishes first (inputs, memory, outputs)
            if kwargs:
                return self._call(args, kwargs)
            fast = self._fast
            if fast is not None:
                out = fast(args)
                if out is not MISS:
                    return out
            out = self._call(args, kwargs)
            if self._fast_plan is not getattr(self._func, "_plan", self._fast_plan):
                self._fast = self._make_fast()  # a new plan (or the first): bind it
            return out

    def _call(self, args, kwargs):
        """The general call: any inputs, callbacks, asynchronous functions."""
        if self._callbefore_func is not None:
            self._callbefore_func()
        if args or kwargs:
            if not self._auto_wait:
                self._func.wait()  # the previous run may still be reading the inputs
            pairs = self._inputs
            if not kwargs and self._inputs_explicit and len(args) == len(pairs):
                _feed(zip(pairs, args), self._auto_wait)  # the hot path: positional inputs
            else:
                self._setup_args(args, kwargs)
        self._func.execute()
        if self._callback_func is not None:
            self._callback_func()
        if not self._auto_wait:
            return list(self._savers) if self._savers else None
        self._wait()
        if not self._savers:
            return None
        if self._expand_single:
            return self._savers[0].get()
        return [s.get() for s in self._savers]

    def _make_fast(self):
        """``fast(args)``: a call of the current plan bound once, for the common case (a
        function of one part run on the caller's thread, waited for, with positional
        ndarray inputs of the planned shapes and dtypes or none, no callbacks but the
        outputs' copies); it returns the call's value, or ``MISS`` where the general call
        must run instead, having run nothing (it may have copied some inputs in, as the
        general call does again). None where the function never takes it."""
        core = self._func
        self._fast_plan = getattr(core, "_plan", None)
        if (
            not isinstance(core, AsyncExecutable)
            or not self._auto_wait
            or self._callbefore_func is not None
            or self._callback_func is not None
        ):
            return None
        if any(
            cb is not None and not isinstance(getattr(cb, "__self__", None), FuncOutputSaver)
            for _, cb in core.outspec
        ):
            return None  # user callbacks run on the callback worker: the general wait
        fed = [p for _, p in self._inputs] if self._inputs_explicit else []
        feed = _fast_feeder(fed)
        if feed is None:
            return None
        savers = tuple(self._savers)
        if self._expand_single:
            result = savers[0].get
        elif savers:

            def result():
                return [s.get() for s in savers]

        else:
            result = None
        return core.fast_runner([p.tensor for p in fed], feed, result)

    def _drop_fast(self) -> None:
        """Forget the bound fast call: the next call takes the general path and binds again."""
        self._fast = self._fast_plan = None

    def execute(self) -> AsyncExec:
        """Start a run without setting inputs."""
        with self.lock:
            self._func.execute()
        return self

    def wait(self) -> AsyncExec:
        """Wait for the run and drain its callbacks; re-raise the first error.

        The device is waited for first: a run dispatches its eager callbacks while it runs,
        so draining the callback worker before the run ended could miss the last ones.
        """
        with self.lock:
            return self._wait()

    def _wait(self) -> AsyncExec:
        cbw = self._cb_worker
        try:
            self._func.wait()
        finally:
            if cbw._pending:  # no calls on the hot path, which pays for the call lock
                cbw.wait()
            err = cbw.error
        if err is not None:
            cbw.error = None
            if isinstance(err, MegBrainError) or is_user_exception(err):
                raise err  # a callback's own exception reaches the caller as it is
            if not isinstance(err, Exception):
                raise err  # KeyboardInterrupt, SystemExit: caught by their type
            raise MegBrainError(f"callback worker failed: {type(err).__name__}: {err}") from err
        return self

    def disable_auto_wait(self) -> None:
        """``__call__`` returns without waiting; outputs are FuncOutputSaver objects."""
        self._auto_wait = False
        self._drop_fast()

    @property
    def prev_exec_time(self) -> float:
        return self._func.prev_exec_time

    @property
    def available_outputs(self) -> tuple:
        return self._available

    @property
    def outputs(self) -> tuple:
        """The vars whose values a call returns, in order (settable: reorder/duplicate)."""
        return tuple(self._output_vars)

    @outputs.setter
    def outputs(self, vars_: Sequence):
        savers = []
        for v in vars_:
            node = _var_of(v)
            if node not in self._var2output_saver:
                raise GraphError(f"var {node.name!r} is not a copy_output of this function")
            savers.append(self._var2output_saver[node])
        self._savers = savers
        self._output_vars = [SymbolVar(_var_of(v)) for v in vars_]
        self._expand_single = False
        self._drop_fast()

    def dump(self) -> dict:
        """The internal graph and execution sequence as JSON."""
        return self._func.to_json()

    def clear_device_memory(self) -> None:
        with self.lock:
            self._wait()
            self._func.clear_device_memory()

    def update_static_alloc_plan_and_get_size(self) -> dict:
        """``{comp_node: bytes}`` of the static memory plan, without allocating."""
        return self._func.update_static_alloc_plan_and_get_size()


def comp_graph(*, extra_opts: dict | None = None, check_env_var: bool = True) -> CompGraph:
    """Create a :class:`CompGraph`.

    With ``check_env_var``, ``MGB_COMP_GRAPH_OPT="k=v;k2=v2"`` adds options (``extra_opts``
    win; a warning lists what was taken from the env) and
    ``MGB_COMP_GRAPH_USER_DATA="k=pyexpr;..."`` fills user_data with the evaluated
    expressions, as the reference does.
    """
    opts = dict(extra_opts or {})
    cg = CompGraph()
    if check_env_var:
        env = os.environ.get("MGB_COMP_GRAPH_OPT")
        if env:
            from_env = {}
            for item in filter(None, env.split(";")):
                k, _, v = item.partition("=")
                from_env[k.strip()] = v.strip()
                opts.setdefault(k.strip(), v.strip())
            warnings.warn(
                f"set comp graph option from env MGB_COMP_GRAPH_OPT: {from_env}"
                + (f" (extra_opts take precedence: {extra_opts})" if extra_opts else ""),
                stacklevel=2,
            )
        env = os.environ.get("MGB_COMP_GRAPH_USER_DATA")
        if env:
            for item in filter(None, env.split(";")):
                k, _, v = item.partition("=")
                cg.user_data[k.strip()] = eval(v.strip(), {})  # noqa: S307 - as the reference
    for k, v in opts.items():
        cg.set_option(k, v)
    return cg
