"""Per-head value and query-key spectra of a pretrained Transformer (docs/science.md §5, §3).

For head h (shapes and conventions in `attnflow.pretrained.checkpoint`):

* **Value side.** V_h = W_O^h W_V^h (d x d, rank <= d_head). Its nonzero spectrum is the
  spectrum of the d_head x d_head matrix W_V^h W_O^h (AB and BA share nonzero eigenvalues with
  their Jordan structure). lambda_max is the eigenvalue of largest real part *of that nonzero
  spectrum*, as in the paper's figure for albert-xlarge-v2; on the full residual stream V_h also
  has the eigenvalue 0 with multiplicity >= d - d_head, so when lambda_max < 0 the top
  eigenvalue of V_h itself is 0 (its kernel). The atlas row (docs/science.md §3, Table 1) is that of
  W_V^h W_O^h, through `attnflow.analysis.atlas.predict_configuration`.
* **Query-key side.** B_h = (W_Q^h)^T W_K^h / sqrt(d_head), so the head's score is
  x_k^T B_h x_j. The effective beta is its spectral norm ||B_h||_2 (largest singular value):
  the largest score between unit vectors, i.e. the beta of the paper's model with Q^T K of
  unit norm. Tokens of a LayerNorm'd residual stream have norm about sqrt(d) (times the
  gains), which multiplies the scores by about d. The symmetric part (B_h + B_h^T)/2 has rank
  <= 2 d_head; its nonzero spectrum is computed from 2 d_head x 2 d_head matrices without
  forming d x d ones.
* **Gaussian baseline.** The same quantities for weights drawn i.i.d. N(0, s^2) with the
  model's shapes and initialiser scale s (config ``initializer_range``), the initialisation of
  BERT, ALBERT, GPT-2 and LLaMA in Hugging Face.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attnflow._checks import as_generator, integer
from attnflow._repr import ShortRepr
from attnflow.pretrained.checkpoint import AttentionLayer, Checkpoint, load_layers

__all__ = [
    "HeadSpectrum",
    "gaussian_layers",
    "head_spectra",
    "layer_spectra",
    "load_model_layers",
    "plot_spectra",
    "spectra_report",
    "spectra_summary",
    "write_spectra",
]

REAL_TOL = 1e-9  # |Im lambda| <= REAL_TOL * spectral radius counts as real


@dataclass(frozen=True, repr=False)
class HeadSpectrum(ShortRepr):
    """Spectra of one head.

    Attributes
    ----------
    layer, head : 0-based indices.
    value_eigenvalues : (d_head,) complex, eigenvalues of W_V^h W_O^h (the nonzero spectrum of
        V_h), sorted by decreasing real part.
    qk_symmetric_eigenvalues : (2 d_head,) real, ascending: the spectrum of (B_h + B_h^T)/2
        on the span of the rows of W_Q^h and W_K^h: all its nonzero eigenvalues (and zeros
        if that span has dimension < 2 d_head); the rest of its spectrum is 0.
    beta_eff : ||B_h||_2, the spectral norm of B_h.
    atlas_row : the atlas row predicted from W_V^h W_O^h
    (`attnflow.analysis.atlas.predict_configuration`).
    """

    layer: int
    head: int
    value_eigenvalues: np.ndarray
    qk_symmetric_eigenvalues: np.ndarray
    beta_eff: float
    atlas_row: str

    @property
    def lambda_max(self) -> complex:
        """The eigenvalue of largest real part (of a conjugate pair, the one with Im >= 0)."""
        top = self.value_eigenvalues[0]
        return complex(top.real, abs(top.imag))

    @property
    def is_real(self) -> bool:
        radius = float(np.max(np.abs(self.value_eigenvalues)))
        return abs(self.lambda_max.imag) <= REAL_TOL * radius

    @property
    def kind(self) -> str:
        """"complex" if lambda_max is not real, else "negative" or "positive" (sign of it)."""
        if not self.is_real:
            return "complex"
        return "negative" if self.lambda_max.real < 0 else "positive"

    def row(self) -> dict[str, Any]:
        """One row of the per-head table (JSON/CSV-friendly scalars)."""
        lam = self.lambda_max
        qk = self.qk_symmetric_eigenvalues
        return {
            "layer": self.layer,
            "head": self.head,
            "lambda_max_re": lam.real,
            "lambda_max_im": lam.imag,
            "lambda_max_kind": self.kind,
            "spectral_radius": float(np.max(np.abs(self.value_eigenvalues))),
            "n_eigenvalues_re_negative": int(np.sum(self.value_eigenvalues.real < 0)),
            "atlas_row": self.atlas_row,
            "beta_eff": self.beta_eff,
            "qk_sym_max": float(qk[-1]),
            "qk_sym_min": float(qk[0]),
        }


def layer_spectra(layer: AttentionLayer) -> list[HeadSpectrum]:
    """The `HeadSpectrum` of every head of one layer."""
    from attnflow.analysis.atlas import predict_configuration

    out = []
    for h in range(layer.n_heads):
        core = layer.value_core(h)
        eig = np.linalg.eigvals(core)
        eig = eig[np.lexsort((-eig.imag, -eig.real))]
        sym, beta_eff = _qk_spectrum(layer.W_Q[h], layer.W_K[h])
        out.append(HeadSpectrum(layer=layer.index, head=h, value_eigenvalues=eig,
                                qk_symmetric_eigenvalues=sym, beta_eff=beta_eff,
                                atlas_row=predict_configuration(core).row))
    return out


def _qk_spectrum(W_Q: np.ndarray, W_K: np.ndarray) -> tuple[np.ndarray, float]:
    """Nonzero spectrum of the symmetric part of B = W_Q^T W_K / sqrt(dh), and ||B||_2.

    AB and BA share their nonzero eigenvalues, so only dh-sized matrices are needed. With
    U = [W_Q^T, W_K^T] (d, 2 dh) and G = U^T U its Gram matrix, (B + B^T)/2 = U M U^T with
    M = [[0, I], [I, 0]] / (2 sqrt dh): its nonzero spectrum is that of M G (2 dh x 2 dh,
    real). ||B||_2^2 is the top eigenvalue of B B^T = W_Q^T (W_K W_K^T) W_Q / dh, i.e. of
    (W_K W_K^T)(W_Q W_Q^T) / dh. Plain `eigvals` of small matrices: a QR or eigh of these
    shapes runs 100x slower under OpenBLAS threading on a loaded 2-core machine."""
    dh = W_Q.shape[0]
    U_T = np.concatenate([W_Q, W_K], axis=0)  # U^T, (2 dh, d)
    G = U_T @ U_T.T
    MG = np.concatenate([G[dh:], G[:dh]], axis=0) / (2.0 * math.sqrt(dh))
    sym = np.sort(np.linalg.eigvals(MG).real)
    top = float(np.max(np.linalg.eigvals(G[dh:, dh:] @ G[:dh, :dh]).real))
    return sym, math.sqrt(max(top, 0.0) / dh)


def load_model_layers(model: str | Path | Checkpoint | Any,
                      layers: Sequence[int] | None = None) -> tuple[Any, list[AttentionLayer]]:
    """The model and its listed layers (default: each distinct weight set) from a checkpoint
    directory (`Checkpoint`) or a GGUF file (`attnflow.pretrained.gguf.GGUFModel`)."""
    from attnflow.pretrained.gguf import GGUFModel

    if isinstance(model, GGUFModel) or (isinstance(model, (str, Path))
                                        and Path(model).expanduser().is_file()):
        gguf_model = model if isinstance(model, GGUFModel) else GGUFModel(model)
        indices = range(gguf_model.n_layers) if layers is None else layers
        return gguf_model, [gguf_model.layer(int(i)) for i in indices]
    return load_layers(model, layers)


def head_spectra(model_dir: str | Path | Checkpoint,
                 layers: Sequence[int] | None = None) -> list[HeadSpectrum]:
    """Spectra of every head of the given layers (default: each distinct weight set) of a
    checkpoint directory or a GGUF file."""
    _, loaded = load_model_layers(model_dir, layers)
    return [s for layer in loaded for s in layer_spectra(layer)]


def gaussian_layers(ckpt: Checkpoint, layers: Sequence[int],
                    seed: int | np.random.Generator | None = 0) -> list[AttentionLayer]:
    """Layers with the checkpoint's attention shapes and i.i.d. N(0, s^2) weights,
    s = ckpt.initializer_range (grouped-query sharing kept)."""
    rng = as_generator(seed)
    s, d, H, Hkv, dh = (ckpt.initializer_range, ckpt.d, ckpt.n_heads, ckpt.n_kv_heads,
                        ckpt.d_head)
    kv_head = np.arange(H) // (H // Hkv)
    out = []
    for index in layers:
        W_Q = rng.normal(0.0, s, (H, dh, d))
        W_K, W_V = (rng.normal(0.0, s, (Hkv, dh, d))[kv_head] for _ in range(2))
        W_O = rng.normal(0.0, s, (H, d, dh))
        out.append(AttentionLayer(index=int(index), W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=W_O,
                                  kv_head=kv_head))
    return out


def spectra_summary(spectra: Sequence[HeadSpectrum]) -> dict[str, Any]:
    """Counts and ranges over heads: how many lambda_max are real negative / complex / real
    positive (and which heads are negative, as [layer, head]), how many have Re lambda_max < 0,
    the effective betas, the atlas rows."""
    beta = np.array([s.beta_eff for s in spectra])
    lam = np.array([s.lambda_max.real for s in spectra])
    rows: dict[str, int] = {}
    for s in spectra:
        rows[s.atlas_row] = rows.get(s.atlas_row, 0) + 1
    kinds = [s.kind for s in spectra]
    return {
        "n_heads": len(spectra),
        "negative_heads": [[s.layer, s.head] for s in spectra if s.kind == "negative"],
        "n_negative": kinds.count("negative"),
        "n_complex": kinds.count("complex"),
        "n_positive": kinds.count("positive"),
        "n_lambda_max_re_negative": int(np.sum(lam < 0)),
        "lambda_max_re_median": float(np.median(lam)),
        "lambda_max_re_range": [float(lam.min()), float(lam.max())],
        "beta_eff_median": float(np.median(beta)),
        "beta_eff_range": [float(beta.min()), float(beta.max())],
        "atlas_rows": rows,
    }


def plot_spectra(spectra: Sequence[HeadSpectrum], title: str,
                 baseline: Sequence[HeadSpectrum] | None = None) -> Any:
    """A grid of complex-plane scatter plots, one panel per head (rows = layers), with the
    unit circle and the imaginary axis; lambda_max in red; the Gaussian baseline of the same
    head, if given, in grey. Returns the matplotlib Figure."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    layers = sorted({s.layer for s in spectra})
    heads = sorted({s.head for s in spectra})
    base = {(b.layer, b.head): b for b in baseline or ()}
    fig, axes = plt.subplots(len(layers), len(heads), squeeze=False,
                             figsize=(1.9 * len(heads) + 0.5, 1.9 * len(layers) + 0.8))
    circle = np.exp(1j * np.linspace(0.0, 2.0 * np.pi, 200))
    for s in spectra:
        ax = axes[layers.index(s.layer), heads.index(s.head)]
        ax.plot(circle.real, circle.imag, color="0.6", lw=0.6)
        ax.axvline(0.0, color="0.3", lw=0.6)
        ax.axhline(0.0, color="0.85", lw=0.4)
        if (s.layer, s.head) in base:
            b = base[(s.layer, s.head)].value_eigenvalues
            ax.scatter(b.real, b.imag, s=3, color="0.6", lw=0)
        ev = s.value_eigenvalues
        ax.scatter(ev.real, ev.imag, s=4, color="tab:blue", lw=0)
        ax.scatter([s.lambda_max.real], [s.lambda_max.imag], s=14, color="red", lw=0)
        r = max(1.05, 1.05 * float(np.max(np.abs(ev))))
        ax.set(xlim=(-r, r), ylim=(-r, r), aspect="equal")
        ax.set_title(f"L{s.layer} H{s.head}  {s.kind}", fontsize=7)
        ax.tick_params(labelsize=5)
    height = fig.get_figheight()
    fig.suptitle(title, fontsize=9, y=1 - 0.15 / height)
    fig.subplots_adjust(left=0.03, right=0.99, bottom=0.03, top=1 - 0.65 / height,
                        wspace=0.35, hspace=0.45)
    return fig


def write_spectra(model_dir: str | Path, out_dir: str | Path,
                  layers: Sequence[int] | None = None, seed: int = 0) -> dict[str, Any]:
    """Compute the per-head spectra of a checkpoint and of its Gaussian baseline and write

    * ``spectra.png``: the grid of complex-plane panels (`plot_spectra`);
    * ``heads.csv``, ``heads.json``: one row per head and source ("pretrained", "gaussian");
    * ``summary.json``: the returned numbers.

    `model_dir` is a checkpoint directory or a GGUF file. Returns {"model": name, "model_dir",
    "layout", "d", "d_head", "layers", "seed", "note" (what the weights are, e.g. dequantised
    GGUF tensors; "" for a checkpoint directory), "pretrained": spectra_summary(...),
    "gaussian": spectra_summary(...), "files": [...]}.
    """
    seed = integer("seed", seed, 0, expected="a non-negative integer (the baseline's seed)")
    ckpt, loaded = load_model_layers(model_dir, layers)
    spectra = [s for layer in loaded for s in layer_spectra(layer)]
    baseline_layers = gaussian_layers(ckpt, [layer.index for layer in loaded], seed)
    baseline = [s for layer in baseline_layers for s in layer_spectra(layer)]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = ([{"source": "pretrained", **s.row()} for s in spectra]
            + [{"source": "gaussian", **s.row()} for s in baseline])
    with open(out / "heads.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (out / "heads.json").write_text(json.dumps(rows, indent=1))
    fig = plot_spectra(spectra, f"{ckpt.name}: eigenvalues of $W_V^h W_O^h$ per head "
                       f"(grey: Gaussian init, s = {ckpt.initializer_range:g})", baseline)
    fig.savefig(out / "spectra.png", dpi=130)
    import matplotlib.pyplot as plt

    plt.close(fig)
    summary = {
        "model": ckpt.name,
        "model_dir": str(ckpt.model_dir),
        "layout": ckpt.layout,
        "d": ckpt.d,
        "d_head": ckpt.d_head,
        "layers": [layer.index for layer in loaded],
        "seed": seed,
        "initializer_range": ckpt.initializer_range,
        "note": getattr(ckpt, "note", ""),
        "pretrained": spectra_summary(spectra),
        "gaussian": spectra_summary(baseline),
        "files": ["spectra.png", "heads.csv", "heads.json", "summary.json"],
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def spectra_report(summary: dict[str, Any], figure: str = "spectra.png") -> str:
    """A Markdown section for the report from the dict `write_spectra` returns, beside the
    paper's findings for albert-xlarge-v2 (docs/science.md §5). `figure`: the image's path as the
    report should link it."""
    p, g = summary["pretrained"], summary["gaussian"]

    def fmt_range(x: dict[str, Any], key: str) -> str:
        lo, hi = x[f"{key}_range"]
        return f"{x[f'{key}_median']:.3g} [{lo:.3g}, {hi:.3g}]"

    negative = ", ".join(f"L{layer} H{head}" for layer, head in p["negative_heads"]) or "none"
    rows = [
        ("heads", p["n_heads"], g["n_heads"]),
        ("lambda_max real, negative", p["n_negative"], g["n_negative"]),
        ("lambda_max complex", p["n_complex"], g["n_complex"]),
        ("lambda_max real, positive", p["n_positive"], g["n_positive"]),
        ("Re lambda_max < 0", p["n_lambda_max_re_negative"], g["n_lambda_max_re_negative"]),
        ("Re lambda_max: median [min, max]", fmt_range(p, "lambda_max_re"),
         fmt_range(g, "lambda_max_re")),
        ("beta_eff (spectral norm of B_h): median [min, max]", fmt_range(p, "beta_eff"),
         fmt_range(g, "beta_eff")),
        ("atlas rows of W_V W_O", _rows_text(p["atlas_rows"]), _rows_text(g["atlas_rows"])),
    ]
    table = "\n".join(f"| {name} | {a} | {b} |" for name, a, b in rows)
    layers = ", ".join(str(layer) for layer in summary["layers"])
    return f"""## Value and query-key spectra of a pretrained Transformer (docs/science.md §5)

The paper's figure is for **albert-xlarge-v2** (d = 2048, 16 heads of size 128, one layer
shared by all 24). This run used **{summary["model"]}** ({summary["layout"]} layout, d =
{summary["d"]}, heads of size {summary["d_head"]}, layers {layers}), read offline from
`{summary["model_dir"]}`; the baseline draws every weight i.i.d. N(0, s^2) with the same shapes
and s = {summary["initializer_range"]:g} (the model's initializer_range), seed {summary["seed"]}.

Per head: lambda_max is the eigenvalue of largest real part of W_V^h W_O^h (the nonzero
spectrum of V_h = W_O^h W_V^h); beta_eff is the spectral norm of
B_h = (W_Q^h)^T W_K^h / sqrt(d_head) (scores between unit tokens; LayerNorm'd tokens of norm
~sqrt(d) see about d times more).

| | pretrained | Gaussian init |
|---|---|---|
{table}

{summary.get("note", "")}

Heads with a real negative lambda_max: {negative}. The paper reports for albert-xlarge-v2 that
most heads have a real top eigenvalue, that heads 1 and 6 have a negative lambda_max, and that
Gaussian initialisation keeps lambda_max far from the left half-plane, so negative (repulsive)
heads are learned.

![eigenvalues of W_V W_O per head]({figure})
"""


def _rows_text(rows: dict[str, int]) -> str:
    return ", ".join(f"{name} {count}" for name, count in sorted(rows.items()))
