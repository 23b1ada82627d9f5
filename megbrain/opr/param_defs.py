"""The operator param table of MegBrain 0.6 (the MegDNN params, then MegBrain's own ones).

Each declaration fixes a param's class name, tag, fields, their C types and defaults, and
the members of its enums; member order is part of the binary format (enums serialize as
their index), so members are only ever appended. Operators take their enum names from here
(:func:`megbrain.graph.param_def.members_of`); ``megbrain.opr_param_defs`` publishes the
classes under the names of ``megengine._internal.opr_param_defs``.
"""

from __future__ import annotations

import struct
from typing import Any

from ..dtype import (
    canonize_dtype,
    dtype_name,
    get_dtype_num,
    get_scale,
    get_zero_point,
    is_quantize,
)
from ..graph.param_def import EnumBase, ParamDefBase, ParamDefTable

_table = ParamDefTable(__name__, dtype_num=get_dtype_num)
pdef = _table.pdef


def _names(text: str) -> tuple[str, ...]:
    return tuple(text.split())


# ---- MegDNN params ------------------------------------------------------------------------
_CONV_WINDOW = ("pad_h", 0, "pad_w", 0, "stride_h", 1, "stride_w", 1)
_CONV_FIELDS = (*_CONV_WINDOW, "dilate_h", 1, "dilate_w", 1)
_CONV_FORMATS = _names(
    "NCHW NHWC NHWCD4 NCHW4 NCHW8 NCHW32 NCHW88 NCHW44 NCHW44_DOT "
    "NCHW_WINOGRAD NCHW88_WINOGRAD NCHW44_WINOGRAD CHWN4"
)
_SEP_BORDER_MODES = _names(
    "BORDER_REPLICATE BORDER_REFLECT BORDER_REFLECT_101 BORDER_WRAP "
    "BORDER_CONSTANT BORDER_TRANSPARENT BORDER_ISOLATED"
)
_INTERP_MODES = _names("NEAREST LINEAR AREA CUBIC LANCZOS4")
_BORDER_MODES = _names("REPLICATE REFLECT REFLECT_101 WRAP CONSTANT TRANSPARENT ISOLATED")
_REDUCE_DATA_TYPES = _names(
    "DEFAULT FLOAT_IO16xC32 FLOAT_O32xC32 FLOAT_O16xC32 QUINT_I8xO32 QINT_I8xO32"
)

pdef("Empty")

pdef("Axis").add_fields("int32", "axis", 0)

(
    pdef("Convolution", "Legacy convolution param.", version=0, is_legacy=True)
    .add_enum("Mode", "CROSS_CORRELATION", "CONVOLUTION")
    .add_fields("uint32", *_CONV_FIELDS)
    .add_enum(
        "DataType",
        *_names("FLOAT INT8x8x16 INT8x8x32 FLOAT_IO16xC32 QUINT8x8x32 INT8x8xX QUINT4x4x32"),
        name_field="data_type",
    )
    .add_enum("Sparse", "DENSE", "GROUP")
    .add_enum("Format", *_CONV_FORMATS)
)

(
    pdef("Convolution", "2D convolution.", version=1)
    .add_enum_alias("Mode", "ConvolutionV0")
    .add_fields("uint32", *_CONV_FIELDS)
    .add_enum_alias("Sparse", "ConvolutionV0")
    .add_enum_alias("Format", "ConvolutionV0")
    .add_enum("ComputeMode", "DEFAULT", "FLOAT32", name_field="compute_mode")
)

pdef("MaskPropagate").add_fields(
    "uint32", *_CONV_WINDOW, "kernel_h", 1, "kernel_w", 1, "dilate_h", 1, "dilate_w", 1
)

(
    pdef("ConvPooling")
    .add_enum("Method", "WITH_TEXTURE_OBJ", "WITH_SHARED_MEM")
    .add_enum_alias("ConvMode", "ConvolutionV0", "Mode")
    .add_enum("PoolMode", "AVERAGE", "MAX")
    .add_enum("NonlineMode", "IDENTITY", "RELU", "SIGMOID")
    .add_fields(
        "uint32",
        *("pool_shape_h", 1, "pool_shape_w", 1, "pool_stride_h", 1, "pool_stride_w", 1),
        *("pool_pad_h", 0, "pool_pad_w", 0, "conv_stride_h", 1, "conv_stride_w", 1),
        *("conv_pad_h", 0, "conv_pad_w", 0),
    )
)

(
    pdef("ConvBias", "Legacy conv_bias param.", version=0, is_legacy=True)
    .add_enum("NonlineMode", "IDENTITY", "RELU", "SIGMOID", "H_SWISH")
    .add_enum_alias("Mode", "ConvolutionV0")
    .add_fields("uint32", *_CONV_WINDOW)
)

(
    pdef("ConvBias", "act(conv(x, w) + bias).", version=1, is_legacy=True)
    .add_enum_alias("NonlineMode", "ConvBiasV0")
    .add_enum_alias("Mode", "ConvolutionV0")
    .add_enum_alias("DataType", "ConvolutionV0", name_field="data_type")
    .add_enum_alias("Sparse", "ConvolutionV0")
    .add_enum_alias("Format", "ConvolutionV0")
    .add_fields("uint32", *_CONV_FIELDS)
)

(
    pdef("ConvBias", "act(conv(x, w) + bias).", version=2, is_legacy=True)
    .add_enum_alias("NonlineMode", "ConvBiasV0")
    .add_enum_alias("Mode", "ConvolutionV0")
    .add_enum_alias("Sparse", "ConvolutionV0")
    .add_enum_alias("Format", "ConvolutionV0")
    .add_fields("uint32", *_CONV_FIELDS)
    .add_enum_alias("ComputeMode", "Convolution", name_field="compute_mode")
)

(
    pdef("ConvBias", "act(conv(x, w) + bias).", version=3)
    .add_enum_alias("NonlineMode", "ConvBiasV0")
    .add_enum_alias("Mode", "ConvolutionV0")
    .add_enum_alias("Sparse", "ConvolutionV0")
    .add_enum_alias("Format", "ConvolutionV0")
    .add_fields("uint32", *_CONV_FIELDS, "output_block_size", 0)
    .add_enum_alias("ComputeMode", "Convolution", name_field="compute_mode")
)

(
    pdef("SeparableConv")
    .add_enum_alias("Mode", "ConvolutionV0")
    .add_enum("BorderMode", *_SEP_BORDER_MODES)
    .add_fields("bool", "is_symm_kernel", True)
    .add_fields("uint32", *_CONV_WINDOW, "ksize_h", 3, "ksize_w", 3, "anchor_h", 1, "anchor_w", 1)
)

pdef("Images2Neibs").add_fields("uint32", *_CONV_WINDOW, "window_h", 3, "window_w", 3)

(
    pdef("Pooling")
    .add_enum("Mode", "MAX", "AVERAGE", "AVERAGE_COUNT_EXCLUDE_PADDING")
    .add_fields(
        "uint32",
        *("pad_h", 0, "pad_w", 0, "stride_h", 2, "stride_w", 2, "window_h", 2, "window_w", 2),
    )
    .add_enum_alias("Format", "ConvolutionV0")
)

(
    pdef("LRN", "Local response normalization across channels.")
    .add_fields("uint32", "n", 5)
    .add_fields("float32", "k", 2.0, "alpha", 1e-4, "beta", 0.75)
)

(
    pdef("BN")
    .add_enum("ParamDim", "DIM_11HW", "DIM_1CHW", "DIM_1C11", name_field="param_dim")
    .add_enum("FwdMode", "TRAINING", "INFERENCE", name_field="fwd_mode")
    .add_fields("float64", "epsilon", 1e-4)
    .add_fields("float64", "avg_factor", 1.0)
    .add_fields("float32", "scale", 1.0)
    .add_fields("float32", "bias", 0.0)
)

pdef("ROIPooling").add_enum("Mode", "MAX", "AVERAGE").add_fields("float32", "scale", 1.0)

(
    pdef("WarpPerspective", version=1)
    .add_enum(
        "InterpolationMode",
        *_INTERP_MODES,
        name_field="imode",
        default=1,
        member_alias=[(m, f"INTER_{m}") for m in _INTERP_MODES],
    )
    .add_enum(
        "BorderMode",
        *_BORDER_MODES,
        name_field="bmode",
        member_alias=[(m, f"BORDER_{m}") for m in _BORDER_MODES],
    )
    .add_enum_alias("Format", "ConvolutionV0")
    .add_fields("float32", "border_val", 0.0)
)

pdef("SpatialTfGridGenerator").add_enum("Mode", "AFFINE")
pdef("SpatialTfSampler").add_enum("Mode", "BILINEAR")

pdef("AddUpdate").add_fields("float32", "alpha", 1.0, "beta", 1.0, "bias", 0.0)

pdef("Elemwise").add_enum(
    "Mode",
    *_names(
        # unary
        "RELU ABS ACOS ASIN CEIL COS EXP EXPM1 FLOOR LOG LOG1P NEGATE SIGMOID SIN TANH "
        # binary
        "ABS_GRAD ADD FLOOR_DIV MAX MIN MOD MUL POW SIGMOID_GRAD SUB SWITCH_GT0 TANH_GRAD "
        "TRUE_DIV LOG_SUM_EXP LT LEQ EQ SHL SHR "
        # ternary and fused
        "COND_LEQ_MOV FUSE_MUL_ADD3 FUSE_MUL_ADD4 FUSE_ADD_RELU FUSE_ADD_SIGMOID FUSE_ADD_TANH "
        # appended later, hence out of arity order
        "FAST_TANH FAST_TANH_GRAD ROUND RMULH ATAN2 ERF ERFINV ERFC ERFCINV H_SWISH "
        "H_SWISH_GRAD FUSE_ADD_H_SWISH"
    ),
)

pdef("ElemwiseMultiType").add_enum(
    "Mode",
    *_names(
        "FUSE_MUL_ADD3_INT16x32x32x32 FUSE_MUL_ADD3_IXxF32xF32xI8 ROUND_SHR_SATURATE_IXxI8xI8 "
        "FUSE_ADD_RMULH_ROUND_SHR_SATURATE_INT16x16x16x8 "
        "FUSE_ADD_RMULH_ROUND_SHR_SATURATE_INT32x32x32x8 ROUND_SHR_SATURATE_IXxI8xI16 "
        "QADD QFUSE_ADD_RELU QMUL QMIN QMAX QSUB QTRUE_DIV QFUSE_ADD_SIGMOID QFUSE_ADD_TANH "
        "QRELU QABS QSIGMOID QEXP QTANH QFUSE_MUL_ADD3 QFAST_TANH QNEGATE QACOS QASIN QCEIL "
        "QCOS QEXPM1 QFLOOR QLOG QLOG1P QSIN QROUND QERF QERFINV QERFC QERFCINV QABS_GRAD "
        "QFLOOR_DIV QMOD QSIGMOID_GRAD QSWITCH_GT0 QTANH_GRAD QLT QLEQ QEQ QPOW QLOG_SUM_EXP "
        "QFAST_TANH_GRAD QATAN2 QCOND_LEQ_MOV QH_SWISH QFUSE_ADD_H_SWISH QH_SWISH_GRAD"
    ),
)

pdef("PowC", "Power with a constant exponent.").add_fields("float32", "exp", 0.0)

(
    pdef("MatrixMul", version=0, is_legacy=True)
    .add_fields("bool", "transposeA", False, "transposeB", False)
    .add_enum(
        "DataType",
        *_names("FLOAT INT8x8x16 INT8x8x32 FLOAT_IO16xC32 QUINT8x8x32 QUINT4x4x32"),
        name_field="data_type",
    )
)

(
    pdef("MatrixMul", version=1, is_legacy=True)
    .add_fields("bool", "transposeA", False, "transposeB", False)
    .add_enum("ComputeMode", "DEFAULT", "FLOAT32", name_field="compute_mode")
)

(
    pdef("MatrixMul", version=2)
    .add_fields("bool", "transposeA", False, "transposeB", False)
    .add_enum_alias("ComputeMode", "MatrixMulV1", name_field="compute_mode")
    .add_enum("Format", "DEFAULT", "MK4", "MK8", "MK4_DOT")
)

(
    pdef("Winograd", "The winograd transform inside ConvBias.")
    .add_fields("uint32", "output_block_size", 0)
    .add_enum_alias("Format", "MatrixMul")
    .add_enum_alias("ComputeMode", "Convolution", name_field="compute_mode")
)

pdef("SVD").add_fields("bool", "full_matrices", False, "compute_uv", True)

(
    pdef("Reduce", "Legacy reduce param.", version=0, is_legacy=True)
    .add_enum("Mode", "SUM", "SUM_SQR", "PRODUCT", "MIN", "MAX")
    .add_fields("int32", "axis", -1)
)

(
    pdef("Reduce", "Reduce along an axis.", version=1, is_legacy=True)
    .add_enum("Mode", "SUM", "SUM_SQR", "PRODUCT", "MIN", "MAX", "MEAN")
    .add_fields("int32", "axis", -1)
    .add_enum("DataType", *_REDUCE_DATA_TYPES, name_field="data_type")
)

(
    # axis INT_MAX (instead of -1) asks for a reduction to a target shape
    pdef("Reduce", "Reduce along an axis.", version=2)
    .add_enum("Mode", "SUM", "SUM_SQR", "PRODUCT", "MIN", "MAX", "MEAN")
    .add_fields("int32", "axis", 2**31 - 1)
    .add_enum("DataType", *_REDUCE_DATA_TYPES, name_field="data_type")
)

(
    pdef("Cumsum", "Legacy cumsum param.", version=0, is_legacy=True)
    .add_fields("int32", "axis", -1)
    .add_fields("bool", "exclusive", True)
    .add_fields("bool", "reverse", False)
)

(
    pdef("Cumsum", "Accumulated sum along an axis.", version=1)
    .add_fields("int32", "axis", 2**31 - 1)
    .add_fields("bool", "exclusive", True)
    .add_fields("bool", "reverse", False)
)

(
    pdef("CondTake")
    .add_enum("Mode", "EQ", "NEQ", "LT", "LEQ", "GT", "GEQ")
    .add_fields("float32", "val", 0.0)
    .add_fields("float32", "eps", 1e-6)
)

pdef("Argsort").add_enum("Order", "ASCENDING", "DESCENDING")

pdef("IndexingRemap").add_fields("bool", "is_non_overlapping", False)

pdef("Sleep").add_fields("float32", "time", 0.0)

pdef("Linspace").add_fields("bool", "endpoint", True)

(
    pdef("LinspaceFull")
    .add_fields("float64", "start", 0.0)
    .add_fields("float64", "stop", 1.0)
    .add_fields("bool", "endpoint", True)
)

pdef("Eye").add_fields("int32", "k", 0).add_fields("dtype", "dtype", "float32")

pdef("UniformRNG").add_fields("uint64", "seed", 0)

pdef("GaussianRNG").add_fields("uint64", "seed", 0).add_fields("float32", "mean", 0.0, "std", 1.0)

pdef("Flip").add_fields("bool", "vertical", False, "horizontal", False)

pdef("Rotate").add_fields("bool", "clockwise", True)

pdef("ROICopy").add_fields("uint32", "row_from", 0, "row_to", 0, "col_from", 0, "col_to", 0)

pdef("CvtColor").add_enum(
    "Mode",
    *_names(
        "RGB2GRAY RGB2YUV YUV2RGB GRAY2RGB RGBA2RGB RGBA2BGR RGBA2GRAY RGB2BGR BGR2GRAY BGR2RGB "
        "YUV2GRAY_NV21 YUV2RGB_NV21 YUV2BGR_NV21 YUV2GRAY_NV12 YUV2RGB_NV12 YUV2BGR_NV12 "
        "YUV2GRAY_YV12 YUV2RGB_YV12 YUV2BGR_YV12 YUV2GRAY_YU12 YUV2RGB_YU12 YUV2BGR_YU12 "
        "YCrCb2RGB YCrCb2BGR "
        "BT601_YUV2RGB_NV21 BT601_YUV2BGR_NV21 BT601_YUV2RGB_NV12 BT601_YUV2BGR_NV12 "
        "BT601_YUV2RGB_YV12 BT601_YUV2BGR_YV12 BT601_YUV2RGB_YU12 BT601_YUV2BGR_YU12"
    ),
    # gray conversion is the same under both YUV standards
    member_alias=[
        (f"YUV2GRAY_{s}", f"BT601_YUV2GRAY_{s}") for s in ("NV21", "NV12", "YV12", "YU12")
    ],
    name_field="mode",
)

(
    pdef("WarpAffine", version=0, is_legacy=True)
    .add_enum_alias("InterpolationMode", "WarpPerspective", name_field="imode")
    .add_enum_alias("BorderMode", "WarpPerspective", name_field="border_mode")
    .add_fields("float32", "border_val", 0.0)
)

(
    pdef("WarpAffine", version=1)
    .add_enum_alias("InterpolationMode", "WarpPerspective", name_field="imode")
    .add_enum_alias("BorderMode", "WarpPerspective", name_field="border_mode")
    .add_fields("float32", "border_val", 0.0)
    .add_enum_alias("Format", "ConvolutionV0", default=1)
)

(
    pdef("GaussianBlur")
    .add_enum_alias("BorderMode", "WarpPerspective", name_field="border_mode")
    .add_fields("uint32", "kernel_height", 0, "kernel_width", 0)
    .add_fields("float32", "sigma_x", 0.0, "sigma_y", 0.0)
)

(
    pdef("Resize", version=0, is_legacy=True).add_enum_alias(
        "InterpolationMode", "WarpPerspective", name_field="imode"
    )
)

(
    pdef("Resize", version=1)
    .add_enum_alias("InterpolationMode", "WarpPerspective", name_field="imode")
    .add_enum_alias("Format", "ConvolutionV0", default=1)
)

(
    pdef("Remap", version=0)
    .add_enum_alias("InterpolationMode", "WarpPerspective", name_field="imode")
    .add_enum_alias("BorderMode", "WarpPerspective", name_field="border_type")
    .add_enum_alias("Format", "ConvolutionV0", default=1)
    .add_fields("float32", "scalar", 0.0)
)

(
    pdef("Convolution3D")
    .add_enum("Mode", "CROSS_CORRELATION", "CONVOLUTION")
    .add_fields(
        "uint32",
        *("pad_d", 0, "pad_h", 0, "pad_w", 0, "stride_d", 1, "stride_h", 1, "stride_w", 1),
        *("dilate_d", 1, "dilate_h", 1, "dilate_w", 1),
    )
    .add_enum("Sparse", "DENSE", "GROUP")
    .add_enum("DataType", "FLOAT", "FLOAT_IO16xC32", name_field="data_type")
    .add_enum("Format", "NCDHW", "NDHWC")
)

(
    pdef("Conv3DBias")
    .add_enum("NonlineMode", "IDENTITY", "RELU", "SIGMOID")
    .add_enum_alias("Mode", "Convolution3D")
    # stride_w defaults to 0 in the reference too
    .add_fields(
        "uint32",
        *("pad_d", 0, "pad_h", 0, "pad_w", 0, "stride_d", 1, "stride_h", 1, "stride_w", 0),
    )
)

(
    pdef("SeparableConv3D")
    .add_enum_alias("Mode", "Convolution3D")
    .add_enum("BorderMode", *_SEP_BORDER_MODES)
    .add_fields("bool", "is_symm_kernel", True)
    .add_fields(
        "uint32",
        *("pad_d", 0, "pad_h", 0, "pad_w", 0, "stride_d", 0, "stride_h", 1, "stride_w", 1),
        *("ksize_d", 0, "ksize_h", 3, "ksize_w", 3, "anchor_d", 0, "anchor_h", 1, "anchor_w", 1),
    )
)

pdef("TopK").add_enum("Mode", "KTH_ONLY", "VALUE_IDX_NOSORT", "VALUE_IDX_SORTED")

pdef("RelayoutFormat", "Change the tensor layout format.").add_enum(
    "Mode",
    *_names(
        "NHWC_NHWCD4 NHWCD4_NHWC NHWC_NHWCD4I NCHW_NHWCD4 NCHW_NHWCD4I NHWCD4I_NCHW "
        "NHWCD4_NCHW INTER_WEIGHT_DENSE INTER_WEIGHT_DENSEI INTER_WEIGHT_GROUP "
        "INTER_WEIGHT_GROUPI INTER_WEIGHT_CHAN INTER_WEIGHT_CHANI INTER_WEIGHT_DENSEI_DOT "
        "INTER_WEIGHT_GROUPI_DOT NCHW4_CHWN4 CHWN4_NCHW4 NCHW_NCHW88_CONV_DENSE_WEIGHT "
        "NCHW_NCHW88_CONV_CHAN_WEIGHT NCHW_NCHW88_CONV_GROUP_WEIGHT NCHW_NCHW88 NCHW88_NCHW "
        "NCHW_NCHW4_IC_SMALL NCHW_NCHW4_IC_SMALL_CONV_DENSE_WEIGHT NCHW_NCHW4 NCHW4_NCHW "
        "NCHW_NCHW4_WEIGHT"
    ),
)

(
    pdef("SeparableFilter")
    .add_enum_alias("Format", "ConvolutionV0")
    .add_enum_alias("BorderMode", "WarpPerspective")
    .add_fields("bool", "is_symm_kernel", True)
    .add_fields("uint32", "ksize_h", 3, "ksize_w", 3, "anchor_h", 1, "anchor_w", 1)
)

(
    pdef("LocalShare", "Local share convolution.")
    .add_enum_alias("Mode", "ConvolutionV0")
    .add_fields("uint32", *_CONV_FIELDS, "spatial_groups_h", 1, "spatial_groups_w", 1)
    .add_enum_alias("Sparse", "ConvolutionV0")
    .add_enum_alias("Format", "ConvolutionV0")
    # no snake-case field name given here, so the field is ``computeMode``
    .add_enum_alias("ComputeMode", "Convolution")
)

(
    pdef("ROIAlign")
    .add_enum("Mode", "MAX", "AVERAGE", name_field="mode")
    .add_enum_alias("Format", "ConvolutionV0")
    .add_fields("float32", "spatial_scale", 1.0)
    .add_fields("float32", "offset", 0.0)
    .add_fields(
        "uint32", "pooled_height", 1, "pooled_width", 1, "sample_height", 2, "sample_width", 2
    )
)

(
    pdef("DeformablePSROIPooling")
    .add_fields("bool", "no_trans", True)
    .add_fields("float32", "spatial_scale", 1.0, "trans_std", 1.0)
    .add_fields("uint32", "pooled_h", 1, "pooled_w", 1, "part_size", 1, "sample_per_part", 1)
)

(
    pdef("BatchConvBias", "Convolution with weights not shared along the batch axis.")
    .add_enum_alias("NonlineMode", "ConvBiasV0")
    .add_enum_alias("Mode", "ConvolutionV0")
    .add_fields("uint32", *_CONV_FIELDS)
    .add_enum_alias("Sparse", "ConvolutionV0")
    .add_enum_alias("Format", "ConvolutionV0")
    .add_enum_alias("ComputeMode", "Convolution", name_field="compute_mode")
)

# ---- MegBrain params ----------------------------------------------------------------------
pdef("DType").add_fields("dtype", "dtype", "byte")

# share_key -1 keeps the storage private to the operator
pdef("PersistentOutputStorage").add_fields("int32", "share_key", -1)

pdef("OptionalAxis", "An optional axis: -1 means none.").add_fields("int32", "axis", -1)

(
    pdef("OptionalAxisV1", "An optional axis: MAX_NDIM means none.")
    .add_const("int32", "MAX_NDIM", 7)
    .add_const("int32", "INVALID_AXIS", "MAX_NDIM")
    .add_fields("int32", "axis", "INVALID_AXIS")
)

(
    pdef("ExecutionPolicy", "How an operator selects its algorithm.")
    .add_enum(
        "Strategy",
        *_names("HEURISTIC HEURISTIC_REPRODUCIBLE PROFILE PROFILE_REPRODUCIBLE PROFILE_HEURISTIC"),
    )
    .add_fields("uint64", "workspace_limit", 2**64 - 1)
)

(pdef("AssertEqual").add_fields("float32", "maxerr", 1e-4).add_fields("bool", "verbose", False))

pdef("CollectiveComm", "Collective communication between computing nodes.").add_enum(
    "Mode",
    *_names(
        "REDUCE_SUM BROADCAST ALL_GATHER REDUCE_SCATTER_SUM ALL_REDUCE_SUM ALL_REDUCE_MAX "
        "ALL_REDUCE_MIN ALL_REDUCE_PROD GATHER SCATTER ALL_TO_ALL"
    ),
    name_field="mode",
)

# only reserves a tag, the one :class:`SerializedDType` serializes under
pdef("FakeSerializedDType", "Placeholder for the tag of SerializedDType; do not use.")

(
    pdef("CondExecPred", "Compare a predicate with branch keys to make execution masks.")
    .add_enum("Mode", "CASE", "CASE_FALLBACK", "PIECEWISE")
    .add_fields("float32", "eps", 1e-4)
)

pdef("CondExecPredLogical", "A logical function of predicate proxy vars.").add_enum(
    "Mode", "OR", "AND", "XOR", "NOR", "NAND", "XNOR"
)

(
    pdef("CondExecMark", "Attach the execution mask of a predicate to an operator.")
    .add_enum("GradMode", "SUM", "SUM_COND_OUT", name_field="grad_mode")
    .add_enum("StaticInfer", "SHAPE_VALUE", "SHAPE_ONLY", "NONE", name_field="static_infer")
)

(
    pdef("CondExecMerge", "Merge conditional execution branches.")
    .add_fields("uint32", "nr_output", 1)
    .add_enum("Mode", "EXACT_ONE", "EXACT_ONE_SAME_SHAPE", "SUM", "SUM_COND_OUT")
)

#: class name -> param class, in declaration order
PARAM_DEFS: dict[str, type[ParamDefBase]] = _table.build()
globals().update(PARAM_DEFS)
del pdef


# ---- SerializedDType ----------------------------------------------------------------------
_ASYMM_DTYPES = ("Quantized8Asymm", "Quantized4Asymm")


def _serialized_dtype(dtype: Any) -> bytes:
    """The bytes MegBrain writes for a dtype: its uint32 enum number, then for a quantized
    dtype the C struct of its parameters (float scale, and uint8 zero point padded to 8)."""
    dt = canonize_dtype(dtype)
    out = struct.pack("I", get_dtype_num(dt))
    if dtype_name(dt) in _ASYMM_DTYPES:
        out += struct.pack("fB3x", get_scale(dt), get_zero_point(dt))
    elif is_quantize(dt):
        out += struct.pack("f", get_scale(dt))
    return out


class _IdentityPacker:
    # the field already holds the packed bytes
    @staticmethod
    def pack(*chunks: bytes) -> bytes:
        return b"".join(chunks)


class SerializedDType(ParamDefBase):
    """A dtype as a param: ``serialize()`` gives the tag then the dtype's serialized bytes.

    Parameters
    ----------
    dtype:
        A dtype accepted by :func:`megbrain.dtype.canonize_dtype`.
    """

    TAG = PARAM_DEFS["FakeSerializedDType"].TAG
    __slots__ = ["dtype"]
    _packer = _IdentityPacker()

    def __init__(self, dtype: Any):
        self.dtype = _serialized_dtype(dtype)


__all__ = [*PARAM_DEFS, "SerializedDType", "EnumBase", "ParamDefBase"]
