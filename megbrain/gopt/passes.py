"""Optimizer passes (graph option ``graph_opt_level``), applied before the comp seq is built.

* level 1: arithmetic simplification while the graph is built (``x*1``, ``x+0``, ``x/x``,
  double negation, elementwise operators over constants), :func:`arith_simplify_on_insert`;
* level 2: global passes before compile, in the order of
  :data:`~megbrain.gopt.framework.PRESET`: common subexpression merging, chain reordering,
  constant folding, redundant TypeCvt removal, arithmetic fusion (``act(a + b)`` ->
  FUSE_ADD_<act>, products in sums -> FUSE_MUL_ADD3/4) (then the gradient, JIT fusion and
  sublinear memory passes of their own modules); :func:`optimize_for_compile` runs them;
* a negative level runs the same passes and checks each replaced output against the
  unoptimized one at run time (AssertEqual).

A pass is ``f(graph, dest_vars, options=None) -> {old var: new var}``; passes are small
functions registered by name (:mod:`megbrain.gopt.framework`), so the optimizer is data.
Most are a *rule* applied by :class:`Rewriter`, the one rewrite engine: a topological sweep
that rebuilds each operator over its replaced inputs and offers it to the rule.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable

import numpy as np

from ..dtype import same_dtype
from ..errors import GraphError
from ..graph import InferType, OperatorNodeConfig, VarNode
from ..graph.replace import dep_oprs
from ..graph.static_infer import Inferer, static_shape
from ..opr.base import SymbolVar
from ..opr.basic_arith import elemwise, fill_retain_dtype
from ..opr.io import ImmutableTensor
from .framework import (
    PASSES,
    PRESET,
    get_replaced_var,
    register_pass,
    run_passes,
)

__all__ = [
    "PASSES",
    "PRESET",
    "FUSE_ADD_ACTS",
    "Rewriter",
    "VarMap",
    "inherit_props",
    "register_pass",
    "reorder_const_chain",
    "run_passes",
    "optimize_for_compile",
    "arith_simplify_on_insert",
    "arith_fuse",
    "install",
    "get_replaced_var",
]

logger = logging.getLogger("megbrain")

_FOLD_MAX_BYTES = 1 << 20
#: Elemwise modes whose two operands may be swapped
_COMMUTATIVE = frozenset(
    {"ADD", "MUL", "MAX", "MIN", "EQ", "LOG_SUM_EXP", "FUSE_ADD_RELU", "FUSE_ADD_SIGMOID",
     "FUSE_ADD_TANH", "FUSE_ADD_H_SWISH"}
)  # fmt: skip


def _is_scalar_const(v: VarNode, value: float) -> bool:
    if v.value_type != InferType.CONST or v.owner.type_name != "ImmutableTensor":
        return False
    c = v.owner.value
    return c.size >= 1 and bool(np.all(c == value))


# ---- the rewrite engine ------------------------------------------------------------------
class VarMap(dict):
    """``{old var: new var}`` of a pass; ``reasons`` holds the rewrites a rule made (the
    rest are operators rebuilt over replaced inputs), which log_level 2 prints."""

    def __init__(self):
        super().__init__()
        self.reasons: dict[VarNode, str] = {}


class Rewriter:
    """One topological sweep over the operators ``dest`` depends on (``SubGraph::Rewriter``).

    :meth:`apply` rebuilds each operator over its replaced inputs (inserting deduplicates and
    simplifies), then offers the rebuilt operator to ``rule``, which returns replacement vars
    for its outputs (None entries keep an output) or None. Rules look at the rebuilt
    structure; :meth:`readers_of` answers for rebuilt vars with the readers of the original.
    """

    def __init__(self, graph, dest: Iterable[VarNode], *, allow_dtype_change: bool = False):
        self.graph = graph
        self.dest = list(dest)
        self.oprs = dep_oprs(self.dest)
        self.varmap = VarMap()
        self.allow_dtype_change = allow_dtype_change
        self._orig: dict[VarNode, VarNode] = {}
        self._readers: dict | None = None

    def get(self, v: VarNode) -> VarNode:
        """The current replacement of original var ``v``."""
        return self.varmap.get(v, v)

    @property
    def readers(self) -> dict:
        """Original var -> its reading operators; a destination var has a ``None`` reader."""
        if self._readers is None:
            r: dict = {}
            for o in self.oprs:
                for v in o.inputs:
                    r.setdefault(v, []).append(o)
                for v in o.extra_deps:
                    r.setdefault(v, []).append(o)
            for v in self.dest:
                r.setdefault(v, []).append(None)
            for deps in self.graph.options.extra_vardeps.values():
                for d in deps:
                    r.setdefault(d, []).append(None)
            self._readers = r
        return self._readers

    def original(self, v: VarNode) -> VarNode:
        """The original var ``v`` was rebuilt from (``v`` itself if none)."""
        return self._orig.get(v, v)

    def readers_of(self, v: VarNode) -> list:
        """Readers of ``v`` (or of the original var ``v`` was rebuilt from)."""
        return self.readers.get(self._orig.get(v, v), [])

    def sole_reader(self, v: VarNode) -> bool:
        """Whether exactly one operator reads ``v`` (once) and it is no destination."""
        rs = self.readers_of(v)
        return len(rs) == 1 and rs[0] is not None and v not in self.graph.options.extra_vardeps

    def sole_source(self, v: VarNode, type_name: str, mode: str | None = None):
        """The owner of ``v`` when it is a ``type_name`` operator (of param ``mode`` when
        given) without extra deps and ``v`` has a sole reader (so the owner may be fused
        into it); else None."""
        o = v.owner
        if (
            o.type_name == type_name
            and (mode is None or o.param.mode == mode)
            and not o.extra_deps
            and self.sole_reader(v)
        ):
            return o
        return None

    def replace(self, old: VarNode, new: VarNode, reason: str | None = None) -> None:
        """Record ``old -> new`` (``old`` an original var)."""
        if old is new:
            return
        if old.dtype != new.dtype and not self.allow_dtype_change:
            raise GraphError(
                f"gopt: {old.name!r} ({old.dtype}) replaced by {new.name!r} ({new.dtype})"
            )
        self.varmap[old] = new
        self._orig[new] = self._orig.get(old, old)
        if reason is not None:
            self.varmap.reasons[old] = reason

    def rebuild(self, opr) -> list[VarNode]:
        """``opr``'s outputs over its replaced inputs (``opr.outputs`` when none changed)."""
        ins = [self.get(v) for v in opr.inputs]
        extra = [self.get(v) for v in opr.extra_deps]
        if all(a is b for a, b in zip(ins, opr.inputs)) and all(
            a is b for a, b in zip(extra, opr.extra_deps)
        ):
            return opr.outputs
        new = opr.clone(ins)
        new.extra_deps = extra
        return self.graph.insert_opr(new)

    def apply(self, rule: Callable | None, reason: str) -> VarMap:
        """Sweep once with ``rule(rebuilt opr) -> list | None``; returns the var map."""
        for opr in self.oprs:
            outs = self.rebuild(opr)
            for old, new in zip(opr.outputs, outs):
                self.replace(old, new)
            cur = outs[0].owner
            if rule is None or cur.type_name != opr.type_name or cur.outputs != outs:
                continue  # simplified into another operator at insertion
            with inherit_props(self.graph, cur):
                got = rule(cur)
            if got is not None:
                for old, new in zip(opr.outputs, got):
                    if new is not None:
                        self.replace(old, new, reason)
        self._carry_extra_vardeps()
        return self.varmap

    def _carry_extra_vardeps(self) -> None:
        extra = self.graph.options.extra_vardeps
        for k in [k for k in extra if k in self.varmap]:
            extra.setdefault(self.varmap[k], []).extend(self.get(d) for d in extra[k])


@contextlib.contextmanager
def inherit_props(graph, src):
    """Operators inserted in the scope take ``src``'s priority (when they have none) and
    exception tracker, so that a rewrite keeps the comp seq order and error reports."""

    def hook(opr):
        if opr.priority == 0:
            opr.priority = src.priority
        if opr.tracker is None:
            opr.tracker = src.tracker

    graph.opr_insert_hooks.append(hook)
    try:
        yield
    finally:
        graph.opr_insert_hooks.remove(hook)


def combine(mode: str, vars_: list[VarNode]) -> VarNode:
    """``vars_[0] <mode> vars_[1] <mode> ...`` as Elemwise operators (left to right)."""
    out = SymbolVar(vars_[0])
    for v in vars_[1:]:
        out = elemwise(out, SymbolVar(v), mode=mode)
    return out.node


# ---- level 1: at insertion ---------------------------------------------------------------
def arith_simplify_on_insert(graph, opr):
    """Simplify an Elemwise about to be inserted; returns replacement outputs or None."""
    if abs(graph.options.graph_opt_level) < 1 or opr.type_name not in ("Elemwise", "TypeCvt"):
        return None
    out = _fold_immutable(graph, opr)
    if out is None and opr.type_name == "Elemwise":
        out = _simplify_elemwise(opr)
    if out is None:
        return None
    if graph.options.log_level >= 2:
        logger.info("gopt: %s simplified to %s", opr.default_name(), out.name)
    return [out]


def _simplify_elemwise(opr) -> VarNode | None:
    mode, ins = opr.param.mode, opr.inputs
    out = None
    if (
        mode == "NEGATE"
        and ins[0].owner.type_name == "Elemwise"
        and (ins[0].owner.param.mode == "NEGATE")
    ):
        out = ins[0].owner.inputs[0]
    elif len(ins) == 2:
        a, b = ins
        if mode in ("ADD", "SUB") and _is_scalar_const(b, 0):
            out = a
        elif mode == "ADD" and _is_scalar_const(a, 0):
            out = b
        elif mode in ("MUL", "TRUE_DIV") and _is_scalar_const(b, 1):
            out = a
        elif mode == "MUL" and _is_scalar_const(a, 1):
            out = b
        elif mode == "TRUE_DIV" and a is b and np.issubdtype(a.dtype, np.floating):
            out = fill_retain_dtype(SymbolVar(a), 1).node
        if out is not None and out in (a, b):
            # the result must keep the broadcast shape and dtype
            sa, sb = static_shape(a), static_shape(b)
            if sa is None or sb is None or out.dtype != a.dtype:
                return None
            if tuple(np.broadcast_shapes(sa, sb)) != static_shape(out):
                return None
    return out


def _fold_immutable(graph, opr) -> VarNode | None:
    """An Elemwise or TypeCvt over ImmutableTensors only becomes the ImmutableTensor of its
    value (a constant subexpression); None when it can not be computed now."""
    ins = opr.inputs
    if not ins or not all(v.owner.type_name == "ImmutableTensor" for v in ins):
        return None
    vals = [v.owner.value for v in ins]
    try:
        with np.errstate(all="ignore"):
            (dt,) = opr.infer_dtypes([v.dtype for v in ins])
            (shape,) = opr.infer_shapes([a.shape for a in vals], {})
            if dt.metadata or int(np.prod(shape)) * dt.itemsize > _FOLD_MAX_BYTES:
                return None
            out = np.empty(shape, dt)
            opr.bind(vals, [out])()
        cn = opr.infer_comp_node()
    except Exception:  # noqa: BLE001 - insert normally: the error is raised there, or at run
        return None
    return graph.insert_opr(ImmutableTensor(out, cn, OperatorNodeConfig()))[0]


def install(graph) -> None:
    """Attach the insertion-time simplifier to ``graph`` (it checks the level per call)."""
    if arith_simplify_on_insert not in graph.insert_rewriters:
        graph.insert_rewriters.append(arith_simplify_on_insert)


def chain_terms(rw: Rewriter, opr, mode: str) -> list[VarNode]:
    """The leaves of the Elemwise ``mode`` chain ending at ``opr``: inner links (read only by
    the chain, without extra deps) are looked through."""
    out, stack = [], list(reversed(opr.inputs))
    while stack:
        v = stack.pop()
        o = rw.sole_source(v, "Elemwise", mode)
        if o is not None:
            stack.extend(reversed(o.inputs))
        else:
            out.append(v)
    return out


# ---- level 2: before compile, in PRESET order --------------------------------------------
@register_pass("merge_common_subexpr")
def merge_common_subexpr(graph, dest):
    """Operators equal up to the order of commutative operands (which insertion-time
    deduplication does not see) are merged into the first one."""
    seen: dict = {}

    def rule(opr):
        if opr.has_side_effect or not opr.dedup:
            return None
        key = opr.hash_key()
        if opr.type_name == "Elemwise" and opr.param.mode in _COMMUTATIVE:
            key = (key[0], key[1], tuple(sorted(key[2])), *key[3:])
        twin = seen.setdefault(key, opr)
        return None if twin is opr else twin.outputs

    return Rewriter(graph, dest).apply(rule, "common subexpression")


def reorder_chains(rw: Rewriter, is_const: Callable[[VarNode], bool], reason: str) -> VarMap:
    """In each maximal ADD or MUL chain, gather the terms ``is_const`` accepts into one
    subexpression: ``(x + c1) + c2 -> x + (c1 + c2)``, which folding then computes once."""

    def absorbed(v: VarNode, mode: str) -> bool:
        rs = rw.readers_of(v)
        return (
            rw.sole_reader(v)
            and rs[0].type_name == "Elemwise"
            and rs[0].param.mode == mode
            and not rs[0].extra_deps
        )

    def rule(opr):
        if opr.type_name != "Elemwise" or opr.param.mode not in ("ADD", "MUL") or opr.extra_deps:
            return None
        mode = opr.param.mode
        if absorbed(opr.outputs[0], mode):
            return None  # not the root of its chain
        ts = chain_terms(rw, opr, mode)
        consts = [t for t in ts if is_const(t)]
        if len(consts) < 2 or len(consts) == len(ts):
            return None
        others = combine(mode, [t for t in ts if not is_const(t)])
        new = combine(mode, [others, combine(mode, consts)])
        if static_shape(new) != static_shape(opr.outputs[0]):
            return None
        return [new]

    return rw.apply(rule, reason)


def reorder_const_chain(graph, dest):
    """``(x + c1) + c2 -> x + (c1 + c2)`` (and MUL) for constant ``c1``, ``c2``: the compile
    preset's ``reorder_arith_chain`` (:func:`megbrain.gopt.inference.reorder_arith_chain`)."""
    return reorder_chains(
        Rewriter(graph, dest), lambda v: v.value_type == InferType.CONST, "arith chain reorder"
    )


@register_pass("fold_constants")
def fold_constants(graph, dest):
    """Replace computed vars with a CONST value by ImmutableTensors of that value."""
    varmap = VarMap()
    inf = Inferer()
    for opr in dep_oprs(dest):
        if not opr.inputs or opr.has_side_effect or opr.type_name == "ImmutableTensor":
            continue
        if opr.type_name in ("Broadcast",):  # folding would materialize a large tensor
            continue
        for v in opr.outputs:
            if v.value_type != InferType.CONST:
                continue
            val = inf.value(v)
            if val.nbytes > _FOLD_MAX_BYTES:
                continue
            new = graph.insert_opr(ImmutableTensor(val, v.comp_node, OperatorNodeConfig()))[0]
            varmap[v] = new
            varmap.reasons[v] = "constant folding"
    return varmap


@register_pass("remove_redundant_typecvt")
def remove_redundant_typecvt(graph, dest, options=None):
    """TypeCvt to the dtype its input already has is the identity (quantization parameters
    included: int8 to QuantizedS8, or between two scales, converts values)."""
    varmap = VarMap()
    for o in dep_oprs(dest):
        if o.type_name == "TypeCvt" and same_dtype(o.inputs[0].dtype, o.outputs[0].dtype):
            varmap[o.outputs[0]] = o.inputs[0]
            varmap.reasons[o.outputs[0]] = "redundant TypeCvt"
    return varmap


#: FUSE_ADD_<act> -> act
FUSE_ADD_ACTS = {f"FUSE_ADD_{m}": m for m in ("RELU", "SIGMOID", "TANH", "H_SWISH")}


def _chain_root(rw: Rewriter, opr, modes) -> bool:
    """Whether ``opr`` (an Elemwise of one of ``modes``) ends its chain."""
    if opr.type_name != "Elemwise" or opr.param.mode not in modes or opr.extra_deps:
        return False
    rs = rw.readers_of(opr.outputs[0])
    return not (
        rw.sole_reader(opr.outputs[0])
        and rs[0].type_name == "Elemwise"
        and rs[0].param.mode == opr.param.mode
        and not rs[0].extra_deps
    )


@register_pass("arith_fuse")
def arith_fuse(graph, dest, options=None):
    """``act(a + b)`` becomes ``FUSE_ADD_<act>(a, b)`` (act RELU, SIGMOID, TANH, H_SWISH);
    in an ADD chain, products read only by the chain become FUSE_MUL_ADD4 in pairs and a
    last one FUSE_MUL_ADD3 with a term of one of its factors' shape (the reference's
    ArithFusePass, in its compile preset as in its inference one). In a training graph the
    bias add and ReLU after a convolution become one in-place pass, and ReLU's gradient
    reads the fused output (``SWITCH_GT0(y, dy)``) instead of keeping the sum alive."""
    rw = Rewriter(graph, dest)
    acts = {m: f for f, m in FUSE_ADD_ACTS.items()}
    sv = SymbolVar

    def fuse_act(opr):
        (x,) = opr.inputs
        o = rw.sole_source(x, "Elemwise", "ADD")
        if o is None or x.dtype.metadata:
            return None
        return [elemwise(sv(o.inputs[0]), sv(o.inputs[1]), mode=acts[opr.param.mode]).node]

    def fuse_mul_add(opr):
        ts = chain_terms(rw, opr, "ADD")
        muls, bias = [], []
        for t in ts:
            o = rw.sole_source(t, "Elemwise", "MUL")
            if o is not None:
                a, b = o.inputs
                sa, sb = static_shape(a), static_shape(b)
                if sa is None or sb is None:
                    return None
                if int(np.prod(sa)) > int(np.prod(sb)):
                    a, b = b, a
                muls.append((a, b))
            else:
                bias.append(t)
        if not muls:
            return None
        sums = []
        while len(muls) >= 2:
            (a, b), (c, d) = muls.pop(), muls.pop()
            sums.append(elemwise(*map(sv, (c, d, a, b)), mode="FUSE_MUL_ADD4").node)
        if muls:
            a, b = muls.pop()
            pick = next(
                (t for t in bias if static_shape(t) in (static_shape(a), static_shape(b))),
                None,
            )
            if pick is not None:
                bias.remove(pick)
                sums.append(elemwise(sv(a), sv(b), sv(pick), mode="FUSE_MUL_ADD3").node)
            else:
                sums.append(combine("MUL", [a, b]))
        new = combine("ADD", bias + sums)
        if static_shape(new) != static_shape(opr.outputs[0]) or new.dtype != opr.outputs[0].dtype:
            return None
        return [new]

    def rule(opr):
        if opr.type_name != "Elemwise" or opr.extra_deps:
            return None
        if opr.param.mode in acts and len(opr.inputs) == 1:
            return fuse_act(opr)
        if _chain_root(rw, opr, ("ADD",)):  # before its activation: FMA wins, as the reference
            return fuse_mul_add(opr)
        return None

    return rw.apply(rule, "arithmetic fused")


# ---- running the preset -----------------------------------------------------------------
def optimize_for_compile(
    graph, dest: list[VarNode], *, only: tuple | None = None, skip: tuple = ()
) -> list[VarNode]:
    """Run the PRESET passes (those in ``only`` if given, less those in ``skip``, in PRESET
    order) on ``dest`` when ``|graph_opt_level| >= 2``; record and log every replacement; at
    a negative level, wrap replaced outputs in a run-time check."""
    level = graph.options.graph_opt_level
    if abs(level) < 2:
        return dest
    names = [p for p in PRESET if (only is None or p in only) and p not in skip]
    cur = run_passes(graph, dest, names, PASSES)
    if level < 0:
        from ..opr.utility import assert_equal

        cur = [
            v if v is o else assert_equal(SymbolVar(o), SymbolVar(v)).node
            for o, v in zip(dest, cur)
        ]
    return cur
