"""The calling conventions of MegBrain 0.6's generated ``mgb.opr`` functions.

The reference generated ``f(<inputs>, *, <param>=None, ..., name=None, comp_node=None,
config=None, comp_graph=None[, dtype=None], **fields)``: a param is given whole (a param-def
object or a list of its fields) or field by field, enum fields take members or names, and
unknown keywords raise.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import megbrain as mgb
import megbrain.opr_param_defs as P
from megbrain.errors import MegBrainError

# python name -> (the inputs in order, the keywords the reference's function took): its
# param arguments, their fields, and the config arguments
REFERENCE_SIGNATURES = {
    "elemwise": (("*inputs",), "name comp_node config comp_graph param mode"),
    "reduce_general": (
        ("*inputs",),
        "name comp_node config comp_graph param mode axis data_type",
    ),
    "typecvt": (("src", "target_dtype"), "name comp_node config comp_graph"),
    "concat": (("*inputs",), "name comp_node config comp_graph axis"),
    "reshape": (("src", "target_shape"), "name comp_node config comp_graph unspec_axis axis"),
    "broadcast": (("src", "target_shape"), "name comp_node config comp_graph param"),
    "get_var_shape": (("src",), "name comp_node config comp_graph axis"),
    "add_axis": (("src", "axis"), "name comp_node config comp_graph"),
    "remove_axis": (("src", "axis"), "name comp_node config comp_graph"),
    "matrix_mul": (
        ("opr0", "opr1"),
        "name comp_node config comp_graph dtype param transposeA transposeB compute_mode format",
    ),
    "batched_matrix_mul": (
        ("opr0", "opr1"),
        "name comp_node config comp_graph dtype param transposeA transposeB compute_mode format",
    ),
    "matrix_mul_v0": (
        ("opr0", "opr1"),
        "name comp_node config comp_graph param transposeA transposeB data_type",
    ),
    "dot": (("opr0", "opr1"), "name comp_node config comp_graph param"),
    "matrix_inverse": (("src",), "name comp_node config comp_graph param"),
    "svd": (("src",), "name comp_node config comp_graph param full_matrices compute_uv"),
    "convolution": (
        ("src", "filter"),
        "name comp_node config comp_graph dtype param mode pad_h pad_w stride_h stride_w "
        "dilate_h dilate_w sparse format compute_mode execution_polity strategy workspace_limit",
    ),
    "convolution_v0": (
        ("src", "filter"),
        "name comp_node config comp_graph param mode pad_h pad_w stride_h stride_w dilate_h "
        "dilate_w data_type sparse format execution_polity strategy workspace_limit",
    ),
    "deconvolution": (
        ("src", "filter"),
        "name comp_node config comp_graph param mode pad_h pad_w stride_h stride_w dilate_h "
        "dilate_w sparse format compute_mode execution_polity strategy workspace_limit",
    ),
    "conv_bias_activation": (
        ("src", "filter", "bias"),
        "name comp_node config comp_graph dtype param nonlineMode mode sparse format pad_h "
        "pad_w stride_h stride_w dilate_h dilate_w output_block_size compute_mode "
        "execution_policy strategy workspace_limit",
    ),
    "convolution3d": (
        ("src", "filter"),
        "name comp_node config comp_graph param mode pad_d pad_h pad_w stride_d stride_h "
        "stride_w dilate_d dilate_h dilate_w sparse data_type format execution_polity strategy "
        "workspace_limit",
    ),
    "deconvolution3d": (
        ("src", "filter"),
        "name comp_node config comp_graph param mode pad_d pad_h pad_w stride_d stride_h "
        "stride_w dilate_d dilate_h dilate_w sparse data_type format execution_policy strategy "
        "workspace_limit",
    ),
    "pooling": (
        ("src",),
        "name comp_node config comp_graph param mode pad_h pad_w stride_h stride_w window_h "
        "window_w format",
    ),
    "batch_norm": (
        ("x", "scale", "bias", "running_mean", "running_variance"),
        "name comp_node config comp_graph param param_dim fwd_mode epsilon avg_factor",
    ),
    "batch_norm_no_statistic": (
        ("x", "scale", "bias"),
        "name comp_node config comp_graph param param_dim fwd_mode epsilon avg_factor",
    ),
    "lrn": (("src",), "name comp_node config comp_graph param n k alpha beta"),
    "roi_pooling": (
        ("src", "rois", "dest_shape"),
        "name comp_node config comp_graph param mode scale",
    ),
    "roi_align": (
        ("src", "rois"),
        "name comp_node config comp_graph param mode format spatial_scale offset "
        "pooled_height pooled_width sample_height sample_width",
    ),
    "warp_perspective": (
        ("src", "mat", "out_shape"),
        "name comp_node config comp_graph param imode bmode format border_val",
    ),
    "resize": (("src", "out_shape"), "name comp_node config comp_graph param imode format"),
    "linspace": (("start", "stop", "num"), "name comp_node config comp_graph param endpoint"),
    "eye": (("shape",), "name comp_node config comp_graph param k dtype"),
    "alloc": (("shape", "dtype"), "name comp_node config comp_graph"),
    "uniform_rng": (("shape", "seed"), "name comp_node config comp_graph"),
    "gaussian_rng": (("shape", "seed", "mean", "std"), "name comp_node config comp_graph"),
    "argmax": (("src", "axis", "keepdims"), "name comp_node config comp_graph"),
    "argmin": (("src", "axis", "keepdims"), "name comp_node config comp_graph"),
    "argsort": (("src",), "name comp_node config comp_graph param order"),
    "cumsum": (("src",), "name comp_node config comp_graph param axis exclusive reverse"),
    "cond_take": (("data", "mask"), "name comp_node config comp_graph param mode val eps"),
    "top_k": (("data", "k"), "name comp_node config comp_graph param mode"),
    "indexing_one_hot": (("src", "axis", "index", "keepdims"), "name comp_node config comp_graph"),
    "indexing_set_one_hot": (
        ("src", "axis", "index", "value"),
        "name comp_node config comp_graph",
    ),
    "indexing_remap": (
        ("src", "map_"),
        "name comp_node config comp_graph param is_non_overlapping",
    ),
    "copy": (("src",), "name comp_node config comp_graph param"),
    "identity": (("src",), "name comp_node config comp_graph param"),
    "mark_no_broadcast_elemwise": (("src",), "name comp_node config comp_graph param"),
    "assert_equal": (("expect", "get"), "name comp_node config comp_graph param maxerr verbose"),
    "set_grad": (("src", "grad_getter"), "name comp_node config comp_graph"),
    "callback_injector": (("src", "cb"), "name comp_node config comp_graph"),
    "virtual_dep": (("symvars",), "name comp_node config comp_graph"),
    "virtual_loss": (("ys", "y_grads"), "name comp_node config comp_graph"),
    # hand-written in the reference's module template
    "reduce_": (("src", "mode", "axis", "keepdims"), "name comp_node config comp_graph"),
    "add_update": (
        ("dest", "delta", "alpha", "beta", "bias", "disable"),
        "name comp_node config comp_graph",
    ),
    "dimshuffle": (("src", "pattern", "ndim"), "name comp_node config"),
    "param_pack_split": (("src", "shapes"), "name comp_node config"),
    "mean": (("inp", "axis", "keepdims"), ""),
    "square": (("inp",), ""),
    "sqrt": (("inp",), ""),
    "zero_grad": (("sv",), ""),
    "symvar_from_shared_nd": (("sv", "comp_graph", "name"), ""),
}

_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


@pytest.mark.parametrize("fname", sorted(REFERENCE_SIGNATURES))
def test_reference_inputs_and_keywords_are_accepted(fname):
    inputs, keywords = REFERENCE_SIGNATURES[fname]
    params = inspect.signature(getattr(mgb.opr, fname)).parameters.values()
    positional = [
        ("*" if p.kind == p.VAR_POSITIONAL else "") + p.name
        for p in params
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
    ]
    assert tuple(positional[: len(inputs)]) == inputs
    named = {p.name for p in params if p.kind in _NAMED}
    missing = sorted(set(keywords.split()) - named)
    assert not missing, f"{fname} lacks keyword(s) {missing}"


@pytest.fixture
def graph():
    return mgb.comp_graph()


def _const(graph, value, dtype="float32"):
    return mgb.make_immutable("cpu0", graph, np.asarray(value, dtype))


# ---- comp_graph ---------------------------------------------------------------------------
def test_concat_of_arrays_goes_to_the_given_graph_and_comp_node(graph):
    a = np.ones((2, 2), np.float32)
    b = np.zeros((1, 2), np.float32)
    out = mgb.opr.concat(a, b, axis=0, comp_node="cpu0", comp_graph=graph)
    assert out.owner_graph == graph
    assert out.comp_node == mgb.comp_node("cpu0")
    np.testing.assert_array_equal(out.inferred_value, np.concatenate([a, b]))
    # the list form of MegEngine's F.concat
    listed = mgb.opr.concat([a, b], axis=1 - 1, comp_node="cpu0", comp_graph=graph)
    np.testing.assert_array_equal(listed.inferred_value, np.concatenate([a, b]))


@pytest.mark.parametrize(
    "build",
    [
        lambda g: mgb.opr.elemwise(1.0, 2.0, mode="add", comp_node="cpu0", comp_graph=g),
        lambda g: mgb.opr.typecvt(np.ones(2), "int32", comp_node="cpu0", comp_graph=g),
        lambda g: mgb.opr.reduce_general(np.ones(3), mode="sum", comp_node="cpu0", comp_graph=g),
        lambda g: mgb.opr.reshape(np.ones(4), (2, 2), comp_node="cpu0", comp_graph=g),
        lambda g: mgb.opr.argmax(np.ones(3), comp_node="cpu0", comp_graph=g),
        lambda g: mgb.opr.identity(np.ones(3), comp_node="cpu0", comp_graph=g),
        lambda g: mgb.opr.reduce_(np.ones((2, 3)), "SUM", 1, comp_node="cpu0", comp_graph=g),
    ],
)
def test_comp_graph_places_immediate_inputs(graph, build):
    assert build(graph).owner_graph == graph


# ---- whole params -------------------------------------------------------------------------
def test_param_object_equals_field_keywords(graph):
    x = _const(graph, np.random.rand(1, 2, 5, 5))
    w = _const(graph, np.random.rand(3, 2, 3, 3))
    by_param = mgb.opr.convolution(
        x,
        w,
        param=P.Convolution(pad_h=1, stride_w=2, mode="convolution"),
        execution_polity=P.ExecutionPolicy(strategy="PROFILE"),
    )
    by_fields = mgb.opr.convolution(
        x, w, pad_h=1, stride_w=2, mode=P.Convolution.Mode.CONVOLUTION, strategy="profile"
    )
    assert by_param.imm_shape == by_fields.imm_shape == (1, 3, 5, 2)
    assert by_param.owner_opr.params == by_fields.owner_opr.params


def test_param_objects_of_several_operators(graph):
    x = _const(graph, [[3.0, 1.0, 2.0], [0.0, 5.0, 4.0]])
    np.testing.assert_array_equal(
        mgb.opr.elemwise(x, x, param=P.Elemwise("mul")).inferred_value, x.inferred_value**2
    )
    np.testing.assert_array_equal(
        mgb.opr.reduce_general(x, param=P.Reduce("max", 1)).inferred_value, [[3.0], [5.0]]
    )
    np.testing.assert_array_equal(mgb.opr.concat(x, x, axis=P.Axis(1)).imm_shape, (2, 6))
    np.testing.assert_array_equal(
        mgb.opr.get_var_shape(x, axis=P.OptionalAxisV1(1)).inferred_value, [3]
    )
    np.testing.assert_array_equal(
        mgb.opr.get_var_shape(x, axis=P.OptionalAxisV1()).inferred_value, [2, 3]
    )
    vals, idx = mgb.opr.argsort(x, param=P.Argsort("DESCENDING"))
    np.testing.assert_array_equal(idx.inferred_value, [[0, 2, 1], [1, 2, 0]])
    e = mgb.opr.eye((2, 3), param=P.Eye(k=1, dtype="int32"), comp_node="cpu0", comp_graph=graph)
    assert e.dtype == np.int32
    np.testing.assert_array_equal(e.inferred_value, np.eye(2, 3, 1))


def test_param_as_field_list_and_one_field_value(graph):
    a = _const(graph, np.random.rand(2, 3))
    assert mgb.opr.matrix_mul(a, a, param=[True, False]).imm_shape == (3, 3)
    assert mgb.opr.matrix_mul(a, a, param=(False, True)).imm_shape == (2, 2)
    np.testing.assert_array_equal(
        mgb.opr.elemwise([a, a], param="sub").inferred_value, np.zeros((2, 3))
    )


def test_enum_members_as_field_values(graph):
    x = _const(graph, [0.0, 1.0, 2.0])
    # MegEngine's F.where passes the enum member itself
    vals, _ = mgb.opr.cond_take(x, x, mode=P.CondTake.Mode.GEQ, val=1)
    assert vals.owner_opr.params["mode"] == "GEQ"


def test_reduce_general_takes_the_target_shape_as_an_input(graph):
    x = _const(graph, np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(
        mgb.opr.reduce_general([x, (2, 1)], mode="sum").inferred_value, [[3.0], [12.0]]
    )
    np.testing.assert_array_equal(
        mgb.opr.reduce_general(x, (1, 3), mode="sum").inferred_value, [[3.0, 5.0, 7.0]]
    )
    shape = mgb.opr.get_var_shape(_const(graph, np.zeros((1, 3))))
    np.testing.assert_array_equal(
        mgb.opr.reduce_general([x, shape], mode="max").inferred_value, [[3.0, 4.0, 5.0]]
    )


def test_renamed_field_under_its_reference_name(graph):
    x = _const(graph, np.zeros(6))
    assert mgb.opr.reshape(x, (2, 1, 3), axis=1).imm_shape == (2, 1, 3)
    assert mgb.opr.reshape(x, (2, 1), unspec_axis=P.OptionalAxisV1(1)).imm_shape == (2, 3)


def test_legacy_param_versions(graph):
    x = _const(graph, np.random.rand(1, 2, 5, 5))
    w = _const(graph, np.random.rand(3, 2, 3, 3))
    assert mgb.opr.convolution_v0(x, w, param=P.ConvolutionV0(pad_h=1)).imm_shape == (1, 3, 5, 3)
    a = _const(graph, np.random.rand(2, 3))
    assert mgb.opr.matrix_mul_v0(a, a, param=P.MatrixMulV0(transposeA=True)).imm_shape == (3, 3)
    with pytest.raises(MegBrainError, match="convolution_v0: data_type='INT8x8x16'"):
        mgb.opr.convolution_v0(x, w, data_type="int8x8x16")


# ---- errors ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "fname, call",
    [
        ("concat", lambda x: mgb.opr.concat(x, x, axis=0, bogus=1)),
        ("elemwise", lambda x: mgb.opr.elemwise(x, x, mode="add", bogus=1)),
        ("reduce_general", lambda x: mgb.opr.reduce_general(x, mode="sum", bogus=1)),
        ("convolution", lambda x: mgb.opr.convolution(x, x, bogus=1)),
        ("matrix_mul", lambda x: mgb.opr.matrix_mul(x, x, bogus=1)),
        ("reshape", lambda x: mgb.opr.reshape(x, (3,), bogus=1)),
        ("typecvt", lambda x: mgb.opr.typecvt(x, "int32", bogus=1)),
    ],
)
def test_unknown_keyword_raises_type_error_naming_function_and_keyword(graph, fname, call):
    with pytest.raises(TypeError, match=rf"{fname}\(\).*'bogus'"):
        call(_const(graph, [1.0, 2.0, 3.0]))


def test_field_given_twice_raises(graph):
    x = _const(graph, [1.0, 2.0])
    with pytest.raises(TypeError, match=r"elemwise\(\).*'mode'"):
        mgb.opr.elemwise(x, x, param=P.Elemwise("add"), mode="sub")


def test_bad_whole_param_raises(graph):
    x = _const(graph, [1.0, 2.0])
    with pytest.raises(TypeError, match=r"matrix_mul\(\): param= takes at most 4"):
        mgb.opr.matrix_mul(x, x, param=[False] * 5)
    with pytest.raises(TypeError, match=r"reduce_general\(\): param= must be a Reduce"):
        mgb.opr.reduce_general(x, param=P.Elemwise("add"))


def test_unimplemented_field_only_at_its_default(graph):
    x = _const(graph, [1.0, 2.0])
    mgb.opr.reduce_general(x, mode="sum", data_type="default")
    with pytest.raises(MegBrainError, match="reduce_general: data_type='FLOAT_O32xC32'"):
        mgb.opr.reduce_general(x, mode="sum", data_type="FLOAT_O32xC32")
    # a hint: any value
    w = _const(graph, np.ones((1, 1, 1, 1)))
    mgb.opr.convolution(_const(graph, np.ones((1, 1, 2, 2))), w, workspace_limit=1)


def test_symvar_from_shared_nd(graph):
    sv = mgb.make_shared("cpu0", value=np.arange(3, dtype=np.float32))
    var = mgb.opr.symvar_from_shared_nd(sv, graph, "w")
    assert var.owner_graph == graph and var.name == "w"
    with pytest.raises(TypeError, match=r"symvar_from_shared_nd\(\): sv must be a SharedND"):
        mgb.opr.symvar_from_shared_nd(np.zeros(3), graph)
