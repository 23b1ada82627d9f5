"""Losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss, composed.

The target's class is picked by a select against a one-hot comparison with the class
index (never a multiply, so a -inf log-probability of another class does not turn into NaN).
"""

from __future__ import annotations

import numpy as np

import megbrain as mgb

from .ops_tensor import _reshape, static_shape
from .registry import Attr, converter

E = mgb.opr.elemwise

_REDUCTIONS = frozenset({"none", "sum", "mean"})


def _sum_all(v):
    shp = tuple(int(d) for d in v.imm_shape)
    return mgb.opr.reduce_(_reshape(v, (1, int(np.prod(shp)))), "SUM", 1, True)


def _nll(ctx, logp, target, weight):
    """-logp[n, target[n, ...], ...] with ONNX's weights, ignore_index and reduction."""
    xs = static_shape(ctx, logp)
    ts = static_shape(ctx, target, "target")
    if len(xs) < 2 or ts != xs[:1] + xs[2:]:
        raise ctx.fail(f"input of shape {xs} and target of shape {ts} do not match")
    c = xs[1]
    dt = np.dtype(logp.dtype)
    tgt = _reshape(target, ts[:1] + (1,) + ts[1:])
    cls = np.arange(c, dtype=np.int32).reshape((1, c) + (1,) * (len(xs) - 2))
    hot = mgb.opr.typecvt(E(tgt, ctx.imm(cls), mode="EQ"), dt)
    picked = mgb.opr.reduce_(E(hot, logp, mode="SWITCH_GT0"), "SUM", 1, True)
    loss = _reshape(E(ctx.imm(np.asarray(0, dt)), picked, mode="SUB"), ts)
    ignore = ctx.attr("ignore_index")
    valid = None
    if ignore is not None:
        # an ignored target's loss is 0 (a select: its picked value may be anything)
        miss = E(target, ctx.imm(np.int32(ignore)), mode="EQ")
        valid = mgb.opr.typecvt(E(ctx.imm(np.int32(1)), miss, mode="SUB"), dt)
        loss = E(valid, loss, mode="SWITCH_GT0")
    gw = valid
    if weight is not None:
        wc = _reshape(_cast(weight, dt), (1, c) + (1,) * (len(xs) - 2))
        gw = _reshape(mgb.opr.reduce_(E(hot, wc, mode="SWITCH_GT0"), "SUM", 1, True), ts)
        if valid is not None:
            gw = E(valid, gw, mode="SWITCH_GT0")
        loss = E(loss, gw, mode="MUL")
    red = ctx.attr("reduction")
    if red == "none":
        return loss
    total = _sum_all(loss)
    if red == "sum":
        return ctx.as_shape(total, ())
    den = _sum_all(gw) if gw is not None else ctx.imm(np.asarray(float(np.prod(ts)), dt))
    return ctx.as_shape(E(total, den, mode="TRUE_DIV"), ())


def _cast(v, dt):
    return v if np.dtype(v.dtype) == dt else mgb.opr.typecvt(v, dt)


_LOSS_ATTRS = {"ignore_index": None, "reduction": Attr("mean", _REDUCTIONS)}


@converter("NegativeLogLikelihoodLoss", 12, attrs=_LOSS_ATTRS)
def _nll_loss(ctx):
    return _nll(ctx, ctx.input(0), ctx.input(1), ctx.input(2))


@converter("SoftmaxCrossEntropyLoss", 12, attrs=_LOSS_ATTRS)
def _softmax_ce(ctx):
    x = ctx.input(0)
    if len(static_shape(ctx, x)) < 2:
        raise ctx.fail("the scores need a class axis (rank >= 2)")
    d = E(x, mgb.opr.reduce_(x, "MAX", 1, True), mode="SUB")
    logp = E(d, E(mgb.opr.reduce_(E(d, mode="EXP"), "SUM", 1, True), mode="LOG"), mode="SUB")
    return [_nll(ctx, logp, ctx.input(1), ctx.input(2)), logp]
