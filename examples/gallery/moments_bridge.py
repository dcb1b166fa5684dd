"""Particles against the mean field, moment by moment.

10^6 tokens drawn i.i.d. from rho_0 ~ exp(0.5 cos theta + 0.3 sin 3 theta)
(af.meanfield.sample), full attention, beta = 9, RK4 with the harmonic kernel, against the
mean-field solver from rho_0: the Fourier moments M_k(t) of the tokens in the band
m_k +- 2 sd / sqrt(n) of n i.i.d. draws of rho(t). ATTNFLOW_GALLERY_TINY=1: a seconds-long
run; ATTNFLOW_GALLERY_OUT=DIR: where the image goes.
"""

import os
from pathlib import Path

import numpy as np

import attnflow as af

tiny = os.environ.get("ATTNFLOW_GALLERY_TINY") == "1"
n, t_end = (2000, 0.5) if tiny else (1_000_000, 2.0)
rho0 = af.meanfield.from_function(lambda t: np.exp(0.5 * np.cos(t) + 0.3 * np.sin(3 * t)),
                                  modes=128)
times = np.linspace(0, t_end, 11)
model = af.Attention(beta=9.0, mask="full", backend="harmonic")
traj = af.simulate(model, af.meanfield.sample(rho0, n, seed=0), t_end, dt=0.05,
                   method="rk4", save_at=times)
field = af.meanfield.solve(model, rho0, t_end, save_at=times)
fig = af.plot.plot_moments(field, traj, modes=(1, 2, 3))
fig.savefig(Path(os.environ.get("ATTNFLOW_GALLERY_OUT", ".")) / "moments_bridge.png", dpi=120)
