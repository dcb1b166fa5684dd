"""The array layer: which array library an input belongs to, and the few operations the
family needs beyond the array API standard.

attnflow computes on whichever array it is given: numpy arrays (the numba kernels, today's
results bit for bit) or torch tensors (any device, any float dtype, with autograd). The
family's arithmetic asks its input for its namespace (`namespace`, numpy itself for numpy
inputs, `array_api_compat`'s torch namespace for tensors, as scikit-learn and POT do) and
uses the helpers here where the standard has no function (erf, sinc); `attnflow.sphere`'s
`inner`, `normalize`, `project` keep numpy's fast paths (einsum, numba) and take tensors.
Parameters given as numpy arrays meet tensor tokens through `like` (moved once per device
and dtype, then cached); parameters given as tensors stay tensors, so that gradients reach
them. torch is imported only when a tensor is seen (it stays an optional dependency).
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

from attnflow._checks import describe, fail, finite_array

__all__ = ["TOKEN_DTYPES", "arange", "check_parameter", "check_storage", "check_tokens",
           "device_of", "dtype_name", "erf", "is_tensor", "like", "moved", "namespace",
           "on_device", "scalar", "sinc", "tensor_scalar", "tensors_of", "to_numpy"]

# The dtypes tokens may have, arrays and tensors alike (integer arrays become float64): the
# numba kernels and the Triton kernels compute in these, the sphere's tolerance
# (`manifolds.sphere_tolerance`) is a few ulps of them, and saved runs hold them.
TOKEN_DTYPES = ("float32", "float64")
_TOKENS_EXPECTED = ("float32 or float64 tokens (float16 and bfloat16 are refused: cast with "
                    ".float() or .astype(np.float32))")


_TENSOR: Any = None  # torch.Tensor, once torch has been imported


def is_tensor(x: Any) -> bool:
    """True for a torch tensor (checked without importing torch: before torch is in
    sys.modules no tensor exists). An isinstance test, which torch.compile traces without a
    graph break."""
    global _TENSOR
    if _TENSOR is None:
        torch = sys.modules.get("torch")
        if torch is None or not hasattr(torch, "Tensor"):
            return False
        _TENSOR = torch.Tensor
    return isinstance(x, _TENSOR)


def namespace(*xs: Any) -> Any:
    """The array namespace of the inputs: numpy itself unless one is a tensor, then
    `array_api_compat`'s torch namespace (None entries are skipped)."""
    tensors = [x for x in xs if x is not None and is_tensor(x)]
    if not tensors:
        return np
    import array_api_compat

    return array_api_compat.array_namespace(*tensors)


_CACHE: dict[tuple[int, str, str], tuple[Any, Any]] = {}
_CACHE_SIZE = 512


def like(a: Any, x: Any) -> Any:
    """The parameter `a` (a numpy array, a tensor, or None) as an array of x's library, dtype
    and device. numpy for numpy: `a.astype(x.dtype, copy=False)` (no copy when the dtypes
    agree). A numpy array for a tensor is moved once per (array, dtype, device) and cached
    (the array is kept alive beside its copy, so its id stays its own). A tensor for a
    tensor keeps its graph (`Tensor.to`)."""
    if a is None:
        return None
    if isinstance(x, np.ndarray):
        if is_tensor(a):
            raise fail("tokens", "a torch tensor for a model with tensor parameters (pass x0 "
                       "as a tensor, or simulate(..., device=...))", "a numpy array")
        return a.astype(x.dtype, copy=False)
    if is_tensor(a):
        if a.dtype == x.dtype and a.device == x.device:
            return a
        return a.to(device=x.device, dtype=x.dtype)
    key = (id(a), str(x.dtype), str(x.device))
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is a:
        return hit[1]
    import torch

    out = torch.as_tensor(np.asarray(a), dtype=x.dtype, device=x.device)
    if len(_CACHE) >= _CACHE_SIZE:
        _CACHE.clear()
    _CACHE[key] = (a, out)
    return out


def moved(a: np.ndarray, x: Any) -> Any:
    """A fresh numpy array as a tensor of x's dtype on x's device (not cached: for arrays
    made per call, such as noise increments)."""
    import torch

    return torch.as_tensor(a, dtype=x.dtype, device=x.device)


def arange(n: int, like_x: Any) -> Any:
    """0, 1, ..., n - 1 in float64 in x's library (and on its device)."""
    if isinstance(like_x, np.ndarray):
        return np.arange(n, dtype=float)
    import torch

    return torch.arange(n, dtype=torch.float64, device=like_x.device)


def erf(z: Any) -> Any:
    """The error function elementwise (not in the array API standard)."""
    if isinstance(z, np.ndarray):
        from scipy.special import erf as sp_erf

        return sp_erf(z)
    import torch

    return torch.special.erf(z)


def sinc(z: Any) -> Any:
    """sin(pi z) / (pi z), 1 at 0 (numpy's convention)."""
    if isinstance(z, np.ndarray):
        return np.sinc(z)
    import torch

    return torch.sinc(z)


def to_numpy(x: Any) -> Any:
    """A tensor as a numpy array (detached, on the host); anything else as it is."""
    if is_tensor(x):
        return x.detach().cpu().numpy()
    return x


def scalar(x: Any) -> Any:
    """A tensor with one element as a Python float (for records and messages)."""
    return float(x.detach().cpu()) if is_tensor(x) else x


def device_of(x: Any) -> str:
    """"cpu" for numpy arrays, else the tensor's device ("cuda:0", ...)."""
    return str(x.device) if is_tensor(x) else "cpu"


def dtype_name(x: Any) -> str:
    """The dtype's short name, "float64", "float32", ... for arrays and tensors alike."""
    return str(x.dtype).removeprefix("torch.")


def check_parameter(name: str, a: Any, ndim: int | None = None, dtype: Any = None) -> Any:
    """A model parameter: a tensor is validated without conversion (floating, finite, rank)
    and returned as it is, so that autograd reaches it; anything else goes through
    `finite_array` and becomes a float array."""
    if not is_tensor(a):
        arr = finite_array(name, a, ndim=ndim, dtype=dtype)
        return arr if arr.dtype.kind == "f" else arr.astype(float)
    check_storage(name, a)
    if not a.is_floating_point():
        raise fail(name, "a floating-point tensor", f"a tensor of dtype {a.dtype}")
    if ndim is not None and a.ndim != ndim:
        raise fail(name, f"a tensor with {ndim} dimensions", f"shape {tuple(a.shape)}")
    import torch

    with torch.no_grad():
        bad = int((~torch.isfinite(a)).sum())
    if bad:
        raise fail(name, "finite entries", f"{bad} non-finite entries in a tensor of shape "
                   f"{tuple(a.shape)}")
    return a


def check_tokens(name: str, X: Any, min_ndim: int = 2) -> Any:
    """Tokens (..., n, d): a floating tensor (finite, checked on its device, unchanged), or
    an array through `finite_array` (floats)."""
    if not is_tensor(X):
        X = finite_array(name, X, min_ndim=min_ndim)
        if not np.issubdtype(X.dtype, np.floating):
            return X.astype(float)
        if X.dtype.name not in TOKEN_DTYPES:
            raise fail(name, _TOKENS_EXPECTED, f"an array of dtype {X.dtype}")
        return X
    check_storage(name, X)
    if dtype_name(X) not in TOKEN_DTYPES:
        raise fail(name, _TOKENS_EXPECTED, f"a tensor of dtype {X.dtype}")
    if X.ndim < min_ndim:
        raise fail(name, f"an array with at least {min_ndim} dimensions",
                   f"a tensor of shape {tuple(X.shape)}")
    if X.numel():
        import torch

        with torch.no_grad():
            if not bool(torch.isfinite(X).all()):
                raise fail(name, "finite entries", f"non-finite entries in a tensor of shape "
                           f"{tuple(X.shape)}")
    return X


def tensor_scalar(name: str, value: Any, low: float = -math.inf, low_open: bool = False,
                  expected: str = "a finite number") -> Any:
    """A 0-d floating tensor checked like `_checks.number` (kept as a tensor: a parameter
    that gradients reach)."""
    check_storage(name, value)
    if not value.is_floating_point() or value.ndim != 0:
        raise fail(name, expected + " (a 0-d floating tensor)", describe(value))
    v = float(value.detach().cpu())
    if not math.isfinite(v) or v < low or (low_open and v == low):
        raise fail(name, expected, repr(v))
    return value


def check_storage(name: str, a: Any) -> Any:
    """A tensor that holds values: tensors on the "meta" device (shapes without storage)
    are refused, naming the argument. Returns `a`."""
    if a.is_meta:
        raise fail(name, "a tensor that holds values (on 'cpu' or a CUDA device; 'meta' "
                   "tensors have shapes only)", describe(a))
    return a


def _reachable(torch: Any, device: Any) -> Any:
    """The torch device named by `device`, where this torch can allocate (ValueError
    otherwise: an unknown name, "meta", a CUDA device without CUDA or past the count)."""
    try:
        target = torch.device(device)
    except (RuntimeError, TypeError):
        raise fail("device", "a torch device ('cpu', 'cuda', 'cuda:1', ...) or None",
                   repr(device)) from None
    if target.type == "meta":
        raise fail("device", "a device whose tensors hold values ('cpu', 'cuda', ...; "
                   "'meta' tensors have shapes only)", repr(device))
    if target.type == "cuda" and not torch.cuda.is_available():
        raise fail("device", "a device this torch can reach ('cpu' here: this torch has "
                   "no CUDA device, or was built without CUDA)", repr(device))
    try:
        torch.empty(0, device=target)
    except (RuntimeError, AssertionError) as err:  # no such backend, index past the count
        raise fail("device", "a device this torch can reach",
                   f"{device!r} ({' '.join(str(err).split())[:120]})") from None
    return target


def on_device(x0: Any, device: Any, params: list[Any]) -> Any:
    """The initial tokens x0 where a run happens: a tensor on `device` when one is named
    (numpy arrays converted, tensors moved, both differentiably); a numpy x0 beside tensor
    `params` (a model's, `tensors_of`) goes to their device; otherwise x0 as it is. A tensor
    x0 on another device than the parameters is an error naming both."""
    if device is None and not is_tensor(x0) and not params:
        return x0
    try:
        import torch
    except ImportError:
        raise fail("device", "None without torch (pip install attnflow[torch])",
                   repr(device)) from None
    if device is not None:
        target = _reachable(torch, device)
    else:
        target = x0.device if is_tensor(x0) else params[0].device
    if not is_tensor(x0):
        x0 = np.asarray(x0)
        x0 = torch.as_tensor(x0 if x0.dtype.kind == "f" else x0.astype(float), device=target)
    elif x0.device != target:
        x0 = x0.to(target)
    other = sorted({str(p.device) for p in params if p.device != x0.device})
    if other:
        raise fail("x0", f"tokens on the device of the model's tensor parameters ({other[0]}): "
                   "move the model's tensors or pass device=", f"a tensor on {x0.device}")
    return x0


def tensors_of(obj: Any) -> list[Any]:
    """The torch tensors among an attnflow object's parameters (a model: heads, beta,
    strength, encodings, norms, MLP weights), found by walking its public attributes, lists
    and tuples (private caches, such as stacked copies, are skipped)."""
    found: dict[int, Any] = {}
    seen: set[int] = set()

    def walk(item: Any, depth: int) -> None:
        if depth > 8 or id(item) in seen or item is None or isinstance(item, (str, bytes)):
            return
        seen.add(id(item))
        if is_tensor(item):
            found[id(item)] = item
        elif isinstance(item, (list, tuple)):
            for member in item:
                walk(member, depth + 1)
        elif type(item).__module__.startswith("attnflow"):
            for name, value in getattr(item, "__dict__", {}).items():
                if not name.startswith("_"):
                    walk(value, depth + 1)

    walk(obj, 0)
    return list(found.values())
