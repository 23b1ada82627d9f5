"""Locally connected convolution: GroupLocal and Local with their backward
operators, and the ``mgb.opr`` functions ``group_local`` and ``local``.

The weights are untied: each output position has its own filter. GroupLocal's filter is
(G, OH, OW, IC/G, FH, FW, OC/G), Local's (OH, OW, IC, FH, FW, OC) (one group). As MegDNN's,
these operators implement CROSS_CORRELATION with zero padding and strides, NCHW, floating
point; CONVOLUTION mode, dilation and ``sparse=GROUP`` (the group count is the filter's) are
refused. Gradients are the backward operators, whose own gradients are forward or backward
operators again (the three are bilinear), so second-order gradients work.
"""

from __future__ import annotations

from ..graph import OperatorNodeBase, register_opr
from ..graph.operator import fmt_shape
from ..kernels import dnn_local as kern
from ..kernels.conv import common as conv_kernels
from .base import SymbolVar, build_opr
from .dnn import (
    ConvolutionParam,
    _NamedByKind,
    _TrioBackwardData,
    _TrioBackwardFilter,
    _TrioForward,
    bind_trio,
)
from .param_args import opr_params
from .sereg_params import register_strict

__all__ = [
    "GroupLocal",
    "GroupLocalBackwardData",
    "GroupLocalBackwardFilter",
    "Local",
    "LocalBackwardData",
    "LocalBackwardFilter",
    "group_local",
    "local",
]


class _LocalBase(_NamedByKind, OperatorNodeBase):
    """Geometry and checks shared by the locally connected operators."""

    Param = ConvolutionParam
    uses_workspace = True  # the column buffer
    #: the filter has a leading group axis (GroupLocal) or not (Local)
    grouped = True

    @property
    def filter_layout(self) -> str:
        return "(G, OH, OW, IC/G, FH, FW, OC/G)" if self.grouped else "(OH, OW, IC, FH, FW, OC)"

    def _check_param(self) -> None:
        p = self.param
        if p.format != "NCHW":
            raise self.error(f"format {p.format} is not supported (only NCHW is implemented)")
        if p.mode != "CROSS_CORRELATION":
            raise self.error(f"only CROSS_CORRELATION mode is supported, got mode={p.mode}")
        if p.sparse != "DENSE":
            raise self.error(
                f"sparse={p.sparse} is not supported: the filter's first axis gives the groups"
            )
        if p.dilate != (1, 1):
            raise self.error(f"dilation is not supported, got dilate={p.dilate}")

    def _geometry(self, filt: tuple) -> tuple[int, ...]:
        """(G, OH, OW, ICg, FH, FW, OCg) of a filter shape."""
        nd = 7 if self.grouped else 6
        if len(filt) != nd:
            raise self.error(f"filter must be {nd}-d {self.filter_layout}, got {fmt_shape(filt)}")
        return tuple(filt) if self.grouped else (1, *filt)

    def _fwd_shape(self, src: tuple, filt: tuple, src_name: str = "src") -> tuple:
        """The output shape of ``src`` with filter ``filt``, checking channels and positions."""
        self._check_param()
        if len(src) != 4:
            raise self.error(f"{src_name} must be 4-d (NCHW), got {fmt_shape(src)}")
        g, oh, ow, icg, fh, fw, ocg = self._geometry(filt)
        if src[1] != g * icg:
            raise self.error(
                f"channel mismatch: {src_name} {fmt_shape(src)} has {src[1]} channels but filter "
                f"{fmt_shape(filt)} expects {g * icg} (groups={g}, channels per group={icg})"
            )
        p = self.param
        out = tuple(
            conv_kernels.conv_out_size(s, f, st, pd, 1)
            for s, f, st, pd in zip(src[2:], (fh, fw), p.stride, p.pad)
        )
        if any(o <= 0 for o in out):
            raise self.error(
                f"{src_name} {fmt_shape(src)} is smaller than the filter window {fh}x{fw} "
                f"(pad={p.pad}): output size {fmt_shape(out)}"
            )
        if out != (oh, ow):
            raise self.error(
                f"filter {fmt_shape(filt)} has weights for {oh}x{ow} output positions, but "
                f"{src_name} {fmt_shape(src)} with stride={p.stride} and pad={p.pad} gives "
                f"{out[0]}x{out[1]}"
            )
        return (src[0], g * ocg, oh, ow)

    def _grouped(self, filt):
        return filt if self.grouped else filt[None]

    def _check_backward(self, src: tuple, filt: tuple, diff: tuple) -> None:
        """A backward operator's check: ``diff`` has the forward output's shape."""
        fwd = self._fwd_shape(src, filt)
        if fwd != diff:
            raise self.error(
                f"src {fmt_shape(src)} with filter {fmt_shape(filt)} gives {fmt_shape(fwd)}, "
                f"not the diff shape {fmt_shape(diff)}"
            )


class _LocalForward(_TrioForward, _LocalBase):
    """Inputs (src, filter)."""

    def infer_shapes(self, in_shapes, in_values):
        return [self._fwd_shape(tuple(in_shapes[0]), tuple(in_shapes[1]))]

    def bind(self, ins, outs):
        p = self.param
        return kern.bind_group_local(ins[0], self._grouped(ins[1]), outs[0], p.stride, p.pad)


class _LocalBackwardData(_TrioBackwardData, _LocalBase):
    """Inputs (filter, diff, src_for_shape); output of src's shape."""

    def infer_shapes(self, in_shapes, in_values):
        filt, diff, src = (tuple(s) for s in in_shapes)
        self._check_backward(src, filt, diff)
        return [src]

    def bind(self, ins, outs):
        p = self.param
        return kern.bind_group_local_backward_data(
            self._grouped(ins[0]), ins[1], outs[0], p.stride, p.pad
        )


class _LocalBackwardFilter(_TrioBackwardFilter, _LocalBase):
    """Inputs (src, diff, filter_for_shape); output of the filter's shape."""

    def infer_shapes(self, in_shapes, in_values):
        src, diff, filt = (tuple(s) for s in in_shapes)
        self._check_backward(src, filt, diff)
        return [filt]

    def bind(self, ins, outs):
        p = self.param
        return kern.bind_group_local_backward_filter(
            ins[0], ins[1], self._grouped(outs[0]), p.stride, p.pad
        )


@register_opr
class GroupLocal(_LocalForward):
    """Locally connected convolution of NCHW ``src`` with a (G, OH, OW, IC/G, FH, FW, OC/G)
    filter (MegBrain's GroupLocalForward)."""

    #: the reference's C++ type (GroupLocal is an alias of GroupLocalForward)
    type_name = "GroupLocalForward"

    short_name = "glocal"


@register_opr
class GroupLocalBackwardData(_LocalBackwardData):
    """Gradient of GroupLocal w.r.t. src."""

    short_name = "glocal_bwd_data"


@register_opr
class GroupLocalBackwardFilter(_LocalBackwardFilter):
    """Gradient of GroupLocal w.r.t. the filter."""

    short_name = "glocal_bwd_filter"


@register_opr
class Local(_LocalForward):
    """Locally connected convolution of NCHW ``src`` with an (OH, OW, IC, FH, FW, OC) filter
    (MegBrain's LocalForward)."""

    #: the reference's C++ type (Local is an alias of LocalForward)
    type_name = "LocalForward"

    short_name = "local"
    grouped = False


@register_opr
class LocalBackwardData(_LocalBackwardData):
    """Gradient of Local w.r.t. src."""

    short_name = "local_bwd_data"
    grouped = False


@register_opr
class LocalBackwardFilter(_LocalBackwardFilter):
    """Gradient of Local w.r.t. the filter."""

    short_name = "local_bwd_filter"
    grouped = False


bind_trio(GroupLocal, GroupLocalBackwardData, GroupLocalBackwardFilter)
bind_trio(Local, LocalBackwardData, LocalBackwardFilter)


# ---- functions ---------------------------------------------------------------------------
def _local_param(mode, pad_h, pad_w, stride_h, stride_w, dilate_h, dilate_w, sparse, fmt, cm):
    return ConvolutionParam(
        mode=mode,
        pad_h=pad_h,
        pad_w=pad_w,
        stride_h=stride_h,
        stride_w=stride_w,
        dilate_h=dilate_h,
        dilate_w=dilate_w,
        sparse=sparse,
        format=fmt,
        compute_mode=cm,
    )


@opr_params(("param", "Convolution"))
def group_local(
    src,
    filter,
    *,
    mode: str = "CROSS_CORRELATION",
    pad_h: int = 0,
    pad_w: int = 0,
    stride_h: int = 1,
    stride_w: int = 1,
    dilate_h: int = 1,
    dilate_w: int = 1,
    sparse: str = "DENSE",
    format: str = "NCHW",
    compute_mode: str = "DEFAULT",
    name: str | None = None,
    comp_node=None,
    config=None,
    comp_graph=None,
) -> SymbolVar:
    """Locally connected convolution with groups (registry name ``GroupLocal``).

    ``out[n, g*OCg + o, oh, ow] = sum(src[n, g*ICg + i, oh*stride_h - pad_h + fh,
    ow*stride_w - pad_w + fw] * filter[g, oh, ow, i, fh, fw, o])``, zero outside ``src``.

    Parameters
    ----------
    src : SymbolVar or array_like
        The (N, IC, IH, IW) float input.
    filter : SymbolVar or array_like
        The (G, OH, OW, IC/G, FH, FW, OC/G) filter: one (IC/G, FH, FW, OC/G) kernel per group
        and output position; OH and OW must be the output size.
    mode : {"CROSS_CORRELATION"}
        The only mode implemented (as in MegDNN).
    pad_h, pad_w, stride_h, stride_w : int
        Zero padding and strides.
    dilate_h, dilate_w : int
        Must be 1.
    sparse : {"DENSE"}
        The groups come from the filter's first axis.
    format : {"NCHW"}
        The only format implemented.
    compute_mode : {"DEFAULT", "FLOAT32"}
        Accepted; float16 always computes in float32.
    param : opr_param_defs.Convolution, optional
        The whole param instead of fields.
    name, comp_node, config, comp_graph
        The operator config, as for every ``mgb.opr`` function.

    Returns
    -------
    SymbolVar
        The (N, OC, OH, OW) output, ``OH = (IH + 2 pad_h - FH) // stride_h + 1``.

    Raises
    ------
    MegBrainError
        For mismatched channels or output positions, an unsupported mode, dilation, sparse
        or format, or non-float dtypes.
    """
    p = _local_param(
        mode, pad_h, pad_w, stride_h, stride_w, dilate_h, dilate_w, sparse, format, compute_mode
    )
    return build_opr(GroupLocal, [src, filter], p, None, name, comp_node, config, comp_graph)


@opr_params(("param", "ConvolutionV0"))
def local(
    src,
    filter,
    *,
    mode: str = "CROSS_CORRELATION",
    pad_h: int = 0,
    pad_w: int = 0,
    stride_h: int = 1,
    stride_w: int = 1,
    dilate_h: int = 1,
    dilate_w: int = 1,
    sparse: str = "DENSE",
    format: str = "NCHW",
    name: str | None = None,
    comp_node=None,
    config=None,
    comp_graph=None,
) -> SymbolVar:
    """Locally connected convolution (registry name ``Local``): :func:`group_local` with
    one group and an (OH, OW, IC, FH, FW, OC) filter.

    Parameters
    ----------
    src : SymbolVar or array_like
        The (N, IC, IH, IW) float input.
    filter : SymbolVar or array_like
        The (OH, OW, IC, FH, FW, OC) filter.
    mode, pad_h, pad_w, stride_h, stride_w, dilate_h, dilate_w, sparse, format
        As for :func:`group_local` (``data_type`` of the reference's param is accepted at
        its default FLOAT only).
    param : opr_param_defs.ConvolutionV0, optional
        The whole param instead of fields.
    name, comp_node, config, comp_graph
        The operator config, as for every ``mgb.opr`` function.

    Returns
    -------
    SymbolVar
        The (N, OC, OH, OW) output.
    """
    p = _local_param(
        mode, pad_h, pad_w, stride_h, stride_w, dilate_h, dilate_w, sparse, format, "DEFAULT"
    )
    return build_opr(Local, [src, filter], p, None, name, comp_node, config, comp_graph)


# ---- serialization (megbrain/serialization/sereg.py) -------------------------------------
# the reference's Local and GroupLocal write param.Convolution only (registered as
# LocalV1...): the strategy field of ConvolutionParam is not kept (one algorithm here)
for _cls in (
    Local, LocalBackwardData, LocalBackwardFilter,
    GroupLocal, GroupLocalBackwardData, GroupLocalBackwardFilter,
):  # fmt: skip
    register_strict(_cls, name=_cls.__name__ + "V1")
del _cls
