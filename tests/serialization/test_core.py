"""The serialization core: registry, file layout and a round trip below the API."""

import struct

import numpy as np
import pytest
import xxhash

import megbrain as mgb
from megbrain.api.comp_graph import CompGraph
from megbrain.errors import SerializationError
from megbrain.serialization import DumpConfig, LoadConfig, dump_graph, load_graph, sereg


def _graph():
    g = mgb.comp_graph()
    x = mgb.make_arg("cpu0", g, shape=(2, 3), name="x")
    w = mgb.make_shared(
        "cpu0", value=np.arange(6, dtype="float32").reshape(2, 3), comp_graph=g, name="w"
    )
    y = mgb.opr.elemwise(x * w + 1.5, mode="relu", name="y")
    return g, x, w, y


def test_type_id_strips_version_tail():
    seed = 20160701
    assert sereg.type_id_of("Elemwise") == xxhash.xxh64_intdigest(b"Elemwise", seed=seed)
    assert sereg.type_id_of("MatrixMulV2") == sereg.type_id_of("MatrixMul")
    assert sereg.type_id_of("V2") == xxhash.xxh64_intdigest(b"V2", seed=seed)


def test_header_and_identifier():
    _, _, _, y = _graph()
    data, res = dump_graph([y.node])
    magic, reserved, offset = struct.unpack_from("<IIQ", data)
    assert (magic, reserved) == (0x5342474D, 0)
    assert data[:4] == b"MGBS"
    assert offset == res.tensor_value_bytes
    fbs = 16 + offset
    (size,) = struct.unpack_from("<I", data, fbs)
    assert fbs + 4 + size == len(data) == res.tot_bytes
    assert data[fbs + 8 : fbs + 12] == b"mgb1"


def test_round_trip_below_api():
    _, _, _, y = _graph()
    data, res = dump_graph([y.node], DumpConfig(keep_param_name=True))
    assert (res.nr_opr, res.inputs, res.outputs, res.params) == (6, ["x"], ["y"], ["w"])
    r = load_graph(data, 0, LoadConfig(graph_factory=CompGraph))
    (out,) = r.output_var_list
    assert out.name == "y" and r.output_var_map == {"y": out}
    types = sorted(o.type_name for o in r.graph.all_oprs())
    assert types == sorted(
        ["Host2DeviceCopy", "SharedDeviceTensor", "Elemwise", "ImmutableTensor"] + ["Elemwise"] * 2
    )
    np.testing.assert_array_equal(
        r.tensor_map["w"].as_ndarray(), np.arange(6, dtype="float32").reshape(2, 3)
    )


def test_opr_without_serializer_is_named():
    g = mgb.comp_graph()
    x = mgb.make_arg("cpu0", g, shape=(2,), name="x")
    y = mgb.opr.callback_injector(x, lambda v: None)
    with pytest.raises(SerializationError, match="CallbackInjector"):
        dump_graph([y.node])


def test_param_table_mismatch_names_both():
    with pytest.raises(SerializationError, match="legacy"):
        sereg.table_spec_of(mgb.opr_param_defs.MatrixMulV0)
