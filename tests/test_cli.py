"""`attnflow simulate` end to end in a subprocess; its output loads."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from scipy.cluster.hierarchy import fcluster, linkage

import attnflow as af


def attnflow(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attnflow", *args], capture_output=True,
                          text=True, timeout=120)


def test_simulate_end_to_end(tmp_path):
    out = tmp_path / "run.zarr"
    res = attnflow("simulate", "--n", "12", "--d", "3", "--beta", "4", "--batch", "3",
                   "--V", "orth:1,0.5,0.2:7", "--Q", "gaussian:1", "--t-end", "5",
                   "--save-at", "linspace:0:5:11", "--method", "dopri5", "--rtol", "1e-7",
                   "--seed", "5", "--no-progress", "--out", str(out))
    assert res.returncode == 0, res.stderr
    for field in ("final time", "clusters", "max dist to x_1(0)", "field evaluations",
                  "wall time"):
        assert field in res.stdout
    traj = af.load(out)
    assert traj.states.shape == (11, 3, 12, 3) and traj.seed == 5
    assert np.allclose(np.linalg.eigvals(traj.model.heads[0][2]).real.max(), 1.0)
    assert traj.integrator["rtol"] == 1e-7
    # The same seed draws the same initial tokens as the library does.
    assert np.array_equal(traj.states[0], af.sphere.uniform((3, 12), 3, 5))


def _printed(stdout: str, label: str) -> str:
    """The value printed after `label` at the start of a line of `attnflow simulate`."""
    (line,) = [ln for ln in stdout.splitlines() if ln.startswith(label)]
    return line[len(label):].strip()


def test_simulate_prints_the_measured_values_and_uses_the_eig_preset(tmp_path):
    out = tmp_path / "run.nc"
    res = attnflow("simulate", "--n", "12", "--d", "3", "--beta", "4", "--batch", "3",
                   "--V", "eig:1,0.5,0.2:7", "--t-end", "5", "--method", "rk4", "--dt", "0.05",
                   "--seed", "2", "--no-progress", "--out", str(out))
    assert res.returncode == 0, res.stderr
    traj = af.load(out)
    # eig: P diag(l) P^-1 with a random non-orthogonal P: those eigenvalues, not symmetric
    V = traj.model.heads[0][2]
    np.testing.assert_allclose(np.sort(np.linalg.eigvals(V).real), [0.2, 0.5, 1.0], atol=1e-12)
    assert np.abs(np.linalg.eigvals(V).imag).max() < 1e-12 and np.abs(V - V.T).max() > 0.1
    assert float(_printed(res.stdout, "final time")) == 5.0
    assert int(_printed(res.stdout, "field evaluations")) == 4 * 100  # RK4: 4 per step of 0.05
    # max over runs and tokens of the geodesic distance to the run's initial first token
    X, x0 = traj.states[-1], traj.states[0]
    drift = np.arccos(np.clip(np.einsum("rkd,rd->rk", X, x0[:, 0]), -1, 1)).max()
    assert float(_printed(res.stdout, "max dist to x_1(0)").split()[0]) == pytest.approx(
        drift, rel=1e-3)
    # clusters: scipy's single linkage at beta^-1/2 / 4 = 0.125 rad, per run
    counts = []
    for x in X:
        dist = np.arccos(np.clip(x @ x.T, -1, 1))[np.triu_indices(12, 1)]
        counts.append(len(set(fcluster(linkage(dist, "single"), 0.125, "distance"))))
    assert _printed(res.stdout, "clusters") == (
        f"median {np.median(counts):g} (min {min(counts)}, max {max(counts)}) over 3 runs  "
        "(single linkage, tol 0.125 rad)")


def test_simulate_with_an_implicit_method_records_its_jacobians(tmp_path):
    out = tmp_path / "run.nc"
    res = attnflow("simulate", "--n", "10", "--beta", "9", "--t-end", "200", "--method",
                   "bdf", "--rtol", "1e-8", "--no-progress", "--out", str(out))
    assert res.returncode == 0, res.stderr
    traj = af.load(out)
    assert traj.integrator["method"] == "bdf" and traj.integrator["n_jacobians"] >= 1
    np.testing.assert_allclose(np.linalg.norm(traj.states, axis=-1), 1.0, atol=1e-12)


def test_simulate_reports_bad_input_clearly(tmp_path):
    res = attnflow("simulate", "--n", "4", "--V", "diag:1,2,3", "--out",
                   str(tmp_path / "x.nc"))
    assert res.returncode == 2
    assert "V: expected 2 eigenvalues for d = 2" in res.stderr


def test_help_documents_every_option():
    text = attnflow("simulate", "--help").stdout
    for option in ("--n", "--d", "--beta", "--mask", "--Q", "--K", "--V", "--batch",
                   "--method", "--dt", "--rtol", "--atol", "--t-end", "--save-at", "--seed",
                   "--dtype", "--out"):
        assert option in text


# Commands that report progress while they run (bars on stderr).
SHOWS_PROGRESS = {"simulate", "sweep", "reproduce"}


def test_every_command_that_shows_progress_has_no_progress():
    import typer

    from attnflow.cli import app

    commands = typer.main.get_command(app).commands
    assert SHOWS_PROGRESS <= set(commands)
    for name in SHOWS_PROGRESS:
        flags = {opt for p in commands[name].params for opt in (*p.opts, *p.secondary_opts)}
        assert "--no-progress" in flags, name
