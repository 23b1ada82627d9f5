"""The ``megbrain`` command: inspect, run and draw graph files, after MegBrain's load_and_run.

A model is a MegBrain graph file or an ONNX model (``.onnx``, or any file that is not
MegBrain's and parses as one), built with ``megbrain.onnx.load`` (``run``: compiled with
``megbrain.onnx.load_inference``, its inference passes always on).

``megbrain inspect model.mge [--json]``
    Operators by type, inputs and outputs with shapes and dtypes, parameter count and bytes,
    comp nodes, for every graph of the file.
``megbrain run model.mge [options]``
    Load, compile and run the (first, or ``--graph``) graph; print per-iteration timing.
    Options: ``[--input name=file.npy ...] [--random [--seed S]] [--iters N] [--warmup K]
    [--output out.npz] [--opt-level L] [--optimize-for-inference]``.
``megbrain dot model.mge -o graph.svg``
    Draw the graph with Graphviz; without the ``dot`` program (or the ``graphviz``
    package) the DOT text is written beside the output path instead.

Exit status: 0 on success, 2 for a bad command line (unknown option, malformed or unknown
``--input``, an input given no value), 1 for a file that can not be used (missing or
corrupt model, unreadable ``.npy``, a value of the wrong shape or dtype) or a failed run.
Errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import shutil
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

import megbrain as mgb
from megbrain.graph import static_shape as graph_static_shape

__all__ = ["main", "CliError"]

PROG = "megbrain"

#: operator types whose outputs are parameters (weights) of the graph
PARAM_TYPES = frozenset(
    {"SharedDeviceTensor", "VolatileSharedDeviceTensor", "MultipleDeviceTensorHolder"}
)
#: operator types whose outputs are constants embedded in the graph
CONST_TYPES = frozenset({"ImmutableTensor"})


class CliError(Exception):
    """A user-facing failure of the command: ``str(err)`` is printed, ``status`` returned."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status


# ---- loading -------------------------------------------------------------------------------


def _open_model(path: str) -> tuple[list | None, Any]:
    """``(graphs, None)`` for a MegBrain graph file, ``(None, model)`` for an ONNX model (``.onnx``,
    or a file that is not MegBrain's and parses as one); CliError(1) for a bad file."""
    if not os.path.exists(path):
        raise CliError(f"model file not found: {path}")
    if os.path.isdir(path):
        raise CliError(f"model path is a directory: {path}")
    if path.lower().endswith(".onnx"):
        return None, _read_onnx(path)
    try:
        graphs = list(mgb.iter_comp_graphs_from_file(path))
    except mgb.MegBrainError as exc:
        model = _read_onnx(path, quiet=True)
        if model is None:
            raise CliError(f"can not load {path}: {exc}") from exc
        return None, model
    if not graphs:
        raise CliError(f"can not load {path}: the file holds no graph")
    return graphs, None


def _load_graphs(path: str, values: dict[str, str] | None = None) -> list:
    """Every graph of the file, as CompGraphLoadResults; CliError(1) for a bad file.

    See :func:`_open_model` for what a model file may be, :func:`_load_onnx` for ``values``.
    """
    graphs, model = _open_model(path)
    return graphs if model is None else [_load_onnx(path, model, values or {})]


def _read_onnx(path: str, *, quiet: bool = False):
    """The ONNX ModelProto in ``path``; None (``quiet``) or CliError when it holds none."""
    try:
        import onnx
    except ImportError as exc:
        if quiet:
            return None
        raise CliError(
            f"can not load {path}: reading ONNX models needs the onnx package "
            "(pip install 'megbrain[onnx]')"
        ) from exc
    try:
        model = onnx.load(path)
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and friends
        if quiet:
            return None
        raise CliError(f"can not load {path}: not an ONNX model: {exc}") from exc
    if not model.graph.node and not model.opset_import:
        # protobuf parses many byte strings as an empty message
        if quiet:
            return None
        raise CliError(f"can not load {path}: not an ONNX model (no graph)")
    return model


def _static_dims(vi) -> bool:
    t = vi.type.tensor_type
    return t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim)


def _build_onnx(path: str, model, values: dict[str, str], build):
    """``build(model, static_inputs=...)`` (a ``megbrain.onnx`` loader), the CLI's errors
    for a model it refuses.

    ``values`` (input name -> .npy file) gives the inputs whose shapes the model leaves open
    (a named batch dim): they are built with those values' shapes.
    """
    init = {t.name for t in model.graph.initializer}
    open_inputs = [
        vi.name for vi in model.graph.input if vi.name not in init and not _static_dims(vi)
    ]
    static = {n: _read_npy(n, values[n]) for n in open_inputs if n in values}
    try:
        return build(model, static_inputs=static)
    except mgb.MegBrainError as exc:
        hint = ""
        if any(n not in values for n in open_inputs):
            hint = (
                " (inputs of open shape: " + ", ".join(open_inputs) + "; give their values "
                "with --input NAME=FILE.npy)"
            )
        raise CliError(f"can not load ONNX model {path}: {exc}{hint}") from exc


def _load_onnx(path: str, model, values: dict[str, str]):
    """An ONNX model built into a new graph (``megbrain.onnx.load``), as a
    CompGraphLoadResult whose outputs carry the model's output names (``values``: see
    :func:`_build_onnx`)."""
    import megbrain.onnx as mgb_onnx

    res = _build_onnx(path, model, values, mgb_onnx.load)
    outputs = {}
    args = {id(v) for v in res.inputs.values()}
    for name, var in res.outputs.items():
        if var.name != name:
            var = mgb.opr.identity(var, name=name) if id(var) in args else var.rename(name)
        outputs[name] = var
    return mgb.CompGraphLoadResult(res.graph, outputs, list(outputs.values()))


def _pick_graph(graphs: list, index: int, path: str):
    if not -len(graphs) <= index < len(graphs):
        raise CliError(f"--graph {index}: {path} holds {len(graphs)} graph(s)", status=2)
    return graphs[index]


def _shape_of(var) -> tuple | None:
    """The static shape of ``var``, or None when it is not known before running."""
    # not imm_shape: that is () while unknown, and a dynamic var's last shape after a run
    shp = graph_static_shape(var.node)
    return None if shp is None else tuple(int(d) for d in shp)


def _dtype_name(dtype: Any) -> str:
    return str(getattr(dtype, "name", dtype))


def _input_vars(outputs: Sequence) -> list:
    """The graph's inputs (Host2DeviceCopy vars), sorted by name."""
    return sorted(mgb.cgtools.get_dep_vars(list(outputs), "Host2DeviceCopy"), key=lambda v: v.name)


def _all_oprs(outputs: Sequence) -> list:
    map_oprs = mgb.cgtools.graph_traversal(list(outputs))[0]
    return [map_oprs[k] for k in sorted(map_oprs)]


# ---- inspect -------------------------------------------------------------------------------


def _var_info(var) -> dict:
    shape = _shape_of(var)
    return {
        "name": var.name,
        "shape": None if shape is None else list(shape),
        "dtype": _dtype_name(var.dtype),
        "comp_node": str(var.comp_node),
    }


def describe_graph(result) -> dict:
    """A JSON-able description of one loaded graph (what ``inspect`` prints)."""
    outputs = list(result.output_vars_list)
    oprs = _all_oprs(outputs)
    by_type = collections.Counter(o.type for o in oprs)
    params = {"count": 0, "elements": 0, "bytes": 0}
    consts = {"count": 0, "elements": 0, "bytes": 0}
    comp_nodes = set()
    for o in oprs:
        for v in o.outputs:
            comp_nodes.add(str(v.comp_node))
        acc = params if o.type in PARAM_TYPES else consts if o.type in CONST_TYPES else None
        if acc is None:
            continue
        for v in o.outputs:
            shape = _shape_of(v)
            if shape is None:
                continue
            n = int(np.prod(shape, dtype=np.int64))
            acc["count"] += 1
            acc["elements"] += n
            acc["bytes"] += n * np.dtype(v.dtype).itemsize
    return {
        "nr_opr": len(oprs),
        "operators": dict(sorted(by_type.items(), key=lambda kv: (-kv[1], kv[0]))),
        "inputs": [_var_info(v) for v in _input_vars(outputs)],
        "outputs": [_var_info(v) for v in outputs],
        "params": params,
        "constants": consts,
        "comp_nodes": sorted(comp_nodes),
    }


def _fmt_shape(shape) -> str:
    if shape is None:
        return "?"
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024 or unit == "MiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def _print_description(path: str, size: int, graphs: list[dict], out) -> None:
    print(f"{path}: {size} bytes, {len(graphs)} graph(s)", file=out)
    for i, d in enumerate(graphs):
        print(f"\ngraph {i}: {d['nr_opr']} operators", file=out)
        width = max((len(t) for t in d["operators"]), default=4)
        for t, n in d["operators"].items():
            print(f"  {t:<{width}}  {n:>5}", file=out)
        for title in ("inputs", "outputs"):
            print(f"{title}:", file=out)
            if not d[title]:
                print("  (none)", file=out)
            for v in d[title]:
                print(
                    f"  {v['name']}: {_fmt_shape(v['shape'])} {v['dtype']} on {v['comp_node']}",
                    file=out,
                )
        p, c = d["params"], d["constants"]
        print(
            f"params: {p['count']} tensors, {p['elements']} elements, {_fmt_bytes(p['bytes'])}",
            file=out,
        )
        print(
            f"constants: {c['count']} tensors, {c['elements']} elements, "
            f"{_fmt_bytes(c['bytes'])}",
            file=out,
        )
        print(f"comp nodes: {', '.join(d['comp_nodes'])}", file=out)


def cmd_inspect(args) -> int:
    graphs = _load_graphs(args.model)
    desc = [describe_graph(g) for g in graphs]
    size = os.path.getsize(args.model)
    if args.json:
        json.dump({"file": args.model, "bytes": size, "graphs": desc}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_description(args.model, size, desc, sys.stdout)
    return 0


# ---- run -----------------------------------------------------------------------------------


def _parse_input_args(items: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, sep, fname = item.partition("=")
        if not sep or not name or not fname:
            raise CliError(f"--input {item!r}: expected NAME=FILE.npy", status=2)
        if name in out:
            raise CliError(f"--input {name!r} given twice", status=2)
        out[name] = fname
    return out


def _read_npy(name: str, fname: str) -> np.ndarray:
    if not os.path.exists(fname):
        raise CliError(f"--input {name}: file not found: {fname}")
    try:
        value = np.load(fname, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise CliError(f"--input {name}: can not read {fname} as .npy: {exc}") from exc
    if not isinstance(value, np.ndarray):
        raise CliError(f"--input {name}: {fname} holds an archive, not one array (.npy)")
    return value


def _random_value(var, shape: tuple, rng: np.random.Generator) -> np.ndarray:
    dt = np.dtype(var.dtype)
    if dt.kind == "f" or dt.kind == "V":
        return rng.standard_normal(shape).astype(dt)
    if dt.kind == "b":
        return rng.integers(0, 2, shape).astype(dt)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(max(info.min, 0), min(info.max, 10) + 1, shape).astype(dt)
    raise CliError(f"input {var.name!r}: can not fill dtype {dt} at random; give --input")


def _input_values(inputs: list, given: dict[str, str], random: bool, seed: int) -> list:
    names = [v.name for v in inputs]
    unknown = sorted(set(given) - set(names))
    if unknown:
        real = ", ".join(names) if names else "(the graph has no inputs)"
        raise CliError(f"unknown input name(s) {', '.join(unknown)}; the inputs are: {real}", 2)
    rng = np.random.default_rng(seed)
    values = []
    for var in inputs:
        shape = _shape_of(var)
        want_dt = np.dtype(var.dtype)
        if var.name in given:
            value = _read_npy(var.name, given[var.name])
            if shape is not None and tuple(value.shape) != shape:
                raise CliError(
                    f"--input {var.name}: {given[var.name]} has shape {_fmt_shape(value.shape)}"
                    f", the input expects {_fmt_shape(shape)}"
                )
            if value.dtype != want_dt:
                raise CliError(
                    f"--input {var.name}: {given[var.name]} has dtype {value.dtype}, the "
                    f"input expects {_dtype_name(want_dt)} (convert it with astype)"
                )
            values.append(value)
        elif shape is None:
            raise CliError(
                f"input {var.name!r} ({_dtype_name(want_dt)}) has no known shape: give its "
                f"value with --input {var.name}=FILE.npy",
                status=2,
            )
        elif random:
            try:
                values.append(_random_value(var, shape, rng))
            except MemoryError as exc:
                raise CliError(
                    f"input {var.name!r}: no memory for a random value of shape "
                    f"{_fmt_shape(shape)} {_dtype_name(want_dt)}"
                ) from exc
        else:
            raise CliError(
                f"input {var.name!r} {_fmt_shape(shape)} {_dtype_name(want_dt)} has no value: "
                f"give --input {var.name}=FILE.npy or --random",
                status=2,
            )
    return values


def _progress(iterable, total: int, desc: str, enabled: bool):
    """A tqdm bar on stderr when tqdm is installed, stderr is a terminal and ``enabled``."""
    if not enabled or not sys.stderr.isatty():
        return iterable
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, total=total, desc=desc, file=sys.stderr, leave=False)


def _timing_stats(times_s: list[float]) -> dict:
    ms = [t * 1e3 for t in times_s]
    return {
        "iters": len(ms),
        "min_ms": min(ms),
        "median_ms": statistics.median(ms),
        "mean_ms": statistics.fmean(ms),
        "max_ms": max(ms),
    }


def _graph_function(args, res) -> tuple[list, list[str], Any]:
    """A MegBrain graph compiled as the options say: ``(input vars, output names, func)``."""
    graph, outputs = res.graph, list(res.output_vars_list)
    if not outputs:
        raise CliError(f"{args.model}: the graph has no outputs")
    inputs = _input_vars(outputs)
    try:
        if args.opt_level is not None:
            graph.set_option("graph_opt_level", args.opt_level)
        func = graph.compile(
            inputs,
            [mgb.copy_output(v) for v in outputs],
            optimize_for_inference=args.optimize_for_inference,
        )
    except mgb.MegBrainError as exc:
        raise CliError(f"can not compile {args.model}: {exc}") from exc
    return inputs, [v.name for v in outputs], func


def _onnx_function(args, model, given: dict[str, str]) -> tuple[list, list[str], Any]:
    """An ONNX model compiled by ``megbrain.onnx.load_inference`` (its inference passes are
    always on, so ``--optimize-for-inference`` changes nothing): ``(input vars in the model's
    order, output names, func)``."""
    import megbrain.onnx as mgb_onnx

    graph = mgb.comp_graph()
    if args.opt_level is not None:
        graph.set_option("graph_opt_level", args.opt_level)
    f = _build_onnx(
        args.model, model, given, functools.partial(mgb_onnx.load_inference, graph=graph)
    )
    return list(f.inputs.values()), f.output_names, f


def cmd_run(args) -> int:
    if args.iters < 1:
        raise CliError(f"--iters must be >= 1, got {args.iters}", status=2)
    if args.warmup < 0:
        raise CliError(f"--warmup must be >= 0, got {args.warmup}", status=2)
    given = _parse_input_args(args.input or [])
    graphs, model = _open_model(args.model)
    if model is not None:
        inputs, names, func = _onnx_function(
            args, _pick_graph([model], args.graph, args.model), given
        )
    else:
        inputs, names, func = _graph_function(args, _pick_graph(graphs, args.graph, args.model))
    values = _input_values(inputs, given, args.random, args.seed)
    show = not args.no_progress and args.warmup + args.iters >= 20
    result = None
    times = []
    try:
        for _ in _progress(range(args.warmup), args.warmup, "warmup", show):
            func(*values)
        for _ in _progress(range(args.iters), args.iters, "run", show):
            t0 = time.perf_counter()
            result = func(*values)
            times.append(time.perf_counter() - t0)
    except (mgb.MegBrainError, MemoryError) as exc:
        raise CliError(f"running {args.model} failed: {type(exc).__name__}: {exc}") from exc
    if len(names) == 1 and not isinstance(result, (list, tuple)):
        result = [result]
    arrays = {n: np.asarray(r) for n, r in zip(_unique_names(names), result)}
    stats = _timing_stats(times)
    print(f"{args.model}: {len(inputs)} input(s), {len(names)} output(s)")
    for n, a in arrays.items():
        print(f"  {n}: {_fmt_shape(a.shape)} {a.dtype}")
    print(
        f"time per iteration over {stats['iters']} iteration(s) ({args.warmup} warm-up): "
        f"min {stats['min_ms']:.3f} ms, median {stats['median_ms']:.3f} ms, "
        f"mean {stats['mean_ms']:.3f} ms, max {stats['max_ms']:.3f} ms"
    )
    if args.output:
        try:
            np.savez(args.output, **arrays)
        except OSError as exc:
            raise CliError(f"can not write {args.output}: {exc}") from exc
        print(f"outputs written to {args.output}")
    return 0


def _unique_names(names: list[str]) -> list[str]:
    seen: collections.Counter = collections.Counter()
    out = []
    for n in names:
        n = n or "output"
        seen[n] += 1
        out.append(n if seen[n] == 1 else f"{n}_{seen[n] - 1}")
    return out


# ---- dot -----------------------------------------------------------------------------------


def _dot_quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def graph_to_dot(result, name: str = "megbrain") -> str:
    """The DOT text of one loaded graph: one node per operator, one edge per var read."""
    outputs = list(result.output_vars_list)
    oprs = _all_oprs(outputs)
    lines = [f"digraph {_dot_quote(name)} {{", "  node [shape=box, fontsize=10];"]
    for o in oprs:
        style = ""
        if o.type == "Host2DeviceCopy":
            style = ", style=filled, fillcolor=lightblue"
        elif o.type in PARAM_TYPES:
            style = ", style=filled, fillcolor=lightyellow"
        elif o.type in CONST_TYPES:
            style = ", style=filled, fillcolor=gray90"
        label = _dot_quote(o.name + "\n" + o.type)
        lines.append(f"  o{o.id} [label={label}{style}];")
    for o in oprs:
        for v in o.inputs:
            src = v.owner_opr.id
            label = f"{_fmt_shape(_shape_of(v))} {_dtype_name(v.dtype)}"
            lines.append(f"  o{src} -> o{o.id} [label={_dot_quote(label)}, fontsize=8];")
    for v in {v.id: v for v in outputs}.values():
        lines.append(f"  out{v.id} [label={_dot_quote(v.name)}, shape=ellipse];")
        lines.append(f"  o{v.owner_opr.id} -> out{v.id};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def cmd_dot(args) -> int:
    res = _pick_graph(_load_graphs(args.model), args.graph, args.model)
    text = graph_to_dot(res, os.path.basename(args.model))
    target = args.output
    stem, ext = os.path.splitext(target)
    fmt = ext[1:].lower()
    dot_path = target if fmt in ("dot", "gv") else stem + ".dot"
    try:
        import graphviz
    except ImportError:
        graphviz = None
    if fmt in ("dot", "gv"):
        _write_text(dot_path, text)
        print(f"DOT text written to {dot_path}")
        return 0
    if graphviz is None:
        _write_text(dot_path, text)
        print(
            f"{PROG}: the graphviz package is not installed (pip install 'megbrain[graphviz]'):"
            f" wrote the DOT text to {dot_path} instead of {target}",
            file=sys.stderr,
        )
        return 0
    if shutil.which("dot") is None:
        src = graphviz.Source(text)
        _write_text(dot_path, src.source)
        print(
            f"{PROG}: the Graphviz 'dot' program is not installed: wrote the DOT text to "
            f"{dot_path} instead of {target} (render it with: dot -T{fmt} {dot_path} -o "
            f"{target})",
            file=sys.stderr,
        )
        return 0
    try:
        data = graphviz.Source(text).pipe(format=fmt)
    except (graphviz.ExecutableNotFound, graphviz.CalledProcessError, ValueError) as exc:
        raise CliError(f"dot could not draw {target}: {exc}") from exc
    try:
        with open(target, "wb") as f:
            f.write(data)
    except OSError as exc:
        raise CliError(f"can not write {target}: {exc}") from exc
    print(f"graph drawn to {target}")
    return 0


def _write_text(path: str, text: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as exc:
        raise CliError(f"can not write {path}: {exc}") from exc


# ---- entry point ---------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``megbrain`` command."""
    ap = argparse.ArgumentParser(
        prog=PROG,
        description="Inspect, run and draw graph files written by "
        "megbrain.serialize_comp_graph_to_file.",
    )
    ap.add_argument("--version", action="version", version=f"{PROG} {mgb.__version__}")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name, func, help):
        p = sub.add_parser(name, help=help)
        p.add_argument("model", help="graph file")
        p.set_defaults(func=func)
        return p

    def which_graph(p):
        p.add_argument("--graph", type=int, default=0, help="which graph of the file (default 0)")

    p = command("inspect", cmd_inspect, "operators, inputs, outputs, params and comp nodes")
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = command("run", cmd_run, "load, compile and run a graph, with timing")
    p.add_argument(
        "--input",
        action="append",
        metavar="NAME=FILE.npy",
        help="the value of an input (repeat for several inputs)",
    )
    p.add_argument(
        "--random", action="store_true", help="fill inputs not given from their shapes/dtypes"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of --random (default 0)")
    p.add_argument("--iters", type=int, default=10, help="timed iterations (default 10)")
    p.add_argument("--warmup", type=int, default=1, help="untimed iterations first (default 1)")
    p.add_argument("--output", metavar="OUT.npz", help="save the last iteration's outputs")
    p.add_argument("--opt-level", type=int, default=None, help="graph_opt_level option")
    p.add_argument(
        "--optimize-for-inference",
        action="store_true",
        help="apply optimize_for_inference before compiling",
    )
    which_graph(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")

    p = command("dot", cmd_dot, "draw the graph with Graphviz")
    p.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="PATH",
        help="drawing to write (its suffix is the format: .svg, .png, .pdf; .dot for text)",
    )
    which_graph(p)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``megbrain`` command; returns the exit status (also for ``sys.exit``).

    Parameters
    ----------
    argv:
        The arguments after the program name; ``sys.argv[1:]`` when None.

    Returns
    -------
    int
        0 on success, 1 for a file that can not be used or a failed run, 2 for a bad
        command line.
    """
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        return args.func(args)
    except CliError as exc:
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return exc.status
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader of stdout went away (``megbrain inspect m.mge | head``): stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
