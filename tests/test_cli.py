"""The ``megbrain`` command, run as a subprocess (``python -m megbrain``) on graphs dumped here."""

import functools
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import megbrain as mgb
from megbrain import cli, nn

W = np.arange(6, dtype="float32").reshape(2, 3) / 4


def _megbrain(*args, cwd=None):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run(
        [sys.executable, "-m", "megbrain", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=env,
    )


def _inproc(capsys, *args):
    """``cli.main`` in this process (cheaper than a subprocess), as a CompletedProcess."""
    capsys.readouterr()
    rc = cli.main([str(a) for a in args])
    cap = capsys.readouterr()
    return subprocess.CompletedProcess(args, rc, cap.out, cap.err)


def _dump_tiny(path, *, append=False):
    """y = relu(x * w + 1.5), z = y * y; x (2, 3) float32, w a (2, 3) param."""
    g = mgb.comp_graph()
    x = mgb.make_arg("cpu0", g, shape=(2, 3), name="x")
    w = mgb.make_shared("cpu0", value=W, comp_graph=g, name="w")
    y = mgb.opr.elemwise(x * w + 1.5, mode="relu")
    mgb.serialize_comp_graph_to_file(str(path), {"y": y, "z": y * y}, append=append)
    return path


def _expect(xv):
    y = np.maximum(xv * W + 1.5, 0)
    return y, y * y


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return _dump_tiny(tmp_path_factory.mktemp("cli") / "tiny.mge")


def _assert_clean_error(r, status, *needles):
    assert r.returncode == status, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    for n in needles:
        assert n in r.stderr, (n, r.stderr)


def test_help_lists_subcommands():
    r = _megbrain("--help")
    assert r.returncode == 0, r.stderr
    for sub in ("inspect", "run", "dot"):
        assert sub in r.stdout
    assert _megbrain().returncode == 2


def test_inspect_text(tiny):
    r = _megbrain("inspect", tiny)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "1 graph(s)" in out
    assert "x: (2, 3) float32 on cpu0" in out
    assert "y: (2, 3) float32" in out and "z: (2, 3) float32" in out
    assert "params: 1 tensors, 6 elements, 24 B" in out
    assert "Elemwise" in out and "Host2DeviceCopy" in out


def test_inspect_json(tiny):
    r = _megbrain("inspect", tiny, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["bytes"] == os.path.getsize(tiny)
    (g,) = doc["graphs"]
    assert g["inputs"] == [
        {"name": "x", "shape": [2, 3], "dtype": "float32", "comp_node": "cpu0:0"}
    ]
    assert [o["name"] for o in g["outputs"]] == ["y", "z"]
    assert g["params"] == {"count": 1, "elements": 6, "bytes": 24}
    assert g["operators"]["Host2DeviceCopy"] == 1
    assert g["operators"]["SharedDeviceTensor"] == 1
    # x*w, +1.5, relu, y*y
    assert g["operators"]["Elemwise"] == 4
    assert g["nr_opr"] == sum(g["operators"].values())
    assert g["comp_nodes"] == ["cpu0:0"]


def test_run_with_input_writes_outputs(tiny, tmp_path):
    xv = np.random.default_rng(3).standard_normal((2, 3)).astype("float32")
    np.save(tmp_path / "x.npy", xv)
    out = tmp_path / "out.npz"
    r = _megbrain("run", tiny, "--input", f"x={tmp_path / 'x.npy'}", "--iters", 3, "--output", out)
    assert r.returncode == 0, r.stderr
    assert "over 3 iteration(s)" in r.stdout
    for word in ("min", "median", "mean", "max"):
        assert word in r.stdout
    got = np.load(out)
    ey, ez = _expect(xv)
    np.testing.assert_allclose(got["y"], ey, rtol=1e-6)
    np.testing.assert_allclose(got["z"], ez, rtol=1e-6)


def test_run_random_is_seeded_and_optimizes(tiny, tmp_path, capsys):
    outs = []
    for i, extra in enumerate(([], ["--opt-level", 0], ["--optimize-for-inference"])):
        out = tmp_path / f"o{i}.npz"
        run = _megbrain if i == 0 else functools.partial(_inproc, capsys)
        r = run("run", tiny, "--random", "--seed", 7, "--iters", 2, "--output", out, *extra)
        assert r.returncode == 0, r.stderr
        outs.append(np.load(out))
    x = np.random.default_rng(7).standard_normal((2, 3)).astype("float32")
    for got in outs:
        np.testing.assert_allclose(got["y"], _expect(x)[0], rtol=1e-6)
        np.testing.assert_allclose(got["z"], _expect(x)[1], rtol=1e-6)
    r = _inproc(capsys, "run", tiny, "--random", "--seed", 8, "--output", tmp_path / "s8")
    assert r.returncode == 0, r.stderr
    assert not np.allclose(np.load(tmp_path / "s8.npz")["y"], outs[0]["y"])


def test_bad_model_files(tmp_path, tiny, capsys):
    _assert_clean_error(_megbrain("inspect", tmp_path / "nope.mge"), 1, "not found", "nope.mge")
    data = tiny.read_bytes()
    (tmp_path / "cut.mge").write_bytes(data[: len(data) // 2])
    _assert_clean_error(_megbrain("run", tmp_path / "cut.mge", "--random"), 1, "truncated")
    (tmp_path / "junk.mge").write_bytes(b"not a graph file at all" * 3)
    _assert_clean_error(_inproc(capsys, "dot", tmp_path / "junk.mge", "-o", tmp_path / "g.svg"), 1)


def test_bad_inputs(tiny, tmp_path, capsys):
    np.save(tmp_path / "good.npy", np.zeros((2, 3), "float32"))
    np.save(tmp_path / "shape.npy", np.zeros((3, 2), "float32"))
    np.save(tmp_path / "dtype.npy", np.zeros((2, 3), "float64"))
    (tmp_path / "broken.npy").write_bytes(b"\x93NUMPY garbage")
    cases = [
        (["--input", f"q={tmp_path / 'good.npy'}"], 2, ["unknown input", "q", "inputs are: x"]),
        (["--input", f"x={tmp_path / 'shape.npy'}"], 1, ["(3, 2)", "(2, 3)"]),
        (["--input", f"x={tmp_path / 'dtype.npy'}"], 1, ["float64", "float32"]),
        (["--input", f"x={tmp_path / 'broken.npy'}"], 1, ["broken.npy"]),
        (["--input", f"x={tmp_path / 'missing.npy'}"], 1, ["not found"]),
        (["--input", "x"], 2, ["NAME=FILE.npy"]),
        ([], 2, ["--random", "--input x="]),
    ]
    for i, (extra, status, needles) in enumerate(cases):
        run = _megbrain if i < 2 else functools.partial(_inproc, capsys)
        _assert_clean_error(run("run", tiny, *extra), status, *needles)


def test_input_of_unknown_shape_asks_for_input(tmp_path):
    g = mgb.comp_graph()
    x = mgb.make_arg("cpu0", g, dtype="float32", name="feat")
    path = tmp_path / "dyn.mge"
    mgb.serialize_comp_graph_to_file(str(path), {"y": x * 2})
    _assert_clean_error(_megbrain("run", path, "--random"), 2, "feat", "--input feat=")
    np.save(tmp_path / "f.npy", np.ones((4,), "float32"))
    r = _megbrain("run", path, "--input", f"feat={tmp_path / 'f.npy'}", "--output", tmp_path / "o")
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "o.npz")["y"], np.full(4, 2, "float32"))


def test_appended_graphs(tmp_path, capsys):
    path = _dump_tiny(tmp_path / "two.mge")
    g = mgb.comp_graph()
    a = mgb.make_arg("cpu0", g, shape=(5,), dtype="int32", name="a")
    mgb.serialize_comp_graph_to_file(str(path), {"b": a + 1}, append=True)
    doc = json.loads(_megbrain("inspect", path, "--json").stdout)
    assert [gr["inputs"][0]["name"] for gr in doc["graphs"]] == ["x", "a"]
    r = _megbrain("run", path, "--graph", 1, "--random", "--output", tmp_path / "o.npz")
    assert r.returncode == 0, r.stderr
    b = np.load(tmp_path / "o.npz")["b"]
    assert b.dtype == np.int32 and b.shape == (5,) and ((b >= 1) & (b <= 11)).all()
    _assert_clean_error(_inproc(capsys, "run", path, "--graph", 2, "--random"), 2, "2 graph(s)")


def test_dot_without_dot_program(tiny, tmp_path):
    target = tmp_path / "pic" / "graph.svg"
    target.parent.mkdir()
    r = _megbrain("dot", tiny, "-o", target)
    assert r.returncode == 0, r.stderr
    if shutil.which("dot") is None:
        assert not target.exists()
        assert "graph.dot" in r.stderr
        text = (tmp_path / "pic" / "graph.dot").read_text()
    else:
        assert target.read_bytes().lstrip().startswith((b"<?xml", b"<svg"))
        text = cli.graph_to_dot(mgb.load_comp_graph_from_file(str(tiny)))
    assert text.startswith("digraph")
    assert "Host2DeviceCopy" in text and "SharedDeviceTensor" in text
    assert '"(2, 3) float32"' in text
    assert text.count("->") == 4 + 1 + 2 + 2  # operator inputs (x*w, +c, relu, y*y) + outputs


def test_dot_without_graphviz_package(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "graphviz", None)  # import graphviz raises ImportError
    assert cli.main(["dot", str(tiny), "-o", str(tmp_path / "g.png")]) == 0
    assert "graphviz package is not installed" in capsys.readouterr().err
    assert (tmp_path / "g.dot").read_text().startswith("digraph")


def test_dot_text_output(tiny, tmp_path, capsys):
    assert cli.main(["dot", str(tiny), "-o", str(tmp_path / "g.dot")]) == 0
    assert "DOT text written" in capsys.readouterr().out
    assert (tmp_path / "g.dot").read_text().startswith("digraph")


def test_digits_cnn(tmp_path):
    """The digits CNN's inference graph: inspect shows its layers, run matches the model."""
    from megbrain.examples import digits

    model = digits.make_model("cnn")
    path = tmp_path / "digits.mge"
    try:
        digits.dump_inference(model, str(path), batch=4)
    except mgb.SerializationError as exc:
        pytest.skip(f"the digits CNN's operators are not all registered yet: {exc}")
    g = mgb.comp_graph()
    x = mgb.make_arg("cpu0", g, shape=(4, 1, 8, 8), name="x")
    logits = model(x)
    xv = np.random.default_rng(0).random((4, 1, 8, 8), dtype=np.float32)
    expect = g.compile([x], mgb.copy_output(logits))(xv)
    doc = json.loads(_megbrain("inspect", path, "--json").stdout)
    (gr,) = doc["graphs"]
    assert gr["inputs"][0]["shape"] == [4, 1, 8, 8]
    assert gr["outputs"][0]["name"] == "logits" and gr["outputs"][0]["shape"] == [4, 10]
    assert gr["operators"]["ConvolutionForward"] == 2 and gr["operators"]["PoolingForward"] == 2
    n_weights = sum(int(np.prod(p.get_value().shape)) for p in model.parameters())
    assert gr["params"]["elements"] >= n_weights
    np.save(tmp_path / "x.npy", xv)
    r = _megbrain("run", path, "--input", f"x={tmp_path / 'x.npy'}", "--output", tmp_path / "o")
    assert r.returncode == 0, r.stderr
    np.testing.assert_allclose(np.load(tmp_path / "o.npz")["logits"], expect, rtol=1e-5, atol=1e-6)


def test_digits_example_dump(tmp_path, capsys):
    """``digits --dump`` writes the trained model's graph; it runs to the model's answer."""
    from megbrain.examples import digits

    path = tmp_path / "mlp.mge"
    argv = ["--epochs", "1", "--model", "mlp", "--no-progress", "--out", str(tmp_path / "w.npz")]
    try:
        digits.main(argv + ["--dump", str(path), "--dump-batch", "3"])
    except mgb.SerializationError as exc:
        pytest.skip(f"the digits MLP's operators are not all registered yet: {exc}")
    assert "inference graph written to" in capsys.readouterr().out
    r = _inproc(capsys, "inspect", path, "--json")
    (gr,) = json.loads(r.stdout)["graphs"]
    assert gr["inputs"][0]["shape"] == [3, 1, 8, 8] and gr["outputs"][0]["shape"] == [3, 10]
    model = digits.make_model("mlp")
    nn.load_weights(model, str(tmp_path / "w.npz"))
    xv = digits.load_digits()[2][:3]
    np.save(tmp_path / "x.npy", xv)
    xarg = f"x={tmp_path / 'x.npy'}"
    r = _inproc(capsys, "run", path, "--input", xarg, "--output", tmp_path / "o")
    assert r.returncode == 0, r.stderr
    expect = digits.build_eval(model, 3)(xv)
    np.testing.assert_allclose(np.load(tmp_path / "o.npz")["logits"], expect, rtol=1e-5, atol=1e-6)


def test_progress_bar_only_on_a_terminal(monkeypatch):
    pytest.importorskip("tqdm")
    items = range(30)
    assert cli._progress(items, 30, "run", True) is items  # stderr is not a tty under pytest
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    bar = cli._progress(items, 30, "run", True)
    assert bar is not items and list(bar) == list(items)
    assert cli._progress(items, 30, "run", False) is items
    monkeypatch.setitem(sys.modules, "tqdm", None)  # not installed: plain iteration
    assert cli._progress(items, 30, "run", True) is items
