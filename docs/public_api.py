"""The public names of megbrain: what the API reference documents and the docstring test checks.

A public module is ``megbrain`` or any submodule whose dotted path has no part starting with
``_``. Its public names are its ``__all__`` when it has one, otherwise the classes and functions
it defines whose names do not start with ``_``.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import ModuleType

# Modules whose import failed for want of an optional dependency (``onnx`` for
# ``megbrain.onnx``): name -> the missing package. Filled by public_modules().
SKIPPED: dict[str, str] = {}


def public_modules() -> dict[str, ModuleType]:
    """Import and return every public module of megbrain, by dotted name (sorted).

    A module needing an optional package that is not installed is left out (and recorded in
    :data:`SKIPPED`); any other import error propagates.
    """
    import megbrain

    mods: dict[str, ModuleType] = {"megbrain": megbrain}

    # walk_packages ignores a package it can not import (its submodules are not listed);
    # importing each listed module below then raises or records the error
    for info in pkgutil.walk_packages(megbrain.__path__, "megbrain."):
        if any(part.startswith("_") for part in info.name.split(".")[1:]):
            continue
        if any(info.name.startswith(s + ".") for s in SKIPPED):
            continue
        try:
            mods[info.name] = importlib.import_module(info.name)
        except ImportError as exc:
            cause = exc if isinstance(exc, ModuleNotFoundError) else exc.__cause__
            missing = getattr(cause, "name", None) if isinstance(cause, ImportError) else None
            if missing is None or missing.split(".")[0] == "megbrain":
                raise
            SKIPPED[info.name] = missing
    return dict(sorted(mods.items()))


def public_names(mod: ModuleType) -> list[str]:
    """The public names of ``mod`` (see the module docstring)."""
    names = getattr(mod, "__all__", None)
    if names is None:
        names = [
            n
            for n, v in vars(mod).items()
            if (inspect.isclass(v) or inspect.isfunction(v))
            and getattr(v, "__module__", None) == mod.__name__
        ]
    return [n for n in names if not n.startswith("_")]


def canonical_pages(mods: dict[str, ModuleType]) -> dict[int, tuple[str, str]]:
    """For each public object (by id), the (module, name) whose page describes it: the
    module defining it when that module is public and lists it, else the first listing it."""
    home: dict[int, tuple[str, str]] = {}
    for name, mod in mods.items():
        for n in public_names(mod):
            obj = getattr(mod, n, None)
            if obj is None or isinstance(obj, ModuleType):
                continue
            defined_here = getattr(obj, "__module__", None) == name and (
                getattr(obj, "__name__", n) == n
            )
            if id(obj) not in home or defined_here:
                if id(obj) in home and home[id(obj)][0] == getattr(obj, "__module__", None):
                    continue
                home[id(obj)] = (name, n)
    return home
