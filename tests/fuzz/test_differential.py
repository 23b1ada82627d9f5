"""Random graphs agree across graph configurations, with NumPy and with finite differences.

The CI test checks the graphs of seeds 0, 1, 2, ... for ``MGB_FUZZ_CI_SECONDS`` (default 25)
seconds, and at least 5 graphs on a machine too busy to check them in that time; the long run
(``pytest -m slow tests/fuzz``) checks seeds from ``MGB_FUZZ_SEED`` (default 100000) for
``MGB_FUZZ_SECONDS`` (default 900) seconds or ``MGB_FUZZ_GRAPHS`` graphs.
A failure names the seed, the configuration and the (minimized) graph;
``python tests/fuzz/graph_fuzzer.py --seed N --repro`` prints a standalone reproducer.
"""

from __future__ import annotations

import os

import graph_fuzzer as gf
import numpy as np
import pytest


def _env(name: str, default: float) -> float:
    return float(os.environ.get(name) or default)


def test_random_graphs_agree_across_configurations():
    res = gf.campaign(
        range(1 << 30), _env("MGB_FUZZ_CI_SECONDS", 25), min_graphs=5, minimize_seconds=10
    )
    print(res.report(limit=100))
    assert not res.mismatches, res.report()
    if res.graphs >= 20:  # every operator family was exercised
        assert not set(gf.OPERATORS) - set(res.operators), res.operators


@pytest.mark.slow
def test_random_graphs_long_run():
    n = os.environ.get("MGB_FUZZ_GRAPHS")
    start = int(_env("MGB_FUZZ_SEED", 100000))
    res = gf.campaign(
        range(start, start + (1 << 30)),
        _env("MGB_FUZZ_SECONDS", 900 if not n else 1 << 30),
        max_graphs=int(n) if n else None,
        log=print,
    )
    print(res.report(limit=100))
    assert not res.mismatches, res.report()


# ---- the tester itself -------------------------------------------------------------------
def test_generation_is_reproducible():
    a, b = gf.generate(7), gf.generate(7)
    assert a.program() == b.program()
    for x, y in zip(a.values, b.values):
        np.testing.assert_array_equal(x, y)
    assert 3 <= a.n_ops <= 40  # 3-30 operators plus the reshapes some of them need
    assert gf.generate(8).program() != a.program()


def test_a_wrong_answer_is_found_and_minimized(monkeypatch):
    """A reference that disagrees with TANH is reported, and reduced to a small graph."""
    seed = next(
        s
        for s in range(200)
        if any(n.attrs.get("mode") == "TANH" for n in gf.generate(s).nodes)
        and gf.generate(s).n_ops >= 5
    )
    desc = gf.generate(seed)
    monkeypatch.setitem(gf.UNARY, "TANH", lambda x: np.tanh(x) + 0.5)
    desc.values, desc.margins = gf.ref_eval(desc.nodes)
    found = gf.check_desc(desc, configs=[], fd=False)
    assert {m.kind for m in found} >= {"reference"}, [m.report() for m in found]
    m = next(m for m in found if m.kind == "reference")
    small = gf.minimize(desc, gf._still_fails(m), seconds=30)
    assert small.n_ops < desc.n_ops or desc.n_ops == 1
    assert any(n.attrs.get("mode") == "TANH" for n in small.nodes)
    assert "seed" in m.report() and "TANH" in m.report()


@pytest.mark.parametrize("config", ["no_mem_reuse", "2cn_async", "eager"])
def test_reproducer_scripts_run(config):
    desc = gf.generate(3)
    for kind in ("grad", "finite-diff"):
        code = gf.reproducer(gf.Mismatch(desc.seed, config, kind, "", desc))
        exec(compile(code, f"<reproducer {config} {kind}>", "exec"), {})
