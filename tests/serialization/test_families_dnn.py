"""Graph files of the blas, linalg, dnn (convolution, pooling, normalization, local, image),
JIT and craniotome families: every operator round-trips through a file with its
reference type id, params and results; operators that can not be dumped say why."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sereg_harness import file_tables

import megbrain as mgb
from megbrain.errors import MegBrainError, SerializationError
from megbrain.graph import static_shape
from megbrain.opr import param_defs as pdefs
from megbrain.opr.base import SymbolVar
from megbrain.opr.sereg_params import param_from_def
from megbrain.serialization import dep_oprs, sereg

F32 = np.float32


# ---- the round trip -------------------------------------------------------------------------
def _run(inputs, outputs, feeds):
    graph = outputs[0].owner_graph
    f = graph.compile(inputs, [mgb.copy_output(o) for o in outputs])
    res = f(*[feeds[v.name] for v in inputs])
    return [np.asarray(r) for r in (res if isinstance(res, (list, tuple)) else [res])]


#: operators whose param holds a tensor's identity, not a file's content
_IO = (
    "Host2DeviceCopy",
    "SharedDeviceTensor",
    "VolatileSharedDeviceTensor",
    "ImmutableTensor",
    "MultipleDeviceTensorHolder",
)


def _file_form(param):
    """``param`` with its float fields as the file's float32 holds them."""
    if not dataclasses.is_dataclass(param):
        return param
    return dataclasses.replace(
        param,
        **{
            f.name: float(F32(getattr(param, f.name)))
            for f in dataclasses.fields(param)
            if isinstance(getattr(param, f.name), float)
        },
    )


def _oprs(outputs):
    """(type name, param) of every operator ``outputs`` depend on, in dump order."""
    return [
        (o.type_name, None if o.type_name in _IO else _file_form(o.param))
        for o in dep_oprs([v.node for v in outputs])
    ]


def round_trip(tmp_path, outputs, feeds, *, expect=None, optimize=False):
    """Run ``outputs`` (fed by name from ``feeds``), dump them to a file, load it, run the
    loaded outputs on the same inputs and assert identical results, operator type names and
    params. ``expect``: {reference registered name: its param tables in the order written}
    that the file itself must hold (a name's entry compared exactly, other names ignored).

    Returns the loaded output vars."""
    outputs = list(outputs)
    if optimize:
        outputs = mgb.optimize_for_inference(outputs, fuse_conv_bias_nonlinearity=True)
    inputs = sorted(mgb.cgtools.get_dep_vars(outputs, "Host2DeviceCopy"), key=lambda v: v.name)
    before = _oprs(outputs)
    path = str(tmp_path / "graph.mgb")
    # dump first: running updates shared values in place (BatchNorm statistics)
    mgb.serialize_comp_graph_to_file(path, outputs)
    expect_vals = _run(inputs, outputs, feeds)
    if expect:
        tables = file_tables(path)
        assert {k: tables.get(k) for k in expect} == expect
    _, _, loaded = mgb.load_comp_graph_from_file(path)
    assert _oprs(loaded) == before
    linputs = sorted(mgb.cgtools.get_dep_vars(loaded, "Host2DeviceCopy"), key=lambda v: v.name)
    assert [v.name for v in linputs] == [v.name for v in inputs]
    got = _run(linputs, loaded, feeds)
    assert len(got) == len(expect_vals)
    for a, b in zip(got, expect_vals):
        np.testing.assert_array_equal(a, b)
    return loaded


def _arg(g, name, value):
    return mgb.make_arg("cpu0", g, shape=value.shape, dtype=value.dtype, name=name)


def _shared(g, name, value):
    return mgb.make_shared("cpu0", value=value, comp_graph=g, name=name)


def _bwd(y, wrt, feeds, rng):
    """The gradient operators of ``y``'s owner w.r.t. its inputs ``wrt`` (indices), for an
    output gradient fed as input ``d<name of y>`` (added to ``feeds``): the backward
    operators of a family without the reductions of a scalar loss."""
    opr = y.node.owner
    dv = rng.randn(*static_shape(y.node)).astype(y.dtype)
    name = f"d{len(feeds)}"
    feeds[name] = dv
    dy = _arg(y.owner_graph, name, dv)
    ogs = [dy.node if o is y.node else None for o in opr.outputs]
    return [SymbolVar(opr.grad(i, ogs)) for i in wrt]


_CONV = ("Convolution", "ExecutionPolicy")
_CONV3D = ("Convolution3D", "ExecutionPolicy")
#: the param tables the reference writes per registered name (src/opr/impl/*.sereg.h)
TABLES = {
    "MatrixMulV2": ("MatrixMul",),
    "BatchedMatrixMulV2": ("MatrixMul",),
    "Dot": ("Empty",),
    "MatrixInverse": ("Empty",),
    "SVD": ("SVD",),
    "ConvolutionV1": _CONV,
    "ConvolutionBackwardDataV1": _CONV,
    "ConvolutionBackwardFilterV1": _CONV,
    "Convolution3D": _CONV3D,
    "Convolution3DBackwardData": _CONV3D,
    "Convolution3DBackwardFilter": _CONV3D,
    "ConvBiasForwardV3": ("ConvBias", "ExecutionPolicy"),
    "Pooling": ("Pooling",),
    "PoolingBackward": ("Pooling",),
    "BatchNorm": ("BN",),
    "BatchNormBackward": ("BN",),
    "LRN": ("LRN",),
    "LRNBackward": ("LRN",),
    **{
        f"{n}V1": ("Convolution",)
        for n in (
            "Local",
            "LocalBackwardData",
            "LocalBackwardFilter",
            "GroupLocal",
            "GroupLocalBackwardData",
            "GroupLocalBackwardFilter",
        )
    },  # fmt: skip
    "ROIPooling": ("ROIPooling",),
    "ROIPoolingBackward": ("ROIPooling",),
    "ROIAlign": ("ROIAlign",),
    "ROIAlignBackward": ("ROIAlign",),
    "WarpPerspective": ("WarpPerspective",),
    "WarpPerspectiveBackwardData": ("WarpPerspective",),
    "WarpPerspectiveBackwardMat": ("WarpPerspective",),
    "ResizeV1": ("Resize",),
    "ResizeBackward": ("Resize",),
    "Elemwise": ("Elemwise",),
    "dynamic": (),  # a craniotome: blobs only
}


def _tables(*names):
    return {n: TABLES[n] for n in names}


@pytest.fixture
def rng():
    return np.random.RandomState(0)


def test_registered_names_are_the_references():
    """The file's type ids are those of the reference's registered class names."""
    want = {
        mgb.opr.blas.MatrixMul: "MatrixMul",
        mgb.opr.dnn.Convolution: "Convolution",
        mgb.opr.dnn_conv_bias.ConvBias: "ConvBiasForward",
        mgb.opr.dnn_local.Local: "Local",
        mgb.opr.dnn_local.GroupLocalBackwardData: "GroupLocalBackwardData",
        mgb.opr.dnn_image.Resize: "Resize",
        mgb.opr.dnn_norm.BatchNorm: "BatchNorm",
    }
    for cls, name in want.items():
        entry = sereg.find_by_opr(cls.__new__(cls))
        assert entry.type_id == sereg.type_id_of(name), cls


# ---- blas and linalg ------------------------------------------------------------------------
def test_blas_round_trip_with_grads(tmp_path, rng):
    g = mgb.comp_graph()
    a, b = rng.randn(3, 4).astype(F32), rng.randn(3, 5).astype(F32)
    feeds = {"a": a}
    c = mgb.opr.matrix_mul(_arg(g, "a", a), _shared(g, "b", b), True, compute_mode="FLOAT32")
    ba, bb = rng.randn(2, 3, 4).astype(F32), rng.randn(2, 4, 2).astype(F32)
    feeds["ba"] = ba
    bc = mgb.opr.batched_matrix_mul(_arg(g, "ba", ba), _shared(g, "bb", bb))
    v = rng.randn(5).astype(F32)
    feeds["v"] = v
    d = mgb.opr.dot(_arg(g, "v", v), _shared(g, "v2", v[::-1].copy()))
    grads = _bwd(c, [0, 1], feeds, rng) + _bwd(bc, [0, 1], feeds, rng)
    loaded = round_trip(
        tmp_path,
        [c, bc, d, *grads],
        feeds,
        expect=_tables("MatrixMulV2", "BatchedMatrixMulV2", "Dot"),
    )
    mm = loaded[0].node.owner
    assert mm.type_name == "MatrixMul" and mm.param.transposeA and not mm.param.transposeB
    assert mm.param.compute_mode == "FLOAT32"


def test_linalg_round_trip_with_grads(tmp_path, rng):
    g = mgb.comp_graph()
    m = (rng.randn(2, 3, 3) + 3 * np.eye(3)).astype(F32)
    feeds = {"m": m}
    x = _arg(g, "m", m)
    inv = mgb.opr.matrix_inverse(x)
    u, s, vt = mgb.opr.svd(x, full_matrices=True)
    (gx,) = _bwd(inv, [0], feeds, rng)
    round_trip(tmp_path, [inv, u, s, vt, gx], feeds, expect=_tables("MatrixInverse", "SVD"))


# ---- convolution, pooling --------------------------------------------------------------------
def test_convolution_round_trip_with_grads(tmp_path, rng):
    g = mgb.comp_graph()
    xv = rng.randn(2, 4, 7, 6).astype(F32)
    feeds = {"x": xv}
    x = _arg(g, "x", xv)
    w = _shared(g, "w", rng.randn(2, 3, 2, 3, 3).astype(F32))
    y = mgb.opr.convolution(
        x, w, sparse="GROUP", pad_h=1, stride_w=2, dilate_h=2, mode="CONVOLUTION",
        strategy="PROFILE",
    )  # fmt: skip
    p = mgb.opr.pooling(y, mode="AVERAGE", window_h=2, window_w=2, stride_h=1, pad_w=1)
    dy = mgb.opr.deconvolution(p, _shared(g, "w2", rng.randn(6, 2, 2, 2).astype(F32)))
    grads = _bwd(y, [0, 1], feeds, rng) + _bwd(p, [0], feeds, rng)
    loaded = round_trip(
        tmp_path,
        [y, p, dy, *grads],
        feeds,
        expect=_tables(
            "ConvolutionV1", "ConvolutionBackwardDataV1", "ConvolutionBackwardFilterV1",
            "Pooling", "PoolingBackward",
        ),
    )  # fmt: skip
    conv = loaded[0].node.owner
    assert conv.param.strategy == "PROFILE" and conv.param.dilate_h == 2


def test_convolution_writes_param_and_execution_policy():
    g = mgb.comp_graph()
    x = mgb.make_arg("cpu0", g, shape=(1, 1, 3, 3), name="x")
    y = mgb.opr.convolution(x, np.ones((1, 1, 2, 2), F32), strategy="PROFILE_HEURISTIC", pad_w=1)
    written = []

    class Ctx:
        def write_param(self, p):
            written.append(p)

    sereg.find_by_opr(y.node.owner).dump(Ctx(), y.node.owner)
    assert [type(p).__name__ for p in written] == ["Convolution", "ExecutionPolicy"]
    assert written[0].pad_w == 1 and written[1].strategy.name == "PROFILE_HEURISTIC"


def test_convolution3d_round_trip_with_grads(tmp_path, rng):
    g = mgb.comp_graph()
    xv = rng.randn(1, 2, 4, 5, 4).astype(F32)
    feeds = {"x": xv}
    x = _arg(g, "x", xv)
    w = _shared(g, "w", rng.randn(3, 2, 2, 2, 2).astype(F32))
    y = mgb.opr.convolution3d(x, w, pad_d=1, stride_h=2)
    dy = mgb.opr.deconvolution3d(y, _shared(g, "w2", rng.randn(3, 2, 1, 2, 1).astype(F32)))
    round_trip(
        tmp_path,
        [y, dy, *_bwd(y, [0, 1], feeds, rng)],
        feeds,
        expect=_tables(
            "Convolution3D", "Convolution3DBackwardData", "Convolution3DBackwardFilter"
        ),
    )  # fmt: skip


def test_conv_bias_round_trip_with_grads(tmp_path, rng):
    g = mgb.comp_graph()
    xv = rng.randn(2, 3, 5, 5).astype(F32)
    feeds = {"x": xv}
    x = _arg(g, "x", xv)
    w = _shared(g, "w", rng.randn(4, 3, 3, 3).astype(F32))
    b = _shared(g, "b", rng.randn(2, 4, 5, 5).astype(F32))  # a bias of the output's shape
    y = mgb.opr.conv_bias_activation(x, w, b, nonlineMode="RELU", pad_h=1, pad_w=1)
    loaded = round_trip(
        tmp_path,
        [y, *_bwd(y, [0, 1, 2], feeds, rng)],
        feeds,
        expect=_tables("ConvBiasForwardV3", "ConvolutionBackwardDataV1"),
    )
    assert loaded[0].node.owner.param.nonlineMode == "RELU"


def test_fused_conv_bias_of_optimize_for_inference(tmp_path, rng):
    g = mgb.comp_graph()
    xv = rng.randn(2, 3, 6, 6).astype(F32)
    x = _arg(g, "x", xv)
    w = _shared(g, "w", rng.randn(4, 3, 3, 3).astype(F32))
    b = _shared(g, "b", rng.randn(1, 4, 1, 1).astype(F32))
    y = mgb.opr.elemwise(mgb.opr.convolution(x, w, pad_h=1) + b, mode="RELU")
    loaded = round_trip(
        tmp_path, [y], {"x": xv}, optimize=True, expect=_tables("ConvBiasForwardV3")
    )
    types = {o.type_name for o in dep_oprs([v.node for v in loaded])}
    assert "ConvBiasForward" in types and "ConvolutionForward" not in types


def test_conv_bias_output_block_size_is_refused_at_load():
    with pytest.raises(SerializationError, match=r"ConvBias.output_block_size=2"):
        param_from_def(
            mgb.opr.dnn_conv_bias.ConvBiasParam,
            pdefs.ConvBias(output_block_size=2),
            "ConvBiasForwardV3",
        )


# ---- normalization --------------------------------------------------------------------------
def test_batch_norm_and_lrn_round_trip_with_grads(tmp_path, rng):
    g = mgb.comp_graph()
    xv = rng.randn(2, 3, 4, 4).astype(F32)
    feeds = {"x": xv}
    x = _arg(g, "x", xv)
    scale = _shared(g, "scale", rng.rand(1, 3, 1, 1).astype(F32) + 0.5)
    bias = _shared(g, "bias", rng.randn(1, 3, 1, 1).astype(F32))
    _, _, y = mgb.opr.batch_norm(x, scale, bias, epsilon=1e-3)
    z = mgb.opr.lrn(y, n=3, alpha=0.01, beta=0.5, k=1.5)
    grads = _bwd(y, [0, 1, 2], feeds, rng) + _bwd(z, [0], feeds, rng)
    loaded = round_trip(
        tmp_path,
        [y, z, *grads],
        feeds,
        expect=_tables("BatchNorm", "BatchNormBackward", "LRN", "LRNBackward"),
    )
    assert loaded[1].node.owner.param.n == 3
    assert loaded[0].node.owner.param.epsilon == pytest.approx(1e-3)


def test_batch_norm_inference_with_statistics_round_trip(tmp_path, rng):
    g = mgb.comp_graph()
    xv = rng.randn(2, 3, 4, 4).astype(F32)
    x = _arg(g, "x", xv)
    s = [_shared(g, n, rng.rand(1, 3, 1, 1).astype(F32) + 0.5) for n in "abcd"]
    outs = mgb.opr.batch_norm(x, *s, fwd_mode="INFERENCE")
    round_trip(tmp_path, [outs[-1]], {"x": xv}, expect=_tables("BatchNorm"))


def test_batch_norm_training_with_statistics_round_trip(tmp_path, rng):
    g = mgb.comp_graph()
    xv = rng.randn(2, 3, 4, 4).astype(F32)
    x = _arg(g, "x", xv)
    scale, bias = (_shared(g, n, rng.rand(1, 3, 1, 1).astype(F32) + 0.5) for n in "sb")
    mean = _shared(g, "mean", rng.randn(1, 3, 1, 1).astype(F32))
    var = _shared(g, "var", rng.rand(1, 3, 1, 1).astype(F32) + 1)
    outs = mgb.opr.batch_norm(x, scale, bias, mean, var, avg_factor=0.25)
    loaded = round_trip(tmp_path, [outs[0], outs[1], outs[-1]], {"x": xv})
    owner = loaded[0].node.owner
    assert owner.type_name == "BatchNormForward" and len(owner.inputs) == 5
    assert owner.param.avg_factor == 0.25


def test_bn_folding_of_optimize_for_inference(tmp_path, rng):
    g = mgb.comp_graph()
    xv = rng.randn(2, 3, 5, 5).astype(F32)
    x = _arg(g, "x", xv)
    w = _shared(g, "w", rng.randn(4, 3, 3, 3).astype(F32))
    s = [_shared(g, n, rng.rand(1, 4, 1, 1).astype(F32) + 0.5) for n in "abcd"]
    y = mgb.opr.batch_norm(mgb.opr.convolution(x, w), *s, fwd_mode="INFERENCE")[-1]
    y = mgb.opr.elemwise(y, mode="RELU")
    loaded = round_trip(tmp_path, [y], {"x": xv}, optimize=True)
    types = {o.type_name for o in dep_oprs([v.node for v in loaded])}
    assert "BatchNormForward" not in types and "MultipleDeviceTensorHolder" in types


def test_bn_scale_field_is_refused_at_load():
    with pytest.raises(SerializationError, match=r"BatchNorm: param BN.scale=2.0"):
        param_from_def(mgb.opr.dnn_norm.BNParam, pdefs.BN(scale=2.0), "BatchNorm")


# ---- local ----------------------------------------------------------------------------------
def test_local_and_group_local_round_trip_with_grads(tmp_path, rng):
    g = mgb.comp_graph()
    xv = rng.randn(2, 4, 5, 5).astype(F32)
    feeds = {"x": xv}
    x = _arg(g, "x", xv)
    # group_local: (G, OH, OW, IC/G, FH, FW, OC/G); 5x5 with 3x3, pad 1, stride 2 -> 3x3
    gw = _shared(g, "gw", rng.randn(2, 3, 3, 2, 3, 3, 2).astype(F32))
    y = mgb.opr.group_local(x, gw, pad_h=1, pad_w=1, stride_h=2, stride_w=2)
    lw = _shared(g, "lw", rng.randn(2, 2, 4, 2, 2, 3).astype(F32))
    z = mgb.opr.local(y, lw)
    grads = _bwd(y, [0, 1], feeds, rng) + _bwd(z, [0, 1], feeds, rng)
    round_trip(
        tmp_path,
        [y, z, *grads],
        feeds,
        expect=_tables(
            "LocalV1", "LocalBackwardDataV1", "LocalBackwardFilterV1",
            "GroupLocalV1", "GroupLocalBackwardDataV1", "GroupLocalBackwardFilterV1",
        ),
    )  # fmt: skip


# ---- image ----------------------------------------------------------------------------------
def test_roi_round_trip_with_grads(tmp_path, rng):
    g = mgb.comp_graph()
    sv = rng.randn(2, 2, 8, 8).astype(F32)
    rois = np.array([[0, 1.2, 0.7, 5.5, 6.1], [1, 0, 2, 7, 7], [1, 4, 4, 6, 5]], F32)
    feeds = {"src": sv, "rois": rois}
    src = _arg(g, "src", sv)
    r = _arg(g, "rois", rois)
    p = mgb.opr.roi_pooling(src, r, (2, 3), mode="AVERAGE", scale=0.5)
    a = mgb.opr.roi_align(src, r, pooled_height=2, pooled_width=2, spatial_scale=0.9)
    grads = _bwd(p, [0], feeds, rng) + _bwd(a, [0], feeds, rng)
    round_trip(
        tmp_path,
        [p, a, *grads],
        feeds,
        expect=_tables("ROIPooling", "ROIPoolingBackward", "ROIAlign", "ROIAlignBackward"),
    )


def test_warp_and_resize_round_trip_with_grads(tmp_path, rng):
    g = mgb.comp_graph()
    sv = rng.randn(2, 3, 6, 5).astype(F32)
    mat = np.stack([np.eye(3) + 0.05 * rng.randn(3, 3) for _ in range(2)]).astype(F32)
    mat[:, 2] = [0, 0, 1]
    feeds = {"src": sv, "mat": mat}
    w = mgb.opr.warp_perspective(
        _arg(g, "src", sv), _arg(g, "mat", mat), (4, 5), bmode="CONSTANT", border_val=0.5
    )
    r = mgb.opr.resize(w, (7, 3), format="NCHW")
    grads = _bwd(w, [0, 1], feeds, rng) + _bwd(r, [0], feeds, rng)
    loaded = round_trip(
        tmp_path,
        [w, r, *grads],
        feeds,
        expect=_tables(
            "WarpPerspective", "WarpPerspectiveBackwardData", "WarpPerspectiveBackwardMat",
            "ResizeV1", "ResizeBackward",
        ),
    )  # fmt: skip
    assert loaded[0].node.owner.param.border_val == 0.5


# ---- JIT ------------------------------------------------------------------------------------
def test_jit_executor_dump_is_refused_and_its_expansion_round_trips(tmp_path, rng):
    from megbrain.opr.jit import expand, jit_executor

    g = mgb.comp_graph()
    av, bv = rng.randn(2, 3).astype(F32), rng.randn(2, 3).astype(F32)
    a, b = _arg(g, "a", av), _arg(g, "b", bv)
    expr = (("MUL", (("i", 0), ("i", 1))), ("ADD", (("t", 0), ("c", 1.5))))
    y = jit_executor([a, b], expr)
    with pytest.raises(SerializationError, match=r"\(JITExecutor\).*before JIT fusion"):
        mgb.serialize_comp_graph_to_file(str(tmp_path / "jit.mgb"), [y])
    assert not (tmp_path / "jit.mgb").exists()
    unfused = SymbolVar(expand(y.node.owner))
    round_trip(tmp_path, [unfused], {"a": av, "b": bv}, expect=_tables("Elemwise"))


# ---- craniotome -----------------------------------------------------------------------------
class _Scale(mgb.craniotome.CraniotomeBase):
    """``x * k + inputs[1]`` with ``k`` dumped as the param bytes."""

    __nr_inputs__ = 2
    __nr_outputs__ = 1

    def setup(self, k=2.0):
        self.k = float(k)

    def infer_shape(self, inp_shapes):
        return [inp_shapes[0]]

    def execute(self, inputs, outputs):
        outputs[0].set_value(inputs[0].get_value() * F32(self.k) + inputs[1].get_value())

    def get_serialize_params(self):
        return ["test_families_dnn.scale", np.float64(self.k).tobytes()]


class _NoParams(_Scale):
    def get_serialize_params(self):
        return ["test_families_dnn.no_params"]


class _Unnamed(_Scale):
    def get_serialize_params(self):
        return super(_Scale, self).get_serialize_params()  # the base: not implemented


def _scale_loader(params):
    d = _Scale()
    d.setup(np.frombuffer(params, np.float64)[0])
    return d


def _no_params_loader(params):
    assert params is None
    d = _NoParams()
    d.setup(-1.0)
    return d


def test_craniotome_round_trip_through_registered_loaders(tmp_path, rng):
    mgb.craniotome.register_loader("test_families_dnn.scale", _scale_loader)
    mgb.craniotome.register_loader("test_families_dnn.no_params", _no_params_loader)
    g = mgb.comp_graph()
    xv, yv = rng.randn(4).astype(F32), rng.randn(4).astype(F32)
    x, y = _arg(g, "x", xv), _arg(g, "y", yv)
    z = _Scale.make(x, y, k=0.25)
    w = _NoParams.make(z, x, k=-1.0)
    loaded = round_trip(tmp_path, [z, w], {"x": xv, "y": yv}, expect=_tables("dynamic"))
    np.testing.assert_allclose(
        _run(sorted(mgb.cgtools.get_dep_vars(loaded, "Host2DeviceCopy"), key=lambda v: v.name),
             loaded, {"x": xv, "y": yv})[1],
        -(xv * F32(0.25) + yv) + xv, rtol=1e-6,
    )  # fmt: skip
    descs = [v.node.owner.desc for v in loaded]
    assert [type(d) for d in descs] == [_Scale, _NoParams] and descs[0].k == 0.25


def test_craniotome_dump_and_load_errors(tmp_path, rng):
    g = mgb.comp_graph()
    x = mgb.make_arg("cpu0", g, shape=(3,), name="x")
    y = _Unnamed.make(x, x)
    with pytest.raises(SerializationError, match=r"\(Craniotome\): _Unnamed does not define"):
        mgb.serialize_comp_graph_to_file(str(tmp_path / "c.mgb"), [y])

    class _Unknown(_Scale):
        def get_serialize_params(self):
            return ["test_families_dnn.never_registered", b"\0"]

    path = str(tmp_path / "u.mgb")
    mgb.serialize_comp_graph_to_file(path, [_Unknown.make(x, x)])
    with pytest.raises(SerializationError, match=r"never_registered.*register_loader"):
        mgb.load_comp_graph_from_file(path)
    with pytest.raises(MegBrainError, match="callable"):
        mgb.craniotome.register_loader("x", None)


# ---- whole graphs ---------------------------------------------------------------------------
def test_training_graph_of_a_small_network_round_trips(tmp_path, rng):
    """mgb.grad of a loss through convolution, batch norm, pooling and matmul: the file holds
    the forward and every backward operator of these families."""
    g = mgb.comp_graph()
    xv = rng.randn(2, 3, 6, 6).astype(F32)
    x = _arg(g, "x", xv)
    w = _shared(g, "w", rng.randn(4, 3, 3, 3).astype(F32))
    b = _shared(g, "b", rng.randn(1, 4, 1, 1).astype(F32))
    scale = _shared(g, "scale", rng.rand(1, 4, 1, 1).astype(F32) + 0.5)
    shift = _shared(g, "shift", rng.randn(1, 4, 1, 1).astype(F32))
    fc = _shared(g, "fc", rng.randn(36, 5).astype(F32))
    h = mgb.opr.conv_bias_activation(x, w, b, nonlineMode="RELU", pad_h=1, pad_w=1)
    h = mgb.opr.batch_norm(h, scale, shift)[-1]
    h = mgb.opr.pooling(h, mode="MAX")  # (2, 4, 3, 3)
    out = mgb.opr.matrix_mul(h.reshape((2, 36)), fc)
    loss = (out * out).sum()
    grads = mgb.grad(loss, [x, w, b, scale, shift, fc], use_virtual_grad=False)
    round_trip(
        tmp_path,
        [loss, *grads],
        {"x": xv},
        expect=_tables(
            "ConvBiasForwardV3", "ConvolutionBackwardDataV1", "ConvolutionBackwardFilterV1",
            "BatchNorm", "BatchNormBackward", "Pooling", "PoolingBackward", "MatrixMulV2",
        ),
    )  # fmt: skip


_CONV_PARAMS = st.fixed_dictionaries(
    {
        "mode": st.sampled_from(["CROSS_CORRELATION", "CONVOLUTION"]),
        "pad_h": st.integers(0, 2),
        "pad_w": st.integers(0, 2),
        "stride_h": st.integers(1, 3),
        "stride_w": st.integers(1, 3),
        "dilate_h": st.integers(1, 2),
        "dilate_w": st.integers(1, 2),
        "sparse": st.sampled_from(["DENSE", "GROUP"]),
        "compute_mode": st.sampled_from(["DEFAULT", "FLOAT32"]),
        "strategy": st.sampled_from(list(mgb.opr.dnn.STRATEGIES)),
    }
)


@settings(max_examples=25, deadline=None)
@given(p=_CONV_PARAMS, dtype=st.sampled_from([np.float32, np.float16]), seed=st.integers(0, 99))
def test_convolution_params_and_dtypes_round_trip(tmp_path_factory, p, dtype, seed):
    rng = np.random.RandomState(seed)
    g = mgb.comp_graph()
    xv = rng.randn(1, 4, 7, 8).astype(dtype)
    fshape = (2, 3, 2, 3, 2) if p["sparse"] == "GROUP" else (5, 4, 3, 2)
    w = _shared(g, "w", rng.randn(*fshape).astype(dtype))
    y = mgb.opr.convolution(_arg(g, "x", xv), w, **p)
    loaded = round_trip(
        tmp_path_factory.mktemp("conv"), [y], {"x": xv}, expect=_tables("ConvolutionV1")
    )
    assert loaded[0].node.owner.param == y.node.owner.param
    assert loaded[0].dtype == dtype


def test_config_comp_node_round_trip(tmp_path, rng):
    g = mgb.comp_graph()
    xv = rng.randn(1, 2, 5, 5).astype(F32)
    x1 = mgb.opr.copy(_arg(g, "x", xv), comp_node="cpu1")
    w = mgb.make_shared("cpu1", value=rng.randn(3, 2, 2, 2).astype(F32), comp_graph=g)
    y = mgb.opr.pooling(mgb.opr.convolution(x1, w), comp_node="cpu1", mode="MAX")
    loaded = round_trip(tmp_path, [y], {"x": xv})
    conv = loaded[0].node.owner.inputs[0].owner
    assert conv.type_name == "ConvolutionForward"
    assert [str(o.comp_node) for o in (loaded[0].node, conv.outputs[0])] == ["cpu1:0"] * 2


def test_config_dtype_and_name_round_trip(tmp_path, rng):
    g = mgb.comp_graph()
    av = rng.randint(-9, 9, (3, 4)).astype(np.int8)
    bv = rng.randint(-9, 9, (4, 2)).astype(np.int8)
    c = mgb.opr.matrix_mul(_arg(g, "a", av), _shared(g, "b", bv), dtype=np.int16, name="c16")
    qa = mgb.dtype.qint8(0.5)
    q = mgb.opr.matrix_mul(
        mgb.opr.typecvt(_arg(g, "qa", av), qa), mgb.opr.typecvt(_shared(g, "qb", bv), qa)
    )
    loaded = round_trip(tmp_path, [c, q], {"a": av, "qa": av})
    assert loaded[0].name == "c16" and loaded[0].dtype == np.int16
    assert mgb.dtype.get_scale(loaded[1].dtype) == 0.25


@settings(max_examples=20, deadline=None)
@given(
    fmt=st.sampled_from(["NCHW", "NHWC"]),
    imode=st.sampled_from(["LINEAR", "NEAREST"]),
    bmode=st.sampled_from(list(mgb.kernels.dnn_image.BORDER_MODES)),
    dtype=st.sampled_from([np.float32, np.uint8]),
    out_hw=st.tuples(st.integers(1, 6), st.integers(1, 6)),
    seed=st.integers(0, 99),
)
def test_image_params_and_dtypes_round_trip(
    tmp_path_factory, fmt, imode, bmode, dtype, out_hw, seed
):
    rng = np.random.RandomState(seed)
    g = mgb.comp_graph()
    shape = (2, 3, 5, 4) if fmt == "NCHW" else (2, 5, 4, 3)
    sv = (rng.rand(*shape) * 100).astype(dtype)
    mat = np.stack([np.eye(3) + 0.1 * rng.randn(3, 3) for _ in range(2)]).astype(F32)
    mat[:, 2] = [0, 0, 1]
    src = _arg(g, "src", sv)
    w = mgb.opr.warp_perspective(
        src, _arg(g, "mat", mat), out_hw, imode=imode, bmode=bmode, border_val=3.0, format=fmt
    )
    r = mgb.opr.resize(src, out_hw, imode=imode, format=fmt)
    loaded = round_trip(
        tmp_path_factory.mktemp("img"),
        [w, r],
        {"src": sv, "mat": mat},
        expect=_tables("WarpPerspective", "ResizeV1"),
    )
    assert [v.dtype for v in loaded] == [dtype, dtype]
    assert loaded[0].node.owner.param == w.node.owner.param


def test_file_with_bn_scale_fails_to_load_naming_it(tmp_path, monkeypatch, rng):
    """A file whose param.BN holds a scale other than 1 (which BNParam can not hold)."""
    g = mgb.comp_graph()
    xv = rng.randn(2, 3, 4, 4).astype(F32)
    s = [_shared(g, n, rng.rand(1, 3, 1, 1).astype(F32) + 0.5) for n in "ab"]
    y = mgb.opr.batch_norm(_arg(g, "x", xv), *s)[-1]
    bn = mgb.opr.dnn_norm.BatchNorm
    entry = sereg.find_by_opr(y.node.owner)

    def dump(ctx, opr):
        ctx.write_param(pdefs.BN(epsilon=opr.param.epsilon, scale=2.0))

    monkeypatch.setitem(sereg._BY_CLASS, bn, dataclasses.replace(entry, dump=dump))
    path = str(tmp_path / "bn.mgb")
    mgb.serialize_comp_graph_to_file(path, [y])
    monkeypatch.undo()
    with pytest.raises(SerializationError, match=r"BatchNorm: param BN.scale=2.0 is not supported"):
        mgb.load_comp_graph_from_file(path)
