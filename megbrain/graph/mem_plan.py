"""Static memory planning: place chunks with known lifetimes in one arena per comp node.

The allocator interface mirrors MegBrain's ``StaticMemAlloc``: ``add(begin, end, size, key)``
registers a chunk live over the half-open step interval ``[begin, end)``;
``add_overwrite_spec(src, dst, offset)`` says chunk ``dst`` lives inside ``src`` at ``offset``
(in-place reuse); ``solve()`` assigns offsets; ``tot_alloc()`` is the arena size and
``tot_alloc_lower_bound()`` the most bytes simultaneously live, which no plan can beat.
The algorithm is "greedy by size": chunks in decreasing size, each at the lowest offset
that does not collide with an already placed chunk whose lifetime overlaps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable

__all__ = ["StaticAllocator", "align_up"]


def align_up(n: int, align: int) -> int:
    return (n + align - 1) // align * align


@dataclass
class _Chunk:
    key: Hashable
    begin: int
    end: int
    size: int
    offset: int = -1
    parent: _Chunk | None = None
    parent_offset: int = 0
    children: list = field(default_factory=list)


class StaticAllocator:
    """Greedy-by-size interval allocator (see the module docstring)."""

    def __init__(self, align: int = 64):
        self.align = align
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

        ``dst`` must start when ``src`` ends (its last reader writes ``dst``) and fit in it.
        """
        s, d = self._root(self._chunks[src]), self._chunks[dst]
        if d.size + offset > s.size:
            raise ValueError(f"overwrite {dst!r} (+{offset}, {d.size}B) exceeds {src!r}")
        d.parent, d.parent_offset = s, offset
        s.children.append(d)
        s.end = max(s.end, d.end)
        s.begin = min(s.begin, d.begin)
        self._solved = False

    @staticmethod
    def _root(c: _Chunk) -> _Chunk:
        while c.parent is not None:
            c = c.parent
        return c

    def solve(self) -> None:
        """Assign every chunk an offset."""
        roots = [c for c in self._chunks.values() if c.parent is None]
        roots.sort(key=lambda c: (-c.size, c.begin))
        placed: list[_Chunk] = []
        tot = 0
        for c in roots:
            busy = sorted(
                (p.offset, p.offset + p.size)
                for p in placed
                if p.begin < c.end and c.begin < p.end
            )
            off = 0
            for lo, hi in busy:
                if off + c.size <= lo:
                    break
                off = max(off, hi)
            c.offset = off
            placed.append(c)
            tot = max(tot, off + c.size)
        for c in self._chunks.values():
            if c.parent is not None:
                c.offset = self._root(c).offset + self._offset_in_root(c)
        self._tot = tot
        self._solved = True

    def _offset_in_root(self, c: _Chunk) -> int:
        off = 0
        while c.parent is not None:
            off += c.parent_offset
            c = c.parent
        return off

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
        events = []
        for c in self._chunks.values():
            if c.parent is None:
                events.append((c.begin, c.size))
                events.append((c.end, -c.size))
        events.sort(key=lambda e: (e[0], e[1]))
        cur = best = 0
        for _, delta in events:
            cur += delta
            best = max(best, cur)
        return best
