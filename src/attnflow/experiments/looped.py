"""Looped real decoders: the whole stack applied again and again, weights tied across depth
(docs/science.md §7-8), in the spirit of Rodríguez Abella, Silvestre and Tabuada
(ICML 2025), who looped GPT-2 and GPT-Neo.

Pass p applies every layer of the real Stack (`decoder_stack`, Euler with dt = 1: one pass is
the network's forward pass) once more to the output of pass p - 1, with the MLPs (the full
blocks) and without them (attention and norms only). After each pass the recipe measures, on
the first `n_tokens` tokens of the paragraph,

* the consensus gap 1 - mean_j |cos(x_1, x_j)| (j >= 2): 0 when every token is on token 1's
  line;
* the mean pairwise cosine, the mean cosine to token 1, and the spread of the token norms
  (`attnflow.analysis.depth`).

Claims (criteria in the ledger, looped.*): looped attention-only weights reach
consensus; looped full blocks concentrate.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from attnflow.experiments._decoders import (
    PARAGRAPH,
    install_hint,
    label,
    load,
    loop,
    real_stack,
)
from attnflow.experiments._ledger import claim, not_run
from attnflow.experiments._recipe import Claim, Output, Progress, save_figure

# the seed paper (Theorem 4.1) and Rodríguez Abella, Silvestre, Tabuada (ICML 2025)
PAPERS = ("2411.04990", "2412.02682")
NAME = "looped"
TITLE = "Looped real decoders: the whole stack applied again and again (tied weights)"
QUICK: dict[str, Any] = {"models": ["smollm2", "gemma3-270m"], "n_tokens": 12, "passes": 50}
FULL: dict[str, Any] = {**QUICK, "n_tokens": 48, "passes": 200}
FULL_MINUTES = 5
WITHIN = 50  # the claims' horizon: "within 50 passes", "after 50 passes"
FALLING = 10  # "keeps falling": no rise over the last this many passes (the ledger's measure)
VARIANTS = {"attention only": False, "full blocks": True}  # label -> mlp
MEASURES = ("consensus_gap", "mean_pairwise_cosine", "mean_cosine_to_first", "norm_spread")


def run(params: dict[str, Any], seed: int, out: Path, progress: Progress) -> Output:
    from attnflow.kernels.blocked import _blas_on_one_thread

    with _blas_on_one_thread():  # small matrices: one BLAS thread (as realmodel)
        return _run(params, out, progress)


def curves(states: np.ndarray) -> dict[str, list[float]]:
    """The measures (module docstring) of states (P + 1, n, d) after each pass."""
    from attnflow.analysis.depth import cosine_to_first, mean_pairwise_cosine, norm_spread

    cos1 = cosine_to_first(states)
    return {"consensus_gap": (1.0 - np.abs(cos1).mean(axis=-1)).tolist(),
            "mean_pairwise_cosine": mean_pairwise_cosine(states).tolist(),
            "mean_cosine_to_first": cos1.mean(axis=-1).tolist(),
            "norm_spread": norm_spread(states).tolist()}


def _run(params: dict[str, Any], out: Path, progress: Progress) -> Output:
    passes = int(params["passes"])
    if passes <= FALLING:
        raise ValueError(f"looped.passes: expected more than {FALLING} passes (the claims "
                         f"compare the last pass with {FALLING} before), received {passes}")
    results: dict[str, Any] = {}
    claims: list[Claim] = []
    notes: list[str] = []
    models = list(params["models"])
    jobs = len(models) * len(VARIANTS)
    done = 0
    for name in models:
        model = load(name)
        if model is None:
            why = install_hint(name)
            claims += [not_run(id, why, model=name, passes=passes, n_tokens="-")
                       for id in ("looped.consensus", "looped.concentrates")]
            notes.append(f"{name}: {why}.")
            done += len(VARIANTS)
            continue
        ids = model.token_ids(PARAGRAPH)[: params["n_tokens"]]
        per: dict[str, Any] = {"n_tokens": len(ids), "n_layers": model.config.n_layers}
        for variant, mlp in VARIANTS.items():
            start = time.process_time()
            stack = real_stack(model, mlp)
            states = loop(stack, model.embed(ids), passes,
                          lambda f, k=done: progress((k + f) / jobs))
            per[variant] = curves(states)
            per[variant]["cpu_s"] = time.process_time() - start
            done += 1
        results[label(name, model)] = per
        claims += _claims(per, label(name, model), passes)
    figures = [save_figure(_figure(results, passes), out, "looped_curves.png")] \
        if results else []
    for name, per in results.items():
        for variant in VARIANTS:
            c = per[variant]
            at = ", ".join(f"{p}: gap {c['consensus_gap'][p]:.3g}, pairwise "
                           f"{c['mean_pairwise_cosine'][p]:.3f}"
                           for p in sorted({1, min(10, passes), min(WITHIN, passes), passes}))
            notes.append(f"{name}, {variant}, {per['n_tokens']} tokens, {per['n_layers']} layers "
                         f"a pass: after pass {at} ({c['cpu_s']:.1f} s of CPU).")
    return Output({"models": results, "passes": passes}, claims, figures, notes)


def _claims(per: dict[str, Any], model: str, passes: int) -> list[Claim]:
    f = {"model": model, "passes": passes, "n_tokens": per["n_tokens"]}
    at = min(WITHIN, passes)
    a, m = per["attention only"], per["full blocks"]
    gap = np.asarray(a["consensus_gap"])
    values = {"gap_min": float(gap[1:at + 1].min()),
              "keeps_falling": bool(gap[-1] <= gap[-1 - FALLING]),
              "fall_ratio": float(gap[at] / gap[0])}
    pair = float(m["mean_pairwise_cosine"][at])

    def later(x: np.ndarray) -> str:
        return f", {x[-1]:.3g} after {passes}" if passes > at else ""

    return [
        claim("looped.consensus", measured=f"attention only: gap 1 - mean|cos(x_1, x_j)| "
              f"{gap[0]:.3g} at the embeddings, {gap[1]:.3g} after 1 pass, "
              f"{gap[min(10, passes)]:.3g} after {min(10, passes)}, {gap[at]:.3g} after {at}"
              f"{later(gap)} ({gap[-1 - FALLING]:.3g} after {passes - FALLING}); smallest "
              f"within {at}: {values['gap_min']:.3g} (after pass "
              f"{1 + int(np.argmin(gap[1:at + 1]))})",
              values=values, **f),
        claim("looped.concentrates", measured=f"full blocks: mean pairwise cosine "
              f"{m['mean_pairwise_cosine'][0]:.3f} at the embeddings, "
              f"{m['mean_pairwise_cosine'][1]:.3f} after 1 pass, "
              f"{m['mean_pairwise_cosine'][min(10, passes)]:.3f} after {min(10, passes)}, "
              f"{pair:.3f} after {at}{later(np.asarray(m['mean_pairwise_cosine']))}",
              values={"pairwise_cos": pair}, **f),
    ]


def _figure(results: dict[str, Any], passes: int) -> Figure:
    fig = Figure(figsize=(11.0, 7.0))
    axes = fig.subplots(2, 2).ravel()
    titles = {"consensus_gap": "1 - mean_j |cos(x_1, x_j)|",
              "mean_pairwise_cosine": "mean pairwise cosine",
              "mean_cosine_to_first": "mean cos(x_k, x_1), k >= 2",
              "norm_spread": "std |x_k| / mean |x_k|"}
    colors = ("tab:blue", "tab:orange", "tab:green", "tab:red")
    p = np.arange(passes + 1)
    for color, (name, per) in zip(colors, results.items()):
        for variant, ls in zip(VARIANTS, ("-", "--")):
            for ax, key in zip(axes, MEASURES):
                ax.plot(p, per[variant][key], color=color, ls=ls, label=f"{name}, {variant}")
    for ax, key in zip(axes, MEASURES):
        ax.set(title=titles[key], xlabel="pass (0: the embeddings)")
        if key in ("consensus_gap", "norm_spread"):
            ax.set_yscale("log")
        ax.axvline(min(WITHIN, passes), color="0.5", lw=0.7, ls=":")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("The whole stack applied again and again (weights tied across passes)")
    fig.tight_layout()
    return fig
