"""CompGraphProfiler: the reference's JSON, the Chrome trace, attach/detach rules."""

from __future__ import annotations

import gc
import io
import json

import numpy as np
import pytest
from plugin_util import arange, chain, core, seq_ids

import megbrain as mgb
from megbrain import plugin


def test_every_executed_operator_has_a_positive_time():
    g = mgb.comp_graph()
    prof = plugin.CompGraphProfiler(g)
    x, y = chain(g, 10)
    f = g.compile([x], mgb.copy_output(y))
    f(arange(4))
    out = prof.get()
    assert out.get("profiler")
    ids = seq_ids(f)
    host, dev = out["profiler"]["host"], out["profiler"]["device"]
    assert set(host) == {str(i) for i in ids} == set(dev)
    for oid in ids:
        (t,) = host[str(oid)].values()
        assert t["end"] > t["start"] >= 0
        (d,) = dev[str(oid)].values()
        assert d["end"] > d["kern"] >= d["start"] >= 0


def test_json_has_the_fields_the_reference_readers_use():
    g = mgb.comp_graph()
    prof = plugin.CompGraphProfiler(g)
    x, y = chain(g, 4)
    f = g.compile([x], mgb.copy_output(y))
    f(arange(4))
    text = io.StringIO()
    prof.write_json(text)
    obj = json.loads(text.getvalue())
    assert set(obj) == {"graph_exec", "profiler"}
    assert set(obj["profiler"]) == {"device", "host", "opr_footprint", "opr_internal_pf"}
    ge = obj["graph_exec"]
    assert set(ge) >= {"operator", "var", "comp_seq"}
    varz = ge["var"]
    # what MegEngine's profile_analyzer reads
    for oid, entry in ge["operator"].items():
        assert entry["id"] == oid and entry["name"] and entry["type"]
        for v in entry["input"] + entry["output"]:
            assert v in varz
    for oid, fp in obj["profiler"]["opr_footprint"].items():
        assert oid in ge["operator"]
        assert set(fp) >= {"computation", "memory", "in_shapes", "out_shapes"}
        assert fp["memory"] > 0
    add = [o for o in ge["operator"].values() if o["type"] == "Elemwise"][0]
    fp = obj["profiler"]["opr_footprint"][add["id"]]
    assert fp["out_shapes"] == [[4]] and fp["computation"] == 4


def test_chrome_trace_one_complete_event_per_operator_per_run(tmp_path):
    g = mgb.comp_graph()
    prof = plugin.CompGraphProfiler(g)
    x, y = chain(g, 6)
    f = g.compile([x], mgb.copy_output(y))
    runs = 3
    for _ in range(runs):
        f(arange(4))
    path = tmp_path / "trace.json"
    prof.write_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    xs = [e for e in events if e["ph"] == "X"]
    ids = seq_ids(f)
    assert len(xs) == runs * len(ids)
    for oid in ids:
        mine = [e for e in xs if e["args"]["id"] == oid]
        assert sorted(e["args"]["run"] for e in mine) == list(range(runs))
    for e in xs:
        assert e["dur"] > 0 and e["ts"] >= 0
        assert {"name", "cat", "pid", "tid"} <= set(e)
        assert set(e["args"]) >= {"type", "inputs", "outputs"}
    meta = [e for e in events if e["ph"] == "M"]
    assert {m["args"]["name"] for m in meta if m["name"] == "process_name"} == {"cpu0:0"}
    assert any(m["name"] == "thread_name" for m in meta)
    top = prof.top_operators(3)
    assert len(top) == 3 and top[0]["total"] >= top[1]["total"] >= top[2]["total"]
    assert all(r["calls"] == runs for r in top)


def test_two_comp_nodes_record_worker_threads_and_dispatch():
    g = mgb.comp_graph()
    prof = plugin.CompGraphProfiler(g)
    x = mgb.make_arg("cpu0", g, shape=(64,), name="x")
    a = mgb.opr.copy(x * 2.0, comp_node="cpu1")
    y = mgb.opr.copy(a + 1.0, comp_node="cpu0") * 3.0
    f = g.compile([x], mgb.copy_output(y))
    np.testing.assert_allclose(f(arange(64)), (arange(64) * 2 + 1) * 3)
    out = prof.get()["profiler"]
    nodes = {cn for per in out["device"].values() for cn in per}
    assert nodes == {"cpu0:0", "cpu1:0"}
    threads = {t for per in out["host"].values() for t in per}
    assert "MainThread" not in threads  # timed on the comp nodes' worker threads
    trace = prof.chrome_trace()
    pids = {e["pid"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert len(pids) == 2
    for per in out["device"].values():
        for t in per.values():
            assert t["kern"] >= t["start"]


def test_plugin_attached_after_compile_does_not_see_that_function():
    g = mgb.comp_graph()
    x, y = chain(g, 3)
    f = g.compile([x], mgb.copy_output(y))
    prof = plugin.CompGraphProfiler(g)
    f(arange(4))
    assert prof.get()["profiler"]["host"] == {}
    assert prof.chrome_trace()["traceEvents"] == []
    f2 = g.compile([x], mgb.copy_output(y * 2.0))
    f2(arange(4))
    assert set(prof.get()["profiler"]["host"]) == {str(i) for i in seq_ids(f2)}


def test_detach_and_del_stop_observation_and_graphs_do_not_leak():
    g1, g2 = mgb.comp_graph(), mgb.comp_graph()
    p1 = plugin.CompGraphProfiler(g1)
    x1, y1 = chain(g1, 3)
    x2, y2 = chain(g2, 3)
    f2 = g2.compile([x2], mgb.copy_output(y2))
    assert core(f2)._observers == ()
    f1 = g1.compile([x1], mgb.copy_output(y1))
    f1(arange(4))
    f2(arange(4))
    n = len(prof_events(p1))
    assert n == len(seq_ids(f1))
    p1.detach()
    assert not p1.attached and g1.plugins == []
    f1(arange(4))  # compiled while attached: no longer reports
    assert len(prof_events(p1)) == n
    p3 = plugin.CompGraphProfiler(g1)
    assert len(g1.plugins) == 1
    del p3
    gc.collect()
    assert g1.plugins == []


def prof_events(p):
    return [e for e in p.chrome_trace()["traceEvents"] if e["ph"] == "X"]


def test_plugin_keeps_its_graph_alive():
    import weakref

    g = mgb.comp_graph()
    prof = plugin.CompGraphProfiler(g)
    ref = weakref.ref(g)
    del g
    gc.collect()
    assert ref() is not None and prof.comp_graph is ref()


def test_no_plugin_no_wrapper():
    """Steps of a function compiled without plugins are the operators' own closures."""
    g = mgb.comp_graph()
    x, y = chain(g, 5)
    f = g.compile([x], mgb.copy_output(y))
    f(arange(4))
    steps = core(f)._plan.steps[0]
    assert steps and not any(s.__module__.startswith("megbrain.plugin") for s in steps)
    prof = plugin.CompGraphProfiler(g)
    f2 = g.compile([x], mgb.copy_output(y))
    f2(arange(4))
    steps = core(f2)._plan.steps[0]
    wrapped = [s for s in steps if s.__module__ == "megbrain.plugin.profiler"]
    assert len(wrapped) == len(seq_ids(f2))
    del prof


def test_eager_graph_compiles_are_not_observed():
    g = mgb.comp_graph()
    g.set_option("eager_evaluation", True)
    prof = plugin.CompGraphProfiler(g)
    x = mgb.make_shared("cpu0", value=arange(4), comp_graph=g)
    f = g.compile(None, mgb.copy_output(x + 1.0))
    f()
    assert prof.get()["profiler"]["host"] == {}


def test_bad_graph_argument():
    with pytest.raises(TypeError, match="CompGraphProfiler: comp_graph must be a CompGraph"):
        plugin.CompGraphProfiler(object())


def test_reference_names_are_exported():
    import megbrain

    for name in (
        "CompGraphProfiler",
        "NumRangeChecker",
        "NumRangeCheckerError",
        "TextOprIODump",
        "BinaryOprIODump",
        "InfkernFinder",
        "GlobalInfkernFinder",
        "InfkernFinderInputValueRec",
        "fast_signal_hander",
        "load_tensor_binary",
    ):
        assert hasattr(megbrain.plugin, name)
    assert issubclass(plugin.NumRangeCheckerError, mgb.MegBrainError)


def test_digits_profile_writes_a_trace(tmp_path, capsys):
    pytest.importorskip("sklearn")
    from megbrain.examples import digits

    path = str(tmp_path / "trace.json")
    out = digits.main(["--profile", path, "--model", "mlp", "--batch", "8"])
    trace = json.load(open(path))
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    runs = {e["args"]["run"] for e in xs}
    assert len(runs) == 5  # the warm-up step is dropped
    per_run = {r: sum(1 for e in xs if e["args"]["run"] == r) for r in runs}
    assert len(set(per_run.values())) == 1  # the same operators each step
    assert out["top"] and out["top"][0]["calls"] == 5
    printed = capsys.readouterr().out
    assert "trace written to" in printed and out["top"][0]["type"] in printed


def test_multi_part_functions_are_observed_copies_are_not():
    g = mgb.comp_graph()
    prof = plugin.CompGraphProfiler(g)
    x = mgb.make_arg("cpu0", g, shape=(4,), name="x")
    a = x * 2.0
    b = a + 1.0
    f1, f2 = g.compile_multi_part([([x], [mgb.copy_output(a)]), (None, [mgb.copy_output(b)])])
    f1(arange(4))
    f2()
    xs = prof_events(prof)
    assert {e["args"]["run"] for e in xs} == {0, 1}
    assert {e["args"]["id"] for e in xs} == seq_ids_core(f1)
    n = len(xs)
    # a copy compiled while the graph has a current function lives in another graph
    fc = g.compile([x], mgb.copy_output(b * 3.0), copy=True)
    np.testing.assert_allclose(fc(arange(4)), (arange(4) * 2 + 1) * 3)
    assert len(prof_events(prof)) == n


def seq_ids_core(func):
    return {o.id for o in func._func.core.iter_opr_seq()}


def test_result_survives_clear_device_memory_as_in_the_client_jit():
    g = mgb.comp_graph()
    prof = plugin.CompGraphProfiler(g)
    x = mgb.make_arg("cpu0", g, shape=(1,), name="x")
    f = g.compile(None, [mgb.copy_output(x * x)])
    assert f(x=np.full(1, 3, "f4"))[0].tolist() == [9]
    g.clear_device_memory()
    out = prof.get()
    assert out.get("profiler") and out["profiler"]["host"]


def test_max_events_keeps_the_latest_runs():
    g = mgb.comp_graph()
    x, y = chain(g, 4)
    f0 = g.compile([x], mgb.copy_output(y))
    nops = len(seq_ids(f0))
    prof = plugin.CompGraphProfiler(g, max_events=2 * nops)
    f = g.compile([x], mgb.copy_output(y))
    for _ in range(5):
        f(arange(4))
    xs = prof_events(prof)
    assert sorted({e["args"]["run"] for e in xs}) == [3, 4]
    assert set(prof.get()["profiler"]["host"]) == {str(i) for i in seq_ids(f)}
    with pytest.raises(ValueError, match="max_events must be a positive integer"):
        plugin.CompGraphProfiler(g, max_events=0)
