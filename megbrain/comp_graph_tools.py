"""``comp_graph_tools``: graph inspection and rewriting helpers (also ``megbrain.cgtools``)."""

from .api.cgtools import *  # noqa: F403
from .api.cgtools import __all__  # noqa: F401
