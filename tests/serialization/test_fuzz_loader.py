"""Fuzzing the graph loader: seeded mutations of real dumps must load or be refused with a
SerializationError -- never another exception, a hang or a huge allocation.

The default run spends ``MEGBRAIN_FUZZ_SECONDS`` (default 15) seconds; the slow test runs at
least ``MEGBRAIN_FUZZ_INPUTS`` (default 10,000) inputs. Both print what they saw: inputs, how
many loaded, how many were refused (by the first words of the message) and the slowest load.
Graphs that load are compiled and run with inputs of their declared shapes; there a
MegBrainError (a graph that is well formed but can not run, say after a changed shape) is a
clean refusal too, any other exception is a failure.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import resource
import signal
import struct
import subprocess
import sys
import textwrap
import time
import tracemalloc

import numpy as np
import pytest

import megbrain as mgb
from megbrain.errors import MemAllocError
from megbrain.serialization.format import GraphSlot, OprSlot, TensorSlot

HEADER = struct.Struct("<IIQ")
#: a load of one input may take at most this long (inputs < 1 MB), timed again once when
#: over it: a first load may compile a kernel into an empty Numba cache (a fresh checkout)
#: or meet the host's hiccup, where a loader that hangs or loops is as slow the second time
LOAD_LIMIT_S = 1.0
#: compiling and running a graph that loaded may take at most this long
RUN_LIMIT_S = 10.0
#: inputs of loaded graphs larger than this are not run (nor graphs with 16 times this in
#: static vars)
RUN_BYTES_LIMIT = 1 << 24


# ---- seed graphs ------------------------------------------------------------------------------


def _tiny():
    g = mgb.comp_graph()
    x = mgb.make_arg("cpu0", g, shape=(2, 3), name="x")
    return {"y": mgb.opr.elemwise(x * 2 + 1, mode="relu")}


def _shared_params():
    rng = np.random.RandomState(0)
    g = mgb.comp_graph()
    x = mgb.make_arg("cpu0", g, shape=(4, 3), name="x")
    w = mgb.make_shared("cpu0", value=rng.rand(4, 3).astype("float32"), comp_graph=g, name="w")
    b = mgb.make_shared("cpu0", value=rng.rand(1, 3).astype("int32"), comp_graph=g, name="b")
    h = mgb.opr.elemwise(x * w + b.astype("float32"), mode="tanh")
    return {"h": h, "k": h * w - w}


def _digits_cnn():
    from megbrain.examples import digits

    model = digits.make_model("cnn")
    model.eval()
    g = mgb.comp_graph()
    x = mgb.make_arg("cpu0", g, shape=(2, 1, 8, 8), name="x")
    return {"logits": model(x)}


def _dump(tmp_path, name, builders, **kw):
    path = tmp_path / f"{name}.mge"
    for i, build in enumerate(builders):
        mgb.serialize_comp_graph_to_file(str(path), build(), append=i > 0, **kw)
    return path.read_bytes()


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz_seeds")
    out = {
        "tiny": _dump(d, "tiny", [_tiny]),
        "shared": _dump(d, "shared", [_shared_params], keep_param_name=True, keep_var_name=2),
        "appended": _dump(d, "appended", [_tiny, _shared_params, _tiny]),
    }
    try:
        out["digits"] = _dump(d, "digits", [_digits_cnn])
    except mgb.SerializationError:  # an operator family not registered yet
        pass
    return out


# ---- where the FlatBuffer keeps its offsets and lengths -----------------------------------------

# field kinds of the tables the loader reads (schema.fbs of MegBrain 0.6)
_GRAPH = {
    GraphSlot.MGB_VERSION: ("scalar", 4),
    GraphSlot.HASH: ("scalar", 8),
    GraphSlot.NR_SHARED_TENSOR: ("scalar", 4),
    GraphSlot.OPRS: ("tables", "Operator"),
    GraphSlot.OUTPUT_VARS_IDX: ("vector", 8),
}
_OPERATOR = {
    OprSlot.TYPE_ID: ("scalar", 8),
    OprSlot.PARAM_TYPE: ("scalar", 1),
    OprSlot.PARAM: ("table", None),
    OprSlot.INPUTS: ("vector", 4),
    OprSlot.COMP_NODE: ("tables", "CompNode"),
    OprSlot.OUTPUT_NAME: ("strings", None),
    OprSlot.OUTPUT_DTYPE: ("table", "DType"),
    OprSlot.TENSORS: ("tables", "Tensor"),
    OprSlot.PRIORITY: ("scalar", 4),
    OprSlot.BLOBS: ("tables", "Blob"),
    OprSlot.ADDITIONAL_PARAMS_TYPE: ("vector", 1),
    OprSlot.ADDITIONAL_PARAMS: ("tables", None),
}
_TENSOR = {
    TensorSlot.NAME: ("string", None),
    TensorSlot.SHAPE: ("vector", 4),
    TensorSlot.COMP_NODE: ("table", "CompNode"),
    TensorSlot.DTYPE: ("table", "DType"),
    TensorSlot.DATA_SIZE: ("scalar", 4),
    TensorSlot.OFFSET: ("scalar", 4),
}
_SCHEMA = {
    "Graph": _GRAPH,
    "Operator": _OPERATOR,
    "Tensor": _TENSOR,
    "CompNode": {0: ("string", None)},
    "DType": {0: ("scalar", 1), 1: ("scalar", 1), 2: ("table", None)},
    "Blob": {0: ("vector", 1)},
}


def fbs_positions(buf: bytes, base: int = 0) -> list[tuple[int, int, str]]:
    """``(position, size, kind)`` of every offset, vtable entry, length and scalar of a
    well-formed graph FlatBuffer ``buf`` (``base`` added to positions); tables of unknown
    type (operator params) contribute their vtables and fields as opaque scalars."""
    out: list[tuple[int, int, str]] = []
    seen: set[int] = set()

    def u32(p):
        return struct.unpack_from("<I", buf, p)[0]

    def add(p, size, kind):
        out.append((base + p, size, kind))

    def target(p):
        add(p, 4, "uoffset")
        return p + u32(p)

    def vector(p, elem, kind):
        v = target(p)
        n = u32(v)
        add(v, 4, "length")
        for i in range(n if elem in (4, 8) else 0):
            add(v + 4 + elem * i, min(elem, 4), kind)
        return v + 4, n

    def table(pos, type_name):
        if pos in seen:
            return
        seen.add(pos)
        add(pos, 4, "soffset")
        vt = pos - struct.unpack_from("<i", buf, pos)[0]
        vt_size, _ = struct.unpack_from("<HH", buf, vt)
        add(vt, 2, "vtable")
        add(vt + 2, 2, "vtable")
        fields = _SCHEMA.get(type_name, {})
        for slot in range((vt_size - 4) // 2):
            entry = vt + 4 + 2 * slot
            add(entry, 2, "vtable")
            off = struct.unpack_from("<H", buf, entry)[0]
            if not off:
                continue
            p = pos + off
            kind, arg = fields.get(slot, ("scalar", 4 if type_name is None else 1))
            if kind == "scalar":
                add(p, arg, "scalar")
            elif kind == "table":
                table(target(p), arg)
            elif kind == "string":
                vector(p, 1, "char")
            elif kind == "vector":
                vector(p, arg, "element")
            elif kind in ("tables", "strings"):
                start, n = vector(p, 4, "uoffset")
                for i in range(n):
                    q = start + 4 * i
                    if kind == "tables":
                        table(q + u32(q), arg)
                    else:
                        add(q + u32(q), 4, "length")

    add(0, 4, "uoffset")
    table(u32(0), "Graph")
    return out


def file_positions(data: bytes) -> list[tuple[int, int, str]]:
    """The header fields and FlatBuffer positions of every graph of a file."""
    out, pos = [], 0
    while pos < len(data):
        _, _, offset = HEADER.unpack_from(data, pos)
        out += [(pos, 4, "magic"), (pos + 8, 8, "header offset")]
        fbs = pos + HEADER.size + offset
        (size,) = struct.unpack_from("<I", data, fbs)
        out.append((fbs, 4, "fbs size"))
        out += fbs_positions(data[fbs + 4 : fbs + 4 + size], fbs + 4)
        pos = fbs + 4 + size
    return out


# ---- mutations --------------------------------------------------------------------------------

_INTERESTING = {
    1: [0, 1, 0x7F, 0x80, 0xFF],
    2: [0, 1, 2, 4, 0x7FFF, 0x8000, 0xFFFF],
    4: [0, 1, 2, 3, 4, 7, 8, 0xFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, 0xFFFFFFFF],
    8: [0, 1, 0x7FFFFFFF, 0xFFFFFFFF, 1 << 32, (1 << 63) - 1, 1 << 63, (1 << 64) - 1],
}
_FMT = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}


def _set_int(buf: bytearray, pos: int, size: int, value: int) -> None:
    if 0 <= pos and pos + size <= len(buf):
        struct.pack_into(_FMT[size], buf, pos, value % (1 << (8 * size)))


def _interesting(rng, size, old, data_len):
    choice = rng.integers(4)
    if choice == 0:
        return int(rng.choice(_INTERESTING[size]))
    if choice == 1:
        return old + int(rng.choice([-8, -4, -2, -1, 1, 2, 4, 8]))
    if choice == 2:
        return int(rng.integers(0, max(data_len, 2) * 2))
    return int(rng.integers(0, 1 << min(8 * size, 63)))


def _mutate_structured(rng, data, positions):
    buf = bytearray(data)
    for _ in range(int(rng.integers(1, 4))):
        pos, size, _kind = positions[int(rng.integers(len(positions)))]
        old = int.from_bytes(buf[pos : pos + size], "little")
        _set_int(buf, pos, size, _interesting(rng, size, old, len(data)))
    return bytes(buf)


def _bitflip(rng, data, _):
    buf = bytearray(data)
    for _ in range(int(rng.integers(1, 9))):
        i = int(rng.integers(len(buf)))
        buf[i] ^= 1 << int(rng.integers(8))
    return bytes(buf)


def _byteset(rng, data, _):
    buf = bytearray(data)
    for _ in range(int(rng.integers(1, 4))):
        size = int(rng.choice([1, 2, 4, 8]))
        pos = int(rng.integers(len(buf)))
        _set_int(buf, pos, size, int(rng.choice(_INTERESTING[size])))
    return bytes(buf)


def _truncate(rng, data, _):
    return data[: int(rng.integers(len(data)))]


def _insert(rng, data, _):
    i = int(rng.integers(len(data) + 1))
    n = int(rng.choice([1, 2, 4, 8, int(rng.integers(1, 64))]))
    return data[:i] + rng.bytes(n) + data[i:]


def _delete(rng, data, _):
    i = int(rng.integers(len(data)))
    return data[:i] + data[i + int(rng.integers(1, 16)) :]


def _garbage(rng, data, _):
    n = int(rng.integers(0, 256))
    if rng.integers(2):  # a valid header before the garbage
        return HEADER.pack(0x5342474D, 0, int(rng.integers(0, n + 8))) + rng.bytes(n)
    return rng.bytes(n)


MUTATORS = {
    "structured": _mutate_structured,
    "bitflip": _bitflip,
    "byteset": _byteset,
    "truncate": _truncate,
    "insert": _insert,
    "delete": _delete,
    "garbage": _garbage,
}
_WEIGHTS = {"structured": 5, "bitflip": 3, "byteset": 2, "truncate": 1, "insert": 1}


def _splice(rng, a, b):
    return a[: int(rng.integers(len(a) + 1))] + b[int(rng.integers(len(b) + 1)) :]


# ---- running one input ------------------------------------------------------------------------


class Hang(BaseException):
    """An input ran past its time limit (a BaseException: no ``except Exception`` of the code
    under test may turn it into an ordinary error)."""


class _Alarm:
    """Raise Hang in the main thread after ``seconds`` (SIGALRM; a no-op where unavailable)."""

    def __init__(self, seconds):
        self.seconds = seconds
        self.ok = hasattr(signal, "setitimer")

    def _fire(self, *_):
        raise Hang(f"no answer within {self.seconds} s")

    def __enter__(self):
        if self.ok:
            self.old = signal.signal(signal.SIGALRM, self._fire)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def __exit__(self, *exc):
        if self.ok:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.old)


def _prefix(msg: str) -> str:
    """The first words of a message, numbers and quoted names blanked, to group refusals."""
    msg = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", msg.split("\n")[0])
    msg = re.sub(r"\b\d+\b", "N", msg)
    return " ".join(msg.split()[:6])


def _run_loaded(res, rng) -> str:
    outs = list(res.output_vars_list)
    inputs = sorted(mgb.cgtools.get_dep_vars(outs, "Host2DeviceCopy"), key=lambda v: v.name)
    values = []
    for v in inputs:
        try:
            shape = tuple(v.imm_shape)
        except mgb.MegBrainError:
            return "not run: input shape unknown"
        dt = np.dtype(v.dtype)
        if int(np.prod(shape, dtype=np.float64)) * dt.itemsize > RUN_BYTES_LIMIT:
            return "not run: input too big"
        values.append(rng.standard_normal(shape).astype(dt))
    if not outs:
        return "not run: no outputs"
    need = 0
    for o in mgb.cgtools.get_oprs_seq(outs):
        for v in o.outputs:
            try:
                need += int(np.prod(v.imm_shape, dtype=np.float64)) * np.dtype(v.dtype).itemsize
            except mgb.MegBrainError:
                pass
    if need > RUN_BYTES_LIMIT * 16:  # a changed padding or shape asks for gigabytes
        return "not run: vars too big"
    f = res.graph.compile(inputs, [mgb.copy_output(o) for o in outs])
    with np.errstate(all="ignore"):  # mutated weights overflow
        f(*values)
    return "ran"


class FuzzStats:
    def __init__(self):
        self.inputs = 0
        self.loaded = 0
        self.outcomes: collections.Counter = collections.Counter()
        self.by_mutator: collections.Counter = collections.Counter()
        self.max_s = 0.0
        self.max_case = None
        self.max_run_s = 0.0
        self.max_run_case = None
        self.failures: list[tuple[str, bytes, str]] = []

    def report(self, title) -> str:
        lines = [
            f"{title}: {self.inputs} inputs, {self.loaded} loaded, "
            f"{self.inputs - self.loaded} refused; slowest load {self.max_s * 1e3:.1f} ms "
            f"({self.max_case}), slowest compile+run {self.max_run_s * 1e3:.1f} ms "
            f"({self.max_run_case}); {len(self.failures)} failures",
            "  by mutator: " + ", ".join(f"{k} {v}" for k, v in sorted(self.by_mutator.items())),
        ]
        for k, v in self.outcomes.most_common(25):
            lines.append(f"  {v:>6}  {k}")
        return "\n".join(lines)


def _time_load(path) -> float:
    """Seconds one more load of ``path`` takes (whether it loads or is refused)."""
    t0 = time.perf_counter()
    with contextlib.suppress(Exception, Hang), _Alarm(5 * LOAD_LIMIT_S):
        list(mgb.iter_comp_graphs_from_file(str(path)))
    return time.perf_counter() - t0


def check_one(path, data: bytes, rng, stats: FuzzStats, case: str) -> None:
    """Load ``data`` (and run what loads); record the outcome, or a failure in ``stats``."""
    path.write_bytes(data)
    stats.inputs += 1
    outcome = None
    t0 = time.perf_counter()
    dt_load = dt_run = 0.0
    try:
        with _Alarm(5 * LOAD_LIMIT_S):
            try:
                graphs = list(mgb.iter_comp_graphs_from_file(str(path)))
            except mgb.SerializationError as exc:
                graphs = None
                outcome = "refused: " + _prefix(str(exc))
        dt_load = time.perf_counter() - t0
        if graphs is not None:
            stats.loaded += 1
            ran = []
            with _Alarm(RUN_LIMIT_S):
                for res in graphs:
                    try:
                        ran.append(_run_loaded(res, rng))
                    except mgb.MegBrainError as exc:
                        ran.append(f"run refused ({type(exc).__name__}): {_prefix(str(exc))}")
            dt_run = time.perf_counter() - t0 - dt_load
            outcome = "loaded; " + "; ".join(sorted(set(ran)))
    except (Exception, Hang) as exc:  # noqa: BLE001 - what the fuzzer looks for
        stats.failures.append((case, data, f"{type(exc).__name__}: {exc}"))
        outcome = f"FAILURE {type(exc).__name__}"
    if dt_load > LOAD_LIMIT_S and len(data) < (1 << 20):
        dt_again = _time_load(path)
        if dt_again > LOAD_LIMIT_S:
            stats.failures.append(
                (case, data, f"loading took {dt_load:.2f} s, then {dt_again:.2f} s again"))
        dt_load = min(dt_load, dt_again)
    if dt_load > stats.max_s:
        stats.max_s, stats.max_case = dt_load, case
    if dt_run > stats.max_run_s:
        stats.max_run_s, stats.max_run_case = dt_run, case
    stats.outcomes[outcome] += 1


def make_case(seeds: dict, positions: dict, seed: int, i: int) -> tuple[str, bytes]:
    """Input ``i`` of the run seeded ``seed``: ``(case name, bytes)``, the same on every call."""
    rng = np.random.default_rng([seed, i])
    names = sorted(seeds)
    name = names[i % len(names)]
    mutators = sorted(MUTATORS)
    weights = np.array([_WEIGHTS.get(m, 1) for m in mutators] + [1], dtype=float)
    k = int(rng.choice(len(weights), p=weights / weights.sum()))
    if k == len(mutators):
        other = names[int(rng.integers(len(names)))]
        return f"{name}/splice:{other}/{seed}:{i}", _splice(rng, seeds[name], seeds[other])
    mut = mutators[k]
    data = MUTATORS[mut](rng, seeds[name], positions[name])
    if rng.random() < 0.2 and data:  # stack a second mutation
        if len(data) == len(seeds[name]):
            data = _mutate_structured(rng, data, positions[name])
        else:
            data = _bitflip(rng, data, None)
    return f"{name}/{mut}/{seed}:{i}", data


def fuzz(seeds: dict, tmp_path, *, seconds=None, inputs=None, seed=0) -> FuzzStats:
    """Inputs ``make_case(seeds, ..., seed, i)`` for i = 0, 1, ... until ``inputs`` were
    checked or ``seconds`` passed."""
    stats = FuzzStats()
    positions = {n: file_positions(d) for n, d in seeds.items()}
    path = tmp_path / "fuzz.mge"
    deadline = None if seconds is None else time.perf_counter() + seconds
    i = 0
    while True:
        if inputs is not None and i >= inputs:
            break
        if deadline is not None and time.perf_counter() > deadline:
            break
        case, data = make_case(seeds, positions, seed, i)
        stats.by_mutator[case.split("/")[1].split(":")[0]] += 1
        check_one(path, data, np.random.default_rng([seed, i, 1]), stats, case)
        i += 1
    return stats


def _describe(seeds: dict, case: str, data: bytes) -> str:
    """How to get ``data`` again: the bytes changed from its seed, or the bytes themselves."""
    seed = seeds.get(case.split("/")[0], b"")
    if len(data) == len(seed):
        diff = [(i, seed[i], data[i]) for i in range(len(data)) if seed[i] != data[i]]
        return f"seed {case.split('/')[0]!r} with bytes (pos, old, new) {diff[:32]}"
    if len(data) <= 2048:
        return f"bytes ({len(data)}): {data.hex()}"
    return f"{len(data)} bytes, make_case(seeds, positions, *{case.split('/')[-1].split(':')})"


def _assert_no_failures(stats: FuzzStats, seeds: dict):
    if stats.failures:
        lines = [f"{len(stats.failures)} failures:"]
        for case, data, why in stats.failures[:5]:
            lines.append(f"{case}: {why}\n    reproducer: {_describe(seeds, case, data)}")
        raise AssertionError("\n".join(lines))


# ---- tests ------------------------------------------------------------------------------------


def test_positions_cover_the_flatbuffer(seeds):
    """The structured mutator knows where the offsets are: every one it finds is in the file,
    and each kind of field is found in every seed."""
    for name, data in seeds.items():
        pos = file_positions(data)
        kinds = collections.Counter(k for _, _, k in pos)
        for k in ("uoffset", "soffset", "vtable", "length", "element", "scalar", "header offset"):
            assert kinds[k] > 0, (name, k)
        assert all(0 <= p and p + s <= len(data) for p, s, _ in pos), name
        assert kinds["magic"] == (3 if name == "appended" else 1)


def test_seeds_load_and_run(seeds, tmp_path):
    stats = FuzzStats()
    rng = np.random.default_rng(0)
    for name, data in seeds.items():
        check_one(tmp_path / "s.mge", data, rng, stats, name)
    _assert_no_failures(stats, seeds)
    assert stats.loaded == len(seeds)
    assert all(k.startswith("loaded; ran") for k in stats.outcomes), stats.outcomes


def test_fuzz_loader_time_budget(seeds, tmp_path):
    seconds = float(os.environ.get("MEGBRAIN_FUZZ_SECONDS", "15"))
    stats = fuzz(seeds, tmp_path, seconds=seconds, seed=1)
    print("\n" + stats.report(f"fuzz ({seconds:g} s budget)"))
    _assert_no_failures(stats, seeds)
    assert stats.inputs >= 50
    assert stats.inputs - stats.loaded > 0 and stats.loaded > 0  # both outcomes seen
    assert stats.max_s < LOAD_LIMIT_S


@pytest.mark.slow
def test_fuzz_loader_many_inputs(seeds, tmp_path):
    n = int(os.environ.get("MEGBRAIN_FUZZ_INPUTS", "10000"))
    stats = fuzz(seeds, tmp_path, inputs=n, seed=2)
    print("\n" + stats.report(f"fuzz ({n} inputs)"))
    _assert_no_failures(stats, seeds)
    assert stats.inputs == n
    assert stats.max_s < LOAD_LIMIT_S


# ---- huge declarations ------------------------------------------------------------------------


def _tensor_shape_positions(data):
    """Positions of the shape elements of every Tensor table (params and input metas)."""
    fbs = HEADER.size + HEADER.unpack_from(data, 0)[2]
    buf = data[fbs + 4 :]
    out = []

    def u32(p):
        return struct.unpack_from("<I", buf, p)[0]

    def field(pos, slot):
        vt = pos - struct.unpack_from("<i", buf, pos)[0]
        vt_size = struct.unpack_from("<H", buf, vt)[0]
        if 4 + 2 * slot >= vt_size:
            return None
        off = struct.unpack_from("<H", buf, vt + 4 + 2 * slot)[0]
        return pos + off if off else None

    def vec(p):
        v = p + u32(p)
        return v + 4, u32(v)

    root = u32(0)
    start, n = vec(field(root, GraphSlot.OPRS))
    for i in range(n):
        opr = start + 4 * i + u32(start + 4 * i)
        tp = field(opr, OprSlot.TENSORS)
        if tp is None:
            continue
        ts, tn = vec(tp)
        for j in range(tn):
            t = ts + 4 * j + u32(ts + 4 * j)
            sp = field(t, TensorSlot.SHAPE)
            s0, sn = vec(sp)
            out.append([fbs + 4 + s0 + 4 * k for k in range(sn)])
    return out


def _huge_variants(data):
    """Files whose tensors declare about 2**62 elements, or a vector of 2**31 - 1 entries."""
    out = []
    for shape_pos in _tensor_shape_positions(data):
        buf = bytearray(data)
        for p in shape_pos:
            struct.pack_into("<I", buf, p, 0x7FFFFFFF)
        out.append(("tensor shape", bytes(buf)))
    for pos, _size, kind in file_positions(data):
        if kind == "length":
            buf = bytearray(data)
            struct.pack_into("<I", buf, pos, 0x7FFFFFFF)
            out.append(("vector length", bytes(buf)))
    return out


def test_huge_declarations_are_refused_without_allocating(seeds, tmp_path):
    """Every tensor of the shared-param graph declared with a huge shape, every vector length
    set to 2**31 - 1: refused (or, for an input tensor, whose file holds no data, loaded
    lazily), the traced peak staying far below what the declarations would need."""
    path = tmp_path / "huge.mge"
    variants = _huge_variants(seeds["shared"])
    assert len(variants) > 10
    refused = collections.Counter()
    for what, data in variants:
        path.write_bytes(data)
        tracemalloc.start()
        try:
            with _Alarm(5):
                mgb.load_comp_graph_from_file(str(path))
        except mgb.SerializationError:
            refused[what] += 1
        finally:
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
        assert peak < 64 << 20, (what, peak)
    # the param tensors' data are in the file: a huge shape there can not match them
    assert refused["tensor shape"] >= 2
    assert refused["vector length"] == sum(1 for w, _ in variants if w == "vector length")


_RLIMIT_CHILD = textwrap.dedent(
    """
    import resource, sys
    import megbrain as mgb
    import numpy as np
    np.zeros(1 << 20)  # warm numpy's allocator
    with open("/proc/self/statm") as f:
        vsize = int(f.read().split()[0]) * resource.getpagesize()
    limit = vsize + (256 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    outcomes = []
    for path in sys.argv[1:]:
        try:
            mgb.load_comp_graph_from_file(path)
            outcomes.append("loaded")
        except mgb.SerializationError:
            outcomes.append("refused")
        except MemoryError as exc:
            outcomes.append("MemoryError")
    print(" ".join(outcomes))
    """
)


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc (Linux)")
def test_huge_declarations_under_address_space_limit(seeds, tmp_path):
    """The same files, loaded in a process whose address space may grow only 256 MiB."""
    paths = []
    for i, (_, data) in enumerate(_huge_variants(seeds["shared"])):
        p = tmp_path / f"h{i}.mge"
        p.write_bytes(data)
        paths.append(str(p))
    r = subprocess.run(
        [sys.executable, "-c", _RLIMIT_CHILD, *paths],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    outcomes = r.stdout.split()
    assert len(outcomes) == len(paths)
    assert "MemoryError" not in outcomes
    assert resource.RLIMIT_AS  # the limit exists on this platform


# ---- known bugs ---------------------------------------------------------------------------------


def test_run_needing_too_much_memory_raises_memallocerror():
    """Found by the fuzzer (a Convolution's pad_w changed to 33554426 in the digits CNN's
    file; the file loads, as the reference's would). A graph whose static vars need more
    memory than the host has should fail its first run with MemAllocError (a MegBrainError
    naming the var), not NumPy's bare MemoryError."""
    g = mgb.comp_graph()
    x = mgb.make_arg("cpu0", g, shape=(1, 1, 8, 8), name="x")
    w = mgb.make_shared("cpu0", value=np.ones((16, 1, 3, 3), "float32"), comp_graph=g)
    y = mgb.opr.convolution(x, w, pad_w=1 << 31)  # (1, 16, 6, 2**32 + 6): 1.5 TiB
    f = g.compile([x], mgb.copy_output(y))
    with pytest.raises(MemAllocError, match=r"can not allocate var 'conv.*1536 GiB"):
        f(np.ones((1, 1, 8, 8), "float32"))
