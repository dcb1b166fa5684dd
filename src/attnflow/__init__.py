"""attnflow: self-attention dynamics of tokens on the sphere.

Simulate causal (decoder-style), full and windowed attention as interacting particles on
S^{d-1}, and analyse what deep attention stacks do to tokens. The science is that of
Karagodin, Polyanskiy & Rigollet, *Clustering in Causal Attention Masking* (NeurIPS 2024).

    >>> import attnflow as af
    >>> x0 = af.sphere.uniform(200, d=2, seed=0)
    >>> traj = af.simulate(af.Attention(beta=64), x0, t_end=150)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from attnflow._version import __version__

# Public name -> the module that defines it. Loaded on first use, so `import attnflow` stays
# fast (scipy.stats, xarray, zarr, dask and matplotlib load only when needed).
_ANALYSIS = (  # = attnflow.analysis.__all__ (tests/test_package.py checks it)
    "AtlasPrediction", "Clusters", "Lemma51Bound", "ObservedConfiguration", "alibi_memory",
    "hardy_label", "recency_time", "soft_accuracy", "soft_weights", "influence_recency_time",
    "mean_influence", "rms_influence", "token_memory",
    "RENYI_PARKING_CONSTANT", "ROWS", "RemarkB2Check", "SINK_EPS", "Theorem52Check",
    "angular_distance", "attention_to_first", "battery", "cap_mass", "causal_memory",
    "cell_memory", "classify_configuration", "cluster_count", "cluster_count_at", "cluster_counts",
    "clusters", "consumed_fraction", "cosine_to_first", "default_cluster_tol", "dispersion_rate",
    "distance_to_subspace", "effective_rank", "energy", "equiangular_rhs", "equiangular_start",
    "expected_renyi_centers_circle", "expected_strong_centers", "g",
    "gaussian_blowup_time", "gaussian_isotropic_moments", "gaussian_moment_rhs",
    "gaussian_moments", "h",
    "hardy_kernel", "inverse_cdf", "k_star", "kuramoto_order", "length_scale", "lemma51_bound",
    "log_energy", "massive_activation", "mean_pairwise_cosine", "noise_threshold", "norm_spread",
    "output_correlation", "output_correlation_limit", "predict_configuration",
    "remark_b2_conditions", "renyi_center_count", "renyi_centers", "renyi_parking_mean",
    "self_weight", "sink_rate", "spanning_tree", "strong_renyi_center_count",
    "strong_renyi_centers", "tau_beta", "theorem52_conditions", "theorem52_max_N",
    "theorem52_min_beta", "uniform_fluctuation",
    "METRICS", "Metric", "MetricContext", "evaluate_metric", "mean_direction", "order_parameter",
    "LimitStatistics", "cap_constant", "critical_beta", "limit_keys", "limit_statistics",
    "mean_kernel", "nearest_gaps", "poisson_gaps", "sample_gaps", "weight_statistics",
    "three_token_state", "triangle_rates", "triangle_threshold",
    "FourierMoments", "fourier_moments", "wasserstein_circle", "HarmonicMoments",
    "harmonic_moments", "DensityModes",
    "density_cluster_count", "density_modes", "density_peak_count", "kde_circle",
    "StationaryBranch", "TransitionStrengths", "funk_hecke", "instability_strength",
    "landau_coefficient", "linear_fluctuation", "stationary_branch",
    "stationary_order", "transition_strengths", "tricritical_beta",
)
_EXPORTS: dict[str, str] = {
    **{name: "attnflow.analysis" for name in _ANALYSIS},
    "sweep": "attnflow.sweeps",
    "explore": "attnflow.explorer",
    "explore_html": "attnflow.explorer",
    "explore_live": "attnflow.explorer",
    "influence": "attnflow.sensitivity",
}
_SUBMODULES = ("analysis", "explorer", "family", "kernels", "manifolds", "meanfield", "plot",
               "pretrained", "sphere", "sweeps")

# The core is imported eagerly (numpy only). `simulate` must be: the submodule of the same name
# would otherwise shadow the function once anything imports it.
from attnflow.brownian import BrownianPath  # noqa: E402
from attnflow.errors import CorruptFileError  # noqa: E402
from attnflow.family import (  # noqa: E402
    MLP,
    ALiBi,
    Attention,
    Block,
    LayerNorm,
    ProjectionBias,
    QKNorm,
    RMSNorm,
    RoPE,
    Stack,
)
from attnflow.integrate import NonFiniteStateError  # noqa: E402
from attnflow.savetimes import log_times  # noqa: E402
from attnflow.simulate import estimate_run, simulate  # noqa: E402
from attnflow.trajectory import Trajectory, load  # noqa: E402

__all__ = ["__version__", "MLP", "ALiBi", "Attention", "Block", "BrownianPath", "CorruptFileError",
           "LayerNorm", "NonFiniteStateError", "ProjectionBias", "QKNorm", "RMSNorm", "RoPE",
           "Stack", "Trajectory", "estimate_run", "load", "log_times", "simulate",
           *sorted(_EXPORTS), *_SUBMODULES]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"attnflow.{name}")
    else:
        raise AttributeError(f"module 'attnflow' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from attnflow import (  # noqa: F401
        analysis,
        explorer,
        family,
        kernels,
        manifolds,
        meanfield,
        plot,
        pretrained,
        sphere,
        sweeps,
    )
    from attnflow.analysis import *  # noqa: F403
    from attnflow.explorer import explore, explore_html, explore_live  # noqa: F401
    from attnflow.sensitivity import influence  # noqa: F401
    from attnflow.sweeps import sweep  # noqa: F401
