"""Communication between processes: CollectiveComm, RemoteSend and RemoteRecv on MPI.

MegBrain ran these operators on NCCL between GPUs; here they run on MPI between processes
(``mpiexec -n N python prog.py``) through mpi4py, imported when an operator first runs
(``megbrain.distributed``). The mapping of MegBrain's arguments onto MPI:

* one communicator per ``key``, split from ``COMM_WORLD`` by the first collective of that
  key; every process of the job takes part (``nr_devices`` is the job's size); ``rank``
  and ``nr_devices`` are that communicator's rank and size and must agree with it;
* ``server_addr`` and ``port`` are accepted and unused (MPI's launcher connects the ranks);
* ``backend="mpi"`` (the default); ``"nccl"`` needs CUDA and raises here;
* the operators run on a comp node of their own (the input's device, stream
  ``distributed.COMM_STREAM``) unless ``comp_node`` is given, so the executor runs them on
  that node's worker thread, overlapped with the computation of other nodes;
* every run first exchanges each rank's (is_root, shape, dtype); a mismatch raises the
  same error on every rank, so none is left waiting;
* a blocking wait longer than ``MGB_COMM_TIMEOUT`` seconds (default 50) aborts the job.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial

import numpy as np

from ..device import mpi_comm as _dist
from ..errors import GraphError, MegBrainError
from ..graph import (
    OperatorNodeBase,
    OperatorNodeConfig,
    ParamBase,
    register_opr,
    static_infer,
)
from ..graph.operator import fmt_shape, table_param
from ..graph.var import InferType
from ..kernels.arrays import same_elements
from ..serialization import sereg
from . import basic_arith, indexing, tensor_manip
from . import param_defs as pdefs
from .base import SymbolVar, _merge_config, as_var, canonize_input_vars, check_graph, insert_opr
from .param_args import opr_params

__all__ = [
    "CollectiveComm",
    "RemoteSend",
    "RemoteRecv",
    "collective_comm",
    "remote_send",
    "remote_recv",
    "MPI_DTYPES",
]

#: dtypes MPI transfers and reduces (mpi4py maps them to MPI datatypes)
MPI_DTYPES = tuple(
    np.dtype(t)
    for t in ("float32", "float64", "int8", "uint8", "int16", "uint16", "int32", "int64")
)
_DTYPE_CODE = {d: i for i, d in enumerate(MPI_DTYPES)}
_HDR = 12  # int64s per rank in the shape exchange: is_root, dtype, ndim, dims
_ROOTED = ("BROADCAST", "REDUCE_SUM", "GATHER", "SCATTER")
_GRAD_MODE = {
    "ALL_REDUCE_SUM": "ALL_REDUCE_SUM",
    "ALL_REDUCE_MAX": "ALL_REDUCE_SUM",
    "ALL_REDUCE_MIN": "ALL_REDUCE_SUM",
    "ALL_REDUCE_PROD": "ALL_REDUCE_SUM",
    "BROADCAST": "REDUCE_SUM",
    "REDUCE_SUM": "BROADCAST",
    "ALL_GATHER": "REDUCE_SCATTER_SUM",
    "REDUCE_SCATTER_SUM": "ALL_GATHER",
    "GATHER": "SCATTER",
    "SCATTER": "GATHER",
    "ALL_TO_ALL": "ALL_TO_ALL",
}


@dataclass(frozen=True)
@table_param(pdefs.CollectiveComm)
class CollectiveCommParam(ParamBase):
    """Param of CollectiveComm: the communication ``mode``."""


def _check_backend(backend: str | None, what: str) -> str:
    backend = "mpi" if backend is None else str(backend).lower()
    if backend == "nccl":
        raise MegBrainError(
            f"{what}: backend 'nccl' needs CUDA devices, which this build has not; "
            "use backend='mpi' (processes started by mpiexec)"
        )
    if backend != "mpi":
        raise MegBrainError(f"{what}: unknown backend {backend!r}; expected 'mpi' (or 'nccl')")
    return backend


def _contig(a: np.ndarray) -> np.ndarray:
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


class _Out:
    """An output array MPI can write into: the planned array or a contiguous temporary."""

    def __init__(self, out: np.ndarray):
        self.out = out
        self.buf = out if out.flags.c_contiguous else np.empty(out.shape, out.dtype)

    def done(self):
        if self.buf is not self.out:
            np.copyto(self.out, self.buf)


def _same_memory(a: np.ndarray | None, b: np.ndarray) -> bool:
    return a is not None and same_elements(a, b)


def _copy_then(src: np.ndarray, buf: np.ndarray, post):
    def run():
        np.copyto(buf, src)
        return post()

    return run


class _Bound:
    """A collective bound to its arrays (one per memory plan): the contiguous buffers, this
    rank's header and the MPI calls are fixed here, so that a run is the header exchange, a
    byte comparison of the headers with the last ones that passed the check, and the
    transfer.

    The header exchange completes before the transfer starts, so ranks whose shapes differ
    raise before any data moves (nothing is left pending). Under the ``busy`` wait policy
    both are MPI's blocking collectives: MPICH's blocking Allreduce is its fastest on one
    node (its non-blocking one, and one overlapped with the header, measured slower), and
    an Iallgather overlapped with the transfer saved nothing. Under ``poll`` / ``yield``
    they are non-blocking requests completed by :meth:`mpi_comm._Watch.wait_peers` and
    :func:`mpi_comm.wait`, which do not spin a core.
    """

    __slots__ = ("opr", "src_in", "src", "out", "o", "mine", "infos", "ok", "comm", "calls",
                 "watch", "zero_out", "nbytes", "shapeless")

    def __init__(self, opr: CollectiveComm, src: np.ndarray | None, out: np.ndarray | None):
        self.opr = opr
        self.src_in = src
        #: the array MPI sends from: the input itself when contiguous, else a staging copy
        self.src = src if src is None or src.flags.c_contiguous else np.empty(src.shape,
                                                                                 src.dtype)
        self.out = out
        self.o = None if out is None else _Out(out)
        #: no input and no given output shape: the output is made on the root's shape
        self.shapeless = out is None
        self.mine, self.infos = opr._header(self.src, opr.outputs[0].dtype)
        self.ok = None  # the headers' bytes of the last run that passed the check
        self.comm = None
        #: (blocking call, posting call) of the transfer, made when the headers pass
        self.calls = None
        #: the watchdog's guard of every run (reused: a bound never runs twice at once)
        self.watch = _dist.watch(
            f"{opr.type_name} {opr.name!r} ({opr.param.mode}, rank {opr.rank})")
        self.zero_out = opr.param.mode in ("REDUCE_SUM", "GATHER")
        #: the bytes this rank moves: its input's or output's, whichever is larger
        self.nbytes = max(0 if src is None else src.nbytes, 0 if out is None else out.nbytes)

    def _passed(self, infos: np.ndarray) -> None:
        """Check new headers; learn the root (and a shape-less output's shape), make the
        transfer's calls. Raises on every rank alike when the headers disagree."""
        opr = self.opr
        root, root_shape = opr._check(infos)
        remade = False
        if self.shapeless:  # the output takes the root's shape (which may change)
            shape = root_shape if opr.param.mode == "BROADCAST" else (
                root_shape[0] // opr.nr_devices, *root_shape[1:])
            if self.out is None or self.out.shape != shape:
                self.out = np.empty(shape, opr.outputs[0].dtype)
                self.o = _Out(self.out)
                remade = True
        if self.calls is None or remade or root != opr._root:
            opr._root = root
            self.calls = (opr._poster(self.comm, root, self.src, self.o.buf, blocking=True),
                          opr._poster(self.comm, root, self.src, self.o.buf, blocking=False))
        self.ok = infos.tobytes()

    def __call__(self):
        if self.src is not self.src_in:
            np.copyto(self.src, self.src_in)
        if self.comm is None:
            self.comm = self.opr._comm()
        infos = self.infos
        with self.watch as w:
            w.exchange(self.comm, self.mine, infos)
            if infos.tobytes() != self.ok:
                self._passed(infos)
            if _dist.wait_policy() == "busy":
                self.calls[0]()
            else:
                w.wait(self.calls[1](), self.nbytes)
        o = self.o
        if self.zero_out and self.opr.rank != self.opr._root:
            o.buf.fill(0)
        o.done()
        return self.out


@register_opr
class CollectiveComm(OperatorNodeBase):
    """One collective of the ranks sharing ``key``; see the module docstring for MPI.

    Modes and output shapes (input shape ``S``, ``n = nr_devices``): ALL_REDUCE_SUM / MAX
    / MIN / PROD: ``S``; BROADCAST: the root's ``S`` (other ranks may have no input);
    REDUCE_SUM: ``S`` on the root, ``(1,)`` of zeros elsewhere; ALL_GATHER: ``S[0] * n``
    rows, ranks in order; REDUCE_SCATTER_SUM: row block ``rank`` of the sum, ``S[0] / n``
    rows; GATHER: ``S[0] * n`` rows on the root, ``(1,)`` of zeros elsewhere; SCATTER:
    block ``rank`` of the root's input, ``S[0] / n`` rows; ALL_TO_ALL: ``S``, block ``j``
    of rank ``i``'s output is block ``i`` of rank ``j``'s input.
    """

    Param = CollectiveCommParam
    value_inferable = False
    has_side_effect = True  # every rank must run it, used or not by the others' readers
    dedup = False

    def __init__(
        self,
        inputs,
        param: CollectiveCommParam,
        config: OperatorNodeConfig,
        *,
        key: str,
        nr_devices: int,
        is_root: bool,
        rank: int,
        local_grad: bool = False,
        backend: str = "mpi",
        dtype=None,
        out_shape: tuple | None = None,
    ):
        super().__init__(inputs, param, config)
        self.key = str(key)
        self.nr_devices = int(nr_devices)
        self.is_root = bool(is_root)
        self.rank = int(rank)
        self.local_grad = bool(local_grad)
        self.backend = _check_backend(backend, "collective_comm")
        self.dtype = None if dtype is None else np.dtype(dtype)
        #: the output shape of a rank without input (a gradient's BROADCAST / SCATTER)
        self.out_shape = None if out_shape is None else tuple(int(s) for s in out_shape)
        mode = param.mode
        if len(self.inputs) > 1:
            raise GraphError(f"collective_comm key={key!r}: at most one input, got {len(inputs)}")
        if not self.inputs and (mode not in ("BROADCAST", "SCATTER") or self.is_root):
            raise GraphError(
                f"collective_comm key={key!r} mode {mode}: an input is required (only the "
                "non-root ranks of BROADCAST and SCATTER may have none)"
            )
        if not self.inputs and self.dtype is None:
            raise GraphError(f"collective_comm key={key!r} mode {mode}: dtype is required "
                             "on a rank without input")
        if self.nr_devices < 1 or not 0 <= self.rank < self.nr_devices:
            raise GraphError(
                f"collective_comm key={key!r}: rank {rank} out of range for "
                f"nr_devices={nr_devices}"
            )
        self.dynamic_output_shape = not self.inputs and self.out_shape is None
        #: the root's rank, known after the first run's header exchange
        self._root = None

    # ---- contract ---------------------------------------------------------------------------
    def hash_key(self):
        return (*super().hash_key(), self.key, self.nr_devices, self.is_root, self.rank)

    def default_name(self):
        head = f"{self.param.mode}:{self.key}"
        return head if not self.inputs else f"{head}({self.inputs[0].name})"

    def infer_comp_node(self):
        if self.config.comp_nodes:
            return self.config.comp_nodes[0]
        if not self.inputs:
            raise GraphError(
                f"collective_comm key={self.key!r}: comp_node is required without input"
            )
        return _dist.comm_comp_node(self.inputs[0].comp_node)

    def source_infer(self):
        t = InferType.MISSING if self.dynamic_output_shape else InferType.CONST
        return [(t, InferType.MISSING)]

    def infer_dtypes(self, in_dtypes):
        dt = self.dtype if self.dtype is not None else in_dtypes[0]
        if in_dtypes and self.dtype is not None and in_dtypes[0] != self.dtype:
            raise self.error(f"dtype={self.dtype} given, but the input is {in_dtypes[0]}")
        if dt not in MPI_DTYPES:
            raise self.error(
                f"dtype {dt} can not be sent over MPI; expected one of "
                f"{', '.join(d.name for d in MPI_DTYPES)}"
            )
        return [dt]

    def _shape_of(self, src: tuple | None) -> tuple:
        """The output shape on this rank from this rank's input shape (or the root's)."""
        mode, n = self.param.mode, self.nr_devices
        if src is None:
            return self.out_shape
        if mode in ("ALL_GATHER",) or (mode == "GATHER" and self.is_root):
            if not src:
                raise self.error("the input must have at least one axis")
            return (src[0] * n, *src[1:])
        if mode in ("REDUCE_SCATTER_SUM", "SCATTER", "ALL_TO_ALL"):
            if not src or src[0] % n:
                raise self.error(
                    f"mode {mode}: the first axis of {fmt_shape(src)} does not split into "
                    f"nr_devices={n} equal parts"
                )
            return src if mode == "ALL_TO_ALL" else (src[0] // n, *src[1:])
        if mode in ("REDUCE_SUM", "GATHER") and not self.is_root:
            return (1,)
        return tuple(src)

    def infer_shapes(self, in_shapes, in_values):
        return [self._shape_of(tuple(in_shapes[0]) if in_shapes else None)]

    # ---- running ----------------------------------------------------------------------------
    def _comm(self):
        return _dist.get_comm(self.key, self.nr_devices, self.rank)

    def _header(self, src: np.ndarray | None, out_dtype):
        """This rank's (is_root, dtype, ndim, dims) as int64s, and the array receiving
        every rank's."""
        mine = np.full(_HDR, -2, np.int64)
        mine[0], mine[1] = int(self.is_root), _DTYPE_CODE[np.dtype(out_dtype)]
        if src is not None:
            if src.ndim > _HDR - 3:
                raise self.error(f"at most {_HDR - 3} dimensions, got {src.ndim}")
            mine[2] = src.ndim
            mine[3 : 3 + src.ndim] = src.shape
        return mine, np.empty((self.nr_devices, _HDR), np.int64)

    def _check(self, infos: np.ndarray) -> tuple[int, tuple]:
        """Check every rank's header; return (root, the root's shape). Every rank sees the
        same headers, so a mismatch raises the same error on every rank."""
        rows = [
            (bool(h[0]), None if h[2] < 0 else tuple(int(d) for d in h[3 : 3 + h[2]]),
             MPI_DTYPES[h[1]].name)
            for h in infos
        ]
        mode = self.param.mode
        roots = [r for r, (isr, _, _) in enumerate(rows) if isr]
        desc = "; ".join(
            f"rank {r}: {'root ' if i[0] else ''}{'no input' if i[1] is None else fmt_shape(i[1])}"
            f" {i[2]}"
            for r, i in enumerate(rows)
        )
        if mode in _ROOTED and len(roots) != 1:
            raise self.error(f"mode {mode} needs exactly one root rank, got {len(roots)} ({desc})")
        root = roots[0] if mode in _ROOTED else 0
        if len({i[2] for i in rows}) != 1:
            raise self.error(f"ranks disagree on the dtype: {desc}")
        shapes = {i[1] for i in rows if i[1] is not None}
        if len(shapes) != 1:
            raise self.error(f"input shapes differ across the ranks of key {self.key!r}: {desc}")
        return root, rows[root][1]

    def _poster(self, comm, root: int, src, buf, blocking: bool):
        """A zero-argument callable doing one transfer between the bound arrays: MPI's
        blocking collective, or (``blocking=False``) posting the non-blocking one and
        returning its request. Everything but the call itself (the MPI op, in place or
        not, which buffers) is decided here, once per binding."""
        MPI = _dist.mpi()
        mode, me = self.param.mode, self.rank

        def call(name, *args):
            return partial(getattr(comm, name if blocking else "I" + name.lower()), *args)

        if mode.startswith("ALL_REDUCE_"):
            op = {"SUM": MPI.SUM, "MAX": MPI.MAX, "MIN": MPI.MIN, "PROD": MPI.PROD}[mode[11:]]
            if _same_memory(src, buf):  # the memory plan runs it in place: no copy at all
                return call("Allreduce", MPI.IN_PLACE, buf, op)
            if np.may_share_memory(src, buf):
                return _copy_then(src, buf, call("Allreduce", MPI.IN_PLACE, buf, op))
            return call("Allreduce", src, buf, op)
        if mode == "BROADCAST":
            post = call("Bcast", buf, root)
            if me == root and not _same_memory(src, buf):
                return _copy_then(src, buf, post)
            return post
        if mode == "REDUCE_SUM":
            return call("Reduce", src, buf if me == root else None, MPI.SUM, root)
        if mode == "ALL_GATHER":
            return call("Allgather", src, buf)
        if mode == "REDUCE_SCATTER_SUM":
            return call("Reduce_scatter_block", src, buf, MPI.SUM)
        if mode == "GATHER":
            return call("Gather", src, buf if me == root else None, root)
        if mode == "SCATTER":
            return call("Scatter", src if me == root else None, buf, root)
        if mode == "ALL_TO_ALL":
            return call("Alltoall", src, buf)
        raise self.error(f"mode {mode} is not implemented")  # pragma: no cover

    def _run(self, src, out):
        """One run on fresh arrays (the dynamic path); bound runs reuse their :class:`_Bound`."""
        return _Bound(self, src, out)()

    def bind(self, ins, outs):
        return _Bound(self, ins[0] if ins else None, outs[0])

    def inplace_input(self):
        # the all-reduces and BROADCAST write an output of the input's shape: MPI_IN_PLACE
        # on the input's memory when the plan allows (saves MPI's copy of the send buffer)
        mode = self.param.mode
        return 0 if self.inputs and (mode.startswith("ALL_REDUCE_") or mode == "BROADCAST") \
            else None

    def run_dynamic(self, ins):
        src = ins[0] if ins else None
        if src is None and self.out_shape is None:
            return [self._run(None, None)]
        out = np.empty(self._shape_of(None if src is None else src.shape), self.outputs[0].dtype)
        return [self._run(src, out)]

    # ---- gradient ---------------------------------------------------------------------------
    def _full_grad(self, og, x_shape=None):
        mode = _GRAD_MODE[self.param.mode]
        cn = self.outputs[0].comp_node
        inputs = [] if og is None else [as_var(og)]
        out_shape = None
        if og is None:
            out_shape = x_shape
        opr = CollectiveComm(
            inputs,
            CollectiveCommParam(mode=mode),
            OperatorNodeConfig(comp_node=cn),
            key=self.key + ":grad",
            nr_devices=self.nr_devices,
            is_root=self.is_root,
            rank=self.rank,
            local_grad=False,
            backend=self.backend,
            dtype=self.outputs[0].dtype,
            out_shape=out_shape,
        )
        return SymbolVar(self.graph.insert_opr(opr)[0])

    def _local_grad(self, g: SymbolVar, n: int, r: int):
        """The reference's gradients without communication (``local_grad=True``)."""
        mode = self.param.mode
        rows = static_infer.infer_shape(g.node)[0]
        if mode == "ALL_GATHER":  # this rank's block of the output's gradient
            k = rows // n
            return g[k * r : k * (r + 1)].node
        zero = g.fill_retain_dtype(0)
        if mode == "REDUCE_SCATTER_SUM":  # the gradient in this rank's block, zeros elsewhere
            return tensor_manip.concat([g if i == r else zero for i in range(n)], axis=0).node
        k = rows // n  # ALL_TO_ALL: this rank's block kept
        rows_r = slice(k * r, k * (r + 1))
        return indexing.set_subtensor(zero, g[rows_r])[rows_r].node

    def grad(self, wrt_idx, out_grads):
        mode, x, y = self.param.mode, SymbolVar(self.inputs[0]), SymbolVar(self.outputs[0])
        og = out_grads[0]
        n, r = self.nr_devices, self.rank
        if og is None:
            og = y.fill_retain_dtype(0).node
        g = SymbolVar(og)
        if self.local_grad:
            if mode.startswith("ALL_REDUCE_"):
                full = g
            elif mode in ("ALL_GATHER", "REDUCE_SCATTER_SUM", "ALL_TO_ALL"):
                return self._local_grad(g, n, r)
            else:
                raise self.error(
                    "local_grad is only supported by the all-reduce, ALL_GATHER, "
                    "REDUCE_SCATTER_SUM and ALL_TO_ALL modes"
                )
        elif mode in ("REDUCE_SUM", "GATHER"):
            # the root sends the gradient; the other ranks receive their part of x's shape
            full = self._full_grad(g if self.is_root else None,
                                   x_shape=static_infer.infer_shape(self.inputs[0]))
        elif mode in ("BROADCAST", "SCATTER"):
            full = self._full_grad(g)
            if not self.is_root:  # (1,) of zeros: keeps the collective in this rank's graph
                return tensor_manip.broadcast(full, x.shape).node
        else:
            full = self._full_grad(g)
        if mode == "ALL_REDUCE_MAX":
            return basic_arith.elemwise(y, x, full, mode="COND_LEQ_MOV").node
        if mode == "ALL_REDUCE_MIN":
            return basic_arith.elemwise(x, y, full, mode="COND_LEQ_MOV").node
        if mode == "ALL_REDUCE_PROD":
            return (full * y / x).node
        return full.node


@opr_params(("param", "CollectiveComm"))
def collective_comm(
    input,
    key: str,
    nr_devices: int,
    is_root: bool,
    rank: int,
    local_grad: bool = False,
    server_addr: str | None = None,
    port: int | None = None,
    mode: str = "REDUCE_SUM",
    dtype=None,
    backend: str | None = None,
    output_buffer=None,
    disable=None,
    *,
    name: str | None = None,
    comp_node=None,
    config=None,
    comp_graph=None,
) -> SymbolVar:
    """Collective communication between the MPI processes sharing ``key``.

    Parameters
    ----------
    input : SymbolVar or CompGraph
        The input var; a CompGraph on the non-root ranks of BROADCAST and SCATTER, which
        have none (``dtype`` and ``comp_node`` are then required).
    key : str
        Names the collective; one MPI communicator per key, split from ``COMM_WORLD``.
    nr_devices : int
        The number of ranks: the job's size (``mpiexec -n``).
    is_root : bool
        Whether this rank is the root of BROADCAST, REDUCE_SUM, GATHER and SCATTER.
    rank : int
        This process's rank in the key's communicator, 0..nr_devices-1.
    local_grad : bool
        The all-reduce, ALL_GATHER, REDUCE_SCATTER_SUM and ALL_TO_ALL gradients computed
        without communicating, as the reference.
    server_addr, port :
        Accepted and unused: mpiexec connects the ranks.
    mode : str
        A :class:`~megbrain.opr_param_defs.CollectiveComm` mode (or ``param=``).
    dtype : numpy dtype, optional
        The dtype; must match the input's.
    backend : str
        ``"mpi"`` (default); ``"nccl"`` raises: it needs CUDA.
    output_buffer, disable :
        Accepted for the reference's signature; must be None.
    name, comp_node, config, comp_graph :
        As every operator; the comp node defaults to the input's device on the
        communication stream (``megbrain.distributed.COMM_STREAM``).

    Returns
    -------
    SymbolVar
        The output (see :class:`CollectiveComm` for shapes).

    Raises
    ------
    MegBrainError
        Bad arguments at insertion; at run time, ranks whose shapes or dtypes disagree
        (on every rank).
    """
    _check_backend(backend, "collective_comm")
    if output_buffer is not None:
        raise MegBrainError("collective_comm: output_buffer is not supported")
    if disable is not None:
        val = disable.get() if hasattr(disable, "get") else disable
        if np.asarray(val).item() != 0:
            raise MegBrainError("collective_comm: disable must be 0 (skipping is not supported)")
    cfg = _merge_config(name, comp_node, config)
    param = CollectiveCommParam(mode=mode)
    kw = dict(key=key, nr_devices=nr_devices, is_root=is_root, rank=rank,
              local_grad=local_grad, backend=backend, dtype=dtype)
    if as_var(input) is None:
        graph = check_graph(input if input is not None else comp_graph)
        return SymbolVar(graph.insert_opr(CollectiveComm([], param, cfg, **kw))[0])
    (v,) = canonize_input_vars([input], comp_graph=comp_graph, config=cfg)
    return insert_opr(CollectiveComm([v], param, cfg, **kw))[0]


# ---- RemoteSend / RemoteRecv --------------------------------------------------------------
# A send-recv pair is a two-rank communicator of the key: the sender is rank 0, the
# receiver rank 1 (MegBrain's own convention).
@dataclass(frozen=True)
class _NoParam(ParamBase):
    pass


@register_opr
class RemoteSend(OperatorNodeBase):
    """Sends its input to the RemoteRecv of the same key on the other rank; the output is
    an empty var (``(1,)`` of zeros with ``is_grad``) expressing the dependency."""

    value_inferable = False
    has_side_effect = True
    dedup = False

    def __init__(self, inputs, param, config, *, key: str, is_grad: bool = False):
        super().__init__(inputs, param, config)
        self.key, self.is_grad = str(key), bool(is_grad)

    def infer_comp_node(self):
        if self.config.comp_nodes:
            return self.config.comp_nodes[0]
        return _dist.comm_comp_node(self.inputs[0].comp_node)

    def infer_dtypes(self, in_dtypes):
        if in_dtypes[0] not in MPI_DTYPES:
            raise self.error(f"dtype {in_dtypes[0]} can not be sent over MPI")
        return [in_dtypes[0]]

    def infer_shapes(self, in_shapes, in_values):
        return [(1,) if self.is_grad else (0,)]

    def bind(self, ins, outs):
        src, out = ins[0], outs[0]

        def run():
            comm = _dist.get_comm(self.key, 2, 0, "remote_send")
            data = _contig(src)
            with _dist.watch(f"remote_send key={self.key!r}"):
                comm.send((data.shape, data.dtype.str), dest=1, tag=1)
                comm.Send(data, dest=1, tag=2)
            out.fill(0)

        return run

    def grad(self, wrt_idx, out_grads):
        if not self.is_grad:
            return None
        shape = static_infer.infer_shape(self.inputs[0])
        opr = RemoteRecv([], None, OperatorNodeConfig(comp_node=self.outputs[0].comp_node),
                         key=self.key + ":grad", shape=shape, dtype=self.inputs[0].dtype)
        return self.graph.insert_opr(opr)[0]


@register_opr
class RemoteRecv(OperatorNodeBase):
    """Receives the value the RemoteSend of the same key sends; shape and dtype must be the
    sender's (checked on each transfer)."""

    value_inferable = False
    has_side_effect = True
    dedup = False

    def __init__(self, inputs, param, config, *, key: str, shape, dtype):
        super().__init__(inputs, param, config)
        self.key = str(key)
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)

    def infer_dtypes(self, in_dtypes):
        if self.dtype not in MPI_DTYPES:
            raise self.error(f"dtype {self.dtype} can not be received over MPI")
        return [self.dtype]

    def infer_shapes(self, in_shapes, in_values):
        return [self.shape]

    def bind(self, ins, outs):
        out = outs[0]

        def run():
            comm = _dist.get_comm(self.key, 2, 1, "remote_recv")
            with _dist.watch(f"remote_recv key={self.key!r}"):
                shape, dt = comm.recv(source=0, tag=1)
                if tuple(shape) != self.shape or np.dtype(dt) != self.dtype:
                    comm.Recv(np.empty(shape, dt), source=0, tag=2)
                    raise self.error(
                        f"the sender sent {fmt_shape(shape)} {np.dtype(dt)}, this receiver "
                        f"expects {fmt_shape(self.shape)} {self.dtype}"
                    )
                o = _Out(out)
                comm.Recv(o.buf, source=0, tag=2)
                o.done()

        return run

    def grad(self, wrt_idx, out_grads):
        return None


def remote_send(
    address: str | None,
    port: int | None,
    key: str,
    var,
    is_grad: bool = False,
    *,
    name: str | None = None,
    comp_node=None,
    config=None,
) -> SymbolVar:
    """Send ``var``'s value to the :func:`remote_recv` of ``key`` on the other rank.

    The pair forms a two-rank communicator of ``key`` (this rank is its rank 0); every
    process of the job takes part in creating it (so the job has two processes).
    ``address`` and ``port`` are accepted and unused. The output is an empty var that
    only expresses the dependency (``(1,)`` with ``is_grad``, whose gradient receives
    ``var``'s gradient from the peer).
    """
    cfg = _merge_config(name, comp_node, config)
    (v,) = canonize_input_vars([var], config=cfg)
    return insert_opr(RemoteSend([v], None, cfg, key=key, is_grad=is_grad))[0]


def remote_recv(
    address: str | None,
    port: int | None,
    key: str,
    comp_graph,
    shape,
    dtype,
    *,
    name: str | None = None,
    comp_node=None,
    config=None,
) -> SymbolVar:
    """Receive the value the :func:`remote_send` of ``key`` sends (rank 1 of the key's
    two-rank communicator); ``shape`` and ``dtype`` must be the sender's var's.
    ``address`` and ``port`` are accepted and unused."""
    graph = check_graph(comp_graph)
    cfg = _merge_config(name, comp_node, config)
    if not cfg.comp_nodes:
        cfg.comp_node(_dist.comm_comp_node("cpu0"))
    return SymbolVar(graph.insert_opr(RemoteRecv([], None, cfg, key=key, shape=shape,
                                                 dtype=dtype))[0])


# ---- serialization (megbrain/serialization/sereg.py) -------------------------------------
def _cc_dump(ctx, opr) -> None:
    ctx.write_param(pdefs.CollectiveComm(mode=opr.param.mode))
    extra = dict(key=opr.key, nr_devices=opr.nr_devices, is_root=opr.is_root, rank=opr.rank,
                 local_grad=opr.local_grad, backend=opr.backend,
                 dtype=None if opr.dtype is None else opr.dtype.str,
                 out_shape=opr.out_shape)
    ctx.dump_buf(json.dumps(extra).encode())


def _cc_load(ctx, inputs, config):
    p = ctx.read_param(pdefs.CollectiveComm)
    extra = json.loads(ctx.load_buf().decode())
    param = CollectiveCommParam(mode=p.mode)
    return ctx.graph.insert_opr(CollectiveComm(list(inputs), param, config, **extra))


sereg.register_serializer(CollectiveComm, dump=_cc_dump, load=_cc_load)
