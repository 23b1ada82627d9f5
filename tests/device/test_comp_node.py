"""Tests of megbrain.device: locators, device maps, CompNode identity, memory, pickling."""

import copy
import os
import pickle
import threading

import numpy as np
import pytest

from megbrain.device import (
    CPU,
    CUDA,
    DEVICE_CPU_DEFAULT,
    XPU,
    CompNode,
    add_device_map,
    as_comp_node,
    cn_thread_local,
    del_device_map,
    get_device_count,
    parse_locator,
    set_default_device,
    set_device_map,
    set_unspec_device_type,
)
from megbrain.device.comp_node import _reset_device_config
from megbrain.errors import ConversionError, MegBrainError


@pytest.fixture(autouse=True)
def _clean_device_config():
    yield
    _reset_device_config()
    del_device_map()


@pytest.mark.parametrize(
    "loc, expected",
    [
        ("cpu0", (CPU, 0, 0)),
        ("cpu3:2", (CPU, 3, 2)),
        ("cpux", (CPU, -1, 0)),
        ("cpux:1", (CPU, -1, 1)),
        ("gpu1", (CUDA, 1, 0)),
        ("gpux", (CUDA, -1, 0)),
        ("xpux", (XPU, -1, 0)),
        ("xpu", (XPU, -1, 0)),
        ("xpu2:3", (XPU, 2, 3)),
        ("cpu:default", (CPU, DEVICE_CPU_DEFAULT, 0)),
    ],
)
def test_parse_locator(loc, expected):
    assert parse_locator(loc) == expected
    assert CompNode._parse_locator(loc) == list(expected)


@pytest.mark.parametrize(
    "bad", ["", "cpu", "gpu", "tpu0", "cpu0:", "cpu-1", "cpu0:x", "cpu0x", "cpu:1"]
)
def test_bad_locator_names_the_string(bad):
    with pytest.raises(MegBrainError, match=repr(bad).replace("\\", "\\\\")):
        CompNode.load(bad)


def test_xpux_and_cpux_map_to_cpu0():
    cpu0 = CompNode.load("cpu0")
    for loc in ("cpux", "xpux", "xpu0", "cpu0:0"):
        cn = CompNode.load(loc)
        assert cn == cpu0 and hash(cn) == hash(cpu0)
        assert cn.impl is cpu0.impl
        assert cn.locator_physical == (CPU, 0, 0)
    assert CompNode.load("cpux").locator_logical == (CPU, -1, 0)
    assert CompNode.load("cpu0:1") != cpu0
    assert CompNode.load("cpu1") != cpu0
    assert len({CompNode.load("cpux"), cpu0, CompNode.load("cpu1")}) == 2


def test_str_repr_and_properties():
    cn = CompNode.load("cpux")
    assert str(cn) == "cpu0:0"
    assert repr(cn) == 'CompNode("cpu0:0" from "cpux:0")'
    assert cn.to_string_logical() == "cpux:0"
    assert cn.mem_align == 64
    assert cn.device_type == CPU
    assert cn.array_module is np
    assert not cn.is_inline
    total, free = cn.mem_status_bytes
    assert total >= free > 0


def test_load_accepts_comp_node_and_as_comp_node():
    cn = CompNode.load("cpu1")
    assert CompNode.load(cn) is cn
    assert as_comp_node(cn) is cn
    assert as_comp_node("cpu1") == cn
    assert CompNode("cpu1") == cn
    with pytest.raises(ConversionError):
        as_comp_node(3)


def test_cpu_default():
    cn = CompNode.load("cpu:default")
    assert cn.is_inline
    assert cn == CompNode.default_cpu()
    assert str(cn) == "cpu:default"
    assert cn.locator_logical == cn.locator_physical == (CPU, DEVICE_CPU_DEFAULT, 0)
    assert cn != CompNode.load("cpu0")


def test_alloc_is_aligned():
    cn = CompNode.load("cpu0")
    for n in (0, 1, 100, 4097):
        buf = cn.alloc(n)
        assert buf.dtype == np.uint8 and buf.shape == (n,)
        assert buf.ctypes.data % cn.mem_align == 0


@pytest.mark.parametrize("loc", ["gpu0", "gpux", "gpu1:2"])
def test_gpu_raises_without_cuda(loc):
    with pytest.raises(MegBrainError, match="no CUDA device available"):
        CompNode.load(loc)


def test_device_count():
    assert get_device_count("cpu") == os.cpu_count()
    assert get_device_count("xpu") == os.cpu_count()
    assert get_device_count("gpu", warn=False) == 0
    with pytest.warns(RuntimeWarning):
        assert get_device_count("CUDA") == 0
    assert CompNode._get_device_count(CPU, False) == os.cpu_count()
    with pytest.raises(MegBrainError, match="device type"):
        get_device_count("tpu")


def test_unspec_device_type():
    set_unspec_device_type("CUDA")
    with pytest.raises(MegBrainError, match="no CUDA device available"):
        CompNode.load("xpux")
    assert CompNode.load("cpux") == CompNode.load("cpu0")
    set_unspec_device_type("cpu")
    assert CompNode.load("xpux") == CompNode.load("cpu0")
    with pytest.raises(MegBrainError):
        set_unspec_device_type("XPU")


def test_set_device_map():
    set_device_map("CPU", 0, 3)
    cn = CompNode.load("cpu0")
    assert cn.locator_logical == (CPU, 0, 0) and cn.locator_physical == (CPU, 3, 0)
    assert cn == CompNode.load("cpu3")
    assert repr(cn) == 'CompNode("cpu3:0" from "cpu0:0")'
    set_device_map("cpu", "cpu1", "cpu2")
    assert CompNode.load("cpu1:4").locator_physical == (CPU, 2, 4)
    CompNode._set_device_map(CPU, 5, 6)
    assert str(CompNode.load("cpu5")) == "cpu6:0"
    with pytest.raises(MegBrainError):
        set_device_map("CPU", "gpu1", 0)
    with pytest.raises(MegBrainError):
        set_device_map("CPU", 0, -1)
    with pytest.raises(MegBrainError):
        set_device_map("TPU", 0, 1)


def test_set_default_device():
    set_default_device("cpu2")
    assert str(CompNode.load("cpux")) == "cpu2:0"
    assert str(CompNode.load("xpux")) == "cpu2:0"
    assert str(CompNode.load("cpu0")) == "cpu0:0"
    set_default_device(1)
    assert str(CompNode.load("xpux:1")) == "cpu1:1"
    # a gpu string switches the default device type to CUDA
    set_default_device("gpu1")
    with pytest.raises(MegBrainError, match="no CUDA device available"):
        CompNode.load("xpux")
    assert str(CompNode.load("cpux")) == "cpu1:0"


def test_loaded_nodes_keep_their_mapping():
    before = CompNode.load("cpux")
    set_default_device("cpu4")
    assert str(before) == "cpu0:0"
    assert str(CompNode.load("cpux")) == "cpu4:0"


def test_pickle_as_logical_locator():
    cn = CompNode.load("cpux")
    assert cn.__getstate__() == "cpux:0"
    back = pickle.loads(pickle.dumps(cn))
    assert back == cn and back.locator_logical == (CPU, -1, 0)
    data = pickle.dumps([CompNode.load("cpu1:2"), CompNode.load("cpu:default")])
    assert pickle.loads(data) == [CompNode.load("cpu1:2"), CompNode.load("cpu:default")]
    assert copy.copy(cn) is cn and copy.deepcopy(cn) is cn


def test_pickle_with_map_location():
    data = pickle.dumps((CompNode.load("cpu0"), CompNode.load("cpu3:1")))
    add_device_map({"cpu0": "cpu1"})
    a, b = pickle.loads(data)
    assert str(a) == "cpu1:0" and str(b) == "cpu3:1"
    add_device_map(lambda s: "cpu:default" if s == "cpu3:1" else s)
    assert pickle.loads(data)[1] == CompNode.default_cpu()
    add_device_map("cpu2")
    assert [str(c) for c in pickle.loads(data)] == ["cpu2:0", "cpu2:0"]

    seen = []
    t = threading.Thread(target=lambda: seen.append(pickle.loads(data)))
    t.start()
    t.join()
    assert [str(c) for c in seen[0]] == ["cpu0:0", "cpu3:1"]  # map_location is thread-local

    del_device_map()
    assert cn_thread_local.map_location is None
    assert [str(c) for c in pickle.loads(data)] == ["cpu0:0", "cpu3:1"]
    with pytest.raises(MegBrainError):
        add_device_map({"cpu0": "bogus"})
    with pytest.raises(ConversionError):
        add_device_map(3)


def test_pickle_gpu_without_cuda_maps_to_cpu():
    state = pickle.dumps(CompNode.load("cpu0")).replace(b"cpu0:0", b"gpu0:0")
    with pytest.raises(MegBrainError, match="no CUDA"):
        pickle.loads(state)
    add_device_map({"gpu0": "cpu0"})
    assert pickle.loads(state) == CompNode.load("cpu0")
