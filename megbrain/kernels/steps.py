"""Bound kernels as zero-argument steps, and running several as one."""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["Step", "chain"]

#: a kernel bound to its arrays: calling it computes into the bound outputs
Step = Callable[[], object]


def chain(steps: Sequence[Step]) -> Callable[[], None]:
    """One step running ``steps`` in order (the step itself when there is only one)."""
    if len(steps) == 1:
        return steps[0]
    steps = tuple(steps)

    def run() -> None:
        for step in steps:
            step()

    return run
