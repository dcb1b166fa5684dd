"""What the benchmarks ran on: the CPU, its vector instruction set, and the one numba, numpy and
torch actually use (which `--target avx2` of benchmarks/run.py lowers on an AVX-512 CPU).

`AVX2_ENV` is the environment that makes all of them use AVX2 code on an AVX-512 CPU: numba
compiles for Haswell with Haswell's own features (NUMBA_CPU_NAME alone keeps the host's
features, AVX-512 included), torch dispatches to its AVX2 kernels, numpy leaves out its
AVX-512 dispatch targets, and the OpenBLAS of numpy and scipy (the GEMMs, and numba's np.dot
in the blocked kernel) loads its Haswell kernels. Set it before they are imported.

OPENBLAS_CORETYPE set in the environment picks OpenBLAS's kernels whatever the CPU: this
project's machines have started sessions with OPENBLAS_CORETYPE=Haswell, which on an AVX-512
CPU halves the GEMM rate (measured 2026-12-02, benchmarks/RESULTS.md). `describe` names the
kernels OpenBLAS loaded and the variable where it is set.
"""

from __future__ import annotations

import os
import platform

AVX2_ENV = {"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": "",
            "ATEN_CPU_CAPABILITY": "avx2",
            "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",
            "OPENBLAS_CORETYPE": "Haswell"}


def cpu_flags() -> tuple[str, set[str]]:
    """The CPU's model name and its flags, from /proc/cpuinfo (empty where there is none)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() in ("flags", "Features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return model, flags


def vector_isa(flags: set[str]) -> str:
    """The widest vector instruction set among the CPU's flags."""
    for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"),
                       ("sve", "SVE"), ("asimd", "NEON"), ("sse2", "SSE2")):
        if flag in flags:
            return name
    return "unknown"


def numba_target() -> str:
    """The CPU name numba compiles for and the widest vector set of its features."""
    import llvmlite.binding as ll
    from numba.core import config

    name = config.CPU_NAME or ll.get_host_cpu_name()
    if config.CPU_FEATURES == "":
        return f"{name} (that CPU's own features)"
    features = config.CPU_FEATURES or ll.get_host_cpu_features().flatten()
    enabled = {f[1:] for f in features.split(",") if f.startswith("+")}
    return f"{name} ({vector_isa(enabled)})"


def numpy_dispatch() -> str:
    """numpy's enabled SIMD dispatch targets on this CPU."""
    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__

    return " ".join(t for t in __cpu_dispatch__ if __cpu_features__.get(t)) or "baseline only"


def torch_capability() -> str:
    """The vector code torch dispatches to, or "not installed"."""
    try:
        import torch
    except ImportError:
        return "not installed"
    return torch.backends.cpu.get_cpu_capability()


def openblas_kernels() -> str:
    """The kernels each loaded OpenBLAS runs (numpy's, and scipy's, which numba's np.dot
    calls), and OPENBLAS_CORETYPE where the environment sets it."""
    import scipy.linalg.cython_blas  # noqa: F401  load scipy's BLAS too
    from threadpoolctl import threadpool_info

    kernels = sorted({f"{info.get('architecture')} ({info.get('version')})"
                      for info in threadpool_info() if info.get("internal_api") == "openblas"})
    forced = os.environ.get("OPENBLAS_CORETYPE")
    return (", ".join(kernels) or "none loaded") + (
        f", set by OPENBLAS_CORETYPE={forced}" if forced else "")


def describe() -> str:
    """One sentence for a RESULTS.md entry: CPU, vector ISA, and what each library uses."""
    model, flags = cpu_flags()
    override = " (AVX2 forced: --target avx2)" if os.environ.get("ATEN_CPU_CAPABILITY") else ""
    return (f"CPU: {model}, vector ISA {vector_isa(flags)}{override}; numba target "
            f"{numba_target()}, numpy dispatch {numpy_dispatch()}, torch "
            f"{torch_capability()}, OpenBLAS kernels {openblas_kernels()}")


def loadavg() -> tuple[float, ...]:
    """The 1, 5 and 15 minute load averages (empty where the system has none)."""
    try:
        return os.getloadavg()
    except OSError:
        return ()

