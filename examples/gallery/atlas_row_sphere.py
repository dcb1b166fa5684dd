"""An atlas row on the sphere: V's spectrum predicts where the tokens end.

V = diag(1, 0.5, 0.2): lambda_max > 0 with a one-dimensional top eigenspace L, so the atlas
predicts two antipodal points +-x_i of L. 32 tokens on S^2, Q = K = I, beta = 9, dopri5.
Set ATTNFLOW_GALLERY_TINY=1 for a seconds-long run; ATTNFLOW_GALLERY_OUT=DIR for the image.
"""

import os
from pathlib import Path

import numpy as np

import attnflow as af

tiny = os.environ.get("ATTNFLOW_GALLERY_TINY") == "1"
n, t_end = (10, 20.0) if tiny else (32, 300.0)

V = np.diag([1.0, 0.5, 0.2])
print("predicted:", af.analysis.atlas.predict_configuration(V).label)
model = af.Attention(V=V, beta=9.0)
x0 = af.sphere.uniform(n, d=3, seed=1)
save = np.concatenate([np.linspace(0, 20, 81), np.linspace(20, t_end, 60)[1:]])
traj = af.simulate(model, x0, t_end, save_at=np.unique(save), method="dopri5", rtol=1e-6)
print("observed:", af.analysis.atlas.classify_configuration(traj.final, V).label)

fig = af.plot.plot_sphere(traj)
fig.savefig(Path(os.environ.get("ATTNFLOW_GALLERY_OUT", ".")) / "atlas_row_sphere.png", dpi=120)
