"""Saving and loading module weights as ``.npz`` files, without pickle.

Loading trusts nothing in the file: the zip directory (names, duplicates, encryption,
compression, declared sizes) and every ``.npy`` header (dtype, shape, order) are checked
against the model before any array data is read, so a damaged, hostile or mismatched file
costs a few header reads and leaves the model unchanged.
"""

from __future__ import annotations

import os
import tokenize
import zipfile
import zlib
from typing import IO, NamedTuple

import numpy as np

import megbrain as mgb

__all__ = ["save_weights", "load_weights"]

_NPY_MAGIC = b"\x93NUMPY"
#: compression methods np.savez / np.savez_compressed write; the others zipfile can read need
#: optional modules (bz2, lzma) or are unsupported (raising NotImplementedError late)
_COMPRESSIONS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflated"}
#: the largest ``.npy`` header accepted: numpy's own default limit for untrusted files, plus
#: the magic, version and length fields
_MAX_HEADER = 10000
_HEADER_SLACK = _MAX_HEADER + 16
# what a damaged member or header can raise while it is parsed or read (numpy parses the
# header dict with ast.literal_eval, older versions with tokenize)
_READ_ERRORS = (
    OSError,
    ValueError,
    KeyError,
    EOFError,
    SyntaxError,
    TypeError,
    tokenize.TokenError,
    zipfile.BadZipFile,
    zlib.error,
    RuntimeError,
    NotImplementedError,
)


class _Entry(NamedTuple):
    """A checked member of the weights file: where its data starts and how to read it."""

    info: zipfile.ZipInfo
    shape: tuple[int, ...]
    dtype: np.dtype
    fortran_order: bool
    header_size: int


def save_weights(module, path: str | os.PathLike) -> None:
    """Write every parameter and buffer of ``module`` to ``path`` (npz, no pickle).

    The file is written beside ``path`` first and renamed over it, so an interrupted save
    never leaves a half-written weights file behind.

    Parameters
    ----------
    module : Module
        The model whose ``state_dict()`` is written.
    path : str or os.PathLike
        The file to write.
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

    Every check is made before the first array is read, and the model changes only once all
    arrays are read: the zip directory must hold exactly one ``<name>.npy`` member per
    parameter and buffer of ``module`` (no duplicates, not encrypted, stored or deflated),
    each declaring an uncompressed size no larger than its array needs; each ``.npy`` header
    must declare the model's shape and dtype exactly (no casting).

    Parameters
    ----------
    module : Module
        The model to load into.
    path : str or os.PathLike
        An ``.npz`` file written by :func:`save_weights` (or ``np.savez``).

    Raises
    ------
    SerializationError
        When the file can not be read as an npz of plain arrays (missing, truncated,
        corrupt, a bare ``.npy``, encrypted or unknown-compression members, damaged headers,
        pickled objects, members larger than declared or than their arrays need), or its
        names, shapes or dtypes do not match ``module``. The message names the file and the
        entry; ``module`` is then left unchanged.
    """
    path = os.fspath(path)
    own = dict(module.named_parameters())
    own.update(module.named_buffers())
    try:
        with open(path, "rb") as f:
            if f.read(len(_NPY_MAGIC)) == _NPY_MAGIC:
                raise _unreadable(path, "it is a bare .npy array, not an .npz of named weights")
            f.seek(0)
            with zipfile.ZipFile(f) as zf:
                infos = _check_directory(path, zf, own)
                entries = {k: _read_header(path, zf, k, info, own[k]) for k, info in infos.items()}
                # only now, with every name, header and size checked, is array data read
                state = {k: _read_data(path, zf, k, e) for k, e in entries.items()}
    except mgb.SerializationError:
        raise
    except (*_READ_ERRORS, MemoryError) as exc:
        raise _unreadable(path, str(exc) or type(exc).__name__) from exc
    try:
        module.load_state_dict(state)
    except mgb.MegBrainError as exc:
        raise _mismatch(path, str(exc)) from exc


def _unreadable(path: str, why: str, entry: str | None = None) -> mgb.SerializationError:
    where = "" if entry is None else f" entry {entry}:"
    return mgb.SerializationError(f"can not read weights from {path!r}:{where} {why}")


def _mismatch(path: str, why: str) -> mgb.SerializationError:
    return mgb.SerializationError(f"weights in {path!r} do not match the model: {why}")


def _check_directory(path: str, zf: zipfile.ZipFile, own: dict) -> dict[str, zipfile.ZipInfo]:
    """The members by weight name, after checking the directory alone (nothing is read)."""
    infos: dict[str, zipfile.ZipInfo] = {}
    for info in zf.infolist():
        name = info.filename
        if not name.endswith(".npy") or info.is_dir():
            raise _unreadable(path, "not a .npy array (save_weights writes only those)", name)
        key = name[: -len(".npy")]
        if key in infos:
            # zipfile would silently give the last one; which one was meant is unknowable
            raise _unreadable(path, "appears more than once in the file", key)
        if info.flag_bits & 0x1:
            raise _unreadable(path, "is encrypted (weights files are never encrypted)", key)
        if info.compress_type not in _COMPRESSIONS:
            raise _unreadable(
                path,
                f"uses compression method {info.compress_type}; only stored (0) and deflated "
                "(8) are supported",
                key,
            )
        infos[key] = info
    missing = [k for k in own if k not in infos]
    unexpected = [k for k in infos if k not in own]
    if missing or unexpected:
        raise _mismatch(path, f"missing keys {missing}, unexpected keys {unexpected}")
    for key, info in infos.items():
        t = own[key]
        allowed = _nbytes(tuple(t.shape), np.dtype(t.dtype)) + _HEADER_SLACK
        if info.file_size > allowed:
            # a zip bomb, or trailing data: refused before anything is inflated
            raise _unreadable(
                path,
                f"declares {info.file_size} bytes uncompressed, more than the {allowed} an "
                f"array of shape {tuple(t.shape)} and dtype {np.dtype(t.dtype)} needs",
                key,
            )
    return infos


def _nbytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    n = dtype.itemsize
    for d in shape:
        n *= int(d)
    return n


def _read_header(path: str, zf: zipfile.ZipFile, key: str, info: zipfile.ZipInfo, t) -> _Entry:
    """Read and check the ``.npy`` header of ``key`` against the model's tensor ``t``."""
    with zf.open(info) as fp:
        try:
            version = np.lib.format.read_magic(fp)
            shape, fortran_order, dtype = _read_array_header(fp, version)
            header_size = fp.tell()
        except _READ_ERRORS as exc:
            raise _unreadable(path, f"damaged .npy header ({exc})", key) from exc
    if dtype.hasobject:
        raise _unreadable(path, f"holds Python objects (dtype {dtype}), which need pickle", key)
    want_shape, want_dtype = tuple(t.shape), np.dtype(t.dtype)
    if shape != want_shape:
        raise _mismatch(path, f"entry {key} has shape {shape}, expected {want_shape}")
    # the byte order is the file's business; the kind and size must be the model's exactly
    if dtype.newbyteorder("=") != want_dtype:
        raise _mismatch(path, f"entry {key} has dtype {dtype}, expected {want_dtype}")
    expected = header_size + _nbytes(shape, dtype)
    if info.file_size != expected:
        raise _unreadable(
            path,
            f"holds {info.file_size} bytes, but its header declares {expected} "
            f"(shape {shape}, dtype {dtype})",
            key,
        )
    return _Entry(info, shape, dtype, bool(fortran_order), header_size)


def _read_array_header(fp: IO[bytes], version: tuple[int, int]):
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(fp, max_header_size=_MAX_HEADER)
    if version in ((2, 0), (3, 0)):
        # 3.0 differs from 2.0 only in the header's text encoding (utf8 for field names);
        # the plain dtypes of weights are ASCII either way
        return np.lib.format.read_array_header_2_0(fp, max_header_size=_MAX_HEADER)
    raise ValueError(f"unsupported .npy format version {version[0]}.{version[1]}")


def _read_data(path: str, zf: zipfile.ZipFile, key: str, e: _Entry) -> np.ndarray:
    """The array of a checked entry: exactly the bytes its header declares."""
    nbytes = _nbytes(e.shape, e.dtype)
    with zf.open(e.info) as fp:
        try:
            fp.read(e.header_size)
            buf = fp.read(nbytes)
            # reading to the end makes zipfile check the CRC of the whole member
            rest = fp.read(1)
        except _READ_ERRORS as exc:
            raise _unreadable(path, str(exc), key) from exc
    if len(buf) != nbytes or rest:
        raise _unreadable(path, f"holds {len(buf)} bytes of data, expected {nbytes}", key)
    arr = np.frombuffer(buf, dtype=e.dtype)
    return arr.reshape(e.shape, order="F" if e.fortran_order else "C")
