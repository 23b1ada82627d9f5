"""I/O operators: Host2DeviceCopy re-planning, (volatile) shared device tensors, immutable
dedup, cross comp node Copy, and kernel errors surfacing from wait()."""

import numpy as np
import pytest
from opr_harness import HostValue, inputs, make_graph, run

from megbrain.device import CompNode
from megbrain.errors import MegBrainError
from megbrain.graph import InferType, OperatorNodeBase, OperatorNodeConfig, register_opr
from megbrain.opr import copy, elem, insert_opr, make_immutable, shared_device_tensor


class DevValue(HostValue):
    """A shared device tensor for the tests: the harness's tensor protocol over a replaceable
    array (``empty()``, ``shape``, ``dtype``, ``comp_node``, ``as_ndarray()``)."""

    def __init__(self, arr, comp_node="cpu0"):
        super().__init__(arr, CompNode.load(comp_node))


def _compile(g, var):
    got = {}
    f = g.compile([(var.node, lambda a: got.__setitem__("v", np.array(a)))])
    return f, got


# ---- Host2DeviceCopy ---------------------------------------------------------------------
def test_h2d_shape_change_replans_and_results_follow():
    g = make_graph()
    (x,), (hx,) = inputs(g, np.arange(6, dtype=np.float32).reshape(2, 3))
    y = elem.exp(x) * 2 + x
    f, got = _compile(g, y)
    for shape in [(2, 3), (4, 5), (1,), (2, 3)]:
        xv = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
        hx.arr = xv  # a new buffer and maybe a new shape
        assert y.imm_shape == shape  # static inference follows at once (RT_STATIC)
        f.execute().wait()
        assert got["v"].shape == shape
        np.testing.assert_allclose(got["v"], np.exp(xv) * 2 + xv, rtol=1e-6)
    np.copyto(hx.arr, 7)  # a same-shape value written in place is read on the next run
    f.execute().wait()
    np.testing.assert_allclose(got["v"], np.full((2, 3), np.exp(7) * 2 + 7), rtol=1e-6)


# ---- SharedDeviceTensor / VolatileSharedDeviceTensor --------------------------------------
def test_shared_device_tensor_rejects_replaced_buffer_until_restored():
    g = make_graph()
    w0 = np.arange(4, dtype=np.float32)
    dv = DevValue(w0)
    w = shared_device_tensor(g, dv, name="w")
    assert not w.volatile and w.node.shape_type == InferType.CONST
    f, got = _compile(g, w * 3)
    f.execute().wait()
    np.testing.assert_array_equal(got["v"], w0 * 3)
    dv.arr = np.ones(7, np.float32)  # another shape: the plan bound the old buffer
    with pytest.raises(MegBrainError, match="SharedDeviceTensor"):
        f.execute()
        f.wait()
    dv.arr = w0  # restoring the original buffer makes the function usable again
    f.execute().wait()
    np.testing.assert_array_equal(got["v"], w0 * 3)
    w0[:] = [5, 6, 7, 8]  # writes into the shared buffer itself are seen
    f.execute().wait()
    np.testing.assert_array_equal(got["v"], [15, 18, 21, 24])


def test_shared_device_tensornd_rejects_a_grown_buffer():
    # a DeviceTensorND's per-run check compares its storage's buffer identity: growing the
    # storage in place (same Storage object, new buffer) must be caught like a new tensor
    from megbrain.tensor import DeviceTensorND

    g = make_graph()
    t = DeviceTensorND("cpu0", shape=(4,), dtype=np.float32)
    t.as_ndarray()[:] = np.arange(4)
    w = shared_device_tensor(g, t, name="w")
    f, got = _compile(g, w * 3)
    f.execute().wait()
    np.testing.assert_array_equal(got["v"], np.arange(4) * 3)
    t.as_ndarray()[:] = 1  # a value written in place is read, nothing re-planned
    f.execute().wait()
    np.testing.assert_array_equal(got["v"], [3, 3, 3, 3])
    t.storage.ensure_size(1 << 16)
    with pytest.raises(MegBrainError, match="SharedDeviceTensor 'w'"):
        f.execute()
        f.wait()


@pytest.mark.parametrize("change", ["ensure_size", "resize", "reset"])
def test_multiple_device_tensor_holder_sees_each_change_of_a_tensors_memory(change):
    # its per-run state is kept between layout epochs: every way a held tensor's buffer or
    # shape changes must still be caught (the same tuple is returned only while none did)
    from megbrain.opr.io import multiple_device_tensor_holder
    from megbrain.tensor import DeviceTensorND

    g = make_graph()
    ts = [DeviceTensorND("cpu0", shape=(4,), dtype=np.float32) for _ in range(3)]
    for k, t in enumerate(ts):
        t.as_ndarray()[:] = k
    outs = multiple_device_tensor_holder(g, ts, name="h")
    f, got = _compile(g, outs[2] * 3)
    f.execute().wait()
    np.testing.assert_array_equal(got["v"], [6, 6, 6, 6])
    holder = outs[2].node.owner
    assert holder.runtime_state() is holder.runtime_state()  # kept: nothing changed
    ts[2].as_ndarray()[:] = 5  # a value written in place is read, nothing re-planned
    f.execute().wait()
    np.testing.assert_array_equal(got["v"], [15, 15, 15, 15])
    if change == "ensure_size":
        ts[2].storage.ensure_size(1 << 16)
    elif change == "resize":
        ts[2].resize((5,))
    else:
        ts[2].reset(DeviceTensorND("cpu0", shape=(4,), dtype=np.float32).storage,
                    ts[2].layout)  # fmt: skip
    with pytest.raises(MegBrainError, match="MultipleDeviceTensorHolder 'h'"):
        f.execute()
        f.wait()


def test_volatile_shared_device_tensor_follows_new_buffer():
    g = make_graph()
    dv = DevValue(np.arange(4, dtype=np.float32))
    w = shared_device_tensor(g, dv, volatile=True)
    assert w.volatile and w.node.shape_type == InferType.RT_STATIC
    (x,), _ = inputs(g, np.float32([10]))
    f, got = _compile(g, w + x)
    f.execute().wait()
    np.testing.assert_array_equal(got["v"], [10, 11, 12, 13])
    for new in [np.full(4, 2, np.float32), np.arange(6, dtype=np.float32).reshape(2, 3)]:
        dv.arr = new
        f.execute().wait()
        np.testing.assert_array_equal(got["v"], new + 10)
    np.testing.assert_array_equal((w * 2).inferred_value, dv.arr * 2)


# ---- ImmutableTensor -----------------------------------------------------------------------
def test_immutable_tensor_dedup_and_const():
    g = make_graph()
    v = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    a = make_immutable("cpu0", g, v)
    assert a == make_immutable("cpu0", g, v.copy())  # same value: the same var
    assert a != make_immutable("cpu0", g, v + 1)
    assert a != make_immutable("cpu0", g, v.astype(np.int32))
    assert a != make_immutable("cpu0", g, v.reshape(4))
    assert a != make_immutable("cpu1", g, v)
    assert a.node.shape_type == InferType.CONST and a.node.value_type == InferType.CONST
    v[0, 0] = 100  # the constant holds its own copy
    np.testing.assert_array_equal(a.inferred_value, [[1, 2], [3, 4]])
    (got,) = run([a + 1], g)
    np.testing.assert_array_equal(got, [[2, 3], [4, 5]])


# ---- Copy ------------------------------------------------------------------------------------
@pytest.mark.parametrize("level", [1, 0])
def test_copy_between_comp_nodes(level):
    g = make_graph(async_exec_level=level)
    x0 = np.linspace(-1, 1, 3000, dtype=np.float32).reshape(30, 100)
    (x,), (hx,) = inputs(g, x0, comp_node="cpu0")
    y = copy(x * 2, comp_node="cpu1")
    z = elem.exp(y) + 1  # runs on cpu1
    w = copy(z, comp_node="cpu0") - x
    assert y.comp_node == CompNode.load("cpu1") and z.comp_node == CompNode.load("cpu1")
    assert w.comp_node == CompNode.load("cpu0")
    outs = {}
    f = g.compile(
        [
            (z.node, lambda a: outs.__setitem__("z", np.array(a))),
            (w.node, lambda a: outs.__setitem__("w", np.array(a))),
        ]
    )
    for k in range(3):
        xv = x0 * (k + 1)
        np.copyto(hx.arr, xv)
        f.execute().wait()
        ref_z = np.exp(xv * 2) + 1
        np.testing.assert_allclose(outs["z"], ref_z, rtol=1e-6)
        np.testing.assert_allclose(outs["w"], ref_z - xv, rtol=1e-6)


# ---- errors raised by kernels -------------------------------------------------------------
@register_opr
class FailingKernelForTest(OperatorNodeBase):
    """Identity whose kernel raises while ``fail`` is set."""

    dedup = False

    def __init__(self, inputs, param=None, config=None):
        super().__init__(inputs, param, config)
        self.fail = False

    def infer_shapes(self, in_shapes, in_values):
        return [in_shapes[0]]

    def bind(self, ins, outs):
        def run_kernel():
            if self.fail:
                raise ValueError("kernel exploded")
            np.copyto(outs[0], ins[0])

        return run_kernel


@pytest.mark.parametrize(
    ("level", "cross_node"), [(0, False), (1, False), (2, False), (1, True), (0, True)]
)
def test_kernel_error_surfaces_from_wait_and_function_runs_again(level, cross_node):
    g = make_graph(async_exec_level=level)
    (x,), (hx,) = inputs(g, np.arange(5, dtype=np.float32))
    src = copy(x + 1, comp_node="cpu1") if cross_node else x + 1
    cfg = OperatorNodeConfig(name="boom")
    opr = FailingKernelForTest([src.node], None, cfg)
    (y,) = insert_opr(opr)
    out = copy(y, comp_node="cpu0") * 2 if cross_node else y * 2
    f, got = _compile(g, out)
    opr.fail = True
    f.execute()  # asynchronous: the error is kept for wait()
    with pytest.raises(MegBrainError) as info:
        f.wait()
    msg = str(info.value)
    assert "FailingKernelForTest" in msg and "boom" in msg and "kernel exploded" in msg
    assert isinstance(info.value.__cause__, ValueError)
    f.wait()  # the error was reported once
    opr.fail = False
    np.copyto(hx.arr, [1, 2, 3, 4, 5])
    f.execute().wait()
    np.testing.assert_array_equal(got["v"], [4, 6, 8, 10, 12])
