"""Every public name has a docstring that speaks to users.

Public names are those of ``megbrain.__all__`` and of every submodule whose dotted path has no
part starting with ``_`` (a module's ``__all__``, or the classes and functions it defines):
the names the API reference documents (docs/public_api.py decides, for both)."""

from __future__ import annotations

import functools
import importlib.util
import inspect
import re
from pathlib import Path
from types import ModuleType

import pytest

_DOCS = Path(__file__).resolve().parent.parent / "docs"
_spec = importlib.util.spec_from_file_location("public_api", _DOCS / "public_api.py")
public_api = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(public_api)

MODULES = public_api.public_modules()
# references to documents a user of the package does not have
_OUTSIDE = re.compile(r"SPEC\.md|DESIGN\.md|\.\./shared|SPEC §")


def _own_doc(obj) -> str:
    """The docstring of ``obj`` itself (a partial's or an instance's class doc is not one)."""
    if isinstance(obj, functools.partial):
        return obj.__dict__.get("__doc__") or ""
    if inspect.isclass(obj) or inspect.isroutine(obj) or isinstance(obj, ModuleType):
        return inspect.getdoc(obj) or ""
    if callable(obj) and type(obj).__module__.startswith("megbrain"):
        return getattr(obj, "__doc__", None) or ""  # a callable instance of ours
    return "-"  # data (constants, dtypes): documented by the module


def _names():
    out = []
    for mname, mod in MODULES.items():
        out.append((mname, None))
        out += [(mname, n) for n in public_api.public_names(mod)]
    return out


NAMES = _names()


def test_there_are_many_public_names():
    assert len(MODULES) > 50
    assert len(NAMES) > 500


def test_every_public_name_has_a_docstring():
    missing = []
    for mname, n in NAMES:
        mod = MODULES[mname]
        obj = mod if n is None else getattr(mod, n, None)
        if n is not None and not hasattr(mod, n):
            missing.append(f"{mname}.{n} (listed but missing)")
        elif not _own_doc(obj).strip():
            missing.append(mname if n is None else f"{mname}.{n}")
    assert not missing, f"{len(missing)} public names without a docstring: {missing}"


def test_elemwise_functions_have_their_own_docstrings():
    import megbrain as mgb

    modes = [n for n in dir(mgb.opr.elem) if not n.startswith("_")]
    assert len(modes) >= 50
    for n in modes:
        doc = _own_doc(getattr(mgb.opr.elem, n))
        assert doc.strip() and "partial(func" not in doc, n


@pytest.mark.parametrize("mname", sorted(MODULES))
def test_docstrings_do_not_cite_files_outside_the_repository(mname):
    mod = MODULES[mname]
    docs = [mod.__doc__ or ""]
    for _, obj in inspect.getmembers(mod):
        if getattr(obj, "__module__", None) == mname:
            docs.append(getattr(obj, "__doc__", None) or "")
            if inspect.isclass(obj):
                docs += [getattr(m, "__doc__", None) or "" for m in vars(obj).values()]
    bad = [d.strip().splitlines()[0] for d in docs if isinstance(d, str) and _OUTSIDE.search(d)]
    assert not bad, f"{mname}: {bad}"
