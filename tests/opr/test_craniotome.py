"""Operators defined in Python (``megbrain.craniotome``): forward with static and dynamic
shapes, sources, gradients, eager graphs, multi-part and copied compiles, deduplication,
compile notifications, class checks, malformed hook results and user exceptions."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import megbrain as mgb
from megbrain.craniotome import CraniotomeBase, make_opr
from megbrain.opr.craniotome import Craniotome, CraniotomeClassError, CraniotomeOutput

CN = "cpu0"
F32 = np.float32


def _graph(**opts):
    g = mgb.comp_graph(check_env_var=False)
    for k, v in opts.items():
        g.set_option(k, v)
    return g


def _arg(g, shape=(3,), name="x"):
    return mgb.make_arg(CN, g, shape=shape, name=name)


def _grad(target, wrt):
    return mgb.grad(target, wrt, use_virtual_grad=False)


def _oprs(func):
    return [o for o in func._func.iter_opr_seq() if isinstance(o, Craniotome)]


class AddMul(CraniotomeBase):
    """(a + b, a * b): two inputs, two outputs, gradient as a list."""

    __nr_inputs__ = 2
    __nr_outputs__ = 2
    runs = 0

    def infer_shape(self, inp_shapes):
        assert inp_shapes[0] == inp_shapes[1]
        return [inp_shapes[0], inp_shapes[0]]

    def execute(self, inputs, outputs):
        type(self).runs += 1
        a, b = (i.get_value() for i in inputs)
        outputs[0].set_value(a + b)
        outputs[1].set_value(a * b)

    def grad(self, wrt_idx, inputs, outputs, out_grad):
        a, b = inputs
        gs, gp = out_grad
        ga = (gs if gs is not None else 0) + (gp * b if gp is not None else 0)
        gb = (gs if gs is not None else 0) + (gp * a if gp is not None else 0)
        return [ga, gb]


class Cube(CraniotomeBase):
    """x ** 3 with a differentiable gradient (second order works)."""

    __nr_inputs__ = 1
    __nr_outputs__ = 1

    def infer_shape(self, inp_shapes):
        return inp_shapes

    def execute(self, inputs, outputs):
        outputs[0].set_value(inputs[0].get_value() ** 3)

    def grad(self, wrt_idx, inputs, outputs, out_grad):
        (x,) = inputs
        return out_grad[0] * x * x * 3


# ---- forward -------------------------------------------------------------------------------
def test_static_forward_outputs_are_planned():
    g = _graph()
    x, y = _arg(g, name="x"), _arg(g, name="y")
    s, p = AddMul.make(x, y)
    assert s.imm_shape == (3,) and p.imm_shape == (3,)
    assert s.dtype == np.float32
    f = g.compile([x, y], [mgb.copy_output(s), mgb.copy_output(p * 2)])
    a, b = np.arange(3, dtype=F32), np.full(3, 2.0, F32)
    rs, rp = f(a, b)
    np.testing.assert_array_equal(rs, a + b)
    np.testing.assert_array_equal(rp, a * b * 2)
    (opr,) = _oprs(f)
    info = {d["id"]: d["kind"] for d in f._func.mem_alloc_info()}
    assert info[s.node.id] == "static" and info[p.node.id] == "static"
    assert opr.type_name == "Craniotome" and opr.name == "AddMul(x,y)"
    # a new input shape re-plans and re-infers
    rs, _ = f(np.ones((5,), F32), np.ones((5,), F32))
    np.testing.assert_array_equal(rs, np.full(5, 2.0))


def test_immediate_inputs_kwargs_and_instance_counts():
    class SumN(CraniotomeBase):
        __nr_inputs__ = None
        __nr_outputs__ = 1
        scale = 1.0

        def setup(self, n, scale=1.0):
            self.__nr_inputs__ = n
            self.scale = scale

        def infer_shape(self, inp_shapes):
            return [inp_shapes[0]]

        def execute(self, inputs, outputs):
            outputs[0].set_value(sum(i.get_value() for i in inputs) * self.scale)

    g = _graph()
    x = _arg(g)
    y = SumN.make(x, 2.0, np.ones(3, F32), n=3, scale=10.0)
    f = g.compile([x], mgb.copy_output(y))
    np.testing.assert_array_equal(f(np.arange(3, dtype=F32)), (np.arange(3) + 3) * 10)
    with pytest.raises(mgb.GraphError, match="expected 2 inputs, got 1"):
        SumN.make(x, n=2)
    with pytest.raises(mgb.GraphError, match="__nr_inputs__ must be an int"):
        SumN.make(x, n="1")
    with pytest.raises(TypeError):
        SumN.make(x, n=1, bogus=1)


def test_expand_single_outputs_off_gives_a_tuple():
    class Id(CraniotomeBase):
        __nr_inputs__ = 1
        __nr_outputs__ = 1
        __expand_single_outputs__ = False

        def infer_shape(self, inp_shapes):
            return inp_shapes

        def execute(self, inputs, outputs):
            outputs[0].set_value(inputs[0])

    g = _graph()
    x = _arg(g)
    (y,) = Id.make(x)
    assert isinstance(y, mgb.SymbolVar)
    assert make_opr(Id) == Id.make
    with pytest.raises(TypeError):
        make_opr(int)


def test_output_dtype_and_conversion():
    class ToInt(CraniotomeBase):
        __nr_inputs__ = 1
        __nr_outputs__ = 1

        def infer_shape(self, inp_shapes):
            return inp_shapes

        def init_output_dtype(self, input_dtypes):
            assert input_dtypes == [np.dtype(np.float32)]
            return [np.int32]

        def execute(self, inputs, outputs):
            assert outputs[0].dtype == np.int32 and outputs[0].shape == (3,)
            outputs[0].set_value(inputs[0].get_value() * 2)  # float32 values are converted

    g = _graph()
    x = _arg(g)
    y = ToInt.make(x)
    assert y.dtype == np.int32
    f = g.compile([x], mgb.copy_output(y + 1))
    out = f(np.arange(3, dtype=F32))
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, [1, 3, 5])


def test_dynamic_output_shape():
    class Positive(CraniotomeBase):
        __nr_inputs__ = 1
        __nr_outputs__ = 1
        __is_dynamic_output_shape__ = True

        def execute(self, inputs, outputs):
            v = inputs[0].get_value()
            assert outputs[0].shape == ()  # unset until written
            outputs[0].set_value(v[v > 0])

    g = _graph()
    x = _arg(g, shape=(5,))
    y = Positive.make(x)
    assert y.imm_shape == ()  # only known when running (MegBrain's _get_imm_shape)
    f = g.compile([x], mgb.copy_output(y * 2))
    np.testing.assert_array_equal(f(np.array([1, -1, 2, -3, 4], F32)), [2, 4, 8])
    assert y.imm_shape == (3,)  # the shape the run computed
    np.testing.assert_array_equal(f(np.array([-1, -1, 5, -3, -4], F32)), [10])
    # an empty result is refused unless __allow_empty_out__
    with pytest.raises(mgb.GraphError, match="__allow_empty_out__"):
        f(np.full(5, -1.0, F32))


def test_dynamic_output_left_unset_or_empty_allowed():
    class Maybe(CraniotomeBase):
        __nr_inputs__ = 1
        __nr_outputs__ = 2
        __is_dynamic_output_shape__ = True
        __allow_empty_out__ = True

        def execute(self, inputs, outputs):
            outputs[0].resize(2, 2)
            outputs[0].reset_zero()

    g = _graph()
    x = _arg(g)
    a, b = Maybe.make(x)
    f = g.compile([x], [mgb.copy_output(a), mgb.copy_output(b)])
    ra, rb = f(np.ones(3, F32))
    np.testing.assert_array_equal(ra, np.zeros((2, 2)))
    assert rb.shape == (0,)


def test_static_shape_change_in_execute_is_an_error():
    class Grow(CraniotomeBase):
        __nr_inputs__ = 1
        __nr_outputs__ = 1

        def infer_shape(self, inp_shapes):
            return inp_shapes

        def execute(self, inputs, outputs):
            outputs[0].set_value(np.zeros(7, F32))

    g = _graph()
    x = _arg(g)
    f = g.compile([x], mgb.copy_output(Grow.make(x)))
    with pytest.raises(mgb.GraphError, match=r"inferred shape \{3\} to \{7\}") as info:
        f(np.ones(3, F32))
    assert any("Grow(x)" in n for n in info.value.__notes__)


def test_output_handles_expire_after_execute():
    kept = []

    class Keep(CraniotomeBase):
        __nr_inputs__ = 1
        __nr_outputs__ = 1

        def infer_shape(self, inp_shapes):
            return inp_shapes

        def execute(self, inputs, outputs):
            kept.append(outputs[0])
            outputs[0].set_value(inputs[0])
            np.testing.assert_array_equal(outputs[0].get_value(), inputs[0].get_value())

    g = _graph()
    x = _arg(g)
    f = g.compile([x], mgb.copy_output(Keep.make(x)))
    f(np.ones(3, F32))
    assert isinstance(kept[0], CraniotomeOutput)
    with pytest.raises(mgb.GraphError, match="outside execute"):
        kept[0].set_value(np.ones(3, F32))


# ---- sources ---------------------------------------------------------------------------------
def test_no_input_operator():
    class Iota(CraniotomeBase):
        __nr_inputs__ = 0
        __nr_outputs__ = 1

        def setup(self, n):
            self.n = n

        def infer_shape(self, inp_shapes):
            assert inp_shapes == ()
            return [(self.n,)]

        def init_output_dtype(self, input_dtypes):
            return [np.int32]

        def execute(self, inputs, outputs):
            outputs[0].set_value(np.arange(self.n))

    g = _graph()
    y = Iota.make(comp_graph=g, comp_node=CN, n=4)
    assert y.imm_shape == (4,) and y.dtype == np.int32
    assert y.inferred_value is None  # opaque: never run by static inference
    f = g.compile(None, mgb.copy_output(y * 2))
    np.testing.assert_array_equal(f(), [0, 2, 4, 6])
    with pytest.raises(mgb.GraphError, match="comp_graph must be given"):
        Iota.make(n=4)
    with pytest.raises(mgb.GraphError, match="comp_node must be given"):
        Iota.make(comp_graph=g, n=4)


def test_no_input_operator_needs_init_output_dtype():
    class NoDtype(CraniotomeBase):
        __nr_inputs__ = 0
        __nr_outputs__ = 1

        def infer_shape(self, inp_shapes):
            return [(1,)]

        def execute(self, inputs, outputs):
            pass

    with pytest.raises(mgb.GraphError, match="init_output_dtype"):
        NoDtype.make(comp_graph=_graph(), comp_node=CN)


def test_dynamic_source_asks_its_shape_before_each_run():
    class Growing(CraniotomeBase):
        __nr_inputs__ = 0
        __nr_outputs__ = 1
        __is_dynamic_output_shape__ = True
        n = 1

        def infer_shape(self, inp_shapes):
            return [(self.n,)]

        def init_output_dtype(self, input_dtypes):
            return [np.float32]

        def execute(self, inputs, outputs):
            outputs[0].set_value(np.arange(self.n, dtype=F32))
            self.n += 1

    g = _graph()
    y = Growing.make(comp_graph=g, comp_node=CN)
    assert y.imm_shape == (1,)
    f = g.compile(None, mgb.copy_output(y + 1))
    np.testing.assert_array_equal(f(), [1])
    np.testing.assert_array_equal(f(), [1, 2])
    np.testing.assert_array_equal(f(), [1, 2, 3])


# ---- gradients -------------------------------------------------------------------------------
def test_grad_list_with_none_out_grad():
    g = _graph()
    x, y = _arg(g, name="x"), _arg(g, name="y")
    s, p = AddMul.make(x, y)
    # the loss reads only the product: out_grad[0] is None
    gx, gy = mgb.grad(p.sum(), [x, y])
    f = g.compile([x, y], [mgb.copy_output(gx), mgb.copy_output(gy)])
    a, b = np.arange(3, dtype=F32), np.full(3, 2.0, F32)
    rx, ry = f(a, b)
    np.testing.assert_array_equal(rx, b)
    np.testing.assert_array_equal(ry, a)
    gx, gy = mgb.grad((s + p).sum(), [x, y])
    f = g.compile([x, y], [mgb.copy_output(gx), mgb.copy_output(gy)])
    rx, ry = f(a, b)
    np.testing.assert_array_equal(rx, 1 + b)
    np.testing.assert_array_equal(ry, 1 + a)


def test_grad_var_and_second_order():
    g = _graph()
    x = _arg(g)
    y = Cube.make(x)
    (g1,) = mgb.grad(y.sum(), [x], use_virtual_grad=False)
    (g2,) = mgb.grad(g1.sum(), [x], use_virtual_grad=False)
    f = g.compile([x], [mgb.copy_output(y), mgb.copy_output(g1), mgb.copy_output(g2)])
    a = np.array([1, 2, 3], F32)
    ry, r1, r2 = f(a)
    np.testing.assert_allclose(ry, a**3)
    np.testing.assert_allclose(r1, 3 * a**2)
    np.testing.assert_allclose(r2, 6 * a)


def test_grad_zero_and_comp_order_deps_have_no_grad():
    class FirstOnly(CraniotomeBase):
        __nr_inputs__ = 2
        __nr_outputs__ = 1

        def infer_shape(self, inp_shapes):
            return [inp_shapes[0]]

        def execute(self, inputs, outputs):
            outputs[0].set_value(inputs[0].get_value() * 2)

        def grad(self, wrt_idx, inputs, outputs, out_grad):
            return out_grad[0] * 2 if wrt_idx == 0 else 0

    g = _graph()
    x, y, d = _arg(g, name="x"), _arg(g, name="y"), _arg(g, name="d")
    z = FirstOnly.make(x, y, dev_comp_order_deps=[d * 3])
    gx, gy, gd = mgb.grad(z.sum(), [x, y, d])
    f = g.compile([x, y, d], [mgb.copy_output(gx), mgb.copy_output(gy), mgb.copy_output(gd)])
    rx, ry, rd = f(np.ones(3, F32), np.ones(3, F32), np.ones(3, F32))
    np.testing.assert_array_equal(rx, [2, 2, 2])
    np.testing.assert_array_equal(ry, [0, 0, 0])
    np.testing.assert_array_equal(rd, [0, 0, 0])


def test_grad_not_implemented_and_bad_results():
    class G(CraniotomeBase):
        __nr_inputs__ = 1
        __nr_outputs__ = 1
        result = None

        def setup(self, result=None):
            self.result = result

        def infer_shape(self, inp_shapes):
            return inp_shapes

        def execute(self, inputs, outputs):
            outputs[0].set_value(inputs[0])

        def grad(self, wrt_idx, inputs, outputs, out_grad):
            return self.result(out_grad[0]) if callable(self.result) else self.result

    class NoGrad(G):
        grad = CraniotomeBase.grad

    g = _graph()
    x = _arg(g)
    with pytest.raises(mgb.GraphError, match="must give a SymbolVar or 0 for input 0, got str"):
        _grad(G.make(x, result="oops").sum(), [x])
    with pytest.raises(mgb.GraphError, match="returned 2 gradients for 1 inputs"):
        _grad(G.make(x, result=lambda og: [og, og]).sum(), [x])
    with pytest.raises(mgb.GraphError, match=r"gave shape \{1\} for input 0 of shape \{3\}"):
        _grad(G.make(x, result=lambda og: og.sum()).sum(), [x])
    with pytest.raises(mgb.MegBrainError, match="grad for craniotome:NoGrad not implemented"):
        _grad(NoGrad.make(x).sum(), [x])


# ---- graph features ---------------------------------------------------------------------------
def test_eager_graph():
    events = []

    class Double(Cube):
        def execute(self, inputs, outputs):
            events.append("run")
            outputs[0].set_value(inputs[0].get_value() * 2)

        def grad(self, wrt_idx, inputs, outputs, out_grad):
            return out_grad[0] * 2

        def on_graph_compiled(self, used_outputs):
            events.append(("compiled", used_outputs))

        def on_compiled_func_deleted(self):
            events.append("deleted")

    g = _graph(eager_evaluation=True)
    x = mgb.make_shared(CN, value=np.arange(3, dtype=F32), comp_graph=g, name="x")
    y = Double.make(x)
    assert events == [("compiled", (0,)), "run"]
    np.testing.assert_array_equal(y.eager_val.get_value(), [0, 2, 4])
    (gx,) = _grad(y.sum(), [x])
    np.testing.assert_array_equal(gx.eager_val.get_value(), [2, 2, 2])
    del y, gx
    gc.collect()
    assert events[-1] == "deleted"


def test_eager_execute_error_raises_at_make():
    class Fail(Cube):
        def execute(self, inputs, outputs):
            raise KeyError("nope")

    g = _graph(eager_evaluation=True)
    x = mgb.make_shared(CN, value=np.ones(3, F32), comp_graph=g)
    with pytest.raises(KeyError) as info:
        Fail.make(x)
    assert any("Fail(" in n for n in info.value.__notes__)
    np.testing.assert_array_equal((x + 1).eager_val.get_value(), [2, 2, 2])  # still usable


def test_multi_part_compile_runs_once():
    g = _graph()
    x = _arg(g)
    AddMul.runs = 0
    s, p = AddMul.make(x, x)
    f0, f1 = g.compile_multi_part([([x], mgb.copy_output(s)), (None, mgb.copy_output(p + s))])
    a = np.arange(3, dtype=F32)
    np.testing.assert_array_equal(f0(a), a + a)
    np.testing.assert_array_equal(f1(), a * a + a + a)
    assert AddMul.runs == 1


def test_compile_copy_uses_copy():
    copies = []

    class Scaled(Cube):
        def setup(self, k):
            self.k = k

        def execute(self, inputs, outputs):
            outputs[0].set_value(inputs[0].get_value() * self.k)

        def copy(self):
            ret = super().copy()
            copies.append((self, ret))
            return ret

    g = _graph()
    x = _arg(g)
    y = Scaled.make(x, k=3.0)
    f = g.compile([x], mgb.copy_output(y))
    fc = g.compile([x], mgb.copy_output(y + 1), copy=True)
    a = np.arange(3, dtype=F32)
    np.testing.assert_array_equal(fc(a), a * 3 + 1)
    np.testing.assert_array_equal(f(a), a * 3)  # the original function stays valid
    ((orig, new),) = copies
    assert orig is y.node.owner.desc
    assert new is not orig and new.k == 3.0
    (copied,) = _oprs(fc)
    assert copied.desc is new and new.owner_opr_id == copied.id
    assert copied.graph is not g and orig.owner_opr_id == y.node.owner.id


def test_copy_must_return_a_new_instance_of_the_class():
    class BadCopy(Cube):
        def copy(self):
            return self

    g = _graph()
    x = _arg(g)
    y = BadCopy.make(x)
    g.compile([x], mgb.copy_output(y))
    with pytest.raises(mgb.GraphError, match="copy\\(\\) must return a new BadCopy"):
        g.compile([x], mgb.copy_output(y), copy=True)


def test_dedup_by_hash_and_eq():
    class Scale(Cube):
        def setup(self, k):
            self.k = k

        def execute(self, inputs, outputs):
            outputs[0].set_value(inputs[0].get_value() * self.k)

        def __hash__(self):
            return hash(self.k)

        def __eq__(self, rhs):
            return self.k == rhs.k

    class Other(Scale):
        pass

    g = _graph()
    x = _arg(g)
    a, b, c, d = Scale.make(x, k=2), Scale.make(x, k=2), Scale.make(x, k=3), Other.make(x, k=2)
    assert a.node is b.node and a.node is not c.node and a.node is not d.node
    # the default (identity) never merges
    assert Cube.make(x).node is not Cube.make(x).node

    class Unhashable(Cube):
        def __eq__(self, rhs):
            return True

    with pytest.raises(mgb.GraphError, match="unhashable"):
        Unhashable.make(x)


def test_graph_optimizer_treats_it_as_opaque():
    runs = []

    class Plus(Cube):
        def execute(self, inputs, outputs):
            runs.append(1)
            outputs[0].set_value(inputs[0].get_value() + 1)

    g = _graph(graph_opt_level=2)
    c = mgb.make_immutable(CN, g, np.ones(3, F32))
    y = (Plus.make(c) + 1) + 2  # constant inputs: not folded into a constant
    f = g.compile(None, mgb.copy_output(y))
    assert runs == []
    np.testing.assert_array_equal(f(), [5, 5, 5])
    assert len(runs) == 1 and len(_oprs(f)) == 1


def test_io_vars_comp_node_and_comp_order_deps():
    order = []

    class Rec(CraniotomeBase):
        __nr_inputs__ = 1
        __nr_outputs__ = 1

        def setup(self, tag):
            self.tag = tag

        def infer_shape(self, inp_shapes):
            return inp_shapes

        def execute(self, inputs, outputs):
            order.append(self.tag)
            io = self.get_io_vars()
            assert [v.name for v in io["input"]] == ["x"]
            assert len(io["output"]) == 1
            outputs[0].set_value(inputs[0])

    g = _graph()
    x = _arg(g)
    first = Rec.make(x, tag="first")
    # identical structure: only the comp-order dependency orders them
    second = Rec.make(x, tag="second", dev_comp_order_deps=[first])
    desc = second.node.owner.desc
    io = desc.get_io_vars()
    assert io["comp_order"] == [first] and io["output"] == [second] and io["input"] == [x]
    assert desc.owner_opr_id == second.node.owner.id
    assert desc.comp_node == mgb.comp_node(CN)
    f = g.compile([x], [mgb.copy_output(second)])
    f(np.ones(3, F32))
    assert order == ["first", "second"]
    with pytest.raises(mgb.GraphError, match="not the descriptor of an operator"):
        Rec().get_io_vars()


# ---- compile notifications --------------------------------------------------------------------
def test_compiled_and_deleted_callbacks_pair():
    events = []

    class Watch(AddMul):
        def on_graph_compiled(self, used_outputs):
            events.append(("compiled", used_outputs))

        def on_compiled_func_deleted(self):
            events.append("deleted")

    g = _graph()
    x = _arg(g)
    s, p = Watch.make(x, x)
    f1 = g.compile([x], mgb.copy_output(p))
    assert events == [("compiled", (1,))]
    f1(np.ones(3, F32))
    f2 = g.compile([x], [mgb.copy_output(s), mgb.copy_output(p)])
    assert events == [("compiled", (1,)), "deleted", ("compiled", (0, 1))]
    f2(np.ones(3, F32))
    g.compile([x], mgb.copy_output(x + 1))  # a function without the operator
    assert events[-1] == "deleted"
    n = len(events)
    f3 = g.compile([x], mgb.copy_output(s * 2), copy=True)  # on the copy's descriptor
    assert events[n:] == [("compiled", (0,))]
    del f1, f2, f3
    gc.collect()
    assert events[-1] == "deleted"
    assert events.count("deleted") == sum(isinstance(e, tuple) for e in events)


# ---- class checks -------------------------------------------------------------------------------
def test_class_definition_checks():
    with pytest.raises(CraniotomeClassError, match="__init__"):

        class A(CraniotomeBase):
            def __init__(self):
                pass

    with pytest.raises(AssertionError, match="get_io_vars"):

        class B(CraniotomeBase):
            def get_io_vars(self):
                pass

    with pytest.raises(CraniotomeClassError, match="_owner"):

        class C(CraniotomeBase):
            def _owner(self):
                pass

    with pytest.raises(KeyError, match="__nr_input__"):

        class D(CraniotomeBase):
            __nr_input__ = 1

    class E(CraniotomeBase):  # allowed with __check_key__ = False
        __check_key__ = False
        __custom__ = 1
        __nr_inputs__ = 1
        __nr_outputs__ = 1

        def _helper(self):  # private names the base lacks are fine
            pass

    class Abstract(CraniotomeBase):
        __nr_inputs__ = 1
        __nr_outputs__ = 1

    with pytest.raises(TypeError):
        Abstract.make(_arg(_graph()))


def test_infer_shape_required_unless_dynamic():
    class NoInfer(CraniotomeBase):
        __nr_inputs__ = 1
        __nr_outputs__ = 1

        def execute(self, inputs, outputs):
            pass

    with pytest.raises(mgb.GraphError, match="infer_shape\\(\\) must be implemented"):
        NoInfer.make(_arg(_graph()))


@pytest.mark.parametrize(
    ("ret", "match"),
    [
        ([(0,)], "dims must be positive"),
        ([(-1,)], "dims must be positive"),
        ([(2.5,)], "a shape is a non-empty sequence of ints"),
        ([()], "a shape is a non-empty sequence of ints"),
        ([(3,), (3,)], "returned 2 shapes for 1 outputs"),
        ("abc", "must return a list of 1 shapes"),
        ([3], "a shape is a non-empty sequence of ints"),
    ],
)
def test_bad_infer_shape_results(ret, match):
    class Bad(CraniotomeBase):
        __nr_inputs__ = 1
        __nr_outputs__ = 1

        def infer_shape(self, inp_shapes):
            return ret

        def execute(self, inputs, outputs):
            pass

    with pytest.raises(mgb.GraphError, match=match) as info:
        Bad.make(_arg(_graph()))
    assert "craniotome:Bad" in str(info.value)


def test_bad_init_output_dtype_results():
    class Bad(Cube):
        def setup(self, ret):
            self.ret = ret

        def init_output_dtype(self, input_dtypes):
            return self.ret

    x = _arg(_graph())
    with pytest.raises(mgb.GraphError, match="list of 1 dtypes"):
        Bad.make(x, ret=np.float32)
    with pytest.raises(mgb.GraphError, match="invalid dtype"):
        Bad.make(x, ret=["no-such-dtype"])


# ---- user exceptions ----------------------------------------------------------------------------
def test_execute_exception_is_the_users_own():
    class Flaky(Cube):
        fail = True

        def execute(self, inputs, outputs):
            if type(self).fail:
                raise ValueError("bad value in execute")
            outputs[0].set_value(inputs[0].get_value() + 1)

    g = _graph()
    x = _arg(g)
    y = Flaky.make(x, name="flaky")
    f = g.compile([x], mgb.copy_output(y))
    with pytest.raises(ValueError, match="bad value in execute") as info:
        f(np.ones(3, F32))
    assert any("'flaky'" in n and "Flaky" in n for n in info.value.__notes__)
    Flaky.fail = False
    np.testing.assert_array_equal(f(np.ones(3, F32)), [2, 2, 2])  # the graph is still usable


def test_execute_exception_from_wait_without_auto_wait():
    class Boom(Cube):
        def execute(self, inputs, outputs):
            raise ZeroDivisionError("boom")

    g = _graph()
    x = _arg(g)
    f = g.compile([x], mgb.copy_output(Boom.make(x)))
    f.disable_auto_wait()
    f(np.ones(3, F32))
    with pytest.raises(ZeroDivisionError) as info:
        f.wait()
    assert any("Boom(x)" in n for n in info.value.__notes__)


def test_infer_shape_exception_is_noted():
    class Raises(Cube):
        def infer_shape(self, inp_shapes):
            raise LookupError("no shape")

    with pytest.raises(LookupError) as info:
        Raises.make(_arg(_graph()))
    assert any("infer_shape()" in n for n in info.value.__notes__)


def test_on_another_comp_node_threaded():
    class Twice(Cube):
        def execute(self, inputs, outputs):
            v = inputs[0].get_value()
            if v[0] < 0:
                raise ValueError("negative")
            outputs[0].set_value(v * 2)

    g = _graph()
    x = _arg(g)
    y = Twice.make(x, comp_node="cpu1")
    assert y.comp_node == mgb.comp_node("cpu1")
    f = g.compile([x], mgb.copy_output(y + 1))
    assert f._func._threaded
    np.testing.assert_array_equal(f(np.arange(3, dtype=F32)), [1, 3, 5])
    with pytest.raises(ValueError, match="negative"):
        f(-np.ones(3, F32))
    np.testing.assert_array_equal(f(np.arange(3, dtype=F32)), [1, 3, 5])


@pytest.mark.parametrize(
    "opts", [{"enable_sublinear_memory_opt": True}, {"force_dynamic_alloc": True}]
)
def test_memory_options(opts):
    class NoDup(Cube):
        __allow_duplicate__ = False

    g = _graph(**opts)
    x = _arg(g)
    y = NoDup.make(x * 2 + 1)
    assert y.node.owner.__allow_duplicate__ is False
    z = (y * 3 + 2).sum()
    (gx,) = _grad(z, [x])
    f = g.compile([x], [mgb.copy_output(z), mgb.copy_output(gx)])
    rz, rg = f(np.arange(3, dtype=F32))
    a = np.arange(3) * 2 + 1
    np.testing.assert_allclose(rz, [(a**3 * 3 + 2).sum()])
    np.testing.assert_allclose(rg, 9 * a**2 * 2)


def test_compiling_an_eager_graph_runs_a_copy():
    class Neg(Cube):
        def execute(self, inputs, outputs):
            outputs[0].set_value(-inputs[0].get_value())

    g = _graph(eager_evaluation=True)
    x = mgb.make_shared(CN, value=np.arange(3, dtype=F32), comp_graph=g)
    y = Neg.make(x)
    f = g.compile(None, mgb.copy_output(y * 2))
    np.testing.assert_array_equal(f(), [0, -2, -4])
    (opr,) = _oprs(f)
    assert opr.desc is not y.node.owner.desc and type(opr.desc) is Neg
