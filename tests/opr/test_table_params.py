"""Every operator Param derived from a param-def table (graph.table_param) has the table's
fields, defaults and enum choices, but for the differences listed here on purpose."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import megbrain.opr  # noqa: F401  (loads every family, so every Param class exists)
from megbrain.graph import ParamBase
from megbrain.graph.param_def import members_of
from megbrain.opr import param_defs as P

#: the Params derived from a table, by class name -> table
EXPECTED = {
    "AxisParam": P.Axis,
    "ConcatParam": P.Axis,
    "ElemwiseParam": P.Elemwise,
    "ReduceParam": P.Reduce,
    "MatrixMulParam": P.MatrixMul,
    "CollectiveCommParam": P.CollectiveComm,
    "CondExecPredParam": P.CondExecPred,
    "CondExecPredLogicalParam": P.CondExecPredLogical,
    "CondExecMarkParam": P.CondExecMark,
    "CondExecMergeParam": P.CondExecMerge,
    "ConvolutionParam": P.Convolution,
    "Convolution3DParam": P.Convolution3D,
    "ConvBiasParam": P.ConvBias,
    "PoolingParam": P.Pooling,
    "ROIPoolingParam": P.ROIPooling,
    "ROIAlignParam": P.ROIAlign,
    "WarpPerspectiveParam": P.WarpPerspective,
    "ResizeParam": P.Resize,
    "BNParam": P.BN,
    "LRNParam": P.LRN,
    "ElemwiseMultiTypeParam": P.ElemwiseMultiType,
    "AllocParam": P.DType,
    "EyeParam": P.Eye,
    "LinspaceParam": P.Linspace,
    "UniformRNGParam": P.UniformRNG,
    "GaussianRNGParam": P.GaussianRNG,
    "IndexingRemapParam": P.IndexingRemap,
    "SVDParam": P.SVD,
    "ArgsortParam": P.Argsort,
    "TopKParam": P.TopK,
    "CumsumParam": P.Cumsum,
    "CondTakeParam": P.CondTake,
    "RelayoutFormatParam": P.RelayoutFormat,
    "AssertEqualParam": P.AssertEqual,
    "PersistentOutputStorageParam": P.PersistentOutputStorage,
}

#: (Param, field) -> our default, where it is not the table's on purpose
OUR_DEFAULTS = {
    ("ElemwiseParam", "mode"): "ADD",
    ("ReduceParam", "axis"): None,
    ("AllocParam", "dtype"): np.dtype(np.float32),
}
#: (Param, field) of enum fields checked by the Param itself instead of ``_choices``
OWN_ENUM_CHECK = {("ElemwiseMultiTypeParam", "mode")}
#: Params whose table fields come in another order: ConvBias's are ConvolutionParam's first
OTHER_ORDER = {"ConvBiasParam"}


def _subclasses(cls: type) -> set[type]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub} | _subclasses(sub)
    return out


def _table_default(f) -> object:
    # as a Param holds it: an enum member's name, a dtype as np.dtype, a converted number
    if f.enum is not None:
        return f.default
    return np.dtype(f.default) if f.ctype == "dtype" else f.convert(f.default)


DERIVED = {
    c.__name__: c
    for c in _subclasses(ParamBase)
    if "_table" in c.__dict__ and c.__module__.startswith("megbrain.")
}


def test_every_table_param_is_derived():
    assert {n: c._table for n, c in DERIVED.items()} == EXPECTED


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_param_has_its_tables_fields_and_defaults(name):
    pcls = DERIVED[name]
    table = pcls._table
    ours = {f.name: f for f in dataclasses.fields(pcls)}
    kept = [f for f in table.FIELDS if f.name not in pcls._table_skip]
    assert not pcls._table_skip & set(ours), "a skipped field is a field of the Param"
    assert {f.name for f in kept} <= set(ours)
    for f in kept:
        default = ours[f.name].default
        want = OUR_DEFAULTS.get((name, f.name), _table_default(f))
        assert type(default) is type(want) and default == want, (f.name, default, want)
        if f.enum is None:
            continue
        if (name, f.name) in OWN_ENUM_CHECK:
            for m in members_of(f.enum):
                assert getattr(pcls(**{f.name: m}), f.name) == m
        else:
            assert pcls._choices[f.name] == members_of(f.enum), f.name
    if name not in OTHER_ORDER:
        in_order = [n for n in ours if n in {f.name for f in kept}]
        assert in_order == [f.name for f in kept]


def test_the_default_param_is_the_default_table_but_for_our_defaults():
    from megbrain.opr.sereg_params import param_to_def

    for name, pcls in DERIVED.items():
        if any(n == name for n, _ in OUR_DEFAULTS):
            continue
        table = pcls._table
        got = param_to_def(table, pcls())
        assert got == table(), name
