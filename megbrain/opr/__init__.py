"""``mgb.opr``: the operators, one module per family, and their functions.

Importing a family module registers its operators (the deserializer creates operators by
registry name), so every family is imported here, in a fixed order: a family imports
``base``, the helper layer ``_internal`` and only the families before it (``FAMILIES``);
what it builds from a later family it reaches through ``_internal``'s builders. SymbolVar's
operator methods are bound last (``symbolvar_methods``), once every family is loaded.
"""

# isort: off
# in the order of FAMILIES (below)
from . import io, tensor_manip, relayout, basic_arith, grad, utility  # noqa: F401
from . import basic_arith_grad  # noqa: F401
from . import indexing, indexing_adv, param_pack, misc, gen, rand, blas, linalg  # noqa: F401
from . import elemwise_multi_type as _emt  # noqa: F401 - the name is the function's
from . import dnn, dnn_conv_bias, dnn_pool, dnn_local, dnn_norm, dnn_image  # noqa: F401
from . import jit, cond, loop, collective, craniotome, craniotome_desc  # noqa: F401
from . import operator_handle  # noqa: F401
from . import symbolvar_methods  # noqa: F401

# isort: on
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
from .blas import batched_matrix_mul, batched_matrix_mul_v0, dot, matrix_mul, matrix_mul_v0
from .collective import collective_comm, remote_recv, remote_send
from .cond import (
    cond_exec_mark,
    cond_exec_mark_if_need,
    cond_exec_merge,
    cond_exec_pred,
    cond_exec_pred_logical,
)
from .dnn import (
    convolution,
    convolution3d,
    convolution_v0,
    deconvolution,
    deconvolution3d,
    deconvolution_v0,
)
from .dnn_conv_bias import conv_bias_activation, conv_bias_activation_v1
from .dnn_image import resize, roi_align, roi_pooling, warp_perspective
from .dnn_local import group_local, local
from .dnn_norm import batch_norm, batch_norm_no_statistic, lrn
from .dnn_pool import pooling
from .elemwise_multi_type import elemwise_multi_type
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
    set_advanced_indexing,
    set_mesh_indexing,
)
from .io import copy, host2device_copy, make_immutable, shared_device_tensor
from .linalg import matrix_inverse, svd
from .loop import LoopDesc, make_loop
from .misc import argmax, argmin, argsort, cond_take, cumsum, top_k
from .param_pack import param_pack_concat, param_pack_split
from .rand import gaussian_rng, uniform_rng
from .relayout import relayout_format
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
    persistent_output_storage,
    require_input_dynamic_storage,
    set_grad,
    symvar_from_shared_nd,
    timestamp,
    virtual_dep,
    virtual_grad,
    virtual_loss,
    zero_grad,
)

#: the family order: a family imports only the helper layer and the families before it
FAMILIES = (
    "io", "tensor_manip", "relayout", "basic_arith", "grad", "utility", "basic_arith_grad",
    "indexing", "indexing_adv", "param_pack", "misc", "gen", "rand", "blas", "linalg",
    "elemwise_multi_type", "dnn", "dnn_conv_bias", "dnn_pool", "dnn_local", "dnn_norm",
    "dnn_image", "jit", "cond", "loop", "collective", "craniotome", "craniotome_desc",
    "operator_handle", "symbolvar_methods",
)  # fmt: skip

__all__ = [
    "SymbolVar",
    "add_axis",
    "add_update",
    "advanced_indexing",
    "alloc",
    "argmax",
    "argmin",
    "argsort",
    "assert_equal",
    "basic_arith",
    "batch_norm",
    "batch_norm_no_statistic",
    "batched_incr_mesh_indexing",
    "batched_matrix_mul",
    "batched_matrix_mul_v0",
    "batched_mesh_indexing",
    "batched_set_mesh_indexing",
    "blas",
    "broadcast",
    "callback_injector",
    "canonize_input_vars",
    "concat",
    "cond",
    "collective",
    "collective_comm",
    "cond_exec_mark",
    "cond_exec_mark_if_need",
    "cond_exec_merge",
    "cond_exec_pred",
    "cond_exec_pred_logical",
    "cond_take",
    "craniotome",
    "conv_bias_activation",
    "conv_bias_activation_v1",
    "convolution",
    "convolution3d",
    "convolution_v0",
    "deconvolution",
    "deconvolution3d",
    "deconvolution_v0",
    "dnn",
    "pooling",
    "copy",
    "create_opr",
    "cumsum",
    "dimshuffle",
    "dnn_image",
    "dnn_norm",
    "dot",
    "elem",
    "elemwise",
    "elemwise_multi_type",
    "eye",
    "fill_retain_dtype",
    "gaussian_rng",
    "gen",
    "get_var_shape",
    "group_local",
    "host2device_copy",
    "identity",
    "incr_advanced_indexing",
    "incr_mesh_indexing",
    "incr_subtensor",
    "indexing",
    "indexing_adv",
    "indexing_one_hot",
    "indexing_remap",
    "indexing_set_one_hot",
    "insert_opr",
    "io",
    "linalg",
    "linspace",
    "local",
    "loop",
    "LoopDesc",
    "make_loop",
    "lrn",
    "make_immutable",
    "make_opr_config",
    "mark_no_broadcast_elemwise",
    "matrix_inverse",
    "matrix_mul",
    "matrix_mul_v0",
    "mean",
    "mesh_indexing",
    "misc",
    "param_pack_concat",
    "param_pack_split",
    "persistent_output_storage",
    "rand",
    "reduce_",
    "reduce_general",
    "remote_recv",
    "remote_send",
    "relayout_format",
    "remove_axis",
    "require_input_dynamic_storage",
    "reshape",
    "resize",
    "roi_align",
    "roi_pooling",
    "set_advanced_indexing",
    "set_grad",
    "set_mesh_indexing",
    "set_subtensor",
    "shared_device_tensor",
    "sqrt",
    "square",
    "svd",
    "symvar_from_shared_nd",
    "tensor_manip",
    "timestamp",
    "top_k",
    "typecvt",
    "uniform_rng",
    "utility",
    "virtual_dep",
    "virtual_grad",
    "virtual_loss",
    "warp_perspective",
    "zero_grad",
]
