"""One harness for operator tests: build a graph over host inputs, run it, compare with NumPy.

Works at the graph level (below the API objects) so operator tests do not depend on them.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from megbrain.device import CompNode
from megbrain.graph import ComputingGraph, infer_shape
from megbrain.opr import SymbolVar
from megbrain.opr.io import host2device_copy


class HostValue:
    """The source-tensor protocol Host2DeviceCopy reads: a settable host array."""

    def __init__(self, arr: np.ndarray, comp_node):
        self.arr = np.ascontiguousarray(arr)
        self.comp_node = comp_node
        self.dtype = self.arr.dtype

    def empty(self) -> bool:
        return self.arr is None

    def shape_valid(self) -> bool:
        return self.arr is not None

    @property
    def shape(self):
        return self.arr.shape

    def as_ndarray(self) -> np.ndarray:
        return self.arr

    # what Host2DeviceCopy.runtime_state compares: the buffer and the layout of ``arr``
    @property
    def storage(self) -> tuple:
        return _Buffer(self.arr.__array_interface__["data"][0], self.arr.nbytes)

    @property
    def layout(self) -> tuple:
        return (self.arr.shape, self.arr.strides, self.arr.dtype)


class _Buffer(NamedTuple):
    ptr: int
    size: int


def make_graph(**options) -> ComputingGraph:
    g = ComputingGraph()
    for k, v in options.items():
        g.options.set(k.replace("__", "."), v)
    return g


def inputs(graph: ComputingGraph, *arrays, comp_node="cpu0", value_infer=True):
    """Host2DeviceCopy vars over ``arrays``; returns (vars, host values)."""
    cn = CompNode.load(comp_node)
    hosts = [HostValue(np.asarray(a), cn) for a in arrays]
    vars_ = [
        host2device_copy(graph, h, enable_value_infer=value_infer, name=f"x{i}")
        for i, h in enumerate(hosts)
    ]
    return vars_, hosts


def run(outputs, graph: ComputingGraph | None = None) -> list[np.ndarray]:
    """Compile and run ``outputs`` once; return copies of their values."""
    outputs = [o.node if isinstance(o, SymbolVar) else o for o in outputs]
    graph = graph or outputs[0].graph
    got: dict[int, np.ndarray] = {}
    spec = [(v, (lambda a, i=i: got.__setitem__(i, np.array(a)))) for i, v in enumerate(outputs)]
    f = graph.compile(spec)
    f.execute().wait()
    return [got[i] for i in range(len(outputs))]


def build_and_run(build, *arrays):
    """``build`` applied to input vars holding ``arrays``: (the output var, its value)."""
    g = make_graph()
    xs, _ = inputs(g, *arrays)
    out = build(*xs)
    (got,) = run([out], g)
    return out, got


def check_opr(build, ref, arrays, *, rtol=1e-5, atol=1e-6, value_infer=True):
    """Build ``build(*vars)`` over host inputs, run, and compare with ``ref(*arrays)``.

    Also checks that the statically inferred shape equals the executed one, and that
    ``inferred_value`` (where available) equals the executed value.
    """
    g = make_graph()
    xs, _ = inputs(g, *arrays, value_infer=value_infer)
    out = build(*xs)
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    refs = ref(*arrays)
    refs = list(refs) if isinstance(refs, (list, tuple)) else [refs]
    got = run(outs, g)
    for o, r, a in zip(outs, refs, got):
        r = np.asarray(r)
        assert a.shape == r.shape, (a.shape, r.shape)
        np.testing.assert_allclose(a.astype(np.float64), r.astype(np.float64), rtol=rtol, atol=atol)
        node = o.node if isinstance(o, SymbolVar) else o
        if node.shape_static:
            assert infer_shape(node) == a.shape
        iv = o.inferred_value if isinstance(o, SymbolVar) else None
        if iv is not None:
            np.testing.assert_allclose(
                iv.astype(np.float64), a.astype(np.float64), rtol=rtol, atol=atol
            )
    return got


def check_grad(build, arrays, *, wrt=None, eps=1e-6, rtol=1e-4, atol=1e-6, seed=0):
    """Check ``grad`` of ``build(*vars)`` against central finite differences in float64.

    The output is reduced to a scalar as ``sum(out * r)`` with a fixed random ``r``, so
    every output element is exercised. ``wrt`` selects the input indices (default: all).
    """
    from megbrain.opr.grad import grad as graph_grad
    from megbrain.opr.io import make_immutable

    arrays = [np.asarray(a, dtype=np.float64) for a in arrays]
    wrt = list(range(len(arrays))) if wrt is None else list(wrt)
    g = make_graph()
    xs, hosts = inputs(g, *arrays)
    out = build(*xs)
    out = out[0] if isinstance(out, (list, tuple)) else out
    shape = infer_shape(out.node)
    r = np.random.default_rng(seed).standard_normal(shape)
    loss = (out * make_immutable("cpu0", g, r, dtype=np.float64)).sum()
    grads = graph_grad(loss, [xs[i] for i in wrt], warn_mid_wrt=False)
    got = run([loss, *grads], g)
    analytic = got[1:]

    f = g.compile([(loss.node, lambda a: box.__setitem__(0, float(np.asarray(a).ravel()[0])))])
    box = [0.0]

    def loss_at():
        f.execute().wait()
        return box[0]

    for gi, i in enumerate(wrt):
        base = arrays[i]
        num = np.zeros_like(base)
        flat = num.reshape(-1)
        for k in range(base.size):
            for sign in (1, -1):
                pert = base.copy().reshape(-1)
                pert[k] += sign * eps
                hosts[i].arr = pert.reshape(base.shape)
                flat[k] += sign * loss_at()
            flat[k] /= 2 * eps
        hosts[i].arr = base
        np.testing.assert_allclose(
            analytic[gi], num, rtol=rtol, atol=atol, err_msg=f"gradient of input {i}"
        )
    return analytic
