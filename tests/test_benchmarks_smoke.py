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
    """Every row of benchmarks/gpu.py at tiny sizes on the CPU (Triton in its interpreter),
    the device tests' step included; no row fails."""
    pytest.importorskip("torch")
    text = load("gpu").main(["--device", "cpu", "--quick"])
    assert "pytest -m gpu tests/test_triton_fused.py" in text and "skipped" in text
    for row in ("| floor | exp: torch.exp over an array (cpu) |  | float32 |",
                "| floor | copy bandwidth (read + write) |", "| floor | GEMM (no TF32) | 256x256 |",
                "| W1 | RK4 1 steps, SDPA + projection | B=2, n=200 | float64 |",
                "| W1B | RK4 1 steps, forward + backward, kernel torch | B=2, n=200 | float64 |",
                "| W1B | RK4 1 steps, forward + backward, kernel torch | B=2, n=200 | float32 |",
                "| E1 | SDPA, head padded to 8 (comparison) | n=512, d=2 | float16 |",
                "| H1 | harmonic kernel, circle, causal, beta 64 | n=4000 | float64 |",
                "| H4 | RK4 dt=0.05 to t=0.1, harmonic, causal, beta 64 | n=300 | float64 |",
                "| W2 | one causal evaluation, attnflow tensor path | n=256, d=64 | float32 |",
                "| BW | forward + backward, checkpoint per step | n=128, 2 steps | float32 |",
                "| TD | torchdiffeq RK4 on W1"):
        assert row in text, row
    if importlib.util.find_spec("triton") is not None:
        assert "| W1 | RK4 1 steps, Triton fused | B=2, n=200 | float32 |" in text
        assert "| E1 | one causal evaluation, Triton fused | n=512, d=2 | float32 |" in text
    else:
        assert "triton not importable" in text
    assert "FAILED" not in text
    assert "float32 >= 25 % of the exp floor" in text  # the targets beside the rows
    with pytest.raises(SystemExit):
        load("gpu").main(["--device", "cpu", "--only", "W9"])


def test_gradients_quick():
    """benchmarks/gradients.py at tiny sizes: its rows, after its own check that simulate's
    gradients equal the plain torch loop's to 1e-12."""
    pytest.importorskip("torch")
    text = load("gradients").main(["--quick"])
    for row in ("| d=2 | B=8, n=60, d=2, causal, beta=64, 1 steps | fused |",
                "| d=3 | B=8, n=60, d=3, causal, beta=64, 1 steps | fused |",
                "| d=64 | B=8, n=60, d=64, causal, beta=1, 1 steps | torch |",
                "| Adam step | B=1, n=24, d=3, full, beta=1, 4 steps | torch |"):
        assert row in text, row


def test_harmonic_quick():
    text = load("harmonic").main(["--quick", "--results", ""])
    for row in ("| H1 | causal, d=2, beta=64, one evaluation | n=4000 |",
                "| H2 | causal, d=2, beta=64, one evaluation | n=20000 |",
                "| H3 | causal, d=3, beta=9, one evaluation | n=4000 |",
                "| H4 | RK4 dt=0.05 to t=0.2, d=2, beta=64, causal | n=2000 |",
                "| H6 | causal, d=2, beta=64, V=K, one evaluation: fused circle path vs general "
                "path vs copy floor | n=20000 |"):
        assert row in text
    assert "vector ISA " in text
    with pytest.raises(SystemExit):
        load("harmonic").main(["--only", "H9", "--results", ""])
