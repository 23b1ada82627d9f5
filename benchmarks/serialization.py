"""Dump and load time and file size of graph files against pickle and ``np.savez``.

Two inference graphs: the digits CNN of ``megbrain.examples.digits`` (eval mode, batch 1)
and a ResNet-style network (a stem convolution and ``--blocks`` residual blocks of
conv-BN-ReLU-conv-BN plus the identity, then ReLU, global average pooling and a linear
head; random weights). For each, the graph file (``serialize_comp_graph_to_file`` with
parameter names kept, ``load_comp_graph_from_file``) is compared with ``pickle`` and
``np.savez`` of the same weights (a dict name -> ndarray of the model's parameters and
buffers): the graph file holds the whole graph, the others only the weights. Times are the
best of ``--repeats`` runs, through files in a temporary directory; the loaded graph is
checked to compute what the original does.

Run: ``python benchmarks/serialization.py [--blocks N] [--width C] [--repeats N]``.
"""

from __future__ import annotations

import argparse
import os
import pickle
import platform
import tempfile
import time

import numpy as np

import megbrain as mgb
from megbrain import nn

CN = "cpu0"


class ResBlock(nn.Module):
    """relu(x + bn2(conv2(relu(bn1(conv1(x))))))."""

    def __init__(self, width: int):
        super().__init__()
        self.conv1 = nn.Conv2d(width, width, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(width)

    def forward(self, x):
        h = mgb.opr.elem.relu(self.bn1(self.conv1(x)))
        return mgb.opr.elem.relu(x + self.bn2(self.conv2(h)))


class GlobalAvgPool(nn.Module):
    def forward(self, x):
        return x.mean(axis=3).mean(axis=2)


def resnet(blocks: int, width: int, classes: int = 10) -> nn.Module:
    """A small ResNet for (N, 3, H, W) images, with seeded random weights and statistics."""
    nn.init.default_rng(0)
    model = nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
        *[ResBlock(width) for _ in range(blocks)],
        GlobalAvgPool(), nn.Linear(width, classes),
    )  # fmt: skip
    rng = np.random.default_rng(1)
    for name, buf in model.named_buffers():
        n = buf.get_value().shape
        if name.endswith("running_var"):
            buf.set_value(rng.uniform(0.5, 1.5, n).astype(np.float32))
        else:
            buf.set_value((rng.standard_normal(n) * 0.1).astype(np.float32))
    return model.eval()


def digits_cnn() -> nn.Module:
    from megbrain.examples import digits

    return digits.make_model("cnn").eval()


def weights_of(model: nn.Module) -> dict[str, np.ndarray]:
    """name -> value of every parameter and buffer."""
    out = {n: np.array(p.get_value()) for n, p in model.named_parameters()}
    out.update({n: np.array(b.get_value()) for n, b in model.named_buffers()})
    return out


def best(fn, repeats: int) -> float:
    t = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        t = min(t, time.perf_counter() - t0)
    return t


def bench(name: str, model: nn.Module, in_shape: tuple, repeats: int, tmp: str) -> list[dict]:
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, shape=in_shape, name="x")
    out = model(x)
    xv = np.random.default_rng(2).standard_normal(in_shape).astype(np.float32)
    expect = g.compile([x], mgb.copy_output(out))(xv)
    weights = weights_of(model)
    n_values = sum(v.size for v in weights.values())
    paths = {k: os.path.join(tmp, f"{name}.{k}") for k in ("mge", "pkl", "npz")}

    def dump_graph():
        mgb.serialize_comp_graph_to_file(paths["mge"], {"out": out}, keep_param_name=True)

    def load_graph():
        return mgb.load_comp_graph_from_file(paths["mge"])

    def dump_pickle():
        with open(paths["pkl"], "wb") as f:
            pickle.dump(weights, f, protocol=pickle.HIGHEST_PROTOCOL)

    def load_pickle():
        with open(paths["pkl"], "rb") as f:
            return pickle.load(f)

    def dump_npz():
        np.savez(paths["npz"], **weights)

    def load_npz():
        with np.load(paths["npz"]) as z:
            return {k: z[k] for k in z.files}

    rows = []
    for fmt, dump, load in (
        ("graph file", dump_graph, load_graph),
        ("pickle", dump_pickle, load_pickle),
        ("np.savez", dump_npz, load_npz),
    ):
        dump()
        load()
        key = {"graph file": "mge", "pickle": "pkl", "np.savez": "npz"}[fmt]
        rows.append(
            {
                "model": name,
                "format": fmt,
                "dump_s": best(dump, repeats),
                "load_s": best(load, repeats),
                "bytes": os.path.getsize(paths[key]),
                "values": n_values,
            }
        )
    # the loaded graph computes what the model does; the weights round trip exactly
    res = load_graph()
    (inp,) = mgb.cgtools.get_dep_vars(res.output_vars_list, "Host2DeviceCopy")
    got = res.graph.compile([inp], mgb.copy_output(res.output_vars_list[0]))(xv)
    np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-6)
    for k, v in load_pickle().items():
        np.testing.assert_array_equal(v, weights[k])
    ops = len(mgb.cgtools.get_oprs_seq(res.output_vars_list))
    for r in rows:
        r["nr_opr"] = ops
    return rows


def print_table(rows: list[dict]) -> None:
    print(
        f"{'model':<22} {'format':<11} {'dump ms':>9} {'load ms':>9} {'bytes':>10} "
        f"{'dump x':>7} {'load x':>7} {'size x':>7}"
    )
    ref = {(r["model"]): r for r in rows if r["format"] == "np.savez"}
    for r in rows:
        b = ref[r["model"]]
        print(
            f"{r['model']:<22} {r['format']:<11} {r['dump_s'] * 1e3:>9.3f} "
            f"{r['load_s'] * 1e3:>9.3f} {r['bytes']:>10} {r['dump_s'] / b['dump_s']:>7.2f} "
            f"{r['load_s'] / b['load_s']:>7.2f} {r['bytes'] / b['bytes']:>7.3f}"
        )
    print("ratios (x) are against np.savez of the same weights; graph files hold the whole")
    print("graph (operators, params, names) as well")


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", type=int, default=4, help="residual blocks (default 4)")
    ap.add_argument("--width", type=int, default=32, help="channels (default 32)")
    ap.add_argument("--size", type=int, default=16, help="image height/width (default 16)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    print(f"{platform.python_implementation()} {platform.python_version()}, numpy "
          f"{np.__version__}, {platform.machine()}")  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        rows += bench("digits CNN", digits_cnn(), (1, 1, 8, 8), args.repeats, tmp)
        rn = resnet(args.blocks, args.width)
        rows += bench(
            f"ResNet {args.blocks}x{args.width}ch",
            rn,
            (1, 3, args.size, args.size),
            args.repeats,
            tmp,
        )
    for m in dict.fromkeys(r["model"] for r in rows):
        r = next(r for r in rows if r["model"] == m)
        print(f"{m}: {r['nr_opr']} operators, {r['values']} weight values")
    print_table(rows)
    return rows


if __name__ == "__main__":
    main()
