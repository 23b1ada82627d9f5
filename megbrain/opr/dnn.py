"""Convolution and pooling operators: Convolution, ConvolutionBackwardData,
ConvolutionBackwardFilter, ConvBias, Convolution3D (and its backward oprs), Pooling and
PoolingBackward, with the ``mgb.opr`` functions ``convolution``, ``deconvolution``,
``conv_bias_activation``, ``convolution3d``, ``deconvolution3d`` and ``pooling``.

Only the batch-channel-first formats (NCHW, NCDHW) and floating-point dtypes are implemented,
and, for the forward 2-d convolutions (Convolution and ConvBias), the channel-blocked NCHW88
(:mod:`megbrain.kernels.conv.nchw88`, the layout ``optimize_for_inference(use_nchw88=True)``
converts a network to; it has no gradient here); the other formats of the reference are
accepted by the params and refused at inference. ConvBias takes an optional fourth input
``z`` of the output's shape: ``act(conv + bias + z)``, as the reference's.
Gradients are built from the backward operators, whose own gradients are convolutions, so
second-order gradients work.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np

from ..errors import MegBrainError
from ..graph import OperatorNodeBase, OperatorNodeConfig, ParamBase, register_opr
from ..graph.operator import fmt_shape
from ..graph.param_def import members_of
from ..graph.static_infer import static_shape
from ..kernels import elemwise as ew_kernels
from ..kernels import workspace
from ..kernels.conv import common as conv_kernels
from ..kernels.conv import epilogue as conv_epilogue
from ..kernels.conv import nchw88 as conv_nchw88
from ..kernels.conv import registry as conv_algos
from ..kernels.conv.constant_operands import constant_filter
from ..kernels.pool import binds as pool_kernels
from ..kernels.steps import chain
from . import param_defs as pdefs
from .base import SymbolVar, _merge_config, canonize_input_vars, insert_opr
from .param_args import opr_params
from .sereg_params import register_strict, register_with_policy

#: operators whose outputs are parameters: their values change only when the user writes
#: them (``graph_opt.weight_preprocess`` promises that no write follows the first run)
_PARAM_SOURCES = ("SharedDeviceTensor", "MultipleDeviceTensorHolder")

__all__ = [
    "Convolution",
    "ConvolutionBackwardData",
    "ConvolutionBackwardFilter",
    "ConvBias",
    "Convolution3D",
    "Convolution3DBackwardData",
    "Convolution3DBackwardFilter",
    "Pooling",
    "PoolingBackward",
    "ConvolutionParam",
    "ConvBiasParam",
    "Convolution3DParam",
    "PoolingParam",
    "convolution",
    "deconvolution",
    "conv_bias_activation",
    "convolution3d",
    "deconvolution3d",
    "pooling",
    "convolution_v0",
    "deconvolution_v0",
    "conv_bias_activation_v1",
]

CONV_MODES = members_of(pdefs.Convolution.Mode)
SPARSE_MODES = members_of(pdefs.Convolution.Sparse)
#: MegDNN's convolution formats; only NCHW is implemented
CONV_FORMATS = members_of(pdefs.Convolution.Format)
CONV3D_MODES = members_of(pdefs.Convolution3D.Mode)
CONV3D_SPARSE_MODES = members_of(pdefs.Convolution3D.Sparse)
CONV3D_FORMATS = members_of(pdefs.Convolution3D.Format)
COMPUTE_MODES = members_of(pdefs.Convolution.ComputeMode)
CONV3D_DATA_TYPES = members_of(pdefs.Convolution3D.DataType)
#: the execution strategies of the reference, choosing the kernels' algorithm at bind time
#: (megbrain.kernels.conv.registry)
STRATEGIES = members_of(pdefs.ExecutionPolicy.Strategy)
NONLINE_MODES = members_of(pdefs.ConvBias.NonlineMode)
POOLING_MODES = members_of(pdefs.Pooling.Mode)
#: MegDNN's pooling formats; only NCHW is implemented
POOLING_FORMATS = members_of(pdefs.Pooling.Format)
#: the Elemwise mode computing ``act(conv + bias)`` in place, per ConvBias nonlineMode
_BIAS_ACT = {
    "IDENTITY": "ADD",
    "RELU": "FUSE_ADD_RELU",
    "SIGMOID": "FUSE_ADD_SIGMOID",
    "H_SWISH": "FUSE_ADD_H_SWISH",
}


# ---- params --------------------------------------------------------------------------------
class _WindowParam(ParamBase):
    """A param with per-spatial-dim int fields ``<kind>_<axis>`` (``pad_h``, ``stride_w``)."""

    _axes: tuple[str, ...] = ("h", "w")
    #: field kind -> smallest allowed value
    _int_fields: dict[str, int] = {"pad": 0, "stride": 1, "dilate": 1}

    def __post_init__(self):
        super().__post_init__()
        for kind, lo in self._int_fields.items():
            for ax in self._axes:
                name = f"{kind}_{ax}"
                v = getattr(self, name)
                if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
                    raise MegBrainError(
                        f"{type(self).__qualname__}: {name} must be an int >= {lo}, got {v!r}"
                    )
                object.__setattr__(self, name, int(v))

    def _per_axis(self, kind: str) -> tuple[int, ...]:
        return tuple(getattr(self, f"{kind}_{ax}") for ax in self._axes)

    @property
    def pad(self) -> tuple[int, ...]:
        return self._per_axis("pad")

    @property
    def stride(self) -> tuple[int, ...]:
        return self._per_axis("stride")


class _ConvParamMixin:
    @property
    def dilate(self) -> tuple[int, ...]:
        return self._per_axis("dilate")

    @property
    def flip(self) -> bool:
        return self.mode == "CONVOLUTION"

    @property
    def group(self) -> bool:
        return self.sparse == "GROUP"


@dataclass(frozen=True)
class ConvolutionParam(_ConvParamMixin, _WindowParam):
    """Param of Convolution and its backward operators (MegDNN ``Convolution``).

    ``mode=CONVOLUTION`` flips the filter spatially; ``sparse=GROUP`` takes a grouped
    (G, OC/G, IC/G, FH, FW) filter. ``compute_mode`` is accepted and stored (every mode
    computes float16 in float32); ``strategy`` (MegDNN's ExecutionPolicy) chooses the
    algorithm at bind time, see :mod:`megbrain.kernels.conv.registry`.
    """

    mode: str = "CROSS_CORRELATION"
    pad_h: int = 0
    pad_w: int = 0
    stride_h: int = 1
    stride_w: int = 1
    dilate_h: int = 1
    dilate_w: int = 1
    sparse: str = "DENSE"
    format: str = "NCHW"
    compute_mode: str = "DEFAULT"
    strategy: str = "HEURISTIC"
    _choices = {
        "mode": CONV_MODES,
        "sparse": SPARSE_MODES,
        "format": CONV_FORMATS,
        "compute_mode": COMPUTE_MODES,
        "strategy": STRATEGIES,
    }


@dataclass(frozen=True)
class ConvBiasParam(ConvolutionParam):
    """Param of ConvBias: the convolution's fields plus the activation ``nonlineMode``."""

    nonlineMode: str = "IDENTITY"
    _choices = {**ConvolutionParam._choices, "nonlineMode": NONLINE_MODES}

    def conv_param(self) -> ConvolutionParam:
        """The param of the convolution inside."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(ConvolutionParam)}
        return ConvolutionParam(**fields)


@dataclass(frozen=True)
class Convolution3DParam(_ConvParamMixin, _WindowParam):
    """Param of Convolution3D and its backward operators (MegDNN ``Convolution3D``)."""

    mode: str = "CROSS_CORRELATION"
    pad_d: int = 0
    pad_h: int = 0
    pad_w: int = 0
    stride_d: int = 1
    stride_h: int = 1
    stride_w: int = 1
    dilate_d: int = 1
    dilate_h: int = 1
    dilate_w: int = 1
    sparse: str = "DENSE"
    data_type: str = "FLOAT"
    format: str = "NCDHW"
    strategy: str = "HEURISTIC"
    _axes = ("d", "h", "w")
    _choices = {
        "mode": CONV3D_MODES,
        "sparse": CONV3D_SPARSE_MODES,
        "data_type": CONV3D_DATA_TYPES,
        "format": CONV3D_FORMATS,
        "strategy": STRATEGIES,
    }


@dataclass(frozen=True)
class PoolingParam(_WindowParam):
    """Param of Pooling and PoolingBackward (MegDNN ``Pooling``)."""

    mode: str = "MAX"
    pad_h: int = 0
    pad_w: int = 0
    stride_h: int = 2
    stride_w: int = 2
    window_h: int = 2
    window_w: int = 2
    format: str = "NCHW"
    _int_fields = {"pad": 0, "stride": 1, "window": 1}
    _choices = {"mode": POOLING_MODES, "format": POOLING_FORMATS}

    @property
    def window(self) -> tuple[int, ...]:
        return self._per_axis("window")


# ---- shared checks -------------------------------------------------------------------------
class _NamedByKind:
    """Default operator names as MegBrain's: ``conv(x,w)``, ``pooling(x)``..."""

    short_name = ""

    def default_name(self) -> str:
        args = ",".join(v.name for v in self.inputs)
        if len(args) > 48:
            args = args[:45] + "..."
        return f"{self.short_name}({args})"


def _float_dtype(opr: OperatorNodeBase, dtypes, names) -> np.dtype:
    """The common floating-point dtype of the inputs; the config dtype must agree."""
    dt = dtypes[0]
    if any(d != dt for d in dtypes):
        desc = ", ".join(f"{n} {d}" for n, d in zip(names, dtypes))
        raise opr.error(f"inputs must share one dtype, got {desc}")
    try:
        conv_kernels.compute_dtype(dt)
    except ValueError:
        raise opr.error(f"unsupported dtype {dt}: only floating point is implemented") from None
    want = opr.config.dtype_value
    if want is not None and want != dt:
        raise opr.error(f"unsupported output dtype {want} for inputs of dtype {dt}")
    return dt


class _ConvBase(_NamedByKind, OperatorNodeBase):
    """Shared geometry of the convolution operators over ``nsp`` spatial dims."""

    Param = ConvolutionParam
    uses_workspace = True  # the im2col column buffer
    nsp = 2
    layout = "NCHW"
    #: whether the operator computes the NCHW88 format too (the forward 2-d convolutions)
    blocked_format = False

    def _check_format(self):
        if self.param.format == self.layout or self._nchw88():
            return
        also = " and NCHW88" if self.blocked_format else ""
        raise self.error(
            f"format {self.param.format} is not supported (only {self.layout}{also} is "
            "implemented)"
        )

    def _nchw88(self) -> bool:
        return self.blocked_format and self.param.format == "NCHW88"

    def _no_nchw88_grad(self):
        if self.param.format == "NCHW88":
            raise self.error(
                "the NCHW88 format has no gradient here (it is an inference layout, from "
                "optimize_for_inference(use_nchw88=True)); differentiate the NCHW graph"
            )

    def _filter_geometry(self, fshape: tuple) -> tuple[int, int, int, tuple]:
        """(G, OCg, ICg, spatial) of a dense or grouped filter shape."""
        nd = self.nsp + (3 if self.param.group else 2)
        if len(fshape) != nd:
            kind = "grouped (G, OCg, ICg, ...)" if self.param.group else "dense (OC, IC, ...)"
            raise self.error(
                f"sparse={self.param.sparse} needs a {nd}-d {kind} filter, got {fmt_shape(fshape)}"
            )
        if self.param.group:
            return fshape[0], fshape[1], fshape[2], tuple(fshape[3:])
        return 1, fshape[0], fshape[1], tuple(fshape[2:])

    def _check_ndim(self, what: str, shape: tuple):
        if len(shape) != self.nsp + 2:
            raise self.error(
                f"{what} must be {self.nsp + 2}-d ({self.layout}), got {fmt_shape(shape)}"
            )

    def _out_spatial(self, sshape, fspatial, src_desc) -> tuple:
        p = self.param
        out = tuple(
            conv_kernels.conv_out_size(*a) for a in zip(sshape, fspatial, p.stride, p.pad, p.dilate)
        )
        if any(o <= 0 for o in out):
            raise self.error(
                f"{src_desc} is smaller than the dilated filter {fmt_shape(fspatial)} "
                f"(pad={p.pad}, dilate={p.dilate}): output size {fmt_shape(out)}"
            )
        return out

    def _fwd_shape(self, src: tuple, filt: tuple, src_name: str = "src") -> tuple:
        """Forward output shape of ``src`` convolved with ``filt``, checking channels."""
        self._check_format()
        if self._nchw88():
            return self._nchw88_geometry(src, filt).out_shape
        self._check_ndim(src_name, src)
        g, ocg, icg, fsp = self._filter_geometry(filt)
        if src[1] != g * icg:
            raise self.error(
                f"channel mismatch: {src_name} {fmt_shape(src)} has {src[1]} channels but filter "
                f"{fmt_shape(filt)} expects {g * icg} (groups={g}, channels per group={icg})"
            )
        return (src[0], g * ocg) + self._out_spatial(src[2:], fsp, f"{src_name} {fmt_shape(src)}")

    def _nchw88_geometry(self, src: tuple, filt: tuple) -> conv_nchw88.Nchw88Geometry:
        p = self.param
        try:
            return conv_nchw88.nchw88_geometry(src, filt, p.group, p.stride, p.pad, p.dilate)
        except ValueError as exc:
            raise self.error(str(exc)) from None

    def _bind_nchw88(self, src, filt, out, epilogue=None, z=None):
        """The NCHW88 forward step (:func:`conv_nchw88.bind_nchw88_forward`), recording its
        algorithm; its NCHW fallback chooses an NCHW algorithm by the param's strategy."""

        def select_nchw(x, w, y):
            step = self._bind_kernel("forward", x, w, y)
            inner[0] = self.chosen_algorithm
            return step

        inner = [None]
        p = self.param
        with constant_filter(self._filter_is_constant()):
            try:
                name, step = conv_nchw88.bind_nchw88_forward(
                    src, filt, out, p.stride, p.pad, p.dilate, p.flip, group=bool(p.group),
                    epilogue=epilogue, z=z, select_nchw=select_nchw,
                )  # fmt: skip
            except ValueError as exc:
                raise self.error(str(exc)) from None
        self.chosen_algorithm = name if inner[0] is None else f"{name}:{inner[0]}"
        return step

    def _grouped(self, filt: np.ndarray) -> np.ndarray:
        return filt if self.param.group else filt[None]

    def _kernel_args(self) -> tuple:
        p = self.param
        return p.stride, p.pad, p.dilate, p.flip

    #: the name of the kernel algorithm the last bind chose (None before the first)
    chosen_algorithm: str | None = None

    def _bind_kernel(self, kind: str, a: np.ndarray, b: np.ndarray, out: np.ndarray,
                     epilogue=None, then=None):  # fmt: skip
        """Bind the ``kind`` convolution kernel the param's strategy chooses, recording its
        name in :attr:`chosen_algorithm`. An ``epilogue``
        (:class:`megbrain.kernels.conv.epilogue.Epilogue`) goes to an algorithm that takes
        epilogues; otherwise ``then()``, when given, binds the step run after the kernel."""
        args = (a, b, out, *self._kernel_args())
        layouts = tuple((x.shape, x.strides, x.dtype) for x in (a, b, out))
        # the executor binds twice (the workspace size, then into the plan): the same layouts
        # keep the same algorithm; so do new shapes under no_profiling_on_shape_change
        opts = getattr(self.graph, "options", None)
        keep_any = opts is not None and opts.no_profiling_on_shape_change
        same = layouts == getattr(self, "_chosen_for", None)
        keep = self.chosen_algorithm if same or keep_any else None
        with constant_filter(kind == "forward" and self._filter_is_constant()):
            try:
                algo = conv_algos.select(kind, *args, strategy=self.param.strategy, keep=keep)
            except ValueError as exc:
                raise self.error(str(exc)) from None
            self.chosen_algorithm, self._chosen_for = algo.name, layouts
            if epilogue is not None and algo.epilogue:
                return algo.bind(*args, epilogue=epilogue)
            step = algo.bind(*args)
        return step if then is None else chain([step, then()])

    def _filter_is_constant(self) -> bool:
        """Whether the filter (input 1) keeps its values from run to run: an ImmutableTensor,
        or, under ``graph_opt.weight_preprocess``, a parameter (the user's promise that it is
        not updated after the first run, as in the reference)."""
        owner = self.inputs[1].owner
        if owner.type_name == "ImmutableTensor":
            return True
        opts = getattr(self.graph, "options", None)
        return (
            opts is not None
            and bool(opts.graph_opt.weight_preprocess)
            and owner.type_name in _PARAM_SOURCES
        )


def _make(cls, inputs, param) -> SymbolVar:
    """Insert a ``cls`` operator over vars (grad methods' building block)."""
    nodes = [v.node if isinstance(v, SymbolVar) else v for v in inputs]
    return insert_opr(cls(nodes, param, OperatorNodeConfig()))[0]


class _ConvForward(_ConvBase):
    """Convolution: inputs (src, filter)."""

    def infer_dtypes(self, in_dtypes):
        if len(in_dtypes) != 2:
            raise self.error(f"expected 2 inputs (src, filter), got {len(in_dtypes)}")
        return [_float_dtype(self, in_dtypes, ("src", "filter"))]

    def infer_shapes(self, in_shapes, in_values):
        return [self._fwd_shape(tuple(in_shapes[0]), tuple(in_shapes[1]))]

    def bind(self, ins, outs):
        if self._nchw88():
            return self._bind_nchw88(ins[0], ins[1], outs[0])
        return self._bind_kernel("forward", ins[0], self._grouped(ins[1]), outs[0])

    def grad(self, wrt_idx, out_grads):
        og = out_grads[0]
        if og is None:
            return None
        self._no_nchw88_grad()
        src, filt = self.inputs
        if wrt_idx == 0:
            return _make(self.bwd_data, [filt, og, src], self.param).node
        return _make(self.bwd_filter, [src, og, filt], self.param).node


class _ConvBackwardData(_ConvBase):
    """Deconvolution: inputs (filter, diff[, src_for_shape]); output of src's shape."""

    shape_only_inputs = (2,)

    def infer_dtypes(self, in_dtypes):
        if len(in_dtypes) not in (2, 3):
            raise self.error(
                f"expected 2 or 3 inputs (filter, diff[, src for shape]), got {len(in_dtypes)}"
            )
        return [_float_dtype(self, in_dtypes[:2], ("filter", "diff"))]

    def infer_shapes(self, in_shapes, in_values):
        self._check_format()
        filt, diff = tuple(in_shapes[0]), tuple(in_shapes[1])
        self._check_ndim("diff", diff)
        g, ocg, icg, fsp = self._filter_geometry(filt)
        if diff[1] != g * ocg:
            raise self.error(
                f"channel mismatch: diff {fmt_shape(diff)} has {diff[1]} channels but filter "
                f"{fmt_shape(filt)} gives {g * ocg} (groups={g}, channels per group={ocg})"
            )
        if len(in_shapes) == 3:
            out = tuple(in_shapes[2])
            self._check_ndim("the output shape", out)
            if out[0] != diff[0] or out[1] != g * icg:
                raise self.error(
                    f"output shape {fmt_shape(out)} must have {diff[0]} samples and "
                    f"{g * icg} channels for diff {fmt_shape(diff)} and filter {fmt_shape(filt)}"
                )
        else:
            p = self.param
            sp = tuple(
                conv_kernels.deconv_out_size(*a)
                for a in zip(diff[2:], fsp, p.stride, p.pad, p.dilate)
            )
            if any(s <= 0 for s in sp):
                raise self.error(
                    f"diff {fmt_shape(diff)} with filter {fmt_shape(filt)} gives a non-positive "
                    f"output size {fmt_shape(sp)} (pad={p.pad})"
                )
            out = (diff[0], g * icg) + sp
        fwd = self._fwd_shape(out, filt, "output")
        if fwd != diff:
            raise self.error(
                f"output shape {fmt_shape(out)} convolved with filter {fmt_shape(filt)} gives "
                f"{fmt_shape(fwd)}, not the diff shape {fmt_shape(diff)}"
            )
        return [out]

    def bind(self, ins, outs):
        return self._bind_kernel("backward_data", self._grouped(ins[0]), ins[1], outs[0])

    def grad(self, wrt_idx, out_grads):
        og = out_grads[0]
        if og is None or wrt_idx == 2:
            return None
        filt, diff = self.inputs[:2]
        if wrt_idx == 0:
            return _make(self.bwd_filter, [og, diff, filt], self.param).node
        return _make(self.forward, [og, filt], self.param).node


class _ConvBackwardFilter(_ConvBase):
    """Filter gradient: inputs (src, diff, filter_for_shape); output of the filter's shape."""

    shape_only_inputs = (2,)

    def infer_dtypes(self, in_dtypes):
        if len(in_dtypes) != 3:
            raise self.error(
                f"expected 3 inputs (src, diff, filter for shape), got {len(in_dtypes)}"
            )
        return [_float_dtype(self, in_dtypes[:2], ("src", "diff"))]

    def infer_shapes(self, in_shapes, in_values):
        src, diff, filt = (tuple(s) for s in in_shapes)
        self._check_ndim("diff", diff)
        fwd = self._fwd_shape(src, filt)
        if fwd != diff:
            raise self.error(
                f"src {fmt_shape(src)} convolved with filter {fmt_shape(filt)} gives "
                f"{fmt_shape(fwd)}, not the diff shape {fmt_shape(diff)}"
            )
        return [filt]

    def bind(self, ins, outs):
        return self._bind_kernel("backward_filter", ins[0], ins[1], self._grouped(outs[0]))

    def grad(self, wrt_idx, out_grads):
        og = out_grads[0]
        if og is None or wrt_idx == 2:
            return None
        src, diff = self.inputs[:2]
        if wrt_idx == 0:
            return _make(self.bwd_data, [og, diff, src], self.param).node
        return _make(self.forward, [src, og], self.param).node


@register_opr
class Convolution(_ConvForward):
    """Batched 2-d convolution of NCHW ``src`` with a dense (OC, IC, FH, FW) or grouped
    (G, OCg, ICg, FH, FW) filter."""

    #: the reference's C++ type (Convolution is an alias of ConvolutionForward)
    type_name = "ConvolutionForward"

    short_name = "conv"
    blocked_format = True


@register_opr
class ConvolutionBackwardData(_ConvBackwardData):
    """Gradient of Convolution w.r.t. src (deconvolution); an optional third input gives the
    output shape (needed when a stride makes it ambiguous)."""

    short_name = "conv_bwd_data"


@register_opr
class ConvolutionBackwardFilter(_ConvBackwardFilter):
    """Gradient of Convolution w.r.t. the filter; the third input gives the filter shape."""

    short_name = "conv_bwd_filter"


@register_opr
class Convolution3D(_ConvForward):
    """Batched 3-d convolution of NCDHW ``src``; dense or grouped filter."""

    #: the reference's C++ type (Convolution3D is an alias of Convolution3DForward)
    type_name = "Convolution3DForward"

    short_name = "conv3d"

    Param = Convolution3DParam
    nsp = 3
    layout = "NCDHW"


@register_opr
class Convolution3DBackwardData(_ConvBackwardData):
    """Gradient of Convolution3D w.r.t. src (3-d deconvolution)."""

    short_name = "conv3d_bwd_data"

    Param = Convolution3DParam
    nsp = 3
    layout = "NCDHW"


@register_opr
class Convolution3DBackwardFilter(_ConvBackwardFilter):
    """Gradient of Convolution3D w.r.t. the filter."""

    short_name = "conv3d_bwd_filter"

    Param = Convolution3DParam
    nsp = 3
    layout = "NCDHW"


for _fwd, _data, _filt in [
    (Convolution, ConvolutionBackwardData, ConvolutionBackwardFilter),
    (Convolution3D, Convolution3DBackwardData, Convolution3DBackwardFilter),
]:
    for _cls in (_fwd, _data, _filt):
        _cls.forward, _cls.bwd_data, _cls.bwd_filter = _fwd, _data, _filt
del _fwd, _data, _filt, _cls


@register_opr
class ConvBias(_ConvBase):
    """``act(convolution(src, filter) + bias [+ z])`` with bias (1, OC, 1, 1) (NCHW88:
    (1, OC/8, 1, 1, 8)) or of the output's shape and the optional ``z`` of the output's
    shape (summed in that order); act is IDENTITY, RELU, SIGMOID or H_SWISH
    (``nonlineMode``)."""

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
        return [_float_dtype(self, in_dtypes, ("src", "filter", "bias", "z"))]

    def _channel_bias_shape(self, out: tuple) -> tuple:
        if self._nchw88():
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

        def act():  # bias (and z) and activation in passes of their own
            if z is None:
                return ew_kernels.bind(_BIAS_ACT[mode], [outs[0], ins[2]], outs[0])
            return chain([
                ew_kernels.bind("ADD", [outs[0], ins[2]], outs[0]),
                ew_kernels.bind(_BIAS_ACT[mode], [outs[0], z], outs[0]),
            ])  # fmt: skip

        if self._nchw88():
            epilogue = self._nchw88_epilogue(mode, ins[2], outs[0])
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
        epilogue = None if z is not None else conv_epilogue.for_conv_bias(mode, ins[2], outs[0])
        return self._bind_kernel(
            "forward", ins[0], self._grouped(ins[1]), outs[0], epilogue=epilogue, then=act
        )

    def inplace_input(self):
        """``z`` (input 3) when DIRECT_NCHW88 applies ``act(conv + bias + z)``: it reads each
        position's ``z`` before it writes the position, so the output may take ``z``'s
        memory (one stream less than reading ``z`` and writing elsewhere); no other algorithm
        and no other case (``z`` also read as the source, say) may."""
        if len(self.inputs) != 4 or not self._nchw88():
            return None
        z = self.inputs[3]
        if any(v is z for v in self.inputs[:3]):
            return None
        shapes = [static_shape(v) for v in self.inputs]
        if any(s is None for s in shapes) or self.param.nonlineMode not in ("IDENTITY", "RELU"):
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

    def _nchw88_epilogue(self, mode: str, bias: np.ndarray, out: np.ndarray):
        """The epilogue of an NCHW88 ConvBias (its per-channel bias as OC values, a view),
        or None when the kernel can not apply it."""
        if mode not in ("IDENTITY", "RELU") or bias.dtype != out.dtype:
            return None
        if bias.shape != self._channel_bias_shape(out.shape) or not bias.flags.c_contiguous:
            return None
        return conv_epilogue.Epilogue(bias.reshape(-1), mode == "RELU")

    def grad(self, wrt_idx, out_grads):
        from .basic_arith import elemwise
        from .grad import reduce_to_input, sv

        og = out_grads[0]
        if og is None:
            return None
        self._no_nchw88_grad()
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


class _PoolBase(_NamedByKind, OperatorNodeBase):
    Param = PoolingParam

    def _pooled_shape(self, src: tuple) -> tuple:
        p = self.param
        if p.format != "NCHW":
            raise self.error(f"format {p.format} is not supported (only NCHW is implemented)")
        if len(src) != 4:
            raise self.error(f"src must be 4-d (NCHW), got {fmt_shape(src)}")
        if any(pd >= w for pd, w in zip(p.pad, p.window)):
            raise self.error(
                f"padding {p.pad} must be smaller than the window {p.window}: a window would lie "
                "entirely in the padding"
            )
        out = tuple(pool_kernels.pool_out_size(*a) for a in zip(src[2:], p.window, p.stride, p.pad))
        if any(o <= 0 for o in out):
            raise self.error(
                f"src {fmt_shape(src)} is smaller than the window {p.window} (pad={p.pad})"
            )
        return src[:2] + out


@register_opr
class Pooling(_PoolBase):
    """MAX / AVERAGE / AVERAGE_COUNT_EXCLUDE_PADDING pooling of NCHW ``src``."""

    #: the reference's C++ type (Pooling is an alias of PoolingForward)
    type_name = "PoolingForward"

    short_name = "pooling"

    def infer_dtypes(self, in_dtypes):
        if len(in_dtypes) != 1:
            raise self.error(f"expected 1 input (src), got {len(in_dtypes)}")
        return [_float_dtype(self, in_dtypes, ("src",))]

    def infer_shapes(self, in_shapes, in_values):
        return [self._pooled_shape(tuple(in_shapes[0]))]

    def bind(self, ins, outs):
        p = self.param
        return pool_kernels.bind_pooling(ins[0], outs[0], p.mode, p.window, p.stride, p.pad)

    def grad(self, wrt_idx, out_grads):
        if out_grads[0] is None:
            return None
        return _make(
            PoolingBackward, [self.inputs[0], self.outputs[0], out_grads[0]], self.param
        ).node


@register_opr
class PoolingBackward(_PoolBase):
    """Gradient of Pooling w.r.t. src: inputs (src, dst, diff), output of src's shape."""

    short_name = "pooling_bwd"

    def infer_dtypes(self, in_dtypes):
        if len(in_dtypes) != 3:
            raise self.error(f"expected 3 inputs (src, dst, diff), got {len(in_dtypes)}")
        return [_float_dtype(self, in_dtypes, ("src", "dst", "diff"))]

    def infer_shapes(self, in_shapes, in_values):
        src, dst, diff = (tuple(s) for s in in_shapes)
        out = self._pooled_shape(src)
        if dst != out or diff != out:
            raise self.error(
                f"dst {fmt_shape(dst)} and diff {fmt_shape(diff)} must have the pooled shape "
                f"{fmt_shape(out)} of src {fmt_shape(src)}"
            )
        return [src]

    def bind(self, ins, outs):
        p = self.param
        return pool_kernels.bind_pooling_backward(
            ins[0], ins[1], ins[2], outs[0], p.mode, p.window, p.stride, p.pad
        )


# ---- functions ---------------------------------------------------------------------------
def _param(cls, fname: str, param, params: dict):
    """``param`` (a ``cls``) or a ``cls`` built from keyword fields, with a clear error."""
    if param is not None:
        if params:
            raise MegBrainError(f"{fname}: give param= or param fields, not both")
        if not isinstance(param, cls):
            raise MegBrainError(f"{fname}: param must be a {cls.__name__}, got {param!r}")
        return param
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(params) - set(names))
    if unknown:
        raise MegBrainError(
            f"{fname}: unknown param field(s) {', '.join(unknown)}; fields are {', '.join(names)}"
        )
    return cls(**params)


# the reference spells the policy argument of some functions ``execution_polity``; both
# spellings are taken everywhere. workspace_limit is a hint to the algorithm choice: dropped
_POLICY = (("execution_polity", "ExecutionPolicy"), ("execution_policy", "ExecutionPolicy"))


def _conv_params(*specs: tuple[str, str], fixed: tuple[str, ...] = ()):
    return opr_params(*specs, ignore=("workspace_limit",), fixed=("output_block_size", *fixed))


def _create(cls, inputs, param, dtype, name, comp_node, config, comp_graph):
    cfg = _merge_config(name, comp_node, config, dtype)
    vars_ = canonize_input_vars(inputs, comp_graph=comp_graph, config=cfg)
    return insert_opr(cls(vars_, param, cfg))[0]


@_conv_params(("param", "Convolution"), *_POLICY)
def convolution(
    src, filter, *, param=None, dtype=None, name=None, comp_node=None, config=None,
    comp_graph=None, **params,
) -> SymbolVar:  # fmt: skip
    """Batched 2-d convolution (registry name ``Convolution``).

    Parameters
    ----------
    src : SymbolVar or array_like
        The (N, IC, IH, IW) input.
    filter : SymbolVar or array_like
        The (OC, IC, FH, FW) filter, or (G, OC/G, IC/G, FH, FW) with ``sparse="GROUP"``.
    param : ConvolutionParam, optional
        The whole param, instead of fields.
    dtype : dtype-like, optional
        The output dtype; must be the inputs' (floating-point) dtype.
    name, comp_node, config, comp_graph
        The operator config, as for every ``mgb.opr`` function.
    **params
        Fields of :class:`ConvolutionParam`: ``mode`` (CROSS_CORRELATION | CONVOLUTION),
        ``pad_h``, ``pad_w``, ``stride_h``, ``stride_w``, ``dilate_h``, ``dilate_w``,
        ``sparse`` (DENSE | GROUP), ``format`` (NCHW only), ``compute_mode``, ``strategy``.

    Returns
    -------
    SymbolVar
        The (N, OC, OH, OW) output, ``OH = (IH + 2 pad_h - dilate_h (FH - 1) - 1) // stride_h
        + 1``.
    """
    p = _param(ConvolutionParam, "convolution", param, params)
    return _create(Convolution, [src, filter], p, dtype, name, comp_node, config, comp_graph)


@_conv_params(("param", "Convolution"), *_POLICY)
def deconvolution(
    src, filter, *, param=None, dtype=None, name=None, comp_node=None, config=None,
    comp_graph=None, **params,
) -> SymbolVar:  # fmt: skip
    """Deconvolution, the gradient of convolution w.r.t. its input
    (registry name ``ConvolutionBackwardData``, inputs ``(filter, src)``).

    Parameters
    ----------
    src : SymbolVar or array_like
        The (N, OC, H, W) input (the "diff" of the forward convolution).
    filter : SymbolVar or array_like
        The forward convolution's (OC, IC, FH, FW) filter, or grouped with ``sparse="GROUP"``.
    param, dtype, name, comp_node, config, comp_graph, **params
        As for :func:`convolution`.

    Returns
    -------
    SymbolVar
        The (N, IC, (H - 1) stride_h + dilate_h (FH - 1) + 1 - 2 pad_h, ...) output.
    """
    p = _param(ConvolutionParam, "deconvolution", param, params)
    return _create(
        ConvolutionBackwardData, [filter, src], p, dtype, name, comp_node, config, comp_graph
    )


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
    return _create(ConvBias, [src, filter, bias], p, dtype, name, comp_node, config, comp_graph)


@_conv_params(("param", "Convolution3D"), *_POLICY)
def convolution3d(
    src, filter, *, param=None, dtype=None, name=None, comp_node=None, config=None,
    comp_graph=None, **params,
) -> SymbolVar:  # fmt: skip
    """Batched 3-d convolution of NCDHW ``src`` (registry name ``Convolution3D``).

    Parameters
    ----------
    src : SymbolVar or array_like
        The (N, IC, D, H, W) input.
    filter : SymbolVar or array_like
        The (OC, IC, FD, FH, FW) filter, or (G, OC/G, IC/G, FD, FH, FW) with
        ``sparse="GROUP"``.
    param : Convolution3DParam, optional
        The whole param, instead of fields.
    dtype, name, comp_node, config, comp_graph
        As for :func:`convolution`.
    **params
        Fields of :class:`Convolution3DParam`: ``mode``, ``pad_d/h/w``, ``stride_d/h/w``,
        ``dilate_d/h/w``, ``sparse``, ``data_type``, ``format`` (NCDHW only), ``strategy``.

    Returns
    -------
    SymbolVar
        The (N, OC, OD, OH, OW) output.
    """
    p = _param(Convolution3DParam, "convolution3d", param, params)
    return _create(Convolution3D, [src, filter], p, dtype, name, comp_node, config, comp_graph)


@_conv_params(("param", "Convolution3D"), *_POLICY)
def deconvolution3d(
    src, filter, *, param=None, dtype=None, name=None, comp_node=None, config=None,
    comp_graph=None, **params,
) -> SymbolVar:  # fmt: skip
    """3-d deconvolution (registry name ``Convolution3DBackwardData``, inputs
    ``(filter, src)``); arguments as for :func:`convolution3d`.

    Returns
    -------
    SymbolVar
        The (N, IC, (D - 1) stride_d + dilate_d (FD - 1) + 1 - 2 pad_d, ...) output.
    """
    p = _param(Convolution3DParam, "deconvolution3d", param, params)
    return _create(
        Convolution3DBackwardData, [filter, src], p, dtype, name, comp_node, config, comp_graph
    )


@opr_params(("param", "Pooling"))
def pooling(
    src, *, mode="MAX", pad_h=0, pad_w=0, stride_h=2, stride_w=2, window_h=2, window_w=2,
    format="NCHW", param=None, name=None, comp_node=None, config=None, comp_graph=None,
) -> SymbolVar:  # fmt: skip
    """2-d pooling of NCHW ``src`` (registry name ``Pooling``).

    Parameters
    ----------
    src : SymbolVar or array_like
        The (N, C, IH, IW) input.
    mode : {"MAX", "AVERAGE", "AVERAGE_COUNT_EXCLUDE_PADDING"}
        MAX ignores padding; AVERAGE divides by the window size (padding counts as zeros);
        AVERAGE_COUNT_EXCLUDE_PADDING divides by the number of non-padding elements.
    pad_h, pad_w, stride_h, stride_w, window_h, window_w : int
        The geometry; padding must be smaller than the window.
    format : {"NCHW"}
        Only NCHW is implemented.
    param : PoolingParam, optional
        The whole param, instead of the fields.
    name, comp_node, config, comp_graph
        The operator config, as for every ``mgb.opr`` function.

    Returns
    -------
    SymbolVar
        The (N, C, (IH + 2 pad_h - window_h) // stride_h + 1, ...) output.
    """
    if param is None:
        param = PoolingParam(mode, pad_h, pad_w, stride_h, stride_w, window_h, window_w, format)
    elif not isinstance(param, PoolingParam):
        raise MegBrainError(f"pooling: param must be a PoolingParam, got {param!r}")
    return _create(Pooling, [src], param, None, name, comp_node, config, comp_graph)


# ---- legacy param versions -------------------------------------------------------------------
# the data_type of ConvolutionV0 and ConvBiasV1 chose MegDNN's mixed-precision kernels; FLOAT,
# the default, is the plain computation of the functions above
@_conv_params(("param", "ConvolutionV0"), *_POLICY, fixed=("data_type",))
def convolution_v0(
    src, filter, *, name=None, comp_node=None, config=None, comp_graph=None, **params
) -> SymbolVar:
    """:func:`convolution` with MegBrain's legacy param ``ConvolutionV0`` (``data_type`` FLOAT).

    Returns
    -------
    SymbolVar
        The (N, OC, OH, OW) output.
    """
    cfg = {"name": name, "comp_node": comp_node, "config": config, "comp_graph": comp_graph}
    return convolution(src, filter, **cfg, **params)


@_conv_params(("param", "ConvolutionV0"), *_POLICY, fixed=("data_type",))
def deconvolution_v0(
    src, filter, *, name=None, comp_node=None, config=None, comp_graph=None, **params
) -> SymbolVar:
    """:func:`deconvolution` with the legacy param ``ConvolutionV0`` (``data_type`` FLOAT).

    Returns
    -------
    SymbolVar
        The deconvolved output.
    """
    cfg = {"name": name, "comp_node": comp_node, "config": config, "comp_graph": comp_graph}
    return deconvolution(src, filter, **cfg, **params)


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


# ---- serialization (megbrain/graph/sereg.py) ------------------------------------------------
# as the reference: the convolutions write their table then param.ExecutionPolicy (the
# strategy); the current Convolution is registered as ConvolutionV1, ConvBias as
# ConvBiasForwardV3 (type ids of the unversioned names); Pooling writes param.Pooling only
for _cls, _def, _name in [
    (Convolution, pdefs.Convolution, "ConvolutionV1"),
    (ConvolutionBackwardData, pdefs.Convolution, "ConvolutionBackwardDataV1"),
    (ConvolutionBackwardFilter, pdefs.Convolution, "ConvolutionBackwardFilterV1"),
    (Convolution3D, pdefs.Convolution3D, "Convolution3D"),
    (Convolution3DBackwardData, pdefs.Convolution3D, "Convolution3DBackwardData"),
    (Convolution3DBackwardFilter, pdefs.Convolution3D, "Convolution3DBackwardFilter"),
    (ConvBias, pdefs.ConvBias, "ConvBiasForwardV3"),
]:
    register_with_policy(_cls, _def, name=_name)
del _cls, _def, _name
register_strict(Pooling, pdefs.Pooling, name="Pooling")
register_strict(PoolingBackward, pdefs.Pooling)
