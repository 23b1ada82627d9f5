"""Sphinx configuration of the megbrain documentation (``python -m sphinx -W -b html docs ...``)."""

from __future__ import annotations

import inspect
import os
import sys
import types

sys.path.insert(0, os.path.abspath(".."))

import megbrain  # noqa: E402

project = "megbrain"
author = "megbrain contributors"
copyright = "2026, megbrain contributors"  # noqa: A001
release = megbrain.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# no intersphinx: the build must work offline
autosummary_generate = True
autosummary_imported_members = False
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False}
autodoc_typehints = "description"
autodoc_member_order = "bysource"
napoleon_numpy_docstring = True
napoleon_google_docstring = False
napoleon_use_rtype = False
myst_heading_anchors = 3
# re-exported names (megbrain.CompNode = megbrain.device.CompNode) make short type names in
# signatures ambiguous; any of the targets is the same object
suppress_warnings = ["myst.xref_missing", "ref.python"]
napoleon_use_ivar = True

html_theme = "alabaster"
html_title = f"megbrain {release}"


def _write_api_pages() -> None:
    """One page per public module under api/generated/ (rebuilt at every build).

    An object public under several names (``megbrain.SharedND`` is
    ``megbrain.api.shared.SharedND``) is described once, on the page of the module defining
    it when that module is public, else on the first page listing it; the other pages link
    to that description.
    """
    sys.path.insert(0, os.path.dirname(__file__))
    from public_api import canonical_pages, public_modules, public_names

    out = os.path.join(os.path.dirname(__file__), "api", "generated")
    os.makedirs(out, exist_ok=True)
    mods = public_modules()
    home = canonical_pages(mods)
    for name, mod in mods.items():
        own, links = [], []
        for n in public_names(mod):
            obj = getattr(mod, n, None)
            if obj is None or isinstance(obj, types.ModuleType):
                continue
            where = home.get(id(obj), (name, n))
            (own if where == (name, n) else links).append((n, where))
        title = f"``{name}``"
        body = [title, "=" * len(title), "", f".. automodule:: {name}", "   :no-members:", ""]
        for n, _ in own:
            obj = getattr(mod, n)
            if inspect.isclass(obj) and obj.__module__.startswith("megbrain"):
                body += [f".. autoclass:: {name}.{n}", "   :members:", ""]
            elif inspect.isclass(obj):  # a NumPy or ml_dtypes type: named, not documented
                kind = f"{obj.__module__}.{obj.__name__}"
                body += [f".. py:data:: {name}.{n}", f"   :type: {kind}", ""]
            elif callable(obj):
                body += [f".. autofunction:: {name}.{n}", ""]
            else:  # data: its type only (autodoc would show a dict's or str's own docstring)
                body += [f".. py:data:: {name}.{n}", f"   :type: {type(obj).__name__}", ""]
        if links:
            body += ["", "Also available here:", ""]
            body += [f"* ``{n}``: :py:obj:`{w[0]}.{w[1]}`" for n, w in links]
        with open(os.path.join(out, name + ".rst"), "w") as f:
            f.write("\n".join(body) + "\n")


_write_api_pages()
