"""The memory a new array may take: what is available now (`available_memory`), on the host
or on a CUDA device (`device_memory`), and the one-line refusal of a size or shape whose
array cannot fit (`check_allocation`), used by every size argument of the API (tokens,
matrices, mean-field modes) before it allocates.
"""

from __future__ import annotations

import os
from typing import Any

from attnflow._checks import fail

__all__ = ["BUDGET_FRACTION", "available_memory", "check_allocation", "device_memory",
           "size_text"]

BUDGET_FRACTION = 0.8  # of the available memory: what one run or one array may take


def available_memory() -> int:
    """Bytes of host memory available to a new allocation: psutil's `available` (free plus
    reclaimable caches) where psutil is installed, else the free pages (os.sysconf)."""
    try:
        import psutil
    except ImportError:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return int(psutil.virtual_memory().available)


def _cuda_free(device: Any) -> int:
    """Free bytes on a CUDA device (torch.cuda.mem_get_info)."""
    import torch

    return int(torch.cuda.mem_get_info(device)[0])


def device_memory(device: Any) -> tuple[int, str]:
    """(bytes available, where) for arrays on `device` (a torch device, its text, or None
    for numpy): a CUDA device's free memory, else the host's `available_memory`."""
    if device is not None and str(device).startswith("cuda"):
        return _cuda_free(device), f"free on {device}"
    return available_memory(), "available"


def check_allocation(name: str, nbytes: float, what: str, device: Any = None) -> None:
    """Refuse, naming the argument `name`, an array of `nbytes` bytes (described by `what`,
    e.g. "shape (10**9, 2) in float64") above `BUDGET_FRACTION` of the memory available on
    `device` (None: the host)."""
    free, where = device_memory(device)
    limit = BUDGET_FRACTION * free
    if nbytes > limit:
        raise fail(name, f"sizes whose arrays fit in {size_text(limit)} ({BUDGET_FRACTION:.0%} "
                   f"of the memory {where} now)", f"{what}: {size_text(nbytes)}")


def size_text(nbytes: float) -> str:
    """A size for people: 656 MB, 1.6 GB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"
