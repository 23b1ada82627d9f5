"""Image kernels in NCHW (MegDNN's ROIPooling, ROIAlign, WarpPerspective and Resize, forward and
backward), bound once to their arrays and run into the given outputs.

Coordinates follow MegDNN's naive kernels, computed in float32 (float64 for float64 operands);
integer images are rounded half away from zero and saturated on store.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

__all__ = [
    "BORDER_MODES",
    "border_coord",
    "bind_roi_pooling",
    "bind_roi_pooling_backward",
    "bind_roi_align",
    "bind_roi_align_backward",
    "bind_warp_perspective",
    "bind_warp_perspective_backward_data",
    "bind_warp_perspective_backward_mat",
    "resize_matrix",
    "bind_resize",
    "bind_resize_backward",
]

#: border modes with a coordinate mapping (TRANSPARENT and ISOLATED have none)
BORDER_MODES = ("REPLICATE", "REFLECT", "REFLECT_101", "WRAP", "CONSTANT")
_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)


def _ct(*arrays: np.ndarray) -> np.dtype:
    """The compute dtype: float64 if any operand is float64, else float32."""
    return _F64 if any(a.dtype == _F64 for a in arrays) else _F32


def _store(out: np.ndarray, val: np.ndarray) -> None:
    """Write ``val`` into ``out``; integers round half away from zero and saturate."""
    if out.dtype.kind in "iu":
        info = np.iinfo(out.dtype)
        val = np.clip(np.trunc(val + np.copysign(0.5, val)), info.min, info.max)
    np.copyto(out, val, casting="unsafe")


def _c_round(x: float) -> int:
    """C's ``round``: half away from zero."""
    return int(math.floor(x + 0.5)) if x >= 0 else int(math.ceil(x - 0.5))


def _batch_index(name: str, roi: np.ndarray, i: int, n: int) -> int:
    b = int(roi[0])
    if not 0 <= b < n:
        raise ValueError(f"{name}: roi {i} has batch index {float(roi[0]):g}, src has {n} images")
    return b


def _scatter(grad: np.ndarray, idx: list, val: list) -> None:
    """``grad.flat[idx] += val`` summed over repeats (``idx``/``val`` are lists of arrays)."""
    if not idx:
        return
    flat = np.bincount(np.concatenate(idx), np.concatenate(val), grad.size)
    _store(grad, flat.reshape(grad.shape))


# ---- ROIPooling ----------------------------------------------------------------------------
def _roi_pool_bins(roi, scale, ph_n, pw_n, h, w, ct):
    """Clipped [start, end) rows and cols of every bin of one ROI (MegDNN's float32 math)."""
    sx, sy, ex, ey = (_c_round(float(ct.type(v) * ct.type(scale))) for v in roi[1:5])
    roi_w, roi_h = max(ex - sx + 1, 1), max(ey - sy + 1, 1)
    bh, bw = np.float32(roi_h) / np.float32(ph_n), np.float32(roi_w) / np.float32(pw_n)

    def edges(nb, size, start, n):
        k = np.arange(nb, dtype=np.float32)
        lo = np.floor(k * size).astype(np.int64) + start
        hi = np.ceil((k + 1) * size).astype(np.int64) + start
        return np.clip(lo, 0, n), np.clip(hi, 0, n)

    return edges(ph_n, bh, sy, h) + edges(pw_n, bw, sx, w)


def bind_roi_pooling(
    src: np.ndarray, rois: np.ndarray, dst: np.ndarray, index: np.ndarray, *, mode: str,
    scale: float,
) -> Callable[[], None]:  # fmt: skip
    """Caffe's ROI pooling: ``dst[r, c]`` pools ``src[rois[r, 0], c]`` over each bin.

    MAX writes the flat ``h*W + w`` position of the maximum into ``index`` (-1 for an empty
    bin, whose value is 0); AVERAGE writes -1 there.
    """
    n, _, h, w = src.shape
    ph_n, pw_n = dst.shape[2:]
    ct = _ct(src, rois)

    def run() -> None:
        index.fill(-1)
        for r in range(rois.shape[0]):
            b = _batch_index("ROIPooling", rois[r], r, n)
            hs, he, ws, we = _roi_pool_bins(rois[r], scale, ph_n, pw_n, h, w, ct)
            for ph in range(ph_n):
                for pw in range(pw_n):
                    region = src[b, :, hs[ph] : he[ph], ws[pw] : we[pw]]
                    if region.size == 0:
                        dst[r, :, ph, pw] = 0
                        continue
                    flat = region.reshape(region.shape[0], -1)
                    if mode == "MAX":
                        am = flat.argmax(axis=1)
                        _store(dst[r, :, ph, pw], flat[np.arange(flat.shape[0]), am])
                        rw = we[pw] - ws[pw]
                        index[r, :, ph, pw] = (hs[ph] + am // rw) * w + ws[pw] + am % rw
                    else:
                        _store(dst[r, :, ph, pw], flat.astype(ct).mean(axis=1))

    return run


def bind_roi_pooling_backward(
    diff: np.ndarray, rois: np.ndarray, index: np.ndarray, grad: np.ndarray, *, mode: str,
    scale: float,
) -> Callable[[], None]:  # fmt: skip
    """The gradient of ROI pooling w.r.t. ``src`` (shape of ``grad``)."""
    n, c, h, w = grad.shape
    ph_n, pw_n = diff.shape[2:]
    ct = _ct(diff, rois)
    chan = np.arange(c)[:, None, None]

    def run() -> None:
        idx, val = [], []
        for r in range(rois.shape[0]):
            b = _batch_index("ROIPoolingBackward", rois[r], r, n)
            if mode == "MAX":
                pos = index[r]
                ok = pos >= 0
                idx.append(((b * c + chan) * (h * w) + pos)[ok])
                val.append(diff[r].astype(_F64)[ok])
                continue
            hs, he, ws, we = _roi_pool_bins(rois[r], scale, ph_n, pw_n, h, w, ct)
            for ph in range(ph_n):
                for pw in range(pw_n):
                    size = (he[ph] - hs[ph]) * (we[pw] - ws[pw])
                    if size == 0:
                        continue
                    hh, ww = np.meshgrid(
                        np.arange(hs[ph], he[ph]), np.arange(ws[pw], we[pw]), indexing="ij"
                    )
                    pos = (b * c + chan) * (h * w) + (hh * w + ww)[None]
                    g = diff[r, :, ph, pw].astype(_F64) / size
                    idx.append(pos.ravel())
                    val.append(np.broadcast_to(g[:, None, None], pos.shape).ravel())
        grad.fill(0)
        _scatter(grad, idx, val)

    return run


# ---- ROIAlign ------------------------------------------------------------------------------
def _align_samples(roi, ss, off, ph_n, pw_n, sh_n, sw_n, ct):
    """Sample centres of one ROI: rows (PH, SH) and cols (PW, SW)."""
    t = ct.type
    sx, sy, ex, ey = (t(v) * t(ss) - t(off) for v in roi[1:5])
    bh = max(ey - sy, t(0)) / t(ph_n)
    bw = max(ex - sx, t(0)) / t(pw_n)

    def centres(start, size, nb, ns):
        rate = t(1) / t(ns)
        k = np.arange(nb, dtype=ct)[:, None] + rate * (np.arange(ns, dtype=ct) + t(0.5))[None]
        return start + size * k

    return centres(sy, bh, ph_n, sh_n), centres(sx, bw, pw_n, sw_n)


def _bilinear_taps(hc: np.ndarray, wc: np.ndarray, h: int, w: int):
    """The four (row, col, weight, inside) taps of bilinear sampling at (hc, wc)."""
    h0, w0 = np.floor(hc), np.floor(wc)
    fh, fw = hc - h0, wc - w0
    h0, w0 = h0.astype(np.int64), w0.astype(np.int64)
    taps = []
    for dh, wh in ((0, 1 - fh), (1, fh)):
        for dw, ww in ((0, 1 - fw), (1, fw)):
            hh, wv = h0 + dh, w0 + dw
            inside = (hh >= 0) & (hh < h) & (wv >= 0) & (wv < w)
            taps.append((np.clip(hh, 0, h - 1), np.clip(wv, 0, w - 1), wh * ww, inside))
    return taps


def bind_roi_align(
    src: np.ndarray, rois: np.ndarray, dst: np.ndarray, index: np.ndarray, *, mode: str,
    spatial_scale: float, offset: float, sample_height: int, sample_width: int,
) -> Callable[[], None]:  # fmt: skip
    """ROIAlign: each bin pools ``sample_height x sample_width`` bilinear samples (zero outside).

    MAX writes the ``h_iter*sample_width + w_iter`` of the chosen sample into ``index``.
    """
    n, c, h, w = src.shape
    ph_n, pw_n = dst.shape[2:]
    sh_n, sw_n = sample_height, sample_width
    ct = _ct(src, rois)

    def run() -> None:
        index.fill(-1)
        for r in range(rois.shape[0]):
            b = _batch_index("ROIAlign", rois[r], r, n)
            hc, wc = _align_samples(rois[r], spatial_scale, offset, ph_n, pw_n, sh_n, sw_n, ct)
            hg, wg = hc[:, :, None, None], wc[None, None]
            img = src[b].astype(ct, copy=False)
            val = 0
            for hh, ww, wt, inside in _bilinear_taps(hg, wg, h, w):
                val = val + img[:, hh, ww] * np.where(inside, wt, 0)
            # (C, PH, SH, PW, SW) -> (C, PH, PW, SH*SW)
            val = val.transpose(0, 1, 3, 2, 4).reshape(c, ph_n, pw_n, sh_n * sw_n)
            if mode == "MAX":
                am = val.argmax(axis=3)
                _store(dst[r], np.take_along_axis(val, am[..., None], 3)[..., 0])
                index[r] = am
            else:
                _store(dst[r], val.sum(axis=3) / (sh_n * sw_n))

    return run


def bind_roi_align_backward(
    diff: np.ndarray, rois: np.ndarray, index: np.ndarray, grad: np.ndarray, *, mode: str,
    spatial_scale: float, offset: float, sample_height: int, sample_width: int,
) -> Callable[[], None]:  # fmt: skip
    """The gradient of ROIAlign w.r.t. ``src`` (shape of ``grad``)."""
    n, c, h, w = grad.shape
    ph_n, pw_n = diff.shape[2:]
    sh_n, sw_n = sample_height, sample_width
    ct = _ct(diff, rois)
    chan = np.arange(c)[:, None, None]
    phi, pwi = np.arange(ph_n)[None, :, None], np.arange(pw_n)[None, None, :]

    def run() -> None:
        idx, val = [], []
        for r in range(rois.shape[0]):
            b = _batch_index("ROIAlignBackward", rois[r], r, n)
            hc, wc = _align_samples(rois[r], spatial_scale, offset, ph_n, pw_n, sh_n, sw_n, ct)
            g = diff[r].astype(_F64)
            if mode == "MAX":  # the chosen sample of each (C, PH, PW)
                am = np.clip(index[r], 0, sh_n * sw_n - 1)
                hs, ws = hc[phi, am // sw_n], wc[pwi, am % sw_n]
                gs, cc = g, chan
            else:  # every sample: (1, PH, PW, SH, SW)
                hs, ws = hc[None, :, None, :, None], wc[None, None, :, None, :]
                gs, cc = (g / (sh_n * sw_n))[..., None, None], chan[..., None, None]
            for hh, ww, wt, inside in _bilinear_taps(hs, ws, h, w):
                pos = (b * c + cc) * (h * w) + hh * w + ww
                v = gs * np.where(inside, wt, 0)
                pos, v = np.broadcast_arrays(pos, v)
                idx.append(pos.ravel())
                val.append(v.ravel())
        grad.fill(0)
        _scatter(grad, idx, val)

    return run


# ---- WarpPerspective -----------------------------------------------------------------------
def border_coord(p: np.ndarray, size: int, bmode: str) -> np.ndarray:
    """MegDNN's ``get_real_coord``: map integer coords into ``[0, size)``; -1 for CONSTANT."""
    p = np.asarray(p, dtype=np.int64)
    inside = (p >= 0) & (p < size)
    if bmode == "CONSTANT":
        return np.where(inside, p, -1)
    if bmode == "REPLICATE":
        return np.clip(p, 0, size - 1)
    if size == 1:
        return np.zeros_like(p)
    if bmode == "WRAP":
        return np.mod(p, size)
    if bmode == "REFLECT":  # fedcba|abcdefgh|hgfedcb
        q = np.mod(p, 2 * size)
        return np.where(q < size, q, 2 * size - 1 - q)
    if bmode == "REFLECT_101":  # gfedcb|abcdefgh|gfedcba
        q = np.mod(p, 2 * size - 2)
        return np.where(q < size, q, 2 * size - 2 - q)
    raise ValueError(f"border mode {bmode} is not supported")


_COORD_LIMIT = float(1 << 40)


def _warp_coords(mat: np.ndarray, oh_n: int, ow_n: int, ct: np.dtype):
    """Source (row, col) of every output pixel: (N, OH, OW) each, plus parts for BackwardMat."""
    m = mat.astype(ct, copy=False)
    ow = np.arange(ow_n, dtype=ct)[None, None, :]
    oh = np.arange(oh_n, dtype=ct)[None, :, None]

    def row(i):
        return m[:, i, 0, None, None] * ow + m[:, i, 1, None, None] * oh + m[:, i, 2, None, None]

    num_w, num_h, den = row(0), row(1), row(2)
    with np.errstate(divide="ignore", invalid="ignore"):
        aw, ah = num_w / den, num_h / den
    return aw, ah, num_w, num_h, den


def _floor_int(a: np.ndarray) -> np.ndarray:
    f = np.floor(np.nan_to_num(a, nan=-_COORD_LIMIT, posinf=_COORD_LIMIT, neginf=-_COORD_LIMIT))
    return np.clip(f, -_COORD_LIMIT, _COORD_LIMIT).astype(np.int64)


def _linear_taps(ah, aw, ih_n, iw_n, bmode):
    """Four taps (row, col, weight, inside) of MegDNN's bilinear warp with border mapping."""
    h0, w0 = _floor_int(ah), _floor_int(aw)
    fh, fw = ah - np.floor(ah), aw - np.floor(aw)
    taps = []
    for dh, wh in ((0, 1 - fh), (1, fh)):
        hh = border_coord(h0 + dh, ih_n, bmode)
        for dw, ww in ((0, 1 - fw), (1, fw)):
            wv = border_coord(w0 + dw, iw_n, bmode)
            inside = (hh >= 0) & (wv >= 0)
            taps.append((np.maximum(hh, 0), np.maximum(wv, 0), wh * ww, inside))
    return taps


def bind_warp_perspective(
    src: np.ndarray, mat: np.ndarray, dst: np.ndarray, *, imode: str, bmode: str, border_val: float,
) -> Callable[[], None]:  # fmt: skip
    """``dst[n, c, oh, ow] = src[n, c, y, x]`` where ``(x, y, 1) ~ mat[n] @ (ow, oh, 1)``.

    LINEAR interpolates the four neighbours (each mapped by ``bmode``; CONSTANT uses
    ``border_val`` outside and for non-finite results); NEAREST rounds the coordinate to the
    nearest pixel (OpenCV's convention).
    """
    n_b, _, ih_n, iw_n = src.shape
    oh_n, ow_n = dst.shape[2:]
    ct = _ct(src, mat)
    bval = ct.type(border_val)

    def run() -> None:
        aw, ah, *_ = _warp_coords(mat, oh_n, ow_n, ct)
        for n in range(n_b):
            img = src[n].astype(ct, copy=False)
            if imode == "NEAREST":
                hh = border_coord(_floor_int(np.rint(ah[n])), ih_n, bmode)
                ww = border_coord(_floor_int(np.rint(aw[n])), iw_n, bmode)
                inside = (hh >= 0) & (ww >= 0)
                val = img[:, np.maximum(hh, 0), np.maximum(ww, 0)]
                _store(dst[n], np.where(inside, val, bval))
                continue
            val = 0
            for hh, ww, wt, inside in _linear_taps(ah[n], aw[n], ih_n, iw_n, bmode):
                val = val + np.where(inside, img[:, hh, ww], bval) * wt
            if bmode == "CONSTANT":
                val = np.where(np.isfinite(val), val, bval)
            _store(dst[n], val)

    return run


def bind_warp_perspective_backward_data(
    mat: np.ndarray, diff: np.ndarray, grad: np.ndarray, *, bmode: str
) -> Callable[[], None]:
    """The gradient of LINEAR warp_perspective w.r.t. ``src`` (shape of ``grad``)."""
    n_b, c, ih_n, iw_n = grad.shape
    oh_n, ow_n = diff.shape[2:]
    ct = _ct(diff, mat)
    chan = np.arange(c)[:, None, None]

    def run() -> None:
        aw, ah, *_ = _warp_coords(mat, oh_n, ow_n, ct)
        idx, val = [], []
        for n in range(n_b):
            g = diff[n].astype(_F64)
            for hh, ww, wt, inside in _linear_taps(ah[n], aw[n], ih_n, iw_n, bmode):
                pos = (n * c + chan) * (ih_n * iw_n) + hh * iw_n + ww
                v = g * np.where(inside, wt, 0)
                pos = np.broadcast_to(pos, v.shape)
                ok = np.broadcast_to(inside, v.shape) & np.isfinite(v)
                idx.append(pos[ok])
                val.append(v[ok])
        grad.fill(0)
        _scatter(grad, idx, val)

    return run


def bind_warp_perspective_backward_mat(
    src: np.ndarray, mat: np.ndarray, diff: np.ndarray, grad: np.ndarray, *, bmode: str,
    border_val: float,
) -> Callable[[], None]:  # fmt: skip
    """The gradient of LINEAR warp_perspective w.r.t. ``mat`` (MegDNN's BackwardMat): each
    output's gradient through the bilinear interpolation's slope at its warped coordinate,
    then through the projective division to the nine matrix entries (non-finite terms
    dropped)."""
    n_b, _, ih_n, iw_n = src.shape
    oh_n, ow_n = diff.shape[2:]
    ct = _ct(src, mat)
    bval = ct.type(border_val)
    ow = np.arange(ow_n, dtype=ct)[None, :]
    oh = np.arange(oh_n, dtype=ct)[:, None]

    def run() -> None:
        aw, ah, num_w, num_h, den = _warp_coords(mat, oh_n, ow_n, ct)
        out = np.zeros((n_b, 9), _F64)
        for n in range(n_b):
            img = src[n].astype(ct, copy=False)
            fh, fw = ah[n] - np.floor(ah[n]), aw[n] - np.floor(aw[n])
            v = [
                np.where(ins, img[:, hh, ww], bval)
                for hh, ww, _, ins in _linear_taps(ah[n], aw[n], ih_n, iw_n, bmode)
            ]
            # v: [v00, v01, v10, v11] (row offset, col offset)
            d_aw = (v[1] - v[0]) * (1 - fh) + (v[3] - v[2]) * fh
            d_ah = (v[2] - v[0]) * (1 - fw) + (v[3] - v[1]) * fw
            h = diff[n].astype(ct, copy=False)
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                d = den[n]
                gw, gh = h * d_aw / d, h * d_ah / d  # (C, OH, OW)
                dd_w, dd_h = -num_w[n] / d, -num_h[n] / d
                parts = [
                    gw * ow,
                    gw * oh,
                    gw,
                    gh * ow,
                    gh * oh,
                    gh,
                    gw * ow * dd_w + gh * ow * dd_h,
                    gw * oh * dd_w + gh * oh * dd_h,
                    gw * dd_w + gh * dd_h,
                ]
            for i, p in enumerate(parts):
                p = np.broadcast_to(p, h.shape)
                out[n, i] = p[np.isfinite(p)].sum()
        _store(grad, out.reshape(grad.shape))

    return run


# ---- Resize --------------------------------------------------------------------------------
def resize_matrix(out_n: int, in_n: int, imode: str) -> np.ndarray:
    """The (out_n, in_n) matrix of MegDNN's 1-d resize (rows sum to 1), in float64."""
    m = np.zeros((out_n, in_n), _F64)
    scale = np.float32(out_n) / np.float32(in_n)
    for o in range(out_n):
        if imode == "NEAREST":
            m[o, min(int(np.float32(o) / scale), in_n - 1)] = 1
            continue
        if in_n == 1:
            m[o, 0] = 1
            continue
        alpha = (np.float32(o) + np.float32(0.5)) / scale - np.float32(0.5)
        i0 = int(np.floor(alpha))
        alpha = float(alpha - np.float32(i0))
        if i0 < 0:
            i0, alpha = 0, 0.0
        elif i0 + 1 >= in_n:
            i0, alpha = in_n - 2, 1.0
        m[o, i0] += 1 - alpha
        m[o, i0 + 1] += alpha
    return m


def bind_resize(src: np.ndarray, dst: np.ndarray, *, imode: str) -> Callable[[], None]:
    """Resize the last two axes of ``src`` (NCHW) to ``dst``'s (LINEAR or NEAREST)."""
    ih_n, iw_n = src.shape[2:]
    oh_n, ow_n = dst.shape[2:]
    if imode == "NEAREST":
        rows = resize_matrix(oh_n, ih_n, imode).argmax(axis=1)
        cols = resize_matrix(ow_n, iw_n, imode).argmax(axis=1)

        def run_nearest() -> None:
            np.copyto(dst, src[:, :, rows[:, None], cols[None, :]])

        return run_nearest
    ct = _ct(src)
    mh = resize_matrix(oh_n, ih_n, imode).astype(ct)
    mwt = resize_matrix(ow_n, iw_n, imode).T.astype(ct).copy()

    def run_linear() -> None:
        _store(dst, np.matmul(np.matmul(mh, src.astype(ct, copy=False)), mwt))

    return run_linear


def bind_resize_backward(diff: np.ndarray, grad: np.ndarray, *, imode: str) -> Callable[[], None]:
    """The gradient of resize w.r.t. its input (shape of ``grad``)."""
    ih_n, iw_n = grad.shape[2:]
    oh_n, ow_n = diff.shape[2:]
    ct = _ct(diff)
    mht = resize_matrix(oh_n, ih_n, imode).T.astype(ct).copy()
    mw = resize_matrix(ow_n, iw_n, imode).astype(ct)

    def run() -> None:
        _store(grad, np.matmul(np.matmul(mht, diff.astype(ct, copy=False)), mw))

    return run
