"""Shared tensors of the binding: SharedND, _HostSharedND, SharedScalar,
ProxySharedNDAndSymbolVar and make_shared / make_arg / make_immutable."""

from __future__ import annotations

import contextlib
import math
import operator
import os
import warnings

import numpy as np

from ..device import CPU, CompNode, as_comp_node
from ..dtype import canonize_dtype, convert_array, same_dtype, to_mgb_supported_dtype
from ..errors import ConversionError, MegBrainError
from ..graph.value_proxy import array_protocol, dlpack_protocol, pubapi_dev_tensor_ptr
from ..opr import io
from ..opr.base import SymbolVar, as_var
from ..tensor import DeviceTensorND, HostTensorND, Slice
from .callback import CompGraphCallbackValueProxy, SharedNDLazyInitializer

__all__ = [
    "SharedND",
    "_HostSharedND",
    "SharedScalar",
    "ProxySharedNDAndSymbolVar",
    "make_shared",
    "make_arg",
    "make_immutable",
    "from_dlpack",
]

_copyto = np.copyto

_EAGER_COPY_WARN = (
    "copy from eager-copied CompGraphCallbackValueProxy into SharedND; "
    "consider using callback_lazycopy"
)
_EAGER_SHARE_WARN = (
    "share value from eager-copied CompGraphCallbackValueProxy into SharedND; "
    "consider using callback_lazycopy"
)


#: the most elements a NumPy array (the host memory behind every tensor) can hold
_MAX_ELEMENTS = np.iinfo(np.intp).max


def _alloc_shape(shape, what: str) -> tuple:
    """``shape`` as a tuple of ints, refusing an empty shape and zero-sized or negative dims
    (the reference's ``vec2shape`` asserts both)."""
    try:
        shp = tuple(operator.index(s) for s in shape)
    except TypeError:
        raise MegBrainError(f"{what}: bad shape {shape!r}: expected a sequence of ints") from None
    if not shp or min(shp) <= 0:
        raise MegBrainError(
            f"{what}: bad shape {shp}: a shape must be non-empty with every dim positive"
        )
    if math.prod(shp) > _MAX_ELEMENTS:
        raise MegBrainError(
            f"{what}: bad shape {shp}: {math.prod(shp)} elements, more than an array can hold "
            f"({_MAX_ELEMENTS})"
        )
    return shp


def _np_scalar_type(dt: np.dtype):
    """The reference's ``dtype_mgb2np``: the NumPy scalar type (``np.float32``), or the dtype
    itself when it carries parameters (a quantized dtype's scale and zero point)."""
    return dt if dt.metadata else dt.type


class SharedND:
    """A device tensor shared between Python and graphs (``SharedDeviceTensor``).

    Parameters
    ----------
    comp_node:
        Where the tensor lives.
    dtype:
        Element dtype (any dtype megbrain supports).
    """

    def __init__(self, comp_node, dtype=np.float32):
        self._dev = DeviceTensorND(as_comp_node(comp_node), dtype=canonize_dtype(dtype))
        self._copy_sync = True
        self._refkeeper = None
        self._lazy_init: SharedNDLazyInitializer | None = None

    # ---- state -----------------------------------------------------------------------------
    @property
    def dev_tensor(self) -> DeviceTensorND:
        return self._dev

    @property
    def shape(self) -> tuple:
        if self._lazy_init is not None and not self._dev.shape_valid():
            return tuple(self._lazy_init.get_shape())
        return tuple(self._dev.shape) if self._dev.shape_valid() else ()

    @property
    def comp_node(self) -> CompNode:
        return self._dev.comp_node

    @property
    def dtype(self):
        """The NumPy scalar type (``np.float32``), as the reference's ``_get_dtype`` gives it;
        the dtype object for parametrized (quantized) dtypes."""
        return self._get_dtype()

    @property
    def lazy_initializer(self):
        return self._lazy_init

    @lazy_initializer.setter
    def lazy_initializer(self, init):
        if self._dev.shape_valid():
            raise MegBrainError("lazy_initializer can only be set on an uninitialized SharedND")
        self._lazy_init = init

    def _apply_lazy_init(self):
        init = self._lazy_init
        if init is not None and not self._dev.shape_valid():
            self._lazy_init = None
            self.set_value(init.get_value())

    def _get_dtype(self):
        """The dtype as the reference returns it: the NumPy scalar type (``np.float32``), or
        the dtype object for parametrized (quantized) dtypes."""
        return _np_scalar_type(self._dev.dtype)

    def _pubapi_dev_tensor_ptr(self, version: int) -> int:
        """An address for external libraries.

        Parameters
        ----------
        version:
            0: the raw data pointer. 1: the reference's address of a C++
            ``mgb::pubapi::DeviceTensor`` struct, which has no meaning in a Python runtime:
            it raises.

        Returns
        -------
        int
            The data pointer (version 0).

        Raises
        ------
        MegBrainError
            For version 1 or an unknown version.
        """
        return pubapi_dev_tensor_ptr(version, self._dev.raw_ptr)

    @property
    def dev_ptr(self) -> int:
        """The raw data pointer (``_pubapi_dev_tensor_ptr(0)``)."""
        return self._pubapi_dev_tensor_ptr(0)

    @property
    def pubapi_dev_tensor_ptr(self) -> int:
        """Raises :class:`MegBrainError`: the reference returned the address of a C++
        ``mgb::pubapi::DeviceTensor`` (version 1), which a Python runtime does not have. Use
        :attr:`dev_ptr` for the raw data pointer."""
        return self._pubapi_dev_tensor_ptr(1)

    # ---- values ----------------------------------------------------------------------------
    def _set_init_shape(self, shape):
        shape = _alloc_shape(shape, "_set_init_shape")
        if self._dev.shape_valid():
            raise MegBrainError("_set_init_shape: the SharedND already has a shape")
        self._dev.resize(shape)

    def resize(self, *shape) -> SharedND:
        """Resize (data not initialised); ``resize(2, 3)`` or ``resize((2, 3))``.

        Raises
        ------
        MegBrainError
            For an empty shape or a dim that is not positive.
        """
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = tuple(shape[0])
        self._dev.resize(_alloc_shape(shape, "SharedND.resize"))
        return self

    def reset_zero(self) -> None:
        self._dev.sync()
        self._dev.as_ndarray()[...] = 0

    def _set_copy_sync(self, flag: bool) -> None:
        self._copy_sync = bool(flag)

    def set_value(self, w, *, sync=True, inplace=False, share=False) -> SharedND:
        """Set the value from an array, another SharedND or a callback value proxy."""
        if w is self:
            return self
        if share:
            if not isinstance(w, CompGraphCallbackValueProxy):
                raise MegBrainError("set_value(share=True) needs a CompGraphCallbackValueProxy")
            if w.eager_copied:
                warnings.warn(_EAGER_SHARE_WARN, stacklevel=2)
            self._share_from_value_proxy(w)
            return self
        self._set_copy_sync(sync)
        if isinstance(w, CompGraphCallbackValueProxy):
            if w.eager_copied:
                warnings.warn(_EAGER_COPY_WARN, stacklevel=2)
            self._copy_from_proxy(w)
            return self
        if isinstance(w, SharedND):
            w._apply_lazy_init()
            self.copy_from_shared_sub(w, -3 if inplace else -2, -1, -1, -1)
            return self
        if inplace:
            raise MegBrainError("set_value(inplace=True) is only allowed from a SharedND")
        self._lazy_init = None
        self._copy_from_array(w)
        return self

    def _copy_from_proxy(self, proxy: CompGraphCallbackValueProxy) -> None:
        """Copy a callback value now, on the calling thread.

        The proxy's memory belongs to the running function and may be reused as soon as the
        callback returns, and a lazy callback may run on this tensor's own comp node worker
        (where a dispatched copy would only run after the whole run), so the copy is done
        here rather than enqueued. An eager proxy is copied from its host copy, taken when
        the value was produced.
        """
        src = proxy.get_value(borrow_mem=True)
        dev = self._dev
        if src.dtype != dev.dtype:
            raise MegBrainError(
                f"set_value: callback value of dtype {src.dtype} can not be copied into a "
                f"SharedND of dtype {dev.dtype}"
            )
        self._lazy_init = None
        if not (dev.shape_valid() and tuple(dev.shape) == src.shape):
            dev.resize(src.shape)
        self.comp_node.impl.copy(dev.as_ndarray(), src)
        self._refkeeper = None

    def _share_from_value_proxy(self, proxy: CompGraphCallbackValueProxy) -> None:
        """Use the callback value's buffer, zero copy (its shape, dtype and comp node too).

        The tensor object stays the same (the reference assigns into ``*m_dev_tensor``), so
        graphs and aliases built on this SharedND see the new buffer. The buffer belongs to
        the running function: its next run may overwrite it.
        """
        src = DeviceTensorND.from_ndarray(proxy.dev_value, proxy.comp_node, borrow=True)
        self._lazy_init = None
        self._dev.reset(src.storage, src.layout)
        self._refkeeper = None

    def _copy_from_array(self, arr) -> None:
        arr = np.asarray(arr)
        dt = self._dev.dtype
        if arr.dtype != dt or not arr.flags.c_contiguous:
            arr = convert_array(arr, dt) if arr.dtype != dt else np.ascontiguousarray(arr)
        if arr.ndim == 0:
            arr = arr.reshape(1)
        dev = self._dev
        if dev.shape_valid() and tuple(dev.shape) == arr.shape and dev.comp_node.is_inline:
            np.copyto(dev.as_ndarray(), arr)
            return
        host = HostTensorND.from_ndarray(arr, self.comp_node, borrow=True)
        dev.copy_from(host)
        if self._copy_sync:
            dev.sync()
            self._refkeeper = None
        else:
            self._refkeeper = host

    def get_value(self) -> np.ndarray | None:
        """A copy of the value, or None when the tensor is empty."""
        self._apply_lazy_init()
        if not self._dev.shape_valid():
            return None
        return self._dev.to_ndarray()

    def copy_from_shared_sub(self, rhs: SharedND, axis: int, begin, end, step) -> None:
        """Copy from ``rhs``: axis -3 whole tensor in place, -2 whole (may resize), else a
        slice of ``rhs`` along ``axis``. ``rhs`` may live on another comp node (the copy
        then waits for the work already dispatched there); dtypes must match."""
        _check_shared(rhs, "copy_from_shared_sub")
        if axis == -3:
            self._dev.copy_from_fixlayout(rhs._dev)
        elif axis == -2:
            self._dev.copy_from(rhs._dev)
        else:
            spec = Slice(begin, end, step).apply(rhs._dev.layout, axis)
            self._dev.copy_from(rhs._dev.sub(spec))
        if self._copy_sync:
            self._dev.sync()

    def copy_to_sub_from_shared(self, axis: int, begin, end, step, rhs: SharedND) -> None:
        """Write ``rhs`` (on any comp node) into the slice of self along ``axis``; always
        syncs."""
        _check_shared(rhs, "copy_to_sub_from_shared")
        spec = Slice(begin, end, step).apply(self._dev.layout, axis)
        self._dev.sub(spec).copy_from_fixlayout(rhs._dev).sync()

    def share_memory_from(self, rhs: SharedND, offset: int) -> None:
        """Alias ``rhs``'s memory from element ``offset`` on, keeping self's layout."""
        if rhs is self:
            raise MegBrainError("share_memory_from: can not share memory with itself")
        _check_peer(self, rhs, "share_memory_from")
        st = rhs._dev.storage.sub(rhs._dev.dtype.itemsize * int(offset))
        self._dev.reset(st, self._dev.layout)

    def reset_dev_tensor(self, rhs: SharedND) -> None:
        """Share ``rhs``'s storage and layout."""
        if rhs is self:
            raise MegBrainError("reset_dev_tensor: can not reset from itself")
        _check_peer(self, rhs, "reset_dev_tensor")
        self._dev.reset(rhs._dev.storage, rhs._dev.layout)

    # ---- graph -----------------------------------------------------------------------------
    def symvar(self, comp_graph, name=None, *, volatile=False) -> SymbolVar:
        """This tensor as a var of ``comp_graph`` (volatile: buffer/shape may change)."""
        self._apply_lazy_init()
        if not self._dev.shape_valid():
            raise MegBrainError("initial shape must be available")
        return io.shared_device_tensor(comp_graph, self._dev, volatile=volatile, name=name)

    _as_sym_var = None  # SharedND is canonized through symvar()

    @staticmethod
    def _from_symvar(symvar) -> SharedND:
        v = as_var(symvar)
        opr = v.owner
        if opr.type_name not in ("SharedDeviceTensor", "VolatileSharedDeviceTensor"):
            raise MegBrainError(f"cannot convert from {opr.type_name}")
        snd = SharedND.__new__(SharedND)
        snd._dev, snd._copy_sync, snd._refkeeper, snd._lazy_init = opr.tensor, True, None, None
        return snd

    # ---- pickling --------------------------------------------------------------------------
    def __getstate__(self):
        return {"value": self.get_value(), "comp_node": self.comp_node, "dtype": self.dtype}

    def __setstate__(self, state):
        self.__init__(state["comp_node"], state["dtype"])
        if state["value"] is not None:
            self.set_value(state["value"])

    def __repr__(self) -> str:
        return f"SharedND(shape={self.shape}, dtype={self._dev.dtype}, comp_node={self.comp_node})"

    # ---- zero-copy interop (NumPy's array protocol and DLPack) -----------------------------
    def _host_view(self, what: str) -> np.ndarray:
        """The tensor's memory as an array, after the work pending on its comp node."""
        self._apply_lazy_init()
        if not self._dev.shape_valid():
            raise MegBrainError(f"SharedND.{what}: the tensor is empty (no value set yet)")
        if self.comp_node.device_type != CPU:
            raise MegBrainError(
                f"SharedND.{what}: the tensor lives on {self.comp_node}, not on a CPU comp node"
            )
        self._dev.sync()
        return self._dev.as_ndarray()

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """The value as an array sharing this tensor's memory (``np.asarray(snd)``), or a copy
        when ``copy=True`` or a ``dtype`` other than the tensor's is asked for."""
        return array_protocol(self._host_view("__array__"), dtype, copy, "SharedND")

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """Export the tensor as a DLPack capsule sharing its memory (``torch.from_dlpack(snd)``,
        ``np.from_dlpack(snd)``); the arguments are those of the DLPack protocol."""
        return dlpack_protocol(self._host_view("__dlpack__"), stream, max_version, dl_device, copy)

    def __dlpack_device__(self) -> tuple[int, int]:
        """The DLPack device of the tensor: ``(1, 0)``, the CPU."""
        self._host_view("__dlpack_device__")
        return (1, 0)


def _check_shared(b: SharedND, what: str) -> None:
    if not isinstance(b, SharedND):
        raise MegBrainError(f"{what}: expected a SharedND, got {type(b).__name__}")


def _check_peer(a: SharedND, b: SharedND, what: str) -> None:
    """Memory sharing needs the same dtype and comp node (copies only need a SharedND)."""
    _check_shared(b, what)
    da, db = a._dev.dtype, b._dev.dtype
    if da != db or a.comp_node != b.comp_node:
        raise MegBrainError(
            f"{what}: dtype/comp node mismatch: {da}@{a.comp_node} vs {db}@{b.comp_node}"
        )


class _HostSharedND:
    """A host tensor feeding a ``Host2DeviceCopy`` (a graph's runtime input)."""

    def __init__(self, comp_node, dtype=np.float32):
        self._tensor = HostTensorND(as_comp_node(comp_node), dtype=canonize_dtype(dtype))
        self._borrow_on_cpu = False
        self._proxied_opr = None
        self._borrowed_ptr = None
        #: (storage, layout, ndarray, shape, dtype) of the host array, for the hot path
        self._view = None

    @property
    def tensor(self) -> HostTensorND:
        return self._tensor

    @staticmethod
    def make_proxy(var) -> _HostSharedND:
        """A _HostSharedND whose tensor *is* the host data of ``var``'s Host2DeviceCopy."""
        v = as_var(var)
        opr = v.owner
        if opr.type_name != "Host2DeviceCopy":
            raise MegBrainError(f"make_proxy: {v.name!r} is produced by {opr.type_name}")
        p = _HostSharedND.__new__(_HostSharedND)
        p._tensor, p._borrow_on_cpu, p._proxied_opr = opr.tensor, False, opr
        p._borrowed_ptr = None
        p._view = None
        return p

    def __repr__(self) -> str:
        if self._proxied_opr is not None:
            return f"<HostSharedND proxy at {id(self):#x} for {self._proxied_opr.name}>"
        return f"<HostSharedND at {id(self):#x}>"

    def _get_dtype(self):
        """The dtype as the reference returns it: the NumPy scalar type (``np.float32``), or
        the dtype object for parametrized (quantized) dtypes."""
        return _np_scalar_type(self._tensor.dtype)

    def enable_borrow_on_cpu(self, flag: bool) -> None:
        self._borrow_on_cpu = bool(flag)

    def as_sym_var(self, cg, enable_static_infer=True, name=None) -> SymbolVar:
        if self._tensor.empty():
            cg.options.allocate_static_mem_after_graph_compile = False
        var = io.host2device_copy(
            cg, self._tensor, enable_value_infer=enable_static_infer, name=name
        )
        cg.user_input_vars[id(self._tensor)] = var.node
        return var

    def symvar(self, comp_graph, name=None, *, enable_static_infer=None) -> SymbolVar:
        if enable_static_infer is None:
            enable_static_infer = True
        return self.as_sym_var(comp_graph, enable_static_infer, name)

    def _resize(self, shape) -> None:
        """Resize (data not initialised); borrowed storage is first replaced by our own.

        Raises
        ------
        MegBrainError
            For an empty shape or a dim that is not positive, as the reference.
        """
        shape = _alloc_shape(shape, "_HostSharedND._resize")
        t = self._tensor
        if self._borrowed_ptr is not None:
            fresh = HostTensorND(t.comp_node, shape, t.dtype)
            t.reset(fresh.storage, fresh.layout)
            self._borrowed_ptr = None
        else:
            t.resize(shape)
        self._view = None

    def set_value(self, w, *, borrow: bool = False) -> _HostSharedND:
        """Set the host value; ``borrow`` shares ``w``'s memory (off on CPU unless enabled)."""
        t = self._tensor
        cache = self._view
        if cache is not None and type(w) is np.ndarray:
            # the hot path (every call of a compiled function): same shape and dtype, copied
            # into our own storage; valid while the tensor keeps the cached storage/layout
            st, lay, view, shape, dt = cache
            if (
                t._storage is st
                and t._layout is lay
                and w.shape == shape
                and (w.dtype is dt or w.dtype == dt)
                and not (borrow and self._borrow_on_cpu)
                and (w.size < 1024 or w.flags.c_contiguous)
            ):
                _copyto(view, w)
                return self
        self._set_value_slow(w, borrow)
        if t.shape_valid() and self._borrowed_ptr is None:
            view = t.as_ndarray()
            self._view = (t.storage, t.layout, view, view.shape, view.dtype)
        else:
            self._view = None
        return self

    def _set_value_slow(self, w, borrow: bool) -> None:
        io.clear_shape_only(self._tensor)
        t = self._tensor
        dt = t.dtype
        if type(w) is np.ndarray:
            if w.size >= 1024 and (w.dtype != dt or not w.flags.c_contiguous):
                warnings.warn(
                    f"set_value: converting input of dtype {w.dtype} to {dt} "
                    "(or making it contiguous) is slow",
                    stacklevel=2,
                )
        else:
            w0 = w
            w = np.ascontiguousarray(w, dtype=dt) if not hasattr(w, "dtype") else np.asarray(w)
            if w.size >= 1024 and not os.environ.get("MGB_DISABLE_SET_VALUE_WARN"):
                warnings.warn(
                    f"set_value from {type(w0).__name__} of size {w.size} is slow", stacklevel=2
                )
        if w.dtype != dt:
            w = convert_array(w, dt)
        if w.ndim == 0:
            w = w.reshape(1)
        cn = t.comp_node
        if borrow and cn.device_type == CPU and not self._borrow_on_cpu:
            borrow = False
        if borrow and w.flags.c_contiguous:
            src = HostTensorND.from_ndarray(w, cn, borrow=True)
            t.reset(src.storage, src.layout)
            self._borrowed_ptr = t.raw_ptr
            return
        if self._borrowed_ptr is not None:
            # never write into the caller's borrowed array: own fresh storage again
            if t.raw_ptr == self._borrowed_ptr:
                fresh = HostTensorND(cn, w.shape, dt)
                t.reset(fresh.storage, fresh.layout)
            self._borrowed_ptr = None
        if t.shape_valid() and tuple(t.shape) == w.shape and not t.empty():
            np.copyto(t.as_ndarray(), w)
            return
        t.resize(w.shape)
        np.copyto(t.as_ndarray(), w)

    def get_value(self) -> np.ndarray | None:
        t = self._tensor
        if t.empty() or not t.shape_valid():
            return None
        return t.as_ndarray().copy()


def _fast_feeder(proxies):
    """``feed(values) -> bool`` for a compiled function's fast call: given one value per
    proxy, copies each into its proxy's tensor where :meth:`_HostSharedND.set_value` would
    copy it in place (an ndarray of the tensor's shape and dtype, no borrowing, the tensor's
    storage and layout those of now) and returns True; returns False for another count of
    values, or at the first value it can not take (the values before it copied in). None
    while a tensor has no value in its own memory."""
    specs = []
    for p in proxies:
        t = p.tensor
        if (
            p._borrow_on_cpu
            or p._borrowed_ptr is not None
            or not t.shape_valid()
            or io.is_shape_only(t)
        ):
            return None
        st, lay = t.memory_state
        view = t.as_ndarray()
        # set_value warns on a large non-contiguous value (the slow path): never taken here
        specs.append((t, st, lay, view, view.shape, view.dtype, view.size < 1024))
    specs = tuple(specs)
    ndarray = np.ndarray

    n = len(specs)

    def feed(values) -> bool:
        if len(values) != n:
            return False
        for (t, st, lay, view, shape, dt, small), w in zip(specs, values):
            if not (
                type(w) is ndarray
                and w.shape == shape
                and (w.dtype is dt or w.dtype == dt)
                and t._storage is st
                and t._layout is lay
                and (small or w.flags.c_contiguous)
            ):
                return False
            view[...] = w  # np.copyto's copy (same shape and dtype) minus its dispatch
        return True

    return feed


def _scalar_value(val, where: str) -> np.ndarray:
    """``val`` (a Python scalar, a 0-d or a 1-element 1-d value) as a (1,) array of the dtype
    megbrain gives it (float64 -> float32, int64 -> int32); ``where`` names the caller."""
    arr = np.asarray(val)
    if arr.dtype.kind in "OSUMm":
        raise TypeError(
            f"{where}: val must be a number (a Python scalar, a 0-d or a (1,) numeric array); "
            f"got {type(val).__name__} {val!r}"
        )
    if arr.shape not in ((), (1,)):
        raise MegBrainError(
            f"value given to SharedScalar must be scalar (a number, a 0-d or a (1,) array); "
            f"got shape {arr.shape}"
        )
    return convert_array(arr.reshape(1), to_mgb_supported_dtype(arr.dtype))


class SharedScalar:
    """A scalar whose updates reach compiled functions without recompiling.

    Parameters
    ----------
    val:
        A Python scalar, or a 0-d or 1-element 1-d array; its dtype (float64 and int64
        mapped to float32 and int32) is the scalar's until set() changes it. Once the dtype
        is locked (by :meth:`lock_dtype` or a graph using the scalar), set() only accepts
        values of that same dtype.
    """

    def __init__(self, val):
        self._value = _scalar_value(val, "SharedScalar")
        self._locked = False
        self._dev_copies: dict = {}

    @property
    def dtype(self) -> np.dtype:
        return self._value.dtype

    @property
    def dtype_locked(self) -> bool:
        return self._locked

    def lock_dtype(self) -> None:
        self._locked = True

    def set(self, val) -> None:
        """Set the value; every device copy follows at once.

        Raises
        ------
        TypeError
            For a value that is not a number (a string, None, an object).
        MegBrainError
            For a value that is not a scalar, or, once the dtype is locked, of another dtype
            (a Python float is float32, a Python int int32).
        """
        new = _scalar_value(val, "SharedScalar.set")
        if self._locked:
            if not same_dtype(new.dtype, self.dtype):
                raise MegBrainError(
                    f"dtype for SharedScalar has been locked as {self.dtype}, but attempt to "
                    f"set it to {new.dtype}"
                )
            self._value[0] = new[0]
        else:
            self._value = new
        for dev in self._dev_copies.values():
            dev.sync()
            np.copyto(dev.as_ndarray(), self._value)

    _set = set

    def get(self):
        return self._value[0]

    def _get(self) -> np.ndarray:
        return self._value.copy()

    def _as_sym_var(self, graph, comp_node) -> SymbolVar:
        """Lock the dtype and return a SharedDeviceTensor var of this scalar on comp_node."""
        self._locked = True
        cn = as_comp_node(comp_node)
        dev = self._dev_copies.get(cn)
        if dev is None or dev.dtype != self.dtype:
            dev = DeviceTensorND(cn, (1,), self.dtype)
            np.copyto(dev.as_ndarray(), self._value)
            self._dev_copies[cn] = dev
        return io.shared_device_tensor(graph, dev, name=f"SharedScalar@{id(self):#x}")

    def __getstate__(self):
        return {"value": self._value.copy(), "locked": self._locked}

    def __setstate__(self, state):
        self._value = state["value"]
        self._locked = state["locked"]
        self._dev_copies = {}

    def __repr__(self) -> str:
        return f"SharedScalar({self.get()})"


class ProxySharedNDAndSymbolVar(SymbolVar):
    """A SymbolVar from ``snd.symvar(...)`` that also gets and sets the tensor's value."""

    __slots__ = ("_snd",)

    def __init__(self, snd, comp_graph, name=None, **kw):
        super().__init__(snd.symvar(comp_graph, name, **kw))
        self._snd = snd

    def set_value(self, v, **kw):
        self._snd.set_value(v, **kw)
        self._reeval_if_eager_eval()
        return self

    def get_value(self):
        return self._snd.get_value()

    def reset_zero(self):
        self._snd.reset_zero()

    def _reeval_if_eager_eval(self):
        ev = self.node.graph.eager_evaluator
        if ev is not None:
            ev.reeval(self.node)


@contextlib.contextmanager
def _named_errors(fname: str):
    """Re-raise a bad-argument error of an internal step as ``fname``'s own (same class)."""
    try:
        yield
    except (MegBrainError, TypeError, ValueError) as exc:
        try:
            new = type(exc)(f"{fname}: {exc}")
        except Exception:  # noqa: BLE001 - a class with another constructor
            new = MegBrainError(f"{fname}: {exc}")
        raise new from exc


def make_shared(
    comp_node, *, dtype=None, shape=None, value=None, comp_graph=None, name=None, volatile=None
):
    """A device SharedND, or with ``comp_graph`` its ProxySharedNDAndSymbolVar."""
    if value is not None and shape is not None:
        raise MegBrainError("make_shared: value and shape are mutually exclusive")
    if dtype is None:
        dtype = (
            to_mgb_supported_dtype(np.asarray(value).dtype) if value is not None else (np.float32)
        )
    snd = SharedND(comp_node, dtype)
    if value is not None:
        snd.set_value(value)
    elif shape is not None:
        with _named_errors("make_shared"):
            snd._set_init_shape(shape)
    if comp_graph is None:
        if name is not None or volatile is not None:
            raise MegBrainError("make_shared: name and volatile need comp_graph")
        return snd
    return ProxySharedNDAndSymbolVar(snd, comp_graph, name, volatile=bool(volatile))


def make_arg(
    comp_node,
    comp_graph,
    *,
    dtype=np.float32,
    shape=None,
    name=None,
    value=None,
    enable_static_infer=True,
):
    """A runtime input: a _HostSharedND feeding a Host2DeviceCopy."""
    if value is not None:
        value = np.asarray(value)
        if dtype is None:
            dtype = to_mgb_supported_dtype(value.dtype)
        if shape is not None and tuple(shape) != value.shape:
            raise MegBrainError(
                f"make_arg: shape {tuple(shape)} differs from the value's shape {value.shape}"
            )
    hsnd = _HostSharedND(comp_node, np.float32 if dtype is None else dtype)
    if value is not None:
        hsnd.set_value(value)
    elif shape is not None:
        with _named_errors("make_arg"):
            hsnd._resize(shape)
        io.mark_shape_only(hsnd.tensor)
    return ProxySharedNDAndSymbolVar(
        hsnd, comp_graph, name, enable_static_infer=enable_static_infer
    )


def make_immutable(comp_node, comp_graph, value, *, dtype=None, name=None) -> SymbolVar:
    """A constant var (ImmutableTensor), deduplicated and value-inferable."""
    if isinstance(value, (str, bytes)):
        raise ConversionError(f"make_immutable: unsupported value {value!r}")
    return io.make_immutable(comp_node, comp_graph, value, dtype=dtype, name=name)


def from_dlpack(obj, copy: bool | None = None, *, comp_node="cpu0") -> SharedND:
    """A SharedND holding the memory of a DLPack-capable array (NumPy, PyTorch, JAX, ...).

    Parameters
    ----------
    obj:
        An object with ``__dlpack__`` (a ``numpy.ndarray``, a CPU ``torch.Tensor``, a JAX
        array), living on the CPU.
    copy:
        ``None`` or ``False``: share the memory, refusing a source that can not be shared.
        ``True``: always copy (converting float64/int64 to float32/int32).
    comp_node:
        The CPU comp node the tensor belongs to.

    Returns
    -------
    SharedND
        Sharing ``obj``'s memory unless ``copy=True``: writes through either side are seen by
        the other, and graphs built on the tensor read the source's current data.

    Raises
    ------
    ConversionError
        When the memory can not be shared and ``copy`` is not True: ``obj`` is read-only,
        not contiguous, of a dtype megbrain does not have, or not on the CPU; or when ``obj``
        has no DLPack export at all.
    """
    what = "from_dlpack"
    cn = as_comp_node(comp_node)
    if cn.device_type != CPU:
        raise MegBrainError(f"{what}: comp node {cn} is not a CPU comp node")
    if isinstance(obj, np.ndarray):
        arr = obj
    else:
        if not hasattr(obj, "__dlpack__"):
            raise ConversionError(
                f"{what}: {type(obj).__name__} has no __dlpack__ (not a DLPack array)"
            )
        try:
            arr = np.from_dlpack(obj)
        except (BufferError, RuntimeError, TypeError, ValueError) as exc:
            if copy:
                try:
                    arr = np.array(obj)
                except Exception:  # noqa: BLE001 - the DLPack error says more
                    arr = None
                if arr is not None and arr.dtype != object:
                    return _shared_copy(arr, cn, what)
            raise ConversionError(
                f"{what}: can not import {type(obj).__name__} through DLPack: {exc}"
            ) from exc
    if copy:
        return _shared_copy(arr, cn, what)
    problem = None
    try:
        dt = canonize_dtype(arr.dtype)
    except ConversionError as exc:
        problem = str(exc)
    else:
        if not arr.flags.c_contiguous:
            problem = f"the source is not C-contiguous (shape {arr.shape}, strides {arr.strides})"
        elif not arr.flags.writeable:
            problem = "the source is read-only"
    if problem is not None:
        raise ConversionError(
            f"{what}: can not share the memory of a {arr.dtype} array of shape {arr.shape}: "
            f"{problem}; pass copy=True to copy it"
        )
    view = arr.reshape(1) if arr.ndim == 0 else arr
    snd = SharedND(cn, dt)
    src = DeviceTensorND.from_ndarray(view, cn, borrow=True)
    snd._dev.reset(src.storage, src.layout)
    snd._refkeeper = obj  # the exporter's buffer stays alive with the tensor
    return snd


def _shared_copy(arr: np.ndarray, cn: CompNode, what: str) -> SharedND:
    """A SharedND holding a copy of ``arr`` in the megbrain dtype closest to its own."""
    with _named_errors(what):
        dt = to_mgb_supported_dtype(arr.dtype)
        snd = SharedND(cn, dt)
        snd.set_value(convert_array(arr, dt))
    return snd
