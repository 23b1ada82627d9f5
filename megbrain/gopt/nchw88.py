"""``use_nchw88``: an inference graph in the channel-blocked NCHW88 layout (the reference's
EnableNchwxxPass for NCHW88).

Float32 2-d Convolution and ConvBias operators whose input and output channels per group are
multiples of 8 (dense, or grouped with ``sparse=GROUP``), or channel-wise ones (one input and
output channel per group, the groups a multiple of 8: depthwise) become their NCHW88 form:
the filter converted by RelayoutFormat (folded into a constant by the ``param_fuse`` that
follows), the per-channel bias (1, OC, 1, 1) to (1, OC/8, 1, 1, 8), ``z`` and a full-shape
bias to NCHW88. So does the hybrid first layer of the reference (a dense one whose NCHW
source has fewer than 8 channels, ``OC % 8 == 0``: a network's stem), reading its source as
it is, its filter (OC, IC, FH, FW) to (OC/8, FH, FW, IC, 8): its direct kernel writes NCHW88
in about the time the NCHW convolution took alone, without the relayout of its output
(mobilenet_v2's 3->32 3x3/s2 stem 0.31 ms against 0.37 + 0.24), and the pooling after it
then runs blocked too.
Elementwise operators follow when one input is NCHW88 and every other one is NCHW88, of a
shape broadcasting per channel or per position (``(N, 1, H, W)``), or a scalar. So do
Pooling of an NCHW88 var (the NCHW88 Pooling: max and average, any geometry) and Concat of
4-d vars one of which is NCHW88, along the channels when every input's are a multiple of 8
(axis 1 of the blocked form: GoogLeNet's and DenseNet's concatenations) or along H or W
(the ceil-mode padding the ONNX importer writes as a concatenation), the other inputs
converted. A global pooling as ONNX's GlobalAveragePool imports (a reshape to (N, C, H*W),
Reduce MEAN, SUM or MAX over axis 2, a reshape to (N, C, 1, 1): squeeze-and-excitation) of
an NCHW88 var follows too, as a Reduce of its (N, C/8, H*W, 8) view, and so does a Reduce
over axis 2 or 3 (H or W). Every other reader of a converted var reads it back in NCHW
(RelayoutFormat NCHW88_NCHW, made once per var), as do the outputs: the graph computes the
same values in another layout. A var of one position, (N, C, 1, 1), has the same values in
the same order in both layouts: it goes either way by a reshape.

Not converted (they stay NCHW, behind a relayout): all other operators.

Three compile-time passes live here too: ``fuse_pool_end_padding`` (ceil mode's padding into
the NCHW88 max pooling), ``fuse_channel_shuffle`` (ShuffleNet's concatenation and channel
shuffle as one ChannelShuffleConcat whose producers write their parts in place) and
``fuse_depthwise_pointwise`` (a depthwise ConvBias and the 1x1 one reading it as one
SeparableConvBias).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..graph import OperatorNodeConfig, VarNode, infer_value, static_shape
from ..graph.replace import dep_oprs
from ..kernels.pool.nchw88 import pool_nchw88_shape
from ..opr.base import SymbolVar
from ..opr.dnn import Convolution
from ..opr.dnn_conv_bias import ConvBias, ConvBiasTail, SeparableConvBias, SeparableConvBiasParam
from ..opr.dnn_pool import Pooling, PoolingEndPad, PoolingEndPadParam
from ..opr.indexing import Subtensor, subtensor_getitem
from ..opr.relayout import RelayoutFormat, relayout_format
from ..opr.tensor_manip import (
    ChannelShuffleConcat,
    Concat,
    ConcatParam,
    Dimshuffle,
    Reshape,
    dimshuffle,
    reshape,
)
from .jit import _readers, _sweep
from .passes import Rewriter, VarMap, inherit_props, register_pass

__all__ = [
    "finish_blocked",
    "fuse_channel_shuffle",
    "fuse_depthwise_pointwise",
    "fuse_pool_end_padding",
    "keep_nchw",
    "use_nchw88",
]

_F32 = np.dtype(np.float32)
_CONVS = (Convolution.type_name, ConvBias.type_name)
#: _conv_weight_mode's answer for the hybrid first layer, whose filter (OC, IC, FH, FW)
#: becomes (OC/8, FH, FW, IC, 8) by a reshape and a dimshuffle (no RelayoutFormat mode)
_HYBRID = "hybrid"


def _conv_weight_mode(opr) -> str | None:
    """The filter's RelayoutFormat mode when ``opr`` converts, else None."""
    p = opr.param
    if opr.type_name not in _CONVS or p.format != "NCHW" or opr.extra_deps:
        return None
    if opr.outputs[0].dtype != _F32 or any(v.dtype != _F32 for v in opr.inputs):
        return None
    src, filt = static_shape(opr.inputs[0]), static_shape(opr.inputs[1])
    out = static_shape(opr.outputs[0])
    if src is None or filt is None or out is None or len(src) != 4:
        return None
    if p.group:  # (G, OCg, ICg, FH, FW)
        if len(filt) != 5:
            return None
        if filt[1] == filt[2] == 1 and filt[0] % 8 == 0:  # channel-wise (depthwise)
            return "NCHW_NCHW88_CONV_CHAN_WEIGHT"
        if filt[1] % 8 or filt[2] % 8:
            return None
        return "NCHW_NCHW88_CONV_GROUP_WEIGHT"
    if len(filt) != 4 or filt[0] % 8:
        return None
    if filt[1] < 8:  # an NCHW source: the hybrid first layer
        return _HYBRID
    if filt[1] % 8:
        return None
    return "NCHW_NCHW88_CONV_DENSE_WEIGHT"


def _one_position(shape: tuple | None, block: int) -> bool:
    """Whether an NCHW var of ``shape`` is (N, C, 1, 1) with C a multiple of ``block``: its
    values are in the same order in NCHW and the blocked layout, so a reshape moves it
    between the layouts."""
    return shape is not None and len(shape) == 4 and shape[2:] == (1, 1) and shape[1] % block == 0


def to_blocked(rw: Rewriter, v: VarNode, block: int, layout: str) -> VarNode:
    """A layout pass's NCHW var ``v`` (as rewritten) relaid into ``layout`` (``"NCHW88"``,
    ``"NCHW4"``) of ``block`` channels: a reshape where it has one position, else a
    RelayoutFormat."""
    s, x = static_shape(v), SymbolVar(rw.get(v))
    if _one_position(s, block):
        return reshape(x, (s[0], s[1] // block, 1, 1, block)).node
    return relayout_format(x, mode=f"NCHW_{layout}").node


def read_back(rw: Rewriter, blocked: dict, v: VarNode, block: int, layout: str) -> VarNode:
    """``v`` as a layout pass's NCHW operators read it: a var computed blocked (in
    ``blocked``) read back from ``layout`` once (a reshape where it has one position, else a
    RelayoutFormat), any other as rewritten."""
    if v in blocked and v not in rw.varmap:
        s, b = static_shape(v), SymbolVar(blocked[v])
        if _one_position(s, block):
            back = reshape(b, s)
        else:
            back = relayout_format(b, mode=f"{layout}_NCHW")
        rw.replace(v, back.node, f"read back from {layout}")
    return rw.get(v)


def use_nchw88(graph, dest, options) -> VarMap:
    """The NCHW88 rewrite of the graph of ``dest`` (see the module's docstring)."""
    rw = Rewriter(graph, dest)
    blocked: dict[VarNode, VarNode] = {}  # original var -> its NCHW88 var

    def nchw(v: VarNode) -> VarNode:
        return read_back(rw, blocked, v, 8, "NCHW88")

    def to88(v: VarNode) -> VarNode:
        if v not in blocked:
            blocked[v] = to_blocked(rw, v, 8, "NCHW88")
        return blocked[v]

    def pooling_chain(opr) -> bool:
        """Whether ``opr`` reshapes an NCHW88 var (N, C, H, W) to (N, C, H*W) read only by
        Reduce operators over axis 2, each read only by reshapes to (N, C, 1, 1): a global
        pooling (squeeze-and-excitation), computed blocked."""
        if opr.type_name != "Reshape" or opr.extra_deps or opr.inputs[0] not in blocked:
            return False
        s, out = static_shape(opr.inputs[0]), static_shape(opr.outputs[0])
        if s is None or out != (s[0], s[1], s[2] * s[3]) or s[1] % 8:
            return False

        def only(v, ok) -> bool:
            rs = rw.readers.get(v, [])
            return bool(rs) and all(r is not None and not r.extra_deps and ok(r) for r in rs)

        def to_nchw_shape(r) -> bool:
            return r.type_name == "Reshape" and static_shape(r.outputs[0]) == (*s[:2], 1, 1)

        def reduce(r) -> bool:
            return (r.type_name == "Reduce" and len(r.inputs) == 1 and r.param.axis == 2
                    and only(r.outputs[0], to_nchw_shape))  # fmt: skip

        return only(opr.outputs[0], reduce)

    def operand88(v: VarNode, out: tuple) -> VarNode | None:
        """An elementwise operand of NCHW88 output ``out`` (its NCHW shape), or None."""
        if v in blocked:
            return blocked[v]
        s = static_shape(v)
        if s is None:
            return None
        if all(d == 1 for d in s):
            return rw.get(v)
        if len(s) != 4 or any(d not in (1, o) for d, o in zip(s, out)):
            return None
        if s[1] == out[1]:
            return to88(v)
        if s[1] == 1:
            return reshape(SymbolVar(rw.get(v)), (s[0], 1, s[2], s[3], 1)).node
        return None

    def convert_conv(opr, wmode: str) -> VarNode:
        w = SymbolVar(rw.get(opr.inputs[1]))
        if wmode == _HYBRID:
            src = nchw(opr.inputs[0])
            oc, ic, fh, fw = static_shape(opr.inputs[1])
            filt = dimshuffle(reshape(w, (oc // 8, 8, ic, fh, fw)), (0, 3, 4, 2, 1)).node
        else:
            src = to88(opr.inputs[0])
            filt = relayout_format(w, mode=wmode).node
        ins = [src, filt]
        if opr.type_name == ConvBias.type_name:
            bias = opr.inputs[2]
            ins.append(relayout_format(SymbolVar(rw.get(bias)), mode="NCHW_NCHW88").node
                       if bias not in blocked else blocked[bias])  # fmt: skip
            ins += [to88(z) for z in opr.inputs[3:]]
        param = dataclasses.replace(opr.param, format="NCHW88")
        return graph.insert_opr(type(opr)(ins, param, opr.config))[0]

    def convert_elemwise(opr) -> VarNode | None:
        out = static_shape(opr.outputs[0])
        if (
            opr.type_name != "Elemwise"
            or opr.extra_deps
            or out is None
            or len(out) != 4
            or out[1] % 8
            or not any(v in blocked for v in opr.inputs)
        ):
            return None
        ins = [operand88(v, tuple(out)) for v in opr.inputs]
        if any(v is None for v in ins):
            return None
        return graph.insert_opr(opr.clone(ins))[0]

    def convert_pooling(opr) -> VarNode | None:
        """The NCHW88 Pooling of an NCHW88 float32 var, or None."""
        if (
            opr.type_name != Pooling.type_name
            or opr.extra_deps
            or opr.param.format != "NCHW"
            or opr.inputs[0] not in blocked
            or opr.outputs[0].dtype != _F32
        ):
            return None
        param = dataclasses.replace(opr.param, format="NCHW88")
        return graph.insert_opr(Pooling([blocked[opr.inputs[0]]], param, opr.config))[0]

    def convert_concat(opr) -> VarNode | None:
        """The Concat of NCHW88 vars along the channels (every input's a multiple of 8) or
        a spatial axis, when one input is NCHW88 (the others are converted), or None."""
        out = static_shape(opr.outputs[0])
        if (
            opr.type_name != Concat.type_name
            or opr.extra_deps
            or out is None
            or len(out) != 4
            or out[1] % 8
            or opr.outputs[0].dtype != _F32
            or not any(v in blocked for v in opr.inputs)
        ):
            return None
        shapes = [static_shape(v) for v in opr.inputs]
        if any(s is None or len(s) != 4 or s[1] % 8 for s in shapes):
            return None
        axis = opr.param.axis % 4
        if axis == 0:
            return None
        ins = [to88(v) for v in opr.inputs]
        return graph.insert_opr(Concat(ins, ConcatParam(axis), opr.config))[0]

    def spatial_reduce(opr) -> bool:
        """Whether ``opr`` reduces an NCHW88 var (N, C, H, W) over H or W."""
        if opr.type_name != "Reduce" or len(opr.inputs) != 1 or opr.extra_deps:
            return False
        # a negative axis would count from the blocked var's end: its 8 channels
        return opr.inputs[0] in blocked and opr.param.axis in (2, 3)

    flat: dict[VarNode, VarNode] = {}  # a pooling chain's (N, C, H*W) -> (N, C/8, H*W, 8)
    pooled: dict[VarNode, VarNode] = {}  # its Reduce's (N, C, 1) -> (N, C/8, 1, 8)
    for opr in rw.oprs:
        with inherit_props(graph, opr):
            v = opr.inputs[0] if opr.inputs else None
            if pooling_chain(opr):
                n, c, hw = static_shape(opr.outputs[0])
                flat[opr.outputs[0]] = reshape(SymbolVar(blocked[v]), (n, c // 8, hw, 8)).node
                continue
            if v in flat:  # the chain's Reduce
                pooled[opr.outputs[0]] = graph.insert_opr(opr.clone([flat[v]]))[0]
                continue
            if v in pooled:  # the chain's reshape to (N, C, 1, 1)
                n, c = static_shape(opr.outputs[0])[:2]
                blocked[opr.outputs[0]] = reshape(SymbolVar(pooled[v]), (n, c // 8, 1, 1, 8)).node
                continue
            if spatial_reduce(opr):  # the same axis of (N, C/8, H, W, 8)
                blocked[opr.outputs[0]] = graph.insert_opr(opr.clone([blocked[v]]))[0]
                continue
            wmode = _conv_weight_mode(opr)
            if wmode is not None:
                new = convert_conv(opr, wmode)
            else:
                new = convert_elemwise(opr)
                for convert in (convert_pooling, convert_concat):
                    new = convert(opr) if new is None else new
            if new is not None:
                blocked[opr.outputs[0]] = new
                continue
            keep_nchw(rw, opr, nchw)
    return finish_blocked(rw, dest, blocked, nchw, "NCHW88")


def keep_nchw(rw: Rewriter, opr, nchw) -> None:
    """A layout pass's operator left as it is: rebuilt over its inputs read in NCHW
    (``nchw(var)``: a blocked one read back once)."""
    for v in (*opr.inputs, *opr.extra_deps):
        nchw(v)
    for old, rebuilt in zip(opr.outputs, rw.rebuild(opr)):
        rw.replace(old, rebuilt)


def finish_blocked(rw: Rewriter, dest, blocked: dict, nchw, layout: str) -> VarMap:
    """A layout pass's var map: the outputs read back in NCHW (``nchw``), those computed
    blocked (in ``blocked``) so marked."""
    for v in dest:
        nchw(v)
    varmap = rw.varmap
    for v in dest:
        if v in blocked:
            varmap.reasons[v] = f"computed in {layout}"
    return varmap


@register_pass("fuse_pool_end_padding")
def fuse_pool_end_padding(graph, dest: list[VarNode]) -> dict:
    """The compile-time pass (after the JIT's): an NCHW88 MAX Pooling whose source is the
    ONNX importer's ceil-mode padding of a var, Concats along H and/or W of the var and
    constants of ``-inf`` (nothing else reading the Concats; no more padding before the var
    than after it), becomes one :class:`~megbrain.opr.dnn_pool.PoolingEndPad` of the var:
    the padding before the var and as much after it go to the pooling's own, the rest to
    its end padding; the windows there take the image's taps, and no copy of the whole
    activation is made."""
    oprs = dep_oprs(dest)
    readers, external = _readers(graph, oprs, dest)
    ends: dict = {}  # Pooling -> (its unpadded source, its param, the Concats dropped)
    for o in oprs:
        if type(o) is not Pooling or o.extra_deps:
            continue
        p = o.param
        if p.format != "NCHW88" or p.mode != "MAX":
            continue
        v, before, after, dropped, reader = o.inputs[0], [0, 0], [0, 0], [], o
        while True:
            c = v.owner
            if c.type_name != Concat.type_name or c.extra_deps or c.param.axis not in (2, 3):
                break
            ax = c.param.axis - 2
            if before[ax] or after[ax] or v in external or readers.get(v) != [reader]:
                break
            inner = [i for i in c.inputs if not _all_lowest(i)]
            shapes = [static_shape(i) for i in c.inputs]
            if len(inner) != 1 or any(sh is None for sh in shapes):
                break
            k = list(c.inputs).index(inner[0])
            before[ax] = sum(sh[ax + 2] for sh in shapes[:k])
            after[ax] = sum(sh[ax + 2] for sh in shapes[k + 1 :])
            dropped.append(c)
            v, reader = inner[0], c
        src = static_shape(v)
        # the padding before goes to the pooling's own (symmetric), the rest after to its end
        pad = [q + b for q, b in zip(p.pad, before)]
        end = [a - b for a, b in zip(after, before)]
        if not dropped or src is None or min(end) < 0:
            continue
        try:
            pool_nchw88_shape(src, p.window, p.stride, pad, end)
        except ValueError:
            continue
        fields = {f: getattr(p, f) for f in p.__dataclass_fields__}
        fields.update(pad_h=pad[0], pad_w=pad[1], end_h=end[0], end_w=end[1])
        ends[o] = (v, PoolingEndPadParam(**fields), dropped)
    if not ends:
        return {}

    def fused(o, memo: dict) -> tuple[VarNode, VarNode]:
        v, param, _ = ends[o]
        new = PoolingEndPad([memo.get(v, v)], param, OperatorNodeConfig(comp_node=o.comp_node))
        return o.outputs[0], graph.insert_opr(new)[0]

    skip = {c for _, _, dropped in ends.values() for c in dropped}
    return _sweep(graph, oprs, skip, {o: fused for o in ends})


@register_pass("fuse_channel_shuffle")
def fuse_channel_shuffle(graph, dest: list[VarNode]) -> dict:
    """The compile-time pass: ShuffleNet's channel shuffle of a concatenation, a Concat of
    ``G`` float32 4-d inputs of one shape along the channels, reshaped to ``(N, G, C, H, W)``, the
    axes 1 and 2 swapped (Dimshuffle) and reshaped back to ``(N, G C, H, W)`` (the last
    Reshape a copy), becomes one :class:`~megbrain.opr.tensor_manip.ChannelShuffleConcat`
    (nothing else reading the Concat, the first Reshape or the Dimshuffle): its inputs'
    parts of the output are strided views that a ConvBias producing one writes in place
    (the memory plan), so only the other inputs are copied, once.

    The same shuffle of two NCHW88 vars (``use_nchw88`` left it between RelayoutFormats:
    the Concat read back in NCHW, shuffled, and its channel ranges converted to NCHW88
    again) becomes one ChannelShuffleConcat in NCHW88 when every reader of the shuffled
    var converts it, whole or a range of whole blocks (a Subtensor), back to NCHW88: those
    conversions become the operator's output and views of its blocks."""
    oprs = dep_oprs(dest)
    readers, external = _readers(graph, oprs, dest)

    def only_reader(v: VarNode, type_name: str):
        got = readers.get(v, [])
        if v in external or len(got) != 1 or got[0].type_name != type_name:
            return None
        return None if got[0].extra_deps else got[0]

    def shuffled(v: VarNode, g: int):
        """The Reshape, Dimshuffle and Reshape shuffling ``v`` (N, C, H, W) in ``g`` groups,
        or None."""
        n, c, h, w = static_shape(v)
        r1 = only_reader(v, Reshape.type_name)
        if r1 is None or static_shape(r1.outputs[0]) != (n, g, c // g, h, w):
            return None
        d = only_reader(r1.outputs[0], Dimshuffle.type_name)
        if d is None or d.param.pattern != (0, 2, 1, 3, 4):
            return None
        r2 = only_reader(d.outputs[0], Reshape.type_name)
        if r2 is None or static_shape(r2.outputs[0]) != (n, c, h, w):
            return None
        return r1, d, r2

    found: dict = {}  # the last Reshape -> the Concat
    to_blocked: dict = {}  # a RelayoutFormat to NCHW88 -> (the NCHW88 Concat, its blocks)
    read_back: dict = {}  # the last Reshape of an NCHW88 shuffle also read in NCHW -> Concat
    dropped: set = set()
    for o in oprs:
        if type(o) is not Concat or o.extra_deps or len(o.inputs) < 2:
            continue
        shapes = [static_shape(v) for v in o.inputs]
        out = static_shape(o.outputs[0])
        # float32 only: the float ConvBias kernels are the ones checked on strided outputs
        if out is None or o.outputs[0].dtype != _F32 or any(sh != shapes[0] for sh in shapes):
            continue
        if len(out) == 4 and o.param.axis % 4 == 1:
            chain = shuffled(o.outputs[0], len(shapes))
            if chain is not None:
                found[chain[2]] = o
                dropped.update((o, *chain[:2]))
            continue
        if len(out) != 5 or out[4] != 8 or o.param.axis % 5 != 1 or len(shapes) != 2:
            continue
        back = only_reader(o.outputs[0], RelayoutFormat.type_name)
        if back is None or back.param.mode != "NCHW88_NCHW":
            continue
        chain = shuffled(back.outputs[0], 2)
        if chain is None:
            continue
        r2 = chain[2]
        ranges = _block_reads(r2.outputs[0], readers)
        for conversion, blocks in ranges.items():
            to_blocked[conversion] = (o, blocks)
        # the Subtensors the conversions read (or the last Reshape, for a whole one)
        dropped.update((o, back, *chain[:2], *(conv.inputs[0].owner for conv in ranges)))
        read = {conv.inputs[0].owner for conv in ranges} | set(ranges)
        others = [x for x in readers.get(r2.outputs[0], []) if x not in read]
        if others or r2.outputs[0] in external:
            read_back[r2] = o  # also read in NCHW: the fused output converted back once
            dropped.discard(r2)
    if not found and not to_blocked and not read_back:
        return {}

    made: dict = {}  # a Concat -> its ChannelShuffleConcat's output (made once)

    def shuffle(cat, memo: dict) -> VarNode:
        if cat not in made:
            new = ChannelShuffleConcat([memo.get(v, v) for v in cat.inputs], cat.param,
                                       OperatorNodeConfig(comp_node=cat.comp_node))  # fmt: skip
            made[cat] = graph.insert_opr(new)[0]
        return made[cat]

    def fused(r2, memo: dict) -> tuple[VarNode, VarNode]:
        return r2.outputs[0], shuffle(found[r2], memo)

    def fused_blocked(conversion, memo: dict) -> tuple[VarNode, VarNode]:
        cat, blocks = to_blocked[conversion]
        out = shuffle(cat, memo)
        if blocks is not None:
            out = subtensor_getitem(SymbolVar(out), (slice(None), slice(*blocks))).node
        return conversion.outputs[0], out

    def fused_read_back(r2, memo: dict) -> tuple[VarNode, VarNode]:
        out = shuffle(read_back[r2], memo)
        return r2.outputs[0], relayout_format(SymbolVar(out), mode="NCHW88_NCHW").node

    makers = {r2: fused for r2 in found} | {c: fused_blocked for c in to_blocked}
    makers |= {r2: fused_read_back for r2 in read_back}
    return _sweep(graph, oprs, dropped, makers)


def _block_reads(v: VarNode, readers: dict) -> dict:
    """The readers of ``v`` (N, C, H, W) that convert it back to NCHW88, whole
    (RelayoutFormat NCHW_NCHW88) or a range of whole 8-channel blocks (a Subtensor of
    constant bounds on the channels, read by nothing but that conversion): each conversion
    -> its blocks ``(begin, end)``, or None for the whole var."""
    shape = static_shape(v)
    got: dict = {}
    for r in readers.get(v, []):
        if r.extra_deps or r.inputs[0] is not v:
            continue
        if r.type_name == RelayoutFormat.type_name and r.param.mode == "NCHW_NCHW88":
            got[r] = None
            continue
        if r.type_name != Subtensor.type_name:
            continue
        conv = readers.get(r.outputs[0], [])
        if len(conv) != 1 or conv[0].type_name != RelayoutFormat.type_name:
            continue
        if conv[0].param.mode != "NCHW_NCHW88" or conv[0].extra_deps:
            continue
        values = [infer_value(i) for i in r.inputs[1:]]
        if any(x is None for x in values):
            continue
        idx = r._index(shape, values)
        spans = [range(n)[i] if isinstance(i, slice) else None for n, i in zip(shape, idx)]
        if any(s != range(n) for k, (n, s) in enumerate(zip(shape, spans)) if k != 1):
            continue
        c = spans[1]
        if c is None or c.step != 1 or not len(c) or c.start % 8 or c.stop % 8:
            continue
        got[conv[0]] = (c.start // 8, c.stop // 8)
    return got


def _all_lowest(var: VarNode) -> bool:
    """Whether ``var`` is a float32 constant of ``-inf`` only (the importer's MAX padding)."""
    owner = var.owner
    value = getattr(owner, "value", None)
    return (
        owner.type_name == "ImmutableTensor"
        and isinstance(value, np.ndarray)
        and value.dtype == np.float32
        and bool(np.all(value == -np.inf))
    )


def _separable_parts(pw, readers: dict, external: set):
    """``(the depthwise ConvBias, its tail)`` when ``pw`` is an NCHW88 float32 dense 1x1
    stride-1 unpadded ConvBias (its activation one the kernels apply, a per-channel bias)
    whose source is the output of a channel-wise NCHW88 float32 ConvBias or ConvBiasTail
    (no ``z``, a per-channel bias) that nothing else reads; else None."""
    if type(pw) is not ConvBias or pw.extra_deps:
        return None
    p, fshape, bshape = pw.param, static_shape(pw.inputs[1]), static_shape(pw.inputs[2])
    if p.format != "NCHW88" or p.sparse != "DENSE":
        return None
    if (p.pad_h, p.pad_w, p.stride_h, p.stride_w) != (0, 0, 1, 1) or fshape is None:
        return None
    if tuple(fshape[2:4]) != (1, 1) or p.nonlineMode not in ("IDENTITY", "RELU", "H_SWISH"):
        return None
    y = pw.inputs[0]
    dw = y.owner
    if type(dw) not in (ConvBias, ConvBiasTail) or dw.extra_deps or len(dw.inputs) != 3:
        return None
    if y in external or readers.get(y) != [pw] or any(v is y for v in pw.inputs[1:]):
        return None
    q, dshape = dw.param, static_shape(dw.inputs[1])
    if q.format != "NCHW88" or q.sparse != "GROUP" or dshape is None or len(dshape) != 6:
        return None
    if q.nonlineMode not in ("IDENTITY", "RELU", "H_SWISH") or dw.comp_node != pw.comp_node:
        return None
    shapes = [static_shape(v) for v in (y, dw.inputs[2])]
    per_channel = [None if sh is None else (1, sh[1], 1, 1, sh[4]) for sh in shapes[:1]]
    if shapes[1] is None or tuple(shapes[1]) != per_channel[0] or bshape is None:
        return None
    if len(bshape) != 5 or bshape[2:4] != (1, 1):
        return None
    if any(v.dtype != _F32 for v in (*pw.inputs, *dw.inputs)):
        return None
    return dw, dw.param.tail if type(dw) is ConvBiasTail else ""


@register_pass("fuse_depthwise_pointwise")
def fuse_depthwise_pointwise(graph, dest: list[VarNode]) -> dict:
    """The compile-time pass (after ``fuse_conv_bias_tail``): a channel-wise NCHW88 float32
    ConvBias (or ConvBiasTail) whose output only a dense 1x1 stride-1 NCHW88 ConvBias reads,
    as its source (a mobile net's depthwise layer and projection), becomes one
    :class:`~megbrain.opr.dnn_conv_bias.SeparableConvBias`, computed by one kernel with the
    intermediate in each thread's cache (DEPTHWISE_POINTWISE_NCHW88)."""
    oprs = dep_oprs(dest)
    readers, external = _readers(graph, oprs, dest)
    found = {}
    for o in oprs:
        parts = _separable_parts(o, readers, external)
        if parts is not None:
            found[o] = parts

    if not found:
        return {}

    def fused(pw, memo: dict) -> tuple[VarNode, VarNode]:
        dw, tail = found[pw]
        fields = {f.name: getattr(pw.param, f.name) for f in dataclasses.fields(ConvBias.Param)}
        dwp = ConvBias.Param(**{f.name: getattr(dw.param, f.name)
                                for f in dataclasses.fields(ConvBias.Param)})  # fmt: skip
        param = SeparableConvBiasParam(**fields, dw=dwp, dw_tail=tail or "")
        ins = [memo.get(v, v) for v in (dw.inputs[0], *pw.inputs[1:], *dw.inputs[1:])]
        new = SeparableConvBias(ins, param, OperatorNodeConfig(comp_node=pw.comp_node))
        return pw.outputs[0], graph.insert_opr(new)[0]

    skip = {dw for dw, _ in found.values()}
    return _sweep(graph, oprs, skip, {pw: fused for pw in found})
