"""The numba kernels compiled for other x86-64 targets than this CPU's: generic x86-64 (SSE2)
and Haswell (AVX2, its own features: NUMBA_CPU_NAME alone would keep this CPU's AVX-512).
Each target runs in a child process; its results agree with this process's (native target)
to the dtype's rounding, its code uses no register wider than the target has (the 512-bit
request of `kernels._simd` asks for nothing that is missing), and `auto.choose` picks the
same kernels (choices depend on shapes and options only)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import numpy as np
import pytest

CHILD = r"""
import json, re
import numpy as np
from numba import njit
from attnflow.kernels import auto, blocked, fused
from attnflow.kernels._simd import vector_bytes, wide_vectors
from attnflow.kernels._vexp import vexp, vexp2

@njit
def exps(x):
    wide_vectors()
    out = np.empty((2, x.size), x.dtype)
    for i in range(x.size):
        out[0, i] = vexp(x[i])
        out[1, i] = vexp2(x[i])
    return out

rng = np.random.default_rng(5)
q, k, v = rng.standard_normal((3, 37, 19, 2))  # 37 runs: tiles with unused lanes
big = rng.standard_normal((3, 300, 4))
results = {}
for dtype in ("float64", "float32"):
    a = [x.astype(dtype) for x in (q, k, v)]
    results["fused_" + dtype] = fused.attend(*a, 3.0, "causal").tolist()
    results["fused_window_" + dtype] = fused.attend(*a, 3.0, ("window", 5)).tolist()
    b = [x.astype(dtype) for x in big]
    results["blocked_" + dtype] = blocked.attend(*b, 1.0, "causal", block=64).tolist()
    results["exp_" + dtype] = exps(np.linspace(-80, 5, 1001).astype(dtype)).tolist()
asm = "".join(exps.inspect_asm().values())  # compiled afresh (not cached): inspectable
widest = [r for r in ("xmm", "ymm", "zmm") if re.search("%" + r + r"\d", asm)][-1]
shapes = [(1, 32, 3), (1, 500, 64), (5000, 200, 2), (8, 200, 2), (4, 200, 2), (12, 64, 16)]
choices = [auto.choose(np.zeros(s), np.zeros(s)).__module__ for s in shapes]
tiles = [fused.tile_runs(dtype, runs) for dtype in ("float64", "float32") for runs in (8, 5000)]
measured = {"results": results, "widest": widest, "choices": choices,
            "vector_bytes": vector_bytes(), "tiles": tiles}
if __name__ == "__main__":
    print(json.dumps(measured))
"""

TARGETS = {  # target: (environment, widest vector register its code may use)
    "generic": ({"NUMBA_CPU_NAME": "generic"}, "xmm"),
    "haswell": ({"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": ""}, "ymm"),
}
REGISTERS = ["xmm", "ymm", "zmm"]  # 16, 32, 64 bytes


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as fh:
            return next((set(line.split(":", 1)[1].split()) for line in fh
                         if line.startswith("flags")), set())
    except OSError:
        return set()


def run_child(env: dict) -> dict:
    child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                           env={**os.environ, **env}, timeout=600)
    assert child.returncode == 0, child.stderr[-3000:]
    return json.loads(child.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def native() -> dict:
    """The same measurements in this process (the native target)."""
    namespace = {"__name__": "native"}
    exec(CHILD, namespace)
    return json.loads(json.dumps(namespace["measured"]))  # the child's float rounding


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 targets")
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_other_target_agrees_with_native(target, native):
    env, widest = TARGETS[target]
    if target == "haswell" and "avx2" not in cpu_flags():
        pytest.skip("this CPU has no AVX2")
    other = run_child(env)
    assert REGISTERS.index(other["widest"]) <= REGISTERS.index(widest)
    # the fused kernel's tiles: four registers of the target's width (float64, float32),
    # halved for a batch of 8 runs that would leave more than half of them empty
    assert other["vector_bytes"] == 16 << REGISTERS.index(widest)
    full = [4 * other["vector_bytes"] // size for size in (8, 4)]
    assert other["tiles"] == [t for lanes in full for t in
                              (lanes // 2 if 8 <= lanes // 2 else lanes, lanes)]
    assert other["choices"] == native["choices"]
    assert native["choices"][:3] == ["attnflow.kernels.dense", "attnflow.kernels.blocked",
                                     "attnflow.kernels.fused"]
    for key, want in native["results"].items():
        # Different targets contract and reassociate sums differently: agreement to a few
        # units of the dtype's rounding, relative to the values' scale (|values| <= ~3).
        tol = 1e-13 if key.endswith("float64") else 2e-6
        got, want = np.asarray(other["results"][key]), np.asarray(want)
        scale = np.maximum(np.abs(want), 1.0)
        assert np.all(np.abs(got - want) <= tol * scale), (key, np.abs(got - want).max())


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 flags")
def test_native_registers_are_the_cpus(native):
    """The native target's code and tiles use the widest registers the CPU's flags name, no
    wider (AVX-512: 64 bytes, AVX2: 32, else 16)."""
    flags = cpu_flags()
    width = 64 if "avx512f" in flags else 32 if "avx2" in flags else 16
    assert native["vector_bytes"] == width
    assert native["widest"] == REGISTERS[width.bit_length() - 5]
