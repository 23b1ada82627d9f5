"""Compiled loop of the depthwise convolution and the dense 1x1 one reading it, in NCHW88
(:mod:`..pointwise88_dw`): a unit (a sample's band of output rows) runs the depthwise rows
of every channel block into the thread's scratch, then POINTWISE_NCHW88's register tiles
over those positions straight into the output.

The depthwise rows are CHANNELWISE_NCHW88's tiles (:func:`.channelwise88._dw_tile`, with its
unrolled filter widths and strides, two channel blocks in vectors of 16 where the target has
AVX-512), written ``(C/8, rows, OW, 8)`` into the scratch; the 1x1 tiles are
:func:`.pointwise88.pw_tile` reading the scratch as their source (a block's stride the
band's positions). Each output sums in the order of the two kernels it replaces, so the
results equal theirs bit for bit. No allocation: the scratch is bound (one slice a thread).
"""

from __future__ import annotations

import functools

from numba import types as t

from ... import tiled_jit
from .channelwise88 import _dw_tile
from .pointwise88 import BLOCK, CB, pw_tile, silu8

# Numba's cache keys this file's kernels on its time stamp alone: a change to the tiles of
# .channelwise88 or .pointwise88 they inline goes with an edit here (this line)
__all__ = ["compiled_units", "signature"]

#: the tiles, unit taker and SiLU the kernels call: module globals, not closure cells
#: (Numba keys a cached closure by its cells' pickles, which differ in every process)
_dw_g = _pw_g = _take_g = _silu_g = None


def _make_kernel(fwl: int, swl: int, R: int, B: int, EPI: int):
    """The loop over units for the depthwise filter width ``fwl`` and stride ``swl``
    (:func:`.channelwise88.kernel_key`), 1x1 tiles of ``R`` positions by ``B`` blocks of
    16 and 1x1 epilogue bits ``EPI`` (compile-time constants)."""
    global _dw_g, _pw_g, _take_g, _silu_g
    _dw_g, _pw_g, _take_g, _silu_g = _dw_tile(), pw_tile(), tiled_jit.take_unit(), silu8()
    big, half, quarter = 8, 4, 2

    def kernel(x, wd, bd, zero, wp, out, z, bp, scratch, dims, conv, epid, counter, me):
        """Thread ``me``'s units from ``counter``: ``out = act(conv1x1(dw(x)) + bp [+ z])``,
        ``dw(x)`` the depthwise convolution of the flat C-contiguous ``x`` (N, CBN, H, W, 8)
        by ``wd`` (packed as CHANNELWISE_NCHW88 packs it) with its epilogue bits ``epid``
        (1 bias ``bd``, 4 ReLU, 8 H_SWISH, 16 ReLU6, 32 SiLU); ``wp`` the 1x1 filter
        packed (NG, CBN 8, B, 16) (:func:`.pointwise88.filter_packer`); ``out`` and ``z``
        (N, OCB8, OH, OW, 8).

        dims: N, CBN, H, W, OH, OW, FH, FW, ROWS (a unit's output rows), BANDS, PAIRS (two
        depthwise blocks in vectors of 16), NG, HALF, OCB8, SCR (scratch floats a thread);
        conv: SH, SW, PH, PW, DH, DW."""
        cbn, h_, w_, oh, ow = dims[1], dims[2], dims[3], dims[4], dims[5]
        fh, fw, rows, bands, pairs = dims[6], dims[7], dims[8], dims[9], dims[10] != 0
        ng, hf, ocb8, scr = dims[11], dims[12] != 0, dims[13], dims[14]
        sh, sw, ph, pw, dh, dw = conv[0], conv[1], conv[2], conv[3], conv[4], conv[5]
        xrow = w_ * CB
        rstep, cstep, sstep = dh * xrow, dw * CB, sw * CB
        jl = min(ow, (pw + sw - 1) // sw)
        jr = max(jl, min(ow, (w_ - 1 + pw - (fw - 1) * dw) // sw + 1))
        slots = (cbn + 1) // 2 if pairs else cbn
        xh = h_ * xrow
        bs = rows * ow * CB  # a block's stride in the scratch
        s0 = me * scr
        ohw8 = oh * ow * CB
        while True:
            u = _take_g(counter, me)
            if u < 0:
                return
            n = u // bands
            r0 = (u % bands) * rows
            r1 = min(oh, r0 + rows)
            for slot in range(slots):
                cb = slot * 2 if pairs else slot
                two = pairs and cb + 1 < cbn
                blk = n * cbn + cb
                wo = cb * fh * fw * CB
                bo = cb * CB
                for i in range(r0, r1):
                    top = i * sh - ph
                    a0 = 0 if top >= 0 else min(fh, (-top + dh - 1) // dh)
                    a1 = min(fh, (h_ - 1 - top) // dh + 1) if top <= h_ - 1 else 0
                    if a1 < a0:
                        a1 = a0
                    xr = (blk * h_ + top) * xrow - pw * CB
                    orow = s0 + (cb * rows + i - r0) * ow * CB
                    if two:
                        if ow > half:
                            for jj in range(0, ow, big):
                                _dw_g(x, xr + jj * sstep, sstep, cstep, rstep, a0, a1, wd, wo,
                                      fw, scratch, orow + jj * CB, zero, bd, bo, epid, zero,
                                      jj * sw - pw, w_, big, fwl, swl,
                                      jj < jl or jj + big > jr, ow - jj, 16, xh, bs)  # fmt: skip
                        elif ow > quarter:
                            _dw_g(x, xr, sstep, cstep, rstep, a0, a1, wd, wo, fw, scratch, orow,
                                  zero, bd, bo, epid, zero, -pw, w_, half, fwl, swl,
                                  jl > 0 or half > jr, ow, 16, xh, bs)  # fmt: skip
                        else:
                            _dw_g(x, xr, sstep, cstep, rstep, a0, a1, wd, wo, fw, scratch, orow,
                                  zero, bd, bo, epid, zero, -pw, w_, quarter, fwl, swl,
                                  jl > 0 or quarter > jr, ow, 16, xh, bs)  # fmt: skip
                    elif ow > half:
                        for jj in range(0, ow, big):
                            _dw_g(x, xr + jj * sstep, sstep, cstep, rstep, a0, a1, wd, wo, fw,
                                  scratch, orow + jj * CB, zero, bd, bo, epid, zero,
                                  jj * sw - pw, w_, big, fwl, swl, jj < jl or jj + big > jr,
                                  ow - jj, 8, 0, 0)  # fmt: skip
                    elif ow > quarter:
                        _dw_g(x, xr, sstep, cstep, rstep, a0, a1, wd, wo, fw, scratch, orow,
                              zero, bd, bo, epid, zero, -pw, w_, half, fwl, swl,
                              jl > 0 or half > jr, ow, 8, 0, 0)  # fmt: skip
                    else:
                        _dw_g(x, xr, sstep, cstep, rstep, a0, a1, wd, wo, fw, scratch, orow,
                              zero, bd, bo, epid, zero, -pw, w_, quarter, fwl, swl,
                              jl > 0 or quarter > jr, ow, 8, 0, 0)  # fmt: skip
                    if epid & 32:  # SiLU on the row just stored, 8 channels a vector
                        for e in range(orow, orow + ow * CB, CB):
                            _silu_g(scratch, e)
                        if two:
                            for e in range(orow + bs, orow + bs + ow * CB, CB):
                                _silu_g(scratch, e)
            # the 1x1 tiles over the band's positions, the scratch as their source
            npos = (r1 - r0) * ow
            nt = npos // R
            for g in range(ng):
                w0 = g * cbn * (CB * BLOCK * B)
                o0 = (n * ocb8 + g * 2 * B) * ohw8 + r0 * ow * CB
                b0 = g * B * BLOCK
                last = hf and g == ng - 1
                if nt == 0:  # fewer positions than a tile: tiles of one
                    for q in range(npos):
                        if last:
                            _pw_g(1, B, 1, EPI, scratch, s0 + q * CB, bs, cbn, wp, w0, out,
                                  o0 + q * CB, ohw8, z, bp, b0, 0, zero, 0, zero)  # fmt: skip
                        else:
                            _pw_g(1, B, 0, EPI, scratch, s0 + q * CB, bs, cbn, wp, w0, out,
                                  o0 + q * CB, ohw8, z, bp, b0, 0, zero, 0, zero)  # fmt: skip
                    continue
                for k in range(nt + (1 if npos % R else 0)):
                    q = k * R if k < nt else npos - R
                    skip = 0 if k < nt else nt * R - q
                    if last:
                        _pw_g(R, B, 1, EPI, scratch, s0 + q * CB, bs, cbn, wp, w0, out,
                              o0 + q * CB, ohw8, z, bp, b0, skip, zero, 0, zero)  # fmt: skip
                    else:
                        _pw_g(R, B, 0, EPI, scratch, s0 + q * CB, bs, cbn, wp, w0, out,
                              o0 + q * CB, ohw8, z, bp, b0, skip, zero, 0, zero)  # fmt: skip

    return kernel


def signature():
    """The Numba signature of the kernels of :func:`_make_kernel`."""
    fr = t.Array(t.float32, 1, "C", readonly=True)
    f1, ints, i8 = t.float32[::1], t.int64[::1], t.int64
    return t.void(fr, fr, fr, fr, fr, f1, fr, fr, f1, ints, ints, i8, ints, i8)


@functools.cache
def _compiled(fwl: int, swl: int, R: int, B: int, epi: int):
    run = _make_kernel(fwl, swl, R, B, epi)
    # a name of its own per variant: Numba's cache keeps one index per name
    run.__qualname__ = run.__name__ = f"pointwise88_dw_{fwl}s{swl}_{R}x{B}_e{epi}"
    return tiled_jit.compile_tiled(run, [signature()])


def compiled_units(key: tuple[int, int], R: int, B: int, epi: int):
    """The compiled units (compiled on first use) of the depthwise kernel ``key``
    (:func:`.channelwise88.kernel_key`), 1x1 tiles ``R x B`` and 1x1 epilogue bits ``epi``:
    ``units(x, wd, bd, zero, wp, out, z, bp, scratch, dims, conv, epid, counter, me)`` (the
    kernel's docstring in :func:`_make_kernel`)."""
    return _compiled(*key, R, B, epi)
