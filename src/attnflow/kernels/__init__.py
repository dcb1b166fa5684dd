"""Attention kernels behind one signature (`attnflow.kernels.types.Kernel`).

`get_kernel(name)` returns the kernel registered under a backend name:

* "dense": the readable reference (dense scores); every other kernel is tested against it.
* "fused": numba, for ensembles of runs with small heads (the paper's workloads).
* "blocked": streaming softmax over key blocks, for long sequences in bounded memory.
* "torch": torch's scaled_dot_product_attention on CPU threads (optional extra).
* "auto" (the default of `Attention`): per call, the fastest of dense, fused and blocked.
"""

from __future__ import annotations

import importlib.util

from attnflow._checks import fail
from attnflow.kernels import auto, blocked, dense, fused
from attnflow.kernels import torch as torch_kernel
from attnflow.kernels.types import Kernel, Memory

KERNELS: dict[str, Kernel] = {
    "auto": auto.attend,
    "dense": dense.attend,
    "fused": fused.attend,
    "blocked": blocked.attend,
    "torch": torch_kernel.attend,
}


def get_kernel(name: str) -> Kernel:
    """The kernel registered as `name` (see `KERNELS` for the choices)."""
    try:
        kernel = KERNELS[name]
    except KeyError:
        raise fail("backend", f"one of {sorted(KERNELS)}", repr(name)) from None
    if name == "torch" and importlib.util.find_spec("torch") is None:
        raise fail("backend", "an installed backend ('torch' needs: pip install attnflow[torch])",
                   repr(name))
    return kernel


__all__ = ["KERNELS", "Kernel", "Memory", "get_kernel"]
