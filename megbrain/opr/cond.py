"""Conditional execution: CondExecPred, CondExecPredLogical, CondExecMark, CondExecMerge.

A predicate operator (:class:`CondExecPred`, :class:`CondExecPredLogical`) outputs one
*predicate proxy var* (PPV, an int32 ``(1,)`` holding 1 or 0) per branch and owns one
:class:`ExecutionMask` per PPV. :class:`CondExecMark` attaches the mask of its PPV to itself
and, through the graph's :class:`CondExecRegistry`, to every operator inserted later that
reads its outputs (directly or not), until a :class:`CondExecMerge` joins the branches again.
An operator with a mask carries it as ``exec_mask``; the executor guards its step with
``mask.enabled``, so operators of a branch not taken do not run. Masks nest: a mask set
under a disabled mask is disabled as well.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from ..errors import GraphError
from ..graph import OperatorNodeBase, ParamBase, register_opr
from ..graph.operator import fmt_shape, table_param
from ..serialization import sereg
from . import param_defs as pdefs
from .base import SymbolVar, _merge_config, as_var, canonize_input_vars, insert_opr
from .basic_arith import Elemwise
from .param_args import as_int, opr_params
from .tensor_manip import shape_to_var

__all__ = [
    "CondExecMark",
    "CondExecMerge",
    "CondExecPred",
    "CondExecPredLogical",
    "ExecutionMask",
    "cond_exec_mark",
    "cond_exec_mark_if_need",
    "cond_exec_merge",
    "cond_exec_pred",
    "cond_exec_pred_logical",
]

_I32 = np.dtype(np.int32)


class ExecutionMask:
    """Whether the operators of one branch run in the current execution.

    Set by the predicate operator owning it (``owner`` is its PPV) each time that operator
    runs; disabling a mask disables every mask nested under it.
    """

    __slots__ = ("owner", "enabled", "parent", "nested", "level", "__weakref__")

    def __init__(self, owner):
        self.owner = owner
        self.enabled = False
        self.parent: ExecutionMask | None = None
        self.nested: list[ExecutionMask] = []
        self.level = 0

    def enable(self, flag: bool) -> None:
        self.enabled = bool(flag)
        if not flag:
            stack = list(self.nested)
            while stack:
                m = stack.pop()
                m.enabled = False
                stack.extend(m.nested)

    def add_nested(self, nested: ExecutionMask) -> None:
        nested.parent = self
        nested.level = self.level + 1
        self.nested.append(nested)

    @staticmethod
    def find_direct_lowest(a, b):
        """The lower of two masks on one root path (None when they are on different paths)."""
        if a is None or a is b:
            return b
        if b is None:
            return a
        lo, hi = (a, b) if a.level <= b.level else (b, a)
        ret = hi
        while hi is not None and hi.level >= lo.level:
            if hi is lo:
                return ret
            hi = hi.parent
        return None

    def __repr__(self) -> str:
        return f"ExecutionMask({self.owner.name!r})"


def _is_pred(opr) -> bool:
    return isinstance(opr, (CondExecPred, CondExecPredLogical))


def _can_prove_imply(lhs: ExecutionMask, rhs: ExecutionMask) -> bool:
    """Whether ``lhs`` enabled implies ``rhs`` enabled (rhs is lhs's parent, or an OR of
    PPVs that includes lhs's)."""
    if rhs is lhs.parent:
        return True
    opr = rhs.owner.owner
    if isinstance(opr, CondExecPredLogical) and opr.param.mode == "AND" and len(opr.inputs) == 1:
        opr = opr.inputs[0].owner
    if isinstance(opr, CondExecPredLogical) and opr.param.mode == "OR":
        return any(v is lhs.owner for v in opr.inputs)
    return False


class CondExecRegistry:
    """Per graph: the execution mask of each conditional var, propagated at insertion."""

    KEY = "cond_exec_registry"

    def __init__(self):
        self.var2mask: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @classmethod
    def get(cls, graph) -> CondExecRegistry:
        reg = graph.internal_data.get(cls.KEY)
        if reg is None:
            reg = graph.internal_data[cls.KEY] = cls()
            graph.opr_insert_hooks.append(reg.on_new_opr)
            graph.insert_rewriters.append(reg.merge_grad_sum)
        return reg

    @classmethod
    def find(cls, graph) -> CondExecRegistry | None:
        return graph.internal_data.get(cls.KEY)

    def mask_of(self, var) -> ExecutionMask | None:
        return self.var2mask.get(var)

    def require_ppv(self, var, what: str) -> ExecutionMask:
        mask = self.var2mask.get(var)
        if mask is None or mask.owner is not var:
            raise GraphError(
                f"{what}: var {var.name!r} is not a predicate proxy var (an output of "
                "cond_exec_pred or cond_exec_pred_logical)"
            )
        return mask

    def on_new_opr(self, opr) -> None:
        """Decide the mask of a newly inserted operator from its inputs' masks."""
        is_mark = isinstance(opr, CondExecMark)
        is_merge = isinstance(opr, CondExecMerge)
        is_logical = isinstance(opr, CondExecPredLogical)
        mode = opr.param.mode if is_merge else None
        follow_pred = is_mark or mode == "SUM_COND_OUT"
        mask = None
        n_in = len(opr.inputs)
        for idx, v in enumerate(opr.inputs):
            is_last = idx == n_in - 1
            if _is_pred(v.owner) and not ((follow_pred and is_last) or is_logical):
                raise GraphError(
                    f"{opr.type_name} {opr.name!r}: input {idx} ({v.name!r}) is a predicate "
                    "proxy var; only cond_exec_mark, cond_exec_merge and cond_exec_pred_logical "
                    "read those"
                )
            if follow_pred and is_last:
                i_mask = self.require_ppv(v, f"{opr.type_name} {opr.name!r}")
                if mask is not None and not _can_prove_imply(i_mask, mask):
                    raise GraphError(
                        f"{opr.type_name} {opr.name!r}: can not prove that the mask of "
                        f"{v.name!r} implies the mask of the other inputs "
                        f"({mask.owner.name!r})"
                    )
                mask = i_mask
                break
            i_mask = self.var2mask.get(v)
            if is_logical and i_mask is not None:
                i_mask = i_mask.parent
            if is_merge:
                if mode == "SUM" and idx >= opr.nr_branch * opr.nr_out:
                    if v.value_static:
                        i_mask = None
                elif i_mask is not None:
                    i_mask = i_mask.parent
            if i_mask is not None:
                lower = ExecutionMask.find_direct_lowest(mask, i_mask)
                if lower is None:
                    raise GraphError(
                        f"{opr.type_name} {opr.name!r}: inputs are under execution masks of "
                        f"different branches ({mask.owner.name!r} and {i_mask.owner.name!r}); "
                        "merge the branches with cond_exec_merge first"
                    )
                mask = lower
        if is_merge:
            opr.branch_masks = [
                self._branch_mask(opr, br) for br in range(opr.nr_branch)
            ]
        if is_logical:
            opr.in_masks = [self.require_ppv(v, "cond_exec_pred_logical") for v in opr.inputs]
        opr.exec_mask = mask
        if mask is not None:
            for o in opr.outputs:
                self.var2mask[o] = mask
        if isinstance(opr, CondExecPred):
            opr.masks = [ExecutionMask(o) for o in opr.outputs]
        elif is_logical:
            opr.masks = [ExecutionMask(opr.outputs[0])]
        else:
            return
        for o, m in zip(opr.outputs, opr.masks):
            if mask is not None:
                mask.add_nested(m)
            self.var2mask[o] = m

    def merge_grad_sum(self, graph, opr):
        """Insert rewriter (the reference's ``modify_grad_sum_list``): while a gradient is
        built, the sum of gradient parts from sibling branches (SUM_COND_OUT merges, or vars
        of a branch) becomes one SUM_COND_OUT merge over all their branches, which runs when
        any of them is active."""
        if not (
            isinstance(opr, Elemwise)
            and opr.param.mode == "ADD"
            and len(opr.inputs) == 2
            and graph.__dict__.get("_grad_target_stack")
        ):
            return None
        a, b = opr.inputs
        ma, mb = self.var2mask.get(a), self.var2mask.get(b)
        if ma is None or mb is None or ExecutionMask.find_direct_lowest(ma, mb) is not None:
            return None
        if a.dtype != b.dtype:
            return None
        branches = []
        for v in (a, b):
            o = v.owner
            if isinstance(o, CondExecMerge) and o.param.mode == "SUM_COND_OUT" and o.nr_out == 1:
                branches += o.inputs[:-1]
            else:
                branches.append(v)
        (out,) = cond_exec_merge([SymbolVar(v) for v in branches], mode="SUM_COND_OUT")
        return [out.node]

    def _branch_mask(self, opr, br: int) -> ExecutionMask:
        got = None
        for j in range(opr.nr_out):
            v = opr.inputs[br * opr.nr_out + j]
            m = self.var2mask.get(v)
            if m is None:
                raise GraphError(
                    f"CondExecMerge {opr.name!r}: input {br * opr.nr_out + j} ({v.name!r}) of "
                    f"branch {br} is not conditional; mark it with cond_exec_mark"
                )
            if got is not None and m is not got:
                raise GraphError(
                    f"CondExecMerge {opr.name!r}: the vars of branch {br} are under "
                    f"different masks ({got.owner.name!r} and {m.owner.name!r})"
                )
            got = m
        return got


# ---- CondExecPred ---------------------------------------------------------------------------
@dataclass(frozen=True)
@table_param(pdefs.CondExecPred)
class CondExecPredParam(ParamBase):
    """Param of CondExecPred: how the predicate selects branches, the float tolerance."""


def _comparer(pred: np.ndarray, eps: float):
    """``key -> -1 / 0 / 1``: pred below, equal to (within eps for floats) or above key."""
    p = pred.reshape(-1)[0]
    if pred.dtype.kind == "f":
        pf = float(p)

        def cmp(key):
            k = float(key.reshape(-1)[0])
            return 0 if abs(pf - k) < eps else (-1 if pf < k else 1)

    else:
        pi = int(p)

        def cmp(key):
            k = int(key.reshape(-1)[0])
            return 0 if pi == k else (-1 if pi < k else 1)

    return cmp


def _scalar_check(opr, shapes) -> None:
    for i, s in enumerate(shapes):
        if s is not None and int(np.prod(s)) != 1:
            what = "predicate" if i == len(shapes) - 1 else f"branch key {i}"
            raise opr.error(
                f"the {what} must be a scalar, got shape {fmt_shape(s)}", GraphError
            )


@register_opr
class CondExecPred(OperatorNodeBase):
    """Inputs ``keys + [pred]``; one PPV per branch (CASE: one per key; CASE_FALLBACK: one
    more, active when no key matches; PIECEWISE: the ``len(keys) + 1`` intervals)."""

    Param = CondExecPredParam
    value_inferable = False
    exec_mask = None

    def __init__(self, inputs, param, config):
        super().__init__(inputs, param, config)
        nkeys = len(inputs) - 1
        self.nr_outputs = nkeys + (0 if param.mode == "CASE" else 1)
        self.masks: list[ExecutionMask] = []

    def default_name(self):
        return f"cond_pred({self.inputs[-1].name})"

    def infer_dtypes(self, in_dtypes):
        pdt = in_dtypes[-1]
        for i, dt in enumerate(in_dtypes[:-1]):
            if dt != pdt:
                raise self.error(
                    f"dtype mismatch: pred is {pdt.name} but key {i} is {dt.name}", GraphError
                )
        if pdt.kind not in "fiu":
            raise self.error(f"unsupported pred dtype {pdt.name}", GraphError)
        CondExecRegistry.get(self.graph)
        return [_I32] * self.nr_outputs

    def infer_shapes(self, in_shapes, in_values):
        _scalar_check(self, in_shapes)
        return [(1,)] * self.nr_outputs

    def flags(self, ins) -> list[bool]:
        """Which branches are active for the key and pred values ``ins``."""
        _scalar_check(self, [a.shape for a in ins])
        cmp = _comparer(ins[-1], self.param.eps)
        keys = ins[:-1]
        if self.param.mode == "PIECEWISE":
            res = [cmp(k) for k in keys]
            out = []
            for i in range(len(keys) + 1):
                left = 1 if i == 0 else res[i - 1]  # pred vs the interval's left end
                right = -1 if i == len(keys) else res[i]
                out.append(left != -1 and right == -1)
            return out
        out = [cmp(k) == 0 for k in keys]
        if self.param.mode == "CASE_FALLBACK":
            out.append(not any(out))
        return out

    def bind(self, ins, outs):
        def run():
            for m, o, f in zip(self.masks, outs, self.flags(ins)):
                m.enable(f)
                o[0] = f

        return run


# ---- CondExecPredLogical --------------------------------------------------------------------
@dataclass(frozen=True)
@table_param(pdefs.CondExecPredLogical)
class CondExecPredLogicalParam(ParamBase):
    """Param of CondExecPredLogical: the logical function."""


def logical_reduce(mode: str, flags) -> bool:
    """``mode`` (OR, AND, XOR, NOR, NAND, XNOR) over the booleans ``flags``."""
    flags = [bool(f) for f in flags]
    base = mode[1:] if mode in ("NOR", "NAND", "XNOR") else mode
    if base == "OR":
        r = any(flags)
    elif base == "AND":
        r = all(flags)
    else:
        r = sum(flags) % 2 == 1
    return r != (base != mode)


@register_opr
class CondExecPredLogical(OperatorNodeBase):
    """A PPV active when the logical function of the input PPVs' masks is true."""

    Param = CondExecPredLogicalParam
    value_inferable = False
    exec_mask = None

    def __init__(self, inputs, param, config):
        super().__init__(inputs, param, config)
        self.in_masks: list[ExecutionMask] = []
        self.masks: list[ExecutionMask] = []

    def default_name(self):
        return f"{self.param.mode}({','.join(v.name for v in self.inputs)})"

    def infer_dtypes(self, in_dtypes):
        reg = CondExecRegistry.find(self.graph)
        for v in self.inputs:
            if reg is None:
                raise GraphError(f"cond_exec_pred_logical: {v.name!r} is not a PPV")
            reg.require_ppv(v, "cond_exec_pred_logical")
        return [_I32]

    def infer_shapes(self, in_shapes, in_values):
        return [(1,)]

    def bind(self, ins, outs):
        out, mode = outs[0], self.param.mode

        def run():
            f = logical_reduce(mode, [m.enabled for m in self.in_masks])
            self.masks[0].enable(f)
            out[0] = f

        return run


# ---- CondExecMark ---------------------------------------------------------------------------
@dataclass(frozen=True)
@table_param(pdefs.CondExecMark)
class CondExecMarkParam(ParamBase):
    """Param of CondExecMark: the gradient's merge mode, what is statically inferred."""


@register_opr
class CondExecMark(OperatorNodeBase):
    """Inputs ``vars + [ppv]``; output i is input i (a view), under the PPV's mask.

    Output values are never statically inferred (SHAPE_VALUE acts as SHAPE_ONLY), so
    constant folding never removes an operator of a branch; with ``static_infer`` NONE the
    output shapes are dynamic as well.
    """

    Param = CondExecMarkParam
    value_inferable = False
    exec_mask = None

    def __init__(self, inputs, param, config):
        super().__init__(inputs, param, config)
        self.nr_outputs = len(inputs) - 1
        self.dynamic_output_shape = param.static_infer == "NONE"

    def default_name(self):
        return f"cond_mark({','.join(v.name for v in self.inputs[:-1])})"

    def infer_dtypes(self, in_dtypes):
        reg = CondExecRegistry.find(self.graph)
        ppv = self.inputs[-1]
        if reg is None:
            raise GraphError(f"cond_exec_mark: {ppv.name!r} is not a predicate proxy var")
        reg.require_ppv(ppv, "cond_exec_mark")
        return list(in_dtypes[:-1])

    def infer_shapes(self, in_shapes, in_values):
        return list(in_shapes[:-1])

    def fwd_views(self, ins):
        return list(ins[:-1])

    def bind(self, ins, outs):
        pairs = list(zip(outs, ins[:-1]))

        def run():
            for o, i in pairs:
                np.copyto(o, i)

        return run

    def grad(self, wrt_idx, out_grads):
        if wrt_idx == len(self.inputs) - 1 or out_grads[wrt_idx] is None:
            return None
        og = SymbolVar(out_grads[wrt_idx])
        if self.param.grad_mode == "SUM":
            shp = SymbolVar(self.inputs[wrt_idx]).shape
            return cond_exec_merge([og], [shp], mode="SUM")[0].node
        return cond_exec_merge([og], mode="SUM_COND_OUT")[0].node


# ---- CondExecMerge --------------------------------------------------------------------------
@dataclass(frozen=True)
@table_param(pdefs.CondExecMerge)
class CondExecMergeParam(ParamBase):
    """Param of CondExecMerge: the outputs per branch, how the branches merge."""


@register_opr
class CondExecMerge(OperatorNodeBase):
    """Inputs: the branches' vars (``nr_branch x nr_output``, branch-major), then the
    output shapes (SUM), then the OR of the branches' PPVs (SUM_COND_OUT).

    EXACT_ONE / EXACT_ONE_SAME_SHAPE copy the one active branch (an error if none or
    several are active); SUM adds the active branches (zeros of the given shapes if none
    is); SUM_COND_OUT adds them and runs only when one is active. EXACT_ONE's output shapes
    are dynamic (they are the active branch's).
    """

    Param = CondExecMergeParam
    value_inferable = False
    exec_mask = None

    def __init__(self, inputs, param, config):
        super().__init__(inputs, param, config)
        self.nr_out = n = param.nr_output
        extra = {"SUM": n, "SUM_COND_OUT": 1}.get(param.mode, 0)
        self.nr_branch = (len(inputs) - extra) // n
        self.nr_outputs = n
        self.dynamic_output_shape = param.mode == "EXACT_ONE"
        if param.mode == "SUM":
            idx = tuple(range(self.nr_branch * n, self.nr_branch * n + n))
            self.value_deps = self.static_only_inputs = idx
        self.branch_masks: list[ExecutionMask] = []

    def default_name(self):
        return f"cond_merge({','.join(v.name for v in self.inputs[:2])})"

    def _inp(self, br: int, k: int):
        return br * self.nr_out + k

    def infer_dtypes(self, in_dtypes):
        dts = in_dtypes[: self.nr_out]
        for br in range(self.nr_branch):
            for k in range(self.nr_out):
                dt = in_dtypes[self._inp(br, k)]
                if dt != dts[k]:
                    raise self.error(
                        f"branch {br} output {k} has dtype {dt.name}, branch 0 has "
                        f"{dts[k].name}",
                        GraphError,
                    )
        return list(dts)

    def infer_shapes(self, in_shapes, in_values):
        mode = self.param.mode
        if mode == "SUM":
            base = self.nr_branch * self.nr_out
            return [
                tuple(int(s) for s in np.asarray(in_values[base + k]).reshape(-1))
                for k in range(self.nr_out)
            ]
        out = []
        for k in range(self.nr_out):
            shapes = [in_shapes[self._inp(br, k)] for br in range(self.nr_branch)]
            known = [s for s in shapes if s is not None]
            if mode != "EXACT_ONE" and any(tuple(s) != tuple(known[0]) for s in known):
                raise self.error(
                    f"mode {mode} needs branches of one shape; output {k} has "
                    + ", ".join(fmt_shape(s) for s in shapes),
                    GraphError,
                )
            out.append(known[0] if known else None)
        return out

    def _active(self) -> list[int]:
        act = [br for br, m in enumerate(self.branch_masks) if m.enabled]
        if self.param.mode in ("EXACT_ONE", "EXACT_ONE_SAME_SHAPE") and len(act) != 1:
            what = "no branch is" if not act else f"branches {act} are"
            raise GraphError(
                f"CondExecMerge {self.name!r}: {what} active in mode {self.param.mode}; "
                "exactly one must be"
            )
        return act

    def _compute(self, ins, outs) -> None:
        act = self._active()
        for k, o in enumerate(outs):
            if not act:
                o.fill(0)
                continue
            first = ins[self._inp(act[0], k)]
            if first.shape != o.shape:
                raise GraphError(
                    f"CondExecMerge {self.name!r}: branch {act[0]} output {k} has shape "
                    f"{fmt_shape(first.shape)}, expected {fmt_shape(o.shape)}"
                )
            np.copyto(o, first)
            for br in act[1:]:
                x = ins[self._inp(br, k)]
                if x.shape != o.shape:
                    raise GraphError(
                        f"CondExecMerge {self.name!r}: branch {br} output {k} has shape "
                        f"{fmt_shape(x.shape)}, expected {fmt_shape(o.shape)}"
                    )
                np.add(o, x, out=o)

    def bind(self, ins, outs):
        return lambda: self._compute(ins, outs)

    def run_dynamic(self, ins):
        act = self._active()
        shapes = []
        for k in range(self.nr_out):
            if self.param.mode == "SUM":
                base = self.nr_branch * self.nr_out
                shp = tuple(int(s) for s in np.asarray(ins[base + k]).reshape(-1))
            elif act:
                shp = ins[self._inp(act[0], k)].shape
            else:
                raise GraphError(f"CondExecMerge {self.name!r}: no branch is active")
            shapes.append(shp)
        outs = [np.empty(s, v.dtype) for s, v in zip(shapes, self.outputs)]
        self._compute(ins, outs)
        return outs

    def grad(self, wrt_idx, out_grads):
        if wrt_idx >= self.nr_branch * self.nr_out:
            return None  # shapes (SUM) and the OR of the PPVs (SUM_COND_OUT)
        br, k = divmod(wrt_idx, self.nr_out)
        og = out_grads[k]
        if og is None:
            return None
        ppv = SymbolVar(self.branch_masks[br].owner)
        infer = "NONE" if self.param.mode == "EXACT_ONE" else "SHAPE_VALUE"
        return cond_exec_mark(ppv, SymbolVar(og), static_infer=infer)[0].node


# ---- functions ------------------------------------------------------------------------------
def _flat(args) -> list:
    """Varargs of vars, or one list of them."""
    if len(args) == 1 and isinstance(args[0], (list, tuple)):
        return list(args[0])
    return list(args)


@opr_params(("param", "CondExecPred"))
def cond_exec_pred(
    pred, *keys, mode: str = "CASE", eps: float = 1e-4, name=None, comp_node=None,
    config=None, comp_graph=None,
) -> list[SymbolVar]:  # fmt: skip
    """Compare the scalar ``pred`` with the branch ``keys``: one PPV per branch.

    Parameters
    ----------
    pred : SymbolVar
        A scalar (shape (1,)) var; its value is read when the operator runs.
    *keys : SymbolVar or number
        The branch keys (scalars of pred's dtype), or one list of them.
    mode : {"CASE", "CASE_FALLBACK", "PIECEWISE"}
        CASE: PPV i is active when ``pred == keys[i]`` (within ``eps`` for floats);
        CASE_FALLBACK: one more PPV, active when no key matches; PIECEWISE: ``len(keys)+1``
        PPVs for the intervals ``(-inf, k0), [k0, k1), ..., [k_last, inf)``.
    eps : float
        Tolerance of float equality.

    Returns
    -------
    list of SymbolVar
        The predicate proxy vars, for :func:`cond_exec_mark` and :func:`cond_exec_merge`.
    """
    keys = _flat(keys)
    if not keys:
        raise GraphError("cond_exec_pred: at least one branch key is needed")
    cfg = _merge_config(name, comp_node, config)
    pv = as_var(pred)
    vs = canonize_input_vars(
        keys + [pred], comp_graph=comp_graph, config=cfg,
        dtype=None if pv is None else pv.dtype,
    )  # fmt: skip
    return insert_opr(CondExecPred(vs, CondExecPredParam(mode, float(eps)), cfg))


@opr_params(("param", "CondExecPredLogical"))
def cond_exec_pred_logical(
    *ppvs, mode: str = "OR", name=None, comp_node=None, config=None, comp_graph=None
) -> SymbolVar:
    """A PPV active when ``mode`` (OR, AND, XOR, NOR, NAND, XNOR) of the PPVs holds.

    A single PPV under OR, AND or XOR is returned as it is.
    """
    ppvs = _flat(ppvs)
    if not ppvs:
        raise GraphError("cond_exec_pred_logical: at least one PPV is needed")
    cfg = _merge_config(name, comp_node, config)
    param = CondExecPredLogicalParam(mode)
    vs = canonize_input_vars(ppvs, comp_graph=comp_graph, config=cfg)
    if len(vs) == 1 and param.mode in ("OR", "AND", "XOR") and not cfg.comp_nodes:
        reg = CondExecRegistry.find(vs[0].graph)
        if reg is None:
            raise GraphError(f"cond_exec_pred_logical: {vs[0].name!r} is not a PPV")
        reg.require_ppv(vs[0], "cond_exec_pred_logical")
        return SymbolVar(vs[0])
    return insert_opr(CondExecPredLogical(vs, param, cfg))[0]


@opr_params(("param", "CondExecMark"))
def cond_exec_mark(
    ppv, *inputs, grad_mode: str = "SUM", static_infer: str = "SHAPE_VALUE", name=None,
    comp_node=None, config=None, comp_graph=None,
) -> list[SymbolVar]:  # fmt: skip
    """Mark ``inputs`` as conditional on ``ppv``: operators reading the outputs (and their
    readers, up to a :func:`cond_exec_merge`) run only when the PPV is active.

    Parameters
    ----------
    ppv : SymbolVar
        A predicate proxy var.
    *inputs : SymbolVar
        The vars entering the branch (or one list of them).
    grad_mode : {"SUM", "SUM_COND_OUT"}
        How the gradient leaves the branch: a SUM merge (zeros when not taken), or a
        SUM_COND_OUT merge (itself conditional).
    static_infer : {"SHAPE_VALUE", "SHAPE_ONLY", "NONE"}
        NONE makes the output shapes dynamic.

    Returns
    -------
    list of SymbolVar
        One output per input, with the input's value.
    """
    inputs = _flat(inputs)
    if not inputs:
        raise GraphError("cond_exec_mark: at least one input is needed")
    cfg = _merge_config(name, comp_node, config)
    vs = canonize_input_vars(inputs + [ppv], comp_graph=comp_graph, config=cfg)
    return insert_opr(CondExecMark(vs, CondExecMarkParam(grad_mode, static_infer), cfg))


@opr_params(("param", "CondExecMark"))
def cond_exec_mark_if_need(
    maybe_ppv, input, *, grad_mode: str = "SUM", static_infer: str = "SHAPE_VALUE",
    name=None, comp_node=None, config=None, comp_graph=None,
) -> SymbolVar:  # fmt: skip
    """:func:`cond_exec_mark` of ``input`` with the mask of ``maybe_ppv`` when that is a PPV
    or a conditional var; ``input`` itself otherwise."""
    mv = as_var(maybe_ppv)
    if mv is None:
        raise GraphError("cond_exec_mark_if_need: maybe_ppv must be a var")
    reg = CondExecRegistry.find(mv.graph)
    mask = None if reg is None else reg.mask_of(mv)
    if mask is None:
        (v,) = canonize_input_vars([input], comp_graph=comp_graph or mv.graph.api_graph())
        return SymbolVar(v)
    return cond_exec_mark(
        SymbolVar(mask.owner), input, grad_mode=grad_mode, static_infer=static_infer,
        name=name, comp_node=comp_node, config=config, comp_graph=comp_graph,
    )[0]  # fmt: skip


@opr_params(("param", "CondExecMerge"))
def cond_exec_merge(
    inputs, out_shapes=(), *, nr_output: int = 1, mode: str = "EXACT_ONE", name=None,
    comp_node=None, config=None, comp_graph=None,
) -> list[SymbolVar]:  # fmt: skip
    """Merge conditional branches into unconditional vars.

    Parameters
    ----------
    inputs : list of SymbolVar
        ``nr_branch * nr_output`` vars, branch-major: ``inputs[b * nr_output + k]`` is output
        k of branch b; the vars of one branch share one mask.
    out_shapes : list, optional
        SUM only: the shape of each output (used when no branch is active); by default the
        shape of the first branch whose shape is static.
    nr_output : int
        Vars per branch.
    mode : {"EXACT_ONE", "EXACT_ONE_SAME_SHAPE", "SUM", "SUM_COND_OUT"}
        See :class:`CondExecMerge`.

    Returns
    -------
    list of SymbolVar
        ``nr_output`` vars.
    """
    inputs = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
    nr_output = as_int(nr_output, "cond_exec_merge", "nr_output")
    param = CondExecMergeParam(nr_output, mode)
    if nr_output < 1 or not inputs or len(inputs) % nr_output:
        raise GraphError(
            f"cond_exec_merge: {len(inputs)} inputs can not be split into branches of "
            f"nr_output={nr_output} vars"
        )
    cfg = _merge_config(name, comp_node, config)
    vs = canonize_input_vars(inputs, comp_graph=comp_graph, config=cfg)
    out_shapes = list(out_shapes) if isinstance(out_shapes, (list, tuple)) else [out_shapes]
    if param.mode != "SUM" and out_shapes:
        raise GraphError(f"cond_exec_merge: out_shapes is only for mode SUM, not {param.mode}")
    if param.mode == "SUM":
        if not out_shapes:
            for k in range(nr_output):
                cands = [vs[b * nr_output + k] for b in range(len(vs) // nr_output)]
                src = next((v for v in cands if v.shape_static), None)
                if src is None:
                    raise GraphError(
                        f"cond_exec_merge: out_shapes is omitted but no branch's output {k} "
                        "has a static shape"
                    )
                out_shapes.append(SymbolVar(src).shape)
        if len(out_shapes) != nr_output:
            raise GraphError(
                f"cond_exec_merge: {len(out_shapes)} out_shapes given for {nr_output} outputs"
            )
        vs += [shape_to_var(s, SymbolVar(vs[0])).node for s in out_shapes]
    elif param.mode == "SUM_COND_OUT":
        reg = CondExecRegistry.find(vs[0].graph)
        if reg is None:
            raise GraphError("cond_exec_merge: the inputs are not conditional")
        ppvs = []
        for b in range(len(vs) // nr_output):
            m = reg.mask_of(vs[b * nr_output])
            if m is None:
                raise GraphError(
                    f"cond_exec_merge: input {b * nr_output} ({vs[b * nr_output].name!r}) is "
                    "not conditional; mark it with cond_exec_mark"
                )
            ppvs.append(SymbolVar(m.owner))
        vs.append(cond_exec_pred_logical(ppvs, mode="OR").node)
    return insert_opr(CondExecMerge(vs, param, cfg))


# ---- serialization: each operator is its param-def table and its inputs ----------------------

sereg.register_param_opr(CondExecPred, pdefs.CondExecPred)
sereg.register_param_opr(CondExecPredLogical, pdefs.CondExecPredLogical)
sereg.register_param_opr(CondExecMark, pdefs.CondExecMark)
sereg.register_param_opr(CondExecMerge, pdefs.CondExecMerge)
