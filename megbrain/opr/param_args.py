"""The param calling conventions of MegBrain 0.6's generated ``mgb.opr`` functions.

The reference generated each operator function as ``f(<inputs>, *, <pname>=None, ...,
name=None, comp_node=None, config=None, comp_graph=None, **kwargs)``: every param (``param``
of type ``Convolution``, ``execution_polity`` of type ``ExecutionPolicy`` ...) may be given as
a param-def object (:mod:`megbrain.opr_param_defs`), as a list of its fields in ``__slots__``
order, as the value of its only field, or field by field as keyword arguments.

Our functions take the fields as keyword arguments of their own; :func:`opr_params` wraps
such a function so it also takes the whole-param forms, checks the keywords it does not
know, and publishes the resulting signature.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from ..errors import ArgumentError, MegBrainError
from ..graph.operator import ParamBase
from ..graph.param_def import EnumBase
from . import param_defs as _pdefs

__all__ = [
    "opr_params",
    "param_fields",
    "optional_axis",
    "reduce_axis",
    "is_int",
    "as_int",
    "as_axis",
    "as_axes",
    "check_axis_range",
]

_KW = inspect.Parameter.KEYWORD_ONLY
_VAR_KW = inspect.Parameter.VAR_KEYWORD
_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def is_int(value: Any) -> bool:
    """Whether ``value`` is a Python or NumPy integer (bools are not)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def as_int(value: Any, fname: str, arg: str, what: str = "an int") -> int:
    """``value`` as an int, or an error; the one conversion of integer arguments.

    ``int()`` would truncate ``1.5`` and parse ``'1'``, turning a mistake into a silently
    different operator, so only Python and NumPy integers are accepted.

    Parameters
    ----------
    value:
        The argument.
    fname:
        The function it was given to, for the message.
    arg:
        The argument's name, for the message.
    what:
        What was expected, for the message.

    Returns
    -------
    int

    Raises
    ------
    ArgumentError
        For anything else, bools included.
    """
    if not is_int(value):
        raise ArgumentError(
            f"{fname}(): {arg} must be {what} (a Python or NumPy integer), got {value!r} "
            f"of type {type(value).__name__}"
        )
    return int(value)


def as_axis(value: Any, fname: str, arg: str = "axis") -> int:
    """An axis argument as an int (negative axes count from the end); see :func:`as_int`."""
    return as_int(value, fname, arg, "an int axis")


def as_axes(value: Any, fname: str, arg: str = "axis") -> list[int]:
    """An int axis or a sequence of them as a list of ints; see :func:`as_int`."""
    if is_int(value):
        return [int(value)]
    if isinstance(value, np.ndarray) and value.ndim == 1:
        value = value.tolist()
    if not isinstance(value, (list, tuple, range)):
        raise ArgumentError(
            f"{fname}(): {arg} must be an int axis or a list of them, got {value!r} of type "
            f"{type(value).__name__}"
        )
    return [as_int(a, fname, f"{arg}[{i}]", "an int axis") for i, a in enumerate(value)]


def check_axis_range(axis: int, ndim: int, fname: str, arg: str = "axis") -> int:
    """``axis`` in ``[-ndim, ndim)`` as a non-negative int; ArgumentError otherwise."""
    if not -ndim <= axis < ndim:
        raise ArgumentError(f"{fname}(): {arg}={axis} is out of range for ndim {ndim}")
    return axis % ndim


def optional_axis(axis: Any) -> int | None:
    """An ``OptionalAxisV1`` axis as ours: ``INVALID_AXIS`` (no axis) is None."""
    invalid = _pdefs.PARAM_DEFS["OptionalAxisV1"].INVALID_AXIS
    if axis is None:
        return None
    axis = as_axis(axis, "OptionalAxisV1")
    return None if axis == invalid else axis


def reduce_axis(axis: Any, fname: str = "reduce_general") -> int | None:
    """A ``Reduce`` axis as ours: INT_MAX (reduce to the target shape) is None."""
    if axis is None:
        return None
    axis = as_axis(axis, fname)
    return None if axis == 2**31 - 1 else axis


def _param_class(type_name: str) -> type:
    if type_name == "SerializedDType":
        return _pdefs.SerializedDType
    try:
        return _pdefs.PARAM_DEFS[type_name]
    except KeyError:
        raise ValueError(f"no param def named {type_name!r}") from None


def _plain(value: Any) -> Any:
    """An enum member as its name, which every function of ours takes; other values as is."""
    return value.name if isinstance(value, EnumBase) else value


def _is_param_def(value: Any) -> bool:
    # param-def objects of the table, and any other object laid out like them (the
    # reference's classes list their fields in ``__slots__``)
    return not isinstance(value, (ParamBase, str, bytes)) and bool(
        getattr(type(value), "__slots__", None)
    )


def param_fields(fname: str, pname: str, ptype: type, value: Any) -> dict[str, Any] | None:
    """The fields a whole-param argument stands for.

    Parameters
    ----------
    fname:
        The function name, for messages.
    pname:
        The argument name (``param``, ``axis``, ``execution_polity`` ...).
    ptype:
        The param-def class of the argument.
    value:
        A param-def object (of ``ptype`` or of a class with its ``__slots__``), a list or
        tuple of field values in ``ptype.__slots__`` order, or, for a one-field param, that
        field's value.

    Returns
    -------
    dict or None
        Field name -> value, enum members given by name; None for any other value.

    Raises
    ------
    TypeError
        For a param-def object of another layout, or a list of too many values.
    """
    slots = tuple(ptype.__slots__)
    if _is_param_def(value):
        # any class laid out as ptype will do (the reference's own classes, say), no other
        if not isinstance(value, ptype) and tuple(type(value).__slots__) != slots:
            raise TypeError(
                f"{fname}(): {pname}= must be a {ptype.__name__} (fields {', '.join(slots)}), "
                f"got a {type(value).__name__}"
            )
        return {n: _plain(getattr(value, n)) for n in slots}
    if isinstance(value, (list, tuple)):
        if len(value) > len(slots):
            raise TypeError(
                f"{fname}(): {pname}= takes at most {len(slots)} field value(s) of "
                f"{ptype.__name__} ({', '.join(slots)}), got {len(value)}"
            )
        return {n: _plain(v) for n, v in zip(slots, value)}
    if len(slots) == 1:
        return {slots[0]: _plain(value)}
    return None


def _check_default(fname: str, ptype: type, field: str, value: Any) -> None:
    """A field the function does not implement is accepted at its default value only."""
    default = getattr(ptype(), field)
    try:
        given = getattr(ptype(**{field: value}), field)
    except (TypeError, ValueError) as exc:
        raise MegBrainError(f"{fname}: invalid {field}={value!r}: {exc}") from None
    if given != default:
        raise MegBrainError(
            f"{fname}: {field}={_plain(given)!r} is not supported (only the default "
            f"{_plain(default)!r})"
        )


def opr_params(
    *specs: tuple[str, str],
    rename: Mapping[str, str] | None = None,
    ignore: Iterable[str] = (),
    fixed: Iterable[str] = (),
    convert: Mapping[str, Callable[[Any], Any]] | None = None,
) -> Callable[[Callable], Callable]:
    """Give an ``mgb.opr`` function the reference's ways of passing params.

    Parameters
    ----------
    *specs:
        ``(argument name, param-def type name)`` pairs, as in the reference's declaration:
        ``("param", "Convolution"), ("execution_polity", "ExecutionPolicy")``.
    rename:
        Reference field name -> the function's keyword for it, where they differ.
    ignore:
        Reference fields the function accepts and drops at any value: hints with no effect
        on results (``workspace_limit``). Any other field the function lacks is accepted at
        its default value only.
    fixed:
        Reference fields the function lacks, accepted at their default value only, that the
        wrapper can not tell by itself: those of a function taking its fields as
        ``**kwargs``, and fields named like one of the function's inputs (``scale`` of
        ``BN``), which only a whole param can give.
    convert:
        The function's keyword -> converter of values taken from a whole param (sentinels
        such as ``OptionalAxisV1.INVALID_AXIS`` to None).

    Returns
    -------
    callable
        A decorator. The wrapped function takes, besides its own arguments: each spec's
        argument as a param-def object, a list of field values or a one-field value (an
        argument the function declares itself, as ``axis`` of ``concat``, keeps its own
        meaning for other values); every reference field as a keyword; enum members for
        names. An unknown keyword, or a field given twice, raises TypeError naming the
        function.
    """
    rename = dict(rename or {})
    ignore = frozenset(ignore)
    fixed = frozenset(fixed)
    convert = dict(convert or {})
    classes = [(pname, _param_class(tname)) for pname, tname in specs]

    def deco(func: Callable) -> Callable:
        fname = func.__name__
        sig = inspect.signature(func)
        declared = {n for n, p in sig.parameters.items() if p.kind in _NAMED}
        var_kw = any(p.kind == _VAR_KW for p in sig.parameters.values())
        # field keyword -> (param class, reference field name)
        field_of: dict[str, tuple[type, str]] = {}
        for _, cls in classes:
            for f in cls.__slots__:
                field_of.setdefault(rename.get(f, f), (cls, f))
        # the function itself takes its declared keywords; with **kwargs also every field it
        # is not told to drop
        dropped = {rename.get(f, f) for f in ignore | fixed}
        own = declared | (set(field_of) - dropped if var_kw else set())
        # a renamed field is also taken under its reference name
        aliases = {f: k for f, k in rename.items() if f not in declared}
        accepted = own | set(field_of) | set(aliases) | {p for p, _ in classes}

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            unknown = [k for k in kwargs if k not in accepted]
            if unknown:
                raise TypeError(f"{fname}() got an unexpected keyword argument {unknown[0]!r}")
            for f, key in aliases.items():
                if f in kwargs:
                    if key in kwargs:
                        raise TypeError(f"{fname}(): {f!r} and {key!r} name the same field")
                    kwargs[key] = kwargs.pop(f)
            given = set(kwargs)
            for pname, cls in classes:
                if pname not in kwargs:
                    continue
                value = kwargs[pname]
                if value is None or isinstance(value, ParamBase):
                    if pname not in declared:
                        if value is not None:
                            raise TypeError(
                                f"{fname}(): {pname}= must be a {cls.__name__}, got {value!r}"
                            )
                        del kwargs[pname]
                    continue
                if pname in declared and not _is_param_def(value):
                    continue  # the function's own meaning of this argument (axis=1)
                fields = param_fields(fname, pname, cls, value)
                if fields is None:
                    raise TypeError(
                        f"{fname}(): {pname}= must be a {cls.__name__}, a list of its fields "
                        f"or None, got {value!r}"
                    )
                del kwargs[pname]
                given.discard(pname)
                for f, v in fields.items():
                    if f in fixed:
                        _check_default(fname, cls, f, v)
                        continue
                    if f in ignore:
                        continue
                    key = rename.get(f, f)
                    if key in given:
                        raise TypeError(
                            f"{fname}(): field {key!r} given both by {pname}= and as a keyword"
                        )
                    kwargs[key] = convert[key](v) if key in convert else v
            for key in list(kwargs):
                if key not in field_of:
                    continue
                kwargs[key] = _plain(kwargs[key])
                if key not in own:
                    cls, f = field_of[key]
                    v = kwargs.pop(key)
                    if f not in ignore:
                        _check_default(fname, cls, f, v)
            return func(*args, **kwargs)

        params = [p for p in sig.parameters.values() if p.kind != _VAR_KW]
        names = {p.name for p in params}
        # the published signature: the function's own arguments, then the param arguments
        # (None), the fields it does not declare (the reference defaults) and the reference
        # names of renamed fields (None: the renamed keyword's default applies)
        defaults: dict[str, Any] = {p: None for p, _ in classes}
        for key, (cls, f) in field_of.items():
            defaults.setdefault(key, _plain(getattr(cls(), f)))
        defaults.update({f: None for f in aliases if f not in defaults})
        params += [
            inspect.Parameter(n, _KW, default=d) for n, d in defaults.items() if n not in names
        ]
        wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        return wrapper

    return deco
