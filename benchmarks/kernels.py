"""Large-kernel benchmarks: megbrain operators run through compiled graphs against the best
plain-NumPy formulation of the same computation, and against PyTorch / onnxruntime when they
are installed.

Run ``python benchmarks/kernels.py [--repeat N]``. Ours and NumPy are timed interleaved, round
after round in one process, on the same buffers, and each keeps its best time, so a noisy
neighbour hurts both alike; peers are timed after them. The table reports
``ratio = numpy time / ours time`` (>= target is good) and each peer's time. Sections are plain
functions returning rows; add one to ``SECTIONS``.
"""

from __future__ import annotations

import os

# peers' OpenMP pools (PyTorch) must not spin between calls and steal our cores
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import contextlib
import functools
import importlib.util
import time
from collections.abc import Callable

import numpy as np
from numpy.lib.stride_tricks import as_strided

import megbrain as mgb
from megbrain.kernels import parallel
from megbrain.kernels.pool import binds as dnn_pool
from megbrain.opr.base import create_opr
from megbrain.opr.blas import matrix_mul
from megbrain.opr.dnn import ConvolutionParam, convolution, deconvolution
from megbrain.opr.dnn_norm import batch_norm_no_statistic
from megbrain.opr.dnn_pool import PoolingParam, pooling

CN = "cpu0"
RNG = np.random.default_rng(0)


# ---- timing --------------------------------------------------------------------------------
def best_times(fns: dict[str, Callable[[], object]], repeat: int, warmup_s: float = 1.0):
    """Best wall time (s) of each callable over ``repeat`` interleaved rounds.

    Interleaved warmup rounds run first for ``warmup_s`` seconds (at least two): the first
    touches of large fresh buffers are page faults (transparent huge pages) for a while.
    """
    t_end = time.perf_counter() + warmup_s
    rounds = 0
    while rounds < 2 or time.perf_counter() < t_end:
        for f in fns.values():
            f()
        rounds += 1
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeat):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            best[k] = min(best[k], time.perf_counter() - t0)
    return best


class Compiled:
    """``build(*shared vars)`` compiled with its output computed (not copied out).

    ``ins`` and ``out`` are the graph's own input and output arrays: the NumPy formulations
    read and write exactly these buffers, so that both sides see the same memory placement
    (addresses that coincide modulo 4096 slow strided loops down by up to a third).
    """

    def __init__(self, build: Callable[..., object], arrays: list[np.ndarray]):
        g = mgb.comp_graph()
        vars_ = [mgb.make_shared(CN, value=a, comp_graph=g) for a in arrays]
        self.y = build(*vars_)
        self.graph = g
        self.run = g.compile(None, [self.y])
        self.run()
        plan = self.run._func.var_arrays()
        # a shape-only input (the filter of ConvolutionBackwardFilter) has no buffer
        self.ins = [plan.get(v.node, a) for v, a in zip(vars_, arrays)]
        self.out = plan[self.y.node]

    def result(self) -> np.ndarray:
        """Compile again with the output copied out, run and return it."""
        return np.asarray(self.graph.compile(None, mgb.copy_output(self.y))())


def f32(*shape) -> np.ndarray:
    return RNG.standard_normal(shape, dtype=np.float32)


def have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


# ---- NumPy formulations (each writes into ``out``, the graph's output buffer) -------------
def np_windows(padded: np.ndarray, f: int, o: int, stride: int) -> np.ndarray:
    s = padded.strides
    shape = padded.shape[:2] + (f, f, o, o)
    return as_strided(padded, shape, (s[0], s[1], s[2], s[3], s[2] * stride, s[3] * stride))


def np_conv_fwd(x, w, out, pad):
    """Padded copy, im2col into a preallocated buffer, one matmul with out= (stride 1)."""
    n, c, h, _ = x.shape
    k, _, f, _ = w.shape
    o = out.shape[2]
    padded = np.zeros((n, c, h + 2 * pad, h + 2 * pad), x.dtype)
    interior = padded[:, :, pad : pad + h, pad : pad + h]
    win = np_windows(padded, f, o, 1)
    col = np.empty((n, c, f, f, o, o), x.dtype)
    colm = col.reshape(n, c * f * f, o * o)
    wm = w.reshape(k, -1)
    outm = out.reshape(n, k, o * o)

    def run():
        np.copyto(interior, x)
        np.copyto(col, win)
        np.matmul(wm, colm, out=outm)

    return run


def np_conv_bwd_data(dy, w, out, pad):
    """matmul(W^T, dy) into preallocated columns, col2im (one strided add per offset)."""
    n, k, o, _ = dy.shape
    _, c, f, _ = w.shape
    h = out.shape[2]
    wmt = w.reshape(k, -1).T
    dym = dy.reshape(n, k, o * o)
    dcol = np.empty((n, c, f, f, o, o), dy.dtype)
    dcolm = dcol.reshape(n, c * f * f, o * o)
    padded = np.empty((n, c, h + 2 * pad, h + 2 * pad), dy.dtype)
    adds = [
        (padded[:, :, i : i + o, j : j + o], dcol[:, :, i, j]) for i in range(f) for j in range(f)
    ]

    def run():
        np.matmul(wmt, dym, out=dcolm)
        padded.fill(0)
        for t, s in adds:
            np.add(t, s, t)
        np.copyto(out, padded[:, :, pad : pad + h, pad : pad + h])

    return run


def np_conv_bwd_filter(x, dy, _w, out, pad):
    """im2col, batched matmul against the transposed columns, sum over the batch."""
    n, c, h, _ = x.shape
    k, o = dy.shape[1], dy.shape[2]
    f = out.shape[2]
    padded = np.zeros((n, c, h + 2 * pad, h + 2 * pad), x.dtype)
    interior = padded[:, :, pad : pad + h, pad : pad + h]
    win = np_windows(padded, f, o, 1)
    col = np.empty((n, c, f, f, o, o), x.dtype)
    colt = col.reshape(n, c * f * f, o * o).transpose(0, 2, 1)
    dym = dy.reshape(n, k, o * o)
    prod = np.empty((n, k, c * f * f), x.dtype)
    outm = out.reshape(k, c * f * f)

    def run():
        np.copyto(interior, x)
        np.copyto(col, win)
        np.matmul(dym, colt, out=prod)
        np.add.reduce(prod, 0, None, outm)

    return run


def np_pool_fwd(x, out, mode, f, stride, pad):
    """Padded copy, one ufunc per window offset over strided window views."""
    n, c, h, _ = x.shape
    fill = -np.inf if mode == "MAX" else 0
    padded = np.full((n, c, h + 2 * pad, h + 2 * pad), fill, x.dtype)
    interior = padded[:, :, pad : pad + h, pad : pad + h]
    win = np_windows(padded, f, out.shape[2], stride)
    ufunc = np.maximum if mode == "MAX" else np.add

    def run():
        np.copyto(interior, x)
        np.copyto(out, win[:, :, 0, 0])
        for i in range(f):
            for j in range(f):
                if i or j:
                    ufunc(out, win[:, :, i, j], out=out)
        if mode != "MAX":
            np.true_divide(out, f * f, out)

    return run


def np_pool_bwd_max(x, y, dy, out, f, stride, pad):
    """Padded source and gradient; per offset: hit = (window == max) as float, add hit * diff
    (``np.add(..., where=mask)`` is 1.8x slower)."""
    n, c, h, _ = x.shape
    o = dy.shape[2]
    padded = np.full((n, c, h + 2 * pad, h + 2 * pad), -np.inf, x.dtype)
    interior = padded[:, :, pad : pad + h, pad : pad + h]
    win = np_windows(padded, f, o, stride)
    gpad = np.empty_like(padded)
    last = stride * (o - 1) + 1
    gwin = [gpad[:, :, i : i + last : stride, j : j + last : stride] for i, j in np.ndindex(f, f)]
    hit = np.empty(dy.shape, dy.dtype)

    def run():
        np.copyto(interior, x)
        gpad.fill(0)
        for (i, j), t in zip(np.ndindex(f, f), gwin):
            np.equal(win[:, :, i, j], y, hit, casting="unsafe")
            np.multiply(hit, dy, hit)
            np.add(t, hit, t)
        np.copyto(out, gpad[:, :, pad : pad + h, pad : pad + h])

    return run


def np_pool_bwd_avg(_x, _y, dy, out, f, stride, pad):
    """Non-overlapping windows without padding (stride == window dividing the size): the
    scaled diff written to each window offset's strided view, no fill; otherwise a padded
    gradient, one strided add of the scaled diff per offset."""
    n, c, h, _ = out.shape
    o = dy.shape[2]
    scaled = np.empty(dy.shape, dy.dtype)
    if f == stride and pad == 0 and h % f == 0:
        views = [out[:, :, i::f, j::f] for i, j in np.ndindex(f, f)]

        def run():
            np.multiply(dy, dy.dtype.type(1 / (f * f)), scaled)
            for v in views:
                np.copyto(v, scaled)

        return run
    gpad = np.empty((n, c, h + 2 * pad, h + 2 * pad), dy.dtype)
    last = stride * (o - 1) + 1
    gwin = [gpad[:, :, i : i + last : stride, j : j + last : stride] for i, j in np.ndindex(f, f)]

    def run():
        np.multiply(dy, dy.dtype.type(1 / (f * f)), scaled)
        gpad.fill(0)
        for t in gwin:
            np.add(t, scaled, t)
        np.copyto(out, gpad[:, :, pad : pad + h, pad : pad + h])

    return run


# ---- peers ---------------------------------------------------------------------------------
def torch_peer(fn_name: str, *arrays, **kw):
    if not have("torch"):
        return None
    import torch
    import torch.nn.functional as F  # noqa: N812

    ts = [None if a is None else torch.from_numpy(a) for a in arrays]
    fn = {
        "conv2d": lambda: F.conv2d(*ts, **kw),
        "conv_transpose2d": lambda: F.conv_transpose2d(*ts, **kw),
        "conv2d_weight": lambda: torch.nn.grad.conv2d_weight(
            ts[0], kw["shape"], ts[1], padding=kw["padding"]
        ),
        "max_pool2d": lambda: F.max_pool2d(*ts, **kw),
        "avg_pool2d": lambda: F.avg_pool2d(*ts, **kw),
        "matmul": lambda: torch.matmul(*ts),
        "batch_norm": lambda: F.batch_norm(*ts, **kw),
    }[fn_name]

    def run():
        with torch.no_grad():
            fn()

    return run


def torch_pool_bwd_peer(x, dy, fn_name="max_pool2d", **kw):
    """PyTorch's pooling backward (autograd through one recorded ``F.<fn_name>``)."""
    if not have("torch"):
        return None
    import torch
    import torch.nn.functional as F  # noqa: N812

    tx = torch.from_numpy(x).requires_grad_()
    ty = getattr(F, fn_name)(tx, **kw)
    tdy = torch.from_numpy(dy)
    return lambda: torch.autograd.grad(ty, tx, tdy, retain_graph=True)


def ort_conv_peer(x, w, pad):
    if not have("onnxruntime") or not have("onnx"):
        return None
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[pad] * 4)
    graph = helper.make_graph(
        [node],
        "conv",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, w.shape),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = parallel.num_threads()  # the threads ours use (BLAS's)
    sess = ort.InferenceSession(
        onnx.helper.make_model(graph).SerializeToString(), opts, providers=["CPUExecutionProvider"]
    )
    return lambda: sess.run(None, {"x": x, "w": w})


# ---- sections ------------------------------------------------------------------------------
def row(name, flops, ours: Compiled, numpy_fn, target, peers, repeat):
    """Time ours against ``numpy_fn(*ours.ins, ours.out)`` (and peers); check they agree."""
    baseline = numpy_fn(*ours.ins, ours.out)
    t = best_times({"ours": ours.run, "numpy": baseline}, repeat)
    # peers run after, in their own rounds: their thread pools must not disturb ours
    t.update(best_times({k: v for k, v in peers.items() if v is not None}, repeat))
    want = ours.result()
    baseline()
    err = float(np.max(np.abs(ours.out - want)) / max(1e-30, float(np.max(np.abs(want)))))
    if err > 1e-4:
        raise SystemExit(f"{name}: results differ (relative error {err:.2e})")
    peer_txt = ", ".join(
        f"{k} {t[k] * 1e3:.2f} ms" if v is not None else f"{k} n/a" for k, v in peers.items()
    )
    return (name, t["ours"], t["numpy"], t["numpy"] / t["ours"], target, flops, peer_txt)


def _create(type_name: str, param):
    """A builder inserting ``type_name`` through the registry, as the deserializer does."""

    def build(*vs):
        return create_opr(type_name, [v.node for v in vs], param, mgb.make_opr_config())[0]

    return build


def _algo(compiled: Compiled) -> str:
    """The kernel algorithm the compiled convolution operator chose."""
    return getattr(compiled.y.node.owner, "chosen_algorithm", None) or "?"


def conv_section(repeat):
    n, c, k, h, f, pad = 8, 64, 64, 56, 3, 1
    # the execution policy of the three operators (HEURISTIC unless this variable says)
    kw = dict(pad_h=pad, pad_w=pad, strategy=os.environ.get("MGB_BENCH_CONV_STRATEGY", "HEURISTIC"))
    x, w, dy = f32(n, c, h, h), f32(k, c, f, f), f32(n, k, h, h)
    flops = 2 * n * k * c * f * f * h * h
    fwd = Compiled(lambda a, b: convolution(a, b, **kw), [x, w])
    bwd_data = Compiled(lambda d, b: deconvolution(d, b, **kw), [dy, w])
    bwd_filter = Compiled(_create("ConvolutionBackwardFilter", ConvolutionParam(**kw)), [x, dy, w])
    peers_fwd = {
        "torch": torch_peer("conv2d", x, w, padding=pad),
        "onnxruntime": ort_conv_peer(x, w, pad),
    }
    # each case names the algorithm chosen: "case [ALGORITHM]"
    return [
        row(f"conv fwd {n}x{c}x{h}x{h} {f}x{f} p{pad} [{_algo(fwd)}]", flops, fwd,
            lambda a, b, o: np_conv_fwd(a, b, o, pad), 1.0, peers_fwd, repeat),
        row(f"conv bwd data [{_algo(bwd_data)}]", flops, bwd_data,
            lambda d, b, o: np_conv_bwd_data(d, b, o, pad), 1.0,
            {"torch": torch_peer("conv_transpose2d", dy, w, padding=pad)}, repeat),
        row(f"conv bwd filter [{_algo(bwd_filter)}]", flops, bwd_filter,
            lambda a, d, b, o: np_conv_bwd_filter(a, d, b, o, pad), 1.0,
            {"torch": torch_peer("conv2d_weight", x, dy, shape=w.shape, padding=pad)}, repeat),
    ]  # fmt: skip


def matmul_section(repeat):
    a, b = f32(1024, 1024), f32(1024, 1024)
    ours = Compiled(matrix_mul, [a, b])
    return [
        row("MatrixMul 1024^3", 2 * 1024**3, ours, lambda x, y, o: lambda: np.matmul(x, y, out=o),
            0.95, {"torch": torch_peer("matmul", a, b)}, repeat)
    ]  # fmt: skip


@contextlib.contextmanager
def _pool_threads(one: bool):
    """Pooling bound meanwhile runs in the calling thread (when ``one``), not split over the
    kernel threads (``dnn_pool.SPLIT_MIN_ELEMS``)."""
    saved = dnn_pool.SPLIT_MIN_ELEMS
    dnn_pool.SPLIT_MIN_ELEMS = None if one else saved
    try:
        yield " [1 thread]" if one else ""
    finally:
        dnn_pool.SPLIT_MIN_ELEMS = saved


def _pool_fwd_row(x, mode, f, s, p, repeat, one=False):
    n, c, h, _ = x.shape
    kw = dict(mode=mode, window_h=f, window_w=f, stride_h=s, stride_w=s, pad_h=p, pad_w=p)
    with _pool_threads(one) as tag:
        ours = Compiled(lambda v: pooling(v, **kw), [x])
    peer = torch_peer(
        "max_pool2d" if mode == "MAX" else "avg_pool2d", x, kernel_size=f, stride=s, padding=p
    )
    baseline = functools.partial(np_pool_fwd, mode=mode, f=f, stride=s, pad=p)
    name = f"pooling {mode} {f}x{f} s{s} p{p} {n}x{c}x{h}x{h}{tag}"
    return _with_alone(ours, lambda: row(name, None, ours, baseline, 1.0, {"torch": peer}, repeat))


def _pool_bwd_row(x, mode, f, s, p, repeat, one=False):
    n, c, h, _ = x.shape
    kw = dict(mode=mode, window_h=f, window_w=f, stride_h=s, stride_w=s, pad_h=p, pad_w=p)
    y = Compiled(lambda v: pooling(v, **kw), [x]).result()
    dy = f32(*y.shape)
    param = PoolingParam(mode, p, p, s, s, f, f)
    with _pool_threads(one) as tag:
        bwd = Compiled(_create("PoolingBackward", param), [x, y, dy])
    baseline = functools.partial(
        np_pool_bwd_max if mode == "MAX" else np_pool_bwd_avg, f=f, stride=s, pad=p
    )
    peer = torch_pool_bwd_peer(
        x, dy, "max_pool2d" if mode == "MAX" else "avg_pool2d", kernel_size=f, stride=s, padding=p
    )
    name = f"pooling bwd {mode} {f}x{f} s{s} p{p} {n}x{c}x{h}x{h}{tag}"
    return _with_alone(bwd, lambda: row(name, None, bwd, baseline, 1.0, {"torch": peer}, repeat))


def _with_alone(ours: Compiled, make_row: Callable[[], tuple], repeat: int = 15) -> tuple:
    """``make_row()``'s row with ours also timed alone (before it: the row recompiles), as
    the peers are: interleaved with the NumPy formulation, whose temporaries evict the cache,
    an L3-sized pooling reads its input from memory (128x16x28x28 MAX backward 1.17 vs 0.49
    ms alone, load 2), the peer's from cache."""
    alone = best_times({"ours": ours.run}, repeat, warmup_s=0.3)["ours"]
    r = make_row()
    return r[:-1] + (f"{r[-1]}; ours alone {alone * 1e3:.2f} ms",)


def _rotated_best_times(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Best time of each callable over ``rounds`` rounds, each round starting one callable
    later than the one before (every callable runs at every position of a round equally
    often: none always follows the same neighbour, whose cache footprint it would inherit)."""
    best_times(fns, 1)  # warmup
    names = list(fns)
    best = dict.fromkeys(names, float("inf"))
    for r in range(rounds):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            t0 = time.perf_counter()
            fns[k]()
            best[k] = min(best[k], time.perf_counter() - t0)
    return best


def _pool_offsets_row(x, repeat, count=5):
    """AVERAGE 2x2/s2 pooling with its input at ``count`` different offsets modulo 4096 from
    its planned output (4 KiB aliasing between the loads and the stores slows some loops
    down): the input is a copy-free view ``flat[k:]`` of a shared var with ``k`` leading
    elements, and the plan's var arrays say where each lands. Reports max / min time, and as
    a control the ratio between the first offset's graph and another graph within 256 B of
    that offset (other buffers): on a loaded machine two such graphs differed up to 1.7x."""
    n, c, h, _ = x.shape
    kw = dict(mode="AVERAGE", window_h=2, window_w=2, stride_h=2, stride_w=2)

    def build(k):
        flat = np.concatenate([np.zeros(k, x.dtype), x.ravel()])
        ours = Compiled(lambda v, k=k: pooling(v[k:].reshape(x.shape), **kw), [flat])
        src = ours.run._func.var_arrays()[ours.y.node.owner.inputs[0]]
        assert np.shares_memory(src, ours.ins[0]), "the pooling input must be a view"
        return ours, (ours.out.ctypes.data - src.ctypes.data) % 4096

    runs, rels, first = {}, [], None
    for k in range(0, 4096, 80):
        ours, rel = build(k)
        if all(abs(rel - r) >= 512 for r in rels):  # offsets a few hundred bytes apart
            rels.append(rel)
            runs[f"offset {rel}"] = ours.run
            first = (k, rel) if first is None else first
        if len(runs) == count:
            break
    for k in range(0, 40 * 80, 80):  # buffers land anywhere: build until one is near
        copy, copy_rel = build(k)
        if abs(copy_rel - first[1]) <= 256:
            runs["copy"] = copy.run
            break
    t = _rotated_best_times(runs, 20 * repeat)  # a ratio of bests: more rounds
    t_copy = t.pop("copy", None)
    worst, best = max(t.values()), min(t.values())
    detail = ", ".join(f"{k} B {v * 1e3:.2f} ms" for k, v in t.items())
    control = ""
    if t_copy is not None:
        a, b = t[f"offset {first[1]}"], t_copy
        control = f"; offset {first[1]} B vs another at {copy_rel} B: {max(a, b) / min(a, b):.2f}"
    name = f"pooling AVERAGE 2x2 {n}x{c}x{h}x{h} offsets"
    # the ratio column is min / max (>= 1 / 1.2, i.e. max / min <= 1.2)
    return (name, worst, best, best / worst, 1 / 1.2, None,
            f"max/min {worst / best:.2f}: {detail}{control}")  # fmt: skip


def pooling_section(repeat):
    x = f32(8, 64, 112, 112)
    # benchmarks/training.py's CNN: its two 2x2 max-pools; the LeNet's two
    cnn, cnn2 = f32(128, 16, 28, 28), f32(128, 32, 14, 14)
    lenet, lenet2 = f32(64, 20, 24, 24), f32(64, 50, 8, 8)
    return [
        _pool_fwd_row(x, "MAX", 3, 2, 1, repeat),
        _pool_fwd_row(x, "AVERAGE", 2, 2, 0, repeat),
        _pool_bwd_row(x, "MAX", 3, 2, 1, repeat),
        _pool_bwd_row(x, "AVERAGE", 2, 2, 0, repeat),
        _pool_fwd_row(cnn, "MAX", 2, 2, 0, repeat),
        _pool_bwd_row(cnn, "MAX", 2, 2, 0, repeat),
        _pool_fwd_row(cnn2, "MAX", 2, 2, 0, repeat),
        _pool_bwd_row(cnn2, "MAX", 2, 2, 0, repeat),
        _pool_bwd_row(lenet, "MAX", 2, 2, 0, repeat),
        _pool_bwd_row(lenet2, "MAX", 2, 2, 0, repeat),
        _pool_offsets_row(x, repeat),
        # the same kernels in one thread (dnn_pool.SPLIT_MIN_ELEMS=None): whether the split pays
        _pool_fwd_row(x, "MAX", 3, 2, 1, repeat, one=True),
        _pool_bwd_row(x, "MAX", 3, 2, 1, repeat, one=True),
        _pool_bwd_row(cnn, "MAX", 2, 2, 0, repeat, one=True),
        _pool_bwd_row(cnn2, "MAX", 2, 2, 0, repeat, one=True),
    ]


def np_batch_norm_train(x, scale, bias, out, eps=1e-4):
    """Training-mode BatchNorm over (N, H, W) per channel, into preallocated buffers."""
    c = x.shape[1]
    mean = np.empty((1, c, 1, 1), np.float32)
    var = np.empty((1, c, 1, 1), np.float32)
    tmp = np.empty_like(x)

    def run():
        np.mean(x, axis=(0, 2, 3), keepdims=True, out=mean)
        np.subtract(x, mean, out=tmp)
        np.multiply(tmp, tmp, out=out)
        np.mean(out, axis=(0, 2, 3), keepdims=True, out=var)
        np.add(var, eps, out=var)
        np.sqrt(var, out=var)
        np.divide(scale, var, out=var)
        np.multiply(tmp, var, out=out)
        np.add(out, bias, out=out)

    return run


def batchnorm_section(repeat):
    n, c, h = 8, 64, 56
    x, scale, bias = f32(n, c, h, h), f32(1, c, 1, 1), f32(1, c, 1, 1)
    ours = Compiled(
        lambda a, s, b: batch_norm_no_statistic(a, s, b, param_dim="DIM_1C11")[-1], [x, scale, bias]
    )
    return [
        row(f"BatchNorm train fwd {n}x{c}x{h}x{h}", None, ours, np_batch_norm_train, 0.9,
            {"torch": torch_peer("batch_norm", x, None, None, training=True)}, repeat)
    ]  # fmt: skip


SECTIONS = [conv_section, matmul_section, pooling_section, batchnorm_section]


def environment() -> str:
    lines = []
    try:
        from threadpoolctl import threadpool_info

        for info in threadpool_info():
            lines.append(
                f"  {info.get('internal_api')} {info.get('version')} "
                f"threads={info.get('num_threads')} arch={info.get('architecture')}"
            )
    except ImportError:
        lines.append("  threadpoolctl not installed")
    env = {k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if k in os.environ}
    lines.append(f"  OpenBLAS env: {env if env else 'not set'}; cpus={os.cpu_count()}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=15, help="timed rounds per case")
    ap.add_argument(
        "--only",
        default="",
        help="comma-separated section names (conv, matmul, pooling, batchnorm)",
    )
    args = ap.parse_args()
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    print("environment:\n" + environment())
    sections = [f for f in SECTIONS if not only or f.__name__.removesuffix("_section") in only]
    rows = [r for section in sections for r in section(args.repeat)]
    head = f"{'case':44} {'ours ms':>9} {'numpy ms':>9} {'ratio':>6} {'target':>6} {'GFLOP/s':>8}"
    print(head + "  peers")
    print("-" * (len(head) + 20))
    for name, t_ours, t_np, ratio, target, flops, peers in rows:
        gf = f"{flops / t_ours / 1e9:8.1f}" if flops else f"{'':8}"
        ok = "" if ratio >= target else " <"
        print(
            f"{name:44} {t_ours * 1e3:9.2f} {t_np * 1e3:9.2f} {ratio:6.2f} {target:6.2f} {gf}"
            f"  {peers or '-'}{ok}"
        )


if __name__ == "__main__":
    main()
