"""The compiled BatchNorm TRAINING loops (float32 NCHW, statistics per channel) against the
float64 reference, and their backward against finite differences."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megbrain.kernels import dnn_norm


def ref_forward(x, scale, bias, eps):
    """float64 TRAINING batch norm per channel: (y, mean, inv_std, biased var)."""
    x = x.astype(np.float64)
    m = x.mean(axis=(0, 2, 3), keepdims=True)
    v = x.var(axis=(0, 2, 3), keepdims=True)
    inv = 1 / np.sqrt(v + eps)
    return (x - m) * inv * scale + bias, m, inv, v


def ref_backward(x, dy, scale, eps):
    """float64 gradients (d_scale, d_bias, dx) of ``sum(dy * bn(x))``."""
    x, dy = x.astype(np.float64), dy.astype(np.float64)
    _, m, inv, _ = ref_forward(x, scale, 0.0, eps)
    n = x.size // x.shape[1]
    xhat = (x - m) * inv
    d_bias = dy.sum(axis=(0, 2, 3), keepdims=True)
    d_scale = (dy * xhat).sum(axis=(0, 2, 3), keepdims=True)
    dx = scale * inv * (dy - d_bias / n - xhat * d_scale / n)
    return d_scale, d_bias, dx


def _case(n, c, h, w, offset, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, c, h, w)) * 2 + offset).astype(np.float32)
    p = (1, c, 1, 1)
    scale = rng.uniform(0.5, 2, p).astype(np.float32)
    bias = rng.standard_normal(p).astype(np.float32)
    return rng, x, scale, bias


def _forward(x, scale, bias, mean, var, eps, avg):
    p = scale.shape
    outs = [np.empty(p, np.float32) for _ in range(4)] + [np.empty_like(x)]
    assert dnn_norm._channel_views(x, (scale, bias, outs[2], outs[3]), (outs[4],)) is not None
    dnn_norm.bind_bn_forward(
        x, scale, bias, mean, var, *outs, training=True, epsilon=eps, avg_factor=avg
    )()
    return outs


shapes = dict(
    n=st.integers(1, 4),
    c=st.integers(1, 12),
    h=st.integers(1, 9),
    w=st.integers(1, 9),
    offset=st.sampled_from([0.0, 30.0, -1000.0]),
)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(**shapes, eps=st.sampled_from([1e-5, 1e-2]), avg=st.sampled_from([0.1, 1.0]))
def test_forward_matches_float64(n, c, h, w, offset, eps, avg):
    if n * h * w < 2:
        return  # the unbiased variance of one value is not finite
    rng, x, scale, bias = _case(n, c, h, w, offset, n * 1000 + c * 100 + h * 10 + w)
    mean = rng.standard_normal(scale.shape).astype(np.float32)
    var = rng.uniform(0.5, 2, scale.shape).astype(np.float32)
    out_mean, out_var, save_mean, save_inv, y = _forward(x, scale, bias, mean, var, eps, avg)
    ry, rm, rinv, rv = ref_forward(x, scale, bias, eps)
    cnt = x.size // c
    np.testing.assert_allclose(y, ry, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(save_mean, rm, rtol=1e-5, atol=1e-5 * (1 + abs(offset)))
    np.testing.assert_allclose(save_inv, rinv, rtol=1e-4)
    np.testing.assert_allclose(out_mean, mean * (1 - avg) + rm * avg, rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(
        out_var, var * (1 - avg) + rv * cnt / (cnt - 1) * avg, rtol=1e-4, atol=1e-5
    )


def test_forward_in_place_stats_and_output_over_input():
    """The running statistics update their own memory; ``y`` may be ``x``'s memory."""
    _, x, scale, bias = _case(3, 5, 4, 6, 2.0, 7)
    ry, rm, _, rv = ref_forward(x, scale, bias, 1e-5)
    mean, var = np.zeros(scale.shape, np.float32), np.ones(scale.shape, np.float32)
    outs = [mean, var, np.empty_like(mean), np.empty_like(mean), x]
    dnn_norm.bind_bn_forward(
        x, scale, bias, mean, var, *outs, training=True, epsilon=1e-5, avg_factor=0.5
    )()
    np.testing.assert_allclose(x, ry, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(mean, rm * 0.5, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(var, 0.5 + rv * 72 / 71 * 0.5, rtol=1e-5)


def _backward(x, dy, save_mean, save_inv, scale):
    p = scale.shape
    d_scale, d_bias, dx = np.empty(p, np.float32), np.empty(p, np.float32), np.empty_like(x)
    params = (save_mean, save_inv, scale, d_scale, d_bias)
    assert dnn_norm._channel_views(x, params, (dy, dx)) is not None
    dnn_norm.bind_bn_backward(x, dy, save_mean, save_inv, scale, d_scale, d_bias, dx)()
    return d_scale, d_bias, dx


@settings(max_examples=40, deadline=None, derandomize=True)
@given(**shapes)
def test_backward_matches_float64(n, c, h, w, offset):
    rng, x, scale, _ = _case(n, c, h, w, offset, n * 1000 + c * 100 + h * 10 + w + 1)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    eps = 1e-3
    _, m, inv, _ = ref_forward(x, scale, 0.0, eps)
    got = _backward(x, dy, m.astype(np.float32), inv.astype(np.float32), scale)
    for a, r in zip(got, ref_backward(x, dy, scale, eps)):
        np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(r).max()))


def test_backward_against_finite_differences():
    rng, x, scale, bias = _case(2, 9, 5, 3, 1.0, 11)  # 9 channels: split over threads
    eps = 1e-3
    dy = rng.standard_normal(x.shape)
    _, m, inv, _ = ref_forward(x, scale, bias, eps)
    d_scale, d_bias, dx = _backward(
        x, dy.astype(np.float32), m.astype(np.float32), inv.astype(np.float32), scale
    )
    _check_directional_derivatives(
        rng, (dx, d_scale, d_bias), (x, scale, bias),
        lambda xv, sv, bv: float((dy * ref_forward(xv, sv, bv, eps)[0]).sum()), 1e-4,
    )  # fmt: skip


def _check_directional_derivatives(rng, grads, args, loss, h):
    """Each gradient of ``grads`` (w.r.t. x, scale, bias) along a random direction against
    the float64 central difference of ``loss(x, scale, bias)`` with step ``h``."""
    args = [a.astype(np.float64) for a in args]
    for k, grad in enumerate(grads):
        v = rng.standard_normal(args[k].shape)
        plus, minus = list(args), list(args)
        plus[k], minus[k] = args[k] + h * v, args[k] - h * v
        num = (loss(*plus) - loss(*minus)) / (2 * h)
        np.testing.assert_allclose(float((grad * v).sum()), num, rtol=1e-4, atol=1e-4)


def test_fallback_for_other_layouts():
    """float64 and per-(H, W) statistics keep the NumPy path."""
    x = np.ones((2, 3, 4, 4))
    assert dnn_norm._channel_views(x, (np.ones((1, 3, 1, 1)),)) is None
    x32 = x.astype(np.float32)
    assert dnn_norm._channel_views(x32, (np.ones((1, 1, 4, 4), np.float32),)) is None
    assert dnn_norm._channel_views(x32[:, :, ::2], (np.ones((1, 3, 1, 1), np.float32),)) is None


# ---- a fused activation (tail): RELU or RELU6 of the normalized output --------------------
def _clamp64(y, tail):
    return np.clip(y, 0, 6 if tail == "RELU6" else np.inf)


def _tail_case(n, c, h, w, seed):
    """An input whose normalized values reach past 0 and 6 (a scale of 2-4), and some of
    them exactly 0 and 6 after the clamp."""
    rng, x, _, _ = _case(n, c, h, w, 0.0, seed)
    p = (1, c, 1, 1)
    scale = rng.uniform(2, 4, p).astype(np.float32)
    bias = rng.uniform(-1, 3, p).astype(np.float32)
    return rng, x, scale, bias


@settings(max_examples=30, deadline=None, derandomize=True)
@given(**{k: v for k, v in shapes.items() if k != "offset"},
       tail=st.sampled_from(["RELU", "RELU6"]), compiled=st.booleans())  # fmt: skip
def test_tail_forward_and_backward_match_float64(n, c, h, w, tail, compiled):
    """The clamp in the forward's writing pass and the mask in the backward's passes, the
    compiled loops and the NumPy path (a non-contiguous ``dy``) alike, against float64."""
    if n * h * w < 2:
        return
    rng, x, scale, bias = _tail_case(n, c, h, w, n * 1000 + c * 100 + h * 10 + w + 3)
    eps = 1e-3
    p = scale.shape
    outs = [np.empty(p, np.float32) for _ in range(4)] + [np.empty_like(x)]
    dnn_norm.bind_bn_forward(x, scale, bias, None, None, *outs, training=True, epsilon=eps,
                             avg_factor=0.1, tail=tail)()  # fmt: skip
    z = outs[4]
    ry = ref_forward(x, scale, bias, eps)[0]
    np.testing.assert_allclose(z, _clamp64(ry, tail), rtol=1e-4, atol=1e-5)
    # the float32 y of the unfused forward, clamped, is the fused output bit for bit
    plain = [np.empty(p, np.float32) for _ in range(4)] + [np.empty_like(x)]
    dnn_norm.bind_bn_forward(x, scale, bias, None, None, *plain, training=True, epsilon=eps,
                             avg_factor=0.1)()  # fmt: skip
    np.testing.assert_array_equal(z, np.clip(plain[4], 0, 6 if tail == "RELU6" else None))
    dz = rng.standard_normal(x.shape).astype(np.float32)
    if not compiled:  # strided: the NumPy path
        dz = np.repeat(dz, 2, axis=3)[..., ::2]
    d_scale, d_bias, dx = np.empty(p, np.float32), np.empty(p, np.float32), np.empty_like(x)
    dnn_norm.bind_bn_backward(x, dz, outs[2], outs[3], scale, d_scale, d_bias, dx, tail=tail,
                              z=z)()  # fmt: skip
    keep = (z > 0) & (z < 6) if tail == "RELU6" else z > 0
    want = ref_backward(x, np.where(keep, dz, 0), scale, eps)
    for a, r in zip((d_scale, d_bias, dx), want):
        np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(r).max()))


@pytest.mark.parametrize("tail", ["RELU", "RELU6"])
def test_tail_backward_against_finite_differences(tail):
    """d/d(x, scale, bias) of ``sum(dz * tail(bn(x)))`` in float64 by central differences
    (no value within the step of a kink)."""
    rng, x, scale, bias = _tail_case(2, 9, 5, 3, 17)
    eps = 1e-3
    p = scale.shape
    outs = [np.empty(p, np.float32) for _ in range(4)] + [np.empty_like(x)]
    dnn_norm.bind_bn_forward(x, scale, bias, None, None, *outs, training=True, epsilon=eps,
                             avg_factor=0.1, tail=tail)()  # fmt: skip
    y64 = ref_forward(x, scale, bias, eps)[0]
    assert np.abs(y64).min() > 1e-3 and np.abs(y64 - 6).min() > 1e-3
    assert (y64 < 0).any() and (tail == "RELU" or (y64 > 6).any())
    dz = rng.standard_normal(x.shape)
    d_scale, d_bias, dx = np.empty(p, np.float32), np.empty(p, np.float32), np.empty_like(x)
    dnn_norm.bind_bn_backward(x, dz.astype(np.float32), outs[2], outs[3], scale, d_scale,
                              d_bias, dx, tail=tail, z=outs[4])()  # fmt: skip
    _check_directional_derivatives(
        rng, (dx, d_scale, d_bias), (x, scale, bias),
        lambda xv, sv, bv: float((dz * _clamp64(ref_forward(xv, sv, bv, eps)[0], tail)).sum()),
        1e-6,
    )  # fmt: skip


def test_tail_arguments_checked():
    x = np.ones((2, 3, 2, 2), np.float32)
    p = (1, 3, 1, 1)
    outs = [np.empty(p, np.float32) for _ in range(4)] + [np.empty_like(x)]
    with pytest.raises(ValueError, match="tail"):
        dnn_norm.bind_bn_forward(x, *outs[:2], None, None, *outs, training=True, epsilon=1e-5,
                                 avg_factor=0.1, tail="SIGMOID")  # fmt: skip
    with pytest.raises(ValueError, match="tail"):
        dnn_norm.bind_bn_backward(x, x, *outs[:3], *outs[:2], x.copy(), tail="RELU6")
