"""The names the docs promise exist: a small top level, every analysis name in its subject,
every `af.<name>` (dotted) written in the docs and examples, and analysis functions that
take a run take a Trajectory."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import attnflow as af
import attnflow.analysis as analysis
from attnflow.analysis import clusters, depth, energy

ROOT = Path(__file__).resolve().parents[1]


def test_the_top_level_is_the_core():
    # at most 60 public names, none of one letter; dir() lists exactly them
    assert len(af.__all__) <= 60
    assert [n for n in af.__all__ if len(n) == 1] == []
    assert dir(af) == sorted(af.__all__)
    assert all(hasattr(af, n) for n in af.__all__)


@pytest.mark.parametrize("subject", analysis.__all__)
def test_every_analysis_name_lives_in_its_subject(subject):
    module = getattr(analysis, subject)
    assert module.__all__, f"attnflow.analysis.{subject} lists no names"
    for name in module.__all__:
        assert hasattr(module, name), f"attnflow.analysis.{subject}.{name}"
        # analysis names are not flattened into the top level
        assert name not in af.__all__ or name in ("fit", "influence"), name


def _resolve(path: str) -> bool:
    obj = af
    for part in path.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


def test_every_af_name_in_the_docs_exists():
    texts = [p.read_text() for p in [*ROOT.glob("docs/**/*.md"), *ROOT.glob("examples/**/*.py"),
                                     ROOT / "README.md"]]
    paths = {m.rstrip(".") for text in texts
             for m in re.findall(r"\baf\.([A-Za-z_][\w.]*)", text)}
    assert paths, "no af.<name> found: the pattern is wrong"
    assert sorted(p for p in paths if not _resolve(p)) == []


@pytest.fixture(scope="module")
def traj():
    return af.simulate(af.Attention(beta=9.0), af.sphere.uniform(12, 3, seed=1), 4.0,
                       save_at=[0.0, 2.0, 4.0])


@pytest.fixture(scope="module")
def pre_ln():
    return af.simulate(af.Attention(beta=4.0, norm="pre"), 2 * af.sphere.uniform(8, 3, seed=2),
                       2.0, save_at=[0.0, 2.0])


def test_cluster_count_takes_a_trajectory(traj):
    tol = clusters.default_cluster_tol(9.0)
    np.testing.assert_array_equal(clusters.cluster_count(traj, tol),
                                  clusters.cluster_count(traj.states, tol))
    assert clusters.cluster_count(traj, tol).shape == (3,)


def test_a_trajectory_counts_as_its_directions(pre_ln):
    # pre-LN states are off the sphere: the analysis measures their directions
    np.testing.assert_array_equal(clusters.cluster_count(pre_ln, 0.1),
                                  clusters.cluster_count(pre_ln.directions, 0.1))
    np.testing.assert_allclose(energy.energy(pre_ln, 4.0), energy.energy(pre_ln.directions, 4.0))
    np.testing.assert_allclose(depth.norm_spread(pre_ln), depth.norm_spread(pre_ln.states))


def test_one_configuration_functions_say_what_to_pass(traj):
    with pytest.raises(ValueError, match=r"X: expected an array with 2 dimensions \(one "
                       r"configuration \(n, d\): pass traj.final or traj.at\(t\)"):
        clusters.clusters(traj, 0.1)
    assert clusters.clusters(traj.final, 0.1).count >= 1
