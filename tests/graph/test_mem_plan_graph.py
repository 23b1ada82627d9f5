"""The static memory plan of compiled functions:
live vars never share memory (checked with sentinels), results do not depend on the plan, and
the introspection functions."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest

import megbrain as mgb
from megbrain.graph.comp_seq import data_inputs
from megbrain.graph.operator import OperatorNodeBase
from megbrain.opr.blas import MatrixMul

CN = "cpu0"
SENTINEL = 0xFF  # a NaN in every float dtype, -1 in signed ints

PLAN_OFF = {"seq_opt.enable_mem_plan_opt": 0, "seq_opt.enable_mem_reuse_alloc": 0}
CONFIGS = {
    "default": {},
    "no_mem_plan_opt": {"seq_opt.enable_mem_plan_opt": 0},
    "no_mem_reuse": {"seq_opt.enable_mem_reuse_alloc": 0},
    "force_dynamic": {"force_dynamic_alloc": 1},
}


def _ensure_matmul_grad():
    """Until MatrixMul declares its gradient, give the training-step tests one."""
    if MatrixMul.grad is not OperatorNodeBase.grad:
        return

    def grad(self, i, out_grads):
        a, b = self.inputs
        assert not (self.param.transposeA or self.param.transposeB)
        if i == 0:
            return mgb.opr.matrix_mul(out_grads[0], b, transposeB=True).node
        return mgb.opr.matrix_mul(a, out_grads[0], transposeA=True).node

    MatrixMul.grad = grad


# ---- graphs ------------------------------------------------------------------------------
def _graph(opts=None):
    g = mgb.comp_graph()
    for k, v in (opts or {}).items():
        g.set_option(k, v)
    return g


def build_mixed(g, n=8):
    """Elementwise chains, views (reshape, non-contiguous dimshuffle, subtensor), matmul,
    reductions, broadcast, concat and typecvt, with branches of several sizes."""
    x = mgb.make_arg(CN, g, name="x", shape=(n, 2 * n))
    w = mgb.make_shared(
        CN,
        value=np.linspace(-1, 1, 4 * n * n, dtype=np.float32).reshape(2 * n, 2 * n),
        comp_graph=g,
        name="w",
    )
    a = mgb.opr.elem.tanh(x * 1.5 + 0.25)
    b = mgb.opr.matrix_mul(a, w)
    c = (b - a) * (b + 1.0)
    t = mgb.opr.dimshuffle(c, (1, 0))  # a strided view
    d = mgb.opr.matrix_mul(t, c)  # (2n, 2n)
    e = mgb.opr.reshape(d, (4 * n, n))
    f = mgb.opr.elem.exp(e[2 : 3 * n] * 0.01)
    s = mgb.opr.reduce_(f, "SUM", axis=1, keepdims=True)  # (3n-2, 1)
    h = mgb.opr.broadcast(s, (3 * n - 2, n)) + f
    k = mgb.opr.concat(h, f * 2.0, axis=0)
    i = mgb.opr.typecvt(k, np.float16)
    j = mgb.opr.typecvt(i * 2.0, np.float32) + mgb.opr.reduce_(c, "MAX")
    out = [j, s, mgb.opr.reduce_(a * c, "SUM")]
    feed = {"x": np.random.RandomState(0).uniform(-1, 1, (n, 2 * n)).astype(np.float32)}
    return Built(g, out, [], feed, [])


def build_mlp_step(g, layers=3, batch=8, width=16):
    """A training step: forward, loss, grads and add_update of every parameter."""
    _ensure_matmul_grad()
    rng = np.random.RandomState(1)
    x = mgb.make_arg(CN, g, name="x", shape=(batch, width))
    y = mgb.make_arg(CN, g, name="y", shape=(batch, width))
    params, h = [], x
    for i in range(layers):
        w = mgb.make_shared(
            CN, value=(rng.randn(width, width) / 4).astype(np.float32), comp_graph=g, name=f"w{i}"
        )
        b = mgb.make_shared(CN, value=np.zeros((1, width), np.float32), comp_graph=g, name=f"b{i}")
        params += [w, b]
        h = mgb.opr.matrix_mul(h, w) + b
        if i < layers - 1:
            h = mgb.opr.elem.relu(h)
    d = h - y
    loss = mgb.opr.reduce_(d * d, "SUM") / (batch * width)
    grads = mgb.grad(loss, params)
    ups = [mgb.opr.add_update(p, gr, beta=-0.1) for p, gr in zip(params, grads)]
    feed = {
        "x": rng.randn(batch, width).astype(np.float32),
        "y": rng.randn(batch, width).astype(np.float32),
    }
    return Built(g, [loss], ups, feed, params)


@dataclass
class Built:
    graph: object
    out: list  # copied out
    side: list  # computed only (add_update)
    feed: dict
    params: list

    def compile(self):
        return _compile(self.graph, self.out, self.side)

    def run(self, func):
        """The copied outputs and the current parameter values after one run."""
        res = func(**self.feed)
        return list(res) + [p.get_value().copy() for p in self.params]


def _compile(g, outs, side=()):
    """copy_output of every var of ``outs``, computing ``side`` too."""
    return g.compile(None, [mgb.copy_output(v) for v in outs] + list(side))


# ---- sentinel checking run ----------------------------------------------------------------
def _byte_range(arr):
    lo, hi = np.lib.array_utils.byte_bounds(arr)
    return lo, hi


def checked_run(func) -> dict:
    """Run ``func``'s plan operator by operator, checking the memory plan with sentinels.

    Before each operator, every var still live (produced, and read at or after this
    operator) must hold exactly the bytes it had when produced: no other var was written
    over it. After each operator, every arena byte that no live var covers is overwritten
    with ``SENTINEL``, so reading memory the plan considers free corrupts the results.
    Returns ``{var: value at production}``.
    """
    core = func._func
    plan = core._ensure_plan()
    seq = core.seq
    pos = {o: i for i, o in enumerate(seq)}
    last = {}
    for i, opr in enumerate(seq):
        for v in data_inputs(opr):
            last[v] = i
    steps: dict = {}
    for fn, opr in zip(plan.steps[0], plan.step_oprs[0]):
        steps.setdefault(opr, []).append(fn)
    arenas = [a for a in plan.arenas.values() if a.nbytes]
    snap, values = {}, {}
    for p, opr in enumerate(seq):
        for v, b in snap.items():
            if pos[v.owner] < p <= last.get(v, -1):
                assert plan.arrays[v].tobytes() == b, (
                    f"{v.name!r} (live until step {last[v]}) overwritten before step {p} "
                    f"{opr.name!r}"
                )
        for fn in steps.get(opr, ()):
            fn()
        for v in opr.outputs:
            arr = plan.arrays.get(v)
            if arr is not None and v not in plan.dynamic:
                snap[v] = arr.tobytes()
                values[v] = arr.copy()
        live = [plan.arrays[v] for v in snap if pos[v.owner] <= p < last.get(v, -1)]
        for arena in arenas:
            a0 = _byte_range(arena)[0]
            free = np.ones(arena.nbytes, bool)
            for arr in live:
                lo, hi = _byte_range(arr)
                free[max(lo - a0, 0) : max(min(hi - a0, arena.nbytes), 0)] = False
            arena[free] = SENTINEL
    return values


def _reference(builder):
    b = builder(_graph(PLAN_OFF))
    return b.run(b.compile())


@pytest.mark.parametrize("builder", [build_mixed, build_mlp_step])
def test_live_vars_never_share_memory(builder):
    ref = _reference(builder)
    b = builder(_graph())
    f = b.compile()
    f._setup_args((), dict(b.feed))
    values = checked_run(f)
    plan = f._func._plan
    assert plan.arenas, "nothing was placed in an arena"
    # the plan reuses memory: the arena is smaller than the vars it holds
    total = sum(plan.arrays[r].nbytes for r in plan.chunks)
    assert sum(a.nbytes for a in plan.arenas.values()) < total
    outs = [v for v, _ in f._func.outspec[: len(b.out)]]
    got = [values[v] for v in outs] + [p.get_value() for p in b.params]
    for a, r in zip(got, ref):
        np.testing.assert_array_equal(a, r)


def test_sentinel_run_detects_a_broken_plan():
    """The checker itself: moving a live var onto another one's memory is reported."""
    g = _graph()
    x = mgb.make_arg(CN, g, name="x", shape=(64,))
    a = mgb.opr.elem.exp(x)
    b = mgb.opr.elem.sin(x)  # not products: arith_fuse would fold them into FUSE_MUL_ADD
    c = a + b + x  # a and b are live together
    f = _compile(g, [c])
    f(x=np.ones(64, np.float32))
    plan = f._func._plan
    av, bv = a.node, b.node
    assert plan.decisions[av][0] == plan.decisions[bv][0] == "alloc"
    plan.arrays[bv] = plan.arrays[av]
    f._func._bind_program(plan)
    with pytest.raises(AssertionError, match="overwritten"):
        checked_run(f)


# ---- identical results with planning on and off -----------------------------------------
@pytest.mark.parametrize("builder", [build_mixed, build_mlp_step])
def test_results_identical_with_planning_on_and_off(builder):
    results = {}
    for name, opts in CONFIGS.items():
        b = builder(_graph(opts))
        f = b.compile()
        results[name] = [b.run(f), b.run(f)]  # the second run sees the updated parameters
    for name, res in results.items():
        for run, ref in zip(res, results["default"]):
            for a, r in zip(run, ref):
                np.testing.assert_array_equal(a, r, err_msg=name)


@pytest.mark.parametrize("config", ["no_mem_plan_opt", "force_dynamic"])
def test_add_update_output_without_mem_plan_opt(config):
    g = _graph(CONFIGS[config])
    w = mgb.make_shared(CN, value=np.ones(4, np.float32), comp_graph=g, name="w")
    f = _compile(g, [mgb.opr.add_update(w, np.full(4, 2, np.float32))])
    np.testing.assert_array_equal(f()[0], np.full(4, 3, np.float32))


def test_mem_plan_opt_off_means_no_forwarding_or_inplace():
    for opts, kinds in [({}, {"forward", "inplace"}), (CONFIGS["no_mem_plan_opt"], set())]:
        b = build_mixed(_graph(opts))
        b.run(b.compile())
        info = b.graph.current_exec.mem_alloc_info()
        # sources (the shared w, the input x, constants) are their tensors' memory whatever
        # the options
        found = {
            d["kind"] for d in info if d["name"] not in ("w", "x") and "const" not in d["name"]
        }
        assert kinds <= found if kinds else not found & {"forward", "inplace"}


def test_mem_reuse_off_gives_every_var_its_own_memory():
    b = build_mixed(_graph(CONFIGS["no_mem_reuse"]))
    f = b.compile()
    b.run(f)
    info = [d for d in b.graph.current_exec.mem_alloc_info() if d["kind"] == "static"]
    spans = sorted((d["addr"], d["addr"] + d["size"]) for d in info if d["size"])
    for (_, hi), (lo, _) in zip(spans, spans[1:]):
        assert hi <= lo
    size = sum(f.update_static_alloc_plan_and_get_size().values())
    assert size == sum(d["size"] for d in info)


# ---- introspection -----------------------------------------------------------------------
def test_update_static_alloc_plan_and_get_size_does_not_allocate():
    b = build_mixed(_graph())  # x has a shape but no value yet
    f = b.compile()
    sizes = f.update_static_alloc_plan_and_get_size()
    assert f._func._plan is None
    ((cn, nbytes),) = sizes.items()
    assert isinstance(nbytes, int) and nbytes > 0
    assert str(cn).startswith("cpu0")
    b.run(f)
    assert sum(a.nbytes for a in f._func._plan.arenas.values()) == nbytes
    assert f.update_static_alloc_plan_and_get_size() == sizes


def test_arena_within_lower_bound_on_training_step():
    b = build_mlp_step(_graph(), layers=4, batch=16, width=32)
    f = b.compile()
    b.run(f)
    size = f.update_static_alloc_plan_and_get_size()
    bound = f._func.static_alloc_lower_bound()
    for cn, nbytes in size.items():
        assert bound[cn] <= nbytes <= 1.05 * bound[cn]


def test_clear_device_memory_then_rerun():
    b = build_mixed(_graph())
    f = b.compile()
    first = b.run(f)
    assert f._func._plan is not None
    f.clear_device_memory()
    assert f._func._plan is None
    b.graph.clear_device_memory()  # on the graph as well; nothing to free twice
    again = b.run(f)
    for x, y in zip(first, again):
        np.testing.assert_array_equal(x, y)


def test_allocate_static_mem_after_graph_compile():
    g = _graph({"allocate_static_mem_after_graph_compile": 1})
    x = mgb.make_arg(CN, g, name="x", value=np.arange(6, dtype=np.float32))
    f = _compile(g, [(x * 2 + 1) * 3])
    plan = f._func._plan
    assert plan is not None and plan.arenas
    np.testing.assert_array_equal(f()[0], (np.arange(6) * 2 + 1) * 3)
    assert f._func._plan is plan  # the first run used the plan made at compile time


def test_without_allocate_after_compile_plan_waits_for_first_run():
    g = _graph()
    x = mgb.make_arg(CN, g, name="x", value=np.arange(6, dtype=np.float32))
    f = _compile(g, [x * 2 + 1])
    assert f._func._plan is None
    f()
    assert f._func._plan is not None


def test_mem_allocation_info_json():
    b = build_mixed(_graph())
    f = b.compile()
    b.run(f)
    info = b.graph.current_exec.mem_alloc_info()
    plan = f._func._plan
    by_id = {v.id: arr for v, arr in plan.arrays.items()}
    assert {d["id"] for d in info} >= set(by_id)
    for d in info:
        assert set(d) >= {"id", "name", "comp_node", "size", "addr", "kind"}
        if d["id"] in by_id:
            arr = by_id[d["id"]]
            assert d["size"] == arr.nbytes
            assert d["addr"] == arr.__array_interface__["data"][0]
    # static vars lie in the arena
    arena = next(iter(plan.arenas.values()))
    a0 = arena.__array_interface__["data"][0]
    for d in info:
        if d["kind"] == "static" and d["size"]:
            assert a0 <= d["addr"] and d["addr"] + d["size"] <= a0 + arena.nbytes


def test_mem_allocation_info_empty_before_compile():
    assert json.loads(_graph().get_mem_allocation_info()) == []


def test_add_update_in_place_has_the_address_of_its_destination():
    b = build_mlp_step(_graph())
    params = b.params
    f = b.compile()
    before = [p.get_value().copy() for p in params]
    b.run(f)
    info = {d["id"]: d for d in b.graph.current_exec.mem_alloc_info()}
    ups = [o for o in f._func.seq if o.type_name == "AddUpdate"]
    assert len(ups) == len(params)
    for up in ups:
        dest, res = up.inputs[0], up.outputs[0]
        assert info[res.id]["addr"] == info[dest.id]["addr"] != 0
        assert info[res.id]["size"] == info[dest.id]["size"]
    # and the update happened in the shared tensors themselves
    assert any(not np.array_equal(b, p.get_value()) for b, p in zip(before, params))


# ---- re-planning and dynamic vars ---------------------------------------------------------
def test_plan_rebuilt_when_input_shape_changes():
    g = _graph()
    x = mgb.make_arg(CN, g, name="x", shape=(2, 3))
    y = mgb.opr.reduce_(mgb.opr.elem.exp(x * 0.5) + x, "SUM", axis=1, keepdims=True)
    f = _compile(g, [y, x * 2])
    for shape in [(2, 3), (2, 3), (5, 7), (1, 1), (5, 7)]:
        xv = np.random.RandomState(sum(shape)).randn(*shape).astype(np.float32)
        r, r2 = f(x=xv)
        np.testing.assert_allclose(r, (np.exp(xv * 0.5) + xv).sum(1, keepdims=True), 1e-5)
        np.testing.assert_array_equal(r2, xv * 2)
        size = sum(f.update_static_alloc_plan_and_get_size().values())
        assert size >= xv.nbytes
    plan = f._func._plan
    f(x=xv)
    assert f._func._plan is plan  # same shape: no re-plan


def _dynamic_graph(n=16):
    g = _graph()
    x = mgb.make_arg(CN, g, name="x", shape=(2, n))
    t = mgb.make_arg(
        CN, g, name="t", dtype=np.int32, value=np.array([2, n], np.int32), enable_static_infer=False
    )
    return g, x, t


def test_dynamic_vars_computed_and_reported():
    g, x, t = _dynamic_graph()
    r = mgb.opr.reshape(x * 2, t)  # shape known only from t's value at run time
    z = (r + 1) * 3
    f = _compile(g, [z, x + 5])
    xv = np.arange(32, dtype=np.float32).reshape(2, 16)
    for shape in [(4, 8), (32, 1)]:
        z_v, x5 = f(x=xv, t=np.array(shape, np.int32))
        np.testing.assert_array_equal(z_v, ((xv * 2).reshape(shape) + 1) * 3)
        np.testing.assert_array_equal(x5, xv + 5)
    kinds = {d["name"]: d["kind"] for d in g.current_exec.mem_alloc_info()}
    assert kinds[z.name] == "dynamic" and kinds[r.name] == "dynamic"
    assert kinds["x"] == "forward"  # the host tensor's memory, read in place on CPU


def test_static_memory_viewed_by_dynamic_var_stays_live():
    g, x, t = _dynamic_graph()
    m = x * 2
    r = mgb.opr.reshape(m, t)  # a dynamic view of m's static memory
    s = x * 3  # static, allocated after m's last (static) reader
    z = (r + s) + x
    f = _compile(g, [z])
    xv = np.arange(32, dtype=np.float32).reshape(2, 16)
    np.testing.assert_array_equal(f(x=xv, t=np.array([2, 16], np.int32))[0], xv * 6)


def test_dynamic_vars_freed_after_last_reader():
    g, x, t = _dynamic_graph()
    g.set_option("graph_opt_level", 1)  # keep the chain as written (the probe finds w's opr)
    r = mgb.opr.reshape(x * 2, t) + 1  # dynamic
    z = r * 3  # the last reader of r
    w = z * 2
    f = _compile(g, [w])
    feed = {"x": np.ones((2, 16), np.float32), "t": np.array([4, 8], np.int32)}
    f(**feed)
    core, seen = f._func, {}
    plan = core._plan
    k = plan.step_oprs[0].index(w.node.owner)  # probe after z, when w runs
    plan.steps[0].insert(k, lambda: seen.setdefault("slots", set(core._slots)))
    plan.step_oprs[0].insert(k, w.node.owner)
    # x = 1: r = 1*2 + 1 = 3, z = 9, w = 18
    np.testing.assert_array_equal(f(**feed)[0], np.full((4, 8), 18, np.float32))
    assert z.node in seen["slots"] and r.node not in seen["slots"]


def test_force_dynamic_alloc_has_no_static_plan():
    b = build_mixed(_graph(CONFIGS["force_dynamic"]))
    f = b.compile()
    b.run(f)
    assert not any(f.update_static_alloc_plan_and_get_size().values())
    kinds = {d["kind"] for d in b.graph.current_exec.mem_alloc_info()}
    assert "static" not in kinds
