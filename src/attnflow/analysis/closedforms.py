"""The closed forms of the theory, gathered: one home for every formula the recipes hold
simulations to (docs/science.md). Each name is defined in the module of its paper or
section (theory: Lemma 5.1, Theorem 5.2, Remark B.2; family: the model family, §6;
kinetic: the mean field, §9 and §11.1; tricritical, selectivity, gaussian, threebody:
§11; parking: Rényi's parking problem; influence: the linearised influence, §11.7);
its docstring there restates the definition."""

from __future__ import annotations

from attnflow.analysis.dispersion import (  # noqa: F401
    ATTENTIONS,
    dispersion_rate,
)
from attnflow.analysis.family import (  # noqa: F401
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
from attnflow.analysis.gaussian import (  # noqa: F401
    gaussian_blowup_time,
    gaussian_isotropic_moments,
    gaussian_moment_rhs,
    gaussian_moments,
)
from attnflow.analysis.influence import (  # noqa: F401
    influence_recency_time,
    mean_influence,
    rms_influence,
)
from attnflow.analysis.kinetic import (  # noqa: F401
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
from attnflow.analysis.parking import (  # noqa: F401
    RENYI_PARKING_CONSTANT,
    cap_mass,
    expected_renyi_centers_circle,
    expected_strong_centers,
    renyi_parking_mean,
)
from attnflow.analysis.selectivity import (  # noqa: F401
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
from attnflow.analysis.theory import (  # noqa: F401
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
from attnflow.analysis.threebody import (  # noqa: F401
    three_token_state,
    triangle_rates,
    triangle_threshold,
)
from attnflow.analysis.tricritical import (  # noqa: F401
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

__all__ = ["ATTENTIONS", "Lemma51Bound", "LimitStatistics", "RENYI_PARKING_CONSTANT",
           "RemarkB2Check", "StationaryBranch", "Theorem52Check", "TransitionStrengths",
           "alibi_memory", "cap_constant", "cap_mass", "causal_memory", "cell_memory",
           "critical_beta", "dispersion_rate", "equiangular_rhs", "equiangular_start",
           "expected_renyi_centers_circle", "expected_strong_centers", "funk_hecke", "g",
           "gaussian_blowup_time", "gaussian_isotropic_moments", "gaussian_moment_rhs",
           "gaussian_moments", "h", "hardy_kernel", "hardy_label", "influence_recency_time",
           "instability_strength", "inverse_cdf", "k_star", "kuramoto_order", "landau_coefficient",
           "lemma51_bound", "limit_keys", "limit_statistics", "linear_fluctuation",
           "mean_influence", "mean_kernel", "nearest_gaps", "noise_threshold",
           "output_correlation", "output_correlation_limit", "poisson_gaps", "recency_time",
           "remark_b2_conditions", "renyi_parking_mean", "rms_influence", "sample_gaps",
           "self_weight", "soft_accuracy", "soft_weights", "stationary_branch", "stationary_order",
           "tau_beta", "theorem52_conditions", "theorem52_max_N", "theorem52_min_beta",
           "three_token_state", "token_memory", "transition_strengths", "triangle_rates",
           "triangle_threshold", "tricritical_beta", "uniform_fluctuation", "weight_statistics"]
