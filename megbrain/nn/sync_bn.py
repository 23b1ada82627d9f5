"""SyncBatchNorm: batch normalization whose batch statistics cover every rank's batch."""

from __future__ import annotations

import itertools

import numpy as np

import megbrain as mgb

from ..device import mpi_comm as _comm
from .layers import _BatchNorm, _known_shape, _param_var
from .module import _add_state_update

__all__ = ["SyncBatchNorm"]

_counter = itertools.count()


class SyncBatchNorm(_BatchNorm):
    """Batch normalization over (N, C), (N, C, L) or (N, C, H, W) input whose training-mode
    statistics are those of the batches of all the ranks together (MegEngine 0.6's
    SyncBatchNorm): each rank's per-channel sums of ``x`` and ``x**2`` and its element
    count are all-reduced (one ``collective_comm`` ALL_REDUCE_SUM), giving the global mean
    and (biased) variance that normalize; the gradient flows back through the all-reduce.
    The running statistics are updated as BatchNorm's (unbiased variance), the same on
    every rank. In eval mode it is BatchNorm. Outside an MPI job (one process) the
    statistics are the local batch's.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1,
                 affine: bool = True):
        super().__init__(num_features, eps=eps, momentum=momentum, affine=affine)
        object.__setattr__(self, "_key", f"sync_bn{next(_counter)}")

    def forward(self, x):
        if not self.training:
            return super().forward(x)
        shape = _known_shape(x, "SyncBatchNorm")
        ndim = len(shape)
        if ndim not in (2, 3, 4):
            raise mgb.MegBrainError(
                f"SyncBatchNorm: expected 2-d, 3-d or 4-d input, got shape {shape}"
            )
        c = self.num_features
        if shape[1] != c:
            raise mgb.MegBrainError(
                f"SyncBatchNorm: input has {shape[1]} channels, expected {c} (shape {shape})"
            )
        g = x.owner_graph
        bshape = self._bshape(ndim)
        rows = x.dimshuffle(1, *[i for i in range(ndim) if i != 1]).reshape(c, -1)
        count = float(np.prod(shape) // c)
        s1 = rows.sum(axis=1)
        s2 = (rows * rows).sum(axis=1)
        cnt = mgb.make_immutable(x.comp_node, g, np.asarray([count], np.float32))
        stats = mgb.opr.concat([s1.reshape(c), s2.reshape(c), cnt], axis=0)
        if _comm.is_distributed():
            n, r = _comm.world_size(), _comm.world_rank()
            # on the computation's own comp node, not the communication node: nothing can
            # overlap it (the normalization needs it at once), and running it inline saves
            # two thread hand-offs per all-reduce (forward and backward)
            stats = mgb.opr.collective_comm(stats, key=self._key, nr_devices=n,
                                            is_root=r == 0, rank=r, mode="ALL_REDUCE_SUM",
                                            comp_node=x.comp_node)
        tot = stats[2 * c : 2 * c + 1]
        mean = stats[:c] / tot
        var = stats[c : 2 * c] / tot - mean * mean
        inv = 1.0 / mgb.opr.sqrt(var + self.eps)
        y = (x - mean.reshape(*bshape)) * inv.reshape(*bshape)
        if self.weight is not None:
            y = y * _param_var(self.weight, x).reshape(*bshape)
            y = y + _param_var(self.bias, x).reshape(*bshape)
        m = self.momentum
        unbiased = var * tot / mgb.opr.elemwise(tot - 1, 1e-12, mode="MAX")
        pshape = (1, c, 1, 1)
        for name, batch in (("running_mean", mean), ("running_var", unbiased)):
            upd = mgb.opr.add_update(self._stat_var(name, g), batch.reshape(*pshape),
                                     alpha=1 - m, beta=m)
            _add_state_update(g, upd)
        return y
