"""``megbrain.optim``: optimizers updating parameters in place inside the compiled step."""

from .optimizer import SGD, Adadelta, Adagrad, Adam, Optimizer

__all__ = ["Adadelta", "Adagrad", "Adam", "Optimizer", "SGD"]
