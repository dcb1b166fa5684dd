"""Attention kernels behind one signature (`attnflow.kernels.types.Kernel`).

`get_kernel(name)` returns the kernel registered under a backend name. The dense numpy
kernel is the readable reference; faster kernels register themselves here.
"""

from __future__ import annotations

from attnflow._checks import fail
from attnflow.kernels import dense
from attnflow.kernels.types import Kernel, Memory

KERNELS: dict[str, Kernel] = {"dense": dense.attend}


def get_kernel(name: str) -> Kernel:
    """The kernel registered as `name` (see `KERNELS` for the choices)."""
    try:
        return KERNELS[name]
    except KeyError:
        raise fail("backend", f"one of {sorted(KERNELS)}", repr(name)) from None


__all__ = ["KERNELS", "Kernel", "Memory", "get_kernel"]
