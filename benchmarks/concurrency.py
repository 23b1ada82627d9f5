"""Serving from threads: aggregate throughput of torchvision's ResNet-18 (batch 1) called
from 1, 2 and 4 caller threads, megbrain against one onnxruntime session.

The model is exported to ONNX (opset 17, ``dynamo=False``; random weights) in a temporary
directory, loaded with ``megbrain.onnx`` and optimized as in ``onnx_inference.py`` (its
inference recipe). Each row runs every side for ``--seconds`` with ``T`` threads calling as
fast as they can, in ``--rounds`` interleaved rounds; the table has the median calls per
second summed over the threads and the ratio to the same side's 1-thread row (issue 35's
target: 4 threads >= 0.9x of 1). Sides:

* ``mgb shared``: one compiled function called by all threads (calls take turns; each call's
  kernels split over the cores);
* ``mgb per-thread``: each thread its own graph loaded from the same file;
* ``ort``: one onnxruntime session (intra-op threads = the CPU count) run by all threads.

    python benchmarks/concurrency.py [--seconds S] [--rounds R] [--threads 1,2,4]

Needs torch and torchvision (benchmarks/requirements-peers.txt) and onnxruntime.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from onnx_inference import _megbrain_runner, _ort_runner  # noqa: E402


def resnet18():
    """torchvision's ResNet-18 (eval, random weights); where torchvision does not load
    (its operators built for another torch), the same network written with ``torch.nn``."""
    try:
        import torchvision

        return torchvision.models.resnet18(weights=None).eval(), "torchvision"
    except Exception:  # noqa: BLE001 - e.g. "operator torchvision::nms does not exist"
        pass
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
                )

        def forward(self, x):
            y = self.bn2(self.conv2(self.bn1(self.conv1(x)).relu()))
            return (y + (x if self.down is None else self.down(x))).relu()

    layers = [
        nn.Conv2d(3, 64, 7, 2, 3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
    ]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000)]
    return nn.Sequential(*layers).eval(), "torch.nn (torchvision did not load)"


def export_resnet18(tmp: str) -> tuple[str, dict, str]:
    """ResNet-18 as ONNX in ``tmp``; the feed of batch 1; where the network came from."""
    import torch

    model, origin = resnet18()
    x = torch.from_numpy(np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32))
    path = os.path.join(tmp, "resnet18.onnx")
    with torch.no_grad():
        torch.onnx.export(model, (x,), path, opset_version=17, dynamo=False, input_names=["x"])
    return path, {"x": x.numpy()}, origin


def throughput(calls: list, seconds: float) -> float:
    """Calls per second summed over threads, thread ``i`` calling ``calls[i]`` in a loop."""
    stop = threading.Event()
    counts = [0] * len(calls)
    start = threading.Barrier(len(calls) + 1)

    def loop(i):
        fn = calls[i]
        fn()  # warm
        start.wait()
        n = 0
        while not stop.is_set():
            fn()
            n += 1
        counts[i] = n

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - t0)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=2.0, help="timed seconds per row and side")
    ap.add_argument("--threads", default="1,2,4", help="caller thread counts")
    ap.add_argument("--rounds", type=int, default=5, help="rounds (the median is reported)")
    args = ap.parse_args(argv)
    counts = [int(t) for t in args.threads.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        path, feed, origin = export_resnet18(tmp)
        shared, _ = _megbrain_runner(path, feed)
        own = [shared] + [_megbrain_runner(path, feed)[0] for _ in range(max(counts) - 1)]
        ort = _ort_runner(path, feed, os.cpu_count() or 1, spin=True)
        sides = {
            "mgb shared": lambda n: [shared] * n,
            "mgb per-thread": lambda n: own[:n],
            "ort": lambda n: [ort] * n,
        }
        print(
            f"ResNet-18 ({origin}) batch 1, {os.cpu_count()} CPUs, {args.rounds} rounds of "
            f"{args.seconds:g} s per row; calls/s summed over the caller threads (x: over 1 thread)"
        )
        print(f"{'threads':>8}" + "".join(f"{k:>22}" for k in sides))
        # rounds interleave every row and side, so that a change in the machine's load hits
        # them alike; the table has each one's median over the rounds
        got: dict = {}
        for _ in range(args.rounds):
            for n in counts:
                for name, make in sides.items():
                    got.setdefault((n, name), []).append(throughput(make(n), args.seconds))
        for n in counts:
            row = []
            for name in sides:
                r = statistics.median(got[n, name])
                r1 = statistics.median(got[counts[0], name])
                row.append(f"{r:12.1f} ({r / r1:4.2f}x)")
            print(f"{n:>8}" + "".join(f"{c:>22}" for c in row), flush=True)


if __name__ == "__main__":
    main()
