"""Optimizers that update parameters in place with ``add_update`` inside the compiled step.

Hyper-parameters are SharedScalars, so changing them between steps (``opt.lr = 0.01``)
needs no recompile. ``minimize(loss)`` returns the update vars to put in the step's outspec.
State that the update reads (momentum buffers, moment estimates, Adam's step count) lives in
shared tensors updated by the step itself. ``before_step()`` only counts steps on the host
(``func.callbefore_func = opt.before_step``), for schedules that read ``step_count``.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

import megbrain as mgb

__all__ = ["Optimizer", "SGD", "Adam", "Adagrad", "Adadelta"]


class Optimizer:
    """Base class: parameters, hyper-parameters as SharedScalars, per-parameter slots."""

    #: ``f(param_vars, grads) -> grads`` applied before the updates; set by
    #: ``megbrain.distributed.data_parallel`` to average the gradients across ranks
    grad_transform = None

    def __init__(self, params, **hyper):
        self.params = list(params)
        if not self.params:
            raise mgb.MegBrainError(f"{type(self).__name__}: no parameters to optimize")
        self.hyper = OrderedDict((k, mgb.SharedScalar(np.float32(v))) for k, v in hyper.items())
        #: hyper-parameters whose term is left out of the compiled step (0 at construction)
        self._zero_fixed = frozenset(
            k for k in ("momentum", "weight_decay") if k in hyper and hyper[k] == 0
        )
        self.slots: OrderedDict = OrderedDict()
        self.step_count = 0
        self._cn = self.params[0].comp_node

    def __getattr__(self, name):
        hyper = self.__dict__.get("hyper", {})
        if name in hyper:
            return float(hyper[name].get())
        raise AttributeError(name)

    def __setattr__(self, name, value):
        if name in self.__dict__.get("hyper", {}):
            self.set_hyper(name, value)  # ``opt.lr = 0.01`` changes the SharedScalar
        else:
            object.__setattr__(self, name, value)

    def set_hyper(self, name: str, value: float) -> None:
        """Change a hyper-parameter (e.g. ``lr``); compiled steps see it at their next run."""
        if name not in self.hyper:
            raise mgb.MegBrainError(f"{type(self).__name__}: no hyper-parameter {name!r}")
        if name in self._zero_fixed and value != 0:
            raise mgb.MegBrainError(
                f"{type(self).__name__}: {name} was 0 at construction, so the compiled step "
                f"has no {name} term; create the optimizer with a non-zero {name} to change it"
            )
        self.hyper[name].set(np.float32(value))

    def _slot(self, i: int, name: str, init: float = 0.0) -> mgb.SharedND:
        key = f"{i}.{name}"
        s = self.slots.get(key)
        if s is None:
            p = self.params[i]
            s = mgb.make_shared(p.comp_node, value=np.full(p.shape, init, p.dtype))
            self.slots[key] = s
        return s

    def minimize(self, loss) -> list:
        """Gradient and in-place update vars for every parameter (put them in the outspec)."""
        g = loss.owner_graph
        pvars = [p.symvar(g) for p in self.params]
        grads = mgb.grad(loss, pvars)
        if self.grad_transform is not None:
            grads = self.grad_transform(pvars, grads)
        updates = []
        for i, (pv, gv) in enumerate(zip(pvars, grads)):
            if gv is None:
                continue  # the loss does not depend on this parameter
            self._cn = pv.comp_node
            updates.extend(self._update(i, g, pv, gv))
        return updates

    def _decayed(self, g, p, grad):
        """``grad + weight_decay * p`` (just ``grad`` when weight decay is left out)."""
        if "weight_decay" in self._zero_fixed:
            return grad
        return mgb.opr.elem.fuse_mul_add3(self._h(g, "weight_decay"), p, grad)

    def _h(self, g, name):
        """Hyper-parameter ``name`` as a var on the comp node of the parameter being updated."""
        return self.hyper[name]._as_sym_var(g, self._cn)

    def before_step(self) -> None:
        """Advance the host-side step counter ``step_count`` (for learning-rate schedules)."""
        self.step_count += 1

    def _update(self, i, g, pvar, grad) -> list:
        raise NotImplementedError

    def state_dict(self) -> dict:
        """Hyper-parameters, step count and slot values."""
        return {
            "hyper": {k: float(v.get()) for k, v in self.hyper.items()},
            "step": self.step_count,
            "slots": {k: s.get_value() for k, s in self.slots.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`; slots must already exist (after ``minimize``).

        Everything is checked before anything changes: a mismatched state raises
        MegBrainError and leaves the optimizer as it was.
        """
        name = type(self).__name__
        if set(state) != {"hyper", "step", "slots"}:
            raise mgb.MegBrainError(
                f"{name}.load_state_dict: expected keys hyper, step, slots; got {sorted(state)}"
            )
        slots, hyper = state["slots"], state["hyper"]
        if set(hyper) != set(self.hyper):
            raise mgb.MegBrainError(
                f"{name}.load_state_dict: hyper-parameters {sorted(hyper)} do not match "
                f"{sorted(self.hyper)}"
            )
        if set(slots) != set(self.slots):
            raise mgb.MegBrainError(
                f"{name}.load_state_dict: slots {sorted(slots)} do not match {sorted(self.slots)}"
                " (call minimize() before loading)"
            )
        for k, v in slots.items():
            if np.shape(v) != tuple(self.slots[k].shape):
                raise mgb.MegBrainError(
                    f"{name}.load_state_dict: slot {k!r} has shape {np.shape(v)}, expected "
                    f"{tuple(self.slots[k].shape)}"
                )
        for k, v in hyper.items():
            self.set_hyper(k, v)
        for k, v in slots.items():
            self.slots[k].set_value(np.asarray(v, dtype=self.slots[k].dtype))
        self.step_count = int(state["step"])


class SGD(Optimizer):
    """SGD with momentum, Nesterov momentum and weight decay (PyTorch's formulation).

    Per parameter the step is two in-place AddUpdates: ``buf := momentum*buf + d`` and
    ``p := p - lr*buf`` (``d = grad + weight_decay*p``; Nesterov steps along
    ``d + momentum*buf``). A momentum or weight decay of 0 at construction leaves its term
    out of the compiled step.
    """

    def __init__(self, params, lr, momentum=0.0, nesterov=False, weight_decay=0.0):
        if nesterov and momentum == 0:
            raise mgb.MegBrainError("SGD: nesterov needs a non-zero momentum")
        super().__init__(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
        self.nesterov = nesterov

    def _update(self, i, g, p, grad):
        d = self._decayed(g, p, grad)
        neg_lr = -self._h(g, "lr")
        if "momentum" in self._zero_fixed:
            return [mgb.opr.add_update(p, d, beta=neg_lr)]
        mom = self._h(g, "momentum")
        buf = mgb.opr.add_update(self._slot(i, "momentum_buffer").symvar(g), d, alpha=mom)
        step = mgb.opr.elem.fuse_mul_add3(mom, buf, d) if self.nesterov else buf
        return [buf, mgb.opr.add_update(p, step, beta=neg_lr)]


class Adam(Optimizer):
    """Adam with bias correction (PyTorch's formulation, L2 ``weight_decay``).

    The step count the bias corrections need is a (1,) shared tensor (slot ``"step"``)
    incremented by the compiled step itself, so every run is corrected without help.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(
            params, lr=lr, beta1=betas[0], beta2=betas[1], eps=eps, weight_decay=weight_decay
        )

    def minimize(self, loss) -> list:
        g = loss.owner_graph
        if "step" not in self.slots:
            self.slots["step"] = mgb.make_shared(self._cn, value=np.zeros(1, np.float32))
        t = self.slots["step"].symvar(g)
        self._t_new = t + 1  # the updates below read the new count; t itself is updated last
        updates = super().minimize(loss)
        return updates + [mgb.opr.add_update(t, self._t_new, alpha=0.0)]

    def _update(self, i, g, p, grad):
        h = {k: self._h(g, k) for k in ("lr", "beta1", "beta2", "eps")}
        d = self._decayed(g, p, grad)
        m = mgb.opr.add_update(
            self._slot(i, "exp_avg").symvar(g), d, alpha=h["beta1"], beta=1 - h["beta1"]
        )
        v = mgb.opr.add_update(
            self._slot(i, "exp_avg_sq").symvar(g), d * d, alpha=h["beta2"], beta=1 - h["beta2"]
        )
        bc1 = 1 - mgb.opr.elem.pow(h["beta1"], self._t_new)
        bc2 = 1 - mgb.opr.elem.pow(h["beta2"], self._t_new)
        denom = mgb.opr.sqrt(v / bc2) + h["eps"]
        return [m, v, mgb.opr.add_update(p, m / denom, beta=-h["lr"] / bc1)]


class Adagrad(Optimizer):
    """Adagrad: ``sum += d^2; p -= lr * d / (sqrt(sum) + eps)``."""

    def __init__(self, params, lr=1e-2, eps=1e-10, weight_decay=0.0):
        super().__init__(params, lr=lr, eps=eps, weight_decay=weight_decay)

    def _update(self, i, g, p, grad):
        d = self._decayed(g, p, grad)
        s = mgb.opr.add_update(self._slot(i, "sum").symvar(g), d * d)
        step = d / (mgb.opr.sqrt(s) + self._h(g, "eps"))
        return [s, mgb.opr.add_update(p, step, beta=-self._h(g, "lr"))]


class Adadelta(Optimizer):
    """Adadelta (Zeiler 2012) with PyTorch's lr scaling."""

    def __init__(self, params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.0):
        super().__init__(params, lr=lr, rho=rho, eps=eps, weight_decay=weight_decay)

    def _update(self, i, g, p, grad):
        rho, eps = self._h(g, "rho"), self._h(g, "eps")
        d = self._decayed(g, p, grad)
        sq = mgb.opr.add_update(
            self._slot(i, "square_avg").symvar(g), d * d, alpha=rho, beta=1 - rho
        )
        acc = self._slot(i, "acc_delta").symvar(g)
        delta = mgb.opr.sqrt(acc + eps) / mgb.opr.sqrt(sq + eps) * d
        return [
            sq,
            mgb.opr.add_update(acc, delta * delta, alpha=rho, beta=1 - rho),
            mgb.opr.add_update(p, delta, beta=-self._h(g, "lr")),
        ]
