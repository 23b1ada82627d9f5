"""The fused kernels' float32 approximations (exp, sigmoid, tanh, erf, log) and the activations
built on them (SiLU, GELU, the squeeze-and-excitation gate) against float64 references, in
every layout a kernel is bound to (flat, per-channel, NCHW88 blocked)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megbrain.kernels import jit_codegen as jc

F32 = np.float32
RTOL, ATOL = 1e-4, 1e-5  # the operators' accuracy contract against a float64 reference


def _sigmoid64(x):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


_erf64 = np.vectorize(math.erf, otypes=[np.float64])

_SILU = (("SIGMOID", (("i", 0),)), ("MUL", (("i", 0), ("t", 0))))
# GELU as ONNX exports it: x * 0.5 * (1 + erf(x / sqrt(2)))
_GELU = (
    ("TRUE_DIV", (("i", 0), ("c", math.sqrt(2.0)))),
    ("ERF", (("t", 0),)),
    ("ADD", (("t", 1), ("c", 1.0))),
    ("MUL", (("i", 0), ("t", 2))),
    ("MUL", (("t", 3), ("c", 0.5))),
)
# GELU's tanh form: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
_GELU_TANH = (
    ("MUL", (("i", 0), ("i", 0))),
    ("MUL", (("t", 0), ("i", 0))),
    ("FUSE_MUL_ADD3", (("t", 1), ("c", 0.044715), ("i", 0))),
    ("MUL", (("t", 2), ("c", math.sqrt(2 / math.pi)))),
    ("TANH", (("t", 3),)),
    ("ADD", (("t", 4), ("c", 1.0))),
    ("MUL", (("t", 5), ("i", 0))),
    ("MUL", (("t", 6), ("c", 0.5))),
)

_CASES = {
    "silu": (_SILU, lambda x: x * _sigmoid64(x)),
    "sigmoid": ((("SIGMOID", (("i", 0),)),), _sigmoid64),
    "fuse_add_sigmoid": (
        (("FUSE_ADD_SIGMOID", (("i", 0), ("c", 0.5))),),
        lambda x: _sigmoid64(x + 0.5),
    ),
    "gelu": (_GELU, lambda x: 0.5 * x * (1.0 + _erf64(x / math.sqrt(2.0)))),
    "exp": ((("EXP", (("i", 0),)),), np.exp),
    "tanh": ((("TANH", (("i", 0),)),), np.tanh),
    "erf": ((("ERF", (("i", 0),)),), _erf64),
}


def _values() -> np.ndarray:
    """Every float32 exponent from 1e-30 to 1e30 with both signs, a dense grid over the
    range where the functions bend, and the special values."""
    rng = np.random.default_rng(0)
    mags = 10.0 ** rng.uniform(-30, 30, 4000)
    grid = np.linspace(-104, 104, 20001)
    special = [0.0, -0.0, np.inf, -np.inf, 88.0, -88.0, 88.72, -88.72, 87.5, -87.5, 1e-40]
    return np.concatenate([mags, -mags, grid, special]).astype(F32)


def _check(got: np.ndarray, x: np.ndarray, ref, expr) -> None:
    """``got`` against the float64 ``ref`` where its float32 rounding is finite; equal to that
    rounding (an infinity) where it overflows; at infinite inputs (where SiLU's ``-inf *
    sigmoid(-inf)`` is NaN in float64, -inf in float32) equal to the unfused kernels."""
    with np.errstate(all="ignore"):
        want = ref(x.astype(np.float64))
        want32 = want.astype(F32)
        unfused = jc.interpret(expr, [x])
    inf_in = np.isinf(x)
    fin = np.isfinite(want32) & ~inf_in
    np.testing.assert_allclose(got[fin], want[fin], rtol=RTOL, atol=ATOL)
    over = ~np.isfinite(want32) & ~inf_in
    np.testing.assert_array_equal(got[over], want32[over])
    np.testing.assert_array_equal(got[inf_in], unfused[inf_in])


@pytest.mark.parametrize("name", sorted(_CASES))
def test_fused_approximations_match_float64(name):
    expr, ref = _CASES[name]
    x = _values()
    out = np.empty_like(x)
    with np.errstate(all="ignore"):
        jc.bind(expr, [x], out)()
    _check(out, x, ref, expr)
    if name in ("silu", "sigmoid", "exp"):  # NaN stays NaN
        nan = np.full(9, np.nan, F32)
        jc.bind(expr, [nan], nan)()
        assert np.isnan(nan).all()


def test_tanh_gelu_matches_the_unfused_kernels():
    """GELU's tanh form loses float32's precision in ``1 + tanh`` for x below -3 whatever
    computes it: compared with the unfused (libm) kernels instead of float64."""
    x = np.linspace(-30, 30, 60001).astype(F32)
    out = np.empty_like(x)
    jc.bind(_GELU_TANH, [x], out)()
    with np.errstate(all="ignore"):
        ref = jc.interpret(_GELU_TANH, [x])
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


def test_sigmoid_is_within_a_few_ulp_over_its_whole_range():
    """Tighter than the contract: the shortened exp keeps the Cephes polynomial's accuracy."""
    x = np.linspace(-88, 88, 400001).astype(F32)
    out = np.empty_like(x)
    jc.bind((("SIGMOID", (("i", 0),)),), [x], out)()
    want = _sigmoid64(x.astype(np.float64))
    np.testing.assert_allclose(out, want, rtol=6e-7, atol=1e-37)


_blocked = st.tuples(
    st.integers(1, 2), st.integers(1, 5), st.integers(1, 9), st.integers(1, 9)
).map(lambda s: (s[0], s[1], s[2], s[3], 8))


@settings(max_examples=25, deadline=None)
@given(
    shape=st.one_of(
        _blocked,  # NCHW88 and its (N, C/8, 1, 1, 8) gate
        st.tuples(st.integers(1, 2), st.integers(1, 12), st.integers(1, 9), st.integers(1, 9)),
    ),
    gate=st.sampled_from(["full", "channel", "scalar"]),
    parts=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_gated_silu_layouts_match_float64(shape, gate, parts, seed):
    """silu(x) * sigmoid(g) (a SiLU and a squeeze-and-excitation gate in one kernel), ``g`` of
    the full shape, one per channel (blocked or not) or one element; split or not."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-20, 20, shape).astype(F32)
    if gate == "full":
        gshape = shape
    elif gate == "channel":
        gshape = (1, shape[1], 1, 1) + shape[4:]
    else:
        gshape = (1,)
    g = rng.uniform(-20, 20, gshape).astype(F32)
    expr = (*_SILU, ("SIGMOID", (("i", 1),)), ("MUL", (("t", 1), ("t", 2))))
    out = np.full(shape, np.nan, F32)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(jc, "num_threads", lambda: parts)
        mp.setattr(jc, "PARALLEL_MIN_SIZE_TRANSCENDENTAL", 16)
        jc.bind(expr, [x, g], out)()
    x64, g64 = x.astype(np.float64), g.astype(np.float64)
    want = x64 * _sigmoid64(x64) * _sigmoid64(g64)
    np.testing.assert_allclose(out, want, rtol=RTOL, atol=ATOL)


# ---- channels-last normalizations: row statistics next to per-channel operands -------------
# LayerNorm's tail as megbrain.onnx imports it: scale * d * (var + eps)^-0.5 + bias
_LN_TAIL = (
    ("MUL", (("i", 0), ("i", 1))),
    ("ADD", (("c", 1e-6), ("i", 2))),
    ("POW", (("t", 1), ("c", -0.5))),
    ("MUL", (("t", 2), ("t", 0))),
    ("ADD", (("i", 3), ("t", 3))),
)


def test_bcast_shape_takes_row_statistics_before_the_channels():
    # (N, H, W, 1) statistics and (C,) scale over (N, H, W, C): A = N H W, B = C
    got = jc.bcast_shape((2, 5, 6, 16), [(16,), (2, 5, 6, 16), (2, 5, 6, 1), (1,)])
    assert got == ((60, 16, 1), ("c", "f", "r", "s"))
    assert jc.bcast_shape((1, 5, 6, 16), [(1, 5, 6, 1), (16,)]) == ((30, 16, 1), ("r", "c"))
    # alone, the statistics are a channel block starting at the first dim (A = 1)
    assert jc.bcast_shape((1, 5, 6, 16), [(1, 5, 6, 1)]) == ((1, 30, 16), ("c",))
    assert jc.bcast_shape((3, 5, 6), [(1, 5, 1), (1, 1, 6)]) is None  # no block is leading
    assert jc.bcast_shape((3, 5, 6), [(3, 1, 1), (1, 1, 6)]) is None  # a gap between them
    assert jc.bcast_shape((3, 5, 6, 7), [(3, 1, 1, 1), (1, 5, 1, 1), (1, 1, 1, 7)]) is None


def test_row_nodes_are_computed_once_per_row():
    src = jc.kernel_source(_LN_TAIL, ("bcast", (("c", "f", "r", "c"), False), None))
    body = src.split("def kernel")[1]
    # the statistics' nodes sit in the row loop, before the loop over the channels
    assert body.index("t2 = t1 ** F(-0.5)") < body.index("for b in range(nb)")
    assert body.index("r2 = x2[a]") < body.index("t1 = ")


@settings(max_examples=25, deadline=None)
@given(
    shape=st.tuples(st.integers(1, 3), st.integers(1, 7), st.integers(1, 7), st.integers(2, 40)),
    parts=st.integers(1, 3),
    in_place=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_layer_norm_tail_matches_float64(shape, parts, in_place, seed):
    rng = np.random.default_rng(seed)
    n, h, w, c = shape
    d = rng.standard_normal(shape).astype(F32)
    var = rng.uniform(0.01, 4, (n, h, w, 1)).astype(F32)
    scale = rng.standard_normal(c).astype(F32)
    bias = rng.standard_normal(c).astype(F32)
    want = bias + d * scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + 1e-6)
    out = d if in_place else np.full(shape, np.nan, F32)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(jc, "num_threads", lambda: parts)
        mp.setattr(jc, "PARALLEL_MIN_SIZE", 16)
        jc.bind(_LN_TAIL, [scale, d, var, bias], out)()
    np.testing.assert_allclose(out, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("split", [False, True])
def test_bound_kernels_allocate_nothing_when_run(monkeypatch, split):
    """A bound kernel (split or not) writes into the arrays it was bound to: its runs
    allocate no array (NumPy reports its buffers to tracemalloc)."""
    import tracemalloc

    monkeypatch.setattr(jc, "num_threads", lambda: 2)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 4, 16, 16, 8)).astype(F32)
    g = rng.standard_normal((1, 4, 1, 1, 8)).astype(F32)
    var = rng.uniform(0.5, 2, (1, 16, 16, 1)).astype(F32)
    c = rng.standard_normal(32).astype(F32)
    runs = [
        jc.bind(_SILU, [x], np.empty_like(x), parallel=split),
        jc.bind((*_SILU, ("MUL", (("t", 1), ("i", 1)))), [x, g], np.empty_like(x),
                parallel=split),  # fmt: skip
        jc.bind(_LN_TAIL, [c, x.reshape(1, 16, 16, 32), var, c], np.empty((1, 16, 16, 32), F32),
                parallel=split),  # fmt: skip
    ]
    for run in runs:
        run()  # the first run may start the kernel pool's threads
    tracemalloc.start()
    try:
        for run in runs * 3:
            run()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < x.nbytes // 4


def test_blocked_gate_nodes_are_computed_once_per_block():
    """x * sigmoid(g) over NCHW88: the gate's sigmoid runs once per block of 8 channels (into
    stack values the position loop reads), not once per element."""
    expr = (("SIGMOID", (("i", 1),)), ("MUL", (("i", 0), ("t", 0))))
    body = jc.kernel_source(expr, ("bcast", (("f", "c"), "blocked"), None)).split("def kernel")[1]
    gate, positions = body.index("_sigmoid(x1[b, l])"), body.index("for k in range")
    assert gate < positions and body.count("_sigmoid(") == 1
    rng = np.random.default_rng(9)
    x = rng.uniform(-30, 30, (2, 3, 5, 7, 8)).astype(F32)
    g = rng.uniform(-30, 30, (1, 3, 1, 1, 8)).astype(F32)
    out = np.empty_like(x)
    jc.bind(expr, [x, g], out)()
    want = x.astype(np.float64) * _sigmoid64(g.astype(np.float64))
    np.testing.assert_allclose(out, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("mode, op", [("ADD", np.add), ("SUB", np.subtract),
                                      ("MUL", np.multiply), ("TRUE_DIV", np.true_divide)])
def test_elemwise_of_row_and_channel_operands_runs_compiled_with_numpys_bits(mode, op):
    from megbrain.kernels import elemwise as ew

    rng = np.random.default_rng(11)
    r = rng.uniform(0.5, 2, (2, 9, 10, 1)).astype(F32)
    c = rng.uniform(0.5, 2, (48,)).astype(F32)
    out = np.empty((2, 9, 10, 48), F32)
    assert ew._compiled_bind(mode, [r, c], out) is not None
    ew.bind(mode, [r, c], out)()
    np.testing.assert_array_equal(out, op(r, c))
