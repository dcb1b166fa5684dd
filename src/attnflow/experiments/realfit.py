"""The idealised model fitted to each layer of a real decoder ("what gradients make
possible", 3; docs/science.md §7).

For each layer of SmolLM2-135M and Gemma 3 270M (read from their installed GGUF files, the
forward pass of `attnflow.pretrained.forward` in float64), the directions u_i = x_i / |x_i| of
the residual stream entering the layer and leaving it (the whole layer: attention and MLP,
since the layer is what moves a token from one depth to the next) give the tangent steps
Delta_i = P_{u_i}(u'_i - u_i). The paper's model with one causal head, Q^T K = beta R (R
orthogonal, a rotation of a 2k-dimensional subspace), V = lam I + A B^T (rank r), one step of
time 1, is fitted to them by torch autograd and L-BFGS (`attnflow.pretrained.layerfit`), on
the even-numbered prompts of `PROMPTS`, from two starts (beta = 1, and near the self
baseline, the model's limit beta -> inf; the smaller training misfit kept); the share of the
change it explains, 1 - |Delta - v|^2 / |Delta|^2 per prompt, is measured on them (in sample)
and on the odd-numbered prompts (held out), evaluated with the family's `Attention` on
tensors. Beside it:
the pure model (V = lam I: attention alone) and four baselines without attention mixing or
with fixed weights (`attnflow.pretrained.layerfit.BASELINES`).

Claims (criteria in the ledger, claims.toml, realfit.*; no paper number): the model beats the
best baseline in a majority of layers; it explains most of a typical layer's change; attention
alone explains a nonzero share in a majority of layers.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from attnflow.experiments._decoders import install_hint, label, load, real_stack
from attnflow.experiments._ledger import claim, not_run, without_torch
from attnflow.experiments._recipe import Z95, Claim, Output, Progress, mean_se, save_figure

PAPERS = ("2411.04990",)  # the seed paper: its model is what is fitted
NAME = "realfit"
TITLE = "The idealised model fitted to each layer of SmolLM2 and Gemma 3: the share it explains"
# layer_step: fit every layer_step-th layer; prompts: how many of PROMPTS (half fit, half held
# out); n_tokens: tokens per prompt (the first n of each); rank_v: rank of V's extra; rank_r:
# k, the rotation turns a 2k-dimensional subspace; steps: L-BFGS iterations per fit.
QUICK: dict[str, Any] = {"models": ["smollm2"], "layer_step": 3, "prompts": 6,
                         "n_tokens": 16, "rank_v": 4, "rank_r": 4, "steps": 100}
FULL: dict[str, Any] = {**QUICK, "models": ["smollm2", "gemma3-270m"], "layer_step": 1,
                        "prompts": 16, "n_tokens": 24}
FULL_MINUTES = 6
CLAIMS = ("realfit.beats_baselines", "realfit.share", "realfit.pure")
MIN_PROMPTS = 4  # two fitted, two held out: a standard error over prompts needs two
MAX_TOKENS = 32  # every prompt of PROMPTS has at least 32 tokens in both tokenizers
# The second start of the idealised fit: beta at which causal attention on unit tokens is
# nearly each token's own (weight exp(-beta (1 - cos)) on a neighbour at cosine cos: e^-5 at
# cos = 0.95), with the self baseline's V extra.
SELF_START_BETA = 100.0

# Two-sentence English passages written for this recipe, each at least 32 tokens for both
# tokenizers; independent texts, so that held-out prompts test the fit on unseen motion.
PROMPTS = (
    "The old lighthouse stood at the end of a narrow path that wound between rocks and low "
    "grass. For more than a hundred years, its keepers climbed the spiral stairs every "
    "evening to light the lamp.",
    "A small bakery on the corner opens before sunrise, and the smell of fresh bread fills "
    "the quiet street. By eight o'clock a line of workers waits outside for warm rolls and "
    "strong coffee.",
    "The river rose quickly after three days of heavy rain, covering the fields and the lower "
    "roads. Farmers moved their animals to higher ground and watched the water from the "
    "hills.",
    "In the library of the old university, thousands of books are kept on tall wooden "
    "shelves. Students climb narrow ladders to reach the volumes near the ceiling, where the "
    "light is dim.",
    "Our train left the station late in the evening and crossed the mountains during the "
    "night. When we woke up, the windows showed a wide valley covered with snow and small "
    "villages.",
    "The committee met on Tuesday to discuss the new budget for the city's parks and public "
    "gardens. After a long debate, the members agreed to plant two hundred trees along the "
    "main avenue.",
    "My grandmother kept a notebook of recipes that she had collected from friends and "
    "neighbours over fifty years. Each page was stained with flour, butter and the ink of "
    "her careful handwriting.",
    "Engineers tested the new bridge by driving heavy trucks across it one after another. "
    "Sensors on the steel beams recorded how much the structure bent and how quickly it "
    "returned to rest.",
    "The children built a raft from empty barrels and planks they found behind the barn. "
    "They floated it on the pond all summer, until a storm in August broke it into pieces.",
    "A young doctor arrived in the mountain village with a bag of medicine and a bicycle. "
    "Within a year she knew every family by name and had cured more fevers than she could "
    "count.",
    "The museum's new exhibition shows tools and jewellery made by people who lived in the "
    "region three thousand years ago. Visitors can hold copies of the objects and try the "
    "ancient methods themselves.",
    "Every spring, thousands of birds stop at the lake on their long journey to the north. "
    "Scientists count them from small wooden huts and measure how the numbers change from "
    "one year to the next.",
    "The factory closed in the winter of 1982, and most of the workers left the town to "
    "look for jobs elsewhere. Today its empty halls are used for concerts, markets and art "
    "shows.",
    "She opened the letter slowly, afraid of what it might say after so many months of "
    "silence. Inside was a single photograph of the house by the sea and a short note in "
    "pencil.",
    "Good soil is the secret of a healthy garden, and it takes years to build. Gardeners add "
    "compost, leaves and manure each autumn so that the worms and roots can do the rest of "
    "the work.",
    "The ship's captain studied the charts carefully before choosing a route through the "
    "narrow channels between the islands. Strong currents and hidden rocks had sunk many "
    "vessels there during the previous century.",
    "At the market on Saturday morning, farmers sell apples, cheese, honey and vegetables "
    "from the surrounding hills. People come early to find the best produce before the "
    "crowds arrive.",
    "The first computers filled entire rooms and needed teams of operators to keep them "
    "running. Their memory was tiny by modern standards, yet they solved problems that had "
    "taken people months.",
    "A strong wind blew across the desert all afternoon, lifting sand into the air and "
    "hiding the sun. The travellers waited in their tents until the storm passed and the "
    "stars came out.",
    "Our neighbour repairs old clocks in a small workshop behind his house. He says that "
    "each clock has its own voice, and that he can tell what is wrong just by listening to "
    "it tick.",
    "The mountain road climbs through forests of pine and oak before reaching the high "
    "pastures. In summer, shepherds bring their flocks up here and live in stone huts until "
    "the first frost.",
    "When the power failed across the city, people lit candles and gathered in the streets "
    "to talk. For one evening, neighbours who had never spoken shared food, stories and "
    "music.",
    "The orchestra rehearsed the new symphony for six weeks before its first performance. "
    "On the opening night, the audience stood and applauded for several minutes after the "
    "final chord.",
    "Volcanic islands form when molten rock rises from deep below the ocean floor and cools "
    "in the water. Over millions of years, the new land is shaped by waves, wind, rain and "
    "plants.",
)


def run(params: dict[str, Any], seed: int, out: Path, progress: Progress) -> Output:
    fields = {"model": " and ".join(params["models"]), "rank_v": params["rank_v"],
              "rank_r": params["rank_r"]}
    if (skipped := without_torch(CLAIMS, **fields)) is not None:
        return skipped
    import torch

    from attnflow.kernels.blocked import _blas_on_one_thread

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small products, many calls: one thread (tests/conftest.py)
    try:
        with _blas_on_one_thread():
            return _run(params, seed, out, progress)
    finally:
        torch.set_num_threads(threads)


def _check(params: dict[str, Any]) -> None:
    from attnflow._checks import fail

    p = params["prompts"]
    if (isinstance(p, bool) or not isinstance(p, int) or not MIN_PROMPTS <= p <= len(PROMPTS)
            or p % 2):
        raise fail("prompts", f"an even integer in [{MIN_PROMPTS}, {len(PROMPTS)}] (half "
                   "fitted, half held out)", repr(p))
    if not isinstance(params["layer_step"], int) or params["layer_step"] < 1:
        raise fail("layer_step", "an integer >= 1", repr(params["layer_step"]))
    if not isinstance(params["n_tokens"], int) or not 2 <= params["n_tokens"] <= MAX_TOKENS:
        raise fail("n_tokens", f"an integer in [2, {MAX_TOKENS}] (every prompt has "
                   f"{MAX_TOKENS} tokens)", repr(params["n_tokens"]))


def _run(params: dict[str, Any], seed: int, out: Path, progress: Progress) -> Output:
    _check(params)
    results: dict[str, Any] = {}
    claims: list[Claim] = []
    notes: list[str] = []
    models = list(params["models"])
    fields = {"rank_v": params["rank_v"], "rank_r": params["rank_r"]}
    for i, name in enumerate(models):
        start = time.process_time()
        model = load(name)
        if model is None:
            why = install_hint(name)
            claims += [not_run(id, why, model=name, **fields) for id in CLAIMS]
            notes.append(f"{name}: {why}.")
            continue
        hidden = _hidden(model, params)

        def step(f: float, i: int = i) -> None:
            progress((i + f) / len(models))

        per = _fit_layers(hidden, params, seed, step)
        per["cpu_s"] = time.process_time() - start
        results[label(name, model)] = per
        claims += _claims(per, label(name, model), fields)
    figures = [save_figure(_figure(results), out, "realfit_shares.png")] if results else []
    for name, per in results.items():
        notes.append(_summary_note(name, per))
    notes.append(
        "Directions of the residual stream entering and leaving each layer (attention and "
        "MLP: the whole layer's step); Delta_i = P_u(u' - u). Forward pass in float64 "
        "(quantised weights dequantised); fits in torch float64 by L-BFGS "
        f"({params['steps']} iterations), on the even-numbered prompts; the shares on the "
        "odd-numbered ones are held out, evaluated with the family's Attention (Q = I, K = R, "
        "V) on tensors. Share = 1 - |Delta - v|^2 / |Delta|^2 per prompt, mean +- standard "
        "error over prompts; a negative held-out share is a fit worse than predicting no "
        "motion.")
    return Output({"models": results, "params": dict(params)}, claims, figures, notes)


def _hidden(model: Any, params: dict[str, Any]) -> np.ndarray:
    """(L + 1, P, n, d) the residual stream of the first n tokens of each prompt (float64)."""
    from attnflow.pretrained.forward import forward

    stack = real_stack(model, True)
    out = []
    for text in PROMPTS[: params["prompts"]]:
        ids = model.token_ids(text)[: params["n_tokens"]]
        out.append(forward(model, ids, logits="none", stack=stack).hidden)
    return np.stack(out, axis=1)


def _fit_layers(hidden: np.ndarray, params: dict[str, Any], seed: int,
                progress: Progress) -> dict[str, Any]:
    """Per fitted layer: the in-sample and held-out shares (mean, se over prompts) of the
    idealised and pure models and of each baseline, the fitted parameters, and the
    held-out gains over the best baseline."""
    from attnflow.pretrained.layerfit import (
        BASELINES,
        baseline,
        fit_idealised,
        misfit,
        share,
        tangent_steps,
    )

    P = hidden.shape[1]
    train, test = list(range(0, P, 2)), list(range(1, P, 2))
    layers = list(range(0, hidden.shape[0] - 1, params["layer_step"]))
    rows = []
    for count, layer in enumerate(layers):
        U, Delta = tangent_steps(hidden[layer], hidden[layer + 1])
        Ut, Dt = U[train], Delta[train]
        fits = {name: baseline(name, Ut, Dt, params["rank_v"], params["steps"], seed)
                for name in BASELINES}
        # the idealised model from two starts, the one of smaller misfit on the training
        # prompts kept: beta = 1 with a small random V extra, and the self baseline's extra
        # at beta = SELF_START_BETA (near the model's limit beta -> inf, which is that
        # baseline)
        starts = [fit_idealised(Ut, Dt, params["rank_v"], params["rank_r"], params["steps"],
                                seed, init=init)
                  for init in ({}, {"beta": SELF_START_BETA, "A": fits["self"].params["A"],
                                    "B": fits["self"].params["B"]})]
        misfits = [misfit(Ut, Dt, m.field(Ut)) for m in starts]
        fitted = {"idealised": starts[int(np.argmin(misfits))],
                  "pure": fit_idealised(Ut, Dt, 0, params["rank_r"], params["steps"], seed)}
        row: dict[str, Any] = {"layer": layer,
                               "parameters": {k: m.numbers() for k, m in fitted.items()},
                               "start_misfits": misfits}
        shares = {}
        for key, m in fitted.items():  # evaluated with the family's Attention on tensors
            block = m.attention()
            shares[key] = (share(Dt, block.field(Ut)),
                           share(Delta[test], block.field(U[test])))
        for name, b in fits.items():
            shares[name] = (share(Dt, b.field(Ut)), share(Delta[test], b.field(U[test])))
        row["in_sample"] = {k: mean_se(s[0]) for k, s in shares.items()}
        row["held_out"] = {k: mean_se(s[1]) for k, s in shares.items()}
        best = max(BASELINES, key=lambda k: row["held_out"][k][0])
        gain = mean_se(shares["idealised"][1] - shares[best][1])
        row["best_baseline"], row["gain"] = best, gain
        row["beats"] = bool(gain[0] > Z95 * gain[1])
        pure = row["held_out"]["pure"]
        row["pure_explains"] = bool(pure[0] > Z95 * pure[1])
        rows.append(row)
        progress((count + 1) / len(layers))
    return {"n_layers": hidden.shape[0] - 1, "n_prompts": P, "n_tokens": hidden.shape[2],
            "d": hidden.shape[3], "layers": rows}


def _claims(per: dict[str, Any], model: str, fields: dict[str, Any]) -> list[Claim]:
    rows = per["layers"]
    k = len(rows)
    held = np.array([r["held_out"]["idealised"][0] for r in rows])
    inside = np.array([r["in_sample"]["idealised"][0] for r in rows])
    pure = np.array([r["held_out"]["pure"][0] for r in rows])
    gains = np.array([r["gain"][0] for r in rows])
    beaten = sum(r["beats"] for r in rows)
    explained = sum(r["pure_explains"] for r in rows)
    size = (f"{k} layers, {per['n_prompts'] // 2} + {per['n_prompts'] // 2} prompts of "
            f"{per['n_tokens']} tokens")
    f = {"model": model, **fields}
    return [
        claim("realfit.beats_baselines",
              measured=f"beats the best baseline in {beaten} of {k} layers (held out); "
              f"median gain {np.median(gains):+.3f}; best baselines: "
              f"{_counts([r['best_baseline'] for r in rows])} ({size})",
              values={"layers_beaten": beaten / k, "median_gain": float(np.median(gains))},
              **f),
        claim("realfit.share",
              measured=f"held-out share: median {np.median(held):.3f} over layers (range "
              f"{held.min():.3f} to {held.max():.3f}); in sample: median "
              f"{np.median(inside):.3f} ({size})",
              values={"median_share": float(np.median(held)),
                      "median_share_in_sample": float(np.median(inside))}, **f),
        claim("realfit.pure",
              measured=f"pure model (V = lam I): held-out share > 1.96 se in {explained} of "
              f"{k} layers; median share {np.median(pure):.4f} (range {pure.min():.4f} to "
              f"{pure.max():.4f}) ({size})",
              values={"layers_explained": explained / k,
                      "median_share": float(np.median(pure))}, **f),
    ]


def _counts(names: list[str]) -> str:
    return ", ".join(f"{n} {names.count(n)}" for n in dict.fromkeys(names))


def _summary_note(name: str, per: dict[str, Any]) -> str:
    """The held-out shares by layer, in a line."""
    cells = [f"{r['layer']}: {r['held_out']['idealised'][0]:.2f}/"
             f"{r['held_out'][r['best_baseline']][0]:.2f}{r['best_baseline'][0]}"
             for r in per["layers"]]
    return (f"{name} (d = {per['d']}, {per['n_layers']} layers; {per['cpu_s']:.0f} s CPU): "
            "held-out share by layer, idealised model / best baseline (s self, d drift, "
            "m mean, f first): " + ", ".join(cells) + ".")


# ---------------------------------------------------------------------------- figure
STYLES = {"idealised": ("tab:blue", "-", "idealised (V = lam I + low rank)"),
          "pure": ("tab:purple", "-", "pure (V = lam I)"),
          "self": ("tab:orange", "--", "baseline: self (no attention)"),
          "drift": ("tab:green", "--", "baseline: common drift"),
          "mean": ("tab:gray", ":", "baseline: toward the causal mean"),
          "first": ("tab:brown", ":", "baseline: toward token 1")}


def _figure(results: dict[str, Any]) -> Figure:
    """Held-out share per layer (error bars: one standard error over prompts) of the fitted
    models and the baselines, one panel per model; the idealised model in sample, thin."""
    fig = Figure(figsize=(6.0 * len(results), 4.2))
    axes = np.atleast_1d(fig.subplots(1, len(results), squeeze=False)[0])
    for ax, (name, per) in zip(axes, results.items()):
        rows = per["layers"]
        x = np.array([r["layer"] for r in rows])
        for key, (color, ls, text) in STYLES.items():
            m = np.array([r["held_out"][key][0] for r in rows])
            se = np.array([r["held_out"][key][1] for r in rows])
            ax.errorbar(x, m, yerr=se, color=color, ls=ls, lw=1.2, marker=".", ms=4,
                        capsize=2, label=text)
        inside = np.array([r["in_sample"]["idealised"][0] for r in rows])
        ax.plot(x, inside, color="tab:blue", lw=0.6, alpha=0.6,
                label="idealised, in sample")
        ax.axhline(0.0, color="0.3", lw=0.6)
        ax.set(title=f"{name} ({per['n_prompts'] // 2} held-out prompts)",
               xlabel="layer", ylabel="share of the change of direction explained",
               ylim=(max(-0.5, ax.get_ylim()[0]), 1.0))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("The idealised model fitted to each layer: held-out share explained")
    fig.tight_layout()
    return fig
