"""Analysis of token configurations and trajectories: pure functions, arrays in, numbers out.

* clusters: single-linkage clusters at a geodesic tolerance (`clusters`, `cluster_count`,
  `cluster_counts`).
* renyi: Rényi centers and strong Rényi centers, the fraction of tokens they consume.
* atlas: the atlas of final configurations predicted from V's spectrum, and the classifier
  of observed final configurations.
* parking: expected numbers of (strong) Rényi centers, Rényi's parking constant.
* theory: h, g, tau_beta and the conditions of Lemma 5.1, Theorem 5.2 and Remark B.2.

Definitions follow SCIENCE.md §§2-4 and are restated in each docstring.
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
    spanning_tree,
)
from attnflow.analysis.renyi import consumed_fraction, renyi_centers, strong_renyi_centers

__all__ = [
    "ROWS",
    "AtlasPrediction",
    "Clusters",
    "ObservedConfiguration",
    "classify_configuration",
    "cluster_count",
    "cluster_counts",
    "clusters",
    "consumed_fraction",
    "distance_to_subspace",
    "predict_configuration",
    "renyi_centers",
    "spanning_tree",
    "strong_renyi_centers",
]
