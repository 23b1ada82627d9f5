"""Convolution kernels, laid out like MegDNN's ``fallback/conv_bias``: the shared geometry
(:mod:`.common`), the algorithm registry and execution policy (:mod:`.registry`), one
self-registering module per algorithm family (:mod:`.im2col`, :mod:`.bwd_data`,
:mod:`.bwd_filter`, :mod:`.nchw8c`, :mod:`.winograd`, :mod:`.direct`, :mod:`.grouped`,
:mod:`.depthwise_bwd`, :mod:`.pointwise`, :mod:`.tapwise`; :mod:`.nchw88` and
:mod:`.channelwise88` for the NCHW88 layout), their compiled loops (:mod:`.loops`) and the
public binds (:mod:`.binds`).

Importing the package registers every algorithm, in the order below (registration order
breaks priority ties), so that a registry lookup always sees them all.
"""

# isort: off
from . import im2col, bwd_data, bwd_filter, nchw8c, winograd, direct, grouped  # noqa: F401
from . import depthwise_bwd, pointwise, channelwise, tapwise  # noqa: F401
# isort: on
