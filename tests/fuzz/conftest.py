"""The differential fuzzer's test directory: the operator harness on ``sys.path`` (for
``check_grad``), and ``@pytest.mark.slow`` tests skipped unless ``-m`` selects them."""

from __future__ import annotations

import os
import sys

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
sys.path.insert(0, os.path.join(os.path.dirname(_HERE), "opr"))  # opr_harness


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the long fuzzer runs of this directory unless a ``-m`` expression was given."""
    if config.option.markexpr:
        return
    skip = pytest.mark.skip(reason="long fuzzer run: select it with `pytest -m slow tests/fuzz`")
    for item in items:
        if "slow" in item.keywords and str(item.path).startswith(_HERE):
            item.add_marker(skip)
