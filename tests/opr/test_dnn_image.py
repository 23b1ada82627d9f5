"""ROIPooling, ROIAlign, WarpPerspective and Resize: forward against naive NumPy loops, shape
inference (also from out-shape vars), gradients and bad inputs."""

import math

import numpy as np
import pytest
from opr_harness import check_grad, check_opr, inputs, make_graph, run

from megbrain.errors import MegBrainError
from megbrain.opr.dnn_image import resize, roi_align, roi_pooling, warp_perspective
from megbrain.opr.grad import grad

F32 = np.float32


def _cround(v: float) -> int:
    return math.floor(v + 0.5) if v >= 0 else math.ceil(v - 0.5)


# ---- ROIPooling ----------------------------------------------------------------------------
def ref_roi_pooling(src, rois, oh, ow, mode, scale):
    """Caffe's ROI pooling with MegDNN's float32 bin edges; also returns MAX's argmax."""
    _, c_n, h_n, w_n = src.shape
    out = np.zeros((len(rois), c_n, oh, ow))
    idx = np.full(out.shape, -1)
    for r, roi in enumerate(rois):
        b = int(roi[0])
        x0, y0, x1, y1 = (_cround(float(F32(v) * F32(scale))) for v in roi[1:])
        bin_h = F32(max(y1 - y0 + 1, 1)) / F32(oh)
        bin_w = F32(max(x1 - x0 + 1, 1)) / F32(ow)
        for i in range(oh):
            hs = min(max(math.floor(F32(i) * bin_h) + y0, 0), h_n)
            he = min(max(math.ceil(F32(i + 1) * bin_h) + y0, 0), h_n)
            for j in range(ow):
                ws = min(max(math.floor(F32(j) * bin_w) + x0, 0), w_n)
                we = min(max(math.ceil(F32(j + 1) * bin_w) + x0, 0), w_n)
                for c in range(c_n):
                    vals = [
                        (src[b, c, y, x], y * w_n + x) for y in range(hs, he) for x in range(ws, we)
                    ]
                    if not vals:
                        continue
                    if mode == "MAX":
                        best = max(vals, key=lambda t: t[0])
                        out[r, c, i, j], idx[r, c, i, j] = best
                    else:
                        out[r, c, i, j] = sum(v for v, _ in vals) / len(vals)
    return out, idx


ROIS = np.array(
    [
        [0, 1, 1, 5, 6],
        [1, 0, 2, 7, 7],
        [1, 6, 5, 2, 3],  # malformed (x1 < x0): pooled as a 1x1 ROI
        [0, 5, 3, 11, 9],  # partly outside the image
        [0, 20, 20, 25, 26],  # fully outside: every bin empty
        [1, 3, 1, 5, 5],  # odd coordinates: scale 0.5 rounds halves away from zero
    ],
    F32,
)


@pytest.mark.parametrize("mode", ["MAX", "AVERAGE"])
@pytest.mark.parametrize(("scale", "out_hw"), [(1.0, (2, 3)), (0.5, (3, 2)), (1.0, (1, 1))])
def test_roi_pooling_matches_numpy(mode, scale, out_hw):
    src = np.random.default_rng(0).standard_normal((2, 3, 8, 9)).astype(F32)
    got = check_opr(
        lambda s, r: roi_pooling(s, r, out_hw, mode=mode, scale=scale),
        lambda s, r: ref_roi_pooling(s, r, *out_hw, mode, scale)[0],
        [src, ROIS],
    )
    assert got[0].shape == (len(ROIS), 3, *out_hw)


def test_roi_pooling_index_output_and_dest_shape_var():
    src = np.random.default_rng(1).standard_normal((2, 2, 8, 9)).astype(F32)
    g = make_graph()
    (s, r, shp), (_, _, hshp) = inputs(g, src, ROIS, np.array([2, 3], np.int32))
    y = roi_pooling(s, r, shp)
    index = y.node.owner.outputs[1]
    assert y.imm_shape == (len(ROIS), 2, 2, 3) and index.dtype == np.int32
    got_y, got_idx = run([y, index], g)
    ref_y, ref_idx = ref_roi_pooling(src, ROIS, 2, 3, "MAX", 1.0)
    np.testing.assert_allclose(got_y, ref_y, rtol=1e-6)
    np.testing.assert_array_equal(got_idx, ref_idx)
    hshp.arr = np.array([4, 1], np.int32)  # the output shape follows the shape var's value
    assert y.imm_shape == (len(ROIS), 2, 4, 1)


@pytest.mark.parametrize("mode", ["MAX", "AVERAGE"])
def test_roi_pooling_grad(mode):
    src = np.random.default_rng(2).standard_normal((2, 2, 6, 7))
    rois = np.array(
        [[0, 1, 1, 4, 5], [1, 0, 2, 6, 5], [1, 3, 3, 1, 1], [0, 2, 0, 3, 3]], np.float64
    )
    check_grad(lambda s, r: roi_pooling(s, r, (2, 2), mode=mode), [src, rois], wrt=[0])


# ---- ROIAlign ------------------------------------------------------------------------------
def _bilinear_zero(img, y, x):
    """Bilinear sample of ``img`` at (y, x); taps outside the image count as 0."""
    h_n, w_n = img.shape
    y0, x0 = math.floor(y), math.floor(x)
    total = 0.0
    for yy, wy in ((y0, 1 - (y - y0)), (y0 + 1, y - y0)):
        for xx, wx in ((x0, 1 - (x - x0)), (x0 + 1, x - x0)):
            if 0 <= yy < h_n and 0 <= xx < w_n:
                total += img[yy, xx] * wy * wx
    return total


def ref_roi_align(src, rois, ph_n, pw_n, sh, sw, mode, ss, off):
    out = np.zeros((len(rois), src.shape[1], ph_n, pw_n))
    for r, roi in enumerate(rois):
        b = int(roi[0])
        x0, y0, x1, y1 = (float(v) * ss - off for v in roi[1:])
        bin_h, bin_w = max(y1 - y0, 0) / ph_n, max(x1 - x0, 0) / pw_n
        for c in range(src.shape[1]):
            for i in range(ph_n):
                for j in range(pw_n):
                    vals = [
                        _bilinear_zero(
                            src[b, c],
                            y0 + bin_h * (i + (hi + 0.5) / sh),
                            x0 + bin_w * (j + (wi + 0.5) / sw),
                        )
                        for hi in range(sh)
                        for wi in range(sw)
                    ]
                    out[r, c, i, j] = max(vals) if mode == "MAX" else sum(vals) / len(vals)
    return out


ALIGN_ROIS = np.array(
    [[0, 1.2, 0.7, 5.5, 6.1], [1, -2, -1, 3, 2.5], [1, 4, 4, 4, 4], [0, 6.3, 2, 12, 9]], F32
)


@pytest.mark.parametrize("mode", ["MAX", "AVERAGE"])
@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"pooled_height": 2, "pooled_width": 3, "spatial_scale": 0.8, "offset": 0.5},
        {"pooled_height": 3, "pooled_width": 2, "sample_height": 3, "sample_width": 1},
    ],
)
def test_roi_align_matches_numpy(mode, kw):
    src = np.random.default_rng(3).standard_normal((2, 3, 7, 8)).astype(F32)
    p = {
        "pooled_height": 1,
        "pooled_width": 1,
        "sample_height": 2,
        "sample_width": 2,
        "spatial_scale": 1.0,
        "offset": 0.0,
        **kw,
    }
    got = check_opr(
        lambda s, r: roi_align(s, r, mode=mode, **kw),
        lambda s, r: ref_roi_align(
            s,
            r,
            p["pooled_height"],
            p["pooled_width"],
            p["sample_height"],
            p["sample_width"],
            mode,
            p["spatial_scale"],
            p["offset"],
        ),
        [src, ALIGN_ROIS],
        rtol=1e-5,
        atol=1e-5,
    )
    assert got[0].shape == (4, 3, p["pooled_height"], p["pooled_width"])


@pytest.mark.parametrize("mode", ["MAX", "AVERAGE"])
def test_roi_align_grad(mode):
    src = np.random.default_rng(4).standard_normal((2, 2, 5, 6))
    rois = ALIGN_ROIS.astype(np.float64)
    check_grad(
        lambda s, r: roi_align(
            s, r, mode=mode, pooled_height=2, pooled_width=2, spatial_scale=0.9, offset=0.3
        ),
        [src, rois],
        wrt=[0],
    )


# ---- WarpPerspective -----------------------------------------------------------------------
def _border(p, n, bmode):
    """MegDNN's get_real_coord, the do-while loop of the reference."""
    if 0 <= p < n:
        return p
    if bmode == "CONSTANT":
        return None
    if bmode == "REPLICATE":
        return 0 if p < 0 else n - 1
    if bmode == "WRAP":
        return p % n
    if n == 1:
        return 0
    while not 0 <= p < n:
        if bmode == "REFLECT":
            p = -p - 1 if p < 0 else 2 * n - 1 - p
        else:  # REFLECT_101
            p = -p if p < 0 else 2 * n - 2 - p
    return p


def ref_warp(src, mat, oh, ow, imode, bmode, bval):
    n_b, c_n, h_n, w_n = src.shape
    out = np.zeros((n_b, c_n, oh, ow))
    for n in range(n_b):
        m = mat[n].astype(np.float64)
        for i in range(oh):
            for j in range(ow):
                d = m[2, 0] * j + m[2, 1] * i + m[2, 2]
                x = (m[0, 0] * j + m[0, 1] * i + m[0, 2]) / d
                y = (m[1, 0] * j + m[1, 1] * i + m[1, 2]) / d
                for c in range(c_n):

                    def at(yy, xx, c=c, n=n):
                        yy, xx = _border(yy, h_n, bmode), _border(xx, w_n, bmode)
                        return bval if yy is None or xx is None else src[n, c, yy, xx]

                    if imode == "NEAREST":
                        out[n, c, i, j] = at(int(np.rint(y)), int(np.rint(x)))
                        continue
                    y0, x0 = math.floor(y), math.floor(x)
                    fy, fx = y - y0, x - x0
                    v = (
                        at(y0, x0) * (1 - fy) * (1 - fx)
                        + at(y0, x0 + 1) * (1 - fy) * fx
                        + at(y0 + 1, x0) * fy * (1 - fx)
                        + at(y0 + 1, x0 + 1) * fy * fx
                    )
                    out[n, c, i, j] = v if math.isfinite(v) or bmode != "CONSTANT" else bval
    return out


def _warp_mats(n, rng):
    """Perspective matrices mapping part of the output outside the source image."""
    base = np.array([[1.1, 0.2, -1.5], [-0.15, 0.9, -0.7], [0.02, -0.01, 1.0]])
    noise = np.array([[0.1, 0.1, 1.0], [0.1, 0.1, 1.0], [0.001, 0.001, 0.01]])
    return base + rng.standard_normal((n, 3, 3)) * noise


BMODES = ["REPLICATE", "REFLECT", "REFLECT_101", "WRAP", "CONSTANT"]


@pytest.mark.parametrize("imode", ["LINEAR", "NEAREST"])
@pytest.mark.parametrize("bmode", BMODES)
def test_warp_perspective_matches_numpy(imode, bmode):
    rng = np.random.default_rng(5)
    src = rng.standard_normal((2, 2, 5, 6)).astype(F32)
    mat = _warp_mats(2, rng).astype(F32)
    got = check_opr(
        lambda s, m: warp_perspective(s, m, (7, 8), imode=imode, bmode=bmode, border_val=2.5),
        lambda s, m: ref_warp(s, m, 7, 8, imode, bmode, 2.5),
        [src, mat],
        rtol=1e-4,
        atol=1e-4,
    )
    assert got[0].shape == (2, 2, 7, 8)


def test_warp_perspective_translation_uint8_and_nhwc():
    src = np.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5).astype(np.uint8)
    mat = np.tile(np.array([[1, 0, 1.5], [0, 1, 1], [0, 0, 1]], F32), (2, 1, 1))
    # x shifts by 1.5: the average of two neighbours, rounded half away from zero
    ref = ((src[:, :, 1:4, 1:4].astype(np.float64) + src[:, :, 1:4, 2:5]) / 2 + 0.5) // 1
    (got,) = check_opr(lambda s, m: warp_perspective(s, m, (3, 3)), lambda s, m: ref, [src, mat])
    assert got.dtype == np.uint8
    nhwc = np.ascontiguousarray(src.transpose(0, 2, 3, 1))
    check_opr(
        lambda s, m: warp_perspective(s, m, (3, 3), format="NHWC"),
        lambda s, m: ref.transpose(0, 2, 3, 1),
        [nhwc, mat],
    )


def test_warp_perspective_out_shape_var():
    rng = np.random.default_rng(6)
    src = rng.standard_normal((1, 2, 4, 4)).astype(F32)
    mat = np.eye(3, dtype=F32)[None]
    g = make_graph()
    (s, m, shp), (_, _, hshp) = inputs(g, src, mat, np.array([3, 2], np.int32))
    y = warp_perspective(s, m, shp)
    assert y.imm_shape == (1, 2, 3, 2)
    np.testing.assert_array_equal(run([y], g)[0], src[:, :, :3, :2])
    hshp.arr = np.array([4, 4], np.int32)
    assert y.imm_shape == (1, 2, 4, 4)
    np.testing.assert_array_equal(run([y], g)[0], src)


@pytest.mark.parametrize("bmode", BMODES)
def test_warp_perspective_grad(bmode):
    rng = np.random.default_rng(7)
    src = rng.standard_normal((2, 2, 4, 5))
    check_grad(
        lambda s, m: warp_perspective(s, m, (5, 6), bmode=bmode, border_val=0.5),
        [src, _warp_mats(2, rng)],
        rtol=1e-3,
        atol=1e-5,
    )


def test_warp_perspective_nhwc_grad():
    rng = np.random.default_rng(8)
    check_grad(
        lambda s, m: warp_perspective(s, m, (3, 4), format="NHWC"),
        [rng.standard_normal((1, 4, 5, 2)), _warp_mats(1, rng)],
        rtol=1e-3,
        atol=1e-5,
    )


# ---- Resize --------------------------------------------------------------------------------
def _resize_taps(o, out_n, in_n, imode):
    scale = F32(out_n) / F32(in_n)
    if imode == "NEAREST":
        return [(min(int(F32(o) / scale), in_n - 1), 1.0)]
    if in_n == 1:
        return [(0, 1.0)]
    a = (o + 0.5) / float(scale) - 0.5
    i0 = math.floor(a)
    a -= i0
    if i0 < 0:
        i0, a = 0, 0.0
    elif i0 + 1 >= in_n:
        i0, a = in_n - 2, 1.0
    return [(i0, 1 - a), (i0 + 1, a)]


def ref_resize(src, oh, ow, imode):
    n_b, c_n, h_n, w_n = src.shape
    out = np.zeros((n_b, c_n, oh, ow))
    for i in range(oh):
        for j in range(ow):
            for hi, wh in _resize_taps(i, oh, h_n, imode):
                for wj, ww in _resize_taps(j, ow, w_n, imode):
                    out[:, :, i, j] += src[:, :, hi, wj] * wh * ww
    return out


@pytest.mark.parametrize("imode", ["LINEAR", "NEAREST"])
@pytest.mark.parametrize(
    ("in_hw", "out_hw"), [((4, 5), (8, 10)), ((7, 9), (3, 4)), ((1, 3), (2, 7)), ((5, 1), (5, 3))]
)
def test_resize_matches_numpy(imode, in_hw, out_hw):
    src = np.random.default_rng(9).standard_normal((2, 3, *in_hw)).astype(F32)
    check_opr(
        lambda s: resize(s, out_hw, imode, format="NCHW"),
        lambda s: ref_resize(s, *out_hw, imode),
        [src],
        atol=1e-5,
    )


def test_resize_default_format_is_nhwc_and_ints_round():
    # 5 -> 3 and 7 -> 3 weigh in thirds: results are ninths, never a rounding tie
    src = np.random.default_rng(10).integers(0, 256, (2, 5, 7, 3)).astype(np.uint8)
    ref = ref_resize(src.transpose(0, 3, 1, 2).astype(np.float64), 3, 3, "LINEAR")
    ref = np.floor(ref + 0.5).transpose(0, 2, 3, 1)
    (got,) = check_opr(lambda s: resize(s, (3, 3)), lambda s: ref, [src])
    assert got.dtype == np.uint8 and got.shape == (2, 3, 3, 3)


@pytest.mark.parametrize("imode", ["LINEAR", "NEAREST"])
@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
def test_resize_grad(imode, fmt):
    src = np.random.default_rng(11).standard_normal((1, 2, 3, 4))
    check_grad(lambda s: resize(s, (5, 3), imode, format=fmt), [src])


# ---- bad inputs ----------------------------------------------------------------------------
def _build(fn, *arrays, **kw):
    g = make_graph()
    xs, _ = inputs(g, *arrays)
    return fn(*xs, **kw)


_IMG = np.zeros((2, 3, 6, 6), F32)
_MAT = np.tile(np.eye(3, dtype=F32), (2, 1, 1))


@pytest.mark.parametrize(
    ("fn", "arrays", "kw", "needle"),
    [
        (
            roi_pooling,
            [_IMG, np.zeros((3, 4), F32)],
            {"dest_shape": (2, 2)},
            "ROIPoolingForward 'bad'.*rois must have shape \\(m, 5\\), got \\{3,4\\}",
        ),
        (
            roi_pooling,
            [_IMG, np.zeros((3, 5), np.float64)],
            {"dest_shape": (2, 2)},
            "rois must have src's dtype float32",
        ),
        (
            roi_pooling,
            [_IMG, np.zeros((3, 5), F32)],
            {"dest_shape": (2, 0)},
            "dest_shape must hold two positive ints",
        ),
        (
            roi_align,
            [_IMG, np.zeros((3, 5), F32)],
            {"format": "NHWC"},
            "ROIAlignForward 'bad'.*format NHWC is not supported",
        ),
        (roi_align, [_IMG, np.zeros((3, 5), F32)], {"sample_height": 0}, "must be positive"),
        (
            warp_perspective,
            [_IMG, _MAT],
            {"out_shape": (4, 4), "imode": "CUBIC"},
            "WarpPerspectiveForward 'bad'.*imode CUBIC is not supported",
        ),
        (
            warp_perspective,
            [_IMG, _MAT],
            {"out_shape": (4, 4), "bmode": "TRANSPARENT"},
            "bmode TRANSPARENT is not supported",
        ),
        (
            warp_perspective,
            [_IMG, _MAT[:1]],
            {"out_shape": (4, 4)},
            "mat must have shape \\(2, 3, 3\\) for src {2,3,6,6}, got {1,3,3}",
        ),
        (
            warp_perspective,
            [_IMG, _MAT],
            {"out_shape": (4, 4, 4)},
            "out_shape must hold two positive ints",
        ),
        (
            resize,
            [_IMG],
            {"out_shape": (4, 4), "imode": "AREA"},
            "ResizeForward 'bad'.*imode AREA is not supported",
        ),
        (resize, [_IMG[0]], {"out_shape": (4, 4)}, "src must be 4-d, got {3,6,6}"),
    ],
)
def test_bad_inputs_raise_naming_operator(fn, arrays, kw, needle):
    with pytest.raises(MegBrainError, match=needle):
        _build(fn, *arrays, name="bad", **kw)


def test_roi_batch_index_out_of_range_raises_at_run():
    g = make_graph()
    (s, r), _ = inputs(g, _IMG, np.array([[5, 0, 0, 2, 2]], F32), value_infer=False)
    y = roi_align(s, r)
    msg = "ROIAlignForward .*roi 0 has batch index 5, src has 2 images"
    with pytest.raises(MegBrainError, match=msg):
        run([y], g)


def test_warp_perspective_nearest_has_no_grad():
    g = make_graph()
    (s, m), _ = inputs(g, _IMG, _MAT)
    y = warp_perspective(s, m, (3, 3), imode="NEAREST")
    (gs,) = grad(y.sum(), s)
    with pytest.raises(MegBrainError, match="no gradient for imode NEAREST"):
        run([gs], g)
