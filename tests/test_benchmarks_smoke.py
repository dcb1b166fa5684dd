"""The benchmark scripts run (not how fast): benchmarks/run.py and benchmarks/gpu.py at tiny
sizes, on the CPU."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_run_quick(tmp_path):
    results = tmp_path / "RESULTS.md"
    text = load("run").main(["--quick", "--no-torch", "--results", str(results)])
    for row in ("| W1 | attnflow fused f64, RK4", "| W1 | attnflow fused f32, RK4",
                "| W1 | floor: fastest exp on all threads at once, float64 |",
                "| W1 | floor: fastest exp on all threads at once, float32 |",
                "| W1 | baseline (a)",
                "| W2 | blocked kernel, one causal field evaluation, float64 |",
                "| W2 | blocked kernel, one causal field evaluation, float32 |",
                "| W3 | dopri5 vs RK4", "| W3 | bdf vs RK4", "| rk4 | dt=0.5 |"):
        assert row in text
    assert "vector ISA " in text and "numba target " in text
    assert results.read_text() == "\n" + text


def test_sdpa_quick():
    pytest.importorskip("torch")
    text = load("run").main(["--quick", "--only", "SDPA", "--sdpa-sizes", "256",
                             "--results", ""])
    for row in ("| SDPA | causal, d=64, beta=1, float64 | n=256 |",
                "| SDPA | causal, d=64, beta=1, float32 | n=256 |",
                "| SDPA | causal, d=2, beta=64, float64 | n=256 |",
                "| SDPA | causal, d=2, beta=64, float32 | n=256 |"):
        assert row in text


def test_fused_floor_native():
    text = load("fused_floor").main(["--target", "native", "--rounds", "1"])
    assert "| float64 |" in text and "| float32 |" in text and "vector ISA " in text


def test_gpu_script_on_cpu():
    pytest.importorskip("torch")
    text = load("gpu").main(["--device", "cpu", "--quick"])
    assert "| W1 | RK4 2 steps, torch.float64 | B=64 |" in text
    assert "| W2 | SDPA causal, torch.float32 | n=1024, d=64 |" in text


def test_harmonic_quick():
    text = load("harmonic").main(["--quick", "--results", ""])
    for row in ("| H1 | causal, d=2, beta=64, one evaluation | n=4000 |",
                "| H2 | causal, d=2, beta=64, one evaluation | n=20000 |",
                "| H3 | causal, d=3, beta=9, one evaluation | n=4000 |",
                "| H4 | RK4 dt=0.05 to t=0.2, d=2, beta=64, causal | n=2000 |"):
        assert row in text
    assert "vector ISA " in text
    with pytest.raises(SystemExit):
        load("harmonic").main(["--only", "H9", "--results", ""])
