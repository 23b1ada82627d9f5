"""The dense KxK NCHW88 convolutions (DIRECT_NCHW88) of ResNet-18, GoogLeNet, SqueezeNet 1.1
and DenseNet-121 against onnxruntime running a one-Conv+Relu model of the same shape.

    python benchmarks/dense88.py [--threads 1 2] [--repeat 30] [--runs 100] [--smoke]
                                 [--whole-planes | --cold | --peak] [case ...]

Every output (bias + ReLU, constant filter, random source) is checked against onnxruntime's
(rtol 1e-4, atol 1e-4). Cases are named ``HxH:IC->OC FxF/sS``, ``H`` the source's side. Each
row: our time (best of ``--repeat``, every case timed before onnxruntime's sessions are
made), onnxruntime's fused Conv node alone (its profiler's time, 10th percentile of
``--runs`` runs) and its whole run, the ratio onnxruntime's node time / ours (>= 1 is good)
and our GFLOP/s; then the sums over the cases.

With ``--whole-planes``, no onnxruntime: per case, our step with each small plane one unit
per channel unit (the split before :func:`megbrain.kernels.conv.nchw88.unit_rows` cut them
into bands) against the current one, interleaved, best of ``--repeat`` wall times, the
outputs checked equal bit for bit.

With ``--cold``, what a layer inside a network pays that one timed alone does not, at one
thread, best of ``--repeat`` CPU times: per case our step warm and after 64 MB written
(every cache flushed: the filter from memory), the source's copy into the padded phase
planes alone (warm / flushed), and onnxruntime's one-Conv+Relu session (warm / flushed,
its reorders included). With ``--peak``, no layer: the GFLOP/s of the register tile
(:func:`megbrain.kernels.tiled_jit.fma_tile`) alone, per tile shape, its operands in the
L1 cache: the core's ceiling for the layers' rates.
"""

from __future__ import annotations

import functools
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
from conv_fast import ort_conv_relu  # noqa: E402
from pointwise88 import _ort_node_time, parser, table, time_with_peer  # noqa: E402

#: (source side, input channels, output channels, filter side, stride): the distinct dense
#: layers of more than one tap but the first ones (``F // 2`` padding)
CASES = [
    (56, 64, 64, 3, 1), (28, 128, 128, 3, 1), (14, 256, 256, 3, 1), (7, 512, 512, 3, 1),
    (56, 64, 128, 3, 2), (28, 128, 256, 3, 2), (14, 256, 512, 3, 2),  # resnet18
    (56, 64, 192, 3, 1), (28, 96, 128, 3, 1), (28, 128, 192, 3, 1), (28, 16, 32, 3, 1),
    (28, 32, 96, 3, 1), (14, 96, 208, 3, 1), (14, 112, 224, 3, 1), (14, 128, 256, 3, 1),
    (14, 144, 288, 3, 1), (14, 160, 320, 3, 1), (14, 16, 48, 3, 1), (14, 24, 64, 3, 1),
    (14, 32, 128, 3, 1), (7, 160, 320, 3, 1), (7, 192, 384, 3, 1), (7, 32, 128, 3, 1),
    (7, 48, 128, 3, 1),  # googlenet
    (55, 16, 64, 3, 1), (27, 32, 128, 3, 1), (13, 48, 192, 3, 1), (13, 64, 256, 3, 1),  # squeeze
    (56, 128, 32, 3, 1), (28, 128, 32, 3, 1), (14, 128, 32, 3, 1), (7, 128, 32, 3, 1),  # dense
]  # fmt: skip


def case_name(case) -> str:
    h, ic, oc, f, s = case
    return f"{h}x{h}:{ic}->{oc} {f}x{f}/s{s}"


def operands(case, seed: int = 0) -> tuple:
    """``(x, w, b, src, filt, out)`` of a case: the NCHW source, OIHW filter and bias, and
    the NCHW88 source, dense filter and output."""
    from megbrain.kernels.conv import common as conv_common
    from megbrain.kernels.conv import nchw88 as conv_nchw88

    h, ic, oc, f, s = case
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (1, ic, h, h)).astype(np.float32)
    w = (rng.uniform(-1, 1, (oc, ic, f, f)) / np.sqrt(ic * f * f)).astype(np.float32)
    b = rng.uniform(-1, 1, oc).astype(np.float32)
    src = np.ascontiguousarray(conv_nchw88.to_nchw88(x))
    filt = np.ascontiguousarray(w.reshape(oc // 8, 8, ic // 8, 8, f, f).transpose(0, 2, 4, 5, 3,
                                                                                  1))  # fmt: skip
    o = conv_common.conv_out_size(h, f, s, f // 2, 1)
    out = np.empty((1, oc // 8, o, o, 8), np.float32)
    return x, w, b, src, filt, out


def bind_case(src, filt, b, out, f: int, s: int):
    """``(name, step)``: the case's convolution with bias and ReLU, its filter constant."""
    from megbrain.kernels.conv import nchw88 as conv_nchw88
    from megbrain.kernels.conv.constant_operands import constant_filter
    from megbrain.kernels.conv.epilogue import Epilogue

    with constant_filter(True):
        return conv_nchw88.bind_nchw88_forward(src, filt, out, (s, s), (f // 2, f // 2),
                                               (1, 1), epilogue=Epilogue(b, True))  # fmt: skip


def run_case(case, threads: int, repeat: int, runs: int = 100, peer: bool = True) -> dict:
    """Times of one case at ``threads`` threads (seconds): ours, and with ``peer``
    onnxruntime's node and whole run, the output checked against onnxruntime's."""
    from megbrain.kernels import parallel

    h, ic, oc, f, s = case
    x, w, b, src, filt, out = operands(case)
    saved = parallel.num_threads  # the units split over the kernel pool's threads
    parallel.num_threads = lambda: threads
    try:
        name, times = time_with_peer(lambda: bind_case(src, filt, b, out, f, s), out,
                                     lambda: ort_conv_relu(w, b, h, threads, stride=s), x,
                                     threads, repeat, peer)  # fmt: skip
    finally:
        parallel.num_threads = saved
    if peer:
        times["ort"] = _ort_node_time(ic, oc, h, w, b, x, threads, runs, stride=s)
    return {"name": name, "flops": 2 * out[0, :, :, :, 0].size * 8 * ic * f * f, **times}


def whole_planes(cases, threads: int, repeat: int) -> None:
    """Print, per case and summed, the wall time (ms) of our step with whole small planes
    and with the current split, at ``threads`` threads, interleaved."""
    from conv_fast import best_times

    from megbrain.kernels import parallel
    from megbrain.kernels.conv import nchw88 as conv_nchw88

    saved = parallel.num_threads, conv_nchw88.unit_rows

    def whole(oh, wq, ow, planes, widths, threads):  # one thread's split: no bands added
        return saved[1](oh, wq, ow, planes, widths, 1)

    parallel.num_threads = lambda: threads
    tot = {"whole": 0.0, "now": 0.0}
    print(f"{'case':>24} {'thr':>3} {'whole ms':>8} {'now ms':>8} {'ratio':>6}")
    try:
        for case in cases:
            h, ic, oc, f, s = case
            _, _, b, src, filt, out = operands(case)
            outs, fns = {}, {}
            for key, rule in (("whole", whole), ("now", saved[1])):
                conv_nchw88.unit_rows = rule
                outs[key] = np.empty_like(out)
                fns[key] = bind_case(src, filt, b, outs[key], f, s)[1]
            conv_nchw88.unit_rows = saved[1]
            t = best_times(fns, repeat, False)
            assert np.array_equal(outs["whole"], outs["now"])
            for k in tot:
                tot[k] += t[k]
            print(f"{case_name(case):>24} {threads:>3} {t['whole'] * 1e3:8.3f} "
                  f"{t['now'] * 1e3:8.3f} {t['whole'] / t['now']:6.2f}")  # fmt: skip
    finally:
        parallel.num_threads, conv_nchw88.unit_rows = saved
    print(f"{'sum':>24} {threads:>3} {tot['whole'] * 1e3:8.3f} {tot['now'] * 1e3:8.3f} "
          f"{tot['whole'] / tot['now']:6.2f}")  # fmt: skip


def _flushed_best(fn, repeat: int, flush) -> float:
    """The best time (seconds, the calling thread's CPU clock: these run on one thread) of
    ``fn`` over ``repeat`` calls, each after ``flush()`` when given."""
    import time

    best = float("inf")
    for _ in range(repeat):
        if flush is not None:
            flush()
        t0 = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t0)
    return best


def cold(cases, repeat: int, peer: bool = True) -> None:
    """Print, per case at one thread, ms: our step warm / flushed, its source's padded copy
    warm / flushed, and with ``peer`` onnxruntime's session warm / flushed."""
    from megbrain.kernels import parallel
    from megbrain.kernels.conv.loops import nchw8c as loops
    from megbrain.kernels.conv.nchw8c import plane_geometry

    junk = np.ones(16 << 20, np.float32)  # 64 MB

    def flush():
        np.add(junk, 1, out=junk)

    saved = parallel.num_threads
    parallel.num_threads = lambda: 1
    print(f"{'case':>24} {'warm':>7} {'flushed':>7} {'copy':>7} {'flushed':>7} {'ort':>7} "
          f"{'flushed':>7}")  # fmt: skip
    try:
        for case in cases:
            h, ic, oc, f, s = case
            x, w, b, src, filt, out = operands(case)
            step = bind_case(src, filt, b, out, f, s)[1]
            oh, p = out.shape[2], f // 2
            hq, wq, col_off, _, _ = plane_geometry((h, h), (oh, oh), (s, s), (p, p), (1, 1),
                                                   (f, f))  # fmt: skip
            buf = np.empty(ic * s * s * hq * wq + loops.SLACK * 8, np.float32)
            xs = loops.readonly_view(src)

            def pack(xs=xs, buf=buf, s=s, p=p, col_off=col_off, hq=hq, wq=wq, ic=ic):
                loops.pack_blocked_input(xs, buf, (s, s), p, col_off, hq, wq, 0, ic // 8)

            fns = [step, pack]
            if peer:
                sess = ort_conv_relu(w, b, h, 1, stride=s)
                fns.append(lambda sess=sess, x=x: sess.run(None, {"x": x}))
            times = []
            for fn in fns:
                fn()
                times += [_flushed_best(fn, repeat, None), _flushed_best(fn, repeat, flush)]
            print(f"{case_name(case):>24} " + " ".join(f"{t * 1e3:7.3f}" for t in times))
    finally:
        parallel.num_threads = saved


def peak(repeat: int, reps: int = 20000) -> dict:
    """Print and return the GFLOP/s of :func:`megbrain.kernels.tiled_jit.fma_tile` per tile
    shape (positions x output channels), 3x3 taps over two blocks of 8 channels in L1."""
    from numba import carray
    from numba import types as t

    from megbrain.kernels import tiled_jit

    fma_tile, stack_tile = tiled_jit.fma_tile(), tiled_jit.stack_tile()
    wq, cbn = 30, 2
    taps = np.array([a * wq + b for a in range(3) for b in range(3)], np.int64)
    cstride = 40 * wq * 8
    xp = np.random.default_rng(0).uniform(-1, 1, cbn * cstride + 1024).astype(np.float32)
    xp.flags.writeable = False
    rates = {}
    for npos, width in [(12, 32), (14, 32), (7, 32), (6, 64), (12, 16)]:
        size = npos * width

        def loop(npos=npos, width=width, size=size):
            def tiles(xv, wv, rb, wnext, n, tv):  # pragma: no cover - compiled
                tile = stack_tile(size, np.float32)
                acc = carray(tile, size)
                for i in range(size):
                    acc[i] = 0.0
                for r in range(n):
                    fma_tile(tile, npos, width, 8, xv, r % 8 * npos * 8, wv, 0, cbn, cstride,
                             tv, wnext)  # fmt: skip
                for i in range(size):
                    rb[i] = acc[i]

            return tiles

        f1 = t.float32[::1]
        sig = t.void(t.Array(t.float32, 1, "C", readonly=True), f1, f1, t.int64, t.int64,
                     t.int64[::1])
        kernel = tiled_jit.compile_tiled(loop(), [sig], cache=False)
        wp = np.ones(cbn * 9 * 8 * width + 64, np.float32)
        run = functools.partial(kernel, xp, wp, np.zeros(size, np.float32), cbn * 9 * 8 * 16,
                                reps, taps)  # fmt: skip
        best = _flushed_best(run, repeat, None)
        rates[(npos, width)] = 2.0 * size * 8 * 9 * cbn * reps / best * 1e-9
        print(f"tile {npos:2} positions x {width:2} channels: {rates[(npos, width)]:6.1f} GFLOP/s")
    return rates


def main(argv=None) -> list[dict]:
    ap = parser(__doc__, 30, "two small cases, 2 rounds, 1 thread")
    ap.add_argument("--whole-planes", action="store_true",
                    help="whole small planes against the current split, no onnxruntime")
    ap.add_argument("--cold", action="store_true",
                    help="warm against flushed caches, the padded copy alone, one thread")
    ap.add_argument("--peak", action="store_true", help="the register tile's GFLOP/s alone")
    args = ap.parse_args(argv)
    cases = [k for k in CASES if not args.cases or case_name(k) in args.cases]
    if args.smoke:
        cases, args.repeat, args.runs = [(7, 16, 32, 3, 1), (8, 16, 16, 3, 2)], 2, 5
        args.threads = [1]
    if args.peak:
        peak(min(args.repeat, 5), 200 if args.smoke else 20000)
        return []
    if args.cold:
        cold(cases, args.repeat)
        return []
    if args.whole_planes:
        for threads in args.threads:
            whole_planes(cases, threads, args.repeat)
        return []
    return table(cases, case_name, run_case, args.threads, args.repeat, args.runs, 24)


if __name__ == "__main__":
    main()
