"""Exporters of the tensor-manipulation family: shapes (GetVarShape, Reshape, AxisAddRemove,
Dimshuffle, Broadcast), Concat, the Subtensor and vector-indexing families, one-hot
indexing, arg/sort/top-k, Cumsum, the generators (Linspace, Eye, Alloc), param packs and the
identity-like utility operators.

Shapes stay dynamic where megbrain computes them: a Reshape whose target comes from
``GetVarShape`` is exported as ONNX ``Shape`` arithmetic. Exporters that must bake a static
shape (SetSubtensor's index grid) record it with :meth:`Writer.bakes_shape`, and the driver
refuses a ``dynamic_axes`` dim that reaches one.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from .export_base import INT64_MAX, INT64_MIN, REFUSED, Writer, exports, onnx_dtype, static_shape


def _vec(w: Writer, values) -> str:
    return w.const(np.asarray(values, np.int64).reshape(-1), "i64")


def _to_int32(w, name):
    return w.node("Cast", [name], to=TensorProto.INT32)


# ---- identity-like ---------------------------------------------------------------------------
@exports(
    "Identity",
    "Copy",
    "MarkNoBroadcastElemwise",
    "SetGrad",
    "RequireInputDynamicStorage",
    "PersistentOutputStorage",
    "VirtualDep",  # input 0; the ordering it adds has no meaning in a dataflow graph
)
def _identity(w, op, ins):
    return w.node("Identity", [ins[0]])


# ---- shapes ----------------------------------------------------------------------------------
@exports("GetVarShape")
def _get_var_shape(w, op, ins):
    shape = w.node("Shape", [ins[0]])
    axis = op.params.get("axis")
    if axis is not None:
        ndim = len(static_shape(w, op.inputs[0], "input"))
        a = int(axis) % ndim
        shape = w.node("Slice", [shape, _vec(w, [a]), _vec(w, [a + 1])])
    return _to_int32(w, shape)


@exports("Reshape")
def _reshape(w, op, ins):
    unspec = op.params.get("unspec_axis")
    target = op.inputs[1]
    val = w.value(target)
    if val is not None:
        shape = np.asarray(val, np.int64).reshape(-1).copy()
        if unspec is not None:
            shape[int(unspec)] = -1
        return w.node("Reshape", [ins[0], _vec(w, shape)])
    shape = w.i64(target)
    if unspec is not None:
        n = int(np.prod(static_shape(w, target, "target shape")))
        hot = np.zeros(n, np.int64)
        hot[int(unspec)] = 1
        # shape * (1 - onehot) - onehot: -1 at the unspecified axis
        shape = w.node("Sub", [w.node("Mul", [shape, _vec(w, 1 - hot)]), _vec(w, hot)])
    return w.node("Reshape", [ins[0], shape])


@exports("AxisAddRemove")
def _axis_add_remove(w, op, ins):
    x = ins[0]
    ndim = len(static_shape(w, op.inputs[0], "input"))
    for kind, axis in op.params["desc"]:
        if kind == "add":
            x = w.unsqueeze(x, [int(axis)])
            ndim += 1
        elif ndim == 1:
            pass  # removing the only axis of (1,) keeps (1,)
        else:
            x = w.squeeze(x, [int(axis)])
            ndim -= 1
    return x if x != ins[0] else w.node("Identity", [x])


@exports("Dimshuffle")
def _dimshuffle(w, op, ins):
    pattern = ["x" if d in ("x", -1) else int(d) for d in op.params["pattern"]]
    src = static_shape(w, op.inputs[0], "input")
    real = [d for d in pattern if d != "x"]
    dropped = [a for a in range(len(src)) if a not in real]
    x = ins[0]
    if dropped:
        x = w.squeeze(x, dropped)
        real = [d - sum(1 for a in dropped if a < d) for d in real]
    if real != sorted(real):
        x = w.node("Transpose", [x], perm=real)
    new = [k for k, d in enumerate(pattern) if d == "x"]
    if new:
        x = w.unsqueeze(x, new)
    return x if x != ins[0] else w.node("Identity", [x])


@exports("Broadcast")
def _broadcast(w, op, ins):
    return w.node("Expand", [ins[0], w.i64(op.inputs[1])])


@exports("Concat")
def _concat(w, op, ins):
    return w.node("Concat", list(ins), axis=int(op.params["axis"]))


# ---- subtensor -------------------------------------------------------------------------------
def _parse(descs, vals):
    """[(axis, kind, begin, end, step, index)] with the value vars (or None) in place."""
    it = iter(vals)
    out = []
    for axis, kind, *has in descs:
        got = [next(it) if h else None for h in has]
        out.append((axis, kind, *got))
    return out


def _step_sign(w, var) -> int:
    if var is None:
        return 1
    val = var.inferred_value
    if val is None:
        raise w.error(f"the sign of slice step {var.name!r} must be known when exporting")
    return 1 if int(np.asarray(val).reshape(-1)[0]) > 0 else -1


def _slice(w: Writer, x: str, items, ndim: int) -> str:
    """Slice the interval axes of ``items``."""
    starts, ends, axes, steps = [], [], [], []
    for axis, kind, b, e, s, _ in items:
        if kind != "interval":
            continue
        sign = _step_sign(w, s)
        starts.append(w.i64(b) if b is not None else _vec(w, [0 if sign > 0 else INT64_MAX]))
        ends.append(w.i64(e) if e is not None else _vec(w, [INT64_MAX if sign > 0 else INT64_MIN]))
        steps.append(w.i64(s) if s is not None else _vec(w, [1]))
        axes.append(axis % ndim)
    if not axes:
        return x

    def cat(parts):
        return parts[0] if len(parts) == 1 else w.node("Concat", parts, axis=0)

    return w.node("Slice", [x, cat(starts), cat(ends), _vec(w, axes), cat(steps)])


@exports("Subtensor")
def _subtensor(w, op, ins):
    ndim = len(static_shape(w, op.inputs[0], "input"))
    items = _parse(op.opr.param.descs, op.inputs[1:])
    x = _slice(w, ins[0], items, ndim)
    taken = sorted(axis % ndim for axis, kind, *_ in items if kind == "index")
    for a in taken:
        idx = next(it[5] for it in items if it[1] == "index" and it[0] % ndim == a)
        x = w.node("Gather", [x, w.i64(idx)], axis=a)
    if taken:
        if len(taken) == ndim:
            x = w.node("Reshape", [x, _vec(w, [1])])
        else:
            x = w.squeeze(x, taken)
    return x if x != ins[0] else w.node("Identity", [x])


def _positions(w, shape, items) -> tuple[np.ndarray, tuple]:
    """(the N-d positions the subtensor index selects, shape sub shape with the indexed axes
    kept as 1 + (ndim,); megbrain's sub shape), from static shapes and index values."""

    def v(var):
        if var is None:
            return None
        val = var.inferred_value
        if val is None:
            raise w.error(f"index value {var.name!r} must be static to export")
        return int(np.asarray(val).reshape(-1)[0])

    keep, real = [slice(None)] * len(shape), [slice(None)] * len(shape)
    for axis, kind, b, e, s, i in items:
        a = axis % len(shape)
        if kind == "index":
            k = v(i) % shape[a]
            keep[a], real[a] = slice(k, k + 1), k
        else:
            keep[a] = real[a] = slice(v(b), v(e), v(s))
    grids = np.indices(shape, dtype=np.int64)
    pos = np.stack([g[tuple(keep)] for g in grids], axis=-1)
    sub = np.broadcast_to(np.empty((), np.bool_), shape)[tuple(real)].shape or (1,)
    return pos, sub


@exports("SetSubtensor", "IncrSubtensor")
def _modify_subtensor(w, op, ins):
    shape = static_shape(w, op.inputs[0], "input")
    items = _parse(op.opr.param.descs, op.inputs[2:])
    pos, sub = _positions(w, shape, items)
    w.bakes_shape(ins[0], "the index grid of a subtensor update")
    indices = w.const(pos, "indices")
    value = w.node("Expand", [ins[1], _vec(w, sub)])
    value = w.node("Reshape", [value, _vec(w, pos.shape[:-1])])
    if op.type == "IncrSubtensor":
        value = w.node("Add", [w.node("GatherND", [ins[0], indices]), value])
    return w.node("ScatterND", [ins[0], indices, value])


# ---- vector indexing -------------------------------------------------------------------------
def _normalized(w, x, name, axis):
    """Index ``name`` (int64) with negative entries counted from the end of ``axis`` of x."""
    dim = _dim(w, x, axis)
    neg = w.node("Less", [name, _zero64(w)])
    return w.node("Where", [neg, w.node("Add", [name, dim]), name])


def _zero64(w):
    return w.const(np.zeros((), np.int64), "zero")


def _index_grid(w, op, x, items, ndim, family):
    """The indices of a vector-indexing family as one (B..., k) int64 tensor over the axes
    ``axes`` (moved first), and the perm from the (B..., rest...) layout GatherND gives to
    the family's result layout; returns (indices, axes, rest, perm, B)."""
    index = sorted((it[0] % ndim, it[5]) for it in items if it[1] == "index")
    shapes = [tuple(static_shape(w, v, "index")) for _, v in index]
    axes = [a for a, _ in index]
    parts = []
    if family == "mavi":
        bshape = tuple(np.broadcast_shapes(*shapes))
        for (a, var), _ in zip(index, shapes):
            t = _normalized(w, x, w.node("Cast", [w.name(var)], to=TensorProto.INT64), a)
            parts.append(w.node("Expand", [t, _vec(w, bshape)]))
    elif family == "mesh":
        bshape = tuple(s[0] for s in shapes)
        k = len(index)
        for j, (a, var) in enumerate(index):
            t = _normalized(w, x, w.node("Cast", [w.name(var)], to=TensorProto.INT64), a)
            t = w.node("Reshape", [t, _vec(w, [1] * j + [-1] + [1] * (k - j - 1))])
            parts.append(w.node("Expand", [t, _vec(w, bshape)]))
    else:  # batched: axis 0 pairs entry b with the rows index[b]
        batch = static_shape(w, op.outputs[0], "output")[0]
        bshape = (batch,) + tuple(s[1] for s in shapes)
        k = len(index) + 1
        one = w.const(np.ones((), np.int64), "one")
        rows = w.node("Range", [_zero64(w), w.squeeze(_dim(w, x, 0), [0]), one])
        rows = w.node("Reshape", [rows, _vec(w, [-1] + [1] * (k - 1))])
        parts.append(w.node("Expand", [rows, _vec(w, bshape)]))
        for j, (a, var) in enumerate(index, start=1):
            t = _normalized(w, x, w.node("Cast", [w.name(var)], to=TensorProto.INT64), a)
            t = w.node("Reshape", [t, _vec(w, [0] + [1] * (j - 1) + [-1] + [1] * (k - j - 1))])
            parts.append(w.node("Expand", [t, _vec(w, bshape)]))
        axes = [0] + axes
    rest = [a for a in range(ndim) if a not in axes]
    nb = len(bshape)
    idx = w.node("Concat", [w.unsqueeze(t, [nb]) for t in parts], axis=-1)
    if family == "mavi":
        if axes == list(range(axes[0], axes[0] + len(axes))) and axes[0] > 0:
            lead = list(range(nb, nb + axes[0]))
            perm = lead + list(range(nb)) + list(range(nb + axes[0], nb + len(rest)))
        else:
            perm = list(range(nb + len(rest)))
    else:  # the index dims stay in place of their axes
        perm = [axes.index(p) if p in axes else nb + rest.index(p) for p in range(ndim)]
    return idx, axes, rest, perm, bshape


def _identity_perm(perm):
    return perm == list(range(len(perm)))


@exports("IndexingMultiAxisVec", "BatchedMeshIndexing")
def _vec_gather(w, op, ins):
    ndim = len(static_shape(w, op.inputs[0], "input"))
    items = _parse(op.opr.param.descs, op.inputs[1:])
    x = _slice(w, ins[0], items, ndim)
    family = "mavi" if op.type == "IndexingMultiAxisVec" else "batched"
    index = [it for it in items if it[1] == "index"]
    if family == "mavi" and len(index) == 1:
        return w.node("Gather", [x, w.name(index[0][5])], axis=index[0][0] % ndim)
    idx, axes, rest, perm, _ = _index_grid(w, op, x, items, ndim, family)
    y = w.node("GatherND", [w.node("Transpose", [x], perm=axes + rest), idx])
    return y if _identity_perm(perm) else w.node("Transpose", [y], perm=perm)


@exports(
    "IndexingSetMultiAxisVec",
    "IndexingIncrMultiAxisVec",
    "SetMeshIndexing",
    "IncrMeshIndexing",
    "BatchedSetMeshIndexing",
    "BatchedIncrMeshIndexing",
)
def _vec_scatter(w, op, ins):
    shape = static_shape(w, op.inputs[0], "input")
    ndim = len(shape)
    items = _parse(op.opr.param.descs, op.inputs[2:])
    if any(it[1] == "interval" and any(v is not None for v in it[2:5]) for it in items):
        raise w.error("an indexed update with slices on other axes is not exported")
    incr = "Incr" in op.type
    if incr and w.opset < 16:
        raise w.error("an indexed increment needs ScatterND's reduction (opset 16 or newer)")
    family = "mavi" if "MultiAxisVec" in op.type else (
        "batched" if op.type.startswith("Batched") else "mesh"
    )
    x = ins[0]
    idx, axes, rest, perm, bshape = _index_grid(w, op, x, items, ndim, family)
    layout = list(bshape) + [shape[a] for a in rest]  # (B..., rest...)
    result = [layout[p] for p in perm]  # the getter's result shape
    value = w.node("Expand", [ins[1], _vec(w, result)])
    inv = [perm.index(k) for k in range(len(perm))]
    if not _identity_perm(inv):
        value = w.node("Transpose", [value], perm=inv)
    order = axes + rest
    xt = x if _identity_perm(order) else w.node("Transpose", [x], perm=order)
    kw = {"reduction": "add"} if incr else {}
    y = w.node("ScatterND", [xt, idx, value], **kw)
    back = [order.index(k) for k in range(ndim)]
    return y if _identity_perm(back) else w.node("Transpose", [y], perm=back)


@exports("IndexingOneHot")
def _one_hot(w, op, ins):
    src = static_shape(w, op.inputs[0], "src")
    ax = int(op.params["axis"]) % len(src)
    index = ins[1] if len(src) == 1 else w.unsqueeze(ins[1], [ax])
    return w.node("GatherElements", [ins[0], index], axis=ax)


@exports("IndexingSetOneHot")
def _set_one_hot(w, op, ins):
    src = static_shape(w, op.inputs[0], "src")
    ax = int(op.params["axis"]) % len(src)
    index = ins[1] if len(src) == 1 else w.unsqueeze(ins[1], [ax])
    return w.node("ScatterElements", [ins[0], index, ins[2]], axis=ax)


@exports("IndexingRemap")
def _remap(w, op, ins):
    return w.node("GatherND", [ins[0], w.node("Cast", [ins[1]], to=TensorProto.INT64)])


@exports("MeshIndexing")
def _mesh(w, op, ins):
    ndim = len(static_shape(w, op.inputs[0], "input"))
    items = _parse(op.opr.param.descs, op.inputs[1:])
    x = _slice(w, ins[0], items, ndim)
    for it in items:
        if it[1] == "index":
            x = w.node("Gather", [x, w.name(it[5])], axis=it[0] % ndim)
    return x


@exports("CondTake")
def _cond_take(w, op, ins):
    p = op.params
    flat = _vec(w, [-1])
    m = w.node("Cast", [w.node("Reshape", [ins[1], flat])], to=TensorProto.DOUBLE)
    val = w.const(np.asarray(p["val"], np.float64), "val")
    mode = p["mode"]
    if mode in ("EQ", "NEQ"):
        if np.dtype(op.inputs[1].dtype).kind == "f":
            eps = w.const(np.asarray(p["eps"], np.float64), "eps")
            cond = w.node("Less", [w.node("Abs", [w.node("Sub", [m, val])]), eps])
        else:
            cond = w.node("Equal", [m, val])
        if mode == "NEQ":
            cond = w.node("Not", [cond])
    else:
        ops = {"LT": "Less", "LEQ": "LessOrEqual", "GT": "Greater", "GEQ": "GreaterOrEqual"}
        cond = w.node(ops[mode], [m, val])
    values = w.node("Compress", [w.node("Reshape", [ins[0], flat]), cond], axis=0)
    where = w.squeeze(w.node("NonZero", [cond]), [0])
    return [values, _to_int32(w, where)]


# ---- arg / sort / top-k ----------------------------------------------------------------------
@exports("Argmax", "Argmin")
def _arg(w, op, ins):
    ndim = len(static_shape(w, op.inputs[0], "input"))
    axis = int(op.params["axis"]) % ndim
    r = w.node("ArgMax" if op.type == "Argmax" else "ArgMin", [ins[0]], axis=axis, keepdims=1)
    return _to_int32(w, r)


def _dim(w, x, axis):
    return w.node("Slice", [w.node("Shape", [x]), _vec(w, [axis]), _vec(w, [axis + 1])])


@exports("Argsort")
def _argsort(w, op, ins):
    desc = op.params["order"] == "DESCENDING"
    vals, idx = w.node(
        "TopK", [ins[0], _dim(w, ins[0], 1)], n_out=2, axis=1, largest=int(desc), sorted=1
    )
    return [vals, _to_int32(w, idx)]


@exports("TopK")
def _topk(w, op, ins):
    kvar = op.inputs[1]
    kval = kvar.inferred_value
    if kval is None:
        raise w.error(f"the sign of k ({kvar.name!r}) must be known when exporting")
    largest = int(np.asarray(kval).reshape(-1)[0]) < 0
    k = w.i64(kvar)
    if largest:
        k = w.node("Abs", [k])
    vals, idx = w.node("TopK", [ins[0], k], n_out=2, axis=1, largest=int(largest), sorted=1)
    if op.params["mode"] == "KTH_ONLY":
        kth = w.node("Gather", [vals, _vec(w, [-1])], axis=1)
        return [w.squeeze(kth, [1]), None]
    return [vals, _to_int32(w, idx)]


@exports("Cumsum")
def _cumsum(w, op, ins):
    p = op.params
    x = ins[0]
    ndim = len(static_shape(w, op.inputs[0], "input"))
    axis = int(p["axis"])
    if axis == 2**31 - 1:
        x, axis = w.node("Reshape", [x, _vec(w, [-1])]), 0
    axis %= max(ndim, 1)
    return w.node(
        "CumSum",
        [x, w.const(np.asarray(axis, np.int64), "axis")],
        exclusive=int(bool(p["exclusive"])),
        reverse=int(bool(p["reverse"])),
    )


# ---- generators ------------------------------------------------------------------------------
@exports("Linspace")
def _linspace(w, op, ins):
    dt = np.dtype(op.outputs[0].dtype)
    start, stop = (w.node("Reshape", [w.cast(ins[k], dt), _vec(w, [])]) for k in (0, 1))
    num = w.node("Reshape", [w.cast(ins[2], dt), _vec(w, [])])
    one = w.const(np.asarray(1, dt), "k")
    zero = w.const(np.asarray(0, dt), "k")
    steps = w.node("Range", [zero, num, one])
    div = w.node("Sub", [num, one]) if op.params["endpoint"] else num
    div = w.node("Max", [div, one])  # num == 1 gives [start]
    delta = w.node("Div", [w.node("Sub", [stop, start]), div])
    return w.node("Add", [w.node("Mul", [steps, delta]), start])


@exports("Eye")
def _eye(w, op, ins):
    dt = np.dtype(op.outputs[0].dtype)
    zeros = w.node(
        "ConstantOfShape", [w.i64(op.inputs[0])], value=_tensor_value(np.zeros(1, np.float32))
    )
    return w.node("EyeLike", [zeros], k=int(op.params["k"]), dtype=onnx_dtype(dt))


@exports("Alloc")
def _alloc(w, op, ins):
    dt = np.dtype(op.outputs[0].dtype)
    return w.node("ConstantOfShape", [w.i64(op.inputs[0])], value=_tensor_value(np.zeros(1, dt)))


def _tensor_value(arr):
    from onnx import numpy_helper

    return numpy_helper.from_array(arr)


# ---- param packs -----------------------------------------------------------------------------
@exports("ParamPackSplit")
def _pack_split(w, op, ins):
    p = op.params
    outs = []
    for b, e, shp in zip(p["offsets"][::2], p["offsets"][1::2], p["shapes"]):
        part = w.node("Slice", [ins[0], _vec(w, [b]), _vec(w, [e])])
        outs.append(w.node("Reshape", [part, _vec(w, list(shp))]))
    return outs


@exports("ParamPackConcat")
def _pack_concat(w, op, ins):
    p = op.params
    dt = np.dtype(op.outputs[0].dtype)
    size = int(p["size"]) or max(p["offsets"][1::2])
    spans = sorted(zip(p["offsets"][::2], p["offsets"][1::2], range(len(ins))))
    parts, at = [], 0
    for b, e, k in spans:
        if b > at:
            parts.append(w.const(np.zeros(b - at, dt), "gap"))
        parts.append(w.node("Reshape", [ins[k], _vec(w, [-1])]))
        at = e
    if size > at:
        parts.append(w.const(np.zeros(size - at, dt), "gap"))
    return w.node("Concat", parts, axis=0)


REFUSED.update(
    {
        "AddUpdate": "it updates a shared tensor in place; an ONNX graph has no state",
        "CondExecMark": "conditional execution has no ONNX form short of If subgraphs",
        "CondExecMerge": "conditional execution has no ONNX form short of If subgraphs",
        "CondExecPred": "conditional execution has no ONNX form short of If subgraphs",
        "CondExecPredLogical": "conditional execution has no ONNX form short of If subgraphs",
        "Loop": "megbrain loops are not written as ONNX Loop subgraphs",
        "LoopGrad": "megbrain loops are not written as ONNX Loop subgraphs",
        "LoopInput": "megbrain loops are not written as ONNX Loop subgraphs",
        "CollectiveComm": "multi-machine communication has no ONNX form",
        "RemoteSend": "multi-machine communication has no ONNX form",
        "RemoteRecv": "multi-machine communication has no ONNX form",
        "CallbackInjector": "it runs a Python callback",
        "Craniotome": "it is an operator defined in Python",
        "Timestamp": "it records profiling timestamps",
        "RelayoutFormat": "ONNX tensors have no channel-blocked (NCHW88) layout; export the "
        "graph before optimize_for_inference(use_nchw88=True)",
        "VirtualGrad": "a symbolic gradient (expanded only when compiling)",
        "VirtualLoss": "a symbolic gradient (expanded only when compiling)",
        "InvalidGrad": "an undefined gradient (no function can compute it)",
        "AssertEqual": "a run-time check with no ONNX form",
        "GaussianRNG": "ONNX random operators draw from another generator",
        "UniformRNG": "ONNX random operators draw from another generator",
        "ArgsortBackward": "a gradient operator (training graphs have no ONNX form)",
        "IndexingRemapBackward": "a gradient operator (training graphs have no ONNX form)",
    }
)
