"""Weight files: ``nn.save_weights`` / ``nn.load_weights`` round trip every parameter and buffer
through ``.npz`` without pickle; corrupt or mismatched files raise SerializationError and leave
the model unchanged."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest

import megbrain as mgb
from megbrain import nn


def model(seed=0, hidden=8):
    nn.init.default_rng(seed)
    return nn.Sequential(nn.Linear(4, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
                         nn.Linear(hidden, 3))  # fmt: skip


def trained(seed=0):
    """A model whose BatchNorm buffers moved away from their initial values."""
    m = model(seed)
    g = mgb.comp_graph()
    x = mgb.make_arg("cpu0", g, shape=(5, 4), name="x")
    f = g.compile([x], [mgb.copy_output(m(x))] + nn.pending_updates(g))
    f(np.random.default_rng(seed).standard_normal((5, 4)).astype(np.float32))
    return m


def assert_state_equal(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        np.testing.assert_array_equal(sa[k], sb[k], err_msg=k)
        assert sa[k].dtype == sb[k].dtype


def test_round_trip_exact(tmp_path):
    src, dst = trained(0), model(1)
    path = tmp_path / "w.npz"
    nn.save_weights(src, path)
    nn.load_weights(dst, path)
    assert_state_equal(src, dst)
    assert not (tmp_path / "w.npz.tmp").exists()


def test_file_is_plain_npz_without_pickle(tmp_path):
    src = trained(0)
    path = tmp_path / "w.npz"
    nn.save_weights(src, str(path))
    with np.load(path, allow_pickle=False) as data:
        assert sorted(data.files) == sorted(src.state_dict())
        for k, v in src.state_dict().items():
            np.testing.assert_array_equal(data[k], v)
            assert data[k].dtype != object


def test_overwrite_existing_file(tmp_path):
    path = tmp_path / "w.npz"
    nn.save_weights(model(0), path)
    src = trained(2)
    nn.save_weights(src, path)
    dst = model(3)
    nn.load_weights(dst, path)
    assert_state_equal(src, dst)


def corrupt_truncated(path, tmp_path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def corrupt_flipped(path, tmp_path):
    """Flip bytes inside the first member's data: the zip CRC check catches it."""
    with zipfile.ZipFile(path) as z:
        info = z.infolist()[0]
    data = bytearray(path.read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra) + 128
    for i in range(start, start + 16):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def corrupt_garbage(path, tmp_path):
    path.write_bytes(b"not a weights file at all" * 10)


def corrupt_empty(path, tmp_path):
    path.write_bytes(b"")


def corrupt_pickled(path, tmp_path):
    """An object array needs pickle, which loading refuses."""
    arrays = {k: v for k, v in model(0).state_dict().items()}
    arrays["0.weight"] = np.array([{"evil": 1}] * 32, dtype=object).reshape(8, 4)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


@pytest.mark.parametrize(
    "corrupt", [corrupt_truncated, corrupt_flipped, corrupt_garbage, corrupt_empty,
                corrupt_pickled],
)  # fmt: skip
def test_corrupt_file_raises_and_leaves_model_unchanged(tmp_path, corrupt):
    path = tmp_path / "w.npz"
    nn.save_weights(trained(0), path)
    corrupt(path, tmp_path)
    dst = model(1)
    before = model(1)
    with pytest.raises(mgb.SerializationError, match="can not read weights from"):
        nn.load_weights(dst, path)
    assert_state_equal(dst, before)


def test_missing_file(tmp_path):
    with pytest.raises(mgb.SerializationError, match="can not read weights"):
        nn.load_weights(model(0), tmp_path / "nope.npz")


@pytest.mark.parametrize(
    "other,match",
    [
        (lambda: model(0, hidden=6), r"0.weight has shape \(8, 4\), expected \(6, 4\)"),
        (lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)),
         r"missing keys \['2.weight', '2.bias'\], unexpected keys \['1.weight', "),
        (lambda: nn.Sequential(model(0), nn.Linear(3, 3)), "missing keys"),
    ],
)  # fmt: skip
def test_mismatched_file_raises_and_leaves_model_unchanged(tmp_path, other, match):
    path = tmp_path / "w.npz"
    nn.save_weights(trained(0), path)
    dst = other()
    before = {k: v.copy() for k, v in dst.state_dict().items()}
    with pytest.raises(mgb.SerializationError, match="do not match the model") as info:
        nn.load_weights(dst, path)
    assert info.match(match)
    for k, v in dst.state_dict().items():
        np.testing.assert_array_equal(v, before[k])


def test_partially_matching_file_changes_nothing(tmp_path):
    """Only the last tensor mismatches: none of the earlier ones may have been loaded."""
    src = trained(0)
    state = src.state_dict()
    state["3.bias"] = np.zeros(4, np.float32)
    path = tmp_path / "w.npz"
    with open(path, "wb") as f:
        np.savez(f, **state)
    dst = model(1)
    before = model(1)
    with pytest.raises(mgb.SerializationError, match=r"3.bias has shape \(4,\)"):
        nn.load_weights(dst, path)
    assert_state_equal(dst, before)
