"""Operator footprint: memory touched and arithmetic work, as the reference's OprFootprint."""

from __future__ import annotations

import numpy as np

from ..dtype import dtype_size

__all__ = ["opr_footprint"]


def _nelems(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def opr_footprint(opr, in_shapes, out_shapes) -> dict:
    """The footprint of ``opr`` for the given input and output shapes (None: unknown).

    Returns
    -------
    dict
        ``computation`` (arithmetic operations, None where no formula is known: only
        Elemwise and MatrixMul have one), ``memory`` (bytes of the known inputs and
        outputs), ``in_shapes``, ``out_shapes`` and ``param`` (the operator's param as
        JSON, or None), the keys of the reference's ``OprFootprint::Result::to_json``.
    """
    memory = 0
    for v, shp in zip([*opr.inputs, *opr.outputs], [*in_shapes, *out_shapes]):
        if shp is not None:
            memory += _nelems(shp) * dtype_size(v.dtype)
    computation = None
    if opr.type_name == "Elemwise" and out_shapes and out_shapes[0] is not None:
        computation = _nelems(out_shapes[0]) * max(len(opr.inputs) - 1, 1)
    elif opr.type_name == "MatrixMul" and None not in in_shapes[:2]:
        p = opr.param
        m = in_shapes[0][1] if p.transposeA else in_shapes[0][0]
        k = in_shapes[0][0] if p.transposeA else in_shapes[0][1]
        n = in_shapes[1][0] if p.transposeB else in_shapes[1][1]
        computation = 2 * m * n * k
    param = opr.param.to_json() if hasattr(opr.param, "to_json") else None
    return {
        "computation": computation,
        "memory": memory,
        "in_shapes": [list(s) if s is not None else None for s in in_shapes],
        "out_shapes": [list(s) if s is not None else None for s in out_shapes],
        "param": param,
    }
