"""BatchNorm and LRN: forward against NumPy, running statistics, shape inference, gradients
and bad inputs."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opr_harness import HostValue, check_grad, check_opr, inputs, make_graph, run

from megbrain.device import CompNode
from megbrain.errors import GraphError, MegBrainError
from megbrain.graph import infer_shape
from megbrain.opr import add_update, shared_device_tensor
from megbrain.opr.dnn_norm import batch_norm, batch_norm_no_statistic, lrn

PARAM_SHAPE = {
    "DIM_11HW": lambda s: (1, 1, s[2], s[3]),
    "DIM_1CHW": lambda s: (1, s[1], s[2], s[3]),
    "DIM_1C11": lambda s: (1, s[1], 1, 1),
}


def ref_bn_training(x, scale, bias, mean, var, eps, avg):
    """TRAINING-mode batch norm: normalize over the axes where scale has size 1."""
    x = x.astype(np.float64)
    axes = tuple(i for i in range(4) if scale.shape[i] == 1)
    n = math.prod(x.shape[i] for i in axes)
    m = x.mean(axis=axes, keepdims=True)
    v = x.var(axis=axes, keepdims=True)
    inv = 1 / np.sqrt(v + eps)
    y = (x - m) * inv * scale + bias
    new_mean = mean * (1 - avg) + m * avg
    new_var = var * (1 - avg) + v * n / (n - 1) * avg
    return new_mean, new_var, m, inv, y


def _params(rng, shape, param_dim):
    p = PARAM_SHAPE[param_dim](shape)
    scale = rng.uniform(0.5, 2, p).astype(np.float32)
    bias = rng.standard_normal(p).astype(np.float32)
    mean = rng.standard_normal(p).astype(np.float32)
    var = rng.uniform(0.5, 2, p).astype(np.float32)
    return scale, bias, mean, var


dims = st.integers(1, 4)


class DevValue(HostValue):
    """A shared device tensor over a replaceable array (the harness's tensor protocol)."""

    def __init__(self, arr):
        super().__init__(arr, CompNode.load("cpu0"))

    def shape_valid(self) -> bool:
        return self.arr is not None


def _bn_inputs(g, x, scale, bias, mean, var):
    """Host inputs for x, scale and bias; shared tensors (updated in place) for the stats."""
    (xv, sv, bv), _ = inputs(g, x, scale, bias)
    dm, dv = DevValue(mean.copy()), DevValue(var.copy())
    return (xv, sv, bv, shared_device_tensor(g, dm), shared_device_tensor(g, dv)), (dm, dv)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    n=st.integers(2, 4),
    c=dims,
    h=dims,
    w=dims,
    param_dim=st.sampled_from(sorted(PARAM_SHAPE)),
    eps=st.sampled_from([1e-4, 1e-2]),
    avg=st.sampled_from([1.0, 0.3, 0.0]),
)
def test_batch_norm_training_matches_numpy(n, c, h, w, param_dim, eps, avg):
    rng = np.random.default_rng(n * 1000 + c * 100 + h * 10 + w)
    x = (rng.standard_normal((n, c, h, w)) * 3 + 1).astype(np.float32)
    arrays = [x, *_params(rng, x.shape, param_dim)]
    g = make_graph()
    vs, (dm, dv) = _bn_inputs(g, *arrays)
    outs = batch_norm(*vs, param_dim=param_dim, epsilon=eps, avg_factor=avg)
    got = run(outs, g)
    for o, a, r in zip(outs, got, ref_bn_training(*arrays, eps, avg)):
        assert a.dtype == np.float32 and a.shape == infer_shape(o.node) == r.shape
        np.testing.assert_allclose(a, r, rtol=2e-5, atol=2e-5)
    # outputs 0 and 1 are the shared tensors themselves, updated in place
    np.testing.assert_array_equal(dm.arr, got[0])
    np.testing.assert_array_equal(dv.arr, got[1])


def test_batch_norm_inference_uses_running_stats():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 4, 2, 5)).astype(np.float32)
    scale, bias, mean, var = _params(rng, x.shape, "DIM_1C11")

    def ref(x, scale, bias, mean, var):
        inv = 1 / np.sqrt(var.astype(np.float64) + 1e-3)
        return mean, inv, (x - mean) * inv * scale + bias

    check_opr(
        lambda *v: batch_norm(*v, param_dim="DIM_1C11", fwd_mode="INFERENCE", epsilon=1e-3),
        ref,
        [x, scale, bias, mean, var],
    )


def test_batch_norm_no_statistic_gives_three_outputs():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 3, 3, 2)).astype(np.float32)
    scale, bias, _, _ = _params(rng, x.shape, "DIM_1CHW")

    def ref(x, scale, bias):
        _, _, m, inv, y = ref_bn_training(x, scale, bias, 0, 1, 1e-4, 1)
        return m, inv, y

    got = check_opr(
        lambda *v: batch_norm_no_statistic(*v, param_dim="DIM_1CHW"),
        ref,
        [x, scale, bias],
        rtol=2e-5,
        atol=2e-5,
    )
    assert len(got) == 3


def test_batch_norm_outputs_in_megbrain_order_with_empty_stats():
    g = make_graph()
    x = np.zeros((2, 3, 4, 5), np.float16)
    p = np.ones((1, 3, 1, 1), np.float32)
    (xv, sv, bv, mv, vv), _ = _bn_inputs(g, x, p, p, p, p)
    train = batch_norm(xv, sv, bv, mv, vv, param_dim="DIM_1C11")
    assert [o.imm_shape for o in train] == [(1, 3, 1, 1)] * 4 + [(2, 3, 4, 5)]
    assert [o.dtype for o in train] == [np.float32] * 4 + [np.float16]
    for outs in (
        batch_norm(xv, sv, bv, mv, vv, fwd_mode="INFERENCE"),
        batch_norm_no_statistic(xv, sv, bv),
    ):
        assert len(outs) == 3  # the empty running-statistics outputs are dropped
        all_outs = outs[-1].node.owner.outputs
        assert [infer_shape(v) for v in all_outs[:2]] == [(0,), (0,)]
        assert outs[-1].imm_shape == x.shape


def test_batch_norm_float16_input_float32_params():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 2, 3, 3)).astype(np.float16)
    arrays = [x, *_params(rng, x.shape, "DIM_1C11")]
    g = make_graph()
    vs, _ = _bn_inputs(g, *arrays)
    got = run(batch_norm(*vs, param_dim="DIM_1C11"), g)
    for a, r in zip(got, ref_bn_training(*arrays, 1e-4, 1.0)):
        np.testing.assert_allclose(a.astype(np.float64), r, rtol=2e-3, atol=2e-3)
    assert got[4].dtype == np.float16 and got[0].dtype == np.float32


def _train_graph(rng, *, avg=0.25, **options):
    x = rng.standard_normal((5, 2, 3, 3)).astype(np.float32)
    arrays = [x, *_params(rng, x.shape, "DIM_1C11")]
    g = make_graph(**options)
    vs, devs = _bn_inputs(g, *arrays)
    outs = batch_norm(*vs, param_dim="DIM_1C11", avg_factor=avg)
    return g, arrays, vs, outs, devs


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"force_dynamic_alloc": True},
        {"seq_opt__enable_mem_plan_opt": False},
        {"seq_opt__enable_mem_reuse_alloc": False},
    ],
)
def test_running_stats_updated_in_place_without_fetching_them(options):
    rng = np.random.default_rng(4)
    g, arrays, vs, outs, (dm, dv) = _train_graph(rng, **options)
    ptrs = (dm.arr.ctypes.data, dv.arr.ctypes.data)
    x, scale, bias, exp_m, exp_v = arrays
    f = g.compile([(outs[-1].node, lambda a: got.__setitem__(0, np.array(a)))])
    got = [None]
    for _ in range(3):
        f.execute().wait()
        exp_m, exp_v, _, _, exp_y = ref_bn_training(x, scale, bias, exp_m, exp_v, 1e-4, 0.25)
        np.testing.assert_allclose(got[0], exp_y, rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(dm.arr, exp_m, rtol=1e-5)
        np.testing.assert_allclose(dv.arr, exp_v, rtol=1e-5)
    assert (dm.arr.ctypes.data, dv.arr.ctypes.data) == ptrs  # the same buffers


def test_readers_of_old_stats_run_before_the_update():
    rng = np.random.default_rng(5)
    g, arrays, vs, outs, (dm, dv) = _train_graph(rng)
    old_mean = vs[3] * 1.0 + 0.0  # created after BatchNorm, still reads the old value
    before = dm.arr.copy()
    got_old, new_mean = run([old_mean, outs[0]], g)
    np.testing.assert_array_equal(got_old, before)
    np.testing.assert_array_equal(new_mean, dm.arr)
    assert not np.array_equal(before, dm.arr)


def test_reading_old_and_updated_stats_together_raises():
    rng = np.random.default_rng(6)
    g, _, vs, outs, _ = _train_graph(rng)
    mixed = outs[0] - vs[3]  # the updated and the old statistics in one operator
    with pytest.raises(GraphError, match="reads both the old value"):
        run([mixed], g)


def test_stats_updated_by_two_operators_raise():
    rng = np.random.default_rng(7)
    g, _, vs, outs, _ = _train_graph(rng)
    upd = add_update(vs[3], outs[2])
    with pytest.raises(GraphError, match="updated in place by two operators"):
        run([outs[-1], upd], g)


@pytest.mark.parametrize("stat", [3, 4])
def test_training_stats_must_be_shared(stat):
    g = make_graph()
    p = np.ones((1, 2, 1, 1), np.float32)
    vs = list(_bn_inputs(g, np.ones((2, 2, 2, 2), np.float32), p, p, p, p)[0])
    (host,), _ = inputs(g, p)
    vs[stat] = host
    what = "running_mean" if stat == 3 else "running_variance"
    msg = f"BatchNormForward 'bn'.*{what} .* must be a shared tensor"
    with pytest.raises(GraphError, match=msg):
        batch_norm(*vs, name="bn")
    # INFERENCE mode only reads the statistics: any var will do
    batch_norm(*vs, fwd_mode="INFERENCE")


def test_inference_leaves_stats_untouched():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((3, 2, 2, 2)).astype(np.float32)
    arrays = [x, *_params(rng, x.shape, "DIM_1C11")]
    g = make_graph()
    vs, (dm, dv) = _bn_inputs(g, *arrays)
    outs = batch_norm(*vs, param_dim="DIM_1C11", fwd_mode="INFERENCE")
    run(outs, g)
    np.testing.assert_array_equal(dm.arr, arrays[3])
    np.testing.assert_array_equal(dv.arr, arrays[4])


@pytest.mark.parametrize("param_dim", sorted(PARAM_SHAPE))
def test_batch_norm_grad(param_dim):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 2, 2, 3))
    scale, bias, mean, var = (a.astype(np.float64) for a in _params(rng, x.shape, param_dim))

    def with_stats(xv, sv, bv):
        g = xv.node.graph
        rm, rv = (shared_device_tensor(g, DevValue(a.copy())) for a in (mean, var))
        return batch_norm(xv, sv, bv, rm, rv, param_dim=param_dim)[-1]

    check_grad(with_stats, [x, scale, bias])
    check_grad(
        lambda *v: batch_norm_no_statistic(*v, param_dim=param_dim, epsilon=0.1)[-1],
        [x, scale, bias],
    )


def test_batch_norm_grad_in_inference_raises():
    from megbrain.opr.grad import grad

    g = make_graph()
    p = np.ones((1, 2, 1, 1), np.float32)
    (xv, sv, bv, mv, vv), _ = inputs(g, np.ones((2, 2, 2, 2), np.float32), p, p, p, p)
    y = batch_norm(xv, sv, bv, mv, vv, fwd_mode="INFERENCE")[-1]
    with pytest.raises(MegBrainError, match="TRAINING"):
        grad(y.sum(), xv)


@pytest.mark.parametrize(
    ("shapes", "kw", "exc", "needle"),
    [
        ([(2, 4, 5, 5), (1, 3, 1, 1), (1, 3, 1, 1)], {}, MegBrainError, "scale of shape {1,3,1,1}"),
        ([(2, 3, 5), (1, 3, 1), (1, 3, 1)], {}, MegBrainError, "x must be 4-d"),
        (
            [(2, 3, 5, 5), (1, 3, 1, 1), (1, 3, 1, 1)],
            {"fwd_mode": "INFERENCE"},
            MegBrainError,
            "INFERENCE mode needs running_mean",
        ),
        (
            [(2, 3, 5, 5), (1, 3, 1, 1), (1, 3, 1, 1), (1, 3, 1, 1)],
            {},
            GraphError,
            "both running_mean and running_variance",
        ),
        ([(2, 3, 5, 5), (1, 3, 1, 1), (1, 1, 1, 1)], {}, MegBrainError, "bias has shape"),
        (
            [(2, 3, 5, 5), (1, 3, 1, 1), (1, 3, 1, 1)],
            {"param_dim": "DIM_13"},
            MegBrainError,
            "param_dim",
        ),
    ],
)
def test_batch_norm_bad_inputs(shapes, kw, exc, needle):
    g = make_graph()
    vs, _ = inputs(g, *[np.ones(s, np.float32) for s in shapes])
    with pytest.raises(exc, match=needle):
        batch_norm(*vs, name="bn", **kw)


def test_batch_norm_int_input_raises():
    g = make_graph()
    p = np.ones((1, 2, 1, 1), np.float32)
    (xv, sv, bv), _ = inputs(g, np.ones((2, 2, 2, 2), np.int32), p, p)
    with pytest.raises(MegBrainError, match="'bn'.*x must be a float var, got int32"):
        batch_norm(xv, sv, bv, name="bn")


# ---- LRN -----------------------------------------------------------------------------------
def ref_lrn(x, n, k, alpha, beta):
    x = x.astype(np.float64)
    out = np.empty_like(x)
    channels, half = x.shape[1], n // 2
    for c in range(channels):
        lo, hi = max(0, c - half), min(channels - 1, c + half)
        s = (x[:, lo : hi + 1] ** 2).sum(axis=1)
        out[:, c] = x[:, c] * (k + alpha * s) ** -beta
    return out


@settings(max_examples=20, deadline=None, derandomize=True)
@given(
    b=st.integers(1, 3),
    c=st.integers(1, 7),
    hw=st.integers(1, 4),
    n=st.sampled_from([1, 3, 5, 7]),
    alpha=st.sampled_from([1e-4, 0.3]),
    beta=st.sampled_from([0.75, 1.5]),
    k=st.sampled_from([2.0, 1.0]),
)
def test_lrn_matches_numpy(b, c, hw, n, alpha, beta, k):
    x = np.random.default_rng(b * 100 + c * 10 + hw).standard_normal((b, c, hw, hw + 1))
    x = (x * 3).astype(np.float32)
    check_opr(
        lambda v: lrn(v, n=n, k=k, alpha=alpha, beta=beta),
        lambda a: ref_lrn(a, n, k, alpha, beta),
        [x],
    )


def test_lrn_default_params_and_float16():
    x = np.random.default_rng(6).standard_normal((2, 6, 3, 3)).astype(np.float16)
    (got,) = check_opr(lrn, lambda a: ref_lrn(a, 5, 2.0, 1e-4, 0.75), [x], rtol=2e-3, atol=2e-3)
    assert got.dtype == np.float16


@pytest.mark.parametrize("n", [1, 3, 5])
def test_lrn_grad(n):
    x = np.random.default_rng(7).standard_normal((2, 5, 2, 2))
    check_grad(lambda v: lrn(v, n=n, k=1.0, alpha=0.4, beta=0.75), [x])


@pytest.mark.parametrize(
    ("shape", "dtype", "kw", "needle"),
    [
        ((2, 3, 4, 4), np.float32, {"n": 4}, "positive odd number, got 4"),
        ((2, 3, 4), np.float32, {}, "must be 4-d"),
        ((2, 3, 4, 4), np.int32, {}, "must be a float var"),
    ],
)
def test_lrn_bad_inputs(shape, dtype, kw, needle):
    g = make_graph()
    (x,), _ = inputs(g, np.ones(shape, dtype))
    with pytest.raises(MegBrainError, match=f"LRNForward 'norm'.*{needle}"):
        lrn(x, name="norm", **kw)
