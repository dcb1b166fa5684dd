"""The grid fields a sweep may vary, each with its checker and default: the one place to
edit when the model family gains or loses an option.

`axes()` lists them in the order of the store's dims. The model family's text options come
from the registry of parts (`attnflow.family.PARTS`, read at each call, so a part registered
later is an axis too): `family_axes` gives their checkers and defaults, `family_model_options`
turns their values into `Attention` options. `owned()` says which fields a saved model file
(``grid.model``) holds itself, so that the spec must leave them out.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from attnflow._checks import fail, inverse_temperature
from attnflow._checks import integer as checked_integer
from attnflow.family.text import DEFAULTS, family_options, option_names
from attnflow.kernels import KERNELS, get_kernel
from attnflow.kernels.masks import mask_from_text
from attnflow.methods import METHODS

Check = Callable[[str, Any], Any]  # (the field's name in errors, raw value) -> checked value
REQUIRED = ...  # the default of a field the spec must give


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def real(lo: float, strict: bool) -> Check:
    """A checker of numbers > lo (strict) or >= lo."""
    want = f"a number {'>' if strict else '>='} {lo:g}"

    def check(name: str, v: Any) -> float:
        if not is_number(v) or not math.isfinite(v) or v < lo or (strict and v == lo):
            raise fail(name, want, repr(v))
        return float(v)

    return check


def beta_value(name: str, v: Any) -> float:
    """beta: a number of either sign, or +-inf (hardmax attention; TOML's `inf`, the texts
    "inf", "+inf", "-inf"), checked by `attnflow._checks.inverse_temperature`."""
    if isinstance(v, str) and v.strip().lower() in ("inf", "+inf", "-inf"):
        return -math.inf if v.strip().startswith("-") else math.inf
    return inverse_temperature(name, v)


def integer(lo: int, hi: int | None = None) -> Check:
    """A checker of integers in [lo, hi] (`attnflow._checks.integer`; hi None: no bound)."""
    def check(name: str, v: Any) -> int:
        return checked_integer(name, v, lo, hi)

    return check


def text(name: str, v: Any) -> str:
    if not isinstance(v, str) or not v.strip():
        raise fail(name, "a non-empty string", repr(v))
    return v.strip()


def _one_of(choices: tuple[str, ...]) -> Check:
    def check(name: str, v: Any) -> str:
        if v not in choices:
            raise fail(name, f"one of {', '.join(choices)}", repr(v))
        return v

    return check


def _backend(name: str, v: Any) -> str:
    """A kernel name (`attnflow.kernels.KERNELS`) or harmonic:TOL, stripped."""
    v = text(name, v).strip()
    try:
        get_kernel(v)
    except ValueError as err:  # its reason (a tolerance out of range, torch not installed)
        raise fail(name, f"one of {', '.join(KERNELS)} or harmonic:TOL ({err})",
                   repr(v)) from None
    return v


def _mask_text(name: str, v: Any) -> str:
    mask_from_text(text(name, v), name)
    return v.strip()


def _model_file(name: str, v: Any) -> str:
    path = text(name, v)
    if not path.endswith(MODEL_FILES):
        raise fail(name, "a model file: a Trajectory (.nc, .zarr) or per-layer weights (.npz)",
                   repr(v))
    return path


def _family_text(option: str) -> Check:
    """A checker of one of the model family's text options (`attnflow.family.text`)."""

    def check(name: str, v: Any) -> str:
        if is_number(v):  # a number is its text form (strength = 2, alibi = 0.5)
            v = repr(float(v))
        # (random MLP weights are drawn for a token dimension of 2 only to check the text)
        family_options(**{option: text(name, v)}, names={option: name}, d=2)
        return v.strip()

    return check


def family_axes() -> dict[str, tuple[Check, Any]]:
    """The model family's options as sweep fields: {name: (checker, default)}, each value
    the text form a run's model is built from (`family_model_options`): every registered
    part with a text form, and nGPT's alpha."""
    out = {name: (_family_text(name), DEFAULTS.get(name, "none")) for name in option_names()}
    out["alpha"] = (real(0, strict=True), 0.2)
    return out


def family_model_options(point: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments of `attnflow.Attention` from a grid point's values of the fields of
    `family_axes` (`attnflow.family.text.family_options`; random MLP weights for the point's
    d)."""
    texts = {name: (None if point[name] == "none" and name not in DEFAULTS else point[name])
             for name in family_axes()}
    return family_options(**texts, d=point.get("d"))


MODEL_FILES = (".nc", ".zarr", ".npz")
MATRICES = ("Q", "K", "V")

def axes() -> dict[str, tuple[Check, Any]]:
    """Grid fields that may be axes, in the order of the store's dims: checker, default (None:
    the simulate or model default, not recorded)."""
    return {
    "model": (_model_file, None),
    "beta": (beta_value, REQUIRED),
    "n": (integer(1), REQUIRED),
    "d": (integer(2), REQUIRED),
    "mask": (_mask_text, "causal"),
    "Q": (text, "identity"),
    "K": (text, "identity"),
    "V": (text, "identity"),
    "method": (_one_of(METHODS), "rk4"),
    "dt": (real(0, strict=True), None),
    "rtol": (real(0, strict=True), None),
    "atol": (real(0, strict=True), None),
    "backend": (_backend, None),
    **family_axes(),
    "noise": (real(0, strict=False), None),
    }


def owned() -> dict[str, tuple[str, ...]]:
    """The fields a model file holds itself, by kind: per-layer weights hold the matrices (the
    other options apply to every layer); a Trajectory's record holds the whole model."""
    return {"weights": MATRICES,
            "trajectory": ("beta", "mask", *MATRICES, "backend", *family_axes())}


def model_kind(path: str) -> str:
    """"weights" for an .npz of per-layer weights, "trajectory" for a saved Trajectory."""
    return "weights" if path.endswith(".npz") else "trajectory"
