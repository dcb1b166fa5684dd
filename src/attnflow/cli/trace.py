"""`attnflow trace`: one forward pass of a decoder or encoder, written as a TransformerLens-named
trace."""

from __future__ import annotations

from pathlib import Path

import typer

from attnflow.cli._app import app
from attnflow.cli._options import output_path


@app.command()
def trace(
    model: str = typer.Argument(..., help="A .gguf decoder, a Hugging Face checkpoint folder "
                                "(BERT-layout encoder), or an installed weight package's "
                                "name (smollm2, gemma3-270m, minilm)."),
    text: str = typer.Option(None, help="The text to run (the model's own tokenizer)."),
    token_ids: str = typer.Option(None, help="Comma-separated token ids instead of --text."),
    out: Path = typer.Option(Path("trace.zarr"), "--out", "-o", help="Output .zarr store."),
    attention: bool = typer.Option(True, help="Also record every head's attention pattern "
                                   "(layers x heads x n^2 floats)."),
    mlp: bool = typer.Option(True, help="--no-mlp: the ablation, the same model with every "
                             "MLP sublayer dropped (attention and norms only)."),
) -> None:
    """Run a decoder or encoder on a text and write its residual stream (blocks.{l}.hook_resid_pre,
    hook_resid_mid, hook_resid_post) and attention patterns (blocks.{l}.attn.hook_pattern)
    as an xarray Dataset in Zarr, in TransformerLens's hook names."""
    from attnflow._checks import fail
    from attnflow.pretrained.trace import save_trace
    from attnflow.pretrained.trace import trace as run

    output_path("--out", out, [".zarr"])
    ids = None
    if token_ids is not None:
        try:
            ids = [int(v) for v in token_ids.split(",")]
        except ValueError:
            raise fail("--token-ids", "comma-separated integers", repr(token_ids)) from None
    if (text is None) == (ids is None):
        raise fail("--text/--token-ids", "exactly one of them",
                   "both" if text is not None else "neither")
    ds = run(model, text=text, token_ids=ids, attention=attention, mlp=mlp)
    path = save_trace(ds, out)
    L = sum(1 for name in ds.data_vars if name.endswith("hook_resid_post"))
    print(f"model        {model}")
    print(f"tokens       {ds.sizes['pos']}")
    print(f"layers       {L}" + ("" if mlp else " (MLPs dropped)"))
    print(f"written      {path}")
