"""The 3x3 depthwise 8-bit convolution on the source's bytes (AVX-512 VNNI and VBMI): each
output lane's window gathered by ``vpermb`` into four bytes and summed by ``vpdpbusd``
exactly in int32, then requantized by :mod:`.requant_ir`. Used by
:mod:`..quantized` where :func:`vnni_bytes`; the loops of :mod:`.int8` serve other CPUs.

The loops are GIL-free, take units (a band of output rows of a chunk of planes) from a
shared counter as they go (or every unit, on one thread), are compiled on first use and
allocate nothing.
"""

from __future__ import annotations

import functools

import numpy as np
from llvmlite import binding, ir
from numba import njit
from numba.core import cgutils, config, types
from numba.extending import intrinsic

from ... import tiled_jit
from . import requant_ir
from .int8 import _data, _lane_mask

__all__ = [
    "depthwise_vnni",
    "depthwise_vnni_count",
    "depthwise_vnni_index",
    "depthwise_vnni_loop",
    "depthwise_vnni_operands",
    "depthwise_vnni_paired",
    "depthwise_vnni_plan",
    "depthwise_vnni_takes",
    "depthwise_vnni_units",
    "vnni_bytes",
]


def vnni_bytes() -> bool:
    """Whether the compiler targets AVX-512 with VNNI and VBMI (``NUMBA_CPU_FEATURES``, else
    the host's features): there a 3x3 depthwise row is ``vpermb`` and ``vpdpbusd`` on the
    source's bytes (:func:`depthwise_vnni`)."""
    features = config.CPU_FEATURES
    if features is None:
        features = binding.get_host_cpu_features().flatten()
    return {"+avx512f", "+avx512bw", "+avx512vnni", "+avx512vbmi"} <= set(features.split(","))


#: the row plans of :func:`_dw_rows16`: (output rows, stride, dilation, paired) of the rows
#: whose shared source rows are loaded once, paired: two rows of 8 or fewer columns a vector;
#: plan 0 is one row at any stride and dilation
_DW_PLANS = {1: (4, 1, 1, False), 2: (4, 2, 1, False), 3: (8, 1, 1, True), 4: (8, 2, 1, True)}


@intrinsic
def _dw_rows16(typingctx, out, o0, ostride, nr, cnt, x, x0, xstride, inside, lims, idx, wt,
               init, q, dh, epi, plan):  # fmt: skip
    """Sixteen outputs ``o0 + rr ostride ... + cnt - 1`` of each of the ``nr`` first output
    rows ``rr`` of a 3x3 depthwise row block, by bytes. Block row ``rr`` reads the source
    rows ``rr sh + a dh`` (``a`` = 0, 1, 2) from the block's top, each 64 bytes from
    ``x[x0 + row xstride]`` whose lanes ``lims[0] <= i < lims[1]`` lie in the image (the
    others, and rows whose ``inside`` bit is clear, ``lims[2]``, the source's raw zero
    point), shifted to unsigned (``x ^ 128`` for int8) and permuted by ``vpermb`` with the
    64 bytes ``idx`` into each output lane's four window bytes: a source row shared by
    block rows is loaded and permuted once. Each row then sums ``vpdpbusd`` with the filter
    row's word ``wt[a]`` onto ``init``. The literal ``plan`` gives the block
    (:data:`_DW_PLANS`; 0: one row, stride unused, dilation ``dh``). A paired plan's vector
    holds two rows of ``cnt`` (<= 8) columns, the second's lanes from ``cnt`` on (``idx``
    then indexes two source rows, ``vpermi2b``), stored as one run (``ostride`` = ``cnt``:
    the rows are adjacent in the output). The literal ``epi`` 0
    stores the int32 sums, 1 (2: with ReLU) the bytes of
    :func:`.requant_ir.requantize16_group` (the block's vectors) with ``q`` (7 float32)."""
    if not (isinstance(epi, types.IntegerLiteral) and isinstance(plan, types.IntegerLiteral)
            and isinstance(x, types.Array) and x.dtype.bitwidth == 8
            and isinstance(out, types.Array)
            and out.dtype.bitwidth == (32 if epi.literal_value == 0 else 8)
            and q == types.UniTuple(types.float32, 7)
            and wt == types.UniTuple(types.int32, 3)):
        return None  # fmt: skip
    mode = epi.literal_value
    rows, sh, dhl, paired = _DW_PLANS.get(plan.literal_value, (1, 1, 0, False))
    signed = x.dtype.signed

    def codegen(context, builder, signature, args):
        (out_v, o0_v, os_v, nr_v, cnt_v, x_v, x0_v, xs_v, in_v, lims_v, idx_v, wt_v, init_v,
         q_v, dh_v) = args[:15]  # fmt: skip
        i1, i8, i32, i64 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
        b64, v32 = ir.VectorType(i8, 64), ir.VectorType(i32, 16)

        def fn(name, ret, fargs):
            return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, fargs),
                                                  name)  # fmt: skip

        def splat(scalar, vty, n):
            one = builder.insert_element(ir.Constant(vty, ir.Undefined), scalar,
                                         ir.Constant(i32, 0))  # fmt: skip
            return builder.shuffle_vector(one, ir.Constant(vty, ir.Undefined),
                                          ir.Constant(ir.VectorType(i32, n), None))  # fmt: skip

        def arg64(k):
            return context.cast(builder, args[k], signature.args[k], types.int64)

        lo, hi, zx = (builder.extract_value(lims_v, k) for k in range(3))
        row_mask = _lane_mask(builder, 64, lo, hi)
        none = ir.Constant(ir.VectorType(i1, 64), None)
        pad = splat(builder.trunc(zx, i8), b64, 64)
        xd = builder.bitcast(_data(context, builder, signature.args[5], x_v), i8.as_pointer())
        perm_idx = builder.load(builder.bitcast(_data(context, builder, signature.args[10],
                                                      idx_v), b64.as_pointer()), align=1)
        load = fn("llvm.masked.load.v64i8.p0", b64,
                  [b64.as_pointer(), i32, row_mask.type, b64])
        permute = fn("llvm.x86.avx512.permvar.qi.512", b64, [b64, b64])
        permute2 = fn("llvm.x86.avx512.vpermi2var.qi.512", b64, [b64] * 3)
        dot = fn("llvm.x86.avx512.vpdpbusd.512", v32, [v32] * 3)
        flip = ir.Constant(b64, [ir.Constant(i8, 128)] * 64)
        x0, xs, inside = arg64(6), arg64(7), arg64(8)
        dh = ir.Constant(i64, dhl) if dhl else arg64(14)
        words = [splat(builder.extract_value(wt_v, a), v32, 16) for a in range(3)]
        start = splat(context.cast(builder, init_v, signature.args[12], types.int32), v32, 16)
        qs = [requant_ir.splat16(builder, builder.extract_value(q_v, k)) for k in range(7)]
        loaded, permuted = {}, {}

        def source_row(i):  # the unsigned bytes of the block's source row i (an i64)
            key = i.constant if isinstance(i, ir.Constant) else None
            if key is not None and key in loaded:
                return loaded[key]
            bit = builder.icmp_unsigned("!=", builder.and_(inside, builder.shl(
                ir.Constant(i64, 1), i)), ir.Constant(i64, 0))  # fmt: skip
            ptr = builder.gep(xd, [builder.add(x0, builder.mul(i, xs))])
            raw = builder.call(load, [builder.bitcast(ptr, b64.as_pointer()),
                                      ir.Constant(i32, 1), builder.select(bit, row_mask, none),
                                      pad])  # fmt: skip
            u = builder.xor(raw, flip) if signed else raw
            if key is not None:
                loaded[key] = u
            return u

        def windows(rr, a):  # block row rr's (and, paired, rr + 1's) windows of filter row a
            if not dhl:
                u = source_row(builder.mul(ir.Constant(i64, a), dh))
                return builder.bitcast(builder.call(permute, [u, perm_idx]), v32)
            i = rr * sh + a
            if paired:
                u, u2 = source_row(ir.Constant(i64, i)), source_row(ir.Constant(i64, i + sh))
                return builder.bitcast(builder.call(permute2, [u, perm_idx, u2]), v32)
            if i not in permuted:
                u = source_row(ir.Constant(i64, i))
                permuted[i] = builder.bitcast(builder.call(permute, [u, perm_idx]), v32)
            return permuted[i]

        od_elt = i32 if mode == 0 else i8
        od = builder.bitcast(_data(context, builder, signature.args[0], out_v),
                             od_elt.as_pointer())  # fmt: skip
        o0, ostride, nr, cnt = arg64(1), arg64(2), arg64(3), arg64(4)
        lanes = _lane_mask(builder, 16, ir.Constant(i64, 0), cnt)
        none16 = ir.Constant(lanes.type, None)
        # two rows' vectors requantized together (one check near ties; the paired plans'
        # vectors one at a time: measured faster so), each group stored before the next
        starts = list(range(0, rows, 2 if paired else 1))
        group = 1 if paired or mode == 0 else 2
        for g0 in range(0, len(starts), group):
            accs = []
            for rr in starts[g0:g0 + group]:
                acc = start
                for a in range(3):
                    acc = builder.call(dot, [acc, windows(rr, a), words[a]])
                accs.append(acc)
            if mode:
                accs = [builder.trunc(v, ir.VectorType(i8, 16))
                        for v in requant_ir.requantize16_group(builder, accs, qs, mode == 2)]
            for rr, val in zip(starts[g0:g0 + group], accs):
                vty = val.type
                store = fn(f"llvm.masked.store.v16i{od_elt.width}.p0", ir.VoidType(),
                           [vty, vty.as_pointer(), i32, lanes.type])
                keep = builder.icmp_signed("<", ir.Constant(i64, rr), nr)
                mask = builder.select(keep, lanes, none16)
                if paired:  # the second row's lanes too, where it is in the block
                    both = builder.icmp_signed("<", ir.Constant(i64, rr + 1), nr)
                    two = _lane_mask(builder, 16, ir.Constant(i64, 0), builder.add(cnt, cnt))
                    mask = builder.select(both, two, mask)
                at = builder.add(o0, builder.mul(ir.Constant(i64, rr), ostride))
                builder.call(store, [val, builder.bitcast(builder.gep(od, [at]),
                                                          vty.as_pointer()),
                                     ir.Constant(i32, 1), mask])  # fmt: skip
        return context.get_dummy_value()

    sig = types.void(out, o0, ostride, nr, cnt, x, x0, xstride, inside, lims, idx, wt, init, q,
                     dh, epi, plan)  # fmt: skip
    return sig, codegen


#: :func:`.tiled_jit.take_unit`'s compiled function, for the loops: a module global, not a
#: closure cell (Numba keys a cached closure by its cells' pickles, which differ per process)
_take_g = None


def _make_depthwise_vnni(epi: int, plan: int):
    """The loop of :func:`depthwise_vnni` for the literals ``epi`` and ``plan``."""
    global _take_g
    _take_g = tiled_jit.take_unit()
    rows = _DW_PLANS.get(plan, (1,))[0]

    def depthwise_vnni(x, wt, init, bias, out, q, idx, geom, units, counter,
                       me):  # pragma: no cover - compiled
        """The units of :func:`.int8.depthwise`'s convolution for a 3x3 filter, on the
        source's bytes: ``units`` = (band rows, chunks, planes a chunk, planes), unit ``u``
        the output rows of band ``u // chunks`` of the planes (``n * C + c``) of chunk ``u %
        chunks``, taken from ``counter`` (:func:`.tiled_jit.take_unit`) as thread ``me``, or,
        with ``me`` < 0, every unit in turn. Each 16 columns of a block of output rows is
        one :func:`_dw_rows16` (a masked load and a ``vpermb`` per source row, a
        ``vpdpbusd`` per filter row, the requantize, a masked store per output row). ``wt``
        (3 C) int32: each filter row's three signed bytes (minus the filter's zero point)
        and a zero byte; ``init`` (C) int32: minus the shifted zero point times the
        filter's sum, to which the int32 ``bias`` (C) is added (wrapping); ``idx`` the 64
        bytes ``vpermb`` gathers each lane's window with; ``geom`` as
        :func:`.int8.depthwise` reads it (``geom[6]`` the raw zero point)."""
        sh, sw, ph, pw, dh, dw = geom[0], geom[1], geom[2], geom[3], geom[4], geom[5]
        zx, h_, w_, oh, ow, c_ = geom[6], geom[9], geom[10], geom[11], geom[12], geom[15]
        qt = (q[0], q[1], q[2], q[3], q[4], q[5], q[6])
        span = 15 * sw + 2 * dw + 1  # the bytes a vector's windows read
        nin = (rows - 1) * sh + 2 * dh + 1  # the source rows of a block
        rb, chunks, per, planes = units[0], units[1], units[2], units[3]
        count = (oh + rb - 1) // rb * chunks
        u = -1
        while True:
            if me < 0:
                u += 1
                if u >= count:
                    break
            else:
                u = _take_g(counter, me)
                if u < 0:
                    break
            b, k = u // chunks, u % chunks
            ra, rz = b * rb, min(oh, (b + 1) * rb)
            for t in range(k * per, min(planes, (k + 1) * per)):
                c = t % c_
                ws = (wt[3 * c], wt[3 * c + 1], wt[3 * c + 2])
                bc = np.int32(init[c] + bias[c])
                xbase, obase = t * h_ * w_, t * oh * ow
                for r0 in range(ra, rz, rows):
                    top = r0 * sh - ph
                    inside = 0
                    for i in range(nin):
                        if 0 <= top + i < h_:
                            inside |= 1 << i
                    nr = min(rows, rz - r0)
                    for j0 in range(0, ow, 16):
                        col = j0 * sw - pw
                        lims = (max(0, -col), min(span, w_ - col), zx)
                        _dw_rows16(out, obase + r0 * ow + j0, ow, nr, min(16, ow - j0), x,
                                   xbase + top * w_ + col, w_, inside, lims, idx, ws, bc, qt,
                                   dh, epi, plan)  # fmt: skip

    return depthwise_vnni


def depthwise_vnni_takes(fh: int, fw: int, sw: int, dw: int, dh: int) -> bool:
    """Whether :func:`depthwise_vnni` computes a depthwise convolution of this filter,
    column stride and dilations: a 3x3 filter whose 16 outputs' windows span at most 64
    bytes of a row, and whose rows span at most 63."""
    return fh == fw == 3 and 15 * sw + 2 * dw < 64 and 2 * dh < 63


def depthwise_vnni_plan(sh: int, dh: int, ow: int) -> int:
    """The row plan (:data:`_DW_PLANS`) :func:`depthwise_vnni` takes for this row stride,
    dilation and output row width: rows paired where two fit a vector."""
    fits = ow <= 8
    return next((k for k, (_, s, d, pair) in _DW_PLANS.items()
                 if (s, d, pair) == (sh, dh, fits)), 0)  # fmt: skip


def depthwise_vnni_operands(w, zf: int, u0: int, wt, init) -> None:
    """``wt`` (3 C int32) and ``init`` (C int32) of :func:`depthwise_vnni` from the filter
    ``w`` (C, 3, 3), any strides, 8-bit minus ``zf`` (signed bytes), ``u0`` the source's
    zero point shifted to unsigned; see :func:`_depthwise_vnni_operands_py`."""
    _compiled("depthwise_vnni_operands")(w, np.int32(zf), np.int32(u0), wt, init)


def _depthwise_vnni_operands_py(w, zf, u0, wt, init):  # pragma: no cover - compiled
    for c in range(w.shape[0]):
        total = np.int32(0)
        for a in range(3):
            word = np.uint32(0)
            for b in range(3):
                v = np.int32(w[c, a, b]) - zf
                total += v
                word |= np.uint32(v & 0xFF) << np.uint32(8 * b)
            wt[3 * c + a] = np.int32(word)
        init[c] = -u0 * total


def depthwise_vnni_index(sw: int, dw: int, pair: int = 0) -> np.ndarray:
    """The 64 ``vpermb`` indices of :func:`depthwise_vnni`: lane ``k``'s bytes ``k sw + b
    dw`` for its taps ``b`` = 0, 1, 2, and a fourth (its filter byte 0); with ``pair`` (a
    paired plan's row width), lanes ``k >= pair`` read the second source row (``vpermi2b``'s
    indices from 64) at ``(k - pair) sw + b dw``."""
    k, b = np.meshgrid(np.arange(16), np.arange(4), indexing="ij")
    taps = np.minimum(b, 2) * dw
    second = (k >= pair) if pair else np.zeros_like(k, bool)
    idx = np.where(second, 64 + (k - pair) * sw + taps, k * sw + taps)
    return np.minimum(idx, 127).astype(np.uint8).reshape(-1)


def depthwise_vnni_paired(plan: int) -> bool:
    """Whether the row plan ``plan`` pairs two output rows in a vector."""
    return _DW_PLANS.get(plan, (0, 0, 0, False))[3]


def depthwise_vnni_loop(epi: int, plan: int):
    """The compiled loop :func:`depthwise_vnni` calls for ``epi`` and the row plan ``plan``,
    taking the same arguments less ``epi`` (``me`` an int): a binding calls it directly (the
    lookup cost each call a few microseconds, as much as a 7x7 layer's share of a
    thread)."""
    return _compiled(f"depthwise_vnni,{int(epi)},{int(plan)}")


def depthwise_vnni(x, wt, init, bias, out, q, idx, geom, epi: int, units, counter,
                   me: int) -> None:  # fmt: skip
    """The units of a 3x3 depthwise 8-bit convolution by ``vpdpbusd`` on the source's bytes
    (:func:`vnni_bytes` CPUs) thread ``me`` takes (every unit with ``me`` < 0); the
    arguments as :func:`_make_depthwise_vnni`'s loop reads them, ``geom[8]`` the row plan
    (:func:`depthwise_vnni_plan`), ``q`` the (7,) of :func:`.vnni.requant_params`,
    ``units`` (:func:`depthwise_vnni_units`) int64, ``counter`` as
    :func:`.tiled_jit.take_unit` reads it."""
    loop = depthwise_vnni_loop(epi, int(geom[8]))
    loop(x, wt, init, bias, out, q, idx, geom, units, counter, int(me))


def depthwise_vnni_units(oh: int, planes: int, plan: int, threads: int,
                         per_thread: int) -> np.ndarray:  # fmt: skip
    """The units :func:`depthwise_vnni` takes on ``threads`` threads, about ``per_thread``
    each (one unit, the whole layer, on one thread): int64 (band rows, chunks, planes a
    chunk, planes). Chunks of the planes (whole planes: a unit's setup per plane, the
    filter's words and the bias, is paid once), and, where the planes are fewer than the
    units wanted, bands of output rows (a multiple of the plan's rows); unit ``u`` is band
    ``u // chunks`` of chunk ``u % chunks``."""
    rows = _DW_PLANS.get(plan, (1,))[0]
    want = max(1, threads * per_thread) if threads > 1 else 1
    per = -(-planes // min(planes, want))
    chunks = -(-planes // per)
    blocks = -(-oh // rows)
    bands = min(blocks, -(-want // chunks))
    rb = -(-blocks // bands) * rows
    return np.array([rb, chunks, per, planes], np.int64)


def depthwise_vnni_count(units: np.ndarray, oh: int) -> int:
    """How many units :func:`depthwise_vnni_units`'s ``units`` makes of ``oh`` output rows."""
    return -(-oh // int(units[0])) * int(units[1])


@functools.cache
def _compiled(name: str):
    if name == "depthwise_vnni_operands":
        fn = _depthwise_vnni_operands_py
    else:  # "depthwise_vnni,<epi>,<plan>"
        fn = _make_depthwise_vnni(*(int(v) for v in name.split(",")[1:]))
    # the sums are integers: contracted multiply-adds give the same bits
    fastmath = {"contract"} if name.startswith("depthwise_vnni,") else False
    return njit(nogil=True, cache=True, error_model="numpy", fastmath=fastmath)(fn)
