"""What the ONNX import claims, in one place.

``model_is_claimed`` says whether every node of a model has a converter (the backend's
``is_compatible``); ``EXCLUDED_CASES`` lists the cases of claimed operators that are left out
of ONNX's backend test suite, each with its reason.
"""

from __future__ import annotations

import onnx

from .registry import claimed_op_types, lookup

__all__ = [
    "claimed_op_types",
    "model_is_claimed",
    "unclaimed_op_types",
    "EXCLUDED_CASES",
    "KNOWN_GAPS",
    "FAMILIES",
    "op_family",
]


def _opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    return 0


def unclaimed_op_types(model: onnx.ModelProto) -> list[str]:
    """The op types of ``model`` without a converter at its opset (sorted)."""
    opset = _opset(model)
    return sorted(
        {
            n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
            for n in model.graph.node
            if n.domain not in ("", "ai.onnx") or lookup(n.op_type, opset) is None
        }
    )


def model_is_claimed(model: onnx.ModelProto) -> bool:
    """Whether every node of ``model`` (default domain) has a converter at its opset."""
    return not unclaimed_op_types(model)


#: backend-test cases of claimed op types needing a dtype megbrain lacks (regex -> reason)
EXCLUDED_CASES: dict[str, str] = {
    r"(?i)uint16|uint32|uint64|_ui(16|32|64)_": "megbrain has no uint16/uint32/uint64 dtype",
    r"bitwise_not_3d": "its input is UINT16: megbrain has no uint16 dtype",
    r"(?i)float8|float4e2m1|e8m0|e4m3|e5m2": "megbrain has no 8-bit or 4-bit float dtype",
    r"(?i)_u?int[24]_|_u?int[24]$|to_u?int[24]_": "no ONNX-compatible int2/int4 dtype",
    r"(?i)string": "megbrain has no string dtype",
    r"_opt_|_optional|identity_sequence": "optional and sequence types are not supported",
}

#: cases of claimed op types that fail, each with why (regex -> reason)
KNOWN_GAPS: dict[str, str] = {
    r"test_dft_inverse(_opset19)?_cpu": "the expected imaginary parts that are 0 hold float32"
    " rounding noise (1.9e-7, above the case's atol 1e-7); megbrain gives about 5e-16",
}


#: operator families (for conformance reports); an op type not listed is "other"
FAMILIES: dict[str, tuple[str, ...]] = {
    "elementwise": (
        "Abs Acos Acosh Add And Asin Asinh Atan Atanh Cast CastLike Ceil Celu Clip Cos Cosh"
        " Div Elu Equal Erf Exp Floor Gelu Greater GreaterOrEqual HardSigmoid HardSwish"
        " IsInf IsNaN LeakyRelu Less LessOrEqual Log Max Mean Min Mish Mod Mul Neg Not Or"
        " PRelu Pow Reciprocal Relu Round Selu Shrink Sigmoid Sign Sin Sinh Softplus"
        " Softsign Sqrt Sub Sum SwiGLU Swish Tan Tanh ThresholdedRelu Where Xor"
    ).split(),
    "reduce": (
        "ArgMax ArgMin ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean"
        " ReduceMin ReduceProd ReduceSum ReduceSumSquare CumSum CumProd"
    ).split(),
    "conv/pool": (
        "Conv ConvTranspose AveragePool MaxPool LpPool GlobalAveragePool GlobalMaxPool"
        " CausalConvWithState DeformConv MaxUnpool"
    ).split(),
    "normalization": (
        "BatchNormalization InstanceNormalization GroupNormalization LayerNormalization"
        " RMSNormalization LRN MeanVarianceNormalization LpNormalization Dropout"
    ).split(),
    "matmul/einsum": ("MatMul Gemm Einsum Det").split(),
    "softmax/attention": (
        "Softmax LogSoftmax Hardmax Attention RotaryEmbedding FlexAttention"
    ).split(),
    "loss": ("NegativeLogLikelihoodLoss SoftmaxCrossEntropyLoss").split(),
    "tensor/shape": (
        "Concat DepthToSpace Expand Flatten Gather GatherElements GatherND Identity OneHot"
        " Pad Reshape ReverseSequence Scatter ScatterElements ScatterND Shape Size Slice"
        " SpaceToDepth Split Squeeze Tile TopK Transpose Trilu Unsqueeze CenterCropPad"
        " NonZero Compress Unique NonMaxSuppression TensorScatter"
    ).split(),
    "resize/sampling": ("Resize Upsample GridSample AffineGrid RoiAlign Col2Im").split(),
    "generators": (
        "Constant ConstantOfShape EyeLike Range Bernoulli RandomUniformLike RandomNormalLike"
        " RandomUniform RandomNormal"
    ).split(),
    "signal": ("DFT STFT BlackmanWindow HammingWindow HannWindow MelWeightMatrix").split(),
    "quantization": (
        "QuantizeLinear DequantizeLinear DynamicQuantizeLinear QLinearMatMul QLinearConv"
        " ConvInteger MatMulInteger"
    ).split(),
    "bitwise": ("BitShift BitwiseAnd BitwiseOr BitwiseXor BitwiseNot BitCast").split(),
    "rnn": ("RNN GRU LSTM LinearAttention").split(),
    "control flow/sequence": (
        "If Loop Scan SequenceMap SequenceEmpty SequenceLength SequenceInsert SequenceAt"
        " SequenceConstruct SequenceErase SplitToSequence ConcatFromSequence Optional"
        " OptionalHasElement OptionalGetElement"
    ).split(),
    "string": ("StringSplit StringNormalizer StringConcat RegexFullMatch").split(),
}

_FAMILY_OF = {op: fam for fam, ops in FAMILIES.items() for op in ops}


def op_family(op_type: str) -> str:
    """The family of ``op_type`` in :data:`FAMILIES` ("other" when not listed)."""
    return _FAMILY_OF.get(op_type, "other")
