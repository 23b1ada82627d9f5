"""Resize and Upsample, separable per axis: each resized axis gathers its source rows at
indices computed at load and sums them with load-time weights (nearest: one tap, linear: two,
cubic: four, antialiased downsampling: the kernel stretched by 1 / scale), which is ONNX's
interpolation written out; tf_crop_and_resize rows sampling outside the input get zero
weights plus the extrapolation value."""

from __future__ import annotations

import itertools

import numpy as np

import megbrain as mgb

from .ops_elemwise import round_half_even
from .ops_tensor import _reshape, static_shape
from .registry import Attr, converter

E = mgb.opr.elemwise

_COORD_MODES = frozenset(
    {
        "half_pixel",
        "half_pixel_symmetric",
        "pytorch_half_pixel",
        "align_corners",
        "asymmetric",
        "tf_crop_and_resize",
    }
)
_NEAREST = frozenset({"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"})


def _source_coords(mode, out_len, in_len, scale, roi=(0.0, 1.0)):
    o = np.arange(out_len, dtype=np.float64)
    if mode == "tf_crop_and_resize":
        # the region [roi0, roi1] (fractions of in_len - 1) sampled at out_len points; ONNX
        # uses the unrounded output length, in_len * scale
        start, end = roi
        if in_len * scale == 1:
            x = np.full(out_len, (end - start) * (in_len - 1) / 2)
        else:
            x = o * (end - start) * (in_len - 1) / (in_len * scale - 1)
        return x + start * (in_len - 1)
    if mode == "half_pixel":
        return (o + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (o + 0.5) / scale - 0.5 if out_len > 1 else np.zeros(out_len)
    if mode == "align_corners":
        # ONNX uses the unrounded output length, in_len * scale
        return o * (in_len - 1) / (in_len * scale - 1) if out_len > 1 else np.zeros(out_len)
    if mode == "half_pixel_symmetric":
        adjustment = out_len / (scale * in_len)
        offset = in_len / 2 * (1 - adjustment)
        return offset + (o + 0.5) / scale - 0.5
    return o / scale  # asymmetric


def _nearest_index(x, mode):
    if mode == "round_prefer_floor":
        return np.where(x - np.floor(x) == 0.5, np.floor(x), np.round(x))
    if mode == "round_prefer_ceil":
        return np.where(x - np.floor(x) == 0.5, np.ceil(x), np.round(x))
    if mode == "floor":
        return np.floor(x)
    return np.ceil(x)


def _cubic_weights(t, a):
    def w(d):
        d = np.abs(d)
        return np.where(
            d <= 1,
            ((a + 2) * d - (a + 3)) * d * d + 1,
            np.where(d < 2, ((a * d - 5 * a) * d + 8 * a) * d - 4 * a, 0.0),
        )

    return np.stack([w(t + 1), w(t), w(1 - t), w(2 - t)], axis=1)


def _antialias_coeffs(interp, ratio, scale, a):
    """ONNX's antialiased kernels: when downsampling (scale < 1) the linear (triangle) or
    cubic kernel is stretched by 1 / scale and normalized to sum 1.  Tap k weighs source
    index ``x - ratio + start + k`` (``ratio`` in (0, 1]); returns (start, weights)."""
    s = min(scale, 1.0)
    if interp == "linear":
        start = int(np.floor(-1 / s) + 1)
        d = (np.arange(start, 2 - start)[None, :] - ratio[:, None]) * s
        w = np.clip(1 - np.abs(d), 0, 1)
    else:
        start = int(np.floor(-2 / s) + 1)
        d = np.abs((np.arange(start, 2 - start)[None, :] - ratio[:, None]) * s)
        w = np.where(
            d <= 1,
            ((a + 2) * d - (a + 3)) * d * d + 1,
            np.where(d < 2, ((a * d - 5 * a) * d + 8 * a) * d - 4 * a, 0.0),
        )
    return start, w / w.sum(axis=1, keepdims=True)


def _taps(ctx, in_len, out_len, scale, roi=(0.0, 1.0)):
    """(indices, weights, extrapolated) for one axis: indices and weights of shape
    (out_len, taps), and the rows (out_len,) that take the extrapolation value (rows whose
    tf_crop_and_resize coordinate falls outside the input), or None."""
    x = _source_coords(ctx.coord_mode, out_len, in_len, scale, roi)
    extra = None
    if ctx.coord_mode == "tf_crop_and_resize":
        extra = (x < 0) | (x > in_len - 1)
        extra = extra if extra.any() else None
    if ctx.antialias and ctx.interp != "nearest":
        ratio = np.where(x == np.floor(x), 1.0, x - np.floor(x))
        start, w = _antialias_coeffs(ctx.interp, ratio, scale, ctx.cubic_a)
        idx = (x - ratio)[:, None] + start + np.arange(w.shape[1])[None, :]
        if ctx.exclude_outside:
            w = np.where((idx < 0) | (idx > in_len - 1), 0.0, w)
            total = w.sum(axis=1, keepdims=True)
            w = w / np.where(total == 0, 1.0, total)
    elif ctx.interp == "nearest":
        idx = _nearest_index(x, ctx.nearest_mode)[:, None]
        w = np.ones_like(idx)
    elif ctx.interp == "linear":
        x0 = np.floor(x)
        t = x - x0
        idx = np.stack([x0, x0 + 1], axis=1)
        w = np.stack([1 - t, t], axis=1)
    else:
        x0 = np.floor(x)
        idx = np.stack([x0 - 1, x0, x0 + 1, x0 + 2], axis=1)
        w = _cubic_weights(x - x0, ctx.cubic_a)
        if ctx.exclude_outside:
            w = np.where((idx < 0) | (idx > in_len - 1), 0.0, w)
            w = w / w.sum(axis=1, keepdims=True)
    if extra is not None:
        w = np.where(extra[:, None], 0.0, w)
    idx = np.clip(np.round(idx), 0, in_len - 1).astype(np.int32)
    return idx, w, extra


def _resize_axis(ctx, x, axis, out_len, scale, roi=(0.0, 1.0)):
    shp = static_shape(ctx, x)
    idx, w, extra = _taps(ctx, shp[axis], out_len, scale, roi)
    dt = np.dtype(x.dtype)
    bshape = [1] * len(shp)
    bshape[axis] = out_len
    weighted = ctx.interp != "nearest" or extra is not None
    out = None
    for k in range(idx.shape[1]):
        part = mgb.opr.advanced_indexing(x)[(slice(None),) * axis + (ctx.imm(idx[:, k]),)]
        if weighted:
            part = E(part, ctx.imm(w[:, k].reshape(bshape).astype(dt)), mode="MUL")
        out = part if out is None else E(out, part, mode="ADD")
    if extra is not None:
        fill = np.where(extra, ctx.extrapolation_value, 0.0).reshape(bshape).astype(dt)
        out = E(out, ctx.imm(fill), mode="ADD")
    return out


def _resize(ctx, x, scales, sizes, axes, roi=None):
    src = static_shape(ctx, x)
    nd = len(src)
    axes = list(range(nd)) if axes is None else [a + nd if a < 0 else a for a in axes]
    full_scale = [1.0] * nd
    full_roi = [(0.0, 1.0)] * nd
    if roi is not None and ctx.coord_mode == "tf_crop_and_resize":
        if len(roi) != 2 * len(axes):
            raise ctx.fail(f"roi has {len(roi)} values, expected {2 * len(axes)}")
        for i, a in enumerate(axes):
            full_roi[a] = (float(roi[i]), float(roi[len(axes) + i]))
    out = list(src)
    if sizes is not None:
        policy = getattr(ctx, "aspect", "stretch")
        sz = [int(s) for s in sizes]
        if policy != "stretch":
            ratios = [sz[i] / src[a] for i, a in enumerate(axes)]
            r = min(ratios) if policy == "not_larger" else max(ratios)
            sz = [int(np.floor(r * src[a] + 0.5)) for a in axes]
            for a in axes:
                full_scale[a] = r
        else:
            for i, a in enumerate(axes):
                full_scale[a] = sz[i] / src[a]
        for i, a in enumerate(axes):
            out[a] = sz[i]
    else:
        for i, a in enumerate(axes):
            full_scale[a] = float(scales[i])
            out[a] = int(np.floor(src[a] * float(scales[i])))
    y = x
    for a in range(nd):
        if out[a] == src[a] and full_scale[a] == 1.0 and full_roi[a] == (0.0, 1.0):
            continue
        y = _resize_axis(ctx, y, a, out[a], full_scale[a], full_roi[a])
    return y if y is not x else mgb.opr.identity(x)


def _setup(
    ctx, interp, coord, nearest="floor", cubic_a=-0.75, exclude=0, antialias=0, extrapolation=0.0
):
    weighted = interp != "nearest" or coord == "tf_crop_and_resize"
    if np.dtype(ctx.input(0).dtype).kind in "iub" and weighted:
        raise ctx.fail(f"{interp} resize ({coord}) of {ctx.input(0).dtype} is not supported")
    ctx.interp, ctx.coord_mode, ctx.nearest_mode = interp, coord, nearest
    ctx.cubic_a, ctx.exclude_outside = cubic_a, exclude
    ctx.antialias, ctx.extrapolation_value = antialias, extrapolation


@converter(
    "Upsample",
    7,
    9,
    attrs={"mode": Attr("nearest", frozenset({"nearest", "linear"})), "scales": None},
)
def _upsample(ctx):
    _setup(ctx, ctx.attr("mode"), "asymmetric")
    scales = ctx.attr("scales") if ctx.opset < 9 else ctx.const(1, "scales").ravel()
    return _resize(ctx, ctx.input(0), list(scales), None, None)


@converter("Resize", 10, 10, attrs={"mode": Attr("nearest", frozenset({"nearest", "linear"}))})
def _resize10(ctx):
    _setup(ctx, ctx.attr("mode"), "asymmetric")
    return _resize(ctx, ctx.input(0), list(ctx.const(1, "scales").ravel()), None, None)


@converter(
    "Resize",
    11,
    attrs={
        "mode": Attr("nearest", frozenset({"nearest", "linear", "cubic"})),
        "coordinate_transformation_mode": Attr("half_pixel", _COORD_MODES),
        "nearest_mode": Attr("round_prefer_floor", _NEAREST),
        "cubic_coeff_a": -0.75,
        "exclude_outside": Attr(0, frozenset({0, 1})),
        "extrapolation_value": 0.0,
        "antialias": Attr(0, frozenset({0, 1})),
        "axes": None,
        "keep_aspect_ratio_policy": Attr(
            "stretch", frozenset({"stretch", "not_larger", "not_smaller"})
        ),
    },
)
def _resize11(ctx):
    _setup(
        ctx,
        ctx.attr("mode"),
        ctx.attr("coordinate_transformation_mode"),
        ctx.attr("nearest_mode"),
        ctx.attr("cubic_coeff_a"),
        ctx.attr("exclude_outside"),
        ctx.attr("antialias"),
        ctx.attr("extrapolation_value"),
    )
    ctx.aspect = ctx.attr("keep_aspect_ratio_policy")
    roi = None
    if ctx.coord_mode == "tf_crop_and_resize":
        if not ctx.has(1):
            raise ctx.fail("tf_crop_and_resize needs the roi input")
        roi = ctx.const(1, "roi").ravel().tolist()
    scales = ctx.const(2, "scales").ravel() if ctx.has(2) else np.zeros(0)
    sizes = ctx.const(3, "sizes").ravel() if ctx.has(3) else None
    axes = ctx.attr("axes")
    axes = None if axes is None else list(axes)
    if sizes is not None and len(sizes):
        return _resize(ctx, ctx.input(0), None, list(sizes), axes, roi)
    return _resize(ctx, ctx.input(0), list(scales), None, axes, roi)


# ---------------------------------------------------------------------------- GridSample
class _GridSampler:
    """GridSample written out: per spatial axis, the grid's coordinate is denormalized, moved
    inside by the padding mode, split into taps (nearest: 1, linear: 2, cubic: 4) with their
    weights; the taps of all axes are gathered from the input and summed."""

    def __init__(self, ctx, align, padding):
        self.ctx, self.align, self.padding = ctx, align, padding

    def c(self, v):
        return self.ctx.imm(np.asarray(v, np.float32))

    def sel(self, cond, a, b):
        """where(cond, a, b) for float 0/1 ``cond``, as selects (no 0 * inf)."""
        keep_b = E(self.c(1), cond, mode="SUB")
        return E(E(cond, a, mode="SWITCH_GT0"), E(keep_b, b, mode="SWITCH_GT0"), mode="ADD")

    def cmp(self, a, b, mode):
        return mgb.opr.typecvt(E(a, b, mode=mode), np.float32)

    def reflect(self, x, lo, hi):
        rng = hi - lo
        if rng <= 0:
            return E(E(x, self.c(0), mode="MUL"), self.c(lo), mode="ADD")
        below, above = self.cmp(x, self.c(lo), "LT"), self.cmp(self.c(hi), x, "LT")
        dx = self.sel(below, E(self.c(lo), x, mode="SUB"), E(x, self.c(hi), mode="SUB"))
        n = E(E(dx, self.c(rng), mode="TRUE_DIV"), mode="FLOOR")
        r = E(dx, E(n, self.c(rng), mode="MUL"), mode="SUB")
        odd = E(E(n, self.c(2), mode="MOD"), mode="ABS")
        low_side = self.sel(odd, E(self.c(hi), r, mode="SUB"), E(self.c(lo), r, mode="ADD"))
        high_side = self.sel(odd, E(self.c(lo), r, mode="ADD"), E(self.c(hi), r, mode="SUB"))
        return self.sel(below, low_side, self.sel(above, high_side, x))

    def coord(self, g, d, mode):
        """The source coordinate of grid values ``g`` along an axis of length ``d``."""
        if self.align:
            x = E(E(g, self.c(1), mode="ADD"), self.c((d - 1) / 2.0), mode="MUL")
            lo, hi = 0.0, d - 1.0
        else:
            x = E(E(E(g, self.c(1), mode="ADD"), self.c(d), mode="MUL"), self.c(1), mode="SUB")
            x = E(x, self.c(0.5), mode="MUL")
            lo, hi = -0.5, d - 0.5
        if mode == "nearest":
            x = round_half_even(self.ctx, x)
        if self.padding == "border":
            out = E(self.cmp(x, self.c(lo), "LT"), self.cmp(self.c(hi), x, "LT"), mode="ADD")
            clamped = E(E(x, self.c(0), mode="MAX"), self.c(d - 1), mode="MIN")
            x = self.sel(out, clamped, x)
        elif self.padding == "reflection":
            x = self.reflect(x, lo, hi)
        return x, lo, hi

    def fetch_index(self, i, d, lo, hi):
        """(index to gather, validity or None) of integral tap positions ``i``."""
        if self.padding == "zeros":
            valid = E(self.cmp(self.c(-1), i, "LT"), self.cmp(i, self.c(d), "LT"), mode="MUL")
            return E(E(i, self.c(0), mode="MAX"), self.c(d - 1), mode="MIN"), valid
        if self.padding == "reflection":
            i = self.reflect(i, lo, hi)
            return E(E(E(i, self.c(0), mode="MAX"), self.c(d - 1), mode="MIN"), mode="FLOOR"), None
        return E(E(i, self.c(0), mode="MAX"), self.c(d - 1), mode="MIN"), None

    def taps(self, x, mode):
        """[(position, weight)] of the taps at coordinates ``x``."""
        if mode == "nearest":
            t = E(E(x, mode="ABS"), mode="FLOOR")
            return [(E(t, _sign(self, x), mode="MUL"), None)]  # truncation toward zero
        x0 = E(x, mode="FLOOR")
        t = E(x, x0, mode="SUB")
        if mode == "linear":
            return [(x0, E(self.c(1), t, mode="SUB")), (E(x0, self.c(1), mode="ADD"), t)]
        a = -0.75

        def w(d):  # Keys' cubic kernel, |d| <= 2
            d = E(d, mode="ABS")
            d2 = E(d, d, mode="MUL")
            d3 = E(d2, d, mode="MUL")
            near = E(
                E(E(d3, self.c(a + 2), mode="MUL"), E(d2, self.c(a + 3), mode="MUL"), mode="SUB"),
                self.c(1),
                mode="ADD",
            )
            far = E(
                E(E(d3, self.c(a), mode="MUL"), E(d2, self.c(5 * a), mode="MUL"), mode="SUB"),
                E(E(d, self.c(8 * a), mode="MUL"), self.c(4 * a), mode="SUB"),
                mode="ADD",
            )
            return self.sel(self.cmp(d, self.c(1), "LEQ"), near, far)

        out = []
        for k in (-1, 0, 1, 2):
            out.append((E(x0, self.c(k), mode="ADD"), w(E(t, self.c(-k), mode="ADD"))))
        return out


def _sign(s, x):
    return E(s.cmp(s.c(0), x, "LEQ"), s.cmp(x, s.c(0), "LT"), mode="SUB")


@converter(
    "GridSample",
    16,
    attrs={
        "align_corners": Attr(0, frozenset({0, 1})),
        "mode": Attr("linear", frozenset({"linear", "bilinear", "nearest", "cubic", "bicubic"})),
        "padding_mode": Attr("zeros", frozenset({"zeros", "border", "reflection"})),
    },
)
def _grid_sample(ctx):
    x, grid = ctx.input(0), ctx.input(1)
    xs, gs = static_shape(ctx, x), static_shape(ctx, grid, "grid")
    nd = len(xs) - 2
    if nd < 1 or len(gs) != nd + 2 or gs[0] != xs[0] or gs[-1] != nd:
        raise ctx.fail(f"grid of shape {gs} does not fit input {xs}")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(ctx.attr("mode"), ctx.attr("mode"))
    if np.dtype(x.dtype).kind not in "f":
        raise ctx.fail(f"GridSample of {x.dtype} is not supported")
    n, c, spatial, out = xs[0], xs[1], xs[2:], gs[1:-1]
    s = _GridSampler(ctx, bool(ctx.attr("align_corners")), ctx.attr("padding_mode"))
    g = grid if np.dtype(grid.dtype) == np.float32 else mgb.opr.typecvt(grid, np.float32)
    axes = []  # per spatial axis (outermost first): its taps as (index, weight)
    for k in range(nd):
        comp = nd - 1 - k  # the grid lists (x, y, z): innermost axis first
        gk = _reshape(g[(slice(None),) * (nd + 1) + (slice(comp, comp + 1),)], (n,) + out)
        coord, lo, hi = s.coord(gk, spatial[k], mode)
        taps = []
        for pos, w in s.taps(coord, mode):
            idx, valid = s.fetch_index(pos, spatial[k], lo, hi)
            if valid is not None:
                w = valid if w is None else E(w, valid, mode="MUL")
            taps.append((idx, w))
        axes.append(taps)
    strides = [int(np.prod(spatial[k + 1 :])) for k in range(nd)]
    size = int(np.prod(spatial))
    xf = x if np.dtype(x.dtype) == np.float32 else mgb.opr.typecvt(x, np.float32)
    rows = _reshape(mgb.opr.dimshuffle(xf, [0] + list(range(2, nd + 2)) + [1]), (n * size, c))
    base = ctx.imm((np.arange(n) * size).reshape((n,) + (1,) * nd).astype(np.float32))
    m = int(n * np.prod(out))
    acc = None
    for combo in itertools.product(*axes):
        flat, weight = base, None
        for k, (idx, w) in enumerate(combo):
            flat = E(flat, E(idx, ctx.imm(np.float32(strides[k])), mode="MUL"), mode="ADD")
            if w is not None:
                weight = w if weight is None else E(weight, w, mode="MUL")
        flat = _reshape(mgb.opr.typecvt(flat, np.int32), (m,))
        part = _reshape(mgb.opr.advanced_indexing(rows)[flat], (n,) + out + (c,))
        if weight is not None:
            part = E(part, _reshape(weight, (n,) + out + (1,)), mode="MUL")
        acc = part if acc is None else E(acc, part, mode="ADD")
    y = mgb.opr.dimshuffle(acc, [0, nd + 1] + list(range(1, nd + 1)))
    return y if np.dtype(x.dtype) == np.float32 else mgb.opr.typecvt(y, x.dtype)


@converter("AffineGrid", 20, attrs={"align_corners": Attr(0, frozenset({0, 1}))})
def _affine_grid(ctx):
    # grid = theta @ [x, y, (z,) 1] over the normalized base grid (a constant)
    theta = ctx.input(0)
    size = [int(s) for s in ctx.const(1, "size").ravel()]
    n, nd = size[0], len(size) - 2
    spatial = size[2:]
    if nd not in (2, 3) or static_shape(ctx, theta, "theta") != (n, nd, nd + 1):
        raise ctx.fail(f"theta {static_shape(ctx, theta)} does not fit size {size}")
    lines = []
    for d in spatial:
        if ctx.attr("align_corners"):
            lines.append(np.linspace(-1.0, 1.0, d) if d > 1 else np.zeros(1))
        else:
            lines.append((np.arange(d) * 2.0 + 1.0) / d - 1.0)
    mesh = np.meshgrid(*lines, indexing="ij")  # outermost axis first
    pts = int(np.prod(spatial))
    comps = [m.reshape(pts) for m in mesh[::-1]] + [np.ones(pts)]  # x, y, (z), 1
    base = ctx.imm(np.stack(comps).astype(np.float32)[None])  # (1, nd + 1, P)
    t = theta if np.dtype(theta.dtype) == np.float32 else mgb.opr.typecvt(theta, np.float32)
    g = mgb.opr.batched_matrix_mul(t, mgb.opr.broadcast(base, (n, nd + 1, pts)))
    g = _reshape(mgb.opr.dimshuffle(g, [0, 2, 1]), [n] + spatial + [nd])
    return g if np.dtype(theta.dtype) == np.float32 else mgb.opr.typecvt(g, theta.dtype)
