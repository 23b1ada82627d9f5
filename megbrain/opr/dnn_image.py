"""Image operators: ROIPooling, ROIAlign, WarpPerspective and Resize with
their backward operators, and the ``mgb.opr`` functions ``roi_pooling``, ``roi_align``,
``warp_perspective`` and ``resize``.

Output sizes given as ints become an int32 var that the operator reads at static inference
(``value_deps``), as MegBrain's ``out_shape`` inputs are.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..dtype import is_bfloat16, is_quantize
from ..graph import OperatorNodeBase, ParamBase, register_opr
from ..graph.operator import fmt_shape, table_param
from ..graph.param_def import members_of
from ..kernels import dnn_image as kern
from . import param_defs as pdefs
from .base import SymbolVar, _merge_config, canonize_input_vars, insert_opr
from .param_args import as_int, opr_params
from .sereg_params import register_strict
from .tensor_manip import _shape_value, shape_to_var

__all__ = [
    "ROIPoolingParam",
    "ROIPooling",
    "ROIPoolingBackward",
    "ROIAlignParam",
    "ROIAlign",
    "ROIAlignBackward",
    "WarpPerspectiveParam",
    "WarpPerspective",
    "WarpPerspectiveBackwardData",
    "WarpPerspectiveBackwardMat",
    "ResizeParam",
    "Resize",
    "ResizeBackward",
    "roi_pooling",
    "roi_align",
    "warp_perspective",
    "resize",
]

INTERP_MODES = members_of(pdefs.WarpPerspective.InterpolationMode)
_I32 = np.dtype(np.int32)


def _is_float(dt: np.dtype) -> bool:
    return (dt.kind == "f" and not dt.metadata) or is_bfloat16(dt)


def _strip_alias(param: ParamBase, field: str, prefix: str) -> None:
    """Accept MegDNN's member aliases (``INTER_LINEAR``, ``BORDER_CONSTANT``)."""
    v = getattr(param, field)
    if isinstance(v, str) and v.upper().startswith(prefix):
        object.__setattr__(param, field, v[len(prefix) :])


def _floats(param: ParamBase, *fields: str) -> None:
    for f in fields:
        object.__setattr__(param, f, float(getattr(param, f)))


def _check_shape_dtype(opr: OperatorNodeBase, dt: np.dtype, what: str) -> None:
    # MegBrain reads a shape value of any int or float dtype (copy_tensor_value_to_shape)
    if is_quantize(dt) or not (dt.kind in "iu" or _is_float(dt)):
        raise opr.error(f"{what} must be an int or float var, got {dt}")


def _out_hw(opr: OperatorNodeBase, val, what: str) -> tuple[int, int]:
    arr = np.asarray(val)
    if arr.dtype.kind not in "iu":
        # static_cast_safe: float sizes must be integers exactly representable in float32
        f = arr.astype(np.float64)
        if not np.all((np.abs(f) <= 2**24) & (np.ceil(f) == f)):
            raise opr.error(f"{what} holds {f.tolist()}: not ints without precision loss")
        val = f.astype(np.int64)
    hw = _shape_value(opr, val, what)
    if len(hw) != 2 or min(hw) <= 0:
        raise opr.error(f"{what} must hold two positive ints (height, width), got {hw}")
    return hw


def _check_src(opr: OperatorNodeBase, dt: np.dtype, allow_int: bool = False) -> None:
    ok = _is_float(dt) or (allow_int and dt in (np.dtype(np.int8), np.dtype(np.uint8)))
    if not ok or is_quantize(dt):
        kinds = "float, int8 or uint8" if allow_int else "float"
        raise opr.error(f"src must be a {kinds} var, got {dt}")


def _check_4d(opr: OperatorNodeBase, what: str, shape) -> tuple:
    shape = tuple(shape)
    if len(shape) != 4:
        raise opr.error(f"{what} must be 4-d, got {fmt_shape(shape)}")
    return shape


def _check_rois(opr: OperatorNodeBase, shape) -> int:
    if len(shape) != 2 or shape[1] != 5:
        raise opr.error(f"rois must have shape (m, 5), got {fmt_shape(shape)}")
    return int(shape[0])


def _nchw(a: np.ndarray, fmt: str) -> np.ndarray:
    """An NCHW view of an image array in ``fmt`` (NCHW or NHWC)."""
    return a.transpose(0, 3, 1, 2) if fmt == "NHWC" else a


def _named(label: str):
    """``default_name`` as MegBrain's: ``label(input0)`` (not the pooling mode)."""

    def default_name(self) -> str:
        return f"{label}({self.inputs[0].name})"

    return default_name


def _grad_input(opr: OperatorNodeBase, out_grads) -> bool:
    return out_grads[0] is not None and _is_float(opr.inputs[0].dtype)


# ---- ROIPooling ----------------------------------------------------------------------------
@dataclass(frozen=True)
@table_param(pdefs.ROIPooling)
class ROIPoolingParam(ParamBase):
    """Param of ROIPooling: pooling ``mode`` and the ``scale`` applied to ROI coordinates."""

    def __post_init__(self):
        super().__post_init__()
        _floats(self, "scale")

    def kernel_kw(self) -> dict:
        return {"mode": self.mode, "scale": self.scale}


class _ROIBackward(OperatorNodeBase):
    """Inputs (dst_grad, src, rois, index); output src_grad (only src's shape is read)."""

    shape_only_inputs = (1,)
    #: ``f(dst_grad, rois, index, src_grad, **param.kernel_kw())``
    kernel = None

    def infer_shapes(self, in_shapes, in_values):
        return [tuple(in_shapes[1])]

    def bind(self, ins, outs):
        return self.kernel(ins[0], ins[2], ins[3], outs[0], **self.param.kernel_kw())


class _ROIBase(OperatorNodeBase):
    """(src, rois, ...) -> (dst, index): shared dtype and shape checks and the gradient
    (through ``backward``, a :class:`_ROIBackward`; rois and sizes get none)."""

    backward: type[_ROIBackward]

    def grad(self, wrt_idx, out_grads):
        if wrt_idx != 0 or not _grad_input(self, out_grads):
            return None
        src, rois = self.inputs[0], self.inputs[1]
        bwd = self.backward([out_grads[0], src, rois, self.outputs[1]], self.param, None)
        return insert_opr(bwd)[0].node

    def infer_dtypes(self, in_dtypes):
        _check_src(self, in_dtypes[0])
        if in_dtypes[1] != in_dtypes[0]:
            raise self.error(f"rois must have src's dtype {in_dtypes[0]}, got {in_dtypes[1]}")
        return [in_dtypes[0], _I32]

    def _out_shape(self, in_shapes, ph: int, pw: int) -> tuple:
        src = _check_4d(self, "src", in_shapes[0])
        return (_check_rois(self, in_shapes[1]), src[1], ph, pw)


@register_opr
class ROIPooling(_ROIBase):
    """Caffe's ROI pooling. Inputs (src NCHW, rois (m, 5), dest_shape (2,)); outputs
    (dst (m, C, oh, ow), index int32: the argmax ``h*W + w`` of MAX)."""

    #: the reference's C++ type (ROIPooling is an alias of ROIPoolingForward)
    type_name = "ROIPoolingForward"

    Param = ROIPoolingParam
    default_name = _named("roi_pooling")
    value_deps = (2,)
    static_only_inputs = (2,)

    def infer_dtypes(self, in_dtypes):
        if len(in_dtypes) != 3:
            raise self.error(f"expected 3 inputs (src, rois, dest_shape), got {len(in_dtypes)}")
        _check_shape_dtype(self, in_dtypes[2], "dest_shape")
        return super().infer_dtypes(in_dtypes)

    def infer_shapes(self, in_shapes, in_values):
        shp = self._out_shape(in_shapes, *_out_hw(self, in_values[2], "dest_shape"))
        return [shp, shp]

    def bind(self, ins, outs):
        return kern.bind_roi_pooling(ins[0], ins[1], *outs, **self.param.kernel_kw())


@register_opr
class ROIPoolingBackward(_ROIBackward):
    Param = ROIPoolingParam
    default_name = _named("roi_pooling_backward")
    kernel = staticmethod(kern.bind_roi_pooling_backward)


ROIPooling.backward = ROIPoolingBackward


# ---- ROIAlign ------------------------------------------------------------------------------
@dataclass(frozen=True)
@table_param(pdefs.ROIAlign)
class ROIAlignParam(ParamBase):
    """Param of ROIAlign (MegDNN's field names and defaults)."""

    def __post_init__(self):
        super().__post_init__()
        _floats(self, "spatial_scale", "offset")
        for f in ("pooled_height", "pooled_width", "sample_height", "sample_width"):
            object.__setattr__(self, f, as_int(getattr(self, f), "roi_align", f))

    def kernel_kw(self) -> dict:
        return {
            "mode": self.mode,
            "spatial_scale": self.spatial_scale,
            "offset": self.offset,
            "sample_height": self.sample_height,
            "sample_width": self.sample_width,
        }


@register_opr
class ROIAlign(_ROIBase):
    """ROIAlign (Mask R-CNN) with MegDNN's sampling. Inputs (src NCHW, rois (m, 5)); outputs
    (dst (m, C, pooled_height, pooled_width), index int32: the sample chosen by MAX)."""

    #: the reference's C++ type (ROIAlign is an alias of ROIAlignForward)
    type_name = "ROIAlignForward"

    Param = ROIAlignParam
    default_name = _named("roi_align")

    def infer_dtypes(self, in_dtypes):
        if len(in_dtypes) != 2:
            raise self.error(f"expected 2 inputs (src, rois), got {len(in_dtypes)}")
        p = self.param
        if p.format != "NCHW":
            raise self.error(f"format {p.format} is not supported (only NCHW)")
        sizes = (p.pooled_height, p.pooled_width, p.sample_height, p.sample_width)
        if min(sizes) <= 0:
            raise self.error(
                "pooled_height/width and sample_height/width must be positive, got "
                + ", ".join(map(str, sizes))
            )
        return super().infer_dtypes(in_dtypes)

    def infer_shapes(self, in_shapes, in_values):
        shp = self._out_shape(in_shapes, self.param.pooled_height, self.param.pooled_width)
        return [shp, shp]

    def bind(self, ins, outs):
        return kern.bind_roi_align(ins[0], ins[1], *outs, **self.param.kernel_kw())


@register_opr
class ROIAlignBackward(_ROIBackward):
    Param = ROIAlignParam
    default_name = _named("roi_align_backward")
    kernel = staticmethod(kern.bind_roi_align_backward)


ROIAlign.backward = ROIAlignBackward


# ---- WarpPerspective -----------------------------------------------------------------------
@dataclass(frozen=True)
@table_param(pdefs.WarpPerspective)
class WarpPerspectiveParam(ParamBase):
    """Param of WarpPerspective; ``border_val`` is used by the CONSTANT border mode."""

    def __post_init__(self):
        _strip_alias(self, "imode", "INTER_")
        _strip_alias(self, "bmode", "BORDER_")
        super().__post_init__()
        _floats(self, "border_val")


def _check_warp_param(opr: OperatorNodeBase, p) -> None:
    if p.imode not in ("LINEAR", "NEAREST"):
        raise opr.error(f"imode {p.imode} is not supported (only LINEAR and NEAREST)")
    if p.format not in ("NCHW", "NHWC"):
        raise opr.error(f"format {p.format} is not supported (only NCHW and NHWC)")
    bmode = getattr(p, "bmode", None)
    if bmode is not None and bmode not in kern.BORDER_MODES:
        raise opr.error(f"bmode {bmode} is not supported ({', '.join(kern.BORDER_MODES)})")


def _image_out_shape(src: tuple, fmt: str, n: int, hw: tuple[int, int]) -> tuple:
    if fmt == "NHWC":
        return (n, hw[0], hw[1], src[3])
    return (n, src[1], hw[0], hw[1])


@register_opr
class WarpPerspective(OperatorNodeBase):
    """Perspective warp: inputs (src, mat (N, 3, 3), out_shape (2,)); ``mat[n]`` maps output
    pixel ``(ow, oh, 1)`` to source ``(x, y)`` (homogeneous)."""

    #: the reference's C++ type (WarpPerspective is an alias of WarpPerspectiveForward)
    type_name = "WarpPerspectiveForward"

    Param = WarpPerspectiveParam
    default_name = _named("warp_perspective")
    value_deps = (2,)
    static_only_inputs = (2,)

    def infer_dtypes(self, in_dtypes):
        if len(in_dtypes) != 3:
            raise self.error(f"expected 3 inputs (src, mat, out_shape), got {len(in_dtypes)}")
        _check_warp_param(self, self.param)
        _check_src(self, in_dtypes[0], allow_int=True)
        if not _is_float(in_dtypes[1]):
            raise self.error(f"mat must be a float var, got {in_dtypes[1]}")
        _check_shape_dtype(self, in_dtypes[2], "out_shape")
        return [in_dtypes[0]]

    def infer_shapes(self, in_shapes, in_values):
        src = _check_4d(self, "src", in_shapes[0])
        mat = tuple(in_shapes[1])
        if len(mat) != 3 or mat[1:] != (3, 3) or mat[0] != src[0]:
            raise self.error(
                f"mat must have shape ({src[0]}, 3, 3) for src {fmt_shape(src)}, "
                f"got {fmt_shape(mat)}"
            )
        hw = _out_hw(self, in_values[2], "out_shape")
        return [_image_out_shape(src, self.param.format, src[0], hw)]

    def bind(self, ins, outs):
        p, f = self.param, self.param.format
        return kern.bind_warp_perspective(
            _nchw(ins[0], f),
            ins[1],
            _nchw(outs[0], f),
            imode=p.imode,
            bmode=p.bmode,
            border_val=p.border_val,
        )

    def grad(self, wrt_idx, out_grads):
        if wrt_idx == 2 or not _grad_input(self, out_grads):
            return None
        if self.param.imode != "LINEAR":
            raise self.error(f"no gradient for imode {self.param.imode} (only LINEAR)")
        src, mat = self.inputs[0], self.inputs[1]
        if wrt_idx == 0:
            bwd = WarpPerspectiveBackwardData([mat, out_grads[0], src], self.param, None)
        else:
            bwd = WarpPerspectiveBackwardMat([src, mat, out_grads[0]], self.param, None)
        return insert_opr(bwd)[0].node


@register_opr
class WarpPerspectiveBackwardData(OperatorNodeBase):
    """Inputs (mat, dst_grad, src); output src_grad (only src's shape is read)."""

    Param = WarpPerspectiveParam
    default_name = _named("warp_perspective_backward_data")
    shape_only_inputs = (2,)

    def infer_dtypes(self, in_dtypes):
        return [in_dtypes[1]]

    def infer_shapes(self, in_shapes, in_values):
        return [tuple(in_shapes[2])]

    def bind(self, ins, outs):
        f = self.param.format
        return kern.bind_warp_perspective_backward_data(
            ins[0], _nchw(ins[1], f), _nchw(outs[0], f), bmode=self.param.bmode
        )


@register_opr
class WarpPerspectiveBackwardMat(OperatorNodeBase):
    """Inputs (src, mat, dst_grad); output mat_grad."""

    Param = WarpPerspectiveParam
    default_name = _named("warp_perspective_backward_mat")

    def infer_dtypes(self, in_dtypes):
        return [in_dtypes[1]]

    def infer_shapes(self, in_shapes, in_values):
        return [tuple(in_shapes[1])]

    def bind(self, ins, outs):
        p, f = self.param, self.param.format
        return kern.bind_warp_perspective_backward_mat(
            _nchw(ins[0], f),
            ins[1],
            _nchw(ins[2], f),
            outs[0],
            bmode=p.bmode,
            border_val=p.border_val,
        )


# ---- Resize --------------------------------------------------------------------------------
@dataclass(frozen=True)
@table_param(pdefs.Resize)
class ResizeParam(ParamBase):
    """Param of Resize; MegDNN's default format is NHWC."""

    def __post_init__(self):
        _strip_alias(self, "imode", "INTER_")
        super().__post_init__()


@register_opr
class Resize(OperatorNodeBase):
    """Resize the spatial axes: inputs (src, out_shape (2,)); LINEAR uses MegDNN's half-pixel
    centres with edge clamping, NEAREST picks ``min(floor(o * in / out), in - 1)``."""

    #: the reference's C++ type (Resize is an alias of ResizeForward)
    type_name = "ResizeForward"

    Param = ResizeParam
    default_name = _named("resize")
    value_deps = (1,)
    static_only_inputs = (1,)

    def infer_dtypes(self, in_dtypes):
        if len(in_dtypes) != 2:
            raise self.error(f"expected 2 inputs (src, out_shape), got {len(in_dtypes)}")
        _check_warp_param(self, self.param)
        _check_src(self, in_dtypes[0], allow_int=True)
        _check_shape_dtype(self, in_dtypes[1], "out_shape")
        return [in_dtypes[0]]

    def infer_shapes(self, in_shapes, in_values):
        src = _check_4d(self, "src", in_shapes[0])
        hw = _out_hw(self, in_values[1], "out_shape")
        return [_image_out_shape(src, self.param.format, src[0], hw)]

    def bind(self, ins, outs):
        f = self.param.format
        return kern.bind_resize(_nchw(ins[0], f), _nchw(outs[0], f), imode=self.param.imode)

    def grad(self, wrt_idx, out_grads):
        if wrt_idx != 0 or not _grad_input(self, out_grads):
            return None
        bwd = ResizeBackward([out_grads[0], self.inputs[0]], self.param, None)
        return insert_opr(bwd)[0].node


@register_opr
class ResizeBackward(OperatorNodeBase):
    """Inputs (dst_grad, src); output src_grad (only src's shape is read)."""

    Param = ResizeParam
    default_name = _named("resize_backward")
    shape_only_inputs = (1,)

    def infer_shapes(self, in_shapes, in_values):
        return [tuple(in_shapes[1])]

    def bind(self, ins, outs):
        f = self.param.format
        return kern.bind_resize_backward(
            _nchw(ins[0], f), _nchw(outs[0], f), imode=self.param.imode
        )


# ---- functions ---------------------------------------------------------------------------
#: operator -> the function that makes it, for messages about its shape argument
_FUNC_NAMES = {
    "ROIPooling": "roi_pooling",
    "WarpPerspective": "warp_perspective",
    "Resize": "resize",
}


def _insert(cls, inputs, param, name, comp_node, config, comp_graph, shape_at=None):
    cfg = _merge_config(name, comp_node, config)
    if shape_at is not None:
        (ref,) = canonize_input_vars([inputs[0]], comp_graph=comp_graph, config=cfg)
        inputs = list(inputs)
        arg = "dest_shape" if cls is ROIPooling else "out_shape"
        what = f"{_FUNC_NAMES.get(cls.__name__, cls.__name__)}() {arg}"
        inputs[shape_at] = shape_to_var(inputs[shape_at], ref, what=what)
    vars_ = canonize_input_vars(inputs, comp_graph=comp_graph, config=cfg)
    return insert_opr(cls(vars_, param, cfg))[0]


@opr_params(("param", "ROIPooling"))
def roi_pooling(
    src,
    rois,
    dest_shape,
    mode: str = "MAX",
    scale: float = 1.0,
    *,
    name: str | None = None,
    comp_node=None,
    config=None,
    comp_graph=None,
) -> SymbolVar:
    """ROI pooling (registry name ``ROIPooling``), as in Caffe's Fast R-CNN.

    Parameters
    ----------
    src : SymbolVar
        The (n, c, ih, iw) float feature map.
    rois : SymbolVar or array_like
        (m, 5) rows ``[batch_index, x0, y0, x1, y1]`` (inclusive corners), of src's dtype.
    dest_shape : tuple of 2 ints or SymbolVar
        The pooled (oh, ow).
    mode : {"MAX", "AVERAGE"}
        Pooling inside each bin; an empty bin gives 0.
    scale : float
        Multiplies the ROI coordinates, which are then rounded.
    name, comp_node, config, comp_graph
        The operator config, as for every ``mgb.opr`` function.

    Returns
    -------
    SymbolVar
        The (m, c, oh, ow) pooled features.
    """
    param = ROIPoolingParam(mode, scale)
    return _insert(
        ROIPooling, [src, rois, dest_shape], param, name, comp_node, config, comp_graph, shape_at=2
    )


@opr_params(("param", "ROIAlign"))
def roi_align(
    src,
    rois,
    *,
    mode: str = "MAX",
    spatial_scale: float = 1.0,
    offset: float = 0.0,
    pooled_height: int = 1,
    pooled_width: int = 1,
    sample_height: int = 2,
    sample_width: int = 2,
    format: str = "NCHW",
    name: str | None = None,
    comp_node=None,
    config=None,
    comp_graph=None,
) -> SymbolVar:
    """ROIAlign (registry name ``ROIAlign``) with MegDNN's semantics.

    Each ROI ``[b, x0, y0, x1, y1] * spatial_scale - offset`` is split into
    ``pooled_height x pooled_width`` bins; each bin takes ``sample_height x sample_width``
    bilinear samples at regular centres (pixels outside the image count as 0) and pools them.

    Parameters
    ----------
    src : SymbolVar
        The (n, c, ih, iw) float feature map.
    rois : SymbolVar or array_like
        (m, 5) rows ``[batch_index, x0, y0, x1, y1]`` of src's dtype.
    mode : {"MAX", "AVERAGE"}
        Pooling of the samples of a bin.
    spatial_scale, offset : float
        The ROI coordinate transform.
    pooled_height, pooled_width, sample_height, sample_width : int
        Bins per ROI and samples per bin.
    format : {"NCHW"}
        The only supported layout.
    name, comp_node, config, comp_graph
        The operator config, as for every ``mgb.opr`` function.

    Returns
    -------
    SymbolVar
        The (m, c, pooled_height, pooled_width) features.
    """
    param = ROIAlignParam(
        mode,
        format,
        spatial_scale,
        offset,
        pooled_height,
        pooled_width,
        sample_height,
        sample_width,
    )
    return _insert(ROIAlign, [src, rois], param, name, comp_node, config, comp_graph)


@opr_params(("param", "WarpPerspective"))
def warp_perspective(
    src,
    mat,
    out_shape,
    imode: str = "LINEAR",
    bmode: str = "REPLICATE",
    border_val: float = 0.0,
    *,
    format: str = "NCHW",
    name: str | None = None,
    comp_node=None,
    config=None,
    comp_graph=None,
) -> SymbolVar:
    """Perspective warp (registry name ``WarpPerspective``).

    ``dst[n, :, h, w] = src[n, :, y, x]`` with ``(x*d, y*d, d) = mat[n] @ (w, h, 1)``.

    Parameters
    ----------
    src : SymbolVar
        The (n, c, ih, iw) image (float, int8 or uint8); (n, ih, iw, c) for NHWC.
    mat : SymbolVar or array_like
        (n, 3, 3) float matrices mapping output pixels to source coordinates.
    out_shape : tuple of 2 ints or SymbolVar
        The output (oh, ow).
    imode : {"LINEAR", "NEAREST"}
        Bilinear interpolation, or the nearest pixel; AREA, CUBIC and LANCZOS4 raise.
    bmode : {"REPLICATE", "REFLECT", "REFLECT_101", "WRAP", "CONSTANT"}
        How source coordinates outside the image are mapped; TRANSPARENT and ISOLATED raise.
    border_val : float
        The value outside the image for CONSTANT.
    format : {"NCHW", "NHWC"}
        The image layout.
    name, comp_node, config, comp_graph
        The operator config, as for every ``mgb.opr`` function.

    Returns
    -------
    SymbolVar
        The (n, c, oh, ow) warped image, of src's dtype.
    """
    param = WarpPerspectiveParam(imode, bmode, format, border_val)
    return _insert(
        WarpPerspective,
        [src, mat, out_shape],
        param,
        name,
        comp_node,
        config,
        comp_graph,
        shape_at=2,
    )


@opr_params(("param", "Resize"))
def resize(
    src,
    out_shape,
    imode: str = "LINEAR",
    *,
    format: str = "NHWC",
    name: str | None = None,
    comp_node=None,
    config=None,
    comp_graph=None,
) -> SymbolVar:
    """Resize the spatial axes of an image batch (registry name ``Resize``).

    Parameters
    ----------
    src : SymbolVar
        A 4-d image (float, int8 or uint8) in ``format``.
    out_shape : tuple of 2 ints or SymbolVar
        The output (oh, ow).
    imode : {"LINEAR", "NEAREST"}
        Bilinear with half-pixel centres, or nearest; other modes raise.
    format : {"NHWC", "NCHW"}
        The image layout; NHWC is MegBrain's default, pass ``format="NCHW"`` for NCHW.
    name, comp_node, config, comp_graph
        The operator config, as for every ``mgb.opr`` function.

    Returns
    -------
    SymbolVar
        The resized image, of src's dtype.
    """
    param = ResizeParam(imode, format)
    return _insert(Resize, [src, out_shape], param, name, comp_node, config, comp_graph, shape_at=1)


# ---- serialization (megbrain/serialization/sereg.py) -------------------------------------
# each writes its Param's table; the reference's mat_idx input of WarpPerspective (4 inputs)
# is refused by the operator
for _cls in (
    ROIPooling, ROIPoolingBackward, ROIAlign, ROIAlignBackward,
    WarpPerspective, WarpPerspectiveBackwardData, WarpPerspectiveBackwardMat, ResizeBackward,
):  # fmt: skip
    register_strict(_cls, name=_cls.__name__)  # the registered names are the aliases
del _cls
register_strict(Resize, name="ResizeV1")
