"""Param mapping for the operator families' graph-file registrations (``serialization/sereg.py``).

An operator's ``Param`` dataclass is derived from the reference's param table (a class of
:mod:`megbrain.opr.param_defs`, see :func:`megbrain.graph.operator.table_param`), so the two
share field names and the table an operator writes is its Param's ``_table``. These helpers
map one to the other by name and are strict where
:func:`megbrain.serialization.sereg.register_param_opr`'s defaults are lenient: a table field
our Param has no place for (one it skips) must hold its default when a file is loaded, else
the load fails naming the operator, the field and its value (the graph would compute
something else). The convolution-like operators write a second table,
``param.ExecutionPolicy``, as the reference does.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from ..errors import SerializationError
from ..serialization import sereg
from . import param_defs as pdefs

__all__ = ["param_to_def", "param_from_def", "register_strict", "register_with_policy"]


#: re-exported: the by-name mapping the registry's defaults use too
param_to_def = sereg.param_to_def


def param_from_def(pcls: type, pdef: Any, opr_name: str, **extra: Any) -> Any:
    """The operator's ``pcls`` Param from a loaded table ``pdef``.

    Fields are taken by name (enum members by name), ``extra`` overriding. A table field
    ``pcls`` does not have must hold its default value.

    Parameters
    ----------
    pcls:
        The operator's Param dataclass.
    pdef:
        The loaded param-def instance.
    opr_name:
        The operator's registered name, for messages.
    **extra:
        Param fields given explicitly (from another table).

    Returns
    -------
    Any
        A ``pcls`` instance.

    Raises
    ------
    SerializationError
        For a table field without a place in ``pcls`` holding another value than its
        default.
    """
    names = {f.name for f in dataclasses.fields(pcls)}
    default = type(pdef)()
    kw = {}
    for f in type(pdef).FIELDS:
        v = getattr(pdef, f.name)
        if f.name in names:
            kw[f.name] = v.name if isinstance(v, enum.Enum) else v
        elif v != getattr(default, f.name):
            shown = v.name if isinstance(v, enum.Enum) else v
            want = getattr(default, f.name)
            want = want.name if isinstance(want, enum.Enum) else want
            raise SerializationError(
                f"loading {opr_name}: param {type(pdef).__name__}.{f.name}={shown} is not "
                f"supported (only the default {want})"
            )
    kw.update(extra)
    return pcls(**kw)


@dataclasses.dataclass(frozen=True)
class _NoParam:
    """The Param of a param-less operator: every table field must be at its default."""


def _table_of(opr_cls: type, def_cls: type | None) -> type:
    # a Param derived from a table names the table its operator writes
    return def_cls or opr_cls.Param._table


def register_strict(
    opr_cls: type, def_cls: type | None = None, *, name: str | None = None
) -> sereg.OprSerializer:
    """Register ``opr_cls`` as one ``def_cls`` table and its inputs, mapped by
    :func:`param_to_def` / :func:`param_from_def`.

    Parameters
    ----------
    opr_cls:
        The operator class, built as ``opr_cls(inputs, param, config)``; its ``Param`` is a
        dataclass, or None for a param-less operator (``def_cls`` then ``Empty``).
    def_cls:
        The reference's param table written; default the one the Param is derived from.
    name:
        The reference's registered name (default the class's type name).

    Returns
    -------
    OprSerializer
    """
    reg_name = name or opr_cls.type_name
    def_cls = _table_of(opr_cls, def_cls)

    def from_def(pdef: Any) -> Any:
        if opr_cls.Param is None:  # a param-less operator: only checks the table's fields
            param_from_def(_NoParam, pdef, reg_name)
            return None
        return param_from_def(opr_cls.Param, pdef, reg_name)

    return sereg.register_param_opr(
        opr_cls,
        def_cls,
        to_def=lambda param: param_to_def(def_cls, param),
        from_def=from_def,
        name=name,
    )


def register_with_policy(
    opr_cls: type, def_cls: type | None = None, *, name: str
) -> sereg.OprSerializer:
    """Register a convolution-like operator as the reference writes it: its ``def_cls``
    table, then ``param.ExecutionPolicy`` holding the Param's ``strategy``.

    ``workspace_limit`` is written at its default and ignored at load (a hint to the
    algorithm choice, of which there is one here).

    Parameters
    ----------
    opr_cls:
        The operator class; its Param has the fields of ``def_cls`` (those it lacks must be
        at their defaults in a file) and ``strategy``.
    def_cls:
        The operator's param table (``param.Convolution``, ``param.ConvBias``...); default
        the one the Param is derived from.
    name:
        The reference's registered name.

    Returns
    -------
    OprSerializer
    """
    def_cls = _table_of(opr_cls, def_cls)

    def dump(ctx: sereg.DumpContext, opr: Any) -> None:
        ctx.write_param(param_to_def(def_cls, opr.param))
        ctx.write_param(pdefs.ExecutionPolicy(strategy=opr.param.strategy))

    def load(ctx: sereg.LoadContext, inputs: list, config: Any) -> Any:
        pdef = ctx.read_param(def_cls)
        policy = ctx.read_param(pdefs.ExecutionPolicy)
        param = param_from_def(opr_cls.Param, pdef, name, strategy=policy.strategy.name)
        return ctx.graph.insert_opr(opr_cls(list(inputs), param, config))

    return sereg.register_serializer(opr_cls, dump=dump, load=load, name=name)
