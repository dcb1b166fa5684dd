"""A sweep: how the number of clusters over time depends on beta.

A grid of beta values, 8 seeds each, 100 tokens on the circle (causal, Q = K = V = I), run
by `attnflow.sweep` in this process into an xarray Dataset; median cluster count against
time per beta. Set ATTNFLOW_GALLERY_TINY=1 for a seconds-long run;
ATTNFLOW_GALLERY_OUT=DIR for the image.
"""

import os
from pathlib import Path

from matplotlib.figure import Figure

import attnflow as af

tiny = os.environ.get("ATTNFLOW_GALLERY_TINY") == "1"
grid = {"beta": [4, 16] if tiny else [4, 16, 64, 256], "n": 16 if tiny else 100, "d": 2,
        "t_end": 5 if tiny else 100, "save_at": 11 if tiny else 51,
        "seeds": 2 if tiny else 8, "dt": 0.1}
ds = af.sweep(grid, keep={"metrics": ["cluster_count"]}, scheduler="serial")

fig = Figure(figsize=(4.5, 3.2), layout="constrained")
ax = fig.subplots()
for beta in ds["beta"].values:
    counts = ds["cluster_count"].sel(beta=beta).median("seed")
    ax.plot(ds["time"][1:], counts[1:], label=f"beta = {beta:g}")
ax.set(xscale="log", yscale="log", xlabel="t (layers)", ylabel="clusters (median over seeds)")
ax.legend(fontsize=8)
fig.savefig(Path(os.environ.get("ATTNFLOW_GALLERY_OUT", ".")) / "sweep_clusters.png", dpi=120)
