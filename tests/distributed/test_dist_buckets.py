"""Gradient buckets are scheduled as soon as their gradients exist (no MPI needed: the
function is compiled, not run)."""

from __future__ import annotations

import megbrain as mgb
from megbrain import nn, optim
from megbrain.distributed.parallel import BUCKET_PRIORITY, all_reduce_mean


def _compiled_seq(pack_max_size: int):
    nn.init.default_rng(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256),
                          nn.ReLU(), nn.Linear(256, 10))
    g = mgb.comp_graph()
    x = mgb.make_arg("cpu0", g, shape=(32, 1, 8, 8), name="x")
    y = mgb.make_arg("cpu0", g, shape=(32, 10), name="y")
    model.train()
    loss = nn.functional.cross_entropy(model(x), y)
    opt = optim.SGD(model.parameters(), lr=0.1)
    opt.grad_transform = lambda pvars, grads: all_reduce_mean(
        grads, key="order", pack_max_size=pack_max_size, nr_ranks=1, rank=0)
    g.compile([x, y], [mgb.copy_output(loss)] + opt.minimize(loss))
    return g.current_exec.seq


def test_each_bucket_all_reduced_as_soon_as_its_gradients_exist():
    """Buckets go last parameters first; each one's all-reduce comes in the comp seq (and so
    in the communication node's queue) right after its gradients, before the backward pass
    of the layers below: the last layer's bucket is posted first, overlapping the rest."""
    seq = _compiled_seq(64 << 10)  # 4 buckets: last layer + bias, W2, b1, W1
    pos = {o: i for i, o in enumerate(seq)}
    colls = [o for o in seq if o.type_name == "CollectiveComm"]
    assert len(colls) == 4
    assert {str(o.comp_node) for o in colls} == {"cpu0:1024"}  # the communication node
    ks = [o.priority - BUCKET_PRIORITY for o in colls]
    assert ks == sorted(ks) == [0, 1, 2, 3]
    # bucket 0 (the last layer) goes before every gradient of the layers below: the
    # matrix products of the backward pass are those reading no parameter
    grads_below = [o for o in seq if o.type_name == "MatrixMul" and pos[o] > pos[colls[0]]]
    assert len(grads_below) >= 3  # dx of layer 3, dW2, dx of layer 2, dW1


def test_one_bucket_runs_inline_and_keeps_the_virtual_gradients():
    """A single bucket (nothing to overlap) runs on the gradients' own comp node, without
    thread hand-offs, and leaves the gradients to the compile's expansion, which builds them
    from the optimized forward graph (ADD + RELU fused)."""
    seq = _compiled_seq(4 << 20)
    colls = [o for o in seq if o.type_name == "CollectiveComm"]
    assert len(colls) == 1
    assert str(colls[0].comp_node) == "cpu0:0"
    assert any(o.type_name == "Elemwise" and o.param.mode == "FUSE_ADD_RELU" for o in seq)
