"""A differential tester: random operator graphs run under every graph configuration.

A graph is generated from a seed (:func:`generate`) as a list of :class:`Node` s, each one
operator of a family (elementwise unary/binary with broadcasting, reductions, reshape,
broadcast, dimshuffle, add/remove axis, concat, subtensor, set/incr_subtensor, matrix_mul,
batched_matrix_mul, convolution, pooling, indexing_one_hot, typecvt, argsort/top_k values,
cumsum). Its NumPy reference (float64) is computed alongside the construction, which also
uses it to keep every operator inside its domain (no log of negatives, no huge values).

The description renders as the ``mgb`` code that builds it (:meth:`GraphDesc.program`): the
tester executes exactly that code, so a failure report is a runnable program.

:func:`check_desc` runs the graph, forward and the gradients of a scalar loss (the sum of the
outputs times fixed random weights), under each of :data:`CONFIGS` and compares

* every configuration with ``graph_opt_level=0`` (forward ``FWD_RTOL``/``FWD_ATOL``,
  gradients ``GRAD_RTOL``/``GRAD_ATOL``, both scaled by the graph's largest value) and with
  the NumPy reference (``REF_RTOL``/``REF_ATOL``); a second run must repeat the first
  exactly, and eager graphs' values at insertion must equal their compiled results;
* the same graph built in float64 below the API (``opr_harness``) with the NumPy reference,
  and its gradients with central finite differences (``opr_harness.check_grad``, rtol
  ``FD_RTOL``) when no non-smooth operator (relu, max, sort, ...) is within ``KINK_MARGIN``
  of a kink; the float32 gradients of ``graph_opt_level=0`` with those float64 gradients.

:func:`minimize` reduces a failing graph: it keeps one output's cone, then replaces operators
by inputs holding their reference values while the failure remains. :func:`campaign` runs
seeds for a time budget. ``python tests/fuzz/graph_fuzzer.py --help`` runs seeds by hand.

Tolerances: float32 results of different configurations differ by rounding only where the
optimizer reorders arithmetic or JIT fusion uses its vectorizable exp/log/tanh/erf/sigmoid
(a few ulp), hence rtol 1e-5 rather than exact equality; absolute tolerances are scaled by
the largest magnitude in the graph, where cancellation makes small results inexact. Float32
gradients through a float16 round trip are float16-rounded (TypeCvt's gradient is a TypeCvt),
so they match the float64 gradients to float16 accuracy only; so do the two-comp-node
configurations' gradients through float16 round trips, whose identical operators on different
comp nodes are not merged (each rounds its own part of the gradient).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

import megbrain as mgb

if __package__ in (None, ""):  # run as a script: the operator harness is in ../opr
    import os

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "opr"))

from opr_harness import check_grad, make_graph
from opr_harness import inputs as harness_inputs
from opr_harness import run as harness_run

__all__ = [
    "BASELINE",
    "CONFIGS",
    "Config",
    "GraphDesc",
    "Mismatch",
    "Node",
    "campaign",
    "check_desc",
    "generate",
    "minimize",
    "run_config",
]

# ---- tolerances and limits ----------------------------------------------------------------
FWD_RTOL, FWD_ATOL = 1e-5, 1e-6  # float32 forward, configuration vs graph_opt_level=0
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-5  # float32 gradients, configuration vs graph_opt_level=0
REF_RTOL, REF_ATOL = 1e-4, 1e-4  # float32 graph vs the float64 NumPy reference
F64_RTOL, F64_ATOL = 1e-9, 1e-9  # float64 graph vs the float64 NumPy reference
FD_RTOL = 1e-4  # float64 gradients vs central finite differences (check_grad)
F64_GRAD_RTOL, F64_GRAD_ATOL = 1e-3, 1e-4  # float32 gradients vs float64 gradients
# TypeCvt's gradient rounds to float16 in float32 graphs (the float64 graph models the round
# trip as an offset): float16 accuracy, relative to the gradient's scale
F16_GRAD_TOL = 4e-3
KINK_MARGIN = 1e-3  # finite differences only this far from every non-smooth point
MAX_ABS = 64.0  # operators whose reference exceeds this are not generated
MAX_SIZE = 256  # nor those with more elements
DYNAMIC_INPUTS = 0.1  # share of runtime inputs without static inference (dynamic shapes)
FD_ELEMENTS = 64  # input elements perturbed by the finite-difference check


# ---- configurations -----------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    """Graph options, and whether the graph is spread over cpu0 and cpu1."""

    options: dict
    two_cn: bool = False


BASELINE = "opt0"
CONFIGS: dict[str, Config] = {
    "opt0": Config({"graph_opt_level": 0}),
    "opt1": Config({"graph_opt_level": 1}),
    "opt2": Config({"graph_opt_level": 2}),
    "opt-2": Config({"graph_opt_level": -2}),
    "opt3": Config({"graph_opt_level": 3}),
    "jit1": Config({"graph_opt.jit": 1}),
    "jit2": Config({"graph_opt.jit": 2}),
    "eager": Config({"eager_evaluation": 1}),
    "no_mem_plan_opt": Config({"seq_opt.enable_mem_plan_opt": 0}),
    "no_mem_reuse": Config({"seq_opt.enable_mem_reuse_alloc": 0}),
    "force_dynamic": Config({"force_dynamic_alloc": 1}),
    "sublinear": Config({"enable_sublinear_memory_opt": 1}),
    "2cn_sync": Config({"async_exec_level": 0}, two_cn=True),
    "2cn_async": Config({"async_exec_level": 1}, two_cn=True),
    "2cn_async_always": Config({"async_exec_level": 0b100}, two_cn=True),
}


# ---- graph descriptions -------------------------------------------------------------------
@dataclass
class Node:
    """One operator (or input) of a generated graph.

    ``args`` index earlier nodes; ``cn`` is the comp node (0 or 1) the node runs on in the
    two-comp-node configurations, reached by copying its inputs there (``place="copy"``) or
    by the operator's ``comp_node=`` (``place="kw"``).
    """

    op: str
    args: tuple[int, ...] = ()
    attrs: dict = field(default_factory=dict)
    cn: int = 0
    place: str = "copy"


@dataclass
class GraphDesc:
    """A generated graph: nodes, the outputs, the loss weights and the NumPy reference."""

    seed: int
    nodes: list[Node]
    outputs: list[int]
    weights: list[np.ndarray]
    values: list[np.ndarray] = field(default_factory=list)
    margins: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.values:
            self.values, self.margins = ref_eval(self.nodes)

    @property
    def float_inputs(self) -> list[int]:
        return [i for i, n in enumerate(self.nodes) if n.op == "input"]

    @property
    def n_ops(self) -> int:
        return sum(n.op not in ("input", "index") for n in self.nodes)

    @property
    def margin(self) -> float:
        """The smallest distance of a non-smooth operator's input from its kink."""
        return min(self.margins, default=math.inf)

    @property
    def scale(self) -> float:
        """The largest magnitude of a float value in the graph (at least 1)."""
        vals = [np.abs(v).max() for v, n in zip(self.values, self.nodes) if n.op != "index"]
        return max([1.0, *vals])

    def data(self) -> dict:
        """The input arrays by var name."""
        return {f"v{i}": n.attrs["value"] for i, n in enumerate(self.nodes) if "value" in n.attrs}

    def feed(self) -> dict:
        """The runtime inputs (``make_arg`` vars) by name."""
        return {
            f"v{i}": n.attrs["value"]
            for i, n in enumerate(self.nodes)
            if n.attrs.get("kind") == "arg"
        }

    def changed_data(self) -> dict:
        """Other values for the inputs: floats moved by up to 1%, new runtime indices."""
        rng = np.random.default_rng([self.seed, 1])
        out = {}
        for i, n in enumerate(self.nodes):
            v = n.attrs.get("value")
            if n.op == "input":
                out[f"v{i}"] = (v * (1 + 0.01 * rng.uniform(-1, 1, v.shape))).astype(np.float32)
            elif n.op == "index" and n.attrs["kind"] == "arg":
                out[f"v{i}"] = rng.integers(0, n.attrs["high"], v.shape).astype(np.int32)
        return out

    def changed_values(self) -> list[np.ndarray]:
        """The reference values over :meth:`changed_data`."""
        data = self.changed_data()
        nodes = [
            Node(n.op, n.args, {**n.attrs, "value": data[f"v{i}"]}, n.cn, n.place)
            if f"v{i}" in data
            else n
            for i, n in enumerate(self.nodes)
        ]
        with np.errstate(all="ignore"):
            return ref_eval(nodes)[0]

    def offsets(self) -> dict[int, np.ndarray]:
        """Per typecvt round trip: float16(x) - x at the reference point (float64 builds)."""
        return {
            i: self.values[i] - self.values[n.args[0]]
            for i, n in enumerate(self.nodes)
            if n.op == "f16"
        }

    def program(self, mode: str = "f32", two_cn: bool = False, eager: bool = False) -> str:
        """The ``mgb`` code building the graph and ``loss`` into a graph ``g``.

        It reads the names ``mgb``, ``np``, ``g``, ``X`` (input arrays), ``W`` (the loss
        weights), ``DT`` (the float dtype) and, in ``mode="f64"``, ``OFF``
        (:meth:`offsets`); in that mode the float inputs ``v<i>`` are bound beforehand.
        """
        lines = []
        for i, node in enumerate(self.nodes):
            if mode == "f64" and node.op == "input":
                continue
            lines.append(f"v{i} = {_node_code(self, i, mode, two_cn, eager)}")
        terms = []
        for j, o in enumerate(self.outputs):
            cn = self.nodes[o].cn if two_cn else 0
            lines.append(f'w{j} = mgb.make_immutable("cpu{cn}", g, W[{j}], dtype=DT)')
            lines.append(f'loss{j} = mgb.opr.reduce_(v{o} * w{j}, "SUM")')
            if cn:
                lines.append(f'loss{j} = mgb.opr.copy(loss{j}, comp_node="cpu0")')
            terms.append(f"loss{j}")
        lines.append("loss = " + " + ".join(terms))
        return "\n".join(lines)

    def describe(self) -> str:
        """The seed, sizes and the program (two comp nodes: the placement as comments)."""
        head = (
            f"# seed {self.seed}: {self.n_ops} operators, outputs "
            + ", ".join(f"v{o}" for o in self.outputs)
            + ", inputs "
            + ", ".join(f"v{i}{tuple(self.values[i].shape)}" for i in self.float_inputs)
        )
        body = []
        for line, node in zip(self.program().splitlines(), self.nodes):
            body.append(f"{line}  # cpu{node.cn}" + (" kw" if node.place == "kw" else ""))
        return "\n".join([head, *body, *self.program().splitlines()[len(self.nodes) :]])


def _restrict(nodes: list[Node], outputs: list[int]) -> tuple[list[Node], list[int]]:
    """The nodes the outputs depend on, renumbered."""
    keep: set[int] = set()
    stack = list(outputs)
    while stack:
        i = stack.pop()
        if i not in keep:
            keep.add(i)
            stack.extend(nodes[i].args)
    order = sorted(keep)
    new = {old: k for k, old in enumerate(order)}
    out = []
    for old in order:
        n = nodes[old]
        out.append(Node(n.op, tuple(new[a] for a in n.args), dict(n.attrs), n.cn, n.place))
    return out, [new[o] for o in outputs]


# ---- NumPy reference ------------------------------------------------------------------------
def _as1(a) -> np.ndarray:
    """MegBrain has no 0-d vars: a scalar result has shape (1,)."""
    a = np.asarray(a)
    return a.reshape(1) if a.ndim == 0 else a


def _gap(x: np.ndarray, axes: tuple[int, ...] | None, largest: bool) -> float:
    """The smallest gap between the extreme and the runner-up over ``axes`` (ties: 0)."""
    if axes is None:
        rows = x.reshape(1, -1)
    else:
        rest = [a for a in range(x.ndim) if a not in axes]
        rows = np.transpose(x, rest + list(axes)).reshape(-1, math.prod(x.shape[a] for a in axes))
    if rows.shape[1] < 2:
        return math.inf
    s = np.sort(rows, axis=1)
    g = s[:, -1] - s[:, -2] if largest else s[:, 1] - s[:, 0]
    return float(g.min())


def _sorted_gap(x: np.ndarray) -> float:
    """The smallest gap between neighbours of each sorted row (ties make sorting non-smooth)."""
    if x.shape[1] < 2:
        return math.inf
    return float(np.diff(np.sort(x, axis=1), axis=1).min())


_erf = np.vectorize(math.erf, otypes=[np.float64])

UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "RELU": lambda x: np.maximum(x, 0),
    "ABS": np.abs,
    "NEGATE": np.negative,
    "TANH": np.tanh,
    "SIGMOID": lambda x: 1 / (1 + np.exp(-x)),
    "SIN": np.sin,
    "COS": np.cos,
    "ERF": _erf,
    "EXP": np.exp,
    "EXPM1": np.expm1,
    "LOG": np.log,
    "LOG1P": np.log1p,
}
UNARY_DOMAIN: dict[str, Callable[[np.ndarray], bool]] = {
    "EXP": lambda x: x.max() <= 4,
    "EXPM1": lambda x: x.max() <= 4,
    "LOG": lambda x: x.min() >= 0.2,
    "LOG1P": lambda x: x.min() >= -0.8,
}
KINKED_UNARY = {"RELU", "ABS"}
EXACT_UNARY = {"RELU", "ABS", "NEGATE"}  # float32 results equal the float64 reference

BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "ADD": np.add,
    "SUB": np.subtract,
    "MUL": np.multiply,
    "TRUE_DIV": np.divide,
    "MAX": np.maximum,
    "MIN": np.minimum,
    "POW": np.power,
}
BINARY_CONSTS = {
    "ADD": [-1.5, -0.5, 0.25, 1.0, 2.0],
    "SUB": [-1.0, 0.5, 1.5],
    "MUL": [-2.0, -0.5, 0.25, 1.5, 3.0],
    "TRUE_DIV": [-2.0, 0.5, 1.5, 4.0],
    "MAX": [-0.5, 0.0, 0.75],
    "MIN": [-0.25, 0.0, 1.0],
    "POW": [-1.0, 0.5, 2.0, 3.0],
}


def _binary_ok(mode: str, a: np.ndarray, b: np.ndarray) -> bool:
    if mode == "TRUE_DIV":
        return bool(np.abs(b).min() >= 0.3)
    if mode == "POW":
        return bool(np.min(a) >= 0.2 and np.abs(b).max() <= 3)
    return True


REDUCE: dict[str, Callable] = {
    "SUM": np.sum,
    "MEAN": np.mean,
    "MAX": np.max,
    "MIN": np.min,
    "PRODUCT": np.prod,
    "SUM_SQR": lambda x, axis=None, keepdims=False: np.sum(x * x, axis=axis, keepdims=keepdims),
}


def _py_index(index: tuple) -> tuple:
    return tuple(slice(*it[1:]) if it[0] == "s" else it[1] for it in index)


def _conv(x: np.ndarray, w: np.ndarray, ph: int, pw: int, sh: int, sw: int) -> np.ndarray:
    n, _, h, wd = x.shape
    oc, _, fh, fw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh, ow = (h + 2 * ph - fh) // sh + 1, (wd + 2 * pw - fw) // sw + 1
    out = np.zeros((n, oc, oh, ow))
    for i in range(oh):
        for j in range(ow):
            patch = xp[:, :, i * sh : i * sh + fh, j * sw : j * sw + fw]
            out[:, :, i, j] = np.tensordot(patch, w, axes=([1, 2, 3], [1, 2, 3]))
    return out


def _pool(x: np.ndarray, a: dict) -> tuple[np.ndarray, float]:
    mode, (wh, ww), (sh, sw), (ph, pw) = a["mode"], a["window"], a["stride"], a["pad"]
    n, c, h, wd = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=np.nan)
    oh, ow = (h + 2 * ph - wh) // sh + 1, (wd + 2 * pw - ww) // sw + 1
    out = np.zeros((n, c, oh, ow))
    margin = math.inf
    for i in range(oh):
        for j in range(ow):
            win = xp[:, :, i * sh : i * sh + wh, j * sw : j * sw + ww].reshape(n, c, -1)
            valid = ~np.isnan(win)
            total = np.where(valid, win, 0).sum(-1)
            if mode == "MAX":
                out[:, :, i, j] = np.nanmax(win, -1)
                if valid[0, 0].sum() >= 2:  # every (n, c) has the same pattern
                    s = np.sort(win[valid].reshape(n, c, -1), -1)
                    margin = min(margin, float((s[..., -1] - s[..., -2]).min()))
            elif mode == "AVERAGE":
                out[:, :, i, j] = total / (wh * ww)
            else:
                out[:, :, i, j] = total / valid.sum(-1)
    return out, margin


def _ref_node(node: Node, ins: list[np.ndarray]) -> tuple[np.ndarray, float]:
    """The float64 value of ``node`` over ``ins``, and its distance from a kink."""
    a, op = node.attrs, node.op
    x = ins[0] if ins else None
    inf = math.inf
    if op == "unary":
        m = a["mode"]
        return UNARY[m](x), float(np.abs(x).min()) if m in KINKED_UNARY else inf
    if op == "binary":
        args = list(ins)
        if "const" in a:
            args.insert(a["const_pos"], np.float64(a["const"]))
        p, q = args
        margin = float(np.abs(p - q).min()) if a["mode"] in ("MAX", "MIN") else inf
        return np.asarray(BINARY[a["mode"]](p, q), np.float64), margin
    if op == "reduce":
        mode, axis, keep = a["mode"], a["axis"], a["keepdims"]
        if axis is None:
            axes, out = None, REDUCE[mode](x).reshape(1)
        else:
            axis = axis if isinstance(axis, list) else [axis]
            axes = tuple(sorted({ax % x.ndim for ax in axis}))
            out = _as1(REDUCE[mode](x, axis=axes, keepdims=keep))
        margin = _gap(x, axes, mode == "MAX") if mode in ("MAX", "MIN") else inf
        return out, margin
    if op == "reshape":
        return x.reshape(a["shape"]), inf
    if op == "broadcast":
        shape = ins[1].shape if "like" in a else a["shape"]
        return np.broadcast_to(x, shape).copy(), inf
    if op == "dimshuffle":
        pat = a["pattern"]
        kept = sorted(p for p in pat if p != "x")
        y = x.reshape([x.shape[k] for k in kept])
        y = y.transpose([kept.index(p) for p in pat if p != "x"])
        return y.reshape([1 if p == "x" else x.shape[p] for p in pat]), inf
    if op == "add_axis":
        return np.expand_dims(x, a["axis"]), inf
    if op == "remove_axis":
        return _as1(np.squeeze(x, a["axis"])), inf
    if op == "concat":
        return np.concatenate(ins, axis=a["axis"]), inf
    if op == "subtensor":
        return _as1(x[_py_index(a["index"])]).copy(), inf
    if op in ("set_subtensor", "incr_subtensor"):
        y, idx = x.copy(), _py_index(a["index"])
        v = ins[1].reshape(np.shape(y[idx]))
        if op == "set_subtensor":
            y[idx] = v
        else:
            y[idx] += v
        return y, inf
    if op in ("matmul", "batched_matmul"):
        p, q = ins
        if a["ta"]:
            p = np.swapaxes(p, -1, -2)
        if a["tb"]:
            q = np.swapaxes(q, -1, -2)
        return np.matmul(p, q), inf
    if op == "conv":
        return _conv(x, ins[1], *a["pad"], *a["stride"]), inf
    if op == "pooling":
        return _pool(x, a)
    if op == "one_hot":
        ax = a["axis"] % x.ndim
        idx = np.expand_dims(ins[1].astype(np.int64), ax)
        y = np.take_along_axis(x, idx, ax)
        return (y if a["keepdims"] else _as1(np.squeeze(y, ax))), inf
    if op == "f16":
        return x.astype(np.float16).astype(np.float64), inf
    if op == "argsort":
        s = np.sort(x, axis=1)
        return (s if a["order"] == "ASCENDING" else s[:, ::-1].copy()), _sorted_gap(x)
    if op == "top_k":
        k = a["k"]
        s = np.sort(x, axis=1) if k > 0 else np.sort(x, axis=1)[:, ::-1]
        out = s[:, abs(k) - 1] if a["mode"] == "KTH_ONLY" else s[:, : abs(k)]
        return out.copy(), _sorted_gap(x)
    if op == "cumsum":
        ax = a["axis"]
        y = np.flip(x, ax) if a["reverse"] else x
        c = np.cumsum(y, axis=ax)
        if a["exclusive"]:
            c = c - y
        return (np.flip(c, ax) if a["reverse"] else c).copy(), inf
    raise ValueError(f"unknown operator {op!r}")


def ref_eval(nodes: list[Node]) -> tuple[list[np.ndarray], list[float]]:
    """The reference value of every node and the kink margin of every operator."""
    values: list[np.ndarray] = []
    margins: list[float] = []
    for node in nodes:
        if node.op == "input":
            values.append(node.attrs["value"].astype(np.float64))
        elif node.op == "index":
            values.append(node.attrs["value"])
        else:
            v, m = _ref_node(node, [values[i] for i in node.args])
            values.append(np.asarray(v, np.float64))
            margins.append(m)
    return values, margins


# ---- code of each operator ------------------------------------------------------------------
_NO_KW = {"subtensor"}  # ``x[idx]`` takes no comp_node=


def _index_code(index: tuple) -> str:
    parts = []
    for it in index:
        if it[0] == "i":
            parts.append(str(it[1]))
        else:
            start, stop, step = (("" if v is None else str(v)) for v in it[1:])
            parts.append(f"{start}:{stop}" + (f":{step}" if step else ""))
    return ", ".join(parts)


def _node_code(desc: GraphDesc, i: int, mode: str, two_cn: bool, eager: bool) -> str:
    node = desc.nodes[i]
    a, op = node.attrs, node.op
    cn = f"cpu{node.cn if two_cn else 0}"
    if op == "input":
        if a["kind"] == "shared":
            return f'mgb.make_shared("{cn}", value=X["v{i}"], comp_graph=g, name="v{i}")'
        value = ', value=X["v' + str(i) + '"]' if a["preset"] or eager else ""
        if not a.get("static", True):
            value += ", enable_static_infer=False"
        shape = tuple(a["value"].shape)
        return f'mgb.make_arg("{cn}", g, shape={shape}, dtype=np.float32, name="v{i}"{value})'
    if op == "index":
        if a["kind"] == "const" or mode == "f64":
            return f'mgb.make_immutable("{cn}", g, X["v{i}"], dtype=np.int32)'
        shape = tuple(a["value"].shape)
        value = ', value=X["v' + str(i) + '"]' if eager else ""
        return f'mgb.make_arg("{cn}", g, shape={shape}, dtype=np.int32, name="v{i}"{value})'
    kw, args = "", []
    use_kw = two_cn and node.place == "kw" and op not in _NO_KW
    for j in node.args:
        s = f"v{j}"
        if two_cn and not use_kw and desc.nodes[j].cn != node.cn:
            s = f'mgb.opr.copy({s}, comp_node="{cn}")'
        args.append(s)
    if use_kw:
        kw = f', comp_node="{cn}"'
    x = args[0]
    if op == "unary":
        return f'mgb.opr.elemwise({x}, mode="{a["mode"]}"{kw})'
    if op == "binary":
        if "const" in a:
            args.insert(a["const_pos"], repr(a["const"]))
        return f'mgb.opr.elemwise({args[0]}, {args[1]}, mode="{a["mode"]}"{kw})'
    if op == "reduce":
        return f'mgb.opr.reduce_({x}, "{a["mode"]}", {a["axis"]!r}, {a["keepdims"]}{kw})'
    if op == "reshape":
        return f"mgb.opr.reshape({x}, {a['shape']!r}{kw})"
    if op == "broadcast":
        target = f"mgb.opr.get_var_shape({args[1]})" if "like" in a else repr(a["shape"])
        return f"mgb.opr.broadcast({x}, {target}{kw})"
    if op == "dimshuffle":
        return f"mgb.opr.dimshuffle({x}, {a['pattern']!r}, {a['ndim']}{kw})"
    if op in ("add_axis", "remove_axis"):
        return f"mgb.opr.{op}({x}, {a['axis']!r}{kw})"
    if op == "concat":
        return f"mgb.opr.concat([{', '.join(args)}], axis={a['axis']}{kw})"
    if op == "subtensor":
        return f"{x}[{_index_code(a['index'])}]"
    if op in ("set_subtensor", "incr_subtensor"):
        return f"mgb.opr.{op}({x}, {args[1]}{kw})[{_index_code(a['index'])}]"
    if op in ("matmul", "batched_matmul"):
        fn = "matrix_mul" if op == "matmul" else "batched_matrix_mul"
        return f"mgb.opr.{fn}({x}, {args[1]}, transposeA={a['ta']}, transposeB={a['tb']}{kw})"
    if op == "conv":
        (ph, pw), (sh, sw) = a["pad"], a["stride"]
        return (
            f"mgb.opr.convolution({x}, {args[1]}, pad_h={ph}, pad_w={pw}, stride_h={sh}, "
            f"stride_w={sw}{kw})"
        )
    if op == "pooling":
        (wh, ww), (sh, sw), (ph, pw) = a["window"], a["stride"], a["pad"]
        return (
            f'mgb.opr.pooling({x}, mode="{a["mode"]}", window_h={wh}, window_w={ww}, '
            f"stride_h={sh}, stride_w={sw}, pad_h={ph}, pad_w={pw}{kw})"
        )
    if op == "one_hot":
        keep = a["keepdims"]
        return f"mgb.opr.indexing_one_hot({x}, {a['axis']}, {args[1]}, keepdims={keep}{kw})"
    if op == "f16":
        if mode == "f64":  # the rounding as a constant offset: identity gradient, like TypeCvt's
            return f'{x} + mgb.make_immutable("cpu0", g, OFF[{i}], dtype=DT)'
        return f"mgb.opr.typecvt(mgb.opr.typecvt({x}, np.float16{kw}), np.float32{kw})"
    if op == "argsort":
        return f'mgb.opr.argsort({x}, "{a["order"]}"{kw})[0]'
    if op == "top_k":
        return f'mgb.opr.top_k({x}, {a["k"]}, "{a["mode"]}"{kw})[0]'
    if op == "cumsum":
        return (
            f"mgb.opr.cumsum({x}, {a['axis']}, exclusive={a['exclusive']}, "
            f"reverse={a['reverse']}{kw})"
        )
    raise ValueError(f"unknown operator {op!r}")


# ---- generation -------------------------------------------------------------------------------
def _factor(size: int, nd: int, rng: np.random.Generator) -> tuple[int, ...]:
    """A random shape of ``nd`` dims with ``size`` elements."""
    dims = [1] * nd
    n, p = size, 2
    while n > 1:
        while n % p:
            p += 1
        dims[int(rng.integers(nd))] *= p
        n //= p
    return tuple(dims)


def _rand_shape(rng: np.random.Generator, max_size: int = 48) -> tuple[int, ...]:
    while True:
        shape = tuple(int(d) for d in rng.integers(1, 6, size=int(rng.integers(1, 5))))
        if math.prod(shape) <= max_size:
            return shape


class _Gen:
    """Builds a node list with the reference values alongside."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[Node] = []
        self.vals: list[np.ndarray] = []
        self.exact: list[bool] = []
        self.used: set[int] = set()
        self.cn = 0
        self.n_ops = 0

    def _append(self, node: Node, val: np.ndarray, exact: bool) -> int:
        self.nodes.append(node)
        self.vals.append(val)
        self.exact.append(exact)
        self.used.update(node.args)
        return len(self.nodes) - 1

    def new_input(self, shape, low: float = -2.0, high: float = 2.0) -> int:
        rng = self.rng
        val = rng.uniform(low, high, shape).astype(np.float32)
        attrs = {"kind": "shared" if rng.random() < 0.3 else "arg", "value": val}
        attrs["preset"] = bool(rng.random() < 0.3)
        attrs["static"] = attrs["kind"] == "shared" or bool(rng.random() >= DYNAMIC_INPUTS)
        return self._append(Node("input", (), attrs, cn=self.cn), val.astype(np.float64), True)

    def new_index(self, shape, high: int) -> int:
        val = self.rng.integers(0, high, shape).astype(np.int32)
        attrs = {"kind": "const" if self.rng.random() < 0.5 else "arg", "value": val, "high": high}
        return self._append(Node("index", (), attrs, cn=self.cn), val, True)

    def op(self, op: str, args: Iterable[int], attrs: dict, exact: bool = False) -> int | None:
        """Add the operator if its reference is finite, moderate and small; else None."""
        rng = self.rng
        if rng.random() < 0.25:
            self.cn = 1 - self.cn
        node = Node(op, tuple(args), attrs, self.cn, "kw" if rng.random() < 0.5 else "copy")
        try:
            with np.errstate(all="ignore"):
                val, _ = _ref_node(node, [self.vals[a] for a in node.args])
        except (ValueError, IndexError):
            return None
        val = np.asarray(val, np.float64)
        if not (0 < val.size <= MAX_SIZE) or not np.isfinite(val).all():
            return None
        if np.abs(val).max() > MAX_ABS:
            return None
        floats = [a for a in node.args if self.nodes[a].op != "index"]
        exact = exact and all(self.exact[a] for a in floats)
        self.n_ops += 1
        return self._append(node, val, exact)

    def floats(self) -> list[int]:
        return [i for i, n in enumerate(self.nodes) if n.op != "index"]

    def pick(self, pred: Callable[[np.ndarray], bool] | None = None, exact: bool = False):
        """A float value (recent and unused ones preferred), or None."""
        cands = [
            i
            for i in self.floats()
            if (pred is None or pred(self.vals[i])) and (not exact or self.exact[i])
        ]
        if not cands:
            return None
        w = np.array([(1 + i) * (3 if i not in self.used else 1) for i in cands], np.float64)
        return cands[int(self.rng.choice(len(cands), p=w / w.sum()))]

    def with_ndim(self, nd: int) -> int | None:
        """A value of ``nd`` dims: an existing one, a reshape of one, or a new input."""
        i = self.pick(lambda v: v.ndim == nd) if self.rng.random() < 0.7 else None
        if i is not None:
            return i
        j = self.pick()
        if j is not None and self.rng.random() < 0.6:
            shape = _factor(self.vals[j].size, nd, self.rng)
            r = self.op("reshape", [j], {"shape": shape}, exact=True)
            if r is not None:
                return r
        while True:
            shape = tuple(int(d) for d in self.rng.integers(1, 5, size=nd))
            if math.prod(shape) <= 64:
                return self.new_input(shape)

    def operand(self, shape: tuple[int, ...], low: float = -2.0, high: float = 2.0) -> int:
        """An existing value of ``shape`` (sometimes) or a new input."""
        if self.rng.random() < 0.4:
            j = self.pick(lambda v: v.shape == tuple(shape))
            if j is not None:
                return j
        return self.new_input(shape, low, high)


def _gen_unary(G: _Gen) -> None:
    i = G.pick()
    if i is None:
        return
    x = G.vals[i]
    modes = [m for m in UNARY if m not in UNARY_DOMAIN or UNARY_DOMAIN[m](x)]
    m = str(G.rng.choice(modes))
    G.op("unary", [i], {"mode": m}, exact=m in EXACT_UNARY)


def _bcast_shape(shape: tuple[int, ...], rng: np.random.Generator) -> tuple[int, ...]:
    """A shape broadcasting with ``shape``: some dims 1, leading dims dropped or added."""
    s = [1 if rng.random() < 0.3 else d for d in shape]
    if len(s) > 1 and rng.random() < 0.3:
        s = s[int(rng.integers(1, len(s))) :]
    if len(s) < 4 and rng.random() < 0.15:
        s = [int(rng.integers(2, 4))] + s
    return tuple(s)


def _gen_binary(G: _Gen) -> None:
    rng = G.rng
    i = G.pick()
    if i is None:
        return
    a = G.vals[i]
    mode = str(rng.choice(list(BINARY)))
    exact = mode in ("MAX", "MIN")
    if rng.random() < 0.3:
        c = float(rng.choice(BINARY_CONSTS[mode]))
        pos = int(rng.integers(2))
        p, q = (np.float64(c), a) if pos == 0 else (a, np.float64(c))
        if not _binary_ok(mode, p, q):
            return
        G.op("binary", [i], {"mode": mode, "const": c, "const_pos": pos}, exact)
        return
    j = None
    if rng.random() < 0.5:

        def fits(v: np.ndarray) -> bool:
            try:
                return math.prod(np.broadcast_shapes(v.shape, a.shape)) <= MAX_SIZE
            except ValueError:
                return False

        j = G.pick(fits)
    if j is None:
        low = 0.3 if mode == "TRUE_DIV" and rng.random() < 0.5 else -2.0
        j = G.new_input(_bcast_shape(a.shape, rng), low, 2.0)
    args = [i, j] if rng.random() < 0.5 else [j, i]
    if not _binary_ok(mode, G.vals[args[0]], G.vals[args[1]]):
        args = args[::-1]
        if not _binary_ok(mode, G.vals[args[0]], G.vals[args[1]]):
            return
    G.op("binary", args, {"mode": mode}, exact)


def _gen_reduce(G: _Gen) -> None:
    rng = G.rng
    i = G.pick()
    if i is None:
        return
    nd = G.vals[i].ndim
    mode = str(rng.choice(list(REDUCE)))
    r = rng.random()
    if r < 0.25:
        axis = None
    elif r < 0.8 or nd < 2:
        axis = int(rng.integers(-nd, nd))
    else:
        axis = [int(ax) - (nd if rng.random() < 0.3 else 0) for ax in rng.choice(nd, 2, False)]
    attrs = {"mode": mode, "axis": axis, "keepdims": bool(rng.random() < 0.4)}
    G.op("reduce", [i], attrs, exact=mode in ("MAX", "MIN"))


def _gen_reshape(G: _Gen) -> None:
    i = G.pick()
    if i is None:
        return
    shape = list(_factor(G.vals[i].size, int(G.rng.integers(1, 5)), G.rng))
    if G.rng.random() < 0.3:
        shape[int(G.rng.integers(len(shape)))] = -1
    G.op("reshape", [i], {"shape": tuple(shape)}, exact=True)


def _gen_broadcast(G: _Gen) -> None:
    rng = G.rng
    i = G.pick()
    if i is None:
        return
    x = G.vals[i]

    def target_of(v: np.ndarray) -> bool:
        try:
            return v.shape != x.shape and np.broadcast_shapes(v.shape, x.shape) == v.shape
        except ValueError:
            return False

    j = G.pick(target_of) if rng.random() < 0.5 else None
    if j is not None:
        G.op("broadcast", [i, j], {"like": True}, exact=True)
        return
    shape = [int(rng.integers(2, 5)) if d == 1 and rng.random() < 0.7 else d for d in x.shape]
    if tuple(shape) == x.shape or rng.random() < 0.3:
        shape = [int(rng.integers(2, 4))] + shape
    G.op("broadcast", [i], {"shape": tuple(shape)}, exact=True)


def _gen_dimshuffle(G: _Gen) -> None:
    rng = G.rng
    i = G.pick()
    if i is None:
        return
    x = G.vals[i]
    pat: list = [int(p) for p in rng.permutation(x.ndim) if x.shape[p] != 1 or rng.random() < 0.5]
    if not pat or rng.random() < 0.3:
        pat.insert(int(rng.integers(len(pat) + 1)), "x")
    G.op("dimshuffle", [i], {"pattern": tuple(pat), "ndim": x.ndim}, exact=True)


def _gen_add_axis(G: _Gen) -> None:
    i = G.pick(lambda v: v.ndim < 5)
    if i is None:
        return
    nd = G.vals[i].ndim
    G.op("add_axis", [i], {"axis": int(G.rng.integers(-nd - 1, nd + 1))}, exact=True)


def _gen_remove_axis(G: _Gen) -> None:
    i = G.pick(lambda v: 1 in v.shape)
    if i is None:
        return
    x = G.vals[i]
    axis = int(G.rng.choice([k for k, d in enumerate(x.shape) if d == 1]))
    if G.rng.random() < 0.3:
        axis -= x.ndim
    G.op("remove_axis", [i], {"axis": axis}, exact=True)


def _gen_concat(G: _Gen) -> None:
    rng = G.rng
    i = G.pick()
    if i is None:
        return
    x = G.vals[i]
    ax = int(rng.integers(x.ndim))
    args = [i]
    for _ in range(int(rng.integers(1, 3))):
        shape = list(x.shape)
        shape[ax] = int(rng.integers(1, 4))
        args.append(G.operand(tuple(shape)))
    rng.shuffle(args)
    axis = ax - x.ndim if rng.random() < 0.3 else ax
    G.op("concat", args, {"axis": axis}, exact=True)


def _rand_index(shape: tuple[int, ...], rng: np.random.Generator) -> tuple | None:
    """A tuple of ("i", k) and ("s", start, stop, step) items selecting a non-empty part."""
    items = []
    for d in shape[: int(rng.integers(1, len(shape) + 1))]:
        r = rng.random()
        if r < 0.2:
            items.append(("i", int(rng.integers(-d, d))))
        elif r < 0.35:
            items.append(("s", None, None, None))
        else:
            step = [None, 1, 2, -1, -2][int(rng.integers(5))]
            start = None if rng.random() < 0.3 else int(rng.integers(-d - 1, d + 1))
            stop = None if rng.random() < 0.3 else int(rng.integers(-d - 1, d + 1))
            if not len(range(d)[slice(start, stop, step)]):
                return None
            items.append(("s", start, stop, step))
    return tuple(items)


def _gen_subtensor(G: _Gen) -> None:
    i = G.pick()
    if i is None:
        return
    index = _rand_index(G.vals[i].shape, G.rng)
    if index is not None:
        G.op("subtensor", [i], {"index": index}, exact=True)


def _gen_modify_subtensor(G: _Gen) -> None:
    i = G.pick()
    if i is None:
        return
    x = G.vals[i]
    index = _rand_index(x.shape, G.rng)
    if index is None:
        return
    shape = _as1(x[_py_index(index)]).shape
    op = "set_subtensor" if G.rng.random() < 0.5 else "incr_subtensor"
    G.op(op, [i, G.operand(shape)], {"index": index}, exact=op == "set_subtensor")


def _gen_matmul(G: _Gen, batched: bool = False) -> None:
    rng = G.rng
    nd = 3 if batched else 2
    i = G.with_ndim(nd)
    if i is None:
        return
    x = G.vals[i]
    ta, tb = bool(rng.random() < 0.3), bool(rng.random() < 0.3)
    k = x.shape[-2] if ta else x.shape[-1]
    n = int(rng.integers(1, 5))
    shape = (*x.shape[:-2], n, k) if tb else (*x.shape[:-2], k, n)
    j = G.operand(shape, -1.0, 1.0)
    G.op("batched_matmul" if batched else "matmul", [i, j], {"ta": ta, "tb": tb})


def _gen_conv(G: _Gen) -> None:
    rng = G.rng
    i = G.with_ndim(4)
    if i is None:
        return
    n, c, h, w = G.vals[i].shape
    pad = (int(rng.integers(2)), int(rng.integers(2)))
    fh = int(rng.integers(1, min(3, h + 2 * pad[0]) + 1))
    fw = int(rng.integers(1, min(3, w + 2 * pad[1]) + 1))
    f = G.new_input((int(rng.integers(1, 4)), c, fh, fw), -1.0, 1.0)
    stride = (int(rng.integers(1, 3)), int(rng.integers(1, 3)))
    G.op("conv", [i, f], {"pad": pad, "stride": stride})


def _gen_pooling(G: _Gen) -> None:
    rng = G.rng
    i = G.with_ndim(4)
    if i is None:
        return
    _, _, h, w = G.vals[i].shape
    window, pad = [], []
    for d in (h, w):
        p = int(rng.integers(2))
        window.append(int(rng.integers(max(1, p + 1), min(3, d + 2 * p) + 1)))
        pad.append(p if p < window[-1] else 0)
    mode = str(rng.choice(["MAX", "AVERAGE", "AVERAGE_COUNT_EXCLUDE_PADDING"]))
    attrs = {
        "mode": mode,
        "window": tuple(window),
        "stride": (int(rng.integers(1, 3)), int(rng.integers(1, 3))),
        "pad": tuple(pad),
    }
    G.op("pooling", [i], attrs, exact=mode == "MAX")


def _gen_one_hot(G: _Gen) -> None:
    i = G.pick(lambda v: v.ndim >= 2)
    if i is None:
        i = G.with_ndim(2)
    x = G.vals[i]
    ax = int(G.rng.integers(x.ndim))
    idx = G.new_index(x.shape[:ax] + x.shape[ax + 1 :], x.shape[ax])
    axis = ax - x.ndim if G.rng.random() < 0.3 else ax
    G.op("one_hot", [i, idx], {"axis": axis, "keepdims": bool(G.rng.random() < 0.4)}, True)


def _gen_f16(G: _Gen) -> None:
    i = G.pick(exact=True)  # a value computed exactly in every configuration
    if i is not None:
        G.op("f16", [i], {}, exact=True)


def _gen_argsort(G: _Gen) -> None:
    i = G.with_ndim(2)
    if i is not None:
        order = "ASCENDING" if G.rng.random() < 0.5 else "DESCENDING"
        G.op("argsort", [i], {"order": order}, exact=True)


def _gen_top_k(G: _Gen) -> None:
    i = G.with_ndim(2)
    if i is None:
        return
    n = G.vals[i].shape[1]
    k = int(G.rng.integers(1, n + 1)) * (1 if G.rng.random() < 0.5 else -1)
    mode = "KTH_ONLY" if G.rng.random() < 0.4 else "VALUE_IDX_SORTED"
    G.op("top_k", [i], {"k": k, "mode": mode}, exact=True)


def _gen_cumsum(G: _Gen) -> None:
    i = G.pick()
    if i is None:
        return
    nd = G.vals[i].ndim
    attrs = {
        "axis": int(G.rng.integers(-nd, nd)),
        "exclusive": bool(G.rng.random() < 0.5),
        "reverse": bool(G.rng.random() < 0.5),
    }
    G.op("cumsum", [i], attrs)


#: (weight, operator generator); every operator family of the graph
GENERATORS: list[tuple[float, Callable[[_Gen], None]]] = [
    (3.0, _gen_unary),
    (4.0, _gen_binary),
    (2.0, _gen_reduce),
    (1.0, _gen_reshape),
    (1.0, _gen_broadcast),
    (1.0, _gen_dimshuffle),
    (0.7, _gen_add_axis),
    (0.7, _gen_remove_axis),
    (1.0, _gen_concat),
    (1.2, _gen_subtensor),
    (1.0, _gen_modify_subtensor),
    (0.8, _gen_matmul),
    (0.5, lambda G: _gen_matmul(G, batched=True)),
    (0.6, _gen_conv),
    (0.6, _gen_pooling),
    (0.6, _gen_one_hot),
    (0.5, _gen_f16),
    (0.5, _gen_argsort),
    (0.5, _gen_top_k),
    (0.7, _gen_cumsum),
]
#: the operators a campaign should have generated
OPERATORS = (
    "unary binary reduce reshape broadcast dimshuffle add_axis remove_axis concat subtensor "
    "set_subtensor incr_subtensor matmul batched_matmul conv pooling one_hot f16 argsort "
    "top_k cumsum"
).split()


def generate(seed: int) -> GraphDesc:
    """The random graph of ``seed``: 3 to 30 operators, up to 5 outputs."""
    G = _Gen(seed)
    rng = G.rng
    for _ in range(int(rng.integers(1, 3))):
        G.new_input(_rand_shape(rng))
    target = int(rng.integers(3, 31))
    weights = np.array([w for w, _ in GENERATORS])
    for _ in range(20 * target):
        if G.n_ops >= target:
            break
        GENERATORS[int(rng.choice(len(GENERATORS), p=weights / weights.sum()))][1](G)
    ops = [i for i, n in enumerate(G.nodes) if n.op not in ("input", "index")]
    if not ops:  # never in practice: a unary operator always applies
        G.op("unary", [0], {"mode": "TANH"})
        ops = [len(G.nodes) - 1]
    used = {a for n in G.nodes for a in n.args}
    sinks = [i for i in ops if i not in used]
    outputs = sorted(int(o) for o in rng.choice(sinks, min(len(sinks), 5), replace=False))
    extra = [i for i in ops if i not in outputs]
    if extra and rng.random() < 0.3:
        outputs = sorted([*outputs, int(rng.choice(extra))])
    nodes, outputs = _restrict(G.nodes, outputs)
    desc = GraphDesc(seed, nodes, outputs, [])
    desc.weights = [
        rng.standard_normal(desc.values[o].shape).astype(np.float32) for o in desc.outputs
    ]
    return desc


# ---- running ------------------------------------------------------------------------------------
@dataclass
class Outcome:
    """Results of one configuration: copied outputs, gradients, eager values."""

    forward: list[np.ndarray]
    grads: list[np.ndarray]
    eager: list[np.ndarray] | None
    rerun: list[np.ndarray]  # the first inputs again
    changed: list[np.ndarray]  # outputs and gradients over GraphDesc.changed_data


def _namespace(desc: GraphDesc, graph, dtype) -> dict:
    return {
        "mgb": mgb,
        "np": np,
        "g": graph,
        "X": desc.data(),
        "W": [w.astype(dtype) for w in desc.weights],
        "DT": dtype,
        "OFF": desc.offsets(),
    }


def run_config(desc: GraphDesc, name: str) -> Outcome:
    """Build ``desc`` in a graph with configuration ``name``; run it twice."""
    cfg = CONFIGS[name]
    g = mgb.comp_graph()
    for k, v in cfg.options.items():
        g.set_option(k, v)
    eager = g.is_eager()
    ns = _namespace(desc, g, np.float32)
    exec(compile(desc.program("f32", cfg.two_cn, eager), "<fuzz graph>", "exec"), ns)
    outs = [ns[f"v{o}"] for o in desc.outputs]
    wrt = [ns[f"v{i}"] for i in desc.float_inputs]
    # as the reference's optimizers: VirtualGrad only where the graph optimizer expands it
    grads = mgb.grad(ns["loss"], wrt, use_virtual_grad=False if eager else None)
    grads = list(grads) if isinstance(grads, (list, tuple)) else [grads]
    eager_vals = None
    if eager:
        eager_vals = [np.array(v.eager_val.get_value()) for v in outs + grads]
    func = g.compile(None, [mgb.copy_output(v) for v in outs + grads])
    feed, changed = desc.feed(), desc.changed_data()
    shared = [i for i, n in enumerate(desc.nodes) if n.attrs.get("kind") == "shared"]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="extra inputs ignored")
        first = [np.array(r) for r in func(**feed)]
        for i in shared:
            ns[f"v{i}"].set_value(changed[f"v{i}"])
        second = [np.array(r) for r in func(**{k: changed[k] for k in feed})]
        for i in shared:
            ns[f"v{i}"].set_value(desc.nodes[i].attrs["value"])
        again = [np.array(r) for r in func(**feed)]
    n = len(outs)
    return Outcome(first[:n], first[n:], eager_vals, again, second)


def _diff(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> str | None:
    """None if close (NaN where both are NaN, an infinity where both are that infinity, as
    ``numpy.testing.assert_allclose`` counts them: inputs changed past an operator's domain
    give the reference's NaN too); else what differs."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return f"shape {got.shape} != {want.shape}"
    g64, w64 = got.astype(np.float64), want.astype(np.float64)
    with np.errstate(invalid="ignore"):
        same = (np.isnan(g64) & np.isnan(w64)) | (np.isinf(g64) & (g64 == w64))
        bad = ~(np.abs(g64 - w64) <= atol + rtol * np.abs(w64)) & ~same
    if not bad.any():
        return None
    k = np.unravel_index(int(np.argmax(np.where(bad, np.abs(g64 - w64), -1))), got.shape)
    return (
        f"{int(bad.sum())}/{bad.size} elements differ, max |diff| "
        f"{np.abs(g64 - w64).max():.3g} (at {tuple(int(t) for t in k)}: {g64[k]!r} vs "
        f"{w64[k]!r}; rtol {rtol:g}, atol {atol:.3g})"
    )


@dataclass
class Mismatch:
    """One failed comparison, with what is needed to reproduce it."""

    seed: int
    config: str
    kind: str  # error forward grad rerun changed-inputs eager reference float64 finite-diff...
    detail: str
    desc: GraphDesc

    def signature(self) -> tuple[str, str, str]:
        """Configuration, kind and (for errors) the exception, without numbers."""
        what = self.detail.splitlines()[-1] if self.kind == "error" else ""
        return self.config, self.kind, re.sub(r"\d+|'[^']*'", "#", what)[:120]

    def report(self) -> str:
        return (
            f"seed {self.seed}, config {self.config} {CONFIGS.get(self.config, '')}, "
            f"{self.kind}: {self.detail}\n{self.desc.describe()}"
        )


def _error_text(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    where = next((f"{f.filename}:{f.lineno}" for f in reversed(tb) if "megbrain" in f.filename), "")
    return f"{where}\n{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def _compare_lists(got: list, want: list, rtol: float, atol: float, what: str) -> str | None:
    for k, (a, b) in enumerate(zip(got, want)):
        d = _diff(a, b, rtol, atol)
        if d:
            return f"{what} {k}: {d}"
    return None


def _float64_checks(desc: GraphDesc, fd: bool, base: Outcome | None) -> list[Mismatch]:
    """The float64 graph vs the reference, finite differences, and float32 vs float64 grads."""
    found: list[Mismatch] = []
    arrays = [desc.nodes[i].attrs["value"].astype(np.float64) for i in desc.float_inputs]
    code = compile(desc.program("f64"), "<fuzz graph f64>", "exec")

    def build(*xs):
        ns = _namespace(desc, xs[0].node.graph, np.float64)
        ns.update({f"v{i}": x for i, x in zip(desc.float_inputs, xs)})
        exec(code, ns)
        return ns, ns["loss"]

    try:
        g = make_graph()
        xs, _ = harness_inputs(g, *arrays)
        ns, _ = build(*xs)
        got = harness_run([ns[f"v{o}"] for o in desc.outputs], g)
    except Exception as exc:  # noqa: BLE001 - every failure is a finding
        return [Mismatch(desc.seed, "float64", "error", _error_text(exc), desc)]
    want = [desc.values[o] for o in desc.outputs]
    d = _compare_lists(got, want, F64_RTOL, F64_ATOL * desc.scale, "output")
    if d:
        found.append(Mismatch(desc.seed, "float64", "float64", d, desc))
    if not fd or desc.margin < KINK_MARGIN:
        return found
    # perturb the inputs of at most FD_ELEMENTS elements in all
    rng = np.random.default_rng(desc.seed)
    wrt, total = [], 0
    for k in rng.permutation(len(arrays)):
        if total + arrays[k].size <= FD_ELEMENTS or not wrt:
            wrt.append(int(k))
            total += arrays[k].size
    wrt.sort()
    try:
        analytic = check_grad(lambda *xs: build(*xs)[1], arrays, wrt=wrt, rtol=FD_RTOL)
    except AssertionError as exc:
        found.append(Mismatch(desc.seed, "float64", "finite-diff", str(exc).strip(), desc))
        return found
    except Exception as exc:  # noqa: BLE001
        found.append(Mismatch(desc.seed, "float64", "error", _error_text(exc), desc))
        return found
    if base is not None:
        # check_grad's loss is ours times a fixed random r of shape (1,) (its seed 0)
        r = float(np.random.default_rng(0).standard_normal((1,))[0])
        gscale = max([1.0, *(float(np.abs(a).max()) / abs(r) for a in analytic)])
        for gi, i in enumerate(wrt):
            rtol, atol = F64_GRAD_RTOL, F64_GRAD_ATOL * gscale
            if any(n.op == "f16" for n in desc.nodes):
                rtol, atol = F16_GRAD_TOL, F16_GRAD_TOL * gscale * desc.scale
            d = _diff(base.grads[i], analytic[gi] / r, rtol, atol)
            if d:
                detail = f"float32 gradient of v{desc.float_inputs[i]} vs float64: {d}"
                found.append(Mismatch(desc.seed, BASELINE, "grad-f64", detail, desc))
    return found


def check_desc(
    desc: GraphDesc, configs: Iterable[str] | None = None, fd: bool = True
) -> list[Mismatch]:
    """Run ``desc`` under the configurations (default: all) and compare; the mismatches."""
    names = list(CONFIGS) if configs is None else list(configs)
    found: list[Mismatch] = []
    scale = desc.scale

    def add(config: str, kind: str, detail: str | None) -> None:
        if detail:
            found.append(Mismatch(desc.seed, config, kind, detail, desc))

    try:
        base = run_config(desc, BASELINE)
    except Exception as exc:  # noqa: BLE001
        add(BASELINE, "error", _error_text(exc))
        base = None
    if base is not None:
        gscale = scale * max([1.0, *(float(np.abs(gr).max()) for gr in base.grads)])
        want = [desc.values[o] for o in desc.outputs]
        ref_atol = REF_ATOL * scale
        add(BASELINE, "reference", _compare_lists(base.forward, want, REF_RTOL, ref_atol, "output"))
        add(BASELINE, "rerun", _compare_lists(base.rerun, base.forward + base.grads, 0, 0, "run"))
        changed = desc.changed_values()
        want = [changed[o] for o in desc.outputs]
        detail = _compare_lists(base.changed, want, REF_RTOL, ref_atol, "output")
        add(BASELINE, "changed-inputs", detail and f"run with other input values: {detail}")
    for name in names:
        if name == BASELINE:
            continue
        try:
            out = run_config(desc, name)
        except Exception as exc:  # noqa: BLE001
            add(name, "error", _error_text(exc))
            continue
        add(name, "rerun", _compare_lists(out.rerun, out.forward + out.grads, 0, 0, "result"))
        if base is None:
            continue
        fwd_atol, grad_rtol, grad_atol = FWD_ATOL * scale, GRAD_RTOL, GRAD_ATOL * gscale
        if CONFIGS[name].two_cn and any(n.op == "f16" for n in desc.nodes):
            # operators on other comp nodes are not merged: identical float16 round trips
            # stay apart, and the gradient is float16-rounded on each of them
            grad_rtol, grad_atol = F16_GRAD_TOL, F16_GRAD_TOL * gscale
        add(
            name, "forward", _compare_lists(out.forward, base.forward, FWD_RTOL, fwd_atol, "output")
        )
        add(name, "grad", _compare_lists(out.grads, base.grads, grad_rtol, grad_atol, "gradient"))
        n = len(out.forward)
        detail = _compare_lists(
            out.changed[:n], base.changed[:n], FWD_RTOL, fwd_atol, "output"
        ) or _compare_lists(out.changed[n:], base.changed[n:], grad_rtol, grad_atol, "gradient")
        add(name, "changed-inputs", detail and f"run with other input values: {detail}")
        if out.eager is not None:
            add(
                name,
                "eager",
                _compare_lists(
                    out.eager, out.forward + out.grads, FWD_RTOL, FWD_ATOL * gscale, "eager value"
                ),
            )
    if fd or BASELINE in names:
        found.extend(_float64_checks(desc, fd, base))
    return found


# ---- reduction ---------------------------------------------------------------------------
def _with_outputs(desc: GraphDesc, outputs: list[int]) -> GraphDesc:
    pos = {o: k for k, o in enumerate(desc.outputs)}
    nodes, outs = _restrict(desc.nodes, outputs)
    return GraphDesc(desc.seed, nodes, outs, [desc.weights[pos[o]] for o in outputs])


def _cut(desc: GraphDesc, k: int) -> GraphDesc:
    """``desc`` with operator ``k`` replaced by an input holding its reference value."""
    nodes = list(desc.nodes)
    old = nodes[k]
    value = desc.values[k].astype(np.float32)
    nodes[k] = Node("input", (), {"kind": "arg", "value": value, "preset": False}, cn=old.cn)
    nodes, outs = _restrict(nodes, desc.outputs)
    return GraphDesc(desc.seed, nodes, outs, list(desc.weights))


def minimize(
    desc: GraphDesc, fails: Callable[[GraphDesc], bool], seconds: float = 30.0
) -> GraphDesc:
    """A smaller graph on which ``fails`` still holds: one output, operators cut to inputs."""
    t_end = time.monotonic() + seconds
    if len(desc.outputs) > 1:
        for o in desc.outputs:
            cand = _with_outputs(desc, [o])
            if fails(cand):
                desc = cand
                break
    progress = True
    while progress and time.monotonic() < t_end:
        progress = False
        for o in desc.outputs if len(desc.outputs) > 1 else ():
            cand = _with_outputs(desc, [p for p in desc.outputs if p != o])
            if fails(cand):
                desc, progress = cand, True
                break
        if progress:
            continue
        for k in reversed(range(len(desc.nodes))):
            if time.monotonic() >= t_end:
                break
            if desc.nodes[k].op in ("input", "index") or k in desc.outputs:
                continue
            cand = _cut(desc, k)
            try:
                ok = fails(cand)
            except Exception:  # noqa: BLE001 - a reduced graph the reference rejects
                ok = False
            if ok:
                desc, progress = cand, True
                break
    return desc


def reproducer(m: Mismatch) -> str:
    """A standalone script reproducing ``m`` (comparing with graph_opt_level=0)."""
    d = m.desc
    data = "\n".join(
        f"    {k!r}: np.array({v.tolist()!r}, dtype=np.{v.dtype})," for k, v in d.data().items()
    )
    weights = ", ".join(f"np.array({w.tolist()!r}, dtype=np.float32)" for w in d.weights)
    if m.kind in ("finite-diff", "float64", "grad-f64") or m.config == "float64":
        off = repr({k: v.tolist() for k, v in d.offsets().items()})
        wrt = ", ".join(f"v{i}" for i in d.float_inputs)
        body = "\n".join("    " + ln for ln in d.program("f64").splitlines())
        return f"""import sys

import numpy as np

import megbrain as mgb

sys.path.insert(0, "tests/opr")
from opr_harness import check_grad

X = {{
{data}
}}
W = [{weights}]
OFF = {{k: np.asarray(v) for k, v in {off}.items()}}
DT = np.float64


def build({wrt}):
    g = v{d.float_inputs[0]}.node.graph
{body}
    return loss


check_grad(build, [X[k] for k in {[f"v{i}" for i in d.float_inputs]!r}])
"""
    cfg = CONFIGS.get(m.config, CONFIGS[BASELINE])
    eager = bool(cfg.options.get("eager_evaluation"))

    def fn(name: str, two_cn: bool, eager_: bool) -> str:
        body = "\n".join("    " + ln for ln in d.program("f32", two_cn, eager_).splitlines())
        outs = ", ".join(f"v{o}" for o in d.outputs)
        wrt = ", ".join(f"v{i}" for i in d.float_inputs)
        return f"def {name}(g):\n{body}\n    return [{outs}], loss, [{wrt}]\n"

    return f"""import numpy as np

import megbrain as mgb

X = {{
{data}
}}
W = [{weights}]
DT = np.float32
FEED = {{k: X[k] for k in {list(d.feed())!r}}}


{fn("build", cfg.two_cn, eager)}

{fn("build_ref", False, False)}

def run(build, opts):
    g = mgb.comp_graph()
    for k, v in opts.items():
        g.set_option(k, v)
    outs, loss, wrt = build(g)
    grads = mgb.grad(loss, wrt, use_virtual_grad=False if g.is_eager() else None)
    f = g.compile(None, [mgb.copy_output(v) for v in outs + list(grads)])
    return f(**FEED)


got = run(build, {cfg.options!r})
want = run(build_ref, {{"graph_opt_level": 0}})
for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol={FWD_RTOL}, atol={FWD_ATOL * d.scale:.3g})
"""


# ---- campaigns ---------------------------------------------------------------------------
@dataclass
class CampaignResult:
    """What a campaign ran and found."""

    graphs: int = 0
    fd_checked: int = 0
    elapsed: float = 0.0
    operators: Counter = field(default_factory=Counter)
    mismatches: list[Mismatch] = field(default_factory=list)
    minimized: dict = field(default_factory=dict)  # signature -> minimized Mismatch

    def report(self, limit: int = 6) -> str:
        lines = [
            f"{self.graphs} graphs ({self.fd_checked} with finite differences) in "
            f"{self.elapsed:.0f} s, {len(self.mismatches)} mismatches, "
            f"{len(self.minimized)} kinds"
        ]
        groups: dict = {}
        for m in self.mismatches:
            groups.setdefault(m.signature(), []).append(m)
        for sig, ms in list(groups.items())[:limit]:
            seeds = sorted({m.seed for m in ms})
            lines.append(f"\n== {sig[0]} / {sig[1]} {sig[2]}: {len(ms)} (seeds {seeds[:10]})")
            lines.append(self.minimized.get(sig, ms[0]).report())
        return "\n".join(lines)


def _still_fails(m: Mismatch) -> Callable[[GraphDesc], bool]:
    sig = m.signature()
    fd = m.kind in ("finite-diff", "grad-f64") or m.config == "float64"
    configs = [] if m.config in ("float64", BASELINE) else [m.config]

    def fails(d: GraphDesc) -> bool:
        return any(x.signature() == sig for x in check_desc(d, configs, fd=fd))

    return fails


def campaign(
    seeds: Iterable[int],
    seconds: float,
    *,
    max_graphs: int | None = None,
    min_graphs: int = 0,
    minimize_seconds: float = 20.0,
    log: Callable[[str], None] | None = None,
) -> CampaignResult:
    """Generate and check graphs of ``seeds`` until ``seconds`` pass (but at least
    ``min_graphs`` graphs, however slow the machine) or ``max_graphs`` are checked."""
    res = CampaignResult()
    t0 = time.monotonic()
    for seed in seeds:
        out_of_time = time.monotonic() - t0 >= seconds and res.graphs >= min_graphs
        if out_of_time or (max_graphs and res.graphs >= max_graphs):
            break
        desc = generate(seed)
        res.graphs += 1
        res.fd_checked += desc.margin >= KINK_MARGIN
        res.operators.update(n.op for n in desc.nodes)
        found = check_desc(desc)
        res.mismatches.extend(found)
        for m in found:
            sig = m.signature()
            if sig in res.minimized:
                continue
            small = minimize(m.desc, _still_fails(m), minimize_seconds)
            again = [x for x in check_desc(small, None, fd=True) if x.signature() == sig]
            res.minimized[sig] = again[0] if again else m
            if log:
                log(f"seed {seed}: {sig}\n{res.minimized[sig].report()}")
    res.elapsed = time.monotonic() - t0
    return res


def main(argv: list[str] | None = None) -> int:
    """Command line: check seeds, print the failures (minimized) and reproducers."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, action="append", help="check this seed (repeatable)")
    p.add_argument("--start", type=int, default=0, help="first seed of a campaign")
    p.add_argument("--seconds", type=float, default=60.0, help="campaign time budget")
    p.add_argument("--config", action="append", help="only these configurations")
    p.add_argument("--show", action="store_true", help="print each graph")
    p.add_argument("--repro", action="store_true", help="print a reproducer script per failure")
    args = p.parse_args(argv)
    if args.seed:
        bad = 0
        for s in args.seed:
            desc = generate(s)
            if args.show:
                print(desc.describe())
            found = check_desc(desc, args.config)
            for m in found:
                small = minimize(m.desc, _still_fails(m))
                again = [x for x in check_desc(small, None) if x.signature() == m.signature()]
                mm = again[0] if again else m
                print(mm.report())
                if args.repro:
                    print(reproducer(mm))
            bad += bool(found)
            print(f"seed {s}: {len(found)} mismatches")
        return int(bad > 0)
    res = campaign(range(args.start, 1 << 30), args.seconds, log=print)
    print(res.report(limit=100))
    if args.repro:
        for m in res.minimized.values():
            print(reproducer(m))
    return int(bool(res.mismatches))


if __name__ == "__main__":
    sys.exit(main())
