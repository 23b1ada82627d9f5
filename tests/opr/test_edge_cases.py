"""Edge cases that used to give silently wrong answers and now compute right or raise clearly.

* the gradient of a PRODUCT reduction where inputs are exactly 0 (was NaN from ``y / x``);
* axes out of range in ``reduce_`` and the var methods (wrapped modulo ndim);
* a NumPy array on the left of an operator (took over: an object array of vars);
* axes, shapes and ints given as ``'1'``, ``1.5`` or bools (truncated or parsed), options
  the C field can not hold (``graph_opt_level=1e30`` became 0);
* inputs given a shape but never a value (ran on uninitialized memory).
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
from opr_harness import check_grad, inputs, make_graph, run

import megbrain as mgb
from megbrain.errors import ArgumentError, MegBrainError, ShapeDescError
from megbrain.opr import SymbolVar, make_immutable
from megbrain.opr.basic_arith import reduce_, reduce_general
from megbrain.opr.grad import grad

CN = "cpu0"
F64 = np.dtype(np.float64)


def _shared(value, comp_graph=None) -> SymbolVar:
    """A shared-tensor var holding ``value`` (in a fresh graph unless one is given)."""
    g = mgb.comp_graph() if comp_graph is None else comp_graph
    return mgb.make_shared(CN, value=value, comp_graph=g)


# ---- PRODUCT gradient at zeros ---------------------------------------------------------------
def _with_zeros(shape, seed=0) -> np.ndarray:
    """Values away from 0 in magnitude, with single zeros, two zeros along axis 1 and a row of
    zeros along axis 2: every count of zeros an exclusive product can meet."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.5, 1.5, shape) * rng.choice([-1.0, 1.0], shape)
    x[0, 1, 2] = 0.0
    x[1, :2, 3] = 0.0
    x[2, 3, :] = 0.0
    return x


def _exclusive_prod(a: np.ndarray, axis: int) -> np.ndarray:
    a = np.moveaxis(a, axis, -1)
    out = np.stack([np.prod(np.delete(a, i, axis=-1), axis=-1) for i in range(a.shape[-1])], -1)
    return np.moveaxis(out, -1, axis)


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", [None, 0, 1, 2, -1, (0, 2), (1, 2)])
def test_product_grad_with_zeros_matches_finite_differences(axis, keepdims):
    x = _with_zeros((3, 4, 5))
    got = check_grad(lambda v: reduce_(v, "PRODUCT", axis, keepdims), [x])
    assert np.isfinite(got[0]).all()


@pytest.mark.parametrize("target", [(1, 4, 1), (3, 1, 5), (1, 1, 1), (3, 4, 1), (3, 4, 5)])
def test_product_grad_to_target_shape_with_zeros(target):
    x = _with_zeros((3, 4, 5), seed=1)
    check_grad(lambda v: reduce_general(v, mode="PRODUCT", target_shape=target), [x])


def test_product_grad_is_the_exclusive_product():
    x = np.array([[1.0, 2.0, 0.0, 3.0], [0.0, 2.0, 0.0, 5.0], [1.0, 2.0, 3.0, 4.0]])
    g = make_graph()
    (v,), _ = inputs(g, x)
    (gx,) = grad(reduce_(v, "PRODUCT", 1).sum(), [v], warn_mid_wrt=False)
    np.testing.assert_array_equal(run([gx], g)[0], _exclusive_prod(x, 1))


@pytest.mark.parametrize("axis", [None, 1, 2, (0, 2)])
def test_product_second_order_with_zeros(axis):
    x = _with_zeros((3, 4, 5), seed=2)[:, :3, :4]
    r = np.random.default_rng(6).standard_normal(x.shape)

    def first(v):
        w = make_immutable(CN, v.node.graph, r, dtype=F64)
        y = reduce_(v * w, "PRODUCT", axis, False)
        return SymbolVar(grad((y * y).sum(), [v], warn_mid_wrt=False)[0])

    check_grad(first, [x])

    def plain_first(v):  # d/dx of the exclusive product itself: products of all but two
        return SymbolVar(grad(reduce_(v, "PRODUCT", axis, False).sum(), [v], warn_mid_wrt=False)[0])

    check_grad(plain_first, [x])


def test_product_grad_follows_runtime_shape_changes_and_refuses_outgrown_axes():
    g = make_graph()
    (v,), hosts = inputs(g, np.array([[1.0, 2.0, 0.0, 3.0, 4.0]]))
    (gx,) = grad(reduce_(v, "PRODUCT", 1).sum(), [v], warn_mid_wrt=False)
    got = {}
    f = g.compile([(gx, lambda a: got.__setitem__(0, np.array(a)))])
    # the doubling steps built for 5 elements cover up to 8
    for a in ([[2.0, 0.0, 3.0]], [[2.0]], [[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 0.0, 8.0]]):
        hosts[0].arr = np.array(a)
        f.execute().wait()
        np.testing.assert_array_equal(got[0], _exclusive_prod(np.array(a), 1))
    hosts[0].arr = np.arange(1.0, 10.0).reshape(1, 9)
    with pytest.raises(mgb.exc.AssertionError, match="PRODUCT grad"):
        f.execute().wait()


def test_product_grad_of_dynamic_shape_counts_zeros():
    from megbrain.opr.misc import cond_take

    g = make_graph()
    data = np.array([2.0, 0.0, 5.0, 3.0, 7.0])
    (x, m), hosts = inputs(g, data, np.array([1, 1, 0, 1, 1], np.int32))
    vals, _ = cond_take(x, m, mode="EQ", val=1)  # [2, 0, 3, 7]: a shape known only at run time
    (gx,) = grad(reduce_(vals, "PRODUCT", None).sum(), [x], warn_mid_wrt=False)
    np.testing.assert_array_equal(run([gx], g)[0], [0.0, 42.0, 0.0, 0.0, 0.0])
    hosts[1].arr = np.array([1, 1, 1, 0, 0], np.int32)  # [2, 0, 5]
    np.testing.assert_array_equal(run([gx], g)[0], [0.0, 10.0, 0.0, 0.0, 0.0])
    hosts[1].arr = np.array([1, 0, 1, 1, 0], np.int32)  # [2, 5, 3]: no zero
    np.testing.assert_array_equal(run([gx], g)[0], [15.0, 0.0, 6.0, 10.0, 0.0])


def test_product_grad_in_eager_graph_with_zero():
    g = mgb.comp_graph()
    g.set_option("eager_evaluation", True)
    x = _shared(np.array([[3.0, 0.0, 2.0]], np.float32), comp_graph=g)
    gx = mgb.grad(x.prod(axis=1).sum(), x, use_virtual_grad=False)
    np.testing.assert_array_equal(gx.eager_val.get_value(), [[0.0, 6.0, 0.0]])


# ---- reduce axes out of range ----------------------------------------------------------------
def _var(eager=False, shape=(2, 3)):
    g = mgb.comp_graph()
    if eager:
        g.set_option("eager_evaluation", True)
    return mgb.make_shared(CN, value=np.ones(shape, np.float32), comp_graph=g)


@pytest.mark.parametrize("eager", [False, True])
@pytest.mark.parametrize(
    "call",
    [
        lambda x: mgb.opr.reduce_(x, "SUM", [5]),
        lambda x: mgb.opr.reduce_(x, "SUM", [0, 2]),
        lambda x: mgb.opr.reduce_(x, "SUM", (-3,)),
        lambda x: x.sum(axis=[5]),
        lambda x: x.mean(axis=[1, 5]),
        lambda x: x.max(axis=(7,)),
        lambda x: x.min(axis=[2]),
        lambda x: x.prod(axis=[-3]),
        lambda x: mgb.opr.mean(x, [5]),
    ],
)
def test_axis_list_out_of_range_raises(call, eager):
    with pytest.raises(ArgumentError, match=r"reduce_\(\): axis=-?\d is out of range for ndim 2"):
        call(_var(eager))


@pytest.mark.parametrize("eager", [False, True])
@pytest.mark.parametrize("method", ["sum", "mean", "max", "min", "prod"])
def test_single_axis_out_of_range_raises(method, eager):
    x = _var(eager)
    for axis in (2, 5, -3):
        with pytest.raises(MegBrainError, match=f"axis {axis} out of range"):
            getattr(x, method)(axis=axis)


def test_axis_list_naming_an_axis_twice_raises():
    with pytest.raises(ArgumentError, match="more than once"):
        _var().sum(axis=[1, -1])


def test_axis_list_in_range_still_reduces():
    x = _shared(np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    y = x.sum(axis=[0, -1])
    assert y.imm_shape == (3,)
    np.testing.assert_array_equal(
        y.inferred_value, np.arange(24, dtype=np.float32).reshape(2, 3, 4).sum(axis=(0, 2))
    )


_NP_REDUCE = {
    "SUM": np.sum,
    "SUM_SQR": lambda a, axis, keepdims: np.sum(a * a, axis=axis, keepdims=keepdims),
    "PRODUCT": np.prod,
    "MIN": np.min,
    "MAX": np.max,
    "MEAN": np.mean,
}


@pytest.mark.parametrize("axes", [[0, 2], [-1, 0], (1, 2, 0)])
@pytest.mark.parametrize("mode", list(_NP_REDUCE))
def test_reduce_over_an_axis_list_matches_numpy(mode, axes):
    # SUM_SQR used to square the partial results again at every further axis
    x = np.random.default_rng(3).uniform(0.5, 1.5, (2, 3, 4)).astype(np.float32)
    for keepdims in (False, True):
        got = mgb.opr.reduce_(_shared(x), mode, axes, keepdims).inferred_value
        want = np.asarray(_NP_REDUCE[mode](x, axis=tuple(axes), keepdims=keepdims))
        assert got.shape == (want.shape or (1,))  # no 0-d tensors
        np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5)


# ---- a NumPy array on the left ---------------------------------------------------------------
_LEFT_OPS = {
    "add": (lambda a, b: a + b),
    "sub": (lambda a, b: a - b),
    "mul": (lambda a, b: a * b),
    "truediv": (lambda a, b: a / b),
    "floordiv": (lambda a, b: a // b),
    "mod": (lambda a, b: a % b),
    "pow": (lambda a, b: a**b),
    "lt": (lambda a, b: a < b),
    "le": (lambda a, b: a <= b),
    "gt": (lambda a, b: a > b),
    "ge": (lambda a, b: a >= b),
}


@pytest.mark.parametrize("left", ["array", "scalar"])
@pytest.mark.parametrize("op", list(_LEFT_OPS))
def test_numpy_on_the_left_gives_a_var(op, left):
    xv = np.array([[1.0, 2.0, 3.0], [4.0, 0.5, 2.0]], np.float32)
    a = (
        np.array([[2.0, 2.0, 5.0], [1.0, 3.0, 2.0]], np.float32)
        if left == "array"
        else (np.float32(2.0))
    )
    x = _shared(xv)
    y = _LEFT_OPS[op](a, x)
    assert isinstance(y, SymbolVar)
    with np.errstate(all="ignore"):
        want = _LEFT_OPS[op](np.asarray(a), xv)
    np.testing.assert_allclose(y.inferred_value, want.astype(np.float32), rtol=1e-6)


def test_numpy_on_the_left_of_shifts_and_matmul():
    x = _shared(np.array([1, 2, 3], np.int32))
    np.testing.assert_array_equal((np.array([8, 8, 8], np.int32) >> x).inferred_value, [4, 2, 1])
    np.testing.assert_array_equal((np.array([1, 1, 1], np.int32) << x).inferred_value, [2, 4, 8])
    m = _shared(np.eye(2, dtype=np.float32) * 3)
    y = np.ones((2, 2), np.float32) @ m
    assert isinstance(y, SymbolVar)
    np.testing.assert_array_equal(y.inferred_value, np.full((2, 2), 3.0))


def test_numpy_ufunc_refuses_a_var():
    x = _shared(np.ones(3, np.float32))
    with pytest.raises(TypeError, match="__array_ufunc__"):
        np.add(np.ones(3, np.float32), x)


# ---- axes, shapes and ints must be integers --------------------------------------------------
BAD_INTS = {
    "str": "1",
    "float": 1.5,
    "integral float": 1.0,
    "bool": True,
    "np.float": np.float64(1),
}


def _graph_and_vars():
    g = mgb.comp_graph()
    x = _shared(np.arange(24, dtype=np.float32).reshape(2, 3, 4), comp_graph=g)
    idx = _shared(np.zeros((2, 4), np.int32), comp_graph=g)
    return g, x, idx


O = mgb.opr
# (function named in the message, argument named, call with the bad value)
AXIS_CALLS = {
    "concat": ("concat", "axis", lambda g, x, i, a: O.concat([x, x], axis=a)),
    "argmax": ("argmax", "axis", lambda g, x, i, a: O.argmax(x, axis=a)),
    "argmin": ("argmin", "axis", lambda g, x, i, a: O.argmin(x, axis=a)),
    "cumsum": ("cumsum", "axis", lambda g, x, i, a: O.cumsum(x, axis=a)),
    "indexing_one_hot": (
        "indexing_one_hot",
        "axis",
        lambda g, x, i, a: O.indexing_one_hot(x, a, i),
    ),
    "indexing_set_one_hot": (
        "indexing_set_one_hot",
        "axis",
        lambda g, x, i, a: O.indexing_set_one_hot(x, a, i, np.zeros((2, 4), np.float32)),
    ),
    "get_var_shape": ("get_var_shape", "axis", lambda g, x, i, a: O.get_var_shape(x, axis=a)),
    "axis_shape": ("get_var_shape", "axis", lambda g, x, i, a: x.axis_shape(a)),
    "add_axis": ("add_axis", "axis", lambda g, x, i, a: O.add_axis(x, a)),
    "add_axis list": ("add_axis", r"axis\[1\]", lambda g, x, i, a: O.add_axis(x, [0, a])),
    "remove_axis": (
        "remove_axis",
        "axis",
        lambda g, x, i, a: O.remove_axis(x.reshape(2, 1, 12), a),
    ),
    "reduce_general": ("reduce_general", "axis", lambda g, x, i, a: O.reduce_general(x, axis=a)),
    "reduce_": ("reduce_", "axis", lambda g, x, i, a: O.reduce_(x, "SUM", a)),
    "reduce_ list": ("reduce_", r"axis\[0\]", lambda g, x, i, a: O.reduce_(x, "SUM", [a])),
    "sum": ("reduce_", "axis", lambda g, x, i, a: x.sum(axis=a)),
    "mean": ("reduce_", "axis", lambda g, x, i, a: x.mean(axis=a)),
    "max": ("reduce_", "axis", lambda g, x, i, a: x.max(axis=a)),
    "dimshuffle": ("dimshuffle", r"pattern\[0\]", lambda g, x, i, a: x.dimshuffle(a, 0, 2)),
    "dimshuffle ndim": (
        "dimshuffle",
        "ndim",
        lambda g, x, i, a: O.dimshuffle(x, (1, 0, 2), ndim=a),
    ),
    "reshape unspec_axis": (
        "reshape",
        "unspec_axis",
        lambda g, x, i, a: O.reshape(x, (6, 4), unspec_axis=a),
    ),
}


@pytest.mark.parametrize("value", list(BAD_INTS.values()), ids=list(BAD_INTS))
@pytest.mark.parametrize("case", list(AXIS_CALLS))
def test_axis_must_be_an_integer(case, value):
    fname, arg, call = AXIS_CALLS[case]
    g, x, idx = _graph_and_vars()
    if case == "dimshuffle ndim" and value is True:
        pytest.skip("ndim=True is 1 < the pattern's 3 axes: refused by the operator anyway")
    with pytest.raises(ArgumentError, match=rf"{fname}\(\): {arg} must be an int"):
        call(g, x, idx, value)


@pytest.mark.parametrize("case", list(AXIS_CALLS))
def test_numpy_integer_axes_are_accepted(case):
    _, _, call = AXIS_CALLS[case]
    g, x, idx = _graph_and_vars()
    axis = np.int64(3) if case == "dimshuffle ndim" else np.int32(1)
    assert isinstance(call(g, x, idx, axis), SymbolVar)


SHAPE_CALLS = {
    "alloc": ("alloc", lambda g, x, s: O.alloc(s, comp_node=CN, comp_graph=g)),
    "eye": ("eye", lambda g, x, s: O.eye(s, comp_node=CN, comp_graph=g)),
    "uniform_rng": ("uniform_rng", lambda g, x, s: O.uniform_rng(s, comp_node=CN, comp_graph=g)),
    "gaussian_rng": ("gaussian_rng", lambda g, x, s: O.gaussian_rng(s, comp_node=CN, comp_graph=g)),
    "alloc with a var": ("alloc", lambda g, x, s: O.alloc([x.axis_shape(0), *s])),
    "reshape": ("reshape", lambda g, x, s: x.reshape(*s, -1)),
    "broadcast": ("broadcast", lambda g, x, s: O.broadcast(x[:, :1, :1], (*s, 3, 4))),
    "resize": ("resize", lambda g, x, s: O.resize(x.reshape(1, 2, 3, 4), s)),
    "warp_perspective": (
        "warp_perspective",
        lambda g, x, s: O.warp_perspective(
            x.reshape(1, 2, 3, 4), np.eye(3, dtype=np.float32).reshape(1, 3, 3), s
        ),
    ),
    "roi_pooling": (
        "roi_pooling",
        lambda g, x, s: O.roi_pooling(x.reshape(1, 2, 3, 4), np.zeros((1, 5), np.float32), s),
    ),
}
BAD_DIMS = {"float": (1.5, 4), "integral float": (2.0, 4), "str": ("2", 4), "bool": (True, 4)}


@pytest.mark.parametrize("shape", list(BAD_DIMS.values()), ids=list(BAD_DIMS))
@pytest.mark.parametrize("case", list(SHAPE_CALLS))
def test_shape_elements_must_be_integers(case, shape):
    fname, call = SHAPE_CALLS[case]
    g, x, _ = _graph_and_vars()
    with pytest.raises(ShapeDescError, match=rf"{fname}\(\) \w+: bad shape element"):
        call(g, x, shape)


@pytest.mark.parametrize("case", ["alloc", "eye", "uniform_rng", "gaussian_rng"])
def test_shape_elements_must_fit(case):
    fname, call = SHAPE_CALLS[case]
    g, x, _ = _graph_and_vars()
    with pytest.raises(ShapeDescError, match=rf"{fname}\(\) shape: .*int32"):
        call(g, x, (2**31, 2))


def test_numpy_integer_shapes_are_accepted():
    g, x, _ = _graph_and_vars()
    assert O.alloc((np.int64(1), np.int32(4)), comp_node=CN, comp_graph=g).imm_shape == (1, 4)
    assert O.uniform_rng(np.array([2, 3]), comp_node=CN, comp_graph=g).imm_shape == (2, 3)
    assert x.reshape(np.int64(6), 4).imm_shape == (6, 4)


INT_CALLS = {
    "eye k": ("eye", "k", lambda g, x, v: O.eye(3, k=v, comp_node=CN, comp_graph=g)),
    "uniform_rng seed": (
        "uniform_rng",
        "seed",
        lambda g, x, v: O.uniform_rng((2,), seed=v, comp_node=CN, comp_graph=g),
    ),
    "gaussian_rng seed": (
        "gaussian_rng",
        "seed",
        lambda g, x, v: O.gaussian_rng((2,), seed=v, comp_node=CN, comp_graph=g),
    ),
    "linspace num": (
        "linspace",
        "num",
        lambda g, x, v: O.linspace(0.0, 1.0, v, comp_graph=g, comp_node=CN),
    ),
    "top_k k": ("top_k", "k", lambda g, x, v: O.top_k(x.reshape(6, 4), v)),
    "lrn n": ("lrn", "n", lambda g, x, v: O.lrn(x.reshape(1, 2, 3, 4), n=v)),
    "roi_align pooled_height": (
        "roi_align",
        "pooled_height",
        lambda g, x, v: O.roi_align(
            x.reshape(1, 2, 3, 4), np.zeros((1, 5), np.float32), pooled_height=v
        ),
    ),
    "param_pack_split shapes": (
        "param_pack_split",
        r"shapes\[0\]",
        lambda g, x, v: O.param_pack_split(x.reshape(-1), [(v, 2)]),
    ),
}


@pytest.mark.parametrize("value", [2.5, "3", True], ids=["float", "str", "bool"])
@pytest.mark.parametrize("case", list(INT_CALLS))
def test_int_arguments_must_be_integers(case, value):
    fname, arg, call = INT_CALLS[case]
    g, x, _ = _graph_and_vars()
    with pytest.raises(ArgumentError, match=rf"{fname}\(\): {arg} must be an int"):
        call(g, x, value)


def test_linspace_num_int_is_accepted():
    g = mgb.comp_graph()
    y = O.linspace(0.0, 1.0, np.int64(5), comp_graph=g, comp_node=CN)
    np.testing.assert_allclose(y.inferred_value, np.linspace(0, 1, 5), rtol=1e-6)


@pytest.mark.parametrize(
    "name, val",
    [
        ("graph_opt_level", 1e30),  # the C cast made it 0
        ("graph_opt_level", 2**15),
        ("graph_opt.jit", 257),  # uint8 wrapped to 1
        ("async_exec_level", -1),
        ("graph_opt_level", 1.5),  # int() truncated to 1
        ("graph_opt_level", float("nan")),
        ("force_dynamic_alloc", 0.5),
        ("log_level", None),
        ("log_level", "high"),
    ],
)
def test_option_values_the_field_can_not_hold_raise(name, val):
    g = mgb.comp_graph(check_env_var=False)
    old = g.options.get(name)
    with pytest.raises(ArgumentError, match=rf"set_option\('{name.replace('.', '[.]')}'\)"):
        g.set_option(name, val)
    assert g.options.get(name) == old


def test_option_values_the_reference_accepts_still_work():
    g = mgb.comp_graph(check_env_var=False)
    g.set_option("graph_opt_level", np.int64(3))
    assert g.set_option("graph_opt_level", "1") == 3
    assert g.set_option("graph_opt_level", 0.0) == 1
    assert g.set_option("eager_evaluation", True) is False
    assert g.set_option("eager_evaluation", 0) is True


# ---- inputs never given a value --------------------------------------------------------------
def test_never_fed_shape_hinted_input_raises_naming_it():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, shape=(3,), name="the_input")
    f = g.compile(None, mgb.copy_output(x * 2))
    with pytest.raises(MegBrainError, match="'the_input' has no value"):
        f()
    # a value set afterwards is used: the refusal is not baked into the function
    x.set_value(np.array([1, 2, 3], np.float32))
    np.testing.assert_array_equal(f(), [2, 4, 6])


def test_shape_hinted_input_fed_through_the_function_runs():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, shape=(3,), name="x")
    f = g.compile([x], mgb.copy_output(x + 1))
    np.testing.assert_array_equal(f(np.zeros(3, np.float32)), [1, 1, 1])


def test_shape_of_a_never_fed_input_is_usable():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, shape=(3, 5), name="x")
    f = g.compile(None, mgb.copy_output(x.shape))
    np.testing.assert_array_equal(f(), [3, 5])


def test_never_fed_input_without_shape_raises_naming_it():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="no_shape")
    with pytest.raises(MegBrainError, match="no_shape"):
        g.compile(None, mgb.copy_output(x + 1))()


def test_never_fed_input_in_eager_graph_raises_naming_it():
    g = mgb.comp_graph()
    g.set_option("eager_evaluation", True)
    with pytest.raises(MegBrainError, match="'eager_in' has no value"):
        mgb.make_arg(CN, g, shape=(3,), name="eager_in")


def test_shape_only_mark_does_not_outlive_its_tensor():
    # a dropped, never fed input must not leave a mark a later tensor could inherit (the
    # marks are held by tensor, not by a recyclable id)
    from megbrain.opr import io

    for _ in range(20):
        g = mgb.comp_graph()
        mgb.make_arg(CN, g, shape=(3,), name="dropped")
        del g
    gc.collect()
    mgb.make_arg(CN, mgb.comp_graph(), shape=(1,))  # releases the marks nothing holds
    assert len(io._SHAPE_ONLY) <= 2
    for _ in range(20):
        g = make_graph()
        (v,), _ = inputs(g, np.ones(3))
        np.testing.assert_array_equal(run([v * 2.0], g)[0], [2.0, 2.0, 2.0])
