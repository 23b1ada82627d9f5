"""Puts this directory on ``sys.path`` so operator tests can ``from opr_harness import ...``."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
