"""Fused elementwise kernels: an expression of Elemwise modes -> Numba source -> a cached callable.

An *expression* is a tuple of nodes ``(mode, args)`` evaluated in order; each arg is
``("i", k)`` (input ``k``), ``("t", j)`` (the result of node ``j``) or ``("c", value)`` (a
scalar constant); the last node is the result. :func:`bind` compiles (or fetches) a kernel for
the arrays' layout and returns a zero-argument callable computing the result into ``out``;
an optional closing reduction ``(mode, axis)`` reduces it on the way (SUM/MEAN/MAX/MIN).

Kernels compute in float32 (float16 goes through float32 scratch: Numba has no CPU float16),
each node as the scalar form of its mode in the table of :mod:`.elemwise_modes` (vectorizable
approximations for exp/log/tanh/erf/sigmoid: Numba's ``math.tanh`` and friends are scalar
libm calls that do not vectorize). Compiled kernels are cached in memory and on disk: each
kernel's source is written once to a module named by its hash under :func:`cache_dir` and
compiled by Numba with ``cache=True``, so another process loads the machine code instead of
compiling. Kernels are compiled serial (no ``prange``): a parallel elementwise kernel is split
by :func:`_split_parts` into parts the threads of :mod:`.parallel`'s pool take in turn
(from fewer elements for kernels calling exp/log/tanh/erf), so that no Numba threading layer (and
no OpenMP pool spinning or sleeping next to OpenBLAS's threads) is ever loaded.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import math
import os
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import numba
import numpy as np

from .arrays import F16, F32, same_elements
from .elemwise_modes import JIT_FORMS, JIT_HELPERS, REDUCE_MODES, arity, bind_numpy, compute
from .native_call import register_entry_point
from .parallel import concurrently, num_threads, ranges, take_in_turn
from .reduce import bind_reduce
from .steps import chain

__all__ = [
    "STATS",
    "bcast_shape",
    "bind",
    "helper",
    "cache_dir",
    "check_expr",
    "full_shape",
    "interpret",
    "kernel_source",
    "parallel_min_size",
    "reduced_shape",
]

#: elements from which an elementwise kernel is split over :mod:`.parallel`'s threads (each
#: part gets at least half of it). These loops are memory bound: on 2 cores a split lost to
#: one thread from 0.8M to 3.2M elements (docs/DECISIONS.md), hence the high bar
PARALLEL_MIN_SIZE = 1 << 22
#: the same for a kernel calling an exp/log/tanh/erf approximation (SiLU, sigmoid, GELU): some
#: 25-30 vector instructions per 8 elements and a division make it compute bound (SiLU 0.5 ns
#: an element on one thread against 0.3 for a copy), so a second thread pays off from far
#: fewer elements
PARALLEL_MIN_SIZE_TRANSCENDENTAL = 1 << 18
#: the JIT helpers that make a kernel compute bound
_TRANSCENDENTAL_HELPERS = frozenset({"_exp", "_log", "_tanh", "_erf", "_sigmoid", "_lse"})
#: counters: kernels compiled by Numba, loaded from the disk cache, found in memory
STATS = {"compiled": 0, "disk_loads": 0, "memory_hits": 0}

_lock = threading.RLock()
_kernels: dict[tuple, Callable] = {}  # (source hash, argument layout key) -> entry point
_modules: dict[str, object] = {}  # source hash -> imported generated module
_tmp_dir: Path | None = None



# ---- source generation ----------------------------------------------------------------------
def _const(value: float) -> str:
    v = float(np.float32(value))
    if math.isnan(v):
        return "F(np.nan)"
    if math.isinf(v):
        return "F(np.inf)" if v > 0 else "F(-np.inf)"
    return f"F({v!r})"


def _node_expr(mode: str, args: list[str], consts: list) -> str:
    """The expression of one node; a few POW exponents get exact cheaper forms."""
    if mode == "POW" and consts[1] is not None:
        e = float(np.float32(consts[1]))
        a = args[0]
        if e == 2.0:
            return f"{a} * {a}"
        if e == 1.0:
            return a
        if e == 0.5:  # powf(x, 0.5) is sqrt(x) except at -inf
            return f"(np.sqrt({a}) if {a} != F(-np.inf) else F(np.inf))"
    return JIT_FORMS[mode][0](*args)


def _helpers_of(expr: Sequence) -> list[str]:
    return _with_deps([h for mode, _ in expr for h in JIT_FORMS[mode][1]])


def _with_deps(names: Sequence[str]) -> list[str]:
    """``names`` and the helpers they call, each after those it calls."""
    order: list[str] = []

    def add(name: str) -> None:
        if name in order:
            return
        for dep in JIT_HELPERS[name][1]:
            add(dep)
        order.append(name)

    for name in names:
        add(name)
    return order


def _body(expr: Sequence, load: Callable[[int], str], nodes=None) -> list[str]:
    """Statements computing each node (of ``nodes``, all by default) into ``t<j>``;
    ``load(k)`` names input k's value."""
    lines = []
    for j, (mode, args) in enumerate(expr):
        if nodes is not None and j not in nodes:
            continue
        names, consts = [], []
        for kind, x in args:
            if kind == "i":
                names.append(load(x))
                consts.append(None)
            elif kind == "t":
                names.append(f"t{x}")
                consts.append(None)
            else:
                names.append(_const(x))
                consts.append(x)
        lines.append(f"t{j} = {_node_expr(mode, names, consts)}")
    return lines


@functools.lru_cache(maxsize=1024)
def kernel_source(
    expr: Sequence,
    layout: tuple,
    reduce: tuple | None = None,
) -> str:
    """Python source of a module defining ``kernel(x0, ..., out)`` for ``expr``.

    Parameters
    ----------
    expr : sequence of (mode, args)
        The expression (module docstring).
    layout : tuple
        ``("flat", kinds, alias)``: 1-d arrays, ``kinds[k]`` is ``"f"`` (one element per
        output element) or ``"s"`` (one element, broadcast); ``("bcast", (kinds, inner),
        alias)``: the full shape collapsed to ``(A, B, K)``, or ``(A, B)`` when ``inner`` is
        False, or ``(A, B, K, L)`` when it is ``"blocked"`` (:func:`bcast_shape`); ``kinds[k]``
        is ``"f"`` (an array of that shape), ``"c"`` (a ``(B,)`` array broadcast over A and
        K: a per-channel bias; ``(B, L)`` when blocked), ``"r"`` (an ``(A,)`` array
        broadcast over the rest) or ``"s"``; a node is computed in the outermost loop its
        inputs allow;
        ``("nd", ndim, alias)``: every input broadcast to the full shape, ``out`` of the full
        (or reduced) shape. ``alias``: None, or the input that is also the output
        (``kernel`` then takes no ``out``).
    reduce : (mode, axis) or None
        A closing reduction: over everything (axis None) or one axis of the full shape.

    Returns
    -------
    str
        The module source.
    """
    kind, arg, alias = layout
    nin = len(arg) if kind == "flat" else len(arg[0]) if kind == "bcast" else _nr_inputs(expr)
    params = ", ".join([f"x{k}" for k in range(nin)] + (["out"] if alias is None else []))
    last = f"t{len(expr) - 1}"
    # compute bound (exp/log/tanh/erf): 512-bit vectors, 20-25% less time than 256-bit ones
    heavy = _heavy(expr)
    held: list[int] = []  # blocked: per-channel nodes held in stack tiles
    body: list[str] = ["_zmm()"] if heavy else []
    # in place: one array object, so that LLVM sees the store can not clobber later loads
    body += [] if alias is None else [f"out = x{alias}"]
    if kind == "flat":
        body += [f"s{k} = x{k}[0]" for k in range(nin) if arg[k] == "s"]

        def load(k):
            return f"s{k}" if arg[k] == "s" else f"x{k}[i]"

        calc = _body(expr, load)
        if reduce is None:
            body += ["for i in range(out.shape[0]):", *_ind(calc, 1), f"    out[i] = {last}"]
        else:
            n = next((f"x{k}.shape[0]" for k in range(nin) if arg[k] == "f"), "1")
            body += [f"n = {n}", *_acc_init(reduce[0]), "for i in range(n):", *_ind(calc, 1)]
            body += [*_ind(_acc_step(reduce[0], last), 1), *_acc_store(reduce[0], "out[0]", "n")]
    elif kind == "bcast":
        kinds, inner = arg
        body += [f"s{k} = x{k}[0]" for k in range(nin) if kinds[k] == "s"]
        idx = "a, b, k, l" if inner == "blocked" else "a, b, k" if inner else "a, b"

        def load(k):
            if kinds[k] == "f":
                return f"x{k}[{idx}]"
            if kinds[k] in ("s", "r"):
                return f"{kinds[k]}{k}"
            return f"x{k}[b, l]" if inner == "blocked" else f"c{k}" if inner else f"x{k}[b]"

        # each node computed in the outermost loop its inputs allow: once (scalars and
        # constants), per row of A, per channel (when a loop over K is inside), or per element
        depth = _node_depths(expr, [{"s": 0, "r": 1, "c": 2 if inner else 3}.get(t, 3)
                                    for t in kinds])  # fmt: skip

        def calc(d):
            return _body(expr, load, {j for j, dj in enumerate(depth) if dj == d})

        # blocked: the per-channel nodes that per-element ones read (a squeeze-and-excitation
        # gate's sigmoid) once per block, into L values on the stack that the position loop
        # reads as registers. Computed there, an exp per element kept that loop from
        # vectorizing: LLVM unrolls a loop of L fully before it vectorizes, and Numba runs
        # no SLP vectorizer
        held = [] if inner != "blocked" else [
            j for j, dj in enumerate(depth) if dj == 2 and (j == len(expr) - 1 or any(
                depth[i] == 3 and ("t", j) in expr[i][1] for i in range(j + 1, len(expr))))
        ]  # fmt: skip
        body += [f"h{j} = carray(_stack({_LANES}, F), {_LANES})" for j in held]
        body += calc(0)
        body += ["na, nb = out.shape[0], out.shape[1]", "for a in range(na):"]
        body += _ind([f"r{k} = x{k}[a]" for k in range(nin) if kinds[k] == "r"], 1)
        body += _ind(calc(1), 1)
        if inner == "blocked":  # a vector of L channels per position
            body += ["    for b in range(nb):"]
            if held:
                body += [f"        for l in range({_LANES}):", *_ind(calc(2), 3)]
                body += _ind([f"h{j}[l] = t{j}" for j in held], 3)
            body += ["        for k in range(out.shape[2]):"]
            # the block width a literal: LLVM turns the innermost loop into vector operations
            body += [f"            for l in range({_LANES}):"]
            body += _ind([f"t{j} = h{j}[l]" for j in held], 4)
            body += [*_ind(calc(3), 4), f"                out[{idx}] = {last}"]
        elif inner:  # the channel values are loaded once per row of K
            body += ["    for b in range(nb):"]
            body += _ind([f"c{k} = x{k}[b]" for k in range(nin) if kinds[k] == "c"], 2)
            body += _ind(calc(2), 2)
            body += ["        for k in range(out.shape[2]):", *_ind(calc(3), 3)]
            body += [f"            out[{idx}] = {last}"]
        else:
            body += ["    for b in range(nb):", *_ind(calc(3), 2), f"        out[{idx}] = {last}"]
    else:
        ndim = arg
        idx = ", ".join(f"i{d}" for d in range(ndim))

        def load(k):
            return f"x{k}[{idx}]"

        calc = _body(expr, load)
        body += [f"n{d} = x0.shape[{d}]" for d in range(ndim)]
        axis = None if reduce is None else reduce[1]
        if reduce is None:
            loops = list(range(ndim))
            inner = [*calc, f"out[{idx}] = {last}"]
            head = []
        elif axis is None:
            loops = list(range(ndim))
            body += _acc_init(reduce[0])
            inner = [*calc, *_acc_step(reduce[0], last)]
            head = []
        else:
            loops = [d for d in range(ndim) if d != axis] + [axis]
            oidx = ", ".join("0" if d == axis else f"i{d}" for d in range(ndim))
            inner = [*calc, *_acc_step(reduce[0], last)]
            head = _acc_init(reduce[0])
        for depth, d in enumerate(loops):
            if reduce is not None and axis is not None and d == axis:
                body += _ind(head, depth)
            body.append("    " * depth + f"for i{d} in range(n{d}):")
        body += _ind(inner, len(loops))
        if reduce is not None:
            count = "*".join(f"n{d}" for d in range(ndim)) if axis is None else f"n{axis}"
            if axis is None:
                body += _acc_store(reduce[0], "out[0]", count)
            else:
                store = _acc_store(reduce[0], f"out[{oidx}]", count)
                body += _ind(store, len(loops) - 1)
    helpers = [JIT_HELPERS[h][0] for h in _helpers_of(expr)]
    head_lines = [
        "# megbrain fused elementwise kernel, generated by megbrain.kernels.jit_codegen",
        f"# expr: {tuple(expr)!r}",
        f"# layout: {layout!r} reduce: {reduce!r}",
        "import math",
        "",
        "import numpy as np",
        "from llvmlite import ir as _llir",
        "from numba import njit, types",
        "from numba.extending import intrinsic",
        *(["from megbrain.kernels.tiled_jit import zmm_vectors", "_zmm = zmm_vectors()"]
          if heavy else []),
        *(["from numba import carray", "from megbrain.kernels.tiled_jit import stack_tile",
           "_stack = stack_tile()"] if held else []),
        *_HELPER_HEAD,
    ]
    fastmath = (
        ", fastmath={'reassoc'}" if reduce is not None and reduce[0] in ("SUM", "MEAN") else ""
    )
    deco = f"@njit(error_model='numpy', nogil=True, cache=True{fastmath})"
    src = "\n".join(head_lines) + "\n" + "".join(helpers) + "\n\n"
    src += f"{deco}\ndef kernel({params}):\n" + "\n".join(_ind(body, 1)) + "\n"
    return src


#: the definitions the helpers' sources (JIT_HELPERS) use, after the imports
_HELPER_HEAD = [
    "",
    "F = np.float32",
    "I = np.int32",
    "_OPTS = dict(error_model='numpy', nogil=True)",
    "# the approximations (exp/log/tanh/erf...) may fuse a * b + c into one FMA: half the",
    "# instructions of their polynomials; exact modes never (their values are NumPy's)",
    "_APPROX = dict(_OPTS, fastmath={'contract'})",
]


def helper(name: str) -> Callable:
    """The compiled JIT helper ``name`` (``"_sigmoid"``: :data:`.elemwise_modes.JIT_HELPERS`),
    from a generated module of its own, for other compiled loops to call (the convolution
    epilogues' SiLU): the same code as the fused kernels'."""
    head = [
        "# megbrain JIT helpers, generated by megbrain.kernels.jit_codegen",
        "import numpy as np",
        "from llvmlite import ir as _llir",
        "from numba import njit, types",
        "from numba.extending import intrinsic",
        *_HELPER_HEAD,
    ]
    src = "\n".join(head) + "\n" + "".join(JIT_HELPERS[h][0] for h in _with_deps([name]))
    return getattr(_load_module(src), name)


def _node_depths(expr: Sequence, input_depths: Sequence[int]) -> list[int]:
    """Per node, the deepest ``input_depths`` of the inputs it reads, directly or through
    other nodes (constants: 0)."""
    depths: list[int] = []
    for _, args in expr:
        ds = [input_depths[x] if kind == "i" else depths[x] if kind == "t" else 0
              for kind, x in args]  # fmt: skip
        depths.append(max(ds, default=0))
    return depths


def _ind(lines: list[str], depth: int) -> list[str]:
    return ["    " * depth + ln for ln in lines]


def _acc_init(mode: str) -> list[str]:
    if mode in ("SUM", "MEAN"):
        return ["acc = 0.0"]  # float64: sums keep their precision
    return ["acc = F(np.inf)" if mode == "MIN" else "acc = F(-np.inf)"]


def _acc_step(mode: str, v: str) -> list[str]:
    if mode in ("SUM", "MEAN"):
        return [f"acc += {v}"]
    op = "<" if mode == "MIN" else ">"
    return [f"acc = {v} if ({v} {op} acc) | ({v} != {v}) else acc"]


def _acc_store(mode: str, dst: str, count: str) -> list[str]:
    if mode == "MEAN":
        return [f"{dst} = F(acc / ({count}))"]
    return [f"{dst} = F(acc)"]


def _nr_inputs(expr: Sequence) -> int:
    ks = [x for _, args in expr for kind, x in args if kind == "i"]
    return max(ks) + 1 if ks else 0


# ---- compile and cache ----------------------------------------------------------------------
def cache_dir() -> Path:
    """The directory of generated kernel modules and Numba's cache of them.

    ``$MGB_JIT_CACHE_DIR`` if set, else ``~/.cache/megbrain/jit``; a private temporary
    directory when that one can not be created or written.
    """
    global _tmp_dir
    env = os.environ.get("MGB_JIT_CACHE_DIR")
    d = Path(env) if env else Path.home() / ".cache" / "megbrain" / "jit"
    try:
        d.mkdir(parents=True, exist_ok=True)
        if os.access(d, os.W_OK):
            return d
    except OSError:
        pass
    if _tmp_dir is None:
        _tmp_dir = Path(tempfile.mkdtemp(prefix="mgb_jit_"))
    return _tmp_dir


def parallel_min_size(expr: Sequence) -> int:
    """Output elements from which the elementwise kernel of ``expr`` is split over
    :mod:`.parallel`'s threads: :data:`PARALLEL_MIN_SIZE`, or the lower
    :data:`PARALLEL_MIN_SIZE_TRANSCENDENTAL` when a node is compute bound."""
    if _heavy(expr):
        return min(PARALLEL_MIN_SIZE, PARALLEL_MIN_SIZE_TRANSCENDENTAL)
    return PARALLEL_MIN_SIZE


def _heavy(expr: Sequence) -> bool:
    """Whether a node of ``expr`` calls an exp/log/tanh/erf approximation (compute bound)."""
    return any(_TRANSCENDENTAL_HELPERS.intersection(JIT_FORMS[m][1]) for m, _ in expr)


def _num_parts() -> int:
    """Parts of a parallel kernel: :func:`.parallel.num_threads`, capped by
    ``$MGB_JIT_NUM_THREADS`` when set."""
    n = num_threads()
    env = os.environ.get("MGB_JIT_NUM_THREADS")
    return max(1, min(int(env), n)) if env else n


def _load_module(src: str):
    """Import the generated module of ``src`` (written to the cache directory once)."""
    digest = hashlib.sha256(src.encode()).hexdigest()[:24]
    mod = _modules.get(digest)
    if mod is not None:
        return mod
    name = f"mgbjit_{digest}"
    path = cache_dir() / f"{name}.py"
    if not path.exists() or path.read_text() != src:
        # written once (atomically): Numba's disk cache is keyed by the file's mtime and size
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(src)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    _modules[digest] = mod
    return mod


def _arg_key(a: np.ndarray) -> tuple:
    f = a.flags
    return (a.ndim, a.dtype.str, f.c_contiguous, f.f_contiguous, f.writeable, f.aligned)


def _kernel(src: str, args: Sequence[np.ndarray]) -> Callable:
    """The compiled entry point of ``src`` for the types of ``args`` (memory, disk, compile)."""
    key = (src, tuple(_arg_key(a) for a in args))
    fn = _kernels.get(key)
    if fn is not None:
        STATS["memory_hits"] += 1
        return fn
    with _lock:
        fn = _kernels.get(key)
        if fn is not None:
            STATS["memory_hits"] += 1
            return fn
        disp = _load_module(src).kernel
        sig = tuple(numba.typeof(a) for a in args)
        hits = sum(disp.stats.cache_hits.values())
        fn = register_entry_point(disp, sig)  # loads from Numba's disk cache when it can
        if sum(disp.stats.cache_hits.values()) > hits:
            STATS["disk_loads"] += 1
        else:
            STATS["compiled"] += 1
        _kernels[key] = fn
    return fn


# ---- binding ----------------------------------------------------------------------------


def check_expr(expr: Sequence, nin: int, reduce=None) -> None:
    """Raise ValueError unless ``expr`` over ``nin`` inputs (and ``reduce``) can be compiled."""
    for mode, args in expr:
        if mode not in JIT_FORMS:
            raise ValueError(f"jit: Elemwise mode {mode} can not be fused")
        if len(args) != arity(mode):
            raise ValueError(f"jit: mode {mode} takes {arity(mode)} inputs, got {len(args)}")
    if _nr_inputs(expr) != nin:
        raise ValueError(f"jit: expression reads {_nr_inputs(expr)} inputs, got {nin}")
    if reduce is not None and reduce[0] not in REDUCE_MODES:
        raise ValueError(f"jit: reduce mode {reduce[0]} can not be fused")


def full_shape(shapes: Sequence[tuple]) -> tuple:
    """The broadcast shape of the inputs (ValueError when they do not broadcast)."""
    return tuple(np.broadcast_shapes(*[tuple(s) for s in shapes]))


def reduced_shape(shape: tuple, reduce) -> tuple:
    """``shape`` after the closing reduction ``reduce`` (None: unchanged)."""
    if reduce is None:
        return tuple(shape)
    axis = reduce[1]
    if axis is None:
        return (1,)
    return tuple(shape[:axis]) + (1,) + tuple(shape[axis + 1 :])


#: the size of the last dim that may be the second part of a split channel block
#: (:func:`bcast_shape`): NCHW88's 8 channels of a block
_LANES = 8


def bcast_shape(shape: tuple, shapes: Sequence[tuple]) -> tuple | None:
    """Collapse the full ``shape`` to ``(A, B, K)`` for the ``"bcast"`` layout.

    Every input must be full (``shape`` itself), one element, or span one block of
    ``shape``'s dims exactly, with ones elsewhere; all such *channel* inputs the same block
    (``(1, C, 1, 1)`` over ``(N, C, H, W)``: ``A = N``, ``B = C``, ``K = H * W``). A channel
    block may also be split in two, its second part the last dim, of 8 (the channel-blocked
    ``(1, C/8, 1, 1, 8)`` over ``(N, C/8, H, W, 8)``): the shape is then collapsed to
    ``(A, B, K, L)``, the channel inputs spanning B and L (``L = 8``). Inputs may also span
    the dims before the channel block, A (*row* inputs: a channels-last normalization's
    ``(N, H, W, 1)`` statistics next to its ``(C,)`` scale over ``(N, H, W, C)``).

    Returns
    -------
    tuple or None
        ``((A, B, K) or (A, B, K, L), kinds)`` with ``kinds[k]`` ``"f"``, ``"c"``, ``"r"``
        (a row input) or ``"s"``; None when the inputs do not fit, or none is a channel input.
    """
    nd = len(shape)
    keep = [d for d in range(nd) if shape[d] != 1]
    full = [shape[d] for d in keep]
    blocks, kinds = [], []
    for sh in shapes:
        sh = (1,) * (nd - len(sh)) + tuple(sh)
        sub = [sh[d] for d in keep]
        if sub == full:
            kinds.append("f")
            continue
        dims = [j for j, n in enumerate(sub) if n != 1]
        if not dims:
            kinds.append("s")
            continue
        gaps = [j for j in range(dims[0], dims[-1] + 1) if j not in dims]
        blk = (dims[0], dims[-1] + 1) if not gaps else (dims[0], gaps[0], gaps[-1] + 1, len(sub))
        spans = [(blk[0], blk[1])] if not gaps else [(blk[0], blk[1]), (blk[2], blk[3])]
        if any(sub[p:q] != full[p:q] for p, q in spans) or (
            gaps and (gaps != list(range(gaps[0], gaps[-1] + 1))
                      or blk[2] != len(sub) - 1 or sub[-1] != _LANES)
        ):
            return None
        blocks.append(blk)
        kinds.append(blk)
    distinct = sorted(set(blocks))
    if not distinct or len(distinct) > 2:
        return None
    block, row = distinct[-1], None
    if len(distinct) == 2:  # the leading dims (a row's statistics) and a channel block after
        row = distinct[0]
        if len(row) != 2 or row[0] != 0 or row[1] != block[0]:
            return None
    kinds = ["f" if k == "f" else "s" if k == "s" else "r" if k == row else "c" for k in kinds]
    sizes = [math.prod(full[p:q]) for p, q in zip((0, *block), (*block, len(full)))]
    if len(block) == 4:  # A, B, K, L (the empty part after the last dims dropped)
        return tuple(sizes[:4]), tuple(kinds)
    return tuple(sizes), tuple(kinds)


def bind(
    expr: Sequence,
    inputs: Sequence[np.ndarray],
    out: np.ndarray,
    reduce: tuple | None = None,
    *,
    layouts: Sequence[str] = ("flat", "bcast", "nd"),
    parallel: bool | None = None,
) -> Callable[[], None] | None:
    """Bind a fused expression to its input and output arrays.

    Parameters
    ----------
    expr : sequence of (mode, args)
        The expression (module docstring); every mode in :data:`.elemwise_modes.FUSABLE_MODES`.
    inputs : sequence of numpy.ndarray
        float32 or float16 arrays of one dtype, broadcasting together to the full shape.
    out : numpy.ndarray
        The result, of the inputs' dtype and the full shape (reduced by ``reduce``). It may
        share memory with an input of the full shape (in-place computation).
    reduce : (mode, axis) or None
        A closing SUM/MEAN/MAX/MIN over everything (axis None, ``out`` of shape (1,)) or over
        one non-negative axis (kept with size 1).
    layouts : sequence of str
        The layouts allowed (:func:`kernel_source`), tried in the order flat, bcast, nd;
        None when the arrays fit none of them.
    parallel : bool or None
        Whether an elementwise kernel may be split along its outer loop over
        :mod:`.parallel`'s threads; None: from :func:`parallel_min_size` elements.

    Returns
    -------
    Callable[[], None] or None
        A zero-argument callable computing into ``out`` from the inputs' current contents;
        for float32 arrays of the output's shape one call of a compiled kernel, or (parallel)
        its calls on disjoint parts run at once through :mod:`.parallel`'s pool.
    """
    check_expr(expr, len(inputs), reduce)
    dtype = out.dtype
    if dtype not in (F32, F16) or any(x.dtype != dtype for x in inputs):
        dts = ", ".join(x.dtype.name for x in inputs)
        raise ValueError(f"jit: inputs ({dts}) and output ({dtype}) must be one float dtype")
    shape = full_shape([x.shape for x in inputs])
    if reduced_shape(shape, reduce) != out.shape:
        raise ValueError(f"jit: inputs of shape {shape} do not give the output shape {out.shape}")
    size = math.prod(shape)
    if reduce is not None:
        count = size if reduce[1] is None else shape[reduce[1]]
        if count == 0 and reduce[0] in ("MIN", "MAX", "MEAN") and out.size:
            raise ValueError(f"jit: reduce mode {reduce[0]} over an empty axis of {shape}")
    if out.size == 0:
        return _noop
    steps: list[Callable[[], object]] = []
    res, inputs_orig = out, inputs
    if dtype == F16:  # compute through float32 scratch
        conv = []
        for x in inputs:
            x32 = np.empty(x.shape, F32)
            steps.append(functools.partial(np.copyto, x32, x, "unsafe"))
            conv.append(x32)
        inputs = conv
        res = np.empty(out.shape, F32)
    ndim = len(shape)
    flat = (
        "flat" in layouts
        and res.flags.c_contiguous
        and (reduce is None or reduce[1] is None)
        and all(x.size == 1 or (x.shape == shape and x.flags.c_contiguous) for x in inputs)
    )
    min_size = parallel_min_size(expr)
    parallel = reduce is None and (size >= min_size if parallel is None else parallel)
    bc = None
    if not flat and reduce is None and "bcast" in layouts and res.flags.c_contiguous:
        bc = bcast_shape(shape, [x.shape for x in inputs])
        if bc is not None and not all(x.size == 1 or x.flags.c_contiguous for x in inputs):
            bc = None  # reshaping would copy: the kernel must read the arrays themselves
    if flat:
        kinds = tuple("f" if x.size == size else "s" for x in inputs)
        args = [x.reshape(-1) for x in inputs] + [res.reshape(-1)]
        layout = ("flat", kinds, _alias(args))
    elif bc is not None:
        dims, kinds = bc
        blocked = len(dims) == 4
        fshape = dims if blocked or dims[2] > 1 else dims[:2]
        cshape = (dims[1], dims[3]) if blocked else -1
        args = [x.reshape(fshape if t == "f" else cshape if t == "c" else -1)
                for x, t in zip(inputs, kinds)]  # fmt: skip
        args.append(res.reshape(fshape))
        layout = ("bcast", (kinds, "blocked" if blocked else dims[2] > 1), _alias(args))
    elif "nd" not in layouts:
        return None
    else:
        args = [np.broadcast_to(x, shape) for x in inputs] + [res]
        layout = ("nd", ndim, _alias(args))
    kshape = args[-1].shape  # the kernel's output shape
    if layout[2] is not None:
        args.pop()
    src = kernel_source(tuple(expr), layout, reduce)
    threads, parts = _split_parts(layout, args, kshape, min_size) if parallel else (1, [args])
    try:
        calls = [functools.partial(_kernel(src, part), *part) for part in parts]
    except Exception as exc:  # noqa: BLE001 - a kernel Numba can not build: run unfused
        _warn_unfused(expr, exc)
        return _bind_unfused(expr, inputs_orig, out, reduce)
    steps.append(take_in_turn([calls] * threads) if threads > 1 else concurrently(calls))
    if res is not out:
        steps.append(functools.partial(np.copyto, out, res, "unsafe"))
    return chain(steps)


def _warn_unfused(expr, exc: BaseException) -> None:
    warnings.warn(
        f"jit: compiling a fused kernel failed ({type(exc).__name__}: {exc}); running "
        f"its {len(expr)} operators unfused",
        RuntimeWarning,
        stacklevel=3,
    )


def _bind_unfused(expr, inputs, out, reduce) -> Callable[[], None]:
    """The expression as one Elemwise kernel call per node (the fallback)."""
    dtype = out.dtype
    shape = full_shape([x.shape for x in inputs])
    vals: list[np.ndarray] = []
    steps = []
    for j, (mode, args) in enumerate(expr):
        xs = [_operand(kind, x, inputs, vals, dtype) for kind, x in args]
        last = j == len(expr) - 1 and reduce is None
        res = out if last else np.empty(full_shape([a.shape for a in xs]), dtype)
        steps.append(bind_numpy(mode, xs, res))
        vals.append(res)
    if reduce is not None:
        src = vals[-1]
        if src.shape != shape:
            src = np.broadcast_to(src, shape)
        steps.append(bind_reduce(reduce[0], src, out, reduce[1]))
    return chain(steps)


def _operand(kind: str, x, inputs: Sequence[np.ndarray], vals: list, dtype) -> np.ndarray:
    """An expression node's argument: input ``x`` (kind "i"), the value of node ``x`` ("t"),
    or the constant ``x`` as a (1,) array of ``dtype``."""
    if kind == "i":
        return inputs[x]
    if kind == "t":
        return vals[x]
    return np.array([x], dtype)


def _alias(args: list[np.ndarray]) -> int | None:
    """The input that ``out`` (the last arg) is exactly (same memory, shape and strides)."""
    out = args[-1]
    for k, a in enumerate(args[:-1]):
        if same_elements(a, out) and a.flags.writeable:
            return k
    return None


#: parts per thread of a split kernel, which the threads take in turn: a thread the OS holds
#: back (the machine's other work) then delays one small part, not half of the kernel
_PARTS_PER_THREAD = 4


def _split_parts(
    layout: tuple, args: list[np.ndarray], oshape: tuple, min_size: int
) -> tuple[int, list[list[np.ndarray]]]:
    """``(threads, parts)``: the threads an elementwise kernel takes (each at least
    ``min_size // 2`` elements) and its arguments cut into disjoint parts along its outer loop
    (``oshape`` the kernel's output shape; :data:`_PARTS_PER_THREAD` per thread, views of
    the arrays): the flat layout's index; the bcast
    layout's A, or its B (full and channel operands alike) when A is 1; the nd
    layout's first dim. One part when the arrays allow no more."""
    kind, arg, _ = layout
    kinds = arg if kind == "flat" else arg[0] if kind == "bcast" else None
    axis = 1 if kind == "bcast" and oshape[0] == 1 else 0
    n = oshape[axis]
    per_item = max(1, math.prod(oshape) // max(1, n))
    min_items = max(1, -(-(min_size // 2) // per_item))
    threads = len(ranges(n, _num_parts(), min_items))
    if threads == 1:
        return 1, [args]
    bounds = ranges(n, threads * _PARTS_PER_THREAD)

    def cut(k: int, a: np.ndarray, lo: int, hi: int) -> np.ndarray:
        t = kinds[k] if kinds is not None and k < len(kinds) else "f"
        if t == "s" or (t == "c" and axis == 0) or (t == "r" and axis == 1):
            return a  # one element, a channel operand every row of A reads, or A's one row
        if t in ("c", "r") or axis == 0:
            return a[lo:hi]
        return a[:, lo:hi]

    return threads, [[cut(k, a, lo, hi) for k, a in enumerate(args)] for lo, hi in bounds]


def _noop() -> None:
    pass


def interpret(
    expr: Sequence,
    inputs: Sequence[np.ndarray],
    reduce: tuple | None = None,
) -> np.ndarray:
    """Evaluate ``expr`` op by op with the unfused Elemwise kernels (no compilation).

    Used for static value inference and as the reference in tests.
    """
    inputs = [np.asarray(x) for x in inputs]
    dtype = inputs[0].dtype
    vals: list[np.ndarray] = []
    for mode, args in expr:
        xs = [_operand(kind, x, inputs, vals, dtype) for kind, x in args]
        vals.append(compute(mode, *xs))
    res = vals[-1]
    if reduce is None:
        return res
    out = np.empty(reduced_shape(res.shape, reduce), dtype)
    bind_reduce(reduce[0], res, out, reduce[1])()
    return out
