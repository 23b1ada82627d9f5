"""Attention (opsets 23 to 25), composed from batched matrix products, elemwise and reduce.

The additive bias (attention mask, causal and sliding-window frontiers, key padding) is built
as ONNX defines it: every disallowed position gets -inf; rows with no allowed key give zero
probabilities (and zero outputs), never NaN.  Computation is in float32; the outputs get the
inputs' dtype.
"""

from __future__ import annotations

import numpy as np

import megbrain as mgb

from .ops_tensor import _reshape, static_shape
from .registry import Attr, converter

E = mgb.opr.elemwise


def _f32(v):
    return v if np.dtype(v.dtype) == np.float32 else mgb.opr.typecvt(v, np.float32)


def _heads_first(ctx, x, heads, what):
    """(b, s, heads * d) -> (b, heads, s, d)."""
    b, s, hidden = static_shape(ctx, x, what)
    if heads is None or hidden % heads:
        raise ctx.fail(f"{what} of shape {(b, s, hidden)} does not split into {heads} heads")
    return mgb.opr.dimshuffle(_reshape(x, (b, s, heads, hidden // heads)), [0, 2, 1, 3])


def _bmm(ctx, a, b, trans_b=False):
    """(..., m, k) x (..., k, n) over equal leading dims, as one batched product."""
    sa, sb = static_shape(ctx, a), static_shape(ctx, b)
    lead = sa[:-2]
    nb = int(np.prod(lead))
    y = mgb.opr.batched_matrix_mul(
        _reshape(a, (nb,) + sa[-2:]), _reshape(b, (nb,) + sb[-2:]), transposeB=trans_b
    )
    return _reshape(y, lead + (sa[-2], sb[-2] if trans_b else sb[-1]))


def _neg_inf_where_not(ctx, allowed):
    """0 where ``allowed`` (float 0/1) is 1, -inf where it is 0 (a select, no 0 * inf)."""
    one = ctx.imm(np.float32(1))
    ninf = ctx.imm(np.full((1,) * len(static_shape(ctx, allowed)), -np.inf, np.float32))
    return E(E(one, allowed, mode="SUB"), ninf, mode="SWITCH_GT0")


def _as_rank4(ctx, v):
    shp = static_shape(ctx, v)
    return _reshape(v, (1,) * (4 - len(shp)) + shp) if len(shp) < 4 else v


def _mask_bias(ctx, kv):
    """The attention mask (input 3) as an additive float32 bias of rank 4, padded to kv."""
    m = ctx.input(3)
    is_bool = ctx.in_type(3) == 9  # BOOL, held as int32 0/1
    shp = static_shape(ctx, m, "attn_mask")
    m = _f32(m)
    if shp[-1] < kv:
        fill = 0.0 if is_bool else -np.inf
        pad = ctx.imm(np.full(shp[:-1] + (kv - shp[-1],), fill, np.float32))
        m = mgb.opr.concat(m, pad, axis=len(shp) - 1)
    if is_bool:
        m = _neg_inf_where_not(ctx, m)
    return _as_rank4(ctx, m)


def _structural_bias(ctx, b, q, kv, past_len):
    """Causal / sliding-window frontiers and key padding, as a rank-4 additive bias (or None).

    A query at block index i sits at absolute position i + offset: offset is the past length
    (internal cache) or ``nonpad_kv_seqlen[b] - q`` (external cache).
    """
    causal = bool(ctx.attr("is_causal"))
    left = ctx.attr("left_window_size")
    right = ctx.attr("right_window_size")
    left = -1 if left is None else int(left)
    right = -1 if right is None else int(right)
    nonpad = ctx.input(6) if ctx.has(6) else None
    if not (causal or left >= 0 or right >= 0 or nonpad is not None):
        return None
    # d = j - i on the (q, kv) grid
    d = (np.arange(kv)[None, :] - np.arange(q)[:, None]).reshape(1, 1, q, kv).astype(np.int32)
    grid = ctx.imm(d)
    if nonpad is not None:
        npad = _reshape(mgb.opr.typecvt(nonpad, np.int32), (b, 1, 1, 1))
        off = E(npad, ctx.imm(np.int32(q)), mode="SUB")
    else:
        off = ctx.imm(np.full((1, 1, 1, 1), past_len, np.int32))
    conds = []
    if causal:
        conds.append(E(grid, off, mode="LEQ"))  # j <= i + offset
    if left >= 0:  # (i + offset) - j <= left
        conds.append(E(E(off, ctx.imm(np.int32(left)), mode="SUB"), grid, mode="LEQ"))
    if right >= 0:  # j - (i + offset) <= right
        conds.append(E(grid, E(off, ctx.imm(np.int32(right)), mode="ADD"), mode="LEQ"))
    if nonpad is not None:  # j < nonpad_kv_seqlen[b]
        j = ctx.imm(np.arange(kv, dtype=np.int32).reshape(1, 1, 1, kv))
        conds.append(E(j, npad, mode="LT"))
    allowed = conds[0]
    for c in conds[1:]:
        allowed = E(allowed, c, mode="MUL")
    return _neg_inf_where_not(ctx, mgb.opr.typecvt(allowed, np.float32))


def _safe_softmax(ctx, x):
    """Softmax over the last axis; a row that is all -inf gives zeros."""
    ax = len(static_shape(ctx, x)) - 1
    mx = mgb.opr.reduce_(x, "MAX", ax, True)
    dead = E(mx, ctx.imm(np.float32(-np.inf)), mode="EQ")
    safe = E(E(ctx.imm(np.float32(1)), dead, mode="SUB"), mx, mode="SWITCH_GT0")
    ex = E(E(x, safe, mode="SUB"), mode="EXP")
    s = mgb.opr.reduce_(ex, "SUM", ax, True)
    s = E(s, E(s, ctx.imm(np.float32(0)), mode="EQ"), mode="ADD")
    return E(ex, s, mode="TRUE_DIV")


def _check_attention(attrs, in_types, where):
    from .registry import ONNXConversionError

    if attrs.get("softmax_precision") not in (None, 1, 10, 11, 16):
        raise ONNXConversionError(
            f"{where}: softmax_precision={attrs['softmax_precision']} is not supported"
        )


@converter(
    "Attention",
    23,
    attrs={
        "is_causal": Attr(0, frozenset({0, 1})),
        "kv_num_heads": None,
        "q_num_heads": None,
        "qk_matmul_output_mode": Attr(0, frozenset({0, 1, 2, 3})),
        "scale": None,
        "softcap": 0.0,
        "softmax_precision": None,
        "left_window_size": None,
        "right_window_size": None,
    },
    validate=_check_attention,
)
def _attention(ctx):
    q_in, k_in, v_in = ctx.input(0), ctx.input(1), ctx.input(2)
    out_dtype = q_in.dtype
    rank = len(static_shape(ctx, q_in, "Q"))
    if rank not in (3, 4):
        raise ctx.fail(f"Q must have rank 3 or 4, got {rank}")
    if (ctx.input(4) is None) != (ctx.input(5) is None):
        raise ctx.fail("past_key and past_value must be given together")
    if ctx.has(6) and ctx.has(4):
        raise ctx.fail("nonpad_kv_seqlen cannot be combined with past_key/past_value")
    Q, K, V = _f32(q_in), _f32(k_in), _f32(v_in)
    if rank == 3:
        Q = _heads_first(ctx, Q, ctx.attr("q_num_heads"), "Q")
        K = _heads_first(ctx, K, ctx.attr("kv_num_heads"), "K")
        V = _heads_first(ctx, V, ctx.attr("kv_num_heads"), "V")
    past_len = 0
    if ctx.has(4):
        past_len = static_shape(ctx, ctx.input(4), "past_key")[2]
        K = mgb.opr.concat(_f32(ctx.input(4)), K, axis=2)
        V = mgb.opr.concat(_f32(ctx.input(5)), V, axis=2)
    present_k, present_v = K, V
    b, hq, q, dq = static_shape(ctx, Q, "Q")
    hk, kv = static_shape(ctx, K, "K")[1:3]
    hv, dv = static_shape(ctx, V, "V")[1], static_shape(ctx, V, "V")[3]
    if hq != hk:
        if hq % hk or hk != hv:
            raise ctx.fail(f"{hq} query heads do not group over {hk} key / {hv} value heads")
        reps = hq // hk

        def repeat(x, d):
            x = _reshape(x, (b, hk, 1, kv, d))
            return _reshape(mgb.opr.broadcast(x, (b, hk, reps, kv, d)), (b, hq, kv, d))

        K, V = repeat(K, dq), repeat(V, dv)
    scale = ctx.attr("scale")
    scale = 1.0 / np.sqrt(dq) if scale is None else float(scale)
    s = ctx.imm(np.float32(np.sqrt(scale)))
    qk = _bmm(ctx, E(Q, s, mode="MUL"), E(K, s, mode="MUL"), trans_b=True)
    softcap = float(ctx.attr("softcap") or 0.0)
    if softcap > 0:
        c = ctx.imm(np.float32(softcap))
        qk = E(E(E(qk, c, mode="TRUE_DIV"), mode="TANH"), c, mode="MUL")
    bias = None
    if ctx.has(3):
        bias = _mask_bias(ctx, kv)
    struct = _structural_bias(ctx, b, q, kv, past_len)
    if struct is not None:
        bias = struct if bias is None else E(bias, struct, mode="ADD")
    logits = qk if bias is None else E(qk, bias, mode="ADD")
    probs = _safe_softmax(ctx, logits)
    if bias is not None:
        # a row whose bias is all -inf attends nothing: zero, whatever its logits hold
        full = mgb.opr.broadcast(bias, (b, hq, q, kv))
        bmax = mgb.opr.reduce_(full, "MAX", 3, True)
        live = E(
            ctx.imm(np.float32(1)), E(bmax, ctx.imm(np.float32(-np.inf)), mode="EQ"), mode="SUB"
        )
        probs = E(live, probs, mode="SWITCH_GT0")
    y = _bmm(ctx, probs, V)
    if rank == 3:
        y = _reshape(mgb.opr.dimshuffle(y, [0, 2, 1, 3]), (b, q, hq * dv))
    mode = ctx.attr("qk_matmul_output_mode")
    qk_out = {0: qk, 1: qk, 2: logits, 3: probs}[mode]

    def back(v):
        return v if np.dtype(v.dtype) == np.dtype(out_dtype) else mgb.opr.typecvt(v, out_dtype)

    return [back(y), back(present_k), back(present_v), back(qk_out)]


@converter(
    "RotaryEmbedding",
    23,
    attrs={
        "interleaved": Attr(0, frozenset({0, 1})),
        "num_heads": None,
        "rotary_embedding_dim": 0,
    },
)
def _rotary_embedding(ctx):
    x, cos, sin = ctx.input(0), ctx.input(1), ctx.input(2)
    shp = static_shape(ctx, x)
    if len(shp) == 4:  # (b, heads, s, d) -> (b, s, heads, d)
        t = mgb.opr.dimshuffle(x, [0, 2, 1, 3])
    elif len(shp) == 3:
        heads = ctx.attr("num_heads")
        if not heads or shp[2] % heads:
            raise ctx.fail(f"3-d input {shp} needs num_heads dividing {shp[2]}")
        t = _reshape(x, (shp[0], shp[1], heads, shp[2] // heads))
    else:
        raise ctx.fail(f"input must have rank 3 or 4, got {shp}")
    b, s, h, d = static_shape(ctx, t)
    r = int(ctx.attr("rotary_embedding_dim") or d)
    half = r // 2
    if ctx.has(3):  # caches indexed by position
        ids = _reshape(mgb.opr.typecvt(ctx.input(3), np.int32), (b * s,))
        cos = mgb.opr.advanced_indexing(cos)[ids]
        sin = mgb.opr.advanced_indexing(sin)[ids]
    if static_shape(ctx, cos)[-1] != half or static_shape(ctx, sin)[-1] != half:
        raise ctx.fail(f"the caches' last dim must be rotary_embedding_dim / 2 = {half}")
    cos, sin = _reshape(cos, (b, s, 1, half)), _reshape(sin, (b, s, 1, half))
    rot = t[:, :, :, :r]
    if ctx.attr("interleaved"):
        x1, x2 = rot[:, :, :, 0::2], rot[:, :, :, 1::2]
    else:
        x1, x2 = rot[:, :, :, :half], rot[:, :, :, half:]
    real = E(E(cos, x1, mode="MUL"), E(sin, x2, mode="MUL"), mode="SUB")
    imag = E(E(sin, x1, mode="MUL"), E(cos, x2, mode="MUL"), mode="ADD")
    if ctx.attr("interleaved"):
        pair = (b, s, h, half, 1)
        rot = mgb.opr.concat(_reshape(real, pair), _reshape(imag, pair), axis=4)
        rot = _reshape(rot, (b, s, h, r))
    else:
        rot = mgb.opr.concat(real, imag, axis=3)
    y = mgb.opr.concat(rot, t[:, :, :, r:], axis=3) if r < d else rot
    if len(shp) == 4:
        return mgb.opr.dimshuffle(y, [0, 2, 1, 3])
    return _reshape(y, shp)


@converter(
    "LinearAttention",
    27,
    attrs={
        "chunk_size": None,
        "kv_num_heads": None,
        "q_num_heads": None,
        "scale": None,
        "update_rule": Attr("gated_delta", frozenset({"linear", "gated", "delta", "gated_delta"})),
    },
)
def _linear_attention(ctx):
    # the recurrence unrolled over the (static) sequence: per step the state (B, H, dk, dv)
    # decays (gated), is corrected toward v (delta), takes k v^T, and is read by q
    rule = ctx.attr("update_rule")
    gating, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if gating != ctx.has(4) or delta != ctx.has(5):
        raise ctx.fail(f"update_rule {rule!r} needs decay: {gating}, beta: {delta}")
    hq, hk = ctx.attr("q_num_heads"), ctx.attr("kv_num_heads")
    if not hq or not hk or hq % hk:
        raise ctx.fail(f"q_num_heads {hq} must be a positive multiple of kv_num_heads {hk}")
    out_dtype = ctx.input(0).dtype
    q = _heads_first(ctx, _f32(ctx.input(0)), hq, "query")
    k = _heads_first(ctx, _f32(ctx.input(1)), hk, "key")
    v = _heads_first(ctx, _f32(ctx.input(2)), hk, "value")
    b, _, t, dk = static_shape(ctx, q)
    dv = static_shape(ctx, v)[3]
    decay = beta = None
    if gating:
        last = static_shape(ctx, ctx.input(4), "decay")[2]
        if last == hk:
            decay = mgb.opr.dimshuffle(_reshape(_f32(ctx.input(4)), (b, t, hk, 1)), [0, 2, 1, 3])
        elif last == hk * dk:
            decay = _heads_first(ctx, _f32(ctx.input(4)), hk, "decay")
        else:
            raise ctx.fail(f"decay's last dim {last} must be {hk} or {hk * dk}")
        decay = E(decay, mode="EXP")
    if delta:
        last = static_shape(ctx, ctx.input(5), "beta")[2]
        if last not in (hk, 1):
            raise ctx.fail(f"beta's last dim {last} must be {hk} or 1")
        beta = mgb.opr.dimshuffle(_reshape(_f32(ctx.input(5)), (b, t, last, 1)), [0, 2, 1, 3])
    if ctx.has(3):
        state = _f32(ctx.input(3))
        state_dtype = ctx.input(3).dtype
        if static_shape(ctx, state, "past_state") != (b, hk, dk, dv):
            raise ctx.fail(f"past_state must have shape {(b, hk, dk, dv)}")
    else:
        state = ctx.imm(np.zeros((b, hk, dk, dv), np.float32))
        state_dtype = out_dtype
    scale = ctx.attr("scale")
    scale = 1.0 / np.sqrt(dk) if not scale else float(scale)
    g = hq // hk
    outs = []
    for i in range(t):
        kt = _reshape(k[:, :, i : i + 1, :], (b, hk, dk, 1))
        vt = _reshape(v[:, :, i : i + 1, :], (b, hk, 1, dv))
        if gating:
            gt = decay[:, :, i : i + 1, :]  # (b, hk, 1, 1 or dk)
            state = E(state, _reshape(gt, (b, hk, static_shape(ctx, gt)[3], 1)), mode="MUL")
        if delta:
            got = mgb.opr.reduce_(E(state, kt, mode="MUL"), "SUM", 2, True)  # (b, hk, 1, dv)
            bt = _reshape(beta[:, :, i : i + 1, :], (b, static_shape(ctx, beta)[1], 1, 1))
            vt = E(bt, E(vt, got, mode="SUB"), mode="MUL")
        state = E(state, E(kt, vt, mode="MUL"), mode="ADD")
        read = state
        if g > 1:
            read = mgb.opr.broadcast(_reshape(state, (b, hk, 1, dk, dv)), (b, hk, g, dk, dv))
            read = _reshape(read, (b, hq, dk, dv))
        qt = _reshape(q[:, :, i : i + 1, :], (b, hq, dk, 1))
        ot = mgb.opr.reduce_(E(qt, read, mode="MUL"), "SUM", 2, True)  # (b, hq, 1, dv)
        outs.append(E(ot, ctx.imm(np.float32(scale)), mode="MUL"))
    y = mgb.opr.concat(*outs, axis=2) if len(outs) > 1 else outs[0]
    y = _reshape(mgb.opr.dimshuffle(y, [0, 2, 1, 3]), (b, t, hq * dv))

    def back(v, dt):
        return v if np.dtype(v.dtype) == np.dtype(dt) else mgb.opr.typecvt(v, dt)

    return [back(y, out_dtype), back(state, state_dtype)]
