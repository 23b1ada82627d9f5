"""megbrain offers every module of MegEngine 0.6's ``_internal`` package, as facades over the
layered packages (never a second implementation)."""

import importlib
import json
import logging

import numpy as np
import pytest

import megbrain as mgb

MODULES = [
    "config",
    "comp_graph_tools",
    "cgtools",
    "opr",
    "opr_extra",
    "opr_param_defs",
    "dtype",
    "exc",
    "helper",
    "mgb_helper",
    "mgb",
    "persistent_cache",
    "logconf",
    "version",
    "global_init",
]


@pytest.mark.parametrize("name", MODULES)
def test_module_is_importable_and_an_attribute(name):
    mod = importlib.import_module("megbrain." + name) if name != "cgtools" else mgb.cgtools
    assert getattr(mgb, name) is mod


def test_facades_reexport_the_layers_objects():
    from megbrain.api import cgtools, functions
    from megbrain.api.callback import copy_output

    assert mgb.comp_graph_tools.get_oprs_seq is cgtools.get_oprs_seq
    assert mgb.mgb_helper.copy_output is copy_output
    assert mgb.exc.MegBrainError is mgb.MegBrainError
    assert mgb.mgb.SymbolVar is mgb.SymbolVar
    assert mgb.mgb._add_update_fastpath is functions._add_update_fastpath
    assert mgb.dtype._metadata_dict["qint8"].qmin == -128


def test_swig_namespaces():
    g = mgb.comp_graph()
    w = mgb.make_shared("cpu0", value=np.ones(2, np.float32), comp_graph=g)
    s = mgb.SharedScalar(1.0)
    mgb.mgb._mgb.SharedScalar__set(s, 3.0)
    assert s.get() == 3.0
    cfg = mgb.helper.gen_config(None, "cpu0", None)
    dis = mgb.SharedScalar(0)
    up = mgb.mgb._Opr.add_update(w, w, s, mgb.SharedScalar(1.0), mgb.SharedScalar(0.0), dis, cfg)
    g.compile([], [up])()
    np.testing.assert_array_equal(w.get_value(), [4, 4])
    assert mgb._get_mgb_version() == tuple(mgb.version_info)
    assert g._id() == g.id


def test_binary_opr_entry_points():
    g = mgb.comp_graph()
    x = mgb.make_immutable("cpu0", g, np.array([6.0, 8.0], np.float32))
    a = x._binary_opr("TRUE_DIV", 2.0)
    b = x._binary_opr_lhs("TRUE_DIV", 48.0)
    assert a.inferred_value.tolist() == [3.0, 4.0]
    assert b.inferred_value.tolist() == [8.0, 6.0]


def test_version_compares_with_strings():
    v = mgb.version.Version(0, 6, 1)
    assert v == "0.6.1" and v > "0.6" and v < (0, 7) and str(v) == "0.6.1"
    assert str(mgb.version.Version(1, 0, 0, 2)) == "1.0.0-dev2"
    assert mgb.__version__ == str(mgb.version_info)


def test_set_logger_routes_records_and_accepts_megbrains_own_logger(caplog):
    own = logging.getLogger("megbrain")
    mgb.logconf.set_logger(own)  # MegEngine hands back the "megbrain" logger: no loop
    assert mgb.get_logger() is own
    other = logging.getLogger("test.megbrain.sink")
    mgb.logconf.set_logger(other)
    with caplog.at_level(logging.WARNING, logger="test.megbrain.sink"):
        own.warning("hello %d", 1)
    assert "hello 1" in caplog.text
    with pytest.raises(TypeError):
        mgb.logconf.set_logger("not a logger")


def test_persistent_cache_round_trip(tmp_path):
    c = mgb.persistent_cache.PersistentCacheOnServer(str(tmp_path))
    assert c.get("algo", b"k") is None
    c.put("algo", b"k", b"v1")
    assert c.get("algo", b"k") == b"v1"
    c.close()
    again = mgb.persistent_cache.PersistentCacheOnServer(str(tmp_path))
    assert again.get("algo", b"k") == b"v1"
    assert again.get("other", b"k") is None


def test_get_opr_fp_graph_exec():
    g = mgb.comp_graph()
    x = mgb.make_arg("cpu0", g, shape=(2, 3), name="x")
    w = mgb.make_shared("cpu0", value=np.ones((3, 4), np.float32), comp_graph=g)
    y = mgb.opr.elem.relu(x @ w)
    res = mgb.get_opr_fp_graph_exec(g, [y])
    json.dumps(res)
    fp = res["opr_footprint"]
    mm = fp[str(y.owner_opr.inputs[0].owner_opr.id)]
    assert mm["computation"] == 2 * 2 * 3 * 4
    assert mm["in_shapes"] == [[2, 3], [3, 4]] and mm["out_shapes"] == [[2, 4]]
    assert fp[str(y.owner_opr.id)]["memory"] == 2 * 2 * 4 * 4
    with pytest.raises(TypeError):
        mgb.get_opr_fp_graph_exec(g, y)


def test_config_cuda_queries_say_there_is_no_cuda():
    assert mgb.config.is_cuda_ctx_set() is False
    assert mgb.config.is_compiled_with_cuda() is False
    with pytest.raises(mgb.MegBrainError, match="without CUDA"):
        mgb.config.get_cuda_version()
    with pytest.raises(mgb.MegBrainError, match="Python"):
        mgb.config.load_opr_library("/tmp/libx.so")
