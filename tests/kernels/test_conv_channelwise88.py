"""The channel-wise (depthwise) NCHW88 convolution (CHANNELWISE_NCHW88, through
megbrain.kernels.conv.nchw88.bind_nchw88_forward) against the float64 reference: drawn
batches, channel blocks, filter sizes, strides, paddings, dilations and flips, with and
without the epilogue (bias, residual ``z``, ReLU keeping NaN); strided operands; nothing
allocated at run time; the workspace contract (the same bits over thread counts:
test_conv_nchw88)."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit
from test_conv_algos import ATOL, RTOL, assert_allocates_nothing
from test_conv_fast_algos import _carved
from test_conv_nchw88 import _filter88, _to88

from megbrain.kernels import parallel, tiled_jit, workspace
from megbrain.kernels.conv import channelwise88
from megbrain.kernels.conv import common as conv_common
from megbrain.kernels.conv import nchw88 as conv_nchw88
from megbrain.kernels.conv.constant_operands import constant_filter
from megbrain.kernels.conv.epilogue import Epilogue
from megbrain.kernels.conv.loops import channelwise88 as loops88


def _ref(x, w, stride, pad, dilate, flip):
    """float64 channel-wise convolution of NCHW ``x`` with ``w`` (C, FH, FW)."""
    w = w.astype(np.float64)
    if flip:
        w = w[:, ::-1, ::-1]
    (sh, sw), (dh, dw) = stride, dilate
    xp = np.pad(x.astype(np.float64), [(0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])])
    fh, fw = w.shape[1:]
    oh = (xp.shape[2] - dh * (fh - 1) - 1) // sh + 1
    ow = (xp.shape[3] - dw * (fw - 1) - 1) // sw + 1
    out = np.zeros((x.shape[0], x.shape[1], oh, ow))
    for a in range(fh):
        for b in range(fw):
            win = xp[:, :, a * dh : a * dh + sh * (oh - 1) + 1 : sh,
                     b * dw : b * dw + sw * (ow - 1) + 1 : sw]  # fmt: skip
            out += win * w[None, :, a, b, None, None]
    return out


def _case(**kw):
    c = dict(n=1, c=16, fshape=(3, 3), stride=(1, 1), pad=(1, 1), dilate=(1, 1),
             sshape=(13, 21), flip=False, seed=3)  # fmt: skip
    c.update(kw)
    return c


def _pair(lo, hi):
    return st.tuples(st.integers(lo, hi), st.integers(lo, hi))


@st.composite
def cases(draw):
    fshape, stride, dilate = draw(_pair(1, 7)), draw(_pair(1, 3)), draw(_pair(1, 2))
    pad = tuple(draw(st.integers(0, (f - 1) * d + 1)) for f, d in zip(fshape, dilate))
    lows = [max(1, d * (f - 1) + 1 - 2 * p) for f, p, d in zip(fshape, pad, dilate)]
    sshape = tuple(draw(st.integers(lo, 30)) for lo in lows)  # rows of 8-position tiles
    n, blocks, flip = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.booleans())
    return _case(n=n, c=8 * blocks, fshape=fshape, stride=stride, pad=pad, dilate=dilate,
                 sshape=sshape, flip=flip, seed=draw(st.integers(0, 2**16)))  # fmt: skip


def _operands(c):
    rng = np.random.default_rng(c["seed"])
    x = rng.uniform(-1, 1, (c["n"], c["c"], *c["sshape"])).astype(np.float32)
    w = rng.uniform(-1, 1, (c["c"], *c["fshape"])).astype(np.float32)
    return x, w, _to88(x), _filter88(w[:, None, None], "chan")


def _out(c):
    geometry = zip(c["sshape"], c["fshape"], c["stride"], c["pad"], c["dilate"])
    osp = tuple(conv_common.conv_out_size(*a) for a in geometry)
    return np.full((c["n"], c["c"] // 8, *osp, 8), np.nan, np.float32)


def _bind(c, src, filt, out, **kw):
    return conv_nchw88.bind_nchw88_forward(src, filt, out, c["stride"], c["pad"], c["dilate"],
                                           c["flip"], group=True, **kw)  # fmt: skip


@settings(max_examples=120, deadline=None)
@given(c=cases(), bias=st.booleans(), relu=st.booleans(), with_z=st.booleans(),
       constant=st.booleans())  # fmt: skip
def test_matches_float64(c, bias, relu, with_z, constant):
    x, w, src, filt = _operands(c)
    out = _out(c)
    rng = np.random.default_rng(c["seed"] + 1)
    want = _ref(x, w, c["stride"], c["pad"], c["dilate"], c["flip"])
    kw = {}
    if bias or relu:
        b = rng.uniform(-1, 1, c["c"]).astype(np.float32)
        if not bias:
            b[:] = 0
        kw["epilogue"] = Epilogue(b, relu)
        want = want + b[None, :, None, None]
    if with_z:
        zn = rng.uniform(-1, 1, want.shape).astype(np.float32)
        kw["z"] = np.ascontiguousarray(conv_nchw88.to_nchw88(zn))
        want = want + zn
    if relu:
        want = np.maximum(want, 0)
    with constant_filter(constant):
        name, step = _bind(c, src, filt, out, **kw)
    assert name == "CHANNELWISE_NCHW88"
    for _ in range(2):  # the second run reuses a constant filter's copy
        step()
        np.testing.assert_allclose(conv_nchw88.to_nchw(out), want, rtol=RTOL, atol=ATOL)


@settings(max_examples=60, deadline=None)
@given(c=cases(), with_z=st.booleans())
def test_h_swish_epilogue_matches_float64(c, with_z):
    x, w, src, filt = _operands(c)
    out = _out(c)
    rng = np.random.default_rng(c["seed"] + 2)
    b = rng.uniform(-3, 3, c["c"]).astype(np.float32)  # both ends of H_SWISH's ramp
    want = _ref(x, w, c["stride"], c["pad"], c["dilate"], c["flip"]) + b[None, :, None, None]
    z = None
    if with_z:
        zn = rng.uniform(-2, 2, want.shape).astype(np.float32)
        z, want = np.ascontiguousarray(conv_nchw88.to_nchw88(zn)), want + zn
    want = want * np.clip(want + 3, 0, 6) / 6
    name, step = _bind(c, src, filt, out, epilogue=Epilogue(b, False, True), z=z)
    assert name == "CHANNELWISE_NCHW88"
    step()
    np.testing.assert_allclose(conv_nchw88.to_nchw(out), want, rtol=RTOL, atol=ATOL)


def test_h_swish_epilogue_keeps_nan():
    c = _case(n=1, c=8, fshape=(3, 3), pad=(1, 1), stride=(1, 1))
    _, _, src, filt = _operands(c)
    src = src.copy()
    src[0, 0, 4, 4, 3] = np.nan
    out = _out(c)
    _bind(c, src, filt, out, epilogue=Epilogue(np.zeros(8, np.float32), False, True))[1]()
    y = conv_nchw88.to_nchw(out)
    assert np.isnan(y[0, 3, 3:6, 3:6]).all() and np.isfinite(y).sum() == y.size - 9


def test_relu_keeps_nan_and_strided_operands_are_read():
    c = _case(n=2, c=24, fshape=(5, 5), pad=(2, 2), stride=(2, 1))
    x, w, src, filt = _operands(c)
    wide = np.zeros(src.shape[:-1] + (16,), np.float32)
    wide[..., ::2] = src
    wide[0, 0, 6, 9, 0] = np.nan
    strided = wide[..., ::2]
    out = _out(c)
    zbig = np.zeros(out.shape[:-1] + (16,), np.float32)
    bias = np.full(c["c"], -100, np.float32)  # every finite sum negative: ReLU gives 0
    _, step = _bind(c, strided, filt, out, epilogue=Epilogue(bias[::-1].copy()[::-1], True),
                    z=zbig[..., ::2])  # fmt: skip
    step()
    y = conv_nchw88.to_nchw(out)
    # source row 6 feeds output rows 2-4 (stride 2, pad 2), column 9 columns 7-11
    assert np.isnan(y[0, 0, 2:5, 7:12]).all()
    y[0, 0, 2:5, 7:12] = 0
    assert (y == 0).all()
    xs = x.copy()
    xs[0, 0, 6, 9] = 0
    strided[0, 0, 6, 9, 0] = 0
    out2 = _out(c)
    _bind(c, strided, filt, out2)[1]()
    np.testing.assert_allclose(conv_nchw88.to_nchw(out2), _ref(xs, w, c["stride"], c["pad"],
                               c["dilate"], False), rtol=RTOL, atol=ATOL)  # fmt: skip


def test_a_readonly_output_view_is_written_through_a_copy():
    c = _case(fshape=(3, 3), stride=(2, 2))
    x, w, src, filt = _operands(c)
    big = _out(c).repeat(2, axis=-1)
    out = big[..., ::2]  # not contiguous
    _bind(c, src, filt, out)[1]()
    np.testing.assert_allclose(conv_nchw88.to_nchw(np.ascontiguousarray(out)),
                               _ref(x, w, c["stride"], c["pad"], c["dilate"], False),
                               rtol=RTOL, atol=ATOL)  # fmt: skip


@pytest.mark.parametrize("constant", [False, True])
def test_workspace_is_written_before_read_and_nothing_is_allocated(monkeypatch, constant):
    c = _case(n=2, c=16, fshape=(5, 5), pad=(2, 2), stride=(2, 2), flip=True)
    x, w, src, filt = _operands(c)
    bias = np.linspace(-1, 1, c["c"], dtype=np.float32)
    out = _out(c)
    z = np.zeros(out.shape[:-1] + (16,), np.float32)[..., ::2]  # copied into the workspace

    def bind():
        with constant_filter(constant):
            return _bind(c, src, filt, out, epilogue=Epilogue(bias, True), z=z)[1]

    step, buf = _carved(bind)
    step()
    want = np.maximum(_ref(x, w, c["stride"], c["pad"], c["dilate"], True)
                      + bias[None, :, None, None], 0)  # fmt: skip
    for _ in range(2):
        buf[:] = 0xFF  # NaN in every workspace byte
        step()
        np.testing.assert_allclose(conv_nchw88.to_nchw(out), want, rtol=RTOL, atol=ATOL)
    monkeypatch.setattr(parallel, "num_threads", lambda: 1)
    with workspace.allocating(workspace.Carver(buf)):
        one_thread = bind()
    one_thread()
    assert_allocates_nothing(one_thread)


def test_a_float64_operand_falls_back_to_nchw():
    c = _case()
    _, _, src, filt = _operands(c)
    name, _ = _bind(c, src.astype(np.float64), filt.astype(np.float64),
                    _out(c).astype(np.float64))  # fmt: skip
    assert name == "NCHW88_AS_NCHW"


def test_the_benchmark_runs_and_agrees_with_onnxruntime(benchmark_module):
    # benchmarks/depthwise88.py on two small layers, so that it cannot rot; times unchecked
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    depthwise88 = benchmark_module("depthwise88")

    rows = depthwise88.main(["--smoke"])
    assert [r["name"] for r in rows] == ["CHANNELWISE_NCHW88"] * 2
    assert all(min(r["ours"], r["ort"], r["copy"]) > 0 for r in rows)


@pytest.mark.parametrize("fshape, stride, dilate", [((9, 8), (1, 3), (1, 1)),
                                                    ((3, 5), (2, 1), (2, 2))])  # fmt: skip
def test_filters_without_a_kernel_of_their_own_take_the_general_one(fshape, stride, dilate):
    c = _case(n=2, c=16, fshape=fshape, stride=stride, pad=(2, 3), dilate=dilate,
              sshape=(17, 26))  # fmt: skip
    assert loops88.kernel_key(fshape[1], stride[1], dilate[1]) == (0, 0)
    x, w, src, filt = _operands(c)
    out = _out(c)
    _bind(c, src, filt, out)[1]()
    np.testing.assert_allclose(conv_nchw88.to_nchw(out), _ref(x, w, c["stride"], c["pad"],
                               c["dilate"], False), rtol=RTOL, atol=ATOL)  # fmt: skip


def test_the_sums_are_vector_fmas_on_registers():
    # compiled afresh: the assembly of a kernel loaded from Numba's cache is not kept
    kernel = loops88._make_kernel(3, 1)
    fn = njit(loops88.signature(), nogil=True, error_model="numpy", fastmath={"contract"})(kernel)
    asm = "\n".join(fn.inspect_asm().values())
    fmas = [line for line in asm.splitlines() if "vfmadd" in line and "ps" in line]
    # 8 positions of the unchecked and of the checked tile, 3 columns each, and their rows
    assert len(fmas) >= 2 * 8 * 3
    assert all("ymm" in line or "zmm" in line for line in fmas)
    # the accumulators are registers: no multiply-add reads or writes one on the stack
    assert not any("(%rsp)" in line for line in fmas)


@pytest.mark.skipif(tiled_jit.vector_width() != 16, reason="blocks are paired on AVX-512")
@settings(max_examples=12, deadline=None)
@given(c=cases(), act=st.sampled_from(["relu", "hswish", "relu6", "silu"]),
       with_z=st.booleans())  # fmt: skip
def test_blocks_in_pairs_give_the_bits_of_one_block_at_a_time(c, act, with_z):
    # AVX-512 computes two channel blocks in vectors of 16 lanes; each lane's sum is the
    # same sequence of fused multiply-adds as with 8, so the outputs are the same bits (and
    # the hypothesis tests above hold both against the float64 reference)
    c = dict(c, c=8 * max(2, c["c"] // 8))
    x, w, src, filt = _operands(c)
    rng = np.random.default_rng(c["seed"] + 3)
    b = rng.uniform(-3, 3, c["c"]).astype(np.float32)
    epi = Epilogue(b, act == "relu", act == "hswish", act == "relu6", act == "silu")
    z = None
    if with_z:
        z = np.ascontiguousarray(rng.uniform(-2, 2, _out(c).shape).astype(np.float32))
    outs = []
    for lanes in (16, 8):
        out = _out(c)
        with mock.patch.object(channelwise88, "vector_width", lambda lanes=lanes: lanes):
            name, step = _bind(c, src, filt, out, epilogue=epi, z=z)
        assert name == "CHANNELWISE_NCHW88"
        step()
        outs.append(out)
    np.testing.assert_array_equal(outs[0], outs[1])
    want = _ref(x, w, c["stride"], c["pad"], c["dilate"], c["flip"]) + b[None, :, None, None]
    if with_z:
        want = want + conv_nchw88.to_nchw(z)
    want = {"relu": lambda v: np.maximum(v, 0), "hswish": lambda v: v * np.clip(v + 3, 0, 6) / 6,
            "relu6": lambda v: np.clip(v, 0, 6), "silu": lambda v: v / (1 + np.exp(-v))}[act](want)
    np.testing.assert_allclose(conv_nchw88.to_nchw(outs[0]), want, rtol=RTOL, atol=ATOL)


def test_the_units_leave_no_thread_more_work_than_the_count_rule_did():
    def old(blocks, oh, t):  # the earlier rule: a count of units only
        bands = max(1, min(oh, -(-4 * t // blocks)))
        rows = -(-oh // bands)
        bands = -(-oh // rows)
        return rows, -(-oh // rows), max(1, blocks // (4 * t)) if bands == 1 else 1

    def busiest(blocks, oh, t, rows, bands, per):
        slots = [min(per, blocks - i) for i in range(0, blocks, per)]
        sizes = [s * min(rows, oh - b * rows) for b in range(bands) for s in slots]
        return channelwise88._makespan(sizes, t)

    for blocks in range(1, 80):
        for oh in (1, 3, 7, 14, 28, 56, 112):
            for t in (2, 3):
                rows, bands, per = channelwise88._units(blocks, oh, t)
                assert rows * bands >= oh > rows * (bands - 1) and 1 <= per <= blocks
                assert busiest(blocks, oh, t, rows, bands, per) <= busiest(
                    blocks, oh, t, *old(blocks, oh, t))
    assert channelwise88._units(36, 7, 2) == (7, 1, 3)  # 12 units of 3 slots, not 9 of 4


@pytest.mark.parametrize("c, side, f, s", [(576, 7, 5, 1), (288, 14, 5, 2), (48, 56, 3, 1)])
def test_units_over_threads_give_the_bits_of_one_thread(monkeypatch, c, side, f, s):
    case = _case(n=1, c=c, fshape=(f, f), stride=(s, s), pad=(f // 2, f // 2), dilate=(1, 1),
                 sshape=(side, side), flip=False, seed=3)  # fmt: skip
    x, w, src, filt = _operands(case)

    monkeypatch.setattr(channelwise88, "MIN_SPLIT_WORK", 0)  # every layer split

    def run(threads):  # units of several slots: the unit sizes depend on the thread count
        monkeypatch.setattr(parallel, "num_threads", lambda: threads)
        out = _out(case)
        _bind(case, src, filt, out)[1]()
        return out

    one, two, three = run(1), run(2), run(3)
    assert np.array_equal(one, two) and np.array_equal(one, three)
    want = _ref(x, w, case["stride"], case["pad"], case["dilate"], case["flip"])
    np.testing.assert_allclose(conv_nchw88.to_nchw(two), want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("c, side, f, s, split", [
    (240, 14, 5, 1, False), (576, 14, 3, 1, False), (16, 56, 3, 2, False),
    (1152, 7, 5, 1, True), (144, 56, 3, 2, True), (240, 28, 5, 1, True)])  # fmt: skip
def test_a_layer_of_little_work_runs_on_one_thread(monkeypatch, c, side, f, s, split):
    case = _case(n=1, c=c, fshape=(f, f), stride=(s, s), pad=(f // 2, f // 2), dilate=(1, 1),
                 sshape=(side, side), flip=False, seed=5)  # fmt: skip
    x, w, src, filt = _operands(case)
    monkeypatch.setattr(parallel, "num_threads", lambda: 2)
    spy = mock.Mock(wraps=channelwise88.units_as_they_go)
    monkeypatch.setattr(channelwise88, "units_as_they_go", spy)
    out = _out(case)
    _bind(case, src, filt, out)[1]()
    assert spy.call_count == 1 and spy.call_args.args[2] == (2 if split else 1)
    want = _ref(x, w, case["stride"], case["pad"], case["dilate"], case["flip"])
    np.testing.assert_allclose(conv_nchw88.to_nchw(out), want, rtol=RTOL, atol=ATOL)


@settings(max_examples=25, deadline=None)
@given(c=st.sampled_from([8, 16, 24, 72, 240]), side=st.integers(1, 30),
       f=st.sampled_from([3, 5]), s=st.sampled_from([1, 2]), pad=st.integers(0, 2))  # fmt: skip
def test_split_or_not_the_bits_are_one_threads(c, side, f, s, pad):
    case = _case(n=1, c=c, fshape=(f, f), stride=(s, s), pad=(pad, pad), dilate=(1, 1),
                 sshape=(side + f, side + f), flip=False, seed=side)  # fmt: skip
    x, w, src, filt = _operands(case)
    outs = []
    with mock.patch.object(parallel, "num_threads", lambda: 2):
        for floor in (0, 1 << 60):  # every layer split; none
            with mock.patch.object(channelwise88, "MIN_SPLIT_WORK", floor):
                out = _out(case)
                _bind(case, src, filt, out)[1]()
                outs.append(out)
    assert np.array_equal(outs[0], outs[1])
    want = _ref(x, w, case["stride"], case["pad"], case["dilate"], case["flip"])
    np.testing.assert_allclose(conv_nchw88.to_nchw(outs[0]), want, rtol=RTOL, atol=ATOL)
