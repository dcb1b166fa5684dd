"""A million tokens against the mean-field equation.

10^6 tokens on the circle at the quantiles of rho_0 ~ 1 + 0.4 cos 3 theta + 0.2 sin theta,
full attention, beta = 9, RK4 with the harmonic kernel (O(n K) per step), against the
mean-field solver from the same density. ATTNFLOW_GALLERY_TINY=1: a seconds-long run;
ATTNFLOW_GALLERY_OUT=DIR: where the image goes.
"""

import os
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

import attnflow as af

tiny = os.environ.get("ATTNFLOW_GALLERY_TINY") == "1"
n, t_end = (2000, 0.5) if tiny else (1_000_000, 3.4)
rho = lambda t: 1 + 0.4 * np.cos(3 * t) + 0.2 * np.sin(t)  # noqa: E731
grid = np.linspace(-np.pi, np.pi, 20001)  # tokens at the quantiles of rho:
theta = np.interp((np.arange(n) + 0.5) / n, np.cumsum(rho(grid)) / rho(grid).sum(), grid)
model = af.Attention(beta=9.0, mask="full", backend="harmonic")
times = np.linspace(0, t_end, 31)
traj = af.simulate(model, np.stack([np.cos(theta), np.sin(theta)], -1), t_end, dt=0.05,
                   save_at=times)
field = af.meanfield.solve(model, af.meanfield.from_function(rho, modes=256), t_end,
                           save_at=times)
angles = np.arctan2(traj.states[..., 1], traj.states[..., 0])
hist = np.stack([np.histogram(a, 256, (-np.pi, np.pi), density=True)[0] for a in angles])
dens = np.roll(field.density(1024)[:, 0], 512, axis=1)  # (T, 1024) angles from -pi
fig = Figure(figsize=(6.4, 2.8), layout="constrained")
axes = fig.subplots(1, 2, sharey=True)
top = max(hist.max(), dens.max())
for ax, img, title in ((axes[0], hist, f"{n:,} tokens"), (axes[1], dens, "mean field")):
    im = ax.imshow(img.T, origin="lower", aspect="auto", vmin=0, vmax=top, cmap="magma",
                   extent=(0, t_end, -np.pi, np.pi))
    ax.set(xlabel="t (layers)", title=title)
axes[0].set_ylabel("angle"), fig.colorbar(im, ax=axes, label="density")
fig.savefig(Path(os.environ.get("ATTNFLOW_GALLERY_OUT", ".")) / "million_tokens.png", dpi=120)
