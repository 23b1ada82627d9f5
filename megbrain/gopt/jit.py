"""JIT fusion pass (graph option ``graph_opt.jit``): maximal subgraphs of float Elemwise
operators (closed, at jit level 2, by a Reduce) become one :class:`~megbrain.opr.jit.JITExecutor`;
then a ConvBias whose only reader is a ReLU6 or SiLU JITExecutor becomes one
:class:`~megbrain.opr.dnn_conv_bias.ConvBiasTail` (``fuse_conv_bias_tail``). Before them, a
squeeze-and-excitation multiply read only by a 1x1 NCHW88 ConvBias becomes part of it
(:class:`~megbrain.opr.dnn_conv_bias.ConvBiasGated`, ``fuse_se_gate``), and so does a
per-channel scale, shift and ReLU read only by one
(:class:`~megbrain.opr.dnn_conv_bias.ConvBiasPreact`, ``fuse_preactivation``).

A subgraph grows from its output towards its inputs: an Elemwise joins the subgraph of its
readers when all of them are in that subgraph and its output is needed nowhere else (not a
destination var, not read by another operator, not an extra var dependency). So every
intermediate result is private to the subgraph, which has exactly one output.
"""

from __future__ import annotations

import numpy as np

from ..errors import MegBrainError
from ..graph import InferType, OperatorNodeConfig, VarNode
from ..graph.replace import dep_oprs
from ..graph.static_infer import infer_shape
from ..kernels.conv.epilogue import TAIL_EXPRS
from ..kernels.elemwise_modes import FUSABLE_MODES, REDUCE_MODES
from ..kernels.jit_codegen import interpret
from ..opr.base import make_immutable
from ..opr.dnn import Convolution
from ..opr.dnn_conv_bias import (
    ConvBias,
    ConvBiasGated,
    ConvBiasParam,
    ConvBiasPreact,
    ConvBiasTail,
    ConvBiasTailParam,
)
from ..opr.jit import JITExecutor, JITExecutorParam
from .passes import register_pass

__all__ = [
    "fuse_conv_bias_tail",
    "fuse_elemwise",
    "fuse_preactivation",
    "fuse_se_gate",
    "jit_fusion",
    "jit_level",
]

_FLOATS = (np.dtype(np.float32), np.dtype(np.float16))


def jit_level(graph) -> int:
    """The effective JIT level: ``graph_opt.jit``, or 1 at ``|graph_opt_level| >= 3``."""
    opts = graph.options
    level = int(opts.graph_opt.jit)
    if level == 0 and abs(opts.graph_opt_level) >= 3:
        level = 1
    return level


@register_pass("jit_fusion")
def jit_fusion(graph, dest: list[VarNode]) -> dict:
    """The pass: fuse when the JIT level is at least 1 (with reductions at 2)."""
    level = jit_level(graph)
    if level < 1:
        return {}
    if any(o.type_name == "VirtualGrad" for o in dep_oprs(dest)):
        # before the gradients are expanded: the backward will read forward intermediates,
        # so fuse in the pass that runs after the expansion (MegBrain's ``after_grad``)
        return {}
    return fuse_elemwise(graph, dest, with_reduce=level >= 2)


def _fusable(opr) -> bool:
    return (
        opr.type_name == "Elemwise"
        and opr.param.mode in FUSABLE_MODES
        and opr.outputs[0].dtype in _FLOATS
        and not opr.extra_deps
    )


def _closing_reduce(opr) -> bool:
    return (
        opr.type_name == "Reduce"
        and len(opr.inputs) == 1
        and opr.param.mode in REDUCE_MODES
        and opr.outputs[0].dtype in _FLOATS
        and not opr.extra_deps
    )


def _shape(v: VarNode):
    try:
        return infer_shape(v)
    except MegBrainError:
        return None


def fuse_elemwise(graph, dest: list[VarNode], with_reduce: bool = False) -> dict:
    """``{old var: new var}`` replacing each fusable subgraph of ``dest``'s graph.

    Operators reading a replaced var are rebuilt here too (in one topological sweep), so
    that subgraphs reading other subgraphs' outputs read the fused results.
    """
    oprs = dep_oprs(dest)
    readers, external = _readers(graph, oprs, dest)

    # grow subgraphs from outputs to inputs: member -> its subgraph's root
    root_of: dict = {}
    members: dict = {}
    for o in reversed(oprs):
        if not _fusable(o):
            continue
        out = o.outputs[0]
        rs = readers.get(out, [])
        roots = {root_of.get(r) for r in rs}
        if out not in external and rs and len(roots) == 1 and None not in roots:
            root = roots.pop()
            if root.outputs[0].dtype == out.dtype and root.comp_node == o.comp_node:
                root_of[o] = root
                members[root].append(o)
                continue
        root_of[o] = o
        members[o] = [o]

    # a Reduce closing a subgraph whose result only it reads
    closing: dict = {}
    if with_reduce:
        for o in oprs:
            if not _closing_reduce(o):
                continue
            src = o.inputs[0]
            root = src.owner
            if members.get(root) is None or src in external or readers.get(src) != [o]:
                continue
            axis = o.param.axis
            if axis is not None:
                shp = _shape(src)
                if shp is None or not -len(shp) <= axis < len(shp):
                    continue
                axis %= len(shp)
            if root.comp_node == o.comp_node:
                closing[root] = (o, (o.param.mode, axis))

    # the subgraphs worth a kernel: two operators at least, and a non-constant input
    plans: dict = {}
    for root, group in members.items():
        red = closing.get(root)
        if len(group) >= 2 or red is not None:
            group = group[::-1]  # collected outputs first: now topological, root last
            plan = _plan(group, None if red is None else red[1])
            if plan is not None:
                plans[root] = plan
    skip = {m for root in plans for m in members[root] if m is not root}
    skip.update(closing[root][0] for root in plans if root in closing)

    def fused(o, memo: dict) -> tuple[VarNode, VarNode]:
        leaves, param = plans[o]
        cfg = OperatorNodeConfig(comp_node=o.comp_node)
        inputs = [memo.get(v, v) for v in leaves]
        new = graph.insert_opr(JITExecutor(inputs, param, cfg))[0]
        red = closing.get(o)
        old = (o if red is None else red[0]).outputs[0]
        if all(a is b for a, b in zip(inputs, leaves)) and new.owner.source is None:
            new.owner.source = old  # its gradient is the unfused graph's
        return old, new

    return _sweep(graph, oprs, skip, {o: fused for o in plans})


def _sweep(graph, oprs: list, skip: set, makers: dict) -> dict:
    """One topological sweep over ``oprs``: those in ``skip`` are dropped, each of
    ``makers`` is replaced by ``makers[o](o, memo) -> (old var, new var)``, and every other
    operator reading a replaced var is rebuilt over the new one. Returns ``{old: new}``."""
    memo: dict[VarNode, VarNode] = {}
    for o in oprs:
        if o in skip:
            continue
        if o in makers:
            old, new = makers[o](o, memo)
            memo[old] = new
            continue
        ins = [memo.get(v, v) for v in o.inputs]
        extra = [memo.get(v, v) for v in o.extra_deps]
        if all(a is b for a, b in zip(ins, o.inputs)) and all(
            a is b for a, b in zip(extra, o.extra_deps)
        ):
            continue
        new_opr = o.clone(ins)
        new_opr.extra_deps = extra
        for old, nv in zip(o.outputs, graph.insert_opr(new_opr)):
            memo[old] = nv
    return memo


def _readers(graph, oprs: list, dest: list[VarNode]) -> tuple[dict, set]:
    """Each var's reading operators among ``oprs``, and the vars needed outside them (the
    destinations, the graph's extra var dependencies)."""
    readers: dict[VarNode, list] = {}
    for o in oprs:
        for v in list(o.inputs) + list(o.extra_deps):
            readers.setdefault(v, []).append(o)
    external = set(dest)
    for k, deps in graph.options.extra_vardeps.items():
        external.add(k)
        external.update(deps)
    return readers, external


def _plan(group: list, reduce) -> tuple | None:
    """(leaf vars, param) of the JITExecutor computing ``group`` (topological, root last);
    None when every input would be an inlined constant."""
    root = group[-1]
    index = {m.outputs[0]: j for j, m in enumerate(group)}
    out_shape = _shape(root.outputs[0])
    leaves: list[VarNode] = []
    consts: dict[VarNode, float] = {}
    for m in group:
        for v in m.inputs:
            if v in index or v in leaves or v in consts:
                continue
            c = _scalar_const(v, out_shape)
            if c is not None:
                consts[v] = c
            else:
                leaves.append(v)
    if not leaves:
        return None
    pos = {v: k for k, v in enumerate(leaves)}
    expr = []
    for m in group:
        args = []
        for v in m.inputs:
            if v in index:
                args.append(("t", index[v]))
            elif v in consts:
                args.append(("c", consts[v]))
            else:
                args.append(("i", pos[v]))
        expr.append((m.param.mode, tuple(args)))
    return leaves, JITExecutorParam(tuple(expr), reduce)


def _scalar_const(v: VarNode, out_shape) -> float | None:
    """The value of a one-element constant that can be inlined without changing the shape."""
    if v.value_type != InferType.CONST or v.owner.type_name != "ImmutableTensor":
        return None
    val = v.owner.value
    if val.size != 1 or out_shape is None or val.ndim > len(out_shape):
        return None
    return float(val.reshape(-1)[0])


#: the activations of a ConvBias each tail may follow (ReLU6 of a ReLU is ReLU6)
_TAIL_AFTER = {"RELU6": ("IDENTITY", "RELU"), "SILU": ("IDENTITY",)}
#: values telling a clip to [0, 6] from any other of MAX / MIN / RELU and constants (such an
#: expression of one input is a clip to [lo, hi]: f(-1) = 0 and f(3) = 3 make lo 0, f(7) = 6
#: makes hi 6)
_CLIP_PROBE = np.array([-np.inf, -7, -1, -0.0, 0, 0.5, 3, 6, 7, np.inf, np.nan], np.float32)


def _fusable_graph(graph, dest: list[VarNode]) -> tuple[list, dict, set] | None:
    """``dest``'s operators, their readers and the vars needed outside them
    (:func:`_readers`) for a compile-time fusion into a ConvBias subclass: None below JIT
    level 1, or before the gradients are expanded (as jit_fusion; those classes have no
    gradient)."""
    if jit_level(graph) < 1:
        return None
    oprs = dep_oprs(dest)
    if any(o.type_name == "VirtualGrad" for o in oprs):
        return None
    return (oprs, *_readers(graph, oprs, dest))


@register_pass("fuse_conv_bias_tail")
def fuse_conv_bias_tail(graph, dest: list[VarNode]) -> dict:
    """The pass (after ``jit_fusion``, at JIT level 1 and up): a float32 ConvBias (IDENTITY,
    or RELU before ReLU6) whose output only a JITExecutor computing ReLU6 or SiLU of it
    reads becomes one :class:`~megbrain.opr.dnn_conv_bias.ConvBiasTail`, which replaces the
    JITExecutor's output."""
    found = _fusable_graph(graph, dest)
    if found is None:
        return {}
    oprs, readers, external = found
    tails: dict = {}  # JITExecutor -> the tail it computes of its ConvBias
    for o in oprs:
        if o.type_name != "JITExecutor" or len(o.inputs) != 1 or o.extra_deps:
            continue
        conv, tail = o.inputs[0].owner, _tail_of(o.param)
        if tail is None or type(conv) is not ConvBias or conv.extra_deps:
            continue
        y = conv.outputs[0]
        if y in external or readers.get(y) != [o] or y.dtype != np.float32:
            continue
        if conv.param.nonlineMode not in _TAIL_AFTER[tail] or conv.comp_node != o.comp_node:
            continue
        tails[o] = tail
    if not tails:
        return {}

    def fused(o, memo: dict) -> tuple[VarNode, VarNode]:
        conv = o.inputs[0].owner
        fields = {f: getattr(conv.param, f) for f in conv.param.__dataclass_fields__}
        param = ConvBiasTailParam(**fields, tail=tails[o])
        cfg = OperatorNodeConfig(comp_node=conv.comp_node)
        new = ConvBiasTail([memo.get(v, v) for v in conv.inputs], param, cfg)
        return o.outputs[0], graph.insert_opr(new)[0]

    skip = {o.inputs[0].owner for o in tails}
    return _sweep(graph, oprs, skip, {o: fused for o in tails})


@register_pass("fuse_se_gate")
def fuse_se_gate(graph, dest: list[VarNode]) -> dict:
    """The pass (before ``jit_fusion``, at JIT level 1 and up): an Elemwise MUL of an
    NCHW88 float32 ``x`` (N, C/8, H, W, 8) and a gate (N, C/8, 1, 1, 8) whose product only
    a dense 1x1 stride-1 unpadded ConvBias reads, as its source, becomes one
    :class:`~megbrain.opr.dnn_conv_bias.ConvBiasGated` reading ``x`` and the gate (the
    squeeze-and-excitation multiply, no pass over ``x``); the gate's own elementwise chain
    is left to ``jit_fusion``."""
    found = _fusable_graph(graph, dest)
    if found is None:
        return {}
    oprs, readers, external = found
    gated: dict = {}  # ConvBias -> (x, gate)
    for o in oprs:
        if type(o) is not ConvBias or o.extra_deps or not _gateable(o):
            continue
        y = o.inputs[0]
        mul = y.owner
        if y in external or readers.get(y) != [o] or any(v is y for v in o.inputs[1:]):
            continue
        operands = _gate_operands(mul) if mul.comp_node == o.comp_node else None
        if operands is not None:
            gated[o] = operands
    if not gated:
        return {}

    def fused(o, memo: dict) -> tuple[VarNode, VarNode]:
        x, gate = gated[o]
        ins = [memo.get(v, v) for v in (x, *o.inputs[1:], gate)]
        new = ConvBiasGated(ins, o.param, OperatorNodeConfig(comp_node=o.comp_node))
        return o.outputs[0], graph.insert_opr(new)[0]

    skip = {o.inputs[0].owner for o in gated}
    return _sweep(graph, oprs, skip, {o: fused for o in gated})


@register_pass("fuse_preactivation")
def fuse_preactivation(graph, dest: list[VarNode]) -> dict:
    """The pass (before ``jit_fusion``, at JIT level 1 and up): an Elemwise RELU of an
    Elemwise FUSE_MUL_ADD3 ``x scale + shift`` (NCHW88 float32 ``x`` (N, C/8, H, W, 8),
    ``scale`` and ``shift`` (1, C/8, 1, 1, 8)) whose result only a dense 1x1 stride-1
    unpadded ConvBias or Convolution reads, as its source, becomes one
    :class:`~megbrain.opr.dnn_conv_bias.ConvBiasPreact` reading ``x``, ``scale`` and
    ``shift`` (DenseNet's pre-activation BatchNorm and ReLU, no pass over ``x``); a
    Convolution's bias is zeros (its zero sums come out +0.0 where they were -0.0)."""
    found = _fusable_graph(graph, dest)
    if found is None:
        return {}
    oprs, readers, external = found
    fused_in: dict = {}  # ConvBias or Convolution -> (x, scale, shift)
    for o in oprs:
        if type(o) not in (ConvBias, Convolution) or o.extra_deps or not _gateable(o):
            continue
        y = o.inputs[0]
        relu = y.owner
        if y in external or readers.get(y) != [o] or any(v is y for v in o.inputs[1:]):
            continue
        if not _elemwise_of(relu, "RELU", 1) or relu.comp_node != o.comp_node:
            continue
        m = relu.inputs[0]
        if m in external or readers.get(m) != [relu] or m.owner.comp_node != o.comp_node:
            continue
        operands = _scale_shift_operands(m.owner)
        if operands is not None:
            fused_in[o] = operands
    if not fused_in:
        return {}

    def fused(o, memo: dict) -> tuple[VarNode, VarNode]:
        x, scale, shift = fused_in[o]
        rest, param = list(o.inputs[1:]), o.param
        if type(o) is Convolution:
            oc = _shape(o.outputs[0])
            zeros = np.zeros((1, oc[1], 1, 1, oc[4]), np.float32)
            rest.append(make_immutable(o.comp_node, graph, zeros).node)
            fields = {f: getattr(param, f) for f in param.__dataclass_fields__}
            param = ConvBiasParam(**fields, nonlineMode="IDENTITY")
        ins = [memo.get(v, v) for v in (x, *rest, scale, shift)]
        new = ConvBiasPreact(ins, param, OperatorNodeConfig(comp_node=o.comp_node))
        return o.outputs[0], graph.insert_opr(new)[0]

    skip = set()
    for o in fused_in:
        relu = o.inputs[0].owner
        skip.update((relu, relu.inputs[0].owner))
    return _sweep(graph, oprs, skip, {o: fused for o in fused_in})


def _elemwise_of(opr, mode: str, arity: int) -> bool:
    """Whether ``opr`` is a float32 Elemwise ``mode`` of ``arity`` inputs, no extra deps."""
    return (
        opr.type_name == "Elemwise"
        and opr.param.mode == mode
        and len(opr.inputs) == arity
        and not opr.extra_deps
        and all(v.dtype == np.float32 for v in opr.inputs)
    )


def _scale_shift_operands(fma) -> tuple[VarNode, VarNode, VarNode] | None:
    """``(x, scale, shift)`` when ``fma`` is an Elemwise FUSE_MUL_ADD3 ``x scale + shift``
    (the product in either order) of an NCHW88 ``x`` (N, C/8, H, W, 8) and a ``scale`` and
    ``shift`` (1, C/8, 1, 1, 8), all float32; else None."""
    if not _elemwise_of(fma, "FUSE_MUL_ADD3", 3):
        return None
    shapes = [_shape(v) for v in fma.inputs]
    if any(s is None or len(s) != 5 for s in shapes):
        return None
    a, b, shift = fma.inputs
    for (x, xs), (scale, ss) in (((a, shapes[0]), (b, shapes[1])),
                                 ((b, shapes[1]), (a, shapes[0]))):  # fmt: skip
        want = (1, xs[1], 1, 1, xs[4])
        if tuple(ss) == want and tuple(shapes[2]) == want and tuple(xs) != want:
            return x, scale, shift
    return None


def _gateable(conv) -> bool:
    """Whether ``conv`` (a ConvBias or Convolution) is an NCHW88 float32 dense 1x1 stride-1
    unpadded one, the convolution POINTWISE_NCHW88 computes with the gate in its filter
    loads (or the pre-activation in its source loads)."""
    p = conv.param
    shape = _shape(conv.inputs[1])
    return (
        p.format == "NCHW88"
        and p.sparse == "DENSE"
        and (p.pad_h, p.pad_w, p.stride_h, p.stride_w) == (0, 0, 1, 1)
        and shape is not None
        and tuple(shape[2:4]) == (1, 1)
        and all(v.dtype == np.float32 for v in conv.inputs)
    )


def _gate_operands(mul) -> tuple[VarNode, VarNode] | None:
    """``(x, gate)`` when ``mul`` is an Elemwise MUL of an NCHW88 ``x`` (N, C/8, H, W, 8)
    and a gate (N, C/8, 1, 1, 8), in either order, both float32; else None."""
    if mul.type_name != "Elemwise" or mul.param.mode != "MUL" or mul.extra_deps:
        return None
    if len(mul.inputs) != 2 or any(v.dtype != np.float32 for v in mul.inputs):
        return None
    shapes = [_shape(v) for v in mul.inputs]
    if any(s is None or len(s) != 5 for s in shapes):
        return None
    for (x, xs), (g, gs) in (zip(mul.inputs, shapes), zip(mul.inputs[::-1], shapes[::-1])):
        if tuple(gs) == (xs[0], xs[1], 1, 1, xs[4]) and tuple(xs[2:4]) != (1, 1):
            return x, g
    return None


def _tail_of(param: JITExecutorParam) -> str | None:
    """"RELU6" or "SILU" when the one-input expression of ``param`` computes it, else None."""
    if param.reduce is not None:
        return None
    if tuple(param.expr) == TAIL_EXPRS["SILU"] or tuple(param.expr) == (
        ("SIGMOID", (("i", 0),)), ("MUL", (("t", 0), ("i", 0))),
    ):  # fmt: skip
        return "SILU"
    if not all(m in ("MAX", "MIN", "RELU") for m, _ in param.expr):
        return None
    got = interpret(param.expr, [_CLIP_PROBE], None)
    want = np.minimum(np.maximum(_CLIP_PROBE, 0), 6)
    return "RELU6" if np.array_equal(got, want, equal_nan=True) else None
