"""InfkernFinder: the operator a run is stuck in; GlobalInfkernFinder; fast signals."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
from plugin_util import arange

import megbrain as mgb
from megbrain import plugin


def _blocked_graph(record=True):
    g = mgb.comp_graph()
    finder = plugin.InfkernFinder(g, record)
    x = mgb.make_arg("cpu0", g, shape=(4,), name="x")
    entered, release = threading.Event(), threading.Event()
    release.set()  # runs pass until a test clears it

    def cb(value):
        entered.set()
        assert release.wait(10)

    y = mgb.opr.callback_injector(x * 2.0, cb, name="blocker")
    z = mgb.opr.elemwise(y + 1.0, name="after", mode="exp")
    f = g.compile([x], mgb.copy_output(z))
    return g, finder, f, x, y, z, entered, release


def test_reports_the_operator_blocked_in_a_callback(tmp_path):
    g, finder, f, x, y, z, entered, release = _blocked_graph()
    f(arange(4))  # a complete run first
    path = str(tmp_path / "status.txt")
    assert finder.write_to_file(path) is None
    release.clear()
    entered.clear()
    t = threading.Thread(target=f, args=(arange(4),))
    t.start()
    try:
        assert entered.wait(10)
        assert finder.write_to_file(path) == y.node.owner.id
        assert finder.running() == {"cpu0:0": (y.node.owner.id, "blocker", "CallbackInjector")}
        text = open(path).read()
        assert "running on cpu0:0: opr CallbackInjector{blocker}" in text
        assert "__waiting__" in text and "__unrec__" in text and "done" in text
    finally:
        release.set()
        t.join(10)
    assert finder.write_to_file(path) is None
    assert finder.running() == {}


def test_records_input_values():
    g, finder, f, x, y, z, entered, release = _blocked_graph()
    release.set()
    f(arange(4))
    f(arange(4) + 1)
    (rec,) = finder.get_input_values(z.node.owner.id)
    assert rec.var_id == z.node.owner.inputs[0].id
    assert rec.run_id == 2
    np.testing.assert_allclose(rec.value, (arange(4) + 1) * 2 + 1)
    with pytest.raises(ValueError, match="no operator with id"):
        finder.get_input_values(10**6)


def test_without_recording_get_input_values_refuses():
    g, finder, f, x, y, z, entered, release = _blocked_graph(record=False)
    release.set()
    f(arange(4))
    with pytest.raises(mgb.MegBrainError, match="record_input_value=False"):
        finder.get_input_values(z.node.owner.id)


def test_global_finder_follows_the_env_var(monkeypatch):
    g = mgb.comp_graph()
    monkeypatch.delenv("MGB_DBG_INFKERN_FINDER", raising=False)
    assert plugin.GlobalInfkernFinder.add_graph(g) is None
    monkeypatch.setenv("MGB_DBG_INFKERN_FINDER", "3")
    with pytest.raises(ValueError, match="must be either 1 or 2"):
        plugin.GlobalInfkernFinder.add_graph(g)
    monkeypatch.setattr(plugin.GlobalInfkernFinder, "_registry", [])
    monkeypatch.setenv("MGB_DBG_INFKERN_FINDER", "2")
    old = signal.getsignal(signal.SIGUSR1)
    try:
        finder = plugin.GlobalInfkernFinder.add_graph(g)
        assert isinstance(finder, plugin.InfkernFinder)
        assert plugin.GlobalInfkernFinder._registry == [finder]
    finally:
        signal.signal(signal.SIGUSR1, old)
        finder.detach()


def test_fast_signal_handler_runs_on_its_own_thread():
    got = []
    done = threading.Event()

    def cb(signum):
        got.append((signum, threading.current_thread().name))
        done.set()

    old = signal.getsignal(signal.SIGUSR2)
    try:
        plugin.fast_signal_hander(signal.SIGUSR2, cb)
        os.kill(os.getpid(), signal.SIGUSR2)
        deadline = time.monotonic() + 10
        while not done.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert got == [(signal.SIGUSR2, "fastsgl")]
    finally:
        signal.signal(signal.SIGUSR2, old)


def test_running_operator_per_comp_node_in_a_threaded_run(tmp_path):
    g = mgb.comp_graph()
    finder = plugin.InfkernFinder(g, False)
    x = mgb.make_arg("cpu0", g, shape=(4,), name="x")
    entered, release = threading.Event(), threading.Event()

    def cb(value):
        entered.set()
        assert release.wait(10)

    a = mgb.opr.copy(x, comp_node="cpu1", name="to1")
    b = mgb.opr.callback_injector(a * 2.0, cb, name="stuck1")
    y = mgb.opr.copy(b, comp_node="cpu0", name="back") + x
    f = g.compile([x], mgb.copy_output(y))
    t = threading.Thread(target=f, args=(arange(4),))
    t.start()
    try:
        assert entered.wait(10)
        stuck = b.node.owner
        assert finder.running()["cpu1:0"] == (stuck.id, "stuck1", "CallbackInjector")
        first = finder.write_to_file(str(tmp_path / "s.txt"))
        assert first is not None
    finally:
        release.set()
        t.join(10)
    assert finder.write_to_file(str(tmp_path / "s.txt")) is None
