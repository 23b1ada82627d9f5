"""The digits example (``megbrain.examples.digits``) in its reduced mode: one epoch, the loss
goes down within it, and the reloaded weights give the trained accuracy."""

from __future__ import annotations

import os

import numpy as np
import pytest

import megbrain as mgb

pytest.importorskip("sklearn")
pytest.importorskip("tqdm")

from megbrain.examples import digits  # noqa: E402

HAS_CONV = hasattr(mgb.opr, "convolution") and hasattr(mgb.opr, "pooling")


def check(result, path):
    losses = np.array(result["step_losses"])
    assert len(losses) == (1797 - 360) // 32
    assert np.isfinite(losses).all()
    assert losses[-10:].mean() < 0.5 * losses[:10].mean()
    assert result["test_acc"] > 0.8
    assert result["reloaded_acc"] == result["test_acc"]
    assert os.path.getsize(path) > 0


def test_digits_mlp_one_epoch(tmp_path, capsys):
    out = tmp_path / "digits.npz"
    result = digits.main(["--epochs", "1", "--model", "mlp", "--no-progress", "--out", str(out)])
    check(result, out)
    assert "test accuracy" in capsys.readouterr().out


@pytest.mark.skipif(not HAS_CONV, reason="mgb.opr.convolution / pooling are not available yet")
def test_digits_cnn_one_epoch(tmp_path):
    out = tmp_path / "digits_cnn.npz"
    check(digits.main(["--epochs", "1", "--no-progress", "--out", str(out)]), out)


def test_train_digits_script(tmp_path):
    """``examples/train_digits.py`` runs as a script in the reduced mode."""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = tmp_path / "w.npz"
    proc = subprocess.run(
        [sys.executable, os.path.join(root, "examples", "train_digits.py"), "--epochs", "1",
         "--model", "mlp", "--no-progress", "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "reloaded from" in proc.stdout and out.exists()
