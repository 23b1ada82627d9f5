"""megbrain.onnx.load: what it builds, and what it refuses before building."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import megbrain as mgb  # noqa: E402
from megbrain.onnx import ONNXConversionError, claimed_op_types, load  # noqa: E402


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def _run(res, *vals):
    args = list(res.inputs.values())
    f = res.graph.compile(args, [mgb.copy_output(v) for v in res.outputs.values()])
    out = f(*vals)
    return out if isinstance(out, (list, tuple)) else [out]


def test_gemm_relu_with_shared_weights_fine_tunable():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    m = _model(
        [helper.make_node("Gemm", ["x", "w", "b"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        [_vi("x", [2, 3])],
        [_vi("y", [2, 4])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    res = load(m)
    assert list(res.inputs) == ["x"] and list(res.outputs) == ["y"]
    x = rng.standard_normal((2, 3)).astype(np.float32)
    (y,) = _run(res, x)
    np.testing.assert_allclose(y, np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-6)


def test_dynamic_batch_dim_becomes_runtime_shape():
    m = _model(
        [helper.make_node("Sigmoid", ["x"], ["y"])], [_vi("x", ["N", 3])], [_vi("y", ["N", 3])]
    )
    res = load(m)
    for n in (1, 5):
        x = np.linspace(-3, 3, 3 * n, dtype=np.float32).reshape(n, 3)
        (y,) = _run(res, x)
        np.testing.assert_allclose(y, 1 / (1 + np.exp(-x)), rtol=1e-5)


def test_unsupported_op_fails_before_building_naming_node_and_opset():
    m = _model(
        [
            helper.make_node("Relu", ["x"], ["h"], name="first"),
            helper.make_node("NonMaxSuppression", ["h"], ["y"], name="nms"),
        ],
        [_vi("x", [2])],
        [_vi("y", [2])],
    )
    graph = mgb.comp_graph()
    with pytest.raises(ONNXConversionError, match=r"'nms'.*NonMaxSuppression.*opset 17"):
        load(m, graph=graph)
    assert isinstance(ONNXConversionError("x"), mgb.MegBrainError)


def test_unsupported_attribute_value_is_refused():
    m = _model(
        [helper.make_node("Pad", ["x", "p"], ["y"], mode="bogus")],
        [_vi("x", [2]), _vi("p", [2], TensorProto.INT64)],
        [_vi("y", [4])],
    )
    with pytest.raises(ONNXConversionError, match="mode='bogus'"):
        load(m)


def test_unsupported_dtype_is_refused():
    m = _model(
        [helper.make_node("Identity", ["x"], ["y"])],
        [_vi("x", [2], TensorProto.COMPLEX64)],
        [_vi("y", [2], TensorProto.COMPLEX64)],
    )
    with pytest.raises(ONNXConversionError, match="COMPLEX64"):
        load(m)


def test_claimed_table_lists_core_families():
    claimed = claimed_op_types()
    for op in ("Conv", "MatMul", "Relu", "ReduceMean", "Reshape", "Softmax", "MaxPool"):
        assert op in claimed


@pytest.mark.parametrize(
    ("equation", "shapes"),
    [
        ("ij,jk->ik", [(2, 3), (3, 4)]),
        ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
        ("...ij,jk", [(2, 2, 3), (3, 4)]),
        ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
        ("ij->", [(3, 4)]),
        ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)]),
        # repeated indices: diagonals and traces
        ("...ii->...i", [(3, 5, 5)]),
        ("ii", [(4, 4)]),
        ("bii,bij->bj", [(2, 3, 3), (2, 3, 4)]),
        ("iji->ij", [(3, 2, 3)]),
        ("iiij->ji", [(3, 3, 3, 2)]),
    ],
)
def test_einsum_matches_numpy(equation, shapes):
    rng = np.random.default_rng(1)
    names = [f"x{i}" for i in range(len(shapes))]
    vals = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    want = np.einsum(equation, *vals)
    m = _model(
        [helper.make_node("Einsum", names, ["y"], equation=equation)],
        [_vi(n, list(s)) for n, s in zip(names, shapes)],
        [_vi("y", list(want.shape))],
        opset=12,
    )
    (y,) = _run(load(m), *vals)
    np.testing.assert_allclose(np.asarray(y).reshape(want.shape), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("storage_order", [0, 1])
def test_maxpool_indices_match_onnxruntime(storage_order):
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 5, 6)).astype(np.float32)
    node = helper.make_node(
        "MaxPool",
        ["x"],
        ["y", "i"],
        kernel_shape=[3, 2],
        strides=[2, 2],
        pads=[1, 0, 1, 1],
        storage_order=storage_order,
    )
    m = _model(
        [node],
        [_vi("x", [2, 3, 5, 6])],
        [_vi("y", None), _vi("i", None, TensorProto.INT64)],
        opset=12,
    )
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    y, i = _run(load(m), x)
    np.testing.assert_array_equal(y, want[0])
    np.testing.assert_array_equal(i, want[1])


hyp = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=25, deadline=None)
@given(
    shape=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    data=st.data(),
)
def test_broadcast_transpose_reduce_match_numpy(shape, data):
    nd = len(shape)
    bshape = data.draw(st.lists(st.sampled_from([True, False]), min_size=nd, max_size=nd))
    other = [1 if keep else d for keep, d in zip(bshape, shape)]
    perm = data.draw(st.permutations(list(range(nd))))
    axes = sorted(data.draw(st.sets(st.integers(0, nd - 1), min_size=1)))
    rng = np.random.default_rng(len(shape))
    a = rng.standard_normal(shape).astype(np.float32)
    b = rng.standard_normal(other).astype(np.float32)
    nodes = [
        helper.make_node("Add", ["a", "b"], ["s"]),
        helper.make_node("Transpose", ["s"], ["t"], perm=list(perm)),
        helper.make_node("ReduceSum", ["t", "axes"], ["y"], keepdims=0),
    ]
    axes_init = numpy_helper.from_array(np.asarray(axes, np.int64), "axes")
    m = _model(nodes, [_vi("a", shape), _vi("b", other)], [_vi("y", None)], [axes_init], 13)
    want = np.transpose(a + b, perm).sum(axis=tuple(axes))
    (y,) = _run(load(m), a, b)
    np.testing.assert_allclose(np.asarray(y).reshape(want.shape), want, rtol=1e-5, atol=1e-5)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    mode=st.sampled_from(["linear", "cubic"]),
    in_hw=st.tuples(st.integers(1, 9), st.integers(1, 9)),
    out_hw=st.tuples(st.integers(1, 9), st.integers(1, 9)),
    exclude_outside=st.sampled_from([0, 1]),
    coord=st.sampled_from(["half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel"]),
)
def test_antialiased_resize_matches_onnx_reference(mode, in_hw, out_hw, exclude_outside, coord):
    from onnx.reference import ReferenceEvaluator

    # a single output sample under pytorch_half_pixel sits at 0 (the spec, onnxruntime);
    # onnx's reference puts it at -0.5
    hyp.assume(not (coord == "pytorch_half_pixel" and 1 in out_hw))
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 2) + in_hw).astype(np.float32)
    sizes = np.asarray((1, 2) + out_hw, np.int64)
    node = helper.make_node(
        "Resize",
        ["x", "", "", "sizes"],
        ["y"],
        mode=mode,
        antialias=1,
        exclude_outside=exclude_outside,
        coordinate_transformation_mode=coord,
    )
    m = _model(
        [node],
        [_vi("x", list(x.shape))],
        [_vi("y", None)],
        [numpy_helper.from_array(sizes, "sizes")],
        19,
    )
    (want,) = ReferenceEvaluator(m).run(None, {"x": x})
    (y,) = _run(load(m), x)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    mode=st.sampled_from(["nearest", "linear", "cubic"]),
    in_hw=st.tuples(st.integers(2, 6), st.integers(2, 6)),
    out_hw=st.tuples(st.integers(1, 6), st.integers(1, 6)),
    roi=st.lists(st.floats(-0.5, 1.5, width=32), min_size=4, max_size=4),
)
def test_tf_crop_and_resize_matches_onnx_reference(mode, in_hw, out_hw, roi):
    from onnx.reference import ReferenceEvaluator

    # a sample exactly on the input's edge is inside or outside depending on rounding
    for i, (n_in, n_out) in enumerate(zip(in_hw, out_hw)):
        o = np.arange(n_out)
        lo, hi = roi[i], roi[2 + i]
        if n_out == 1:
            x = np.asarray([(hi - lo) * (n_in - 1) / 2 + lo * (n_in - 1)])
        else:
            x = o * (hi - lo) * (n_in - 1) / (n_out - 1) + lo * (n_in - 1)
        hyp.assume(np.all(np.abs(x) > 1e-3) and np.all(np.abs(x - (n_in - 1)) > 1e-3))
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 1) + in_hw).astype(np.float32)
    inits = [
        numpy_helper.from_array(np.asarray(roi, np.float32), "roi"),
        numpy_helper.from_array(np.asarray(out_hw, np.int64), "sizes"),
    ]
    node = helper.make_node(
        "Resize",
        ["x", "roi", "", "sizes"],
        ["y"],
        mode=mode,
        axes=[2, 3],
        coordinate_transformation_mode="tf_crop_and_resize",
        extrapolation_value=-7.0,
    )
    m = _model([node], [_vi("x", list(x.shape))], [_vi("y", None)], inits, 19)
    (want,) = ReferenceEvaluator(m).run(None, {"x": x})
    (y,) = _run(load(m), x)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    reduction=st.sampled_from(["none", "add", "mul", "max", "min"]),
    axis=st.integers(-2, 1),
    seed=st.integers(0, 2**16),
)
def test_scatter_elements_with_duplicates_matches_onnx_reference(reduction, axis, seed):
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    ishape = (2, 3)
    dim = x.shape[axis]
    a = axis % 2
    if reduction == "none":  # duplicates have no defined order: distinct targets per line
        lines = [rng.permutation(dim)[: ishape[a]] for _ in range(ishape[1 - a])]
        ind = np.stack(lines, axis=1 - a)
    else:
        ind = rng.integers(-dim, dim, ishape)
    ind = ind.astype(np.int64)
    upd = rng.standard_normal(ind.shape).astype(np.float32)
    node = helper.make_node(
        "ScatterElements", ["x", "i", "u"], ["y"], axis=axis, reduction=reduction
    )
    m = _model(
        [node],
        [_vi("x", [3, 4]), _vi("i", list(ind.shape), TensorProto.INT64), _vi("u", list(ind.shape))],
        [_vi("y", [3, 4])],
        opset=18,
    )
    (want,) = ReferenceEvaluator(m).run(None, {"x": x, "i": ind, "u": upd})
    (y,) = _run(load(m), x, ind.astype(np.int32), upd)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reduction", ["add", "mul", "max", "min"])
def test_scatter_nd_duplicate_rows_combine(reduction):
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    ind = np.asarray([[1], [3], [1], [-3]], np.int64)
    upd = rng.standard_normal((4, 3)).astype(np.float32)
    node = helper.make_node("ScatterND", ["x", "i", "u"], ["y"], reduction=reduction)
    m = _model(
        [node],
        [_vi("x", [4, 3]), _vi("i", [4, 1], TensorProto.INT64), _vi("u", [4, 3])],
        [_vi("y", [4, 3])],
        opset=18,
    )
    (want,) = ReferenceEvaluator(m).run(
        None, {"x": x, "i": np.where(ind < 0, ind + 4, ind), "u": upd}
    )
    (y,) = _run(load(m), x, ind.astype(np.int32), upd)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", [2, 7, 9])
@pytest.mark.parametrize(("exclusive", "reverse"), [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumprod_log_depth_scan_matches_numpy(n, exclusive, reverse):
    rng = np.random.default_rng(n)
    x = rng.uniform(0.5, 1.5, (3, n)).astype(np.float32)
    axis = numpy_helper.from_array(np.asarray(1, np.int64), "axis")
    node = helper.make_node("CumProd", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)
    m = _model([node], [_vi("x", [3, n])], [_vi("y", [3, n])], [axis], opset=26)
    v = x[:, ::-1] if reverse else x
    want = np.cumprod(v, axis=1)
    if exclusive:
        want = np.concatenate([np.ones((3, 1), np.float32), want[:, :-1]], axis=1)
    want = want[:, ::-1] if reverse else want
    (y,) = _run(load(m), x)
    np.testing.assert_allclose(y, want, rtol=1e-5)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(
    mode=st.sampled_from(["linear", "nearest", "cubic"]),
    padding=st.sampled_from(["zeros", "border", "reflection"]),
    align=st.sampled_from([0, 1]),
    hw=st.tuples(st.integers(2, 5), st.integers(2, 5)),
    seed=st.integers(0, 2**16),
)
def test_grid_sample_matches_onnx_reference(mode, padding, align, hw, seed):
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 3) + hw).astype(np.float32)
    grid = rng.uniform(-1.7, 1.7, (2, 4, 3, 2)).astype(np.float32)
    node = helper.make_node(
        "GridSample", ["x", "g"], ["y"], mode=mode, padding_mode=padding, align_corners=align
    )
    m = _model(
        [node], [_vi("x", list(x.shape)), _vi("g", list(grid.shape))], [_vi("y", None)], opset=22
    )
    (want,) = ReferenceEvaluator(m).run(None, {"x": x, "g": grid})
    (y,) = _run(load(m), x, grid)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)


def test_docs_list_the_claimed_op_types_exactly():
    import pathlib
    import re

    doc = pathlib.Path(__file__).parents[2] / "docs" / "onnx.md"
    m = re.search(r"## Claimed op types\n\n(\d+) op types:\n\n(.*?)\n\n", doc.read_text(), re.S)
    assert m, "docs/onnx.md has no claimed-op list"
    listed = m.group(2).split()
    assert listed == list(claimed_op_types())
    assert int(m.group(1)) == len(listed)


@pytest.mark.parametrize(
    ("inverse", "onesided", "complex_in", "length"),
    [(0, 0, 0, None), (0, 1, 0, 12), (0, 0, 1, 6), (1, 0, 1, None), (1, 1, 1, 10), (1, 0, 1, 9)],
)
def test_dft_matches_numpy_fft(inverse, onesided, complex_in, length):
    rng = np.random.default_rng(7)
    n = 8 if not (inverse and onesided) else 6
    x = rng.standard_normal((2, n, 3, 2 if complex_in else 1)).astype(np.float32)
    z = x[..., 0] + 1j * x[..., 1] if complex_in else x[..., 0]
    if inverse:
        ref = np.fft.irfft(z, n=length, axis=1) if onesided else np.fft.ifft(z, n=length, axis=1)
    else:
        ref = np.fft.fft(z, n=length, axis=1)
        if onesided:
            ref = ref[:, : (length or n) // 2 + 1]
    want = ref[..., None] if np.isrealobj(ref) else np.stack([ref.real, ref.imag], axis=-1)
    inputs = ["x", "len" if length else "", "axis"]
    inits = [numpy_helper.from_array(np.asarray(1, np.int64), "axis")]
    if length:
        inits.append(numpy_helper.from_array(np.asarray(length, np.int64), "len"))
    node = helper.make_node("DFT", inputs, ["y"], inverse=inverse, onesided=onesided)
    m = _model([node], [_vi("x", list(x.shape))], [_vi("y", None)], inits, opset=20)
    (y,) = _run(load(m), x)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)


def test_nonzero_and_compress_have_run_time_shapes():
    nodes = [
        helper.make_node("NonZero", ["x"], ["y"]),
        helper.make_node("Compress", ["v", "c"], ["z"], axis=0),
    ]
    m = _model(
        nodes,
        [_vi("x", [2, 3]), _vi("v", [4, 2]), _vi("c", [4], TensorProto.BOOL)],
        [_vi("y", None, TensorProto.INT64), _vi("z", None)],
        opset=13,
    )
    res = load(m)
    v = np.arange(8, dtype=np.float32).reshape(4, 2)
    for x, c in [
        (np.array([[0, 1, 0], [2, 0, 3]], np.float32), [1, 0, 1, 1]),
        (np.zeros((2, 3), np.float32), [0, 0, 0, 1]),
    ]:
        y, z = _run(res, x, v, np.array(c, bool))
        np.testing.assert_array_equal(np.asarray(y).reshape(2, -1), np.stack(np.nonzero(x)))
        np.testing.assert_array_equal(z, v[np.array(c, bool)])


@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor"])
@pytest.mark.parametrize(
    ("np_dt", "onnx_t"),
    [(np.int8, TensorProto.INT8), (np.uint8, TensorProto.UINT8), (np.int32, TensorProto.INT32)],
)
def test_bitwise_ops_match_numpy(op, np_dt, onnx_t):
    rng = np.random.default_rng(11)
    info = np.iinfo(np_dt)
    a = rng.integers(info.min, info.max, (4, 5), endpoint=True).astype(np_dt)
    b = rng.integers(info.min, info.max, (5,), endpoint=True).astype(np_dt)
    m = _model(
        [helper.make_node(op, ["a", "b"], ["y"])],
        [_vi("a", [4, 5], onnx_t), _vi("b", [5], onnx_t)],
        [_vi("y", [4, 5], onnx_t)],
        opset=18,
    )
    fn = {"BitwiseAnd": np.bitwise_and, "BitwiseOr": np.bitwise_or, "BitwiseXor": np.bitwise_xor}
    (y,) = _run(load(m), a, b)
    np.testing.assert_array_equal(y, fn[op](a, b))


@pytest.mark.parametrize(
    "pads, ceil, direct",
    [
        ([1, 1, 1, 1], 0, True),  # ResNet's stem pooling: MAX pooling's own padding
        ([0, 0, 0, 0], 1, False),  # ceil mode adds end pads: padded explicitly
        ([1, 0, 0, 1], 0, False),  # asymmetric
        ([2, 2, 2, 2], 0, True),  # the widest pad MAX pooling takes: every window holds input
    ],
)
def test_maxpool_pads_go_to_pooling_when_symmetric(pads, ceil, direct):
    from onnx.reference import ReferenceEvaluator

    node = helper.make_node(
        "MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=pads, ceil_mode=ceil
    )
    m = _model([node], [_vi("x", [1, 3, 10, 9])], [_vi("y", None)])
    x = np.random.default_rng(3).uniform(-1, 1, (1, 3, 10, 9)).astype(np.float32)
    res = load(m)
    args = list(res.inputs.values())
    f = res.graph.compile(args, [mgb.copy_output(v) for v in res.outputs.values()])
    types = [o.type_name for o in f._func.iter_opr_seq()]
    assert types.count("PoolingForward") == 1
    assert ("Concat" not in types) == direct
    (want,) = ReferenceEvaluator(m).run(None, {"x": x})
    (y,) = f(x)
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize(
    "op, keepdims, shape",
    [
        ("ReduceMean", 0, [1, 16, 7, 7]),  # MnasNet's head, x.mean([2, 3])
        ("ReduceMean", 1, [2, 3, 4, 5, 6]),
        ("ReduceMax", 1, [2, 4, 1, 9]),
        ("ReduceSumSquare", 0, [2, 3, 4, 5]),
    ],
)
def test_a_reduction_over_the_spatial_axes_is_one_reduction(op, keepdims, shape):
    from onnx.reference import ReferenceEvaluator

    axes = numpy_helper.from_array(np.arange(2, len(shape), dtype=np.int64), "axes")
    node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims)
    m = _model([node], [_vi("x", shape)], [_vi("y", None)], [axes], opset=18)
    x = np.random.default_rng(5).uniform(-1, 1, shape).astype(np.float32)
    res = load(m)
    f = res.graph.compile(list(res.inputs.values()),
                          [mgb.copy_output(v) for v in res.outputs.values()])  # fmt: skip
    types = [o.type_name for o in f._func.iter_opr_seq()]
    assert types.count("Reduce") == 1
    (want,) = ReferenceEvaluator(m).run(None, {"x": x})
    (y,) = f(x)
    assert y.shape == want.shape
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "op, attrs, shape",
    [
        ("AveragePool", {"kernel_shape": [7, 7]}, [1, 6, 7, 7]),  # ResNet's head
        ("MaxPool", {"kernel_shape": [3, 5], "strides": [2, 2]}, [2, 4, 3, 5]),
        ("GlobalAveragePool", {}, [2, 3, 4, 5, 6]),
        ("GlobalMaxPool", {}, [2, 3, 4, 9]),
        ("AveragePool", {"kernel_shape": [9]}, [2, 3, 9]),  # 1-d
    ],
)
def test_whole_plane_pooling_is_one_reduction(op, attrs, shape):
    from onnx.reference import ReferenceEvaluator

    m = _model([helper.make_node(op, ["x"], ["y"], **attrs)], [_vi("x", shape)], [_vi("y", None)])
    x = np.random.default_rng(4).uniform(-1, 1, shape).astype(np.float32)
    res = load(m)
    args = list(res.inputs.values())
    f = res.graph.compile(args, [mgb.copy_output(v) for v in res.outputs.values()])
    types = [o.type_name for o in f._func.iter_opr_seq()]
    assert types.count("Reduce") == 1 and "PoolingForward" not in types
    (want,) = ReferenceEvaluator(m).run(None, {"x": x})
    (y,) = f(x)
    assert y.shape == want.shape
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "sa, sb",
    [
        ([1, 7, 7, 96], [96, 24]),  # ConvNeXt's channels-last Linear layer
        ([2, 5, 6], [6, 3]),  # a transformer's tokens by a projection
        ([3, 1, 4], [4, 2]),
        ([2, 3, 5], [5]),  # by a vector: the last axis is dropped
    ],
)
def test_matmul_by_a_matrix_is_one_gemm_equal_to_onnxruntime(sa, sb):
    from megbrain.graph import infer_shape

    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(5)
    x = rng.standard_normal(sa).astype(np.float32)
    w = rng.standard_normal(sb).astype(np.float32)
    m = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_vi("x", sa)], [_vi("y", None)],
               [numpy_helper.from_array(w, "w")])  # fmt: skip
    res = load(m)
    args = list(res.inputs.values())
    f = res.graph.compile(args, [mgb.copy_output(v) for v in res.outputs.values()])
    types = [o.type_name for o in f._func.iter_opr_seq()]
    # one product of all the rows, not a batch of row blocks by a broadcast weight
    assert types.count("BatchedMatrixMul") == 1 and "Broadcast" not in types
    (mm,) = [o for o in f._func.iter_opr_seq() if o.type_name == "BatchedMatrixMul"]
    assert infer_shape(mm.outputs[0])[0] == 1
    (want,) = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    (y,) = f(x)
    assert y.shape == want.shape
    np.testing.assert_allclose(y, x.astype(np.float64) @ w, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
