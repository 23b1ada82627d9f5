"""Bound calls of compiled kernels as plain C calls, so that a thread can run them without
ever taking the GIL.

A kernel part bound for a split (``functools.partial(kernel, *args)``, ``kernel`` a Numba
dispatcher whose arguments are arrays, numbers and tuples of them) becomes a
:class:`NativeCall`: the address of a small compiled *trampoline* and an int64 *block*
holding the kernel's own entry point and every argument (an array as its data address,
shape and strides). ``trampoline(block)`` rebuilds the arguments and calls the kernel's
compiled code through Numba's calling convention, exactly what the dispatcher would run for
those arguments. One trampoline serves every kernel of the same signature; it is a few LLVM
instructions, compiled in milliseconds.

Why: a pool thread that returns from a kernel into Python needs the GIL, and, while the
caller holds it, sleeps on its condition variable; on machines whose idle CPUs halt, waking
it took 20-40 us, as long as a small kernel part (docs/performance.md). A pool thread that
runs :class:`NativeCall` parts from compiled code (:mod:`.parallel`) never waits for the GIL.

The arrays must outlive the call: the owner keeps the bound call (and so its arguments)
alive as long as the :class:`NativeCall`. A kernel's exception cannot cross a C call: the
trampoline drops it (the kernels this serves raise only on arguments their binding checked).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.compiler_lock import global_compiler_lock
from numba.core.registry import CPUDispatcher
from numba.extending import intrinsic

__all__ = ["NativeCall", "call_native", "compare_swap", "native_call", "register_entry_point"]

_I64 = ir.IntType(64)


class NativeCall(NamedTuple):
    """``trampoline(block)`` runs the bound call: both are addresses; ``block`` (the int64
    array whose address is ``block_addr``) keeps the arguments."""

    trampoline: int
    block_addr: int
    block: np.ndarray


def _overload(disp: CPUDispatcher, args: tuple):
    """The compiled overload the dispatcher runs for ``args`` (an exact match of their Numba
    types, else the only overload they convert to), or None."""
    try:
        tys = tuple(disp.typeof_pyval(a) for a in args)
    except Exception:  # noqa: BLE001 - an argument Numba cannot type: no native form
        return None
    cres = disp.overloads.get(tys)
    if cres is None:
        conv = disp.typingctx.can_convert
        fits = [c for sig, c in disp.overloads.items()
                if len(sig) == len(tys) and all(conv(a, p) for a, p in zip(tys, sig))]
        if len(fits) != 1:
            return None
        cres = fits[0]
    if cres.objectmode or getattr(cres, "lifted", ()):
        return None
    return cres


#: the element and scalar types a block holds
_NUMBERS = (types.Integer, types.Float, types.Boolean)


def _pack(ty, value, out: list) -> bool:
    """Append ``value`` as parameter type ``ty``'s int64 slots; False where not supported."""
    if isinstance(ty, types.Array):
        a = value
        if not (isinstance(ty.dtype, _NUMBERS) and isinstance(a, np.ndarray)
                and a.ndim == ty.ndim and a.dtype == np.dtype(str(ty.dtype))):
            return False  # fmt: skip
        if ty.layout == "C" and not a.flags.c_contiguous:
            return False
        out.append(a.ctypes.data)
        out.extend(a.shape)
        out.extend(a.strides)
        return True
    if isinstance(ty, types.Boolean):
        out.append(int(bool(value)))
        return True
    if isinstance(ty, types.Integer):
        v = int(value) & (2**64 - 1)  # the slot's two's complement bits
        out.append(v - 2**64 if v >= 2**63 else v)
        return True
    if isinstance(ty, types.Float):
        bits = np.array([value], np.float64 if ty.bitwidth == 64 else np.float32)
        out.append(int(bits.view(np.int64 if ty.bitwidth == 64 else np.int32)[0]))
        return True
    if isinstance(ty, types.BaseTuple):
        if not isinstance(value, tuple) or len(value) != len(ty):
            return False
        return all(_pack(t, v, out) for t, v in zip(ty, value))
    return False


_lock = threading.Lock()
_trampolines: dict[tuple, tuple[int, object]] = {}


def _build(ctx, builder, ty, slot: Callable[[], ir.Value]):
    """The value of parameter type ``ty`` read from the block's next slots."""
    if isinstance(ty, types.Array):
        ary = ctx.make_array(ty)(ctx, builder)
        data = builder.inttoptr(slot(), ctx.get_data_type(ty.dtype).as_pointer())
        shape = [slot() for _ in range(ty.ndim)]
        strides = [slot() for _ in range(ty.ndim)]
        ctx.populate_array(ary, data=data, shape=cgutils.pack_array(builder, shape),
                           strides=cgutils.pack_array(builder, strides),
                           itemsize=ctx.get_constant(types.intp, ctx.get_abi_sizeof(
                               ctx.get_data_type(ty.dtype))),
                           meminfo=None)  # fmt: skip
        return ary._getvalue()
    if isinstance(ty, types.BaseTuple):
        return ctx.make_tuple(builder, ty, [_build(ctx, builder, t, slot) for t in ty])
    if isinstance(ty, types.Float):
        v = slot()
        if ty.bitwidth == 64:
            return builder.bitcast(v, ir.DoubleType())
        return builder.bitcast(builder.trunc(v, ir.IntType(32)), ir.FloatType())
    lt = ctx.get_value_type(ty)  # integers and booleans
    v = slot()
    return builder.trunc(v, lt) if lt.width < 64 else v


def _trampoline(ctx, sig) -> int:
    """The address of ``void trampoline(int64 *block)`` for kernels of signature ``sig``:
    ``block[0]`` is the kernel's entry point, the arguments follow (:func:`_pack`)."""
    key = (sig.return_type, sig.args)
    with _lock:
        got = _trampolines.get(key)
        if got is not None:
            return got[0]
        codegen = ctx.codegen()
        name = f"mgb_trampoline_{len(_trampolines)}"
        module = codegen._create_empty_module(name)
        fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [_I64.as_pointer()]), name)
        builder = ir.IRBuilder(fn.append_basic_block())
        block = fn.args[0]
        pos = [1]

        def slot() -> ir.Value:
            v = builder.load(builder.gep(block, [ir.Constant(_I64, pos[0])]))
            pos[0] += 1
            return v

        values = [_build(ctx, builder, t, slot) for t in sig.args]
        conv = ctx.call_conv
        fnty = conv.get_function_type(sig.return_type, sig.args)
        target = builder.inttoptr(builder.load(block), fnty.as_pointer())
        ret = cgutils.alloca_once(builder, fnty.args[0].pointee)
        exc = cgutils.alloca_once(builder, fnty.args[1].pointee)
        flat = list(conv._get_arg_packer(sig.args).as_arguments(builder, values))
        builder.call(target, [ret, exc, *flat])
        builder.ret_void()
        with global_compiler_lock:
            library = codegen.create_library(name)
            library.add_ir_module(module)
            library.finalize()
        addr = library.get_pointer_to_function(name)
        _trampolines[key] = (addr, library)  # the library holds the code
        return addr


#: compiled overloads by their entry points (``Dispatcher.compile``'s result), whose calls
#: skip the dispatcher's type dispatch: :func:`register_entry_point`
_entry_points: dict = {}


def register_entry_point(disp: CPUDispatcher, sig: tuple) -> Callable:
    """``disp.compile(sig)``: the overload's entry point, recorded so that a call bound to
    it (``functools.partial(entry, *args)``) has a :class:`NativeCall` form too."""
    entry = disp.compile(sig)
    _entry_points[entry] = disp.overloads[tuple(sig)]
    return entry


def native_call(call) -> NativeCall | None:
    """``call`` (``functools.partial`` of a compiled Numba kernel or of an entry point from
    :func:`register_entry_point`, positional arguments only, already run once so that its
    overload exists) as a :class:`NativeCall`; None where it has no such form (another
    callable, keywords, an argument type other than arrays of numbers, numbers and tuples
    of them)."""
    if not isinstance(call, functools.partial) or call.keywords:
        return None
    disp, args = call.func, call.args
    try:
        cres = _entry_points.get(disp)
    except TypeError:  # not hashable: not an entry point
        cres = None
    if cres is not None:
        ctx = cres.target_context
    elif isinstance(disp, CPUDispatcher):
        cres, ctx = _overload(disp, args), disp.targetctx
    else:
        return None
    if cres is None:
        return None
    slots: list[int] = []
    if not all(_pack(t, a, slots) for t, a in zip(cres.signature.args, args)):
        return None
    entry = cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name)
    if not entry:
        return None
    block = np.array([entry, *slots], np.int64)
    return NativeCall(_trampoline(ctx, cres.signature), block.ctypes.data, block)


@intrinsic
def call_native(typingctx, trampoline, block_addr):
    """``call_native(trampoline, block_addr)`` in compiled code: runs a :class:`NativeCall`."""
    if not (isinstance(trampoline, types.Integer) and isinstance(block_addr, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.VoidType(), [_I64.as_pointer()])
        fn = builder.inttoptr(args[0], fnty.as_pointer())
        builder.call(fn, [builder.inttoptr(args[1], _I64.as_pointer())])
        return context.get_dummy_value()

    return types.void(types.int64, types.int64), codegen


@intrinsic
def compare_swap(typingctx, counters, index, expected, new):
    """``compare_swap(counters, i, expected, new)`` in compiled code: atomically sets
    ``counters[i]`` (int64) to ``new`` if it equals ``expected``; returns the value before."""
    if not (isinstance(counters, types.Array) and counters.dtype == types.int64):
        return None

    def codegen(context, builder, signature, args):
        ary, idx, exp, val = args
        arr = context.make_array(signature.args[0])(context, builder, ary)
        ptr = cgutils.get_item_pointer(context, builder, signature.args[0], arr, [idx],
                                       wraparound=False)  # fmt: skip
        pair = builder.cmpxchg(ptr, exp, val, "seq_cst", "seq_cst")
        return builder.extract_value(pair, 0)

    return types.int64(counters, types.int64, types.int64, types.int64), codegen
