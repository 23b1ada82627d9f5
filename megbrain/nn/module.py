"""Modules: parameters held as SharedND, built once into a static graph."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

import numpy as np

import megbrain as mgb

__all__ = ["Parameter", "Buffer", "Module", "Sequential", "pending_updates"]


class _StateTensor(mgb.SharedND):
    """A SharedND holding a module's state from its initial value: float32, or the dtype
    given (the quantized dtype of an int8 module's weight)."""

    def __init__(self, value, comp_node="cpu0", dtype=np.float32):
        value = np.asarray(value, dtype=dtype)
        super().__init__(comp_node, value.dtype)
        self.set_value(value)


class Parameter(_StateTensor):
    """A trainable tensor (a SharedND that optimizers update in place)."""

    requires_grad = True


class Buffer(_StateTensor):
    """A non-trainable state tensor (e.g. BatchNorm running statistics)."""

    requires_grad = False


def pending_updates(graph) -> list:
    """The state vars modules updated in place in ``graph`` in training mode (BatchNorm's
    running statistics after the update); include them in the compiled outspec of a training
    step so that it updates them even when it needs no output of those modules."""
    return list(graph.internal_data.get("__nn_updates__", []))


def _add_state_update(graph, var) -> None:
    graph.internal_data.setdefault("__nn_updates__", []).append(var)


class Module:
    """Base class of layers: holds parameters, buffers and sub-modules by attribute name."""

    def __init__(self):
        object.__setattr__(self, "_params", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        for d in ("_params", "_buffers", "_modules"):
            self.__dict__[d].pop(name, None)
        if isinstance(value, Parameter):
            self._params[name] = value
        elif isinstance(value, Buffer):
            self._buffers[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        object.__setattr__(self, name, value)

    def forward(self, x):
        raise NotImplementedError

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # ---- traversal -------------------------------------------------------------------------
    def named_children(self) -> Iterator[tuple[str, Module]]:
        yield from self._modules.items()

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        """This module (named ``prefix`` without its dot) and every sub-module, depth first."""
        yield prefix.rstrip("."), self
        for n, m in self._modules.items():
            yield from m.named_modules(f"{prefix}{n}.")

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Parameter]]:
        for n, p in self._params.items():
            yield prefix + n, p
        for n, m in self._modules.items():
            yield from m.named_parameters(f"{prefix}{n}.")

    def parameters(self) -> list[Parameter]:
        return [p for _, p in self.named_parameters()]

    def named_buffers(self, prefix: str = "") -> Iterator[tuple[str, Buffer]]:
        for n, b in self._buffers.items():
            yield prefix + n, b
        for n, m in self._modules.items():
            yield from m.named_buffers(f"{prefix}{n}.")

    def train(self, mode: bool = True) -> Module:
        object.__setattr__(self, "training", bool(mode))
        for m in self._modules.values():
            m.train(mode)
        return self

    def eval(self) -> Module:
        return self.train(False)

    # ---- state -------------------------------------------------------------------------------
    def state_dict(self) -> OrderedDict:
        """Every parameter and buffer by dotted name, as numpy copies."""
        out = OrderedDict()
        for n, p in self.named_parameters():
            out[n] = p.get_value()
        for n, b in self.named_buffers():
            out[n] = b.get_value()
        return out

    def load_state_dict(self, state: dict, strict: bool = True) -> None:
        """Load values by name; everything is checked before anything is changed."""
        own = dict(self.named_parameters())
        own.update(self.named_buffers())
        missing = [k for k in own if k not in state]
        unexpected = [k for k in state if k not in own]
        if strict and (missing or unexpected):
            raise mgb.MegBrainError(
                f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}"
            )
        for k, t in own.items():
            if k in state:
                v = np.asarray(state[k])
                if v.shape != tuple(t.shape):
                    raise mgb.MegBrainError(
                        f"load_state_dict: {k} has shape {v.shape}, expected {tuple(t.shape)}"
                    )
                if not np.can_cast(v.dtype, t.dtype, "same_kind"):
                    raise mgb.MegBrainError(
                        f"load_state_dict: {k} has dtype {v.dtype}, expected {np.dtype(t.dtype)}"
                    )
        for k, t in own.items():
            if k in state:
                t.set_value(np.asarray(state[k], dtype=t.dtype))


class Sequential(Module):
    """Modules applied in order."""

    def __init__(self, *modules: Module):
        super().__init__()
        for i, m in enumerate(modules):
            setattr(self, str(i), m)

    def forward(self, x):
        for m in self._modules.values():
            x = m(x)
        return x

    def __getitem__(self, i: int) -> Module:
        return list(self._modules.values())[i]

    def __len__(self) -> int:
        return len(self._modules)
