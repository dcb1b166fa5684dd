"""Why the real-decoder claims (recipes depth, ladder) miss the idealised theory (issue 43):
measured on the recipes' own inputs (the paragraph, all of its tokens: the full size).

    PYTHONPATH=src python3 scripts/diagnostics/real_decoders.py [depth] [ladder]

depth (about 2 minutes of CPU), for each model and network (real: with the MLPs; twin:
without): the attention on token 1 (mean over heads, queries and layers 2..L) against the
share a uniform pattern gives it (causal: the mean over queries q of 1 / q; full: 1 / n);
the mean pairwise cosine after the first two layers; for MiniLM (an encoder) the same for
the last token ([SEP]) and the sink rate on it, at n tokens and at the first 48 (the quick
size, which cuts [SEP] off); the last layer's mean pairwise cosine with and without the
three features of largest mean |x| (rogue dimensions, Timkey and van Schijndel 2021).

ladder (about 1 minute): per rung, cos(x_1(L), x_1(0)) (how far token 1 itself turns) and
the mean cosine of tokens k >= 2 with x_1(L) (whether they follow it); for the V = I rung,
cos(x_1(L), e_i), e_i the feature of the largest summed RMSNorm gain of the layers.
"""

from __future__ import annotations

import sys

import numpy as np

from attnflow.analysis.depth import SINK_EPS, mean_pairwise_cosine
from attnflow.experiments._decoders import PARAGRAPH, load, real_stack
from attnflow.pretrained.forward import forward


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _uniform_share(n: int, causal: bool) -> float:
    return float(np.mean(1.0 / np.arange(1, n + 1))) if causal else 1.0 / n


def _without_rogue(x: np.ndarray, k: int = 3) -> float:
    """Mean pairwise cosine of x (n, d) without its k features of largest mean |x|."""
    keep = np.argsort(np.abs(x).mean(axis=0))[:-k]
    return float(mean_pairwise_cosine(x[None, :, keep])[0])


def depth() -> None:
    for name in ("smollm2", "gemma3-270m", "minilm"):
        model = load(name)
        ids = model.token_ids(PARAGRAPH)
        causal = name != "minilm"
        for net, mlp in (("real", True), ("twin", False)):
            run = forward(model, ids, attention=True, logits="none", mlp=mlp,
                          stack=real_stack(model, mlp))
            A, X = run.attention, run.hidden  # (L, H, n, n), (L + 1, n, d)
            n = len(ids)
            first = A[1:, :, :, 0].mean(axis=-1)  # (L - 1, H): mean over queries
            line = (f"{name} {net}, n = {n}: attention on token 1 over layers 2..L "
                    f"{first.mean():.3f} (largest layer mean {first.mean(axis=1).max():.3f}; "
                    f"uniform share {_uniform_share(n, causal):.3f}); mean pairwise cosine "
                    f"after layer 2 {mean_pairwise_cosine(X[2:3])[0]:.3f}, last "
                    f"{mean_pairwise_cosine(X[-1:])[0]:.3f}, without the 3 rogue features "
                    f"{_without_rogue(X[-1]):.3f}")
            if not causal:
                last = A[1:, :, :, -1].mean(axis=-1)
                cut = forward(model, ids[:48], attention=True, logits="none", mlp=mlp,
                              stack=real_stack(model, mlp)).attention[1:, :, :, 0].mean(-1)
                line += (f"; last token {model.decode(ids[-1:])!r}: attention on it "
                         f"{last.mean():.3f}, sink rate on it {(last > SINK_EPS).mean():.2f}, "
                         f"on token 1 {(first > SINK_EPS).mean():.2f}; at the first 48 "
                         f"tokens (no {model.decode(ids[-1:])!r}) sink rate on token 1 "
                         f"{(cut > SINK_EPS).mean():.2f}")
            print(line, flush=True)


def ladder() -> None:
    from attnflow.experiments.ladder import RUNGS, rungs, trajectory

    model = load("smollm2")
    ids = model.token_ids(PARAGRAPH)
    x0 = model.embed(ids).astype(float)
    L = model.config.n_layers
    for rung, m in list(rungs(model, None, 1.0).items())[:4]:
        states, _ = trajectory(m, x0, L)
        u = _unit(states)
        line = (f"{rung}: cos(x_1(L), x_1(0)) {u[-1, 0] @ u[0, 0]:.3f}, mean cos(x_k(L), "
                f"x_1(L)) {np.mean(u[-1, 1:] @ u[-1, 0]):.3f}, smallest "
                f"{np.min(u[-1, 1:] @ u[-1, 0]):.3f}")
        if rung == RUNGS[2]:
            gain = sum(np.asarray(b.scheme.norm.gain) for b in m.layers
                       if getattr(b.scheme.norm, "gain", None) is not None)
            i = int(np.argmax(gain)) if np.ndim(gain) else None
            if i is not None:
                line += f"; cos(x_1(L), e_{i}) {u[-1, 0, i]:.3f} (largest summed gain)"
        print(line, flush=True)


if __name__ == "__main__":
    for part in sys.argv[1:] or ["depth", "ladder"]:
        {"depth": depth, "ladder": ladder}[part]()
