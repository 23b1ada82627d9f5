"""``megbrain.nn``: modules, layers, initializations and losses for static-graph training."""

from . import functional, init
from .layers import (
    AvgPool2d,
    BatchNorm1d,
    BatchNorm2d,
    Conv2d,
    Dropout,
    Flatten,
    Linear,
    MaxPool2d,
    ReLU,
    Sigmoid,
    Tanh,
)
from .module import Buffer, Module, Parameter, Sequential, pending_updates
from .serialization import load_weights, save_weights

__all__ = [
    "AvgPool2d",
    "BatchNorm1d",
    "BatchNorm2d",
    "Buffer",
    "Conv2d",
    "Dropout",
    "Flatten",
    "Linear",
    "MaxPool2d",
    "Module",
    "Parameter",
    "ReLU",
    "Sequential",
    "Sigmoid",
    "SyncBatchNorm",
    "Tanh",
    "functional",
    "init",
    "load_weights",
    "pending_updates",
    "save_weights",
]


def __getattr__(name):
    # SyncBatchNorm lives with the MPI code (megbrain.distributed), which imports this package
    if name == "SyncBatchNorm":
        from ..distributed.sync_bn import SyncBatchNorm

        return SyncBatchNorm
    raise AttributeError(f"module 'megbrain.nn' has no attribute {name!r}")
