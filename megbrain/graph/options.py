"""Graph options: one record with a documented field each."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields

import numpy as np

from ..errors import ArgumentError, MegBrainError

__all__ = ["GraphOptions", "OPTION_ALIASES"]

OPTION_ALIASES = {"log_static_mem_alloc": "log_level", "enable_async_exec": "async_exec_level"}


def _integer(val, name: str) -> int:
    """``val`` as the int the reference's ``int(val)`` gives, refusing what it would change:
    a non-integral float (``1.5``), inf/nan, or anything ``int()`` can not read."""
    if isinstance(val, (int, np.integer)):
        return int(val)
    if isinstance(val, (float, np.floating)):
        if not np.isfinite(val) or val != int(val):
            raise ArgumentError(f"set_option({name!r}): {val!r} is not an integer")
        return int(val)
    if isinstance(val, str):
        try:
            return int(val)
        except ValueError:
            raise ArgumentError(
                f"set_option({name!r}): {val!r} is not an integer (an int, or a str of one)"
            ) from None
    raise ArgumentError(
        f"set_option({name!r}): expected an int, got {val!r} of type {type(val).__name__}"
    )


def _c_int(bits: int, signed: bool):
    """Converter to a C integer field of ``bits`` bits.

    The reference cast the value to the field's type, wrapping silently
    (``graph_opt_level=1e30`` became 0); a value the field can not hold is refused instead.
    """
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    kind = f"{'' if signed else 'u'}int{bits}"

    def conv(val, name: str) -> int:
        v = _integer(val, name)
        if not lo <= v <= hi:
            raise ArgumentError(
                f"set_option({name!r}): {val!r} is out of range [{lo}, {hi}] of the option's "
                f"{kind} field"
            )
        return v

    return conv


def _BOOL(val, name: str) -> bool:  # noqa: N802 - a converter table entry, like _U8
    return bool(_integer(val, name))


_U8 = _c_int(8, False)
_U16 = _c_int(16, False)
_I16 = _c_int(16, True)
_I32 = _c_int(32, True)


@dataclass
class SeqOptOptions:
    #: Memory forwarding: outputs alias inputs (reshape, subtensor...) and elemwise writes in place.
    enable_mem_plan_opt: bool = True
    #: The static memory reuse allocator; off gives every var its own chunk.
    enable_mem_reuse_alloc: bool = True
    #: Comp-node optimisation of the sequence (kept for compatibility; no effect on CPU).
    enable_seq_comp_node_opt: bool = True


@dataclass
class GraphOptOptions:
    #: JIT fusion level: 1 fuses elemwise chains, 2 also the reductions that close them.
    jit: int = 0
    #: TensorRT replacement; accepted and ignored (no TensorRT backend).
    tensorrt: bool = False
    #: Convolutions may prepare a parameter filter (SharedDeviceTensor or
    #: MultipleDeviceTensorHolder output) once, at their first run, and reuse it: a promise
    #: that the parameters are not written after that run (an ImmutableTensor filter is
    #: prepared once anyway). For inference; costs a packed copy of each such filter.
    weight_preprocess: bool = False


@dataclass
class SublinearMemConfig:
    #: Memory lower bound for the genetic search.
    lb_memory: int = 0
    #: Genetic algorithm iterations.
    genetic_nr_iter: int = 0
    #: Genetic algorithm pool size.
    genetic_pool_size: int = 20
    #: Number of split candidates tried.
    thresh_nr_try: int = 10
    #: Worker threads of the search.
    num_worker: int = field(default_factory=lambda: max(1, (os.cpu_count() or 2) // 2))


@dataclass
class GraphOptions:
    """Options of one computing graph (``ComputingGraph::Options``)."""

    seq_opt: SeqOptOptions = field(default_factory=SeqOptOptions)
    graph_opt: GraphOptOptions = field(default_factory=GraphOptOptions)
    sublinear_mem_cofig: SublinearMemConfig = field(default_factory=SublinearMemConfig)
    #: Allocate every var on demand, with no static plan.
    force_dynamic_alloc: bool = False
    #: Reshape dynamically shaped grads whose wrt has a static shape.
    enable_grad_var_static_reshape: bool = False
    #: 0: run on the caller's thread; 1: dispatch to comp node workers when more than one
    #: comp node has work in a run; mask 0b10: also for a single CPU comp node; 0b100: always.
    async_exec_level: int = 1
    #: 0 disabled; 1 arithmetic simplification while building; 2 also global passes before
    #: compile (and the threshold of the VirtualGrad default); 3 also JIT; negative: check.
    graph_opt_level: int = 2
    #: Maximum allreduce pack size in MB (no distributed backend: stored only).
    allreduce_pack_max_size: int = 0
    #: Do not pack the first n allreduces.
    allreduce_pack_ignore_first: int = 2
    #: Check vars for writes outside their buffers on the first run.
    var_sanity_check_first_run: bool = True
    #: Keep the initial algorithm choice when shapes change (PROFILE strategy).
    no_profiling_on_shape_change: bool = False
    #: Allocate static memory right after compile instead of at the first execute.
    allocate_static_mem_after_graph_compile: bool = False
    #: 0 silent; 1 memory plan and optimizer summaries; 2 also every var replacement.
    log_level: int = 1
    #: Recompute cheap activations in the backward pass to cut peak memory.
    enable_sublinear_memory_opt: bool = False
    #: Defragment when a dynamic allocation fails.
    enable_var_mem_defragment: bool = True
    #: Evaluate each operator as soon as it is inserted.
    eager_evaluation: bool = False
    #: Swap memory to the host.
    enable_memory_swap: bool = False
    #: ``{var: [dep, ...]}``: whenever var is computed, its deps are computed too.
    extra_vardeps: dict = field(default_factory=dict)

    # The settable names and their C field converters (SET_CG_OPTION).
    _SETTABLE = {
        "seq_opt.enable_mem_plan_opt": _BOOL,
        "seq_opt.enable_mem_reuse_alloc": _BOOL,
        "seq_opt.enable_seq_comp_node_opt": _BOOL,
        "force_dynamic_alloc": _BOOL,
        "enable_grad_var_static_reshape": _BOOL,
        "async_exec_level": _U16,
        "graph_opt.jit": _U8,
        "graph_opt.tensorrt": _BOOL,
        "graph_opt.weight_preprocess": _BOOL,
        "graph_opt_level": _I16,
        "allreduce_pack_max_size": _I16,
        "allreduce_pack_ignore_first": _I16,
        "var_sanity_check_first_run": _BOOL,
        "no_profiling_on_shape_change": _BOOL,
        "allocate_static_mem_after_graph_compile": _BOOL,
        "log_level": _U16,
        "enable_sublinear_memory_opt": _BOOL,
        "sublinear_mem_cofig.lb_memory": _I32,
        "sublinear_mem_cofig.genetic_nr_iter": _I32,
        "sublinear_mem_cofig.genetic_pool_size": _I32,
        "sublinear_mem_cofig.thresh_nr_try": _I32,
        "sublinear_mem_cofig.num_worker": _I32,
        "enable_var_mem_defragment": _BOOL,
        "eager_evaluation": _BOOL,
        "enable_memory_swap": _BOOL,
    }

    @classmethod
    def settable_names(cls) -> list[str]:
        """Every name accepted by :meth:`set`."""
        return list(cls._SETTABLE)

    def _locate(self, name: str):
        name = OPTION_ALIASES.get(name, name)
        conv = self._SETTABLE.get(name)
        if conv is None:
            raise MegBrainError(f"invalid computing graph option name: {name}")
        obj = self
        *path, leaf = name.split(".")
        for p in path:
            obj = getattr(obj, p)
        return obj, leaf, conv

    def get(self, name: str):
        """The value of option ``name`` (dotted, aliases allowed)."""
        obj, leaf, _ = self._locate(name)
        return getattr(obj, leaf)

    def set(self, name: str, val) -> int | bool:
        """Set option ``name``; return the old value.

        Parameters
        ----------
        name : str
            The option (dotted, aliases allowed).
        val : int, bool, integral float or str of an int
            The new value, read as ``int(val)`` as the reference does.

        Returns
        -------
        int or bool
            The previous value.

        Raises
        ------
        MegBrainError
            For an unknown name.
        ArgumentError
            For a value that is not an integer (``1.5``, ``"high"``) or that the option's C
            field can not hold (``graph_opt_level=1e30``, ``graph_opt.jit=257``).
        """
        obj, leaf, conv = self._locate(name)
        old = getattr(obj, leaf)
        setattr(obj, leaf, conv(val, name))
        return old

    def copy(self) -> GraphOptions:
        """A deep copy (extra_vardeps is not copied: it refers to vars of one graph)."""
        new = GraphOptions()
        for f in fields(self):
            if f.name == "extra_vardeps":
                continue
            v = getattr(self, f.name)
            if hasattr(v, "__dataclass_fields__"):
                v = type(v)(**{ff.name: getattr(v, ff.name) for ff in fields(v)})
            setattr(new, f.name, v)
        return new
