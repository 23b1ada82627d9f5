"""The Loop operator (``make_loop``) and its gradient (LoopGrad).

A loop owns a sub graph built by the user's ``desc_maker`` over a :class:`LoopDesc`. Outer
vars enter through :meth:`LoopDesc.add_input` as :class:`LoopInput` sources of the sub graph;
the sub graph is compiled once into a function (fetching the loop condition, the assigned
values and the outputs) and run once per iteration. The loop is a do-while: the body runs,
its outputs are recorded, and while ``|cond| > 1e-6`` the assignments are applied, the
counter (int32, 0 at the first iteration) is incremented and the body runs again.

Gradient: the forward run keeps, per iteration, a host copy of every assigned input's value
(NumPy arrays: the device memory is host memory, so the reference's ``swap_interval``, which
chose how often such copies moved from device to host, has nothing to control and is only
validated). LoopGrad replays the iterations backwards on a second sub graph (``desc_maker``
called again) holding the symbolic gradient of one iteration: ``d/d(inputs)`` of
``sum(out_j * g_j) + sum(next_i * h_i)``, where ``g_j`` is the output's gradient for that
iteration and ``h_i`` the gradient of the assigned input ``i`` one iteration later (zero after
the last iteration, whose assignments are not applied).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import GraphError, MegBrainError
from ..graph import (
    ComputingGraph,
    InferPending,
    InferType,
    OperatorNodeBase,
    ParamBase,
    register_opr,
)
from ..graph.operator import fmt_shape
from ..graph.static_infer import Inferer, static_shape
from ..serialization import sereg
from .base import SymbolVar, _merge_config, as_var, insert_opr, make_opr_config
from .basic_arith import elemwise, reduce_
from .grad import grad
from .param_args import as_int

__all__ = ["Loop", "LoopDesc", "LoopGrad", "LoopInput", "make_loop"]

_I32 = np.dtype(np.int32)
_MODES = ("LAST", "ALL", "SUM")


@register_opr
class LoopInput(OperatorNodeBase):
    """A source of a loop's sub graph: its value is set by the loop before each iteration."""

    type_name = "LoopInput"
    has_runtime_state = True
    value_inferable = False
    dedup = False

    def __init__(self, dtype, comp_node, name: str):
        super().__init__([], None, make_opr_config(name=name, comp_node=comp_node))
        self._dtype = np.dtype(dtype)
        self.value: np.ndarray | None = None

    def source_infer(self):
        return [(InferType.RT_STATIC, InferType.MISSING)]

    def infer_dtypes(self, in_dtypes):
        return [self._dtype]

    def infer_shapes(self, in_shapes, in_values):
        if self.value is None:
            raise InferPending(f"LoopInput {self.name!r}: no value before the loop runs")
        return [self.value.shape]

    def runtime_state(self, watch_value=False):
        return None if self.value is None else self.value.shape

    def bind(self, ins, outs):
        out = outs[0]
        return lambda: np.copyto(out, self.value)

    def set(self, value: np.ndarray) -> None:
        self.value = np.array(value, dtype=self._dtype, copy=True)


class LoopDesc:
    """Describes a loop's sub graph; handed to the ``desc_maker`` of :func:`make_loop`.

    The vars the body builds belong to the sub graph: outer vars enter only through
    :meth:`add_input`.
    """

    def __init__(self, outer_graph, comp_node, loop_name: str):
        #: the outer graph (None: taken from the first add_input) and the sub graph, made
        #: of the outer graph's class when it is known
        self.outer_graph = outer_graph
        self.loop_name = loop_name
        self.comp_node = comp_node
        self._graph = None
        #: (outer var, LoopInput, has_assign) per add_input call
        self.inputs: list[tuple] = []
        self.assigns: dict = {}  # LoopInput -> sub var
        self.cond = None
        self.outputs: list[tuple] = []  # (sub var, mode)
        self.counter: LoopInput | None = None

    @property
    def graph(self):
        if self._graph is None:
            self._graph = ComputingGraph() if self.outer_graph is None else type(self.outer_graph)()
        return self._graph

    def _where(self) -> str:
        return f"make_loop (loop {self.loop_name!r})"

    def _sub_var(self, var, what: str):
        v = as_var(var)
        if v is None or v.graph is not self.graph:
            raise GraphError(
                f"{self._where()}: {what} must be a var of the loop's sub graph (built from "
                f"the vars add_input returned), got {var!r}"
            )
        return v

    def add_input(self, input, has_assign: bool = False) -> SymbolVar:
        """Forward the outer var ``input`` into the sub graph; return the sub graph's var.

        With ``has_assign`` its value may be replaced after each iteration (:meth:`assign`).
        """
        v = as_var(input)
        if v is not None and self.outer_graph is None and v.graph is not self._graph:
            self.outer_graph = v.graph
            if self.comp_node is None:
                self.comp_node = v.comp_node
        if v is None or v.graph is not self.outer_graph:
            raise GraphError(
                f"{self._where()}: add_input takes a var of the loop's outer graph, got "
                f"{input!r}"
            )
        src = LoopInput(v.dtype, self.comp_node, f"{self.loop_name}:in{len(self.inputs)}")
        shape = _static_shape(v)
        if shape is not None:
            src.value = np.zeros(shape, v.dtype)  # shapes of the body known while building
        (out,) = self.graph.insert_opr(src)
        self.inputs.append((v, src, bool(has_assign)))
        return SymbolVar(out)

    def add_input_assignable(self, input) -> SymbolVar:
        """``add_input(input, has_assign=True)``."""
        return self.add_input(input, True)

    def assign(self, dest, val) -> LoopDesc:
        """After each iteration (but the last), ``dest`` (from ``add_input(..,
        has_assign=True)``) takes the value of ``val``."""
        d = self._sub_var(dest, "assign's dest")
        src = d.owner
        entry = next((e for e in self.inputs if e[1] is src), None)
        if entry is None or not entry[2]:
            raise GraphError(
                f"{self._where()}: assign's dest {d.name!r} is not an input added with "
                "has_assign=True"
            )
        val = self._sub_var(val, "assign's val")
        if val.dtype != d.dtype:
            raise GraphError(
                f"{self._where()}: assign to {d.name!r} ({d.dtype.name}) a value of dtype "
                f"{val.dtype.name}"
            )
        if src in self.assigns:
            raise GraphError(f"{self._where()}: {d.name!r} is assigned twice")
        self.assigns[src] = val
        return self

    def set_loop_condition(self, cond) -> LoopDesc:
        """Repeat while ``|cond| > 1e-6``; ``cond`` must be a scalar."""
        c = self._sub_var(cond, "the loop condition")
        shape = _static_shape(c)
        if shape is not None and int(np.prod(shape)) != 1:
            raise GraphError(
                f"{self._where()}: the loop condition {c.name!r} must be a scalar, got "
                f"shape {fmt_shape(shape)}"
            )
        self.cond = c
        return self

    def get_counter_var(self) -> SymbolVar:
        """The int32 (1,) count of iterations completed so far (0 in the first)."""
        if self.counter is None:
            if self.comp_node is None:
                raise GraphError(
                    f"{self._where()}: call add_input (or give comp_node=) before "
                    "get_counter_var"
                )
            self.counter = LoopInput(_I32, self.comp_node, f"{self.loop_name}:counter")
            self.counter.value = np.zeros(1, _I32)
            self.graph.insert_opr(self.counter)
        return SymbolVar(self.counter.outputs[0])

    def add_output(self, var, mode: str) -> int:
        """Record ``var`` as an output: ``"last"`` (its value in the last iteration),
        ``"all"`` (every iteration's, stacked on a new axis 0) or ``"sum"``; returns the
        output's index."""
        v = self._sub_var(var, "add_output's var")
        m = str(mode).upper() if isinstance(mode, str) else None
        if m not in _MODES:
            raise GraphError(
                f"{self._where()}: unrecognized loop output mode {mode!r}; expected one of "
                "'last', 'all', 'sum'"
            )
        self.outputs.append((v, m))
        return len(self.outputs) - 1

    # ---- used by the operators ------------------------------------------------------------
    def check(self) -> None:
        if self.cond is None:
            raise GraphError(f"{self._where()}: the body never called set_loop_condition")
        if not self.outputs:
            raise GraphError(f"{self._where()}: the body added no output (add_output)")
        if not self.inputs:
            raise GraphError(f"{self._where()}: the body added no input (add_input)")

    def set_inputs(self, ins, states=None) -> None:
        for k, ((_, src, has_assign), a) in enumerate(zip(self.inputs, ins)):
            src.set(states[k] if states is not None and has_assign else a)


def _static_shape(v):
    try:
        return static_shape(v)
    except MegBrainError:
        return None


def _build_desc(desc_maker, outer_graph, cn, name) -> LoopDesc:
    desc = LoopDesc(outer_graph, cn, name)
    try:
        desc_maker(desc)
    except GraphError as exc:
        msg = str(exc)
        if "graph" in msg and desc._where() not in msg:
            raise GraphError(
                f"{desc._where()}: {msg}; a loop body may use vars of the outer graph only "
                "through desc.add_input"
            ) from exc
        raise
    desc.check()
    return desc


class _SubFunc:
    """The compiled sub graph: run once, fetch copies of the listed vars."""

    def __init__(self, graph, vars_):
        self.vals: list = [None] * len(vars_)

        def saver(k):
            def cb(arr):
                self.vals[k] = np.array(arr, copy=True)

            return cb

        self.func = ComputingGraph.compile(graph, [(v, saver(k)) for k, v in enumerate(vars_)])

    def __call__(self) -> list:
        self.func.execute()
        self.func.wait()
        return list(self.vals)


@dataclass(frozen=True)
class LoopParam(ParamBase):
    swap_interval: int = -5
    #: id of the loop's desc (loops are never deduplicated)
    desc_id: int = 0


@register_opr
class Loop(OperatorNodeBase):
    """Runs its sub graph until the loop condition is false; outputs are dynamic."""

    Param = LoopParam
    dynamic_output_shape = True
    value_inferable = False
    dedup = False

    def __init__(self, inputs, param, config, desc: LoopDesc, desc_maker: Callable):
        super().__init__(inputs, param, config)
        self.desc = desc
        self.desc_maker = desc_maker
        self.nr_outputs = len(desc.outputs)
        # LAST / SUM outputs have static shapes when the body's shapes follow from the
        # inputs' and no assignment changes an input's shape
        self.dynamic_output_shape = not self._shapes_static(
            [_static_shape(v) for v in inputs], check=False
        )
        self._func: _SubFunc | None = None
        #: per-iteration copies of the assigned inputs, kept once a gradient exists
        self.record = False
        self.saved: list | None = None
        self.nr_iter = 0
        self._grads: dict = {}

    def default_name(self):
        return "loop"

    def infer_dtypes(self, in_dtypes):
        return [v.dtype for v, _ in self.desc.outputs]

    def _shapes_static(self, in_shapes, check: bool):
        """The output shapes for the input shapes ``in_shapes`` (None: not static). With
        ``check``, an assignment changing an input's shape is an error."""
        d = self.desc
        if any(m != "LAST" and m != "SUM" for _, m in d.outputs) or None in in_shapes:
            return None
        if any(v.shape_type == InferType.MISSING for v, _ in d.outputs):
            return None
        held = [(src, src.value) for _, src, _ in d.inputs]
        try:
            for (_, src, _), shp in zip(d.inputs, in_shapes):
                src.value = np.broadcast_to(np.empty((), src._dtype), tuple(shp))
            inf = Inferer()
            for src, val in d.assigns.items():
                got = inf.shape(val)
                if tuple(got) != tuple(src.value.shape):
                    if check:
                        raise GraphError(
                            f"Loop {self.name!r}: assigning {val.name!r} of shape "
                            f"{fmt_shape(got)} to an input of shape {fmt_shape(src.value.shape)}"
                        )
                    return None
            return [tuple(inf.shape(v)) for v, _ in d.outputs]
        except MegBrainError:
            if check:
                raise
            return None
        finally:
            for src, val in held:
                src.value = val

    def infer_shapes(self, in_shapes, in_values):
        if self.dynamic_output_shape:
            raise InferPending(f"Loop {self.name!r}: output shapes are known after running")
        return self._shapes_static(in_shapes, check=True)

    def _sub_func(self) -> _SubFunc:
        if self._func is None:
            d = self.desc
            fetch = [d.cond] + list(d.assigns.values()) + [v for v, _ in d.outputs]
            self._func = _SubFunc(d.graph, fetch)
        return self._func

    def run_dynamic(self, ins):
        d = self.desc
        func = self._sub_func()
        assigned = [src for _, src, _ in d.inputs if src in d.assigns]
        d.set_inputs(ins)
        if d.counter is not None:
            d.counter.set(np.zeros(1, _I32))
        nass = len(d.assigns)
        acc: list = [None] * len(d.outputs)
        alls: list = [[] for _ in d.outputs]
        saved = [] if self.record else None
        t = 0
        while True:
            if saved is not None:
                saved.append([np.array(s.value) for s in assigned])
            vals = func()
            cond, new, outs = vals[0], vals[1 : 1 + nass], vals[1 + nass :]
            for k, ((v, mode), o) in enumerate(zip(d.outputs, outs)):
                if mode == "LAST":
                    acc[k] = o
                elif mode == "SUM":
                    acc[k] = o if acc[k] is None else acc[k] + o
                else:
                    if alls[k] and alls[k][0].shape != o.shape:
                        raise GraphError(
                            f"Loop {self.name!r}: output {k} ({v.name!r}, mode 'all') changed "
                            f"shape from {fmt_shape(alls[k][0].shape)} to {fmt_shape(o.shape)}"
                        )
                    alls[k].append(o)
            if cond.size != 1:
                raise GraphError(
                    f"Loop {self.name!r}: the loop condition {d.cond.name!r} must be a scalar, "
                    f"got shape {fmt_shape(cond.shape)}"
                )
            if not abs(float(cond.reshape(-1)[0])) > 1e-6:
                break
            for src, val in zip(d.assigns, new):
                src.set(val)
            t += 1
            if d.counter is not None:
                d.counter.set(np.full(1, t, _I32))
        self.saved = saved
        self.nr_iter = t + 1
        res = []
        for k, (v, mode) in enumerate(d.outputs):
            res.append(np.stack(alls[k]) if mode == "ALL" else acc[k].astype(v.dtype, copy=False))
        return res

    def bind(self, ins, outs):
        def run():
            for k, (o, got) in enumerate(zip(outs, self.run_dynamic(ins))):
                if o.shape != got.shape:
                    raise GraphError(
                        f"Loop {self.name!r}: output {k} has shape {fmt_shape(got.shape)}, "
                        f"statically inferred {fmt_shape(o.shape)}"
                    )
                np.copyto(o, got)

        return run

    def grad(self, wrt_idx, out_grads):
        if self.inputs[wrt_idx].dtype.kind != "f":
            return None
        key = tuple(None if g is None else g.id for g in out_grads)
        gopr = self._grads.get(key)
        if gopr is None:
            self.record = True
            ogs = [g for g in out_grads if g is not None]
            if not ogs:
                return None
            gopr = LoopGrad(self, out_grads)
            insert_opr(gopr)
            self._grads[key] = gopr
        k = gopr.wrt.index(wrt_idx) if wrt_idx in gopr.wrt else None
        return None if k is None else gopr.outputs[k]


@dataclass(frozen=True)
class LoopGradParam(ParamBase):
    loop_id: int = 0


@register_opr
class LoopGrad(OperatorNodeBase):
    """Gradients of a Loop's float inputs; inputs: the loop's inputs, then the non-None
    output gradients (ordered after the loop through ``extra_deps``)."""

    Param = LoopGradParam
    value_inferable = False
    dedup = False

    def __init__(self, fwd: Loop, out_grads):
        self.og_idx = [k for k, g in enumerate(out_grads) if g is not None]
        inputs = list(fwd.inputs) + [out_grads[k] for k in self.og_idx]
        super().__init__(inputs, LoopGradParam(fwd.id), _merge_config(None, None, None))
        self.extra_deps = [fwd.outputs[0]]
        self.wrt = [i for i, v in enumerate(fwd.inputs) if v.dtype.kind == "f"]
        self.nr_outputs = len(self.wrt)
        self._built = None

    @property
    def fwd(self) -> Loop:
        # through the dependency, so that graph copies and rewrites find the cloned loop
        return self.extra_deps[0].owner

    def default_name(self):
        return f"grad[{self.fwd.name}]"

    def infer_comp_node(self):
        return self.fwd.comp_node

    def infer_dtypes(self, in_dtypes):
        return [in_dtypes[i] for i in self.wrt]

    def infer_shapes(self, in_shapes, in_values):
        return [in_shapes[i] for i in self.wrt]

    def _build(self):
        """The gradient sub graph: a fresh desc with output / next-state gradient inputs."""
        if self._built is not None:
            return self._built
        fwd = self.fwd
        d = _build_desc(fwd.desc_maker, fwd.desc.outer_graph, fwd.desc.comp_node, fwd.name)
        terms, g_in, h_in = [], {}, {}

        def grad_input(v, name: str, inputs: dict, key) -> None:
            # the gradient flowing into the float var v: an input of the sub graph, and
            # the term <v, its gradient> of the loss differentiated
            if v.dtype.kind != "f":
                return
            src = LoopInput(v.dtype, d.comp_node, name)
            src.value = np.zeros(1, v.dtype)
            (gv,) = d.graph.insert_opr(src)
            inputs[key] = src
            terms.append(reduce_(elemwise(SymbolVar(v), SymbolVar(gv), mode="MUL"), "SUM"))

        for k in self.og_idx:
            grad_input(d.outputs[k][0], f"{fwd.name}:grad_out{k}", g_in, k)
        for src, val in d.assigns.items():
            grad_input(val, f"{src.name}:grad_next", h_in, src)
        loss = terms[0]
        for t in terms[1:]:
            loss = loss + t
        wrt_vars = [d.inputs[i][1].outputs[0] for i in self.wrt]
        grads = grad(loss, wrt_vars, warn_mid_wrt=False)
        func = _SubFunc(d.graph, grads)
        self._built = (d, func, g_in, h_in)
        return self._built

    def bind(self, ins, outs):
        def run():
            for o, g in zip(outs, self._compute(ins)):
                np.copyto(o, g)

        return run

    def run_dynamic(self, ins):
        return self._compute(ins)

    def _compute(self, ins):
        fwd = self.fwd
        d, func, g_in, h_in = self._build()
        n_in = len(fwd.inputs)
        if fwd.saved is None:
            # the loop ran before its gradient existed (an eager graph): run it again,
            # recording this time
            fwd.record = True
            fwd.run_dynamic(ins[:n_in])
        saved, T = fwd.saved, fwd.nr_iter
        ogs = dict(zip(self.og_idx, ins[n_in:]))
        assigned = [k for k, (_, src, _) in enumerate(d.inputs) if src in d.assigns]
        h_val = {src: np.zeros(1, src._dtype) for src in h_in}
        acc = [np.zeros(ins[i].shape, ins[i].dtype) for i in self.wrt]
        for t in range(T - 1, -1, -1):
            states = dict(zip(assigned, saved[t]))
            d.set_inputs(ins[:n_in], [states.get(k) for k in range(n_in)])
            if d.counter is not None:
                d.counter.set(np.full(1, t, _I32))
            for k, src in g_in.items():
                mode = d.outputs[k][1]
                og = ogs[k]
                if mode == "ALL":
                    src.set(og[t])
                elif mode == "SUM" or t == T - 1:
                    src.set(og)
                else:
                    src.set(np.zeros(1, og.dtype))
            for src, h in h_in.items():
                h.set(h_val[src])
            gs = func()
            new_h = {}
            for j, i in enumerate(self.wrt):
                src = d.inputs[i][1]
                if src in d.assigns:
                    # the gradient of this iteration's state flows to the previous iteration
                    new_h[src] = gs[j]
                    if t == 0:
                        acc[j] = acc[j] + gs[j]
                else:
                    acc[j] = acc[j] + gs[j]
            for src in h_in:
                h_val[src] = new_h.get(src, np.zeros(1, src._dtype))
        return [a.astype(ins[i].dtype, copy=False) for a, i in zip(acc, self.wrt)]


def make_loop(
    desc_maker: Callable[[LoopDesc], None], *, swap_interval: int = -5, name=None,
    comp_node=None, config=None,
) -> list[SymbolVar]:  # fmt: skip
    """A loop operator whose body ``desc_maker(desc)`` describes (see :class:`LoopDesc`).

    1. the vars given to :meth:`LoopDesc.add_input` are copied into the sub graph;
    2. the body runs and its outputs are recorded;
    3. if ``|cond| <= 1e-6`` the loop ends (so the body runs at least once);
    4. otherwise the :meth:`LoopDesc.assign` rules update the inputs, the counter grows by
       one and the body runs again (step 2).

    Parameters
    ----------
    desc_maker : callable
        Called with a :class:`LoopDesc`; it must build the same body every time it is
        called (the gradient calls it again).
    swap_interval : int
        Accepted for compatibility: per-iteration states are kept in host memory anyway.
    name, comp_node, config
        The operator's config.

    Returns
    -------
    list of SymbolVar
        One var per :meth:`LoopDesc.add_output` call, in call order; their shapes are
        dynamic.

    Raises
    ------
    GraphError
        For a body that uses vars of the outer graph not passed through ``add_input``, a
        non-scalar loop condition, an unknown output mode, an assignment to a var that is
        not an input added with ``has_assign``, or a missing condition / output / input;
        the message names the loop.
    """
    if not callable(desc_maker):
        raise TypeError(f"make_loop: desc_maker must be callable, got {desc_maker!r}")
    swap_interval = as_int(swap_interval, "make_loop", "swap_interval")
    cfg = _merge_config(name, comp_node, config)
    loop_name = cfg.name_value or "loop"
    cn = cfg.comp_nodes[0] if cfg.comp_nodes else None
    desc = _build_desc(desc_maker, None, cn, loop_name)
    inputs = [v for v, _, _ in desc.inputs]
    opr = Loop(inputs, LoopParam(swap_interval, id(desc)), cfg, desc, desc_maker)
    return insert_opr(opr)


# ---- serialization: as in the reference, a Loop can not be dumped ---------------------------


def _refuse_dump(ctx, opr) -> None:
    raise sereg.NotSerializable(
        f"{opr.type_name} {opr.name!r}: serialization of Loop opr not implemented (its sub "
        "graph would have to be written as a nested graph, as the reference never did)"
    )


def _refuse_load(ctx, inputs, config):
    raise sereg.NotSerializable("serialization of Loop opr not implemented")


sereg.register_serializer(Loop, dump=_refuse_dump, load=_refuse_load)
sereg.register_serializer(LoopGrad, dump=_refuse_dump, load=_refuse_load)
