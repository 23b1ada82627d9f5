"""The operator param classes under the names of ``megengine._internal.opr_param_defs``.

The table itself lives in :mod:`megbrain.opr.param_defs`.
"""

from .graph import param_def as _engine
from .opr import param_defs as _table

# the reference module's private bases, which code tests enum members against
_EnumBase = _engine.EnumBase
_ParamDefBase = _engine.ParamDefBase

globals().update(_table.PARAM_DEFS)
SerializedDType = _table.SerializedDType

__all__ = [*_table.PARAM_DEFS, "SerializedDType"]
