"""TextOprIODump and BinaryOprIODump / load_tensor_binary."""

from __future__ import annotations

import io
import os
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from plugin_util import arange, chain, core

import megbrain as mgb
from megbrain import plugin
from megbrain.dtype import canonize_dtype


def test_text_dump_lists_every_operator_with_inputs_and_values(tmp_path):
    g = mgb.comp_graph()
    path = tmp_path / "io.txt"
    dump = plugin.TextOprIODump(g, str(path), print_addr=False, max_size=3)
    x, y = chain(g, 4)
    f = g.compile([x], mgb.copy_output(y))
    f(arange(6).reshape(6)[:4])
    dump.detach()  # closes the file
    text = path.read_text()
    for o in core(f).iter_opr_seq():
        assert f"owner_opr={o.name}{{{o.type_name}}} opr{o.id}" in text
    assert "var1 produced: name=x layout={4} dtype=Float32" in text
    assert " val: [0, 1, 2, ...]min=0 max=3 mean=1.5" in text
    # the first ADD: its input's values as they were before it ran (it runs in place)
    assert "[i0]var1: [0, 1, 2, ...] s" in text
    assert "<0x" not in text


def test_text_dump_setters_and_file_object():
    g = mgb.comp_graph()
    buf = io.StringIO()
    dump = plugin.TextOprIODump(g, buf)
    assert dump.max_size(2) is dump and dump.print_addr(True) is dump
    x = mgb.make_arg("cpu0", g, shape=(3,), name="x")
    f = g.compile([x], mgb.copy_output(x * 2.0))
    f(arange(3))
    text = buf.getvalue()
    assert "[0, 2, ...]" in text and "<0x" in text
    with pytest.raises(ValueError, match="max_size"):
        dump.max_size(-1)
    with pytest.raises(TypeError, match="fpath must be a path or a text file"):
        plugin.TextOprIODump(g, 3)


DTYPES = ["float32", "float16", "int32", "int16", "int8", "uint8", "bool", "bfloat16"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_binary_dump_round_trips_bit_exactly(tmp_path, dtype):
    g = mgb.comp_graph()
    dt = canonize_dtype(dtype)
    rng = np.random.default_rng(0)
    if dt.kind == "b":
        value = rng.integers(0, 2, (3, 5)).astype(bool)
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        value = rng.integers(info.min, info.max, (3, 5), endpoint=True).astype(dt)
    else:
        value = rng.standard_normal((3, 5)).astype(np.float32).astype(dt)
    sv = mgb.make_shared("cpu0", value=value, comp_graph=g, name="v")
    dump = plugin.BinaryOprIODump(g, str(tmp_path / "dump"))  # noqa: F841 - kept attached
    out = mgb.opr.copy(sv, name="copied")
    f = g.compile(None, mgb.copy_output(out))
    f()
    files = sorted(os.listdir(tmp_path / "dump"))
    assert f"{out.node.id:06x}" in files
    for name in files:
        got, title = plugin.load_tensor_binary(str(tmp_path / "dump" / name))
        assert got.dtype == dt
        assert got.shape == (3, 5)
        assert got.tobytes() == np.ascontiguousarray(value).tobytes()
        assert title.startswith("var=")
    with open(tmp_path / "dump" / f"{out.node.id:06x}", "rb") as fin:
        _, title = plugin.load_tensor_binary(fin)
    assert "copied" in title and "owner_opr_inputs=[v(" in title


def test_binary_header_layout(tmp_path):
    g = mgb.comp_graph()
    x = mgb.make_arg("cpu0", g, shape=(2, 3), name="x")
    dump = plugin.BinaryOprIODump(g, str(tmp_path))  # noqa: F841 - kept attached
    f = g.compile([x], mgb.copy_output(x + 1.0))
    f(arange(6).reshape(2, 3))
    raw = (tmp_path / f"{x.node.id:06x}").read_bytes()
    name_len, dt, ndim, *shape = struct.unpack("<III7I", raw[:40])
    assert (dt, ndim, shape) == (0, 7, [2, 3, 0, 0, 0, 0, 0])
    assert raw[40 + name_len :] == arange(6).tobytes()


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda raw: raw[:10], "truncated header"),
        (lambda raw: raw[:30], "truncated shape"),
        (lambda raw: raw[:-1], "data bytes, but shape"),
        (lambda raw: raw + b"\0\0\0\0", "data bytes, but shape"),
        (lambda raw: struct.pack("<I", 77) + raw[4:], "truncated name|not ASCII|data bytes"),
        (lambda raw: raw[:4] + struct.pack("<I", 55) + raw[8:], "unknown dtype number 55"),
        (lambda raw: raw[:4] + struct.pack("<I", 8) + raw[8:], "dtype Byte is unsupported"),
        (lambda raw: raw[:8] + struct.pack("<I", 1000) + raw[12:], "max_ndim=1000"),
        (lambda raw: raw[:40] + b"\xff" + raw[41:], "not ASCII"),
    ],
)
def test_corrupt_binary_file_raises_a_clear_error(tmp_path, mutate, match):
    g = mgb.comp_graph()
    x = mgb.make_arg("cpu0", g, shape=(2, 3), name="x")
    dump = plugin.BinaryOprIODump(g, str(tmp_path))  # noqa: F841 - kept attached
    f = g.compile([x], mgb.copy_output(x + 1.0))
    f(arange(6).reshape(2, 3))
    path = tmp_path / f"{x.node.id:06x}"
    path.write_bytes(mutate(path.read_bytes()))
    with pytest.raises(mgb.SerializationError, match=match):
        plugin.load_tensor_binary(str(path))


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(DTYPES + ["IntB2", "QuantizedS8"]),
    st.lists(st.integers(1, 4), min_size=1, max_size=7),
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=40),
    st.integers(0, 2**32 - 1),
)
def test_dump_tensor_round_trip_any_shape(dtype, shape, name, seed):
    from megbrain.dtype import dtype_name, get_quantized_dtype
    from megbrain.plugin.opr_io_dump import _BINARY_DTYPE, dump_tensor

    dt = get_quantized_dtype(dtype, 0.5) if dtype.startswith("Quant") else canonize_dtype(dtype)
    raw = np.random.default_rng(seed).integers(0, 256, int(np.prod(shape)) * dt.itemsize)
    value = np.frombuffer(raw.astype(np.uint8).tobytes(), dtype=dt).reshape(shape)
    blob = dump_tensor(value, _BINARY_DTYPE[dtype_name(dt)], name)
    got, got_name = plugin.load_tensor_binary(io.BytesIO(blob))
    assert got_name == name and got.shape == tuple(shape)
    assert got.tobytes() == value.tobytes()


def test_binary_dump_inputs_with_env_var(tmp_path, monkeypatch):
    monkeypatch.setenv("MGB_DUMP_INPUT", "1")
    g = mgb.comp_graph()
    x = mgb.make_arg("cpu0", g, shape=(4,), name="x")
    dump = plugin.BinaryOprIODump(g, str(tmp_path))
    y = (x + 1.0) * 3.0  # the MUL runs in place on the ADD's output
    f = g.compile([x], mgb.copy_output(y))
    f(arange(4))
    got, title = plugin.load_tensor_binary(str(tmp_path / f"{y.node.id:06x}-inp0"))
    np.testing.assert_array_equal(got, arange(4) + 1)  # as read by the MUL, before it ran
    assert title.startswith("inp0: var=")
    del dump
