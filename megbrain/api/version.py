"""The runtime's version as a comparable (major, minor, patch, dev) record."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Version", "version_info", "__version__"]


class Version(NamedTuple):
    """A semantic version that compares with strings (``version_info >= "0.1"``) and tuples.

    A string or tuple compared against it gives major, minor and patch (missing parts are 0);
    ``dev`` counts only between two Versions.
    """

    major: int
    minor: int
    patch: int
    dev: int = 0

    @classmethod
    def _normalize(cls, v) -> tuple:
        if isinstance(v, Version):
            return tuple(v)
        if isinstance(v, str):
            v = v.split("-")[0].split(".")
        parts = [int(x) for x in v][:3]
        return (*parts, *[0] * (3 - len(parts)), 0)

    def __eq__(self, rhs) -> bool:
        return tuple(self) == self._normalize(rhs)

    def __ne__(self, rhs) -> bool:
        return not self == rhs

    def __lt__(self, rhs) -> bool:
        return tuple(self) < self._normalize(rhs)

    def __le__(self, rhs) -> bool:
        return tuple(self) <= self._normalize(rhs)

    def __gt__(self, rhs) -> bool:
        return tuple(self) > self._normalize(rhs)

    def __ge__(self, rhs) -> bool:
        return tuple(self) >= self._normalize(rhs)

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __str__(self) -> str:
        s = f"{self.major}.{self.minor}.{self.patch}"
        return s + (f"-dev{self.dev}" if self.dev else "")


version_info = Version(0, 1, 0)
__version__ = str(version_info)
