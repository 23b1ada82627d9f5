"""Integer references of MegDNN's quantized arithmetic (its naive kernels), written apart from
megbrain's kernels so that the operators can be checked against them bit for bit.

Everything follows MegDNN's ``dtype.h`` and naive kernels: dequantize is the stored integer
converted to float32 minus the zero point, times the float32 scale; quantize divides by the
scale in float32, rounds half away from zero (C ``roundf``), adds the zero point and
saturates with ``fmin(fmax(qmin, v), qmax)`` (NaN gives qmin; QuantizedS32's top is the
largest float32 below 2**31); convolutions accumulate int8 products exactly in int32.
"""

from __future__ import annotations

import numpy as np

F32 = np.dtype(np.float32)

#: MegDNN name -> (storage, qmin, qmax as float32)
_RANGES = {
    "QuantizedS8": (np.int8, -128.0, 127.0),
    "Quantized8Asymm": (np.uint8, 0.0, 255.0),
    "QuantizedS32": (np.int32, -2147483648.0, 2147483520.0),
    "QuantizedS16": (np.int16, -32768.0, 32767.0),
}


def qinfo(dt: np.dtype) -> tuple[str, np.float32, int]:
    """(MegDNN name, float32 scale, zero point) of a quantized numpy dtype."""
    meta = dt.metadata["mgb_dtype"]
    return meta["name"], np.float32(meta["scale"]), int(meta.get("zero_point", 0))


def roundf(v: np.ndarray) -> np.ndarray:
    """C ``roundf`` of float32 values: half away from zero, exact (computed in float64)."""
    v64 = np.asarray(v, F32).astype(np.float64)
    t = np.trunc(v64)
    up = np.abs(v64 - t) >= 0.5
    return np.where(up, t + np.sign(v64), t).astype(F32)


def dequantize(q: np.ndarray) -> np.ndarray:
    """MegDNN's ``dequantize``: ``(float32(q) - zero_point) * scale`` in float32."""
    _, scale, zp = qinfo(q.dtype)
    v = np.asarray(q).view(np.dtype(q.dtype.str)).astype(F32)
    if zp:
        v = (v - np.float32(zp)).astype(F32)
    return (v * scale).astype(F32)


def quantize(x: np.ndarray, dt: np.dtype) -> np.ndarray:
    """MegDNN's ``quantize`` of float32 ``x`` into the quantized dtype ``dt``."""
    name, scale, zp = qinfo(dt)
    storage, lo, hi = _RANGES[name]
    with np.errstate(all="ignore"):
        v = roundf((np.asarray(x, F32) / scale).astype(F32))
        if zp:
            v = (v + np.float32(zp)).astype(F32)
        v = np.fmin(np.fmax(np.float32(lo), v), np.float32(hi))
    return v.astype(np.int64).astype(storage).view(dt)


def random_q(rng: np.random.Generator, shape, dt: np.dtype) -> np.ndarray:
    """Random stored values of the quantized dtype ``dt`` (QuantizedS32: within +-5000)."""
    name = qinfo(dt)[0]
    lo, hi = {"QuantizedS8": (-128, 128), "Quantized8Asymm": (0, 256)}.get(name, (-5000, 5000))
    return rng.integers(lo, hi, shape).astype(dt.str).view(dt)


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    """Equal quantized arrays: the same dtype parameters and the same stored integers."""
    assert got.dtype.metadata == want.dtype.metadata
    np.testing.assert_array_equal(got.view(got.dtype.str), want.view(want.dtype.str))


def ints(q: np.ndarray) -> np.ndarray:
    """The stored integers of a quantized array, as int64."""
    return np.asarray(q).view(np.dtype(q.dtype.str)).astype(np.int64)


def wrap_i32(v: np.ndarray) -> np.ndarray:
    """Two's complement wrap of integers to int32 (C's int32 arithmetic on x86)."""
    return ((np.asarray(v, np.int64) + 2**31) % 2**32 - 2**31).astype(np.int32)


def conv2d_int(src, filt, *, stride=(1, 1), pad=(0, 0), dilate=(1, 1), group=False,
               flip=False) -> np.ndarray:  # fmt: skip
    """The exact int32 NCHW convolution of quantized ``src`` with a dense (OC, IC, FH, FW)
    or grouped (G, OCg, ICg, FH, FW) quantized filter, zero points subtracted first (MegDNN's
    StrategyFwd), out-of-image taps skipped."""
    _, _, zs = qinfo(src.dtype)
    _, _, zf = qinfo(filt.dtype)
    x = ints(src) - zs
    w = ints(filt) - zf
    if not group:
        w = w[None]
    if flip:
        w = w[..., ::-1, ::-1]
    n, c, h, wd = x.shape
    g, ocg, icg, fh, fw = w.shape
    assert c == g * icg
    (sh, sw), (ph, pw), (dh, dw) = stride, pad, dilate
    oh = (h + 2 * ph - dh * (fh - 1) - 1) // sh + 1
    ow = (wd + 2 * pw - dw * (fw - 1) - 1) // sw + 1
    xp = np.zeros((n, c, h + 2 * ph, wd + 2 * pw), np.int64)
    xp[:, :, ph : ph + h, pw : pw + wd] = x
    out = np.zeros((n, g, ocg, oh, ow), np.int64)
    xg = xp.reshape(n, g, icg, *xp.shape[2:])
    for a in range(fh):
        for b in range(fw):
            win = xg[:, :, :, a * dh : a * dh + sh * (oh - 1) + 1 : sh,
                     b * dw : b * dw + sw * (ow - 1) + 1 : sw]  # fmt: skip
            out += np.einsum("ngihw,goi->ngohw", win, w[:, :, :, a, b])
    return wrap_i32(out.reshape(n, g * ocg, oh, ow))


def relu(x: np.ndarray) -> np.ndarray:
    """MegDNN's float RELU: ``x <= 0 ? 0 : x``."""
    return np.where(x <= 0, np.float32(0), x).astype(F32)


def h_swish(x: np.ndarray) -> np.ndarray:
    """MegDNN's float H_SWISH: ``x * min(max(x + 3, 0), 6) * (1 / 6)`` in float32."""
    t = np.minimum(np.maximum((x + np.float32(3)).astype(F32), np.float32(0)), np.float32(6))
    return ((x * t).astype(F32) * np.float32(1 / 6)).astype(F32)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """MegDNN's float SIGMOID: ``1 / (exp(-x) + 1)`` in float32."""
    with np.errstate(over="ignore"):
        return (np.float32(1) / (np.exp(-x).astype(F32) + np.float32(1))).astype(F32)


ACTS = {"IDENTITY": lambda x: x, "RELU": relu, "H_SWISH": h_swish, "SIGMOID": sigmoid}


def conv_bias(src, filt, bias, z, out_dtype, mode="IDENTITY", **conv) -> np.ndarray:
    """MegDNN's naive quantized ConvBias: ``conv + bias`` in int32 (the result read with the
    output's scale when the output is QuantizedS32, else with the bias's), then, with a
    ``z``, both dequantized and added in float32, the activation in float32 and a quantize
    to the output; without one, the quantized activation (dequantize, act, quantize) or,
    for IDENTITY, a requantize when the output is not the int32 intermediate."""
    acc = wrap_i32(conv2d_int(src, filt, **conv).astype(np.int64) + ints(bias))
    out_name = qinfo(out_dtype)[0]
    sfb_dtype = out_dtype if out_name == "QuantizedS32" else bias.dtype
    sfb = acc.view(sfb_dtype)
    if z is not None:
        res = (dequantize(sfb) + dequantize(z)).astype(F32)
        return quantize(ACTS[mode](res), out_dtype)
    if mode == "IDENTITY":
        return sfb if sfb_dtype is out_dtype else quantize(dequantize(sfb), out_dtype)
    return quantize(ACTS[mode](dequantize(sfb)), out_dtype)


def elemwise_q(fn, inputs, out_dtype) -> np.ndarray:
    """MegDNN's quantized ElemwiseMultiType mode: ``quantize(fn(dequantize(inputs...)))``."""
    return quantize(fn(*[dequantize(x) for x in inputs]), out_dtype)


def pool2d_int(src, mode, window, stride, pad) -> np.ndarray:
    """MegDNN's naive pooling of a QuantizedS8 / Quantized8Asymm NCHW ``src``: MAX of the
    stored values (padding never fed); the averages sum the stored values in int32 and give
    ``roundf(float32(sum) / float32(count))``: AVERAGE counts the whole window (a
    Quantized8Asymm window's padding adds its zero point), AVERAGE_COUNT_EXCLUDE_PADDING the
    in-image taps."""
    _, _, zp = qinfo(src.dtype)
    x = ints(src)
    n, c, h, w = x.shape
    (fh, fw), (sh, sw), (ph, pw) = window, stride, pad
    oh = (h + 2 * ph - fh) // sh + 1
    ow = (w + 2 * pw - fw) // sw + 1
    out = np.zeros((n, c, oh, ow), np.int64)
    for r in range(oh):
        for q in range(ow):
            h0, w0 = r * sh - ph, q * sw - pw
            hs, he = max(h0, 0), min(h0 + fh, h)
            ws, we = max(w0, 0), min(w0 + fw, w)
            win = x[:, :, hs:he, ws:we]
            fed = (he - hs) * (we - ws)
            if mode == "MAX":
                out[:, :, r, q] = win.max(axis=(2, 3))
                continue
            s = win.sum(axis=(2, 3))
            cnt = fed
            if mode == "AVERAGE":
                cnt = fh * fw
                s = s + (cnt - fed) * zp
            out[:, :, r, q] = roundf((s.astype(F32) / np.float32(cnt)).astype(F32))
    storage, lo, hi = _RANGES[qinfo(src.dtype)[0]]
    return np.clip(out, lo, hi).astype(storage).view(src.dtype)
