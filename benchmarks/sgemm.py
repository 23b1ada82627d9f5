"""megbrain's float32 GEMM (:mod:`megbrain.kernels.sgemm`) against OpenBLAS (NumPy's
matmul), the current split path (:func:`megbrain.kernels.gemm.matmul_step`), the packed GEMM
of a constant matrix (:mod:`megbrain.kernels.packed_gemm`, ConvNeXt's Linear layers) and
torch.mm, at one and two threads, on ResNet-18 CIFAR training's 3x3 GEMMs at batch 32 and
ConvNeXt-Tiny's Linear layers. GFLOP/s, the best of interleaved rounds (each implementation
in turn, so that a busy moment of a shared machine hits them alike), by wall clock and by
the process's CPU time.

With ``--layers``: ResNet-18's 3x3 data gradients at batch 32 by GEMM_COL2IM (whose products
take this GEMM), with it and with NumPy's matmul (:data:`megbrain.kernels.sgemm.ENABLED`),
interleaved, ms per call at the kernel pool's threads.

Run: ``python benchmarks/sgemm.py [--rounds 5] [--only resnet|convnext] [--threads 1,2]
[--layers]``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from megbrain.kernels import gemm, packed_gemm, parallel, sgemm


def resnet_shapes() -> list[tuple[str, int, int, int, bool]]:
    """``(name, m, n, k, b_transposed)``: per stage (C = OC, plane HxW, batch 32), the
    filter gradient ``diff (C, P) @ cols^T (P, 9C)``, the data gradient ``W^T (9C, C) @ diff
    (C, P)`` and the forward ``W (C, 9C) @ cols (9C, P)``, P = 32 H W."""
    out = []
    for c, hw in ((64, 32), (128, 16), (256, 8), (512, 4)):
        p = 32 * hw * hw
        out.append((f"{c}@{hw}x{hw} filter grad", c, 9 * c, p, True))
        out.append((f"{c}@{hw}x{hw} data grad", 9 * c, p, c, False))
        out.append((f"{c}@{hw}x{hw} forward", c, p, 9 * c, False))
    return out


def convnext_shapes() -> list[tuple[str, int, int, int, bool]]:
    """ConvNeXt-Tiny's Linear layers at batch 1: ``x (positions, K) @ W^T (K, N)``."""
    out = []
    for hw, c in ((56, 96), (28, 192), (14, 384), (7, 768)):
        out.append((f"{hw}x{hw} {c}->{4 * c}", hw * hw, 4 * c, c, True))
        out.append((f"{hw}x{hw} {4 * c}->{c}", hw * hw, c, 4 * c, True))
    return out


def candidates(a, b, out, nt: int, constant: bool) -> dict:
    """The implementations at ``nt`` threads, each a zero-argument callable."""
    fns = {"ours": sgemm.bind_sgemm(a, b, out, threads=nt)}
    if nt == 1:
        def blas():
            with parallel.blas_single_threaded():
                np.matmul(a, b, out=out)

        fns["OpenBLAS"] = blas
    else:
        fns["matmul_step"] = gemm.matmul_step(a, b, out)
        fns["OpenBLAS"] = lambda: np.matmul(a, b, out=out)
    if constant and packed_gemm.usable_packed_matmul(a, b, out):
        threads, packed_gemm.threads = packed_gemm.threads, lambda: nt  # its bind-time count
        try:
            fns["packed"] = packed_gemm.bind_packed_matmul(a, b, out, constant=True)
        finally:
            packed_gemm.threads = threads
    try:
        import torch
    except ImportError:
        return fns
    ta, tb, to = (torch.from_numpy(x) for x in (a, b, out))

    def mm():
        torch.set_num_threads(nt)
        torch.mm(ta, tb, out=to)

    fns["torch"] = mm
    return fns


def measure(fns: dict, rounds: int, flops: float) -> dict:
    """Best wall and CPU GFLOP/s of each function over interleaved rounds."""
    best = {name: [0.0, 0.0] for name in fns}
    for f in fns.values():
        f()
    for _ in range(rounds):
        for name, f in fns.items():
            w, c = time.perf_counter(), time.process_time()
            f()
            w, c = time.perf_counter() - w, time.process_time() - c
            best[name][0] = max(best[name][0], flops / w / 1e9)
            best[name][1] = max(best[name][1], flops / max(c, 1e-9) / 1e9)
    return best


def layers(rounds: int) -> None:
    """GEMM_COL2IM's data gradients of ResNet-18's 3x3 layers, the GEMM on and off."""
    from megbrain.kernels.conv.bwd_data import bwd_data_gemm_col2im

    rng = np.random.default_rng(0)
    print(f"\nGEMM_COL2IM data gradients, batch 32, {parallel.num_threads()} threads: ms wall "
          f"(CPU), best of {rounds} interleaved rounds")
    print("| layer (C x OC, plane, stride) | NumPy's matmul | sgemm | ratio (wall, CPU) |")
    print("|---|---|---|---|")
    for c, oc, hw, s in ((64, 64, 32, 1), (64, 128, 32, 2), (128, 128, 16, 1),
                         (128, 256, 16, 2), (256, 256, 8, 1), (256, 512, 8, 2),
                         (512, 512, 4, 1)):  # fmt: skip
        filt = (rng.standard_normal((1, oc, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
        diff = rng.standard_normal((32, oc, hw // s, hw // s)).astype(np.float32)
        grads, steps, was = [], [], sgemm.ENABLED
        for enabled in (False, True):
            sgemm.ENABLED = enabled
            grads.append(np.empty((32, c, hw, hw), np.float32))
            steps.append(bwd_data_gemm_col2im(filt, diff, grads[-1], (s, s), (1, 1), (1, 1)))
        sgemm.ENABLED = was
        best = [[1e9, 1e9], [1e9, 1e9]]
        for f in steps:
            f()
        for _ in range(rounds):
            for i, f in enumerate(steps):
                w, cpu = time.perf_counter(), time.process_time()
                f()
                best[i][0] = min(best[i][0], 1e3 * (time.perf_counter() - w))
                best[i][1] = min(best[i][1], 1e3 * (time.process_time() - cpu))
        np.testing.assert_allclose(grads[1], grads[0], rtol=1e-3, atol=1e-3)
        (ow, oc_), (nw, nc) = best
        print(f"| {c}x{oc} {hw}x{hw} s{s} | {ow:.1f} ({oc_:.1f}) | {nw:.1f} ({nc:.1f}) | "
              f"{ow / nw:.2f}, {oc_ / nc:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", choices=("resnet", "convnext"))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--layers", action="store_true")
    args = ap.parse_args()
    if args.layers:
        layers(args.rounds)
        return
    rng = np.random.default_rng(0)
    shapes = []
    if args.only != "convnext":
        shapes += [(*s, False) for s in resnet_shapes()]
    if args.only != "resnet":
        shapes += [(*s, True) for s in convnext_shapes()]
    for nt in (int(x) for x in args.threads.split(",")):
        print(f"\n{nt} thread(s): GFLOP/s wall (CPU), best of {args.rounds} interleaved rounds")
        head = None
        for name, m, n, k, bt, constant in shapes:
            a = rng.standard_normal((m, k), np.float32)
            b = rng.standard_normal((n, k), np.float32).T if bt else \
                rng.standard_normal((k, n), np.float32)  # fmt: skip
            out = np.empty((m, n), np.float32)
            fns = candidates(a, b, out, nt, constant)
            best = measure(fns, args.rounds, 2.0 * m * n * k)
            if head != list(fns):
                head = list(fns)
                cols = " | ".join(head)
                print(f"| {'shape (m x n x k)':40s} | {cols} | ours / best other (CPU) |")
                print("|---" * (len(head) + 2) + "|")
            # by CPU time: on a shared machine the wall clock counts the waits for a core
            other = max(v[1] for key, v in best.items() if key != "ours")
            cells = " | ".join(f"{best[h][0]:.0f} ({best[h][1]:.0f})" for h in head)
            label = f"{name} {m}x{n}x{k}"
            print(f"| {label:40s} | {cells} | {best['ours'][1] / other:.2f} |")


if __name__ == "__main__":
    main()
