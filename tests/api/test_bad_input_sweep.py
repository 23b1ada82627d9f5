"""A sweep of bad calls over the public entry points: each must raise an error a user can act on.

Every ``mgb.opr`` function, ``make_shared`` / ``make_immutable`` / ``make_arg`` /
``comp_graph`` / ``grad``, the public SharedND methods and ``CompGraph.compile`` are called
with bad operands (None, a str, an object(), a dict), a graph given as None / a str / an
object, dims of 2**31 and negative dims, and the wrong number of arguments. The error must be a
MegBrainError, TypeError, ValueError or IndexError (never an AttributeError, OverflowError,
MemoryError, KeyError, UnboundLocalError or an error class of numpy) and its message must
name the entry point, so that a user reading only the message knows which call was wrong.

Run ``python tests/api/test_bad_input_sweep.py`` to print the counts and the unclear cases.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

import megbrain as mgb

O = mgb.opr
BAD_OPERANDS = {"None": None, "str": "abc", "object": object(), "dict": {"a": 1}}
BAD_GRAPHS = {"str": "g", "object": object(), "int": 3}
BAD_DIMS = {"2**31": (2**31, 2), "negative": (-3, 2), "str": ("a", 2), "None": (None, 2)}
# for shapes allocated at once: 2**31 dims would really be allocated (lazily, 16 GiB)
BAD_ALLOC_DIMS = {"huge": (2**24, 2**24), "negative": (-3, 2), "str": ("a", 2), "None": (None, 2)}
# errors that tell a Python user what was wrong; anything else escaping is a bug
CLEAR = (mgb.MegBrainError, TypeError, ValueError, IndexError)
UNCLEAR = (AttributeError, OverflowError, MemoryError, KeyError, UnboundLocalError)


@dataclass
class Ctx:
    """The good values the calls are built from: one graph, vars of a few shapes."""

    g: mgb.CompGraph
    x4: mgb.SymbolVar  # (2, 3, 4, 4) float32
    m: mgb.SymbolVar  # (3, 3) float32
    v: mgb.SymbolVar  # (6,) float32
    i: mgb.SymbolVar  # (3,) int32
    shared: mgb.SymbolVar  # a make_shared var (3, 3)


def make_ctx() -> Ctx:
    g = mgb.comp_graph()
    cn = "cpu0"
    x4 = mgb.make_immutable(cn, g, np.ones((2, 3, 4, 4), np.float32))
    m = mgb.make_immutable(cn, g, np.eye(3, dtype=np.float32) + 1)
    v = mgb.make_immutable(cn, g, np.arange(6, dtype=np.float32))
    i = mgb.make_immutable(cn, g, np.array([0, 2, 1], np.int32))
    shared = mgb.make_shared(cn, value=np.zeros((3, 3), np.float32), comp_graph=g)
    return Ctx(g, x4, m, v, i, shared)


@dataclass
class Spec:
    """How to call one entry point well.

    ``args(ctx)`` gives the good positional arguments, ``operands`` the positions that take
    a var (where a bad operand is put), ``dims`` the positions that take a shape, ``graph``
    the position of a graph argument, and ``call(f, args, kw)`` makes the call (an indexer
    function also indexes its result).
    """

    name: str
    args: Callable[[Ctx], list]
    operands: tuple[int, ...] = (0,)
    dims: tuple[int, ...] = ()
    graph: int | None = None
    graph_kw: bool = True  # takes comp_graph=
    kwargs: Callable[[Ctx], dict] | None = None
    call: Callable | None = None
    fn: Callable | None = None
    names: tuple[str, ...] = ()  # other names the message may use for the entry point
    dims_kw: str | None = None  # a keyword taking a shape allocated at once


def _index(f, args, kw):
    return f(*args, **kw)[0]


def _adv_index(f, args, kw):
    return f(*args, **kw)[[0, 1]]


def _mesh_index(f, args, kw):
    return f(*args, **kw)[:, [0, 1]]


def _graph_of(c: Ctx):
    return c.g


SPECS: list[Spec] = [
    Spec("add_axis", lambda c: [c.m, 0]),
    Spec("remove_axis", lambda c: [c.x4.reshape(2, 3, 16, 1), 3]),
    Spec("add_update", lambda c: [c.shared, c.m], operands=(0, 1)),
    Spec("advanced_indexing", lambda c: [c.m], call=_adv_index, graph_kw=False),
    Spec(
        "set_advanced_indexing",
        lambda c: [c.m, O.advanced_indexing(c.m)[[0, 1]]],
        (0, 1),
        call=_adv_index,
        graph_kw=False,
    ),
    Spec(
        "incr_advanced_indexing",
        lambda c: [c.m, O.advanced_indexing(c.m)[[0, 1]]],
        (0, 1),
        call=_adv_index,
        graph_kw=False,
    ),
    Spec("mesh_indexing", lambda c: [c.m], call=_mesh_index, graph_kw=False),
    Spec(
        "set_mesh_indexing",
        lambda c: [c.m, O.mesh_indexing(c.m)[:, [0, 1]]],
        (0, 1),
        call=_mesh_index,
        graph_kw=False,
    ),
    Spec(
        "incr_mesh_indexing",
        lambda c: [c.m, O.mesh_indexing(c.m)[:, [0, 1]]],
        (0, 1),
        call=_mesh_index,
        graph_kw=False,
    ),
    Spec(
        "batched_mesh_indexing",
        lambda c: [c.m],
        call=lambda f, a, k: f(*a, **k)[:, [[0], [1], [2]]],
        graph_kw=False,
    ),
    Spec(
        "batched_set_mesh_indexing",
        lambda c: [c.m, c.m[:, :1]],
        (0, 1),
        call=lambda f, a, k: f(*a, **k)[:, [[0], [1], [2]]],
        graph_kw=False,
    ),
    Spec(
        "batched_incr_mesh_indexing",
        lambda c: [c.m, c.m[:, :1]],
        (0, 1),
        call=lambda f, a, k: f(*a, **k)[:, [[0], [1], [2]]],
        graph_kw=False,
    ),
    Spec("set_subtensor", lambda c: [c.m, c.m[0]], (0, 1), call=_index, graph_kw=False),
    Spec("incr_subtensor", lambda c: [c.m, c.m[0]], (0, 1), call=_index, graph_kw=False),
    Spec(
        "alloc",
        lambda c: [(2, 3)],
        operands=(),
        dims=(0,),
        kwargs=lambda c: {"comp_node": "cpu0", "comp_graph": c.g},
    ),
    Spec("argmax", lambda c: [c.m, 0]),
    Spec("argmin", lambda c: [c.m, 0]),
    Spec("argsort", lambda c: [c.m]),
    Spec("assert_equal", lambda c: [c.m, c.m], (0, 1)),
    Spec(
        "batch_norm",
        lambda c: [c.x4, np.ones((1, 3, 1, 1), np.float32), np.zeros((1, 3, 1, 1), np.float32)],
        (0, 1, 2),
    ),
    Spec(
        "batch_norm_no_statistic",
        lambda c: [c.x4, np.ones((1, 3, 1, 1), np.float32), np.zeros((1, 3, 1, 1), np.float32)],
        (0, 1, 2),
    ),
    Spec("batched_matrix_mul", lambda c: [c.x4[0], c.x4[0]], (0, 1)),
    Spec("batched_matrix_mul_v0", lambda c: [c.x4[0], c.x4[0]], (0, 1)),
    Spec("broadcast", lambda c: [c.v.reshape(1, 6), (2, 6)], dims=(1,)),
    Spec("callback_injector", lambda c: [c.m, lambda p: None]),
    Spec("concat", lambda c: [c.m, c.m], (0, 1), kwargs=lambda c: {"axis": 0}),
    Spec("cond_take", lambda c: [c.m, c.m], (0, 1)),
    Spec(
        "conv_bias_activation",
        lambda c: [c.x4, np.ones((2, 3, 3, 3), np.float32), np.zeros((1, 2, 1, 1), np.float32)],
        (0, 1, 2),
    ),
    Spec(
        "conv_bias_activation_v1",
        lambda c: [c.x4, np.ones((2, 3, 3, 3), np.float32), np.zeros((1, 2, 1, 1), np.float32)],
        (0, 1, 2),
    ),
    Spec("convolution", lambda c: [c.x4, np.ones((2, 3, 3, 3), np.float32)], (0, 1)),
    Spec("convolution_v0", lambda c: [c.x4, np.ones((2, 3, 3, 3), np.float32)], (0, 1)),
    Spec("deconvolution", lambda c: [c.x4, np.ones((3, 2, 3, 3), np.float32)], (0, 1)),
    Spec("deconvolution_v0", lambda c: [c.x4, np.ones((3, 2, 3, 3), np.float32)], (0, 1)),
    Spec(
        "convolution3d",
        lambda c: [c.x4.reshape(1, 2, 3, 4, 4), np.ones((1, 2, 1, 1, 1), np.float32)],
        (0, 1),
    ),
    Spec(
        "deconvolution3d",
        lambda c: [c.x4.reshape(1, 2, 3, 4, 4), np.ones((2, 1, 1, 1, 1), np.float32)],
        (0, 1),
    ),
    Spec("pooling", lambda c: [c.x4]),
    Spec("copy", lambda c: [c.m]),
    Spec("cumsum", lambda c: [c.m, 0]),
    Spec("dimshuffle", lambda c: [c.m, (1, 0)], graph_kw=False),
    Spec("dot", lambda c: [c.v, c.v], (0, 1)),
    Spec("elemwise", lambda c: [c.m, c.m], (0, 1), kwargs=lambda c: {"mode": "ADD"}),
    Spec(
        "elem",
        lambda c: [c.m, c.m],
        (0, 1),
        fn=lambda *a, **k: O.elem.add(*a, **k),
        names=("elemwise",),
    ),
    Spec("elemwise_multi_type", lambda c: [c.i.astype(np.int16), c.i, c.i], (0, 1, 2)),
    Spec(
        "eye",
        lambda c: [(3, 3)],
        operands=(),
        dims=(0,),
        kwargs=lambda c: {"comp_node": "cpu0", "comp_graph": c.g},
    ),
    Spec("fill_retain_dtype", lambda c: [c.m, 1.0], graph_kw=False),
    Spec(
        "gaussian_rng",
        lambda c: [(2, 3)],
        operands=(),
        dims=(0,),
        kwargs=lambda c: {"comp_node": "cpu0", "comp_graph": c.g},
    ),
    Spec(
        "uniform_rng",
        lambda c: [(2, 3)],
        operands=(),
        dims=(0,),
        kwargs=lambda c: {"comp_node": "cpu0", "comp_graph": c.g},
    ),
    Spec("get_var_shape", lambda c: [c.m]),
    Spec("group_local", lambda c: [c.x4, np.ones((3, 4, 4, 1, 1, 1, 1), np.float32)], (0, 1)),
    Spec("local", lambda c: [c.x4, np.ones((4, 4, 3, 1, 1, 2), np.float32)], (0, 1)),
    Spec(
        "host2device_copy",
        lambda c: [c.g, mgb.tensor.HostTensorND.from_ndarray(np.ones(3, np.float32))],
        operands=(),
        graph=0,
        graph_kw=False,
    ),
    Spec(
        "shared_device_tensor",
        lambda c: [c.g, mgb.tensor.DeviceTensorND.from_ndarray(np.ones(3, np.float32))],
        operands=(),
        graph=0,
        graph_kw=False,
    ),
    Spec("identity", lambda c: [c.m]),
    Spec("indexing_one_hot", lambda c: [c.m, 1, c.i], (0, 2)),
    Spec("indexing_set_one_hot", lambda c: [c.m, 1, c.i, c.v[:3].reshape(3, 1)], (0, 2, 3)),
    Spec("indexing_remap", lambda c: [c.m, np.zeros((2, 2, 2), np.int32)], (0, 1)),
    Spec(
        "linspace",
        lambda c: [0, 1, 5],
        (0, 1, 2),
        kwargs=lambda c: {"comp_node": "cpu0", "comp_graph": c.g},
    ),
    Spec("lrn", lambda c: [c.x4]),
    Spec(
        "make_immutable",
        lambda c: ["cpu0", c.g, np.ones(3)],
        operands=(2,),
        graph=1,
        graph_kw=False,
    ),
    Spec("mark_no_broadcast_elemwise", lambda c: [c.m]),
    Spec("matrix_inverse", lambda c: [c.m]),
    Spec("matrix_mul", lambda c: [c.m, c.m], (0, 1)),
    Spec("matrix_mul_v0", lambda c: [c.m, c.m], (0, 1)),
    Spec("mean", lambda c: [c.m, 0], graph_kw=False),
    Spec("param_pack_concat", lambda c: [[c.m, c.v]], operands=(0,), graph_kw=False),
    Spec(
        "param_pack_split",
        lambda c: [O.alloc((64,), comp_node="cpu0", comp_graph=c.g), [(2,), (3,)]],
        graph_kw=False,
    ),
    Spec("reduce_", lambda c: [c.m, "SUM", 0]),
    Spec("reduce_general", lambda c: [c.m], kwargs=lambda c: {"mode": "SUM", "axis": 0}),
    Spec("reshape", lambda c: [c.v, (2, 3)], dims=(1,)),
    Spec("resize", lambda c: [c.x4, (5, 5)], kwargs=lambda c: {"format": "NCHW"}),
    Spec("roi_align", lambda c: [c.x4, np.array([[0, 0, 0, 2, 2]], np.float32)], (0, 1)),
    Spec("roi_pooling", lambda c: [c.x4, np.array([[0, 0, 0, 2, 2]], np.float32), (2, 2)], (0, 1)),
    Spec(
        "warp_perspective",
        lambda c: [c.x4, np.tile(np.eye(3, dtype=np.float32), (2, 1, 1)), (4, 4)],
        (0, 1),
    ),
    Spec("set_grad", lambda c: [c.m, None]),
    Spec("zero_grad", lambda c: [c.m]),
    Spec("sqrt", lambda c: [c.m], graph_kw=False),
    Spec("square", lambda c: [c.m], graph_kw=False),
    Spec("svd", lambda c: [c.m]),
    Spec(
        "symvar_from_shared_nd",
        lambda c: [mgb.make_shared("cpu0", value=np.ones(3)), c.g],
        operands=(0,),
        graph=1,
        graph_kw=False,
    ),
    Spec("top_k", lambda c: [c.m, 2]),
    Spec("typecvt", lambda c: [c.m, np.int32]),
    Spec("virtual_dep", lambda c: [[c.m, c.v]]),
    Spec("virtual_grad", lambda c: [c.m.sum(), c.m], (0, 1), graph_kw=False),
    Spec("virtual_loss", lambda c: [[c.m], [c.m]], (0, 1)),
    Spec("canonize_input_vars", lambda c: [[c.m]], graph_kw=True),
    Spec("make_opr_config", lambda c: ["x"], operands=(), graph_kw=False),
    Spec(
        "create_opr",
        lambda c: ["Identity", [c.m.node], None, mgb.OperatorNodeConfig()],
        operands=(),
        graph_kw=False,
    ),
    Spec(
        "insert_opr",
        lambda c: [O.utility.Identity([c.m.node], None, mgb.OperatorNodeConfig())],
        graph_kw=False,
    ),
    # the binding's functions
    Spec(
        "make_shared",
        lambda c: ["cpu0"],
        operands=(),
        graph_kw=True,
        kwargs=lambda c: {"shape": (2, 3)},
        fn=mgb.make_shared,
        dims_kw="shape",
    ),
    Spec(
        "make_shared(value=)",
        lambda c: ["cpu0"],
        operands=(),
        graph_kw=True,
        kwargs=lambda c: {"value": np.ones(2)},
        fn=mgb.make_shared,
        names=("make_shared",),
    ),
    Spec(
        "make_arg",
        lambda c: ["cpu0", c.g],
        operands=(),
        graph=1,
        graph_kw=False,
        kwargs=lambda c: {"shape": (2, 3)},
        fn=mgb.make_arg,
        dims_kw="shape",
    ),
    Spec(
        "mgb.make_immutable",
        lambda c: ["cpu0", c.g, np.ones(3)],
        operands=(2,),
        graph=1,
        graph_kw=False,
        fn=mgb.make_immutable,
        names=("make_immutable",),
    ),
    Spec("comp_graph", lambda c: [], operands=(), graph_kw=False, fn=mgb.comp_graph),
    Spec("grad", lambda c: [c.m.sum(), c.m], (0, 1), graph_kw=False, fn=mgb.grad),
    Spec(
        "CompGraph.compile",
        lambda c: [None, [mgb.copy_output(c.m)]],
        operands=(1,),
        graph_kw=False,
        fn=lambda *a, **k: _CTX.g.compile(*a, **k),
        names=("compile",),
    ),
]

# SharedND methods: (name, good args (ctx, snd) -> list, positions of a bad operand)
SHARED_METHODS = [
    ("set_value", lambda c, s: [np.ones((3, 3), np.float32)], (0,)),
    ("resize", lambda c, s: [2, 3], ()),
    ("symvar", lambda c, s: [c.g], ()),
    (
        "copy_from_shared_sub",
        lambda c, s: [mgb.make_shared("cpu0", value=np.ones((3, 3))), 0, 0, 1, 1],
        (0,),
    ),
    (
        "copy_to_sub_from_shared",
        lambda c, s: [0, 0, 1, 1, mgb.make_shared("cpu0", value=np.ones((1, 3)))],
        (4,),
    ),
    ("share_memory_from", lambda c, s: [mgb.make_shared("cpu0", value=np.ones((3, 3))), 0], (0,)),
    ("reset_dev_tensor", lambda c, s: [mgb.make_shared("cpu0", value=np.ones((3, 3)))], (0,)),
    ("get_value", lambda c, s: [], ()),
    ("reset_zero", lambda c, s: [], ()),
]

_CTX: Ctx


@dataclass
class Case:
    entry: str
    what: str
    names: tuple[str, ...]
    thunk: Callable[[], object]


def _spec_cases(spec: Spec) -> list[Case]:
    fn = spec.fn or getattr(O, spec.name)
    names = (spec.name.split(".")[-1].split("(")[0], *spec.names)

    def mk(args, kw):
        if spec.call is not None:
            return lambda: spec.call(fn, args, kw)
        return lambda: fn(*args, **kw)

    c = _CTX
    good = spec.args(c)
    kw = spec.kwargs(c) if spec.kwargs else {}
    out = []
    for pos in spec.operands:
        for bname, bad in BAD_OPERANDS.items():
            if isinstance(good[pos], list) and spec.name not in ("canonize_input_vars",):
                # a list of vars: the bad value as its first element
                args = list(good)
                args[pos] = [bad, *good[pos][1:]]
                out.append(Case(spec.name, f"arg {pos}[0]={bname}", names, mk(args, kw)))
            args = list(good)
            args[pos] = bad
            out.append(Case(spec.name, f"arg {pos}={bname}", names, mk(args, kw)))
    for pos in spec.dims:
        for bname, bad in BAD_DIMS.items():
            args = list(good)
            args[pos] = bad
            out.append(Case(spec.name, f"dims {pos}={bname}", names, mk(args, kw)))
    if spec.dims_kw is not None:
        for bname, bad in BAD_ALLOC_DIMS.items():
            kw2 = {**kw, spec.dims_kw: bad}
            out.append(Case(spec.name, f"{spec.dims_kw}={bname}", names, mk(good, kw2)))
    if spec.graph is not None:
        for bname, bad in {**BAD_GRAPHS, "None": None}.items():
            args = list(good)
            args[spec.graph] = bad
            out.append(Case(spec.name, f"graph arg {spec.graph}={bname}", names, mk(args, kw)))
    if spec.graph_kw:
        for bname, bad in BAD_GRAPHS.items():
            out.append(Case(spec.name, f"comp_graph={bname}", names,
                            mk(good, {**kw, "comp_graph": bad})))  # fmt: skip
        if spec.operands:
            # every operand a plain value and no graph: it can not be inferred
            args = list(good)
            for pos in spec.operands:
                args[pos] = _plain(args[pos])
            kw2 = {k: v for k, v in kw.items() if k != "comp_graph"}
            out.append(Case(spec.name, "no graph", names, mk(args, kw2)))
    if spec.name not in ("comp_graph",):
        # wrong arity: nothing, then one positional argument too many
        out.append(Case(spec.name, "no args", names, mk([], {})))
    out.append(Case(spec.name, "extra arg", names, mk([*good, *([None] * 8)], kw)))
    return out


def _plain(x):
    if isinstance(x, mgb.SymbolVar):
        return np.ones((2, 2), np.float32)
    if isinstance(x, list):
        return [_plain(v) for v in x]
    return x


def _shared_cases() -> list[Case]:
    out = []
    for meth, args_of, operands in SHARED_METHODS:
        names = (meth,)

        def mk(args, meth=meth):
            snd = mgb.make_shared("cpu0", value=np.zeros((3, 3), np.float32))
            return lambda: getattr(snd, meth)(*args)

        good = args_of(_CTX, None)
        for pos in operands:
            for bname, bad in BAD_OPERANDS.items():
                args = list(good)
                args[pos] = bad
                out.append(Case(f"SharedND.{meth}", f"arg {pos}={bname}", names, mk(args)))
        if meth == "symvar":
            for bname, bad in {**BAD_GRAPHS, "None": None}.items():
                out.append(Case(f"SharedND.{meth}", f"graph={bname}", names, mk([bad])))
        if meth == "resize":
            for bname, bad in BAD_ALLOC_DIMS.items():
                out.append(Case(f"SharedND.{meth}", f"dims={bname}", names, mk(list(bad))))
        out.append(Case(f"SharedND.{meth}", "extra arg", names, mk([*good, *([None] * 8)])))
    return out


def all_cases() -> list[Case]:
    global _CTX
    _CTX = make_ctx()
    out = []
    for spec in SPECS:
        out += _spec_cases(spec)
    return out + _shared_cases()


def judge(case: Case) -> str | None:
    """None when the call raised an error a user can act on, else why it did not."""
    try:
        case.thunk()
    except mgb.MegBrainError as exc:
        # a MegBrainError may also be a MemoryError or TypeError: it is megbrain's own
        return None if any(n in str(exc) for n in case.names) else f"not naming: {exc}"
    except UNCLEAR as exc:
        return f"{type(exc).__name__}: {exc}"
    except CLEAR as exc:
        if type(exc).__module__.startswith("numpy"):
            return f"numpy's {type(exc).__name__}: {exc}"
        msg = str(exc)
        if not any(n in msg for n in case.names):
            return f"{type(exc).__name__} not naming {case.names[0]}: {msg}"
        return None
    except Exception as exc:  # noqa: BLE001 - every other class is unclear too
        return f"{type(exc).__name__}: {exc}"
    return None  # accepted: some bad-looking values are valid (a dict is not a var, ...)


CASES = all_cases()
ENTRY_POINTS = sorted({c.entry for c in CASES})

# Cases whose fix belongs to code worked on elsewhere: (entry, start of ``what``) -> why.
# They are expected to fail until then, and pass (XPASS) once fixed.
KNOWN_GAPS: dict = {}


def _known_gap(case: Case) -> str | None:
    for (entry, what), why in KNOWN_GAPS.items():
        if case.entry == entry and case.what.startswith(what):
            return why
    return None


def _param(case: Case):
    why = _known_gap(case)
    marks = [pytest.mark.xfail(reason=why, strict=False)] if why else []
    return pytest.param(case, id=f"{case.entry}-{case.what}", marks=marks)


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_bad_call_raises_clear_error(case):
    problem = judge(case)
    assert problem is None, f"{case.entry} {case.what}: {problem}"


def test_messages_name_the_argument():
    """Operands are named by position and argument, with what was expected."""
    c = make_ctx()
    cases = [
        (lambda: O.add_axis(None, 0), r"add_axis: input 0 \(src\) is None; expected a SymbolVar"),
        (lambda: O.convolution(c.x4, object()), r"convolution: input 1 \(filter\) is an object"),
        (lambda: O.concat(c.m, {}, axis=0), r"concat: input 1 \(inputs\[1\]\) is a dict"),
        (lambda: O.batch_norm(c.x4, None, None), r"batch_norm: input 1 \(scale\) is None"),
        (lambda: O.virtual_dep([c.m, "x"]), r"virtual_dep: input 1 \(symvars\[1\]\) is a str"),
        (lambda: O.set_subtensor(c.m, None)[0], r"set_subtensor: input 1 \(value\) is None"),
        (lambda: O.mean("abc"), r"mean: input 0 \(inp\) is a str \('abc'\)"),
        (lambda: mgb.grad(c.m.sum(), None), r"grad: input 1 \(wrt\) is None"),
        (lambda: c.m + None, r"elemwise: value is None"),
    ]
    for call, match in cases:
        with pytest.raises(mgb.ConversionError, match=match):
            call()


def test_graph_arguments_are_checked():
    c = make_ctx()
    with pytest.raises(TypeError, match=r"add_axis: comp_graph must be a CompGraph .*a str"):
        O.add_axis(c.m, 0, comp_graph="g")
    with pytest.raises(TypeError, match=r"make_arg: comp_graph must be a CompGraph .*None"):
        mgb.make_arg("cpu0", None, shape=(2,))
    with pytest.raises(TypeError, match=r"make_shared: comp_graph must be a CompGraph"):
        mgb.make_shared("cpu0", shape=(2,), comp_graph=object())
    with pytest.raises(TypeError, match=r"host2device_copy: graph must be a CompGraph"):
        O.host2device_copy(None, mgb.tensor.HostTensorND.from_ndarray(np.ones(2, np.float32)))
    with pytest.raises(mgb.GraphError, match=r"linspace: can not infer the computing graph"):
        O.linspace(0, 1, 5)
    other = mgb.make_immutable("cpu0", mgb.comp_graph(), np.ones(3, np.float32))
    with pytest.raises(mgb.GraphError, match=r"elemwise: input 1 .* belongs to graph"):
        O.elemwise(c.v, other)


def test_huge_allocation_is_a_megbrain_memory_error():
    """numpy's MemoryError becomes a MemAllocError (also a MemoryError) naming the call."""
    from megbrain.errors import MemAllocError

    with pytest.raises(MemAllocError, match=r"make_shared: can not allocate \d+ bytes"):
        mgb.make_shared("cpu0", shape=(2**24, 2**24))
    snd = mgb.make_shared("cpu0", value=np.zeros(3, np.float32))
    with pytest.raises(MemoryError, match=r"SharedND.resize: can not allocate"):
        snd.resize(2**24, 2**24)


if __name__ == "__main__":
    unclear = [(c, judge(c)) for c in CASES]
    unclear = [(c, p) for c, p in unclear if p is not None]
    for c, p in unclear:
        print(f"{c.entry:28s} {c.what:22s} {p[:150]}")
    print(f"{len(ENTRY_POINTS)} entry points, {len(CASES)} cases, {len(unclear)} unclear")
