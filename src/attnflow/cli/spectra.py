"""Pretrained checkpoints on the command line: `attnflow spectra` (per-head value and
query-key spectra) and the `--from-model` path of `attnflow simulate`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from attnflow.cli._app import app


def parse_layers(text: str | None) -> list[int] | None:
    """'0,2,5' -> [0, 2, 5]; None -> None (every distinct weight set)."""
    if text is None:
        return None
    try:
        return [int(v) for v in text.split(",")]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated layer indices, got {text!r}",
                                 param_hint="--layers") from None


@app.command()
def spectra(
    model_dir: Path = typer.Argument(..., help="Hugging Face checkpoint directory (config.json "
                                     "and model.safetensors or pytorch_model.bin), or a "
                                     "LLaMA GGUF file (MODEL.gguf); read offline."),
    out: Path = typer.Option(Path("spectra"), "--out", "-o", help="Output directory."),
    layers: str = typer.Option(None, help="Comma-separated layer indices (default: every "
                               "distinct set of weights; one per group for ALBERT)."),
    seed: int = typer.Option(0, min=0, help="Seed of the Gaussian-initialised baseline."),
) -> None:
    """Eigenvalues of W_V^h W_O^h per head (complex-plane grid), lambda_max, atlas rows and
    effective betas ||W_Q^T W_K / sqrt(d_head)||_2, beside a Gaussian-initialised baseline."""
    from attnflow.pretrained import write_spectra

    summary = write_spectra(model_dir, out, parse_layers(layers), seed)
    p, g = summary["pretrained"], summary["gaussian"]
    print(f"model             {summary['model']} ({summary['layout']}, d = {summary['d']}, "
          f"d_head = {summary['d_head']}, layers {summary['layers']})")
    print(f"{'':34s}{'pretrained':>14s}{'gaussian':>14s}")
    for label, key in (("heads", "n_heads"), ("lambda_max real negative", "n_negative"),
                       ("lambda_max complex", "n_complex"),
                       ("lambda_max real positive", "n_positive"),
                       ("Re lambda_max < 0", "n_lambda_max_re_negative")):
        print(f"{label:34s}{p[key]:>14d}{g[key]:>14d}")
    for label, key in (("median Re lambda_max", "lambda_max_re_median"),
                       ("median beta_eff = |B_h|_2", "beta_eff_median")):
        print(f"{label:34s}{p[key]:>14.4g}{g[key]:>14.4g}")
    negative = ", ".join(f"L{layer} H{head}" for layer, head in p["negative_heads"]) or "none"
    print(f"negative heads    {negative}")
    if summary["note"]:
        print(f"note              {summary['note']}")
    print(f"written           {', '.join(str(Path(out) / f) for f in summary['files'])}")


def simulate_from_model(model_dir: Path, layer: int, head: int | None, text: str | None,
                        token_ids: str | None, out: Path, cluster_tol: float | None,
                        **options: Any) -> None:
    """`attnflow simulate --from-model`: run causal and full dynamics of one layer from the
    embedding of a text, write both trajectories (OUT with _causal / _full before the suffix)
    and print each final configuration beside the atlas prediction. `options` go to
    `attnflow.pretrained.run_pretrained` (beta, t_end, method, dt, rtol, atol, save_at,
    progress)."""
    from attnflow.pretrained import run_pretrained

    try:
        ids = None if token_ids is None else [int(v) for v in token_ids.split(",")]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated integers, got {token_ids!r}",
                                 param_hint="--token-ids") from None
    tol = 1e-2 if cluster_tol is None else cluster_tol
    result = run_pretrained(model_dir, layer, text=text, token_ids=ids, head=head, tol=tol,
                            **options)
    n, d = result.x0.shape
    which = "all heads (summed)" if head is None else f"head {head}"
    print(f"model             {result.model_name}, layer {layer}, {which}")
    print(f"tokens            n = {n}, d = {d}, ids {result.token_ids}")
    if result.prediction is None:
        print("atlas prediction  none (the atlas is for one value matrix: pass --head)")
    else:
        print(f"atlas prediction  {result.prediction.label}")
    for mask, (traj, seen) in result.runs.items():
        path = traj.save(out.with_name(f"{out.stem}_{mask}{out.suffix}"))
        print(f"{mask:17s} {seen.label}: {seen.n_clusters} clusters at tol {tol:g} rad, "
              f"max dist to x_1(0) {seen.max_dist_x1:.3g}, to L {seen.max_dist_L:.3g} rad "
              f"(t = {traj.times[-1]:g}, {traj.n_evals} field evaluations) -> {path}")
