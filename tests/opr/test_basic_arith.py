"""Elemwise (every mode), TypeCvt and Reduce through the graph, against NumPy formulas."""

import math
import zlib

import numpy as np
import pytest
from opr_harness import check_opr, inputs, make_graph, run

from megbrain.errors import MegBrainError
from megbrain.graph import InferType
from megbrain.kernels.elemwise_modes import MODES
from megbrain.opr import (
    elem,
    elemwise,
    insert_opr,
    make_immutable,
    make_opr_config,
    mean,
    reduce_,
    reduce_general,
    typecvt,
)


# ---- NumPy references --------------------------------------------------------------------
def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _h_swish(x):
    return x * np.clip(x + 3, 0, 6) / 6


def _fast_tanh(x):
    return x * (27 + x * x) / (27 + 9 * x * x)


def _erfinv(y):
    x = np.zeros_like(y)
    for _ in range(60):  # Newton on erf(x) - y, from 0: monotone for |y| <= 0.9
        x = x - (_erf(x) - y) / (2 / math.sqrt(math.pi) * np.exp(-x * x))
    return x


_erf = np.vectorize(math.erf, otypes=[np.float64])
_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def _rmulh(x, y):
    k = 31  # int32: round(x * y / 2^31), saturated (only MIN * MIN can overflow)
    return (x.astype(np.int64) * y + (1 << (k - 1))) >> k


#: mode -> (reference on float64 / int64 arrays, domain of each input)
#: domains: a any in [-2, 2], p positive, u in [-0.9, 0.9], e in [0.1, 1.9], nz away from 0,
#: h multiples of 1/2 in [-3, 3] (ties and equal values), s shift in [0, 5], big full int32
REF = {
    "RELU": (lambda x: np.maximum(x, 0), "a"),
    "ABS": (np.abs, "a"),
    "ACOS": (np.arccos, "u"),
    "ASIN": (np.arcsin, "u"),
    "CEIL": (np.ceil, "h"),
    "COS": (np.cos, "a"),
    "EXP": (np.exp, "a"),
    "EXPM1": (np.expm1, "a"),
    "FLOOR": (np.floor, "h"),
    "LOG": (np.log, "p"),
    "LOG1P": (np.log1p, "p"),
    "NEGATE": (np.negative, "a"),
    "SIGMOID": (_sigmoid, "a"),
    "SIN": (np.sin, "a"),
    "TANH": (np.tanh, "a"),
    "FAST_TANH": (_fast_tanh, "a"),
    "ROUND": (lambda x: np.trunc(x + np.copysign(0.5, x)), "h"),
    "ERF": (_erf, "a"),
    "ERFINV": (_erfinv, "u"),
    "ERFC": (_erfc, "a"),
    "ERFCINV": (lambda y: _erfinv(1 - y), "e"),
    "H_SWISH": (_h_swish, "a"),
    "ABS_GRAD": (lambda x, dy: np.where(x > 0, dy, -dy), "ha"),
    "ADD": (np.add, "aa"),
    "FLOOR_DIV": (lambda x, y: np.floor(x / y), ("a", "nz")),
    "MAX": (np.maximum, "hh"),
    "MIN": (np.minimum, "hh"),
    "MOD": (np.fmod, ("a", "nz")),
    "MUL": (np.multiply, "aa"),
    "POW": (np.power, "pa"),
    "SIGMOID_GRAD": (lambda y, dy: (1 - y) * y * dy, "aa"),
    "SUB": (np.subtract, "aa"),
    "SWITCH_GT0": (lambda x, dy: np.where(x > 0, dy, 0), "ha"),
    "TANH_GRAD": (lambda y, dy: (1 - y * y) * dy, "aa"),
    "TRUE_DIV": (np.true_divide, ("a", "nz")),
    "LOG_SUM_EXP": (np.logaddexp, "aa"),
    "LT": (np.less, "hh"),
    "LEQ": (np.less_equal, "hh"),
    "EQ": (np.equal, "hh"),
    "SHL": (lambda x, s: x * 2**s, "as"),
    "SHR": (lambda x, s: x // 2**s, "as"),
    "FUSE_ADD_RELU": (lambda x, y: np.maximum(x + y, 0), "aa"),
    "FUSE_ADD_SIGMOID": (lambda x, y: _sigmoid(x + y), "aa"),
    "FUSE_ADD_TANH": (lambda x, y: np.tanh(x + y), "aa"),
    "FAST_TANH_GRAD": (lambda x, dy: (x * x - 9) ** 2 / (9 * (x * x + 3) ** 2) * dy, "aa"),
    "RMULH": (_rmulh, ("big", "big")),
    "ATAN2": (np.arctan2, "aa"),
    "H_SWISH_GRAD": (
        lambda x, dy: np.where(x < -3, 0, np.where(x > 3, dy, (2 * x + 3) / 6 * dy)),
        ("w", "a"),
    ),
    "FUSE_ADD_H_SWISH": (lambda x, y: _h_swish(x + y), ("w", "a")),
    "COND_LEQ_MOV": (lambda x, y, z: np.where(x <= y, z, 0), "hha"),
    "FUSE_MUL_ADD3": (lambda a, b, c: a * b + c, "aaa"),
    "FUSE_MUL_ADD4": (lambda a, b, c, d: a * b + c * d, "aaaa"),
}

#: input shapes per arity: they broadcast to (2, 3, 4)
SHAPES = {
    1: [(2, 3, 4)],
    2: [(2, 3, 4), (3, 1)],
    3: [(2, 1, 4), (3, 1), (1,)],
    4: [(2, 3, 1), (1, 4), (3, 4), (2, 1, 1)],
}


def _domains(spec):
    return list(spec)  # a string of one-letter domains, or a tuple of names


def _draw(rng, domain, shape, dtype):
    if dtype.kind == "i":
        if domain == "big":
            return rng.integers(-(2**31) + 1, 2**31, shape).astype(dtype)
        if domain == "s":
            return rng.integers(0, 6, shape).astype(dtype)
        lo, hi = (1, 5) if domain == "nz" else (-5, 5)
        v = rng.integers(lo, hi + 1, shape)
        if domain == "nz":
            v *= rng.choice([-1, 1], shape)
        return v.astype(dtype)
    if domain == "h":
        return (rng.integers(-6, 7, shape) / 2).astype(dtype)
    ranges = {"a": (-2, 2), "p": (0.1, 3), "u": (-0.9, 0.9), "e": (0.1, 1.9), "w": (-5, 5)}
    lo, hi = ranges.get(domain, (0.5, 2))  # "nz": magnitude in [0.5, 2], either sign
    v = rng.uniform(lo, hi, shape)
    if domain == "nz":
        v *= rng.choice([-1, 1], shape)
    return v.astype(dtype)


def _arrays(mode, dtype):
    ref, spec = REF[mode]
    doms = _domains(spec)
    assert len(doms) == MODES[mode].arity, mode
    rng = np.random.default_rng(zlib.crc32(mode.encode()))
    shapes = SHAPES[len(doms)]
    return ref, [_draw(rng, d, s, np.dtype(dtype)) for d, s in zip(doms, shapes)]


def _ref64(ref, dtype):
    def run_ref(*xs):
        wide = np.int64 if np.dtype(dtype).kind == "i" else np.float64
        return np.asarray(ref(*[x.astype(wide) for x in xs])).astype(np.float64)

    return run_ref


def test_reference_table_covers_every_mode():
    assert set(REF) == set(MODES)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_elemwise_mode_matches_numpy(mode):
    dtype = np.float32 if MODES[mode].float_ok else np.int32
    ref, arrays = _arrays(mode, dtype)
    (got,) = check_opr(
        lambda *xs: elemwise(*xs, mode=mode), _ref64(ref, dtype), arrays, rtol=2e-5, atol=2e-6
    )
    assert got.dtype == dtype and got.shape == (2, 3, 4)


@pytest.mark.parametrize("mode", sorted(m for m, t in MODES.items() if t.int_ok and t.float_ok))
def test_elemwise_int_mode_matches_numpy(mode):
    ref, arrays = _arrays(mode, np.int32)
    (got,) = check_opr(
        lambda *xs: elemwise(*xs, mode=mode), _ref64(ref, np.int32), arrays, rtol=0, atol=0
    )
    assert got.dtype == np.int32


@pytest.mark.parametrize("mode", ["ADD", "EXP", "SIGMOID", "FUSE_MUL_ADD3", "ERF"])
def test_elemwise_float16(mode):
    ref, arrays = _arrays(mode, np.float16)
    (got,) = check_opr(
        lambda *xs: elemwise(*xs, mode=mode), _ref64(ref, np.float16), arrays, rtol=2e-3, atol=2e-3
    )
    assert got.dtype == np.float16


def test_elem_shortcut_and_dedup():
    g = make_graph()
    (x, y), _ = inputs(g, np.linspace(-1, 1, 6, dtype=np.float32), np.ones(6, np.float32))
    e = elem.exp(x)
    assert e == elemwise(x, mode="exp")  # the same operator: deduplicated
    assert elem.max(x, y) == elemwise(x, y, mode="MAX")
    assert "fuse_mul_add3" in dir(elem)
    with pytest.raises(AttributeError):
        elem.no_such_mode  # noqa: B018
    got_e, got_m = run([e, elem.max(x, y)], g)
    np.testing.assert_allclose(got_e, np.exp(np.linspace(-1, 1, 6)), rtol=1e-6)
    np.testing.assert_array_equal(got_m, np.ones(6))


def test_operators_on_symbolvar_with_python_numbers():
    a = np.array([1.5, -2.0, 3.0], np.float32)
    check_opr(
        lambda x: (2 * x - 1) / 4 + x**2 - abs(-x), lambda x: (2 * x - 1) / 4 + x**2 - abs(x), [a]
    )
    check_opr(lambda x: (x < 2) + (x >= 3), lambda x: (x < 2) + (x >= 3.0), [a])


def test_broadcast_both_ways():
    a = np.arange(3, dtype=np.float32).reshape(3, 1)
    b = np.arange(4, dtype=np.float32).reshape(1, 4)
    check_opr(lambda x, y: x * y + y, lambda x, y: x * y + y, [a, b])


def test_inplace_chain_keeps_reread_inputs_intact():
    g = make_graph()
    x0 = np.linspace(-1, 1, 20, dtype=np.float32).reshape(4, 5)
    (x,), (hx,) = inputs(g, x0)
    a = x + 1
    b = elem.exp(a)  # may not overwrite a: read again by c
    c = b * a  # may overwrite b (its last reader)
    d = c - x  # x read again at the end
    e = elem.tanh(d) + a  # a read once more
    outs = [a, b, c, d, e]
    got = {}
    f = g.compile([(e.node, lambda arr: got.__setitem__("e", np.array(arr)))])

    def ref(xv):
        av = xv.astype(np.float64) + 1
        dv = np.exp(av) * av - xv
        return np.tanh(dv) + av

    for step in range(3):
        xv = x0 * (step + 1)
        np.copyto(hx.arr, xv)
        f.execute().wait()
        np.testing.assert_allclose(got["e"], ref(xv), rtol=1e-5)
    arrays = f.var_arrays()
    assert np.shares_memory(arrays[c.node], arrays[b.node])  # in-place reuse happened
    assert not np.shares_memory(arrays[b.node], arrays[a.node])
    assert not np.shares_memory(arrays[d.node], arrays[x.node])
    # every intermediate value is still right when all are outputs (none may be clobbered)
    vals = run(outs, g)
    av = x0.astype(np.float64) + 1
    for v, r in zip(vals, [av, np.exp(av), np.exp(av) * av, np.exp(av) * av - x0, ref(x0)]):
        np.testing.assert_allclose(v, r, rtol=1e-5)


def test_same_var_twice_in_one_operator():
    a = np.arange(6, dtype=np.float32) - 2
    check_opr(
        lambda x: elemwise(x + 1, x + 1, x + 1, mode="FUSE_MUL_ADD3"),
        lambda x: (x + 1) * (x + 1) + (x + 1),
        [a],
    )


def _build(build, *arrays):
    g = make_graph()
    xs, _ = inputs(g, *arrays)
    return build(*xs)


def test_dtype_mismatch_error_names_operator_and_dtypes():
    # elemwise() promotes; the operator itself still takes one dtype and says which it got
    from megbrain.opr.basic_arith import Elemwise, ElemwiseParam

    def build(x, y):
        return insert_opr(
            Elemwise([x.node, y.node], ElemwiseParam("ADD"), make_opr_config("my_add"))
        )

    with pytest.raises(MegBrainError) as info:
        _build(build, np.zeros(3, np.float32), np.zeros(3, np.int32))
    msg = str(info.value)
    assert "Elemwise 'my_add'" in msg and "float32" in msg and "int32" in msg


def test_bad_arity_error_names_operator():
    with pytest.raises(MegBrainError, match=r"Elemwise 'one'.*ADD takes 2 inputs, got 1"):
        _build(lambda x: elemwise(x, mode="ADD", name="one"), np.zeros(3, np.float32))
    with pytest.raises(MegBrainError, match=r"Elemwise.*EXP takes 1 inputs, got 2"):
        _build(lambda x: elemwise(x, x, mode="EXP"), np.zeros(3, np.float32))


def test_unsupported_dtype_and_bad_broadcast_raise():
    with pytest.raises(MegBrainError, match="SHL.*float32"):
        _build(lambda x: elemwise(x, x, mode="SHL"), np.zeros(3, np.float32))
    with pytest.raises(MegBrainError, match=r"Elemwise 'bad'.*\{2,3\}.*\{4\}"):
        _build(
            lambda x, y: elemwise(x, y, mode="ADD", name="bad"),
            np.zeros((2, 3), np.float32),
            np.zeros(4, np.float32),
        )
    with pytest.raises(MegBrainError, match="invalid mode"):
        _build(lambda x: elemwise(x, mode="NOPE"), np.zeros(3, np.float32))


# ---- TypeCvt -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("src", "dst"),
    [
        ("float32", "int32"),
        ("float32", "float16"),
        ("int32", "float32"),
        ("float32", "float32"),
        ("int16", "int8"),
        ("float16", "float32"),
    ],
)
def test_typecvt(src, dst):
    a = (np.linspace(-3.7, 3.7, 12) * (1 if src.startswith("f") else 10)).astype(src)
    (got,) = check_opr(lambda x: typecvt(x, dst), lambda x: x.astype(dst), [a], rtol=1e-3)
    assert got.dtype == np.dtype(dst)


def test_typecvt_truncates_toward_zero_and_astype():
    a = np.array([-1.7, -0.2, 0.9, 2.5], np.float32)
    (got,) = check_opr(lambda x: x.astype("int32"), lambda x: np.array([-1, 0, 0, 2]), [a])
    assert got.dtype == np.int32


# ---- Reduce ------------------------------------------------------------------------------
NP_REDUCE = {
    "SUM": np.sum,
    "SUM_SQR": lambda x, **kw: np.sum(x * x, **kw),
    "PRODUCT": np.prod,
    "MIN": np.min,
    "MAX": np.max,
    "MEAN": np.mean,
}


@pytest.mark.parametrize("mode", sorted(NP_REDUCE))
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reduce_modes(mode, axis, keepdims):
    a = np.random.default_rng(5).uniform(0.5, 1.5, (2, 3, 4)).astype(np.float32)

    def ref(x):
        if axis is None:
            return NP_REDUCE[mode](x.astype(np.float64)).reshape(1)
        return NP_REDUCE[mode](x.astype(np.float64), axis=axis, keepdims=keepdims)

    (got,) = check_opr(lambda x: reduce_(x, mode, axis, keepdims), ref, [a])
    assert got.dtype == np.float32


@pytest.mark.parametrize("mode", sorted(NP_REDUCE))
@pytest.mark.parametrize("target", [(1, 3, 1), (2, 1, 4), (1, 1, 1), (2, 3, 4)])
def test_reduce_to_target_shape(mode, target):
    a = np.random.default_rng(6).uniform(0.5, 1.5, (2, 3, 4)).astype(np.float32)
    axes = tuple(i for i, t in enumerate(target) if t == 1 and a.shape[i] != 1)

    def ref(x):
        return NP_REDUCE[mode](x.astype(np.float64), axis=axes, keepdims=True)

    check_opr(lambda x: reduce_general(x, mode=mode, target_shape=target), ref, [a])


def test_reduce_int_and_multiple_axes():
    a = np.arange(24, dtype=np.int32).reshape(2, 3, 4) - 10
    check_opr(lambda x: reduce_(x, "SUM", (0, 2)), lambda x: x.sum(axis=(0, 2)), [a])
    check_opr(lambda x: x.max(axis=1, keepdims=True), lambda x: x.max(1, keepdims=True), [a])
    check_opr(lambda x: x.sum(), lambda x: x.sum().reshape(1), [a])


def test_mean():
    a = np.random.default_rng(7).standard_normal((3, 5)).astype(np.float32)
    check_opr(lambda x: mean(x, 1), lambda x: x.mean(1), [a])
    check_opr(lambda x: mean(x, 0, keepdims=True), lambda x: x.mean(0, keepdims=True), [a])
    check_opr(lambda x: x.mean(), lambda x: x.mean().reshape(1), [a])


def test_reduce_axis_error_names_operator():
    with pytest.raises(MegBrainError, match=r"Reduce.*axis 3 out of range.*\{2,3\}"):
        _build(lambda x: reduce_general(x, mode="SUM", axis=3), np.zeros((2, 3), np.float32))


def test_reduce_errors_name_operator():
    with pytest.raises(MegBrainError, match=r"Reduce.*\{2,3\}.*target shape \{4,1\}"):
        _build(
            lambda x: reduce_general(x, mode="SUM", target_shape=(4, 1)),
            np.zeros((2, 3), np.float32),
        )
    with pytest.raises(MegBrainError, match="mode"):
        _build(lambda x: reduce_general(x, mode="MEDIAN"), np.zeros(3, np.float32))


# ---- inferred_value ----------------------------------------------------------------------
def test_inferred_value_over_immutables_is_const():
    g = make_graph()
    a0 = np.array([[0.5, -1.0, 2.0], [1.0, 0.0, -3.0]], np.float32)
    a = make_immutable("cpu0", g, a0)
    y = elem.exp(a) * 2 + a
    s = reduce_general(y, mode="SUM", target_shape=(2, 1))
    t = typecvt(s, "int32")
    for v in (y, s, t):
        assert v.node.value_type == InferType.CONST
    ref = np.exp(a0.astype(np.float64)) * 2 + a0
    np.testing.assert_allclose(y.inferred_value, ref, rtol=1e-6)
    np.testing.assert_allclose(s.inferred_value, ref.sum(1, keepdims=True), rtol=1e-6)
    np.testing.assert_array_equal(t.inferred_value, ref.sum(1, keepdims=True).astype(np.int32))
    # the inferred value is a copy: writing to it changes nothing
    iv = y.inferred_value
    iv[...] = 0
    np.testing.assert_allclose(y.inferred_value, ref, rtol=1e-6)


def test_inferred_value_over_host_inputs_is_rt_static():
    g = make_graph()
    (x,), (hx,) = inputs(g, np.array([1.0, 2.0, 3.0], np.float32))
    y = reduce_general(x * x + 1, mode="MAX", target_shape=(1,))
    assert y.node.value_type == InferType.RT_STATIC
    np.testing.assert_array_equal(y.inferred_value, [10.0])
    np.copyto(hx.arr, [4.0, -5.0, 0.0])
    np.testing.assert_array_equal(y.inferred_value, [26.0])  # follows the input's value


def test_inferred_value_none_without_value_infer():
    g = make_graph()
    (x,), _ = inputs(g, np.array([1.0, 2.0], np.float32), value_infer=False)
    y = elem.exp(x) + 1
    assert y.node.value_type == InferType.MISSING
    assert y.inferred_value is None
    assert y.imm_shape == (2,)  # the shape is still known statically
    (got,) = run([y], g)
    np.testing.assert_allclose(got, np.exp([1.0, 2.0]) + 1, rtol=1e-6)
