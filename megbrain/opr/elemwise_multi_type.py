"""ElemwiseMultiType: elementwise modes whose inputs and output have different dtypes, with
the ``mgb.opr`` function ``elemwise_multi_type``.

Two families: fixed-point modes over integer/float32 operands of fixed dtypes
(``FUSE_MUL_ADD3_INT16x32x32x32``, ``ROUND_SHR_SATURATE_IXxI8xI8``...), and quantized modes
``Q<MODE>`` computing an Elemwise mode on dequantized inputs, quantized to an output dtype
that must be given (``dtype=``). There is no gradient, as in MegBrain.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..dtype import dtype_name, is_quantize
from ..errors import MegBrainError
from ..graph import OperatorNodeBase, ParamBase, register_opr, table_param
from ..graph.param_def import members_of
from ..kernels import elemwise_multi_type as emt_kernels
from ..serialization import sereg
from . import param_defs as pdefs
from .base import SymbolVar, _merge_config, canonize_input_vars, insert_opr
from .basic_arith import broadcast_shapes, fmt_dtype, same_dtype
from .param_args import opr_params

__all__ = ["ElemwiseMultiType", "ElemwiseMultiTypeParam", "elemwise_multi_type", "MODES"]

#: the reference's mode names, in its (serialization) order
MODES = members_of(pdefs.ElemwiseMultiType.Mode)
assert set(MODES) == set(emt_kernels.INT_MODES) | set(emt_kernels.QUANTIZED_MODES)


_BY_UPPER = {m.upper(): m for m in MODES}


@dataclass(frozen=True)
@table_param(pdefs.ElemwiseMultiType)
class ElemwiseMultiTypeParam(ParamBase):
    """The mode, stored under its reference name; given as that name in any case, its index
    or an enum member."""

    # declared, not derived, so it gets no _choices entry: its check is __post_init__'s
    mode: str = MODES[0]

    # not ParamBase's _choices: those store names upper-cased, and these have lower-case
    # letters (FUSE_MUL_ADD3_INT16x32x32x32)
    def __post_init__(self):
        v = self.mode
        if hasattr(v, "name") and not isinstance(v, str):
            v = v.name
        if isinstance(v, (int, np.integer)) and not isinstance(v, bool) and 0 <= v < len(MODES):
            v = MODES[int(v)]
        canon = _BY_UPPER.get(v.upper()) if isinstance(v, str) else None
        if canon is None:
            raise MegBrainError(
                f"ElemwiseMultiTypeParam: invalid mode={self.mode!r}; expected one of "
                + ", ".join(MODES)
            )
        object.__setattr__(self, "mode", canon)


def _quant_name(dt: np.dtype) -> str | None:
    return dtype_name(dt) if is_quantize(dt) else None


@register_opr
class ElemwiseMultiType(OperatorNodeBase):
    """Elementwise computation with NumPy broadcasting over inputs of the mode's dtypes."""

    Param = ElemwiseMultiTypeParam

    def _dtype_error(self, what: str, in_dtypes):
        got = ", ".join(f"{v.name!r} {fmt_dtype(d)}" for v, d in zip(self.inputs, in_dtypes))
        return self.error(f"mode {self.param.mode}: {what}; got inputs {got}")

    def infer_dtypes(self, in_dtypes):
        mode = self.param.mode
        n = emt_kernels.arity(mode)
        if len(in_dtypes) != n:
            raise self.error(f"mode {mode} takes {n} inputs, got {len(in_dtypes)}")
        want = self.config.dtype_value
        trait = emt_kernels.INT_MODES.get(mode)
        if trait is not None:
            for i, (d, allowed) in enumerate(zip(in_dtypes, trait.inputs)):
                if is_quantize(d) or not any(same_dtype(d, a) for a in allowed):
                    names = "/".join(a.name for a in allowed)
                    raise self._dtype_error(f"input {i} must be {names}", in_dtypes)
            if want is not None and not same_dtype(want, trait.out):
                raise self.error(
                    f"mode {mode} gives {trait.out.name}; the requested output dtype "
                    f"{fmt_dtype(want)} differs"
                )
            return [trait.out]
        supported = emt_kernels.QUANTIZED_DTYPE_NAMES
        kinds = [_quant_name(d) for d in in_dtypes]
        if any(k not in supported for k in kinds):
            raise self._dtype_error(f"inputs must be quantized ({', '.join(supported)})", in_dtypes)
        if len(set(kinds)) != 1:
            # MegDNN reads every input with input 0's storage type
            raise self._dtype_error("inputs must be of one quantized kind", in_dtypes)
        if want is None:
            raise self.error(f"mode {mode} needs its quantized output dtype (dtype=...)")
        if _quant_name(want) not in supported:
            raise self.error(
                f"mode {mode}: output dtype must be quantized ({', '.join(supported)}), got "
                f"{fmt_dtype(want)}"
            )
        return [want]

    def infer_shapes(self, in_shapes, in_values):
        return [broadcast_shapes(self, in_shapes)]

    def bind(self, ins, outs):
        return emt_kernels.bind(self.param.mode, ins, outs[0])


sereg.register_param_opr(ElemwiseMultiType, pdefs.ElemwiseMultiType)


@opr_params(("param", "ElemwiseMultiType"))
def elemwise_multi_type(
    *inputs,
    mode: str = MODES[0],
    name: str | None = None,
    comp_node=None,
    config=None,
    comp_graph=None,
    dtype=None,
) -> SymbolVar:
    """Elementwise ``mode`` over inputs of different dtypes (registry name
    ``ElemwiseMultiType``).

    Parameters
    ----------
    *inputs : SymbolVar or array_like
        The operands (a single list is taken as the operand list), broadcast together;
        numbers become constants of the first var's dtype.
    mode : str or ElemwiseMultiType.Mode
        A fixed-point mode (``FUSE_MUL_ADD3_INT16x32x32x32``, ``FUSE_MUL_ADD3_IXxF32xF32xI8``,
        ``ROUND_SHR_SATURATE_IXxI8xI8``, ``ROUND_SHR_SATURATE_IXxI8xI16``,
        ``FUSE_ADD_RMULH_ROUND_SHR_SATURATE_INT16x16x16x8`` / ``..._INT32x32x32x8``), whose
        output dtype is fixed, or a quantized mode ``Q<MODE>`` (``QADD``, ``QFUSE_ADD_RELU``,
        ``QSIGMOID``...): the Elemwise mode on dequantized inputs (QuantizedS8,
        Quantized8Asymm or QuantizedS32, all of one kind), quantized to ``dtype``.
    name, comp_node, config, comp_graph
        The operator config, as for every ``mgb.opr`` function.
    dtype : dtype-like, optional
        The output dtype; required by the quantized modes.

    Returns
    -------
    SymbolVar
        The result, of the inputs' broadcast shape.
    """
    if len(inputs) == 1 and isinstance(inputs[0], (list, tuple)):
        inputs = tuple(inputs[0])
    cfg = _merge_config(name, comp_node, config, dtype)
    param = ElemwiseMultiTypeParam(mode)
    vars_ = canonize_input_vars(list(inputs), comp_graph=comp_graph, config=cfg)
    return insert_opr(ElemwiseMultiType(vars_, param, cfg))[0]
