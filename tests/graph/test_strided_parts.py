"""Strided parts in the static memory plan (ChannelShuffleConcat's): a ConvBias writes its
output as every other channel of the shuffled concatenation, and the sentinel run finds no
live var overwritten and no free memory read."""

from __future__ import annotations

import numpy as np
from test_mem_plan_graph import checked_run

import megbrain as mgb
from megbrain.opr.dnn_conv_bias import conv_bias_activation

CN = "cpu0"
F32 = np.float32


def test_a_conv_written_into_every_other_channel_keeps_every_live_var():
    n, c, h, w = 1, 10, 6, 7
    rng = np.random.default_rng(0)
    g = mgb.comp_graph(check_env_var=False)
    x = mgb.make_arg(CN, g, name="x", shape=(n, 2 * c, h, w))
    wv = rng.uniform(-1, 1, (c, c, 1, 1)).astype(F32)
    bv = rng.uniform(-1, 1, (1, c, 1, 1)).astype(F32)
    conv = conv_bias_activation(x[:, c:], mgb.make_shared(CN, value=wv, comp_graph=g),
                                mgb.make_shared(CN, value=bv, comp_graph=g),
                                nonlineMode="RELU")  # fmt: skip
    cat = mgb.opr.concat(x[:, :c], conv, axis=1)
    y = cat.reshape(n, 2, c, h, w).dimshuffle(0, 2, 1, 3, 4).reshape(n, 2 * c, h, w)
    outs = [y[:, c:] * 2.0, y[:, :c] + 1.0]
    f = g.compile(None, [mgb.copy_output(v) for v in outs])
    xv = rng.uniform(-1, 1, (n, 2 * c, h, w)).astype(F32)
    f._setup_args((), {"x": xv})
    values = checked_run(f)
    plan = f._func._plan
    fused = [o for o in f._func.seq if o.type_name == "ChannelShuffleConcat"]
    assert len(fused) == 1 and plan.decisions[fused[0].inputs[1]][0] == "part"
    conv_ref = np.einsum("oc,nchw->nohw", wv[:, :, 0, 0].astype(np.float64),
                         xv[:, c:].astype(np.float64)) + bv  # fmt: skip
    cat_ref = np.concatenate([xv[:, :c], np.maximum(conv_ref, 0)], axis=1)
    ref = cat_ref.reshape(n, 2, c, h, w).transpose(0, 2, 1, 3, 4).reshape(n, 2 * c, h, w)
    got = [values[v] for v, _ in f._func.outspec]
    np.testing.assert_allclose(got[0], ref[:, c:] * 2.0, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[1], ref[:, :c] + 1.0, rtol=1e-4, atol=1e-5)
