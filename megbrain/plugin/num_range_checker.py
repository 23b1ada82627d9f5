"""NumRangeChecker: stop a run at the first operator producing NaN, Inf or a huge value."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..errors import ArgumentError, MegBrainError
from ..graph.operator import fmt_shape
from .base import Observer, PluginBase, describe_var, is_float_var, value_stats

__all__ = ["NumRangeChecker", "NumRangeCheckerError"]


class NumRangeCheckerError(MegBrainError):
    """A float output of an operator has a NaN, an Inf or an absolute value that is not
    below the bound of a :class:`NumRangeChecker` (raised from the function's run)."""


class _RangeObserver(Observer):
    def __init__(self, bound: float):
        self.bound = bound
        #: var -> (min, max) of its latest checked value: what an error reports of the
        #: inputs of the failing operator (which may have overwritten one in place)
        self.ranges: dict = {}

    def wrap_step(self, func, opr, fn: Callable[[], None], value_of) -> Callable[[], None]:
        outs = [v for v in opr.outputs if is_float_var(v)]
        if not outs:
            return fn  # integer (and quantized) outputs are not checked
        ob, bound, ranges = self, self.bound, self.ranges
        vmin, vmax = np.minimum.reduce, np.maximum.reduce

        def step():
            fn()
            if not ob.active:
                return
            for v in outs:
                a = value_of(v)
                if a is None or not a.size:
                    continue
                lo, hi = vmin(a, None), vmax(a, None)  # over all axes; NaN propagates
                if not (-bound < lo and hi < bound):
                    raise _range_error(opr, v, a, bound, value_of, ranges)
                ranges[v] = (lo, hi)

        return step


def _input_range(var, value, ranges: dict) -> str:
    rec = ranges.get(var)
    if rec is not None and is_float_var(var):
        return f"min={float(rec[0]):.6g} max={float(rec[1]):.6g} (checked when computed)"
    return value_stats(value)


def _range_error(opr, var, value, bound: float, value_of, ranges) -> NumRangeCheckerError:
    a = np.asarray(value)
    with np.errstate(invalid="ignore"):
        bad = ~(np.abs(a) < bound)
    idx = tuple(int(i) for i in np.argwhere(bad)[0])
    first = a[idx].item() if a.ndim else a.item()
    lines = [
        f"NumRangeChecker: float value out of range in operator {opr.type_name} "
        f"{opr.name!r} (id {opr.id}): {describe_var(var, a)}",
        f"  value={float(first):g} range={bound:g} index={fmt_shape(idx)}/{fmt_shape(a.shape)}"
        f" ({int(bad.sum())} of {a.size} values out of range; {value_stats(a)})",
        "  inputs:",
    ]
    for i, v in enumerate(opr.inputs):
        iv = value_of(v)
        lines.append(f"    [i{i}] {describe_var(v, iv)}: {_input_range(v, iv, ranges)}")
    if not opr.inputs:
        lines.append("    (none)")
    return NumRangeCheckerError("\n".join(lines), tracker=opr.tracker)


class NumRangeChecker(PluginBase):
    """Check every float output of every operator run by the functions compiled in
    ``comp_graph``: a NaN, an Inf or ``|value| >= max_abs_val`` stops the run, and the
    function's ``wait()`` (or call) raises :class:`NumRangeCheckerError` naming the operator,
    the var, the first bad value and its index, and the value ranges of the operator's
    inputs.

    Float outputs are float32, float16 and bfloat16; integer and quantized outputs are not
    checked. As the reference, a value passes when ``|value| < max_abs_val``. Only
    functions compiled after the checker was created are observed (see
    :class:`~megbrain.plugin.base.PluginBase`); dropping it or :meth:`detach` stops it.

    Parameters
    ----------
    comp_graph:
        The graph to observe.
    max_abs_val:
        The bound, a positive number.
    """

    def __init__(self, comp_graph, max_abs_val: float):
        try:
            bound = float(max_abs_val)
        except (TypeError, ValueError):
            raise ArgumentError(
                f"NumRangeChecker: max_abs_val must be a number, got {max_abs_val!r}"
            ) from None
        if not bound > 0:
            raise ArgumentError(f"NumRangeChecker: max_abs_val must be positive, got {bound}")
        self.max_abs_val = bound
        super().__init__(comp_graph, _RangeObserver(bound))

