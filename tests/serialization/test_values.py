"""Tensor values and dtypes through files (hypothesis over shapes and dtypes), the dtype
table's quantization parameters, and operators that can not be dumped."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import megbrain as mgb
from megbrain.craniotome import CraniotomeBase
from megbrain.dtype import get_scale, get_zero_point
from megbrain.errors import SerializationError

_DTYPES = [
    np.dtype("float32"),
    np.dtype("int32"),
    np.dtype("int16"),
    np.dtype("int8"),
    np.dtype("uint8"),
    mgb.dtype.qint8(0.25),
    mgb.dtype.quint8(0.5, 3),
    mgb.dtype.qint32(0.125),
]


@settings(max_examples=25, deadline=None)
@given(
    shape=st.lists(st.integers(1, 4), min_size=1, max_size=4).map(tuple),
    dt=st.sampled_from(_DTYPES),
    seed=st.integers(0, 2**16),
    shared=st.booleans(),
)
def test_value_round_trip(tmp_path_factory, shape, dt, seed, shared):
    rng = np.random.RandomState(seed)
    raw = rng.randint(0, 100, size=shape).astype(dt.str)
    value = raw.view(dt) if dt.metadata else raw
    g = mgb.comp_graph()
    if shared:
        v = mgb.make_shared("cpu0", value=value, dtype=dt, comp_graph=g, name="v")
    else:
        v = mgb.make_immutable("cpu0", g, value, dtype=dt)
    path = str(tmp_path_factory.mktemp("v") / "g.mgb")
    res = mgb.serialize_comp_graph_to_file(path, {"out": v}, keep_param_name=True)
    assert res.tensor_value_bytes == raw.nbytes
    _, outd, (out,) = mgb.load_comp_graph_from_file(path)
    assert list(outd) == ["out"]
    assert out.dtype == dt
    if dt.metadata:
        assert get_scale(out.dtype) == get_scale(dt)
        if "zero_point" in str(dt.metadata):
            assert get_zero_point(out.dtype) == get_zero_point(dt)
    owner = out.node.owner
    got = owner.tensor.as_ndarray() if shared else owner.value
    np.testing.assert_array_equal(np.asarray(got).view(dt.str), raw)
    assert owner.type_name == ("SharedDeviceTensor" if shared else "ImmutableTensor")


def test_dtypes_without_file_number():
    from megbrain.serialization import sereg

    assert sereg.fbs_dtype_num(np.float32) == 0 and sereg.fbs_dtype_num("int8") == 2
    for dt in (np.bool_, np.float64):
        with pytest.raises(
            SerializationError, match="no number in MegBrain's file format|can not be serialized"
        ):
            sereg.fbs_dtype_num(dt)


class _Cube(CraniotomeBase):
    __nr_inputs__ = 1
    __nr_outputs__ = 1

    def infer_shape(self, inp_shapes):
        return inp_shapes

    def execute(self, inputs, outputs):
        outputs[0].set_value(inputs[0].get_value() ** 3)


def test_craniotome_is_named_at_dump(tmp_path):
    g = mgb.comp_graph()
    x = mgb.make_arg("cpu0", g, shape=(3,), name="x")
    y = _Cube.make(x)
    with pytest.raises(SerializationError, match=r"operator '_Cube\(x\)' \(Craniotome\)"):
        mgb.serialize_comp_graph_to_file(str(tmp_path / "c.mgb"), [y])


def test_empty_tensors(tmp_path):
    g = mgb.comp_graph()
    w = mgb.make_shared("cpu0", value=np.zeros((0, 3), "float32"), comp_graph=g, name="w")
    c = mgb.make_immutable("cpu0", g, np.zeros((2, 0), "int32"))
    path = str(tmp_path / "e.mgb")
    res = mgb.serialize_comp_graph_to_file(path, [w, c])
    assert res.tensor_value_bytes == 0
    _, _, (lw, lc) = mgb.load_comp_graph_from_file(path)
    assert lw.node.owner.tensor.shape == (0, 3)
    assert lc.node.owner.value.shape == (2, 0) and lc.dtype == np.int32
