"""What every reproduction recipe returns, and small helpers they share.

A recipe is a module of `attnflow.experiments` with
* ``NAME``, ``TITLE``: its name on the command line and its heading in the report;
* ``QUICK`` and ``FULL``: parameter dicts (quick sizes for a default run, the paper's sizes);
* ``FULL_MINUTES``: the expected duration of the full size on 2 cores, printed before it runs;
* ``run(params, seed, out, progress) -> Output``: the work; figures go into the folder `out`,
  `progress(fraction)` is called with the fraction done in [0, 1].

Its claims come from the ledger (`attnflow.experiments._ledger`, claims.toml): the recipe
measures, the ledger's criteria decide.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnflow._files import atomic_path

Progress = Callable[[float], None]

REPRODUCED, PARTLY, NOT_REPRODUCED = "reproduced", "partly", "not reproduced"
NOT_RUN = "not run"  # the recipe lacked an input (e.g. no checkpoint available offline)
Z95 = 1.959963984540054  # the two-sided 95 % point of the standard normal


@dataclass
class Claim:
    """One row of the claims table."""

    claim: str  # the claim, short
    paper: str  # what the paper says (as restated in docs/science.md)
    measured: str  # what we measured, with uncertainty
    verdict: str  # REPRODUCED, PARTLY, NOT_REPRODUCED or NOT_RUN
    why: str = ""  # the reason behind the verdict: the criterion and the measured numbers
    id: str = ""  # the claim's entry in the ledger (claims.toml), "recipe.key"
    criterion: str = ""  # the ledger's criterion in words


@dataclass
class Output:
    """A recipe's results: JSON-friendly numbers, claims, and figure files (names in `out`)."""

    numbers: dict[str, Any]
    claims: list[Claim]
    figures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"numbers": to_jsonable(self.numbers), "claims": [asdict(c) for c in self.claims],
                "figures": self.figures, "notes": self.notes}


def save_figure(fig: Any, out: Path, name: str) -> str:
    """Write a matplotlib Figure to out/name (PNG) atomically; return the name."""
    with atomic_path(out / name) as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight", format="png")
    return name


def mean_se(values: Any) -> tuple[float, float]:
    """Mean and standard error of the mean of a sample."""
    v = np.asarray(values, dtype=float).ravel()
    se = float(v.std(ddof=1) / np.sqrt(v.size)) if v.size > 1 else float("nan")
    return float(v.mean()), se


def wilson(k: int, n: int, z: float) -> tuple[float, float]:
    """Wilson score interval (lo, hi) for a proportion k / n at z standard errors."""
    if n == 0:
        return float("nan"), float("nan")
    p, z2 = k / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * np.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return float(centre - half), float(centre + half)


def to_jsonable(obj: Any) -> Any:
    """Numbers, arrays and nested containers as plain JSON types (NaN/inf kept as strings)."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, (np.bool_, bool)):
        return bool(obj)
    if isinstance(obj, (np.integer, int)):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        f = float(obj)
        return f if np.isfinite(f) else str(f)
    return obj
