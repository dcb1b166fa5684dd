"""Reproduction recipes: one module per claim or figure of the paper (docs/science.md §§2-5),
per claim of the follow-up literature (§6) and of real decoders (§7), and per closed form of
2025-26 (§11).

`RECIPES` maps each recipe's name to its module, in the order of the report; `SUITES` groups
them: "paper" (the seed paper), "followups" (the follow-up literature and a real model),
"closedforms" (the closed forms of 2025-26, docs/science.md §11), "gradients" (what
gradients through `simulate` make possible: fitting the model, §11.8); the names are listed here
only. `references_of` gives the papers a recipe checks: its module's
``PAPERS`` (arXiv ids of `attnflow.references.REFERENCES`), the seed paper for the paper suite.
The contract a recipe module fulfils is described in `attnflow.experiments._recipe`.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from attnflow.references import REFERENCES, SEED, Reference

SUITES: dict[str, tuple[str, ...]] = {
    "paper": ("thm41", "atlas", "fig2", "fig3", "parking", "scaling", "lemma51", "frozen",
              "causal_vs_full", "spectra"),
    "followups": ("normalization", "noise", "longcontext", "energy", "meanfield",
                  "realmodel", "depth", "looped", "ladder", "dispersion", "causalprofile",
                  "convergence", "kuramoto"),
    "closedforms": ("lostmiddle", "alibiprofile", "tricritical", "threebody", "selectivity",
                    "gaussian", "hardmax", "funkhecke"),
    "gradients": ("inverse",),
}
NAMES: tuple[str, ...] = tuple(name for names in SUITES.values() for name in names)
SUITE_OF: dict[str, str] = {name: suite for suite, names in SUITES.items() for name in names}

RECIPES: dict[str, ModuleType] = {
    name: importlib.import_module(f"attnflow.experiments.{name}") for name in NAMES
}



def references_of(name: str) -> list[Reference]:
    """The papers whose claims recipe `name` checks (an unknown recipe: none)."""
    default = (SEED,) if SUITE_OF.get(name) == "paper" else ()
    ids = getattr(RECIPES.get(name), "PAPERS", default)
    return [REFERENCES[i] for i in ids]


__all__ = ["NAMES", "RECIPES", "SUITES", "SUITE_OF", "references_of"]
