"""benchmarks/quantized.py on a 32x32 input, one round, so that the benchmark cannot rot: its
int8 networks build, compile int8, export, and agree with onnxruntime. Times are not checked.
Skipped without onnxruntime or threadpoolctl (benchmark peers here). Marked slow (about a minute:
two networks compiled in three forms, and onnxruntime's int8 ConvInteger path); run it with
``pytest -m slow tests/onnx/test_quantized_benchmark.py`` before changing the benchmark."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("threadpoolctl")

_BENCHMARKS = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks"
)


@pytest.mark.slow
def test_quantized_benchmark_runs_on_a_small_input(monkeypatch, capsys):
    monkeypatch.syspath_prepend(_BENCHMARKS)
    import quantized

    rows = quantized.main(["--size", "32", "--rounds", "1", "--threads", "1", "--profile",
                           "--top", "3", "--nodes"])  # fmt: skip
    out = capsys.readouterr().out
    assert [r["model"] for r in rows] == ["resnet18", "mobilenet_v2"]
    for r in rows:
        assert min(r["int8"], r["float32"], r["onnxruntime"], r["onnxruntime u8"]) > 0
        for peer in ("onnxruntime", "onnxruntime u8"):
            assert r[f"{peer} agreement"]["features max units"] <= 1, r
        # the optimized int8 graph keeps int8: float only around the classifier and input
        assert r["float operators"] == ["Elemwise", "Host2DeviceCopy", "TypeCvt"], r
    assert "resnet18 int8: megbrain operators" in out
    assert "QuantizedS8" in out
    # the per-node comparison names both sides' convolutions alike
    assert "resnet18, 1 thread(s): per kind of node" in out
    assert out.count("conv dense 3x3/s2") >= 6, out


@pytest.mark.slow
def test_quantized_benchmark_layers_compares_both_splits(monkeypatch, capsys):
    monkeypatch.syspath_prepend(_BENCHMARKS)
    import quantized

    assert quantized.main(["--size", "32", "--rounds", "1", "--threads", "2", "--layers",
                           "--models", "mobilenet_v2"]) == []  # fmt: skip
    out = capsys.readouterr().out
    # every dense layer at 1 and 2 threads, split per phase and by bands (outputs checked
    # equal inside), and the sums
    assert "1t phases" in out and "2t bands" in out and "2t nchw4" in out
    assert "16x16x16 -> 96 1x1/s1" in out
    assert "the layers summed" in out


@pytest.mark.slow
def test_quantized_benchmark_scaling_times_every_convolution(monkeypatch, capsys):
    monkeypatch.syspath_prepend(_BENCHMARKS)
    import quantized

    # ungated (--wait 0): the bursts are taken whatever the host's load
    assert quantized.main(["--size", "32", "--rounds", "1", "--threads", "2", "--scaling",
                           "--wait", "0", "--models", "mobilenet_v2"]) == []  # fmt: skip
    out = capsys.readouterr().out
    # the dense and the depthwise layers, each at 1 and 2 threads, and the sums
    assert "16x16x16 -> 96 1x1/s1" in out
    assert "96x16x16 -> 96 3x3/s2 depthwise" in out
    assert "the layers timed, summed" in out


@pytest.mark.slow
def test_quantized_benchmark_runs_in_nchw4_and_nchw(monkeypatch, capsys):
    monkeypatch.syspath_prepend(_BENCHMARKS)
    import quantized

    monkeypatch.setattr(quantized, "LAYOUT", quantized.LAYOUT)  # (restored after the test)
    rows = quantized.main(["--size", "32", "--rounds", "1", "--threads", "1", "--layout",
                           "use_nchw4", "--models", "resnet18", "--profile", "--top", "3",
                           "--nodes"])  # fmt: skip
    out = capsys.readouterr().out
    for peer in ("onnxruntime", "onnxruntime u8"):
        assert rows[0][f"{peer} agreement"]["features max units"] <= 1, rows
    assert "ConvBias NCHW4" in out
    # the per-node comparison names the NCHW4 convolutions as onnxruntime's
    assert out.count("conv dense 3x3/s2") >= 6, out
    assert "conv stem 7x7/s2" in out
