"""Reproduction recipes: one module per claim or figure of the paper (docs/science.md §§2-5).

`RECIPES` maps each recipe's name to its module, in the order of the report. The contract a
recipe module fulfils is described in `attnflow.experiments._recipe`.
"""

from __future__ import annotations

import importlib
from types import ModuleType

NAMES: tuple[str, ...] = ("thm41", "atlas", "fig2", "fig3", "parking", "scaling", "lemma51",
                          "frozen", "causal_vs_full", "spectra", "realmodel")

RECIPES: dict[str, ModuleType] = {
    name: importlib.import_module(f"attnflow.experiments.{name}") for name in NAMES
}

__all__ = ["NAMES", "RECIPES"]
