"""ParamPackSplit / ParamPackConcat: parameters packed into one 1-d var at aligned offsets
(the gradient buckets of data-parallel training), with ``param_pack_split``,
``param_pack_concat`` and ``param_pack_offsets``. The reference only copies them between
graphs; it never dumps them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import MegBrainError
from ..graph import OperatorNodeBase, ParamBase, register_opr, static_shape
from ..graph.operator import fmt_shape
from .base import SymbolVar, _merge_config, canonize_input_vars, input_list, insert_opr
from .indexing_adv import _insert, _zeros_like
from .param_args import as_int
from .tensor_manip import reshape

__all__ = [
    "ParamPackSplit",
    "ParamPackConcat",
    "param_pack_split",
    "param_pack_concat",
    "param_pack_offsets",
]


# ---- ParamPackSplit / ParamPackConcat --------------------------------------------------------
@dataclass(frozen=True)
class ParamPackParam(ParamBase):
    #: ``(begin0, end0, begin1, end1, ...)`` element offsets of each part in the pack
    offsets: tuple = ()
    #: the shape of each part
    shapes: tuple = ()

    def __post_init__(self):
        super().__post_init__()
        shapes = tuple(tuple(int(s) for s in shp) for shp in self.shapes)
        offsets = tuple(int(o) for o in self.offsets)
        if len(offsets) != 2 * len(shapes) or any(
            e - b != int(np.prod(s, dtype=np.int64))
            for b, e, s in zip(offsets[::2], offsets[1::2], shapes)
        ):
            raise MegBrainError(f"param pack: offsets {offsets} do not fit shapes {shapes}")
        object.__setattr__(self, "shapes", shapes)
        object.__setattr__(self, "offsets", offsets)


def param_pack_offsets(shapes, dtype, comp_node) -> tuple[int, ...]:
    """``(begin, end, ...)`` element offsets of ``shapes`` packed one after another, each
    beginning at a multiple of the comp node's memory alignment (``gen_offsets``)."""
    align = max(1, int(getattr(comp_node, "mem_align", 64)) // np.dtype(dtype).itemsize)
    out, off = [], 0
    for shp in shapes:
        off = -(-off // align) * align
        out.append(off)
        off += int(np.prod(shp, dtype=np.int64))
        out.append(off)
    return tuple(out)


@register_opr
class ParamPackSplit(OperatorNodeBase):
    """A packed 1-d param split into views of the given shapes at the given offsets."""

    Param = ParamPackParam

    def __init__(self, inputs, param=None, config=None):
        super().__init__(inputs, param, config)
        self.nr_outputs = len(param.shapes)
        if not self.nr_outputs:
            raise MegBrainError("ParamPackSplit: no shapes given")

    def infer_shapes(self, in_shapes, in_values):
        src = in_shapes[0]
        end = max(self.param.offsets[1::2])
        if len(src) != 1 or src[0] < end:
            raise self.error(f"src must be 1-d with at least {end} elements, got {fmt_shape(src)}")
        return list(self.param.shapes)

    def _views(self, src):
        p = self.param
        return [src[b:e].reshape(s) for b, e, s in zip(p.offsets[::2], p.offsets[1::2], p.shapes)]

    def fwd_views(self, ins):
        return None if ins[0] is None else self._views(ins[0])

    def bind(self, ins, outs):
        src = ins[0]
        pairs = [(o, v) for o, v in zip(outs, self._views(src)) if not np.may_share_memory(o, src)]

        def run():
            for o, v in pairs:
                np.copyto(o, v)

        return run

    def grad(self, wrt_idx, out_grads):
        src = self.inputs[0]
        parts = [
            g if g is not None else _zeros_like(o).node for g, o in zip(out_grads, self.outputs)
        ]
        size = static_shape(src)
        if size is None:
            raise self.error("the gradient needs the static shape of src")
        param = ParamPackConcatParam(self.param.offsets, self.param.shapes, size[0])
        return _insert(ParamPackConcat, parts, param)


@dataclass(frozen=True)
class ParamPackConcatParam(ParamPackParam):
    #: the number of elements of the pack; 0 means the last end offset
    size: int = 0


@register_opr
class ParamPackConcat(OperatorNodeBase):
    """Parts packed into one 1-d var at the given offsets; gaps are zeros."""

    Param = ParamPackConcatParam

    def infer_dtypes(self, in_dtypes):
        if any(d != in_dtypes[0] for d in in_dtypes):
            raise self.error("parts must share one dtype, got " + ", ".join(map(str, in_dtypes)))
        return [in_dtypes[0]]

    def _size(self) -> int:
        return self.param.size or max(self.param.offsets[1::2])

    def infer_shapes(self, in_shapes, in_values):
        p = self.param
        if len(in_shapes) != len(p.shapes) or any(
            tuple(a) != b for a, b in zip(in_shapes, p.shapes)
        ):
            raise self.error(
                f"part shapes {', '.join(map(fmt_shape, in_shapes))} differ from the pack "
                f"shapes {', '.join(map(fmt_shape, p.shapes))}"
            )
        if self._size() < max(p.offsets[1::2]):
            raise self.error(f"pack size {self._size()} too small for offsets {p.offsets}")
        return [(self._size(),)]

    def bind(self, ins, outs):
        out, p = outs[0], self.param
        spans = list(zip(p.offsets[::2], p.offsets[1::2]))

        def run():
            out.fill(0)
            for (b, e), a in zip(spans, ins):
                out[b:e] = a.reshape(-1)

        return run

    def grad(self, wrt_idx, out_grads):
        if out_grads[0] is None:
            return None
        b, e = self.param.offsets[2 * wrt_idx : 2 * wrt_idx + 2]
        return reshape(SymbolVar(out_grads[0])[b:e], self.param.shapes[wrt_idx]).node


def param_pack_split(src, shapes, *, name=None, comp_node=None, config=None) -> list[SymbolVar]:
    """Split the packed 1-d ``src`` into views of ``shapes`` (``ParamPackSplit``).

    Each part begins at a multiple of the comp node's memory alignment, as
    :func:`param_pack_offsets` computes; ``src`` must hold at least the last end offset.
    """
    cfg = _merge_config(name, comp_node, config)
    (v,) = canonize_input_vars([src], config=cfg)
    shapes = tuple(
        tuple(as_int(s, "param_pack_split", f"shapes[{i}]", "an int size") for s in shp)
        for i, shp in enumerate(shapes)
    )
    offsets = param_pack_offsets(shapes, v.dtype, v.comp_node)
    return insert_opr(ParamPackSplit([v], ParamPackParam(offsets, shapes), cfg))


def param_pack_concat(srcs, *, name=None, comp_node=None, config=None) -> SymbolVar:
    """Pack ``srcs`` into one 1-d var at aligned offsets (``ParamPackConcat``), the inverse of
    :func:`param_pack_split`."""
    cfg = _merge_config(name, comp_node, config)
    vars_ = canonize_input_vars(input_list(srcs, "srcs"), config=cfg)
    shapes = []
    for v in vars_:
        s = static_shape(v)
        if s is None:
            raise MegBrainError(f"param_pack_concat: the shape of {v.name!r} is not static")
        shapes.append(s)
    offsets = param_pack_offsets(shapes, vars_[0].dtype, vars_[0].comp_node)
    param = ParamPackConcatParam(offsets, tuple(shapes), 0)
    return insert_opr(ParamPackConcat(vars_, param, cfg))[0]
