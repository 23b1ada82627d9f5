"""Convolution operators: Convolution, ConvolutionBackwardData, ConvolutionBackwardFilter,
Convolution3D (and its backward oprs), with the ``mgb.opr`` functions ``convolution``,
``deconvolution``, ``convolution3d`` and ``deconvolution3d``, and the geometry, params and
checks the other dnn families share (ConvBias in ``dnn_conv_bias``, pooling in ``dnn_pool``).

Only the batch-channel-first formats (NCHW, NCDHW) and floating-point dtypes are implemented,
and, for the forward 2-d convolutions (Convolution and ConvBias), the channel-blocked NCHW88
(:mod:`megbrain.kernels.conv.nchw88`, the layout ``optimize_for_inference(use_nchw88=True)``
converts a network to; it has no gradient here); the other formats of the reference are
accepted by the params and refused at inference. ConvBias takes an optional fourth input
``z`` of the output's shape: ``act(conv + bias + z)``, as the reference's. The forward 2-d
convolutions also take 8-bit quantized src and filter (NCHW, no gradient:
:mod:`megbrain.kernels.conv.quantized`, MegDNN's integer arithmetic), in NCHW4 too
(:mod:`megbrain.kernels.conv.nchw4`, the layout of ``use_nchw4``). Gradients are built
from the backward operators, whose own gradients are convolutions, so second-order
gradients work.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np

from ..dtype import dtype_name, fmt_dtype, get_scale, is_quantize, qint32
from ..errors import MegBrainError
from ..graph import OperatorNodeBase, OperatorNodeConfig, ParamBase, register_opr
from ..graph.operator import NoGradient, fmt_shape, table_param
from ..graph.param_def import members_of
from ..kernels import elemwise as ew_kernels
from ..kernels.conv import common as conv_kernels
from ..kernels.conv import epilogue as conv_epilogue
from ..kernels.conv import nchw4 as conv_nchw4
from ..kernels.conv import nchw88 as conv_nchw88
from ..kernels.conv import quantized as conv_quantized
from ..kernels.conv import registry as conv_algos
from ..kernels.conv.constant_operands import constant_filter
from ..kernels.steps import chain
from . import param_defs as pdefs
from ._internal import input_is_constant
from .base import SymbolVar, build_opr, insert_opr
from .param_args import opr_params
from .sereg_params import register_with_policy

__all__ = [
    "Convolution",
    "ConvolutionBackwardData",
    "ConvolutionBackwardFilter",
    "Convolution3D",
    "Convolution3DBackwardData",
    "Convolution3DBackwardFilter",
    "ConvolutionParam",
    "Convolution3DParam",
    "convolution",
    "deconvolution",
    "convolution3d",
    "deconvolution3d",
    "convolution_v0",
    "deconvolution_v0",
]

CONV_MODES = members_of(pdefs.Convolution.Mode)
#: the name :attr:`_ConvBase.chosen_algorithm` records for the quantized (int8) kernels
QUANTIZED_ALGORITHM = "QUANTIZED_INT8_IM2COL_GEMM"
#: the execution strategies of the reference, choosing the kernels' algorithm at bind time
#: (megbrain.kernels.conv.registry)
STRATEGIES = members_of(pdefs.ExecutionPolicy.Strategy)


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
@table_param(pdefs.Convolution)
class ConvolutionParam(_ConvParamMixin, _WindowParam):
    """Param of Convolution and its backward operators (MegDNN ``Convolution``).

    ``mode=CONVOLUTION`` flips the filter spatially; ``sparse=GROUP`` takes a grouped
    (G, OC/G, IC/G, FH, FW) filter. ``compute_mode`` is accepted and stored (every mode
    computes float16 in float32); ``strategy`` (MegDNN's ExecutionPolicy) chooses the
    algorithm at bind time, see :mod:`megbrain.kernels.conv.registry`. Of the formats only
    NCHW (and NCHW88 for the forward operator) is implemented.
    """

    # not in the table: the reference writes it as a second one, param.ExecutionPolicy
    strategy: str = "HEURISTIC"
    _choices = {"strategy": STRATEGIES}


@dataclass(frozen=True)
@table_param(pdefs.Convolution3D)
class Convolution3DParam(_ConvParamMixin, _WindowParam):
    """Param of Convolution3D and its backward operators (MegDNN ``Convolution3D``)."""

    # not in the table: the reference writes it as a second one, param.ExecutionPolicy
    strategy: str = "HEURISTIC"
    _axes = ("d", "h", "w")
    _choices = {"strategy": STRATEGIES}


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


def _almost_equal(x: float, y: float) -> bool:
    """MegDNN's ``almost_equal`` of two float32 scales (within one float32 ulp)."""
    x32, y32 = np.float32(x), np.float32(y)
    diff = abs(float(x32) - float(y32))
    return diff < float(np.finfo(np.float32).eps) * abs(float(x32 + y32)) or diff < float(
        np.finfo(np.float32).tiny
    )


def _quantized_dtype(opr: OperatorNodeBase, dtypes, names) -> np.dtype:
    """The output dtype of a quantized convolution (MegDNN's ``check_or_deduce_dtype_fwd``
    and ConvBias's ``check_exec``): src and filter of one 8-bit quantized kind; a bias
    QuantizedS32 of scale ``src scale * filter scale`` (within 1e-6); the output
    QuantizedS32 of that scale (the default) or of the source's kind; ``z`` of the output's
    kind. Errors name the operator, the vars and their dtypes."""
    descs = [f"{n} {opr.inputs[i].name!r} {fmt_dtype(d)}" for i, (n, d) in
             enumerate(zip(names, dtypes))]  # fmt: skip
    src, filt = dtypes[:2]
    kinds = conv_quantized.QUANTIZED_SOURCES
    if not (is_quantize(src) and is_quantize(filt)) or dtype_name(src) != dtype_name(filt) or (
        dtype_name(src) not in kinds
    ):
        raise opr.error(
            f"a quantized convolution needs src and filter of one quantized kind "
            f"({' or '.join(kinds)}); got {descs[0]} and {descs[1]}"
        )
    # MegDNN's mul_scale: the float32 product of the float32 scales
    scale = float(np.float32(get_scale(src)) * np.float32(get_scale(filt)))
    if len(dtypes) > 2:
        bias = dtypes[2]
        if not is_quantize(bias) or dtype_name(bias) != "QuantizedS32":
            raise opr.error(f"the bias of a quantized convolution must be QuantizedS32; got "
                            f"{descs[2]} (with {descs[0]}, {descs[1]})")  # fmt: skip
        if not abs(float(np.float32(scale) - np.float32(get_scale(bias)))) < 1e-6:
            raise opr.error(
                f"bias scale must be src scale * filter scale ({scale:g}); got {descs[2]} "
                f"with {descs[0]} and {descs[1]}"
            )
    want = opr.config.dtype_value
    if want is None:
        out = qint32(scale)
    elif is_quantize(want) and dtype_name(want) == "QuantizedS32" and _almost_equal(
        get_scale(want), scale
    ):
        out = want
    elif is_quantize(want) and dtype_name(want) == dtype_name(src):
        out = want
    else:
        raise opr.error(
            f"unsupported output dtype {fmt_dtype(want)} for {descs[0]} and {descs[1]} "
            f"(QuantizedS32(scale={scale:g}) or {dtype_name(src)} expected)"
        )
    if len(dtypes) > 3 and not (is_quantize(dtypes[3]) and dtype_name(dtypes[3]) ==
                                dtype_name(out)):  # fmt: skip
        raise opr.error(f"z must be of the output's kind {fmt_dtype(out)}; got {descs[3]}")
    if opr.param.format not in ("NCHW", "NCHW4"):
        raise opr.error(
            f"format {opr.param.format} is not implemented for quantized dtypes (NCHW and "
            "NCHW4 only)"
        )
    return out


# ---- the forward / backward-data / backward-filter trio (MegBrain's megdnn_opr_wrapper) ----
class _TrioMember:
    """One of a trio of bilinear operators (forward, backward data, backward filter): the
    gradients of each are the other two, so gradients of every order exist."""

    #: (forward, backward data, backward filter) of the trio, set by :func:`bind_trio`
    family: tuple = ()

    def _check_grad(self) -> None:
        """Refuse a gradient the operator can not have (a hook; all are allowed here)."""


class _TrioForward(_TrioMember):
    """Inputs (src, filter)."""

    def infer_dtypes(self, in_dtypes):
        if len(in_dtypes) != 2:
            raise self.error(f"expected 2 inputs (src, filter), got {len(in_dtypes)}")
        return [_float_dtype(self, in_dtypes, ("src", "filter"))]

    def grad(self, wrt_idx, out_grads):
        og = out_grads[0]
        if og is None:
            return None
        self._check_grad()
        _, bwd_data, bwd_filter = self.family
        src, filt = self.inputs
        if wrt_idx == 0:
            return _make(bwd_data, [filt, og, src], self.param).node
        return _make(bwd_filter, [src, og, filt], self.param).node


class _TrioBackwardData(_TrioMember):
    """Inputs (filter, diff, src for shape); the third may be left out where
    ``shape_input_optional`` (the output shape then follows from the geometry)."""

    shape_only_inputs = (2,)
    shape_input_optional = False

    def infer_dtypes(self, in_dtypes):
        if self.shape_input_optional and len(in_dtypes) not in (2, 3):
            raise self.error(
                f"expected 2 or 3 inputs (filter, diff[, src for shape]), got {len(in_dtypes)}"
            )
        if not self.shape_input_optional and len(in_dtypes) != 3:
            raise self.error(
                f"expected 3 inputs (filter, diff, src for shape), got {len(in_dtypes)}"
            )
        return [_float_dtype(self, in_dtypes[:2], ("filter", "diff"))]

    def grad(self, wrt_idx, out_grads):
        og = out_grads[0]
        if og is None or wrt_idx == 2:
            return None
        fwd, _, bwd_filter = self.family
        filt, diff = self.inputs[:2]
        if wrt_idx == 0:  # <bwd_data(filt, diff), og> = <fwd(og, filt), diff>
            return _make(bwd_filter, [og, diff, filt], self.param).node
        return _make(fwd, [og, filt], self.param).node


class _TrioBackwardFilter(_TrioMember):
    """Inputs (src, diff, filter for shape)."""

    shape_only_inputs = (2,)

    def infer_dtypes(self, in_dtypes):
        if len(in_dtypes) != 3:
            raise self.error(
                f"expected 3 inputs (src, diff, filter for shape), got {len(in_dtypes)}"
            )
        return [_float_dtype(self, in_dtypes[:2], ("src", "diff"))]

    def grad(self, wrt_idx, out_grads):
        og = out_grads[0]
        if og is None or wrt_idx == 2:
            return None
        fwd, bwd_data, _ = self.family
        src, diff = self.inputs[:2]
        if wrt_idx == 0:  # <bwd_filter(src, diff), og> = <fwd(src, og), diff>
            return _make(bwd_data, [og, diff, src], self.param).node
        return _make(fwd, [src, og], self.param).node


def bind_trio(forward: type, backward_data: type, backward_filter: type) -> None:
    """Make three operator classes one trio: each one's gradients use the other two.

    Parameters
    ----------
    forward, backward_data, backward_filter : type
        Subclasses of the trio's forward, backward-data and backward-filter bases.
    """
    for cls in (forward, backward_data, backward_filter):
        cls.family = (forward, backward_data, backward_filter)


class _ConvBase(_NamedByKind, OperatorNodeBase):
    """Shared geometry of the convolution operators over ``nsp`` spatial dims."""

    Param = ConvolutionParam
    uses_workspace = True  # the im2col column buffer
    nsp = 2
    layout = "NCHW"
    #: whether the operator computes the NCHW88 (float32) and NCHW4 (8-bit quantized)
    #: formats too (the forward 2-d convolutions)
    blocked_format = False

    def _check_format(self):
        if self.param.format == self.layout or self._nchw88() or self._nchw4():
            return
        also = ", NCHW88 and NCHW4" if self.blocked_format else ""
        raise self.error(
            f"format {self.param.format} is not supported (only {self.layout}{also} is "
            "implemented)"
        )

    def _nchw88(self) -> bool:
        return self.blocked_format and self.param.format == "NCHW88"

    def _nchw4(self) -> bool:
        return self.blocked_format and self.param.format == "NCHW4"

    def _no_nchw88_grad(self):
        if self.param.format in ("NCHW88", "NCHW4"):
            flag = "use_nchw88" if self.param.format == "NCHW88" else "use_nchw4"
            raise self.error(
                f"the {self.param.format} format has no gradient here (it is an inference "
                f"layout, from optimize_for_inference({flag}=True)); differentiate the NCHW "
                "graph",
                NoGradient,
            )

    def _check_nchw4_dtypes(self, in_dtypes) -> None:
        """NCHW4 takes 8-bit quantized sources and filters only (the reference's int8
        layout)."""
        if not self._nchw4():
            return
        names = ("src", "filter")
        for v, d, what in zip(self.inputs, in_dtypes, names):
            if not (is_quantize(d) and np.dtype(d).itemsize == 1):
                raise self.error(f"the NCHW4 format takes 8-bit quantized operands, {what} "
                                 f"{v.name!r} is {fmt_dtype(d)}")  # fmt: skip

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
        if self._nchw4():
            p = self.param
            try:
                return conv_nchw4.nchw4_geometry(src, filt, bool(p.group), p.stride, p.pad,
                                                 p.dilate)  # fmt: skip
            except ValueError as exc:
                raise self.error(f"{exc} ({src_name} {self.inputs[0].name!r})") from None
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

    def _bind_nchw88(self, src, filt, out, epilogue=None, z=None, gate=None, preact=None):
        """The NCHW88 forward step (:func:`conv_nchw88.bind_nchw88_forward`, ``gate`` scaling
        the source, ``preact`` its scale, shift and ReLU), recording its algorithm; its NCHW
        fallback chooses an NCHW algorithm by the param's strategy."""

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
                    epilogue=epilogue, z=z, select_nchw=select_nchw, gate=gate, preact=preact,
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
            if epilogue is not None and conv_epilogue.accepts(algo, epilogue):
                return algo.bind(*args, epilogue=epilogue)
            step = algo.bind(*args)
        return step if then is None else chain([step, then()])

    def _filter_is_constant(self) -> bool:
        """Whether the filter (input 1) keeps its values from run to run
        (:func:`._internal.input_is_constant`)."""
        return input_is_constant(self, 1)


def _make(cls, inputs, param) -> SymbolVar:
    """Insert a ``cls`` operator over vars (grad methods' building block)."""
    nodes = [v.node if isinstance(v, SymbolVar) else v for v in inputs]
    return insert_opr(cls(nodes, param, OperatorNodeConfig()))[0]


class _ConvForward(_TrioForward, _ConvBase):
    """Convolution: inputs (src, filter)."""

    def infer_shapes(self, in_shapes, in_values):
        return [self._fwd_shape(tuple(in_shapes[0]), tuple(in_shapes[1]))]

    def bind(self, ins, outs):
        if self._nchw88():
            return self._bind_nchw88(ins[0], ins[1], outs[0])
        return self._bind_kernel("forward", ins[0], self._grouped(ins[1]), outs[0])

    def _check_grad(self) -> None:
        self._no_nchw88_grad()


class _ConvBackwardData(_TrioBackwardData, _ConvBase):
    """Deconvolution: inputs (filter, diff[, src_for_shape]); output of src's shape."""

    shape_input_optional = True

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


class _ConvBackwardFilter(_TrioBackwardFilter, _ConvBase):
    """Filter gradient: inputs (src, diff, filter_for_shape); output of the filter's shape."""

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


@register_opr
class Convolution(_ConvForward):
    """Batched 2-d convolution of NCHW ``src`` with a dense (OC, IC, FH, FW) or grouped
    (G, OCg, ICg, FH, FW) filter."""

    #: the reference's C++ type (Convolution is an alias of ConvolutionForward)
    type_name = "ConvolutionForward"

    short_name = "conv"
    blocked_format = True

    def infer_dtypes(self, in_dtypes):
        self._check_nchw4_dtypes(in_dtypes)
        if len(in_dtypes) == 2 and any(is_quantize(d) for d in in_dtypes):
            return [_quantized_dtype(self, in_dtypes, ("src", "filter"))]
        return super().infer_dtypes(in_dtypes)

    def bind(self, ins, outs):
        if not is_quantize(outs[0].dtype):
            return super().bind(ins, outs)
        # the int32 sums, requantized when the output is of the source's 8-bit kind (as
        # MegDNN's CPU kernels do: ConvBias without bias, then TypeCvt)
        src, out = ins[0], outs[0]
        filt = ins[1] if self._nchw4() else self._grouped(ins[1])
        self.chosen_algorithm = QUANTIZED_ALGORITHM
        with constant_filter(self._filter_is_constant()):
            return self._bind_quantized(src, filt, out)

    def _bind_quantized(self, src, filt, out):
        p = self.param
        if self._nchw4():
            sums = functools.partial(conv_nchw4.bind_nchw4_convolution, group=bool(p.group))
        else:
            sums = conv_quantized.bind_quantized_convolution
        try:
            if dtype_name(out.dtype) == "QuantizedS32":
                return sums(src, filt, out, p.stride, p.pad, p.dilate, p.flip)
            scale = float(np.float32(get_scale(src.dtype)) * np.float32(get_scale(filt.dtype)))
            acc = np.empty(out.shape, qint32(scale))
            return chain([
                sums(src, filt, acc, p.stride, p.pad, p.dilate, p.flip),
                ew_kernels.typecvt_bind(acc, out),
            ])  # fmt: skip
        except ValueError as exc:
            raise self.error(str(exc)) from None

    def _check_grad(self) -> None:
        super()._check_grad()
        if is_quantize(self.outputs[0].dtype):
            raise self.error("quantized convolutions have no gradient (inference only)")


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


bind_trio(Convolution, ConvolutionBackwardData, ConvolutionBackwardFilter)
bind_trio(Convolution3D, Convolution3DBackwardData, Convolution3DBackwardFilter)


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
    return build_opr(Convolution, [src, filter], p, dtype, name, comp_node, config, comp_graph)


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
    return build_opr(
        ConvolutionBackwardData, [filter, src], p, dtype, name, comp_node, config, comp_graph
    )


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
    return build_opr(Convolution3D, [src, filter], p, dtype, name, comp_node, config, comp_graph)


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
    return build_opr(
        Convolution3DBackwardData, [filter, src], p, dtype, name, comp_node, config, comp_graph
    )


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


# ---- serialization (megbrain/serialization/sereg.py) -------------------------------------
# as the reference: the convolutions write their Param's table (param.Convolution,
# param.Convolution3D) then param.ExecutionPolicy (the strategy); the current Convolution is
# registered as ConvolutionV1 (the type id of the unversioned name)
for _cls, _name in [
    (Convolution, "ConvolutionV1"),
    (ConvolutionBackwardData, "ConvolutionBackwardDataV1"),
    (ConvolutionBackwardFilter, "ConvolutionBackwardFilterV1"),
    (Convolution3D, "Convolution3D"),
    (Convolution3DBackwardData, "Convolution3DBackwardData"),
    (Convolution3DBackwardFilter, "Convolution3DBackwardFilter"),
]:
    register_with_policy(_cls, name=_name)
del _cls, _name
