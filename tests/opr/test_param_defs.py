"""The operator param table: tags, enums, aliases, defaults, the binary format, and the
operators taking their enum names (and enum members) from it."""

import hashlib
import inspect
import pickle
import struct

import numpy as np
import pytest
from opr_harness import inputs, make_graph, run

import megbrain.opr_param_defs as P
from megbrain.dtype import get_dtype_num, quint8
from megbrain.errors import MegBrainError
from megbrain.graph.param_def import ParamDefTable, enum_index, members_of, param_tag
from megbrain.kernels import elemwise_modes as ew_modes
from megbrain.opr import (
    basic_arith,
    blas,
    dnn,
    dnn_conv_bias,
    dnn_image,
    dnn_norm,
    dnn_pool,
    misc,
    param_defs,
)
from megbrain.opr.dnn import convolution
from megbrain.opr.dnn_pool import pooling


def _tag(name: str, version: int = 0) -> int:
    """The tag rule, written out independently of the engine."""
    data = name.encode() + (struct.pack("<I", version) if version else b"")
    tag = int(hashlib.sha256(data).hexdigest()[:8], 16)
    return tag + 1024 if tag < 1024 else tag


# ---- tags and names ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "cls, name, version",
    [
        (P.Empty, "Empty", 0),
        (P.ConvolutionV0, "Convolution", 0),
        (P.Convolution, "Convolution", 1),
        (P.ConvBiasV1, "ConvBias", 1),
        (P.ConvBias, "ConvBias", 3),
        (P.Reduce, "Reduce", 2),
        (P.WarpPerspective, "WarpPerspective", 1),
        (P.CollectiveComm, "CollectiveComm", 0),
        (P.OptionalAxisV1, "OptionalAxisV1", 0),
    ],
)
def test_tag_follows_the_sha256_rule(cls, name, version):
    assert cls.TAG == _tag(name, version) == param_tag(name, version)


def test_tag_hard_numbers():
    assert P.Convolution.TAG == 3401828963
    assert P.ConvolutionV0.TAG == 2883667579
    assert P.Elemwise.TAG == 791173831
    # "P5021266" hashes below 1024 (to 820), so its tag is moved up
    assert param_tag("P5021266") == 820 + 1024


def test_table_holds_every_reference_param():
    assert len(param_defs.PARAM_DEFS) == 74
    assert len(set(c.TAG for c in param_defs.PARAM_DEFS.values())) == 74
    legacy = {n for n in param_defs.PARAM_DEFS if n[-2:-1] == "V" and n[-1].isdigit()}
    assert legacy == {
        "ConvolutionV0", "ConvBiasV0", "ConvBiasV1", "ConvBiasV2", "MatrixMulV0", "MatrixMulV1",
        "ReduceV0", "ReduceV1", "CumsumV0", "WarpAffineV0", "ResizeV0", "OptionalAxisV1",
    }  # fmt: skip
    for name, cls in param_defs.PARAM_DEFS.items():
        assert getattr(P, name) is cls and cls.__name__ == name
    assert P.SerializedDType.TAG == P.FakeSerializedDType.TAG


def test_public_names_of_the_reference_module():
    assert P.Convolution.Mode.CROSS_CORRELATION.value == "CROSS_CORRELATION"
    assert P.CondTake.Mode.EQ and P.Pooling.Mode.MAX and P.TopK.Mode.KTH_ONLY
    assert P.Argsort.Order.ASCENDING and P.Elemwise.Mode.ADD
    assert P.CollectiveComm.Mode.ALL_REDUCE_SUM
    assert members_of(P.BN.ParamDim) == ("DIM_11HW", "DIM_1CHW", "DIM_1C11")
    assert members_of(P.ElemwiseMultiType.Mode)[:2] == (
        "FUSE_MUL_ADD3_INT16x32x32x32",
        "FUSE_MUL_ADD3_IXxF32xF32xI8",
    )
    assert issubclass(P.Elemwise.Mode, P._EnumBase)
    assert issubclass(P.Elemwise, P._ParamDefBase)


# ---- fields and defaults -------------------------------------------------------------------
def test_slots_and_signature():
    assert P.Convolution.__slots__ == [
        "mode", "pad_h", "pad_w", "stride_h", "stride_w", "dilate_h", "dilate_w", "sparse",
        "format", "compute_mode",
    ]  # fmt: skip
    sig = inspect.signature(P.Pooling)
    assert list(sig.parameters) == P.Pooling.__slots__
    assert sig.parameters["mode"].default == "MAX"
    assert sig.parameters["stride_h"].default == 2
    # enum fields without an explicit name take the enum name with a lowered first letter
    assert "computeMode" in P.LocalShare.__slots__
    assert "nonlineMode" in P.ConvBias.__slots__ and "borderMode" in P.SeparableFilter.__slots__


def test_defaults():
    p = P.Pooling()
    assert (p.mode, p.format, p.window_h, p.pad_w) == (
        P.Pooling.Mode.MAX,
        P.Pooling.Format.NCHW,
        2,
        0,
    )
    assert P.WarpPerspective().imode is P.WarpPerspective.InterpolationMode.LINEAR
    assert P.WarpAffine().format is P.Convolution.Format.NHWC
    assert P.Reduce().axis == 2**31 - 1 and P.ReduceV1().axis == -1
    assert P.ExecutionPolicy().workspace_limit == 2**64 - 1
    assert (
        P.OptionalAxisV1().axis == P.OptionalAxisV1.MAX_NDIM == P.OptionalAxisV1.INVALID_AXIS == 7
    )
    assert P.DType().dtype == get_dtype_num("byte")
    assert P.Eye().dtype == get_dtype_num(np.float32)
    bn = P.BN()
    assert (bn.epsilon, bn.avg_factor, bn.scale, bn.bias) == (1e-4, 1.0, 1.0, 0.0)
    assert P.CondTake().eps == pytest.approx(1e-6) and P.SeparableConv().is_symm_kernel is True


def test_values_are_converted_to_their_c_type():
    p = P.Convolution("convolution", np.int64(3), pad_w=2.0)
    assert p.mode is P.Convolution.Mode.CONVOLUTION
    assert type(p.pad_h) is int and type(p.pad_w) is int
    assert type(P.LRN(k=3).k) is float and P.SVD(full_matrices=1).full_matrices is True
    with pytest.raises(TypeError):
        P.Convolution(bogus=1)


def test_eq_and_repr():
    assert P.Pooling(mode="average") == P.Pooling(mode=P.Pooling.Mode.AVERAGE)
    assert P.Pooling() != P.Pooling(pad_h=1)
    assert P.Pooling() != P.ROIPooling()
    assert repr(P.ROIPooling()) == "ROIPooling(mode='MAX', scale=1.0)"


# ---- enums ---------------------------------------------------------------------------------
def test_enum_convert_by_member_name_and_case():
    mode = P.Convolution.Mode
    assert mode.convert(mode.CONVOLUTION) is mode.CONVOLUTION
    assert mode.convert("CONVOLUTION") is mode.CONVOLUTION
    assert mode.convert("cross_correlation") is mode.CROSS_CORRELATION
    assert mode("Convolution") is mode.CONVOLUTION
    data_type = P.ConvolutionV0.DataType
    assert data_type.convert("int8X8X16") is data_type.INT8x8x16
    assert not hasattr(P.Convolution, "DataType")


def test_member_aliases():
    imode = P.WarpPerspective.InterpolationMode
    assert imode.INTER_LINEAR is imode.LINEAR and imode.convert("inter_cubic") is imode.CUBIC
    assert P.WarpPerspective.BorderMode.convert("BORDER_CONSTANT").name == "CONSTANT"
    cvt = P.CvtColor.Mode
    assert cvt.BT601_YUV2GRAY_NV21 is cvt.YUV2GRAY_NV21
    assert members_of(imode) == ("NEAREST", "LINEAR", "AREA", "CUBIC", "LANCZOS4")
    assert len(members_of(cvt)) == 32


@pytest.mark.parametrize("bad", ["NOT_A_MODE", "", 0, None])
def test_bad_enum_value_raises_value_error(bad):
    with pytest.raises(ValueError):
        P.Pooling.Mode.convert(bad)
    with pytest.raises(ValueError):
        P.Pooling(mode=bad)


def test_members_of_another_enum_are_refused():
    with pytest.raises(ValueError):
        P.Convolution3D.Mode.convert(P.Convolution.Mode.CONVOLUTION)


def test_enum_aliases_share_the_source_class():
    conv_mode = P.ConvolutionV0.Mode
    for cls in (P.Convolution, P.ConvBias, P.ConvBiasV0, P.LocalShare, P.BatchConvBias):
        assert cls.Mode is conv_mode
    assert P.ConvPooling.ConvMode is conv_mode
    for cls in (P.Pooling, P.ConvBias, P.WarpPerspective, P.Resize, P.ROIAlign):
        assert cls.Format is P.ConvolutionV0.Format is P.Convolution.Format
    assert P.ConvBias.ComputeMode is P.Convolution.ComputeMode
    assert P.MatrixMul.ComputeMode is P.MatrixMulV1.ComputeMode
    assert P.Winograd.Format is P.MatrixMul.Format
    assert P.ConvBias.NonlineMode is P.ConvBiasV0.NonlineMode
    assert P.WarpAffine.BorderMode is P.Remap.BorderMode is P.WarpPerspective.BorderMode
    assert P.Conv3DBias.Mode is P.Convolution3D.Mode
    # declared separately, even where the members coincide
    assert P.Convolution3D.Mode is not conv_mode
    assert P.ROIAlign.Mode is not P.ROIPooling.Mode
    assert P.MatrixMulV1.ComputeMode is not P.Convolution.ComputeMode
    assert conv_mode.__qualname__ == "ConvolutionV0.Mode"


def test_pickle_round_trips():
    for member in (P.ConvBias.Mode.CONVOLUTION, P.Elemwise.Mode.ADD, P.Pooling.Format.NHWC):
        assert pickle.loads(pickle.dumps(member)) is member
    p = P.WarpPerspective(imode="inter_area", border_val=2.5)
    q = pickle.loads(pickle.dumps(p))
    assert q == p and q.imode is P.WarpPerspective.InterpolationMode.AREA


def test_elemwise_member_order():
    modes = members_of(P.Elemwise.Mode)
    assert modes[:3] == ("RELU", "ABS", "ACOS") and modes[-1] == "FUSE_ADD_H_SWISH"
    assert len(modes) == 52 and enum_index(P.Elemwise.Mode.ADD) == 16


# ---- the binary form -----------------------------------------------------------------------
def test_serialize_convolution():
    p = P.Convolution(
        mode="CONVOLUTION", pad_h=1, stride_w=4, format="NCHW4", compute_mode="FLOAT32"
    )
    want = struct.pack("I", p.TAG) + struct.pack("10I", 1, 1, 0, 1, 4, 1, 1, 0, 3, 1)
    assert p.serialize() == want


def test_serialize_pads_as_the_c_struct():
    p = P.MatrixMul(transposeA=True, compute_mode="FLOAT32", format="MK8")
    # two bools, two bytes of alignment padding, then two uint32 enums
    assert p.serialize() == struct.pack("I", p.TAG) + b"\x01\x00\x00\x00" + struct.pack("II", 1, 2)
    e = P.ExecutionPolicy(strategy="PROFILE", workspace_limit=5)
    assert e.serialize() == struct.pack("I", e.TAG) + struct.pack("I", 2) + bytes(4) + struct.pack(
        "Q", 5
    )
    assert P.Empty().serialize() == struct.pack("I", P.Empty.TAG) + b"\x00"
    # int32 then two bools: rounded up to a multiple of the int32's size at the end
    cs = P.Cumsum(axis=-2, exclusive=True, reverse=False)
    assert cs.serialize() == struct.pack("Ii", cs.TAG, -2) + b"\x01\x00\x00\x00"
    c = P.CondTake(mode="GEQ", val=0.5, eps=0.25)
    assert c.serialize() == struct.pack("I", c.TAG) + struct.pack("Iff", 5, 0.5, 0.25)
    assert P.DType(np.int32).serialize() == struct.pack("II", P.DType.TAG, get_dtype_num(np.int32))


def test_serialized_dtype():
    tag = struct.pack("I", P.FakeSerializedDType.TAG)
    assert P.SerializedDType(np.float32).serialize() == tag + struct.pack("I", 0)
    q = quint8(0.5, 3)
    assert P.SerializedDType(q).serialize() == tag + struct.pack("IfB3x", get_dtype_num(q), 0.5, 3)


# ---- the engine on a table of its own ------------------------------------------------------
def test_engine_errors():
    t = ParamDefTable(__name__)
    t.pdef("A").add_enum("Mode", "X", "Y", default="Y")
    with pytest.raises(ValueError, match="no enum"):
        t.pdef("B").add_enum_alias("Mode", "Nowhere")
    with pytest.raises(ValueError, match="twice"):
        t.pdef("C").add_fields("int32", "a", 0, "a", 1)
    with pytest.raises(ValueError, match="clashes"):
        t.pdef("A")
    with pytest.raises(ValueError, match="unknown C type"):
        t.pdef("D").add_fields("int8", "a", 0)
    with pytest.raises(ValueError, match="dtype_num"):
        t.pdef("E").add_fields("dtype", "dtype", "float32")
    t.pdef("F").add_enum_alias("Mode", "A", name_field="m")
    classes = t.build()
    assert classes["F"]().m is classes["A"].Mode.Y


# ---- operators take their enum names from the table ----------------------------------------
def test_operator_choices_are_the_tables():
    assert dnn.CONV_MODES == members_of(P.Convolution.Mode)
    assert dnn.ConvolutionParam._choices["format"] == members_of(P.Convolution.Format)
    assert dnn.ConvolutionParam._choices["strategy"] == members_of(P.ExecutionPolicy.Strategy)
    assert dnn_conv_bias.ConvBiasParam._choices["nonlineMode"] == members_of(P.ConvBias.NonlineMode)
    assert dnn.Convolution3DParam._choices["data_type"] == members_of(P.Convolution3D.DataType)
    assert dnn_pool.PoolingParam._choices["format"] == members_of(P.Pooling.Format)
    assert basic_arith.ElemwiseParam._choices["mode"] == members_of(P.Elemwise.Mode)
    assert basic_arith.ReduceParam._choices["mode"] == members_of(P.Reduce.Mode)
    assert blas.MatrixMulParam._choices["format"] == members_of(P.MatrixMul.Format)
    assert dnn_norm.BNParam._choices["fwd_mode"] == members_of(P.BN.FwdMode)
    assert dnn_image.ROIAlignParam._choices["mode"] == members_of(P.ROIAlign.Mode)
    assert dnn_image.INTERP_MODES == members_of(P.WarpPerspective.InterpolationMode)
    assert misc.ArgsortParam._choices["order"] == members_of(P.Argsort.Order)
    assert misc.TopKParam._choices["mode"] == members_of(P.TopK.Mode)
    assert misc.CondTakeParam._choices["mode"] == members_of(P.CondTake.Mode)


def test_every_table_elemwise_mode_has_a_kernel():
    assert set(ew_modes.MODES) == set(members_of(P.Elemwise.Mode))


def test_int_elemwise_mode_is_the_reference_index():
    assert basic_arith.ElemwiseParam(mode=0).mode == "RELU"
    assert basic_arith.ElemwiseParam(mode=enum_index(P.Elemwise.Mode.ADD)).mode == "ADD"


def test_operator_params_accept_table_members():
    assert dnn.ConvolutionParam(mode=P.Convolution.Mode.CONVOLUTION).mode == "CONVOLUTION"
    pool = dnn_pool.PoolingParam
    assert pool(mode=P.Pooling.Mode.AVERAGE) == pool(mode="AVERAGE")
    resize = dnn_image.ResizeParam(imode=P.Resize.InterpolationMode.INTER_NEAREST)
    assert resize.imode == "NEAREST"
    with pytest.raises(MegBrainError):
        dnn.ConvolutionParam(format="NCHW4_NCHW32")


def test_operators_run_with_table_members():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 2, 5, 5)).astype(np.float32)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    g = make_graph()
    (xv, wv), _ = inputs(g, x, w)
    outs = [
        convolution(xv, wv, mode=P.Convolution.Mode.CONVOLUTION),
        convolution(xv, wv, mode="CONVOLUTION"),
        pooling(xv, mode=P.Pooling.Mode.AVERAGE),
        pooling(xv, mode="average"),
    ]
    assert outs[0].node.owner.param == outs[1].node.owner.param
    got = run(outs)
    np.testing.assert_array_equal(got[0], got[1])
    np.testing.assert_array_equal(got[2], got[3])
    assert not np.array_equal(got[0], run([convolution(xv, wv)])[0])
