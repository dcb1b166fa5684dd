"""The names the docs promise exist: every analysis name as `af.<name>`, every `af.<name>`
written in the docs and examples, and analysis functions that take a run take a Trajectory."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import attnflow as af
import attnflow.analysis as analysis

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", analysis.__all__)
def test_every_analysis_name_is_a_top_level_name(name):
    # docs/guide/analysis.md: "every name is also available as af.<name>"
    assert getattr(af, name) is getattr(analysis, name)
    assert name in af.__all__ and name in dir(af)


def test_every_af_name_in_the_docs_exists():
    texts = [p.read_text() for p in [*ROOT.glob("docs/**/*.md"), *ROOT.glob("examples/**/*.py"),
                                     ROOT / "README.md"]]
    names = {m for text in texts for m in re.findall(r"\baf\.([A-Za-z_]\w*)", text)}
    assert names, "no af.<name> found: the pattern is wrong"
    assert sorted(n for n in names if not hasattr(af, n)) == []


@pytest.fixture(scope="module")
def traj():
    return af.simulate(af.Attention(beta=9.0), af.sphere.uniform(12, 3, seed=1), 4.0,
                       save_at=[0.0, 2.0, 4.0])


@pytest.fixture(scope="module")
def pre_ln():
    return af.simulate(af.Attention(beta=4.0, norm="pre"), 2 * af.sphere.uniform(8, 3, seed=2),
                       2.0, save_at=[0.0, 2.0])


def test_cluster_count_takes_a_trajectory(traj):
    tol = af.default_cluster_tol(9.0)
    np.testing.assert_array_equal(af.cluster_count(traj, tol), af.cluster_count(traj.states, tol))
    assert af.cluster_count(traj, tol).shape == (3,)


def test_a_trajectory_counts_as_its_directions(pre_ln):
    # pre-LN states are off the sphere: the analysis measures their directions
    np.testing.assert_array_equal(af.cluster_count(pre_ln, 0.1),
                                  af.cluster_count(pre_ln.directions, 0.1))
    np.testing.assert_allclose(af.energy(pre_ln, 4.0), af.energy(pre_ln.directions, 4.0))
    np.testing.assert_allclose(af.norm_spread(pre_ln), af.norm_spread(pre_ln.states))


def test_one_configuration_functions_say_what_to_pass(traj):
    with pytest.raises(ValueError, match=r"X: expected an array with 2 dimensions \(one "
                       r"configuration \(n, d\): pass traj.final or traj.at\(t\)"):
        af.clusters(traj, 0.1)
    assert af.clusters(traj.final, 0.1).count >= 1
