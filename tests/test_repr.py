"""Short representations: results print in a line or two and show as a small HTML table in
notebooks, however many tokens they hold."""

from __future__ import annotations

import numpy as np
import pytest

import attnflow as af
from attnflow._repr import Plain, summarize
from attnflow.analysis import atlas, closedforms, clusters

N = 1000


@pytest.fixture(scope="module")
def traj():
    return af.simulate(af.Attention(beta=4.0), af.sphere.uniform(N, 2, seed=0), 0.2, dt=0.1)


def _results(traj):
    tol = clusters.default_cluster_tol(4.0)
    return {
        "Trajectory": traj,
        "Clusters": clusters.clusters(traj.final, tol),
        "AtlasPrediction": atlas.predict_configuration(np.eye(2)),
        "ObservedConfiguration": atlas.classify_configuration(traj.final, np.eye(2)),
        "Lemma51Bound": closedforms.lemma51_bound(4.0, 2.0, 0.1, 1.0),
        "Theorem52Check": closedforms.theorem52_conditions(9.0, 2.0, 0.1, 10),
        "RemarkB2Check": closedforms.remark_b2_conditions(9.0, 2.0, 0.1, 10),
    }


@pytest.mark.parametrize("name", ["Trajectory", "Clusters", "AtlasPrediction",
                                  "ObservedConfiguration", "Lemma51Bound", "Theorem52Check",
                                  "RemarkB2Check"])
def test_results_have_short_reprs(traj, name):
    obj = _results(traj)[name]
    text = repr(obj)
    assert text.startswith(name + "(") and "\n" not in text
    assert len(text) < 600, text  # a thousand labels would be thousands of characters
    page = obj._repr_html_()
    assert page.startswith("<div>") and f"<strong>{name}</strong>" in page
    assert len(page) < 3000


def test_a_trajectory_says_its_sizes_and_times(traj):
    text = repr(traj)
    assert f"n={N}, d=2" in text and "times=3 from 0 to 0.2" in text and "method='rk4'" in text
    assert "Attention(" in text and "kernel='harmonic (tol 1e-12, order " in text  # what ran


def test_arrays_are_shapes_unless_small():
    assert summarize(np.arange(1000)) == "array(1000,) int64"
    assert summarize(np.array([1.0, 2.5])) == "[1. , 2.5]"
    assert summarize(list(range(100))) == "list of 100"
    assert summarize(Plain("3 from 0 to 1")) == "3 from 0 to 1"
    assert summarize("x" * 500).endswith("...")
