"""megbrain's time per operator of a compiled function, grouped by the kind of work (a
convolution's layout, grouping, filter and stride): the ``--profile`` tables of
``onnx_zoo.py`` and ``quantized.py``."""

from __future__ import annotations

import collections
import statistics


def describe(opr) -> tuple[str, str]:
    """``(kind, detail)`` of an operator: the kind groups operators of one kind of work (a
    convolution's layout, grouping, filter and stride; the quantized dtype of its first
    input), the detail adds its shapes."""
    from megbrain.dtype import dtype_name, is_quantize
    from megbrain.graph.static_infer import static_shape

    def dims(var) -> str:
        shape = static_shape(var)
        return "?" if shape is None else "x".join(map(str, shape))

    shape = dims(opr.outputs[0]) if opr.outputs else "?"
    p = getattr(opr, "param", None)
    kind = opr.type_name
    # the compile-time fused ConvBias subclasses (ConvBiasTail, ConvBiasGated, ConvBiasPreact)
    # too, under their own type
    if (kind == "ConvolutionForward" or kind.startswith("ConvBias")) and p is not None:
        fshape = static_shape(opr.inputs[1]) or ()
        if p.format == "NCHW88" and len(static_shape(opr.inputs[0]) or ()) == 4:
            fh, fw = fshape[1:3]  # the hybrid first layer's (OC/8, FH, FW, IC, 8)
        elif p.format == "NCHW88":  # the channel blocks of 8 trail the filter's dims
            fh, fw = fshape[-4:-2] if fshape[-2:] == (8, 8) else fshape[-3:-1]
        elif p.format == "NCHW4":  # (..., FH, FW, 4)
            fh, fw = fshape[-3:-1]
        else:
            fh, fw = fshape[-2:]
        if p.sparse == "GROUP":
            # a group filter is (G, OCpG, ICpG, ...) (NCHW88: those counted in blocks of 8):
            # depthwise when both are one channel
            icg = fshape[2] * (8 if p.format == "NCHW88" and fshape[-2:] == (8, 8) else
                               4 if p.format == "NCHW4" else 1)  # fmt: skip
            ocg = fshape[1] * (8 if p.format == "NCHW88" and fshape[-2:] == (8, 8) else 1)
            grouping = "depthwise" if (icg, ocg) == (1, 1) else f"grouped {icg}/group"
        else:
            grouping = "dense"
        kind = (
            f"{kind.replace('Forward', '')} {p.format} {grouping} {fh}x{fw}/s{p.stride_h}"
        )
        if is_quantize(opr.inputs[0].dtype):
            kind = f"{kind} {dtype_name(opr.inputs[0].dtype)}"
        algo = getattr(opr, "chosen_algorithm", None)
        detail = f"{dims(opr.inputs[0])} filter {dims(opr.inputs[1])} -> {shape} [{algo}]"
        return kind, detail
    mode = getattr(p, "mode", None)
    if mode is not None:
        kind = f"{kind} {mode}"
    fmt = getattr(p, "format", None)
    if fmt is not None:
        kind = f"{kind} {fmt}"
    if opr.inputs and is_quantize(opr.inputs[0].dtype):
        kind = f"{kind} {dtype_name(opr.inputs[0].dtype)}"
    return kind, f"-> {shape}"


def operator_times(build, runs: int, warmup: int = 2) -> dict:
    """``{operator: [seconds per run]}`` over the steady state of ``runs`` calls of
    ``build(graph)`` (a function compiled into ``graph``, which a CompGraphProfiler observes;
    called without arguments), after ``warmup`` calls that bind and plan."""
    import megbrain as mgb
    from megbrain.plugin import CompGraphProfiler

    graph = mgb.comp_graph()
    prof = CompGraphProfiler(graph)
    run = build(graph)
    for _ in range(warmup):
        run()
    prof._observer.events.clear()
    for _ in range(runs):
        run()
    per = collections.defaultdict(list)
    for opr, _cn, _ident, t0, t1, _run in list(prof._observer.events):
        per[opr].append(t1 - t0)
    return per


def profile(build, runs: int) -> list[tuple[str, str, float]]:
    """``(kind, detail, seconds)`` per operator of :func:`operator_times`'s steady state:
    the median of its times over the runs, the largest first."""
    rows = []
    for opr, ts in operator_times(build, runs).items():
        if opr.type_name in ("Host2DeviceCopy", "MultipleDeviceTensorHolder"):
            continue
        kind, detail = describe(opr)
        rows.append((kind, detail, statistics.median(ts)))
    return sorted(rows, key=lambda r: -r[2])


def print_profile(name: str, rows, top: int) -> None:
    total = sum(r[2] for r in rows)
    kinds: dict[str, list] = collections.defaultdict(lambda: [0.0, 0, ""])
    for kind, detail, t in rows:
        k = kinds[kind]
        k[0] += t
        k[1] += 1
        k[2] = k[2] or detail  # the largest of the kind, as an example
    print(f"\n{name}: megbrain operators, steady state (sum {total * 1e3:.2f} ms)")
    print(f"  {'kind':52s} {'n':>4s} {'ms':>8s} {'share':>6s}  largest")
    for kind, (t, n, detail) in sorted(kinds.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"  {kind:52s} {n:4d} {t * 1e3:8.3f} {t / total:6.1%}  {detail}")
    print("  top operators:")
    for kind, detail, t in rows[:top]:
        print(f"  {kind:52s} {t * 1e3:8.3f} {t / total:6.1%}  {detail}")
