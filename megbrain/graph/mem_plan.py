"""Static memory planning: place chunks with known lifetimes in one arena per comp node.

The allocator interface mirrors MegBrain's ``StaticMemAlloc``: ``add(begin, end, size, key)``
registers a chunk live over the half-open step interval ``[begin, end)``;
``add_overwrite_spec(src, dst, offset)`` says chunk ``dst`` lives inside ``src`` from byte
``offset`` on (in-place reuse: ``dst`` is written by the last reader of ``src``); ``solve()``
assigns offsets; ``tot_alloc()`` is the arena size and ``tot_alloc_lower_bound()`` the most
bytes simultaneously live, which no placement can beat.

Placement is a swappable *solver* (:data:`SOLVERS`), ``f(begins, ends, sizes) -> offsets``
over the root chunks (overwrite specs are merged into their source before). Most solvers are
greedy interval packers: chunks in some order, each put in a gap (lowest fitting, or the
tightest) left by the already placed chunks whose lifetimes overlap its own (per-chunk
conflict lists: a cost that grows with the number of overlapping pairs). ``sweep_best_fit``
instead sweeps over time with a free list of gaps, in O(n log n). The default, ``"best"``,
runs them all and keeps the smallest arena, stopping as soon as one reaches the lower bound;
above :data:`PORTFOLIO_PAIRS` overlapping pairs it runs the sweep alone.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "PORTFOLIO_PAIRS",
    "SOLVERS",
    "StaticAllocator",
    "align_up",
    "interval_lower_bound",
    "overlap_pairs",
    "overlaps",
    "pack",
    "sweep_best_fit",
]

#: above this many pairs of chunks with intersecting lifetimes, ``"best"`` runs only the
#: sweep (the other solvers walk every pair, a cost quadratic in a training graph's size)
PORTFOLIO_PAIRS = 200_000


def align_up(n: int, align: int) -> int:
    """``n`` rounded up to a multiple of ``align``."""
    return (n + align - 1) // align * align


def interval_lower_bound(begins: Sequence[int], ends: Sequence[int], sizes: Sequence[int]) -> int:
    """The most bytes live at one step: the maximum over steps of the sizes live there."""
    events = sorted(
        [(e, -s) for e, s in zip(ends, sizes)] + [(b, s) for b, s in zip(begins, sizes)]
    )  # at equal steps the ends (negative) come first: [b, e) intervals
    cur = best = 0
    for _, delta in events:
        cur += delta
        best = max(best, cur)
    return best


def overlaps(begins: Sequence[int], ends: Sequence[int]) -> list[list[int]]:
    """For each chunk, the other chunks whose lifetimes intersect its own."""
    b = np.asarray(begins, np.int64)
    e = np.asarray(ends, np.int64)
    order = np.argsort(b, kind="stable")
    out: list[list[int]] = [[] for _ in range(len(b))]
    bs = b[order]
    for i in range(len(b)):
        # chunks beginning before i ends, among which those ending after i begins
        cand = order[: np.searchsorted(bs, e[i], "left")]
        hit = cand[e[cand] > b[i]]
        out[i] = [j for j in hit.tolist() if j != i]
    return out


def pack(
    sizes: Sequence[int],
    conflicts: Sequence[Sequence[int]],
    order: Sequence[int],
    best_fit: bool = False,
) -> list[int]:
    """Place chunks one by one in ``order``; returns the offset of each chunk.

    A chunk goes into a gap between the already placed chunks it ``conflicts`` with (those
    whose lifetimes overlap its own): the lowest gap that fits (first fit) or the smallest
    one (``best_fit``), else on top of them.
    """
    offsets = [-1] * len(sizes)
    for i in order:
        size = sizes[i]
        busy = sorted((offsets[j], offsets[j] + sizes[j]) for j in conflicts[i] if offsets[j] >= 0)
        top, off, off_room = 0, -1, 0
        for lo, hi in busy:
            room = lo - top
            if room >= size and (off < 0 or room < off_room):
                off, off_room = top, room
                if not best_fit:
                    break
            top = max(top, hi)
        offsets[i] = top if off < 0 else off
    return offsets


def _by_size(b, e, s):
    return sorted(range(len(s)), key=lambda i: (-s[i], b[i], i))


def _by_area(b, e, s):
    return sorted(range(len(s)), key=lambda i: (-s[i] * (e[i] - b[i]), b[i], i))


def _by_length(b, e, s):
    return sorted(range(len(s)), key=lambda i: (b[i] - e[i], -s[i], i))


def _by_begin(b, e, s):
    return sorted(range(len(s)), key=lambda i: (b[i], -s[i], i))


def _solver(ordering, best_fit: bool) -> Callable:
    def solve(b, e, s, conflicts=None):
        if conflicts is None:
            conflicts = overlaps(b, e)
        return pack(s, conflicts, ordering(b, e, s), best_fit)

    solve.__name__ = f"{ordering.__name__[4:]}_{'best' if best_fit else 'first'}_fit"
    return solve


def _solve_best(b, e, s, conflicts=None):
    """Every other solver in turn; the smallest arena wins (first to reach the bound stops).

    The conflict-list solvers cost the number of overlapping pairs, which grows with the
    square of a training graph's size: beyond :data:`PORTFOLIO_PAIRS` pairs only the sweep
    runs (n log n)."""
    bound = interval_lower_bound(b, e, s)
    if conflicts is None:
        if overlap_pairs(b, e) > PORTFOLIO_PAIRS:
            return sweep_best_fit(b, e, s)
        conflicts = overlaps(b, e)
    best, best_tot = None, None
    for name, fn in SOLVERS.items():
        if name == "best":
            continue
        offs = fn(b, e, s, conflicts)
        tot = max((o + z for o, z in zip(offs, s)), default=0)
        if best_tot is None or tot < best_tot:
            best, best_tot = offs, tot
            if tot <= bound:
                break
    return best if best is not None else []


def overlap_pairs(begins: Sequence[int], ends: Sequence[int]) -> int:
    """How many pairs of chunks have intersecting lifetimes (without listing them)."""
    b = np.asarray(begins, np.int64)
    e = np.asarray(ends, np.int64)
    # j meets i when b[j] < e[i] and e[j] > b[i]; those with e[j] <= b[i] all have b[j] < e[i]
    hits = np.searchsorted(np.sort(b), e, "left") - np.searchsorted(np.sort(e), b, "right")
    return int(hits.sum() - len(b)) // 2


def sweep_best_fit(b, e, s, conflicts=None) -> list[int]:
    """Sweep over time forward and backward (:func:`_sweep`); the smaller arena wins.

    A training step's lifetimes are nested around the end of the forward pass; freeing in
    one direction can leave a gap that allocating in the other avoids, so both run (the
    second only when the first misses the lower bound). ``conflicts`` is ignored."""
    offs = _sweep(b, e, s)
    tot = max((o + z for o, z in zip(offs, s)), default=0)
    if tot <= interval_lower_bound(b, e, s):
        return offs
    last = max(e, default=0)
    back = _sweep([last - x for x in e], [last - x for x in b], s)
    return back if max((o + z for o, z in zip(back, s)), default=0) < tot else offs


def _sweep(b, e, s) -> list[int]:
    """Place chunks in order of their first step, each in the smallest free gap that fits.

    The sweep keeps the free gaps of the arena (coalesced, sorted by size): a chunk's memory
    returns to them at its end step. Each chunk costs a few bisections of the gap list, so a
    plan is O(n log n) (bar the gap list's memmoves) and needs no conflict lists."""
    n = len(s)
    offsets = [0] * n
    starts = sorted(range(n), key=lambda i: (b[i], -s[i], i))
    ends = sorted(range(n), key=lambda i: e[i])
    by_size: list[tuple[int, int]] = []  # (size, start) of each free gap
    gap_at: dict[int, int] = {}  # start -> end of each free gap
    gap_to: dict[int, int] = {}  # end -> start
    top = 0
    k = 0

    def drop(lo, hi):
        del gap_at[lo], gap_to[hi]
        del by_size[bisect_left(by_size, (hi - lo, lo))]

    for i in starts:
        t = b[i]
        while k < n and e[ends[k]] <= t:
            j = ends[k]
            k += 1
            lo, hi = offsets[j], offsets[j] + s[j]
            if lo == hi:
                continue
            if hi in gap_at:  # coalesce with the gap above
                h2 = gap_at[hi]
                drop(hi, h2)
                hi = h2
            if lo in gap_to:  # and the one below
                l2 = gap_to[lo]
                drop(l2, lo)
                lo = l2
            gap_at[lo], gap_to[hi] = hi, lo
            insort(by_size, (hi - lo, lo))
        size = s[i]
        if size == 0:
            offsets[i] = 0
            continue
        g = bisect_left(by_size, (size, -1))
        if g < len(by_size):
            room, lo = by_size[g]
            hi = lo + room
            drop(lo, hi)
            if room > size:
                gap_at[lo + size], gap_to[hi] = hi, lo + size
                insort(by_size, (room - size, lo + size))
            offsets[i] = lo
        elif top in gap_to:  # a free gap at the top grows into the new space
            lo = gap_to[top]
            drop(lo, top)
            offsets[i] = lo
            top = lo + size
        else:
            offsets[i] = top
            top += size
    return offsets


#: solver name -> ``f(begins, ends, sizes, conflicts=None) -> offsets`` (``conflicts``: the
#: result of :func:`overlaps`, shared between solvers); ``StaticAllocator(solver=name)``
SOLVERS: dict[str, Callable] = {
    fn.__name__: fn
    for fn in (
        _solver(_by_size, True),
        _solver(_by_size, False),
        _solver(_by_area, True),
        _solver(_by_length, True),
        _solver(_by_begin, False),
        sweep_best_fit,
    )
}
SOLVERS["best"] = _solve_best


@dataclass
class _Chunk:
    key: Hashable
    begin: int
    end: int
    size: int
    offset: int = -1
    parent: _Chunk | None = None
    parent_offset: int = 0  # byte offset inside ``parent``


class StaticAllocator:
    """Offsets for chunks with known lifetimes in one arena (see the module docstring).

    Parameters
    ----------
    align : int
        Every root chunk starts at a multiple of ``align`` (the comp node's ``mem_align``);
        sizes are rounded up to it.
    solver : str
        A name in :data:`SOLVERS`; ``"best"`` (the default) tries them all.
    """

    def __init__(self, align: int = 64, solver: str = "best"):
        if align <= 0:
            raise ValueError(f"alignment must be positive, got {align}")
        if solver not in SOLVERS:
            raise ValueError(f"unknown solver {solver!r}; expected one of {sorted(SOLVERS)}")
        self.align = align
        self.solver = solver
        self._chunks: dict[Hashable, _Chunk] = {}
        self._tot = 0
        self._solved = False

    def add(self, begin: int, end: int, size: int, key: Hashable) -> None:
        """Register chunk ``key`` of ``size`` bytes live over steps ``[begin, end)``."""
        if end <= begin:
            raise ValueError(f"chunk {key!r}: empty lifetime [{begin}, {end})")
        if size < 0:
            raise ValueError(f"chunk {key!r}: negative size {size}")
        if key in self._chunks:
            raise ValueError(f"chunk {key!r} added twice")
        self._chunks[key] = _Chunk(key, begin, end, align_up(size, self.align))
        self._solved = False

    def add_overwrite_spec(self, src: Hashable, dst: Hashable, offset: int) -> None:
        """Chunk ``dst`` reuses the memory of ``src`` from byte ``offset`` on.

        ``dst`` must fit in ``src`` and start no earlier than the last step of ``src`` (the
        last reader of ``src`` writes ``dst``); both then share one placement.
        """
        s, d = self._chunks[src], self._chunks[dst]
        if d.parent is not None:
            raise ValueError(f"chunk {dst!r} already overwrites another chunk")
        if offset < 0 or d.size + offset > s.size:
            raise ValueError(
                f"overwrite {dst!r} (+{offset}, {d.size}B) does not fit in {src!r} ({s.size}B)"
            )
        if d.begin + 1 < s.end:
            raise ValueError(
                f"overwrite {dst!r} [{d.begin}, {d.end}) starts before {src!r} "
                f"[{s.begin}, {s.end}) is dead"
            )
        r = s
        while r is not d and r.parent is not None:
            r = r.parent
        if r is d:
            raise ValueError(f"overwrite {src!r} -> {dst!r} makes a cycle")
        d.parent, d.parent_offset = s, offset
        self._solved = False

    def _root(self, c: _Chunk) -> tuple[_Chunk, int]:
        off = 0
        while c.parent is not None:
            off += c.parent_offset
            c = c.parent
        return c, off

    def _roots(self) -> dict[Hashable, list[int]]:
        """Root key -> [begin, end, size]: each root spans the lifetimes of its overwriters."""
        spans: dict[Hashable, list[int]] = {}
        for c in self._chunks.values():
            r, _ = self._root(c)
            sp = spans.get(r.key)
            if sp is None:
                spans[r.key] = [c.begin, c.end, r.size]
            else:
                sp[0], sp[1] = min(sp[0], c.begin), max(sp[1], c.end)
        return spans

    def solve(self) -> None:
        """Assign every chunk an offset."""
        spans = self._roots()
        keys = list(spans)
        b = [spans[k][0] for k in keys]
        e = [spans[k][1] for k in keys]
        s = [spans[k][2] for k in keys]
        offs = SOLVERS[self.solver](b, e, s)
        root_off = dict(zip(keys, offs))
        for c in self._chunks.values():
            r, off = self._root(c)
            c.offset = root_off[r.key] + off
        self._tot = max((o + z for o, z in zip(offs, s)), default=0)
        self._solved = True

    def offset(self, key: Hashable) -> int:
        """The solved byte offset of chunk ``key``."""
        if not self._solved:
            self.solve()
        return self._chunks[key].offset

    def tot_alloc(self) -> int:
        """Arena bytes the solved plan needs."""
        if not self._solved:
            self.solve()
        return self._tot

    def tot_alloc_lower_bound(self) -> int:
        """The most bytes simultaneously live: no placement can use less."""
        spans = self._roots().values()
        return interval_lower_bound(
            [sp[0] for sp in spans], [sp[1] for sp in spans], [sp[2] for sp in spans]
        )
