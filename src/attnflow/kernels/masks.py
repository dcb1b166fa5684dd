"""Attention masks: which keys each query token may attend to.

A mask spec is one of
* ``"causal"``: token k attends to tokens 1..k (decoder-style);
* ``"full"``: every token attends to every token;
* ``("window", w)``: token k attends to tokens k-w+1..k (causal sliding window, w >= 1);
* a boolean (n, n) array, entry [k, j] True when token k attends to token j (a numpy
  array or a torch boolean tensor, kept as a numpy array: a mask is structure, not a
  parameter, and the tensor kernel moves it to the tokens' device once).

The command line's text forms are accepted everywhere too: ``"window:W"`` and ``"FILE.npy"``
(`mask_from_text`).
"""

from __future__ import annotations

from typing import Any, Union

import numpy as np

from attnflow._array import check_storage, is_tensor, to_numpy
from attnflow._checks import describe, fail, integer

MaskSpec = Union[str, tuple, np.ndarray]
MAX_WINDOW = 2**31 - 1  # wider than any n: such a window is the causal mask


def check_mask(mask: Any) -> MaskSpec:
    """Validate a mask spec and return its canonical form (see module docstring); text is
    read as on the command line (`mask_from_text`)."""
    if isinstance(mask, str):
        return mask_from_text(mask)
    if isinstance(mask, (tuple, list)) and len(mask) == 2 and mask[0] == "window":
        return ("window", integer("mask", mask[1], 1, MAX_WINDOW, expected=(
            f"a window width 1 <= w <= {MAX_WINDOW} (an integer; a wider window is 'causal') "
            "in ('window', w)")))
    if is_tensor(mask):
        mask = to_numpy(check_storage("mask", mask))
    if isinstance(mask, np.ndarray) or isinstance(mask, (list, tuple)):
        arr = np.asarray(mask)
        if arr.dtype != bool or arr.ndim != 2 or arr.shape[0] != arr.shape[1]:
            raise fail("mask", "a boolean (n, n) array", describe(arr))
        return arr
    raise fail("mask", "'causal', 'full', ('window', w) or a boolean (n, n) array or tensor",
               describe(mask))


def mask_from_text(text: str, name: str = "mask") -> MaskSpec:
    """The mask spec written as text: 'causal', 'full', 'window:W' or FILE.npy (a boolean
    (n, n) array, loaded with allow_pickle=False). `name` is the argument named in errors."""
    if text.startswith("window:"):
        w = text.split(":", 1)[1]
        if not (w.isdigit() and len(w) <= 10) or not 1 <= int(w) <= MAX_WINDOW:
            raise fail(name, f"window:W with an integer 1 <= W <= {MAX_WINDOW} (a wider window "
                       "is 'causal')", repr(text))
        return ("window", int(w))
    if text.endswith(".npy"):
        try:
            return check_mask(np.load(text, allow_pickle=False))
        except (OSError, ValueError) as err:
            raise fail(name, "a readable .npy file of a boolean (n, n) array",
                       f"{text!r} ({err})") from None
    if text not in ("causal", "full"):
        raise fail(name, "'causal', 'full', 'window:W', FILE.npy, ('window', w) or a boolean "
                   "(n, n) array", repr(text))
    return text


def mask_matrix(mask: MaskSpec, n: int) -> np.ndarray:
    """The boolean (n, n) matrix of a canonical mask spec; entry [k, j]: k attends to j."""
    if isinstance(mask, np.ndarray):
        if mask.shape != (n, n):
            raise fail("mask", f"a boolean ({n}, {n}) array for n = {n} tokens", describe(mask))
        return mask
    if mask == "full":
        return np.ones((n, n), dtype=bool)
    k = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    if mask == "causal":
        return j <= k
    w = mask[1]
    return (j <= k) & (j > k - w)


def is_lower_triangular(mask: MaskSpec) -> bool:
    """True when the mask never lets a token see a later token (causal, window, or such an
    array): then token k's dynamics depend on tokens 1..k only."""
    if isinstance(mask, np.ndarray):
        return not np.any(np.triu(mask, 1))
    return mask != "full"


def mask_to_record(mask: MaskSpec, arrays: dict[str, np.ndarray] | None = None) -> Any:
    """A JSON-friendly record of a mask spec. An array goes into `arrays` as "mask" (saved
    as a variable of the file) and the record names it, {"array": "mask"}; without
    `arrays`, as nested lists of 0 and 1 (the form of earlier versions)."""
    if isinstance(mask, np.ndarray):
        if arrays is not None:
            arrays["mask"] = mask
            return {"array": "mask"}
        return {"array": mask.astype(int).tolist()}
    if isinstance(mask, tuple):
        return list(mask)
    return mask


def mask_from_record(rec: Any, arrays: dict[str, np.ndarray] | None = None) -> MaskSpec:
    """Inverse of `mask_to_record`. Only what a record holds is read: a named mask
    ("causal", "full"), a window or an array (in `arrays`, or as nested lists); a text that
    names a file (``FILE.npy``) is refused, so that a saved run never makes its reader open
    another file."""
    if isinstance(rec, dict) and "array" in rec:
        held = rec["array"]
        if isinstance(held, str):
            if held not in (arrays or {}):
                raise fail("mask", "an array of the record's arrays", repr(held)[:80])
            held = arrays[held]
        arr = np.asarray(held)
        if arr.ndim != 2 or arr.shape[0] != arr.shape[1] or arr.dtype.kind not in "biu":
            raise fail("mask", "a square (n, n) array of 0 and 1", describe(arr))
        return arr.astype(bool)
    if (isinstance(rec, list) and len(rec) == 2 and rec[0] == "window"
            and isinstance(rec[1], int) and not isinstance(rec[1], bool) and rec[1] >= 1):
        return ("window", rec[1])
    if rec in ("causal", "full"):
        return rec
    raise fail("mask", "'causal', 'full', ['window', w] or {'array': ...} in a record (a file "
               "name is never read from a record)", repr(rec)[:80])
