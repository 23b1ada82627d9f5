"""Tensors as MegBrain has them: shapes, strided layouts, shared byte storage, and
HostTensorND / DeviceTensorND with views (``sub``), async ``copy_from`` and ``resize``.

Conventions follow MegBrain: a layout with ``ndim == 0`` means "shape not set" (there are no
0-d tensors; a 0-d array becomes shape ``(1,)``), strides count elements, a tensor's data is
``storage`` + ``layout``, and ``empty()`` means the storage holds no byte.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from .device import CPU, CompNode, as_comp_node
from .device.memory import aligned_empty
from .dtype import canonize_dtype, convert_array
from .errors import ConversionError, MegBrainError, MemAllocError, blame_prefix

__all__ = [
    "TensorShape",
    "TensorLayout",
    "SubTensorSpec",
    "Slice",
    "Storage",
    "TensorND",
    "HostTensorND",
    "DeviceTensorND",
]

_DT_CACHE: dict[Any, np.dtype] = {}


def _canonize(dtype_like: Any) -> np.dtype:
    """``canonize_dtype`` with a cache for plain dtypes (metadata dtypes hash like plain)."""
    if isinstance(dtype_like, np.dtype) and dtype_like.metadata is not None:
        return canonize_dtype(dtype_like)
    try:
        return _DT_CACHE[dtype_like]
    except (KeyError, TypeError):
        pass
    dt = canonize_dtype(dtype_like)
    if dt.metadata is None:
        try:
            _DT_CACHE[dtype_like] = dt
        except TypeError:
            pass
    return dt


def _same_dtype(a: np.dtype | None, b: np.dtype | None) -> bool:
    if a is None or b is None:
        return a is b
    return a is b or (a == b and a.metadata == b.metadata)


def _int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


# ---------------------------------------------------------------- shape and layout


class TensorShape(tuple):
    """A tensor shape: a tuple of non-negative ints (``ndim == 0`` means "not set").

    Parameters
    ----------
    shape:
        An iterable of Python or NumPy ints, or a single int for a 1-d shape.

    Raises
    ------
    MegBrainError
        For negative, non-integer (float, bool) or non-iterable input; the message shows it.
    """

    __slots__ = ()

    def __new__(cls, shape: Any = ()) -> TensorShape:
        if type(shape) is cls:
            return shape
        if _int(shape):
            shape = (shape,)
        try:
            dims = tuple(shape)
        except TypeError:
            raise MegBrainError(
                f"{blame_prefix()}invalid tensor shape {shape!r}: not a sequence of ints"
            ) from None
        for d in dims:
            if not _int(d) or d < 0:
                raise MegBrainError(
                    f"{blame_prefix()}invalid tensor shape {shape!r}: dims must be non-negative "
                    f"integers, got {d!r}"
                )
        return tuple.__new__(cls, [int(d) for d in dims])

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self)

    @property
    def total_nr_elems(self) -> int:
        """Number of elements (0 when ``ndim == 0``, as in MegBrain)."""
        if not self:
            return 0
        n = 1
        for d in self:
            n *= d
        return n

    def is_scalar(self) -> bool:
        """Whether this is the shape ``(1,)`` MegBrain uses for scalars."""
        return self == (1,)


def _contig_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = [0] * len(shape)
    acc = 1
    for i in range(len(shape) - 1, -1, -1):
        strides[i] = acc
        acc *= shape[i]
    return tuple(strides)


class TensorLayout:
    """Shape, dtype and element strides of a tensor (MegBrain ``TensorLayout``).

    Parameters
    ----------
    shape:
        Anything :class:`TensorShape` accepts.
    dtype:
        Anything ``megbrain.dtype.canonize_dtype`` accepts.
    strides:
        Strides in elements (may be negative or 0); contiguous (row-major) when None.
    """

    __slots__ = ("shape", "dtype", "strides")

    def __init__(self, shape: Any, dtype: Any = np.float32, strides: Any = None):
        self.shape = TensorShape(shape)
        self.dtype = _canonize(dtype)
        if strides is None:
            self.strides = _contig_strides(self.shape)
        else:
            strides = tuple(strides)
            if len(strides) != len(self.shape) or not all(_int(s) for s in strides):
                raise MegBrainError(
                    f"invalid strides {strides!r} for shape {tuple(self.shape)}: "
                    "need one integer per dim"
                )
            self.strides = tuple(int(s) for s in strides)

    @classmethod
    def _make(cls, shape: TensorShape, dtype: np.dtype | None, strides: tuple) -> TensorLayout:
        self = cls.__new__(cls)
        self.shape, self.dtype, self.strides = shape, dtype, strides
        return self

    @classmethod
    def _contig(cls, shape: TensorShape, dtype: np.dtype | None) -> TensorLayout:
        return cls._make(shape, dtype, _contig_strides(shape))

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    @property
    def total_nr_elems(self) -> int:
        """Number of elements (0 when ``ndim == 0``)."""
        return self.shape.total_nr_elems

    @property
    def byte_strides(self) -> tuple[int, ...]:
        """Strides in bytes, as NumPy counts them."""
        isz = self.dtype.itemsize
        return tuple(s * isz for s in self.strides)

    def is_contiguous(self) -> bool:
        """Whether elements are laid out row-major without gaps (dims of size 1 ignored)."""
        if self.total_nr_elems == 0:
            return True
        expected = 1
        for d, s in zip(reversed(self.shape), reversed(self.strides)):
            if d != 1 and s != expected:
                return False
            expected *= d
        return True

    def span(self) -> tuple[int, int]:
        """``(low, high)`` element offsets addressed, relative to the first element;
        ``high`` is one past the highest (``(0, 0)`` when there is no element)."""
        if self.total_nr_elems == 0:
            return (0, 0)
        low = high = 0
        for d, s in zip(self.shape, self.strides):
            ext = s * (d - 1)
            if ext < 0:
                low += ext
            else:
                high += ext
        return (low, high + 1)

    def span_bytes(self) -> int:
        """Bytes from the lowest to one past the highest element addressed."""
        low, high = self.span()
        return (high - low) * self.dtype.itemsize

    def eq_shape(self, other: TensorLayout) -> bool:
        """Whether ``other`` has the same shape."""
        return self.shape == other.shape

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TensorLayout):
            return NotImplemented
        return (
            self.shape == other.shape
            and _same_dtype(self.dtype, other.dtype)
            and all(d == 1 or a == b for d, a, b in zip(self.shape, self.strides, other.strides))
        )

    def __hash__(self) -> int:
        return hash((tuple(self.shape), self.dtype))

    def __repr__(self) -> str:
        return (
            f"TensorLayout(shape={tuple(self.shape)}, dtype={self.dtype}, strides={self.strides})"
        )


class SubTensorSpec:
    """Where a sub-tensor lives in a larger one: a layout plus an element offset.

    Parameters
    ----------
    layout:
        The sub-tensor's layout (strides relative to the parent's storage).
    offset_elem:
        Offset of its first element, in elements of ``layout.dtype``.
    """

    __slots__ = ("layout", "offset_elem")

    def __init__(self, layout: TensorLayout, offset_elem: int = 0):
        self.layout = layout
        self.offset_elem = int(offset_elem)

    @classmethod
    def make_from_offset_elem(cls, layout: TensorLayout, offset_elem: int) -> SubTensorSpec:
        """A spec of ``layout`` starting ``offset_elem`` elements into the parent."""
        return cls(layout, offset_elem)

    @classmethod
    def make_from_layout(cls, layout: TensorLayout) -> SubTensorSpec:
        """A spec covering ``layout`` at offset 0."""
        return cls(layout, 0)

    @property
    def offset_bytes(self) -> int:
        """The offset in bytes."""
        return self.offset_elem * self.layout.dtype.itemsize

    def merge_with(self, rhs: SubTensorSpec) -> SubTensorSpec:
        """Apply ``rhs`` (a spec relative to this sub-tensor): add offsets, take rhs's layout."""
        return SubTensorSpec(rhs.layout, self.offset_elem + rhs.offset_elem)

    def __repr__(self) -> str:
        return f"SubTensorSpec({self.layout!r}, offset_elem={self.offset_elem})"


class Slice:
    """A Python-style slice along one axis (MegBrain ``Slice``).

    Parameters
    ----------
    begin, end, step:
        As in Python slicing (None for the default; negative indices count from the end and
        out-of-range bounds are clipped). ``step`` must not be 0.
    """

    __slots__ = ("begin", "end", "step")

    def __init__(self, begin: int | None = None, end: int | None = None, step: int | None = None):
        self.begin, self.end, self.step = begin, end, step

    def apply(self, layout: TensorLayout, axis: int) -> SubTensorSpec:
        """Slice ``layout`` along ``axis`` (-1: the flattened array of a contiguous layout).

        Raises
        ------
        MegBrainError
            For a 0 step, an axis out of range, or ``axis == -1`` on a non-contiguous layout.
        """
        if layout.ndim == 0:
            raise MegBrainError("can not apply Slice on a layout whose shape is not set")
        if self.step == 0:
            raise MegBrainError(f"Slice step can not be zero (layout {layout!r})")
        if axis == -1:
            if not layout.is_contiguous():
                raise MegBrainError(
                    f"Slice on the flattened array (axis=-1) of a non-contiguous {layout!r}"
                )
            n = layout.total_nr_elems
            layout = TensorLayout._make(TensorShape((n,)), layout.dtype, (1,))
            axis = 0
        elif axis < 0:
            axis += layout.ndim
        if not 0 <= axis < layout.ndim:
            raise MegBrainError(f"invalid Slice axis {axis} for layout {layout!r}")
        size = layout.shape[axis]
        begin, end, step = slice(self.begin, self.end, self.step).indices(size)
        n = len(range(begin, end, step))
        shape, strides = list(layout.shape), list(layout.strides)
        orig = strides[axis]
        shape[axis], strides[axis] = n, orig * step
        sub = TensorLayout._make(TensorShape(shape), layout.dtype, tuple(strides))
        return SubTensorSpec(sub, begin * orig if n else 0)

    def __repr__(self) -> str:
        return f"Slice({self.begin}, {self.end}, {self.step})"


# ---------------------------------------------------------------- storage


class Storage:
    """A byte buffer on a comp node plus a byte offset; views share the buffer.

    Parameters
    ----------
    comp_node:
        The owning comp node (CompNode or locator); None only for an empty storage.
    nbytes:
        Bytes to allocate now.
    host:
        Allocate host memory (HostTensorND) instead of the comp node's memory
        (DeviceTensorND); the two coincide on CPU.
    """

    __slots__ = ("_cn", "_buf", "_offset", "_host", "_allow_realloc")

    def __init__(
        self, comp_node: CompNode | str | None = None, nbytes: int = 0, *, host: bool = False
    ):
        cn = None if comp_node is None else as_comp_node(comp_node)
        if not _int(nbytes) or nbytes < 0:
            raise MegBrainError(f"invalid storage size {nbytes!r} bytes")
        if cn is None and nbytes:
            raise MegBrainError(f"a storage of {nbytes} bytes needs a comp node")
        self._cn = cn
        self._host = host
        self._offset = 0
        self._allow_realloc = True
        self._buf = self._alloc(int(nbytes)) if nbytes else None

    def _alloc(self, nbytes: int):
        try:
            if self._host:
                return aligned_empty(nbytes, self._cn.mem_align)
            return self._cn.alloc(nbytes)
        except MemoryError as exc:
            # numpy's MemoryError names neither the call nor the comp node
            where = "host memory of " if self._host else ""
            raise MemAllocError(
                f"{blame_prefix()}can not allocate {nbytes} bytes "
                f"({nbytes / 2**30:.4g} GiB) in {where}{self._cn}"
            ) from exc

    @classmethod
    def _make(cls, cn, buf, offset: int, host: bool, allow_realloc: bool) -> Storage:
        self = cls.__new__(cls)
        self._cn, self._buf, self._offset = cn, buf, offset
        self._host, self._allow_realloc = host, allow_realloc
        return self

    @classmethod
    def from_ndarray(
        cls, arr: np.ndarray, comp_node: CompNode | str | None = None, *, host: bool = True
    ) -> Storage:
        """Borrow the memory of a contiguous array, zero-copy (the array stays alive).

        Raises
        ------
        MegBrainError
            If ``arr`` is not contiguous.
        """
        if not (arr.flags.c_contiguous or arr.flags.f_contiguous):
            raise MegBrainError(f"can only borrow a contiguous array, got strides {arr.strides}")
        cn = as_comp_node("cpu:default" if comp_node is None else comp_node)
        return cls._make(cn, arr.ravel(order="K").view(np.uint8), 0, host, True)

    @property
    def comp_node(self) -> CompNode | None:
        """The comp node the memory belongs to."""
        return self._cn

    @property
    def size(self) -> int:
        """Bytes available from the offset to the end of the buffer."""
        return 0 if self._buf is None else self._buf.shape[0] - self._offset

    @property
    def offset(self) -> int:
        """Byte offset of this view in its buffer."""
        return self._offset

    @property
    def buffer(self):
        """The whole underlying 1-d uint8 buffer (None when nothing is allocated)."""
        return self._buf

    @property
    def ptr(self) -> int:
        """Address of the first byte of this view (0 when nothing is allocated)."""
        return 0 if self._buf is None else self._buf.ctypes.data + self._offset

    def empty(self) -> bool:
        """Whether no byte is available."""
        return self.size == 0

    def sub(self, offset: int) -> Storage:
        """A view ``offset`` bytes further into the same buffer (negative allowed while
        still inside it); views can not be grown by :meth:`ensure_size`.

        Raises
        ------
        MegBrainError
            If the view would start before the buffer or past its end.
        """
        start = self._offset + offset
        total = 0 if self._buf is None else self._buf.shape[0]
        if start < 0 or offset > self.size:
            raise MegBrainError(
                f"storage sub view out of range: offset {offset} bytes from a view of "
                f"{self.size} bytes at offset {self._offset} of a {total}-byte buffer"
            )
        return Storage._make(self._cn, self._buf, start, self._host, False)

    def valid_span(self, low_byte: int, high_byte: int) -> bool:
        """Whether bytes ``[low_byte, high_byte)`` relative to the view start are inside."""
        return self._offset + low_byte >= 0 and high_byte <= self.size

    def ensure_size(self, nbytes: int) -> Storage:
        """Grow to at least ``nbytes`` bytes, moving to a new buffer if needed (existing
        views keep the old one). Returns self.

        Raises
        ------
        MegBrainError
            When a view (from :meth:`sub`) is too small, or there is no comp node.
        """
        if nbytes > self.size:
            grown = self._grown(nbytes)
            self._buf, self._offset = grown._buf, 0
            TensorND.layout_epoch += 1  # the tensors on this storage moved
        return self

    def _grown(self, nbytes: int) -> Storage:
        """A new storage of ``nbytes`` bytes on the same node (raises for views)."""
        if not self._allow_realloc:
            raise MegBrainError(
                f"can not grow a storage view to {nbytes} bytes: {self.size} bytes available"
            )
        return Storage(self._cn, nbytes, host=self._host)

    def view(self, layout: TensorLayout, offset: int = 0):
        """An array (numpy on host) seeing ``layout`` from byte ``offset`` of this view."""
        if self._buf is None:
            return np.empty(layout.shape, layout.dtype)
        if self._host:
            return np.ndarray(
                layout.shape, layout.dtype, self._buf, self._offset + offset, layout.byte_strides
            )
        return self._cn.impl.view(self._buf, self._offset + offset, layout)

    def __repr__(self) -> str:
        return f"Storage({self._cn}, size={self.size}, offset={self._offset})"


# ---------------------------------------------------------------- tensors


def _dispatch_copy(dst: TensorND, src: TensorND) -> None:
    """Copy ``src`` into ``dst`` (same shape) on dst's comp node, after src's pending work."""
    if dst._layout.total_nr_elems == 0:
        return
    d_arr, s_arr = dst.as_ndarray(), src.as_ndarray()
    dimpl, scn = dst._storage._cn.impl, src._storage._cn
    simpl = scn.impl
    if simpl is not dimpl and not simpl.is_inline:
        ev = scn.create_event()
        ev.record()
        dimpl.device_wait(ev)
    copier = simpl if simpl.locator[0] != CPU else dimpl
    dimpl.dispatch(copier.copy, d_arr, s_arr)


class TensorND:
    """Base of :class:`HostTensorND` and :class:`DeviceTensorND`: storage + layout.

    Parameters
    ----------
    comp_node:
        A CompNode or locator; None leaves it unset until a copy or an allocation (then
        ``cpu:default`` for host tensors, ``xpux`` for device tensors).
    shape:
        Allocate a contiguous tensor of this shape now (uninitialised).
    dtype:
        The element dtype; None leaves it unset (taken from the source of ``copy_from``).
    """

    #: bumped whenever a tensor's layout or memory is set (resize, reset, copy_from, a
    #: storage's ``ensure_size`` moving it): static inference re-reads its sources' shapes,
    #: and ``MultipleDeviceTensorHolder`` its tensors' states, only after a bump
    layout_epoch: ClassVar[int] = 0

    __slots__ = ("_storage", "_layout")
    _host: ClassVar[bool] = False
    _default_comp_node: ClassVar[str] = "xpux"

    def __init__(
        self, comp_node: CompNode | str | None = None, shape: Any = None, dtype: Any = np.float32
    ):
        cn = None if comp_node is None else as_comp_node(comp_node)
        self._storage = Storage(cn, host=self._host)
        self._layout = TensorLayout._make(
            TensorShape(), None if dtype is None else _canonize(dtype), ()
        )
        if shape is not None:
            self.resize(shape)

    @classmethod
    def _new(cls, storage: Storage, layout: TensorLayout) -> TensorND:
        self = cls.__new__(cls)
        self._storage, self._layout = storage, layout
        return self

    @classmethod
    def from_ndarray(
        cls,
        arr: Any,
        comp_node: CompNode | str | None = None,
        borrow: bool = True,
        dtype: Any = None,
    ) -> TensorND:
        """Make a tensor holding ``arr`` (a 0-d array becomes shape ``(1,)``).

        Parameters
        ----------
        arr:
            An array-like; its dtype must be one megbrain supports unless ``dtype`` is given.
        comp_node:
            The tensor's comp node (default ``cpu:default`` for host, ``xpux`` for device).
        borrow:
            Share the memory of a C-contiguous ``arr`` (zero copy: later writes to ``arr``
            are seen through the tensor); otherwise, or when ``arr`` can not be shared,
            copy it.
        dtype:
            Convert to this dtype first (``megbrain.dtype.convert_array`` rules).

        Raises
        ------
        ConversionError
            For a dtype megbrain does not support (float64, int64, ...) without ``dtype``.
        """
        arr = np.asarray(arr)
        if dtype is None:
            dt = _canonize(arr.dtype)
        else:
            dt = _canonize(dtype)
            if not _same_dtype(arr.dtype, dt):
                arr = convert_array(arr, dt)
        if arr.ndim == 0:
            arr = arr.reshape(1)
        cn = as_comp_node(cls._default_comp_node if comp_node is None else comp_node)
        layout = TensorLayout._contig(TensorShape(arr.shape), dt)
        if borrow and arr.flags.c_contiguous and (cls._host or cn.device_type == CPU):
            return cls._new(Storage.from_ndarray(arr, cn, host=cls._host), layout)
        self = cls._new(Storage(cn, arr.nbytes, host=cls._host), layout)
        if arr.size:
            if cls._host or cn.device_type == CPU:
                np.copyto(self.as_ndarray(), arr)
            else:
                cn.impl.copy(self.as_ndarray(), arr)
        return self

    # -- properties
    @property
    def comp_node(self) -> CompNode | None:
        """The comp node (None while unset)."""
        return self._storage._cn

    @property
    def layout(self) -> TensorLayout:
        """The tensor's layout."""
        return self._layout

    @property
    def shape(self) -> TensorShape:
        """The shape (``()`` while unset)."""
        return self._layout.shape

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self._layout.shape)

    @property
    def dtype(self) -> np.dtype | None:
        """The element dtype (None while unset)."""
        return self._layout.dtype

    @property
    def storage(self) -> Storage:
        """The underlying storage."""
        return self._storage

    @property
    def raw_ptr(self) -> int:
        """Address of the storage start (where the element at offset 0 lives)."""
        return self._storage.ptr

    dev_ptr = raw_ptr

    def empty(self) -> bool:
        """Whether the storage holds no byte (MegBrain ``TensorND::empty``)."""
        return self._storage.empty()

    def shape_valid(self) -> bool:
        """Whether a shape has been set (``ndim != 0``)."""
        return bool(self._layout.shape)

    @property
    def memory_state(self) -> tuple[Storage, TensorLayout]:
        """``(storage, layout)``: a new pair whenever the tensor is re-allocated, borrowed or
        reshaped, the same one across same-shaped value copies (what a compiled function
        compares before each run, in one attribute read)."""
        return self._storage, self._layout

    # -- shape and storage
    def _need_comp_node(self) -> Storage:
        st = self._storage
        if st._cn is None:
            st = self._storage = Storage(as_comp_node(self._default_comp_node), host=self._host)
        return st

    def resize(self, shape: Any) -> TensorND:
        """Set a contiguous layout of ``shape`` (data not kept); the storage is kept when
        large enough, else replaced by a new one. Returns self.

        Raises
        ------
        MegBrainError
            For a bad shape, an unset dtype, or growing a view beyond its storage.
        """
        shape = TensorShape(shape)
        dt = self._layout.dtype
        if dt is None:
            raise MegBrainError(f"can not resize to {tuple(shape)}: the tensor's dtype is not set")
        layout = TensorLayout._contig(shape, dt)
        need = layout.total_nr_elems * dt.itemsize
        st = self._need_comp_node()
        if st.size < need:
            self._storage = st._grown(need)
        self._layout = layout
        TensorND.layout_epoch += 1
        return self

    def reset(self, storage: Storage, layout: TensorLayout) -> TensorND:
        """Use ``storage`` with ``layout`` (the element at offset 0 at the storage start).

        Raises
        ------
        MegBrainError
            If the layout addresses bytes outside the storage.
        """
        self._check_span(storage, layout)
        self._storage, self._layout = storage, layout
        TensorND.layout_epoch += 1
        return self

    @staticmethod
    def _check_span(storage: Storage, layout: TensorLayout, what: str = "layout") -> None:
        low, high = layout.span()
        isz = 0 if layout.dtype is None else layout.dtype.itemsize
        if layout.total_nr_elems and not storage.valid_span(low * isz, high * isz):
            raise MegBrainError(
                f"{what} {layout!r} addresses bytes [{low * isz}, {high * isz}) outside its "
                f"storage ({storage.size} bytes at offset {storage.offset})"
            )

    def sub(self, spec: SubTensorSpec) -> TensorND:
        """A view of the sub-tensor ``spec`` (from :meth:`Slice.apply`), sharing storage.

        Raises
        ------
        MegBrainError
            If the view exceeds the storage.
        """
        st = self._storage.sub(spec.offset_bytes)
        self._check_span(st, spec.layout, "sub-tensor")
        return type(self)._new(st, spec.layout)

    # -- copies
    def _check_copy_dtype(self, src: TensorND, what: str) -> None:
        if not isinstance(src, TensorND):
            raise ConversionError(
                f"{what}: source must be a HostTensorND or DeviceTensorND, got {type(src).__name__}"
            )
        dt = self._layout.dtype
        if dt is not None and not _same_dtype(dt, src._layout.dtype):
            raise MegBrainError(
                f"{what}: dtype mismatch: destination {dt}, source {src._layout.dtype}"
            )

    def copy_from(self, src: TensorND) -> TensorND:
        """Resize to ``src``'s shape (contiguous) and copy its data, asynchronously.

        The copy is dispatched on this tensor's comp node after it waits (through an event)
        for the work already dispatched to ``src``'s node. An unset comp node or dtype is
        taken from ``src``. Returns self.

        Raises
        ------
        MegBrainError
            For a dtype mismatch or a view too small; the tensor is then left unchanged.
        """
        self._check_copy_dtype(src, "copy_from")
        if src is self:
            return self
        slay = src._layout
        st = self._storage
        if st._cn is None:
            st = Storage(src._storage._cn or as_comp_node(self._default_comp_node), host=self._host)
        layout = TensorLayout._contig(slay.shape, slay.dtype)
        need = layout.total_nr_elems * (0 if slay.dtype is None else slay.dtype.itemsize)
        if st.size < need:
            st = st._grown(need)
        self._storage, self._layout = st, layout
        TensorND.layout_epoch += 1
        _dispatch_copy(self, src)
        return self

    def copy_from_fixlayout(self, src: TensorND) -> TensorND:
        """Copy ``src`` into the current layout (no reallocation), asynchronously.

        Raises
        ------
        MegBrainError
            If shapes or dtypes differ; nothing is written then.
        """
        self._check_copy_dtype(src, "copy_from_fixlayout")
        if self._layout.shape != src._layout.shape:
            raise MegBrainError(
                f"copy_from_fixlayout: shape mismatch: destination {tuple(self.shape)}, "
                f"source {tuple(src.shape)}"
            )
        if src is not self:
            _dispatch_copy(self, src)
        return self

    def sync(self) -> TensorND:
        """Wait for the work dispatched to the comp node (re-raising its first error)."""
        cn = self._storage._cn
        if cn is not None:
            cn.sync()
        return self

    # -- numpy
    def as_ndarray(self) -> np.ndarray:
        """A zero-copy array view of the data (no sync: pending writes may be unfinished).

        Raises
        ------
        MegBrainError
            If the shape is not set.
        """
        lay = self._layout
        if not lay.shape:
            raise MegBrainError(f"{type(self).__name__} has no shape: can not view it as an array")
        return self._storage.view(lay)

    def to_ndarray(self) -> np.ndarray:
        """Sync the comp node and return a copy of the data as a numpy array."""
        self.sync()
        if self._host or self._storage._cn.device_type == CPU:
            return self.as_ndarray().copy()
        host = HostTensorND(CompNode.default_cpu(), dtype=self.dtype).copy_from(self)
        return host.as_ndarray()

    numpy = to_ndarray

    def __repr__(self) -> str:
        shape = tuple(self.shape) if self.shape_valid() else None
        return (
            f"{type(self).__name__}(shape={shape}, dtype={self.dtype}, comp_node={self.comp_node})"
        )


class HostTensorND(TensorND):
    """A tensor in host memory, tied to a comp node for ordering (MegBrain ``HostTensorND``)."""

    __slots__ = ()
    _host: ClassVar[bool] = True
    _default_comp_node: ClassVar[str] = "cpu:default"


class DeviceTensorND(TensorND):
    """A tensor in its comp node's memory (host memory on CPU; MegBrain ``DeviceTensorND``)."""

    __slots__ = ()
