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
from .sync_bn import SyncBatchNorm

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
