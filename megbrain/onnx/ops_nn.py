"""Neural-network ONNX operators: Conv, ConvTranspose, pooling, Gemm, MatMul, normalizations,
Softmax."""

from __future__ import annotations

import itertools

import numpy as np

import megbrain as mgb
from megbrain.graph.param_def import per_axis_fields

from .ops_tensor import _norm_axis, _pad_impl, _reshape, _take, static_shape
from .registry import Attr, converter

E = mgb.opr.elemwise
_AUTO_PAD = frozenset({"NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"})


def _c(ctx, v, like):
    return ctx.imm(np.asarray(v, np.dtype(like.dtype)))


def _channel(ctx, v, nd):
    """A per-channel vector shaped (1, C, 1, ...) for an ``nd``-dimensional NC... tensor."""
    c = static_shape(ctx, v)[0]
    return _reshape(v, (1, c) + (1,) * (nd - 2))


# ---------------------------------------------------------------------------------- matmul
@converter("MatMul", 1)
def _matmul(ctx):
    a, b = ctx.input(0), ctx.input(1)
    if np.dtype(a.dtype).kind in "iub":
        raise ctx.fail(f"integer MatMul ({a.dtype}) is not supported")
    return matmul_vars(ctx, a, b)


def matmul_vars(ctx, a, b):
    """``a @ b`` with ONNX MatMul's broadcasting and 1-d promotion (float or quantized vars)."""
    sa, sb = static_shape(ctx, a), static_shape(ctx, b)
    va, vb = len(sa) == 1, len(sb) == 1
    if va:
        a, sa = _reshape(a, (1, sa[0])), (1, sa[0])
    if vb:
        b, sb = _reshape(b, (sb[0], 1)), (sb[0], 1)
    if len(sa) == 2 and len(sb) == 2:
        out = mgb.opr.matrix_mul(a, b)
        batch = ()
    elif len(sb) == 2:
        # an N-d operand by one matrix (channels-last Linear layers, transformers): one GEMM
        # over all the rows, not a batch of small ones; a batch of one, not a MatrixMul, keeps
        # the product on the kernel threads (docs/DECISIONS.md)
        batch = tuple(sa[:-2])
        rows = _reshape(a, (1, int(np.prod(sa[:-1])), sa[-1]))
        out = mgb.opr.batched_matrix_mul(rows, _reshape(b, (1,) + sb))
    else:
        batch = tuple(np.broadcast_shapes(sa[:-2], sb[:-2]))
        nb = int(np.prod(batch))
        a3 = _reshape(mgb.opr.broadcast(a, batch + sa[-2:]), (nb,) + sa[-2:])
        b3 = _reshape(mgb.opr.broadcast(b, batch + sb[-2:]), (nb,) + sb[-2:])
        out = mgb.opr.batched_matrix_mul(a3, b3)
    shape = batch + ((sa[-2],) if not va else ()) + ((sb[-1],) if not vb else ())
    return ctx.as_shape(out, shape)


@converter("Gemm", 7, attrs={"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0})
def _gemm(ctx):
    a, b = ctx.input(0), ctx.input(1)
    y = mgb.opr.matrix_mul(a, b, bool(ctx.attr("transA")), bool(ctx.attr("transB")))
    if ctx.attr("alpha") != 1.0:
        y = E(y, _c(ctx, ctx.attr("alpha"), y), mode="MUL")
    if ctx.has(2):
        cc = ctx.input(2)
        if ctx.attr("beta") != 1.0:
            cc = E(cc, _c(ctx, ctx.attr("beta"), cc), mode="MUL")
        y = E(y, cc, mode="ADD")
    return y


# ---------------------------------------------------------------------------------- conv
def _same_pads(in_sz, k, s, d, upper):
    out = -(-in_sz // s)
    total = max((out - 1) * s + (k - 1) * d + 1 - in_sz, 0)
    small, big = total // 2, total - total // 2
    return (small, big) if upper else (big, small)


def _spatial_pads(ctx, spatial, kernel, strides, dilations):
    """(begin, end) pads per spatial axis from ``pads``/``auto_pad``."""
    n = len(spatial)
    ap = ctx.attr("auto_pad")
    if ap == "VALID":
        return [(0, 0)] * n
    if ap in ("SAME_UPPER", "SAME_LOWER"):
        return [
            _same_pads(spatial[i], kernel[i], strides[i], dilations[i], ap == "SAME_UPPER")
            for i in range(n)
        ]
    pads = ctx.attr("pads") or (0,) * (2 * n)
    return [(int(pads[i]), int(pads[i + n])) for i in range(n)]


def _conv_common(ctx, x, kernel):
    src = static_shape(ctx, x)
    n = len(src) - 2
    strides = list(ctx.attr("strides") or [1] * n)
    dil = list(ctx.attr("dilations") or [1] * n)
    pads = _spatial_pads(ctx, src[2:], kernel, strides, dil)
    return src, n, strides, dil, pads


def _explicit_pad(ctx, x, pads, value=0.0):
    """Pad the spatial axes of x where begin and end differ; returns (x, symmetric pads)."""
    if all(b == e for b, e in pads):
        return x, [b for b, _ in pads]
    full = [0, 0] + [b for b, _ in pads] + [0, 0] + [e for _, e in pads]
    return _pad_impl(ctx, x, full, "constant", _c(ctx, value, x)), [0] * len(pads)


def _grouped(ctx, w, ws):
    """``(w, kw)``: the weight of shape ``ws`` split into ``group`` groups, and the
    ``sparse`` keyword that says so (nothing for one group)."""
    g = ctx.attr("group")
    if g == 1:
        return w, {}
    return _reshape(w, (g, ws[0] // g) + ws[1:]), {"sparse": "GROUP"}


def conv_operands(ctx, x, w, ws, strides, dil, sym):
    """``(x, w, kw)`` for megbrain's convolution: a 1-d one lifted to 2-d (a trailing axis of
    1), the weight of shape ``ws`` grouped, ``kw`` the per-axis fields and ``sparse``."""
    if len(ws) == 3:
        x = _reshape(x, static_shape(ctx, x) + (1,))
        w = _reshape(w, ws + (1,))
        ws = ws + (1,)
        strides, dil, sym = list(strides) + [1], list(dil) + [1], list(sym) + [0]
    w, kw = _grouped(ctx, w, ws)
    return x, w, {**kw, **per_axis_fields(pad=sym, stride=strides, dilate=dil)}


_CONV_ATTRS = {
    "auto_pad": Attr("NOTSET", _AUTO_PAD),
    "dilations": None,
    "group": 1,
    "kernel_shape": None,
    "pads": None,
    "strides": None,
}


@converter("Conv", 1, attrs=_CONV_ATTRS)
def _conv(ctx):
    x, w = ctx.input(0), ctx.input(1)
    ws = static_shape(ctx, w, "weight")
    src, n, strides, dil, pads = _conv_common(ctx, x, ws[2:])
    if n not in (1, 2, 3):
        raise ctx.fail(f"{n}-d convolution is not supported (1-d to 3-d are)")
    x, sym = _explicit_pad(ctx, x, pads)
    x, w, kw = conv_operands(ctx, x, w, ws, strides, dil, sym)
    conv = mgb.opr.convolution3d if n == 3 else mgb.opr.convolution
    y = conv(x, w, **kw)
    if n == 1:
        ys = static_shape(ctx, y)
        y = _reshape(y, ys[:3])
    if ctx.has(2):
        y = E(y, _channel(ctx, ctx.input(2), n + 2), mode="ADD")
    return y


@converter("ConvTranspose", 1, attrs={**_CONV_ATTRS, "output_padding": None, "output_shape": None})
def _conv_transpose(ctx):
    x, w = ctx.input(0), ctx.input(1)
    ws = static_shape(ctx, w, "weight")
    src = static_shape(ctx, x)
    n = len(src) - 2
    if n not in (1, 2, 3):
        raise ctx.fail(f"{n}-d transposed convolution is not supported (1-d to 3-d are)")
    k = ws[2:]
    strides = list(ctx.attr("strides") or [1] * n)
    dil = list(ctx.attr("dilations") or [1] * n)
    opad = list(ctx.attr("output_padding") or [0] * n)
    full = [strides[i] * (src[2 + i] - 1) + (k[i] - 1) * dil[i] + 1 for i in range(n)]
    oshape = ctx.attr("output_shape")
    if oshape is not None or ctx.attr("auto_pad") in ("SAME_UPPER", "SAME_LOWER"):
        # the pads that give output_shape, or input size * stride under SAME_*
        if oshape is not None:
            target = list(oshape)[-n:]
        else:
            target = [src[2 + i] * strides[i] for i in range(n)]
        pads = []
        for i in range(n):
            total = full[i] + opad[i] - target[i]
            b = total // 2 if ctx.attr("auto_pad") == "SAME_UPPER" else total - total // 2
            pads.append((b, total - b))
    elif ctx.attr("auto_pad") == "VALID":
        pads = [(0, 0)] * n
    else:
        p = ctx.attr("pads") or (0,) * (2 * n)
        pads = [(int(p[i]), int(p[i + n])) for i in range(n)]
    xx, ww = x, w
    if n == 1:
        xx = _reshape(x, src + (1,))
        ww = _reshape(w, ws + (1,))
        ws = ws + (1,)
    sh = (strides + [1])[: max(n, 2)]
    dl = (dil + [1])[: max(n, 2)]
    ww, kw = _grouped(ctx, ww, ws)
    deconv = mgb.opr.deconvolution3d if n == 3 else mgb.opr.deconvolution
    y = deconv(xx, ww, **per_axis_fields(stride=sh, dilate=dl), **kw)
    if n == 1:
        y = _reshape(y, static_shape(ctx, y)[:3])
    # crop the begin pads, then cut or zero-extend to the output size
    for i in range(n):
        axis = 2 + i
        b, e = pads[i]
        out_len = full[i] + opad[i] - b - e
        cur = static_shape(ctx, y)[axis]
        if b > 0:
            y = _take(y, axis, b, None)
            cur -= b
        if out_len < cur:
            y = _take(y, axis, 0, out_len)
        elif out_len > cur:
            fill = [0] * (2 * len(static_shape(ctx, y)))
            fill[len(fill) // 2 + axis] = out_len - cur
            y = _pad_impl(ctx, y, fill, "constant", _c(ctx, 0, y))
    if ctx.has(2):
        y = E(y, _channel(ctx, ctx.input(2), n + 2), mode="ADD")
    return y


# ---------------------------------------------------------------------------------- pooling
def _pool(ctx, mode):
    x = ctx.input(0)
    dt = np.dtype(x.dtype)
    if dt.kind in "iu":
        if mode != "MAX" or dt.itemsize > 2:
            raise ctx.fail(f"{dt} input is not supported")
        # megbrain pools floats only; small integers round-trip float32 exactly
        ctx.inputs = [mgb.opr.typecvt(x, np.float32)] + list(ctx.inputs[1:])
        return mgb.opr.typecvt(_pool(ctx, mode), dt)
    want_indices = len(ctx.node.output) > 1 and bool(ctx.node.output[1])
    kernel = list(ctx.attr("kernel_shape"))
    src, n, strides, dil, pads = _conv_common(ctx, x, kernel)
    if n not in (1, 2, 3):
        raise ctx.fail(f"{n}-d pooling is not supported (1-d to 3-d are)")
    base = pads
    if ctx.attr("ceil_mode"):
        # ceil mode adds an end pad where the last window would start inside the input
        new = []
        for i in range(n):
            b, e = pads[i]
            span = src[2 + i] + b + e - ((kernel[i] - 1) * dil[i] + 1)
            extra = (-span) % strides[i] if span % strides[i] else 0
            last_start = (span + extra) // strides[i] * strides[i]
            if extra and last_start >= src[2 + i] + b:
                extra = 0
            new.append((b, e + extra))
        pads = new
    include = bool(ctx.attr("count_include_pad")) if mode == "AVERAGE" else True
    if (
        not want_indices
        and list(kernel) == list(src[2:])
        and all(d == 1 for d in dil)
        and not any(b or e for b, e in pads)
    ):
        # one window over the whole unpadded plane (ResNet's head): a global pooling
        return _global_reduce(x, "MAX" if mode == "MAX" else "MEAN", src)
    if n == 3 or any(d != 1 for d in dil) or want_indices:
        return _pool_slices(ctx, x, mode, kernel, strides, dil, pads, base, include, want_indices)
    factor = None
    if mode == "AVERAGE" and (
        pads != base
        or (not include and any(b or e for b, e in pads))
        or any(b != e for b, e in pads)
    ):
        # average = window sum of the zero-padded input / count of the window's counted
        # cells (the input, plus the pads when count_include_pad), the count known at load
        mask = np.pad(np.ones(src[2:]), base, constant_values=1.0 if include else 0.0)
        mask = np.pad(mask, [(0, p[1] - q[1]) for p, q in zip(pads, base)])
        win = np.lib.stride_tricks.sliding_window_view(mask, kernel)
        win = win[tuple(slice(None, None, st) for st in strides)]
        count = win.sum(axis=tuple(range(n, 2 * n)))
        factor = ctx.imm((np.prod(kernel) / count).astype(np.dtype(x.dtype))[None, None])
        include = True
    exclude = not include
    direct_max = mode == "MAX" and all(b == e and b < k for (b, e), k in zip(pads, kernel))
    if (mode == "MAX" and not direct_max) or factor is not None:
        # pad explicitly (max: with the lowest value; average: with zeros); symmetric pads
        # smaller than the window go to MAX pooling itself, which ignores padding
        dt = np.dtype(x.dtype)
        lowest = np.iinfo(dt).min if dt.kind in "iu" else -np.inf
        fill = lowest if mode == "MAX" else 0
        full = [0, 0] + [b for b, _ in pads] + [0, 0] + [e for _, e in pads]
        if any(full):
            x = _pad_impl(ctx, x, full, "constant", _c(ctx, fill, x))
        sym = [0] * n
    else:
        sym = [b for b, _ in pads]
    if n == 1:
        x = _reshape(x, static_shape(ctx, x) + (1,))
        kernel, strides, sym = kernel + [1], strides + [1], sym + [0]
    pmode = "MAX" if mode == "MAX" else ("AVERAGE_COUNT_EXCLUDE_PADDING" if exclude else "AVERAGE")
    y = mgb.opr.pooling(
        x,
        mode=pmode,
        **per_axis_fields(pad=sym, stride=strides, window=kernel),
    )
    if n == 1:
        y = _reshape(y, static_shape(ctx, y)[:3])
    if factor is not None:
        y = E(y, factor, mode="MUL")
    return y


def _pool_slices(ctx, x, mode, kernel, strides, dil, pads, base, include, want_indices=False):
    """Pooling of any rank and dilation, composed: the padded input's strided slices, one per
    window offset, combined by max or sum (average: times 1 / count, the count known at load).
    MaxPool's Indices follow the first maximum of each window (flat indices into the input,
    row-major, or column-major over the spatial dims with storage_order=1)."""
    src = static_shape(ctx, x)
    n = len(src) - 2
    dt = np.dtype(x.dtype)
    lowest = np.iinfo(dt).min if dt.kind in "iu" else -np.inf
    full = [0, 0] + [b for b, _ in pads] + [0, 0] + [e for _, e in pads]
    xp = x
    if any(full):
        xp = _pad_impl(ctx, x, full, "constant", _c(ctx, lowest if mode == "MAX" else 0, x))
    ps = static_shape(ctx, xp)
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dil)]
    outn = [(ps[2 + i] - eff[i]) // strides[i] + 1 for i in range(n)]

    def window(o):
        return tuple(
            slice(o[i] * dil[i], o[i] * dil[i] + (outn[i] - 1) * strides[i] + 1, strides[i])
            for i in range(n)
        )

    acc = None
    best_idx = None
    if want_indices:
        spatial = src[2:]
        col_major = ctx.attr("storage_order") == 1
        grids = np.meshgrid(*[np.arange(d) for d in ps[2:]], indexing="ij")
        coords = [g - b for g, (b, _) in zip(grids, pads)]  # unpadded coordinates
        flat = np.zeros(ps[2:], np.int64)
        order = list(range(n))[::-1] if col_major else list(range(n))
        for i in order:
            flat = flat * spatial[i] + coords[i]
        nc = (np.arange(src[0] * src[1]) * int(np.prod(spatial))).reshape(
            (src[0], src[1]) + (1,) * n
        )
    count = np.zeros(outn)
    mask = np.pad(np.ones(src[2:]), base, constant_values=1.0 if include else 0.0)
    mask = np.pad(mask, [(0, p[1] - q[1]) for p, q in zip(pads, base)])
    for o in itertools.product(*[range(k) for k in kernel]):
        part = xp[(slice(None), slice(None)) + window(o)]
        if want_indices:
            idx = ctx.imm((nc + flat[window(o)][None, None]).astype(np.int32))
            if best_idx is None:
                best_idx = idx
            else:
                # move to this offset only where it is strictly larger (first maximum wins)
                upd = mgb.opr.typecvt(E(acc, part, mode="LT"), np.int32)
                best_idx = E(best_idx, E(upd, E(idx, best_idx, mode="SUB"), mode="MUL"), mode="ADD")
        acc = part if acc is None else E(acc, part, mode="MAX" if mode == "MAX" else "ADD")
        count += mask[window(o)]
    if mode == "MAX":
        return [acc, best_idx] if want_indices else acc
    return E(acc, ctx.imm((1.0 / count).astype(dt)[None, None]), mode="MUL")


_POOL_ATTRS = {
    "auto_pad": Attr("NOTSET", _AUTO_PAD),
    "ceil_mode": Attr(0, frozenset({0, 1})),
    "dilations": None,
    "kernel_shape": None,
    "pads": None,
    "strides": None,
}


@converter("MaxPool", 1, attrs={**_POOL_ATTRS, "storage_order": Attr(0, frozenset({0, 1}))})
def _maxpool(ctx):
    return _pool(ctx, "MAX")


@converter("AveragePool", 1, attrs={**_POOL_ATTRS, "count_include_pad": 0})
def _avgpool(ctx):
    return _pool(ctx, "AVERAGE")


@converter("LpPool", 11, attrs={**_POOL_ATTRS, "p": 2})
def _lp_pool(ctx):
    # (sum over the window of |x|^p)^(1/p): the window sum is the average counting the
    # (zero) pads, times the window size
    x = ctx.input(0)
    p = float(ctx.attr("p"))
    ctx.inputs = [E(E(x, mode="ABS"), _c(ctx, p, x), mode="POW")] + list(ctx.inputs[1:])
    ctx._attrs["count_include_pad"] = 1
    total = E(
        _pool(ctx, "AVERAGE"), _c(ctx, float(np.prod(ctx.attr("kernel_shape"))), x), mode="MUL"
    )
    return E(total, _c(ctx, 1.0 / p, x), mode="POW")


@converter(
    "CausalConvWithState",
    27,
    attrs={"activation": Attr("none", frozenset({"none", "silu", "swish"}))},
)
def _causal_conv_with_state(ctx):
    # depthwise causal conv1d over [past_state, x]: k shifted slices times per-channel taps
    x, w = ctx.input(0), ctx.input(1)
    b, c, length = static_shape(ctx, x)
    ws = static_shape(ctx, w, "weight")
    if len(ws) != 3 or ws[:2] != (c, 1):
        raise ctx.fail(f"weight must have shape ({c}, 1, k), got {ws}")
    k = ws[2]
    dt = np.dtype(x.dtype)
    if ctx.has(3):
        past = ctx.input(3)
    else:
        past = ctx.imm(np.zeros((b, c, k - 1), dt)) if k > 1 else None
    padded = mgb.opr.concat(past, x, axis=2) if past is not None else x
    # computed in float32; the convolution is rounded to the input dtype before the activation
    f32 = np.dtype(np.float32)

    def wide(v):
        return v if np.dtype(v.dtype) == f32 else mgb.opr.typecvt(v, f32)

    def narrow(v):
        return v if dt == f32 else mgb.opr.typecvt(v, dt)

    pw, ww = wide(padded), wide(w)
    acc = None
    for j in range(k):
        tap = _reshape(ww[:, :, j : j + 1], (1, c, 1))
        part = E(_take(pw, 2, j, j + length), tap, mode="MUL")
        acc = part if acc is None else E(acc, part, mode="ADD")
    if ctx.has(2):
        acc = E(acc, _reshape(wide(ctx.input(2)), (1, c, 1)), mode="ADD")
    acc = narrow(acc)
    if ctx.attr("activation") != "none":
        a = wide(acc)
        acc = narrow(E(a, E(a, mode="SIGMOID"), mode="MUL"))
    if k > 1:
        state = _take(padded, 2, length, length + k - 1)
    else:
        state = ctx.imm(np.zeros((b, c, 0), dt))
    return [acc, state]


def _global_reduce(x, mode: str, shape: tuple):
    """``mode`` (MEAN or MAX) of ``x`` ``(N, C, *S)`` over its spatial axes, kept with size 1:
    one reduction over the planes seen as ``(N, C, prod(S))`` (a view of a contiguous input;
    one reduction per axis took 5x as long for ResNet's 2048x7x7 head)."""
    n, c, sp = shape[0], shape[1], shape[2:]
    if not sp:
        return x
    if len(sp) == 1:
        return mgb.opr.reduce_(x, mode, 2, True)
    y = mgb.opr.reduce_(_reshape(x, (n, c, int(np.prod(sp)))), mode, 2, True)
    return _reshape(y, (n, c) + (1,) * len(sp))


def _global_pool(mode):
    def conv(ctx):
        x = ctx.input(0)
        return _global_reduce(x, mode, static_shape(ctx, x))

    return conv


converter("GlobalAveragePool", 1)(_global_pool("MEAN"))
converter("GlobalMaxPool", 1)(_global_pool("MAX"))


# ---------------------------------------------------------------------------- normalization
@converter(
    "BatchNormalization",
    6,
    attrs={
        "epsilon": 1e-5,
        "momentum": 0.9,
        "spatial": 1,
        "training_mode": Attr(0, frozenset({0, 1})),
    },
)
def _batch_norm(ctx):
    x, scale, bias, mean, var = ctx.inputs[:5]
    nd = len(static_shape(ctx, x))
    if nd == 1:
        raise ctx.fail("1-d input is not supported")
    if ctx.attr("training_mode"):
        if ctx.opset < 14:
            raise ctx.fail("training_mode needs opset 14 or newer")
        return _batch_norm_training(ctx, x, scale, bias, mean, var, nd)
    if len([o for o in ctx.node.output if o]) > 1:
        raise ctx.fail("running mean/var outputs need training_mode=1 (opset 14 or newer)")
    return _batch_norm_apply(ctx, x, scale, bias, mean, var, nd)


def _batch_norm_training(ctx, x, scale, bias, mean, var, nd):
    """ONNX's training form: normalize with the batch's statistics (mean and population
    variance over every axis but the channel's) and return the running statistics updated
    as ``running * momentum + batch * (1 - momentum)``."""
    axes = [a for a in range(nd) if a != 1]
    bmean, _, bvar = _moments(x, axes)
    c = static_shape(ctx, x)[1]
    bmean_c, bvar_c = _reshape(bmean, (c,)), _reshape(bvar, (c,))
    y = _batch_norm_apply(ctx, x, scale, bias, bmean_c, bvar_c, nd)
    m = ctx.attr("momentum")

    def update(run, cur):
        kept = E(run, _c(ctx, m, run), mode="MUL")
        return E(kept, E(cur, _c(ctx, 1 - m, cur), mode="MUL"), mode="ADD")

    return [y, update(mean, bmean_c), update(var, bvar_c)]


def _moments(x, axes, center=True):
    """``(mean, x - mean, var)`` over ``axes`` (kept); without centering ``mean`` is None
    and ``var`` is the mean square."""
    mean, d = None, x
    if center:
        mean = x
        for a in axes:
            mean = mgb.opr.reduce_(mean, "MEAN", a, True)
        d = E(x, mean, mode="SUB")
    var = E(d, d, mode="MUL")
    for a in axes:
        var = mgb.opr.reduce_(var, "MEAN", a, True)
    return mean, d, var


def _channel_affine(ctx, y, s, scale, bias, nd):
    """``y * (s * scale) + bias`` with ``scale`` and ``bias`` per channel (axis 1 of ``nd``
    axes); ``s`` None means 1."""
    sc = _channel(ctx, scale, nd)
    y = E(y, sc if s is None else E(s, sc, mode="MUL"), mode="MUL")
    return E(y, _channel(ctx, bias, nd), mode="ADD")


def _batch_norm_apply(ctx, x, scale, bias, mean, var, nd):
    s = E(
        E(_channel(ctx, var, nd), _c(ctx, ctx.attr("epsilon"), x), mode="ADD"),
        _c(ctx, -0.5, x),
        mode="POW",
    )
    return _channel_affine(ctx, E(x, _channel(ctx, mean, nd), mode="SUB"), s, scale, bias, nd)


# LayerNormalization and RMSNormalization: statistics over the axes from ``axis`` on
_TRAILING_NORM_ATTRS = {"axis": -1, "epsilon": 1e-5, "stash_type": Attr(1, frozenset({1}))}


def _trailing_axes(ctx, x):
    nd = len(static_shape(ctx, x))
    return range(_norm_axis(ctx, ctx.attr("axis"), nd), nd)


@converter("LayerNormalization", 17, attrs=_TRAILING_NORM_ATTRS)
def _layer_norm(ctx):
    x, scale = ctx.input(0), ctx.input(1)
    y, mean, inv = _normalized_parts(ctx, x, _trailing_axes(ctx, x), ctx.attr("epsilon"))
    y = E(y, scale, mode="MUL")
    if ctx.has(2):
        y = E(y, ctx.input(2), mode="ADD")
    return [y, mean, inv]


def _softmax_axis(ctx, x):
    src = static_shape(ctx, x)
    if ctx.opset >= 13:
        return (
            x,
            _norm_axis(ctx, ctx.attr("axis") if ctx.attr("axis") is not None else -1, len(src)),
            src,
        )
    axis = _norm_axis(ctx, 1 if ctx.attr("axis") is None else ctx.attr("axis"), len(src))
    flat = _reshape(x, (int(np.prod(src[:axis])), int(np.prod(src[axis:]))))
    return flat, 1, src


def _softmax_impl(ctx, log):
    x, axis, src = _softmax_axis(ctx, ctx.input(0))
    d = E(x, mgb.opr.reduce_(x, "MAX", axis, True), mode="SUB")
    ex = E(d, mode="EXP")
    s = mgb.opr.reduce_(ex, "SUM", axis, True)
    y = E(d, E(s, mode="LOG"), mode="SUB") if log else E(ex, s, mode="TRUE_DIV")
    return _reshape(y, src)


@converter("Softmax", 1, attrs={"axis": None})
def _softmax(ctx):
    return _softmax_impl(ctx, False)


@converter("LogSoftmax", 1, attrs={"axis": None})
def _log_softmax(ctx):
    return _softmax_impl(ctx, True)


@converter("LRN", 1, attrs={"alpha": 1e-4, "beta": 0.75, "bias": 1.0, "size": None})
def _lrn(ctx):
    # composed: the channel-window sum of squares as a sum of shifted slices of padded x^2
    x = ctx.input(0)
    src = static_shape(ctx, x)
    size = int(ctx.attr("size"))
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = E(x, x, mode="MUL")
    full = [0] * (2 * len(src))
    full[1], full[len(src) + 1] = lo, hi
    padded = _pad_impl(ctx, sq, full, "constant", _c(ctx, 0, x)) if size > 1 else sq
    c = src[1]
    acc = None
    for k in range(size):
        part = _take(padded, 1, k, k + c)
        acc = part if acc is None else E(acc, part, mode="ADD")
    den = E(
        _c(ctx, ctx.attr("bias"), x),
        E(acc, _c(ctx, ctx.attr("alpha") / size, x), mode="MUL"),
        mode="ADD",
    )
    return E(x, E(den, _c(ctx, -ctx.attr("beta"), x), mode="POW"), mode="MUL")


def _normalized_parts(ctx, x, axes, eps, center=True):
    """``(y, mean, inv)``: ``y = (x - mean) * inv`` in ``x``'s dtype with
    ``inv = 1 / sqrt(var + eps)``, statistics over ``axes`` (kept), computed in float32
    (``mean`` is None when not centering)."""
    xf = x if np.dtype(x.dtype) == np.float32 else mgb.opr.typecvt(x, np.float32)
    mean, d, v = _moments(xf, axes, center)
    inv = E(E(v, _c(ctx, eps, xf), mode="ADD"), _c(ctx, -0.5, xf), mode="POW")
    y = E(d, inv, mode="MUL")
    y = y if np.dtype(x.dtype) == np.float32 else mgb.opr.typecvt(y, x.dtype)
    return y, mean, inv


def _normalize(ctx, x, axes, eps, center=True):
    """(x - mean) / sqrt(var + eps) over ``axes`` (kept), computed in float32."""
    return _normalized_parts(ctx, x, axes, eps, center)[0]


@converter("InstanceNormalization", 6, attrs={"epsilon": 1e-5})
def _instance_norm(ctx):
    x, scale, bias = ctx.inputs[:3]
    nd = len(static_shape(ctx, x))
    y = _normalize(ctx, x, range(2, nd), ctx.attr("epsilon"))
    return _channel_affine(ctx, y, None, scale, bias, nd)


@converter(
    "GroupNormalization",
    18,
    attrs={"epsilon": 1e-5, "num_groups": None, "stash_type": Attr(1, frozenset({1}))},
)
def _group_norm(ctx):
    x, scale, bias = ctx.inputs[:3]
    src = static_shape(ctx, x)
    g = int(ctx.attr("num_groups"))
    grouped = _reshape(x, (src[0], g, int(np.prod(src[1:])) // g))
    y = _reshape(_normalize(ctx, grouped, [2], ctx.attr("epsilon")), src)
    nd = len(src)
    sc, bi = scale, bias
    if static_shape(ctx, scale)[0] != src[1]:  # opset 18: one scale per group
        rep = src[1] // g
        sc = _reshape(mgb.opr.broadcast(_reshape(scale, (g, 1)), (g, rep)), (src[1],))
        bi = _reshape(mgb.opr.broadcast(_reshape(bias, (g, 1)), (g, rep)), (src[1],))
    return _channel_affine(ctx, y, None, sc, bi, nd)


@converter("RMSNormalization", 23, attrs=_TRAILING_NORM_ATTRS)
def _rms_norm(ctx):
    x, scale = ctx.input(0), ctx.input(1)
    y = _normalize(ctx, x, _trailing_axes(ctx, x), ctx.attr("epsilon"), center=False)
    return E(y, scale, mode="MUL")


@converter("MeanVarianceNormalization", 9, attrs={"axes": (0, 2, 3)})
def _mvn(ctx):
    x = ctx.input(0)
    nd = len(static_shape(ctx, x))
    axes = sorted(_norm_axis(ctx, a, nd) for a in ctx.attr("axes"))
    return _normalize(ctx, x, axes, 1e-9)


@converter("LpNormalization", 1, attrs={"axis": -1, "p": Attr(2, frozenset({1, 2}))})
def _lp_norm(ctx):
    x = ctx.input(0)
    axis = _norm_axis(ctx, ctx.attr("axis"), len(static_shape(ctx, x)))
    if ctx.attr("p") == 1:
        n = mgb.opr.reduce_(E(x, mode="ABS"), "SUM", axis, True)
    else:
        n = E(mgb.opr.reduce_(E(x, x, mode="MUL"), "SUM", axis, True), _c(ctx, 0.5, x), mode="POW")
    # a zero norm gives 0 (as ONNX's reference), not 0/0
    return E(x, E(n, E(n, _c(ctx, 0, n), mode="EQ"), mode="ADD"), mode="TRUE_DIV")


@converter("Hardmax", 1, attrs={"axis": None})
def _hardmax(ctx):
    x, axis, src = _softmax_axis(ctx, ctx.input(0))
    n = static_shape(ctx, x)[axis]
    idx = mgb.opr.argmax(x, axis, True)
    shape = [1] * len(static_shape(ctx, x))
    shape[axis] = n
    hot = E(idx, ctx.imm(np.arange(n, dtype=np.int32).reshape(shape)), mode="EQ")
    return _reshape(mgb.opr.typecvt(hot, x.dtype), src)


@converter("Col2Im", 18, attrs={"dilations": None, "pads": None, "strides": None})
def _col2im(ctx):
    # every kernel offset's column block, spread to its strided output positions, summed
    x = ctx.input(0)
    image = [int(v) for v in ctx.const(1, "image_shape").ravel()]
    kernel = [int(v) for v in ctx.const(2, "block_shape").ravel()]
    nd = len(image)
    dil = list(ctx.attr("dilations") or [1] * nd)
    strides = list(ctx.attr("strides") or [1] * nd)
    pads = list(ctx.attr("pads") or [0] * (2 * nd))
    n, ck, length = static_shape(ctx, x)
    k = int(np.prod(kernel))
    if ck % k:
        raise ctx.fail(f"input channels {ck} are not a multiple of the block size {k}")
    c = ck // k
    full = [image[i] + pads[i] + pads[nd + i] for i in range(nd)]
    blocks = [(full[i] - dil[i] * (kernel[i] - 1) - 1) // strides[i] + 1 for i in range(nd)]
    if int(np.prod(blocks)) != length:
        raise ctx.fail(f"{length} columns do not make the {blocks} blocks of image {image}")
    cols = _reshape(x, [n, c, k] + blocks)
    acc = None
    for j, off in enumerate(itertools.product(*[range(kk) for kk in kernel])):
        part = _reshape(_take(cols, 2, j, j + 1), [n, c] + blocks)
        for i in range(nd):
            axis = 2 + i
            if strides[i] > 1:  # interleave stride - 1 zeros after each element
                shp = static_shape(ctx, part)
                wide = list(shp[: axis + 1]) + [1] + list(shp[axis + 1 :])
                zshape = list(wide)
                zshape[axis + 1] = strides[i] - 1
                zeros = ctx.imm(np.zeros(zshape, np.dtype(x.dtype)))
                part = mgb.opr.concat(_reshape(part, wide), zeros, axis=axis + 1)
                merged = list(shp)
                merged[axis] = shp[axis] * strides[i]
                part = _take(_reshape(part, merged), axis, 0, (blocks[i] - 1) * strides[i] + 1)
            before = off[i] * dil[i]
            after = full[i] - before - ((blocks[i] - 1) * strides[i] + 1)
            pw = [0] * (2 * (nd + 2))
            pw[axis], pw[nd + 2 + axis] = before, after
            if before or after:
                part = _pad_impl(ctx, part, pw, "constant", _c(ctx, 0, x))
        acc = part if acc is None else E(acc, part, mode="ADD")
    for i in range(nd):
        if pads[i] or pads[nd + i]:
            acc = _take(acc, 2 + i, pads[i], pads[i] + image[i])
    return acc


@converter("MaxUnpool", 9, attrs={"kernel_shape": None, "pads": None, "strides": None})
def _max_unpool(ctx):
    # zeros with x written at the (flat) indices MaxPool gave; an output_shape larger than the
    # inferred one pads with zeros at the end of each axis (as onnx's reference)
    x, ind = ctx.input(0), ctx.input(1)
    src = static_shape(ctx, x)
    kernel = list(ctx.attr("kernel_shape"))
    n = len(kernel)
    strides = list(ctx.attr("strides") or [1] * n)
    pads = list(ctx.attr("pads") or [0] * (2 * n))
    inferred = list(src[:2]) + [
        (src[2 + i] - 1) * strides[i] - pads[i] - pads[n + i] + kernel[i] for i in range(n)
    ]
    total = int(np.prod(inferred))
    count = int(np.prod(src))
    flat = _reshape(mgb.opr.typecvt(ind, np.int32), (count,))
    zeros = ctx.imm(np.zeros(total, np.dtype(x.dtype)))
    y = _reshape(mgb.opr.set_advanced_indexing(zeros, _reshape(x, (count,)))[flat], inferred)
    if ctx.has(2):
        shape = [int(v) for v in ctx.const(2, "output_shape").ravel()]
        extra = [s - d for s, d in zip(shape, inferred)]
        if any(e < 0 for e in extra) or len(shape) != len(inferred):
            raise ctx.fail(f"output_shape {shape} is smaller than the unpooled {inferred}")
        if any(extra):
            y = _pad_impl(ctx, y, [0] * len(shape) + extra, "constant", _c(ctx, 0, x))
    return y
