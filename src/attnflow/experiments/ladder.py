"""The ablation ladder: from a real decoder (SmolLM2-135M) to the model of Theorem 4.1, one
ingredient at a time (docs/science.md §4, §7-8).

Every rung is a family model run by Euler with dt = 1 for as many layers as the real network
has (`depth` = n_layers), on the first `n_tokens` tokens of the paragraph:

1. **real**: the decoder's Stack (`decoder_stack`, pre-LN RMSNorm, RoPE, SwiGLU MLP);
2. **no MLP**: the same Stack without its feed-forward sublayers;
3. **V = I**: every head's value-output map W_O^h W_V^h replaced by the identity (the heads
   keep their Q, K, RoPE and the pre-LN RMSNorm with its gain; they add up);
4. **one layer tied**: layer `tied_layer` of rung 3 acting at every depth (weights tied);
5. **theorem**: post-LN on the sphere with Q = K = V = I, one head, no positions, at
   inverse temperature `beta`: the paper's causal model, from the embeddings' directions.

At each rung the recipe measures the cosine of every token's final direction with token 1's
initial direction x_1(0) (Theorem 4.1: every token goes to x_1(0) when V = I, for any Q, K,
beta), and the battery (`attnflow.analysis.depth`) through depth. Theorem 4.1 is a statement
about t -> infinity on the sphere; a rung that misses the criterion at this depth may still
converge later.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from attnflow.experiments._decoders import PARAGRAPH, install_hint, label, load, real_stack
from attnflow.experiments._ledger import claim, entry, not_run
from attnflow.experiments._recipe import Output, Progress, save_figure

PAPERS = ("2411.04990",)  # arXiv ids of the papers whose claims this recipe checks
NAME = "ladder"
TITLE = "The ablation ladder: from SmolLM2 to the model of Theorem 4.1, one ingredient at a time"
# tied_layer: the middle layer (a stated convention: neither the embedding-facing first nor
# the output-facing last layer); beta = 1: the paper's inverse temperature for the theorem's
# rung (Theorem 4.1 holds for every beta); tol, delta: the battery's, as in depth.
QUICK: dict[str, Any] = {"model": "smollm2", "n_tokens": 24, "tied_layer": None, "beta": 1.0,
                         "tol": 0.3, "delta": 0.3}
FULL: dict[str, Any] = {**QUICK, "n_tokens": None}
FULL_MINUTES = 2
RUNGS = ("real", "no MLP", "V = I", "one layer tied", "theorem (post-LN, Q = K = V = I)")
ID = "ladder.to_first_token"


def run(params: dict[str, Any], seed: int, out: Path, progress: Progress) -> Output:
    from attnflow.kernels.blocked import _blas_on_one_thread

    model = load(params["model"])
    if model is None:
        why = install_hint(params["model"])
        return Output({}, [not_run(ID, why, rung=r, n_tokens="-", depth="-") for r in RUNGS],
                      notes=[f"Not run: {params['model']} {why}."])
    with _blas_on_one_thread():  # small matrices: one BLAS thread (as realmodel)
        return _run(model, label(params["model"], model), params, out, progress)


def value_identity(block: Any) -> Any:
    """The block's attention sublayer with every head's V (or its (V, O) pair) replaced by
    the d x d identity, in the block's scheme; no MLP."""
    from attnflow.family import Block, SelfAttention

    a = block.attention
    eye = np.eye(a.d)
    heads = [(h[0], h[1], eye) for h in a.heads]
    return Block(SelfAttention(heads, beta=a.beta, mask=a.mask, backend=a.backend,
                               encodings=a.encodings, qk_norm=a.qk_norm), norm=block.scheme)


def rungs(model: Any, tied_layer: int | None, beta: float) -> dict[str, Any]:
    """The ladder's models (module docstring), by rung name."""
    from attnflow.family import Attention, Stack

    L = model.config.n_layers
    tied = L // 2 if tied_layer is None else int(tied_layer)
    if not 0 <= tied < L:
        raise ValueError(f"ladder.tied_layer: expected a layer index in [0, {L}), "
                         f"received {tied_layer!r}")
    bare = real_stack(model, False)
    identity = Stack([value_identity(b) for b in bare.layers])
    return dict(zip(RUNGS, (real_stack(model, True), bare, identity,
                            identity.layers[tied], Attention(beta=beta, norm="post"))))


def trajectory(m: Any, x0: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """States (depth + 1, n, d) after each layer (Euler, dt = 1) and attention patterns
    (depth, H, n, n) at the state entering each layer."""
    from attnflow.simulate import simulate

    times = np.arange(depth + 1.0)
    states = simulate(m, x0, float(depth), save_at=times, method="euler", dt=1.0).states
    patterns = np.stack([m.layer_at(t).attention_patterns(states[i])
                         for i, t in enumerate(times[:-1])])
    return states, patterns


def _run(model: Any, name: str, params: dict[str, Any], out: Path,
         progress: Progress) -> Output:
    from attnflow.analysis.metrics import battery

    ids = model.token_ids(PARAGRAPH)[: params["n_tokens"]]
    x0 = model.embed(ids).astype(float)
    depth = model.config.n_layers
    first = x0[0] / np.linalg.norm(x0[0])
    results: dict[str, Any] = {}
    claims = []
    for i, (rung, m) in enumerate(rungs(model, params["tied_layer"], params["beta"]).items()):
        start = time.process_time()
        on_sphere = m.layer_at(0.0).norm == "post"
        init = x0 / np.linalg.norm(x0, axis=-1, keepdims=True) if on_sphere else x0
        states, patterns = trajectory(m, init, depth)
        b = battery(states, patterns, tol=params["tol"], delta=params["delta"])
        theta = states / np.linalg.norm(states, axis=-1, keepdims=True)
        to_x1 = theta[:, 1:] @ first  # (depth + 1, n - 1): cos(x_k(l), x_1(0))
        r = {k: np.asarray(v).tolist() for k, v in b.items() if k != "attention_to_first"}
        r["mean_cos_x1_0"] = to_x1.mean(axis=-1).tolist()
        r["min_cos_x1_0"] = to_x1.min(axis=-1).tolist()
        r["cpu_s"] = time.process_time() - start
        results[rung] = r
        claims.append(claim(
            ID, measured=f"cosine of the final directions with x_1(0): smallest "
            f"{to_x1[-1].min():.3f}, mean {to_x1[-1].mean():.3f} after {depth} layers "
            f"(after {depth // 2}: {to_x1[depth // 2].min():.3f}, "
            f"{to_x1[depth // 2].mean():.3f}); mean pairwise cosine "
            f"{b['mean_pairwise_cosine'][-1]:.3f}",
            values={"min_cos": float(to_x1[-1].min()), "mean_cos": float(to_x1[-1].mean())},
            rung=rung, n_tokens=len(ids), depth=depth))
        progress((i + 1) / len(RUNGS))
    holds = [c.verdict for c in claims]
    figures = [save_figure(_figure(results, holds, name), out, "ladder.png")]
    notes = [f"{name}: {len(ids)} tokens of the paragraph, {depth} layers at every rung "
             f"(Euler, dt = 1); the tied rung repeats layer "
             f"{depth // 2 if params['tied_layer'] is None else params['tied_layer']}; the "
             f"theorem's rung at beta = {params['beta']:g}.",
             "CPU seconds by rung: " + ", ".join(f"{k} {v['cpu_s']:.1f}"
                                                 for k, v in results.items()) + "."]
    return Output({"model": name, "n_tokens": len(ids), "depth": depth,
                   "rungs": results, "verdicts": dict(zip(RUNGS, holds))}, claims, figures,
                  notes)


def _figure(results: dict[str, Any], verdicts: list[str], name: str) -> Figure:
    fig = Figure(figsize=(12.0, 7.0))
    axes = fig.subplots(2, 2).ravel()
    e = entry(ID)
    x = np.arange(len(RUNGS))
    axes[0].plot(x, [r["min_cos_x1_0"][-1] for r in results.values()], "o-",
                 label="smallest over tokens")
    axes[0].plot(x, [r["mean_cos_x1_0"][-1] for r in results.values()], "s--",
                 label="mean over tokens")
    for c, ls in zip((*e.reproduced, *e.partly), (":", "-.")):
        axes[0].axhline(c.threshold, color="0.4", lw=0.8, ls=ls, label=f"criterion {c.text()}")
    ticks = ["\n(".join(r.split(" (", 1)) + f"\n[{v}]" for r, v in zip(RUNGS, verdicts)]
    axes[0].set_xticks(x, ticks, fontsize=7)
    axes[0].set(title="cos(final direction, x_1(0)) at each rung", ylim=(-1.05, 1.05))
    axes[0].legend(fontsize=7)
    for ax, key, title in ((axes[1], "mean_cos_x1_0", "mean cos(x_k, x_1(0)) through depth"),
                           (axes[2], "mean_pairwise_cosine", "mean pairwise cosine"),
                           (axes[3], "effective_rank", "effective rank of the directions")):
        for rung, r in results.items():
            ax.plot(np.arange(len(r[key])), r[key], label=rung)
        ax.set(title=title, xlabel="layer (0: the embeddings)")
        ax.legend(fontsize=7)
    axes[3].set_yscale("log")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(f"{name}: from the real network to the model of Theorem 4.1")
    fig.tight_layout()
    return fig
