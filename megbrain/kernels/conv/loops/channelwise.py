"""Compiled (Numba) loops of the channel-wise (depthwise) NCHW convolution of
:mod:`..channelwise`: any filter size, stride, padding and dilation through the source's
stride phases (:func:`channelwise_nchw`), and the 3x3 padding-1 layers at stride 1 or 2
straight from the source (:func:`rows3_nchw`); the ConvBias epilogue applied as each output
is written.

Single-threaded and GIL-free (``nogil``) over a ``[begin, end)`` range of (sample, channel)
planes, so that a caller splits one call over a few Python threads. No allocation: the
source's stride phases and the sums go to the caller's scratch, the accumulators of a tile
are vectors LLVM keeps in registers (:func:`_taps_tile`, :func:`_rows3_column`). Compiled on
first use.
"""

from __future__ import annotations

import functools

import numpy as np
from llvmlite import ir
from numba import njit
from numba import types as t
from numba.core import cgutils, types
from numba.extending import intrinsic

from ... import tiled_jit
from . import grouped
from .nchw8c import _hswish_py, tail_scalars
from .pointwise import arrays_data, runtime_epilogue
from .pointwise88 import ACTIVATIONS

__all__ = [
    "ROWS3_BITS",
    "VECS",
    "channelwise_nchw",
    "rows3_nchw",
    "scratch_size",
]

#: the epilogue bits :func:`rows3_nchw` applies: bias, ReLU, H_SWISH, ReLU6 (no SiLU)
ROWS3_BITS = 1 | sum(ACTIVATIONS)
#: vectors of output positions summed at once: that many independent sums hide the latency
#: of the multiply-adds
VECS = 4
#: output rows :func:`rows3_nchw`'s column computes together (each source row they read
#: loaded once): one row at a time ran at its chain's latency, about 37 cycles a row
ROW_GROUP = 4

# bound by _compiled() before compiling (LANES: the host's vector width)
taps_tile = _phase_split = _hswish = _relu6 = _silu = rows3 = take = None
LANES = 16


def scratch_size(oshape, fshape, stride, dilate) -> tuple[int, int, int]:
    """``(HQ, WQ, values)``: the phase planes' height and width (as
    :func:`.grouped.scratch_size`) and the float32 scratch one thread needs: the phase planes
    of one channel and the sums at "phase-width" positions, each with a tile's slack (the
    last tile runs past the plane's positions; its extra sums are dropped)."""
    hq, wq, _ = grouped.scratch_size(oshape, fshape, stride, dilate)
    n_pos = (oshape[0] - 1) * wq + oshape[1]
    slack = VECS * tiled_jit.vector_width()
    return hq, wq, stride[0] * stride[1] * hq * wq + slack + n_pos + slack


@functools.cache
def _taps_tile():
    """The ``taps_tile(vecs, s, s0, w, w0, offs, fw, acc, a0)`` Numba intrinsic: for ``vecs``
    (a literal) vectors of positions ``p``, ``acc[a0 + p] = sum_t w[w0 + t] s[s0 + offs[t] +
    p]`` over the taps ``t < len(offs)``, in that order, summed per filter row of ``fw``
    taps, then the rows (a two-level sum: the error of a 7x7 filter stays at DIRECT_GROUPED's):
    LLVM vectors of :func:`.tiled_jit.vector_width` lanes (``llvm.fmuladd``, fused where the
    target has FMA), the accumulators in registers across the taps, no index checked (the
    caller keeps them in bounds)."""
    lanes = tiled_jit.vector_width()

    @intrinsic
    def taps_tile(typingctx, vecs, s, s0, w, w0, offs, fw, acc, a0):
        if not isinstance(vecs, types.IntegerLiteral):
            return None
        nv = vecs.literal_value

        def codegen(context, builder, signature, args):
            _, _, s0_v, _, w0_v, _, fw_v, _, a0_v = args
            i64 = ir.IntType(64)
            vec = ir.VectorType(ir.FloatType(), lanes)

            def const(v):
                return ir.Constant(i64, v)

            def arr(j):
                return context.make_array(signature.args[j])(context, builder, args[j])

            sdata, wdata, adata = arr(1).data, arr(3).data, arr(7).data
            oarr = arr(5)
            rows = builder.sdiv(builder.extract_value(oarr.shape, 0), fw_v)
            fmuladd = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vec, [vec] * 3), f"llvm.fmuladd.v{lanes}f32"
            )
            regs = cgutils.alloca_once(builder, ir.ArrayType(vec, 2 * nv))
            slots = [builder.gep(regs, [const(0), const(j)], inbounds=True)
                     for j in range(2 * nv)]  # fmt: skip
            totals, parts = slots[:nv], slots[nv:]
            for slot in totals:
                builder.store(ir.Constant(vec, None), slot)
            undef = ir.Constant(vec, ir.Undefined)
            splat = ir.Constant(ir.VectorType(ir.IntType(32), lanes), None)  # lane 0 everywhere
            with cgutils.for_range(builder, rows, intp=i64) as row_loop:
                for slot in parts:
                    builder.store(ir.Constant(vec, None), slot)
                first = builder.mul(row_loop.index, fw_v)
                with cgutils.for_range(builder, fw_v, intp=i64) as loop:
                    tap = builder.add(first, loop.index)
                    off = builder.load(builder.gep(oarr.data, [tap], inbounds=True))
                    wptr = builder.gep(wdata, [builder.add(w0_v, tap)], inbounds=True)
                    one = builder.insert_element(undef, builder.load(wptr), const(0))
                    wv = builder.shuffle_vector(one, undef, splat)
                    base = builder.add(s0_v, off)
                    for j, slot in enumerate(parts):
                        ptr = builder.gep(sdata, [builder.add(base, const(j * lanes))],
                                          inbounds=True)  # fmt: skip
                        xv = builder.load(builder.bitcast(ptr, vec.as_pointer()), align=4)
                        builder.store(builder.call(fmuladd, [wv, xv, builder.load(slot)]), slot)
                for tot, part in zip(totals, parts):
                    builder.store(builder.fadd(builder.load(tot), builder.load(part)), tot)
            for j, slot in enumerate(totals):
                ptr = builder.gep(adata, [builder.add(a0_v, const(j * lanes))], inbounds=True)
                builder.store(builder.load(slot), builder.bitcast(ptr, vec.as_pointer()), align=4)
            return context.get_dummy_value()

        i8 = types.int64
        return types.void(vecs, s, i8, w, i8, offs, i8, acc, i8), codegen

    return taps_tile


@functools.cache
def _rows3_column():
    """The ``rows3_column(S, x, xo, c0, h, w, f, fo, y, yo, oh, ow, nvalid, bias, bo, epi)``
    Numba intrinsic: a column of :func:`.tiled_jit.vector_width` outputs ``q < nvalid`` of
    each of the ``oh`` output rows of a 3x3 depthwise convolution at stride ``S`` (a literal,
    1 or 2), padding 1, read straight from the source plane at ``x[xo:]`` (``h`` rows of
    ``w`` contiguous values): output ``(r, q)`` sums ``f[fo + 3 a + b] x[xo + (S r - 1 + a)
    w + c0 + S q + b]`` over the taps whose row and column fall in the plane (zero padding),
    per filter row, then the rows (the order of :func:`_taps_tile`), then ``+ bias[bo]``
    (``epi`` bit 1) and the activations of ``epi``'s bits (:data:`.pointwise88.ACTIVATIONS`;
    an ``epi`` literal compiles only its own), stored at ``y[yo + r ow + q]``. The taps are
    masked loads (the padding's lanes read nothing and are zeros; the column masks made once
    per column), a stride-2 tap two loads
    whose even lanes are kept (the middle column's taps: the odd lanes of the first
    column's loads): no copy of the plane, no scratch. The rows go in groups of
    :data:`ROW_GROUP` (the rest in groups of the powers of two below it): each source row a
    group reads is loaded once, and the group's sums are independent chains."""
    lanes = tiled_jit.vector_width()

    @intrinsic(prefer_literal=True)
    def rows3_column(typingctx, stride, x, xo, c0, h, w, f, fo, y, yo, oh, ow, nvalid, bias,
                     bo, epi):  # fmt: skip
        if not isinstance(stride, types.IntegerLiteral) or stride.literal_value not in (1, 2):
            return None
        st = stride.literal_value

        def codegen(context, builder, signature, args):
            (_, _, xo_v, c0_v, h_v, w_v, _, fo_v, _, yo_v, oh_v, ow_v, nv_v, _, bo_v,
             epi_v) = args  # fmt: skip
            i1, i32, i64, f32 = ir.IntType(1), ir.IntType(32), ir.IntType(64), ir.FloatType()
            vec, ivec = ir.VectorType(f32, lanes), ir.VectorType(i32, lanes)
            mvec = ir.VectorType(i1, lanes)

            def const(v):
                return ir.Constant(i64, v)

            xdata, fdata, ydata, bdata = arrays_data(context, builder, signature, args, 1, 6,
                                                     8, 13)  # fmt: skip
            zero, none = ir.Constant(vec, None), ir.Constant(mvec, None)
            splat = ir.Constant(ivec, None)

            def broadcast(value, ty=vec):
                one = builder.insert_element(ir.Constant(ty, ir.Undefined), value,
                                             ir.Constant(i32, 0))  # fmt: skip
                return builder.shuffle_vector(one, ir.Constant(ty, ir.Undefined), splat)

            ptr_t = xdata.type
            load_fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vec, [ptr_t, i32, mvec, vec]),
                f"llvm.masked.load.v{lanes}f32.p0")  # fmt: skip
            store_fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [vec, ptr_t, i32, mvec]),
                f"llvm.masked.store.v{lanes}f32.p0")  # fmt: skip
            fmuladd = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vec, [vec] * 3), f"llvm.fmuladd.v{lanes}f32")
            lane = ir.Constant(ivec, list(range(lanes)))
            wvec = broadcast(builder.trunc(w_v, i32), ivec)

            def inside(col):  # the lanes col .. col + lanes - 1 that fall in a row
                cols = builder.add(broadcast(builder.trunc(col, i32), ivec), lane)
                return builder.and_(builder.icmp_signed(">=", cols, ir.Constant(ivec, None)),
                                    builder.icmp_signed("<", cols, wvec))  # fmt: skip

            # per tap column b (and for stride 2 the upper half of its lanes): offset, mask
            loads = []
            for b in range(3):
                col = builder.add(c0_v, const(b))
                halves = [col] if st == 1 else [col, builder.add(col, const(lanes))]
                loads.append([(c, inside(c)) for c in halves])
            taps = [broadcast(builder.load(builder.gep(fdata, [builder.add(fo_v, const(k))],
                                                       inbounds=True)))
                    for k in range(9)]  # fmt: skip

            if isinstance(signature.args[15], types.IntegerLiteral):  # folded by LLVM
                epi_v = const(signature.args[15].literal_value)
            epilogue = runtime_epilogue(builder, epi_v, builder.load(builder.gep(
                bdata, [bo_v], inbounds=True)))
            keep = builder.icmp_signed("<", lane, broadcast(builder.trunc(nv_v, i32), ivec))
            even = ir.Constant(ivec, [2 * i for i in range(lanes)])
            odd = ir.Constant(ivec, [2 * i + 1 for i in range(lanes)])

            def source_row(ir_):
                """The three tap columns' vectors of source row ``ir_`` (zeros outside)."""
                rowok = builder.and_(builder.icmp_signed(">=", ir_, const(0)),
                                     builder.icmp_signed("<", ir_, h_v))  # fmt: skip
                row = builder.add(xo_v, builder.mul(ir_, w_v))
                vs, got = [], []
                for b in range(3):
                    if st == 2 and b == 1:  # the odd lanes of tap 0's two loads
                        vs.append(builder.shuffle_vector(got[0], got[1], odd))
                        continue
                    got = [builder.call(load_fn, [
                        builder.gep(xdata, [builder.add(row, c)]), ir.Constant(i32, 4),
                        builder.select(rowok, m, none), zero]) for c, m in loads[b]]
                    vs.append(got[0] if st == 1 else builder.shuffle_vector(got[0], got[1],
                                                                            even))  # fmt: skip
                return vs

            def rows(r0, count):
                """Output rows ``r0 .. r0 + count - 1``: every source row they read loaded
                once, then each row's sum (per filter row, then the rows), epilogue and
                store; the rows' sums are independent chains the core overlaps."""
                first = builder.sub(builder.mul(r0, const(st)), const(1))
                src = [source_row(builder.add(first, const(j)))
                       for j in range(st * (count - 1) + 3)]  # fmt: skip
                for u in range(count):
                    total = zero
                    for a in range(3):
                        part = zero
                        for b in range(3):
                            part = builder.call(fmuladd, [taps[3 * a + b], src[st * u + a][b],
                                                          part])  # fmt: skip
                        total = builder.fadd(total, part)
                    r = builder.add(r0, const(u))
                    yptr = builder.gep(ydata, [builder.add(yo_v, builder.mul(r, ow_v))])
                    builder.call(store_fn, [epilogue(total), yptr, ir.Constant(i32, 4), keep])

            groups = builder.sdiv(oh_v, const(ROW_GROUP))
            with cgutils.for_range(builder, groups, intp=i64) as loop:
                rows(builder.mul(loop.index, const(ROW_GROUP)), ROW_GROUP)
            done = cgutils.alloca_once_value(builder, builder.mul(groups, const(ROW_GROUP)))
            k = ROW_GROUP // 2
            while k:  # the rest: a group of each power of two below ROW_GROUP it holds
                r0 = builder.load(done)
                with builder.if_then(builder.icmp_signed("<=", builder.add(r0, const(k)),
                                                         oh_v)):  # fmt: skip
                    rows(r0, k)
                    builder.store(builder.add(r0, const(k)), done)
                k //= 2
            return context.get_dummy_value()

        i8 = types.int64
        e = epi if isinstance(epi, types.IntegerLiteral) else i8
        sig = types.void(stride, x, i8, i8, i8, i8, f, i8, y, i8, i8, i8, i8, bias, i8, e)
        return sig, codegen

    return rows3_column


#: the epilogues :func:`rows3_nchw` compiles into a variant of its own (bias: ShuffleNet's
#: depthwise layers; bias and ReLU); any other one takes the variant choosing per row
ROWS3_EPILOGUES = (1, 5)


def _rows3_units(EPI):
    """The units of :func:`rows3_nchw` with the epilogue bits ``EPI`` compiled in (-1:
    those of the ``epi`` argument, chosen per row by selects): a compile-time constant of
    the returned function, its only closure cell."""

    def run(x, w, y, bias, dims, epi, counter, me):
        # pragma: no cover - compiled
        # thread me's share of y (N, C, OH, OW) = the 3x3 depthwise convolution of x (N, C,
        # H, W) with w (C, 9), padding 1, stride SH = SW (1 or 2), then the epilogue (epi
        # bits as _channelwise_nchw_py's, no SiLU), a column of vectors of outputs at a time
        # straight from the source (_rows3_column). Unit u (taken as they go from counter,
        # tiled_jit.take_unit) is planes p = n * C + c in [u PER, (u + 1) PER). dims: C, H,
        # W, OH, OW, S, then the sample and channel strides of x and of y, PER, and the
        # planes N C
        c_, h_, w_, oh, ow, s = dims[0], dims[1], dims[2], dims[3], dims[4], dims[5]
        xn, xc, yn, yc, per, planes = dims[6], dims[7], dims[8], dims[9], dims[10], dims[11]
        while True:
            u = take(counter, me)  # noqa: F821
            if u < 0:
                break
            for p in range(u * per, min(planes, (u + 1) * per)):
                n, c = p // c_, p % c_
                xo, yo = n * xn + c * xc, n * yn + c * yc
                for q in range(0, ow, LANES):  # noqa: F821
                    c0, yq, nv = s * q - 1, yo + q, ow - q
                    if s == 1 and EPI < 0:
                        rows3(1, x, xo, c0, h_, w_, w, c * 9, y, yq, oh, ow, nv,  # noqa: F821
                              bias, c, epi)  # fmt: skip
                    elif s == 1:
                        rows3(1, x, xo, c0, h_, w_, w, c * 9, y, yq, oh, ow, nv,  # noqa: F821
                              bias, c, EPI)  # fmt: skip
                    elif EPI < 0:
                        rows3(2, x, xo, c0, h_, w_, w, c * 9, y, yq, oh, ow, nv,  # noqa: F821
                              bias, c, epi)  # fmt: skip
                    else:
                        rows3(2, x, xo, c0, h_, w_, w, c * 9, y, yq, oh, ow, nv,  # noqa: F821
                              bias, c, EPI)  # fmt: skip

    return run


def rows3_nchw(x, w, y, bias, dims, epi: int, counter, me: int):
    """The call of the compiled kernel bound to its arguments (which the kernel pool can run as a C
    call, without the GIL) computing thread ``me``'s units of the 3x3, padding-1,
    stride-1-or-2 depthwise NCHW convolution (:func:`_rows3_units`; the epilogues of
    :data:`ROWS3_EPILOGUES` compiled in): ``x`` and ``bias`` read-only float32 vectors,
    ``w`` a read-only C-contiguous (C, 9) float32 array, ``y`` a writable vector, ``dims``
    and the units' ``counter`` int64."""
    epi = int(epi)
    return functools.partial(_compiled_rows3(epi if epi in ROWS3_EPILOGUES else -1), x, w, y,
                             bias, dims, epi, counter, int(me))  # fmt: skip


@functools.cache
def _compiled_rows3(EPI: int):
    global rows3, take, LANES
    rows3, take, LANES = _rows3_column(), tiled_jit.take_unit(), tiled_jit.vector_width()
    f1, i8, ints = t.float32[::1], t.int64, t.int64[::1]
    fr2 = t.Array(t.float32, 2, "C", readonly=True)
    fr = t.Array(t.float32, 1, "C", readonly=True)
    run = _rows3_units(EPI)
    # a name of its own per variant: Numba's cache keeps one index per name
    e = "any" if EPI < 0 else EPI
    run.__qualname__ = run.__name__ = f"rows3_nchw_units_e{e}_v{LANES}"
    return tiled_jit.compile_tiled(run, [t.void(fr, fr2, f1, fr, ints, i8, ints, i8)])


def _phase_split_py(x, xo, h_, w_, phases, sh, sw, ph_, pw_, hq, wq):
    # pragma: no cover - compiled
    # the (H, W) plane at x[xo:] (rows contiguous), padded by (ph_, pw_) with zeros, split into
    # its sh * sw stride phases: phases[(a sw + b) HQ WQ + r WQ + q] = padded[r sh + a, q sw + b].
    # Unsigned indices, no slices: a slice costs reference counting, a signed index a
    # wrap-around test, either one far more than a row of 7 to 56 values
    zero = np.float32(0.0)
    plane = hq * wq
    for a in range(sh):
        for b in range(sw):
            base = (a * sw + b) * plane
            # the columns q with 0 <= q sw + b - pw_ < W read the source
            qlo = min(wq, max(0, (pw_ - b + sw - 1) // sw))
            qhi = min(wq, max(qlo, (w_ + pw_ - b + sw - 1) // sw))
            for r in range(hq):
                sr = r * sh + a - ph_
                d0 = np.uintp(base + r * wq)
                if sr < 0 or sr >= h_:
                    for q in range(np.uintp(wq)):
                        phases[d0 + q] = zero
                    continue
                for q in range(np.uintp(qlo)):
                    phases[d0 + q] = zero
                s0 = np.uintp(xo + sr * w_ + qlo * sw + b - pw_)
                d1 = d0 + np.uintp(qlo)
                if sw == 1:
                    for q in range(np.uintp(qhi - qlo)):
                        phases[d1 + q] = x[s0 + q]
                else:
                    for q in range(np.uintp(qhi - qlo)):
                        phases[d1 + q] = x[s0 + q * np.uintp(sw)]
                for q in range(np.uintp(qhi), np.uintp(wq)):
                    phases[d0 + q] = zero


def _channelwise_nchw_py(x, w, y, scratch, bias, offs, dims, epi, p0, p1):
    # pragma: no cover - compiled
    """Planes p = n * C + c in [p0, p1) of ``y`` (N, C, OH, OW) = the channel-wise
    convolution of ``x`` (N, C, H, W) with ``w`` (C, FH * FW) (flipped already for
    CONVOLUTION mode), then ``+ bias[c]`` (epi bit 1), ReLU (bit 4) or H_SWISH (bit 8),
    ReLU6 (bit 16) or SiLU (bit 32).
    ``x`` and ``y`` are flat views starting at their first element, each plane's rows
    contiguous.

    dims: C, H, W, OH, OW, SH, SW, PH, PW, HQ, WQ, then the sample and channel strides of x
    and of y, in elements, FW. Per plane the padded source is split into its stride phases, so
    that tap t reads the phases at ``offs[t]`` plus the "phase-width" position ``r WQ + q``
    of output (r, q): tiles of VECS vectors of consecutive positions sum every tap in
    registers, then each output row takes its OW valid sums, the epilogue applied on the
    way."""
    c_, h_, w_, oh, ow = dims[0], dims[1], dims[2], dims[3], dims[4]
    sh, sw, ph, pw, hq, wq = dims[5], dims[6], dims[7], dims[8], dims[9], dims[10]
    xn, xc, yn, yc, fw = dims[11], dims[12], dims[13], dims[14], dims[15]
    n_pos = (oh - 1) * wq + ow
    tile = VECS * LANES
    size = sh * sw * hq * wq
    acc0 = size + tile  # the sums, after the phases and their slack
    zero = np.float32(0.0)
    for k in range(size, acc0):  # the slack the last tile reads: zeros, not stale values
        scratch[k] = zero
    for p in range(p0, p1):
        n, c = p // c_, p % c_
        _phase_split(x, n * xn + c * xc, h_, w_, scratch, sh, sw, ph, pw, hq, wq)  # noqa: F821
        t0 = 0
        while t0 < n_pos:
            taps_tile(VECS, scratch, t0, w, c * w.shape[1], offs, fw, scratch,  # noqa: F821
                      acc0 + t0)
            t0 += tile
        b = bias[c] if epi & 1 else zero
        for r in range(oh):
            a0 = np.uintp(acc0 + r * wq)
            yo = np.uintp(n * yn + c * yc + r * ow)
            if epi & 48:  # the tails, after a ReLU
                for q in range(np.uintp(ow)):
                    v = scratch[a0 + q] + b
                    v = zero if epi & 4 and v < 0 else v
                    y[yo + q] = _silu(v) if epi & 32 else _relu6(v)  # noqa: F821
            elif epi & 8:
                for q in range(np.uintp(ow)):
                    y[yo + q] = _hswish(scratch[a0 + q] + b)  # noqa: F821 - compiled in _compiled
            elif epi & 4:
                for q in range(np.uintp(ow)):
                    v = scratch[a0 + q] + b
                    y[yo + q] = zero if v < 0 else v  # not max(): NaN stays NaN
            else:
                for q in range(np.uintp(ow)):
                    y[yo + q] = scratch[a0 + q] + b


def channelwise_nchw(x, w, y, scratch, bias, offs, dims, epi: int, p0: int, p1: int) -> None:
    """Planes [p0, p1) of the channel-wise NCHW convolution (:func:`_channelwise_nchw_py`):
    ``x`` and ``bias`` read-only float32 vectors, ``w`` a read-only C-contiguous (C, FH * FW)
    float32 array, ``y`` a writable vector, ``scratch`` the float32 values
    :func:`scratch_size` gives, ``offs`` and ``dims`` int64."""
    _compiled()(x, w, y, scratch, bias, offs, dims, int(epi), int(p0), int(p1))


@functools.cache
def _compiled():
    # plain njit, not tiled_jit.compile_tiled: with LLVM's SLP vectorizer on, the phase split
    # and the copies out ran 5-9x slower (the tile is vector code either way)
    global taps_tile, _phase_split, _hswish, _relu6, _silu, LANES
    taps_tile, LANES = _taps_tile(), tiled_jit.vector_width()
    opts = dict(nogil=True, cache=True, error_model="numpy", fastmath={"contract"})
    f1, i8, ints = t.float32[::1], t.int64, t.int64[::1]
    fr2 = t.Array(t.float32, 2, "C", readonly=True)
    fr = t.Array(t.float32, 1, "C", readonly=True)
    _hswish = njit([t.float32(t.float32)], inline="always", **opts)(_hswish_py)
    _relu6, _silu = tail_scalars()
    _phase_split = njit([t.void(fr, i8, i8, i8, f1, i8, i8, i8, i8, i8, i8)], **opts)(
        _phase_split_py
    )
    return njit([t.void(fr, fr2, f1, f1, fr, ints, ints, i8, i8, i8)], **opts)(
        _channelwise_nchw_py
    )
