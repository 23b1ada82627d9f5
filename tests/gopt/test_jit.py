"""JIT fusion (graph option ``graph_opt.jit``): the jit_fusion pass, JITExecutor, the
generated kernels and their caches.

Numba compiles each distinct kernel in about a second, so the tests reuse a few expressions
and the module compiles into one fresh cache directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import megbrain as mgb
from megbrain.gopt.jit import fuse_elemwise
from megbrain.kernels import elemwise_modes as ew_modes
from megbrain.kernels import jit_codegen as jc
from megbrain.opr.jit import jit_executor

CN = "cpu0"
F32 = np.float32


@pytest.fixture(scope="module", autouse=True)
def jit_cache_dir(tmp_path_factory):
    """Compile into a fresh cache directory: the counters below see real compiles."""
    d = tmp_path_factory.mktemp("mgb_jit_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MGB_JIT_CACHE_DIR", str(d))
        yield d


def _graph(jit=1, level=2):
    g = mgb.comp_graph()
    g.set_option("graph_opt.jit", jit)
    g.set_option("graph_opt_level", level)
    return g


def _args(g, shapes, dtype=F32):
    return [mgb.make_arg(CN, g, name=f"x{i}", shape=s, dtype=dtype) for i, s in enumerate(shapes)]


def _types(f):
    return [o.type_name for o in f._func.iter_opr_seq()]


def _run_both(build, shapes, values, dtype=F32, jit=1):
    """Results of ``build(*args)`` compiled with and without JIT fusion, and the fused seq."""
    res = []
    for level in (0, jit):
        g = _graph(level)
        xs = _args(g, shapes, dtype)
        f = g.compile(xs, mgb.copy_output(build(*xs)))
        res.append((f(*values), _types(f)))
    (ref, _), (out, types) = res
    return ref, out, types


# ---- random chains ----------------------------------------------------------------------
# modes that are total on moderate values; the wrapped ones get their domain guarded below
_UNARY = [
    "RELU",
    "ABS",
    "NEGATE",
    "TANH",
    "SIGMOID",
    "H_SWISH",
    "FAST_TANH",
    "SIN",
    "COS",
    "ERF",
    "ERFC",
    "EXP",
    "LOG",
    "LOG1P",
    "EXPM1",
    "ROUND",
    "FLOOR",
    "CEIL",
]
_BINARY = [
    "ADD",
    "SUB",
    "MUL",
    "MAX",
    "MIN",
    "TRUE_DIV",
    "POW",
    "ATAN2",
    "LOG_SUM_EXP",
    "FUSE_ADD_RELU",
    "FUSE_ADD_SIGMOID",
    "FUSE_ADD_TANH",
    "FUSE_ADD_H_SWISH",
    "SWITCH_GT0",
    "ABS_GRAD",
    "SIGMOID_GRAD",
    "TANH_GRAD",
    "FAST_TANH_GRAD",
    "H_SWISH_GRAD",
    "LT",
    "LEQ",
    "MOD",
    "FLOOR_DIV",
]
_TERNARY = ["FUSE_MUL_ADD3", "COND_LEQ_MOV"]


def _random_chain(rng, nin, nops):
    """A builder of a random DAG of ``nops`` Elemwise ops over ``nin`` inputs."""
    plan = []
    for _ in range(nops):
        kind = rng.choice(3, p=[0.4, 0.5, 0.1])
        mode = rng.choice([_UNARY, _BINARY, _TERNARY][kind])
        plan.append((str(mode), [int(a) for a in rng.integers(0, 10**6, 3)]))

    def build(*xs):
        vals = list(xs)
        e = mgb.opr.elem
        for mode, picks in plan:
            a, b, c = (vals[p % len(vals)] for p in picks)
            if mode in ("LOG", "LOG1P"):
                a = e.abs(a) + 0.5
            elif mode in ("EXP", "EXPM1"):
                a = e.tanh(a) * 3.0
            elif mode in ("TRUE_DIV", "MOD", "FLOOR_DIV"):
                b = e.abs(b) + 0.5
            elif mode == "POW":
                a, b = e.abs(a) + 0.5, e.tanh(b)
            n = ew_modes.arity(mode)
            vals.append(mgb.opr.elemwise(*[a, b, c][:n], mode=mode))
        # every intermediate feeds the output, bounded so that errors stay relative
        out = vals[nin]
        for v in vals[nin + 1 :]:
            out = e.tanh(out) + v * 0.25
        return out

    return build


@pytest.mark.parametrize(
    "seed, shapes",
    [
        (0, [(64,), (64,), (64,)]),
        (1, [(4, 1, 6), (5, 1), (6,)]),  # broadcasting: the N-d kernel
        (2, [(3, 8), (1,), (3, 8)]),  # a one-element input: the flat kernel with a scalar
        (3, [(4, 6, 5, 5), (1, 6, 1, 1), (4, 6, 5, 5)]),  # a per-channel bias: "bcast"
        (5, [(7, 9), (1, 9), (1,)]),  # a row bias: "bcast" without an inner loop
        (6, [(2, 3, 4, 5, 8), (1, 3, 1, 1, 8), (1,)]),  # NCHW88's per-channel bias: blocked
    ],
)
def test_random_chains_match_unfused(seed, shapes):
    rng = np.random.default_rng(seed)
    build = _random_chain(rng, len(shapes), 14)
    values = [rng.uniform(-3, 3, s).astype(F32) for s in shapes]
    with np.errstate(all="ignore"):
        ref, out, types = _run_both(build, shapes, values)
    assert types.count("JITExecutor") >= 1
    assert "Elemwise" not in types
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5)


def test_every_mode_matches_the_unfused_kernel():
    """One kernel computing every fusable mode, each element selecting one mode's result."""
    modes = sorted(ew_modes.FUSABLE_MODES)
    nin = 4
    expr = []
    for j, m in enumerate(modes):
        expr.append((m, tuple(("i", (j + a) % nin) for a in range(ew_modes.arity(m)))))
    picks = []
    for j in range(len(modes)):  # sel == j ? node j : 0, as two NaN-safe COND_LEQ_MOVs
        expr.append(("COND_LEQ_MOV", (("i", nin), ("c", float(j)), ("t", j))))
        expr.append(("COND_LEQ_MOV", (("c", float(j)), ("i", nin), ("t", len(expr) - 1))))
        picks.append(len(expr) - 1)
    acc = ("t", picks[0])
    for p in picks[1:]:
        expr.append(("ADD", (acc, ("t", p))))
        acc = ("t", len(expr) - 1)
    expr = tuple(expr)

    rng = np.random.default_rng(0)
    n = 40 * len(modes)
    special = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        np.inf,
        -np.inf,
        np.nan,
        1e-40,
        88.7,
        89.0,
        -104.0,
        3.0,
        -3.0,
        0.5,
        -0.5,
        2.5,
        -2.5,
        1e30,
        7.9,
        -4.0,
        1e-4,
    ]
    xs = []
    for k in range(nin):
        x = rng.uniform(-5, 5, n).astype(F32)
        x[::7] = rng.standard_cauchy(len(x[::7])) * 20
        for j in range(len(modes)):  # specials for every mode, in shifted combinations
            x[j * 40 : j * 40 + len(special)] = np.roll(special, k)
        xs.append(x)
    sel = np.repeat(np.arange(len(modes)), 40).astype(F32)
    out = np.empty(n, F32)
    with np.errstate(all="ignore"):
        jc.bind(expr, [*xs, sel], out)()
        ref = jc.interpret(expr, [*xs, sel])
    approx = {
        "TANH",
        "EXP",
        "LOG",
        "ERF",
        "SIGMOID",
        "LOG_SUM_EXP",
        "FUSE_ADD_TANH",
        "FUSE_ADD_SIGMOID",
        "ERFC",
        "POW",
        "ACOS",
        "ASIN",
        "ATAN2",
        "SIN",
        "COS",
        "EXPM1",
        "LOG1P",
    }
    for j, m in enumerate(modes):
        o, r = out[sel == j], ref[sel == j]
        if m in approx:  # libm and the vectorizable approximations: a few ulp
            np.testing.assert_allclose(o, r, rtol=2e-6, atol=1e-6, err_msg=m)
        else:
            np.testing.assert_array_equal(o, r, err_msg=m)


def test_float16_is_fused_through_float32():
    def build(x, y):
        return mgb.opr.elem.sigmoid(x * y + 1.0) - mgb.opr.elem.tanh(y) * 0.5

    rng = np.random.default_rng(3)
    vals = [rng.uniform(-2, 2, (8, 8)).astype(np.float16) for _ in range(2)]
    ref, out, types = _run_both(build, [(8, 8), (8, 8)], vals, dtype=np.float16)
    assert types.count("JITExecutor") == 1 and out.dtype == np.float16
    np.testing.assert_allclose(out.astype(F32), ref.astype(F32), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("reduce", [None, ("MAX", 1)])
def test_falls_back_to_unfused_kernels_when_numba_fails(monkeypatch, reduce):
    def broken(src, args):
        raise RuntimeError("no numba today")

    monkeypatch.setattr(jc, "_kernel", broken)
    expr = (
        ("MUL", (("i", 0), ("c", 2.0))),
        ("SIGMOID", (("t", 0),)),
        ("SUB", (("t", 1), ("i", 1))),
    )
    rng = np.random.default_rng(8)
    x, y = rng.uniform(-2, 2, (3, 5)).astype(F32), rng.uniform(-2, 2, (5,)).astype(F32)
    out = np.empty((3, 1) if reduce else (3, 5), F32)
    with pytest.warns(RuntimeWarning, match="unfused"):
        fn = jc.bind(expr, [x, y], out, reduce)
    fn()
    np.testing.assert_allclose(out, jc.interpret(expr, [x, y], reduce), rtol=1e-6)


def _record_parts(monkeypatch, parts: int = 3) -> list:
    """Make parallel kernels split into ``parts``; returns the list of the part counts bound."""
    seen: list = []
    real, real_in_turn = jc.concurrently, jc.take_in_turn

    def concurrently(calls):
        seen.append(len(calls))
        return real(calls)

    def take_in_turn(table):  # a split kernel: one row of parts per thread
        seen.append(len(table))
        return real_in_turn(table)

    monkeypatch.setattr(jc, "PARALLEL_MIN_SIZE", 1024)
    monkeypatch.setattr(jc, "num_threads", lambda: parts)
    monkeypatch.setattr(jc, "concurrently", concurrently)
    monkeypatch.setattr(jc, "take_in_turn", take_in_turn)
    return seen


_EXPR3 = (("MUL", (("i", 0), ("i", 1))), ("EXP", (("t", 0),)), ("ADD", (("t", 1), ("i", 0))))


@pytest.mark.parametrize(
    "xshape, yshape",
    [
        ((5000,), (5000,)),  # flat: split along the index
        ((1, 24, 9, 10), (1, 24, 1, 1)),  # bcast with A = 1: split along the channels
        ((6, 8, 70), (1, 8, 1)),  # bcast: split along A, the channel operand read whole
        ((12, 5, 40), (12, 1, 40)),  # nd: split along the first dim
    ],
)
def test_parallel_kernel_is_split_over_the_kernel_pool(monkeypatch, xshape, yshape):
    seen = _record_parts(monkeypatch)
    rng = np.random.default_rng(4)
    x = rng.uniform(-2, 2, xshape).astype(F32)
    y = rng.uniform(-2, 2, yshape).astype(F32)
    out = np.full(np.broadcast_shapes(xshape, yshape), np.nan, F32)
    jc.bind(_EXPR3, [x, y], out)()
    assert seen == [3]
    np.testing.assert_allclose(out, np.exp(x * y) + x, rtol=2e-6, atol=1e-6)


def test_parallel_kernel_in_place_and_no_numba_threading_layer(monkeypatch):
    seen = _record_parts(monkeypatch, parts=2)
    rng = np.random.default_rng(5)
    x = rng.uniform(-2, 2, (1, 16, 8, 9)).astype(F32)
    b = rng.uniform(-2, 2, (1, 16, 1, 1)).astype(F32)
    want = np.exp(x * b) + x
    jc.bind(_EXPR3, [x, b], x)()  # the output is input 0
    assert seen == [2]
    np.testing.assert_allclose(x, want, rtol=2e-6, atol=1e-6)
    import numba.np.ufunc.parallel as npar

    assert not npar._is_initialized  # no OpenMP/TBB/workqueue pool next to OpenBLAS's


def test_small_kernel_is_one_call(monkeypatch):
    seen = _record_parts(monkeypatch)
    x = np.ones(600, F32)  # below PARALLEL_MIN_SIZE // 2 per part: one part
    out = np.empty_like(x)
    jc.bind(_EXPR3, [x, x], out)()
    assert seen == [1]
    np.testing.assert_allclose(out, np.exp(1.0) + 1.0, rtol=1e-6)


def test_transcendental_kernels_split_from_fewer_elements(monkeypatch):
    monkeypatch.setattr(jc, "PARALLEL_MIN_SIZE_TRANSCENDENTAL", 4096)
    seen = _record_parts(monkeypatch, parts=2)
    monkeypatch.setattr(jc, "PARALLEL_MIN_SIZE", 1 << 20)
    silu = (("SIGMOID", (("i", 0),)), ("MUL", (("i", 0), ("t", 0))))
    add = (("ADD", (("i", 0), ("i", 1))),)
    assert jc.parallel_min_size(silu) == 4096 and jc.parallel_min_size(add) == 1 << 20
    x = np.linspace(-9, 9, 10000, dtype=F32)
    jc.bind(silu, [x], np.empty_like(x))
    jc.bind(add, [x, x], np.empty_like(x))
    assert seen == [2, 1]


_GATE = (("SIGMOID", (("i", 0),)), ("MUL", (("t", 0), ("i", 1))))


@pytest.mark.parametrize("expr", [_EXPR3, _GATE])
def test_split_kernels_are_bit_identical_whatever_the_thread_count(monkeypatch, expr):
    """Every element is computed by the same code on any part (vector body or scalar tail)."""
    rng = np.random.default_rng(8)
    x = rng.uniform(-90, 90, (1, 7, 13, 11, 8)).astype(F32)
    x.reshape(-1)[:4] = [np.inf, -np.inf, np.nan, 0.0]
    g = rng.uniform(-3, 3, (1, 7, 1, 1, 8)).astype(F32)
    ys = []
    for parts in (1, 2, 3):
        seen = _record_parts(monkeypatch, parts)
        y = np.empty_like(x)
        jc.bind(expr, [x, g], y)()
        assert seen[-1] == parts
        ys.append(y)
    for y in ys[1:]:
        np.testing.assert_array_equal(y.view(np.int32), ys[0].view(np.int32))


# ---- the pass -----------------------------------------------------------------------------
def _compile_types(build, shapes, jit=1, level=2, dtype=F32):
    g = _graph(jit, level)
    xs = _args(g, shapes, dtype)
    ys = build(*xs)
    ys = ys if isinstance(ys, (list, tuple)) else [ys]
    f = g.compile(xs, [mgb.copy_output(y) for y in ys])
    return _types(f), f


def _chain5(x, y):
    e = mgb.opr.elem
    return e.relu(e.tanh(x * y + 1.0) - y)


def test_pass_needs_jit_option_or_level_3():
    assert "JITExecutor" not in _compile_types(_chain5, [(4,), (4,)], jit=0)[0]
    types, _ = _compile_types(_chain5, [(4,), (4,)], jit=1)
    assert types.count("JITExecutor") == 1 and "Elemwise" not in types
    types, _ = _compile_types(_chain5, [(4,), (4,)], jit=0, level=3)
    assert types.count("JITExecutor") == 1 and "Elemwise" not in types


def test_single_op_and_integer_ops_are_not_fused():
    types, _ = _compile_types(lambda x, y: x + y, [(4,), (4,)])
    assert types.count("Elemwise") == 1 and "JITExecutor" not in types
    types, _ = _compile_types(lambda x, y: (x + y) * x - y, [(4,), (4,)], dtype=np.int32)
    assert "JITExecutor" not in types


def test_vars_used_elsewhere_end_a_subgraph():
    def build(x, y):
        a = mgb.opr.elem.exp(x * y)  # an output too: computed by its own subgraph
        b = mgb.opr.elem.tanh(a + 1.0) * a
        return [a, b]

    types, f = _compile_types(build, [(6,), (6,)])
    assert types.count("JITExecutor") == 2 and "Elemwise" not in types
    x, y = np.linspace(-1, 1, 6, dtype=F32), np.linspace(0, 2, 6, dtype=F32)
    a, b = f(x, y)
    np.testing.assert_allclose(a, np.exp(x * y), rtol=2e-6)
    np.testing.assert_allclose(b, np.tanh(np.exp(x * y) + 1) * np.exp(x * y), rtol=2e-6)

    def reshaped(x, y):
        a = x * y + 1.0  # also read by Reshape: not private to the elemwise subgraph
        r = mgb.opr.reshape(a, (2, 3))
        return mgb.opr.elem.tanh(a) * y + mgb.opr.reshape(r, (6,))

    types, _ = _compile_types(reshaped, [(6,), (6,)])
    assert types.count("JITExecutor") == 2 and "Elemwise" not in types


def test_subgraph_reading_another_reads_the_fused_result():
    def build(x, y):
        a = mgb.opr.elem.exp(x * y + 1.0)
        s = mgb.opr.reduce_(a, "SUM", axis=0, keepdims=True)  # a non-elemwise reader
        return (a - s) * (a + s)

    types, f = _compile_types(build, [(5,), (5,)])
    assert types.count("JITExecutor") == 2 and "Elemwise" not in types
    x, y = np.linspace(-1, 1, 5, dtype=F32), np.linspace(0, 1, 5, dtype=F32)
    a = np.exp(x * y + 1)
    (out,) = f(x, y)
    np.testing.assert_allclose(out, (a - a.sum()) * (a + a.sum()), rtol=1e-5)


@pytest.mark.parametrize(
    "mode, axis, shapes",
    [
        ("SUM", None, [(6, 7), (6, 7)]),
        ("MEAN", 0, [(6, 7), (6, 7)]),
        ("MAX", 1, [(6, 7), (7,)]),
        ("MIN", None, [(6, 1), (7,)]),
    ],
)
def test_level_2_fuses_the_closing_reduce(mode, axis, shapes):
    def build(x, y):
        z = mgb.opr.elem.sigmoid(x * y) - y
        return mgb.opr.reduce_(z, mode, axis=axis, keepdims=True)

    rng = np.random.default_rng(5)
    vals = [rng.uniform(-2, 2, s).astype(F32) for s in shapes]
    ref, out, types = _run_both(build, shapes, vals, jit=2)
    assert types.count("JITExecutor") == 1 and "Reduce" not in types
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    types, _ = _compile_types(build, shapes, jit=1)
    assert "Reduce" in types and types.count("JITExecutor") == 1


# ---- the operator -------------------------------------------------------------------------
@pytest.mark.parametrize("with_reduce", [False, True])
def test_grad_through_fused_op_matches_unfused(with_reduce):
    def build(x, w):
        e = mgb.opr.elem
        y = e.tanh(x * w + 0.5) * e.sigmoid(w) - e.exp(x) * 0.1
        return mgb.opr.reduce_(y * y, "SUM", axis=1, keepdims=True)

    rng = np.random.default_rng(6)
    xv, wv = rng.uniform(-1, 1, (3, 4)).astype(F32), rng.uniform(-1, 1, (4,)).astype(F32)
    res = []
    for fuse in (False, True):
        g = _graph(0, level=1)
        x, w = _args(g, [(3, 4), (4,)])
        y = build(x, w)
        if fuse:
            node = y.node if with_reduce else y.node.owner.inputs[0]
            fused = fuse_elemwise(g, [node], with_reduce=with_reduce)[node]
            assert fused.owner.type_name == "JITExecutor"
            y = mgb.SymbolVar(fused)
            if not with_reduce:
                y = mgb.opr.reduce_(y, "SUM", axis=1, keepdims=True)
        loss = mgb.opr.reduce_(y * y, "SUM")
        gx, gw = mgb.grad(loss, [x, w])
        f = g.compile([x, w], [mgb.copy_output(gx), mgb.copy_output(gw)])
        res.append(f(xv, wv))
    for a, b in zip(*res):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def test_training_graph_fuses_after_the_gradient_is_expanded():
    """Fusion waits for the VirtualGrad expansion: the backward reads forward intermediates,
    which must stay materialized (fusing the loss first would compute the forward twice)."""
    rng = np.random.default_rng(7)
    xv, wv = rng.uniform(-1, 1, (8, 4)).astype(F32), rng.uniform(-1, 1, (4,)).astype(F32)
    res, counts = [], []
    for jit in (0, 2):
        g = _graph(jit)
        x, w = _args(g, [(8, 4), (4,)])
        e = mgb.opr.elem
        y = e.tanh(x * w + 0.5) * e.sigmoid(w)
        loss = mgb.opr.reduce_(y * y, "MEAN")
        gw = mgb.grad(loss, w)
        f = g.compile([x, w], [mgb.copy_output(loss), mgb.copy_output(gw)])
        res.append(f(xv, wv))
        types = _types(f)
        counts.append((types.count("Elemwise"), types.count("JITExecutor")))
    (ew0, jit0), (ew2, jit2) = counts
    assert jit0 == 0 and jit2 >= 1 and ew2 + jit2 < ew0
    for a, b in zip(*res):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def test_static_value_inference_does_not_compile():
    g = _graph(0)
    a = mgb.make_immutable(CN, g, np.array([1.0, 2.0], F32))
    b = mgb.make_immutable(CN, g, np.array([3.0, 4.0], F32))
    y = jit_executor([a, b], (("MUL", (("i", 0), ("i", 1))), ("EXP", (("t", 0),))))
    before = dict(jc.STATS)
    np.testing.assert_allclose(y.inferred_value, np.exp([3.0, 8.0]), rtol=1e-6)
    assert jc.STATS == before


def test_bad_inputs_raise():
    g = _graph(0)
    x = mgb.make_arg(CN, g, shape=(3,), dtype=np.int32)
    with pytest.raises(mgb.MegBrainError, match="float"):
        jit_executor([x, x], (("ADD", (("i", 0), ("i", 1))),))
    x, y = _args(g, [(3,), (4,)])
    with pytest.raises(mgb.MegBrainError, match="broadcast"):
        jit_executor([x, y], (("ADD", (("i", 0), ("i", 1))),))
    with pytest.raises(mgb.MegBrainError, match="ERFINV"):
        jit_executor([x], (("ERFINV", (("i", 0),)),))


def test_in_place_output_repeated_runs():
    g = _graph(1)
    (x,) = _args(g, [(16,)])
    f = g.compile([x], mgb.copy_output(_chain5(x, x)))
    for k in range(3):
        xv = np.linspace(-2, 2, 16, dtype=F32) * (k + 1)
        np.testing.assert_allclose(
            f(xv), np.maximum(np.tanh(xv * xv + 1) - xv, 0), rtol=2e-6, atol=1e-7
        )


# ---- caches -------------------------------------------------------------------------------
def test_second_compile_hits_the_memory_cache():
    def run():
        g = _graph(1)
        x, y = _args(g, [(4,), (4,)])
        f = g.compile([x, y], mgb.copy_output(_chain5(x, y)))
        return f(np.arange(4, dtype=F32), np.ones(4, F32))

    first = run()
    before = dict(jc.STATS)
    np.testing.assert_array_equal(run(), first)
    assert jc.STATS["compiled"] == before["compiled"]
    assert jc.STATS["disk_loads"] == before["disk_loads"]
    assert jc.STATS["memory_hits"] > before["memory_hits"]


_CHILD = textwrap.dedent(
    """
    import json, time
    import numpy as np
    t0 = time.perf_counter()
    from megbrain.kernels import jit_codegen as jc
    expr = (("MUL", (("i", 0), ("c", 3.0))), ("TANH", (("t", 0),)), ("SUB", (("t", 1), ("i", 1))))
    x = np.linspace(-1, 1, 8, dtype=np.float32)
    out = np.empty_like(x)
    jc.bind(expr, [x, x], out)()
    assert np.allclose(out, np.tanh(3 * x) - x, atol=1e-6)
    print(json.dumps(dict(jc.STATS, seconds=time.perf_counter() - t0)))
    """
)


def test_disk_cache_is_used_by_another_process(tmp_path):
    env = dict(os.environ, MGB_JIT_CACHE_DIR=str(tmp_path))
    runs = []
    for _ in range(2):
        p = subprocess.run(
            [sys.executable, "-c", _CHILD],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    assert runs[0]["compiled"] == 1 and runs[0]["disk_loads"] == 0
    assert runs[1]["compiled"] == 0 and runs[1]["disk_loads"] == 1
    assert list(tmp_path.glob("mgbjit_*.py"))


def test_import_megbrain_compiles_nothing_and_starts_no_numba_threads():
    # numba is imported at module level by the kernels that compile; importing megbrain must
    # still compile no kernel and start no Numba threading layer (no OpenMP/TBB pool)
    code = (
        "import megbrain; from megbrain.kernels import jit_codegen as jc; "
        "from numba.np.ufunc import parallel; print(parallel._is_initialized, jc.STATS['compiled'])"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert p.stdout.split() == ["False", "0"]


def test_bcast_shape_collapses_per_channel_operands():
    assert jc.bcast_shape((8, 3, 4, 5), [(8, 3, 4, 5), (1, 3, 1, 1)]) == ((8, 3, 20), ("f", "c"))
    # leading dims missing, a scalar, size-1 dims of the full shape ignored
    got = jc.bcast_shape((8, 1, 3, 4), [(3, 4), (1,), (8, 1, 3, 4)])
    assert got == ((8, 12, 1), ("c", "s", "f"))
    assert jc.bcast_shape((8, 3), [(8, 3), (8, 3)]) is None  # no channel operand: flat
    assert jc.bcast_shape((8, 3, 4), [(8, 1, 4), (8, 3, 4)]) is None  # ones inside the block
    assert jc.bcast_shape((8, 3, 4), [(1, 3, 1), (8, 3, 1)]) is None  # two different blocks


def test_bcast_shape_takes_the_blocked_channels_of_nchw88():
    # (1, C/8, 1, 1, 8) over (N, C/8, H, W, 8): A = N, B = C/8, K = H * W, L = 8
    got = jc.bcast_shape((2, 4, 5, 6, 8), [(2, 4, 5, 6, 8), (1, 4, 1, 1, 8), (1,)])
    assert got == ((2, 4, 30, 8), ("f", "c", "s"))
    assert jc.bcast_shape((1, 4, 5, 6, 8), [(1, 4, 1, 1, 8)]) == ((1, 4, 30, 8), ("c",))
    assert jc.bcast_shape((1, 4, 5, 6, 8), [(1, 4, 1, 6, 8)]) is None  # not the last dim alone
    assert jc.bcast_shape((2, 4, 5, 6, 4), [(1, 4, 1, 1, 4)]) is None  # not 8 lanes


def test_bcast_layout_in_place_and_kernel_source():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((6, 4, 9)).astype(F32)
    b = rng.standard_normal((1, 4, 1)).astype(F32)
    expr = (("FUSE_ADD_RELU", (("i", 0), ("i", 1))), ("MUL", (("t", 0), ("c", 2.0))))
    ref = jc.interpret(expr, [x, b])
    y = x.copy()
    jc.bind(expr, [y, b], y)()
    np.testing.assert_array_equal(y, ref)
    src = jc.kernel_source(expr, ("bcast", (("f", "c"), True), 0))
    assert "c1 = x1[b]" in src and "for k in range(out.shape[2])" in src
    assert jc.bind(expr, [x[:, :, ::2], b], np.empty((6, 4, 5), F32), layouts=("bcast",)) is None


@pytest.mark.parametrize("parts", [1, 3])
@pytest.mark.parametrize(
    "xshape, most",  # most: the parts the arrays allow (split along A, or B when A is 1)
    [((2, 5, 6, 7, 8), 2), ((1, 5, 6, 7, 8), 2), ((1, 7, 3, 8), 1)],
)
def test_blocked_bcast_layout_matches_the_interpreter(monkeypatch, parts, xshape, most):
    """The squeeze-and-excitation multiply of NCHW88 (and a (B, 8) operand of 4 dims), split
    or not, in place or not: the same values as the unfused kernels."""
    seen = _record_parts(monkeypatch, parts)
    rng = np.random.default_rng(6)
    x = rng.uniform(-3, 3, xshape).astype(F32)
    gshape = (1, xshape[1]) + (1,) * (len(xshape) - 3) + (xshape[-1],)
    g = rng.uniform(-3, 3, gshape).astype(F32)
    expr = (("SIGMOID", (("i", 1),)), ("MUL", (("i", 0), ("t", 0))), ("ADD", (("t", 1), ("c", 1))))
    ref = jc.interpret(expr, [x, g])
    out = np.full(xshape, np.nan, F32)
    jc.bind(expr, [x, g], out)()
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)
    assert seen == [min(parts, most)]
    y = x.copy()
    jc.bind((("MUL", (("i", 0), ("i", 1))),), [y, g], y)()  # in place
    np.testing.assert_array_equal(y, x * g)
    src = jc.kernel_source(expr, ("bcast", (("f", "c"), "blocked"), None))
    assert "for l in range(8)" in src and "x1[b, l]" in src


def test_elemwise_mul_of_a_blocked_gate_runs_compiled():
    from megbrain.kernels import elemwise as ew

    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 6, 14, 14, 8)).astype(F32)
    g = rng.standard_normal((1, 6, 1, 1, 8)).astype(F32)
    out = np.empty_like(x)
    assert ew._compiled_bind("MUL", [x, g], out) is not None
    ew.bind("MUL", [x, g], out)()
    np.testing.assert_array_equal(out, x * g)
