"""``python -m megbrain``: the ``megbrain`` command (see :mod:`megbrain.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
