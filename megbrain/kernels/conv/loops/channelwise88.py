"""Compiled (Numba) loop of the channel-wise (depthwise) NCHW88 convolution of
:mod:`..channelwise88`: any filter size, stride, padding and dilation, the ConvBias epilogue
applied as each output position is written.

Single-threaded and GIL-free (``nogil``) over a ``[begin, end)`` range of units (a sample, a
block of 8 channels and a band of output rows), so that a caller splits one call over a few
Python threads. No allocation: the padded source rows go to the caller's scratch, the
accumulators are vectors LLVM keeps in registers (:func:`_tap_sums`). Compiled on first use
(:func:`.tiled_jit.compile_tiled`).
"""

from __future__ import annotations

import functools

import numpy as np
from llvmlite import ir
from numba import carray as _carray
from numba import types as t
from numba.core import cgutils, types
from numba.extending import intrinsic

from ... import tiled_jit
from .nchw8c import _hswish_py

__all__ = ["CB", "channelwise88", "scratch_size"]

#: channels of a block: the innermost dim of the source, filter and output
CB = 8
#: output positions of a row summed at once: that many independent vector sums hide the
#: latency of the multiply-adds
J = 8
_TILE = J * CB
_TILE4 = 4 * CB

# bound by _compiled() before compiling
stack_tile = carray = tap_sums = _tile = _tile4 = _one = _row_tiles = _finish = _hswish = None


@functools.cache
def _tap_sums():
    """The ``tap_sums(acc, positions, x, x0, step, w, w0, a0, a1, b0, b1, fw, rstep, cstep)``
    Numba intrinsic: ``acc`` (a :func:`.tiled_jit.stack_tile` pointer of ``positions`` x 8
    float32, ``positions`` a literal) set to the sums over filter rows ``[a0, a1)`` and
    columns ``[b0, b1)``, in that order, of ``w[w0 + (a fw + b) 8:][:8]`` times
    ``x[x0 + a rstep + b cstep + p step:][:8]`` for position ``p``: LLVM vectors of 8
    (``llvm.fmuladd``, fused where the target has FMA), the accumulators in registers
    across the loops, no index checked (the caller keeps them in bounds). Written as vector
    code: left to LLVM's vectorizers, the scalar loops became gathers on AVX-512 hosts."""

    @intrinsic
    def tap_sums(typingctx, acc, positions, x, x0, step, w, w0, a0, a1, b0, b1, fw, rstep,
                 cstep):  # fmt: skip
        if not isinstance(positions, types.IntegerLiteral):
            return None
        if not (isinstance(acc, types.CPointer) and acc.dtype == types.float32):
            return None
        npos = positions.literal_value

        def codegen(context, builder, signature, args):
            acc_p, _, _, x0_v, step_v, _, w0_v, a0_v, a1_v, b0_v, b1_v, fw_v, rs_v, cs_v = args
            i64, vec = ir.IntType(64), ir.VectorType(ir.FloatType(), CB)

            def data(k):
                return context.make_array(signature.args[k])(context, builder, args[k]).data

            xdata, wdata = data(2), data(5)
            fmuladd = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vec, [vec] * 3), "llvm.fmuladd.v8f32"
            )
            regs = cgutils.alloca_once(builder, ir.ArrayType(vec, npos))
            slots = [builder.gep(regs, [ir.Constant(i64, 0), ir.Constant(i64, p)], inbounds=True)
                     for p in range(npos)]  # fmt: skip
            for slot in slots:
                builder.store(ir.Constant(vec, None), slot)

            def load(base, off):
                ptr = builder.gep(base, [off], inbounds=True)
                return builder.load(builder.bitcast(ptr, vec.as_pointer()), align=4)

            rows = builder.sub(a1_v, a0_v)
            cols = builder.sub(b1_v, b0_v)
            with cgutils.for_range(builder, rows, intp=i64) as a_loop:
                a = builder.add(a0_v, a_loop.index)
                with cgutils.for_range(builder, cols, intp=i64) as b_loop:
                    b = builder.add(b0_v, b_loop.index)
                    wv = load(
                        wdata,
                        builder.add(
                            w0_v,
                            builder.mul(builder.add(builder.mul(a, fw_v), b), ir.Constant(i64, CB)),
                        ),
                    )
                    xb = builder.add(x0_v, builder.add(builder.mul(a, rs_v), builder.mul(b, cs_v)))
                    for p, slot in enumerate(slots):
                        xv = load(xdata, builder.add(xb, builder.mul(step_v, ir.Constant(i64, p))))
                        builder.store(builder.call(fmuladd, [wv, xv, builder.load(slot)]), slot)
            accv = builder.bitcast(acc_p, vec.as_pointer())
            for p, slot in enumerate(slots):
                builder.store(builder.load(slot), builder.gep(accv, [ir.Constant(i64, p)]), align=4)
            return context.get_dummy_value()

        i8 = types.int64
        sig = types.void(acc, positions, x, i8, i8, w, i8, i8, i8, i8, i8, i8, i8, i8)
        return sig, codegen

    return tap_sums


def _tile_py(x, x0, step, w, w0, a0, a1, fw, rstep, cstep, out, o, z, bias, bo, epi):
    # pragma: no cover - compiled
    # J consecutive output positions of a row, every filter column inside the source
    tile = stack_tile(_TILE, np.float32)  # noqa: F821 - the tiled_jit intrinsic
    tap_sums(tile, J, x, x0, step, w, w0, a0, a1, 0, fw, fw, rstep, cstep)  # noqa: F821
    _finish(carray(tile, _TILE), J, out, o, z, bias, bo, epi)  # noqa: F821


def _tile4_py(x, x0, step, w, w0, a0, a1, fw, rstep, cstep, out, o, z, bias, bo, epi):
    # pragma: no cover - compiled
    # _tile_py for the 4 positions of a row short of J (a narrow plane's middle)
    tile = stack_tile(_TILE4, np.float32)  # noqa: F821 - the tiled_jit intrinsic
    tap_sums(tile, 4, x, x0, step, w, w0, a0, a1, 0, fw, fw, rstep, cstep)  # noqa: F821
    _finish(carray(tile, _TILE4), 4, out, o, z, bias, bo, epi)  # noqa: F821


def _one_py(x, x0, w, w0, a0, a1, b0, b1, fw, rstep, cstep, out, o, z, bias, bo, epi):
    # pragma: no cover - compiled
    # one output position (of a row shorter than 4), filter columns [b0, b1)
    tile = stack_tile(CB, np.float32)  # noqa: F821 - the tiled_jit intrinsic
    tap_sums(tile, 1, x, x0, 0, w, w0, a0, a1, b0, b1, fw, rstep, cstep)  # noqa: F821
    _finish(carray(tile, CB), 1, out, o, z, bias, bo, epi)  # noqa: F821


def _finish_py(acc, positions, out, o, z, bias, bo, epi):
    # pragma: no cover - compiled
    # the epilogue (+ bias, + z, ReLU or H_SWISH) of ``positions`` sums, stored at out[o:]
    if epi & 1:
        for jj in range(positions):
            for c in range(CB):
                acc[jj * CB + c] += bias[bo + c]
    if epi & 2:
        for k in range(positions * CB):
            acc[k] += z[np.uintp(o + k)]
    if epi & 4:
        for k in range(positions * CB):
            v = acc[k]
            acc[k] = np.float32(0.0) if v < 0 else v  # not max(): NaN stays NaN
    if epi & 8:
        for k in range(positions * CB):
            acc[k] = _hswish(acc[k])  # noqa: F821 - compiled in _compiled
    for k in range(positions * CB):
        out[np.uintp(o + k)] = acc[k]


def _row_tiles_py(x, xi, sw8, w, wo, a0, a1, fw, rstep, cstep, out, o, z, bias, bo, epi, ow):
    # pragma: no cover - compiled
    # the ow positions of an output row from a padded source row (every tap inside it): tiles
    # of J (4 for a row shorter than J), the last one ending at the row's end (it recomputes
    # a few positions of the one before it, the same sums, reading z again: the output must
    # not take z's memory, which ConvBias.inplace_input offers DIRECT_NCHW88 alone), one at
    # a time below 4 positions
    if ow >= J:
        j = 0
        while True:
            jj = min(j, ow - J)
            _tile(x, xi + jj * sw8, sw8, w, wo, a0, a1, fw, rstep, cstep, out, o + jj * CB, z,
                  bias, bo, epi)  # fmt: skip
            if jj == ow - J:
                break
            j += J
    elif ow >= 4:
        for jj in (0, ow - 4):
            _tile4(x, xi + jj * sw8, sw8, w, wo, a0, a1, fw, rstep, cstep, out, o + jj * CB, z,
                   bias, bo, epi)  # fmt: skip
    else:
        for j in range(ow):
            _one(x, xi + j * sw8, w, wo, a0, a1, 0, fw, fw, rstep, cstep, out, o + j * CB, z,
                 bias, bo, epi)  # fmt: skip


def _channelwise88_py(x, w, out, z, bias, xp, dims, conv, epi, u0, u1):
    # pragma: no cover - compiled
    """Units [u0, u1) of the flat C-contiguous NCHW88 ``out`` (N, CB_N, OH, OW, 8) = the
    channel-wise convolution of the flat C-contiguous ``x`` (N, CB_N, H, W, 8) with ``w``
    (CB_N, FH, FW, 8) (flipped already for CONVOLUTION mode), then ``+ bias[8 cb + c]`` (epi
    bit 1), ``+ z`` (bit 2, out's layout), ReLU (bit 4) or H_SWISH (bit 8).

    dims: N, CB_N, H, W, OH, OW, FH, FW, ROWS (output rows a unit takes), BANDS (units per
    block); conv: SH, SW, PH, PW, DH, DW. A unit first copies the source rows its band reads
    into ``xp`` (rows of W + 2 PW positions, PW zero positions either side), so that every
    filter column of every output position is inside a row: the positions go J at a time.
    Filter rows outside the source are skipped. Each output sums its taps in filter order
    (row-major)."""
    cbn, h_, w_, oh, ow = dims[1], dims[2], dims[3], dims[4], dims[5]
    fh, fw, rows, bands = dims[6], dims[7], dims[8], dims[9]
    sh, sw, ph, pw, dh, dw = conv[0], conv[1], conv[2], conv[3], conv[4], conv[5]
    xrow = w_ * CB
    prow = (w_ + 2 * pw) * CB  # a padded row
    rstep, cstep = dh * prow, dw * CB  # the distance of the next filter row, column
    for u in range(u0, u1):
        blk = u // bands
        cb = blk % cbn
        r0 = (u % bands) * rows
        r1 = min(oh, r0 + rows)
        xb = blk * h_ * xrow
        wo = cb * fh * fw * CB
        base = r0 * sh - ph  # the source row of xp's row 0
        for sr in range(max(0, base), min(h_, (r1 - 1) * sh - ph + (fh - 1) * dh + 1)):
            dst = xp[(sr - base) * prow : (sr - base + 1) * prow]
            for k in range(pw * CB):
                dst[k] = np.float32(0.0)
            mid = dst[pw * CB : pw * CB + xrow]
            src = x[xb + sr * xrow : xb + (sr + 1) * xrow]
            for k in range(xrow):
                mid[k] = src[k]
            tail = dst[pw * CB + xrow :]
            for k in range(pw * CB):
                tail[k] = np.float32(0.0)
        for i in range(r0, r1):
            top = i * sh - ph  # the source row of filter row 0
            a0 = 0 if top >= 0 else min(fh, (-top + dh - 1) // dh)
            a1 = min(fh, (h_ - 1 - top) // dh + 1) if top <= h_ - 1 else 0
            if a1 < a0:
                a1 = a0
            _row_tiles(xp, (top - base) * prow, sw * CB, w, wo, a0, a1, fw, rstep, cstep, out,
                       (blk * oh + i) * ow * CB, z, bias, cb * CB, epi, ow)  # fmt: skip


def scratch_size(rows: int, w: int, fshape, stride, pad, dilate) -> int:
    """The float32 values of the padded source rows (``xp``) a unit of ``rows`` output rows
    reads, for a source ``w`` positions wide."""
    return ((rows - 1) * stride[0] + (fshape[0] - 1) * dilate[0] + 1) * (w + 2 * pad[1]) * CB


def channelwise88(x, w, out, z, bias, xp, dims, conv, epi: int, u0: int, u1: int) -> None:
    """Units [u0, u1) of the channel-wise NCHW88 convolution (:func:`_channelwise88_py`):
    ``x``, ``w``, ``z`` and ``bias`` read-only float32 vectors, ``out`` and the scratch
    ``xp`` (:func:`scratch_size` values) writable ones."""
    _compiled()(x, w, out, z, bias, xp, dims, conv, int(epi), int(u0), int(u1))


@functools.cache
def _compiled():
    global stack_tile, carray, tap_sums, _tile, _tile4, _one, _row_tiles, _finish, _hswish
    stack_tile, carray, tap_sums = tiled_jit.stack_tile(), _carray, _tap_sums()
    compile_tiled = tiled_jit.compile_tiled
    f1, i8 = t.float32[::1], t.int64
    fr = t.Array(t.float32, 1, "C", readonly=True)
    ints = t.int64[::1]
    acc = t.Array(t.float32, 1, "C")
    _hswish = compile_tiled(_hswish_py, [t.float32(t.float32)], inline="always")
    _finish = compile_tiled(_finish_py, [t.void(acc, i8, f1, i8, fr, fr, i8, i8)],
                            inline="always")  # fmt: skip
    tile_sig = [t.void(f1, i8, i8, fr, i8, i8, i8, i8, i8, i8, f1, i8, fr, fr, i8, i8)]
    _tile = compile_tiled(_tile_py, tile_sig, inline="always")
    _tile4 = compile_tiled(_tile4_py, tile_sig, inline="always")
    _one = compile_tiled(_one_py, [t.void(f1, i8, fr, i8, i8, i8, i8, i8, i8, i8, i8, f1, i8,
                                          fr, fr, i8, i8)])  # fmt: skip
    _row_tiles = compile_tiled(_row_tiles_py, [t.void(f1, i8, i8, fr, i8, i8, i8, i8, i8, i8, f1,
                                                      i8, fr, fr, i8, i8, i8)])  # fmt: skip
    return compile_tiled(_channelwise88_py, [t.void(fr, fr, f1, fr, fr, f1, ints, ints, i8, i8,
                                                    i8)])  # fmt: skip
