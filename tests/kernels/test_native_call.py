"""Bound kernels as C calls (megbrain/kernels/native_call.py), and the pool threads running
them without the GIL (parallel.concurrently)."""

import ctypes
import functools
import platform

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit
from numba import typeof as numba_typeof

from megbrain.kernels import parallel
from megbrain.kernels.native_call import native_call
from megbrain.kernels.tiled_jit import fetch_add

_add = fetch_add()

#: the pool runs native offers on x86 only (its memory order keeps the offer's stores)
x86_only = pytest.mark.skipif(platform.machine().lower() not in parallel._TSO_MACHINES,
                              reason="native offers run on x86 only")  # fmt: skip


@njit(nogil=True)
def _affine(x, y, k, f, g, pair, small, flag):
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            v = x[i, j] * f + g + k + pair[0] * 10 + pair[1] + small
            y[i, j] = -v if flag else v


def _run_c(call) -> None:
    nc = native_call(call)
    assert nc is not None
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(nc.trampoline)(nc.block_addr)


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 5), cols=st.integers(1, 6), step=st.integers(1, 3),
       k=st.integers(-2**40, 2**40), f=st.floats(-4, 4, width=32), g=st.floats(-1e3, 1e3),
       pair=st.tuples(st.integers(-9, 9), st.integers(-9, 9)), small=st.integers(0, 255),
       flag=st.booleans())  # fmt: skip
def test_the_c_call_computes_what_the_python_call_does(rows, cols, step, k, f, g, pair,
                                                       small, flag):  # fmt: skip
    """Arrays (contiguous and strided), integers of 64 and 8 bits, float32 and float64
    scalars, a tuple and a bool reach the kernel as the dispatcher passes them."""
    base = np.arange(rows * cols * step, dtype=np.float32).reshape(rows, cols * step)
    x = base[:, ::step]
    want, got = (np.zeros((rows, cols), np.float32) for _ in range(2))
    args = (k, np.float32(f), g, pair, np.uint8(small), flag)
    functools.partial(_affine, x, want, *args)()
    call = functools.partial(_affine, x, got, *args)
    _run_c(call)
    np.testing.assert_array_equal(got, want)


def test_calls_without_a_c_form_are_refused():
    x = np.zeros((2, 2), np.float32)
    good = functools.partial(_affine, x, x, 1, np.float32(1), 1.0, (1, 1), np.uint8(0), False)
    good()
    assert native_call(good) is not None
    assert native_call(lambda: None) is None
    assert native_call(functools.partial(np.copyto, x, x)) is None  # not a compiled kernel
    assert native_call(functools.partial(_affine, x, y=x)) is None  # keywords
    # a list argument has no C form (Numba's reflected list), nor a string
    assert native_call(functools.partial(_affine, x, x, 1, np.float32(1), 1.0, [1, 1],
                                         np.uint8(0), False)) is None  # fmt: skip
    never_run = functools.partial(_affine, x.astype(np.float64), x, 1, np.float32(1), 1.0,
                                  (1, 1), np.uint8(0), False)  # fmt: skip
    assert native_call(never_run) is None  # no overload compiled for those types yet


@njit(nogil=True)
def _part(out, flag, me):
    """Part ``me`` of a two-part step: part 0 (the caller's) waits for part 1 to have run
    (up to ~seconds), so that part 1 is run by the pool thread, not taken back."""
    if me == 0:
        n = 0
        while _add(flag, 0, 0) == 0 and n < 3_000_000_000:
            n += 1
    out[me] += 1
    if me == 1:
        _add(flag, 0, 1)


@pytest.fixture
def two_threads(monkeypatch):
    monkeypatch.setattr(parallel, "num_threads", lambda: 2)
    parallel._forget_pool()
    yield
    parallel._forget_pool()


@x86_only
def test_a_pool_thread_runs_its_part_as_a_c_call(two_threads, monkeypatch):
    out = np.zeros(2, np.int64)
    flag = np.zeros(1, np.int64)
    natives = []
    make = parallel._native_split
    monkeypatch.setattr(parallel, "_native_split",
                        lambda *a: natives.append(make(*a)) or natives[-1])  # fmt: skip
    step = parallel.concurrently([functools.partial(_part, out, flag, me) for me in (0, 1)])
    for r in range(4):
        flag[0] = 0
        step()
        assert list(out) == [r + 1, r + 1]
        if r > 0:  # from the second run on, the worker claimed part 1 as a C call
            assert len(natives) == 1
            assert parallel._ctl[0][0, parallel._CLAIM] == 1
            assert parallel._ctl[0][0, parallel._NATIVE_DONE] == 1


def test_a_step_bound_with_native_parts_off_stays_in_python(two_threads, monkeypatch):
    monkeypatch.setattr(parallel, "NATIVE_PARTS", False)
    out = np.zeros(2, np.int64)
    flag = np.ones(1, np.int64)
    made = []
    monkeypatch.setattr(parallel, "_native_split", lambda *a: made.append(a))
    step = parallel.concurrently([functools.partial(_part, out, flag, me) for me in (0, 1)])
    for _ in range(3):
        step()
    assert list(out) == [3, 3] and not made


def test_a_native_step_and_a_python_split_share_the_pool(two_threads):
    """Offers of both kinds alternate on the same worker: every part runs once."""
    out = np.zeros(2, np.int64)
    flag = np.zeros(1, np.int64)
    marks = np.zeros(64, np.int64)
    native = parallel.concurrently([functools.partial(_part, out, flag, me) for me in (0, 1)])

    def mark(lo, hi):
        marks[lo:hi] += 1

    python = parallel.split(mark, 64, 1)
    for _ in range(50):
        flag[0] = 0
        native()
        python()
    assert list(out) == [50, 50]
    assert np.all(marks == 50)


@njit(nogil=True)
def _bump(out, i):
    out[i] += 1


@x86_only
def test_items_taken_in_turn_run_once_each_as_c_calls(two_threads, monkeypatch):
    out = np.zeros(40, np.int64)
    built = []
    make = parallel._taking_natively
    monkeypatch.setattr(parallel, "_taking_natively",
                        lambda table: built.append(make(table)) or built[-1])  # fmt: skip
    table = [[functools.partial(_bump, out, i) for i in range(40)] for _ in range(2)]
    step = parallel.take_in_turn(table)
    for _ in range(5):
        step()
    assert built and built[0] is not None
    assert np.all(out == 5)


def test_a_registered_entry_point_has_a_c_form():
    from megbrain.kernels.native_call import register_entry_point

    x = np.zeros(3, np.int64)
    entry = register_entry_point(_bump, (numba_typeof(x), numba_typeof(1)))
    call = functools.partial(entry, x, 2)
    call()
    _run_c(call)
    assert list(x) == [0, 0, 2]


def test_parts_beyond_the_pool_run_on_the_caller(monkeypatch):
    """A step bound for more threads than the pool has (its count raised after the pool
    started) still runs every part."""
    monkeypatch.setattr(parallel, "num_threads", lambda: 2)
    parallel._forget_pool()
    try:
        parallel._pool()
        monkeypatch.setattr(parallel, "num_threads", lambda: 3)
        out = np.zeros(3, np.int64)
        step = parallel.concurrently([functools.partial(_bump, out, i) for i in range(3)])
        for _ in range(3):
            step()
        assert list(out) == [3, 3, 3]
    finally:
        parallel._forget_pool()


def test_two_callers_share_the_pool_without_losing_a_part(two_threads):
    """Steps of C-call parts run from two threads at once: one holds the pool, the other
    runs its parts itself; every part runs once per run, and nothing waits for good."""
    import threading

    outs = [np.zeros(2, np.int64) for _ in range(2)]
    steps = [parallel.concurrently([functools.partial(_bump, out, i) for i in range(2)])
             for out in outs]  # fmt: skip
    errors = []

    def loop(step):
        try:
            for _ in range(300):
                step()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=loop, args=(s,)) for s in steps]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and not any(t.is_alive() for t in threads)
    assert all(list(out) == [300, 300] for out in outs)


@x86_only
def test_a_blocked_network_computes_the_same_bits_with_c_call_parts(monkeypatch):
    """An inverted-residual block and a dense 3x3 layer in NCHW88 (units taken as they go,
    depthwise, pointwise, max pooling, JIT elemwise), large enough to split: compiled with
    C-call parts and without, the outputs are the same bits on every run."""
    if parallel.num_threads() < 2:
        pytest.skip("one kernel thread: nothing splits")
    import megbrain as mgb
    from megbrain.opr.dnn import convolution

    rng = np.random.default_rng(0)
    shape = (1, 32, 40, 40)
    xv = rng.standard_normal(shape).astype(np.float32)

    def build():
        g = mgb.comp_graph(check_env_var=False)
        g.set_option("log_level", 0)
        x = mgb.make_arg("cpu0", g, name="x", shape=shape)
        r = np.random.default_rng(1)

        def shared(s):
            return mgb.make_shared("cpu0", value=(r.standard_normal(s) * 0.2).astype(np.float32),
                                   comp_graph=g)  # fmt: skip

        def conv(v, w, **kw):
            return convolution(v, shared(w), **kw) + shared((1, w[0], 1, 1))

        relu = mgb.opr.elem.relu
        h = relu(conv(x, (192, 32, 1, 1)))
        h = relu(convolution(h, shared((192, 1, 1, 3, 3)), pad_h=1, pad_w=1, sparse="GROUP")
                 + shared((1, 192, 1, 1)))  # fmt: skip
        y = conv(h, (32, 192, 1, 1)) + x
        y = relu(conv(y, (64, 32, 3, 3), pad_h=1, pad_w=1))
        y = mgb.opr.pooling(y, window_h=3, window_w=3, stride_h=2, stride_w=2, mode="MAX")
        y = mgb.opr.elem.sigmoid(y) * y
        outs = mgb.optimize_for_inference([y], use_nchw88=True, fuse_conv_bias_nonlinearity=True,
                                          fuse_conv_bias_with_z=True)  # fmt: skip
        g.set_option("graph_opt.jit", 1)
        f = g.compile([x], [mgb.copy_output(outs[0])])
        return f

    natives = []
    make = parallel._native_split
    monkeypatch.setattr(parallel, "_native_split",
                        lambda *a: natives.append(make(*a)) or natives[-1])  # fmt: skip
    monkeypatch.setattr(parallel, "NATIVE_PARTS", False)
    python = build()
    want = [np.array(python(xv)[0]) for _ in range(3)]
    monkeypatch.setattr(parallel, "NATIVE_PARTS", True)
    native = build()
    got = [np.array(native(xv)[0]) for _ in range(3)]
    assert natives, "no step ran its parts as C calls"
    for w, g in zip(want, got):
        np.testing.assert_array_equal(g, w)
