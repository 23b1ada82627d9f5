"""``layer_norm.bind_layer_norm``: layer normalization over the last axis as one kernel, in
each layout it reads (channels contiguous, positions contiguous, any other through a copy),
against float64; clear errors; a run allocates nothing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_conv_algos import assert_allocates_nothing

from megbrain.kernels import layer_norm, parallel
from megbrain.kernels.layer_norm import bind_layer_norm

RTOL, ATOL = 1e-4, 1e-5


def _want(x, scale, bias, eps):
    x = x.astype(np.float64)
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * scale + (0 if bias is None else bias)


def _input(shape, layout, rng):
    """``x`` of ``shape`` (..., C) in ``layout``: "last" (C-contiguous), "nchw" (a
    channels-last view of channels-first memory, as after ONNX's Transpose) or "strided"."""
    if layout == "nchw":
        base = rng.standard_normal((shape[0], shape[-1], *shape[1:-1]))
        x = np.moveaxis(base, 1, -1)
    elif layout == "strided":
        x = rng.standard_normal((*shape[:-1], 2 * shape[-1]))[..., ::2]
    else:
        x = rng.standard_normal(shape)
    return (x * 3 + rng.uniform(-5, 5)).astype(np.float32)


def _check(shape, layout, with_bias, eps, seed):
    rng = np.random.default_rng(seed)
    x = _input(shape, layout, rng)
    c = shape[-1]
    scale = rng.uniform(-2, 2, c).astype(np.float32)
    bias = rng.uniform(-1, 1, c).astype(np.float32) if with_bias else None
    out = np.full(x.shape, np.nan, np.float32)
    step = bind_layer_norm(x, scale, bias, out, eps)
    step()
    np.testing.assert_allclose(out, _want(x, scale, bias, eps), rtol=RTOL, atol=ATOL)
    x[...] = x * 2 + 1  # read at every run
    scale *= -1
    step()
    np.testing.assert_allclose(out, _want(x, scale, bias, eps), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("shape,layout", [
    ((1, 56, 56, 96), "nchw"), ((1, 7, 7, 768), "last"), ((3, 5), "strided"),
    ((1, 1, 1, 1), "last"), ((2, 130, 24), "nchw"),
])  # fmt: skip
def test_layouts_match_float64(shape, layout):
    _check(shape, layout, True, 1e-6, seed=shape[-1])


@settings(max_examples=20, deadline=None)
@given(lead=st.lists(st.integers(1, 9), min_size=1, max_size=3), c=st.integers(1, 70),
       layout=st.sampled_from(["last", "nchw", "strided"]), with_bias=st.booleans(),
       eps=st.sampled_from([1e-5, 1e-6, 0.1]), seed=st.integers(0, 99))  # fmt: skip
def test_shapes_and_layouts(lead, c, layout, with_bias, eps, seed):
    # two compiled loops in all: cheap examples
    if layout == "nchw" and len(lead) < 2:
        layout = "last"
    _check((*lead, c), layout, with_bias, eps, seed)


def test_a_constant_row_is_its_bias():
    x = np.full((4, 32), 7.0, np.float32)
    out = np.empty_like(x)
    bias = np.arange(32, dtype=np.float32)
    bind_layer_norm(x, np.ones(32, np.float32), bias, out, 1e-5)()
    np.testing.assert_array_equal(out, np.broadcast_to(bias, x.shape))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_bits_do_not_depend_on_threads(monkeypatch, threads):
    monkeypatch.setattr(layer_norm, "_MIN_PART", 1)
    rng = np.random.default_rng(1)
    outs = []
    for layout in ("last", "nchw"):
        x = _input((1, 20, 20, 96), layout, rng)
        g, b = np.ones(96, np.float32), np.zeros(96, np.float32)
        monkeypatch.setattr(parallel, "num_threads", lambda: 1)
        one = np.empty(x.shape, np.float32)
        bind_layer_norm(x, g, b, one, 1e-6)()
        monkeypatch.setattr(parallel, "num_threads", lambda t=threads: t)
        out = np.empty(x.shape, np.float32)
        bind_layer_norm(x, g, b, out, 1e-6)()
        outs.append((one, out))
    for one, out in outs:
        assert np.array_equal(one, out)


@pytest.mark.parametrize("layout", ["nchw", "strided"])
def test_a_run_allocates_nothing(monkeypatch, layout):
    monkeypatch.setattr(parallel, "num_threads", lambda: 2)
    monkeypatch.setattr(layer_norm, "_MIN_PART", 1)
    x = _input((1, 16, 16, 64), layout, np.random.default_rng(0))
    out = np.empty(x.shape, np.float32)
    step = bind_layer_norm(x, np.ones(64, np.float32), None, out, 1e-5)
    step()
    assert_allocates_nothing(step)


def test_bad_operands_are_refused():
    x = np.zeros((2, 8), np.float32)
    with pytest.raises(ValueError, match=r"scale and bias of shape \(8,\)"):
        bind_layer_norm(x, np.ones(4, np.float32), None, np.empty_like(x), 1e-5)
    with pytest.raises(ValueError, match="expected float32"):
        bind_layer_norm(x.astype(np.float64), np.ones(8, np.float32), None, np.empty_like(x),
                        1e-5)  # fmt: skip
    with pytest.raises(ValueError, match="out overlaps x"):
        bind_layer_norm(x, np.ones(8, np.float32), None, x, 1e-5)


@settings(max_examples=10, deadline=None)
@given(n=st.integers(1, 3), cb=st.integers(1, 13), h=st.integers(1, 9), w=st.integers(1, 70),
       with_bias=st.booleans(), contiguous=st.booleans(), seed=st.integers(0, 9))  # fmt: skip
def test_an_nchw88_tensor_is_read_in_place_and_matches_float64(n, cb, h, w, with_bias,
                                                               contiguous, seed):  # fmt: skip
    # bind_layer_norm_nchw88: ConvNeXt's LayerNorm after its NCHW88 depthwise convolution
    rng = np.random.default_rng(seed)
    c = cb * 8
    x = (rng.standard_normal((n, cb, h, w, 16)) * 3 + 1).astype(np.float32)
    x = np.ascontiguousarray(x[..., :8]) if contiguous else x[..., ::2]  # else: copied first
    scale = rng.uniform(-2, 2, c).astype(np.float32)
    bias = rng.uniform(-1, 1, c).astype(np.float32) if with_bias else None
    out = np.full((n, h, w, c), np.nan, np.float32)
    layer_norm.bind_layer_norm_nchw88(x, scale, bias, out, 1e-6)()
    last = np.ascontiguousarray(x.transpose(0, 2, 3, 1, 4).reshape(n, h, w, c))
    np.testing.assert_allclose(out, _want(last, scale, bias, 1e-6), rtol=RTOL, atol=ATOL)
    # float64 sums in another order than the channels-contiguous kernel's: the float32 mean
    # and scale may round the other way, nothing more
    rows = np.empty_like(out)
    bind_layer_norm(last, scale, bias, rows, 1e-6)()
    np.testing.assert_allclose(out, rows, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("threads", [1, 3])
def test_nchw88_bits_do_not_depend_on_threads_and_a_run_allocates_nothing(monkeypatch,
                                                                          threads):  # fmt: skip
    monkeypatch.setattr(layer_norm, "_MIN_PART", 1)
    x = np.random.default_rng(2).standard_normal((2, 3, 11, 13, 8)).astype(np.float32)
    g, b = np.ones(24, np.float32), np.zeros(24, np.float32)
    monkeypatch.setattr(parallel, "num_threads", lambda: 1)
    one = np.empty((2, 11, 13, 24), np.float32)
    layer_norm.bind_layer_norm_nchw88(x, g, b, one, 1e-6)()
    monkeypatch.setattr(parallel, "num_threads", lambda t=threads: t)
    out = np.empty_like(one)
    step = layer_norm.bind_layer_norm_nchw88(x, g, b, out, 1e-6)
    step()
    assert np.array_equal(one, out)
    assert_allocates_nothing(step)


def test_bad_nchw88_operands_are_refused():
    x = np.zeros((1, 2, 3, 3, 8), np.float32)
    with pytest.raises(ValueError, match=r"not an NCHW88 tensor \(N, C/8, H, W, 8\)"):
        layer_norm.bind_layer_norm_nchw88(x[..., :4], np.ones(8, np.float32), None,
                                          np.empty((1, 3, 3, 8), np.float32), 1e-5)  # fmt: skip
    with pytest.raises(ValueError, match=r"out of shape \(1, 3, 3, 16\)"):
        layer_norm.bind_layer_norm_nchw88(x, np.ones(16, np.float32), None,
                                          np.empty((1, 3, 3, 8), np.float32), 1e-5)  # fmt: skip
