"""Exporters of the neural-network family: convolutions (2-d and 3-d, ConvBias,
deconvolution as ConvTranspose), pooling, BatchNorm in inference mode, LRN, the matrix
products and Resize."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from ..dtype import is_quantize
from . import export_quant
from .export_base import INT64_MIN, REFUSED, Writer, exports, static_shape
from .export_elemwise import emit_mode

_ACT = {"IDENTITY": None, "RELU": "RELU", "SIGMOID": "SIGMOID", "H_SWISH": "H_SWISH"}


def _geometry(w: Writer, op, nsp: int) -> dict:
    p = op.params
    names = ("d", "h", "w")[3 - nsp :]
    fmt = p["format"]
    if fmt not in ("NCHW", "NCDHW"):
        raise w.error(f"format {fmt} has no ONNX form (ONNX convolution is channel-first)")
    pads = [int(p["pad_" + n]) for n in names]
    return dict(
        pads=pads * 2,
        strides=[int(p["stride_" + n]) for n in names],
        dilations=[int(p["dilate_" + n]) for n in names],
    )


def _filter(w: Writer, op, name: str, var, nsp: int) -> tuple[str, int]:
    """The ONNX weight of a megbrain filter: groups folded into axis 0, flipped for the
    CONVOLUTION mode; returns (name, group)."""
    p = op.params
    group = 1
    if p["sparse"] == "GROUP":
        ws = static_shape(w, var, "grouped filter")
        group = ws[0]
        shape = w.const(np.asarray([ws[0] * ws[1]] + ws[2:], np.int64), "shape")
        name = w.node("Reshape", [name, shape])
    if p["mode"] == "CONVOLUTION":  # a true convolution: cross-correlate with the flipped filter
        axes = list(range(2, 2 + nsp))
        name = w.node(
            "Slice",
            [
                name,
                w.const(np.full(nsp, -1, np.int64), "starts"),
                w.const(np.full(nsp, INT64_MIN, np.int64), "ends"),
                w.const(np.asarray(axes, np.int64), "axes"),
                w.const(np.full(nsp, -1, np.int64), "steps"),
            ],
        )
    return name, group


def _check_compute(w, op):
    if op.params.get("data_type", "FLOAT") != "FLOAT":
        raise w.error(f"data_type {op.params['data_type']} has no ONNX form")


def _conv_parts(w, op, ins, k):
    """``(nsp, geometry, weight, group)`` of a (3-d) convolution whose filter is input ``k``."""
    nsp = 3 if op.type.startswith("Convolution3D") else 2
    _check_compute(w, op)
    geo = _geometry(w, op, nsp)
    return (nsp, geo, *_filter(w, op, ins[k], op.inputs[k], nsp))


@exports("ConvolutionForward", "Convolution3DForward")
def _conv(w, op, ins):
    _, geo, weight, group = _conv_parts(w, op, ins, 1)
    return w.node("Conv", [ins[0], weight], group=group, **geo)


@exports("ConvBiasForward")
def _conv_bias(w, op, ins):
    geo = _geometry(w, op, 2)
    weight, group = _filter(w, op, ins[1], op.inputs[1], 2)
    if is_quantize(op.inputs[0].dtype):
        return export_quant.conv_bias(w, op, ins, geo, weight, group)
    bias_shape = static_shape(w, op.inputs[2], "bias")
    out_shape = static_shape(w, op.outputs[0], "output")
    if bias_shape == [1, out_shape[1], 1, 1]:
        b = w.node("Reshape", [ins[2], w.const(np.array([-1], np.int64), "shape")])
        y = w.node("Conv", [ins[0], weight, b], group=group, **geo)
    else:
        y = w.node("Add", [w.node("Conv", [ins[0], weight], group=group, **geo), ins[2]])
    if len(ins) == 4:  # z, added after the bias as the operator does
        y = w.node("Add", [y, ins[3]])
    act = _ACT[op.params["nonlineMode"]]
    return y if act is None else emit_mode(w, act, [y], op.outputs[0].dtype)


@exports("ConvolutionBackwardData", "Convolution3DBackwardData")
def _deconv(w, op, ins):
    nsp, geo, weight, group = _conv_parts(w, op, ins, 0)
    diff = static_shape(w, op.inputs[1], "deconvolution input")
    filt = static_shape(w, op.inputs[0], "filter")
    out = static_shape(w, op.outputs[0], "deconvolution output")
    ksp = filt[-nsp:]
    extra = []
    for k in range(nsp):
        full = (
            (diff[2 + k] - 1) * geo["strides"][k]
            - 2 * geo["pads"][k]
            + geo["dilations"][k] * (ksp[k] - 1)
            + 1
        )
        extra.append(out[2 + k] - full)
    if any(e < 0 or e >= max(s, d) for e, s, d in zip(extra, geo["strides"], geo["dilations"])):
        raise w.error(f"output shape {out} is not reachable by ConvTranspose from {diff}")
    kw = dict(geo)
    if any(extra):
        kw["output_padding"] = extra
    return w.node("ConvTranspose", [ins[1], weight], group=group, **kw)


@exports("PoolingForward")
def _pool(w, op, ins):
    p = op.params
    if p["format"] != "NCHW":
        raise w.error(f"pooling format {p['format']} has no ONNX form")
    kw = dict(
        kernel_shape=[int(p["window_h"]), int(p["window_w"])],
        pads=[int(p["pad_h"]), int(p["pad_w"])] * 2,
        strides=[int(p["stride_h"]), int(p["stride_w"])],
    )
    if is_quantize(op.inputs[0].dtype):
        return export_quant.pooling(w, op, ins, kw)
    if p["mode"] == "MAX":
        return w.node("MaxPool", [ins[0]], **kw)
    include = 1 if p["mode"] == "AVERAGE" else 0
    return w.node("AveragePool", [ins[0]], count_include_pad=include, **kw)


@exports("BatchNormForward")
def _batch_norm(w, op, ins):
    p = op.params
    if p["fwd_mode"] != "INFERENCE" or len(op.inputs) != 5:
        raise w.error(
            "a TRAINING-mode BatchNorm normalizes with batch statistics and updates its "
            "running statistics in place; export the inference graph (model.eval())"
        )
    dt = np.dtype(op.outputs[-1].dtype)
    eps = float(p["epsilon"])
    x, scale, bias, mean, var = (ins[k] for k in range(5))
    inv = w.node(
        "Reciprocal",
        [w.node("Sqrt", [w.node("Add", [var, w.const(np.asarray(eps, dt), "eps")])])],
    )
    if p["param_dim"] == "DIM_1C11":
        flat = w.const(np.array([-1], np.int64), "shape")
        y = w.node(
            "BatchNormalization",
            [x] + [w.node("Reshape", [t, flat]) for t in (scale, bias, mean, var)],
            epsilon=eps,
        )
    else:
        y = w.node("Mul", [w.node("Sub", [x, mean]), w.node("Mul", [inv, scale])])
        y = w.node("Add", [y, bias])
    # outputs: running_mean, running_var (empty in INFERENCE), save_mean, save_inv_var, y
    return [None, None, mean, inv, y]


@exports("LRNForward")
def _lrn(w, op, ins):
    p = op.params
    n = int(p["n"])
    return w.node(
        "LRN",
        [ins[0]],
        size=n,
        alpha=float(p["alpha"]) * n,
        beta=float(p["beta"]),
        bias=float(p["k"]),
    )


def _matmul_operand(w, op, k, name, transpose):
    if not transpose:
        return name
    nd = len(static_shape(w, op.inputs[k], "matmul operand"))
    return w.node("Transpose", [name], perm=list(range(nd - 2)) + [nd - 1, nd - 2])


@exports("MatrixMul", "BatchedMatrixMul")
def _matmul(w, op, ins):
    p = op.params
    if p.get("format", "DEFAULT") != "DEFAULT":
        raise w.error(f"matmul format {p['format']} has no ONNX form")
    a = _matmul_operand(w, op, 0, ins[0], p.get("transposeA"))
    b = _matmul_operand(w, op, 1, ins[1], p.get("transposeB"))
    if is_quantize(op.inputs[0].dtype):
        return export_quant.matmul(w, op, a, b)
    return w.node("MatMul", [a, b])


@exports("Dot")
def _dot(w, op, ins):
    return w.reduce("ReduceSum", w.node("Mul", [ins[0], ins[1]]), [0], keepdims=1)


@exports("ResizeForward")
def _resize(w, op, ins):
    p = op.params
    if p["imode"] not in ("LINEAR", "NEAREST"):
        raise w.error(f"resize mode {p['imode']} has no exact ONNX form")
    if p["format"] not in ("NCHW", "NHWC"):
        raise w.error(f"resize format {p['format']} has no ONNX form")
    nhwc = p["format"] == "NHWC"
    x = w.node("Transpose", [ins[0]], perm=[0, 3, 1, 2]) if nhwc else ins[0]
    lead = w.node(
        "Slice",
        [
            w.node("Shape", [x]),
            w.const(np.array([0], np.int64), "starts"),
            w.const(np.array([2], np.int64), "ends"),
        ],
    )
    sizes = w.node("Concat", [lead, w.i64(op.inputs[1])], axis=0)
    if p["imode"] == "LINEAR":
        kw = dict(mode="linear", coordinate_transformation_mode="half_pixel")
    else:
        kw = dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    y = w.node("Resize", [x, "", "", sizes], **kw)
    return w.node("Transpose", [y], perm=[0, 2, 3, 1]) if nhwc else y


@exports("LocalForward", "GroupLocalForward")
def _local(w, op, ins):
    """Untied weights: the patches come from a grouped Conv with one-hot filters (exact: one
    product by 1 per output), then one batched MatMul per group and output position."""
    p = op.params
    if p["mode"] != "CROSS_CORRELATION":
        raise w.error(f"local convolution mode {p['mode']} has no ONNX form")
    filt = static_shape(w, op.inputs[1], "local filter")
    g, oh, ow, icg, fh, fw, ocg = filt if op.type == "GroupLocalForward" else [1, *filt]
    dt = np.dtype(op.outputs[0].dtype)
    k = icg * fh * fw
    eye = np.zeros((g * icg * fh * fw, 1, fh, fw), dt)
    for c in range(g * icg):
        for i in range(fh):
            for j in range(fw):
                eye[c * fh * fw + i * fw + j, 0, i, j] = 1
    patches = w.node(
        "Conv",
        [ins[0], w.const(eye, "patch_filter")],
        group=g * icg,
        pads=[int(p["pad_h"]), int(p["pad_w"])] * 2,
        strides=[int(p["stride_h"]), int(p["stride_w"])],
    )  # (N, G*K, OH, OW), channel = (group, ic, fh, fw)
    pt = w.node("Reshape", [patches, w.const(np.array([0, g, k, oh * ow], np.int64), "shape")])
    pt = w.node("Transpose", [pt], perm=[1, 3, 0, 2])  # (G, OH*OW, N, K)
    wt = w.node("Reshape", [ins[1], w.const(np.array([g, oh * ow, k, ocg], np.int64), "shape")])
    y = w.node("MatMul", [pt, wt])  # (G, OH*OW, N, OCg)
    y = w.node("Transpose", [y], perm=[2, 0, 3, 1])  # (N, G, OCg, OH*OW)
    return w.node("Reshape", [y, w.const(np.array([0, g * ocg, oh, ow], np.int64), "shape")])


_GRID_PADDING = {"REPLICATE": "border", "CONSTANT": "zeros", "REFLECT_101": "reflection"}


@exports("WarpPerspectiveForward")
def _warp_perspective(w, op, ins):
    """GridSample (align_corners: pixel centres) over the grid ``mat @ (ow, oh, 1)``.

    MegDNN maps each of the four taps through the border mode; with align_corners GridSample
    clamps (border) or reflects about the edge pixels (reflection) the coordinate first, which
    gives the same taps for REPLICATE and REFLECT_101; CONSTANT samples ``src - border_val``
    with zero padding and adds ``border_val`` back. The other border modes, opsets before 16
    and one-pixel sources take the explicit taps (:func:`_warp_taps`)."""
    p = op.params
    if p["format"] != "NCHW" or p["imode"] not in ("LINEAR", "NEAREST"):
        raise w.error(f"warp {p['format']}/{p['imode']} has no ONNX form")
    src = static_shape(w, op.inputs[0], "warp source")
    out = static_shape(w, op.outputs[0], "warp output")
    ih, iw, (oh, ow) = src[2], src[3], out[2:]
    if p["bmode"] not in _GRID_PADDING or w.opset < 16 or ih < 2 or iw < 2:
        return _warp_taps(w, op, ins, src, out)
    w.bakes_shape(ins[0], "the source size normalizing the sampling grid", axes=(2, 3))
    dt = np.dtype(op.outputs[0].dtype)
    ys, xs = np.meshgrid(np.arange(oh), np.arange(ow), indexing="ij")
    pix = np.stack([xs.ravel(), ys.ravel(), np.ones(oh * ow)]).astype(dt)  # (3, OH*OW)
    r = w.node("MatMul", [ins[1], w.const(pix, "pixels")])  # (N, 3, OH*OW)

    def row(k):
        return w.node(
            "Slice",
            [r, w.const(np.array([k], np.int64), "starts"),
             w.const(np.array([k + 1], np.int64), "ends"), w.const(np.array([1], np.int64))],
        )  # fmt: skip

    den = row(2)
    gx = w.node("Mul", [w.node("Div", [row(0), den]), w.const(np.asarray(2 / (iw - 1), dt))])
    gy = w.node("Mul", [w.node("Div", [row(1), den]), w.const(np.asarray(2 / (ih - 1), dt))])
    one = w.const(np.asarray(1, dt), "one")
    grid = w.node("Concat", [w.node("Sub", [gx, one]), w.node("Sub", [gy, one])], axis=1)
    grid = w.node("Transpose", [grid], perm=[0, 2, 1])
    grid = w.node("Reshape", [grid, w.const(np.array([0, oh, ow, 2], np.int64), "shape")])
    linear = "linear" if w.opset >= 20 else "bilinear"
    mode = linear if p["imode"] == "LINEAR" else "nearest"
    x = ins[0]
    bval = float(p["border_val"])
    constant = p["bmode"] == "CONSTANT" and bval != 0
    if constant:
        bv = w.const(np.asarray(bval, dt), "border_val")
        x = w.node("Sub", [x, bv])
    y = w.node(
        "GridSample",
        [x, grid],
        mode=mode,
        padding_mode=_GRID_PADDING[p["bmode"]],
        align_corners=1,
    )
    return w.node("Add", [y, bv]) if constant else y


@exports("ROIPoolingForward")
def _roi_pooling(w, op, ins):
    """MAX: ONNX MaxRoiPool, which is Caffe's ROI pooling as MegDNN's (rounded ROI corners,
    floor/ceil bin edges clipped to the image, 0 for an empty bin); the argmax output has no
    ONNX value."""
    p = op.params
    if p["mode"] != "MAX":
        raise w.error(f"ROI pooling mode {p['mode']} has no ONNX form (MaxRoiPool only)")
    out = static_shape(w, op.outputs[0], "ROI pooling output")
    y = w.node(
        "MaxRoiPool", [ins[0], ins[1]], pooled_shape=out[2:], spatial_scale=float(p["scale"])
    )
    return [y, None]


@exports("ROIAlignForward")
def _roi_align(w, op, ins):
    """MegDNN's ROIAlign composed exactly (ONNX RoiAlign clamps border samples and pools MAX
    differently): per ROI the SH x SW sample centres of every bin, four bilinear taps each
    gathered by GatherND from the NHWC image (taps outside weigh 0), then the mean or max
    over a bin's samples (and MAX's argmax ``h_iter * SW + w_iter``)."""
    p = op.params
    if p["format"] != "NCHW":
        raise w.error(f"ROIAlign format {p['format']} has no ONNX form")
    src = static_shape(w, op.inputs[0], "ROIAlign source")
    _, c, h, wd = src
    ph, pw = int(p["pooled_height"]), int(p["pooled_width"])
    sh, sw = int(p["sample_height"]), int(p["sample_width"])
    w.bakes_shape(ins[0], "the image size bounding the bilinear taps", axes=(2, 3))
    f32 = np.float32
    i64 = np.int64

    def col(k):
        return w.node(
            "Slice",
            [ins[1], w.const(np.array([k], i64)), w.const(np.array([k + 1], i64)),
             w.const(np.array([1], i64))],
        )  # fmt: skip (R, 1)

    def const(v, dt=f32):
        return w.const(np.asarray(v, dt))

    ss, off = const(p["spatial_scale"]), const(p["offset"])
    sx, sy, ex, ey = (w.node("Sub", [w.node("Mul", [col(k), ss]), off]) for k in (1, 2, 3, 4))

    def centres(start, end, nb, ns):
        size = w.node("Div", [w.node("Max", [w.node("Sub", [end, start]), const(0)]),
                              const(nb)])  # fmt: skip
        k = np.arange(nb, dtype=f32)[:, None] + f32(1) / f32(ns) * (
            np.arange(ns, dtype=f32) + f32(0.5)
        )
        return w.node("Add", [start, w.node("Mul", [size, const(k.reshape(1, -1))])])

    hc = w.unsqueeze(centres(sy, ey, ph, sh), [2])  # (R, PH*SH, 1)
    wc = w.unsqueeze(centres(sx, ex, pw, sw), [1])  # (R, 1, PW*SW)
    batch = w.node("Cast", [col(0)], to=TensorProto.INT64)  # (R, 1): truncates, as int()
    batch = w.unsqueeze(batch, [2])  # (R, 1, 1)
    img = w.node("Transpose", [ins[0]], perm=[0, 2, 3, 1])  # (N, H, W, C)
    full = w.const(np.array([1, ph * sh, pw * sw], i64), "shape")  # broadcast: R stays

    def taps(coord, n):
        lo = w.node("Floor", [coord])
        frac = w.node("Sub", [coord, lo])
        out = []
        for d, wt in ((0, w.node("Sub", [const(1), frac])), (1, frac)):
            at = w.node("Add", [lo, const(d)]) if d else lo
            inside = w.node("And", [w.node("GreaterOrEqual", [at, const(0)]),
                                    w.node("Less", [at, const(n)])])  # fmt: skip
            wt = w.node("Where", [inside, wt, const(0)])
            idx = w.node("Cast", [w.node("Clip", [at, const(0), const(n - 1)])],
                         to=TensorProto.INT64)  # fmt: skip
            out.append((idx, wt))
        return out

    val = None
    for hh, wh in taps(hc, h):
        for ww, wwt in taps(wc, wd):
            parts = [w.unsqueeze(w.node("Expand", [t, full]), [3]) for t in (batch, hh, ww)]
            g = w.node("GatherND", [img, w.node("Concat", parts, axis=3)])  # (R, PHS, PWS, C)
            wt = w.unsqueeze(w.node("Mul", [wh, wwt]), [3])
            term = w.node("Mul", [g, wt])
            val = term if val is None else w.node("Add", [val, term])
    # (R, PH, SH, PW, SW, C) -> (R, C, PH, PW, SH*SW)
    val = w.node("Reshape", [val, w.const(np.array([0, ph, sh, pw, sw, c], i64), "shape")])
    val = w.node("Transpose", [val], perm=[0, 5, 1, 3, 2, 4])
    val = w.node("Reshape", [val, w.const(np.array([0, c, ph, pw, sh * sw], i64), "shape")])
    if p["mode"] == "MAX":
        y = w.reduce("ReduceMax", val, [4], keepdims=0)
        am = w.node("ArgMax", [val], axis=4, keepdims=0)
        return [y, w.node("Cast", [am], to=TensorProto.INT32)]
    return [w.reduce("ReduceMean", val, [4], keepdims=0), None]


def _warp_coords(w, ins, dt, oh, ow):
    """(x, y) source coordinates (N, OH*OW) each of every output pixel: mat @ (ow, oh, 1)."""
    ys, xs = np.meshgrid(np.arange(oh), np.arange(ow), indexing="ij")
    pix = np.stack([xs.ravel(), ys.ravel(), np.ones(oh * ow)]).astype(dt)  # (3, OH*OW)
    r = w.node("MatMul", [ins[1], w.const(pix, "pixels")])  # (N, 3, OH*OW)

    def row(k):
        i64 = np.int64
        return w.node(
            "Slice",
            [r, w.const(np.array([k], i64)), w.const(np.array([k + 1], i64)),
             w.const(np.array([1], i64))],
        )  # fmt: skip

    den = row(2)
    return (w.squeeze(w.node("Div", [row(k), den]), [1]) for k in (0, 1))


def _border_index(w, at, n: int, bmode: str):
    """MegDNN's border mapping of int64 tap coords ``at``: (index in [0, n), inside or None)."""
    i64 = np.int64

    def k(v):
        return w.const(np.asarray(v, i64))

    inside = None
    if bmode == "CONSTANT":
        inside = w.node("And", [w.node("GreaterOrEqual", [at, k(0)]), w.node("Less", [at, k(n)])])
        idx = w.node("Clip", [at, k(0), k(n - 1)])
    elif bmode == "REPLICATE" or n == 1:
        idx = w.node("Clip", [at, k(0), k(n - 1)])
    elif bmode == "WRAP":
        idx = w.node("Mod", [at, k(n)], fmod=0)
    else:
        period = 2 * n if bmode == "REFLECT" else 2 * n - 2
        q = w.node("Mod", [at, k(period)], fmod=0)
        back = k(period - 1 if bmode == "REFLECT" else period)
        idx = w.node("Where", [w.node("Less", [q, k(n)]), q, w.node("Sub", [back, q])])
    return idx, inside


def _warp_taps(w, op, ins, src, out):
    """MegDNN's warp tap by tap: the (x, y) of every output pixel, its nearest or four
    bilinear taps mapped by the border mode, gathered by GatherND from the NHWC image."""
    p = op.params
    bmode = p["bmode"]
    if bmode not in ("REPLICATE", "CONSTANT", "REFLECT", "REFLECT_101", "WRAP"):
        raise w.error(f"border mode {bmode} has no ONNX form")
    w.bakes_shape(ins[0], "the image size the border mode maps taps into", axes=(2, 3))
    dt = np.dtype(op.outputs[0].dtype)
    _, c, ih, iw = src
    oh, ow = out[2:]
    ax, ay = _warp_coords(w, ins, dt, oh, ow)
    img = w.node("Transpose", [ins[0]], perm=[0, 2, 3, 1])  # (N, H, W, C)
    i64 = np.int64
    n = w.node("Slice", [w.node("Shape", [ax]), w.const(np.array([0], i64)),
                         w.const(np.array([1], i64))])  # fmt: skip
    rows = w.node(
        "Range", [w.const(np.zeros((), i64)), w.squeeze(n, [0]), w.const(np.ones((), i64))]
    )
    batch = w.node("Expand", [w.unsqueeze(rows, [1]), w.node("Shape", [ax])])  # (N, L)
    bval = w.const(np.asarray(float(p["border_val"]), dt), "border_val")
    one = w.const(np.asarray(1, dt))

    def taps(coord, n):
        if p["imode"] == "NEAREST":
            lo = w.node("Round", [coord])  # rint: half to even, as MegDNN's NEAREST
            return [(lo, None)]
        lo = w.node("Floor", [coord])
        frac = w.node("Sub", [coord, lo])
        return [(lo, w.node("Sub", [one, frac])), (w.node("Add", [lo, one]), frac)]

    val = None
    for hy, wy in taps(ay, ih):
        yi, yin = _border_index(w, w.node("Cast", [hy], to=TensorProto.INT64), ih, bmode)
        for hx, wx in taps(ax, iw):
            xi, xin = _border_index(w, w.node("Cast", [hx], to=TensorProto.INT64), iw, bmode)
            idx = w.node("Concat", [w.unsqueeze(t, [2]) for t in (batch, yi, xi)], axis=2)
            g = w.node("GatherND", [img, idx])  # (N, L, C)
            if yin is not None:
                inside = w.unsqueeze(w.node("And", [yin, xin]), [2])
                g = w.node("Where", [inside, g, bval])
            if wy is not None:
                g = w.node("Mul", [g, w.unsqueeze(w.node("Mul", [wy, wx]), [2])])
            val = g if val is None else w.node("Add", [val, g])
    val = w.node("Transpose", [val], perm=[0, 2, 1])
    return w.node("Reshape", [val, w.const(np.array([0, c, oh, ow], np.int64), "shape")])


_GRAD = (
    "a gradient operator (training graphs have no ONNX form); export the forward graph"
)
for _t in (
    "BatchNormBackward",
    "BatchNormTailBackward",
    "ConvolutionBackwardFilter",
    "Convolution3DBackwardFilter",
    "PoolingBackward",
    "LRNBackward",
    "ResizeBackward",
    "ROIAlignBackward",
    "ROIPoolingBackward",
    "WarpPerspectiveBackwardData",
    "WarpPerspectiveBackwardMat",
    "LocalBackwardData",
    "LocalBackwardFilter",
    "GroupLocalBackwardData",
    "GroupLocalBackwardFilter",
):
    REFUSED[_t] = _GRAD
REFUSED.update(
    {
        "MatrixInverse": "the default ONNX domain has no matrix inverse",
        "SVD": "the default ONNX domain has no singular value decomposition",
        "ConvBiasTail": "a ConvBias and its tail fused when a function is compiled; export "
        "the graph's vars (its ConvBias and Elemwise operators) instead",
        "PoolingEndPad": "a Pooling and the end padding of its source fused when a function "
        "is compiled; export the graph's vars (its Concat and Pooling operators) instead",
        "ChannelShuffleConcat": "a Concat and the channel shuffle after it fused when a "
        "function is compiled; export the graph's vars (its Concat, Reshape and Dimshuffle "
        "operators) instead",
        "ConvBiasGated": "a ConvBias and its squeeze-and-excitation multiply fused when a "
        "function is compiled; export the graph's vars (its Elemwise and ConvBias operators) "
        "instead",
        "ConvBiasPreact": "a ConvBias and the scale, shift and ReLU of its source fused when "
        "a function is compiled; export the graph's vars (its Elemwise and ConvBias operators) "
        "instead",
        "BatchedMatrixMulTail": "a BatchedMatrixMul and its bias and elementwise tail fused "
        "when a function is compiled; export the graph's vars (its BatchedMatrixMul and "
        "Elemwise operators) instead",
        "LayerNormLast": "a layer normalization's reductions and elementwise operators fused "
        "when a function is compiled; export the graph's vars (its Reduce and Elemwise "
        "operators) instead",
        "BatchNormTail": "a training BatchNorm and its ReLU or ReLU6 fused when a function is "
        "compiled; export the graph's vars (its BatchNorm and Elemwise operators) instead",
        "SeparableConvBias": "a depthwise ConvBias and the 1x1 ConvBias reading it fused when "
        "a function is compiled; export the graph's vars (its two ConvBias operators) instead",
    }
)
