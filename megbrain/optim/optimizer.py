"""Optimizers that update parameters in place with ``add_update`` inside the compiled step.

Hyper-parameters are SharedScalars, so changing them between steps needs no recompile.
``minimize(loss)`` returns the update vars to put in the step's outspec; call
``before_step()`` before each run (``func.callbefore_func = opt.before_step`` does it),
which advances the step counter that bias corrections read.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

import megbrain as mgb

__all__ = ["Optimizer", "SGD", "Adam", "Adagrad", "Adadelta"]


class Optimizer:
    """Base class: parameters, hyper-parameters as SharedScalars, per-parameter slots."""

    def __init__(self, params, **hyper):
        self.params = list(params)
        if not self.params:
            raise mgb.MegBrainError(f"{type(self).__name__}: no parameters to optimize")
        self.hyper = OrderedDict((k, mgb.SharedScalar(np.float32(v))) for k, v in hyper.items())
        self.slots: OrderedDict = OrderedDict()
        self.step_count = 0

    def __getattr__(self, name):
        hyper = self.__dict__.get("hyper", {})
        if name in hyper:
            return float(hyper[name].get())
        raise AttributeError(name)

    def set_hyper(self, name: str, value: float) -> None:
        """Change a hyper-parameter (e.g. ``lr``); compiled steps see it at their next run."""
        if name not in self.hyper:
            raise mgb.MegBrainError(f"{type(self).__name__}: no hyper-parameter {name!r}")
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
        updates = []
        for i, (pv, gv) in enumerate(zip(pvars, grads)):
            updates.extend(self._update(i, g, pv, gv))
        return updates

    def _h(self, g, name):
        return self.hyper[name]._as_sym_var(g, "cpu0")

    def before_step(self) -> None:
        """Advance the step counter (bias corrections read it)."""
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
        """Restore :meth:`state_dict`; slots must already exist (after ``minimize``)."""
        slots = state["slots"]
        for k, v in slots.items():
            if k not in self.slots:
                raise mgb.MegBrainError(f"optimizer state has unknown slot {k!r}")
            if np.shape(v) != tuple(self.slots[k].shape):
                raise mgb.MegBrainError(f"optimizer slot {k!r} has shape {np.shape(v)}")
        for k, v in state["hyper"].items():
            self.set_hyper(k, v)
        for k, v in slots.items():
            self.slots[k].set_value(np.asarray(v))
        self.step_count = int(state["step"])


class SGD(Optimizer):
    """SGD with momentum, Nesterov momentum and weight decay (PyTorch's formulation)."""

    def __init__(self, params, lr, momentum=0.0, nesterov=False, weight_decay=0.0):
        super().__init__(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
        self.nesterov = nesterov
        self._use_momentum = momentum != 0

    def _update(self, i, g, p, grad):
        lr, wd = self._h(g, "lr"), self._h(g, "weight_decay")
        d = grad + wd * p
        if not self._use_momentum:
            return [mgb.opr.add_update(p, d * lr, beta=-1.0)]
        buf = self._slot(i, "momentum_buffer").symvar(g)
        mom = self._h(g, "momentum")
        new_buf = mom * buf + d
        ub = mgb.opr.add_update(buf, new_buf, alpha=0.0)
        step = d + mom * new_buf if self.nesterov else new_buf
        return [ub, mgb.opr.add_update(p, step * lr, beta=-1.0)]


class Adam(Optimizer):
    """Adam with bias correction (the correction factors are SharedScalars set per step)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(params, lr=lr, beta1=betas[0], beta2=betas[1], eps=eps,
                         weight_decay=weight_decay, bc1=1.0, bc2=1.0)

    def before_step(self):
        super().before_step()
        t = self.step_count
        self.hyper["bc1"].set(np.float32(1 - self.beta1**t))
        self.hyper["bc2"].set(np.float32(1 - self.beta2**t))

    def _update(self, i, g, p, grad):
        h = {k: self._h(g, k) for k in self.hyper}
        d = grad + h["weight_decay"] * p
        m = self._slot(i, "exp_avg").symvar(g)
        v = self._slot(i, "exp_avg_sq").symvar(g)
        m_new = h["beta1"] * m + (1 - h["beta1"]) * d
        v_new = h["beta2"] * v + (1 - h["beta2"]) * d * d
        um = mgb.opr.add_update(m, m_new, alpha=0.0)
        uv = mgb.opr.add_update(v, v_new, alpha=0.0)
        denom = mgb.opr.sqrt(v_new / h["bc2"]) + h["eps"]
        step = h["lr"] * (m_new / h["bc1"]) / denom
        return [um, uv, mgb.opr.add_update(p, step, beta=-1.0)]


class Adagrad(Optimizer):
    """Adagrad: ``sum += g^2; p -= lr * g / (sqrt(sum) + eps)``."""

    def __init__(self, params, lr=1e-2, eps=1e-10, weight_decay=0.0):
        super().__init__(params, lr=lr, eps=eps, weight_decay=weight_decay)

    def _update(self, i, g, p, grad):
        d = grad + self._h(g, "weight_decay") * p
        s = self._slot(i, "sum").symvar(g)
        s_new = s + d * d
        us = mgb.opr.add_update(s, s_new, alpha=0.0)
        step = self._h(g, "lr") * d / (mgb.opr.sqrt(s_new) + self._h(g, "eps"))
        return [us, mgb.opr.add_update(p, step, beta=-1.0)]


class Adadelta(Optimizer):
    """Adadelta (Zeiler 2012) with PyTorch's lr scaling."""

    def __init__(self, params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.0):
        super().__init__(params, lr=lr, rho=rho, eps=eps, weight_decay=weight_decay)

    def _update(self, i, g, p, grad):
        h = {k: self._h(g, k) for k in self.hyper}
        d = grad + h["weight_decay"] * p
        sq = self._slot(i, "square_avg").symvar(g)
        acc = self._slot(i, "acc_delta").symvar(g)
        sq_new = h["rho"] * sq + (1 - h["rho"]) * d * d
        delta = mgb.opr.sqrt(acc + h["eps"]) / mgb.opr.sqrt(sq_new + h["eps"]) * d
        acc_new = h["rho"] * acc + (1 - h["rho"]) * delta * delta
        return [
            mgb.opr.add_update(sq, sq_new, alpha=0.0),
            mgb.opr.add_update(acc, acc_new, alpha=0.0),
            mgb.opr.add_update(p, h["lr"] * delta, beta=-1.0),
        ]
