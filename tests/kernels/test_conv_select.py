"""Convolution algorithm selection (megbrain.kernels.conv.registry): every registered algorithm
of every kind against the float64 reference wherever it is usable; the execution policy
(HEURISTIC unchanged, PROFILE timing once and caching in memory and in the persistent cache,
REPRODUCIBLE filtering, PROFILE_HEURISTIC reading only) and the operator param reaching it."""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_conv_algos import (
    ATOL,
    RTOL,
    _arrays,
    _geometry,
    conv_cases,
    ref_backward_data,
    ref_backward_filter,
    ref_forward,
)

from megbrain.api.persistent_cache import PersistentCacheOnServer
from megbrain.errors import MegBrainError
from megbrain.kernels import workspace
from megbrain.kernels.conv import common as conv_common
from megbrain.kernels.conv import im2col as conv_im2col
from megbrain.kernels.conv import registry as conv_algos

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "opr"))
from opr_harness import check_grad, inputs, make_graph  # noqa: E402

KINDS = conv_algos.KINDS
#: the GEMM algorithms of megbrain.kernels.conv, whose HEURISTIC choices predate the registry
BUILT_IN = {
    "IM2COL_GEMM", "IM2COL_GEMM_PER_SAMPLE", "AS_FORWARD_CONV", "GEMM_COL2IM",
    "IM2COL_GEMM_DIFF_NHWC", "IM2COL_GEMM_DIFF_ROWS",
}  # fmt: skip


def _operands(c, kind, dtype=np.float32):
    """(a, b, out, reference) of a ``kind`` convolution on case ``c``."""
    x, w, dy = _arrays(c, dtype)
    if kind == "forward":
        return x, w, np.full(dy.shape, np.nan, dtype), ref_forward(c, x, w)
    if kind == "backward_data":
        return w, dy, np.full(x.shape, np.nan, dtype), ref_backward_data(c, w, dy)
    return x, dy, np.full(w.shape, np.nan, dtype), ref_backward_filter(c, x, dy, w.shape)


@pytest.fixture
def fresh_choices(tmp_path):
    """Empty in-memory choices and a persistent cache in a temporary directory, registered
    as the process-wide one for the test (restored after)."""
    conv_algos.clear_choices()
    cache = PersistentCacheOnServer(str(tmp_path))
    prev = conv_algos.set_persistent_cache(cache)
    yield cache
    conv_algos.set_persistent_cache(prev)
    cache.close()
    conv_algos.clear_choices()


@pytest.fixture
def built_in_only(monkeypatch):
    """The registry restricted to the built-in algorithms (later ones may win the heuristic)."""
    every = conv_algos.algorithms
    monkeypatch.setattr(
        conv_algos, "algorithms", lambda kind: [a for a in every(kind) if a.name in BUILT_IN]
    )


@pytest.fixture
def timings(monkeypatch):
    """Counts the candidates timed, by name."""
    calls: list[str] = []
    real = conv_algos.time_algorithms

    def counted(algos, *args, **kw):
        calls.extend(a.name for a in algos)
        return real(algos, *args, **kw)

    monkeypatch.setattr(conv_algos, "time_algorithms", counted)
    return calls


# ---- every algorithm against the reference -------------------------------------------------
def test_registry_lists_the_built_in_algorithms():
    names = {k: [a.name for a in conv_algos.algorithms(k)] for k in KINDS}
    assert {"IM2COL_GEMM", "IM2COL_GEMM_PER_SAMPLE"} <= set(names["forward"])
    assert {"AS_FORWARD_CONV", "GEMM_COL2IM"} <= set(names["backward_data"])
    assert {"IM2COL_GEMM_DIFF_NHWC", "IM2COL_GEMM_DIFF_ROWS"} <= set(names["backward_filter"])
    assert BUILT_IN <= {n for k in KINDS for n in names[k]}
    for k in KINDS:
        prios = [a.priority for a in conv_algos.algorithms(k)]
        assert prios == sorted(prios, reverse=True)


@settings(max_examples=40, deadline=None)
@given(c=conv_cases(), kind=st.sampled_from(KINDS))
def test_every_usable_algorithm_matches_float64(c, kind):
    # backward data and backward filter are the convolution's gradients w.r.t. src and filter
    a, b, out, ref = _operands(c, kind)
    args = (a, b, out, *_geometry(c))
    usable = conv_algos.usable_algorithms(kind, *args)
    assert usable, kind
    for algo in conv_algos.algorithms(kind):
        if algo not in usable:
            continue
        out[...] = np.nan
        algo.bind(*args)()
        np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL, err_msg=algo.name)


def _strided(a: np.ndarray, how: str) -> np.ndarray:
    """``a``'s values in another memory layout: Fortran order, or every other element of a
    twice-as-long last dim."""
    if how == "fortran":
        return np.asfortranarray(a)
    wide = np.full(a.shape[:-1] + (2 * a.shape[-1],), np.nan, a.dtype)
    wide[..., ::2] = a
    return wide[..., ::2]


@settings(max_examples=25, deadline=None)
@given(
    c=conv_cases(),
    kind=st.sampled_from(KINDS),
    which=st.sampled_from([0, 1, 2]),
    how=st.sampled_from(["fortran", "step"]),
)
def test_every_algorithm_on_strided_operands(c, kind, which, how):
    a, b, out, ref = _operands(c, kind)
    ops = [a, b, out]
    ops[which] = _strided(ops[which], how)
    args = (*ops, *_geometry(c))
    for algo in conv_algos.usable_algorithms(kind, *args):
        ops[2][...] = np.nan
        algo.bind(*args)()
        np.testing.assert_allclose(ops[2], ref, rtol=RTOL, atol=ATOL, err_msg=algo.name)


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
@pytest.mark.parametrize("kind", KINDS)
def test_every_algorithm_in_other_dtypes(kind, dtype):
    c = _case(sshape=(7, 6), icg=3, ocg=2, n=2, seed=3)
    a, b, out, ref = _operands(c, kind, dtype)
    args = (a, b, out, *_geometry(c))
    tol = dict(rtol=RTOL, atol=ATOL) if dtype == np.float64 else dict(rtol=2e-3, atol=2e-2)
    for algo in conv_algos.usable_algorithms(kind, *args):
        out[...] = np.nan
        algo.bind(*args)()
        assert out.dtype == dtype
        np.testing.assert_allclose(out.astype(np.float64), ref, **tol, err_msg=algo.name)


@settings(max_examples=15, deadline=None)
@given(c=conv_cases(nsp=2), kind=st.sampled_from(KINDS), seed=st.integers(0, 100))
def test_every_algorithm_in_batch_chunks(c, kind, seed):
    c = dict(c, n=2 + seed % 3)
    per_sample = c["g"] * c["icg"] * math.prod(c["fshape"]) * math.prod(c["oshape"]) * 4
    a, b, out, ref = _operands(c, kind)
    args = (a, b, out, *_geometry(c))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv_common, "COL_BUFFER_LIMIT", per_sample * (1 + seed % 2))
        for algo in conv_algos.usable_algorithms(kind, *args):
            out[...] = np.nan
            algo.bind(*args)()
            np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL, err_msg=algo.name)


@pytest.mark.parametrize("kind", KINDS)
def test_every_algorithm_writes_its_workspace_before_reading(kind):
    c = dict(n=3, g=2, icg=2, ocg=3, fshape=(3, 3), stride=(1, 1), pad=(1, 1), dilate=(1, 1),
             sshape=(6, 5), flip=True, seed=11)  # fmt: skip
    c["oshape"] = (6, 5)
    a, b, out, ref = _operands(c, kind)
    args = (a, b, out, *_geometry(c))
    for algo in conv_algos.usable_algorithms(kind, *args):
        rec = workspace.Recorder()
        with workspace.allocating(rec):
            algo.bind(*args)
        buf = np.empty(max(rec.nbytes, 1), np.uint8)
        with workspace.allocating(workspace.Carver(buf)):
            step = algo.bind(*args)
        for _ in range(2):
            buf[:] = 0xFF  # NaN as float32
            out[...] = np.nan
            step()
            np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL, err_msg=algo.name)


@pytest.mark.parametrize("stride", [(1, 1), (2, 2)])
@pytest.mark.parametrize("kind", KINDS)
def test_every_algorithm_allocates_nothing_when_run(kind, stride):
    # the buffers come from the bind (workspace or private), never from the run: at most
    # NumPy's bounded iterator buffers (~100 KB), far below a quarter of the largest operand
    import tracemalloc

    c = _case(sshape=(32, 32), stride=stride, icg=16, ocg=16, n=4, seed=2)
    a, b, out, _ = _operands(c, kind)
    args = (a, b, out, *_geometry(c))
    limit = max(128 << 10, max(x.nbytes for x in (a, b, out)) // 4)
    for algo in conv_algos.usable_algorithms(kind, *args):
        step = algo.bind(*args)
        step()
        tracemalloc.start()
        try:
            step()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < limit, (algo.name, peak)


# ---- HEURISTIC -----------------------------------------------------------------------------
def _case(sshape=(8, 8), fshape=(3, 3), stride=(1, 1), pad=(1, 1), icg=2, ocg=3, n=2, seed=1):
    oshape = tuple(conv_common.conv_out_size(*a) for a in zip(sshape, fshape, stride, pad, (1, 1)))
    return dict(n=n, g=1, icg=icg, ocg=ocg, fshape=fshape, stride=stride, pad=pad,
                dilate=(1, 1), sshape=sshape, oshape=oshape, flip=False, seed=seed)  # fmt: skip


@pytest.mark.parametrize(
    "kind,case,name",
    [
        ("forward", _case(icg=2), "IM2COL_GEMM_PER_SAMPLE"),  # K = 18 <= PER_SAMPLE_MAX_K
        ("forward", _case(icg=8), "IM2COL_GEMM"),  # K = 72
        # "same" padding: the compiled col2im while one sample's columns are small
        ("backward_data", _case(), "GEMM_COL2IM"),
        ("backward_data", _case(sshape=(56, 56), icg=64, ocg=64, n=1), "AS_FORWARD_CONV"),
        ("backward_data", _case(stride=(2, 2)), "GEMM_COL2IM"),
        ("backward_data", _case(sshape=(12, 12), fshape=(5, 5), pad=(0, 0)), "GEMM_COL2IM"),
        ("backward_filter", _case(), "IM2COL_GEMM_DIFF_NHWC"),
    ],
)
def test_heuristic_keeps_the_previous_choices(kind, case, name, built_in_only):
    a, b, out, _ = _operands(case, kind)
    for strategy in ("HEURISTIC", "HEURISTIC_REPRODUCIBLE"):
        algo = conv_algos.select(kind, a, b, out, *_geometry(case), strategy=strategy)
        assert algo.name == name


def test_heuristic_follows_the_tunables(monkeypatch, built_in_only):
    c = _case(icg=8)
    a, b, out, _ = _operands(c, "forward")
    monkeypatch.setattr(conv_im2col, "PER_SAMPLE_MAX_K", math.inf)
    assert conv_algos.select("forward", a, b, out, *_geometry(c)).name == "IM2COL_GEMM_PER_SAMPLE"


def test_heuristic_does_not_time(fresh_choices, timings):
    c = _case()
    a, b, out, _ = _operands(c, "backward_filter")
    conv_algos.bind("backward_filter", a, b, out, *_geometry(c))()
    conv_algos.bind("backward_filter", a, b, out, *_geometry(c), strategy="PROFILE_HEURISTIC")
    assert timings == []


# ---- PROFILE -------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_profile_times_once_and_caches(kind, fresh_choices, timings):
    c = _case()
    a, b, out, ref = _operands(c, kind)
    args = (a, b, out, *_geometry(c))
    before = [x.copy() for x in (a, b)]
    usable = conv_algos.usable_algorithms(kind, *args)
    assert len(usable) >= 2
    algo = conv_algos.select(kind, *args, strategy="PROFILE")
    assert algo in usable
    assert sorted(timings) == sorted(u.name for u in usable)
    # profiling wrote nothing the operator owns: the inputs are intact, out still NaN
    for x, y in zip((a, b), before):
        np.testing.assert_array_equal(x, y)
    assert np.isnan(out).all()
    # a second bind reads the in-memory choice
    step = conv_algos.bind(kind, *args, strategy="PROFILE")
    assert len(timings) == len(usable)
    step()
    np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL)
    # PROFILE_HEURISTIC uses the profiled choice
    assert conv_algos.select(kind, *args, strategy="PROFILE_HEURISTIC") == algo
    # it was persisted under the key
    key = conv_algos.choice_key(kind, *args, usable)
    assert fresh_choices.get(conv_algos.CACHE_CATEGORY, key.encode()) == algo.name.encode()


def test_profile_reads_a_persisted_choice(tmp_path, fresh_choices, timings):
    c = _case()
    a, b, out, _ = _operands(c, "backward_data")
    args = (a, b, out, *_geometry(c))
    first = PersistentCacheOnServer(str(tmp_path / "shared"))
    chosen = conv_algos.select("backward_data", *args, strategy="PROFILE", cache=first)
    first.close()
    assert timings
    timings.clear()
    conv_algos.clear_choices()
    # a fresh cache object over the same directory: the choice comes back without timing
    second = PersistentCacheOnServer(str(tmp_path / "shared"))
    got = conv_algos.select("backward_data", *args, strategy="PROFILE", cache=second)
    second.close()
    assert got == chosen and timings == []


def test_profile_ignores_a_stale_name(fresh_choices, timings):
    c = _case()
    a, b, out, _ = _operands(c, "forward")
    args = (a, b, out, *_geometry(c))
    usable = conv_algos.usable_algorithms("forward", *args)
    key = conv_algos.choice_key("forward", *args, usable)
    fresh_choices.put(conv_algos.CACHE_CATEGORY, key.encode(), b"NO_SUCH_ALGORITHM")
    algo = conv_algos.select("forward", *args, strategy="PROFILE")
    assert algo in usable and timings  # profiled again
    assert fresh_choices.get(conv_algos.CACHE_CATEGORY, key.encode()) == algo.name.encode()


def test_profile_key_depends_on_shape_strides_and_candidates():
    c = _case()
    a, b, out, _ = _operands(c, "forward")
    geo = _geometry(c)
    usable = conv_algos.usable_algorithms("forward", a, b, out, *geo)
    key = conv_algos.choice_key("forward", a, b, out, *geo, usable)
    assert key != conv_algos.choice_key("forward", a, b, out, *geo, usable[:1])
    a2 = np.asfortranarray(a)
    assert key != conv_algos.choice_key("forward", a2, b, out, *geo, usable)
    assert key != conv_algos.choice_key("forward", a, b, out, (1, 1), (1, 1), (1, 1), True, usable)
    assert str(conv_algos.blas_threads()) in key


def test_profile_on_strided_operands_matches_float64(fresh_choices):
    c = _case(n=3)
    x, w, dy = _arrays(c)
    xs = np.ascontiguousarray(np.swapaxes(x, 2, 3)).swapaxes(2, 3)  # non-C-contiguous source
    out = np.full(dy.shape, np.nan, np.float32)
    conv_algos.bind("forward", xs, w, out, *_geometry(c), strategy="PROFILE")()
    np.testing.assert_allclose(out, ref_forward(c, x, w), rtol=RTOL, atol=ATOL)


# ---- REPRODUCIBLE --------------------------------------------------------------------------
@pytest.fixture
def fast_unreproducible():
    """A fake non-reproducible forward algorithm of top priority that always profiles
    fastest (its bind does nothing), registered for the test only."""
    fake = conv_algos.ConvAlgorithm(
        "FAKE_NONDETERMINISTIC",
        "forward",
        bind=lambda *args: (lambda: None),
        usable=lambda *args: True,
        reproducible=False,
        priority=1000,
    )
    conv_algos.register(fake)
    yield fake
    conv_algos.unregister("forward", fake.name)


def test_reproducible_strategies_skip_unreproducible_algorithms(
    fast_unreproducible, fresh_choices, timings
):
    c = _case(icg=8)
    a, b, out, _ = _operands(c, "forward")
    args = (a, b, out, *_geometry(c))
    assert conv_algos.select("forward", *args).name == fast_unreproducible.name
    assert conv_algos.select("forward", *args, strategy="PROFILE") == fast_unreproducible
    timings.clear()
    for strategy in ("HEURISTIC_REPRODUCIBLE", "PROFILE_REPRODUCIBLE"):
        algo = conv_algos.select("forward", *args, strategy=strategy)
        assert algo.reproducible and algo != fast_unreproducible
    assert timings and fast_unreproducible.name not in timings  # not even timed


def test_registry_rejects_bad_algorithms():
    algo = conv_algos.algorithms("forward")[0]
    with pytest.raises(ValueError, match="already registered"):
        conv_algos.register(conv_algos.ConvAlgorithm(algo.name, "forward", len, len))
    with pytest.raises(ValueError, match="upper case"):
        conv_algos.register(conv_algos.ConvAlgorithm("lower", "forward", len, len))
    with pytest.raises(ValueError, match="kind"):
        conv_algos.register(conv_algos.ConvAlgorithm("X", "sideways", len, len))
    conv_algos.register(algo)  # the same object again is fine


def test_bad_strategy_and_geometry_are_rejected():
    c = _case()
    a, b, out, _ = _operands(c, "forward")
    with pytest.raises(ValueError, match="unknown execution strategy 'FASTEST'"):
        conv_algos.select("forward", a, b, out, *_geometry(c), strategy="FASTEST")
    with pytest.raises(ValueError, match="Convolution: src"):
        conv_algos.select("forward", a, b, out[:, :, 1:], *_geometry(c))


# ---- through the operators -----------------------------------------------------------------
def _conv_graph(strategy, **options):
    import megbrain.opr as O

    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, (2, 8, 7, 7)).astype(np.float32)
    w = rng.uniform(-1, 1, (4, 8, 3, 3)).astype(np.float32)
    g = make_graph(**options)
    (xv, wv), hosts = inputs(g, x, w)
    y = O.convolution(xv, wv, pad_h=1, pad_w=1, strategy=strategy)
    return g, y, x, w, hosts


def _run(g, y):
    got = []
    f = g.compile([(y.node, lambda a: got.append(np.array(a)))])
    f.execute().wait()
    return got[0]


@pytest.mark.parametrize("strategy", conv_algos.STRATEGIES)
def test_operator_param_reaches_the_choice(strategy, fresh_choices, timings):
    g, y, x, w, _ = _conv_graph(strategy)
    got = _run(g, y)
    c = _case(sshape=(7, 7), icg=8, ocg=4)
    np.testing.assert_allclose(got, ref_forward(c, x, w[None]), rtol=RTOL, atol=ATOL)
    opr = y.node.owner
    assert opr.param.strategy == strategy
    assert opr.chosen_algorithm in {a.name for a in conv_algos.algorithms("forward")}
    assert bool(timings) == (strategy in ("PROFILE", "PROFILE_REPRODUCIBLE"))
    if timings:  # the executor binds twice (workspace size, then the plan): timed once
        assert len(timings) == len(set(timings))


def test_operator_rejects_a_bad_strategy():
    import megbrain.opr as O

    g = make_graph()
    (xv, wv), _ = inputs(g, np.zeros((1, 1, 3, 3), np.float32), np.zeros((1, 1, 1, 1), np.float32))
    with pytest.raises(MegBrainError, match="strategy"):
        O.convolution(xv, wv, strategy="FASTEST")


def test_no_profiling_on_shape_change_keeps_the_choice(fresh_choices, timings):
    g, y, x, w, hosts = _conv_graph("PROFILE", no_profiling_on_shape_change=True)
    _run(g, y)
    first = y.node.owner.chosen_algorithm
    n = len(timings)
    hosts[0].arr = np.random.default_rng(1).uniform(-1, 1, (3, 8, 9, 9)).astype(np.float32)
    got = _run(g, y)
    assert got.shape == (3, 4, 9, 9)
    assert y.node.owner.chosen_algorithm == first and len(timings) == n


@pytest.mark.parametrize("stride_w", [1, 2])  # 1: backward data has two candidates
@pytest.mark.parametrize("strategy", conv_algos.STRATEGIES)
def test_numeric_gradient_with_each_strategy(strategy, stride_w, fresh_choices):
    import megbrain.opr as O

    rng = np.random.default_rng(8)
    x, w = rng.uniform(-1, 1, (2, 2, 5, 5)), rng.uniform(-1, 1, (3, 2, 3, 3))

    def build(a, b):
        return O.convolution(a, b, pad_h=1, pad_w=1, stride_w=stride_w, strategy=strategy)

    check_grad(build, [x, w])


def _conv3d(a, b):
    import megbrain.opr as O

    return O.convolution3d(a, b, pad_d=1, pad_h=1, pad_w=1, strategy="PROFILE")


def _conv_bias(a, b, bias):
    import megbrain.opr as O

    return O.conv_bias_activation(
        a, b, bias, pad_h=1, pad_w=1, nonlineMode="RELU", strategy="PROFILE"
    )


def _deconv(a, b):
    import megbrain.opr as O

    return O.deconvolution(a, b, pad_h=1, pad_w=1, strategy="PROFILE")


@pytest.mark.parametrize(
    "build,shapes",
    [
        (_conv3d, [(2, 3, 4, 5, 5), (4, 3, 3, 3, 3)]),
        (_conv_bias, [(2, 3, 6, 6), (4, 3, 3, 3), (1, 4, 1, 1)]),
        (_deconv, [(2, 4, 6, 6), (4, 3, 3, 3)]),
    ],
)
def test_every_convolution_operator_takes_the_strategy(build, shapes, fresh_choices, timings):
    rng = np.random.default_rng(9)
    g = make_graph()
    vars_, _ = inputs(g, *(rng.uniform(-1, 1, s).astype(np.float32) for s in shapes))
    y = build(*vars_)
    _run(g, y)
    assert y.node.owner.param.strategy == "PROFILE"
    assert y.node.owner.chosen_algorithm is not None
    assert timings  # more than one candidate, timed


def test_the_profiler_trace_names_the_chosen_algorithm():
    import megbrain as mgb
    from megbrain import plugin

    g = mgb.comp_graph()
    prof = plugin.CompGraphProfiler(g)
    rng = np.random.default_rng(4)
    x = mgb.make_shared("cpu0", value=rng.uniform(-1, 1, (2, 3, 6, 6)).astype(np.float32),
                        comp_graph=g)  # fmt: skip
    w = mgb.make_shared("cpu0", value=rng.uniform(-1, 1, (4, 3, 3, 3)).astype(np.float32),
                        comp_graph=g)  # fmt: skip
    y = mgb.opr.convolution(x, w, pad_h=1, pad_w=1)
    g.compile(None, mgb.copy_output(y))()
    events = [e for e in prof.chrome_trace()["traceEvents"] if e.get("ph") == "X"]
    algos = {e["cat"]: e["args"].get("algorithm") for e in events}
    chosen = y.node.owner.chosen_algorithm
    assert algos["ConvolutionForward"] == chosen
    assert chosen in {a.name for a in conv_algos.algorithms("forward")}
    assert all(a is None for t, a in algos.items() if t != "ConvolutionForward")


def test_time_algorithms_interleaves_and_drops_losers(caplog):
    runs = {"FAST": 0, "SLOW": 0}

    def fake(name, delay):
        def bind(*args):
            def step():
                runs[name] += 1
                if delay:
                    import time

                    time.sleep(delay)

            return step

        return conv_algos.ConvAlgorithm(name, "forward", bind, lambda *a: True)

    def broken(*args):
        raise ValueError("does not fit")

    algos = [fake("FAST", 0), fake("SLOW", 0.02),
             conv_algos.ConvAlgorithm("BROKEN", "forward", broken, lambda *a: True)]  # fmt: skip
    c = _case()
    a, b, out, _ = _operands(c, "forward")
    times = conv_algos.time_algorithms(algos, a, b, out, *_geometry(c), runs=4)
    assert set(times) == {"FAST", "SLOW"} and times["FAST"] < times["SLOW"]
    assert runs == {"FAST": 5, "SLOW": 2}  # warm-up + 4 rounds; the loser sits out after one
    assert "BROKEN failed: does not fit" in caplog.text
    assert np.isnan(out).all()  # scratch copies only
