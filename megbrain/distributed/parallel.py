"""Data-parallel training: gradients averaged across ranks (all-reduced in buckets as soon as
they are computed), parameters broadcast from rank 0, and SyncBatchNorm."""

from __future__ import annotations

import itertools
import os

import numpy as np

import megbrain as mgb

from ..device import mpi_comm as _comm

__all__ = [
    "DEFAULT_PACK_MAX_SIZE",
    "all_reduce_mean",
    "bcast_params",
    "data_parallel",
    "limit_threads_per_rank",
]

#: environment variables that set the BLAS / OpenMP thread count (the user's choice wins)
THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")

#: bytes of gradients packed into one all-reduce (the reference's allreduce_pack_max_size
#: idea: few large transfers instead of one per parameter)
DEFAULT_PACK_MAX_SIZE = 4 << 20

#: the operator priority of the buckets' packing and all-reduce (lower runs first)
BUCKET_PRIORITY = -(1 << 20)

_counter = itertools.count()


def _local_ranks() -> int:
    """The number of ranks of the job on this machine (the launcher's environment, else an
    MPI split by shared memory, which every rank must call)."""
    for var in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        if os.environ.get(var, "").isdigit():
            return max(1, int(os.environ[var]))
    MPI = _comm.mpi()
    local = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return local.Get_size()
    finally:
        local.Free()


def limit_threads_per_rank() -> int | None:
    """Cap this rank's BLAS threads (and so megbrain's kernel threads, which follow them) at
    its share of the machine's cores: ``cpu_count // ranks on this machine``, at least 1.

    Ranks sharing a machine each start a BLAS pool as large as the machine; their threads
    then contend for the cores (OpenBLAS's threads poll while idle), which can cost more
    than the second rank brings. The pools loaded now are capped through threadpoolctl;
    those loaded later (SciPy's own OpenBLAS and scikit-learn's OpenMP come with their first
    import) read the thread count from the environment when they load, so it is set there
    too (``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS``): else a BLAS
    pool loaded after the cap kept the whole machine and, since the kernels' split follows
    the largest BLAS pool, so did megbrain's kernels. Nothing is changed when the user set
    a thread count or threadpoolctl is not installed. Every rank must call it (it may split
    ``COMM_WORLD``).

    Returns
    -------
    int or None
        The threads per rank set, or None when nothing was changed.
    """
    if any(v in os.environ for v in THREAD_ENV):
        return None
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - depends on the environment
        return None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    n = max(1, (cpus or 1) // _local_ranks())
    for var in THREAD_ENV:  # for the pools loaded from now on
        os.environ[var] = str(n)
    threadpool_limits(limits=n)
    from ..kernels import parallel

    parallel.num_threads.cache_clear()  # the kernels' split follows the BLAS pool
    return n


def bcast_params(params, root: int = 0) -> None:
    """Overwrite every parameter (SharedND) with rank ``root``'s value (MPI ``Bcast``).

    Every rank must call it with the same parameters, in the same order.
    """
    world = _comm.mpi().COMM_WORLD
    for p in params:
        val = np.ascontiguousarray(p.get_value())
        with _comm.watch(f"bcast_params ({tuple(val.shape)})") as w:
            w.wait_peers(world.Ibcast(val, root))
        p.set_value(val)


def _buckets(grads, pack_max_size: int):
    """Indices of ``grads`` in buckets, last parameters first (the backward pass computes
    their gradients first), one dtype and comp node per bucket, at most ``pack_max_size``
    bytes each (a larger gradient is a bucket of its own)."""
    from ..graph import static_infer

    out, cur, cur_bytes, cur_kind = [], [], 0, None
    for i in reversed(range(len(grads))):
        g = grads[i]
        if g is None:
            continue
        nbytes = int(np.prod(static_infer.infer_shape(g.node))) * g.dtype.itemsize
        kind = (g.dtype, g.comp_node)
        if cur and (kind != cur_kind or cur_bytes + nbytes > pack_max_size):
            out.append(cur)
            cur, cur_bytes = [], 0
        cur.append(i)
        cur_bytes += nbytes
        cur_kind = kind
    if cur:
        out.append(cur)
    return out


def _real_grads(grads) -> list:
    """``grads`` with every VirtualGrad (a gradient expanded when the function is compiled)
    replaced by the real gradient now, so that :func:`_prioritize` sees its operators.

    The price: the backward pass is then built from the forward graph before the compile
    optimizes it (a forward elemwise whose output the backward reads is not fused), which is
    why a single bucket, which nothing can overlap, keeps its VirtualGrads."""
    from ..opr.grad import grad

    by_target: dict = {}
    for i, g in enumerate(grads):
        if g is not None and g.node.owner.type_name == "VirtualGrad":
            by_target.setdefault(g.node.owner.inputs[0], []).append(i)
    out = list(grads)
    for target, idx in by_target.items():
        wrts = [grads[i].node.owner.inputs[1] for i in idx]
        for i, real in zip(idx, grad(target, wrts, warn_mid_wrt=False)):
            out[i] = mgb.SymbolVar(real)
    return out


def _prioritize(grads, buckets) -> None:
    """Order the computation so that the buckets' gradients come out bucket by bucket.

    The comp seq takes ready operators by priority, then by creation order, and the
    communication node runs its all-reduces in that order: left alone, a bucket's gradient
    created late (a bias's reduction) holds its bucket, and the buckets after it, until the
    whole backward pass is done. Every operator of bucket ``k``'s gradients (the forward
    pass included, for bucket 0) that has the default priority 0 gets
    ``BUCKET_PRIORITY + k``, so each bucket's gradients are computed, and its all-reduce
    starts, before the rest of the backward pass, which it then overlaps."""
    from ..graph.comp_seq import topo_order

    seen: set = set()
    for k, bucket in enumerate(buckets):
        for opr in topo_order([grads[i].node for i in bucket]):
            if opr not in seen:
                seen.add(opr)
                if opr.priority == 0:
                    opr.priority = BUCKET_PRIORITY + k


def all_reduce_mean(grads, *, key: str, pack_max_size: int = DEFAULT_PACK_MAX_SIZE,
                    nr_ranks: int | None = None, rank: int | None = None) -> list:
    """``grads`` averaged over the ranks: packed into buckets (ParamPackConcat), all-reduced
    (``collective_comm`` ALL_REDUCE_SUM on the communication comp node, which starts a
    bucket as soon as its gradients are computed, overlapping the rest of the backward pass;
    a single bucket runs on the gradients' own node, as nothing can overlap it), scaled by
    ``1/nr_ranks`` and split back (ParamPackSplit). None entries stay None.

    Parameters
    ----------
    grads : list of SymbolVar or None
        The gradients of one graph.
    key : str
        The collectives' key (every rank passes the same).
    pack_max_size : int
        Bytes per bucket.
    nr_ranks, rank : int, optional
        Default: the MPI job's size and this process's rank.

    Returns
    -------
    list of SymbolVar or None
        The averaged gradients, in the order of ``grads``.
    """
    from ..graph import static_infer

    n = _comm.world_size() if nr_ranks is None else int(nr_ranks)
    r = _comm.world_rank() if rank is None else int(rank)
    buckets = _buckets(grads, pack_max_size)
    if len(buckets) > 1:  # some all-reduce can overlap the backward pass: schedule for it
        grads = _real_grads(grads)
        _prioritize(grads, buckets)
    out = list(grads)
    for k, bucket in enumerate(buckets):
        parts = [grads[i] for i in bucket]
        cn = parts[0].comp_node
        # one bucket can overlap nothing (it waits for the whole backward pass, the update
        # waits for it): run inline on the computation's node, without two thread hand-offs
        ccn = cn if len(buckets) == 1 else _comm.comm_comp_node(cn)
        # first among the ready operators once its gradients exist (see _prioritize)
        with mgb.config.opr_priority_scope(parts[0].owner_graph, BUCKET_PRIORITY + k):
            packed = mgb.opr.param_pack_concat(parts, comp_node=ccn)
            total = mgb.opr.collective_comm(packed, key=key, nr_devices=n, is_root=r == 0,
                                            rank=r, mode="ALL_REDUCE_SUM", comp_node=ccn)
        scale = mgb.make_immutable(cn, total.owner_graph, np.asarray([1.0 / n], parts[0].dtype))
        avg = mgb.opr.elemwise(total, scale, mode="MUL", comp_node=cn)
        shapes = [tuple(static_infer.infer_shape(p.node)) for p in parts]
        for i, v in zip(bucket, mgb.opr.param_pack_split(avg, shapes)):
            out[i] = v
    return out


def data_parallel(optimizer, *, pack_max_size: int = DEFAULT_PACK_MAX_SIZE,
                  bcast: bool = True, limit_threads: bool = True):
    """Make ``optimizer`` (a :class:`megbrain.optim.Optimizer`) train data-parallel over
    the processes of the MPI job.

    Its parameters are broadcast from rank 0 now (``bcast``), and the steps its
    ``minimize`` builds update with the gradients averaged across ranks
    (:func:`all_reduce_mean`), so that every rank keeps the same parameters. Each rank
    feeds its own part of the batch; the loss should be the mean over the local batch
    (then the step equals one process's on the concatenated batch). With ``limit_threads``
    each rank's BLAS threads are capped at its share of the machine's cores
    (:func:`limit_threads_per_rank`; unless a thread count is set in the environment).

    Returns
    -------
    Optimizer
        ``optimizer`` itself.
    """
    n, r = _comm.world_size(), _comm.world_rank()
    key = f"data_parallel{next(_counter)}"
    if limit_threads:
        limit_threads_per_rank()
    if bcast:
        bcast_params(optimizer.params)

    def transform(pvars, grads):
        return all_reduce_mean(grads, key=key, pack_max_size=pack_max_size, nr_ranks=n, rank=r)

    optimizer.grad_transform = transform
    return optimizer
