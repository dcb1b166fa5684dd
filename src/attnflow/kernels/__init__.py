"""Attention kernels behind one signature (`attnflow.kernels.types.Kernel`).

`get_kernel(name)` returns the kernel registered under a backend name:

* "dense": the readable reference (dense scores); every other kernel is tested against it.
* "fused": numba, for ensembles of runs with small heads (the paper's workloads).
* "blocked": streaming softmax over key blocks, for long sequences in bounded memory.
* "torch": torch's scaled_dot_product_attention on CPU threads (optional extra).
* "harmonic" (or "harmonic:TOL", tolerance TOL, default 1e-12): O(n K) harmonic moments on
  the circle and S^2, where queries and keys each have one common norm (`harmonic`).
* "auto" (the default of `Attention`): per call, the fastest of dense, fused, blocked and
  harmonic that has the call's options.

Beside softmax attention, kernels take a score bias and other normalizations
(`attnflow.kernels.options`); `SUPPORTS[name]` lists the options each kernel has.
"""

from __future__ import annotations

import importlib.util

from attnflow._checks import fail
from attnflow.kernels import auto, blocked, dense, fused, fused_torch, harmonic, triton_fused
from attnflow.kernels import torch as torch_kernel
from attnflow.kernels.types import Kernel, Memory, Normalization

KERNELS: dict[str, Kernel] = {
    "auto": auto.attend,
    "dense": dense.attend,
    "fused": fused.attend,
    "blocked": blocked.attend,
    "torch": torch_kernel.attend,
    "harmonic": harmonic.Harmonic(),
}

# The options ("bias", "unnormalised", "positional", "sinkhorn") each kernel has beside plain
# softmax.
SUPPORTS: dict[str, frozenset[str]] = {
    "auto": auto.SUPPORTS,
    "dense": dense.SUPPORTS,
    "fused": fused.SUPPORTS,
    "blocked": blocked.SUPPORTS,
    "torch": torch_kernel.SUPPORTS,
    "harmonic": harmonic.SUPPORTS,
}


def get_kernel(name: str) -> Kernel:
    """The kernel registered as `name` (see `KERNELS` for the choices), or for
    "harmonic:TOL" the harmonic kernel with tolerance TOL."""
    if isinstance(name, str) and name.startswith("harmonic:"):
        try:
            tol = float(name.split(":", 1)[1])
        except ValueError:
            raise fail("backend", "harmonic:TOL with a number TOL (e.g. harmonic:1e-9)",
                       repr(name)) from None
        try:
            return harmonic.Harmonic(tol)
        except ValueError as err:
            raise fail("backend", f"harmonic:TOL with {err}", repr(name)) from None
    try:
        kernel = KERNELS[name]
    except (KeyError, TypeError):
        raise fail("backend", f"one of {sorted(KERNELS)} or harmonic:TOL", repr(name)) from None
    if name == "torch" and importlib.util.find_spec("torch") is None:
        raise fail("backend", "an installed backend ('torch' needs: pip install attnflow[torch])",
                   repr(name))
    return kernel


def kernel_name(kernel: Kernel) -> str:
    """The backend name of a kernel `get_kernel` returns ("harmonic:TOL" for a harmonic kernel
    of another tolerance than the default; "harmonic" for auto's harmonic choice, which falls
    back to blocked per call); the kernel's own name for any other callable."""
    if isinstance(kernel, harmonic.Harmonic):
        return "harmonic" if kernel.tol == harmonic.DEFAULT_TOL else f"harmonic:{kernel.tol:g}"
    if kernel is auto.harmonic_or_blocked:
        return "harmonic"
    for name, registered in KERNELS.items():
        if kernel is registered:
            return name
    if kernel is torch_kernel.attend_tensor:  # auto's choices for tensors (`auto.choose_tensor`)
        return "torch"
    if kernel is fused_torch.attend_tensor:
        return "fused"
    if kernel is triton_fused.attend_or_sdpa:
        return "triton (torch SDPA where gradients are taken)"
    return getattr(kernel, "__qualname__", type(kernel).__name__)


def supports(name: str) -> frozenset[str]:
    """The options (`attnflow.kernels.options`) of the backend `name` (as `get_kernel`)."""
    get_kernel(name)
    return SUPPORTS[name.split(":", 1)[0]]


__all__ = ["KERNELS", "SUPPORTS", "Kernel", "Memory", "Normalization", "get_kernel",
           "kernel_name", "supports"]
