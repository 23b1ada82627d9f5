"""megbrain's float32 GEMM (:mod:`megbrain.kernels.sgemm`) against OpenBLAS (NumPy's
matmul), the current split path (:func:`megbrain.kernels.gemm.matmul_step`), the packed GEMM
of a constant matrix (:mod:`megbrain.kernels.packed_gemm`, ConvNeXt's Linear layers) and
torch.mm, at one and two threads, on ResNet-18 CIFAR training's 3x3 GEMMs at batch 32 and
ConvNeXt-Tiny's Linear layers. GFLOP/s, the best of interleaved rounds (each implementation
in turn, so that a busy moment of a shared machine hits them alike), by wall clock and by
the process's CPU time.

Run: ``python benchmarks/sgemm.py [--rounds 5] [--only resnet|convnext] [--threads 1,2]``.
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
    if constant and packed_gemm.usable_packed_matmul(a, b, out) and nt == parallel.num_threads():
        fns["packed"] = packed_gemm.bind_packed_matmul(a, b, out, constant=True)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", choices=("resnet", "convnext"))
    ap.add_argument("--threads", default="1,2")
    args = ap.parse_args()
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
                print(f"| {'shape (m x n x k)':40s} | {cols} | ours / best other |")
                print("|---" * (len(head) + 2) + "|")
            other = max(v[0] for key, v in best.items() if key != "ours")
            cells = " | ".join(f"{best[h][0]:.0f} ({best[h][1]:.0f})" for h in head)
            label = f"{name} {m}x{n}x{k}"
            print(f"| {label:40s} | {cells} | {best['ours'][0] / other:.2f} |")


if __name__ == "__main__":
    main()
