"""Pre-LN against post-LN: the same start, a different speed of collapse.

Equiangular tokens (every pairwise inner product rho = 0.2), full attention, Q = K = V = I,
beta = 1: post-LN (the paper's model, tokens on the sphere) against pre-LN (GPT-2 / LLaMA:
tokens in R^d, the radius grows and slows the angular motion). The distance to collapse
1 - rho(t) decays like e^{-2t} under post-LN and only like 1/t^2 under pre-LN.
Set ATTNFLOW_GALLERY_TINY=1 for a seconds-long run; ATTNFLOW_GALLERY_OUT=DIR for the image.
"""

import os
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

import attnflow as af
from attnflow.analysis import closedforms

tiny = os.environ.get("ATTNFLOW_GALLERY_TINY") == "1"
n, t_end = (4, 3.0) if tiny else (8, 30.0)
x0 = closedforms.equiangular_start(n, d=n, rho=0.2)
save = np.linspace(0, t_end, 61)

fig = Figure(figsize=(4.5, 3.2), layout="constrained")
ax = fig.subplots()
for norm in ("post", "pre"):
    model = af.Attention(beta=1.0, mask="full", norm=norm)
    theta = af.simulate(model, x0, t_end, save_at=save, method="rk4", dt=0.01).directions
    rho = np.einsum("tkd,tjd->tkj", theta, theta)[:, 0, 1]  # one pair: all pairs are equal
    ax.plot(save, 1 - rho, label=f"{norm}-LN")
ax.set(yscale="log", ylim=(1e-15, 2), xlabel="t (layers)", ylabel="1 - rho(t)")
ax.legend()
fig.savefig(Path(os.environ.get("ATTNFLOW_GALLERY_OUT", ".")) / "pre_vs_post_ln.png", dpi=120)
