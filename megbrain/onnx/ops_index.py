"""Indexing ONNX operators: gathers and scatters by index tensors (GatherElements, GatherND,
Scatter, ScatterElements, ScatterND, TensorScatter, ReverseSequence) and the ones whose output
length depends on values (NonZero, Compress)."""

from __future__ import annotations

import numpy as np

import megbrain as mgb

from .ops_tensor import _norm_axis, _reshape, static_shape
from .registry import Attr, converter

E = mgb.opr.elemwise


def _wrap_negative(ctx, ind, dim):
    """Indices with negative entries counted from the end (``dim`` may be an int or array)."""
    zero = ctx.imm(np.int32(0))
    d = ctx.imm(np.asarray(dim, np.int32))
    if np.dtype(ind.dtype) != np.int32:
        ind = mgb.opr.typecvt(ind, np.int32)
    return E(ind, E(E(ind, zero, mode="LT"), d, mode="MUL"), mode="ADD")


def _take_flat(ctx, x, flat, out_shape):
    """x's elements (x flattened to rows of its trailing ``rest`` dims) at the flat indices."""
    n = int(np.prod(static_shape(ctx, flat)))
    f1 = _reshape(flat, (n,))
    return _reshape(mgb.opr.advanced_indexing(x)[f1], out_shape)


def _element_offsets(ctx, ind, src, ishape, axis):
    """The flat offsets into a ``src``-shaped tensor of the elements ``ind`` (of shape
    ``ishape``) selects along ``axis``, its other coordinates those of each index."""
    strides = [int(np.prod(src[i + 1 :])) for i in range(len(src))]
    grids = np.meshgrid(*[np.arange(d) for d in ishape], indexing="ij")
    other = sum(g * s for i, (g, s) in enumerate(zip(grids, strides)) if i != axis)
    ind = _wrap_negative(ctx, ind, src[axis])
    return E(
        E(ind, ctx.imm(np.int32(strides[axis])), mode="MUL"),
        ctx.imm(np.asarray(other, np.int32)),
        mode="ADD",
    )


@converter("GatherElements", 11, attrs={"axis": 0})
def _gather_elements(ctx):
    x, ind = ctx.input(0), ctx.input(1)
    src = static_shape(ctx, x)
    ishape = static_shape(ctx, ind, "indices")
    nd = len(src)
    axis = _norm_axis(ctx, ctx.attr("axis"), nd)
    flat = _element_offsets(ctx, ind, src, ishape, axis)
    return _take_flat(ctx, _reshape(x, (int(np.prod(src)),)), flat, ishape)


@converter("GatherND", 11, attrs={"batch_dims": 0})
def _gather_nd(ctx):
    x, ind = ctx.input(0), ctx.input(1)
    src = static_shape(ctx, x)
    ishape = static_shape(ctx, ind, "indices")
    b = int(ctx.attr("batch_dims"))
    k = ishape[-1]
    rest = src[b + k :]
    lead = ishape[:-1]
    # row index into x reshaped to (prod(src[:b + k]), *rest)
    strides = [int(np.prod(src[b + j + 1 : b + k])) for j in range(k)]
    flat = None
    for j in range(k):
        col = _reshape(ind[(slice(None),) * (len(ishape) - 1) + (slice(j, j + 1),)], lead)
        col = _wrap_negative(ctx, col, src[b + j])
        term = E(col, ctx.imm(np.int32(strides[j])), mode="MUL")
        flat = term if flat is None else E(flat, term, mode="ADD")
    if b:
        grids = np.meshgrid(*[np.arange(d) for d in lead], indexing="ij")
        bflat = np.zeros(lead, np.int64)
        for i in range(b):
            bflat = bflat * src[i] + grids[i]
        flat = E(flat, ctx.imm((bflat * int(np.prod(src[b : b + k]))).astype(np.int32)), mode="ADD")
    rows = _reshape(x, (int(np.prod(src[: b + k])),) + rest)
    return _take_flat(ctx, rows, flat, lead + rest)


# ---------------------------------------------------------------------------------- scatter
_SCATTER_REDUCTIONS = frozenset({"none", "add", "mul", "max", "min"})


def _identity_of(mode, dt):
    """The neutral element of a combining reduce mode for dtype ``dt``."""
    if mode == "PRODUCT":
        return 1
    if dt.kind == "f":
        return -np.inf if mode == "MAX" else np.inf
    info = np.iinfo(dt)
    return info.min if mode == "MAX" else info.max


def _scatter_rows(ctx, rows, idx, upd, reduction):
    """``rows`` (P, ...) with rows ``idx`` (M,) combined with ``upd`` (M, ...).

    ``none`` writes (the last duplicate wins), ``add`` accumulates duplicates; ``mul``, ``max``
    and ``min`` first combine the updates aimed at the same row (an M x M comparison), then
    combine that with the row and write it back (duplicates write the same value).
    """
    if reduction == "none":
        return mgb.opr.set_advanced_indexing(rows, upd)[idx]
    if reduction == "add":
        return mgb.opr.incr_advanced_indexing(rows, upd)[idx]
    mode = {"mul": "PRODUCT", "max": "MAX", "min": "MIN"}[reduction]
    us = static_shape(ctx, upd, "updates")
    m, rest = us[0], us[1:]
    dt = np.dtype(upd.dtype)
    same = E(_reshape(idx, (m, 1)), _reshape(idx, (1, m)), mode="EQ")
    same = mgb.opr.typecvt(_reshape(same, (m, m) + (1,) * len(rest)), dt)
    pool = _reshape(upd, (1, m) + rest)
    ident = ctx.imm(np.full((1,) * (len(rest) + 2), _identity_of(mode, dt), dt))
    picked = E(
        E(same, pool, mode="SWITCH_GT0"),
        E(E(ctx.imm(np.asarray(1, dt)), same, mode="SUB"), ident, mode="SWITCH_GT0"),
        mode="ADD",
    )
    comb = _reshape(mgb.opr.reduce_(picked, mode, 1, True), us)
    cur = mgb.opr.advanced_indexing(rows)[idx]
    new = E(cur, comb, mode={"PRODUCT": "MUL", "MAX": "MAX", "MIN": "MIN"}[mode])
    return mgb.opr.set_advanced_indexing(rows, new)[idx]


def _scatter_elements_impl(ctx, axis_attr, reduction):
    x, ind, upd = ctx.input(0), ctx.input(1), ctx.input(2)
    src = static_shape(ctx, x)
    ishape = static_shape(ctx, ind, "indices")
    if static_shape(ctx, upd, "updates") != ishape:
        raise ctx.fail(f"updates {static_shape(ctx, upd)} and indices {ishape} differ in shape")
    nd = len(src)
    axis = _norm_axis(ctx, axis_attr, nd)
    n = int(np.prod(ishape))
    if n == 0:
        return mgb.opr.identity(x)
    flat = _element_offsets(ctx, ind, src, ishape, axis)
    flat = _reshape(flat, (n,))
    rows = _reshape(x, (int(np.prod(src)),))
    out = _scatter_rows(ctx, rows, flat, _reshape(upd, (n,)), reduction)
    return _reshape(out, src)


@converter("Scatter", 9, 10, attrs={"axis": 0})
def _scatter(ctx):
    return _scatter_elements_impl(ctx, ctx.attr("axis"), "none")


@converter(
    "ScatterElements",
    11,
    attrs={"axis": 0, "reduction": Attr("none", _SCATTER_REDUCTIONS)},
)
def _scatter_elements(ctx):
    return _scatter_elements_impl(ctx, ctx.attr("axis"), ctx.attr("reduction"))


@converter("ScatterND", 11, attrs={"reduction": Attr("none", _SCATTER_REDUCTIONS)})
def _scatter_nd(ctx):
    x, ind, upd = ctx.input(0), ctx.input(1), ctx.input(2)
    src = static_shape(ctx, x)
    ishape = static_shape(ctx, ind, "indices")
    k = ishape[-1]
    lead, rest = ishape[:-1], src[k:]
    if static_shape(ctx, upd, "updates") != lead + rest:
        raise ctx.fail(
            f"updates {static_shape(ctx, upd)} must have shape {lead + rest} (indices {ishape},"
            f" data {src})"
        )
    m = int(np.prod(lead))
    if m == 0:
        return mgb.opr.identity(x)
    strides = [int(np.prod(src[j + 1 : k])) for j in range(k)]
    flat = None
    for j in range(k):
        col = _reshape(ind[(slice(None),) * (len(ishape) - 1) + (slice(j, j + 1),)], lead)
        col = _wrap_negative(ctx, col, src[j])
        term = E(col, ctx.imm(np.int32(strides[j])), mode="MUL")
        flat = term if flat is None else E(flat, term, mode="ADD")
    rows = _reshape(x, (int(np.prod(src[:k])),) + rest)
    out = _scatter_rows(
        ctx, rows, _reshape(flat, (m,)), _reshape(upd, (m,) + rest), ctx.attr("reduction")
    )
    return _reshape(out, src)


@converter("ReverseSequence", 10, attrs={"batch_axis": 1, "time_axis": 0})
def _reverse_sequence(ctx):
    # out[b, t] = x[b, L_b - 1 - t] for t < L_b, else x[b, t]: a per-(batch, time) gather
    x, lens = ctx.input(0), ctx.input(1)
    src = static_shape(ctx, x)
    nd = len(src)
    ba, ta = _norm_axis(ctx, ctx.attr("batch_axis"), nd), _norm_axis(ctx, ctx.attr("time_axis"), nd)
    if ba == ta or {ba, ta} != {0, 1}:
        raise ctx.fail(f"batch_axis {ba} and time_axis {ta} must be 0 and 1, in some order")
    nb, nt = src[ba], src[ta]
    bt_shape = [1] * nd
    bt_shape[ba] = nb
    tt_shape = [1] * nd
    tt_shape[ta] = nt
    ln = _reshape(_wrap_negative(ctx, lens, 0), bt_shape)
    t = ctx.imm(np.arange(nt, dtype=np.int32).reshape(tt_shape))
    inside = E(t, ln, mode="LT")  # 1 where t < L_b
    flipped = E(E(ln, ctx.imm(np.int32(1)), mode="SUB"), t, mode="SUB")
    src_t = E(t, E(inside, E(flipped, t, mode="SUB"), mode="MUL"), mode="ADD")
    strides = [int(np.prod(src[i + 1 :])) for i in range(nd)]
    grids = np.meshgrid(*[np.arange(d) for d in src], indexing="ij")
    other = sum(g * s for i, (g, s) in enumerate(zip(grids, strides)) if i != ta)
    flat = E(
        E(src_t, ctx.imm(np.int32(strides[ta])), mode="MUL"),
        ctx.imm(np.asarray(other, np.int32)),
        mode="ADD",
    )
    return _take_flat(ctx, _reshape(x, (int(np.prod(src)),)), flat, src)


@converter(
    "TensorScatter",
    24,
    attrs={"axis": -2, "mode": Attr("linear", frozenset({"linear", "circular"}))},
)
def _tensor_scatter(ctx):
    # a cache write: update[b, ..., s, ...] goes to position write_indices[b] + s of the axis
    # (modulo the cache length when circular)
    cache, upd = ctx.input(0), ctx.input(1)
    src, us = static_shape(ctx, cache), static_shape(ctx, upd, "update")
    nd = len(src)
    axis = _norm_axis(ctx, ctx.attr("axis"), nd)
    if axis == 0 or any(a != b for i, (a, b) in enumerate(zip(src, us)) if i != axis):
        raise ctx.fail(f"update {us} does not fit cache {src} along axis {axis}")
    if us[axis] > src[axis]:
        raise ctx.fail(f"update {us} is longer than cache {src} along axis {axis}")
    strides = [int(np.prod(src[i + 1 :])) for i in range(nd)]
    grids = np.meshgrid(*[np.arange(d) for d in us], indexing="ij")
    other = sum(g * s for i, (g, s) in enumerate(zip(grids, strides)) if i != axis)
    pos = ctx.imm(grids[axis].astype(np.int32))
    if ctx.has(2):
        wi = _reshape(_cast_int32(ctx.input(2)), (src[0],) + (1,) * (nd - 1))
        pos = E(pos, wi, mode="ADD")
    if ctx.attr("mode") == "circular":
        pos = E(pos, ctx.imm(np.int32(src[axis])), mode="MOD")
    flat = E(
        E(pos, ctx.imm(np.int32(strides[axis])), mode="MUL"),
        ctx.imm(np.asarray(other, np.int32)),
        mode="ADD",
    )
    n = int(np.prod(us))
    rows = _reshape(cache, (int(np.prod(src)),))
    out = _scatter_rows(ctx, rows, _reshape(flat, (n,)), _reshape(upd, (n,)), "none")
    return _reshape(out, src)


def _cast_int32(v):
    return v if np.dtype(v.dtype) == np.int32 else mgb.opr.typecvt(v, np.int32)


# ------------------------------------------------------------ value-dependent output shapes
def _true_offsets(ctx, mask):
    """The flat offsets where ``mask`` is nonzero (a var of dynamic length), in order."""
    return mgb.opr.cond_take(mask, mask, "NEQ", 0)[1]


@converter("NonZero", 9)
def _nonzero(ctx):
    # the offsets of the nonzero elements, split into one row of coordinates per axis
    x = ctx.input(0)
    src = static_shape(ctx, x)
    off = _true_offsets(ctx, x)
    rows = []
    for i, d in enumerate(src):
        stride = int(np.prod(src[i + 1 :]))
        coord = E(off, ctx.imm(np.int32(stride)), mode="FLOOR_DIV") if stride > 1 else off
        if i > 0:
            coord = E(coord, ctx.imm(np.int32(d)), mode="MOD")
        rows.append(mgb.opr.add_axis(coord, 0))
    return mgb.opr.concat(*rows, axis=0) if len(rows) > 1 else rows[0]


@converter("Compress", 9, attrs={"axis": None})
def _compress(ctx):
    # the slices along axis whose condition is true (a condition shorter than the axis
    # counts as false beyond its end); no axis: the flattened input's elements
    x, cond = ctx.input(0), ctx.input(1)
    src = static_shape(ctx, x)
    axis = ctx.attr("axis")
    if axis is None:
        x = _reshape(x, (int(np.prod(src)),))
        axis, dim = 0, int(np.prod(src))
    else:
        axis = _norm_axis(ctx, axis, len(src))
        dim = src[axis]
    n = static_shape(ctx, cond, "condition")[0]
    if n > dim:
        raise ctx.fail(f"condition of length {n} is longer than axis {axis} ({dim})")
    idx = _true_offsets(ctx, cond)
    return mgb.opr.advanced_indexing(x)[(slice(None),) * axis + (idx,)]
