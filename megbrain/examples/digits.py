"""Train a small CNN on scikit-learn's handwritten digits (1,797 8x8 images, bundled with
the package, no download), save the weights, reload them and evaluate again.

Run ``python -m megbrain.examples.digits [--epochs N] [--model cnn|mlp] [--out weights.npz]``;
``--epochs 1 --model mlp`` is the reduced mode the tests use. ``--profile trace.json`` profiles
a few training steps instead (a Chrome trace and the top operators by time).
``--dump model.mge`` also writes the trained model's inference graph (input ``x``, output
``logits``) with ``serialize_comp_graph_to_file``, for ``megbrain inspect`` / ``megbrain run``.
``mpiexec -n 2 python -m megbrain.examples.digits --distributed`` trains data-parallel: each
rank takes its ``--batch`` of every step, gradients are averaged across ranks, BatchNorm is
SyncBatchNorm, and rank 0 prints and saves.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import NoReturn

import numpy as np

import megbrain as mgb
from megbrain import nn, optim


def load_digits(seed: int = 0):
    """(x_train, y_train, x_test, y_test): images as float32 (N, 1, 8, 8) in [0, 1]."""
    from sklearn.datasets import load_digits as sk_load

    d = sk_load()
    x = (d.images.astype(np.float32) / 16.0)[:, None]
    y = d.target.astype(np.int32)
    idx = np.random.default_rng(seed).permutation(len(x))
    x, y = x[idx], y[idx]
    n_test = 360
    return x[n_test:], y[n_test:], x[:n_test], y[:n_test]


def make_model(kind: str = "cnn", sync_bn: bool = False) -> nn.Module:
    """The seeded model: ``cnn`` (two conv/BN/ReLU/max-pool blocks and an MLP head) or
    ``mlp`` (a BatchNorm1d MLP on the flattened image); ``sync_bn``: SyncBatchNorm layers."""
    nn.init.default_rng(0)
    bn1, bn2 = (nn.SyncBatchNorm,) * 2 if sync_bn else (nn.BatchNorm1d, nn.BatchNorm2d)
    if kind == "mlp":
        return nn.Sequential(
            nn.Flatten(), nn.Linear(64, 128), bn1(128), nn.ReLU(),
            nn.Dropout(0.1), nn.Linear(128, 10),
        )  # fmt: skip
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), bn2(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), bn2(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 2 * 2, 64), nn.ReLU(), nn.Linear(64, 10),
    )  # fmt: skip


def build_train_step(model, optimizer_cls, batch: int, *, graph=None, distributed=False,
                     **opt_kw):
    """Compile one training step (in ``graph``, a fresh graph by default, e.g. one with a
    profiler attached; data-parallel over the MPI job with ``distributed``): returns
    (function, optimizer)."""
    g = mgb.comp_graph() if graph is None else graph
    x = mgb.make_arg("cpu0", g, shape=(batch, 1, 8, 8), name="x")
    y = mgb.make_arg("cpu0", g, shape=(batch, 10), name="y")
    model.train()
    logits = model(x)
    loss = nn.functional.cross_entropy(logits, y)
    opt = optimizer_cls(model.parameters(), **opt_kw)
    if distributed:
        from megbrain.distributed import data_parallel

        data_parallel(opt)
    updates = opt.minimize(loss) + nn.pending_updates(g)
    func = g.compile([x, y], [mgb.copy_output(loss), mgb.copy_output(logits)] + updates)
    func.callbefore_func = opt.before_step
    return func, opt


def build_eval(model, n: int):
    """Compile the evaluation function of ``model`` (eval mode) for a batch of ``n`` images:
    images ``(n, 1, 8, 8)`` in, logits ``(n, 10)`` out."""
    g = mgb.comp_graph()
    x = mgb.make_arg("cpu0", g, shape=(n, 1, 8, 8), name="x")
    model.eval()
    return g.compile([x], mgb.copy_output(model(x)))


def evaluate(model, x, y) -> float:
    """The accuracy of ``model`` on images ``x`` with integer labels ``y``."""
    f = build_eval(model, len(x))
    return nn.functional.accuracy(f(x), y)


def dump_inference(model, path: str, batch: int = 1):
    """Write the inference graph of ``model`` (eval mode; input ``x`` of shape
    ``(batch, 1, 8, 8)``, output ``logits``) to ``path``; returns what was written."""
    g = mgb.comp_graph()
    x = mgb.make_arg("cpu0", g, shape=(batch, 1, 8, 8), name="x")
    model.eval()
    return mgb.serialize_comp_graph_to_file(path, {"logits": model(x)}, keep_param_name=True)


def profile_steps(model_kind: str, batch: int, lr: float, trace_path: str, steps: int = 5):
    """Profile ``steps`` training steps (after one warm-up step), write their Chrome trace
    to ``trace_path`` and print the operators taking the most time."""
    from megbrain.plugin import CompGraphProfiler

    xtr, ytr, _, _ = load_digits()
    onehot = np.eye(10, dtype=np.float32)
    g = mgb.comp_graph()
    prof = CompGraphProfiler(g)  # attached before the compile: it sees the step's operators
    step, _ = build_train_step(make_model(model_kind), optim.Adam, batch, graph=g, lr=lr)
    rng = np.random.default_rng(1)
    for i in range(steps + 1):
        if i == 1:
            prof.clear()  # drop the warm-up step
        idx = rng.integers(0, len(xtr), batch)
        step(xtr[idx], onehot[ytr[idx]])
    prof.write_chrome_trace(trace_path)
    top = prof.top_operators(10)
    print(f"profiled {steps} steps; trace written to {trace_path} (open it in "
          "chrome://tracing or https://ui.perfetto.dev)")
    print(f"{'operator':<48} {'type':<22} {'calls':>5} {'total ms':>9} {'share':>6}")
    for r in top:
        print(f"{r['name'][:48]:<48} {r['type'][:22]:<22} {r['calls']:>5} "
              f"{r['total'] * 1e3:>9.3f} {r['share'] * 100:>5.1f}%")
    return {"trace": trace_path, "top": top}


def _positive_int(text: str) -> int:
    """An argparse type: an int > 0."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def _positive_float(text: str) -> float:
    """An argparse type: a float > 0."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {v}")
    return v


_PROG = "python -m megbrain.examples.digits"


def _fail(msg: str, status: int = 2) -> NoReturn:
    """Exit with one line on stderr naming the command (no traceback)."""
    print(f"{_PROG}: error: {msg}", file=sys.stderr)
    raise SystemExit(status)


def _check_output_path(opt: str, path: str) -> None:
    """Refuse, before any training, an output path whose file can not be written."""
    full = os.path.abspath(path)
    parent = os.path.dirname(full)
    if os.path.isdir(full):
        _fail(f"{opt} {path}: is a directory, expected a file path")
    if not os.path.isdir(parent):
        _fail(f"{opt} {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        _fail(f"{opt} {path}: directory {parent} is not writable")


class _PlainBar:
    """A progress "bar" that shows nothing (no tqdm, or --no-progress)."""

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, **kw) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(disabled: bool):
    """``make(n, desc)``: a bar of ``n`` batches, advanced by ``update()`` as each batch
    completes (tqdm when installed, not ``disabled`` and stderr is a terminal: redraws piped
    to a log file would fill it)."""
    if not disabled and sys.stderr.isatty():
        try:
            from tqdm import tqdm
        except ImportError:
            print("tqdm is not installed: no progress bar (pip install tqdm)", file=sys.stderr)
        else:
            return lambda n, desc: tqdm(
                total=n, desc=desc, unit="batch", leave=False, mininterval=0, miniters=1
            )
    return lambda n, desc: _PlainBar()


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults in the help, except for flags and options whose help says what None means."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def make_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m megbrain.examples.digits``."""
    ap = argparse.ArgumentParser(
        prog=_PROG,
        description="Train a small CNN (or MLP) on scikit-learn's bundled handwritten digits, "
        "save the weights, reload them and evaluate again.",
        formatter_class=_HelpFormatter,
    )
    ap.add_argument("--epochs", type=_positive_int, default=20, help="training epochs")
    ap.add_argument("--batch", type=_positive_int, default=32, help="batch size (per rank)")
    ap.add_argument("--lr", type=_positive_float, default=3e-3, help="Adam learning rate")
    ap.add_argument("--model", choices=("cnn", "mlp"), default="cnn", help="network to train")
    ap.add_argument(
        "--out",
        default=None,
        help="weights file (.npz) to write; default: digits_<model>.npz in the current "
        "directory",
    )
    ap.add_argument(
        "--no-progress", action="store_true", help="no progress bar (tqdm is not needed then)"
    )
    ap.add_argument(
        "--profile",
        metavar="TRACE",
        default=None,
        help="profile 5 training steps instead of training: write a Chrome trace (JSON) "
        "and print the top operators (default: train)",
    )
    ap.add_argument(
        "--dump",
        metavar="MODEL",
        default=None,
        help="also write the trained inference graph to this file, for megbrain inspect/run "
        "(default: not written)",
    )
    ap.add_argument(
        "--dump-batch", type=_positive_int, default=1, help="batch size of --dump's input"
    )
    ap.add_argument(
        "--distributed",
        action="store_true",
        help="data-parallel over the processes of mpiexec (--batch per rank)",
    )
    return ap


def main(argv=None) -> dict:
    """Run the example with the command line ``argv`` (default ``sys.argv[1:]``); returns
    the losses, accuracies and timings. A bad option or setting exits with status 2 and one
    line saying what is wrong."""
    ap = make_parser()
    args = ap.parse_args(argv)
    rank, nranks = 0, 1
    if args.distributed:
        from megbrain import distributed as dist

        dist.install_abort_on_error()  # a failing rank ends the whole job
        rank, nranks = dist.world_rank(), dist.world_size()
        args.no_progress = args.no_progress or rank != 0
    if args.out is None:
        args.out = os.path.join(os.getcwd(), f"digits_{args.model}.npz")
    for opt, path in (("--out", args.out), ("--dump", args.dump), ("--profile", args.profile)):
        if path is not None:
            _check_output_path(opt, path)
    try:
        xtr, ytr, xte, yte = load_digits()
    except ImportError:
        _fail("scikit-learn is needed for the digits data: pip install scikit-learn", 1)
    if args.batch * nranks > len(xtr):
        _fail(
            f"--batch {args.batch}{f' on {nranks} ranks' if nranks > 1 else ''} is larger "
            f"than the {len(xtr)} training images"
        )
    if args.profile is not None:
        return profile_steps(args.model, args.batch, args.lr, args.profile)
    progress = _progress_bar(args.no_progress)
    onehot = np.eye(10, dtype=np.float32)
    model = make_model(args.model, sync_bn=args.distributed)
    step, opt = build_train_step(
        model, optim.Adam, args.batch, lr=args.lr, distributed=args.distributed
    )
    rng = np.random.default_rng(1)  # the same permutation on every rank
    nb = len(xtr) // (args.batch * nranks)
    say = print if rank == 0 else (lambda *a, **k: None)
    t0 = time.perf_counter()
    history, step_losses = [], []
    for epoch in range(args.epochs):
        perm = rng.permutation(len(xtr))
        bar = progress(nb, f"epoch {epoch + 1}/{args.epochs}")
        tot_loss = tot_acc = 0.0
        for i in range(nb):
            at = (i * nranks + rank) * args.batch  # this rank's part of the global batch
            idx = perm[at : at + args.batch]
            loss, logits = step(xtr[idx], onehot[ytr[idx]])
            step_losses.append(float(loss[0]))
            tot_loss += step_losses[-1]
            tot_acc += nn.functional.accuracy(logits, ytr[idx])
            bar.set_postfix(
                loss=f"{tot_loss / (i + 1):.4f}", acc=f"{tot_acc / (i + 1):.3f}", refresh=False
            )
            bar.update(1)  # counted when the batch has run
        bar.close()
        history.append(tot_loss / nb)
        say(f"epoch {epoch + 1}: loss {tot_loss / nb:.4f} train acc {tot_acc / nb:.4f}")
    train_time = time.perf_counter() - t0
    samples_per_s = nb * args.batch * nranks * args.epochs / max(train_time, 1e-9)
    acc = evaluate(model, xte, yte)
    say(f"test accuracy {acc:.4f} ({train_time:.1f} s of training, "
        f"{samples_per_s:.0f} samples/s over {nranks} rank(s))")  # fmt: skip
    if rank != 0:
        args.out = f"{os.path.splitext(args.out)[0]}.rank{rank}.npz"
    nn.save_weights(model, args.out)
    say(f"weights saved to {os.path.abspath(args.out)}")
    fresh = make_model(args.model)
    nn.load_weights(fresh, args.out)
    acc2 = evaluate(fresh, xte, yte)
    say(f"reloaded from {args.out}: test accuracy {acc2:.4f}")
    if args.dump is not None and rank == 0:
        res = dump_inference(model, args.dump, args.dump_batch)
        print(f"inference graph written to {args.dump} ({res.nr_opr} operators, "
              f"{res.tot_bytes} bytes)")  # fmt: skip
    return {
        "loss_history": history,
        "step_losses": step_losses,
        "test_acc": acc,
        "reloaded_acc": acc2,
        "train_time": train_time,
        "samples_per_s": samples_per_s,
    }


if __name__ == "__main__":
    main()
