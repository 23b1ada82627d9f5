"""Shape and data-movement ONNX operators: Reshape, Slice, Gather, Pad, Constant, ..."""

from __future__ import annotations

import numpy as np

import megbrain as mgb

from .loader import narrow as _narrow
from .registry import Attr, converter

E = mgb.opr.elemwise


def static_shape(ctx, var, what="input") -> tuple:
    """The shape of ``var``, which must be known when the graph is built."""
    shp = var.imm_shape
    if shp is None:
        raise ctx.fail(f"the shape of the {what} must be known at load")
    return tuple(int(d) for d in shp)


def _norm_axis(ctx, axis, ndim):
    a = int(axis)
    if not -ndim <= a < ndim:
        raise ctx.fail(f"axis {a} is out of range for rank {ndim}")
    return a + ndim if a < 0 else a


def _reshape(var, shape):
    shape = tuple(int(d) for d in shape)
    if tuple(var.imm_shape or ()) == shape and var.imm_shape is not None:
        return var
    return mgb.opr.reshape(var, shape)


def _axes_of(ctx, attr_idx, ndim, *, input_idx=None, default=None):
    if input_idx is not None and ctx.opset >= 13:
        axes = ctx.const(input_idx, "axes").ravel().tolist() if ctx.has(input_idx) else default
    else:
        axes = ctx.attr(attr_idx)
        axes = default if axes is None else list(axes)
    return None if axes is None else [_norm_axis(ctx, a, ndim) for a in axes]


@converter(["Identity"], 1)
def _identity(ctx):
    return mgb.opr.identity(ctx.input(0))


@converter("Dropout", 7, 11, attrs={"ratio": 0.5, "is_test": 0})
def _dropout7(ctx):
    x = ctx.input(0)
    mask = ctx.imm(np.ones(static_shape(ctx, x), np.int32))
    return [mgb.opr.identity(x), mask]


@converter("Dropout", 12, attrs={"seed": None})
def _dropout12(ctx):
    x = ctx.input(0)
    shape = static_shape(ctx, x)
    training = ctx.has(2) and bool(ctx.const(2, "training_mode").ravel()[0])
    ratio = float(ctx.const(1, "ratio").ravel()[0]) if ctx.has(1) else 0.5
    if not training or ratio == 0.0:
        return [mgb.opr.identity(x), ctx.imm(np.ones(shape, np.int32))]
    if not 0.0 <= ratio < 1.0:
        raise ctx.fail(f"ratio {ratio} is outside [0, 1)")
    if np.dtype(x.dtype).kind not in "f" and np.dtype(x.dtype).name != "bfloat16":
        raise ctx.fail(f"training Dropout of {x.dtype} is not supported")
    seed = ctx.attr("seed")
    if seed is not None:
        # ONNX's reference draws the mask with NumPy's legacy generator seeded by `seed`;
        # the mask is drawn here, once: every run of the compiled graph reuses it
        keep = np.random.RandomState(int(seed)).uniform(0.0, 1.0, shape) >= ratio
        mask = ctx.imm(keep.astype(np.int32))
    else:
        # a fresh mask at each run (UniformRNG draws from (0, 1])
        u = mgb.opr.uniform_rng(shape, comp_graph=ctx.graph, comp_node=ctx.comp_node)
        mask = mgb.opr.typecvt(E(ctx.imm(np.float32(ratio)), u, mode="LEQ"), np.int32)
    scale = ctx.imm(np.asarray(1.0 / (1.0 - ratio), np.dtype(x.dtype)))
    y = E(E(x, mgb.opr.typecvt(mask, x.dtype), mode="MUL"), scale, mode="MUL")
    return [y, mask]


def _check_constant(attrs, in_types, where):
    from .registry import ONNXConversionError

    given = [k for k, v in attrs.items() if v is not None]
    if given == ["sparse_value"] or any(k.startswith("value_string") for k in given):
        raise ONNXConversionError(f"{where}: attribute {given[0]} is not supported")


_CONST_ATTRS = [
    "value",
    "value_float",
    "value_floats",
    "value_int",
    "value_ints",
    "sparse_value",
    "value_string",
    "value_strings",
]


@converter("Constant", 1, attrs=dict.fromkeys(_CONST_ATTRS), validate=_check_constant)
def _constant(ctx):
    a = {k: ctx.attr(k) for k in _CONST_ATTRS if ctx.attr(k) is not None}
    ((k, v),) = a.items()
    if k == "value":
        arr = np.asarray(v)
    elif k in ("value_float", "value_floats"):
        arr = np.asarray(v, np.float32)
    else:
        arr = np.asarray(v, np.int64)
    return ctx.imm(_narrow(arr))


@converter("ConstantOfShape", 9, attrs={"value": None})
def _constant_of_shape(ctx):
    shape = ctx.const(0, "shape").ravel().tolist()
    v = ctx.attr("value")
    v = np.zeros(1, np.float32) if v is None else np.asarray(v).ravel()
    if len(shape) == 0:
        return ctx.imm(_narrow(v.reshape(())))
    return ctx.imm(_narrow(np.full(shape, v[0], dtype=v.dtype)))


@converter("Range", 11)
def _range(ctx):
    s, l, d = (ctx.const(i, n).reshape(()) for i, n in enumerate(("start", "limit", "delta")))
    dt = np.result_type(s, l, d)
    n = max(int(np.ceil((float(l) - float(s)) / float(d))), 0)
    return ctx.imm(_narrow((s + d * np.arange(n)).astype(dt)))


@converter("Shape", 1, attrs={"start": 0, "end": None})
def _shape(ctx):
    x = ctx.input(0)
    shp = x.imm_shape
    if shp is not None:
        shp = np.asarray(shp, np.int32)
        r = len(shp)
        st, en = ctx.attr("start"), ctx.attr("end")
        return ctx.imm(shp[slice(st, en if en is not None else r)])
    if ctx.attr("start") != 0 or ctx.attr("end") is not None:
        return mgb.opr.get_var_shape(x)[ctx.attr("start") : ctx.attr("end")]
    return mgb.opr.get_var_shape(x)


@converter("Size", 1)
def _size(ctx):
    return ctx.imm(np.asarray(int(np.prod(static_shape(ctx, ctx.input(0)))), np.int32))


@converter("Reshape", 5, attrs={"allowzero": Attr(0, frozenset({0, 1}))})
def _reshape_op(ctx):
    x = ctx.input(0)
    shape = [int(d) for d in ctx.const(1, "shape").ravel()]
    src = static_shape(ctx, x)
    if not ctx.attr("allowzero"):
        shape = [src[i] if d == 0 else d for i, d in enumerate(shape)]
    if -1 in shape:
        known = int(np.prod([d for d in shape if d != -1]))
        shape[shape.index(-1)] = int(np.prod(src)) // known if known else 0
    if int(np.prod(shape)) != int(np.prod(src)):
        raise ctx.fail(f"cannot reshape {src} to {shape}")
    return _reshape(x, shape)


@converter("Flatten", 1, attrs={"axis": 1})
def _flatten(ctx):
    x = ctx.input(0)
    src = static_shape(ctx, x)
    a = ctx.attr("axis")
    a = a + len(src) if a < 0 else a
    return _reshape(x, (int(np.prod(src[:a])), int(np.prod(src[a:]))))


@converter("Transpose", 1, attrs={"perm": None})
def _transpose(ctx):
    x = ctx.input(0)
    nd = len(static_shape(ctx, x))
    perm = ctx.attr("perm")
    perm = list(range(nd))[::-1] if perm is None else [int(p) for p in perm]
    return mgb.opr.dimshuffle(x, perm)


@converter("Squeeze", 1, attrs={"axes": None})
def _squeeze(ctx):
    x = ctx.input(0)
    try:
        src = tuple(int(d) for d in x.imm_shape)
    except mgb.MegBrainError:  # a run-time shape (NonZero, Compress): drop the given axes
        if ctx.opset >= 13:
            axes = ctx.const(1, "axes").ravel().tolist() if ctx.has(1) else []
        else:
            axes = list(ctx.attr("axes") or [])
        if not axes or min(axes) < 0:
            raise ctx.fail(
                "squeezing a tensor of run-time shape needs explicit non-negative axes"
            ) from None
        for a in sorted({int(a) for a in axes}, reverse=True):
            x = mgb.opr.remove_axis(x, a)
        return x
    axes = _axes_of(ctx, "axes", len(src), input_idx=1)
    if axes is None:
        axes = [i for i, d in enumerate(src) if d == 1]
    for a in axes:
        if src[a] != 1:
            raise ctx.fail(f"axis {a} of shape {src} is not 1")
    return _reshape(x, [d for i, d in enumerate(src) if i not in axes])


@converter("Unsqueeze", 1, attrs={"axes": None})
def _unsqueeze(ctx):
    x = ctx.input(0)
    src = list(static_shape(ctx, x))
    if ctx.opset >= 13:
        axes = ctx.const(1, "axes").ravel().tolist()
    else:
        axes = list(ctx.attr("axes"))
    nd = len(src) + len(axes)
    axes = sorted(_norm_axis(ctx, a, nd) for a in axes)
    for a in axes:
        src.insert(a, 1)
    return _reshape(x, src)


@converter("Concat", 4, attrs={"axis": None})
def _concat(ctx):
    vs = [v for v in ctx.inputs if v is not None]
    nd = len(static_shape(ctx, vs[0]))
    axis = _norm_axis(ctx, ctx.attr("axis"), nd)
    vs = [v for v in vs if static_shape(ctx, v)[axis] != 0] or vs[:1]
    if len(vs) == 1:
        return mgb.opr.identity(vs[0])
    return mgb.opr.concat(*vs, axis=axis)


def _take(x, axis, start, stop, step=1):
    idx = (slice(None),) * axis + (slice(start, stop, step),)
    return x[idx]


@converter("Split", 2, attrs={"axis": 0, "split": None, "num_outputs": None})
def _split(ctx):
    x = ctx.input(0)
    src = static_shape(ctx, x)
    axis = _norm_axis(ctx, ctx.attr("axis"), len(src))
    n_out = len(ctx.node.output)
    if ctx.opset >= 13 and ctx.has(1):
        sizes = ctx.const(1, "split").ravel().tolist()
    elif ctx.attr("split") is not None:
        sizes = list(ctx.attr("split"))
    else:
        n = ctx.attr("num_outputs") or n_out
        chunk = -(-src[axis] // n)
        sizes = [min(chunk, src[axis] - i * chunk) for i in range(n)]
    outs, pos = [], 0
    for s in sizes:
        outs.append(_take(x, axis, pos, pos + int(s)))
        pos += int(s)
    return outs


def _slice_impl(ctx, x, starts, ends, axes, steps):
    src = static_shape(ctx, x)
    idx = [slice(None)] * len(src)
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = _norm_axis(ctx, a, len(src))
        if st == 0:
            raise ctx.fail("a slice step of 0 is not allowed")
        b, f, stp = slice(int(s), int(e), int(st)).indices(src[a])
        if stp < 0 and f < 0:
            f = None
        idx[a] = slice(b, f, stp)
    return x[tuple(idx)]


@converter("Slice", 1, 9, attrs={"starts": None, "ends": None, "axes": None})
def _slice1(ctx):
    st, en = list(ctx.attr("starts")), list(ctx.attr("ends"))
    axes = ctx.attr("axes")
    axes = list(range(len(st))) if axes is None else list(axes)
    return _slice_impl(ctx, ctx.input(0), st, en, axes, [1] * len(st))


def _int64_list(ctx, i, what):
    return [int(v) for v in ctx.const(i, what).ravel()]


@converter("Slice", 10)
def _slice10(ctx):
    st, en = _int64_list(ctx, 1, "starts"), _int64_list(ctx, 2, "ends")
    axes = _int64_list(ctx, 3, "axes") if ctx.has(3) else list(range(len(st)))
    steps = _int64_list(ctx, 4, "steps") if ctx.has(4) else [1] * len(st)
    return _slice_impl(ctx, ctx.input(0), st, en, axes, steps)


@converter("Gather", 1, attrs={"axis": 0})
def _gather(ctx):
    x, ind = ctx.input(0), ctx.input(1)
    src = static_shape(ctx, x)
    axis = _norm_axis(ctx, ctx.attr("axis"), len(src))
    ishape = static_shape(ctx, ind, "indices")
    dim = src[axis]
    val = ind.inferred_value
    if val is not None:
        flat = ctx.imm(np.where(np.asarray(val) < 0, val + dim, val).astype(np.int32).ravel())
    else:
        flat = _reshape(ind, (int(np.prod(ishape)),)) if len(ishape) != 1 else ind
        flat = E(
            flat,
            E(E(flat, ctx.imm(np.int32(0)), mode="LT"), ctx.imm(np.int32(dim)), mode="MUL"),
            mode="ADD",
        )
    if int(np.prod(ishape)) == 0:
        raise ctx.fail("empty indices are not supported")
    out = mgb.opr.advanced_indexing(x)[(slice(None),) * axis + (flat,)]
    return _reshape(out, src[:axis] + ishape + src[axis + 1 :])


@converter("Expand", 8)
def _expand(ctx):
    x = ctx.input(0)
    shape = ctx.const(1, "shape").ravel().tolist()
    target = np.broadcast_shapes(static_shape(ctx, x), tuple(int(d) for d in shape))
    return mgb.opr.broadcast(x, target)


@converter("Tile", 6)
def _tile(ctx):
    x = ctx.input(0)
    src = static_shape(ctx, x)
    reps = [int(r) for r in ctx.const(1, "repeats").ravel()]
    inter, bshape, final = [], [], []
    for d, r in zip(src, reps):
        inter += [1, d]
        bshape += [r, d]
        final.append(d * r)
    return _reshape(mgb.opr.broadcast(_reshape(x, inter), bshape), final)


def _pad_axis(ctx, x, axis, before, after, mode, value):
    shp = static_shape(ctx, x)
    n = shp[axis]
    if before < 0:
        x = _take(x, axis, -before, None)
        before = 0
    if after < 0:
        x = _take(x, axis, 0, static_shape(ctx, x)[axis] + after)
        after = 0
    n = static_shape(ctx, x)[axis]
    parts = []

    def block(count, side):
        bs = list(static_shape(ctx, x))
        bs[axis] = count
        if mode == "constant":
            return mgb.opr.broadcast(value, bs)
        if mode == "edge":
            edge = _take(x, axis, 0, 1) if side == 0 else _take(x, axis, n - 1, n)
            return mgb.opr.broadcast(edge, bs)
        if mode == "reflect":
            if count > n - 1:
                raise ctx.fail(f"reflect padding {count} exceeds the size {n} - 1")
            if side == 0:
                return _take(x, axis, count, 0, -1)
            return _take(x, axis, n - 2, n - 2 - count if n - 2 - count >= 0 else None, -1)
        # wrap
        if count > n:
            raise ctx.fail(f"wrap padding {count} exceeds the size {n}")
        return _take(x, axis, n - count, n) if side == 0 else _take(x, axis, 0, count)

    if before:
        parts.append(block(before, 0))
    parts.append(x)
    if after:
        parts.append(block(after, 1))
    return mgb.opr.concat(*parts, axis=axis) if len(parts) > 1 else x


_PAD_MODES = frozenset({"constant", "reflect", "edge", "wrap"})


def _pad_impl(ctx, x, pads, mode, value, axes=None):
    nd = len(static_shape(ctx, x))
    axes = list(range(nd)) if axes is None else [_norm_axis(ctx, a, nd) for a in axes]
    k = len(axes)
    out = x
    for j, a in enumerate(axes):
        out = _pad_axis(ctx, out, a, int(pads[j]), int(pads[j + k]), mode, value)
    return out if out is not x else mgb.opr.identity(x)


@converter(
    "Pad",
    2,
    10,
    attrs={"mode": Attr("constant", _PAD_MODES), "pads": None, "paddings": None, "value": 0.0},
)
def _pad2(ctx):
    x = ctx.input(0)
    pads = ctx.attr("pads") or ctx.attr("paddings")
    value = ctx.imm(np.asarray(ctx.attr("value"), np.dtype(x.dtype)))
    return _pad_impl(ctx, x, pads, ctx.attr("mode"), value)


@converter("Pad", 11, attrs={"mode": Attr("constant", _PAD_MODES)})
def _pad11(ctx):
    x = ctx.input(0)
    pads = _int64_list(ctx, 1, "pads")
    if ctx.has(2):
        value = (
            _reshape(ctx.input(2), ()) if ctx.input(2).imm_shape not in ((), None) else ctx.input(2)
        )
    else:
        value = ctx.imm(np.zeros((), np.dtype(x.dtype)))
    axes = _int64_list(ctx, 3, "axes") if ctx.has(3) else None
    return _pad_impl(ctx, x, pads, ctx.attr("mode"), value, axes)


@converter("Trilu", 14, attrs={"upper": Attr(1, frozenset({0, 1}))})
def _trilu(ctx):
    x = ctx.input(0)
    src = static_shape(ctx, x)
    k = int(ctx.const(1, "k").ravel()[0]) if ctx.has(1) else 0
    n, m = src[-2], src[-1]
    mask = np.triu(np.ones((n, m)), k) if ctx.attr("upper") else np.tril(np.ones((n, m)), k)
    if np.dtype(x.dtype).kind not in "iub":
        # a select, so inf/nan outside the triangle do not leak as 0 * inf
        return E(ctx.imm(mask.astype(np.dtype(x.dtype))), x, mode="SWITCH_GT0")
    return E(x, ctx.imm(mask.astype(np.dtype(x.dtype))), mode="MUL")


@converter(
    "DepthToSpace", 1, attrs={"blocksize": None, "mode": Attr("DCR", frozenset({"DCR", "CRD"}))}
)
def _depth_to_space(ctx):
    x = ctx.input(0)
    n, c, h, w = static_shape(ctx, x)
    b = int(ctx.attr("blocksize"))
    if ctx.attr("mode") == "DCR":
        t = mgb.opr.dimshuffle(_reshape(x, (n, b, b, c // (b * b), h, w)), [0, 3, 4, 1, 5, 2])
    else:
        t = mgb.opr.dimshuffle(_reshape(x, (n, c // (b * b), b, b, h, w)), [0, 1, 4, 2, 5, 3])
    return _reshape(t, (n, c // (b * b), h * b, w * b))


@converter(
    "SpaceToDepth", 1, attrs={"blocksize": None, "mode": Attr("DCR", frozenset({"DCR", "CRD"}))}
)
def _space_to_depth(ctx):
    x = ctx.input(0)
    n, c, h, w = static_shape(ctx, x)
    b = int(ctx.attr("blocksize"))
    perm = [0, 3, 5, 1, 2, 4] if ctx.attr("mode") == "DCR" else [0, 1, 3, 5, 2, 4]
    t = mgb.opr.dimshuffle(_reshape(x, (n, c, h // b, b, w // b, b)), perm)
    return _reshape(t, (n, c * b * b, h // b, w // b))


@converter("EyeLike", 9, attrs={"dtype": None, "k": 0})
def _eye_like(ctx):
    from .loader import onnx_to_np_dtype

    x = ctx.input(0)
    n, m = static_shape(ctx, x)
    dt = np.dtype(x.dtype) if ctx.attr("dtype") is None else onnx_to_np_dtype(ctx.attr("dtype"))
    return ctx.imm(np.eye(n, m, int(ctx.attr("k")), dtype=dt))


@converter(
    "CumSum",
    11,
    attrs={"exclusive": Attr(0, frozenset({0, 1})), "reverse": Attr(0, frozenset({0, 1}))},
)
def _cumsum(ctx):
    x = ctx.input(0)
    axis = _norm_axis(ctx, int(ctx.const(1, "axis").ravel()[0]), len(static_shape(ctx, x)))
    return mgb.opr.cumsum(x, axis, bool(ctx.attr("exclusive")), bool(ctx.attr("reverse")))


@converter("OneHot", 9, attrs={"axis": -1})
def _one_hot(ctx):
    ind, values = ctx.input(0), ctx.input(2)
    depth = int(np.asarray(ctx.const(1, "depth")).ravel()[0])
    ishape = static_shape(ctx, ind, "indices")
    nd = len(ishape) + 1
    axis = _norm_axis(ctx, ctx.attr("axis"), nd)
    if np.dtype(ind.dtype).kind == "f":
        ind = mgb.opr.typecvt(ind, np.int32)
    zero = ctx.imm(np.int32(0))
    ind = E(ind, E(E(ind, zero, mode="LT"), ctx.imm(np.int32(depth)), mode="MUL"), mode="ADD")
    shape = list(ishape)
    shape.insert(axis, 1)
    ar = [1] * nd
    ar[axis] = depth
    hot = E(_reshape(ind, shape), ctx.imm(np.arange(depth, dtype=np.int32).reshape(ar)), mode="EQ")
    vdt = np.dtype(values.dtype)
    off, on = values[0:1], values[1:2]
    hot = mgb.opr.typecvt(hot, vdt) if np.dtype(hot.dtype) != vdt else hot
    return E(off, E(hot, E(on, off, mode="SUB"), mode="MUL"), mode="ADD")


@converter(
    "TopK",
    10,
    attrs={"axis": -1, "largest": Attr(1, frozenset({0, 1})), "sorted": Attr(1, frozenset({0, 1}))},
)
def _top_k(ctx):
    x = ctx.input(0)
    src = static_shape(ctx, x)
    nd = len(src)
    axis = _norm_axis(ctx, ctx.attr("axis"), nd)
    k = int(np.asarray(ctx.const(1, "k")).ravel()[0])
    order = [i for i in range(nd) if i != axis] + [axis]
    t = mgb.opr.dimshuffle(x, order) if axis != nd - 1 else x
    rows = int(np.prod([src[i] for i in order[:-1]]))
    t2 = _reshape(t, (rows, src[axis]))
    # sorted either way (an order is allowed when sorted=0); ties keep the lower index
    vals, idx = mgb.opr.top_k(t2, -k if ctx.attr("largest") else k, "VALUE_IDX_SORTED")
    back = [order.index(i) for i in range(nd)]
    shape = [src[i] for i in order[:-1]] + [k]
    outs = []
    for v in (vals, idx):
        v = _reshape(v, shape)
        outs.append(mgb.opr.dimshuffle(v, back) if axis != nd - 1 else v)
    return outs


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


@converter("GatherElements", 11, attrs={"axis": 0})
def _gather_elements(ctx):
    x, ind = ctx.input(0), ctx.input(1)
    src = static_shape(ctx, x)
    ishape = static_shape(ctx, ind, "indices")
    nd = len(src)
    axis = _norm_axis(ctx, ctx.attr("axis"), nd)
    strides = [int(np.prod(src[i + 1 :])) for i in range(nd)]
    grids = np.meshgrid(*[np.arange(d) for d in ishape], indexing="ij")
    other = sum(g * s for i, (g, s) in enumerate(zip(grids, strides)) if i != axis)
    ind = _wrap_negative(ctx, ind, src[axis])
    flat = E(
        E(ind, ctx.imm(np.int32(strides[axis])), mode="MUL"),
        ctx.imm(np.asarray(other, np.int32)),
        mode="ADD",
    )
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
    strides = [int(np.prod(src[i + 1 :])) for i in range(nd)]
    grids = np.meshgrid(*[np.arange(d) for d in ishape], indexing="ij")
    other = sum(g * s for i, (g, s) in enumerate(zip(grids, strides)) if i != axis)
    ind = _wrap_negative(ctx, ind, src[axis])
    flat = E(
        E(ind, ctx.imm(np.int32(strides[axis])), mode="MUL"),
        ctx.imm(np.asarray(other, np.int32)),
        mode="ADD",
    )
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


@converter(
    "CumProd",
    26,
    attrs={"exclusive": Attr(0, frozenset({0, 1})), "reverse": Attr(0, frozenset({0, 1}))},
)
def _cumprod(ctx):
    # a log-depth (Hillis-Steele) scan: after step s every element holds the product of the
    # 2^s elements ending at it; shifts pad with ones
    x = ctx.input(0)
    src = static_shape(ctx, x)
    axis = _norm_axis(ctx, int(ctx.const(1, "axis").ravel()[0]), len(src))
    n = src[axis]
    dt = np.dtype(x.dtype)
    rev = (slice(None),) * axis + (slice(None, None, -1),)

    def shifted(v, k):
        ones = list(src)
        ones[axis] = k
        return mgb.opr.concat(ctx.imm(np.ones(ones, dt)), _take(v, axis, 0, n - k), axis=axis)

    y = x[rev] if ctx.attr("reverse") and n > 1 else x
    if ctx.attr("exclusive") and n:
        y = shifted(y, 1) if n > 1 else ctx.imm(np.ones(src, dt))
    k = 1
    while k < n:
        y = E(y, shifted(y, k), mode="MUL")
        k *= 2
    if ctx.attr("reverse") and n > 1:
        y = y[rev]
    return y if y is not x else mgb.opr.identity(x)


@converter("CenterCropPad", 18, attrs={"axes": None})
def _center_crop_pad(ctx):
    x = ctx.input(0)
    src = static_shape(ctx, x)
    nd = len(src)
    shape = [int(s) for s in ctx.const(1, "shape").ravel()]
    axes = ctx.attr("axes")
    axes = list(range(nd)) if axes is None else [_norm_axis(ctx, a, nd) for a in axes]
    if len(shape) != len(axes):
        raise ctx.fail(f"shape has {len(shape)} values for {len(axes)} axes")
    y = x
    for a, want in zip(axes, shape):
        dim = src[a]
        if want < dim:  # crop: the extra element goes to the end
            start = (dim - want) // 2
            y = _take(y, a, start, start + want)
        elif want > dim:  # pad with zeros: the extra element goes to the end
            before = (want - dim) // 2
            y = _pad_axis(
                ctx,
                y,
                a,
                before,
                want - dim - before,
                "constant",
                ctx.imm(np.zeros((), np.dtype(x.dtype))),
            )
    return y if y is not x else mgb.opr.identity(x)


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


def _window(ctx, fn):
    from .loader import onnx_to_np_dtype

    size = int(ctx.const(0, "size").ravel()[0])
    n = np.arange(size, dtype=np.float64)
    denom = size if ctx.attr("periodic") else size - 1
    dt = onnx_to_np_dtype(ctx.attr("output_datatype"), where=ctx.where)
    with np.errstate(divide="ignore", invalid="ignore"):
        return ctx.imm(fn(n, denom).astype(dt), dt)


_WINDOW_ATTRS = {"output_datatype": 1, "periodic": Attr(1, frozenset({0, 1}))}


@converter("HannWindow", 17, attrs=_WINDOW_ATTRS)
def _hann_window(ctx):
    return _window(ctx, lambda n, d: np.sin(np.pi * n / d) ** 2)


@converter("HammingWindow", 17, attrs=_WINDOW_ATTRS)
def _hamming_window(ctx):
    a = 25.0 / 46.0
    return _window(ctx, lambda n, d: a - (1 - a) * np.cos(2 * np.pi * n / d))


@converter("BlackmanWindow", 17, attrs=_WINDOW_ATTRS)
def _blackman_window(ctx):
    return _window(
        ctx, lambda n, d: 0.42 - 0.5 * np.cos(2 * np.pi * n / d) + 0.08 * np.cos(4 * np.pi * n / d)
    )


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
