"""Attention kernels behind one signature (`attnflow.kernels.types.Kernel`).

`get_kernel(name)` returns the kernel registered under a backend name:

* "dense": the readable reference (dense scores); every other kernel is tested against it.
* "fused": numba, for ensembles of runs with small heads (the paper's workloads).
* "blocked": streaming softmax over key blocks, for long sequences in bounded memory.
* "torch": torch's scaled_dot_product_attention on CPU threads (optional extra).
* "auto" (the default of `Attention`): per call, the fastest of dense, fused and blocked
  that has the call's options.

Beside softmax attention, kernels take a score bias and other normalizations
(`attnflow.kernels.options`); `SUPPORTS[name]` lists the options each kernel has.
"""

from __future__ import annotations

import importlib.util

from attnflow._checks import fail
from attnflow.kernels import auto, blocked, dense, fused
from attnflow.kernels import torch as torch_kernel
from attnflow.kernels.types import Kernel, Memory, Normalization

KERNELS: dict[str, Kernel] = {
    "auto": auto.attend,
    "dense": dense.attend,
    "fused": fused.attend,
    "blocked": blocked.attend,
    "torch": torch_kernel.attend,
}

# The options ("bias", "unnormalised", "sinkhorn") each kernel has beside plain softmax.
SUPPORTS: dict[str, frozenset[str]] = {
    "auto": auto.SUPPORTS,
    "dense": dense.SUPPORTS,
    "fused": fused.SUPPORTS,
    "blocked": blocked.SUPPORTS,
    "torch": torch_kernel.SUPPORTS,
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


__all__ = ["KERNELS", "SUPPORTS", "Kernel", "Memory", "Normalization", "get_kernel"]
