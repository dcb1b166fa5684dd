"""Analysis of token configurations and trajectories: pure functions, arrays in, arrays out.

The quantities of tokens compute with the array they are given: numpy, or torch tensors on
their device and in their autograd graph (the energy, the cosines, the order parameter, the
effective rank, the moments, ...); the combinatorial ones (clusters, Rényi centers, consumed
fractions, density modes) refuse a tensor that requires grad, naming a differentiable
neighbour, and read a tensor without grad from a host copy.

* clusters: single-linkage clusters at a geodesic tolerance (`clusters`, `cluster_count`,
  `cluster_counts`).
* renyi: Rényi centers and strong Rényi centers, the fraction of tokens they consume.
* atlas: the atlas of final configurations predicted from V's spectrum, and the classifier
  of observed final configurations.
* parking: expected numbers of (strong) Rényi centers, Rényi's parking constant.
* theory: h, g, tau_beta and the conditions of Lemma 5.1, Theorem 5.2 and Remark B.2.
* depth: the diagnostics battery through depth, for simulated and real tokens (cosines,
  attention sink, effective rank, angular distance, clusters, Rényi centers, massive
  activations, norm spread; `battery`).
* energy: the interaction energy E_beta and its logarithm (docs/science.md §6).
* dispersion: the dispersion relation of the uniform state on every sphere S^{d-1}
  (docs/science.md §9): the linear growth rate of degree-l harmonics, softmax or
  unnormalised weights, with strength and noise (`dispersion_rate`).
* metrics: the registry of quantities over time (`METRICS`: name, shape, units, whether
  differentiable, a description), `evaluate_metric`; sweeps, stored summaries, the battery,
  the explorer and `attnflow.plot.plot_metric` read it.
* family: closed forms of the model family (docs/science.md §6): the equiangular ODEs and
  exact equiangular starts, the noisy Kuramoto order parameter, the long-context self-weight
  and output correlation, the mean-field cluster number k*.
* threebody: three tokens on the circle (docs/science.md §11.3): the linear rate of the
  equilateral triangle for beta of either sign, its sign change at -2/3, and the
  classification of a final configuration (synchronised, triangle, other).
* gaussian: the Gaussian closure of unnormalised attention in R^d (docs/science.md §11.5):
  the moment ODE of the mean and covariance, its closed form and blow-up time for V = I,
  Q = K = I.
* tricritical: noisy unnormalised attention on S^{d-1} (docs/science.md §11.2): the uniform
  state's instability strength K_#, the tricritical beta_*, the Landau coefficient, the
  stationary branch, the first-order strengths (spinodal, critical), the particles' linear
  fluctuations.
* kinetic: closed forms of the mean-field equation on the circle (docs/science.md §9): the
  Hardy kernel psi and the causal memory profile, quantiles of a
  density given by its Fourier coefficients; with ALiBi (§11.1): the Hardy label, the
  retrieval profile, the soft accuracy and the critical time of recency; the same linear
  equation on n discrete tokens (the finite-n linear theory).
* influence: the influence of each token on the last one, |d theta_n(t) / d theta_j(0)|,
  linearised (docs/science.md §11.7): its mean and rms over starts, its recency time t_I.
* modes: clusters as the modes of a kernel density at the length scale beta^{-1/2}, counted
  by persistence with a mass fraction (`density_cluster_count`; `density_peak_count` for a
  density's coefficients): a count that means the same at n = 10 and n = 10^6.
* moments: particles against a density on the circle (docs/science.md §9): the Fourier
  moments with their standard errors, the Wasserstein-1 distance (closed form on the circle).
* harmonics: the moments of real orthonormal harmonics on every sphere (Fourier on the
  circle, spherical harmonics on S^2, zonal Gegenbauer on S^{d-1}, d >= 4) with standard
  errors and the rotation-invariant power per degree, on arrays or torch tensors.
* selectivity: one query over n iid uniform keys on S^{d-1} (docs/science.md §11.4): the
  critical scale beta_n = gamma n^{2/(d-1)}, the moments of the weights' limit law (a Poisson
  process of the nearest keys), exact samplers of the gaps 1 - <q, k>, the weights'
  statistics.

Definitions follow docs/science.md §§2-4 and are restated in each docstring.
"""

from attnflow.analysis.atlas import (
    ROWS,
    AtlasPrediction,
    ObservedConfiguration,
    classify_configuration,
    distance_to_subspace,
    predict_configuration,
)
from attnflow.analysis.clusters import (
    Clusters,
    cluster_count,
    cluster_counts,
    clusters,
    default_cluster_tol,
    length_scale,
    spanning_tree,
)
from attnflow.analysis.depth import (
    SINK_EPS,
    angular_distance,
    attention_to_first,
    cluster_count_at,
    cosine_to_first,
    effective_rank,
    massive_activation,
    mean_direction,
    mean_pairwise_cosine,
    norm_spread,
    order_parameter,
    renyi_center_count,
    sink_rate,
    strong_renyi_center_count,
)
from attnflow.analysis.dispersion import dispersion_rate
from attnflow.analysis.energy import energy, log_energy
from attnflow.analysis.family import (
    equiangular_rhs,
    equiangular_start,
    k_star,
    kuramoto_order,
    noise_threshold,
    output_correlation,
    output_correlation_limit,
    self_weight,
    uniform_fluctuation,
)
from attnflow.analysis.gaussian import (
    gaussian_blowup_time,
    gaussian_isotropic_moments,
    gaussian_moment_rhs,
    gaussian_moments,
)
from attnflow.analysis.harmonics import HarmonicMoments, harmonic_moments
from attnflow.analysis.influence import (
    influence_recency_time,
    mean_influence,
    rms_influence,
)
from attnflow.analysis.kinetic import (
    alibi_memory,
    causal_memory,
    cell_memory,
    hardy_kernel,
    hardy_label,
    inverse_cdf,
    recency_time,
    soft_accuracy,
    soft_weights,
    token_memory,
)
from attnflow.analysis.metrics import METRICS, Metric, MetricContext, battery, evaluate_metric
from attnflow.analysis.modes import (
    DensityModes,
    density_cluster_count,
    density_modes,
    density_peak_count,
    kde_circle,
)
from attnflow.analysis.moments import FourierMoments, fourier_moments, wasserstein_circle
from attnflow.analysis.parking import (
    RENYI_PARKING_CONSTANT,
    cap_mass,
    expected_renyi_centers_circle,
    expected_strong_centers,
    renyi_parking_mean,
)
from attnflow.analysis.renyi import consumed_fraction, renyi_centers, strong_renyi_centers
from attnflow.analysis.selectivity import (
    LimitStatistics,
    cap_constant,
    critical_beta,
    limit_keys,
    limit_statistics,
    mean_kernel,
    nearest_gaps,
    poisson_gaps,
    sample_gaps,
    weight_statistics,
)
from attnflow.analysis.theory import (
    Lemma51Bound,
    RemarkB2Check,
    Theorem52Check,
    g,
    h,
    lemma51_bound,
    remark_b2_conditions,
    tau_beta,
    theorem52_conditions,
    theorem52_max_N,
    theorem52_min_beta,
)
from attnflow.analysis.threebody import three_token_state, triangle_rates, triangle_threshold
from attnflow.analysis.tricritical import (
    StationaryBranch,
    TransitionStrengths,
    funk_hecke,
    instability_strength,
    landau_coefficient,
    linear_fluctuation,
    stationary_branch,
    stationary_order,
    transition_strengths,
    tricritical_beta,
)

__all__ = [
    "METRICS",
    "Metric",
    "MetricContext",
    "RENYI_PARKING_CONSTANT",
    "ROWS",
    "AtlasPrediction",
    "Clusters",
    "DensityModes",
    "FourierMoments",
    "HarmonicMoments",
    "Lemma51Bound",
    "ObservedConfiguration",
    "RemarkB2Check",
    "SINK_EPS",
    "Theorem52Check",
    "angular_distance",
    "attention_to_first",
    "battery",
    "cap_mass",
    "classify_configuration",
    "cluster_count",
    "cluster_count_at",
    "cluster_counts",
    "default_cluster_tol",
    "density_cluster_count",
    "density_modes",
    "density_peak_count",
    "clusters",
    "consumed_fraction",
    "cosine_to_first",
    "dispersion_rate",
    "distance_to_subspace",
    "effective_rank",
    "energy",
    "evaluate_metric",
    "equiangular_rhs",
    "equiangular_start",
    "expected_renyi_centers_circle",
    "expected_strong_centers",
    "fourier_moments",
    "g",
    "h",
    "k_star",
    "kde_circle",
    "kuramoto_order",
    "length_scale",
    "lemma51_bound",
    "log_energy",
    "massive_activation",
    "mean_direction",
    "mean_pairwise_cosine",
    "noise_threshold",
    "norm_spread",
    "order_parameter",
    "output_correlation",
    "output_correlation_limit",
    "predict_configuration",
    "remark_b2_conditions",
    "renyi_center_count",
    "renyi_centers",
    "renyi_parking_mean",
    "self_weight",
    "sink_rate",
    "spanning_tree",
    "strong_renyi_center_count",
    "strong_renyi_centers",
    "tau_beta",
    "theorem52_conditions",
    "theorem52_max_N",
    "theorem52_min_beta",
    "uniform_fluctuation",
    "wasserstein_circle",
    "causal_memory",
    "cell_memory",
    "hardy_kernel",
    "harmonic_moments",
    "inverse_cdf",
    "LimitStatistics",
    "cap_constant",
    "critical_beta",
    "limit_keys",
    "limit_statistics",
    "mean_kernel",
    "nearest_gaps",
    "poisson_gaps",
    "sample_gaps",
    "weight_statistics",
    "three_token_state",
    "triangle_rates",
    "triangle_threshold",
    "gaussian_blowup_time",
    "gaussian_isotropic_moments",
    "gaussian_moment_rhs",
    "gaussian_moments",
    "alibi_memory",
    "influence_recency_time",
    "mean_influence",
    "rms_influence",
    "hardy_label",
    "recency_time",
    "soft_accuracy",
    "soft_weights",
    "token_memory",
    "StationaryBranch",
    "TransitionStrengths",
    "funk_hecke",
    "instability_strength",
    "landau_coefficient",
    "linear_fluctuation",
    "stationary_branch",
    "stationary_order",
    "transition_strengths",
    "tricritical_beta",
]
