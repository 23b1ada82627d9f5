"""ONNX backend-suite pass counts per operator family, for megbrain's ONNX import.

Runs every node case of the installed ``onnx``'s backend test suite (CPU) on
``megbrain.onnx.backend.MegBrainBackend`` and prints, per operator family
(``megbrain.onnx.support.FAMILIES``), how many claimed cases pass; cases whose op types have
no converter are counted as "not claimed", cases needing a dtype megbrain lacks as
"excluded" (``EXCLUDED_CASES``).  A case belongs to the family of the op type its name
tests (``test_reduce_sum_keepdims`` -> ReduceSum; expanded cases too).

Run: ``python benchmarks/onnx_conformance.py [--failures] [--unclaimed]``
(about a minute).
"""

from __future__ import annotations

import argparse
import collections
import re
import time
import warnings

import numpy as np

#: case-name prefixes that do not spell their op type
_ALIASES = {
    "nllloss": "NegativeLogLikelihoodLoss",
    "sce": "SoftmaxCrossEntropyLoss",
    "batchnorm": "BatchNormalization",
    "instancenorm": "InstanceNormalization",
    "mvn": "MeanVarianceNormalization",
    "trainingdropout": "Dropout",
    "basicconv": "Conv",
    "convwithautopad": "Conv",
    "convwithstrides": "Conv",
    "basicdeformconv": "DeformConv",
    "globalaveragepool": "GlobalAveragePool",
    "globalmaxpool": "GlobalMaxPool",
    "scatterelements": "ScatterElements",
    "castlike": "CastLike",
    "lrn": "LRN",
    "rmsnormalization": "RMSNormalization",
    "logsoftmax": "LogSoftmax",
    "gridsample": "GridSample",
}


def _norm(s: str) -> str:
    return re.sub(r"[^a-z0-9]", "", s.lower())


def _array(v):
    import onnx

    return onnx.numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else v


def principal_op(name: str, node_ops: set[str], all_ops: list[str]) -> str:
    """The op type a case tests: the longest op type (or alias) its name starts with."""
    if len(node_ops) == 1:
        return next(iter(node_ops))
    key = _norm(name.removeprefix("test_"))
    best = ""
    for op in all_ops:
        n = _norm(op)
        if key.startswith(n) and len(n) > len(_norm(best)):
            best = op
    for alias, op in _ALIASES.items():
        if key.startswith(alias) and len(alias) > len(_norm(best)):
            best = op
    return best or sorted(node_ops)[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--failures", action="store_true", help="list the failing cases")
    ap.add_argument("--unclaimed", action="store_true", help="list unclaimed op types")
    ap.add_argument("--other", action="store_true", help="list the op types counted as other")
    args = ap.parse_args()

    import onnx
    from onnx.backend.test.loader import load_model_tests
    from onnx.backend.test.runner import Runner

    from megbrain.onnx.backend import MegBrainBackend
    from megbrain.onnx.support import EXCLUDED_CASES, KNOWN_GAPS, op_family, unclaimed_op_types

    all_ops = sorted({s.name for s in onnx.defs.get_all_schemas_with_history()})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="node")
    stats: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    failures: list[str] = []
    unclaimed: collections.Counter = collections.Counter()
    others: collections.Counter = collections.Counter()
    t0 = time.perf_counter()
    for case in cases:
        model = case.model if case.model is not None else onnx.load(f"{case.model_dir}/model.onnx")
        name = case.name
        run_name = f"{name}_cpu"  # the name the pytest runner matches the patterns against
        op = principal_op(name, {n.op_type for n in model.graph.node}, all_ops)
        fam = op_family(op)
        if fam == "other":
            others[op] += 1
        missing = unclaimed_op_types(model)
        if missing:
            stats[fam]["not claimed"] += 1
            unclaimed.update(missing)
            continue
        if any(re.search(p, run_name) for p in EXCLUDED_CASES):
            stats[fam]["excluded"] += 1
            continue
        stats[fam]["claimed"] += 1
        if any(re.search(p, run_name) for p in KNOWN_GAPS):
            stats[fam]["known gap"] += 1  # claimed, fails, listed with its reason
            failures.append(f"{name}: known gap")
            continue
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                rep = MegBrainBackend.prepare(model)
                for inputs, want in case.data_sets or []:
                    inputs = [_array(v) for v in inputs]
                    want = [_array(v) for v in want]
                    got = rep.run(inputs)
                    Runner.assert_similar_outputs(want, got, rtol=case.rtol, atol=case.atol)
            stats[fam]["passed"] += 1
        except Exception as e:  # noqa: BLE001 - a report, not a test
            failures.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
    dt = time.perf_counter() - t0

    order = sorted(stats, key=lambda f: (f == "other", f))
    print(f"onnx {onnx.__version__}: {len(cases)} node cases, run in {dt:.0f} s")
    head = f"{'family':<22} {'passed':>7} {'claimed':>8} {'excluded':>9} {'not claimed':>12}"
    print(head)
    print("-" * len(head))
    tot = collections.Counter()
    for fam in order:
        c = stats[fam]
        tot.update(c)
        print(
            f"{fam:<22} {c['passed']:>7} {c['claimed']:>8} {c['excluded']:>9}"
            f" {c['not claimed']:>12}"
        )
    print("-" * len(head))
    print(
        f"{'total':<22} {tot['passed']:>7} {tot['claimed']:>8} {tot['excluded']:>9}"
        f" {tot['not claimed']:>12}"
    )
    if tot["known gap"]:
        print(f"claimed cases failing, listed in KNOWN_GAPS: {tot['known gap']}")
    if args.failures:
        print("\nfailing claimed cases:")
        print("\n".join(failures) or "(none)")
    if args.other:
        print("\nop types of the 'other' family (cases):")
        print(", ".join(f"{k} ({v})" for k, v in others.most_common()))
    if args.unclaimed:
        print("\nunclaimed op types (cases):")
        print(", ".join(f"{k} ({v})" for k, v in unclaimed.most_common()))


if __name__ == "__main__":
    main()
