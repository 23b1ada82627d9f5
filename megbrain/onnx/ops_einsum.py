"""Einsum, contracted pairwise left to right with batched matrix products."""

from __future__ import annotations

import string

import numpy as np

import megbrain as mgb

from .ops_tensor import _reshape, static_shape
from .registry import Attr, converter


def _parse(ctx, equation, ranks):
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ctx.fail(f"equation {equation!r} names {len(terms)} operands, got {len(ranks)}")
    spare = [c for c in string.ascii_uppercase + string.ascii_lowercase if c not in eq]
    n_ell = max(
        (r - len(t.replace("...", "")) for t, r in zip(terms, ranks) if "..." in t), default=0
    )
    ell = "".join(spare[:n_ell])
    out_terms = []
    for t, r in zip(terms, ranks):
        if "..." in t:
            k = r - len(t.replace("...", ""))
            t = t.replace("...", ell[n_ell - k :] if k else "")
        if len(t) != r:
            raise ctx.fail(f"term {t!r} does not match an operand of rank {r}")
        out_terms.append(t)
    if arrow:
        out = rhs.replace("...", ell)
    else:
        counts = {}
        for t in out_terms:
            for c in t:
                counts[c] = counts.get(c, 0) + 1
        out = ell + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell))
    return out_terms, out


def _sum_out(x, letters, drop):
    for c in drop:
        x = mgb.opr.reduce_(x, "SUM", letters.index(c), True)
    keep = [i for i, c in enumerate(letters) if c not in drop]
    shp = tuple(int(d) for d in x.imm_shape)
    if drop:
        x = _reshape(x, [shp[i] for i in keep])
    return x, "".join(letters[i] for i in keep)


def _perm(x, letters, order):
    if letters == order:
        return x
    return mgb.opr.dimshuffle(x, [letters.index(c) for c in order])


def _contract(ctx, a, la, b, lb, keep):
    a, la = _sum_out(a, la, [c for c in la if c not in lb and c not in keep])
    b, lb = _sum_out(b, lb, [c for c in lb if c not in la and c not in keep])
    dims = {}
    for x, lx in ((a, la), (b, lb)):
        for c, d in zip(lx, static_shape(ctx, x)):
            dims[c] = max(dims.get(c, 1), d)
    batch = [c for c in la if c in lb and c in keep]
    con = [c for c in la if c in lb and c not in keep]
    fa = [c for c in la if c not in lb]
    fb = [c for c in lb if c not in la]
    a = _perm(a, la, "".join(batch + fa + con))
    b = _perm(b, lb, "".join(batch + con + fb))
    a = mgb.opr.broadcast(a, [dims[c] for c in batch + fa + con])
    b = mgb.opr.broadcast(b, [dims[c] for c in batch + con + fb])

    def prod(cs):
        return int(np.prod([dims[c] for c in cs]))

    a3 = _reshape(a, (prod(batch), prod(fa), prod(con)))
    b3 = _reshape(b, (prod(batch), prod(con), prod(fb)))
    y = mgb.opr.batched_matrix_mul(a3, b3)
    letters = batch + fa + fb
    return _reshape(y, [dims[c] for c in letters]), "".join(letters)


@converter("Einsum", 12, attrs={"equation": Attr(None)})
def _einsum(ctx):
    vs = list(ctx.inputs)
    if any(np.dtype(v.dtype).kind in "iub" for v in vs):
        raise ctx.fail("integer Einsum is not supported")
    eq = ctx.attr("equation").replace(" ", "")
    lhs = eq.partition("->")[0].split(",")
    # the operands of an empty term are 0-d: scalars
    scalars = [v for t, v in zip(lhs, vs) if t == ""]
    kept = [(t, v) for t, v in zip(lhs, vs) if t != ""]
    scale = None
    for v in scalars:
        scale = v if scale is None else mgb.opr.elemwise(scale, v, mode="MUL")
    if not kept:
        return scale
    if scalars:
        eq = ",".join(t for t, _ in kept) + eq[len(eq.partition("->")[0]) :]
        vs = [v for _, v in kept]
    terms, out = _parse(ctx, eq, [len(static_shape(ctx, v)) for v in vs])
    y = _einsum_terms(ctx, vs, terms, out)
    return y if scale is None else mgb.opr.elemwise(y, scale, mode="MUL")


def _diagonal(ctx, x, term):
    """Take the diagonal of every index repeated in ``term`` (``ii`` -> ``i``): the two axes
    are moved last, merged, and the merged axis is gathered at ``k * (n + 1)``."""
    while len(set(term)) != len(term):
        c = next(ch for ch in term if term.count(ch) > 1)
        p = term.index(c)
        q = term.index(c, p + 1)
        shp = static_shape(ctx, x)
        if shp[p] != shp[q]:
            raise ctx.fail(f"index {c!r} of {term!r} has lengths {shp[p]} and {shp[q]}")
        rest = [i for i in range(len(term)) if i not in (p, q)]
        x = mgb.opr.dimshuffle(x, rest + [p, q]) if rest + [p, q] != list(range(len(term))) else x
        n = shp[p]
        x = _reshape(x, [shp[i] for i in rest] + [n * n])
        idx = ctx.imm(np.arange(n, dtype=np.int32) * (n + 1))
        x = mgb.opr.advanced_indexing(x)[(slice(None),) * len(rest) + (idx,)]
        term = "".join(term[i] for i in rest) + c
    return x, term


def _einsum_terms(ctx, vs, terms, out):
    diag = [_diagonal(ctx, v, t) for v, t in zip(vs, terms)]
    vs, terms = [d[0] for d in diag], [d[1] for d in diag]
    x, lx = vs[0], terms[0]
    for i in range(1, len(vs)):
        later = set(out).union(*terms[i + 1 :])
        x, lx = _contract(ctx, x, lx, vs[i], terms[i], later)
    x, lx = _sum_out(x, lx, [c for c in lx if c not in out])
    if not out:
        return ctx.as_shape(x, ()) if lx == "" else x
    return _perm(x, lx, out)
