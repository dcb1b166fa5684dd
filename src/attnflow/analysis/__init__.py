"""Analysis of token configurations and trajectories: pure functions, arrays in, numbers out,
in submodules by subject (import the subject, or its names from it):

* `clusters`: single-linkage clusters at a geodesic tolerance (`clusters`, `cluster_count`,
  `spanning_tree`, `default_cluster_tol`, `length_scale`).
* `modes`: clusters as the modes of a kernel density at the length scale beta^-1/2, counted by
  persistence with a mass fraction (`density_cluster_count`; `density_peak_count` for a
  density's coefficients): a count that means the same at n = 10 and n = 10^6.
* `renyi`: Rényi centers and strong Rényi centers, the fraction of tokens they consume.
* `energy`: the interaction energy E_beta and its logarithm (docs/science.md §6).
* `moments`: particles against a density (docs/science.md §9): harmonic moments on every
  sphere (Fourier on the circle, spherical harmonics on S^2, zonal Gegenbauer moments for
  d >= 4) and Fourier moments, with their standard errors; the Wasserstein-1 distance on the
  circle.
* `depth`: the diagnostics battery through depth, for simulated and real tokens (cosines,
  attention sink, effective rank, angular distance, clusters, Rényi centers, massive
  activations, norm spread; `battery`).
* `metrics`: the registry of quantities over time (`METRICS`: name, shape, units, whether
  differentiable, a description), `evaluate_metric`, the depth `battery`; sweeps, stored
  summaries, the battery, the explorer and `attnflow.plot.plot_metric` read it.
* `atlas`: the atlas of final configurations predicted from V's spectrum, and the classifier
  of observed final configurations.
* `closedforms`: every closed form the recipes hold simulations to: Lemma 5.1, Theorem 5.2
  and Remark B.2 (h, g, tau_beta), the model family's (equiangular ODEs, Kuramoto order,
  long-context self-weight), the mean field's (growth rates, the Hardy kernel, memory
  profiles), one dispersion relation for every sphere (`dispersion_rate`), the parking
  constants, the tricritical point, selectivity at long context, the
  Gaussian closure, three tokens on the circle, the linearised influence.

Definitions follow docs/science.md and are restated in each docstring. The modules the
closed forms are defined in (theory, family, kinetic, dispersion, parking, tricritical,
selectivity, gaussian, threebody, influence) stay importable; `closedforms` is their one public
home.
"""

from attnflow.analysis import (
    atlas,
    closedforms,
    clusters,
    depth,
    energy,
    metrics,
    modes,
    moments,
    renyi,
)

__all__ = ["atlas", "closedforms", "clusters", "depth", "energy", "metrics", "modes", "moments",
           "renyi"]
