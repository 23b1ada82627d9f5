"""``mgb.opr``: the operators, one module per family, and their functions."""

from . import basic_arith, blas, io
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
from .io import copy, host2device_copy, make_immutable, shared_device_tensor
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
from .indexing import incr_subtensor, set_subtensor
from .tensor_manip import (
    add_axis,
    broadcast,
    concat,
    dimshuffle,
    get_var_shape,
    remove_axis,
    reshape,
)
from . import dnn_image, dnn_norm
from .dnn_image import resize, roi_align, roi_pooling, warp_perspective
from .dnn_norm import batch_norm, batch_norm_no_statistic, lrn
