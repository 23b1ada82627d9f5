"""Hostile and damaged weights files: ``nn.load_weights`` raises SerializationError naming the
file and the entry, reads no array data before every name, header and declared size is
checked, and leaves the model unchanged.

Each bad file is built in ``tmp_path``: by ``zipfile`` for whole members, by patching the
zip header bytes for flags and fields ``zipfile`` will not write.
"""

from __future__ import annotations

import io
import re
import struct
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest

import megbrain as mgb
from megbrain import nn


def model(seed: int = 0) -> nn.Module:
    nn.init.default_rng(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def write_zip(path: Path, members, compression=zipfile.ZIP_STORED) -> None:
    """``members``: (name, bytes) pairs, written as given (duplicates too)."""
    with zipfile.ZipFile(path, "w", compression) as zf, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile's "Duplicate name": the duplicate is the point
        for name, data in members:
            zf.writestr(name, data)


def good_members(m: nn.Module, **replace) -> list[tuple[str, bytes]]:
    """The members save_weights would write for ``m``, with some arrays or bytes replaced."""
    out = []
    for k, v in m.state_dict().items():
        r = replace.get(k, v)
        out.append((f"{k}.npy", r if isinstance(r, bytes) else npy_bytes(r)))
    return out


def patch_member(path: Path, name: str, local_off: int, central_off: int, fmt: str, value):
    """Overwrite a field of ``name``'s local header and central directory entry."""
    data = bytearray(path.read_bytes())
    raw = name.encode()
    with zipfile.ZipFile(path) as zf:
        local = zf.getinfo(name).header_offset
    struct.pack_into(fmt, data, local + local_off, value)
    for m in re.finditer(re.escape(b"PK\x01\x02"), bytes(data)):
        (nlen,) = struct.unpack_from("<H", data, m.start() + 28)
        if bytes(data[m.start() + 46 : m.start() + 46 + nlen]) == raw:
            struct.pack_into(fmt, data, m.start() + central_off, value)
    path.write_bytes(bytes(data))


def assert_refused(path: Path, match: str, entry: str | None = "0.weight") -> None:
    dst = model(1)
    before = model(1).state_dict()
    with pytest.raises(mgb.SerializationError, match=match) as info:
        nn.load_weights(dst, path)
    msg = str(info.value)
    assert repr(str(path)) in msg
    if entry is not None:
        assert entry in msg
    for k, v in dst.state_dict().items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)


# ---- the bad files ---------------------------------------------------------------------------
def test_bare_npy(tmp_path):
    path = tmp_path / "w.npz"
    path.write_bytes(npy_bytes(np.ones((8, 4), np.float32)))
    assert_refused(path, "bare .npy array, not an .npz", entry=None)


def test_encrypted_member(tmp_path):
    path = tmp_path / "w.npz"
    write_zip(path, good_members(model(2)))
    patch_member(path, "0.weight.npy", 6, 8, "<H", 0x1)  # general purpose flag bit 0
    assert_refused(path, "is encrypted")


def test_unknown_compression_method(tmp_path):
    path = tmp_path / "w.npz"
    write_zip(path, good_members(model(2)))
    patch_member(path, "0.weight.npy", 8, 10, "<H", 99)  # method 99: AES, not for zipfile
    assert_refused(path, "compression method 99")


def test_bzip2_compression_is_refused_too(tmp_path):
    path = tmp_path / "w.npz"
    write_zip(path, good_members(model(2)), zipfile.ZIP_BZIP2)
    assert_refused(path, "compression method 12")


@pytest.mark.parametrize(
    "damage",
    [
        lambda h: h.replace(b"(8, 4)", b"(8, 4 "),  # unbalanced: a tokenize/syntax error
        lambda h: h.replace(b"'descr'", b"'dexcr'"),  # a key missing
        lambda h: h.replace(b"'<f4'", b"'<q9'"),  # no such dtype
        lambda h: h[:6] + b"\x07\x00" + h[8:],  # format version 7.0
        lambda h: h[:10],  # cut inside the header
    ],
)
def test_damaged_header(tmp_path, damage):
    path = tmp_path / "w.npz"
    m = model(2)
    raw = damage(npy_bytes(m.state_dict()["0.weight"]))
    write_zip(path, good_members(m, **{"0.weight": raw}))
    assert_refused(path, "can not read weights from")


def test_huge_declared_shape(tmp_path):
    """A header declaring 2**62 elements over a few bytes of data: refused from the header."""
    path = tmp_path / "w.npz"
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        head, {"descr": "<f4", "fortran_order": False, "shape": (2**31, 2**31)}
    )
    m = model(2)
    write_zip(path, good_members(m, **{"0.weight": head.getvalue() + b"\0" * 128}))
    assert_refused(path, r"entry 0.weight has shape \(2147483648, 2147483648\), expected \(8, 4\)")


def test_wrong_dtype_is_not_cast(tmp_path):
    path = tmp_path / "w.npz"
    m = model(2)
    w64 = m.state_dict()["0.weight"].astype(np.float64)
    write_zip(path, good_members(m, **{"0.weight": w64}))
    assert_refused(path, r"do not match the model: entry 0.weight has dtype float64, expected")


def test_int_entry_for_float_weight(tmp_path):
    path = tmp_path / "w.npz"
    m = model(2)
    write_zip(path, good_members(m, **{"2.bias": np.zeros(3, np.int32)}))
    assert_refused(path, "has dtype int32, expected float32", entry="2.bias")


def test_duplicate_names(tmp_path):
    path = tmp_path / "w.npz"
    m = model(2)
    members = good_members(m)
    members.append(("0.weight.npy", npy_bytes(np.zeros((8, 4), np.float32))))
    write_zip(path, members)
    assert_refused(path, "appears more than once")


def test_member_that_is_not_an_array(tmp_path):
    path = tmp_path / "w.npz"
    write_zip(path, [*good_members(model(2)), ("notes.txt", b"hello")])
    assert_refused(path, "not a .npy array", entry="notes.txt")


class _CountingReads:
    """Counts the bytes zipfile hands out of members (what load_weights decompresses)."""

    def __init__(self, monkeypatch):
        self.total = 0
        orig = zipfile.ZipExtFile.read

        def read(fp, n=-1):
            data = orig(fp, n)
            self.total += len(data)
            return data

        monkeypatch.setattr(zipfile.ZipExtFile, "read", read)


def test_zip_bomb_is_refused_before_inflating(tmp_path, monkeypatch):
    """400 MB of zeros after a valid header, deflated to well under 1 MB on disk."""
    path = tmp_path / "w.npz"
    m = model(2)
    members = [x for x in good_members(m) if x[0] != "0.weight.npy"]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for name, data in members:
            zf.writestr(name, data)
        with zf.open("0.weight.npy", "w", force_zip64=True) as f:
            f.write(npy_bytes(np.zeros((8, 4), np.float32))[:128])  # the header
            chunk = b"\0" * (4 << 20)
            for _ in range(100):
                f.write(chunk)
    assert path.stat().st_size < 2 << 20
    reads = _CountingReads(monkeypatch)
    assert_refused(path, r"declares 419430\d+ bytes uncompressed, more than the \d+ an array")
    assert reads.total < 64 << 10  # at most a few headers, never the bomb


def test_declared_size_larger_than_allowed(tmp_path, monkeypatch):
    """The central directory claims 2 GiB for a small member: refused from the directory."""
    path = tmp_path / "w.npz"
    write_zip(path, good_members(model(2)))
    patch_member(path, "0.weight.npy", 22, 24, "<I", 2**31)  # uncompressed size
    reads = _CountingReads(monkeypatch)
    assert_refused(path, r"declares 2147483648 bytes uncompressed")
    assert reads.total == 0


def test_trailing_data_after_the_array(tmp_path):
    path = tmp_path / "w.npz"
    m = model(2)
    raw = npy_bytes(m.state_dict()["0.weight"]) + b"\0" * 64
    write_zip(path, good_members(m, **{"0.weight": raw}))
    assert_refused(path, r"holds \d+ bytes, but its header declares \d+")


def test_truncated_member_data(tmp_path):
    path = tmp_path / "w.npz"
    m = model(2)
    raw = npy_bytes(m.state_dict()["0.weight"])[:-4]
    write_zip(path, good_members(m, **{"0.weight": raw}))
    assert_refused(path, r"holds \d+ bytes, but its header declares \d+")


def test_mismatch_in_the_last_entry_reads_no_data(tmp_path, monkeypatch):
    """Headers are all checked before any array is read."""
    path = tmp_path / "w.npz"
    m = model(2)
    write_zip(path, good_members(m, **{"2.bias": np.zeros(4, np.float32)}))
    reads = _CountingReads(monkeypatch)
    assert_refused(path, r"entry 2.bias has shape \(4,\), expected \(3,\)", entry="2.bias")
    assert reads.total < 4 * 256  # the four headers only


# ---- files that are fine ---------------------------------------------------------------------
def test_deflated_fortran_and_big_endian_entries_load(tmp_path):
    path = tmp_path / "w.npz"
    src = model(2).state_dict()
    arrays = dict(src)
    arrays["0.weight"] = np.asfortranarray(src["0.weight"])
    arrays["2.weight"] = src["2.weight"].astype(">f4")
    with open(path, "wb") as f:
        np.savez_compressed(f, **arrays)
    dst = model(3)
    nn.load_weights(dst, path)
    for k, v in dst.state_dict().items():
        np.testing.assert_array_equal(v, src[k], err_msg=k)
        assert v.dtype == np.float32


def test_save_load_round_trip_reads_each_member_once(tmp_path, monkeypatch):
    path = tmp_path / "w.npz"
    src = model(2)
    nn.save_weights(src, path)
    reads = _CountingReads(monkeypatch)
    dst = model(3)
    nn.load_weights(dst, path)
    data = sum(v.nbytes for v in src.state_dict().values())
    assert data <= reads.total < data + 4 * 2 * 256  # headers are read twice, data once
    for k, v in dst.state_dict().items():
        np.testing.assert_array_equal(v, src.state_dict()[k])
