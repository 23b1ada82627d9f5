"""Saving and loading module weights as ``.npz`` files, without pickle."""

from __future__ import annotations

import os
import zipfile
import zlib

import numpy as np

import megbrain as mgb

__all__ = ["save_weights", "load_weights"]


def save_weights(module, path: str | os.PathLike) -> None:
    """Write every parameter and buffer of ``module`` to ``path`` (npz, no pickle).

    The file is written beside ``path`` first and renamed over it, so an interrupted save
    never leaves a half-written weights file behind.
    """
    state = module.state_dict()
    path = os.fspath(path)
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **state)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def load_weights(module, path: str | os.PathLike) -> None:
    """Load weights saved by :func:`save_weights`.

    Raises
    ------
    SerializationError
        When the file can not be read as an npz of plain arrays (missing, truncated,
        corrupt, or holding pickled objects), or its names, shapes or dtypes do not match
        ``module``; ``module`` is then left unchanged.
    """
    path = os.fspath(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            state = {k: data[k] for k in data.files}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise mgb.SerializationError(f"can not read weights from {path!r}: {exc}") from exc
    try:
        module.load_state_dict(state)
    except mgb.MegBrainError as exc:
        raise mgb.SerializationError(f"weights in {path!r} do not match the model: {exc}") from exc
