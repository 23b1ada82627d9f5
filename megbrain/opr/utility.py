"""Graph utility operators: AddUpdate, SetGrad, VirtualGrad, VirtualLoss,
VirtualDep, CallbackInjector, AssertEqual, MarkNoBroadcastElemwise, Identity, Timestamp,
PersistentOutputStorage and RequireInputDynamicStorage."""

from __future__ import annotations

import functools
import inspect
import operator
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..dtype import is_bfloat16, same_dtype
from ..errors import AssertionError as MgbAssertionError
from ..errors import (
    GraphError,
    MegBrainError,
    SerializationError,
    mark_user_exception,
    user_exception_note,
)
from ..graph import OperatorNodeBase, ParamBase, infer_shape, register_opr, table_param
from ..graph.operator import fmt_shape
from ..graph.value_proxy import CompGraphCallbackValueProxy
from ..kernels import elemwise as ew_kernels
from ..serialization import sereg
from . import param_defs as pdefs
from .base import (
    SymbolVar,
    _merge_config,
    as_var,
    build_opr,
    canonize_input_vars,
    input_list,
    insert_opr,
)
from .basic_arith import typecvt
from .param_args import as_int, opr_params

__all__ = [
    "AddUpdate",
    "add_update",
    "set_grad",
    "zero_grad",
    "symvar_from_shared_nd",
    "virtual_grad",
    "virtual_loss",
    "virtual_dep",
    "callback_injector",
    "assert_equal",
    "mark_no_broadcast_elemwise",
    "identity",
    "timestamp",
    "persistent_output_storage",
    "require_input_dynamic_storage",
]


class _Forward(OperatorNodeBase):
    """Output 0 is input 0 (a read-only view); the gradient passes through."""

    def infer_shapes(self, in_shapes, in_values):
        return [in_shapes[0]]

    def fwd_views(self, ins):
        return [ins[0]]

    def bind(self, ins, outs):
        return lambda: np.copyto(outs[0], ins[0])

    def grad(self, wrt_idx, out_grads):
        return out_grads[0] if wrt_idx == 0 else None


@register_opr
class Identity(_Forward):
    """Passes its input through; blocks graph optimizations across it."""


@register_opr
class MarkNoBroadcastElemwise(_Forward):
    """Passes its input through, marking it as never broadcast in elemwise fusion."""


@register_opr
class VirtualDep(_Forward):
    """Output is input 0, computed after every other input."""


@dataclass(frozen=True)
class SetGradParam(ParamBase):
    getter_id: int


@register_opr
class SetGrad(_Forward):
    """Output is the input; its gradient is whatever ``grad_getter`` returns."""

    Param = SetGradParam
    dedup = False

    def __init__(self, inputs, getter, config):
        super().__init__(inputs, SetGradParam(id(getter)), config)
        self.getter = getter

    def grad(self, wrt_idx, out_grads):
        g = self.getter
        if g is None:
            return None
        try:
            nargs = len(inspect.signature(g).parameters)
        except (TypeError, ValueError):
            nargs = 1
        res = g(self.graph.api_graph()) if nargs else g()
        if res is None:
            return None
        if not isinstance(res, SymbolVar):
            raise GraphError(f"SetGrad {self.name!r}: grad getter must return a SymbolVar")
        return res.node


@register_opr
class VirtualGrad(OperatorNodeBase):
    """The gradient of input 0 (target) w.r.t. input 1, expanded before compiling."""

    value_inferable = False

    def infer_dtypes(self, in_dtypes):
        return [in_dtypes[1]]

    def infer_comp_node(self):
        return self.inputs[1].comp_node

    def infer_shapes(self, in_shapes, in_values):
        return [in_shapes[1]]

    def bind(self, ins, outs):
        raise MegBrainError(
            f"VirtualGrad {self.name!r} must be expanded by the graph optimizer before running"
        )


@register_opr
class VirtualLoss(OperatorNodeBase):
    """A scalar whose gradient w.r.t. ``ys[i]`` is ``y_grads[i]`` (inputs: ys then grads)."""

    value_inferable = False

    def infer_shapes(self, in_shapes, in_values):
        n = len(in_shapes) // 2
        for i in range(n):
            if tuple(in_shapes[i]) != tuple(in_shapes[n + i]):
                raise self.error(
                    f"y {i} has shape {fmt_shape(in_shapes[i])} but its grad has "
                    f"{fmt_shape(in_shapes[n + i])}"
                )
        return [(1,)]

    def bind(self, ins, outs):
        out = outs[0]
        return lambda: out.fill(0)

    def grad(self, wrt_idx, out_grads):
        n = len(self.inputs) // 2
        return self.inputs[n + wrt_idx] if wrt_idx < n else None


@dataclass(frozen=True)
class CallbackParam(ParamBase):
    cb_id: int


@register_opr
class CallbackInjector(_Forward):
    """Output is input 0; calls the callback with value proxies of all inputs on each run."""

    Param = CallbackParam
    has_side_effect = True

    def __init__(self, inputs, cb, config):
        super().__init__(inputs, CallbackParam(id(cb)), config)
        self.cb = cb

    def bind(self, ins, outs):
        proxies = [CompGraphCallbackValueProxy(v.comp_node) for v in self.inputs]
        cb, single = self.cb, len(ins) == 1
        where = f"raised by the callback of operator {self.type_name} {self.name!r}"

        def run():
            for p, a in zip(proxies, ins):
                p.setup(a, False)
            try:
                cb(proxies[0] if single else list(proxies))
            except BaseException as exc:
                # the user's exception is re-raised as it is (see mark_user_exception)
                mark_user_exception(exc, user_exception_note(where, self.tracker))
                raise
            finally:
                for p in proxies:
                    p.on_finished()

        return run


@dataclass(frozen=True)
@table_param(pdefs.AssertEqual)
class AssertEqualParam(ParamBase):
    """Param of AssertEqual: the largest error allowed, whether to print the values."""


@register_opr
class AssertEqual(OperatorNodeBase):
    """Output is ``get``; raises when ``max|expect - get| / max(1, |expect|)`` > maxerr."""

    Param = AssertEqualParam
    has_side_effect = True

    def infer_dtypes(self, in_dtypes):
        return [in_dtypes[1]]

    def infer_shapes(self, in_shapes, in_values):
        if tuple(in_shapes[0]) != tuple(in_shapes[1]):
            raise self.error(
                f"shape mismatch: expect {fmt_shape(in_shapes[0])}, get {fmt_shape(in_shapes[1])}"
            )
        return [in_shapes[1]]

    def fwd_views(self, ins):
        return [ins[1]]

    def bind(self, ins, outs):
        expect, get = ins
        maxerr, verbose, name = self.param.maxerr, self.param.verbose, self.name

        def run():
            e = expect.astype(np.float64)
            g = get.astype(np.float64)
            err = np.abs(e - g) / np.maximum(1.0, np.abs(e))
            worst = float(err.max()) if err.size else 0.0
            if not worst <= maxerr:
                msg = f"AssertEqual {name!r}: max error {worst:.6g} > {maxerr:.6g}"
                if verbose:
                    msg += f"\nexpect={expect}\nget={get}"
                raise MgbAssertionError(msg)

        return run

    def grad(self, wrt_idx, out_grads):
        return out_grads[0] if wrt_idx == 1 else None


@dataclass(frozen=True)
class CoefInput:
    """An AddUpdate coefficient computed in the graph: the operator's input ``index``."""

    index: int


@dataclass(frozen=True)
class AddUpdateParam(ParamBase):
    """The coefficients of AddUpdate: each a number, a scalar cell read at every run (an
    object with ``get()``, e.g. a SharedScalar, so it can change without recompiling), or a
    :class:`CoefInput` naming an extra (1,)-shaped input var."""

    alpha: object = 1.0
    beta: object = 1.0
    bias: object = 0.0
    disable: object = 0

    def coefs(self) -> tuple:
        return (self.alpha, self.beta, self.bias, self.disable)

    def to_json(self) -> dict:
        def js(v):
            if isinstance(v, CoefInput):
                return f"input{v.index}"
            return float(v.get() if hasattr(v, "get") else v)

        return {n: js(v) for n, v in zip(("alpha", "beta", "bias", "disable"), self.coefs())}


# ---- the AddUpdate kernel (also mgb._add_update_fastpath's) ---------------------------------
#: elements in one block of the ``beta * delta`` scratch buffer
_ADD_UPDATE_BLOCK = 1 << 14
_F32 = np.dtype(np.float32)


def add_update_coefs(dtype, alpha, beta, bias) -> tuple | None:
    """The coefficients of ``dest = alpha*dest + beta*delta + bias`` as MegDNN AddUpdate
    takes them: float32 values cast to the dest's dtype.

    Parameters
    ----------
    dtype:
        The dest's dtype: a float (float32, float16, bfloat16) or integer dtype.
    alpha, beta, bias:
        The coefficients (numbers); for an integer dtype each must be an integer value, as
        MegDNN checks, and it wraps into the dtype as the integer arithmetic does.

    Returns
    -------
    tuple or None
        ``(alpha, beta, bias)`` as scalars of ``dtype``; None for alpha 0, beta 1 and bias 0,
        which the reference runs as a plain copy ``dest = delta``.

    Raises
    ------
    MegBrainError
        For another dtype, or a coefficient an integer dtype can not represent exactly.
    """
    dt = np.dtype(dtype)
    if dt.metadata or not (dt.kind in "iuf" or is_bfloat16(dt)):
        raise MegBrainError(f"AddUpdate: dest dtype {dt} is not supported (float or integer only)")
    f32 = (np.float32(alpha), np.float32(beta), np.float32(bias))
    if f32[0] == 0 and f32[1] == 1 and f32[2] == 0:
        return None
    if dt == _F32:  # every training step: no conversions past float32
        return f32
    if dt.kind not in "iu":
        return tuple(dt.type(v) for v in f32)
    out = []
    for name, v in zip(("alpha", "beta", "bias"), f32):
        if not (np.isfinite(v) and v == np.floor(v)):
            raise MegBrainError(
                f"AddUpdate: dest dtype is {dt}, but {name}={float(v):g} can not be converted "
                "to it exactly"
            )
        # two's complement truncation: alpha*dest mod 2**bits is then what it would be
        # with the unwrapped integer
        out.append(np.array(int(v) % (1 << 64), np.uint64).astype(dt)[()])
    return tuple(out)


def add_update_apply(dest: np.ndarray, delta: np.ndarray, coefs: tuple | None, aliased=None):
    """``dest[...] = alpha*dest + beta*delta + bias`` in place, in dest's dtype.

    Every element gets the reference kernel's ``alpha * dest + beta * delta + bias``
    evaluated in dest's dtype (``alpha`` 0 still multiplies: NaN stays NaN). dest is
    updated in place; the only scratch memory is one block of ``beta * delta`` when beta is
    not 1 or -1 (or 0, for an integer dtype).

    Parameters
    ----------
    dest:
        The array updated.
    delta:
        An array of dest's dtype that broadcasts to dest's shape.
    coefs:
        From :func:`add_update_coefs`.
    aliased:
        Whether delta may read dest's memory (computed when None).
    """
    if coefs is None:
        np.copyto(dest, delta)
        return
    a, b, c = coefs
    if aliased or (aliased is None and np.may_share_memory(dest, delta)):
        # delta reading dest's own memory (add_update(w, w * 1)) would see the passes'
        # partial results: compute from a snapshot then
        delta = delta.copy()
    if a != 1:
        np.multiply(dest, a, out=dest)
    if b == 1:
        np.add(dest, delta, out=dest)
    elif b == -1:
        np.subtract(dest, delta, out=dest)  # x + (-1*y) is x - y exactly
    elif b != 0 or dest.dtype.kind not in "iu":
        # for floats 0*delta is NaN where delta is inf or NaN: beta 0 still multiplies
        if delta.shape != dest.shape:
            delta = np.broadcast_to(delta, dest.shape)
        _add_scaled(dest, delta, b)
    if c != 0:
        # "+ 0" skipped: it could only turn a -0.0 into +0.0
        np.add(dest, c, out=dest)


def _add_scaled(dest: np.ndarray, delta: np.ndarray, b) -> None:
    """``dest += b * delta`` (delta of dest's shape) through a scratch buffer of at most one
    block, so a large dest needs no dest-sized temporary."""
    if dest.size <= _ADD_UPDATE_BLOCK:
        np.add(dest, np.multiply(delta, b), out=dest)
        return
    row = dest.size // dest.shape[0]
    if row > _ADD_UPDATE_BLOCK:  # rows larger than a block: block each row
        for i in range(dest.shape[0]):
            _add_scaled(dest[i], delta[i], b)
        return
    step = _ADD_UPDATE_BLOCK // row
    buf = np.empty((step, *dest.shape[1:]), dest.dtype)
    for i in range(0, dest.shape[0], step):
        d = dest[i : i + step]
        s = buf[: d.shape[0]]
        np.multiply(delta[i : i + step], b, out=s)
        np.add(d, s, out=d)


@register_opr
class AddUpdate(OperatorNodeBase):
    """``dest := alpha*dest + beta*delta + bias`` in place; output is the updated dest.

    Inputs: dest (a shared tensor), delta (dest's dtype, broadcast to dest), then any
    coefficients given as vars. Numbers and SharedScalars live in the param, as in the
    reference: one operator, no coefficient vars in the graph. The update is computed in
    dest's dtype with the coefficients cast to it (:func:`add_update_coefs`).
    """

    Param = AddUpdateParam
    has_side_effect = True

    def overwrites(self):
        return self.inputs[0]

    def infer_shapes(self, in_shapes, in_values):
        dest, delta = in_shapes[0], in_shapes[1]
        try:
            ok = np.broadcast_shapes(tuple(delta), tuple(dest)) == tuple(dest)
        except ValueError:
            ok = False
        if not ok:
            raise self.error(
                f"delta of shape {fmt_shape(delta)} can not be broadcast to dest {fmt_shape(dest)}"
            )
        return [dest]

    def fwd_views(self, ins):
        return [ins[0]]

    def bind(self, ins, outs):
        dest, delta = ins[:2]
        getters = []
        for c in self.param.coefs():
            if isinstance(c, CoefInput):
                getters.append(functools.partial(operator.getitem, ins[c.index], 0))
            elif hasattr(c, "get"):
                getters.append(c.get)
            else:
                getters.append(functools.partial(operator.pos, c))

        aliased = np.may_share_memory(dest, delta)
        dt = dest.dtype
        coefs = self.param.coefs()[:3]
        # constant coefficients are cast once; scalar cells and vars at every run
        fixed = not any(isinstance(c, CoefInput) or hasattr(c, "get") for c in coefs)
        cast = add_update_coefs(dt, *coefs) if fixed else None
        get_disable = getters[3]
        get_a, get_b, get_c = getters[:3]
        # float32 training updates: one compiled pass instead of NumPy's two to four
        fast = None if aliased else ew_kernels.compiled_scaled_update(dest, delta)

        def run():
            disabled = get_disable()
            if disabled:
                if disabled != 1:
                    raise MegBrainError(
                        f"disable flag on AddUpdate can only be 0 or 1, got {disabled}"
                    )
                return
            cf = cast if fixed else add_update_coefs(dt, get_a(), get_b(), get_c())
            if fast is not None and cf is not None:
                fast(*cf)
            else:
                add_update_apply(dest, delta, cf, aliased)

        return run

    def default_name(self):
        return f"AddUpdate({self.inputs[0].name})"


# ---- serialization (megbrain/serialization/sereg.py) -------------------------------------
def _empty_def(param) -> object:
    return pdefs.Empty()


for _cls in (Identity, MarkNoBroadcastElemwise):
    sereg.register_param_opr(_cls, pdefs.Empty, to_def=_empty_def, from_def=lambda d: None)
# the reference writes no param for VirtualDep, and registers VirtualGrad (2 inputs, Empty)
sereg.register_serializer(
    VirtualDep,
    dump=lambda ctx, opr: None,
    load=lambda ctx, inputs, config: ctx.graph.insert_opr(VirtualDep(list(inputs), None, config)),
)
sereg.register_param_opr(VirtualGrad, pdefs.Empty, to_def=_empty_def, from_def=lambda d: None)
# a dump keeps SetGrad's input: the grad getter is Python code
sereg.register_removed_in_dump(SetGrad)


def _assert_equal_make(graph, inputs, param, config):
    # the reference's files carry a third input, the error var computed in the graph; this
    # operator computes its own error from (expect, get)
    if len(inputs) not in (2, 3):
        raise SerializationError(
            f"AssertEqual: 2 inputs (expect, get) or 3 (with err) expected, got {len(inputs)}"
        )
    return graph.insert_opr(AssertEqual(list(inputs[:2]), param, config))


sereg.register_param_opr(AssertEqual, pdefs.AssertEqual, make=_assert_equal_make)


def _add_update_scalar(opr, name: str, coef) -> tuple:
    """A coefficient as the file's PersistentDTypeScalar: its value now (a SharedScalar is
    written as its current value, as the reference does)."""
    if isinstance(coef, CoefInput):
        raise sereg.NotSerializable(
            f"AddUpdate {opr.name!r}: coefficient {name} is a var (input {coef.index}); the "
            "file's MGBAddUpdate param only holds numbers"
        )
    value = coef.get() if hasattr(coef, "get") else coef
    dtype = getattr(coef, "dtype", None)
    if dtype is None or np.dtype(dtype).itemsize > 4:
        dtype = np.float32
    return sereg.persistent_scalar(value, dtype)


def _add_update_dump(ctx, opr) -> None:
    p = opr.param
    disable = p.disable
    if isinstance(disable, CoefInput) or (disable.get() if hasattr(disable, "get") else disable):
        raise sereg.NotSerializable(
            f"AddUpdate {opr.name!r}: a disable flag other than 0 has no place in the file's "
            "MGBAddUpdate param"
        )
    vals = {n: _add_update_scalar(opr, n, c) for n, c in zip(("alpha", "beta", "bias"), p.coefs())}
    ctx.write_param(sereg.CPP_PARAMS["MGBAddUpdate"](**vals))


def _add_update_load(ctx, inputs, config):
    p = ctx.read_param(sereg.CPP_PARAMS["MGBAddUpdate"])
    coefs = []
    for name in ("alpha", "beta", "bias"):
        v = sereg.persistent_scalar_value(getattr(p, name))
        if v is None:
            raise SerializationError(f"AddUpdate: param MGBAddUpdate lacks {name}")
        coefs.append(float(v))
    if len(inputs) != 2:
        raise SerializationError(f"AddUpdate: 2 inputs (dest, delta) expected, got {len(inputs)}")
    return ctx.graph.insert_opr(AddUpdate(list(inputs), AddUpdateParam(*coefs), config))


sereg.register_serializer(AddUpdate, dump=_add_update_dump, load=_add_update_load)


# ---- functions ---------------------------------------------------------------------------
def add_update(
    dest, delta, alpha=1.0, beta=1.0, bias=0.0, disable=0, *, name=None, comp_node=None,
    config=None, comp_graph=None,
) -> SymbolVar:  # fmt: skip
    """``dest := dest*alpha + delta*beta + bias`` in place (``disable`` skips at run time).

    ``dest`` must be a shared tensor var (from ``make_shared``). Coefficients given as
    SharedScalar can change between runs without recompiling.
    """
    cfg = _merge_config(name, comp_node, config)
    (d,) = canonize_input_vars([dest], comp_graph=comp_graph, config=cfg)
    if d.owner.type_name not in ("SharedDeviceTensor", "VolatileSharedDeviceTensor"):
        raise GraphError(
            f"add_update: dest {d.name!r} must be a shared tensor (from make_shared), got a "
            f"var produced by {d.owner.type_name}"
        )
    (dl,) = canonize_input_vars([SymbolVar(d), delta], config=cfg)[1:]
    if not same_dtype(dl.dtype, d.dtype):
        # as the reference, delta is converted to the dest's dtype first
        dl = typecvt(SymbolVar(dl), d.dtype).node
    coefs, extra = [], []
    for c, nm in zip((alpha, beta, bias, disable), ("alpha", "beta", "bias", "disable")):
        cv = as_var(c, d.graph)
        if cv is not None:
            if cv.shape_static:
                if int(np.prod(infer_shape(cv))) != 1:
                    raise GraphError(f"add_update: {nm} must be a scalar, got var {cv.name!r}")
            extra.append(cv)
            c = CoefInput(1 + len(extra))
        elif hasattr(c, "get"):
            if hasattr(c, "lock_dtype"):
                c.lock_dtype()
        elif isinstance(c, (int, float, np.number)) and not isinstance(c, bool):
            c = float(c) if nm != "disable" else int(c)
        elif isinstance(c, bool) and nm == "disable":
            c = int(c)
        else:
            raise GraphError(
                f"add_update: {nm} must be a number or a SharedScalar, got {type(c).__name__}"
            )
        coefs.append(c)
    if not any(isinstance(c, CoefInput) or hasattr(c, "get") for c in coefs[:3]):
        add_update_coefs(d.dtype, *coefs[:3])  # refuse bad constants now, not at the first run
    return insert_opr(AddUpdate([d, dl, *extra], AddUpdateParam(*coefs), cfg))[0]


def set_grad(
    src, grad_getter: Callable | None, *, name=None, comp_node=None, config=None,
    comp_graph=None,
) -> SymbolVar:  # fmt: skip
    """The output is ``src``; its gradient is ``grad_getter(graph)`` (None: zero)."""
    cfg = _merge_config(name, comp_node, config)
    (v,) = canonize_input_vars([src], comp_graph=comp_graph, config=cfg)
    return insert_opr(SetGrad([v], grad_getter, cfg))[0]


def zero_grad(sv, **kw) -> SymbolVar:
    """``set_grad(sv, None)``: blocks the gradient."""
    return set_grad(sv, None, **kw)


def symvar_from_shared_nd(sv, comp_graph, name: str | None = None) -> SymbolVar:
    """A var of ``comp_graph`` standing for the shared device value ``sv``.

    Parameters
    ----------
    sv : SharedND
        The pre-allocated device value.
    comp_graph : CompGraph
        The graph the var belongs to.
    name : str, optional
        The var name.

    Returns
    -------
    SymbolVar
        ``sv.symvar(comp_graph, name)``.
    """
    # duck-typed: SharedND lives in the API layer above this one
    symvar = getattr(type(sv), "symvar", None)
    if not callable(symvar) or not hasattr(sv, "dev_tensor"):
        raise TypeError(f"symvar_from_shared_nd(): sv must be a SharedND, got {type(sv).__name__}")
    return sv.symvar(comp_graph, name)


def virtual_grad(target, wrt, *, name=None, config=None) -> SymbolVar:
    """A VirtualGrad var: the gradient, expanded at compile after forward optimization."""
    cfg = _merge_config(name, None, config)
    vs = canonize_input_vars([target, wrt], config=cfg)
    return insert_opr(VirtualGrad(vs, None, cfg))[0]


def virtual_loss(
    ys, y_grads, *, name=None, comp_node=None, config=None, comp_graph=None
) -> SymbolVar:
    """A scalar loss whose gradient w.r.t. ``ys[i]`` is ``y_grads[i]``."""
    ys, y_grads = input_list(ys, "ys"), input_list(y_grads, "y_grads")
    if len(ys) != len(y_grads):
        raise GraphError("virtual_loss: ys and y_grads differ in length")
    return build_opr(VirtualLoss, ys + y_grads, None, None, name, comp_node, config, comp_graph)


def virtual_dep(symvars, *, name=None, comp_node=None, config=None, comp_graph=None) -> SymbolVar:
    """``symvars[0]``, computed after all the others."""
    cfg = _merge_config(name, comp_node, config)
    vs = canonize_input_vars(input_list(symvars, "symvars"), comp_graph=comp_graph, config=cfg)
    return insert_opr(VirtualDep(vs, None, cfg))[0]


def callback_injector(
    src, cb, *, name=None, comp_node=None, config=None, comp_graph=None
) -> SymbolVar:
    """Call ``cb(proxy)`` (a list of proxies when ``src`` is a list) each time it runs."""
    cfg = _merge_config(name, comp_node, config)
    srcs = list(src) if isinstance(src, (list, tuple)) else [src]
    vs = canonize_input_vars(srcs, comp_graph=comp_graph, config=cfg)
    return insert_opr(CallbackInjector(vs, cb, cfg))[0]


@opr_params(("param", "AssertEqual"))
def assert_equal(
    expect, get, maxerr=1e-4, verbose=False, *, name=None, comp_node=None, config=None,
    comp_graph=None,
) -> SymbolVar:  # fmt: skip
    """``get``, checked at run time to equal ``expect`` within ``maxerr``."""
    cfg = _merge_config(name, comp_node, config)
    vs = canonize_input_vars([expect, get], comp_graph=comp_graph, config=cfg)
    return insert_opr(AssertEqual(vs, AssertEqualParam(float(maxerr), bool(verbose)), cfg))[0]


@opr_params(("param", "Empty"))
def mark_no_broadcast_elemwise(
    src, *, name=None, comp_node=None, config=None, comp_graph=None
) -> SymbolVar:
    """``src`` unchanged; elemwise operators reading it may not broadcast it."""
    return build_opr(
        MarkNoBroadcastElemwise, [src], None, None, name, comp_node, config, comp_graph
    )


@opr_params(("param", "Empty"))
def identity(src, *, name=None, comp_node=None, config=None, comp_graph=None) -> SymbolVar:
    """``src`` unchanged; blocks the optimizer."""
    return build_opr(Identity, [src], None, None, name, comp_node, config, comp_graph)


# ---- Timestamp, PersistentOutputStorage, RequireInputDynamicStorage -------------------------
@dataclass(frozen=True)
class TimestampParam(ParamBase):
    dest_id: int
    dest_off: int


@register_opr
class Timestamp(_Forward):
    """Output is the input; when it runs, writes the seconds elapsed since the function was
    compiled (its fixed point) into ``dest[dest_off]``."""

    Param = TimestampParam
    has_side_effect = True

    def __init__(self, inputs, dest: np.ndarray, dest_off: int, config):
        super().__init__(inputs, TimestampParam(id(dest), dest_off), config)
        self.dest = dest
        self.base = time.perf_counter()

    def on_func_compiled(self, func, used_outputs):
        # every Timestamp of one function shares the function's fixed point
        bases = self.graph.__dict__.setdefault("_timestamp_bases", {})
        key = id(func)
        if key not in bases:
            bases.clear()
            bases[key] = time.perf_counter()
        self.base = bases[key]
        return None

    def bind(self, ins, outs):
        dest, off = self.dest, self.param.dest_off
        copy = None if np.shares_memory(ins[0], outs[0]) else functools.partial(
            np.copyto, outs[0], ins[0]
        )  # fmt: skip

        def run():
            if copy is not None:
                copy()
            dest[off] = time.perf_counter() - self.base

        return run


def timestamp(
    input, dest, dest_off: int, *, name=None, comp_node=None, config=None, comp_graph=None
) -> SymbolVar:  # fmt: skip
    """``input``, and the time (in seconds, relative to a fixed point of the current
    function) at which it was computed, written to ``dest[dest_off]`` at each run.

    Parameters
    ----------
    input : SymbolVar
        The var to wait for.
    dest : numpy.ndarray
        A 1-d contiguous float32 array receiving the times (kept by reference).
    dest_off : int
        The index in ``dest`` to write.

    Returns
    -------
    SymbolVar
        ``input`` (forwarded).
    """
    off = as_int(dest_off, "timestamp", "dest_off")
    if (
        not isinstance(dest, np.ndarray)
        or dest.dtype != np.float32
        or dest.ndim != 1
        or not dest.flags.c_contiguous
        or not dest.flags.writeable
    ):
        raise TypeError(
            "timestamp: dest must be a writeable 1-dimensional contiguous float32 numpy array, "
            f"got {type(dest).__name__}"
            + (f" {dest.dtype} {dest.shape}" if isinstance(dest, np.ndarray) else "")
        )
    if not 0 <= off < dest.shape[0]:
        raise GraphError(f"timestamp: dest_off={off} out of range for dest of {dest.shape[0]}")
    cfg = _merge_config(name, comp_node, config)
    vs = canonize_input_vars([input], comp_graph=comp_graph, config=cfg)
    return insert_opr(Timestamp(vs, dest, off, cfg))[0]


@dataclass(frozen=True)
@table_param(pdefs.PersistentOutputStorage)
class PersistentOutputStorageParam(ParamBase):
    """Param of PersistentOutputStorage: the storage's ``share_key`` (-1: private)."""


@register_opr
class PersistentOutputStorage(OperatorNodeBase):
    """A copy of the input in storage that persists across runs (never reused by the memory
    plan); operators with one ``share_key`` (other than -1) and the same shape and dtype
    share that storage."""

    Param = PersistentOutputStorageParam
    has_side_effect = True

    def __init__(self, inputs, param, config):
        super().__init__(inputs, param, config)
        self._own: np.ndarray | None = None

    def infer_shapes(self, in_shapes, in_values):
        return [in_shapes[0]]

    def _storage(self, shape, dtype) -> np.ndarray:
        key = self.param.share_key
        if key == -1:
            buf = self._own
            if buf is None or buf.shape != tuple(shape) or buf.dtype != dtype:
                buf = self._own = np.zeros(shape, dtype)
            return buf
        pool = self.graph.internal_data.setdefault("persistent_output_storage", {})
        k = (key, tuple(shape), np.dtype(dtype).str)
        if k not in pool:
            pool[k] = np.zeros(shape, dtype)
        return pool[k]

    def fwd_views(self, ins):
        if not ins or ins[0] is None:
            return None
        return [self._storage(ins[0].shape, self.outputs[0].dtype)]

    def bind(self, ins, outs):
        return functools.partial(np.copyto, outs[0], ins[0])

    def run_dynamic(self, ins):
        out = self._storage(ins[0].shape, self.outputs[0].dtype)
        np.copyto(out, ins[0])
        return [out]

    def grad(self, wrt_idx, out_grads):
        return out_grads[0]


@opr_params(("param", "PersistentOutputStorage"))
def persistent_output_storage(
    inp, *, share_key: int = -1, name=None, comp_node=None, config=None, comp_graph=None
) -> SymbolVar:
    """A copy of ``inp`` in storage that persists across runs; operators with the same
    ``share_key`` (not -1) share it."""
    key = as_int(share_key, "persistent_output_storage", "share_key")
    cfg = _merge_config(name, comp_node, config)
    vs = canonize_input_vars([inp], comp_graph=comp_graph, config=cfg)
    return insert_opr(
        PersistentOutputStorage(vs, PersistentOutputStorageParam(key), cfg)
    )[0]  # fmt: skip


@register_opr
class RequireInputDynamicStorage(_Forward):
    """Output is the input; in the reference it made the input's memory dynamically
    allocated (host arrays need no such distinction here)."""


@opr_params(("param", "Empty"))
def require_input_dynamic_storage(
    inp, *, name=None, comp_node=None, config=None, comp_graph=None
) -> SymbolVar:
    """``inp`` unchanged (its storage dynamically allocated in the reference)."""
    return build_opr(
        RequireInputDynamicStorage, [inp], None, None, name, comp_node, config, comp_graph
    )


sereg.register_param_opr(PersistentOutputStorage, pdefs.PersistentOutputStorage)
