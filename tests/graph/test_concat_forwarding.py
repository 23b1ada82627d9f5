"""Concat written in place by its producers: the memory plan makes a Concat's inputs views of
their ranges of its output where those are contiguous; results equal the unforwarded plan's,
the arena is no larger, and the Concat copies only the inputs that could not be placed."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from test_mem_plan_graph import checked_run

import megbrain as mgb
from megbrain.opr import tensor_manip
from megbrain.opr.tensor_manip import Concat

CN = "cpu0"


def _graph(opts=None):
    g = mgb.comp_graph()
    for k, v in (opts or {}).items():
        g.set_option(k, v)
    return g


def _branches(x, n):
    """``n`` different computations of ``x`` (elementwise, one of them in place)."""
    fns = [
        lambda v: v * 2.0 + 1.0,
        lambda v: mgb.opr.elem.relu(v - 0.25),
        lambda v: mgb.opr.elem.exp(v * 0.5),
        lambda v: mgb.opr.elem.tanh(v),
    ]
    return [fns[i % len(fns)](x + float(i)) for i in range(n)]


def _concats(func):
    """``(Concat, its bound step)`` of each Concat of ``func``'s plan."""
    plan = func._func._plan
    steps: dict = {}  # the first step of an operator is its own (callbacks follow)
    for fn, opr in zip(plan.steps[0], plan.step_oprs[0]):
        if opr.type_name == Concat.type_name:
            steps.setdefault(opr, fn)
    return list(steps.items())


def _copies(fn) -> int:
    """How many inputs a bound Concat step copies."""
    if isinstance(fn, functools.partial) and fn.func is tensor_manip._copy_parts:
        return len(fn.args[0])
    assert isinstance(fn, functools.partial) and fn.func is np.concatenate
    return len(fn.args[0])


def _kinds(g) -> dict:
    return {d["name"]: d["kind"] for d in g.current_exec.mem_alloc_info() if d["id"] is not None}


def _run(build, shape, opts=None, forward=True, monkeypatch=None):
    """Compile and run ``build(x) -> (copied outputs)`` with or without the forwarding;
    returns the outputs, the compiled function and its graph."""
    if not forward:
        monkeypatch.setattr(Concat, "has_input_parts", False)
    try:
        g = _graph(opts)
        x = mgb.make_arg(CN, g, name="x", shape=shape)
        outs = build(x)
        f = g.compile(None, [mgb.copy_output(v) for v in outs])
        xv = np.random.RandomState(0).uniform(-1, 1, shape).astype(np.float32)
        res = [np.array(r) for r in f(x=xv)]
        if not opts:
            f._setup_args((), {"x": xv})
            checked = checked_run(f)  # sentinels: no live var overwritten
            for (v, _), r in zip(f._func.outspec, res):
                np.testing.assert_array_equal(checked[v], r)
        return res, f, g
    finally:
        if not forward:
            monkeypatch.undo()


def _compare(monkeypatch, build, shape, opts=None):
    """Results of the forwarded plan equal the unforwarded one's; arena no larger."""
    ref, f0, _ = _run(build, shape, opts, forward=False, monkeypatch=monkeypatch)
    got, f, g = _run(build, shape, opts)
    for a, b in zip(got, ref):
        np.testing.assert_array_equal(a, b)
    size0 = sum(f0._func._plan.sizes.values())
    assert sum(f._func._plan.sizes.values()) <= size0
    return f, g


def _cat(axis, n=3):
    def build(x):
        return [mgb.opr.concat(_branches(x, n), axis=axis) * 1.0]

    return build


CASES = [
    # (shape, axis, whether the parts are contiguous)
    ((1, 8, 5, 5), 1, True),  # NCHW channels, batch 1
    ((2, 8, 5, 5), 1, False),  # batch 2: strided parts
    ((2, 8, 5, 5), 0, True),  # axis 0, any batch
    ((1, 1, 6, 5), 2, True),  # an inner axis after axes of one position
    ((1, 3, 6, 5), 2, False),  # an inner axis: strided parts
    ((1, 2, 5, 5, 8), 1, True),  # NCHW88 channel blocks, batch 1
    ((2, 2, 5, 5, 8), 1, False),  # NCHW88, batch 2
    ((2, 2, 5, 5, 8), 0, True),  # NCHW88, axis 0
    ((1, 2, 5, 5, 8), -1, False),  # the 8 lanes
]


@pytest.mark.parametrize("shape,axis,contiguous", CASES)
def test_concat_written_in_place_equals_the_copy(monkeypatch, shape, axis, contiguous):
    f, g = _compare(monkeypatch, _cat(axis), shape)
    ((opr, fn),) = _concats(f)
    assert _copies(fn) == (0 if contiguous else 3)
    kinds = _kinds(g)
    placed = [kinds[v.name] == "part" for v in opr.inputs]
    assert placed == [contiguous] * 3
    if contiguous:  # the inputs are views of their ranges of the output
        out = f._func._plan.arrays[opr.outputs[0]]
        for v in opr.inputs:
            assert np.shares_memory(f._func._plan.arrays[v], out)


def test_inputs_with_other_readers_and_an_input_that_is_an_output(monkeypatch):
    def build(x):
        a, b, c = _branches(x, 3)
        cat = mgb.opr.concat([a, b, c], axis=1)
        # a read again after the Concat, b an output, c read by an in-place candidate
        late = mgb.opr.elem.exp(a * 0.1)
        return [cat * 1.0, b, mgb.opr.elem.relu(c) + late]

    f, _ = _compare(monkeypatch, build, (1, 8, 4, 4))
    ((_, fn),) = _concats(f)
    assert _copies(fn) == 0


def test_concat_of_concats(monkeypatch):
    def build(x):
        a, b, c, d = _branches(x, 4)
        inner = mgb.opr.concat([a, b], axis=1)
        outer = mgb.opr.concat([inner, c, d], axis=1)
        return [mgb.opr.concat([outer, a * 3.0], axis=1) * 1.0]

    f, g = _compare(monkeypatch, build, (1, 8, 3, 3))
    assert [_copies(fn) for _, fn in _concats(f)] == [0, 0, 0]
    plan = f._func._plan
    oprs = [opr for opr, _ in _concats(f)]
    top = plan.arrays[oprs[-1].outputs[0]]
    for opr in oprs:
        assert np.shares_memory(plan.arrays[opr.outputs[0]], top)
    kinds = _kinds(g)
    assert kinds[oprs[0].outputs[0].name] == kinds[oprs[1].outputs[0].name] == "part"


def test_repeated_input_and_an_input_of_two_concats(monkeypatch):
    def build(x):
        a, b = _branches(x, 2)
        twice = mgb.opr.concat([a, a, b], axis=0)  # a copied twice: the later Concat holds it
        other = mgb.opr.concat([b * 2.0, a], axis=0)
        return [twice * 1.0, other * 1.0]

    f, _ = _compare(monkeypatch, build, (2, 3, 4))
    assert [_copies(fn) for _, fn in _concats(f)] == [2, 0]


def test_forwarded_input_is_copied(monkeypatch):
    """An input that is a view of another var (a reshape) is copied, and so is the graph
    input, whose Host2DeviceCopy forwards the host tensor's memory on CPU; a computed input
    is written in place."""

    def build(x):
        flat = mgb.opr.reshape(x, (1, 128)) * 3.0
        a = mgb.opr.reshape(flat, (1, 8, 4, 4))
        return [mgb.opr.concat([a, x, x * 2.0], axis=1) * 1.0]

    f, g = _compare(monkeypatch, build, (1, 8, 4, 4))
    ((opr, fn),) = _concats(f)
    assert _copies(fn) == 2
    assert [_kinds(g)[v.name] for v in opr.inputs] == ["forward", "forward", "part"]


@pytest.mark.parametrize(
    "opts",
    [
        {"seq_opt.enable_mem_plan_opt": 0},
        {"force_dynamic_alloc": 1},
        {"seq_opt.enable_mem_reuse_alloc": 0},
    ],
)
def test_memory_options(monkeypatch, opts):
    """No forwarding without the memory plan optimizations or with dynamic allocation; the
    forwarding without memory reuse (separate allocations) is still right."""
    build = _cat(1)
    ref, *_ = _run(build, (1, 8, 4, 4), opts, forward=False, monkeypatch=monkeypatch)
    g = _graph(opts)
    x = mgb.make_arg(CN, g, name="x", shape=(1, 8, 4, 4))
    outs = build(x)
    f = g.compile(None, [mgb.copy_output(v) for v in outs])
    xv = np.random.RandomState(0).uniform(-1, 1, (1, 8, 4, 4)).astype(np.float32)
    np.testing.assert_array_equal(np.array(f(x=xv)[0]), ref[0])
    parts = [k for k in _kinds(g).values() if k == "part"]
    assert bool(parts) == ("seq_opt.enable_mem_reuse_alloc" in opts)


def test_dynamic_shape_is_not_forwarded():
    g = _graph()
    x = mgb.make_arg(CN, g, name="x", shape=(6,))
    taken, _ = mgb.opr.cond_take(x, x, "GT", val=0.0)
    cat = mgb.opr.concat([taken * 2.0, taken + 1.0], axis=0)
    f = g.compile(None, [mgb.copy_output(cat)])
    xv = np.array([1, -1, 2, -2, 3, -3], np.float32)
    np.testing.assert_array_equal(f(x=xv)[0], np.concatenate([xv[xv > 0] * 2, xv[xv > 0] + 1]))
    assert "part" not in _kinds(g).values()


def test_input_on_another_comp_node_is_copied():
    g = _graph()
    x = mgb.make_arg(CN, g, name="x", shape=(1, 8, 2, 2))
    a = x * 2.0
    b = mgb.opr.copy(x, comp_node="cpu1") + 1.0
    cat = mgb.opr.concat([a, b], axis=1, comp_node=CN)
    f = g.compile(None, [mgb.copy_output(cat)])
    xv = np.random.RandomState(0).randn(1, 8, 2, 2).astype(np.float32)
    np.testing.assert_array_equal(f(x=xv)[0], np.concatenate([xv * 2, xv + 1], axis=1))
    kinds = _kinds(g)
    assert kinds[a.name] == "part" and kinds[b.name] != "part"
    ((_, fn),) = _concats(f)
    assert _copies(fn) == 1


def test_repeated_input_is_placed_once(monkeypatch):
    def build(x):
        a, b = _branches(x, 2)
        return [mgb.opr.concat([a, a, b], axis=1) * 1.0]

    f, _ = _compare(monkeypatch, build, (1, 8, 3, 3))
    ((_, fn),) = _concats(f)
    assert _copies(fn) == 1


@pytest.mark.parametrize("shape", [(1, 8, 4, 4), (1, 1, 4, 4, 8)])
def test_growing_concatenations_are_prefixes_of_the_last(monkeypatch, shape):
    """DenseNet: each layer concatenates all the features so far; the block's last
    Concat holds them all, and the earlier Concats are ranges of its prefixes."""

    def build(x):
        feats, outs = [x * 1.5], []
        for i in range(4):
            cat = mgb.opr.concat(feats, axis=1)
            y = mgb.opr.elem.relu(cat * 0.5 + float(i))
            feats.append(mgb.opr.reduce_(y, "SUM", axis=1, keepdims=True) + feats[-1])
            outs.append(mgb.opr.reduce_(y, "MAX"))
        return [mgb.opr.concat(feats, axis=1) * 1.0, *outs]

    f, g = _compare(monkeypatch, build, shape)
    cats = _concats(f)
    assert [_copies(fn) for _, fn in cats] == [0] * 5
    plan = f._func._plan
    last = plan.arrays[cats[-1][0].outputs[0]]
    for opr, _ in cats[:-1]:
        arr = plan.arrays[opr.outputs[0]]
        assert arr.__array_interface__["data"][0] == last.__array_interface__["data"][0]
    kinds = _kinds(g)
    assert [kinds[opr.outputs[0].name] for opr, _ in cats] == ["part"] * 4 + ["static"]
