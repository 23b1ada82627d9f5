"""RelayoutFormat: MegDNN's conversions of tensors and filters to and from the
channel-blocked NCHW88 and NCHW4 layouts, with its ``mgb.opr`` function."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..dtype import dtype_name, get_zero_point, is_quantize
from ..errors import MegBrainError
from ..graph import OperatorNodeBase, ParamBase, register_opr, table_param
from ..graph.operator import NoGradient, fmt_shape
from ..graph.static_infer import infer_shape
from ..kernels.conv import nchw4 as conv_nchw4
from ..kernels.steps import chain
from ..serialization import sereg
from . import param_defs as _pdefs
from .base import SymbolVar, _merge_config, canonize_input_vars, insert_opr
from .param_args import opr_params

__all__ = ["RelayoutFormat", "RelayoutFormatParam", "relayout_format"]

#: RelayoutFormat's modes to a channel-blocked layout: name -> {source ndim: (the block, the
#: axes zero-padded to a multiple of it, the axes split in (blocks, block), the permutation of
#: the split source giving the result)}
_TO_BLOCKED = {
    "NCHW_NCHW88": {4: (8, (1,), (1,), (0, 1, 3, 4, 2))},
    "NCHW_NCHW88_CONV_DENSE_WEIGHT": {4: (8, (1,), (0, 1), (0, 2, 4, 5, 3, 1))},
    "NCHW_NCHW88_CONV_GROUP_WEIGHT": {5: (8, (2,), (1, 2), (0, 1, 3, 5, 6, 4, 2))},
    "NCHW_NCHW88_CONV_CHAN_WEIGHT": {5: (8, (0,), (0,), (0, 2, 3, 4, 5, 1))},
    "NCHW_NCHW4": {4: (4, (1,), (1,), (0, 1, 3, 4, 2))},
    "NCHW_NCHW4_WEIGHT": {
        4: (4, (0, 1), (1,), (0, 1, 3, 4, 2)),
        5: (4, (1, 2), (2,), (0, 1, 2, 4, 5, 3)),
    },
}
#: the modes back to NCHW: name -> the block
_FROM_BLOCKED = {"NCHW88_NCHW": 8, "NCHW4_NCHW": 4}


@dataclass(frozen=True)
@table_param(_pdefs.RelayoutFormat)
class RelayoutFormatParam(ParamBase):
    """Param of RelayoutFormat (MegDNN ``RelayoutFormat``): the conversion ``mode``."""


@register_opr
class RelayoutFormat(OperatorNodeBase):
    """The values of ``src`` in another tensor format (a copy): MegDNN's conversions to and
    from the channel-blocked NCHW88 and NCHW4.

    - ``NCHW_NCHW88``: (N, C, H, W) -> (N, ceil(C/8), H, W, 8), channels zero-padded;
    - ``NCHW88_NCHW``: (N, C/8, H, W, 8) -> (N, C, H, W);
    - ``NCHW_NCHW88_CONV_DENSE_WEIGHT``: (OC, IC, FH, FW) -> (OC/8, ceil(IC/8), FH, FW,
      8 ic, 8 oc), ``OC % 8 == 0``;
    - ``NCHW_NCHW88_CONV_GROUP_WEIGHT``: (G, OCg, ICg, FH, FW) -> (G, OCg/8, ceil(ICg/8),
      FH, FW, 8 ic, 8 oc), ``OCg % 8 == 0``;
    - ``NCHW_NCHW88_CONV_CHAN_WEIGHT``: (G, 1, 1, FH, FW) -> (ceil(G/8), 1, 1, FH, FW, 8);
    - ``NCHW_NCHW4``: (N, C, H, W) -> (N, ceil(C/4), H, W, 4), channels padded;
    - ``NCHW4_NCHW``: (N, C/4, H, W, 4) -> (N, C, H, W);
    - ``NCHW_NCHW4_WEIGHT``: (OC, IC, FH, FW) -> (ceil(OC/4) 4, ceil(IC/4), FH, FW, 4), or
      grouped (G, OCg, ICg, FH, FW) -> (G, ceil(OCg/4) 4, ceil(ICg/4), FH, FW, 4): the
      filter of an NCHW4 convolution, both channel counts padded.

    The padding is zeros (a Quantized8Asymm tensor's: its zero point), as the reference pads.
    Dtypes are kept (quantized ones too). The reference's other modes (the NHWCD4 and CHWN4
    layouts, NCHW4's small-channel and NCHW64's) raise at shape inference. NCHW_NCHW88,
    NCHW_NCHW4 and the modes back have the inverse relayout as gradient (NCHW_NCHW88 and
    NCHW_NCHW4 of a channel count that is a multiple of the block).
    """

    Param = RelayoutFormatParam

    def _check_mode(self) -> None:
        mode = self.param.mode
        if mode not in _FROM_BLOCKED and mode not in _TO_BLOCKED:
            implemented = ", ".join([*_TO_BLOCKED, *_FROM_BLOCKED])
            raise self.error(f"mode {mode} is not implemented (only {implemented})")

    def infer_shapes(self, in_shapes, in_values):
        self._check_mode()
        src, mode = tuple(in_shapes[0]), self.param.mode
        if mode in _FROM_BLOCKED:
            k = _FROM_BLOCKED[mode]
            if len(src) != 5 or src[4] != k:
                raise self.error(
                    f"{mode} needs a (N, C/{k}, H, W, {k}) source, got {fmt_shape(src)}"
                )
            return [(src[0], src[1] * k, src[2], src[3])]
        variants = _TO_BLOCKED[mode]
        if len(src) not in variants:
            ndims = " or ".join(f"{n}-d" for n in variants)
            raise self.error(f"{mode} needs a {ndims} source, got {fmt_shape(src)}")
        block, pads, splits, perm = variants[len(src)]
        if mode == "NCHW_NCHW88_CONV_CHAN_WEIGHT" and src[1:3] != (1, 1):
            raise self.error(f"{mode} needs a (G, 1, 1, FH, FW) filter, got {fmt_shape(src)}")
        for ax in splits:
            if ax not in pads and src[ax] % block:
                raise self.error(
                    f"{mode}: dim {ax} of {fmt_shape(src)} ({src[ax]} output channels) must be "
                    f"a multiple of {block}"
                )
        split = _split_shape(_padded_shape(src, pads, block), splits, block)
        return [tuple(split[i] for i in perm)]

    def bind(self, ins, outs):
        src, dst, mode = ins[0], outs[0], self.param.mode
        if mode == "NCHW4_NCHW":
            return conv_nchw4.bind_blocked_copy(src, dst)
        if mode == "NCHW_NCHW4":
            if src.shape[1] % 4 == 0:
                return conv_nchw4.bind_blocked_copy(src, dst)
            # a private padded copy (its padding stays the pad value), then relaid
            buf = np.full((*src.shape[:1], dst.shape[1] * 4, *src.shape[2:]),
                          _pad_value(src.dtype), src.dtype)  # fmt: skip
            return chain([functools.partial(np.copyto, buf[:, : src.shape[1]], src),
                          conv_nchw4.bind_blocked_copy(buf, dst)])  # fmt: skip
        if mode in _FROM_BLOCKED:
            k = _FROM_BLOCKED[mode]
            n, c, h, w = dst.shape
            return functools.partial(
                np.copyto, dst.reshape(n, c // k, k, h, w).transpose(0, 1, 3, 4, 2), src
            )
        block, pads, splits, perm = _TO_BLOCKED[mode][src.ndim]
        padded = _padded_shape(src.shape, pads, block)
        if padded == src.shape:
            return functools.partial(
                np.copyto, dst, src.reshape(_split_shape(padded, splits, block)).transpose(perm)
            )
        # private: its padding stays the pad value
        buf = np.full(padded, _pad_value(src.dtype), src.dtype)
        part = buf[tuple(slice(0, d) for d in src.shape)]
        view = buf.reshape(_split_shape(padded, splits, block)).transpose(perm)

        def run() -> None:
            np.copyto(part, src)
            np.copyto(dst, view)

        return run

    def grad(self, wrt_idx, out_grads):
        og = out_grads[0]
        if og is None:
            return None
        mode = self.param.mode
        back = {"NCHW88_NCHW": "NCHW_NCHW88", "NCHW4_NCHW": "NCHW_NCHW4"}
        if mode in back:
            return relayout_format(og, mode=back[mode]).node
        inverse = {v: k for k, v in back.items()}
        if mode in inverse and infer_shape(self.inputs[0])[1] % _FROM_BLOCKED[inverse[mode]] == 0:
            return relayout_format(og, mode=inverse[mode]).node
        raise self.error(f"mode {mode} has no gradient here", NoGradient)

    def default_name(self):
        return f"relayout_format({self.inputs[0].name})"


def _padded_shape(shape: tuple, axes: tuple, block: int) -> tuple:
    return tuple(-(-d // block) * block if i in axes else d for i, d in enumerate(shape))


def _split_shape(shape: tuple, axes: tuple, block: int) -> tuple:
    out: list[int] = []
    for i, d in enumerate(shape):
        out += [d // block, block] if i in axes else [d]
    return tuple(out)


def _pad_value(dtype: np.dtype) -> int:
    """The channels' padding of a tensor of ``dtype``: zero, a Quantized8Asymm tensor's
    zero point (the reference's)."""
    if is_quantize(dtype) and dtype_name(dtype) == "Quantized8Asymm":
        return get_zero_point(dtype)
    return 0


@opr_params(("param", "RelayoutFormat"))
def relayout_format(
    src, *, mode="NHWC_NHWCD4", param=None, name=None, comp_node=None, config=None,
    comp_graph=None,
) -> SymbolVar:  # fmt: skip
    """``src`` converted to another tensor format (registry name ``RelayoutFormat``).

    Parameters
    ----------
    src : SymbolVar or array_like
        The tensor to convert.
    mode : str
        The conversion: NCHW_NCHW88, NCHW88_NCHW, NCHW_NCHW88_CONV_DENSE_WEIGHT,
        NCHW_NCHW88_CONV_GROUP_WEIGHT, NCHW_NCHW88_CONV_CHAN_WEIGHT, NCHW_NCHW4, NCHW4_NCHW
        or NCHW_NCHW4_WEIGHT (the reference's other modes raise).
    param : RelayoutFormatParam, optional
        The whole param, instead of ``mode``.
    name, comp_node, config, comp_graph
        The operator config, as for every ``mgb.opr`` function.

    Returns
    -------
    SymbolVar
        The converted tensor (see :class:`RelayoutFormat` for the shapes).
    """
    if param is None:
        param = RelayoutFormatParam(mode)
    elif not isinstance(param, RelayoutFormatParam):
        raise MegBrainError(f"relayout_format: param must be a RelayoutFormatParam, got {param!r}")
    cfg = _merge_config(name, comp_node, config)
    (var,) = canonize_input_vars([src], comp_graph=comp_graph, config=cfg)
    return insert_opr(RelayoutFormat([var], param, cfg))[0]


sereg.register_param_opr(
    RelayoutFormat,
    _pdefs.RelayoutFormat,
    to_def=lambda p: _pdefs.RelayoutFormat(mode=_pdefs.RelayoutFormat.Mode[p.mode]),
    from_def=lambda d: RelayoutFormatParam(d.mode.name),
)
