"""Gradients of Elemwise (every mode), Reduce (every mode) and TypeCvt against float64 finite
differences; accumulation, non-dependencies, second order, VirtualGrad, ``mgb.grad`` and
the binding's ``_grad``."""

from __future__ import annotations

import warnings
import zlib

import numpy as np
import pytest
from opr_harness import check_grad, inputs, make_graph, run

import megbrain as mgb
from megbrain.kernels.elemwise_modes import MODES
from megbrain.opr import SymbolVar, make_immutable
from megbrain.opr.basic_arith import elemwise, reduce_, reduce_general, typecvt
from megbrain.opr.grad import grad

CN = "cpu0"
F32, F64 = np.dtype(np.float32), np.dtype(np.float64)


# ---- input domains -------------------------------------------------------------------------
# A domain draws one input array of a given shape. Kinks and jumps (RELU and ABS at 0, H_SWISH
# at +-3, MAX/MIN ties, FLOOR at integers...) are avoided by construction, not by luck:
# ``_lat(0)`` draws from even integers + (0.15, 0.45) and ``_lat(1)`` from odd ones, so a value
# is never near an integer, two values from different lattices differ by at least 0.7, and
# the sum of two ``_lat(0)`` values is never within 0.1 of an odd integer or 0.3 of zero.
def _uni(lo, hi):
    return lambda rng, shape: rng.uniform(lo, hi, shape)


def _signed(lo, hi):
    return lambda rng, shape: rng.choice([-1.0, 1.0], shape) * rng.uniform(lo, hi, shape)


def _lat(offset):
    return lambda rng, shape: (
        2.0 * rng.integers(-3, 3, shape) + offset + rng.uniform(0.15, 0.45, shape)
    )


N = _uni(-2.0, 2.0)

#: mode -> (a domain per input, the inputs that have a gradient; the others give None)
GRAD_MODES = {
    "ABS": ([_lat(0)], (0,)),
    "NEGATE": ([N], (0,)),
    "ACOS": ([_uni(-0.9, 0.9)], (0,)),
    "ASIN": ([_uni(-0.9, 0.9)], (0,)),
    "COS": ([N], (0,)),
    "SIN": ([N], (0,)),
    "EXP": ([N], (0,)),
    "EXPM1": ([N], (0,)),
    "LOG": ([_uni(0.3, 3.0)], (0,)),
    "LOG1P": ([_uni(-0.5, 2.0)], (0,)),
    "TANH": ([N], (0,)),
    "FAST_TANH": ([N], (0,)),
    "SIGMOID": ([N], (0,)),
    "RELU": ([_lat(0)], (0,)),
    "H_SWISH": ([_lat(0)], (0,)),
    "ERF": ([N], (0,)),
    "ERFC": ([N], (0,)),
    "ERFINV": ([_uni(-0.8, 0.8)], (0,)),
    "ERFCINV": ([_uni(0.2, 1.8)], (0,)),
    "ADD": ([N, N], (0, 1)),
    "SUB": ([N, N], (0, 1)),
    "MUL": ([N, N], (0, 1)),
    "TRUE_DIV": ([N, _signed(0.5, 2.0)], (0, 1)),
    "POW": ([_uni(0.5, 2.0), N], (0, 1)),
    "ATAN2": ([_signed(0.3, 2.0), _signed(0.3, 2.0)], (0, 1)),
    "LOG_SUM_EXP": ([N, N], (0, 1)),
    "MAX": ([_lat(0), _lat(1)], (0, 1)),
    "MIN": ([_lat(0), _lat(1)], (0, 1)),
    # fmod(a, b) = a while |a| < |b|; no gradient for the divisor (tested below)
    "MOD": ([_uni(-1.4, 1.4), _signed(1.5, 2.5)], (0,)),
    "ABS_GRAD": ([_lat(0), N], (1,)),
    "SIGMOID_GRAD": ([_uni(0.05, 0.95), N], (0, 1)),
    "TANH_GRAD": ([_uni(-0.95, 0.95), N], (0, 1)),
    "SWITCH_GT0": ([_lat(0), N], (1,)),
    "H_SWISH_GRAD": ([_lat(0), N], (0, 1)),
    "FUSE_ADD_RELU": ([_lat(0), _lat(0)], (0, 1)),
    "FUSE_ADD_SIGMOID": ([N, N], (0, 1)),
    "FUSE_ADD_TANH": ([N, N], (0, 1)),
    "FUSE_ADD_H_SWISH": ([_lat(0), _lat(0)], (0, 1)),
    "COND_LEQ_MOV": ([_lat(0), _lat(1), N], (2,)),
    "FUSE_MUL_ADD3": ([N, N, N], (0, 1, 2)),
    "FUSE_MUL_ADD4": ([N, N, N, N], (0, 1, 2, 3)),
    "FAST_TANH_GRAD": ([N, N], (0, 1)),
}

#: modes whose gradient is missing: first order of FAST_TANH_GRAD, hence second order of
#: FAST_TANH (whose gradient is built from FAST_TANH_GRAD)
_NO_FAST_TANH_GRAD = pytest.mark.xfail(
    strict=True,
    raises=mgb.MegBrainError,
    reason="Elemwise FAST_TANH_GRAD has no gradient (basic_arith._elemwise_grad raises)",
)
FIRST_ORDER_XFAIL: set = set()
SECOND_ORDER_XFAIL: set = set()

#: float modes without a gradient (piecewise constant): grad is None, or zeros when asked
NO_GRAD_MODES = {
    "CEIL": [_lat(0)],
    "FLOOR": [_lat(0)],
    "ROUND": [_lat(0)],
    "LT": [_lat(0), _lat(1)],
    "LEQ": [_lat(0), _lat(1)],
    "EQ": [_lat(0), _lat(1)],
    # |a| / b in (0.08, 0.93): floor(a / b) stays 0 or -1
    "FLOOR_DIV": [_signed(0.2, 1.4), _uni(1.5, 2.5)],
}

#: integer-only modes: never differentiable (no float dtype)
INT_ONLY_MODES = {"SHL", "SHR", "RMULH"}

SHAPES = {
    "same": [(3, 4)] * 4,
    # the later inputs broadcast, with added leading axes and size-1 axes
    "bcast_later": [(2, 3, 4), (3, 1), (1, 4), (4,)],
    # the first input broadcasts
    "bcast_first": [(3, 1), (2, 3, 4), (4,), (2, 1, 4)],
}


def _arrays(mode, domains, shapes_key, salt=0):
    rng = np.random.default_rng(zlib.crc32(f"{mode}/{shapes_key}/{salt}".encode()))
    return [d(rng, s) for d, s in zip(domains, SHAPES[shapes_key])]


def _ew(mode):
    return lambda *xs: elemwise(*xs, mode=mode)


# ---- the mode table ---------------------------------------------------------------------------
def test_every_mode_is_classified():
    partial = {m for m, (d, w) in GRAD_MODES.items() if len(w) < len(d)}
    assert partial == {"ABS_GRAD", "SWITCH_GT0", "COND_LEQ_MOV", "MOD"}
    groups = [set(GRAD_MODES), set(NO_GRAD_MODES), INT_ONLY_MODES]
    assert sum(len(s) for s in groups) == len(set().union(*groups)), "a mode is in two groups"
    assert set().union(*groups) == set(MODES)
    for mode, (doms, wrt) in GRAD_MODES.items():
        assert len(doms) == MODES[mode].arity, mode
        assert wrt and set(wrt) <= set(range(len(doms))), mode
    for mode, doms in NO_GRAD_MODES.items():
        assert len(doms) == MODES[mode].arity, mode
    for mode in INT_ONLY_MODES:
        assert not MODES[mode].float_ok, mode


# ---- Elemwise: first order -------------------------------------------------------------------
def _params(pairs, xfail_modes):
    return [pytest.param(*p, marks=_NO_FAST_TANH_GRAD) if p[0] in xfail_modes else p for p in pairs]


_FIRST_ORDER = _params(
    [(m, key) for m in sorted(GRAD_MODES) for key in SHAPES if key == "same" or MODES[m].arity > 1],
    FIRST_ORDER_XFAIL,
)


@pytest.mark.parametrize("mode, shapes_key", _FIRST_ORDER)
def test_elemwise_grad(mode, shapes_key):
    doms, wrt = GRAD_MODES[mode]
    arrays = _arrays(mode, doms, shapes_key)
    got = check_grad(_ew(mode), arrays, wrt=wrt)
    for i, gi in zip(wrt, got):
        assert gi.shape == arrays[i].shape and gi.dtype == np.float64, (i, gi.shape)


@pytest.mark.parametrize("mode", ["ABS_GRAD", "SWITCH_GT0", "COND_LEQ_MOV"])
def test_elemwise_inputs_without_grad_give_none(mode):
    doms, wrt = GRAD_MODES[mode]
    g = make_graph()
    xs, _ = inputs(g, *_arrays(mode, doms, "bcast_later"))
    loss = elemwise(*xs, mode=mode).sum()
    nograd = [i for i in range(len(xs)) if i not in wrt]
    grads = grad(loss, [xs[i] for i in nograd], warn_mid_wrt=False, return_zero_for_nodep=False)
    assert grads == [None] * len(nograd)


@pytest.mark.parametrize("mode", sorted(NO_GRAD_MODES))
def test_elemwise_mode_without_grad(mode):
    arrays = _arrays(mode, NO_GRAD_MODES[mode], "bcast_later")
    g = make_graph()
    xs, _ = inputs(g, *arrays)
    loss = (elemwise(*xs, mode=mode) * xs[0]).sum()  # depends on x0 through MUL only
    gs = grad(loss, xs, warn_mid_wrt=False, return_zero_for_nodep=False)
    assert gs[0] is not None and all(gi is None for gi in gs[1:])
    only = grad(elemwise(*xs, mode=mode).sum(), xs, warn_mid_wrt=False, return_zero_for_nodep=False)
    assert only == [None] * len(xs)
    # with zeros asked for: zeros of each input's shape, which finite differences agree with
    got = check_grad(_ew(mode), arrays)
    for a, gi in zip(arrays, got):
        np.testing.assert_array_equal(gi, np.zeros(a.shape))


def test_int_only_modes_reject_floats():
    g = make_graph()
    xs, _ = inputs(g, np.ones(3), np.ones(3))
    for mode in sorted(INT_ONLY_MODES):
        with pytest.raises(mgb.MegBrainError, match=mode):
            elemwise(*xs, mode=mode)


def test_int_inputs_have_no_gradient():
    g = make_graph()
    (x, k), _ = inputs(g, np.ones(3), np.arange(3, dtype=np.int32))
    y = typecvt(k * k + 1, F64) * x
    gx, gk = grad(y.sum(), [x, k], warn_mid_wrt=False, return_zero_for_nodep=False)
    assert gx is not None and gk is None


def test_mod_has_no_gradient_for_the_divisor():
    g = make_graph()
    (a, b), _ = inputs(g, np.full(3, 0.5), np.full(3, 2.0))
    (gb,) = grad(elemwise(a, b, mode="MOD").sum(), b, warn_mid_wrt=False)
    with pytest.raises(mgb.MegBrainError, match="MOD"):
        run([gb], g)


def test_elemwise_with_python_scalars_and_constants():
    rng = np.random.default_rng(1)
    check_grad(lambda x: (x * 3.0 - 1.0) ** 2.0 / 4.0, [rng.standard_normal((2, 3))])
    check_grad(lambda x: 2.0 / (x * x + 1.0), [rng.standard_normal((2, 3))])


def test_broadcast_grad_is_reduced_to_the_input_shape():
    # (1, 4) and (4,) against (2, 3, 4): the gradient sums over the broadcast axes
    rng = np.random.default_rng(2)
    a, b, c = rng.standard_normal((2, 3, 4)), rng.standard_normal((1, 4)), rng.standard_normal(4)
    g = make_graph()
    xs, _ = inputs(g, a, b, c)
    loss = (xs[0] * xs[1] + xs[2]).sum()
    ga, gb, gc = run(grad(loss, xs, warn_mid_wrt=False), g)
    np.testing.assert_allclose(ga, np.broadcast_to(b, a.shape))
    np.testing.assert_allclose(gb, a.sum(axis=(0, 1)).reshape(1, 4))
    np.testing.assert_allclose(gc, np.full(4, 6.0))
    assert (gb.shape, gc.shape) == ((1, 4), (4,))


# ---- Elemwise: second order ------------------------------------------------------------------
def _first_grad(mode, k, r):
    """A build returning d sum(mode(*xs) * r) / d xs[k]."""

    def build(*xs):
        w = make_immutable(CN, xs[0].node.graph, r, dtype=F64)
        (gk,) = grad((elemwise(*xs, mode=mode) * w).sum(), [xs[k]], warn_mid_wrt=False)
        return SymbolVar(gk)

    return build


_SECOND_ORDER = _params(
    [(m, k) for m in sorted(GRAD_MODES) for k in GRAD_MODES[m][1]], SECOND_ORDER_XFAIL
)


@pytest.mark.parametrize("mode, k", _SECOND_ORDER)
def test_elemwise_second_order(mode, k):
    doms, _ = GRAD_MODES[mode]
    arrays = _arrays(mode, doms, "same", salt=1)
    r = np.random.default_rng(3).standard_normal((3, 4))
    check_grad(_first_grad(mode, k, r), arrays)


def test_second_order_of_cube_is_6x():
    x = np.random.default_rng(4).standard_normal((2, 3))

    def first(v):
        return SymbolVar(grad((v * v * v).sum(), [v], warn_mid_wrt=False)[0])

    (g2,) = check_grad(first, [x])
    r = np.random.default_rng(0).standard_normal((2, 3))  # check_grad's output weights
    np.testing.assert_allclose(g2, 6 * x * r, rtol=1e-10)
    # grad of grad directly, no weights
    g = make_graph()
    (v,), _ = inputs(g, x)
    (g1,) = grad((v**3.0).sum(), [v], warn_mid_wrt=False)
    (gg,) = grad(SymbolVar(g1).sum(), [v], warn_mid_wrt=False)
    got1, got2 = run([g1, gg], g)
    np.testing.assert_allclose(got1, 3 * x**2, rtol=1e-10)
    np.testing.assert_allclose(got2, 6 * x, rtol=1e-10)


def test_mixed_partials_through_mul():
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((3,)), rng.standard_normal((2, 3))

    def dfdx(a, b):  # f = sum(a * b * b): df/da = sum over axis 0 of b^2
        return SymbolVar(grad((a * b * b).sum(), [a], warn_mid_wrt=False)[0])

    check_grad(dfdx, [x, y])
    g = make_graph()
    (a, b), _ = inputs(g, x, y)
    (ga,) = grad((a * b * b).sum(), [a], warn_mid_wrt=False)
    gab, gaa = grad(SymbolVar(ga).sum(), [b, a], warn_mid_wrt=False)
    got_ab, got_aa = run([gab, gaa], g)
    np.testing.assert_allclose(got_ab, 2 * y)
    np.testing.assert_array_equal(got_aa, np.zeros(3))


# ---- Reduce ----------------------------------------------------------------------------------
REDUCE_MODES = ("SUM", "SUM_SQR", "PRODUCT", "MIN", "MAX", "MEAN")


def _reduce_input(mode, shape, seed=0):
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if mode in ("MIN", "MAX"):  # distinct values, at least 0.5 apart
        return (rng.permutation(n) * 0.5 + rng.uniform(0, 0.1, n)).reshape(shape) - n / 4
    if mode == "PRODUCT":  # away from zero
        return _signed(0.5, 1.5)(rng, shape)
    return rng.standard_normal(shape)


def test_reduce_mode_list_is_complete():
    from megbrain.opr.basic_arith import REDUCE_MODES as ALL

    assert set(REDUCE_MODES) == set(ALL)


_AXES = [(None, False)] + [(a, k) for a in (0, 1, -1, (0, 2)) for k in (False, True)]


@pytest.mark.parametrize("axis, keepdims", _AXES)
@pytest.mark.parametrize("mode", REDUCE_MODES)
def test_reduce_grad(mode, axis, keepdims):
    x = _reduce_input(mode, (2, 3, 4))
    check_grad(lambda v: reduce_(v, mode, axis, keepdims), [x])


@pytest.mark.parametrize("target", [(1, 3, 1), (2, 1, 4), (1, 1, 1), (2, 3, 4)])
@pytest.mark.parametrize("mode", REDUCE_MODES)
def test_reduce_to_target_shape_grad(mode, target):
    x = _reduce_input(mode, (2, 3, 4), seed=1)
    check_grad(lambda v: reduce_general(v, mode=mode, target_shape=target), [x])


def test_reduce_target_shape_input_has_no_gradient():
    g = make_graph()
    (x,), _ = inputs(g, np.ones((2, 3)))
    y = reduce_general(x, mode="SUM", target_shape=(1, 3))
    assert y.node.owner.grad(1, [y.node]) is None


@pytest.mark.parametrize("mode", REDUCE_MODES)
def test_reduce_second_order(mode):
    x = _reduce_input(mode, (2, 3), seed=2)
    r = np.random.default_rng(6).standard_normal((2, 3))

    def first(v):
        w = make_immutable(CN, v.node.graph, r, dtype=F64)
        y = reduce_(v * w, mode, 1, False)
        return SymbolVar(grad((y * y).sum(), [v], warn_mid_wrt=False)[0])

    check_grad(first, [x])


def test_reduce_grad_with_runtime_shape_change():
    # the gradient follows RT_STATIC shapes: a new input shape gives a gradient of that shape
    g = make_graph()
    (x,), hosts = inputs(g, np.ones((2, 3)))
    (gx,) = grad((x.sum(axis=1) ** 2.0).sum(), [x], warn_mid_wrt=False)
    got = {}
    f = g.compile([(gx, lambda a: got.__setitem__(0, np.array(a)))])
    f.execute().wait()
    np.testing.assert_allclose(got[0], np.full((2, 3), 6.0))
    hosts[0].arr = np.ones((4, 2))
    f.execute().wait()
    np.testing.assert_allclose(got[0], np.full((4, 2), 4.0))


# ---- TypeCvt ---------------------------------------------------------------------------------
def test_typecvt_grad_through_float32():
    x = np.random.default_rng(7).standard_normal((3, 4))
    # the forward rounds to float32, so finite differences need a large eps
    got = check_grad(
        lambda v: typecvt(typecvt(v, F32) * 2.0, F64),
        [x],
        eps=1e-2,
        rtol=1e-4,
        atol=1e-4,
    )
    assert got[0].dtype == np.float64
    g = make_graph()
    (v,), _ = inputs(g, x)
    y32 = typecvt(v, F32)
    (g32,) = grad((y32 * y32).sum(), [y32], warn_mid_wrt=False)
    (g64,) = grad((y32 * y32).sum(), [v], warn_mid_wrt=False)
    assert (g32.dtype, g64.dtype) == (np.float32, F64)
    np.testing.assert_allclose(run([g64], g)[0], 2 * x.astype(np.float32), rtol=1e-6)


def test_typecvt_to_int_blocks_the_gradient():
    g = make_graph()
    (x,), _ = inputs(g, np.linspace(0.1, 2.9, 6))
    y = typecvt(typecvt(x, np.dtype(np.int32)), F64) + x * 0.0
    (gx,) = grad((y * y).sum(), [x], warn_mid_wrt=False)
    np.testing.assert_array_equal(run([gx], g)[0], np.zeros(6))


# ---- accumulation and non-dependencies -------------------------------------------------------
def test_var_used_several_times_accumulates():
    x = np.random.default_rng(8).standard_normal((2, 3))
    check_grad(lambda v: v * v + elemwise(v, mode="SIN") * v + v, [x])
    check_grad(lambda v: elemwise(v, v, v, mode="FUSE_MUL_ADD3"), [x])  # one opr, 3 uses
    g = make_graph()
    (v,), _ = inputs(g, x)
    loss = (v + v + v).sum() + (v * 2.0).sum()
    np.testing.assert_allclose(
        run(grad(loss, [v], warn_mid_wrt=False), g)[0], np.full(x.shape, 5.0)
    )


def test_shared_intermediate_accumulates():
    # y feeds two branches that meet again; grads from both reach y, then x once
    x = np.random.default_rng(9).uniform(0.5, 1.5, (4,))

    def build(v):
        y = elemwise(v, mode="EXP")
        return y * y + elemwise(y, mode="LOG")

    check_grad(build, [x])


def test_return_zero_for_nodep():
    g = make_graph()
    (x, z), _ = inputs(g, np.ones((2, 3)), np.ones((4,)))
    loss = (x * 3.0).sum()
    gx, gz = grad(loss, [x, z], warn_mid_wrt=False, return_zero_for_nodep=False)
    assert gx is not None and gz is None
    gx, gz = grad(loss, [x, z], warn_mid_wrt=False, return_zero_for_nodep=True)
    got_x, got_z = run([gx, gz], g)
    np.testing.assert_array_equal(got_x, np.full((2, 3), 3.0))
    np.testing.assert_array_equal(got_z, np.zeros(4))
    assert got_z.dtype == np.float64


def test_target_must_be_a_scalar():
    g = make_graph()
    (x,), _ = inputs(g, np.ones((2, 3)))
    with pytest.raises(mgb.MegBrainError, match="scalar"):
        grad(x * 2.0, [x], warn_mid_wrt=False)


def test_wrt_of_another_graph_raises():
    g1, g2 = make_graph(), make_graph()
    (x,), _ = inputs(g1, np.ones(2))
    (y,), _ = inputs(g2, np.ones(2))
    with pytest.raises(mgb.GraphError, match="another graph"):
        grad(x.sum(), [y])


# ---- mgb.grad: VirtualGrad, options, warnings ------------------------------------------------
def _user_graph(opt_level=None):
    g = mgb.comp_graph()
    if opt_level is not None:
        g.set_option("graph_opt_level", opt_level)
    rng = np.random.default_rng(10)
    w = mgb.make_shared(
        CN, value=rng.standard_normal((3, 2)).astype(np.float32), comp_graph=g, name="w"
    )
    x = mgb.make_arg(CN, g, name="x", shape=(4, 3))
    return g, w, x


def _loss(w, x):
    h = mgb.opr.matrix_mul(x, w)
    return (mgb.opr.elem.tanh(h) * h + h * 1.0 * 1.0).sum()


def _run(g, x, outs, xval):
    f = g.compile([x], [mgb.copy_output(o) for o in outs])
    return [np.asarray(v) for v in f(xval)]


def _types(g, x, outs):
    f = g.compile([x], [mgb.copy_output(o) for o in outs])
    return {o["type"] for o in f.dump()["seq"]}


@pytest.mark.parametrize("level", [None, 2, -2])
def test_virtual_grad_is_default_at_opt_level_2_and_equals_direct(level):
    g, w, x = _user_graph(level)
    loss = _loss(w, x)
    vw, vx = mgb.grad(loss, [w, x])
    assert vw.owner_opr.name.startswith("VirtualGrad") and vx.owner_opr.name.startswith(
        "VirtualGrad"
    )
    dw, dx = mgb.grad(loss, [w, x], use_virtual_grad=False)
    assert "VirtualGrad" not in dw.owner_opr.name
    xval = np.random.default_rng(11).standard_normal((4, 3)).astype(np.float32)
    got_v = _run(g, x, [vw, vx], xval)
    got_d = _run(g, x, [dw, dx], xval)
    for a, b in zip(got_v, got_d):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # expanded at compile: no VirtualGrad operator is left in the sequence
    assert "VirtualGrad" not in _types(g, x, [vw, vx])


@pytest.mark.parametrize("level", [0, 1, -1])
def test_direct_grad_below_opt_level_2(level):
    g, w, x = _user_graph(level)
    gw = mgb.grad(_loss(w, x), w)
    assert isinstance(gw, mgb.SymbolVar) and "VirtualGrad" not in gw.owner_opr.name
    vw = mgb.grad(_loss(w, x), w, use_virtual_grad=True)
    assert vw.owner_opr.name.startswith("VirtualGrad")
    xval = np.ones((4, 3), np.float32)
    a, b = _run(g, x, [gw, vw], xval)
    np.testing.assert_allclose(a, b, rtol=1e-5)


def test_virtual_grad_numeric_value():
    g, w, x = _user_graph()
    gx = mgb.grad((x * x * w.sum()).sum(), x)  # 2 x sum(w)
    xval = np.random.default_rng(12).standard_normal((4, 3)).astype(np.float32)
    (got,) = _run(g, x, [gx], xval)
    np.testing.assert_allclose(got, 2 * xval * w.get_value().sum(), rtol=1e-5)


def test_virtual_grad_with_return_zero_for_nodep_false_raises():
    g, w, x = _user_graph()
    with pytest.raises(mgb.MegBrainError, match="return_zero_for_nodep"):
        mgb.grad(_loss(w, x), w, return_zero_for_nodep=False)
    # the direct gradient can give None
    z = mgb.make_shared(CN, value=np.ones(2, np.float32), comp_graph=g)
    gw, gz = mgb.grad(_loss(w, x), [w, z], use_virtual_grad=False, return_zero_for_nodep=False)
    assert gw is not None and gz is None


def test_virtual_grad_of_non_dependency_is_zero():
    g, w, x = _user_graph()
    z = mgb.make_shared(CN, value=np.ones(5, np.float32), comp_graph=g)
    gz = mgb.grad(_loss(w, x), z)
    (got,) = g.compile(None, [mgb.copy_output(gz)])()
    np.testing.assert_array_equal(got, np.zeros(5, np.float32))


def test_single_wrt_gives_a_single_grad_and_list_a_list():
    g, w, x = _user_graph(0)
    loss = _loss(w, x)
    assert isinstance(mgb.grad(loss, w), mgb.SymbolVar)
    out = mgb.grad(loss, [w])
    assert isinstance(out, list) and len(out) == 1
    assert len(mgb.grad(loss, (w, x))) == 2


def test_warn_mid_wrt():
    g, w, x = _user_graph(0)
    h = x * 2.0
    loss = (h * h).sum()
    with pytest.warns(UserWarning, match="intermediate"):
        mgb.grad(loss, h)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gh = mgb.grad(loss, h, warn_mid_wrt=False)
        mgb.grad(loss, x)  # an input var: no warning
    xval = np.ones((4, 3), np.float32)
    (got,) = _run(g, x, [gh], xval)
    np.testing.assert_allclose(got, 4 * xval)


def test_grad_rejects_a_non_var_target():
    with pytest.raises(TypeError):
        mgb.grad(1.0, [])


def test_max_min_first_input_gradient_is_one_pass_with_ties_counted_once():
    """MAX/MIN's gradient to their first input is MegBrain's COND_LEQ_MOV (one pass, no mask
    and product); the second input's keeps the strict comparison, so at a tie only the first
    input gets the gradient. ReLU6 (``min(relu(x), 6)``) backward: two passes."""
    g = mgb.comp_graph()
    a = mgb.make_arg(CN, g, shape=(6,), dtype=F32, name="a")
    b = mgb.make_arg(CN, g, shape=(6,), dtype=F32, name="b")
    w = mgb.make_arg(CN, g, shape=(6,), dtype=F32, name="w")
    outs = []
    for mode in ("MAX", "MIN"):
        loss = reduce_(elemwise(a, b, mode=mode) * w, "SUM")
        outs += [mgb.copy_output(v) for v in grad(loss, [a, b])]
    six = elemwise(elemwise(a, mode="RELU"), make_immutable(CN, g, 6.0), mode="MIN")  # ReLU6
    outs.append(mgb.copy_output(grad(reduce_(six * w, "SUM"), [a])[0]))
    f = g.compile([a, b, w], outs)
    av = np.array([-1, 0, 2, 3, 6, 7], F32)
    bv = np.array([0, 0, 1, 3, 5, 8], F32)
    wv = np.arange(1, 7, dtype=F32)
    gmax_a, gmax_b, gmin_a, gmin_b, g6 = f(av, bv, wv)
    np.testing.assert_array_equal(gmax_a, np.where(bv <= av, wv, 0))
    np.testing.assert_array_equal(gmax_b, np.where(av < bv, wv, 0))
    np.testing.assert_array_equal(gmin_a, np.where(av <= bv, wv, 0))
    np.testing.assert_array_equal(gmin_b, np.where(bv < av, wv, 0))
    np.testing.assert_array_equal(g6, np.where((av > 0) & (av <= 6), wv, 0))
    modes = [o.param.mode for o in f._func._ensure_plan().step_oprs[0]
             if o.type_name == "Elemwise"]  # fmt: skip
    assert "LEQ" not in modes
