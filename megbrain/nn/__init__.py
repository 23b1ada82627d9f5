"""``megbrain.nn``: modules, layers, initializations and losses for static-graph training."""

from . import functional, init, quantization
from .layers import (
    AvgPool2d,
    BatchNorm1d,
    BatchNorm2d,
    Conv2d,
    ConvBn2d,
    ConvBnRelu2d,
    ConvRelu2d,
    DequantStub,
    Dropout,
    Elemwise,
    Flatten,
    Linear,
    MaxPool2d,
    QuantStub,
    ReLU,
    ReLU6,
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
    "ConvBn2d",
    "ConvBnRelu2d",
    "ConvRelu2d",
    "DequantStub",
    "Dropout",
    "Elemwise",
    "Flatten",
    "Linear",
    "MaxPool2d",
    "Module",
    "Parameter",
    "QuantStub",
    "ReLU",
    "ReLU6",
    "Sequential",
    "Sigmoid",
    "SyncBatchNorm",
    "Tanh",
    "functional",
    "init",
    "load_weights",
    "pending_updates",
    "quantization",
    "save_weights",
]
