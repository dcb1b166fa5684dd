"""Save times: the default resolves a long run's early dynamics; log-spaced times in Python
(save_at="log", af.log_times) and on the command line (--save-at log)."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

import attnflow as af
from attnflow.cli import app
from attnflow.savetimes import EARLY, default_times, times_from_text

X = af.sphere.uniform(6, 2, seed=0)


def test_short_runs_keep_101_evenly_spaced_times():
    np.testing.assert_array_equal(default_times(10.0), np.linspace(0, 10, 101))
    np.testing.assert_array_equal(default_times(0.0), [0.0])


@pytest.mark.parametrize("t_end", [11.0, 150.0, 1e4])
def test_long_runs_resolve_their_first_interval(t_end):
    t = default_times(t_end)
    assert t[0] == 0 and t[1] == EARLY / 10 and np.all(np.diff(t) > 0) and t[-1] == t_end
    assert set(np.linspace(0, t_end, 101)) <= set(t)  # the evenly spaced times stay
    early = t[(t > 0) & (t < t_end / 100)]
    ratios = early[1:] / early[:-1]
    np.testing.assert_allclose(ratios, 10 ** 0.1)  # 10 per decade up to the first interval


def test_simulate_defaults_and_log_times():
    # A fixed-step method saves the default times moved to its step grid (never a shorter
    # step); an adaptive one saves them as they are.
    traj = af.simulate(af.Attention(beta=4.0), X, 20.0, dt=0.1)
    np.testing.assert_allclose(traj.times, np.unique(np.round(default_times(20.0) / 0.1)) * 0.1)
    assert traj.integrator["n_steps"] == 200 and traj.integrator["dt_min"] == pytest.approx(0.1)
    adaptive = af.simulate(af.Attention(beta=4.0), X, 20.0, method="dopri5")
    np.testing.assert_array_equal(adaptive.times, default_times(20.0))
    log = af.simulate(af.Attention(beta=4.0), X, 20.0, dt=0.1, save_at="log:11")
    np.testing.assert_allclose(log.times, af.log_times(20.0, 11))
    np.testing.assert_allclose(af.log_times(20.0, 11)[1:], np.geomspace(0.01, 20.0, 10))
    assert len(af.simulate(af.Attention(), X, 1.0, save_at="log").times) == 101


def test_log_times_with_noise_move_to_the_step_grid():
    traj = af.simulate(af.Attention(), X, 1.0, method="euler", dt=0.05, noise=0.1, seed=0,
                       save_at="log:6")
    np.testing.assert_allclose(traj.times / 0.05, np.round(traj.times / 0.05), atol=1e-9)


@pytest.mark.parametrize("call,pattern", [
    (lambda: af.log_times(10.0, 1), r"num: expected an integer in \[2, 1e\+08\]"),
    (lambda: af.log_times(0.0), r"t_end: expected a finite number > 0"),
    (lambda: af.log_times(10.0, 5, first=10.0), r"first: expected a time in \(0, t_end = 10\)"),
    (lambda: times_from_text("logs", 5.0), r"save_at: expected default, log, log:NUM"),
    (lambda: af.simulate(af.Attention(), X, 1.0, save_at="log:x"), r"save_at: expected"),
])
def test_bad_save_times_are_named(call, pattern):
    with pytest.raises(ValueError, match=pattern):
        call()


def test_the_command_line_saves_log_spaced_times(tmp_path):
    out = tmp_path / "run.nc"
    result = CliRunner().invoke(app, ["simulate", "--n", "5", "--t-end", "10", "--save-at",
                                      "log:6", "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    np.testing.assert_allclose(af.load(out).times, af.log_times(10.0, 6))
    bad = CliRunner().invoke(app, ["simulate", "--n", "5", "--save-at", "log:1",
                                   "--out", str(out)])
    assert bad.exit_code == 2 and "--save-at: expected" in bad.output
