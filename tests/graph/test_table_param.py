"""table_param: an operator Param's fields, defaults and enum choices derived from a param-def
table (skip, default overrides, body overrides, inheritance, errors)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pytest

from megbrain.dtype import get_dtype_num
from megbrain.errors import MegBrainError
from megbrain.graph import ParamBase, table_param
from megbrain.graph.param_def import ParamDefTable

_t = ParamDefTable(__name__, dtype_num=get_dtype_num)
(
    _t.pdef("Demo")
    .add_enum("Mode", "ALPHA", "BETA", "GAMMA", default=1)
    .add_fields("uint32", "n", 3)
    .add_fields("float32", "x", 0.5)
    .add_fields("bool", "flag", True)
    .add_fields("dtype", "dt", "float32")
    .add_fields("int32", "k", -1)
)
_t.pdef("More").add_enum("Kind", "ONE", "TWO", name_field="kind").add_fields("float64", "eps", 1e-3)
T = _t.build()
Demo, More = T["Demo"], T["More"]


@dataclass(frozen=True)
@table_param(Demo)
class DemoParam(ParamBase):
    """The whole table."""


def _fields(cls):
    return [(f.name, f.type, f.default) for f in dataclasses.fields(cls)]


def test_fields_come_in_table_order_with_the_table_defaults():
    assert _fields(DemoParam) == [
        ("mode", "str", "BETA"),
        ("n", "int", 3),
        ("x", "float", 0.5),
        ("flag", "bool", True),
        ("dt", "np.dtype", np.dtype(np.float32)),
        ("k", "int", -1),
    ]
    assert DemoParam._choices == {"mode": ("ALPHA", "BETA", "GAMMA")}
    assert DemoParam._table is Demo and DemoParam._table_skip == frozenset()


def test_a_derived_param_is_a_frozen_hashable_param():
    p = DemoParam(mode="gamma", n=4)
    assert p.mode == "GAMMA" and DemoParam(mode=0).mode == "ALPHA"
    assert DemoParam(mode=Demo.Mode.GAMMA, n=4) == p and hash(DemoParam(mode=2, n=4)) == hash(p)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.n = 5  # type: ignore[misc]
    assert p.to_json() == {
        "mode": "GAMMA",
        "n": 4,
        "x": 0.5,
        "flag": True,
        "dt": "float32",
        "k": -1,
    }


def test_bad_enum_values_fail_as_for_hand_written_params():
    with pytest.raises(MegBrainError, match=r"DemoParam: invalid mode='delta'; expected one of"):
        DemoParam(mode="delta")
    with pytest.raises(MegBrainError, match=r"DemoParam: mode=3 out of range 0..2"):
        DemoParam(mode=3)


def test_skip_leaves_table_fields_out():
    @dataclass(frozen=True)
    @table_param(Demo, skip=("flag", "dt"))
    class P(ParamBase):
        pass

    assert [f.name for f in dataclasses.fields(P)] == ["mode", "n", "x", "k"]
    assert P._table_skip == {"flag", "dt"}


def test_defaults_change_a_table_default_and_keep_the_choices():
    @dataclass(frozen=True)
    @table_param(Demo, mode="GAMMA", n=7)
    class P(ParamBase):
        pass

    assert P().mode == "GAMMA" and P().n == 7
    assert P._choices == {"mode": ("ALPHA", "BETA", "GAMMA")}


def test_the_body_overrides_a_field_and_adds_its_own():
    @dataclass(frozen=True)
    @table_param(Demo, skip=("dt",))
    class P(ParamBase):
        #: None instead of the table's -1
        k: int | None = None
        # declared: its own check, not _choices
        mode: str = "beta"
        extra: str = "HEURISTIC"
        _choices = {"extra": ("HEURISTIC", "PROFILE")}

    assert _fields(P) == [
        ("mode", "str", "beta"),
        ("n", "int", 3),
        ("x", "float", 0.5),
        ("flag", "bool", True),
        ("k", "int | None", None),
        ("extra", "str", "HEURISTIC"),
    ]
    assert P._choices == {"extra": ("HEURISTIC", "PROFILE")}
    assert P(mode="anything").mode == "anything"


def test_a_subclass_inherits_the_base_fields_and_adds_the_new_table_ones():
    @dataclass(frozen=True)
    @table_param(More)
    class P(DemoParam):
        pass

    names = [f.name for f in dataclasses.fields(P)]
    assert names == [f.name for f in dataclasses.fields(DemoParam)] + ["kind", "eps"]
    assert P._choices == {"mode": ("ALPHA", "BETA", "GAMMA"), "kind": ("ONE", "TWO")}
    assert P(kind="two").kind == "TWO" and P._table is More


def test_misuse_is_refused_where_the_class_is_declared():
    with pytest.raises(TypeError, match="not a param-def class"):
        table_param(int)
    with pytest.raises(TypeError, match="Demo has no field nope"):
        table_param(Demo, skip=("nope",))
    with pytest.raises(TypeError, match="Demo has no field other"):
        table_param(Demo, other=1)
    with pytest.raises(TypeError, match="'DELTA' is no member of Demo.mode"):
        table_param(Demo, mode="DELTA")
    with pytest.raises(TypeError, match="apply table_param under @dataclass"):

        @table_param(Demo)
        @dataclass(frozen=True)
        class Above(ParamBase):
            pass

    with pytest.raises(TypeError, match="n overrides Demo.n without an annotation"):

        @table_param(Demo)
        class Unannotated(ParamBase):
            n = 4
