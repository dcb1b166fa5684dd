"""Fig. 2 on the circle: causal attention gathers tokens into meta-stable clusters.

200 tokens uniform on the circle, Q = K = V = I, beta = 64, causal mask; snapshots at
t = 0, 10, 75 and 150 with Rényi centers (black rings) and strong Rényi centers (red).
Set ATTNFLOW_GALLERY_TINY=1 for a seconds-long run; ATTNFLOW_GALLERY_OUT=DIR for the image.
"""

import os
from pathlib import Path

import attnflow as af

tiny = os.environ.get("ATTNFLOW_GALLERY_TINY") == "1"
n, times = (40, [0, 2, 5, 10]) if tiny else (200, [0, 10, 75, 150])

x0 = af.sphere.uniform(n, d=2, seed=0)
model = af.Attention(beta=64.0, mask="causal")
traj = af.simulate(model, x0, t_end=times[-1], save_at=times, method="rk4", dt=0.05, seed=0)

fig = af.plot.plot_circle(traj, t=times)
fig.savefig(Path(os.environ.get("ATTNFLOW_GALLERY_OUT", ".")) / "fig2_circle.png", dpi=120)
