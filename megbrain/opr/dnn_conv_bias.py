"""ConvBias: ``act(convolution(src, filter) + bias [+ z])`` in one operator, with the
``mgb.opr`` functions ``conv_bias_activation`` and ``conv_bias_activation_v1``.

Its kernels are the convolution's (:mod:`megbrain.opr.dnn`), the bias and activation applied
by the algorithm as it writes (an epilogue) or by one in-place Elemwise step after it; the
NCHW88 format is computed too, and NCHW4 for quantized operands
(:mod:`megbrain.kernels.conv.nchw4`). The optional fourth input ``z`` has the output's shape.
Quantized inputs (QuantizedS8 or Quantized8Asymm src and filter, a QuantizedS32 bias) go to
:mod:`megbrain.kernels.conv.quantized`: exact int32 sums, then MegDNN's naive epilogue.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np

from ..dtype import fmt_dtype, is_quantize
from ..graph import register_opr
from ..graph.operator import NoGradient, fmt_shape, table_param
from ..graph.static_infer import static_shape
from ..kernels import elemwise as ew_kernels
from ..kernels import workspace
from ..kernels.conv import epilogue as conv_epilogue
from ..kernels.conv import nchw4 as conv_nchw4
from ..kernels.conv import nchw88 as conv_nchw88
from ..kernels.conv import pointwise88_dw
from ..kernels.conv import quantized as conv_quantized
from ..kernels.conv.constant_operands import constant_filter
from ..kernels.steps import chain
from ..serialization import sereg
from . import param_defs as pdefs
from ._internal import input_is_constant, reduce_to_input, sv
from .base import SymbolVar, build_opr
from .basic_arith import elemwise
from .dnn import (
    _POLICY,
    QUANTIZED_ALGORITHM,
    Convolution,
    ConvolutionBackwardData,
    ConvolutionBackwardFilter,
    ConvolutionParam,
    _conv_params,
    _ConvBase,
    _float_dtype,
    _make,
    _param,
    _quantized_dtype,
)
from .sereg_params import register_with_policy

__all__ = [
    "ConvBias",
    "ConvBiasGated",
    "ConvBiasParam",
    "ConvBiasPreact",
    "ConvBiasTail",
    "ConvBiasTailParam",
    "SeparableConvBias",
    "SeparableConvBiasParam",
    "conv_bias_activation",
    "conv_bias_activation_v1",
]


#: the activations the NCHW88 kernels apply as they write (bias, z, then the activation)
_NCHW88_EPILOGUE_MODES = ("IDENTITY", "RELU", "H_SWISH")
#: the Elemwise mode computing ``act(conv + bias)`` in place, per ConvBias nonlineMode
_BIAS_ACT = {
    "IDENTITY": "ADD",
    "RELU": "FUSE_ADD_RELU",
    "SIGMOID": "FUSE_ADD_SIGMOID",
    "H_SWISH": "FUSE_ADD_H_SWISH",
}


# the convolution's fields are inherited from ConvolutionParam, in its order (not the
# table's), and nonlineMode follows; output_block_size, a winograd setting, is not supported
@dataclass(frozen=True)
@table_param(pdefs.ConvBias, skip=("output_block_size",))
class ConvBiasParam(ConvolutionParam):
    """Param of ConvBias: the convolution's fields plus the activation ``nonlineMode``."""

    def conv_param(self) -> ConvolutionParam:
        """The param of the convolution inside."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(ConvolutionParam)}
        return ConvolutionParam(**fields)


@register_opr
class ConvBias(_ConvBase):
    """``act(convolution(src, filter) + bias [+ z])`` with bias (1, OC, 1, 1) (NCHW88:
    (1, OC/8, 1, 1, 8); NCHW4: (1, OC/4, 1, 1, 4)) or of the output's shape and the
    optional ``z`` of the output's shape (summed in that order); act is IDENTITY, RELU,
    SIGMOID or H_SWISH (``nonlineMode``)."""

    #: the reference's C++ type (ConvBias is an alias of ConvBiasForward)
    type_name = "ConvBiasForward"

    short_name = "conv_bias"

    Param = ConvBiasParam
    blocked_format = True

    def infer_dtypes(self, in_dtypes):
        if len(in_dtypes) not in (3, 4):
            raise self.error(
                f"expected 3 or 4 inputs (src, filter, bias[, z]), got {len(in_dtypes)}"
            )
        self._check_nchw4_dtypes(in_dtypes)
        names = ("src", "filter", "bias", "z")
        if not any(is_quantize(d) for d in in_dtypes):
            return [_float_dtype(self, in_dtypes, names)]
        out = _quantized_dtype(self, in_dtypes, names)
        if self.param.nonlineMode == "SIGMOID" and len(in_dtypes) == 3:
            # MegDNN's naive kernel applies SIGMOID to float values only: those of a ``z`` sum
            raise self.error(
                f"nonlineMode SIGMOID needs a z for quantized dtypes (output {fmt_dtype(out)})"
            )
        return [out]

    def _channel_bias_shape(self, out: tuple) -> tuple:
        if self._nchw88() or self._nchw4():
            return (1, out[1], 1, 1, out[4])
        return (1, out[1], 1, 1)

    def infer_shapes(self, in_shapes, in_values):
        out = self._fwd_shape(tuple(in_shapes[0]), tuple(in_shapes[1]))
        bias = tuple(in_shapes[2])
        per_channel = self._channel_bias_shape(out)
        if bias not in (per_channel, out):
            raise self.error(
                f"bias {fmt_shape(bias)} must be {fmt_shape(per_channel)} or the output "
                f"shape {fmt_shape(out)}"
            )
        if len(in_shapes) == 4 and tuple(in_shapes[3]) != out:
            raise self.error(
                f"z {fmt_shape(tuple(in_shapes[3]))} must have the output shape {fmt_shape(out)}"
            )
        return [out]

    def bind(self, ins, outs):
        mode = self.param.nonlineMode
        z = ins[3] if len(ins) == 4 else None
        if is_quantize(outs[0].dtype):
            p = self.param
            self.chosen_algorithm = QUANTIZED_ALGORITHM
            try:
                with constant_filter(self._filter_is_constant()):
                    if self._nchw4():
                        return conv_nchw4.bind_nchw4_conv_bias(
                            ins[0], ins[1], ins[2], z, outs[0], p.stride, p.pad, p.dilate,
                            p.flip, mode, bool(p.group),
                        )  # fmt: skip
                    return conv_quantized.bind_quantized_conv_bias(
                        ins[0], self._grouped(ins[1]), ins[2], z, outs[0], p.stride, p.pad,
                        p.dilate, p.flip, mode,
                    )  # fmt: skip
            except ValueError as exc:
                raise self.error(str(exc)) from None

        tail = self._tail()

        def act():  # bias (and z), activation and tail in passes of their own
            if z is None:
                steps = [ew_kernels.bind(_BIAS_ACT[mode], [outs[0], ins[2]], outs[0])]
            else:
                steps = [
                    ew_kernels.bind("ADD", [outs[0], ins[2]], outs[0]),
                    ew_kernels.bind(_BIAS_ACT[mode], [outs[0], z], outs[0]),
                ]
            if tail is not None:
                steps.append(conv_epilogue.tail_step(tail, outs[0]))
            return chain(steps)

        if self._nchw88():
            # the NCHW88 binding runs a tail its chosen kernel does not apply after it
            epilogue = self._nchw88_epilogue(mode, ins[2], outs[0], tail)
            if epilogue is not None:
                return self._bind_nchw88(ins[0], ins[1], outs[0], epilogue=epilogue, z=z)
            steps = []
            if z is not None and np.may_share_memory(z, outs[0]):
                # the plan gave the output z's memory (inplace_input) but the kernel can not
                # take the epilogue (a non-contiguous bias): z is kept before it is written
                kept = workspace.empty(z.shape, z.dtype)
                steps.append(functools.partial(np.copyto, kept, z))
                z = kept
            return chain([*steps, self._bind_nchw88(ins[0], ins[1], outs[0]), act()])
        epilogue = (
            None if z is not None else conv_epilogue.for_conv_bias(mode, ins[2], outs[0], tail)
        )
        return self._bind_kernel(
            "forward", ins[0], self._grouped(ins[1]), outs[0], epilogue=epilogue, then=act
        )

    def inplace_input(self):
        """``z`` (input 3) when DIRECT_NCHW88 or POINTWISE_NCHW88 applies ``act(conv + bias +
        z)``: it reads each
        position's ``z`` before it writes the position, so the output may take ``z``'s
        memory (one stream less than reading ``z`` and writing elsewhere); no other algorithm
        and no other case (``z`` also read as the source, say) may."""
        if len(self.inputs) != 4 or not self._nchw88():
            return None
        z = self.inputs[3]
        if any(v is z for v in self.inputs[:3]):
            return None
        shapes = [static_shape(v) for v in self.inputs]
        if any(s is None for s in shapes) or self.param.nonlineMode not in _NCHW88_EPILOGUE_MODES:
            return None
        if tuple(shapes[2]) != self._channel_bias_shape(tuple(shapes[3])):
            return None  # a full-shape bias is added in a pass of its own, after the kernel
        p = self.param
        try:
            geo = conv_nchw88.nchw88_geometry(shapes[0], shapes[1], p.group, p.stride, p.pad,
                                              p.dilate)  # fmt: skip
        except ValueError:
            return None
        f32 = np.dtype(np.float32)
        direct = all(v.dtype == f32 for v in self.inputs) and conv_nchw88.direct_geometry(
            geo, p.pad, p.dilate
        )
        return 3 if direct else None

    def _tail(self) -> str | None:
        """The fused elementwise tail (:class:`ConvBiasTail`), None for a plain ConvBias."""
        return None

    def _nchw88_epilogue(self, mode: str, bias: np.ndarray, out: np.ndarray, tail=None):
        """The epilogue of an NCHW88 ConvBias (its per-channel bias as OC values, a view),
        or None when the kernel can not apply it (every NCHW88 algorithm applies ReLU and
        H_SWISH; :func:`.nchw88.bind_nchw88_forward` runs a ReLU6 or SiLU tail after the
        algorithms that do not apply it)."""
        if mode not in _NCHW88_EPILOGUE_MODES or bias.dtype != out.dtype:
            return None
        if bias.shape != self._channel_bias_shape(out.shape) or not bias.flags.c_contiguous:
            return None
        return conv_epilogue.Epilogue(bias.reshape(-1), mode == "RELU", mode == "H_SWISH",
                                      tail == "RELU6", tail == "SILU")  # fmt: skip

    def grad(self, wrt_idx, out_grads):
        og = out_grads[0]
        if og is None:
            return None
        self._no_nchw88_grad()
        if is_quantize(self.outputs[0].dtype):
            raise self.error("quantized ConvBias has no gradient (inference only)")
        og, y = sv(og), sv(self.outputs[0])
        src, filt, bias = self.inputs[:3]
        cparam = self.param.conv_param()
        mode = self.param.nonlineMode
        # the gradient of the pre-activation value conv + bias
        if mode == "IDENTITY":
            gpre = og
        elif mode == "RELU":
            gpre = elemwise(y, og, mode="SWITCH_GT0")
        elif mode == "SIGMOID":
            gpre = elemwise(y, og, mode="SIGMOID_GRAD")
        else:
            pre = elemwise(_make(Convolution, [src, filt], cparam), sv(bias), mode="ADD")
            if len(self.inputs) == 4:
                pre = elemwise(pre, sv(self.inputs[3]), mode="ADD")
            gpre = elemwise(pre, og, mode="H_SWISH_GRAD")
        if wrt_idx == 0:
            return _make(ConvolutionBackwardData, [filt, gpre, src], cparam).node
        if wrt_idx == 1:
            return _make(ConvolutionBackwardFilter, [src, gpre, filt], cparam).node
        if wrt_idx == 3:  # z, of the output's shape
            return gpre.node
        return reduce_to_input(gpre, bias)


@dataclass(frozen=True)
class ConvBiasTailParam(ConvBiasParam):
    """Param of ConvBiasTail: ConvBias's and the fused ``tail`` ("RELU6" or "SILU")."""

    tail: str = "RELU6"


@register_opr
class ConvBiasTail(ConvBias):
    """A ConvBias and the elementwise tail reading its output, ``tail(act(conv + bias [+
    z]))`` with tail ReLU6 (``min(max(x, 0), 6)``) or SiLU (``x * sigmoid(x)``), as the JIT
    computes them (:data:`megbrain.kernels.conv.epilogue.TAIL_EXPRS`).

    Made at compile time by the ``fuse_conv_bias_tail`` pass (:mod:`megbrain.gopt.jit`),
    never by a user and never written to a graph file (the reference has no such operator):
    the algorithms registered for the tail apply it as they write each block of the
    output; any other applies it after the kernel with the JIT's kernel, in place."""

    type_name = "ConvBiasTail"
    short_name = "conv_bias_tail"
    Param = ConvBiasTailParam

    def _tail(self) -> str | None:
        return self.param.tail

    def default_name(self):
        return f"{super().default_name()}+{self.param.tail}"

    def grad(self, wrt_idx, out_grads):
        raise self.error("a fused ConvBias tail has no gradient (made at compile time)",
                         NoGradient)  # fmt: skip


class _ConvBiasThroughSource(ConvBias):
    """A ConvBias whose last inputs transform its source per channel before the products,
    made at compile time only. POINTWISE_NCHW88 (any NCHW88 binding) gets them as the
    keyword ``source_kw`` of :meth:`_bind_nchw88` and applies them as it loads; any other
    algorithm reads the transformed source, written into its workspace by
    :meth:`_transform` first."""

    n_extra = 0
    source_kw = ""
    described = ""  # for the gradient's refusal
    _through = None

    @staticmethod
    def _transform(src, extra, out) -> None:
        raise NotImplementedError

    def bind(self, ins, outs):
        extra, ins = ins[-self.n_extra :], ins[: -self.n_extra]
        if self._nchw88():
            self._through = extra[0] if self.n_extra == 1 else tuple(extra)
            try:  # read by _bind_nchw88, for this bind only
                return super().bind(ins, outs)
            finally:
                self._through = None
        src = workspace.empty(ins[0].shape, ins[0].dtype)
        step = super().bind([src, *ins[1:]], outs)
        return chain([functools.partial(self._transform, ins[0], extra, src), step])

    def _bind_nchw88(self, src, filt, out, epilogue=None, z=None, **through):
        return super()._bind_nchw88(src, filt, out, epilogue, z,
                                    **{self.source_kw: self._through})  # fmt: skip

    def inplace_input(self):
        return None  # inputs after the bias are the transform's, which ConvBias's rule skips

    def grad(self, wrt_idx, out_grads):
        raise self.error(f"{self.described} has no gradient (made at compile time)",
                         NoGradient)  # fmt: skip


@register_opr
class ConvBiasGated(_ConvBiasThroughSource):
    """A ConvBias reading its source scaled per sample and input channel, ``act(conv(src
    gate) + bias [+ z])``, ``gate`` its last input ((N, IC/8, 1, 1, 8) in NCHW88, (N, IC, 1,
    1) in NCHW, float32): the squeeze-and-excitation multiply of the mobile nets and the
    convolution reading it.

    Made at compile time by the ``fuse_se_gate`` pass (:mod:`megbrain.gopt.jit`), never by
    a user and never written to a graph file (the reference has no such operator):
    POINTWISE_NCHW88 multiplies each filter vector by its input channel's gate as it loads
    it (a multiply per filter vector of a tile instead of a pass over the source); any
    other algorithm reads the product, computed into its workspace first."""

    type_name = "ConvBiasGated"
    short_name = "conv_bias_gated"
    n_extra = 1
    source_kw = "gate"
    described = "a gated ConvBias"

    @staticmethod
    def _transform(src, extra, out) -> None:
        np.multiply(src, extra[0], out=out)

    def default_name(self):
        return f"{super().default_name()}*gate"

    def _gate_shape(self, src: tuple) -> tuple:
        return (src[0], src[1], 1, 1, *src[4:]) if self._nchw88() else (src[0], src[1], 1, 1)

    def infer_dtypes(self, in_dtypes):
        if len(in_dtypes) not in (4, 5) or in_dtypes[-1] != np.float32:
            raise self.error("expected src, filter, bias[, z] and a float32 gate")
        return super().infer_dtypes(in_dtypes[:-1])

    def infer_shapes(self, in_shapes, in_values):
        gate, want = tuple(in_shapes[-1]), self._gate_shape(tuple(in_shapes[0]))
        if gate != want:
            raise self.error(f"gate {fmt_shape(gate)} must be {fmt_shape(want)}")
        return super().infer_shapes(in_shapes[:-1], in_values)


@register_opr
class ConvBiasPreact(_ConvBiasThroughSource):
    """A ConvBias reading its source through a per-channel scale, shift and ReLU, ``act(
    conv(relu(src scale + shift)) + bias [+ z])``, ``scale`` and ``shift`` its last two
    inputs ((1, IC/8, 1, 1, 8) in NCHW88, (1, IC, 1, 1) in NCHW, float32): a DenseNet
    layer's pre-activation BatchNorm and ReLU and the 1x1 convolution reading them.

    Made at compile time by the ``fuse_preactivation`` pass (:mod:`megbrain.gopt.jit`),
    never by a user and never written to a graph file (the reference has no such
    operator): POINTWISE_NCHW88 applies them to the source as it loads it (no pass over
    the concatenation that each layer reads, which grows layer by layer); any other
    algorithm reads the activated source, computed into its workspace first."""

    type_name = "ConvBiasPreact"
    short_name = "conv_bias_preact"
    n_extra = 2
    source_kw = "preact"
    described = "a pre-activated ConvBias"

    @staticmethod
    def _transform(src, extra, out) -> None:
        conv_nchw88.preactivate(src, *extra, out)

    def default_name(self):
        return f"{super().default_name()}(relu)"

    def _operand_shape(self, src: tuple) -> tuple:
        return (1, src[1], 1, 1, *src[4:]) if self._nchw88() else (1, src[1], 1, 1)

    def infer_dtypes(self, in_dtypes):
        if len(in_dtypes) not in (5, 6) or any(d != np.float32 for d in in_dtypes[-2:]):
            raise self.error("expected src, filter, bias[, z], a float32 scale and shift")
        return super().infer_dtypes(in_dtypes[:-2])

    def infer_shapes(self, in_shapes, in_values):
        want = self._operand_shape(tuple(in_shapes[0]))
        for name, shape in zip(("scale", "shift"), in_shapes[-2:]):
            if tuple(shape) != want:
                raise self.error(f"{name} {fmt_shape(tuple(shape))} must be {fmt_shape(want)}")
        return super().infer_shapes(in_shapes[:-2], in_values)


@dataclass(frozen=True)
class SeparableConvBiasParam(ConvBiasParam):
    """Param of SeparableConvBias: the 1x1 ConvBias's fields, the depthwise ConvBias's param
    ``dw`` and its fused ``dw_tail`` ("RELU6", "SILU" or "" for none)."""

    dw: ConvBiasParam | None = None
    dw_tail: str = ""


@register_opr
class SeparableConvBias(ConvBias):
    """An NCHW88 channel-wise ConvBias and the dense 1x1 stride-1 ConvBias that alone reads
    it, ``act(conv1x1(dwtail(dwact(dwconv(src) + dwbias))) + bias [+ z])``: inputs ``src,
    filter, bias[, z]`` of the 1x1 layer (``src`` the depthwise layer's source), then the
    depthwise ``filter`` (C/8, 1, 1, FH, FW, 8) and per-channel ``bias``.

    Made at compile time by the ``fuse_depthwise_pointwise`` pass (:mod:`megbrain.gopt.nchw88`),
    never by a user and never written to a graph file (the reference has no such operator):
    DEPTHWISE_POINTWISE_NCHW88 computes both layers in one kernel, the intermediate in each
    thread's scratch (:mod:`megbrain.kernels.conv.pointwise88_dw`); where it does not apply
    the two layers run one after the other through a workspace."""

    type_name = "SeparableConvBias"
    short_name = "separable_conv_bias"
    Param = SeparableConvBiasParam

    def default_name(self):
        return f"{super().default_name()}+dw"

    def _dw_shape(self, src: tuple, filt: tuple) -> tuple:
        p = self.param.dw
        try:
            return conv_nchw88.nchw88_geometry(src, filt, True, p.stride, p.pad,
                                               p.dilate).out_shape  # fmt: skip
        except ValueError as exc:
            raise self.error(str(exc)) from None

    def infer_dtypes(self, in_dtypes):
        if len(in_dtypes) not in (5, 6) or any(d != np.float32 for d in in_dtypes):
            raise self.error("expected float32 src, filter, bias[, z], dw filter and dw bias")
        return super().infer_dtypes(in_dtypes[:-2])

    def infer_shapes(self, in_shapes, in_values):
        if not self._nchw88() or self.param.dw is None:
            raise self.error("a separable ConvBias is NCHW88, with its depthwise param")
        mid = self._dw_shape(tuple(in_shapes[0]), tuple(in_shapes[-2]))
        bias = (1, mid[1], 1, 1, mid[4])
        if tuple(in_shapes[-1]) != bias:
            raise self.error(f"dw bias {fmt_shape(tuple(in_shapes[-1]))} must be {fmt_shape(bias)}")
        return super().infer_shapes([mid, *in_shapes[1:-2]], in_values)

    def bind(self, ins, outs):
        (fd, bd), ins = ins[-2:], ins[:-2]
        src, out, z = ins[0], outs[0], ins[3] if len(ins) == 4 else None
        p, dwp = self.param, self.param.dw
        steps = []
        if not bd.flags.c_contiguous:  # read at every run: copied at every run
            kept = workspace.empty(bd.shape, bd.dtype)
            steps.append(functools.partial(np.copyto, kept, bd))
            bd = kept
        tail = dwp.nonlineMode, self.param.dw_tail
        dw_epi = conv_epilogue.Epilogue(bd.reshape(-1), tail[0] == "RELU", tail[0] == "H_SWISH",
                                        tail[1] == "RELU6", tail[1] == "SILU")  # fmt: skip
        epi = self._nchw88_epilogue(p.nonlineMode, ins[2], out)
        constant = self._filter_is_constant() and input_is_constant(self, len(self.inputs) - 2)
        if epi is not None and pointwise88_dw.usable(src, fd, ins[1], out):
            with constant_filter(constant):
                step = pointwise88_dw.bind_depthwise_pointwise88(
                    src, fd, dwp.stride, dwp.pad, dwp.dilate, dw_epi, ins[1], out, epi, z,
                    dwp.flip)  # fmt: skip
            self.chosen_algorithm = pointwise88_dw.ALGORITHM
            return chain([*steps, step])
        mid = workspace.empty(self._dw_shape(src.shape, fd.shape), src.dtype)
        with constant_filter(constant):
            _, dw_step = conv_nchw88.bind_nchw88_forward(src, fd, mid, dwp.stride, dwp.pad,
                                                         dwp.dilate, dwp.flip, group=True,
                                                         epilogue=dw_epi)  # fmt: skip
        return chain([*steps, dw_step, super().bind([mid, *ins[1:]], outs)])

    def inplace_input(self):
        return None

    def grad(self, wrt_idx, out_grads):
        raise self.error("a separable ConvBias has no gradient (made at compile time)",
                         NoGradient)  # fmt: skip


@_conv_params(("param", "ConvBias"), *_POLICY)
def conv_bias_activation(
    src, filter, bias, *, nonlineMode="IDENTITY", param=None, dtype=None, name=None,
    comp_node=None, config=None, comp_graph=None, **params,
) -> SymbolVar:  # fmt: skip
    """``nonlineMode(convolution(src, filter) + bias)`` (registry name ``ConvBias``).

    Parameters
    ----------
    src, filter
        As for :func:`convolution`.
    bias : SymbolVar or array_like
        The (1, OC, 1, 1) bias, or one of the output's shape.
    nonlineMode : {"IDENTITY", "RELU", "SIGMOID", "H_SWISH"}
        The activation.
    param : ConvBiasParam, optional
        The whole param, instead of fields (then ``nonlineMode`` is the param's).
    dtype, name, comp_node, config, comp_graph, **params
        As for :func:`convolution`.

    Returns
    -------
    SymbolVar
        The activated (N, OC, OH, OW) output.
    """
    if param is None:
        params["nonlineMode"] = nonlineMode
    p = _param(ConvBiasParam, "conv_bias_activation", param, params)
    return build_opr(ConvBias, [src, filter, bias], p, dtype, name, comp_node, config, comp_graph)


@_conv_params(("param", "ConvBiasV1"), *_POLICY, fixed=("data_type",))
def conv_bias_activation_v1(
    src, filter, bias, *, dtype=None, name=None, comp_node=None, config=None, comp_graph=None,
    **params,
) -> SymbolVar:  # fmt: skip
    """:func:`conv_bias_activation` with the legacy param ``ConvBiasV1`` (``data_type`` FLOAT).

    Returns
    -------
    SymbolVar
        The activated (N, OC, OH, OW) output.
    """
    cfg = {"name": name, "comp_node": comp_node, "config": config, "comp_graph": comp_graph}
    return conv_bias_activation(src, filter, bias, dtype=dtype, **cfg, **params)


# the current ConvBias is registered as ConvBiasForwardV3 (the type id of the unversioned name)
register_with_policy(ConvBias, pdefs.ConvBias, name="ConvBiasForwardV3")


sereg.register_fused(ConvBiasTail, lambda opr: f"ConvBias with a fused {opr.param.tail} tail")
sereg.register_fused(ConvBiasGated,
                     lambda opr: "ConvBias with a fused squeeze-and-excitation gate")  # fmt: skip
sereg.register_fused(ConvBiasPreact,
                     lambda opr: "ConvBias with a fused pre-activation scale, shift and ReLU")
sereg.register_fused(SeparableConvBias,
                     lambda opr: "a depthwise ConvBias and the 1x1 one reading it")  # fmt: skip
