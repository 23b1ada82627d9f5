"""Saving and loading weights as ``.npz`` files, without pickle."""

from __future__ import annotations

import os
import zipfile

import numpy as np

import megbrain as mgb

__all__ = ["save_weights", "load_weights"]


def save_weights(module, path: str | os.PathLike) -> None:
    """Write every parameter and buffer of ``module`` to ``path`` (npz, no pickle)."""
    state = module.state_dict()
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "wb") as f:
        np.savez(f, **state)
    os.replace(tmp, path)


def load_weights(module, path: str | os.PathLike) -> None:
    """Load weights saved by :func:`save_weights`; a corrupt or mismatched file raises
    SerializationError and leaves ``module`` unchanged."""
    try:
        with np.load(path, allow_pickle=False) as data:
            state = {k: data[k] for k in data.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise mgb.SerializationError(f"can not read weights from {path!r}: {exc}") from exc
    try:
        module.load_state_dict(state)
    except mgb.MegBrainError as exc:
        raise mgb.SerializationError(f"weights in {path!r} do not match the model: {exc}") \
            from exc
