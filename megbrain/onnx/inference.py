"""``megbrain.onnx.load_inference``: an ONNX model as a fast inference function, with the
inference passes chosen for the host (what :func:`~megbrain.onnx.load` leaves to the user).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import numpy as np

import megbrain as mgb
from megbrain.gopt.nchw4 import layout_flag
from megbrain.graph.static_infer import static_shape

from .loader import _model_of, load

__all__ = ["InferenceFunction", "load_inference"]


class InferenceFunction:
    """A compiled ONNX model: call it with the model's inputs, get its outputs.

    Built by :func:`load_inference`.  ``inputs`` maps the model's input names to their
    ``make_arg`` vars, ``outputs`` its output names to the optimized vars, in the model's
    order; ``graph`` is the graph holding them and ``function`` the compiled function.
    """

    def __init__(self, graph, inputs, outputs, function, fed, scalars):
        self.graph = graph
        self.inputs = inputs
        self.outputs = outputs
        self.function = function
        self._fed = fed  # the inputs some output depends on: the function's arguments
        self._scalars = scalars  # per output: the model declares it 0-d (held as (1,))

    @property
    def input_names(self) -> list[str]:
        """The model's input names, in the order of positional arguments."""
        return list(self.inputs)

    @property
    def output_names(self) -> list[str]:
        """The model's output names, in the order of the returned arrays."""
        return list(self.outputs)

    def __call__(self, *args, **kwargs) -> list[np.ndarray]:
        """Run the model.

        Parameters
        ----------
        *args, **kwargs:
            The inputs' values (array-likes), positionally in :attr:`input_names` order, or
            by name.

        Returns
        -------
        list of numpy.ndarray
            One array per model output, in :attr:`output_names` order (as onnxruntime's
            ``InferenceSession.run``).
        """
        names = self.input_names
        if len(args) > len(names):
            raise TypeError(f"the model takes {len(names)} input(s), got {len(args)}")
        values = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in self.inputs:
                raise TypeError(f"unknown input {k!r}; the model's inputs are {names}")
            if k in values:
                raise TypeError(f"input {k!r} given twice")
            values[k] = v
        missing = [k for k in names if k not in values]
        if missing:
            raise TypeError(f"missing input(s) {missing}")
        res = self.function(*[values[k] for k in self._fed])
        if len(self.outputs) == 1 and not isinstance(res, (list, tuple)):
            res = [res]
        return [
            np.asarray(r).reshape(()) if scalar else np.asarray(r)
            for r, scalar in zip(res, self._scalars)
        ]

    def __repr__(self) -> str:
        return f"InferenceFunction(inputs={self.input_names}, outputs={self.output_names})"


def load_inference(
    path_or_model,
    *,
    comp_node: str = "cpu0",
    graph=None,
    static_inputs: Mapping[str, np.ndarray] | None = None,
    warm_up: bool = True,
) -> InferenceFunction:
    """Load an ONNX model and compile it for fast inference.

    The model is built with :func:`~megbrain.onnx.load`, then optimized with
    :func:`megbrain.optimize_for_inference` (BatchNorm and constants folded; convolution,
    bias, residual add and activation fused into ConvBias; the convolutions whose channels
    per group are multiples of 8 and the operators between them in the channel-blocked NCHW88
    layout, or, for an int8 graph whose QuantizedS8 convolutions all take it on a CPU with
    AVX-512 VNNI, those in NCHW4: :func:`megbrain.gopt.nchw4.layout_flag`), compiled with
    JIT fusion of the elementwise chains (``graph_opt.jit``) and with the folded filters
    packed once for the host's kernels (``graph_opt.weight_preprocess``). The parameters
    are constants of the function: to fine-tune a model, use ``load``.

    With ``warm_up``, the function is then run once on zeros (the static inputs on their
    values), so that the work of a first call is done at load: the memory plan, the binding
    of the kernels (loading or compiling their machine code), the packing of the constant
    filters, the kernel threads, the first touch of the arena.  A run computes nothing that
    the next one reads, so the results are those of a function never run; a model whose
    outputs draw random numbers, or whose inputs' shapes are not all known, is not run.

    Parameters
    ----------
    path_or_model:
        A file path, the serialized bytes or an ``onnx.ModelProto``.
    comp_node:
        The comp node every operator and tensor is placed on.
    graph:
        The CompGraph to build into (for instance one a profiler observes); a new one when
        None.  Its ``graph_opt.jit`` and ``graph_opt.weight_preprocess`` options are set.
    static_inputs:
        Values for some of the model's inputs, known at load (see ``load``); they are
        still inputs of the function.
    warm_up:
        Run the function once at load (see above); its cost is then the load's, not the
        first call's.

    Returns
    -------
    InferenceFunction
        Called with the inputs' values (positionally in the model's order, or by name), it
        returns the list of output arrays in the model's order (a 0-d output as a 0-d
        array).

    Raises
    ------
    ONNXConversionError
        When ``load`` refuses the model.

    Examples
    --------
    >>> f = megbrain.onnx.load_inference("resnet18.onnx")      # doctest: +SKIP
    >>> (logits,) = f(image)                                   # doctest: +SKIP
    """
    model = _model_of(path_or_model)
    res = load(model, comp_node=comp_node, graph=graph, static_inputs=static_inputs)
    names = list(res.outputs)
    outs = [res.outputs[n] for n in names]
    outs = mgb.optimize_for_inference(
        outs,
        fuse_conv_bias_nonlinearity=True,
        fuse_conv_bias_with_z=True,
        **{layout_flag(outs): True},
    )
    res.graph.set_option("graph_opt.jit", 1)
    # the parameters are the function's constants (no one holds the shared tensors
    # optimize_for_inference folded them into), so the convolutions may pack them once
    res.graph.set_option("graph_opt.weight_preprocess", 1)
    # an input no output reads is accepted and ignored, as onnxruntime does
    used = {v.id for v in mgb.cgtools.get_dep_vars(outs, "Host2DeviceCopy")}
    fed = [k for k, v in res.inputs.items() if v.id in used]
    func = res.graph.compile([res.inputs[k] for k in fed], [mgb.copy_output(v) for v in outs])
    declared = {vi.name: vi.type.tensor_type for vi in model.graph.output}
    scalars = [declared[n].HasField("shape") and not declared[n].shape.dim for n in names]
    if warm_up:
        static = set(static_inputs or ())
        _warm_up(func, [(res.inputs[k], k in static) for k in fed], outs)
    return InferenceFunction(
        res.graph, dict(res.inputs), dict(zip(names, outs)), func, fed, scalars
    )


#: the operators whose output differs from one run to the next: a run advances their generator
_STATEFUL_TYPES = ("UniformRNG", "GaussianRNG")


def _warm_up(func, args, outs) -> None:
    """Run ``func`` once on zeros for its arguments ``args`` (``(make_arg var, static)``
    pairs; a static input on the value it holds), unless an output depends on an operator
    of :data:`_STATEFUL_TYPES` or an input's shape is not static."""
    if mgb.cgtools.get_dep_vars(outs, _STATEFUL_TYPES):
        return
    feed = []
    for v, static in args:
        if static:
            feed.append(v.get_value())
            continue
        shape = static_shape(v.node)
        if shape is None:
            return
        feed.append(np.zeros(shape, v.dtype))
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")  # zeros' divisions by zero are not the user's
            func(*feed)
    except Exception:  # noqa: BLE001, S110 - zeros a model rejects (an index, a divisor):
        pass  # the first call does the work instead, and reports its own inputs' error
