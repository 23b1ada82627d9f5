"""Compile-time fusions of a transformer-style block's operators (ConvNeXt's): a product by
a weight with the bias and elementwise tail reading it (``fuse_matmul_tail``,
:class:`~megbrain.opr.blas.BatchedMatrixMulTail`), then the layer scale and shortcut add
after the block's last product (``fuse_matmul_residual``), and a layer normalization over
the last axis as one operator (``fuse_layer_norm``, :class:`~megbrain.opr.dnn_norm.LayerNormLast`).
All run after ``jit_fusion``, on its JITExecutors, at the same JIT levels, and only in
compiled functions (graph files keep the operators they replace)."""

from __future__ import annotations

import numpy as np

from ..graph import OperatorNodeConfig, VarNode
from ..kernels.jit_codegen import interpret
from ..kernels.packed_gemm import TAIL_MODES
from ..opr.base import SymbolVar
from ..opr.blas import BatchedMatrixMul, BatchedMatrixMulTail, BatchedMatrixMulTailParam
from ..opr.dnn_norm import LayerNormLast, LayerNormLastParam
from ..opr.tensor_manip import dimshuffle, reshape
from .jit import _fusable_graph, _shape, _sweep
from .passes import register_pass

__all__ = ["fuse_layer_norm", "fuse_matmul_residual", "fuse_matmul_tail"]

_F32 = np.dtype(np.float32)


def _column_bias(v: VarNode, n: int) -> bool:
    """Whether ``v`` is a float32 vector of ``n`` values along the last axis ((n,), or
    (1, ..., 1, n))."""
    shape = _shape(v)
    return (
        v.dtype == _F32
        and shape is not None
        and len(shape) >= 1
        and shape[-1] == n
        and all(d == 1 for d in shape[:-1])
    )


def _split_bias_add(opr, y: VarNode, n: int) -> tuple[VarNode, tuple] | None:
    """``(bias, tail)`` when ``opr`` (an Elemwise ADD or a JITExecutor) computes
    ``tail(y + bias)``: its first node adds a column bias to ``y`` and the rest reads only
    that sum, constants and modes of :data:`TAIL_MODES`; else None."""
    if opr.extra_deps or len(opr.inputs) != 2 or opr.outputs[0].dtype != _F32:
        return None
    if opr.type_name == "Elemwise" and opr.param.mode == "ADD":
        bias = opr.inputs[1] if opr.inputs[0] is y else opr.inputs[0]
        if bias is y or opr.inputs[1] is not y and opr.inputs[0] is not y:
            return None
        return (bias, ()) if _column_bias(bias, n) else None
    if opr.type_name != "JITExecutor" or opr.param.reduce is not None:
        return None
    if opr.inputs[0] is opr.inputs[1] or y not in opr.inputs:
        return None
    iy = opr.inputs.index(y)
    (mode, args), *rest = opr.param.expr
    if mode != "ADD" or sorted(args) != [("i", 0), ("i", 1)]:
        return None
    tail = []
    for m, margs in rest:
        if m not in TAIL_MODES or any(k == "i" for k, _ in margs):
            return None
        tail.append((m, tuple(("i", 0) if (k, j) == ("t", 0) else (k, j - 1) if k == "t"
                              else (k, j) for k, j in margs)))  # fmt: skip
    bias = opr.inputs[1 - iy]
    return (bias, tuple(tail)) if _column_bias(bias, n) else None


@register_pass("fuse_matmul_tail")
def fuse_matmul_tail(graph, dest: list[VarNode]) -> dict:
    """The pass (after ``jit_fusion``, at JIT level 1 and up): a float32 BatchedMatrixMul
    whose product only an Elemwise ADD of a column bias, or a JITExecutor computing an
    expression of such a sum (a Linear layer's bias and GELU), reads (directly or through
    one Reshape that only it reads) becomes one
    :class:`~megbrain.opr.blas.BatchedMatrixMulTail`; a Reshape after it gives the replaced
    output's shape."""
    found = _fusable_graph(graph, dest)
    if found is None:
        return {}
    oprs, readers, external = found
    fused_at: dict = {}  # the tail operator -> (product, reshape or None, bias, tail)
    for o in oprs:
        if type(o) is not BatchedMatrixMul or o.extra_deps or o.outputs[0].dtype != _F32:
            continue
        y = o.outputs[0]
        shape = _shape(y)
        if shape is None or y in external or len(readers.get(y, ())) != 1:
            continue
        (nxt,) = readers[y]
        reshape = None
        if nxt.type_name == "Reshape" and not nxt.extra_deps:
            reshape, y = nxt, nxt.outputs[0]
            if y in external or len(readers.get(y, ())) != 1:
                continue
            (nxt,) = readers[y]
        if nxt.comp_node != o.comp_node:
            continue
        split = _split_bias_add(nxt, y, shape[-1])
        if split is not None:
            fused_at[nxt] = (o, reshape, *split)
    if not fused_at:
        return {}

    def fused(t, memo: dict) -> tuple[VarNode, VarNode]:
        mm, reshape, bias, tail = fused_at[t]
        fields = {f: getattr(mm.param, f) for f in mm.param.__dataclass_fields__}
        param = BatchedMatrixMulTailParam(**fields, tail=tail)
        cfg = OperatorNodeConfig(comp_node=mm.comp_node)
        b = memo.get(bias, bias)
        new = graph.insert_opr(BatchedMatrixMulTail([memo.get(v, v) for v in mm.inputs] + [b],
                                                    param, cfg))[0]  # fmt: skip
        if reshape is not None:
            new = graph.insert_opr(reshape.clone([new, *reshape.inputs[1:]]))[0]
        return t.outputs[0], new

    skip = {mm for mm, *_ in fused_at.values()}
    skip.update(r for _, r, *_ in fused_at.values() if r is not None)
    return _sweep(graph, oprs, skip, {t: fused for t in fused_at})


def _fusable_with_readers(graph, dest: list[VarNode]) -> tuple | None:
    """``(oprs, readers, only)``: :func:`~.jit._fusable_graph`'s operators and readers, and
    ``only(v, oprs)``, whether exactly ``oprs`` read ``v`` and nothing outside them needs it;
    None where no fusion runs."""
    found = _fusable_graph(graph, dest)
    if found is None:
        return None
    oprs, readers, external = found

    def only(v: VarNode, want: set) -> bool:
        return v not in external and set(readers.get(v, ())) == want

    return oprs, readers, only


#: the Dimshuffle from channels-last (N, H, W, C) to the (N, C, H, W) view, as ONNX's
#: Transpose after a ConvNeXt block's MLP imports
_TO_NCHW = (0, 3, 1, 2)


def _channels_last_view(v: VarNode) -> VarNode | None:
    """The (N, H, W, C) var whose Dimshuffle :data:`_TO_NCHW` ``v`` is, else None."""
    o = v.owner
    if o is None or o.type_name != "Dimshuffle" or o.extra_deps:
        return None
    if tuple(o.param.pattern) != _TO_NCHW or len(_shape(o.inputs[0]) or ()) != 4:
        return None
    return o.inputs[0]


def _residual_parts(opr, only, fused: dict) -> tuple | None:
    """``(product, scale, x, shortcut (N, H, W, C) or None)`` when the Elemwise ``opr``
    computes ``scale * y + x`` (FUSE_MUL_ADD3) of ``y`` the (N, C, H, W) view of a
    BatchedMatrixMulTail's (N, H*W, C) product (through a Reshape and the Dimshuffle, read
    by nothing else), a float32 ``scale`` of one value per channel and ``x`` a view of the
    same kind of a channels-last var, the output of an Elemwise in ``fused`` (whose fused
    form is such a view: the shortcut None, found when it is made) or an NCHW88 tensor's
    RelayoutFormat to NCHW that only ``opr`` reads (the shortcut the RelayoutFormat: its
    source is read channels-last instead); else None."""
    if opr.type_name != "Elemwise" or opr.param.mode != "FUSE_MUL_ADD3" or opr.extra_deps:
        return None
    p, q, x = opr.inputs
    shape = _shape(opr.outputs[0])
    if opr.outputs[0].dtype != _F32 or shape is None or len(shape) != 4:
        return None
    u = _channels_last_view(x)
    if u is None and x.owner not in fused:
        rf = x.owner
        if (rf is None or rf.type_name != "RelayoutFormat" or rf.param.mode != "NCHW88_NCHW"
                or rf.extra_deps or not only(x, {opr})):  # fmt: skip
            return None
        u = rf
    if _shape(x) != shape:
        return None
    for y, scale in ((p, q), (q, p)):
        r4 = _channels_last_view(y)
        if r4 is None or y is x or _shape(y) != shape or not only(y, {opr}):
            continue
        ss = _shape(scale)
        if scale.dtype != _F32 or ss is None or ss[-3:] != (shape[1], 1, 1):
            continue
        if any(d != 1 for d in ss[:-3]) or len(ss) > 4:
            continue
        rs = r4.owner
        if rs is None or rs.type_name != "Reshape" or rs.extra_deps or not only(r4, {y.owner}):
            continue
        mm = rs.inputs[0].owner
        if (mm is None or type(mm) is not BatchedMatrixMulTail or len(mm.inputs) != 3
                or mm.extra_deps or not only(mm.outputs[0], {rs})):  # fmt: skip
            continue
        n, h, w, c = _shape(r4)
        if _shape(mm.outputs[0]) != (n, h * w, c):
            continue
        if isinstance(u, VarNode) and _shape(u) != (n, h, w, c):
            continue
        if len({mm.comp_node, opr.comp_node, x.comp_node}) != 1:
            continue
        return mm, scale, x, u
    return None


@register_pass("fuse_matmul_residual")
def fuse_matmul_residual(graph, dest: list[VarNode]) -> dict:
    """The pass (after ``fuse_matmul_tail``, at JIT level 1 and up): a ConvNeXt block's end,
    ``scale * y + x`` (an Elemwise FUSE_MUL_ADD3) of ``y`` the NCHW view (a Reshape and a
    Dimshuffle) of a BatchedMatrixMulTail's channels-last product that only it reads, a
    per-channel ``scale`` and ``x`` an NCHW view of a channels-last shortcut, becomes one
    BatchedMatrixMulTail adding ``scale`` times its result to the shortcut in its write-out;
    the fused output is channels-last, its NCHW view replaces the Elemwise's output (so the
    next block's shortcut is such a view too)."""
    found = _fusable_with_readers(graph, dest)
    if found is None:
        return {}
    oprs, readers, only = found

    # the Elemwise -> (product, scale, x, shortcut or None, the oprs it replaces)
    fused_at: dict = {}
    for o in oprs:
        parts = _residual_parts(o, only, fused_at)
        if parts is not None:
            (reshape_opr,) = readers[parts[0].outputs[0]]
            gone = [parts[0], reshape_opr, readers[reshape_opr.outputs[0]][0]]
            if parts[3] is not None and not isinstance(parts[3], VarNode):
                gone.append(parts[3])  # the RelayoutFormat
            fused_at[o] = (*parts, gone)
    if not fused_at:
        return {}

    def fused(t, memo: dict) -> tuple[VarNode, VarNode]:
        mm, scale, x, u, _ = fused_at[t]
        n, c, h, w = _shape(t.outputs[0])
        if u is None:  # x was fused before: its channels-last product under the view
            u = memo[x].owner.inputs[0]
        elif not isinstance(u, VarNode):  # the NCHW88 source, (N, H, W, C/8, 8): one copy
            src = u.inputs[0]
            u = dimshuffle(SymbolVar(memo.get(src, src)), (0, 2, 3, 1, 4)).node
        cfg = OperatorNodeConfig(comp_node=mm.comp_node)
        sv = reshape(SymbolVar(memo.get(scale, scale)), (c,)).node
        addend = reshape(SymbolVar(memo.get(u, u)), (n, h * w, c)).node
        ins = [memo.get(v, v) for v in mm.inputs] + [sv, addend]
        new = graph.insert_opr(BatchedMatrixMulTail(ins, mm.param, cfg))[0]
        view = dimshuffle(reshape(SymbolVar(new), (n, h, w, c)), _TO_NCHW).node
        return t.outputs[0], view

    skip = {g for *_, gone in fused_at.values() for g in gone}
    return _sweep(graph, oprs, skip, {t: fused for t in fused_at})


def _nchw88_source(x: VarNode, readers: set, only) -> tuple | None:
    """``(z, [the Dimshuffle, the RelayoutFormat])`` when ``x`` is the channels-last view
    (Dimshuffle (0, 2, 3, 1)) of an NCHW88 ``z``'s RelayoutFormat to NCHW, the view read
    only by ``readers`` and the NCHW tensor only by the view (as before each ConvNeXt block's
    LayerNorm, after its depthwise convolution); else None."""
    ds = x.owner
    if ds is None or ds.type_name != "Dimshuffle" or ds.extra_deps or not only(x, readers):
        return None
    if tuple(ds.param.pattern) != (0, 2, 3, 1):
        return None
    rf = ds.inputs[0].owner
    if (rf is None or rf.type_name != "RelayoutFormat" or rf.param.mode != "NCHW88_NCHW"
            or rf.extra_deps or not only(ds.inputs[0], {ds})):  # fmt: skip
        return None
    z = rf.inputs[0]
    if z.dtype != _F32 or len(_shape(z) or ()) != 5 or z.comp_node != x.comp_node:
        return None
    return z, [ds, rf]


def _last_axis_mean(opr, nd: int) -> bool:
    """Whether ``opr`` is a float32 MEAN over the last of ``nd`` axes (axis kept): a Reduce,
    or a JITExecutor of ``x * x`` closed by one."""
    if opr.extra_deps or len(opr.inputs) != 1 or opr.outputs[0].dtype != _F32:
        return False
    if opr.type_name == "Reduce":
        mode, axis = opr.param.mode, opr.param.axis
    elif opr.type_name == "JITExecutor" and opr.param.reduce is not None:
        (mode, axis) = opr.param.reduce
    else:
        return False
    return mode == "MEAN" and axis is not None and axis % nd == nd - 1


def _variance(opr, d: VarNode, readers: dict, only) -> tuple | None:
    """``(the MEAN's operator, the squares' Elemwise or None)`` when ``opr``, a reader of
    ``d``, starts the MEAN of ``d * d`` over the last axis: a JITExecutor of ``d * d``
    closed by that MEAN, or an Elemwise MUL(d, d) that only such a Reduce reads."""
    nd = len(_shape(d))
    if opr.type_name == "JITExecutor":
        ok = (_last_axis_mean(opr, nd) and list(opr.inputs) == [d]
              and tuple(opr.param.expr) == (("MUL", (("i", 0), ("i", 0))),))  # fmt: skip
        return (opr, None) if ok else None
    if opr.type_name != "Elemwise" or opr.param.mode != "MUL" or opr.extra_deps:
        return None
    sq = opr.outputs[0]
    if list(opr.inputs) != [d, d] or len(readers.get(sq, ())) != 1:
        return None
    red = readers[sq][0]
    if red.type_name != "Reduce" or not _last_axis_mean(red, nd) or not only(sq, {red}):
        return None
    return red, opr


def _norm_tail(opr, d: VarNode, v: VarNode, c: int) -> tuple[float, list] | None:
    """``(eps, [scale, bias or None])`` when the JITExecutor ``opr`` computes ``d * (v +
    eps)^-0.5 * scale + bias`` of the centered ``d``, the variance ``v`` and per-channel
    vectors (found by what it computes on random values); else None."""
    if opr.type_name != "JITExecutor" or opr.param.reduce is not None or opr.extra_deps:
        return None
    ins = list(opr.inputs)
    if ins.count(d) != 1 or ins.count(v) != 1:
        return None
    vecs = [u for u in ins if u is not d and u is not v]
    if not 1 <= len(vecs) <= 2 or not all(_column_bias(u, c) for u in vecs):
        return None
    iv = ins.index(v)
    eps = [a[1] for m, args in opr.param.expr if m == "ADD"
           for a in args if a[0] == "c" and ("i", iv) in args]  # fmt: skip
    if len(eps) != 1:
        return None
    rng = np.random.default_rng(0)
    dv = rng.uniform(-2, 2, (3, 2, c)).astype(_F32)
    vv = rng.uniform(0.1, 2, (3, 2, 1)).astype(_F32)
    values = {u: rng.uniform(-2, 2, c).astype(_F32) for u in vecs}
    got = interpret(opr.param.expr, [dv if u is d else vv if u is v else values[u] for u in ins])
    norm = dv.astype(np.float64) * (vv.astype(np.float64) + np.float32(eps[0])) ** -0.5
    for roles in (vecs, vecs[::-1]):
        scale, bias = roles[0], roles[1] if len(roles) > 1 else None
        want = norm * values[scale] + (0 if bias is None else values[bias])
        if np.allclose(got, want, rtol=1e-5, atol=1e-5):
            return float(eps[0]), [scale, bias]
    return None


@register_pass("fuse_layer_norm")
def fuse_layer_norm(graph, dest: list[VarNode]) -> dict:
    """The pass (after ``jit_fusion``, at JIT level 1 and up): the importer's layer
    normalization over the last axis of a float32 ``x`` (MEAN ``m``, ``d = x - m``, MEAN of
    ``d * d``, then a JITExecutor computing ``d * (v + eps)^-0.5 * scale + bias``), where
    only those operators read ``m``, ``d``, the squares and ``v``, becomes one
    :class:`~megbrain.opr.dnn_norm.LayerNormLast`."""
    found = _fusable_with_readers(graph, dest)
    if found is None:
        return {}
    oprs, readers, only = found

    fused_at: dict = {}  # the tail JITExecutor -> (x, eps, scale, bias, the oprs it replaces)
    for o in oprs:
        if o.type_name != "Elemwise" or o.param.mode != "SUB" or o.extra_deps:
            continue
        x, m = o.inputs
        d = o.outputs[0]
        shape = _shape(d)
        if not shape or x.dtype != _F32 or not _last_axis_mean(m.owner, len(shape)):
            continue
        if m.owner.inputs[0] is not x or not only(m, {o}):
            continue
        rd = set(readers.get(d, ()))
        if not only(d, rd) or len(rd) != 2:
            continue
        found = [(r, _variance(r, d, readers, only)) for r in rd]
        var = [(r, f) for r, f in found if f is not None]
        if len(var) != 1:
            continue
        (first, (red, sq)), tail = var[0], next(iter(rd - {var[0][0]}))
        v = red.outputs[0]
        if not only(v, {tail}) or not only(d, {first, tail}):
            continue
        norm = _norm_tail(tail, d, v, shape[-1])
        if norm is None or len({x.comp_node, tail.comp_node, red.comp_node}) != 1:
            continue
        gone = [m.owner, o, red] + ([sq] if sq is not None else [])
        blocked = _nchw88_source(x, {m.owner, o}, only)
        if blocked is not None:  # read the NCHW88 tensor in place
            x, gone = blocked[0], gone + blocked[1]
        fused_at[tail] = (x, norm[0], [u for u in norm[1] if u is not None], gone,
                          blocked is not None)  # fmt: skip
    if not fused_at:
        return {}

    def fused(t, memo: dict) -> tuple[VarNode, VarNode]:
        x, eps, vecs, _, nchw88 = fused_at[t]
        cfg = OperatorNodeConfig(comp_node=t.comp_node)
        new = LayerNormLast([memo.get(u, u) for u in (x, *vecs)],
                            LayerNormLastParam(eps, nchw88), cfg)  # fmt: skip
        return t.outputs[0], graph.insert_opr(new)[0]

    skip = {g for *_, gone, _ in fused_at.values() for g in gone}
    return _sweep(graph, oprs, skip, {t: fused for t in fused_at})
