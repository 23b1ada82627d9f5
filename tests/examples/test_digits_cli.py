"""The digits example's command line, run as a user runs it: a subprocess with tiny settings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sklearn")

ROOT = Path(__file__).resolve().parents[2]
PROG = "python -m megbrain.examples.digits"


def _run(*args, cwd, env_extra=None, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "megbrain.examples.digits", *map(str, args)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_help_names_the_command_and_every_default(tmp_path):
    r = _run("--help", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: {PROG}")
    for text in ("(default: 20)", "(default: 32)", "(default: 0.003)", "(default: cnn)",
                 "(default: 1)", "current directory"):  # fmt: skip
        assert text in r.stdout, text
    for opt in ("--epochs", "--batch", "--lr", "--model", "--out", "--no-progress", "--profile",
                "--dump", "--dump-batch", "--distributed"):  # fmt: skip
        assert opt in r.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--batch", "100000"], "--batch 100000 is larger than the 1437 training images"),
        (["--out", "no/such/dir/w.npz"], "does not exist"),
        (["--out", "."], "is a directory"),
        (["--dump", "missing_dir/m.mge"], "--dump missing_dir/m.mge: directory"),
        (["--epochs", "0"], "expected a positive integer, got 0"),
        (["--batch", "x"], "expected a positive integer, got 'x'"),
        (["--lr", "-1"], "expected a positive number"),
        (["--model", "resnet"], "invalid choice"),
    ],
)
def test_bad_settings_give_one_line_and_status_2(tmp_path, args, message):
    r = _run(*args, "--epochs" if "--epochs" not in args else "--lr", "1", cwd=tmp_path)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{PROG}: error:") and message in last, r.stderr
    assert not list(tmp_path.iterdir())  # nothing written


def test_default_output_is_the_current_directory_and_printed(tmp_path):
    r = _run("--epochs", "1", "--model", "mlp", "--batch", "256", "--no-progress", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "digits_mlp.npz"
    assert out.exists()
    assert f"weights saved to {out}" in r.stdout


def test_no_progress_works_without_tqdm(tmp_path):
    # a tqdm that can not be imported: the run must not need it
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "tqdm.py").write_text("raise ImportError('no tqdm here')\n")
    env = {"PYTHONPATH": f"{fake}{os.pathsep}{ROOT}"}
    out = tmp_path / "w.npz"
    r = _run("--epochs", "1", "--model", "mlp", "--batch", "256", "--no-progress", "--out", out,
             cwd=tmp_path, env_extra=env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert out.exists() and "tqdm" not in r.stderr


def _run_on_terminal(*args, cwd, timeout=300):
    """``_run`` with stderr on a pseudo-terminal (as in an interactive shell); the stderr
    text is returned in ``.stderr``."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    # a new terminal is 0 columns wide, where tqdm draws nothing: make it 100 x 30
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [sys.executable, "-m", "megbrain.examples.digits", *map(str, args)],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=slave, text=True,
    )  # fmt: skip
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    out, _ = proc.communicate(timeout=timeout)
    err = b"".join(chunks).decode(errors="replace")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_progress_bar_counts_batches(tmp_path):
    pytest.importorskip("tqdm")
    r = _run_on_terminal("--epochs", "1", "--model", "mlp", "--batch", "256", "--out",
                         tmp_path / "w.npz", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    # 1437 // 256 = 5 batches; tqdm writes its bar to stderr
    assert "5/5" in r.stderr and "batch" in r.stderr, r.stderr


def test_no_progress_bar_when_piped(tmp_path):
    # a CI log (stderr piped to a file) gets no bar redraws
    pytest.importorskip("tqdm")
    r = _run("--epochs", "1", "--model", "mlp", "--batch", "256", "--out", tmp_path / "w.npz",
             cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "\r" not in r.stderr and "5/5" not in r.stderr and "it/s" not in r.stderr, r.stderr
