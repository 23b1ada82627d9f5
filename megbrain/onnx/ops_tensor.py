"""Shape and data-movement ONNX operators: Reshape, Slice, Gather, Pad, Constant, ..."""

from __future__ import annotations

import numpy as np

import megbrain as mgb

from .loader import narrow as _narrow
from .loader import physical_shape
from .registry import Attr, converter

E = mgb.opr.elemwise


def static_shape(ctx, var, what="input") -> tuple:
    """The ONNX shape of ``var``, which must be known when the graph is built: () for a 0-d
    input of the node (held as (1,))."""
    shp = var.imm_shape
    if shp is None:
        raise ctx.fail(f"the shape of the {what} must be known at load")
    if ctx.rank_of(var) == 0:
        return ()
    return tuple(int(d) for d in shp)


def _norm_axis(ctx, axis, ndim):
    a = int(axis)
    if not -ndim <= a < ndim:
        raise ctx.fail(f"axis {a} is out of range for rank {ndim}")
    return a + ndim if a < 0 else a


def _reshape(var, shape):
    shape = physical_shape(shape)
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
    ctx.set_rank(arr.ndim)
    return ctx.imm(_narrow(arr).reshape(physical_shape(arr.shape)))


@converter("ConstantOfShape", 9, attrs={"value": None})
def _constant_of_shape(ctx):
    shape = ctx.const(0, "shape").ravel().tolist()
    v = ctx.attr("value")
    v = np.zeros(1, np.float32) if v is None else np.asarray(v).ravel()
    ctx.set_rank(len(shape))
    return ctx.imm(_narrow(np.full(physical_shape(shape), v[0], dtype=v.dtype)))


@converter("Range", 11)
def _range(ctx):
    s, l, d = (ctx.const(i, n).reshape(()) for i, n in enumerate(("start", "limit", "delta")))
    dt = np.result_type(s, l, d)
    n = max(int(np.ceil((float(l) - float(s)) / float(d))), 0)
    ctx.set_rank(1)
    return ctx.imm(_narrow((s + d * np.arange(n)).astype(dt)))


@converter("Shape", 1, attrs={"start": 0, "end": None})
def _shape(ctx):
    x = ctx.input(0)
    ctx.set_rank(1)
    shp = x.imm_shape
    if shp is not None:
        shp = np.asarray(static_shape(ctx, x), np.int32)
        r = len(shp)
        st, en = ctx.attr("start"), ctx.attr("end")
        return ctx.imm(shp[slice(st, en if en is not None else r)])
    if ctx.attr("start") != 0 or ctx.attr("end") is not None:
        return mgb.opr.get_var_shape(x)[ctx.attr("start") : ctx.attr("end")]
    return mgb.opr.get_var_shape(x)


@converter("Size", 1)
def _size(ctx):
    n = int(np.prod(static_shape(ctx, ctx.input(0))))
    return ctx.as_shape(ctx.imm(np.asarray([n], np.int32)), ())


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
    return ctx.as_shape(x, shape)


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
    if nd == 0:
        return mgb.opr.identity(x)
    perm = ctx.attr("perm")
    perm = list(range(nd))[::-1] if perm is None else [int(p) for p in perm]
    return mgb.opr.dimshuffle(x, perm)


@converter("Squeeze", 1, attrs={"axes": None})
def _squeeze(ctx):
    x = ctx.input(0)
    try:
        src = static_shape(ctx, x)
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
    return ctx.as_shape(x, [d for i, d in enumerate(src) if i not in axes])


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
    return ctx.as_shape(x, src)


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
    return ctx.as_shape(out, src[:axis] + ishape + src[axis + 1 :])


@converter("Expand", 8)
def _expand(ctx):
    x = ctx.input(0)
    shape = ctx.const(1, "shape").ravel().tolist()
    target = np.broadcast_shapes(static_shape(ctx, x), tuple(int(d) for d in shape))
    ctx.set_rank(len(target))
    return mgb.opr.broadcast(x, physical_shape(target))


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


_BLOCK_ATTRS = {"blocksize": None, "mode": Attr("DCR", frozenset({"DCR", "CRD"}))}


def _blocks(ctx):
    """DepthToSpace's and SpaceToDepth's input, its NCHW shape and the block size."""
    x = ctx.input(0)
    return x, static_shape(ctx, x), int(ctx.attr("blocksize"))


@converter("DepthToSpace", 1, attrs=_BLOCK_ATTRS)
def _depth_to_space(ctx):
    x, (n, c, h, w), b = _blocks(ctx)
    if ctx.attr("mode") == "DCR":
        t = mgb.opr.dimshuffle(_reshape(x, (n, b, b, c // (b * b), h, w)), [0, 3, 4, 1, 5, 2])
    else:
        t = mgb.opr.dimshuffle(_reshape(x, (n, c // (b * b), b, b, h, w)), [0, 1, 4, 2, 5, 3])
    return _reshape(t, (n, c // (b * b), h * b, w * b))


@converter("SpaceToDepth", 1, attrs=_BLOCK_ATTRS)
def _space_to_depth(ctx):
    x, (n, c, h, w), b = _blocks(ctx)
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


_SCAN_ATTRS = {"exclusive": Attr(0, frozenset({0, 1})), "reverse": Attr(0, frozenset({0, 1}))}


def _scan_axis(ctx, x):
    """CumSum's and CumProd's axis (input 1) as a non-negative axis of ``x``."""
    return _norm_axis(ctx, int(ctx.const(1, "axis").ravel()[0]), len(static_shape(ctx, x)))


@converter("CumSum", 11, attrs=_SCAN_ATTRS)
def _cumsum(ctx):
    x = ctx.input(0)
    axis = _scan_axis(ctx, x)
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


@converter("CumProd", 26, attrs=_SCAN_ATTRS)
def _cumprod(ctx):
    # a log-depth (Hillis-Steele) scan: after step s every element holds the product of the
    # 2^s elements ending at it; shifts pad with ones
    x = ctx.input(0)
    src = static_shape(ctx, x)
    axis = _scan_axis(ctx, x)
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
