"""The differential fuzzer's test directory: the operator harness on ``sys.path`` (for
``check_grad``); its ``@pytest.mark.slow`` long run is deselected by the default
``-m 'not slow'`` (pyproject.toml) and selected with ``pytest -m slow tests/fuzz``."""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
sys.path.insert(0, os.path.join(os.path.dirname(_HERE), "opr"))  # opr_harness
