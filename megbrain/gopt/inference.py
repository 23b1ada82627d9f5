"""``optimize_for_inference``: the inference passes, applied in the order of
:data:`INFERENCE_PRESET` (the reference's preset for inference), read top to bottom:

1. ``expand_batch_norm``: BatchNorm in INFERENCE mode becomes ``x * k + b``, ``k`` and ``b``
   computed from its parameters;
2. ``remove_non_computing``: MarkNoBroadcastElemwise, SetGrad and Identity are dropped;
3. ``expand_fused_arith``: FUSE_MUL_ADD3/4 and FUSE_ADD_<act> become plain operators;
4. ``normalize_affine_chain``: a chain of ADD/SUB/MUL/TRUE_DIV/NEGATE applying parameters to
   one var becomes ``x * K + B`` (this is how the elementwise batch normalization of
   ``nn.BatchNorm2d`` in eval mode, ``(x - mean) / sqrt(var + eps) * gamma + beta``, and a
   convolution's own bias reach their folded form);
5. ``fold_conv_scale``: ``convolution(x, w) * K`` with a per-output-channel parameter ``K``
   becomes ``convolution(x, w * K)``;
6. ``param_fuse``: every var computed only from parameters (SharedDeviceTensor, which
   SharedScalar vars are too) and constants becomes a new SharedDeviceTensor holding its
   value now (ImmutableTensor when it depends on constants only);
7. ``reorder_arith_chain``: ADD/MUL/MAX/MIN chains reduced parameters first, then by size;
8. ``arith_fuse``: ``act(a + b)`` becomes FUSE_ADD_<act>, products in sums FUSE_MUL_ADD3/4;
9. ``reorder_arith_chain`` again, ``remove_redundant_typecvt``, ``param_fuse`` again;
10. ``fuse_conv_bias_nonlinearity`` (flag): ``act(convolution(x, w) + b)`` becomes ConvBias;
11. ``fuse_conv_bias_with_z`` (flag): ``act(convolution(x, w) + z)`` with ``z`` of the
    output's shape becomes ConvBias with ``z`` as its bias, ``act(conv_bias(x, w, b) + z)``
    (an IDENTITY ConvBias read once; ``act(conv_bias(x, w, z) + b)`` with a per-channel ``b``
    alike) the four-input ``conv_bias(x, w, b, z)`` with ``act``;
12. ``use_nchw88`` (flag): the convolutions and the elementwise operators between them
    compute in the channel-blocked NCHW88 layout (:mod:`megbrain.gopt.nchw88`); or
    ``use_nchw4`` (flag): the int8 convolutions and the operators between them in NCHW4
    (:mod:`megbrain.gopt.nchw4`);
13. ``convert_f16_io`` (``f16_io_comp`` / ``f16_io_f32_comp``): float32 vars become float16,
    the outputs are converted back to float32;
14. ``param_fuse`` again: the parameters converted to float16 or NCHW88 and the ConvBias
    biases;
15. ``param_merge``: every SharedDeviceTensor becomes an output of one
    MultipleDeviceTensorHolder.

A pass is ``f(graph, dest, options) -> {old var: new var}``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from ..errors import MegBrainError
from ..graph import InferType, OperatorNodeConfig, VarNode, static_shape
from ..graph.static_infer import Inferer
from ..opr.base import SymbolVar, as_var
from ..opr.basic_arith import elemwise, typecvt
from ..opr.dnn import Convolution, ConvolutionParam
from ..opr.dnn_conv_bias import ConvBias, ConvBiasParam
from ..opr.dnn_norm import BatchNorm
from ..opr.io import (
    ImmutableTensor,
    MultipleDeviceTensorHolder,
    make_immutable,
    shared_device_tensor,
)
from ..opr.tensor_manip import broadcast, reshape
from .framework import (
    INFERENCE_PRESET,
    PASSES,
    _record,
    inference_preset,
    register_pass,
    run_passes,
)
from .nchw4 import use_nchw4
from .nchw88 import use_nchw88
from .passes import (
    FUSE_ADD_ACTS,
    Rewriter,
    VarMap,
    _chain_root,
    chain_terms,
    combine,
    inherit_props,
    reorder_const_chain,
)

__all__ = [
    "INFERENCE_PASSES",
    "INFERENCE_PRESET",
    "InferenceOptions",
    "optimize_for_inference",
    "LAYOUT_FLAGS",
]

#: the layout flags of the reference; of them, ``use_nchw88`` and ``use_nchw4`` are implemented
LAYOUT_FLAGS = (
    "use_nhwcd4", "use_nchw32", "use_nchw4", "use_nchw88", "use_nchw44", "use_nchw44_dot",
    "use_chwn4",
)  # fmt: skip

_F16, _F32 = np.dtype(np.float16), np.dtype(np.float32)
_SOURCES = ("SharedDeviceTensor", "ImmutableTensor")
_AFFINE = ("ADD", "SUB", "MUL", "TRUE_DIV", "NEGATE")
#: Elemwise activation -> ConvBias nonlineMode; FUSE_ADD_<act> -> the same with a bias
_ACT = {"RELU": "RELU", "SIGMOID": "SIGMOID", "H_SWISH": "H_SWISH"}
_ADD_ACT = {"ADD": "IDENTITY", "FUSE_ADD_RELU": "RELU", "FUSE_ADD_SIGMOID": "SIGMOID",
            "FUSE_ADD_H_SWISH": "H_SWISH"}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class InferenceOptions:
    """The options of :func:`optimize_for_inference` that select passes."""

    f16_io_f32_comp: bool = False
    f16_io_comp: bool = False
    fuse_conv_bias_nonlinearity: bool = False
    fuse_conv_bias_with_z: bool = False
    use_nchw88: bool = False
    use_nchw4: bool = False


#: the one pass registry (:data:`megbrain.gopt.framework.PASSES`), under its former name
INFERENCE_PASSES = PASSES


# ---- what is a parameter -----------------------------------------------------------------
class ParamOnly:
    """Whether a var is computed from parameters and constants only (memoized per opr).

    Sources qualify when they are SharedDeviceTensor (not volatile) or ImmutableTensor;
    other operators when they are deterministic, side-effect free and all their inputs
    qualify (an input read for its shape only qualifies by a CONST shape).
    """

    def __init__(self):
        self.memo: dict = {}

    def __call__(self, v: VarNode) -> bool:
        return self.opr(v.owner)

    def opr(self, root) -> bool:
        memo = self.memo
        stack = [root]
        while stack:
            o = stack[-1]
            if o in memo:
                stack.pop()
                continue
            if not o.inputs:
                memo[o] = o.type_name in _SOURCES
                stack.pop()
                continue
            if (
                o.has_side_effect
                or not o.value_inferable
                or o.extra_deps
                or any(v.value_type == InferType.MISSING for v in o.outputs)
            ):
                memo[o] = False
                stack.pop()
                continue
            deps = [
                v.owner
                for i, v in enumerate(o.inputs)
                if not (i in o.shape_only_inputs and v.shape_type == InferType.CONST)
            ]
            todo = [d for d in deps if d not in memo]
            if todo:
                stack.extend(todo)
                continue
            memo[o] = all(memo[d] for d in deps)
            stack.pop()
        return memo[root]


def _channel_dim(shape, oc: int) -> int | None:
    """C when ``shape`` broadcasts against (N, oc, H, W) as (1, C, 1, 1) with C in {1, oc}."""
    if shape is None or len(shape) > 4:
        return None
    s = (1,) * (4 - len(shape)) + tuple(shape)
    if s[0] != 1 or s[2] != 1 or s[3] != 1 or s[1] not in (1, oc):
        return None
    return s[1]


def _sv(v: VarNode) -> SymbolVar:
    return SymbolVar(v)


def _const(like: VarNode, value: float) -> VarNode:
    return make_immutable(like.comp_node, like.graph, np.array([value], like.dtype)).node


def _is_conv(v: VarNode, rw: Rewriter) -> bool:
    """Whether ``v`` is an NCHW ConvolutionForward output of static shape, read only once."""
    o = v.owner
    if o.type_name != Convolution.type_name or o.param.format != "NCHW" or o.extra_deps:
        return False
    shape = static_shape(v)
    return shape is not None and len(shape) == 4 and rw.sole_reader(v)


# ---- 1. BatchNorm in inference mode ------------------------------------------------------
@register_pass("expand_batch_norm")
def expand_batch_norm(graph, dest, options):
    """``y = (x - mean) / sqrt(var + eps) * scale + bias`` becomes ``x * k + b`` with
    ``k = scale / sqrt(var + eps)`` and ``b = bias - mean * k``."""

    def rule(opr):
        if opr.type_name != BatchNorm.type_name or opr.param.fwd_mode != "INFERENCE":
            return None
        x, scale, bias, mean, var = opr.inputs
        y = opr.outputs[4]
        k = _sv(scale) / _sqrt(_sv(var) + opr.param.epsilon)
        b = _sv(bias) - _sv(mean) * k
        if k.dtype != x.dtype:
            k, b = typecvt(k, x.dtype), typecvt(b, x.dtype)
        new = (_sv(x) * k + b).node
        if static_shape(new) != static_shape(y):
            return None
        return [None, None, None, None, new]

    return Rewriter(graph, dest).apply(rule, "BatchNorm folded into x * k + b")


def _sqrt(x: SymbolVar) -> SymbolVar:
    """``x ** 0.5``."""
    return elemwise(x, 0.5, mode="POW")


# ---- 2. affine chains --------------------------------------------------------------------
@register_pass("normalize_affine_chain")
def normalize_affine_chain(graph, dest, options):
    """A chain applying parameters ``p`` to one var ``x`` through ADD, SUB, MUL, TRUE_DIV
    (by ``p``) and NEGATE becomes ``x * K + B``, K and B computed from the parameters."""
    rw = Rewriter(graph, dest)
    is_param = ParamOnly()

    def step(opr):
        """(carrier index, param var) when ``opr`` applies a parameter to one var."""
        if opr.type_name != "Elemwise" or opr.param.mode not in _AFFINE or opr.extra_deps:
            return None
        if opr.outputs[0].dtype.kind != "f":
            return None
        if opr.param.mode == "NEGATE":
            return (0, None) if not is_param(opr.inputs[0]) else None
        a, b = opr.inputs
        pa, pb = is_param(a), is_param(b)
        if pa == pb or (opr.param.mode == "TRUE_DIV" and pa):
            return None
        return (1, a) if pa else (0, b)

    def absorbed(v: VarNode) -> bool:
        rs = rw.readers_of(v)
        if not rw.sole_reader(v):
            return False
        st = step(rs[0])
        return st is not None and rs[0].inputs[st[0]] is rw.original(v)

    def rule(opr):
        if step(opr) is None or absorbed(opr.outputs[0]):
            return None
        chain, node = [], opr
        while True:
            ci, p = step(node)
            chain.append((node.param.mode, ci, p))
            x = node.inputs[ci]
            if step(x.owner) is None or not rw.sole_reader(x):
                break
            node = x.owner
        if len(chain) == 1 and chain[0][0] in ("ADD", "MUL"):
            return None  # already x * K or x + B
        k = b = None  # y = x * k + b; None is 1 and 0
        for mode, ci, p in reversed(chain):
            if mode == "ADD":
                b = p if b is None else combine("ADD", [b, p])
            elif mode == "SUB" and ci == 0:
                b = _neg(p) if b is None else combine("SUB", [b, p])
            elif mode == "SUB":  # p - y
                k = _const(x, -1.0) if k is None else _neg(k)
                b = p if b is None else combine("SUB", [p, b])
            elif mode == "MUL":
                k = p if k is None else combine("MUL", [k, p])
                b = None if b is None else combine("MUL", [b, p])
            elif mode == "TRUE_DIV":
                k = combine("TRUE_DIV", [_const(x, 1.0) if k is None else k, p])
                b = None if b is None else combine("TRUE_DIV", [b, p])
            else:  # NEGATE
                k = _const(x, -1.0) if k is None else _neg(k)
                b = None if b is None else _neg(b)
        new = x
        if k is not None:
            new = combine("MUL", [new, k])
        if b is not None:
            new = combine("ADD", [new, b])
        if static_shape(new) != static_shape(opr.outputs[0]):
            return None
        return [new]

    return rw.apply(rule, "affine chain normalized to x * K + B")


def _neg(v: VarNode) -> VarNode:
    return elemwise(_sv(v), mode="NEGATE").node


# ---- 3. per-channel scale into the convolution's filter ----------------------------------
@register_pass("fold_conv_scale")
def fold_conv_scale(graph, dest, options):
    """``convolution(x, w) * K`` with K a per-output-channel parameter becomes
    ``convolution(x, w * K)`` (K reshaped along the filter's output channels)."""
    rw = Rewriter(graph, dest)
    is_param = ParamOnly()

    def rule(opr):
        if opr.type_name != "Elemwise" or opr.param.mode != "MUL" or opr.extra_deps:
            return None
        for c, k in (opr.inputs, opr.inputs[::-1]):
            if _is_conv(c, rw) and is_param(k) and is_param(c.owner.inputs[1]):
                break
        else:
            return None
        conv = c.owner
        src, w = conv.inputs
        oc = static_shape(c)[1]
        ch = _channel_dim(static_shape(k), oc)
        wshape = static_shape(w)
        if ch is None or wshape is None:
            return None
        if conv.param.sparse == "GROUP":
            kshape = (wshape[0], wshape[1], 1, 1, 1) if ch == oc else (1,) * 5
        else:
            kshape = (ch, 1, 1, 1)
        new_w = (_sv(w) * reshape(_sv(k), kshape)).node
        new = graph.insert_opr(conv.clone([src, new_w]))[0]
        if static_shape(new) != static_shape(opr.outputs[0]):
            return None
        return [new]

    return rw.apply(rule, "per-channel scale folded into the convolution filter")


# ---- 4. ParamFuse ------------------------------------------------------------------------
@register_pass("param_fuse")
def param_fuse(graph, dest, options):
    """Each var computed from parameters only and read by other computation (or an output)
    becomes a new SharedDeviceTensor holding its current value (ImmutableTensor when its
    value is CONST)."""
    rw = Rewriter(graph, dest)
    is_param = ParamOnly()
    inf = Inferer()

    def rule(opr):
        if not opr.inputs or not is_param.opr(opr):
            return None
        out = []
        for v in opr.outputs:
            if all(r is not None and is_param.opr(r) for r in rw.readers_of(v)):
                out.append(None)  # read only by other parameter computation
                continue
            out.append(_param_var(graph, v, np.array(inf.value(v))))
        return out

    return rw.apply(rule, "parameters fused")


def _param_var(graph, v: VarNode, val: np.ndarray) -> VarNode:
    name = f"fuse({v.name})"
    if len(name) > 64:
        name = name[:60] + "...)"
    dev = None
    if v.value_type != InferType.CONST:
        from ..tensor import DeviceTensorND

        try:
            dev = DeviceTensorND.from_ndarray(val, comp_node=v.comp_node, dtype=v.dtype)
        except MegBrainError:  # a dtype device tensors do not take (float64 below the API)
            dev = None
    if dev is None:
        cfg = OperatorNodeConfig(name=name)
        return graph.insert_opr(ImmutableTensor(val, v.comp_node, cfg))[0]
    return shared_device_tensor(graph, dev, name=name).node


# ---- 5. ConvBias fusion ------------------------------------------------------------------
def _conv_bias(conv, bias: VarNode, mode: str) -> VarNode:
    fields = {f.name: getattr(conv.param, f.name) for f in dataclasses.fields(ConvolutionParam)}
    param = ConvBiasParam(**fields, nonlineMode=mode)
    src, w = conv.inputs
    return conv.graph.insert_opr(ConvBias([src, w, bias], param, conv.config))[0]


def _per_channel_bias(b: VarNode, oc: int) -> VarNode | None:
    """``b`` as the (1, OC, 1, 1) bias of ConvBias, or None when it is not per channel."""
    shape = static_shape(b)
    ch = _channel_dim(shape, oc)
    if ch is None:
        return None
    if tuple(shape) == (1, oc, 1, 1):
        return b
    return broadcast(reshape(_sv(b), (1, ch, 1, 1)), (1, oc, 1, 1)).node


@register_pass("fuse_conv_bias_nonlinearity")
def fuse_conv_bias_nonlinearity(graph, dest, options):
    """``act(convolution(x, w) + b)`` with a per-channel ``b`` becomes ``ConvBias`` (act is
    RELU, SIGMOID, H_SWISH or none; a FUSE_ADD_<act> is matched too)."""
    rw = Rewriter(graph, dest)

    def rule(opr):
        if opr.type_name != "Elemwise" or opr.extra_deps:
            return None
        mode = opr.param.mode
        if mode in _ADD_ACT:
            for c, b in (opr.inputs, opr.inputs[::-1]):
                if _is_conv(c, rw):
                    bias = _per_channel_bias(b, static_shape(c)[1])
                    if bias is not None:
                        return [_conv_bias(c.owner, bias, _ADD_ACT[mode])]
            return None
        if mode in _ACT:
            (c,) = opr.inputs
            o = c.owner
            if (
                o.type_name == ConvBias.type_name
                and o.param.nonlineMode == "IDENTITY"
                and (rw.sole_reader(c) and not o.extra_deps)
            ):
                src, w, bias = o.inputs
                return [_conv_bias_from(o, [src, w, bias], _ACT[mode])]
            if _is_conv(c, rw):
                zero = make_immutable(
                    c.comp_node, graph, np.zeros((1, static_shape(c)[1], 1, 1), c.dtype)
                ).node
                return [_conv_bias(o, zero, _ACT[mode])]
        return None

    return rw.apply(rule, "convolution, bias and nonlinearity fused into ConvBias")


def _conv_bias_from(cb, inputs, mode: str) -> VarNode:
    param = dataclasses.replace(cb.param, nonlineMode=mode)
    return cb.graph.insert_opr(ConvBias(list(inputs), param, cb.config))[0]


# ---- 6. ConvBias with z ------------------------------------------------------------------
@register_pass("fuse_conv_bias_with_z")
def fuse_conv_bias_with_z(graph, dest, options):
    """``act(convolution(x, w) + z)`` with ``z`` of the output's shape becomes ConvBias with
    ``z`` as its (full-shape) bias; ``act(conv_bias(x, w, b) + z)``, the ConvBias IDENTITY
    with three inputs and read once, becomes ``conv_bias(x, w, b, z)`` with ``act``."""
    rw = Rewriter(graph, dest)

    def rule(opr):
        if opr.type_name != "Elemwise" or opr.param.mode not in _ADD_ACT or opr.extra_deps:
            return None
        mode = _ADD_ACT[opr.param.mode]
        for c, z in (opr.inputs, opr.inputs[::-1]):
            out = static_shape(c)
            zs = static_shape(z)
            if out is None or zs is None:
                continue
            if zs == out and _is_conv(c, rw):
                return [_conv_bias(c.owner, z, mode)]
            o = c.owner
            if not (
                o.type_name == ConvBias.type_name
                and o.param.format == "NCHW"
                and o.param.nonlineMode == "IDENTITY"
                and len(o.inputs) == 3
                and not o.extra_deps
                and rw.sole_reader(c)
            ):
                continue
            src, w, bias = o.inputs
            if zs == out:  # act(conv + b + z)
                return [_conv_bias_from(o, [src, w, bias, z], mode)]
            per_channel = _per_channel_bias(z, out[1]) if len(out) == 4 else None
            if per_channel is not None and static_shape(bias) == out:
                # act((conv + z) + b) with a per-channel b: the bias is b, z the sum's
                # other term (the sum reassociated, as reorder_arith_chain does)
                return [_conv_bias_from(o, [src, w, per_channel, bias], mode)]
        return None

    return rw.apply(rule, "convolution and z fused into ConvBias")


register_pass("use_nchw88")(use_nchw88)
register_pass("use_nchw4")(use_nchw4)


# ---- 7. float16 --------------------------------------------------------------------------
@register_pass("convert_f16_io")
def convert_f16_io(graph, dest, options):
    """Every float32 var becomes float16: float32 sources and the outputs of operators that
    can not take float16 are converted by TypeCvt, TypeCvt to float32 converts to float16,
    and with ``f16_io_f32_comp`` convolutions and matrix multiplications compute in float32
    (``compute_mode=FLOAT32``). Outputs are converted back to their dtype."""
    rw = Rewriter(graph, dest, allow_dtype_change=True)
    f32_comp = options.f16_io_f32_comp

    def to16(v: VarNode) -> VarNode:
        return typecvt(_sv(v), _F16).node if v.dtype == _F32 else v

    for opr in rw.oprs:
        ins = [rw.get(v) for v in opr.inputs]
        with inherit_props(graph, opr):
            if opr.type_name == "TypeCvt" and opr.param.dtype == _F32:
                outs = [typecvt(_sv(ins[0]), _F16).node]
            else:
                outs = _rebuild_f16(rw, opr, ins, f32_comp)
            outs = [to16(v) for v in outs]
        for old, new in zip(opr.outputs, outs):
            rw.replace(old, new, "float32 computed in float16")
    varmap = VarMap()
    for v in dest:
        new = rw.get(v)
        if new.dtype != v.dtype:
            new = typecvt(_sv(new), v.dtype).node
        if new is not v:
            varmap[v] = new
            varmap.reasons[v] = "float16 output converted back"
    return varmap


def _rebuild_f16(rw: Rewriter, opr, ins: list[VarNode], f32_comp: bool) -> list[VarNode]:
    param = opr.param
    if f32_comp and dataclasses.is_dataclass(param) and hasattr(param, "compute_mode"):
        param = dataclasses.replace(param, compute_mode="FLOAT32")
    extra = [rw.get(v) for v in opr.extra_deps]
    if (
        param is opr.param
        and all(a is b for a, b in zip(ins, opr.inputs))
        and all(a is b for a, b in zip(extra, opr.extra_deps))
    ):
        return opr.outputs
    new = opr.clone(ins)
    new.param, new.extra_deps = param, extra
    try:
        return rw.graph.insert_opr(new)
    except MegBrainError:
        # the operator does not take float16: run it on float32 inputs
        ins32 = [
            typecvt(_sv(a), _F32).node if a.dtype == _F16 and b.dtype == _F32 else a
            for a, b in zip(ins, opr.inputs)
        ]
        new = opr.clone(ins32)
        new.extra_deps = extra
        return rw.graph.insert_opr(new)


# ---- markers, fused arithmetic -------------------------------------------------------------
#: operators that only mark their input (for gradients or broadcasting): the identity here
_NON_COMPUTING = ("MarkNoBroadcastElemwise", "SetGrad", "Identity")


@register_pass("remove_non_computing")
def remove_non_computing(graph, dest, options):
    """MarkNoBroadcastElemwise, SetGrad and Identity are replaced by their input (the
    reference's RemoveNonComputingOprPass)."""
    rw = Rewriter(graph, dest)

    def rule(opr):
        if opr.type_name not in _NON_COMPUTING or opr.extra_deps:
            return None
        return [opr.inputs[0]]

    return rw.apply(rule, "marker operator removed")


_FUSE_ADD = FUSE_ADD_ACTS


@register_pass("expand_fused_arith")
def expand_fused_arith(graph, dest, options):
    """FUSE_MUL_ADD3/4 and FUSE_ADD_<act> become their plain operators, so that the chain
    passes see every term (ArithFuse fuses them again at the end)."""

    def rule(opr):
        if opr.type_name != "Elemwise" or opr.extra_deps:
            return None
        mode, ins = opr.param.mode, [_sv(v) for v in opr.inputs]
        if mode == "FUSE_MUL_ADD3":
            new = ins[0] * ins[1] + ins[2]
        elif mode == "FUSE_MUL_ADD4":
            new = ins[0] * ins[1] + ins[2] * ins[3]
        elif mode in _FUSE_ADD:
            new = elemwise(ins[0] + ins[1], mode=_FUSE_ADD[mode])
        else:
            return None
        if new.dtype != opr.outputs[0].dtype:
            return None
        return [new.node]

    return Rewriter(graph, dest).apply(rule, "fused arithmetic expanded")


# ---- chain reordering ------------------------------------------------------------------------
_CHAIN_MODES = ("ADD", "MUL", "MAX", "MIN")


def _bshape(a: tuple, b: tuple) -> tuple | None:
    try:
        return tuple(np.broadcast_shapes(a, b))
    except ValueError:
        return None


def _merge_terms(mode: str, terms: list, compatible: bool) -> None:
    """Reduce pairs of ``[shape, var]`` terms in place while one's shape equals (or, with
    ``compatible``, broadcasts to without growing) another's: the smallest partner first."""
    merged = True
    while merged:
        merged = False
        for i, (si, vi) in enumerate(terms):
            best = None
            for j, (sj, _) in enumerate(terms):
                if i == j:
                    continue
                if compatible:
                    out = _bshape(si, sj)
                    if out is None or (out != si and out != sj):
                        continue
                    shp = out
                elif si == sj:
                    shp = sj
                else:
                    continue
                if best is None or int(np.prod(shp)) < int(np.prod(best[1])):
                    best = (j, shp)
            if best is not None:
                j, shp = best
                terms[j] = [shp, combine(mode, [vi, terms[j][1]])]
                terms[i] = terms[-1]
                terms.pop()
                merged = True
                break


@register_pass("reorder_arith_chain")
def reorder_arith_chain(graph, dest, options=None):
    """Each ADD, MUL, MAX or MIN chain is reduced again: terms of one shape together,
    parameter terms (constants and params) first among themselves, then every term in
    increasing size (the reference's ReorderArithChainPass with params as constants), so
    ``conv(x, w) + b`` becomes ``b + conv(x, w)`` and parameter subexpressions fold.

    Without ``options`` (the compile preset, where parameters may change between runs) it
    is :func:`~megbrain.gopt.passes.reorder_const_chain`: CONST terms only, the reference's
    pass with constants only."""
    if options is None:
        return reorder_const_chain(graph, dest)
    rw = Rewriter(graph, dest)
    is_param = ParamOnly()

    def rule(opr):
        if not _chain_root(rw, opr, _CHAIN_MODES) or is_param.opr(opr):
            return None
        mode = opr.param.mode
        ts = chain_terms(rw, opr, mode)
        shapes = [static_shape(t) for t in ts]
        if len(ts) < 2 or any(s is None for s in shapes):
            return None
        groups: dict = {}
        for t, s in sorted(zip(ts, shapes), key=lambda p: p[0].id):
            groups.setdefault((tuple(s), is_param(t)), []).append(t)
        consts, others = [], []
        for (s, c), vs in groups.items():
            (consts if c else others).append([s, combine(mode, vs)])
        consts.sort(key=lambda p: p[1].id)
        others.sort(key=lambda p: p[1].id)
        _merge_terms(mode, consts, True)
        terms = consts + others
        _merge_terms(mode, terms, False)
        _merge_terms(mode, terms, True)
        terms.sort(key=lambda p: int(np.prod(p[0])))
        new = combine(mode, [v for _, v in terms])
        if new is opr.outputs[0] or static_shape(new) != static_shape(opr.outputs[0]):
            return None
        return [new]

    return rw.apply(rule, "arith chain reordered")


# ---- ParamMerge ------------------------------------------------------------------------------
@register_pass("param_merge")
def param_merge(graph, dest, options):
    """Every SharedDeviceTensor becomes an output of one MultipleDeviceTensorHolder (one per
    comp node here: our operators have one comp node), which keeps the names given to the
    originals (the reference's ParamMergePass)."""
    rw = Rewriter(graph, dest)
    shared = [o for o in rw.oprs if o.type_name == "SharedDeviceTensor"]
    varmap = VarMap()
    by_cn: dict = {}
    for o in shared:
        by_cn.setdefault(o.outputs[0].comp_node, []).append(o)
    for oprs in by_cn.values():
        holder = MultipleDeviceTensorHolder([o.tensor for o in oprs], OperatorNodeConfig())
        outs = graph.insert_opr(holder)
        for o, new in zip(oprs, outs):
            src = o.outputs[0]
            if src.name_given or o.config.name_value is not None:
                new.name = src.name
                new.name_given = True
            varmap[src] = new
            varmap.reasons[src] = "SharedDeviceTensor merged into MultipleDeviceTensorHolder"
    return varmap


# ---- the entry point ---------------------------------------------------------------------
def optimize_for_inference(
    output_vars,
    *,
    f16_io_f32_comp: bool = False,
    f16_io_comp: bool = False,
    use_nhwcd4: bool = False,
    fuse_conv_bias_nonlinearity: bool = False,
    use_nchw32: bool = False,
    fuse_conv_bias_with_z: bool = False,
    use_nchw4: bool = False,
    use_nchw88: bool = False,
    use_nchw44: bool = False,
    use_nchw44_dot: bool = False,
    use_chwn4: bool = False,
) -> list[SymbolVar]:
    """Optimize the graph of ``output_vars`` for inference.

    Parameters
    ----------
    output_vars : SymbolVar or sequence of SymbolVar
        The outputs to optimize (all in one graph).
    f16_io_f32_comp : bool
        Compute in float16 vars, with float32 accumulation in convolution and matmul.
    f16_io_comp : bool
        Compute in float16 vars throughout.
    fuse_conv_bias_nonlinearity : bool
        Fuse convolution, per-channel bias and activation into ConvBias.
    fuse_conv_bias_with_z : bool
        Fuse convolution plus a tensor of its output's shape into ConvBias.
    use_nchw88 : bool
        Compute the convolutions (float32, channels per group multiples of 8) and the
        elementwise, pooling and concatenation operators between them in the channel-blocked
        NCHW88 layout
        (:mod:`megbrain.gopt.nchw88`); the outputs keep their layout.
    use_nchw4 : bool
        Compute the QuantizedS8 convolutions (output channels per group multiples of 4;
        not depthwise) and the elementwise and pooling operators between them in the
        channel-blocked NCHW4 layout (:mod:`megbrain.gopt.nchw4`); the outputs keep their
        layout.
    use_nhwcd4, use_nchw32, use_nchw44, use_nchw44_dot, use_chwn4 : bool
        Layout transforms of the reference that are not implemented here: setting one
        raises MegBrainError. At most one layout flag may be set.

    Returns
    -------
    list of SymbolVar
        The optimized vars, one per output var, in order and with the same dtypes.
        Parameters are read now: later updates of the original shared tensors do not
        reach the folded ones.
    """
    flags = {
        "use_nhwcd4": use_nhwcd4, "use_nchw32": use_nchw32, "use_nchw4": use_nchw4,
        "use_nchw88": use_nchw88, "use_nchw44": use_nchw44, "use_nchw44_dot": use_nchw44_dot,
        "use_chwn4": use_chwn4,
    }  # fmt: skip
    layouts = [k for k in LAYOUT_FLAGS if flags[k]]
    if len(layouts) > 1:
        raise MegBrainError(
            f"optimize_for_inference: at most one layout flag may be set, got {', '.join(layouts)}"
        )
    if layouts and layouts[0] not in ("use_nchw88", "use_nchw4"):
        raise MegBrainError(
            f"optimize_for_inference: {layouts[0]} is not implemented (convolution supports "
            "the NCHW, NCHW88 and NCHW4 formats here: use_nchw88, use_nchw4)"
        )
    if f16_io_f32_comp and f16_io_comp:
        raise MegBrainError(
            "optimize_for_inference: f16_io_f32_comp and f16_io_comp are mutually exclusive"
        )
    options = InferenceOptions(
        f16_io_f32_comp=bool(f16_io_f32_comp),
        f16_io_comp=bool(f16_io_comp),
        fuse_conv_bias_nonlinearity=bool(fuse_conv_bias_nonlinearity),
        fuse_conv_bias_with_z=bool(fuse_conv_bias_with_z),
        use_nchw88=bool(use_nchw88),
        use_nchw4=bool(use_nchw4),
    )
    single = as_var(output_vars) is not None
    dest = [_var(v) for v in ([output_vars] if single else list(output_vars))]
    if not dest:
        return []
    graph = dest[0].graph
    for v in dest:
        if v.graph is not graph:
            raise MegBrainError(f"optimize_for_inference: var {v.name!r} belongs to another graph")
    new = run_passes(graph, dest, inference_preset(options), PASSES, options)
    _record(graph, {}, zip(dest, new))
    return [SymbolVar(v) for v in new]


def _var(x) -> VarNode:
    v = as_var(x)
    if v is None:
        raise TypeError(f"optimize_for_inference: expect SymbolVars, got {x!r}")
    return v


def optimize_nodes_for_inference(vars_: Sequence[VarNode], **kw) -> list[VarNode]:
    """:func:`optimize_for_inference` on VarNodes (for ``CompGraph.compile``)."""
    return [v.node for v in optimize_for_inference(list(vars_), **kw)]
