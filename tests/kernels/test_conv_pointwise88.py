"""POINTWISE_NCHW88 (megbrain.kernels.conv.pointwise88): against the float64 reference over
drawn batches, planes (1x1 and 7x7 among them), channel counts and epilogues (SiLU too, at
large magnitudes as DIRECT_NCHW88's), constant and non-constant filters; bit for bit
DIRECT_NCHW88's sums; the same bits at 1 and 2 threads, and with the units by output channel
group or by band; the output sharing ``z``'s memory;
a squeeze-and-excitation gate scaling the source; a pre-activation (scale, shift, ReLU) of
the source; nothing allocated at run time; the tile's
sums vector FMAs on registers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit
from numba import types as nt
from test_conv_algos import ATOL, RTOL, assert_allocates_nothing

from megbrain.kernels import parallel
from megbrain.kernels.conv import nchw88 as conv_nchw88
from megbrain.kernels.conv import pointwise88
from megbrain.kernels.conv.constant_operands import constant_filter
from megbrain.kernels.conv.epilogue import Epilogue
from megbrain.kernels.conv.loops import pointwise88 as loops
from megbrain.kernels.tiled_jit import vector_width

_CHANNELS = [8, 16, 24, 40, 64, 96, 120, 160, 320, 576, 960, 1280]
_ACTS = ["none", "IDENTITY", "RELU", "H_SWISH", "RELU6", "SILU"]


def _operands(n, h, w, ic, oc, seed):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (n, ic, h, w)).astype(np.float32)
    # scaled by the reduction's length: sums of order 1 whatever the channels
    wt = (rng.uniform(-1, 1, (oc, ic)) / np.sqrt(ic)).astype(np.float32)
    bias = rng.uniform(-1, 1, oc).astype(np.float32)
    z = rng.uniform(-1, 1, (n, oc, h, w)).astype(np.float32)
    src = np.ascontiguousarray(conv_nchw88.to_nchw88(x))
    filt = np.ascontiguousarray(wt.reshape(oc // 8, 8, ic // 8, 8).transpose(0, 2, 3, 1))
    return x, wt, bias, z, src, filt[:, :, None, None]


def _want(x, wt, bias, z, act, with_z):
    y = np.einsum("oi,nihw->nohw", wt.astype(np.float64), x.astype(np.float64))
    if act != "none":
        y = y + bias[None, :, None, None]
    if with_z:
        y = y + z
    if act == "RELU":
        y = np.maximum(y, 0)
    elif act == "H_SWISH":
        y = y * np.clip(y + 3, 0, 6) / 6
    elif act == "RELU6":
        y = np.clip(y, 0, 6)
    elif act == "SILU":
        y = _silu64(y)
    return y


def _silu64(y):
    with np.errstate(over="ignore"):  # exp(-y) of y < -709 is inf: y 0 is -0
        return y / (1 + np.exp(-y))


def _epilogue(act, bias):
    if act == "none":
        return None
    return Epilogue(bias, act == "RELU", act == "H_SWISH", relu6=act == "RELU6",
                    silu=act == "SILU")  # fmt: skip


def _bind(src, filt, out, **kw):
    return conv_nchw88.bind_nchw88_forward(src, filt, out, (1, 1), (0, 0), (1, 1), **kw)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 2), h=st.sampled_from([1, 2, 3, 5, 7, 9, 14]), w=st.integers(1, 9),
       ic=st.sampled_from(_CHANNELS), oc=st.sampled_from(_CHANNELS), act=st.sampled_from(_ACTS),
       with_z=st.booleans(), constant=st.booleans(), seed=st.integers(0, 2**16))  # fmt: skip
def test_matches_float64(n, h, w, ic, oc, act, with_z, constant, seed):
    x, wt, bias, z, src, filt = _operands(n, h, w, ic, oc, seed)
    out = np.full((n, oc // 8, h, w, 8), np.nan, np.float32)
    z88 = np.ascontiguousarray(conv_nchw88.to_nchw88(z)) if with_z else None
    with constant_filter(constant):
        name, step = _bind(src, filt, out, epilogue=_epilogue(act, bias), z=z88)
    assert name == pointwise88.ALGORITHM
    want = _want(x, wt, bias, z, act, with_z)
    for _ in range(2):  # the second run reuses a constant filter's packed copy
        step()
        np.testing.assert_allclose(conv_nchw88.to_nchw(out), want, rtol=RTOL, atol=ATOL)


def test_relu6_clips_at_six_and_keeps_nan():
    x, wt, bias, z, src, filt = _operands(1, 3, 5, 16, 24, seed=3)
    big = np.full_like(src, 100.0)
    big[0, 0, 0, 0, 0] = np.nan
    out = np.empty((1, 3, 3, 5, 8), np.float32)
    _, step = _bind(big, np.abs(filt), out, epilogue=_epilogue("RELU6", np.abs(bias)))
    step()
    assert np.isnan(out[:, :, 0, 0]).all()
    rest = out.reshape(1, 3, 15, 8)[:, :, 1:]
    assert (rest == 6).all()


@pytest.mark.parametrize("direct", [False, True])
def test_silu_holds_its_accuracy_at_large_magnitudes_and_keeps_nan(monkeypatch, direct):
    # sums from -1e4 to 1e4: exp(-x) clipped, never inf / inf; both dense NCHW88 algorithms
    monkeypatch.setattr(conv_nchw88, "preferred_pointwise88", lambda geo: not direct)
    x, wt, bias, z, src, filt = _operands(1, 7, 9, 16, 40, seed=6)
    scale = np.geomspace(1e-3, 1e4, 7 * 9).reshape(7, 9).astype(np.float32)
    big = np.ascontiguousarray(src * scale[None, None, :, :, None])
    big[0, 0, 6, 8, 0] = np.nan
    out = np.empty((1, 5, 7, 9, 8), np.float32)
    name, step = _bind(big, filt, out, epilogue=_epilogue("SILU", bias))
    assert name == ("DIRECT_NCHW88" if direct else pointwise88.ALGORITHM)
    step()
    got = conv_nchw88.to_nchw(out)
    assert np.isnan(got[0, :, 6, 8]).all()
    got[0, :, 6, 8] = 0
    want = _want(conv_nchw88.to_nchw(big).astype(np.float64), wt, bias, z, "SILU", False)
    want[0, :, 6, 8] = 0
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 2), h=st.sampled_from([1, 3, 7, 14]), w=st.integers(1, 9),
       ic=st.sampled_from([8, 24, 96, 576]), oc=st.sampled_from([8, 24, 40, 96]),
       act=st.sampled_from(_ACTS), with_z=st.booleans(), seed=st.integers(0, 2**16))  # fmt: skip
def test_a_gate_scales_each_samples_input_channels(n, h, w, ic, oc, act, with_z, seed):
    # the squeeze-and-excitation multiply folded in (ConvBiasGated): x gate, then the conv
    x, wt, bias, z, src, filt = _operands(n, h, w, ic, oc, seed)
    gate = np.random.default_rng(seed + 1).uniform(0, 1, (n, ic, 1, 1)).astype(np.float32)
    out = np.full((n, oc // 8, h, w, 8), np.nan, np.float32)
    z88 = np.ascontiguousarray(conv_nchw88.to_nchw88(z)) if with_z else None
    g88 = conv_nchw88.to_nchw88(gate).copy(order="C")  # not a view of gate
    name, step = _bind(src, filt, out, epilogue=_epilogue(act, bias), z=z88, gate=g88)
    assert name == pointwise88.ALGORITHM
    step()
    want = _want(x.astype(np.float64) * gate, wt, bias, z, act, with_z)
    np.testing.assert_allclose(conv_nchw88.to_nchw(out), want, rtol=RTOL, atol=ATOL)
    g88 *= 0.5  # read at every run
    step()
    want = _want(x.astype(np.float64) * gate * np.float32(0.5), wt, bias, z, act, with_z)
    np.testing.assert_allclose(conv_nchw88.to_nchw(out), want, rtol=RTOL, atol=ATOL)


def test_another_algorithm_reads_the_gated_source_from_its_workspace():
    x, wt, bias, z, src, filt = _operands(1, 6, 6, 16, 16, seed=5)
    gate = np.random.default_rng(5).uniform(0, 1, (1, 16, 1, 1)).astype(np.float32)
    out = np.empty((1, 2, 3, 3, 8), np.float32)
    name, step = conv_nchw88.bind_nchw88_forward(src, filt, out, (2, 2), (0, 0), (1, 1),
                                                 gate=conv_nchw88.to_nchw88(gate))  # fmt: skip
    assert name == "DIRECT_NCHW88"
    step()
    want = _want((x * gate)[:, :, ::2, ::2], wt, bias, z, "none", False)
    np.testing.assert_allclose(conv_nchw88.to_nchw(out), want, rtol=RTOL, atol=ATOL)


def _scale_shift(ic, seed):
    rng = np.random.default_rng(seed + 2)
    scale = rng.uniform(-2, 2, (1, ic, 1, 1)).astype(np.float32)
    shift = rng.uniform(-1, 1, (1, ic, 1, 1)).astype(np.float32)
    return scale, shift, tuple(conv_nchw88.to_nchw88(a).copy(order="C") for a in (scale, shift))


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 2), h=st.sampled_from([1, 3, 7, 14]), w=st.integers(1, 9),
       ic=st.sampled_from([8, 24, 96, 576]), oc=st.sampled_from([8, 24, 40, 96, 128]),
       act=st.sampled_from(_ACTS), with_z=st.booleans(), seed=st.integers(0, 2**16))  # fmt: skip
def test_a_preactivation_scales_shifts_and_rectifies_the_source(n, h, w, ic, oc, act, with_z,
                                                                seed):  # fmt: skip
    # DenseNet's BatchNorm and ReLU before the 1x1 layer folded in (ConvBiasPreact)
    x, wt, bias, z, src, filt = _operands(n, h, w, ic, oc, seed)
    scale, shift, preact = _scale_shift(ic, seed)
    out = np.full((n, oc // 8, h, w, 8), np.nan, np.float32)
    z88 = np.ascontiguousarray(conv_nchw88.to_nchw88(z)) if with_z else None
    name, step = _bind(src, filt, out, epilogue=_epilogue(act, bias), z=z88, preact=preact)
    assert name == pointwise88.ALGORITHM
    step()
    xa = np.maximum(x.astype(np.float64) * scale + shift, 0)
    want = _want(xa, wt, bias, z, act, with_z)
    np.testing.assert_allclose(conv_nchw88.to_nchw(out), want, rtol=RTOL, atol=ATOL)
    preact[1][...] -= 0.5  # read at every run
    step()
    want = _want(np.maximum(x.astype(np.float64) * scale + (shift - np.float32(0.5)), 0), wt,
                 bias, z, act, with_z)  # fmt: skip
    np.testing.assert_allclose(conv_nchw88.to_nchw(out), want, rtol=RTOL, atol=ATOL)


def test_a_preactivation_keeps_nan_and_other_algorithms_read_it_from_their_workspace():
    x, wt, bias, z, src, filt = _operands(1, 6, 6, 16, 16, seed=5)
    scale, shift, preact = _scale_shift(16, 5)
    src = src.copy()
    src[0, 1, 2, 3, 4] = np.nan
    x = conv_nchw88.to_nchw(src)
    xa = np.maximum(x.astype(np.float64) * scale + shift, 0)
    out = np.empty((1, 2, 6, 6, 8), np.float32)
    name, step = _bind(src, filt, out, preact=preact)
    assert name == pointwise88.ALGORITHM
    step()
    got = conv_nchw88.to_nchw(out)
    assert np.isnan(got[0, :, 2, 3]).all() and np.isfinite(np.delete(got, 2, axis=2)).all()
    np.testing.assert_allclose(got, _want(xa, wt, bias, z, "none", False), rtol=RTOL, atol=ATOL)
    out = np.empty((1, 2, 3, 3, 8), np.float32)
    name, step = conv_nchw88.bind_nchw88_forward(src, filt, out, (2, 2), (0, 0), (1, 1),
                                                 preact=preact)  # fmt: skip
    assert name == "DIRECT_NCHW88"
    step()
    want = _want(xa[:, :, ::2, ::2], wt, bias, z, "none", False)
    np.testing.assert_allclose(conv_nchw88.to_nchw(out), want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("shape", [(2, 5, 6, 24, 40), (1, 7, 7, 160, 960), (1, 1, 1, 72, 24),
                                   (1, 14, 14, 96, 24), (2, 3, 3, 16, 8)])  # fmt: skip
@pytest.mark.parametrize("act", ["RELU", "H_SWISH"])
def test_equals_direct_nchw88_bit_for_bit(monkeypatch, shape, act):
    x, wt, bias, z, src, filt = _operands(*shape, seed=1)
    z88 = np.ascontiguousarray(conv_nchw88.to_nchw88(z))
    outs = []
    for preferred in (True, False):
        monkeypatch.setattr(conv_nchw88, "preferred_pointwise88", lambda geo, p=preferred: p)
        outs.append(np.full((shape[0], shape[4] // 8, *shape[1:3], 8), np.nan, np.float32))
        name, step = _bind(src, filt, outs[-1], epilogue=_epilogue(act, bias), z=z88)
        assert name == (pointwise88.ALGORITHM if preferred else "DIRECT_NCHW88")
        step()
    assert np.array_equal(outs[0], outs[1], equal_nan=True)


@pytest.mark.parametrize("shape", [(2, 12, 13, 16, 48), (1, 7, 7, 64, 160), (3, 2, 2, 32, 24)])
def test_runs_are_bitwise_reproducible_over_thread_counts(monkeypatch, shape):
    _, _, bias, _, src, filt = _operands(*shape, seed=2)
    outs = []
    for threads in (1, 2, 3):
        monkeypatch.setattr(parallel, "num_threads", lambda t=threads: t)
        monkeypatch.setattr(pointwise88, "MIN_SPLIT_MACS", 0)
        outs.append(np.empty((shape[0], shape[4] // 8, *shape[1:3], 8), np.float32))
        _bind(src, filt, outs[-1], epilogue=_epilogue("RELU", bias))[1]()
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[1], outs[2])


@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 3), h=st.sampled_from([1, 3, 7, 14]), w=st.integers(1, 9),
       ic=st.sampled_from([8, 24, 96]), oc=st.sampled_from([24, 40, 96, 160, 576]),
       threads=st.integers(2, 3), seed=st.integers(0, 2**16))  # fmt: skip
def test_units_by_group_or_by_band_give_the_same_bits(n, h, w, ic, oc, threads, seed):
    # a thread's range of units is a range of output channel groups (by_group) or of bands
    # of positions: every sum still runs over the input channels in order, whoever computes it
    x, wt, bias, z, src, filt = _operands(n, h, w, ic, oc, seed)
    tl = pointwise88.tiles_for(n, h * w, ic, oc, threads, (False, True))
    outs = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(parallel, "num_threads", lambda: threads)
        mp.setattr(pointwise88, "MIN_SPLIT_MACS", 0)
        for by_group in (False, True):
            outs.append(np.full((n, oc // 8, h, w, 8), np.nan, np.float32))
            step = pointwise88.bind_pointwise88(src, filt, outs[-1], _epilogue("RELU", bias),
                                                tiles=tl._replace(by_group=by_group))  # fmt: skip
            step()
    want = _want(x, wt, bias, z, "RELU", False)
    np.testing.assert_allclose(conv_nchw88.to_nchw(outs[1]), want, rtol=RTOL, atol=ATOL)
    assert np.array_equal(outs[0], outs[1])


def test_small_planes_of_many_channels_split_by_output_channels():
    # the filter outweighs the source: each of two threads reads its own half of the filter
    for hw, k, oc in ((49, 576, 96), (49, 96, 576), (49, 160, 1280), (196, 48, 288)):
        tl = pointwise88.tiles_for(1, hw, k, oc, 2, (False, True))
        assert tl.by_group and tl.ng % 2 == 0
    for hw, k, oc in ((196, 240, 40), (3136, 24, 144)):  # the source outweighs the filter
        assert not pointwise88.tiles_for(1, hw, k, oc, 2, (False, True)).by_group
    assert not pointwise88.tiles_for(1, 49, 576, 96, 1, (False, True)).by_group


@pytest.mark.parametrize("shape", [(1, 5, 5, 16, 16), (2, 9, 7, 32, 24), (1, 1, 1, 24, 40)])
def test_the_output_may_share_z_memory(shape):
    # ConvBias's inplace_input: each position's z is read before the position is written;
    # a plane's last tile, which repeats positions, reads z there but stores nothing
    x, wt, bias, z, src, filt = _operands(*shape, seed=3)
    out = np.array(conv_nchw88.to_nchw88(z), order="C")  # a copy (for 1x1 planes too)
    name, step = _bind(src, filt, out, epilogue=_epilogue("RELU", bias), z=out)
    assert name == pointwise88.ALGORITHM
    step()
    np.testing.assert_allclose(conv_nchw88.to_nchw(out), _want(x, wt, bias, z, "RELU", True),
                               rtol=RTOL, atol=ATOL)  # fmt: skip


@pytest.mark.parametrize("constant, act, gated", [(False, "H_SWISH", False),
                                                  (True, "H_SWISH", False), (True, "SILU", True),
                                                  (False, "SILU", True),
                                                  (True, "RELU", None)])  # fmt: skip
def test_a_run_allocates_nothing(monkeypatch, constant, act, gated):
    monkeypatch.setattr(parallel, "num_threads", lambda: 1)
    _, _, bias, z, src, filt = _operands(1, 14, 14, 64, 96, seed=4)
    out = np.empty((1, 12, 14, 14, 8), np.float32)
    z88 = np.ascontiguousarray(conv_nchw88.to_nchw88(z))
    gate = np.ones((1, 8, 1, 1, 8), np.float32) if gated else None
    preact = _scale_shift(64, 4)[2] if gated is None else None  # None: pre-activated
    with constant_filter(constant):
        name, step = _bind(src, filt, out, epilogue=_epilogue(act, bias), z=z88, gate=gate,
                           preact=preact)  # fmt: skip
    assert name == pointwise88.ALGORITHM
    step()
    assert_allocates_nothing(step)


def test_strided_padded_or_grouped_convolutions_are_not_taken():
    _, _, _, _, src, filt = _operands(1, 6, 6, 16, 16, seed=5)
    out = np.empty((1, 2, 3, 3, 8), np.float32)
    name, _ = conv_nchw88.bind_nchw88_forward(src, filt, out, (2, 2), (0, 0), (1, 1))
    assert name == "DIRECT_NCHW88"
    out = np.empty((1, 2, 8, 8, 8), np.float32)
    name, _ = conv_nchw88.bind_nchw88_forward(src, filt, out, (1, 1), (1, 1), (1, 1))
    assert name == "DIRECT_NCHW88"


def test_the_tiling_fits_the_registers_and_the_channels():
    for hw, k, oc in ((12544, 16, 96), (49, 960, 160), (1, 576, 144), (196, 96, 24)):
        tl = pointwise88.tiles_for(1, hw, k, oc, 2)
        assert tl.r * tl.b <= 24 and tl.ng * tl.b == -(-oc // loops.BLOCK)
        assert tl.nb >= 1 and (hw < tl.r or tl.tpb * tl.nb <= hw // tl.r)


@pytest.mark.skipif(vector_width() != 16, reason="a tile of 24 accumulators: AVX-512")
def test_the_sums_are_vector_fmas_on_registers():
    # compiled afresh: the assembly of a kernel loaded from Numba's cache is not kept
    fr = nt.Array(nt.float32, 1, "C", readonly=True)
    sig = nt.void(fr, fr, nt.float32[::1], fr, fr, fr, fr, nt.int64[::1], nt.int64[::1], nt.int64)
    fn = njit([sig], nogil=True, error_model="numpy", fastmath={"contract"})(
        loops._units_py(8, 3, 1 | 2 | 4))
    asm = "\n".join(fn.inspect_asm().values())
    fmas = [line for line in asm.splitlines() if "vfmadd" in line and "ps" in line]
    # 8 positions by 3 blocks by 8 channels, in the tile and its half-block twin
    assert len(fmas) >= 2 * 8 * 3 * 8
    assert all("ymm" in line or "zmm" in line for line in fmas)
    # the accumulators are registers: no 512-bit vector is spilled to the stack
    assert not any("(%rsp)" in line and "zmm" in line for line in asm.splitlines())


@pytest.mark.skipif(vector_width() != 16, reason="a tile of 24 accumulators: AVX-512")
def test_a_preactivation_keeps_the_reduction_on_registers():
    # the activated source goes through a stack buffer, the accumulators never
    fr = nt.Array(nt.float32, 1, "C", readonly=True)
    sig = nt.void(fr, fr, nt.float32[::1], fr, fr, fr, fr, nt.int64[::1], nt.int64[::1], nt.int64)
    fn = njit([sig], nogil=True, error_model="numpy", fastmath={"contract"})(
        loops._units_py(8, 3, 1 | 4 | loops.PREACT))
    blocks = "\n".join(fn.inspect_asm().values()).split("\n.LBB")
    loops_ = [b for b in blocks if sum("vfmadd231ps" in ln for ln in b.splitlines()) >= 8 * 3 * 8]
    assert len(loops_) >= 2  # the tile and its half-block twin
    for body in loops_:
        assert not any("(%rsp)" in ln and "zmm" in ln for ln in body.splitlines())
        # the channels' broadcasts load the buffer (no shuffle per channel and position)
        assert not any("vpermps" in ln for ln in body.splitlines())


@pytest.mark.skipif(vector_width() != 16, reason="a tile of 24 accumulators: AVX-512")
def test_silu_keeps_the_reduction_on_registers():
    # the sigmoid's constants and temporaries may go through the stack in the epilogue,
    # never the accumulators in the loop over the input channels
    fr = nt.Array(nt.float32, 1, "C", readonly=True)
    sig = nt.void(fr, fr, nt.float32[::1], fr, fr, fr, fr, nt.int64[::1], nt.int64[::1], nt.int64)
    fn = njit([sig], nogil=True, error_model="numpy", fastmath={"contract"})(
        loops._units_py(8, 3, 1 | 32))
    blocks = "\n".join(fn.inspect_asm().values()).split("\n.LBB")
    loops_ = [b for b in blocks if sum("vfmadd231ps" in ln for ln in b.splitlines()) >= 8 * 3 * 8]
    assert len(loops_) >= 2  # the tile and its half-block twin
    widths = []
    for body in loops_:
        fmas = [ln for ln in body.splitlines() if "vfmadd231ps" in ln]
        assert all("zmm" in ln or "ymm" in ln for ln in fmas)
        widths.append({"ymm" if "ymm" in ln else "zmm" for ln in fmas})
        assert not any("(%rsp)" in ln and ("zmm" in ln or "ymm" in ln) for ln in body.splitlines())
    # the full tile in 16 lanes; the twin's half-padding block in 8 (no padding computed)
    assert {"zmm"} in widths and {"zmm", "ymm"} in widths


def test_the_benchmark_runs_and_agrees_with_onnxruntime(benchmark_module):
    # benchmarks/pointwise88.py on two small layers, so that it cannot rot; times unchecked
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    bench = benchmark_module("pointwise88")

    rows = bench.main(["--smoke"])
    assert [r["name"] for r in rows] == [pointwise88.ALGORITHM] * 2
    assert all(min(r["ours"], r["ort"], r["ort_run"]) > 0 for r in rows)


_silu8_loop = None


def _silu_in_place(a: np.ndarray) -> None:
    global _silu8_loop
    if _silu8_loop is None:
        s8 = loops.silu8()

        @njit(nogil=True)
        def run(v):  # pragma: no cover - compiled
            for e in range(0, v.size, 8):
                s8(v, e)

        _silu8_loop = run
    _silu8_loop(a)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e4, 1e4, width=32) | st.floats(-30, 30, width=32), min_size=8,
                max_size=64).map(lambda v: v[: len(v) // 8 * 8]))  # fmt: skip
def test_the_vector_silu_is_within_float64s_to_a_few_1e_7(values):
    x = np.array(values, np.float32)
    got = x.copy()
    _silu_in_place(got)
    with np.errstate(over="ignore"):
        want = x.astype(np.float64) / (1 + np.exp(-x.astype(np.float64)))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-30)


def test_the_vector_silu_over_the_whole_clipped_range_and_at_nan_and_infinities():
    x = np.concatenate([np.linspace(-100, 100, 400_008), np.geomspace(1e-8, 100, 4000),
                        -np.geomspace(1e-8, 100, 4000), [np.nan, np.inf, -1e30, 1e30] * 2])
    x = x.astype(np.float32)  # fmt: skip
    got = x.copy()
    _silu_in_place(got)
    with np.errstate(over="ignore"):
        want = x.astype(np.float64) / (1 + np.exp(-x.astype(np.float64)))
    fin = np.isfinite(x)
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-6, atol=1e-30)
    assert np.isnan(got[np.isnan(x)]).all()
    assert (got[x == np.inf] == np.inf).all()
    assert abs(got[x == -1e30]).max() < 1e-30  # -1e30 sigmoid(-1e30): -0 in float64
