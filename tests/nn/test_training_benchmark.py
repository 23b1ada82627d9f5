"""benchmarks/training.py's loss checks on the MLP, three steps, so that they cannot rot: the
same-state check (from PyTorch float64's state at each step, megbrain's loss and update agree
with float64's as closely as PyTorch float32's do) and PyTorch's curve at another thread
count, the floor printed beside the free-running comparison. Skipped without PyTorch (a
benchmark peer); marked slow (about 10 s of CPU: PyTorch's import and the MLP's compile), run
them with ``pytest -m slow tests/nn/test_training_benchmark.py`` before changing the
benchmark."""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("torch")

_BENCHMARKS = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks"
)


@pytest.mark.slow
def test_same_state_check_measures_one_step(monkeypatch):
    monkeypatch.syspath_prepend(_BENCHMARKS)
    import training

    monkeypatch.setattr(training, "LOSS_STEPS", 3)
    kind = "mlp"
    out = training.same_state_check(kind, training.mgb_model(kind).state_dict(),
                                    training.make_data(kind))  # fmt: skip
    (m_loss, m_upd), (p_loss, p_upd) = out["megbrain"], out["pytorch"]
    assert m_loss.shape == m_upd.shape == (3,)
    assert np.max(m_loss) <= 1e-6 and np.max(p_loss) <= 1e-6
    # float32 storage of the updated weights sets both update errors' floor
    assert np.all(m_upd <= 2 * p_upd + 1e-6), (m_upd, p_upd)


@pytest.mark.slow
def test_other_threads_curve_restores_the_thread_count(monkeypatch):
    monkeypatch.syspath_prepend(_BENCHMARKS)
    import torch
    import training

    monkeypatch.setattr(training, "LOSS_STEPS", 3)
    kind = "mlp"
    state, data = training.mgb_model(kind).state_dict(), training.make_data(kind)
    threads = torch.get_num_threads()
    other = training.torch_other_threads_curve(kind, state, data)
    assert torch.get_num_threads() == threads
    s = training.torch_trainer(kind, state, data)
    own = np.array([s(i) for i in range(3)])
    assert other.shape == (3,)
    # the same training, summed in another order: equal to float32 rounding over 3 steps
    assert training.max_rel(other, own) <= 1e-5, (other, own)
