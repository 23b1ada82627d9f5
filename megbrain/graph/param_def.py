"""Declarative operator-param definitions turned into classes with MegBrain's binary format.

A table declares each param as a chain, ``table.pdef("Pooling").add_enum("Mode", "MAX",
"AVERAGE").add_fields("uint32", "pad_h", 0, ...)``, and :meth:`ParamDefTable.build` makes one
class per declaration, shaped like the classes of ``megengine._internal.opr_param_defs``:

* ``TAG``: the first 32 bits of ``sha256(name [+ uint32 version])``, moved above 1023;
* ``__slots__``: the field names in declaration order, enum fields included;
* one nested :class:`EnumBase` class per enum (an enum alias is the source class itself);
* ``__init__(self, field=default, ...)``, converting each value to its C type (an enum field
  takes a member, its name in any case, or a member alias);
* ``serialize()``: the uint32 tag, then the fields packed with :mod:`struct`'s native
  alignment (enums as their member index), padded to the largest field's size.

A legacy declaration (``is_legacy=True``) names its class ``<name>V<version>`` and keeps the
tag of the plain name, so an old and a new version of a param can live side by side.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import inspect
import struct
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar, NamedTuple

__all__ = [
    "EnumBase",
    "ParamDefBase",
    "ParamDef",
    "ParamDefTable",
    "FieldSpec",
    "members_of",
    "enum_index",
    "param_tag",
    "default_name_field",
    "per_axis_fields",
]

#: C type name -> (struct format char, Python converter); ``dtype`` converts through the
#: table's hook and is stored as its enum number.
_CTYPES: dict[str, tuple[str, Callable[[Any], Any] | None]] = {
    "int32": ("i", int),
    "uint32": ("I", int),
    "uint64": ("Q", int),
    "float32": ("f", float),
    "float64": ("d", float),
    "bool": ("?", bool),
    "dtype": ("I", None),
}
_ENUM_FMT = "I"


class EnumBase(enum.Enum):
    """Base of the param enums: each member's value is its own name.

    Members are looked up by name without regard to case, so ``Mode("max")`` and
    ``Mode.convert("MAX")`` both give ``Mode.MAX``; member aliases (``INTER_LINEAR`` for
    ``LINEAR``) are found the same way.
    """

    @classmethod
    def convert(cls, val: Any) -> EnumBase:
        """``val`` as a member of this enum.

        Parameters
        ----------
        val:
            A member of this enum, or the name of a member or member alias in any case.

        Returns
        -------
        EnumBase
            The member.

        Raises
        ------
        ValueError
            When ``val`` names no member.
        """
        if isinstance(val, cls):
            return val
        return cls(val)

    @classmethod
    def _missing_(cls, value: object) -> EnumBase | None:
        if isinstance(value, str):
            upper = value.upper()
            for name, member in cls.__members__.items():
                if name.upper() == upper:
                    return member
        return None


@functools.cache
def _indices(enum_cls: type[EnumBase]) -> dict[str, int]:
    return {m.name: i for i, m in enumerate(enum_cls)}


def members_of(enum_cls: type[EnumBase]) -> tuple[str, ...]:
    """The member names of ``enum_cls`` in declaration (and serialization index) order.

    Parameters
    ----------
    enum_cls:
        A param enum class, such as ``Convolution.Mode``.

    Returns
    -------
    tuple of str
        The canonical names; member aliases are left out.
    """
    return tuple(_indices(enum_cls))


def enum_index(member: EnumBase) -> int:
    """The index ``member`` is serialized as: its position in its enum's declaration.

    Parameters
    ----------
    member:
        A member of a param enum.

    Returns
    -------
    int
    """
    return _indices(type(member))[member.name]


def param_tag(name: str, version: int = 0) -> int:
    """The ``TAG`` of the param declared as ``name`` (without any legacy suffix) at ``version``.

    Parameters
    ----------
    name:
        The declared name.
    version:
        The declared version; version 0 leaves the hash input at the bare name.

    Returns
    -------
    int
        The first 8 hex digits of the sha256, plus 1024 when below 1024 (smaller tags are
        reserved).
    """
    h = hashlib.sha256(name.encode("utf-8"))
    if version:
        h.update(struct.pack("<I", version))
    tag = int(h.hexdigest()[:8], 16)
    return tag + 1024 if tag < 1024 else tag


def default_name_field(enum_name: str) -> str:
    """The field name of an enum when none is given: the name with its first letter lowered.

    ``Mode`` gives ``mode`` and ``NonlineMode`` gives ``nonlineMode``; tables pass snake-case
    names such as ``compute_mode`` explicitly.

    Parameters
    ----------
    enum_name:
        The enum class name.

    Returns
    -------
    str
    """
    return enum_name[0].lower() + enum_name[1:]


def per_axis_fields(**per_axis: Sequence) -> dict[str, Any]:
    """The per-axis fields of a spatial param (``pad_h``, ``stride_w``, ``dilate_d``, ...)
    from one list of two (h, w) or three (d, h, w) values per field stem.

    Parameters
    ----------
    **per_axis:
        ``stem=[values]``, e.g. ``pad=[1, 1], stride=[2, 2]``.

    Returns
    -------
    dict
        ``{"pad_h": 1, "pad_w": 1, "stride_h": 2, "stride_w": 2}`` for that example.
    """
    return {
        f"{stem}_{axis}": v
        for stem, values in per_axis.items()
        for axis, v in zip("dhw"[-len(values) :], values)
    }


class ParamDefBase:
    """Base of the generated param classes; see the module docstring for their shape."""

    __slots__ = ()
    TAG: ClassVar[int]
    #: the data fields in declaration order (:class:`FieldSpec`)
    FIELDS: ClassVar[tuple] = ()
    #: whether the class is an old version kept for loading (named ``<name>V<version>``)
    IS_LEGACY: ClassVar[bool] = False
    _packer: ClassVar[Any]
    # the instances are mutable, as the reference's are, so they hash by nothing
    __hash__ = None  # type: ignore[assignment]

    def serialize(self) -> bytes:
        """The binary form: the uint32 ``TAG`` then the packed fields.

        Returns
        -------
        bytes
        """
        values = [getattr(self, n) for n in self.__slots__]
        values = [enum_index(v) if isinstance(v, EnumBase) else v for v in values]
        return struct.pack("I", type(self).TAG) + self._packer.pack(*values)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in self.__slots__)

    def __repr__(self) -> str:
        def fmt(v: Any) -> str:
            return repr(v.name) if isinstance(v, EnumBase) else repr(v)

        args = ", ".join(f"{n}={fmt(getattr(self, n))}" for n in self.__slots__)
        return f"{type(self).__qualname__}({args})"


class FieldSpec(NamedTuple):
    """One data field of a param class, as declared (``ParamDefBase.FIELDS``)."""

    name: str
    fmt: str
    convert: Callable[[Any], Any]
    default: Any
    #: the declared C type (``uint32``, ``dtype``...), or ``enum`` for an enum field
    ctype: str = ""
    #: the enum class of an enum field
    enum: Any = None


_Field = FieldSpec


class ParamDef:
    """The declaration of one param, filled by chained ``add_*`` calls.

    Made by :meth:`ParamDefTable.pdef`; every ``add_*`` method returns the declaration.
    """

    def __init__(self, table: ParamDefTable, name: str, doc: str, version: int, is_legacy: bool):
        self.table = table
        self.name = f"{name}V{version}" if is_legacy else name
        self.doc = doc
        self.tag = param_tag(name, version)
        self.is_legacy = is_legacy
        self.fields: list[_Field] = []
        #: class attributes besides the fields: enum classes (own or aliased) and consts
        self.attrs: dict[str, Any] = {}

    def _add_attr(self, name: str, value: Any) -> None:
        if name in self.attrs or any(f.name == name for f in self.fields):
            raise ValueError(f"param {self.name}: {name} declared twice")
        self.attrs[name] = value

    def _add_field(self, field: _Field) -> None:
        if field.name in self.attrs or any(f.name == field.name for f in self.fields):
            raise ValueError(f"param {self.name}: field {field.name} declared twice")
        self.fields.append(field)

    def _converter(self, ctype: str) -> tuple[str, Callable[[Any], Any]]:
        try:
            fmt, convert = _CTYPES[ctype]
        except KeyError:
            raise ValueError(f"param {self.name}: unknown C type {ctype!r}") from None
        if convert is None:
            hook = self.table.dtype_num
            if hook is None:
                raise ValueError(f"param {self.name}: the table has no dtype_num hook")
            convert = hook
        return fmt, convert

    def _pairs(self, names_defaults: tuple) -> Iterable[tuple[str, Any]]:
        if len(names_defaults) % 2:
            raise ValueError(f"param {self.name}: names and defaults must come in pairs")
        return zip(names_defaults[::2], names_defaults[1::2])

    def _resolve_const(self, value: Any) -> Any:
        # a string naming an earlier const stands for its value, as C++ defaults may
        if isinstance(value, str) and isinstance(self.attrs.get(value), (int, float)):
            return self.attrs[value]
        return value

    def add_fields(self, ctype: str, *names_defaults: Any) -> ParamDef:
        """Add data fields of one C type.

        Parameters
        ----------
        ctype:
            One of ``int32``, ``uint32``, ``uint64``, ``float32``, ``float64``, ``bool``,
            ``dtype``.
        *names_defaults:
            ``name, default, name, default, ...``; a default may name a const added before.

        Returns
        -------
        ParamDef
            ``self``.
        """
        fmt, convert = self._converter(ctype)
        for name, default in self._pairs(names_defaults):
            self._add_field(_Field(name, fmt, convert, self._resolve_const(default), ctype))
        return self

    def add_const(self, ctype: str, *names_defaults: Any) -> ParamDef:
        """Add class constants (not serialized).

        Parameters
        ----------
        ctype:
            The C type, as for :meth:`add_fields`.
        *names_defaults:
            ``name, value, ...``; a value may name a const added before.

        Returns
        -------
        ParamDef
            ``self``.
        """
        _, convert = self._converter(ctype)
        for name, value in self._pairs(names_defaults):
            self._add_attr(name, convert(self._resolve_const(value)))
        return self

    def add_enum(
        self,
        name: str,
        *members: str,
        default: int | str = 0,
        name_field: str | None = None,
        member_alias: Iterable[tuple[str, str]] = (),
        doc: str = "",
    ) -> ParamDef:
        """Add an enum class ``name`` and its field.

        Parameters
        ----------
        name:
            The class name, capitalized.
        *members:
            The member names; their order gives the serialized indices.
        default:
            The default member, by index or name.
        name_field:
            The field name; :func:`default_name_field` of ``name`` when None.
        member_alias:
            ``(member, alias)`` pairs: ``alias`` is another name of ``member``.
        doc:
            The enum's docstring.

        Returns
        -------
        ParamDef
            ``self``.
        """
        if not name[:1].isupper() or not members:
            raise ValueError(f"param {self.name}: bad enum {name!r} with members {members}")
        names = [(m, m) for m in members] + [(alias, m) for m, alias in member_alias]
        cls = EnumBase(name, names, module=self.table.module, qualname=f"{self.name}.{name}")
        if len(cls) != len(members):
            raise ValueError(f"param {self.name}: duplicate members in enum {name}")
        if doc:
            cls.__doc__ = doc
        member = list(cls)[default] if isinstance(default, int) else cls.convert(default)
        self.table.enums[(self.name, name)] = cls
        self.table.enum_defaults[(self.name, name)] = member.name
        self._add_enum_field(name, cls, member.name, name_field)
        return self

    def add_enum_alias(
        self,
        name: str,
        src_class: str,
        src_name: str | None = None,
        name_field: str | None = None,
        default: int | str | None = None,
    ) -> ParamDef:
        """Add a field typed by an enum of an earlier param, reachable here as ``name``.

        Parameters
        ----------
        name:
            The attribute name in this param.
        src_class:
            The class name of the param declaring the enum (``ConvolutionV0``).
        src_name:
            The enum name there; ``name`` when None.
        name_field:
            The field name; :func:`default_name_field` of ``name`` when None.
        default:
            The default member by index or name; the source field's default when None.

        Returns
        -------
        ParamDef
            ``self``.
        """
        key = (src_class, src_name or name)
        try:
            cls = self.table.enums[key]
        except KeyError:
            raise ValueError(f"param {self.name}: no enum {key[1]} in param {key[0]}") from None
        if default is None:
            default = self.table.enum_defaults[key]
        member = list(cls)[default] if isinstance(default, int) else cls.convert(default)
        self._add_enum_field(name, cls, member.name, name_field)
        return self

    def _add_enum_field(
        self, name: str, cls: type[EnumBase], default: str, name_field: str | None
    ) -> None:
        self._add_attr(name, cls)
        field = name_field or default_name_field(name)
        self._add_field(_Field(field, _ENUM_FMT, cls.convert, default, "enum", cls))

    def make_class(self) -> type[ParamDefBase]:
        """The param class of this declaration.

        Returns
        -------
        type
            A subclass of :class:`ParamDefBase`.
        """
        fmt = "".join(f.fmt for f in self.fields)
        # as the C++ struct: the size rounds up to the widest field's; an empty one takes a byte
        fmt = fmt + "0" + max(fmt, key=struct.calcsize) if fmt else "x"
        fields = tuple(self.fields)
        sig = inspect.Signature(
            [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
            + [
                inspect.Parameter(
                    f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=f.default
                )
                for f in fields
            ]
        )

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            values = sig.bind(self, *args, **kwargs)
            values.apply_defaults()
            for f in fields:
                setattr(self, f.name, f.convert(values.arguments[f.name]))

        __init__.__signature__ = sig  # type: ignore[attr-defined]
        __init__.__qualname__ = f"{self.name}.__init__"
        namespace = {
            "__module__": self.table.module,
            "__qualname__": self.name,
            "__doc__": self.doc or f"Param {self.name}.",
            "__slots__": [f.name for f in fields],
            "TAG": self.tag,
            "FIELDS": fields,
            "IS_LEGACY": self.is_legacy,
            "_packer": struct.Struct(fmt),
            "__init__": __init__,
            **self.attrs,
        }
        return type(self.name, (ParamDefBase,), namespace)


class ParamDefTable:
    """A set of param declarations that become classes of one module.

    Parameters
    ----------
    module:
        The ``__name__`` of the module the classes are published in, so their enums and
        instances pickle by reference.
    dtype_num:
        The converter of ``dtype`` fields: a dtype-like to its DTypeEnum number.
    """

    def __init__(self, module: str, dtype_num: Callable[[Any], int] | None = None):
        self.module = module
        self.dtype_num = dtype_num
        self.defs: list[ParamDef] = []
        #: (param class name, enum name) -> enum class, for aliases
        self.enums: dict[tuple[str, str], type[EnumBase]] = {}
        #: (param class name, enum name) -> default member name, for aliases
        self.enum_defaults: dict[tuple[str, str], str] = {}

    def pdef(self, name: str, doc: str = "", version: int = 0, is_legacy: bool = False) -> ParamDef:
        """Declare a param.

        Parameters
        ----------
        name:
            The param name; a legacy one becomes ``<name>V<version>``.
        doc:
            The class docstring.
        version:
            Part of the tag; bumped when the binary format of a param changes.
        is_legacy:
            Whether this is an old version kept for loading old files.

        Returns
        -------
        ParamDef
            The declaration, to chain ``add_*`` calls on.
        """
        d = ParamDef(self, name, doc, version, is_legacy)
        for other in self.defs:
            if other.name == d.name or other.tag == d.tag:
                raise ValueError(f"param {d.name} clashes with {other.name} (tag {d.tag})")
        self.defs.append(d)
        return d

    def build(self) -> dict[str, type[ParamDefBase]]:
        """The classes of all declarations.

        Returns
        -------
        dict
            Class name -> class, in declaration order.
        """
        return {d.name: d.make_class() for d in self.defs}
