"""Every guide runs as written: the ```python blocks of each docs/guides/*.md page run in order,
in one fresh namespace per page, in a temporary working directory."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

GUIDES = sorted((Path(__file__).resolve().parent.parent / "docs" / "guides").glob("*.md"))
_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)


def _blocks(path: Path) -> list[str]:
    return _BLOCK.findall(path.read_text())


def test_guides_exist_and_have_code():
    assert len(GUIDES) >= 10
    assert sum(len(_blocks(p)) for p in GUIDES) >= 20


@pytest.mark.parametrize("path", GUIDES, ids=[p.stem for p in GUIDES])
def test_guide_runs(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ns: dict = {"__name__": f"guide_{path.stem}"}
    for i, code in enumerate(_blocks(path)):
        try:
            exec(compile(code, f"{path.name}[block {i + 1}]", "exec"), ns)  # noqa: S102
        except Exception as exc:
            raise AssertionError(f"{path.name}, code block {i + 1} failed: {exc!r}") from exc
    assert os.getcwd() == str(tmp_path)
