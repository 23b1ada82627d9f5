"""RelayoutFormat: MegDNN's conversions of tensors and filters to and from the
channel-blocked NCHW88 layout, with its ``mgb.opr`` function."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..errors import MegBrainError
from ..graph import OperatorNodeBase, ParamBase, register_opr, table_param
from ..graph.operator import NoGradient, fmt_shape
from ..graph.static_infer import infer_shape
from ..serialization import sereg
from . import param_defs as _pdefs
from .base import SymbolVar, _merge_config, canonize_input_vars, insert_opr
from .param_args import opr_params

__all__ = ["RelayoutFormat", "RelayoutFormatParam", "relayout_format"]

#: RelayoutFormat's modes to NCHW88: name -> (source ndim, the axis zero-padded to a multiple
#: of 8, the axes split in (blocks, 8), the permutation of the split source giving the result)
_TO_NCHW88 = {
    "NCHW_NCHW88": (4, 1, (1,), (0, 1, 3, 4, 2)),
    "NCHW_NCHW88_CONV_DENSE_WEIGHT": (4, 1, (0, 1), (0, 2, 4, 5, 3, 1)),
    "NCHW_NCHW88_CONV_GROUP_WEIGHT": (5, 2, (1, 2), (0, 1, 3, 5, 6, 4, 2)),
    "NCHW_NCHW88_CONV_CHAN_WEIGHT": (5, 0, (0,), (0, 2, 3, 4, 5, 1)),
}
_FROM_NCHW88 = "NCHW88_NCHW"


@dataclass(frozen=True)
@table_param(_pdefs.RelayoutFormat)
class RelayoutFormatParam(ParamBase):
    """Param of RelayoutFormat (MegDNN ``RelayoutFormat``): the conversion ``mode``."""


@register_opr
class RelayoutFormat(OperatorNodeBase):
    """The values of ``src`` in another tensor format (a copy): MegDNN's conversions to and
    from the channel-blocked NCHW88.

    - ``NCHW_NCHW88``: (N, C, H, W) -> (N, ceil(C/8), H, W, 8), channels zero-padded;
    - ``NCHW88_NCHW``: (N, C/8, H, W, 8) -> (N, C, H, W);
    - ``NCHW_NCHW88_CONV_DENSE_WEIGHT``: (OC, IC, FH, FW) -> (OC/8, ceil(IC/8), FH, FW,
      8 ic, 8 oc), ``OC % 8 == 0``;
    - ``NCHW_NCHW88_CONV_GROUP_WEIGHT``: (G, OCg, ICg, FH, FW) -> (G, OCg/8, ceil(ICg/8),
      FH, FW, 8 ic, 8 oc), ``OCg % 8 == 0``;
    - ``NCHW_NCHW88_CONV_CHAN_WEIGHT``: (G, 1, 1, FH, FW) -> (ceil(G/8), 1, 1, FH, FW, 8).

    The reference's other modes (the NHWCD4, CHWN4 and NCHW4 layouts) raise at shape
    inference. NCHW_NCHW88 and NCHW88_NCHW have the inverse relayout as gradient (NCHW_NCHW88
    of a channel count that is a multiple of 8).
    """

    Param = RelayoutFormatParam

    def _check_mode(self) -> None:
        mode = self.param.mode
        if mode != _FROM_NCHW88 and mode not in _TO_NCHW88:
            implemented = ", ".join([*_TO_NCHW88, _FROM_NCHW88])
            raise self.error(f"mode {mode} is not implemented (only {implemented})")

    def infer_shapes(self, in_shapes, in_values):
        self._check_mode()
        src, mode = tuple(in_shapes[0]), self.param.mode
        if mode == _FROM_NCHW88:
            if len(src) != 5 or src[4] != 8:
                raise self.error(f"{mode} needs a (N, C/8, H, W, 8) source, got {fmt_shape(src)}")
            return [(src[0], src[1] * 8, src[2], src[3])]
        ndim, pad_axis, splits, perm = _TO_NCHW88[mode]
        if len(src) != ndim:
            raise self.error(f"{mode} needs a {ndim}-d source, got {fmt_shape(src)}")
        if mode == "NCHW_NCHW88_CONV_CHAN_WEIGHT" and src[1:3] != (1, 1):
            raise self.error(f"{mode} needs a (G, 1, 1, FH, FW) filter, got {fmt_shape(src)}")
        for ax in splits:
            if ax != pad_axis and src[ax] % 8:
                raise self.error(
                    f"{mode}: dim {ax} of {fmt_shape(src)} ({src[ax]} output channels) must be "
                    "a multiple of 8"
                )
        split = _split_shape(_padded_shape(src, pad_axis), splits)
        return [tuple(split[i] for i in perm)]

    def bind(self, ins, outs):
        src, dst, mode = ins[0], outs[0], self.param.mode
        if mode == _FROM_NCHW88:
            n, c, h, w = dst.shape
            return functools.partial(
                np.copyto, dst.reshape(n, c // 8, 8, h, w).transpose(0, 1, 3, 4, 2), src
            )
        _, pad_axis, splits, perm = _TO_NCHW88[mode]
        padded = _padded_shape(src.shape, pad_axis)
        if padded == src.shape:
            return functools.partial(
                np.copyto, dst, src.reshape(_split_shape(padded, splits)).transpose(perm)
            )
        buf = np.zeros(padded, src.dtype)  # private: its padding channels stay zero
        part = buf[(slice(None),) * pad_axis + (slice(0, src.shape[pad_axis]),)]
        view = buf.reshape(_split_shape(padded, splits)).transpose(perm)

        def run() -> None:
            np.copyto(part, src)
            np.copyto(dst, view)

        return run

    def grad(self, wrt_idx, out_grads):
        og = out_grads[0]
        if og is None:
            return None
        mode = self.param.mode
        if mode == _FROM_NCHW88:
            return relayout_format(og, mode="NCHW_NCHW88").node
        if mode == "NCHW_NCHW88" and infer_shape(self.inputs[0])[1] % 8 == 0:
            return relayout_format(og, mode=_FROM_NCHW88).node
        raise self.error(f"mode {mode} has no gradient here", NoGradient)

    def default_name(self):
        return f"relayout_format({self.inputs[0].name})"


def _padded_shape(shape: tuple, axis: int) -> tuple:
    return shape[:axis] + (-(-shape[axis] // 8) * 8,) + shape[axis + 1 :]


def _split_shape(shape: tuple, axes: tuple) -> tuple:
    out: list[int] = []
    for i, d in enumerate(shape):
        out += [d // 8, 8] if i in axes else [d]
    return tuple(out)


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
        NCHW_NCHW88_CONV_GROUP_WEIGHT or NCHW_NCHW88_CONV_CHAN_WEIGHT (the reference's other
        modes raise).
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
