"""Epilogues fused into forward convolutions: ``out = tail(act(conv + bias))`` with a
per-channel bias, an identity, ReLU or H_SWISH activation and an elementwise tail (ReLU6 or
SiLU, fused at compile time), applied by the convolution algorithm to each block of its
output right after computing it (in the core's cache), instead of by separate elementwise
passes over the whole output.

An algorithm registered with ``epilogue=True`` takes ``epilogue=`` (an :class:`Epilogue`)
in its bind; ConvBias offers one when :func:`for_conv_bias` builds it (H_SWISH, ReLU6 or
SiLU only to the algorithms registered with ``hswish``, ``relu6``, ``silu``: :func:`accepts`).
The bias is read at every run (a view of the operator's input, never a copy), and the
activation has ELEMWISE RELU's semantics (``max(x, 0)``: NaN stays NaN), or H_SWISH's
(``min(max(x + 3, 0), 6) x / 6``, in that order); the tails are the JIT's
(:data:`TAIL_EXPRS`): ReLU6 ``min(max(x, 0), 6)`` NaN kept, SiLU ``x * sigmoid(x)`` with the
JIT's sigmoid (:func:`sigmoid`).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
from numba import njit

from .. import jit_codegen, workspace
from ..steps import Step
from .loops.nchw8c import readonly_view

__all__ = [
    "RELU6",
    "SILU",
    "TAIL_EXPRS",
    "Epilogue",
    "accepts",
    "bias_act_step",
    "epilogue_operands",
    "for_conv_bias",
    "rows_then",
    "tail_step",
]

#: the epilogue bits of the tails (after 1 bias, 2 z, 4 ReLU, 8 H_SWISH)
RELU6, SILU = 16, 32
#: the JIT expressions (:mod:`..jit_codegen`) the tails compute over their input ``("i", 0)``
TAIL_EXPRS = {
    "RELU6": (("MAX", (("c", 0.0), ("i", 0))), ("MIN", (("c", 6.0), ("t", 0)))),
    "SILU": (("SIGMOID", (("i", 0),)), ("MUL", (("i", 0), ("t", 0)))),
}

_F32 = np.dtype(np.float32)
_NO_BIAS = readonly_view(np.zeros(1, _F32))


class Epilogue(NamedTuple):
    """``tail(act(conv + bias))``: ``bias`` a 1-d view of the per-output-channel bias (of
    the output's dtype), ``relu`` whether the activation is ReLU, ``hswish`` whether it is
    H_SWISH (neither: the identity), ``relu6`` / ``silu`` whether the tail is ReLU6 / SiLU
    (applied after the activation)."""

    bias: np.ndarray
    relu: bool
    hswish: bool = False
    relu6: bool = False
    silu: bool = False


def accepts(algo, epilogue: Epilogue) -> bool:
    """Whether the registered algorithm ``algo`` (a ``ConvAlgorithm``) applies ``epilogue``:
    it takes epilogues and is registered for each of its H_SWISH, ReLU6 and SiLU."""
    return bool(algo.epilogue) and all(
        getattr(algo, k) or not getattr(epilogue, k) for k in ("hswish", "relu6", "silu")
    )


def for_conv_bias(mode: str, bias: np.ndarray, out: np.ndarray,
                  tail: str | None = None) -> Epilogue | None:  # fmt: skip
    """The epilogue of a ConvBias with activation ``mode``, bias array ``bias`` and tail
    ``tail`` (None, "RELU6" or "SILU") into ``out``, or None when it has none: an activation
    other than IDENTITY, RELU or H_SWISH, or a bias not of shape (1, OC, 1, 1) or of another
    dtype than ``out``'s."""
    if mode not in ("IDENTITY", "RELU", "H_SWISH") or out.ndim != 4 or bias.dtype != out.dtype:
        return None
    if bias.shape != (1, out.shape[1], 1, 1):
        return None
    # a view: read at every run
    return Epilogue(bias[0, :, 0, 0], mode == "RELU", mode == "H_SWISH", tail == "RELU6",
                    tail == "SILU")  # fmt: skip


def tail_step(tail: str | None, out: np.ndarray) -> Step | None:
    """The step applying ``tail`` (a :data:`TAIL_EXPRS` name) to ``out`` in place, with the
    JIT's kernel (the algorithms that do not apply it), or None without a tail."""
    if tail is None:
        return None
    return jit_codegen.bind(TAIL_EXPRS[tail], [out], out)


def _bias_act_py(block, bias, relu):
    # pragma: no cover - compiled
    for r in range(block.shape[0]):
        b = bias[r]
        for c in range(block.shape[1]):
            v = block[r, c] + b
            if relu and v < 0:  # not max(): NaN stays NaN, as np.maximum's
                v = 0.0
            block[r, c] = v


@functools.cache
def _compiled():

    return njit(nogil=True, cache=True, error_model="numpy")(_bias_act_py)


def bias_act_step(ep: Epilogue, block: np.ndarray, rows: slice) -> Step:
    """A step applying ``ep`` to the 2-d ``block`` (channels x positions of one sample) of
    output channels ``rows``, in place."""
    return functools.partial(_run_bias_act, block, ep.bias[rows], ep.relu)


def rows_then(ep: Epilogue, row0: int):
    """A :func:`gemm.matmul_step` ``then`` applying ``ep`` to a product whose output's row
    0 is output channel ``row0`` (a group's first)."""

    def then(block: np.ndarray, rows: slice) -> Step:
        return bias_act_step(ep, block, slice(row0 + rows.start, row0 + rows.stop))

    return then


def _run_bias_act(block, bias, relu) -> None:
    _compiled()(block, bias, relu)


def epilogue_operands(epilogue: Epilogue | None, steps: list) -> tuple[np.ndarray, int]:
    """The bias (a read-only C-contiguous float32 vector; a view of the epilogue's, else a
    copy that a step appended to ``steps`` refreshes at every run) and the epilogue bits
    (1 ``+ bias``, 4 ReLU, 8 H_SWISH, 16 ReLU6, 32 SiLU) a compiled NCHW loop takes for
    ``epilogue``."""
    if epilogue is None:
        return _NO_BIAS, 0
    bias = epilogue.bias
    if not bias.flags.c_contiguous:  # read at every run: copied at every run
        bias = workspace.empty(bias.shape, _F32)
        steps.append(functools.partial(np.copyto, bias, epilogue.bias))
    bits = 1 | (4 if epilogue.relu else 0) | (8 if epilogue.hswish else 0)
    return readonly_view(bias), bits | (RELU6 if epilogue.relu6 else 0) | (
        SILU if epilogue.silu else 0
    )
