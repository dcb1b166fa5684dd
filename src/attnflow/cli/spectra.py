"""`attnflow spectra`: per-head value and query-key spectra of a pretrained checkpoint."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from attnflow.cli import app


def parse_layers(text: str | None) -> list[int] | None:
    """'0,2,5' -> [0, 2, 5]; None -> None (every distinct weight set)."""
    if text is None:
        return None
    try:
        return [int(v) for v in text.split(",")]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated layer indices, got {text!r}") from None


@app.command()
def spectra(
    model_dir: Path = typer.Argument(..., help="Hugging Face checkpoint directory (config.json "
                                     "and model.safetensors or pytorch_model.bin); read "
                                     "offline."),
    out: Path = typer.Option(Path("spectra"), "--out", "-o", help="Output directory."),
    layers: str = typer.Option(None, help="Comma-separated layer indices (default: every "
                               "distinct set of weights; one per group for ALBERT)."),
    seed: int = typer.Option(0, help="Seed of the Gaussian-initialised baseline."),
) -> None:
    """Eigenvalues of W_V^h W_O^h per head (complex-plane grid), lambda_max, atlas rows and
    effective betas ||W_Q^T W_K / sqrt(d_head)||_2, beside a Gaussian-initialised baseline."""
    from attnflow.pretrained import write_spectra

    console = Console(stderr=True)
    try:
        summary = write_spectra(model_dir, out, parse_layers(layers), seed)
    except ValueError as err:
        console.print(f"error: {err}", style="red", markup=False, highlight=False)
        raise typer.Exit(2) from None
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
    print(f"written           {', '.join(str(Path(out) / f) for f in summary['files'])}")
