"""CollectiveComm dumps as the reference's param.CollectiveComm plus its key and ranks; no
MPI is needed to dump or load (only to run)."""

from __future__ import annotations

import numpy as np
import pytest

import megbrain as mgb
from megbrain.errors import MegBrainError


@pytest.mark.parametrize("mode", ["ALL_REDUCE_SUM", "ALL_GATHER", "BROADCAST"])
def test_dump_load_round_trip(tmp_path, mode):
    g = mgb.comp_graph()
    x = mgb.make_shared("cpu0", value=np.ones((4, 3), "float32"), comp_graph=g, name="x")
    y = mgb.opr.collective_comm(x, key="grad_w", nr_devices=2, is_root=False, rank=1,
                                mode=mode, server_addr="10.0.0.1", port=2333)
    path = tmp_path / "g.mgb"
    mgb.serialize_comp_graph_to_file(str(path), [y])
    loaded = mgb.load_comp_graph_from_file(str(path))
    (out,) = loaded.output_vars_list if hasattr(loaded, "output_vars_list") else loaded[1]
    node = out.owner_opr.opr
    assert node.type_name == "CollectiveComm"
    assert (node.param.mode, node.key, node.nr_devices, node.rank, node.is_root) == (
        mode, "grad_w", 2, 1, False)
    assert out.imm_shape == y.imm_shape


def test_bad_arguments_fail_at_insertion():
    g = mgb.comp_graph()
    x = mgb.make_shared("cpu0", value=np.ones((3, 2), "float32"), comp_graph=g)
    with pytest.raises(MegBrainError, match="does not split into nr_devices=2"):
        mgb.opr.collective_comm(x, key="k", nr_devices=2, is_root=True, rank=0,
                                mode="REDUCE_SCATTER_SUM")
    with pytest.raises(MegBrainError, match="rank 2 out of range"):
        mgb.opr.collective_comm(x, key="k", nr_devices=2, is_root=True, rank=2,
                                mode="ALL_REDUCE_SUM")
    with pytest.raises(MegBrainError, match="nccl.*CUDA"):
        mgb.opr.collective_comm(x, key="k", nr_devices=2, is_root=True, rank=0,
                                mode="ALL_REDUCE_SUM", backend="nccl")
    with pytest.raises(MegBrainError, match="can not be sent over MPI"):
        mgb.opr.collective_comm(x.astype("float16"), key="k", nr_devices=2, is_root=True,
                                rank=0, mode="ALL_REDUCE_SUM")


def test_package_imports_without_mpi():
    import subprocess
    import sys

    code = ("import sys; sys.modules['mpi4py'] = None; import megbrain as mgb; "
            "assert mgb.config.create_mm_server('x', 7) == 7; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.strip() == "ok", out.stderr
