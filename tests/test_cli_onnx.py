"""The ``megbrain`` command on ONNX models: inspect, run (random or given inputs) and dot."""

import json

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from test_cli import _assert_clean_error, _inproc  # noqa: E402

from megbrain import cli  # noqa: E402

W = np.arange(12, dtype=np.float32).reshape(3, 4) / 8


def _save(path, batch=2):
    """y = relu(x @ w), n = ReduceSum(y) (0-d); x (batch, 3) float32, w an initializer."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Relu", ["h"], ["y"]),
        helper.make_node("ReduceSum", ["y"], ["n"], keepdims=0),
    ]
    g = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4]),
            helper.make_tensor_value_info("n", TensorProto.FLOAT, []),
        ],
        initializer=[numpy_helper.from_array(W, "w")],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def tiny_onnx(tmp_path_factory):
    return _save(tmp_path_factory.mktemp("cli_onnx") / "tiny.onnx")


def test_inspect_onnx(tiny_onnx, capsys):
    r = _inproc(capsys, "inspect", tiny_onnx)
    assert r.returncode == 0, r.stderr
    assert "x: (2, 3) float32 on cpu0" in r.stdout
    assert "y: (2, 4) float32" in r.stdout and "n: (1,) float32" in r.stdout
    r = _inproc(capsys, "inspect", tiny_onnx, "--json")
    (d,) = json.loads(r.stdout)["graphs"]
    assert [v["name"] for v in d["outputs"]] == ["y", "n"]
    assert d["params"]["elements"] == 12


def test_run_onnx_random_and_given(tiny_onnx, tmp_path, capsys):
    r = _inproc(capsys, "run", tiny_onnx, "--random", "--iters", 3)
    assert r.returncode == 0, r.stderr
    assert "1 input(s), 2 output(s)" in r.stdout and "time per iteration" in r.stdout
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out.npz"
    r = _inproc(capsys, "run", tiny_onnx, "--input", f"x={tmp_path / 'x.npy'}", "--output", out)
    assert r.returncode == 0, r.stderr
    got = np.load(out)
    y = np.maximum(x @ W, 0)
    np.testing.assert_allclose(got["y"], y, rtol=1e-6)
    np.testing.assert_allclose(got["n"].reshape(()), y.sum(), rtol=1e-5)


def test_onnx_without_suffix_is_recognised(tiny_onnx, tmp_path, capsys):
    other = tmp_path / "model.bin"
    other.write_bytes(tiny_onnx.read_bytes())
    r = _inproc(capsys, "inspect", other)
    assert r.returncode == 0, r.stderr
    assert "y: (2, 4) float32" in r.stdout


def test_onnx_open_batch_dim_takes_the_given_input(tmp_path, capsys):
    path = _save(tmp_path / "dyn.onnx", batch="N")
    r = _inproc(capsys, "run", path, "--random")
    _assert_clean_error(r, 1, "can not load ONNX model", "give their values with --input")
    x = np.ones((5, 3), np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out.npz"
    r = _inproc(capsys, "run", path, "--input", f"x={tmp_path / 'x.npy'}", "--output", out)
    assert r.returncode == 0, r.stderr
    np.testing.assert_allclose(np.load(out)["y"], np.maximum(x @ W, 0), rtol=1e-6)


def test_dot_onnx(tiny_onnx, tmp_path, capsys):
    r = _inproc(capsys, "dot", tiny_onnx, "-o", tmp_path / "g.dot")
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "g.dot").read_text()
    assert text.startswith("digraph") and "MatrixMul" in text and '"y"' in text


def test_bad_onnx_file(tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\xff\xfe not a protobuf at all")
    _assert_clean_error(_inproc(capsys, "inspect", bad), 1, "can not load", "bad.onnx")
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x00" * 64)
    _assert_clean_error(_inproc(capsys, "inspect", junk), 1, "wrong magic")
    assert cli.main(["inspect", str(tmp_path / "missing.onnx")]) == 1
