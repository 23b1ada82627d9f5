"""Random operators: UniformRNG and GaussianRNG, with ``uniform_rng`` and
``gaussian_rng``.

Each operator owns a generator seeded from its param when it first runs, so a fresh graph
with the same seed gives the same sequence and successive runs advance it (as MegBrain's
per-operator megdnn RNG state). Random operators are never deduplicated nor value-inferred.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..graph import register_opr, table_param
from ..serialization import sereg
from . import param_defs as pdefs
from .base import SymbolVar, _merge_config, insert_opr
from .gen import DTypeParam, ShapeSourceOpr, shape_input
from .param_args import as_int

__all__ = ["UniformRNG", "GaussianRNG", "uniform_rng", "gaussian_rng"]


# the tables have no dtype (the reference draws float32 only): ``dtype`` is ours, and a dump
# of another dtype is refused
@dataclass(frozen=True)
@table_param(pdefs.UniformRNG)
class UniformRNGParam(DTypeParam):
    """Param of UniformRNG: the ``seed`` and the output ``dtype``."""

    dtype: np.dtype = np.dtype(np.float32)


@dataclass(frozen=True)
@table_param(pdefs.GaussianRNG)
class GaussianRNGParam(DTypeParam):
    """Param of GaussianRNG: the ``seed``, ``mean``, ``std`` and the output ``dtype``."""

    dtype: np.dtype = np.dtype(np.float32)


class _RNGBase(ShapeSourceOpr):
    """(shape): random values of that shape, from this operator's own generator."""

    value_inferable = False
    dedup = False

    def infer_dtypes(self, in_dtypes):
        dt = super().infer_dtypes(in_dtypes)[0]
        if dt.kind != "f":
            raise self.error(f"output dtype must be a float dtype, got {dt}")
        return [dt]

    def generator(self) -> np.random.Generator:
        """This operator's generator, seeded from the param on first use."""
        rng = self.__dict__.get("_rng")
        if rng is None:
            rng = self._rng = np.random.Generator(np.random.PCG64(self.param.seed))
        return rng

    def clone(self, inputs):
        new = super().clone(inputs)
        new.__dict__.pop("_rng", None)  # a copied graph starts from the seed
        return new

    def _draw(self, rng: np.random.Generator, buf: np.ndarray) -> None:
        """Fill the float32 or float64 C-contiguous ``buf`` with this operator's values."""
        raise NotImplementedError

    def _fill(self, rng: np.random.Generator, out: np.ndarray) -> None:
        buf, cast = _native(out)
        self._draw(rng, buf)
        if cast:
            np.copyto(out, buf, casting="unsafe")

    def bind(self, ins, outs):
        out = outs[0]
        return lambda: self._fill(self.generator(), out)


def _native(out: np.ndarray):
    """(array to draw into, whether to cast into ``out`` afterwards)."""
    if out.dtype in (np.float32, np.float64) and out.flags.c_contiguous:
        return out, False
    return np.empty(out.shape, np.float32), True


@register_opr
class UniformRNG(_RNGBase):
    """Uniform values in (0, 1]."""

    Param = UniformRNGParam

    def _draw(self, rng, buf):
        rng.random(dtype=buf.dtype, out=buf)
        np.subtract(1, buf, out=buf)  # [0, 1) -> (0, 1]


@register_opr
class GaussianRNG(_RNGBase):
    """Normal values of the param's mean and standard deviation."""

    Param = GaussianRNGParam

    def _draw(self, rng, buf):
        rng.standard_normal(dtype=buf.dtype, out=buf)
        p = self.param
        buf *= p.std
        buf += p.mean


# ---- serialization (megbrain/serialization/sereg.py) -------------------------------------
# The reference's RNG params have no dtype (its outputs are float32): another dtype is not
# dumped. The seed is written as given; a loaded operator starts from it, as a fresh graph.
def _rng_to_def(def_cls, names):
    def to_def(param):
        if param.dtype != np.float32:
            raise sereg.NotSerializable(
                f"{def_cls.__name__} of dtype {param.dtype}: the file's param.{def_cls.__name__} "
                "has no dtype (float32 only)"
            )
        return def_cls(**{n: getattr(param, n) for n in names})

    return to_def


sereg.register_param_opr(
    UniformRNG,
    pdefs.UniformRNG,
    to_def=_rng_to_def(pdefs.UniformRNG, ("seed",)),
    from_def=lambda d: UniformRNGParam(seed=d.seed),
)
sereg.register_param_opr(
    GaussianRNG,
    pdefs.GaussianRNG,
    to_def=_rng_to_def(pdefs.GaussianRNG, ("seed", "mean", "std")),
    from_def=lambda d: GaussianRNGParam(seed=d.seed, mean=float(d.mean), std=float(d.std)),
)


def uniform_rng(
    shape,
    seed: int = 0,
    *,
    dtype="float32",
    name=None,
    comp_node=None,
    config=None,
    comp_graph=None,
) -> SymbolVar:
    """Uniform random values in (0, 1] (registry name ``UniformRNG``).

    Parameters
    ----------
    shape : ints, SymbolVar, or ints and int vars mixed
        The output shape; plain ints need ``comp_graph`` and ``comp_node``.
    seed : int
        The seed: a fresh graph with the same seed gives the same values.
    """
    cfg = _merge_config(name, comp_node, config)
    sv = shape_input(shape, cfg, comp_graph, "uniform_rng")
    param = UniformRNGParam(as_int(seed, "uniform_rng", "seed"), dtype)
    return insert_opr(UniformRNG([sv], param, cfg))[0]


def gaussian_rng(
    shape,
    seed: int = 0,
    mean: float = 0,
    std: float = 1,
    *,
    dtype="float32",
    name=None,
    comp_node=None,
    config=None,
    comp_graph=None,
) -> SymbolVar:
    """Normal random values with ``mean`` and ``std`` (registry name ``GaussianRNG``); see
    :func:`uniform_rng` for ``shape`` and ``seed``."""
    cfg = _merge_config(name, comp_node, config)
    sv = shape_input(shape, cfg, comp_graph, "gaussian_rng")
    param = GaussianRNGParam(as_int(seed, "gaussian_rng", "seed"), float(mean), float(std), dtype)
    return insert_opr(GaussianRNG([sv], param, cfg))[0]
