"""Real networks through depth: the diagnostics battery on SmolLM2-135M, Gemma 3 270M and
all-MiniLM-L6-v2, each as its real network and as its idealised twin (docs/science.md
§7-8).

The models are family Stacks (`attnflow.pretrained.build.model_stack`: the decoders pre- or
peri-LN with RMSNorm and causal attention; MiniLM, an encoder, post-LN with its trained
LayerNorms, biased projections and full attention); the real network is Euler with dt = 1 on
the Stack with its MLPs (`forward(..., mlp=True)`), the twin the same weights without them
(`mlp=False`: attention and norms only). The first `n_tokens` tokens of
`PARAGRAPH` go through every layer, and `attnflow.analysis.metrics.battery` measures the residual
stream entering layer 0 and after each layer, and each layer's attention patterns. Every
diagnostic gets one figure, with both models and both networks.

MiniLM's attention is full, not causal: Theorem 4.1's mechanism (token 1 sees only itself)
does not act there, so its first-token verdict is a contrast, not a test of the theorem.

Claims (criteria in the ledger, claims.toml, depth.*): the attention sink (Gu et
al., ICLR 2025: the sink rate over the heads of layers 2 and up), anisotropy through depth
(Ethayarajh, EMNLP 2019), and the first token leading (Theorem 4.1 carried to trained weights).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from attnflow.experiments._decoders import PARAGRAPH, install_hint, label, load, real_stack
from attnflow.experiments._ledger import claim, not_run
from attnflow.experiments._recipe import Claim, Output, Progress, save_figure

# arXiv ids of the papers whose claims this recipe checks (Gu et al., Ethayarajh, the seed)
PAPERS = ("2410.10781", "1909.00512", "2411.04990")
NAME = "depth"
TITLE = ("Real networks through depth: SmolLM2, Gemma 3 and MiniLM, real network and "
         "idealised twin")
# tol (cluster tolerance) and delta (Rényi radius), radians: a stated convention (about 17
# degrees), as realmodel's smaller cluster tolerance.
QUICK: dict[str, Any] = {"models": ["smollm2", "gemma3-270m", "minilm"], "n_tokens": 48,
                         "tol": 0.3, "delta": 0.3}
FULL: dict[str, Any] = {**QUICK, "n_tokens": None}
FULL_MINUTES = 3
NETWORKS = {"real": True, "twin": False}  # name -> mlp
LABELS = {"real": "real network (with MLP)", "twin": "idealised twin (no MLP)"}
CLAIMS = ("depth.sink", "depth.anisotropy", "depth.first_token")

# The figures: one per diagnostic, (key of the battery, title, y scale).
PANELS = (
    ("mean_pairwise_cosine", "mean pairwise cosine", "linear"),
    ("mean_cosine_to_first", "mean cos(x_k, x_1), k >= 2 (dotted: the smallest)", "linear"),
    ("attention_to_first", "attention on token 1, mean over heads (dotted: sink rate)",
     "linear"),
    ("effective_rank", "effective rank of the directions", "log"),
    ("angular_distance", "angular distance between consecutive layers (/ pi)", "linear"),
    ("cluster_count", "single-linkage clusters at tol", "log"),
    ("renyi_centers", "Rényi centers (dotted: strong) at delta", "log"),
    ("massive_activation", "max |x| / median |x|", "log"),
    ("norm_spread", "std |x_k| / mean |x_k|", "log"),
)


def run(params: dict[str, Any], seed: int, out: Path, progress: Progress) -> Output:
    from attnflow.kernels.blocked import _blas_on_one_thread

    with _blas_on_one_thread():  # small matrices: one BLAS thread (as realmodel)
        return _run(params, out, progress)


def _run(params: dict[str, Any], out: Path, progress: Progress) -> Output:
    from attnflow.analysis.metrics import battery
    from attnflow.pretrained.forward import forward

    results: dict[str, Any] = {}
    claims: list[Claim] = []
    notes: list[str] = []
    models = list(params["models"])
    for i, name in enumerate(models):
        start = time.process_time()
        model = load(name)
        if model is None:
            why = install_hint(name)
            claims += [not_run(id, why, model=name, network=LABELS[net], n_tokens="-")
                       for net in NETWORKS for id in CLAIMS]
            notes.append(f"{name}: {why}.")
            continue
        ids = model.token_ids(PARAGRAPH)[: params["n_tokens"]]
        per: dict[str, Any] = {}
        for net, mlp in NETWORKS.items():
            run_ = forward(model, ids, attention=True, logits="none", mlp=mlp,
                           stack=real_stack(model, mlp))
            b = battery(run_.hidden, run_.attention, tol=params["tol"], delta=params["delta"])
            per[net] = _summary(b)
            claims += _claims(per[net], label(name, model), LABELS[net], len(ids))
        per["n_tokens"] = len(ids)
        per["n_layers"] = len(run_.hidden) - 1
        per["cpu_s"] = time.process_time() - start
        results[label(name, model)] = per
        progress((i + 1) / len(models))
    figures = [save_figure(_figure(results, key, title, scale, params), out,
                           f"depth_{key}.png") for key, title, scale in PANELS] \
        if results else []
    for name, per in results.items():
        notes.append(f"{name}: {per['n_tokens']} tokens of the paragraph, {per['n_layers']} "
                     f"layers; both networks in {per['cpu_s']:.1f} s of CPU (parsing "
                     "included).")
    notes.append("The mean pairwise cosine and the cosine to token 1 are over all tokens "
                 "(the battery's definitions), the first token included; the sink rate is "
                 "over the heads of layers 2 and up (Gu et al.).")
    if "minilm" in models:
        notes.append("all-MiniLM-L6-v2 is an encoder (full attention, post-LN): its tokens "
                     "are the paragraph's WordPiece tokens from [CLS], and Theorem 4.1's "
                     "causal mechanism does not act on it (its first-token row is a contrast).")
    return Output({"models": results}, claims, figures, notes)


def _summary(b: dict[str, np.ndarray]) -> dict[str, Any]:
    """The battery as lists, with the claims' measures."""
    from attnflow.analysis.depth import SINK_EPS

    out = {k: np.asarray(v).tolist() for k, v in b.items()}
    a = np.asarray(b["attention_to_first"])  # (L, H)
    out["attention_to_first"] = a.mean(axis=1).tolist()
    out["sink_rate_from_layer_2"] = float(np.mean(a[1:] > SINK_EPS)) if len(a) > 1 \
        else float("nan")
    cos = np.asarray(b["mean_pairwise_cosine"])
    out["last_cos"], out["rise"] = float(cos[-1]), float(cos[-1] - cos[0])
    out["min_cos"] = float(b["min_cosine_to_first"][-1])
    out["mean_cos"] = float(b["mean_cosine_to_first"][-1])
    return out


def _claims(s: dict[str, Any], model: str, network: str, n: int) -> list[Claim]:
    f = {"model": model, "network": network, "n_tokens": n}

    def curve(x: list[float], first: int = 0) -> str:
        """Values at the start, middle and end, labelled from `first` (states: 0 is the
        embeddings; layers' attention: 1 is the first layer)."""
        picks = sorted({0, len(x) // 2, len(x) - 1})
        return ", ".join(f"{i + first}: {x[i]:.2f}" for i in picks)

    return [
        claim("depth.sink", measured=f"sink rate {s['sink_rate_from_layer_2']:.2f} over the "
              f"heads of layers 2..{len(s['sink_rate'])}; by layer {curve(s['sink_rate'], 1)}",
              values={"sink_rate": s["sink_rate_from_layer_2"]}, **f),
        claim("depth.anisotropy", measured=f"mean pairwise cosine by layer "
              f"{curve(s['mean_pairwise_cosine'])} (rise {s['rise']:+.2f})",
              values={"last_cos": s["last_cos"], "rise": s["rise"]}, **f),
        claim("depth.first_token", measured=f"cosine to token 1 after the last layer: smallest "
              f"{s['min_cos']:.2f}, mean {s['mean_cos']:.2f}; mean by layer "
              f"{curve(s['mean_cosine_to_first'])}",
              values={"min_cos": s["min_cos"], "mean_cos": s["mean_cos"]}, **f),
    ]


def _figure(results: dict[str, Any], key: str, title: str, scale: str,
            params: dict[str, Any]) -> Figure:
    fig = Figure(figsize=(6.4, 4.0))
    ax = fig.subplots()
    colors = ("tab:blue", "tab:orange", "tab:green", "tab:red")
    extra = {"mean_cosine_to_first": "min_cosine_to_first", "attention_to_first": "sink_rate",
             "renyi_centers": "strong_renyi_centers"}
    for color, (name, per) in zip(colors, results.items()):
        for net, ls in (("real", "-"), ("twin", "--")):
            y = np.asarray(per[net][key], dtype=float)
            start = 1 if key in ("attention_to_first", "angular_distance") else 0
            ax.plot(np.arange(start, start + y.size), y, color=color, ls=ls,
                    label=f"{name}, {LABELS[net]}")
            if key in extra:
                z = np.asarray(per[net][extra[key]], dtype=float)
                ax.plot(np.arange(start, start + z.size), z, color=color, ls=":", lw=1.0,
                        marker="." if net == "real" else "x", ms=3)
    suffix = {"cluster_count": f" {params['tol']:g} rad",
              "renyi_centers": f" {params['delta']:g} rad"}.get(key, "")
    ax.set(title=title + suffix, xlabel="layer (0: the embeddings)", yscale=scale)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
