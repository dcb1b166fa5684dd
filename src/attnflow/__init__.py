"""attnflow: self-attention dynamics of tokens on the sphere.

Simulate causal (decoder-style), full and windowed attention as interacting particles on
S^{d-1}, and analyse what deep attention stacks do to tokens. The science is that of
Karagodin, Polyanskiy & Rigollet, *Clustering in Causal Attention Masking* (NeurIPS 2024).

    >>> import attnflow as af
    >>> x0 = af.sphere.uniform(200, d=2, seed=0)
    >>> traj = af.simulate(af.Attention(beta=64), x0, t_end=150)
"""

from attnflow import analysis, pretrained, sphere
from attnflow.analysis import (
    RENYI_PARKING_CONSTANT,
    Clusters,
    classify_configuration,
    cluster_count,
    cluster_counts,
    clusters,
    consumed_fraction,
    expected_renyi_centers_circle,
    expected_strong_centers,
    g,
    h,
    lemma51_bound,
    predict_configuration,
    remark_b2_conditions,
    renyi_centers,
    strong_renyi_centers,
    tau_beta,
    theorem52_conditions,
    theorem52_max_N,
    theorem52_min_beta,
)
from attnflow.integrate import NonFiniteStateError
from attnflow.model import Attention
from attnflow.simulate import simulate
from attnflow.sweep import sweep
from attnflow.trajectory import Trajectory, load

__version__ = "0.1.0"

__all__ = [
    "Attention",
    "Clusters",
    "analysis",
    "pretrained",
    "classify_configuration",
    "cluster_count",
    "cluster_counts",
    "clusters",
    "consumed_fraction",
    "predict_configuration",
    "renyi_centers",
    "strong_renyi_centers",
    "RENYI_PARKING_CONSTANT",
    "expected_renyi_centers_circle",
    "expected_strong_centers",
    "g",
    "h",
    "lemma51_bound",
    "remark_b2_conditions",
    "tau_beta",
    "theorem52_conditions",
    "theorem52_max_N",
    "theorem52_min_beta",
    "sweep",
    "NonFiniteStateError",
    "Trajectory",
    "__version__",
    "load",
    "simulate",
    "sphere",
]
