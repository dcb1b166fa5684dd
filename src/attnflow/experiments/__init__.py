"""Reproduction recipes: one module per claim or figure of the paper (docs/science.md §§2-5),
per claim of the follow-up literature (§6) and of real decoders (§7), and per closed form of
2025-26 (§11).

`RECIPES` maps each recipe's name to its module, in the order of the report; `SUITES` groups
them: "paper" (the seed paper), "followups" (the follow-up literature and a real model),
"closedforms" (the closed forms of 2025-26, docs/science.md §11), "gradients" (what
gradients through the torch engine make possible); the names are listed here
only. `cause_of` gives the ledger's measured cause of a verdict short of "reproduced";
`references_of` gives the papers a recipe checks: its module's
``PAPERS`` (arXiv ids of `attnflow.references.REFERENCES`), the seed paper for the paper suite.
The contract a recipe module fulfils is described in `attnflow.experiments._recipe`.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from attnflow.experiments._ledger import entries
from attnflow.references import REFERENCES, SEED, Reference

SUITES: dict[str, tuple[str, ...]] = {
    "paper": ("thm41", "atlas", "fig2", "fig3", "parking", "scaling", "lemma51", "frozen",
              "causal_vs_full", "spectra"),
    "followups": ("normalization", "noise", "longcontext", "energy", "meanfield",
                  "realmodel", "depth", "looped", "ladder", "dispersion", "causalprofile",
                  "convergence", "kuramoto"),
    "closedforms": ("lostmiddle", "alibiprofile", "tricritical", "threebody", "selectivity",
                    "gaussian", "hardmax", "funkhecke"),
    "gradients": ("influence", "inverse", "realfit"),
}
NAMES: tuple[str, ...] = tuple(name for names in SUITES.values() for name in names)
SUITE_OF: dict[str, str] = {name: suite for suite, names in SUITES.items() for name in names}

RECIPES: dict[str, ModuleType] = {
    name: importlib.import_module(f"attnflow.experiments.{name}") for name in NAMES
}



def cause_of(id: str) -> str:
    """The measured cause the ledger gives for claim `id` falling short of "reproduced"
    (claims.toml's ``cause``; "" for a claim without one or an id not in the ledger)."""
    found = entries().get(id)
    return found.cause if found else ""


def references_of(name: str) -> list[Reference]:
    """The papers whose claims recipe `name` checks (an unknown recipe: none)."""
    default = (SEED,) if SUITE_OF.get(name) == "paper" else ()
    ids = getattr(RECIPES.get(name), "PAPERS", default)
    return [REFERENCES[i] for i in ids]


__all__ = ["NAMES", "RECIPES", "SUITES", "SUITE_OF", "cause_of", "references_of"]
