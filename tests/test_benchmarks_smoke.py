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
    for row in ("| W1 | attnflow fused f64, RK4", "| W1 | baseline (a)", "| W2 | blocked kernel",
                "| W3 | dopri5 vs RK4", "| W3 | bdf vs RK4", "| rk4 | dt=0.5 |"):
        assert row in text
    assert results.read_text() == "\n" + text


def test_gpu_script_on_cpu():
    pytest.importorskip("torch")
    text = load("gpu").main(["--device", "cpu", "--quick"])
    assert "| W1 | RK4 2 steps, torch.float64 | B=64 |" in text
    assert "| W2 | SDPA causal, torch.float32 | n=1024, d=64 |" in text
