"""Compiled loops of the packed float32 GEMM (:mod:`megbrain.kernels.gemm`'s product by a
constant matrix): register tiles of ``R`` rows by ``B`` blocks of 16 columns whose whole
reduction and write-out stay in registers.

Layouts (float32, flat):

- ``a``: row ``p`` of the ``(M, K)`` left operand at ``a[p lda:][:K]`` (read in place);
- packed constant ``(NG, K, B, 16)``: the columns padded to a multiple of 16, cut into
  ``NG`` groups of ``B`` blocks of 16; a tile's ``B`` vectors of one ``k`` are contiguous
  and a group's whole matrix is one stream (:func:`matrix_packer`);
- ``out``: row ``p`` at ``out[p ldo:][:N]``.

A tile keeps ``R B`` accumulator vectors (at most 24 of AVX-512's 32 registers): per ``k``
``B`` vector loads of the packed matrix and one broadcast of ``a`` per row, ``R B`` fused
multiply-adds, summed over ``k`` in order (so a sum does not depend on the tiling or on the
threads). The bias, the activation (:func:`.conv.loops.pointwise88.activate`) and an
elementwise tail (a JIT expression of one input, :func:`emit_tail`: a Linear layer's GELU)
are applied to the registers before the store, then, with a residual, a per-column scale and an
addend matrix (``out = tail(...) * scale + addend``: a ConvNeXt block's layer scale and
residual add, one fused multiply-add: one rounding, where the Elemwise FUSE_MUL_ADD3 it replaces
may round twice); the last block of the
last group stores only its columns below ``N`` (masked). A band's last partial tile starts ``R``
rows before ``M`` and stores only the rows not stored yet, as POINTWISE_NCHW88's.
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np
from llvmlite import ir
from numba import types as t
from numba.core import cgutils
from numba.extending import intrinsic

from . import tiled_jit
from .conv.loops.pointwise88 import activate
from .elemwise_modes import EIGEN_RATIONALS

__all__ = ["BLOCK", "TAIL_MODES", "compiled_units", "emit_tail", "matrix_packer"]

#: columns of a packed vector (a tile's column block)
BLOCK = 16


def _rational(name: str):
    """The vector form of the JIT's ``name`` (``_erf``, ``_tanh``): Eigen's rational of the
    argument clamped to its bound, Horner steps as multiply-adds (the JIT's approximations
    may contract them), NaN passed through; ``_tanh``'s small-argument and +-1 cases."""
    bound, p, q, _ = EIGEN_RATIONALS[name]
    pc, qc = [float(c) for c in p.split()], [float(c) for c in q.split()]

    def emit(builder, const, fma, x):
        b = float(bound)
        xc = builder.select(builder.fcmp_ordered("<", x, const(b)), x, const(b))
        xc = builder.select(builder.fcmp_ordered(">", xc, const(-b)), xc, const(-b))
        x2 = builder.fmul(xc, xc)
        num, den = const(pc[0]), const(qc[0])
        for c in pc[1:]:
            num = builder.call(fma, [num, x2, const(c)])
        for c in qc[1:]:
            den = builder.call(fma, [den, x2, const(c)])
        r = builder.fdiv(builder.fmul(num, xc), den)
        if name == "_tanh":
            big = builder.fcmp_ordered(">", x, const(0.0))
            r = builder.select(builder.fcmp_ordered("<", builder.call(_fabs(builder, x), [x]),
                                                    const(b)),
                               r, builder.select(big, const(1.0), const(-1.0)))  # fmt: skip
            r = builder.select(builder.fcmp_ordered("<", builder.call(_fabs(builder, x), [x]),
                                                    const(0.0004)), x, r)  # fmt: skip
        return builder.select(builder.fcmp_unordered("uno", x, x), x, r)

    return emit


def _fabs(builder, x):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(x.type, [x.type]),
                                          f"llvm.fabs.v{x.type.count}f32")  # fmt: skip


def _max(builder, a, b):  # as the JIT's: a when a > b or a is NaN
    keep = builder.or_(builder.fcmp_ordered(">", a, b), builder.fcmp_unordered("uno", a, a))
    return builder.select(keep, a, b)


def _min(builder, a, b):
    keep = builder.or_(builder.fcmp_ordered("<", a, b), builder.fcmp_unordered("uno", a, a))
    return builder.select(keep, a, b)


#: the JIT modes a tile's tail computes, as LLVM vector code with the JIT's semantics
#: (:data:`megbrain.kernels.elemwise_modes.JIT_FORMS`): mode -> ``f(builder, const, fma,
#: *args)``; exact modes keep two roundings (no contraction)
TAIL_MODES = {
    "ADD": lambda b, c, f, x, y: b.fadd(x, y),
    "SUB": lambda b, c, f, x, y: b.fsub(x, y),
    "MUL": lambda b, c, f, x, y: b.fmul(x, y),
    "TRUE_DIV": lambda b, c, f, x, y: b.fdiv(x, y),
    "NEGATE": lambda b, c, f, x: b.fneg(x),
    "FUSE_MUL_ADD3": lambda b, c, f, x, y, z: b.fadd(b.fmul(x, y), z),
    "MAX": lambda b, c, f, x, y: _max(b, x, y),
    "MIN": lambda b, c, f, x, y: _min(b, x, y),
    "RELU": lambda b, c, f, x: b.select(b.fcmp_ordered("<", x, c(0.0)), c(0.0), x),
    "ERF": _rational("_erf"),
    "TANH": _rational("_tanh"),
}


def emit_tail(builder, v, tail: tuple):
    """The LLVM vector ``v`` with the JIT expression ``tail`` (:mod:`.jit_codegen`'s form,
    one input ``("i", 0)``, modes of :data:`TAIL_MODES`) applied; ``v`` itself for ``()``."""
    if not tail:
        return v
    lanes = v.type.count
    fma = tiled_jit.vector_fmas(builder, v.type)

    def const(x):
        return ir.Constant(v.type, [ir.Constant(ir.FloatType(), float(np.float32(x)))] * lanes)

    temps: list = []
    for mode, args in tail:
        vals = [v if k == "i" else temps[j] if k == "t" else const(j) for k, j in args]
        temps.append(TAIL_MODES[mode](builder, const, fma, *vals))
    return temps[-1]


@functools.cache
def gemm_tile(tail: tuple = (), residual: bool = False):
    """The ``gemm_tile(R, B, NT, EPI, ap, a0, lda, k, wp, w0, out, o0, ldo, bias, b0, skip,
    scale, res, r0, ldr)`` Numba intrinsic: one tile (the module's docstring), its values
    through :func:`emit_tail` of ``tail``, then with ``residual`` times ``scale[b0 + 16 b:]``
    plus ``res[r0 + p ldr + 16 b:]``. Literals ``R``, ``B``, ``NT`` (the
    columns of the last block stored, 1-16) and ``EPI`` (bit 1 bias, then
    :func:`~.conv.loops.pointwise88.activate`'s bits); row ``p`` reads
    ``ap[a0 + p lda + c]``, the packed matrix ``wp[w0 + (c B + b) 16:]`` for ``c < k``, and
    stores ``out[o0 + p ldo + 16 b:]``, bias ``bias[b0 + 16 b:]``; rows ``p < skip`` are not
    stored. No index is checked."""

    @intrinsic
    def gemm_tile(typingctx, nrow, nblk, ntail, epi, ap, a0, lda, k, wp, w0, out, o0, ldo,
                  bias, b0, skip, scale, res, r0, ldr):  # fmt: skip
        literals = (nrow, nblk, ntail, epi)
        if not all(isinstance(v, t.IntegerLiteral) for v in literals):
            return None
        R, B, NT, ep = (v.literal_value for v in literals)

        def codegen(context, builder, signature, args):
            (_, _, _, _, _, a0_v, lda_v, k_v, _, w0_v, _, o0_v, ldo_v, _, b0_v,
             skip_v, _, _, r0_v, ldr_v) = args  # fmt: skip
            i64, i1 = ir.IntType(64), ir.IntType(1)
            vec = ir.VectorType(ir.FloatType(), BLOCK)
            vptr = vec.as_pointer()
            adata, wdata, odata, bdata, sdata, rdata = (
                context.make_array(signature.args[i])(context, builder, args[i]).data
                for i in (4, 8, 10, 13, 16, 17))  # fmt: skip
            fmuladd = tiled_jit.vector_fmas(builder, vec)
            slots = tiled_jit.zeroed_slots(builder, vec, R * B)
            undef = ir.Constant(vec, ir.Undefined)
            splat = ir.Constant(ir.VectorType(ir.IntType(32), BLOCK), None)

            def const(v):
                return ir.Constant(i64, v)

            def at(base, off):
                return builder.gep(base, [off], inbounds=True)

            with cgutils.for_range(builder, k_v, intp=i64) as loop:
                c = loop.index
                wb = builder.add(w0_v, builder.mul(c, const(B * BLOCK)))
                ws = [builder.load(builder.bitcast(at(wdata, builder.add(wb, const(b * BLOCK))),
                                                   vptr), align=4)
                      for b in range(B)]  # fmt: skip
                xb = builder.add(a0_v, c)
                for p in range(R):
                    x = builder.load(at(adata, builder.add(xb, builder.mul(lda_v, const(p)))))
                    xv = builder.shuffle_vector(builder.insert_element(undef, x, const(0)),
                                                undef, splat)  # fmt: skip
                    for b in range(B):
                        s = slots[p * B + b]
                        builder.store(builder.call(fmuladd, [xv, ws[b], builder.load(s)]), s)

            # the last block's columns below N: masked loads and stores
            mask = ir.Constant(ir.VectorType(i1, BLOCK), [ir.Constant(i1, int(j < NT))
                                                          for j in range(BLOCK)])  # fmt: skip
            i32 = ir.IntType(32)
            mload = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vec, [vptr, i32, mask.type, vec]),
                "llvm.masked.load.v16f32.p0")
            mstore = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [vec, vptr, i32, mask.type]),
                "llvm.masked.store.v16f32.p0")
            four = ir.Constant(i32, 4)

            def partial(b):
                return b == B - 1 and NT < BLOCK

            def column_vectors(data):  # bias, scale: one vector per block
                out = []
                for b in range(B):
                    ptr = builder.bitcast(at(data, builder.add(b0_v, const(b * BLOCK))), vptr)
                    out.append(builder.call(mload, [ptr, four, mask, undef]) if partial(b)
                               else builder.load(ptr, align=4))  # fmt: skip
                return out

            # llvm.fma, not fmuladd: one rounding whatever the target contracts
            fma = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vec, [vec] * 3), "llvm.fma.v16f32")
            biases = column_vectors(bdata) if ep & 1 else []
            scales = column_vectors(sdata) if residual else []
            for p in range(R):
                vs = []
                rrow = builder.add(r0_v, builder.mul(ldr_v, const(p)))
                for b in range(B):
                    v = builder.load(slots[p * B + b])
                    if ep & 1:
                        v = builder.fadd(v, biases[b])
                    v = emit_tail(builder, activate(builder, v, ep), tail)
                    if residual:
                        ptr = builder.bitcast(at(rdata, builder.add(rrow, const(b * BLOCK))),
                                              vptr)  # fmt: skip
                        r = (builder.call(mload, [ptr, four, mask, undef]) if partial(b)
                             else builder.load(ptr, align=4))  # fmt: skip
                        v = builder.call(fma, [v, scales[b], r])
                    vs.append(v)
                with builder.if_then(builder.icmp_signed("<=", skip_v, const(p)), likely=True):
                    row = builder.add(o0_v, builder.mul(ldo_v, const(p)))
                    for b, v in enumerate(vs):
                        ptr = builder.bitcast(at(odata, builder.add(row, const(b * BLOCK))), vptr)
                        if partial(b):
                            builder.call(mstore, [v, ptr, four, mask])
                        else:
                            builder.store(v, ptr, align=4)
            return context.get_dummy_value()

        sig = t.void(nrow, nblk, ntail, epi, ap, a0, lda, k, wp, w0, out, o0, ldo, bias, b0,
                     skip, scale, res, r0, ldr)  # fmt: skip
        return sig, codegen

    return gemm_tile


#: the tile intrinsic and the take-next-unit function, bound before compiling (module
#: globals, not closure cells: Numba's cache keys a closure by its cells' pickled bytes)
tile = take = None


def _units_py(R, B, NT, EPI, tail=(), residual=False):
    """The units of a product of tiles ``R x B``, last block ``NT`` columns, epilogue bits
    ``EPI`` (compile-time constants of the returned function, its only closure cells), the
    tiles' tail ``tail`` and ``residual`` (:func:`gemm_tile`)."""
    global tile, take
    tile, take = gemm_tile(tail, residual), tiled_jit.take_unit()

    def run(ap, wp, out, bias, scale, res, geom, counter, me):  # pragma: no cover - compiled
        # geom: M, K, LDA, LDO, NG (groups of B blocks), NB (bands of rows), TPB (tiles per
        # band; the last band also takes the rows after its tiles), LDR
        m, k, lda, ldo, ng, nb, tpb = geom[0], geom[1], geom[2], geom[3], geom[4], geom[5], geom[6]
        ldr = geom[7]
        while True:
            u = take(counter, me)
            if u < 0:
                break
            c0 = (u % ng) * (B * 16)  # the group's first column
            w0 = c0 * k
            q = (u // ng) * tpb * R
            stop = m if u // ng == nb - 1 else q + tpb * R
            while q < stop:
                start = min(q, m - R)  # a last partial tile backs up over stored rows
                if c0 + B * 16 >= ng * B * 16:
                    tile(R, B, NT, EPI, ap, start * lda, lda, k, wp, w0, out,
                         start * ldo + c0, ldo, bias, c0, q - start, scale, res,
                         start * ldr + c0, ldr)  # fmt: skip
                else:
                    tile(R, B, 16, EPI, ap, start * lda, lda, k, wp, w0, out,
                         start * ldo + c0, ldo, bias, c0, q - start, scale, res,
                         start * ldr + c0, ldr)  # fmt: skip
                q += R

    return run


@functools.cache
def _compiled_units(R: int, B: int, NT: int, epi: int, tail: tuple, residual: bool):
    fr = t.Array(t.float32, 1, "C", readonly=True)
    run = _units_py(R, B, NT, epi, tail, residual)
    # a name of its own per variant: Numba's cache keeps one index per name
    key = hashlib.sha1(repr(tail).encode()).hexdigest()[:12] if tail else ""
    run.__qualname__ = run.__name__ = f"gemm_units_{R}x{B}_t{NT}_e{epi}{key}{'_r' * residual}"
    sig = t.void(fr, fr, t.float32[::1], fr, fr, fr, t.int64[::1], t.int64[::1], t.int64)
    return tiled_jit.compile_tiled(run, [sig])


def compiled_units(R: int, B: int, NT: int, epi: int, tail: tuple = (), residual: bool = False):
    """The compiled units of tiles ``R x B`` (last block ``NT`` columns) with epilogue bits
    ``epi``, the tail ``tail`` (:func:`emit_tail`) and, with ``residual``, the scale and
    addend after it (:func:`gemm_tile`), compiled on first use (by binding code, never a
    kernel thread): ``units(ap, wp, out, bias, scale, res, geom, counter, me)``, the flat
    read-only left operand, packed matrix, bias, scale and addend, the flat output, the int64
    geometry ``(M, K, LDA, LDO, NG, NB, TPB, LDR)``, the units' counter
    (:func:`megbrain.kernels.tiled_jit.take_unit`, units band-major, groups fastest) and the
    thread's index."""
    return _compiled_units(R, B, NT, epi, tuple(tail), bool(residual))


def matrix_packer(b: np.ndarray, wp: np.ndarray, nb: int):
    """A step packing the ``(K, N)`` matrix ``b`` (any strides) into the flat ``wp`` laid out
    ``(NG, K, nb, 16)``, columns padded with zeros to ``NG nb 16`` (views made here: the step
    allocates nothing)."""
    k, n = b.shape
    per = nb * BLOCK
    ng = -(-n // per)
    dst = wp.reshape(ng, k, per)
    pairs = [(dst[g, :, : min(n, (g + 1) * per) - g * per], b[:, g * per : (g + 1) * per])
             for g in range(ng)]  # fmt: skip
    pad = dst[ng - 1, :, n - (ng - 1) * per :]

    def pack() -> None:
        for d, s in pairs:
            np.copyto(d, s)
        pad.fill(0)

    return pack
