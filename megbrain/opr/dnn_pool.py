"""Pooling operators: Pooling and PoolingBackward, with the ``mgb.opr`` function ``pooling``.

The NCHW format is implemented, for floating-point dtypes and (forward only, MegDNN's
integer arithmetic) the quantized ones, the forward channel-blocked NCHW88 for float32
(:mod:`megbrain.kernels.pool.nchw88`, an inference layout without gradient), and the
forward NCHW4 ``(N, C/4, H, W, 4)`` of any of those dtypes (the layout of ``use_nchw4``,
:mod:`megbrain.kernels.pool.nchw4`, no gradient); the gradient is
PoolingBackward (MegDNN's ``PoolingBackward``), computed from src, dst and diff.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..dtype import dtype_name, fmt_dtype, is_quantize, same_dtype
from ..errors import MegBrainError
from ..graph import OperatorNodeBase, register_opr
from ..graph.operator import NoGradient, fmt_shape, table_param
from ..graph.param_def import members_of
from ..kernels.pool import binds as pool_kernels
from ..kernels.pool import nchw4 as pool_nchw4
from ..kernels.pool import nchw88 as pool_nchw88
from ..serialization import sereg
from . import param_defs as pdefs
from .base import SymbolVar, build_opr
from .dnn import _float_dtype, _make, _NamedByKind, _WindowParam
from .param_args import opr_params
from .sereg_params import register_strict

__all__ = ["Pooling", "PoolingBackward", "PoolingEndPad", "PoolingEndPadParam", "PoolingParam",
           "pooling"]


POOLING_MODES = members_of(pdefs.Pooling.Mode)


@dataclass(frozen=True)
@table_param(pdefs.Pooling)
class PoolingParam(_WindowParam):
    """Param of Pooling and PoolingBackward (MegDNN ``Pooling``); of the formats NCHW is
    implemented, and NCHW88 for the forward float32 Pooling."""

    _int_fields = {"pad": 0, "stride": 1, "window": 1}

    @property
    def window(self) -> tuple[int, ...]:
        return self._per_axis("window")


class _PoolBase(_NamedByKind, OperatorNodeBase):
    Param = PoolingParam

    #: whether the operator computes the NCHW88 format too (the forward Pooling)
    blocked_format = False

    def _pooled_shape(self, src: tuple) -> tuple:
        p = self.param
        if self.blocked_format and p.format == "NCHW88":
            try:
                return pool_nchw88.pool_nchw88_shape(src, p.window, p.stride, p.pad)
            except ValueError as exc:
                raise self.error(str(exc)) from None
        if self.blocked_format and p.format == "NCHW4":
            if len(src) != 5 or src[4] != 4:
                raise self.error(f"NCHW4 pooling needs a (N, C/4, H, W, 4) src, got "
                                 f"{fmt_shape(src)}")  # fmt: skip
            out = self._pooled_shape_nchw((src[0], src[1] * 4, *src[2:4]))
            return (src[0], src[1], *out[2:], 4)
        if p.format != "NCHW":
            also = ", NCHW88 and NCHW4" if self.blocked_format else ""
            raise self.error(
                f"format {p.format} is not supported (only NCHW{also} is implemented)"
            )
        return self._pooled_shape_nchw(src)

    def _pooled_shape_nchw(self, src: tuple) -> tuple:
        p = self.param
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
    """MAX / AVERAGE / AVERAGE_COUNT_EXCLUDE_PADDING pooling of NCHW ``src`` (or of an
    NCHW88 ``(N, C/8, H, W, 8)`` float32 one, or an NCHW4 ``(N, C/4, H, W, 4)`` one)."""

    #: the reference's C++ type (Pooling is an alias of PoolingForward)
    type_name = "PoolingForward"

    short_name = "pooling"
    blocked_format = True

    def infer_dtypes(self, in_dtypes):
        if len(in_dtypes) != 1:
            raise self.error(f"expected 1 input (src), got {len(in_dtypes)}")
        src = in_dtypes[0]
        if self.param.format == "NCHW88" and np.dtype(src) != np.float32:
            raise self.error(f"NCHW88 pooling takes float32, got {fmt_dtype(src)}")
        if not is_quantize(src):
            return [_float_dtype(self, in_dtypes, ("src",))]
        kinds = pool_kernels.QUANTIZED_POOL_DTYPES
        want = self.config.dtype_value
        if dtype_name(src) not in kinds:
            raise self.error(f"src {self.inputs[0].name!r} {fmt_dtype(src)}: quantized pooling "
                             f"takes {', '.join(kinds)}")  # fmt: skip
        if want is not None and not same_dtype(want, src):
            raise self.error(f"the output dtype {fmt_dtype(want)} must be src "
                             f"{self.inputs[0].name!r}'s {fmt_dtype(src)}")  # fmt: skip
        return [src]

    def infer_shapes(self, in_shapes, in_values):
        return [self._pooled_shape(tuple(in_shapes[0]))]

    def bind(self, ins, outs):
        p = self.param
        if p.format == "NCHW88":
            return pool_nchw88.bind_pooling_nchw88(ins[0], outs[0], p.mode, p.window, p.stride,
                                                   p.pad)  # fmt: skip
        if p.format == "NCHW4":
            return pool_nchw4.bind_pooling_nchw4(ins[0], outs[0], p.mode, p.window, p.stride,
                                                 p.pad)  # fmt: skip
        return pool_kernels.bind_pooling(ins[0], outs[0], p.mode, p.window, p.stride, p.pad)

    def grad(self, wrt_idx, out_grads):
        if out_grads[0] is None:
            return None
        if self.param.format in ("NCHW88", "NCHW4"):
            flag = "use_nchw88" if self.param.format == "NCHW88" else "use_nchw4"
            raise self.error(
                f"the {self.param.format} format has no gradient here (it is an inference "
                f"layout, from optimize_for_inference({flag}=True)); differentiate the NCHW "
                "graph",
                NoGradient,
            )
        if is_quantize(self.outputs[0].dtype):
            raise self.error("quantized pooling has no gradient (inference only)")
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
    format : {"NCHW", "NCHW88", "NCHW4"}
        NCHW88 takes a float32 (N, C/8, IH, IW, 8) ``src``, NCHW4 a (N, C/4, IH, IW, 4) one
        (inference layouts: no gradient).
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
    return build_opr(Pooling, [src], param, None, name, comp_node, config, comp_graph)


@dataclass(frozen=True)
class PoolingEndPadParam(PoolingParam):
    """Param of PoolingEndPad: Pooling's and the padding ``end_h``, ``end_w`` after
    ``pad_h``, ``pad_w`` at the end of H and W."""

    end_h: int = 0
    end_w: int = 0


@register_opr
class PoolingEndPad(Pooling):
    """An NCHW88 MAX Pooling of its source padded at the end of H and W with the lowest
    value (ONNX's ceil mode): the windows there take the taps inside the image.

    Made at compile time by the ``fuse_pool_end_padding`` pass (:mod:`megbrain.gopt.nchw88`)
    from the Concats of ``-inf`` the ONNX importer pads with and the Pooling reading them,
    never by a user and never written to a graph file (MegDNN's Pooling has one symmetric
    padding per axis)."""

    type_name = "PoolingEndPad"
    short_name = "pooling_end_pad"
    Param = PoolingEndPadParam

    def _pooled_shape(self, src: tuple) -> tuple:
        p = self.param
        if p.format != "NCHW88" or p.mode != "MAX":
            raise self.error(f"the end padding is for NCHW88 MAX pooling, not {p.format} "
                             f"{p.mode}")  # fmt: skip
        try:
            return pool_nchw88.pool_nchw88_shape(src, p.window, p.stride, p.pad,
                                                 (p.end_h, p.end_w))  # fmt: skip
        except ValueError as exc:
            raise self.error(str(exc)) from None

    def bind(self, ins, outs):
        p = self.param
        return pool_nchw88.bind_pooling_nchw88(ins[0], outs[0], p.mode, p.window, p.stride,
                                               p.pad, (p.end_h, p.end_w))  # fmt: skip


register_strict(Pooling, name="Pooling")  # param.Pooling, PoolingParam's table
register_strict(PoolingBackward)


sereg.register_fused(PoolingEndPad,
                     lambda opr: "a Pooling and the end padding of its source fused")  # fmt: skip
