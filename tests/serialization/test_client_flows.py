"""What MegEngine 0.6's Python code does with graph files (jit.trace.dump, mge.dump,
test_jit's load_and_compile, cgtools on loaded graphs), with the operators registered here."""

import numpy as np
import pytest

import megbrain as mgb


def _trace_dump(fpath, sym_outputs, args, arg_names, append=False):
    """jit.trace.dump of MegEngine 0.6: inputs replaced by make_arg, volatile shared tensors
    by non-volatile ones, then serialize_comp_graph_to_file."""
    cg = sym_outputs[0].owner_graph
    replace = {}
    for s, name in zip(args, arg_names):
        shape = mgb.SharedND._from_symvar(s).shape  # the traced Tensor's shape
        replace[s] = mgb.make_arg(
            mgb.CompNode.load("cpux"), cg, dtype=s.dtype, shape=shape, name=name
        )
    for s in mgb.cgtools.get_dep_vars(sym_outputs, "VolatileSharedDeviceTensor"):
        if s in replace:
            continue
        replace[s] = mgb.SharedND._from_symvar(s).symvar(cg, name=s.name, volatile=False)
    outs = list(mgb.cgtools.replace_vars(sym_outputs, replace))
    mgb.serialize_comp_graph_to_file(fpath, outs, append=append)


def _load_and_compile(fpath):
    cg, _, outputs = mgb.load_comp_graph_from_file(fpath)
    inputs = mgb.cgtools.get_dep_vars(outputs, "Host2DeviceCopy")
    inputs = sorted(inputs, key=lambda i: i.name)
    outputs = list(map(mgb.copy_output, outputs))
    if len(outputs) == 1:
        (outputs,) = outputs
    return cg.compile(inputs, outputs)


def _traced(g, n_args, shape=(1,)):
    """Trace-time symbols: the args of a traced function are volatile shared tensors."""
    args = []
    for _ in range(n_args):
        snd = mgb.SharedND(mgb.CompNode.load("cpux"), np.float32)
        snd.set_value(np.zeros(shape, "float32"))
        args.append(snd.symvar(g, volatile=True))
    return args


@pytest.fixture
def fpath(tmp_path):
    return str(tmp_path / "model.mgb")


def test_dump(fpath):
    g = mgb.comp_graph()
    x, y = _traced(g, 2)
    _trace_dump(fpath, [x * y], [x, y], ["arg_0", "arg_1"])
    f = _load_and_compile(fpath)
    np.testing.assert_allclose(f([1, 2, 3], [1, 2, 3]), [1, 4, 9])


def test_capture_dump_and_volatile(fpath):
    g = mgb.comp_graph()
    (x,) = _traced(g, 1)
    psnd = mgb.SharedND(mgb.CompNode.load("cpux"), np.float32)
    psnd.set_value(np.float32([7]))
    p = psnd.symvar(g, volatile=True)
    _trace_dump(fpath, [x * p], [x], ["arg_0"])
    f = _load_and_compile(fpath)
    np.testing.assert_allclose(f([1, 2, 3]), [7, 14, 21])
    cg, _, outputs = mgb.load_comp_graph_from_file(fpath)
    (out,) = outputs
    assert mgb.cgtools.get_type(mgb.cgtools.get_inputs(out)[1]) == "SharedDeviceTensor"


def test_graph_traversal_of_loaded(fpath):
    g = mgb.comp_graph()
    (x,) = _traced(g, 1, (2, 3))
    _trace_dump(fpath, [mgb.opr.elemwise(x, mode="relu")], [x], ["data"])
    *_, outputs = mgb.load_comp_graph_from_file(fpath)
    _, map_vars, var2oprs, *_ = mgb.cgtools.graph_traversal(outputs)
    input_var = map_vars[1]
    assert input_var.name == "data"
    _, var_idx = var2oprs[input_var.id][0]
    assert var_idx == 0
    assert [mgb.cgtools.get_opr_type(o) for o in mgb.cgtools.get_oprs_seq(outputs)] == [
        "Host2DeviceCopy",
        "Elemwise",
    ]


def test_dump_of_eager_graph(fpath):
    """mge.dump outside a trace: the tensors live in an eager graph."""
    g = mgb.comp_graph(extra_opts={"eager_evaluation": True})
    snd = mgb.SharedND(mgb.CompNode.load("cpux"), np.float32)
    snd.set_value(np.arange(4, dtype="float32"))
    data = snd.symvar(g, volatile=True)
    pred = mgb.opr.elemwise(data * 2 + 1, mode="relu")
    mgb.serialize_comp_graph_to_file(fpath, [pred])
    cg, _, (out,) = mgb.load_comp_graph_from_file(fpath)
    f = cg.compile(None, mgb.copy_output(out))
    np.testing.assert_allclose(f(), [1, 3, 5, 7])


def test_network_visitor_of_loaded(fpath):
    """test_jit.test_network_visitor: the shape computation of a reshape survives the file
    and is what prune_reshape drops."""
    g = mgb.comp_graph()
    (x,) = _traced(g, 1, (2, 3, 4, 5))
    _trace_dump(fpath, [x.reshape([x.shape[0], -1])], [x], ["x"])
    *_, outputs = mgb.load_comp_graph_from_file(fpath)
    all_oprs = mgb.cgtools.get_oprs_seq(outputs)
    pruned_oprs = mgb.cgtools.get_oprs_seq(outputs, prune_reshape=True)
    assert len(all_oprs) == len(pruned_oprs) + 3
    f = _load_and_compile(fpath)
    v = np.arange(120, dtype="float32").reshape(2, 3, 4, 5)
    np.testing.assert_array_equal(f(v), v.reshape(2, -1))
