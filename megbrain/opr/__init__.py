"""``mgb.opr``: the operators, one module per family, and their functions.

Importing a family module registers its operators (the deserializer creates operators by
registry name), so every family is imported here.
"""

from . import (
    basic_arith,
    blas,
    dnn,
    dnn_image,
    dnn_norm,
    gen,
    indexing,
    indexing_adv,
    io,
    linalg,
    misc,
    rand,
    tensor_manip,
    utility,
)
from .base import SymbolVar, canonize_input_vars, create_opr, insert_opr, make_opr_config
from .basic_arith import (
    elem,
    elemwise,
    fill_retain_dtype,
    mean,
    reduce_,
    reduce_general,
    sqrt,
    square,
    typecvt,
)
from .blas import batched_matrix_mul, dot, matrix_mul
from .dnn import (
    conv_bias_activation,
    convolution,
    convolution3d,
    deconvolution,
    deconvolution3d,
    pooling,
)
from .dnn_image import resize, roi_align, roi_pooling, warp_perspective
from .dnn_norm import batch_norm, batch_norm_no_statistic, lrn
from .gen import alloc, eye, linspace
from .indexing import incr_subtensor, set_subtensor
from .indexing_adv import (
    advanced_indexing,
    batched_incr_mesh_indexing,
    batched_mesh_indexing,
    batched_set_mesh_indexing,
    incr_advanced_indexing,
    incr_mesh_indexing,
    indexing_one_hot,
    indexing_remap,
    indexing_set_one_hot,
    mesh_indexing,
    param_pack_concat,
    param_pack_split,
    set_advanced_indexing,
    set_mesh_indexing,
)
from .io import copy, host2device_copy, make_immutable, shared_device_tensor
from .linalg import matrix_inverse, svd
from .misc import argmax, argmin, argsort, cond_take, cumsum, top_k
from .rand import gaussian_rng, uniform_rng
from .tensor_manip import (
    add_axis,
    broadcast,
    concat,
    dimshuffle,
    get_var_shape,
    remove_axis,
    reshape,
)
from .utility import (
    add_update,
    assert_equal,
    callback_injector,
    identity,
    mark_no_broadcast_elemwise,
    set_grad,
    virtual_dep,
    virtual_grad,
    virtual_loss,
    zero_grad,
)

__all__ = [
    "SymbolVar", "add_axis", "add_update", "advanced_indexing", "alloc", "argmax", "argmin",
    "argsort", "assert_equal", "basic_arith", "batch_norm", "batch_norm_no_statistic",
    "batched_incr_mesh_indexing", "batched_matrix_mul", "batched_mesh_indexing",
    "batched_set_mesh_indexing", "blas", "broadcast", "callback_injector", "canonize_input_vars",
    "concat", "cond_take", "conv_bias_activation", "convolution", "convolution3d",
    "deconvolution", "deconvolution3d", "dnn", "pooling", "copy", "create_opr", "cumsum",
    "dimshuffle", "dnn_image", "dnn_norm",
    "dot", "elem", "elemwise", "eye", "fill_retain_dtype", "gaussian_rng", "gen",
    "get_var_shape", "host2device_copy", "identity", "incr_advanced_indexing",
    "incr_mesh_indexing", "incr_subtensor", "indexing", "indexing_adv", "indexing_one_hot",
    "indexing_remap", "indexing_set_one_hot", "insert_opr", "io", "linalg", "linspace", "lrn",
    "make_immutable", "make_opr_config", "mark_no_broadcast_elemwise", "matrix_inverse",
    "matrix_mul", "mean", "mesh_indexing", "misc", "param_pack_concat", "param_pack_split",
    "rand", "reduce_", "reduce_general", "remove_axis", "reshape", "resize", "roi_align",
    "roi_pooling", "set_advanced_indexing", "set_grad", "set_mesh_indexing", "set_subtensor",
    "shared_device_tensor", "sqrt", "square", "svd", "tensor_manip", "top_k", "typecvt",
    "uniform_rng", "utility", "virtual_dep", "virtual_grad", "virtual_loss", "warp_perspective",
    "zero_grad",
]
