"""Layers: Linear, Conv2d, BatchNorm, activations (ReLU, ReLU6, Sigmoid, Tanh), pooling,
Dropout, Flatten, and the float modules that quantization converts as units (ConvBn2d,
ConvBnRelu2d, Elemwise, the stubs)."""

from __future__ import annotations

import math

import numpy as np

import megbrain as mgb
from megbrain.graph import static_shape
from megbrain.graph.param_def import per_axis_fields
from megbrain.tensor import SubTensorSpec, TensorLayout

from . import init
from .module import Buffer, Module, Parameter, _add_state_update

__all__ = [
    "Linear",
    "Conv2d",
    "BatchNorm1d",
    "BatchNorm2d",
    "ReLU",
    "ReLU6",
    "Sigmoid",
    "Tanh",
    "MaxPool2d",
    "AvgPool2d",
    "Dropout",
    "Flatten",
    "ConvRelu2d",
    "ConvBn2d",
    "ConvBnRelu2d",
    "Elemwise",
    "QuantStub",
    "DequantStub",
]


def _known_shape(x, who: str) -> tuple:
    """The shape of ``x`` the layer ``who`` builds from, which must be static (``imm_shape``
    would say ``()`` while it is unknown)."""
    shape = static_shape(x.node)
    if shape is None:
        raise mgb.MegBrainError(f"{who}: the shape of input {x.name!r} must be static")
    return tuple(shape)


def _param_var(p, x):
    """The var of parameter ``p`` in the graph of ``x``."""
    return p.symvar(x.owner_graph)


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)


class Linear(Module):
    """``y = x @ W.T + b`` with W of shape (out_features, in_features)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, rng=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(init.kaiming_uniform((out_features, in_features), rng=rng))
        if bias:
            bound = 1 / math.sqrt(in_features)
            b = (rng or init.default_rng()).uniform(-bound, bound, out_features)
            self.bias = Parameter(b.astype(np.float32))
        else:
            self.bias = None

    def forward(self, x):
        b = None if self.bias is None else _param_var(self.bias, x)
        return self._linear(x, _param_var(self.weight, x), b)

    def _linear(self, x, w, b):
        """``x @ w.T + b`` on the given weight and bias vars (``b`` may be None)."""
        y = mgb.opr.matrix_mul(x, w, transposeB=True)
        return y if b is None else y + b.reshape(1, self.out_features)


class Conv2d(Module):
    """2-D convolution over NCHW input, weight (out, in/groups, kh, kw)."""

    def __init__(
        self,
        in_channels,
        out_channels,
        kernel_size,
        stride=1,
        padding=0,
        dilation=1,
        groups=1,
        bias=True,
        rng=None,
    ):
        super().__init__()
        kh, kw = _pair(kernel_size)
        self.stride, self.padding, self.dilation = _pair(stride), _pair(padding), _pair(dilation)
        self.groups, self.out_channels = groups, out_channels
        shape = (out_channels, in_channels // groups, kh, kw)
        self.weight = Parameter(init.kaiming_uniform(shape, rng=rng))
        if bias:
            bound = 1 / math.sqrt(in_channels // groups * kh * kw)
            b = (rng or init.default_rng()).uniform(-bound, bound, (1, out_channels, 1, 1))
            self.bias = Parameter(b.astype(np.float32))
        else:
            self.bias = None

    def forward(self, x):
        b = None if self.bias is None else _param_var(self.bias, x)
        return self._conv(x, _param_var(self.weight, x), b)

    def _conv(self, x, w, b):
        """The convolution of ``x`` with the (out, in/groups, kh, kw) weight var ``w``, plus
        the (1, out, 1, 1) bias var ``b`` (may be None)."""
        if self.groups > 1:
            oc, icg, kh, kw = self.weight.shape
            w = w.reshape(self.groups, oc // self.groups, icg, kh, kw)
        y = mgb.opr.convolution(
            x,
            w,
            **per_axis_fields(pad=self.padding, stride=self.stride, dilate=self.dilation),
            sparse="GROUP" if self.groups > 1 else "DENSE",
        )
        return y if b is None else y + b


class _BatchNorm(Module):
    """Batch normalization; while training, the BatchNorm operator updates the running
    statistics in place (``running = (1 - momentum) * running + momentum * batch``, the
    variance unbiased), each time a compiled function containing it runs."""

    def __init__(
        self, num_features: int, eps: float = 1e-5, momentum: float = 0.1, affine: bool = True
    ):
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.weight = Parameter(np.ones(num_features, np.float32)) if affine else None
        self.bias = Parameter(np.zeros(num_features, np.float32)) if affine else None
        self.running_mean = Buffer(np.zeros(num_features, np.float32))
        self.running_var = Buffer(np.ones(num_features, np.float32))
        #: buffer name -> (storage pointer, its (1, C, 1, 1) view): see _stat_var
        object.__setattr__(self, "_stat_views", {})

    def _bshape(self, ndim: int) -> tuple:
        shape = [1] * ndim
        shape[1] = self.num_features
        return tuple(shape)

    def _stat_var(self, name: str, graph):
        """Buffer ``name`` (shape (C,)) as a (1, C, 1, 1) shared var over the same memory.

        The BatchNorm operator needs its statistics in the param shape and as shared tensors
        (it writes into them), while the buffers keep the (C,) shape of ``state_dict``. One
        view per buffer storage, so that a graph sees one var per buffer.
        """
        buf = getattr(self, name)
        dev = buf.dev_tensor
        cached = self._stat_views.get(name)
        if cached is None or cached[0] != (id(dev), dev.raw_ptr):
            layout = TensorLayout((1, self.num_features, 1, 1), dev.dtype)
            view = dev.sub(SubTensorSpec.make_from_layout(layout))
            cached = self._stat_views[name] = ((id(dev), dev.raw_ptr), view)
        return mgb.opr.shared_device_tensor(graph, cached[1], name=name)

    def forward(self, x):
        shape = _known_shape(x, type(self).__name__)
        ndim = len(shape)
        bshape = self._bshape(ndim)
        if self.training:
            g, c = x.owner_graph, self.num_features
            pshape = (1, c, 1, 1)
            # (N, C) and (N, C, L) are normalized as (N, C, 1, 1) and (N, C, L, 1)
            x4 = x if ndim == 4 else x.reshape(*shape, *(1,) * (4 - ndim))
            if self.weight is not None:
                gamma = _param_var(self.weight, x).reshape(*pshape)
                beta = _param_var(self.bias, x).reshape(*pshape)
            else:
                gamma = mgb.make_immutable(x.comp_node, g, np.ones(pshape, np.float32))
                beta = mgb.make_immutable(x.comp_node, g, np.zeros(pshape, np.float32))
            outs = mgb.opr.batch_norm(
                x4,
                gamma,
                beta,
                self._stat_var("running_mean", g),
                self._stat_var("running_var", g),
                param_dim="DIM_1C11",
                fwd_mode="TRAINING",
                epsilon=self.eps,
                avg_factor=self.momentum,
            )
            # the statistics after the update: compiling them (pending_updates) makes a
            # function run the update even when it does not need y
            for v in outs[:2]:
                _add_state_update(g, v)
            y = outs[-1]
            return y if ndim == 4 else y.reshape(*shape)
        # eval: composed from differentiable operators (BatchNorm's INFERENCE mode has no
        # gradient)
        mean = _param_var(self.running_mean, x).reshape(*bshape)
        var = _param_var(self.running_var, x).reshape(*bshape)
        y = (x - mean) / mgb.opr.sqrt(var + self.eps)
        if self.weight is not None:
            gamma = _param_var(self.weight, x).reshape(*bshape)
            y = y * gamma + _param_var(self.bias, x).reshape(*bshape)
        return y


class BatchNorm1d(_BatchNorm):
    """BatchNorm over (N, C) or (N, C, L) input."""


class BatchNorm2d(_BatchNorm):
    """BatchNorm over (N, C, H, W) input."""


class ReLU(Module):
    def forward(self, x):
        return mgb.opr.elem.relu(x)


class ReLU6(Module):
    """``min(max(x, 0), 6)``: MobileNetV2's activation."""

    def forward(self, x):
        return mgb.opr.elem.min(mgb.opr.elem.relu(x), 6.0)


class Sigmoid(Module):
    def forward(self, x):
        return mgb.opr.elem.sigmoid(x)


class Tanh(Module):
    def forward(self, x):
        return mgb.opr.elem.tanh(x)


class _Pool2d(Module):
    mode = "MAX"

    def __init__(self, kernel_size, stride=None, padding=0):
        super().__init__()
        self.kernel = _pair(kernel_size)
        self.stride = _pair(stride if stride is not None else kernel_size)
        self.padding = _pair(padding)

    def forward(self, x):
        return mgb.opr.pooling(
            x,
            mode=self.mode,
            **per_axis_fields(window=self.kernel, stride=self.stride, pad=self.padding),
        )


class MaxPool2d(_Pool2d):
    mode = "MAX"


class AvgPool2d(_Pool2d):
    mode = "AVERAGE_COUNT_EXCLUDE_PADDING"


class Dropout(Module):
    """Zeroes elements with probability ``p`` while training (seeded), scales by 1/(1-p).

    The mask comes from a UniformRNG operator seeded with ``seed`` (by default drawn from
    :func:`init.default_rng`, so that two Dropout layers differ and a re-seeded model
    repeats); each run of the compiled step draws a new mask.
    """

    def __init__(self, p: float = 0.5, seed: int | None = None):
        super().__init__()
        if not 0 <= p < 1:
            raise mgb.MegBrainError(f"Dropout: p must be in [0, 1), got {p}")
        if seed is None:
            seed = int(init.default_rng().integers(2**31))
        self.p, self.seed = p, seed

    def forward(self, x):
        if not self.training or self.p == 0:
            return x
        u = mgb.opr.uniform_rng(x.shape, seed=self.seed)
        keep = mgb.opr.elemwise(self.p, u, mode="LT")
        return x * keep * (1.0 / (1 - self.p))


class Flatten(Module):
    """(N, ...) -> (N, prod(...))."""

    def forward(self, x):
        shp = _known_shape(x, "Flatten")
        return x.reshape(-1, int(np.prod(shp[1:])))


# ---- the units of quantization (megbrain.nn.quantization converts each as a whole) ---------
class ConvRelu2d(Conv2d):
    """:class:`Conv2d` then ReLU, one unit (one ConvBias with RELU once quantized)."""

    def forward(self, x):
        return mgb.opr.elem.relu(super().forward(x))


class ConvBn2d(Module):
    """Conv2d then BatchNorm2d (``conv`` and ``bn``), one unit so that quantization can fold
    the normalization into the convolution's weight and bias.

    The arguments are :class:`Conv2d`'s (``bias`` False by default: the normalization's
    shift replaces it), then BatchNorm2d's ``eps`` and ``momentum``.
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 dilation=1, groups=1, bias=False, eps=1e-5, momentum=0.1, rng=None):  # fmt: skip
        super().__init__()
        self.conv = Conv2d(in_channels, out_channels, kernel_size, stride, padding, dilation,
                           groups, bias, rng)  # fmt: skip
        self.bn = BatchNorm2d(out_channels, eps, momentum)

    def forward(self, x):
        return self.bn(self.conv(x))


class ConvBnRelu2d(ConvBn2d):
    """:class:`ConvBn2d` then ReLU."""

    def forward(self, x):
        return mgb.opr.elem.relu(super().forward(x))


class Elemwise(Module):
    """An Elemwise operator as a module (``method``: its mode, e.g. ``"ADD"``,
    ``"FUSE_ADD_RELU"``, ``"MUL"``), so that quantization gives it an output scale and runs
    it as the ``Q`` mode of ElemwiseMultiType."""

    def __init__(self, method: str):
        super().__init__()
        self.method = mgb.opr_param_defs.Elemwise.Mode.convert(method).name

    def forward(self, *xs):
        return mgb.opr.elemwise(*xs, mode=self.method)


class QuantStub(Module):
    """Where the int8 part of a network begins: the identity in float, the quantization of
    its input once the network is quantized."""

    def forward(self, x):
        return x


class DequantStub(Module):
    """Where the int8 part of a network ends: the identity in float, the conversion back
    to float32 once the network is quantized."""

    def forward(self, x):
        return x
