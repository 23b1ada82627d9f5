"""``mgb.cgtools``: dependency walks, types, operator sequences, replacement."""

from __future__ import annotations

import numpy as np
import pytest

import megbrain as mgb
from megbrain import cgtools

CN = "cpu0"


@pytest.fixture
def net():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(2, 3))
    w = mgb.make_shared(CN, value=np.ones((2, 3)), comp_graph=g, name="w")
    h = x * w
    y = h.reshape(6) + 1
    return g, x, w, h, y


def _names(vs):
    return sorted(v.name for v in vs)


def test_get_dep_vars_all(net):
    g, x, w, h, y = net
    deps = cgtools.get_dep_vars(y)
    assert all(isinstance(v, mgb.SymbolVar) for v in deps)
    assert {x, w, h, y} <= set(deps)
    assert len(deps) == len(set(deps))


def test_get_dep_vars_by_type(net):
    g, x, w, h, y = net
    assert cgtools.get_dep_vars(y, "Host2DeviceCopy") == [x]
    both = cgtools.get_dep_vars(y, ["Host2DeviceCopy", "SharedDeviceTensor"])
    assert set(both) == {x, w} and len(both) == 2
    assert cgtools.get_dep_vars(y, ("Reshape",))[0].name.startswith("reshape")
    assert cgtools.get_dep_vars(y, "ConvolutionForward") == []


def test_get_dep_vars_list_of_outputs(net):
    g, x, w, h, y = net
    z = mgb.make_arg(CN, g, name="z", shape=(1,))
    found = cgtools.get_dep_vars([y, z + 1], "Host2DeviceCopy")
    assert set(found) == {x, z}


def test_get_inputs_and_types(net):
    g, x, w, h, y = net
    assert cgtools.get_inputs(h) == [x, w]
    assert cgtools.get_type(h) == "Elemwise"
    assert cgtools.get_type(x) == "Host2DeviceCopy"
    assert cgtools.get_type(w) == "SharedDeviceTensor"
    assert cgtools.get_inputs(x) == []
    opr = h.owner_opr
    assert cgtools.get_opr_type(opr) == "Elemwise"
    assert opr.inputs == (x, w) and opr.outputs == (h,)
    assert repr(opr) == f"Operator(id={opr.id},name={opr.name})"


def test_get_oprs_seq_topological(net):
    g, x, w, h, y = net
    seq = cgtools.get_oprs_seq(y)
    types = [cgtools.get_opr_type(o) for o in seq]
    assert "ImmutableTensor" not in types
    pos = {o.id: i for i, o in enumerate(seq)}
    for o in seq:  # every input's producer comes first
        for v in o.inputs:
            p = v.owner_opr
            if cgtools.get_opr_type(p) != "ImmutableTensor":
                assert pos[p.id] < pos[o.id]
    assert seq[-1].id == y.owner_opr.id
    assert {x.owner_opr.id, w.owner_opr.id, h.owner_opr.id} <= set(pos)


def test_get_oprs_seq_prune_reshape():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(2, 3))
    y = (x * 2).reshape(x.shape[0] * 3)  # the target shape is computed from x
    full = [cgtools.get_opr_type(o) for o in cgtools.get_oprs_seq(y)]
    pruned = [cgtools.get_opr_type(o) for o in cgtools.get_oprs_seq(y, prune_reshape=True)]
    assert "GetVarShape" in full
    assert "GetVarShape" not in pruned
    assert pruned.count("Reshape") == 1 and "Host2DeviceCopy" in pruned
    # an operator also used outside the shape computation is kept
    s = x.shape
    z = (x * 2).reshape(s[0] * 3) + s[1].astype(np.float32)
    kept = [cgtools.get_opr_type(o) for o in cgtools.get_oprs_seq(z, prune_reshape=True)]
    assert "GetVarShape" in kept


def test_graph_traversal(net):
    g, x, w, h, y = net
    map_oprs, map_vars, var2oprs, opr2receivers, indegree2opr, opr2indegree = (
        cgtools.graph_traversal([y])
    )
    hid, yid = h.owner_opr.id, y.owner_opr.id
    assert {x.owner_opr.id, w.owner_opr.id, hid, yid} <= set(map_oprs)
    assert all(cgtools.get_opr_type(o) for o in map_oprs.values())
    assert map_vars[x.id] == x and map_vars[h.id] == h
    assert var2oprs[x.id] == [(hid, 0)] and var2oprs[w.id] == [(hid, 1)]
    assert opr2receivers[x.owner_opr.id] == [hid]
    assert opr2indegree[x.owner_opr.id] == 0 and opr2indegree[hid] == 2
    assert x.owner_opr.id in indegree2opr[0] and hid in indegree2opr[2]
    for oid, deg in opr2indegree.items():
        assert oid in indegree2opr[deg]


def test_graph_traversal_repeated_input():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(2,))
    sq = x * x
    _, _, var2oprs, opr2receivers, _, opr2indegree = cgtools.graph_traversal([sq])
    sid = sq.owner_opr.id
    assert var2oprs[x.id] == [(sid, 0), (sid, 1)]
    assert opr2receivers[x.owner_opr.id] == [sid, sid]
    assert opr2indegree[sid] == 2


def test_replace_vars():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    z = mgb.make_arg(CN, g, name="z", shape=(3,))
    y = (x + 1) * 2
    (y2,) = cgtools.replace_vars([y], {x: z})
    assert y2 != y
    f = g.compile(None, [mgb.copy_output(y), mgb.copy_output(y2)])
    r, r2 = f(x=np.zeros(3), z=np.ones(3))
    np.testing.assert_array_equal(r, [2, 2, 2])
    np.testing.assert_array_equal(r2, [4, 4, 4])
    (same,) = cgtools.replace_vars(y, [(x, x)])
    assert same == y


def test_replace_oprs():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    h = x * 3
    y = h + 1
    h2 = x - 3
    (y2,) = cgtools.replace_oprs([y], {h.owner_opr: h2.owner_opr})
    f = g.compile(None, mgb.copy_output(y2))
    np.testing.assert_array_equal(f(x=np.full(3, 5)), [3, 3, 3])


def test_set_priority_to_id():
    g = mgb.comp_graph()
    x = mgb.make_arg(CN, g, name="x", shape=(3,))
    with mgb.config.opr_priority_scope(g, -5):
        a = x + 1
    b = x * 2
    y = a + b
    cgtools.set_priority_to_id([y])
    assert b.owner_opr.opr.priority == b.owner_opr.id
    assert y.owner_opr.opr.priority == y.owner_opr.id
    assert a.owner_opr.opr.priority == -5  # non-zero priorities are kept
