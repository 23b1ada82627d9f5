"""Every param table of the OperatorParam union writes and reads back (what other operator
families rely on when they register)."""

import flatbuffers
import numpy as np
import pytest

import megbrain.opr_param_defs as pdefs
from megbrain.errors import SerializationError
from megbrain.opr.param_defs import PARAM_DEFS
from megbrain.serialization import fbs, sereg

_UNION = [c for n, c in PARAM_DEFS.items() if not c.IS_LEGACY and n in sereg.OPERATOR_PARAM_UNION]


def _round_trip(obj):
    spec = sereg.table_spec_of(obj)
    b = flatbuffers.Builder(64)
    b.Finish(fbs.write_table(b, spec, obj))
    return fbs.read_table(fbs.Reader(b.Output()).root(), spec), len(b.Output())


def _changed(cls):
    kw = {}
    for f in cls.FIELDS:
        if f.ctype == "enum":
            kw[f.name] = list(f.enum)[-1]
        elif f.ctype == "bool":
            kw[f.name] = not f.default
        elif f.ctype in ("float32", "float64"):
            kw[f.name] = 0.5
        elif f.ctype == "dtype":
            kw[f.name] = "int8"
        elif f.ctype == "int32":
            kw[f.name] = -3
        else:
            kw[f.name] = 3
    return cls(**kw)


def test_union_covers_the_tables():
    names = {c.__name__ for c in _UNION}
    assert len(sereg.OPERATOR_PARAM_UNION) == 69
    assert {"Elemwise", "MatrixMul", "ConvBias", "OptionalAxisV1", "Remap"} <= names
    assert sereg.table_spec_of(pdefs.Elemwise).union_type == 17
    assert sereg.table_spec_of(pdefs.Remap).union_type == 68
    assert sereg.table_spec_of(sereg.DTypeParam("float32")).union_type == 67
    assert sereg.table_spec_of(sereg.CPP_PARAMS["MGBAddUpdate"]).union_type == 16


@pytest.mark.parametrize("cls", _UNION, ids=lambda c: c.__name__)
def test_pdef_tables(cls):
    default = cls()
    got, size_default = _round_trip(default)
    assert got == default
    changed = _changed(cls)
    got, size_changed = _round_trip(changed)
    assert got == changed
    # fields at their defaults are omitted, as flatc's code does
    assert size_default <= size_changed


def test_legacy_and_non_union_params_refused():
    for cls in (pdefs.ConvolutionV0, pdefs.AddUpdate, pdefs.Sleep):
        with pytest.raises(SerializationError, match="not a table of the OperatorParam union"):
            sereg.table_spec_of(cls)


def test_cpp_tables():
    cpp = sereg.CPP_PARAMS
    objs = [
        cpp["Host2DeviceCopy"](enable_value_infer=False, dump_default_value=True),
        cpp["Dimshuffle"](pattern=[2, -1, 0], ndim=3),
        cpp["AxisAddRemove"](desc=[(0, 1), (1, -2)]),
        cpp["MGBSleep"](seconds=0.25, host=True),
        cpp["IndexDescMaskDump"](
            items=[(1, True, False, True, False), (0, False, False, False, True)]
        ),
        cpp["NMSKeep"](iou_thresh=0.5, max_output=7),
        cpp["MGBAddUpdate"](
            alpha=sereg.persistent_scalar(0.5),
            beta=sereg.persistent_scalar(2, "int32"),
            bias=None,
        ),
        sereg.DTypeParam(np.dtype("int16")),
        cpp["Dimshuffle"](),
    ]
    for obj in objs:
        got, _ = _round_trip(obj)
        assert got == obj, obj
    add = _round_trip(objs[6])[0]
    assert sereg.persistent_scalar_value(add.alpha) == 0.5
    assert sereg.persistent_scalar_value(add.beta) == 2
    assert add.bias is None


def test_quantized_dtype_table():
    from megbrain.dtype import qint8, quint8

    for dt in (qint8(0.5), quint8(0.25, 7)):
        got, _ = _round_trip(sereg.DTypeParam(dt))
        assert got == sereg.DTypeParam(dt)


@pytest.mark.parametrize("cls", [pdefs.Convolution, pdefs.Reduce, pdefs.Eye], ids=str)
def test_defaults_written_or_omitted_read_the_same(cls):
    spec = sereg.table_spec_of(cls)
    sizes = []
    for force in (False, True):
        b = flatbuffers.Builder(64)
        b.ForceDefaults(force)
        b.Finish(fbs.write_table(b, spec, cls()))
        out = b.Output()
        sizes.append(len(out))
        assert fbs.read_table(fbs.Reader(out).root(), spec) == cls()
    assert sizes[0] < sizes[1]
