"""``mgb``: the names of the reference's compiled binding module that Python code reads.

Everything here is an object of the layered packages under its binding name: the classes,
the custom dtypes, and the ``_Opr``/``_mgb`` namespaces of raw entry points.
"""

from __future__ import annotations

from . import opr as _opr
from .api import (  # noqa: F401
    AsyncExec,
    CompGraph,
    CompGraphCallbackValueProxy,
    SharedND,
    SharedScalar,
    _HostSharedND,
)
from .api.config import max_size_t  # noqa: F401
from .api.functions import (  # noqa: F401
    _add_update_fastpath,
)
from .api.persistent_cache import PersistentCache as _PersistentCache  # noqa: F401
from .api.serialization import (  # noqa: F401
    TensorValueDumperContext,
    TensorValueLoaderContext,
)
from .api.version import version_info as _version_info
from .device import CompNode, as_comp_node  # noqa: F401
from .dtype import (  # noqa: F401
    intb1,
    intb2,
    intb4,
)
from .graph import OperatorNodeConfig  # noqa: F401
from .opr.base import SymbolVar  # noqa: F401
from .opr.operator_handle import Operator  # noqa: F401


def _get_mgb_version() -> tuple[int, int, int, int]:
    """(major, minor, patch, dev) of this runtime."""
    return tuple(_version_info)


class _Opr:
    """Raw operator constructors taking every argument positionally, as the binding had them."""

    @staticmethod
    def add_update(dest, delta, alpha, beta, bias, disable, config):
        return _opr.add_update(dest, delta, alpha, beta, bias, disable, config=config)


class _mgb:  # noqa: N801 - the binding's name
    """Raw free functions of the binding."""

    @staticmethod
    def SharedScalar__set(scalar: SharedScalar, value) -> None:  # noqa: N802
        scalar.set(value)


def __getattr__(name: str):
    # bfloat16 is imported on first use (see megbrain.dtype)
    if name == "bfloat16":
        from . import dtype

        return dtype.bfloat16
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
