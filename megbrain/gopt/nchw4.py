"""``use_nchw4``: an int8 inference graph in the channel-blocked NCHW4 layout (the reference's
EnableNCHW4Pass): ``(N, C/4, H, W, 4)`` activations between the quantized convolutions, so
that the VNNI kernels read their source's 4-channel words as they are.

QuantizedS8 2-d Convolution and ConvBias operators without dilation whose output channels
(per group) are a multiple of 4 become their NCHW4 form: dense ones of any input channel
count (a network's first layer: its 3 channels padded to 4 with zeros, as the reference
pads them; the filter's padded channels are zero), grouped ones whose input channels per
group are a multiple of 4 too. The filter is converted by RelayoutFormat
NCHW_NCHW4_WEIGHT, the per-channel bias (1, OC, 1, 1) to (1, OC/4, 1, 1, 4) (both folded
into constants by the ``param_fuse`` that follows), ``z`` and a full-shape bias to NCHW4.
Depthwise convolutions (one channel per group) stay NCHW, behind relayouts.

Elementwise operators (Elemwise, ElemwiseMultiType: the quantized residual adds; TypeCvt:
the quantize and dequantize) follow when one input is NCHW4 and every other one is NCHW4
of the same shape or a scalar: they are layout-agnostic then. So does Pooling of an NCHW4
var (the NCHW4 Pooling). Every other reader of a converted var reads it back in NCHW
(RelayoutFormat NCHW4_NCHW, made once per var), as do the outputs: the graph computes the
same values in another layout. A var of one position, (N, C, 1, 1), has its values in the
same order in both layouts: it goes either way by a reshape.
"""

from __future__ import annotations

import dataclasses

from ..dtype import dtype_name
from ..graph import VarNode, static_shape
from ..graph.replace import dep_oprs
from ..kernels.conv import quantized as conv_quantized
from ..opr.base import SymbolVar, as_var
from ..opr.dnn import Convolution
from ..opr.dnn_conv_bias import ConvBias
from ..opr.dnn_pool import Pooling
from ..opr.relayout import relayout_format
from .nchw88 import finish_blocked, keep_nchw, read_back, to_blocked
from .passes import Rewriter, VarMap, inherit_props

__all__ = ["layout_flag", "use_nchw4"]

_CONVS = (Convolution.type_name, ConvBias.type_name)
#: the operators computing the same values in any layout of their (same-shaped) inputs
_ELEMENTWISE = ("Elemwise", "ElemwiseMultiType", "TypeCvt")


def converts(opr) -> bool:
    """Whether the pass computes the convolution ``opr`` in NCHW4 (see the module)."""
    p = opr.param
    if opr.type_name not in _CONVS or p.format != "NCHW" or opr.extra_deps:
        return False
    if any(dtype_name(v.dtype) != "QuantizedS8" for v in opr.inputs[:2]):
        return False
    if tuple(p.dilate) != (1, 1):
        return False
    src, filt = static_shape(opr.inputs[0]), static_shape(opr.inputs[1])
    if src is None or filt is None or len(src) != 4 or static_shape(opr.outputs[0]) is None:
        return False
    if p.group:  # (G, OCg, ICg, FH, FW): whole blocks of 4 per group, no depthwise
        return len(filt) == 5 and filt[1] % 4 == 0 and filt[2] % 4 == 0
    return len(filt) == 4 and filt[0] % 4 == 0


def use_nchw4(graph, dest, options) -> VarMap:
    """The NCHW4 rewrite of the graph of ``dest`` (see the module's docstring)."""
    rw = Rewriter(graph, dest)
    blocked: dict[VarNode, VarNode] = {}  # original var -> its NCHW4 var

    def nchw(v: VarNode) -> VarNode:
        return read_back(rw, blocked, v, 4, "NCHW4")

    copies: dict[VarNode, VarNode] = {}  # an NCHW var read in NCHW4 -> its relaid copy

    def to4(v: VarNode) -> VarNode:
        if v in blocked:
            return blocked[v]
        if v not in copies:
            copies[v] = to_blocked(rw, v, 4, "NCHW4")
        return copies[v]

    def convert_conv(opr) -> VarNode:
        w = SymbolVar(rw.get(opr.inputs[1]))
        ins = [to4(opr.inputs[0]), relayout_format(w, mode="NCHW_NCHW4_WEIGHT").node]
        ins += [to4(v) for v in opr.inputs[2:]]  # the bias, z
        param = dataclasses.replace(opr.param, format="NCHW4")
        return graph.insert_opr(type(opr)(ins, param, opr.config))[0]

    def convert_elemwise(opr) -> VarNode | None:
        out = static_shape(opr.outputs[0])
        if (opr.type_name not in _ELEMENTWISE or opr.extra_deps or out is None or len(out) != 4
                or out[1] % 4 or not any(v in blocked for v in opr.inputs)):  # fmt: skip
            return None
        ins = []
        for v in opr.inputs:
            s = static_shape(v)
            if v in blocked or s == out:
                ins.append(to4(v))
            elif s is not None and all(d == 1 for d in s):
                ins.append(rw.get(v))
            else:
                return None
        return graph.insert_opr(opr.clone(ins))[0]

    def convert_pooling(opr) -> VarNode | None:
        if (opr.type_name != Pooling.type_name or opr.extra_deps or opr.param.format != "NCHW"
                or opr.inputs[0] not in blocked):  # fmt: skip
            return None
        param = dataclasses.replace(opr.param, format="NCHW4")
        return graph.insert_opr(Pooling([blocked[opr.inputs[0]]], param, opr.config))[0]

    for opr in rw.oprs:
        with inherit_props(graph, opr):
            new = convert_conv(opr) if converts(opr) else None
            for convert in (convert_elemwise, convert_pooling):
                new = convert(opr) if new is None else new
            if new is not None:
                blocked[opr.outputs[0]] = new
                continue
            keep_nchw(rw, opr, nchw)
    return finish_blocked(rw, dest, blocked, nchw, "NCHW4")


def layout_flag(output_vars) -> str:
    """The layout flag of :func:`megbrain.optimize_for_inference` for the graph of
    ``output_vars`` on this host: ``"use_nchw4"`` where the VNNI kernels are on
    (``quantized.VNNI``), the graph has QuantizedS8 convolutions and every one of them
    converts (ResNet-18: its operators 0.5-0.8% faster in NCHW4); else ``"use_nchw88"``
    (float graphs; and int8 ones with depthwise layers, which stay NCHW behind two
    relayouts each: MobileNetV2 17% slower in NCHW4). See DECISIONS.md, "use_nchw4 for
    int8 graphs whose convolutions all convert"."""
    if not conv_quantized.VNNI:
        return "use_nchw88"
    vars_ = [as_var(v) for v in (output_vars if isinstance(output_vars, (list, tuple))
                                 else [output_vars])]  # fmt: skip
    convs = [o for o in dep_oprs(vars_) if o.type_name in _CONVS
             and dtype_name(o.inputs[0].dtype) == "QuantizedS8"]  # fmt: skip
    return "use_nchw4" if convs and all(converts(o) for o in convs) else "use_nchw88"
