"""Honest defaults at large n (issue 42): a run of 10^5 tokens with the default save times
takes the steps it records, and the record names the kernel that ran."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import attnflow as af
from attnflow.kernels import harmonic

N = 100_000


@pytest.fixture(scope="module")
def counted(request):
    """A default run of N tokens (causal, beta = 64: auto picks the harmonic kernel), with
    the harmonic kernel's calls counted (one per field evaluation: one head)."""
    calls = []
    original = harmonic.attend
    mp = pytest.MonkeyPatch()
    mp.setattr(harmonic, "attend",  # the run's calls (not the estimate's, on fewer tokens)
               lambda *a, **k: calls.append(a[0].shape[-2] == N) or original(*a, **k))
    x0 = af.sphere.uniform(N, 2, seed=0)
    model = af.Attention(beta=64.0, mask="causal")
    # A process's first run loads the integrator's compiled code (about 20 MB of Python
    # objects, once, whatever n): not part of a run's memory, and loaded here first.
    af.simulate(model, x0[:50], 0.05)
    tracemalloc.start()
    try:
        traj = af.simulate(model, x0, t_end=0.2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        mp.undo()
    return traj, sum(calls), peak


def test_the_recorded_step_is_the_step_taken(counted):
    traj, calls, _ = counted
    steps = round(0.2 / traj.integrator["dt"])  # 4 steps of the default dt = 0.05
    assert traj.integrator["dt"] == 0.05 and calls == 4 * steps  # RK4: 4 evaluations a step
    assert traj.integrator["n_steps"] == steps and traj.n_evals == calls
    assert traj.integrator["dt_min"] == pytest.approx(0.05, rel=1e-12)
    np.testing.assert_allclose(traj.times, 0.05 * np.arange(steps + 1), atol=1e-15)


def test_the_record_names_the_kernel_that_ran(counted):
    traj, _, _ = counted
    K = harmonic.order(64.0, 2, harmonic.DEFAULT_TOL)
    assert traj.integrator["kernel"].startswith(f"harmonic (tol 1e-12, order {K})")
    assert f"order {K}" in repr(traj)


def test_the_memory_estimate_is_within_20_percent_of_the_peak(counted):
    # tracemalloc traces numpy's arrays; the estimate's probe resets its peak just before
    # the run starts, so the peak is the run's.
    traj, _, peak = counted
    estimate = traj.integrator["estimate"]
    assert abs(estimate["memory"] - peak) <= 0.2 * peak, (estimate, peak)
    assert estimate["file"] == traj.states.nbytes  # the states, uncompressed


def test_a_run_over_the_budget_is_refused_in_one_line_naming_the_cheaper_choices():
    with pytest.raises(ValueError) as err:
        af.simulate(af.Attention(beta=1.0), af.sphere.uniform(50, 2, seed=0), 1.0,
                    memory_budget=10_000)
    text = str(err.value)
    assert "\n" not in text and text.startswith("memory_budget: expected a run within 10 kB")
    assert "fewer save times" in text and "store='float32'" in text and "summaries" in text
    with pytest.raises(ValueError, match="memory_budget: expected a number of bytes > 0"):
        af.simulate(af.Attention(beta=1.0), af.sphere.uniform(5, 2, seed=0), 1.0,
                    memory_budget=-1)


def test_float32_and_summaries_keep_what_they_say(tmp_path):
    model = af.Attention(beta=9.0, mask="full")
    x0 = af.sphere.uniform((2, 40), 2, seed=1)
    full = af.simulate(model, x0, 1.0)
    small = af.simulate(model, x0, 1.0, store="float32")
    assert small.states.dtype == np.float32 and small.integrator["store"] == "float32"
    np.testing.assert_array_equal(small.states, full.states.astype(np.float32))
    summ = af.simulate(model, x0, 1.0, store="summaries", cluster_tol=0.05)
    np.testing.assert_array_equal(summ.times, [0.0, 1.0])
    np.testing.assert_array_equal(summ.states, full.states[[0, -1]])
    s = summ.summaries
    np.testing.assert_array_equal(s["time"], full.times)
    # independent truths: numpy's mean, the cluster count and energy of the kept states
    np.testing.assert_allclose(s["mean"], full.states.mean(axis=-2), atol=1e-15)
    np.testing.assert_array_equal(s["clusters"],
                                  af.analysis.clusters.cluster_count(full.states, 0.05))
    np.testing.assert_allclose(s["log_energy"], af.analysis.energy.log_energy(full.states, 9.0),
                               rtol=1e-10)
    assert summ.integrator["summaries"] == ["clusters", "log_energy", "mean"]
    back = af.load(summ.save(tmp_path / "summaries.nc"))
    for name, value in s.items():
        np.testing.assert_array_equal(back.summaries[name], value)
    assert summ.integrator["estimate"]["file"] < full.integrator["estimate"]["file"] / 5


def test_given_times_shorten_the_steps_and_the_record_says_so():
    traj = af.simulate(af.Attention(beta=1.0), af.sphere.uniform(5, 2, seed=0), 0.23,
                       save_at=[0.1])
    # [0, 0.1] in 2 steps of 0.05, [0.1, 0.23] in 3 of 0.13 / 3
    assert traj.integrator["n_steps"] == 5
    assert traj.integrator["dt_min"] == pytest.approx(0.13 / 3)


class _Clock:
    """A fake clock advanced by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_off_a_terminal_is_plain_lines_with_rate_and_time_left():
    import io

    from attnflow._progress import progress_bar

    stream, clock = io.StringIO(), _Clock()
    with progress_bar(True, 2.0, "simulating", "t = {task.completed:.4g} / 2",
                      stream=stream, interval=10.0, clock=clock) as report:
        for t in (0.1, 0.2):  # within the first 10 s: nothing yet
            clock.now += 4.0
            report(t)
        assert stream.getvalue() == ""
        clock.now += 2.0  # 10 s after the start, t = 0.5: 0.05 per s, 30 s left
        report(0.5)
        clock.now += 1.0
        report(0.55)  # 1 s after the last line: none
        clock.now += 29.0
        report(2.0)
    lines = stream.getvalue().splitlines()
    assert lines == ["simulating: t = 0.5 / 2 (25%), 0.05 per s, about 30 s left",
                     "simulating: t = 2 / 2 (100%), 0.05 per s, about 0 s left",
                     "simulating: t = 2 / 2 (100%), done in 40 s"]


def test_simulate_reports_progress_to_a_log(capsys, monkeypatch):
    import attnflow._progress

    monkeypatch.setattr(attnflow._progress, "INTERVAL", 0.0)  # a line at every step
    af.simulate(af.Attention(beta=1.0), af.sphere.uniform(5, 2, seed=0), 0.2, progress=True)
    lines = capsys.readouterr().err.splitlines()  # pytest's stderr is not a terminal
    assert [line.split(" (")[0] for line in lines] == [
        f"simulating: t = {t:.4g} / 0.2" for t in (0.05, 0.1, 0.15, 0.2, 0.2)]
    assert lines[-1].endswith("(100%), done in 0 s") and "left" in lines[0]


def test_the_command_line_takes_backend_store_and_budget(tmp_path):
    from typer.testing import CliRunner

    from attnflow.cli import app

    out = tmp_path / "run.nc"
    args = ["simulate", "--n", "300", "--t-end", "0.5", "--out", str(out), "--no-progress"]
    result = CliRunner().invoke(app, [*args, "--backend", "blocked", "--store", "float32"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("estimated         peak memory about")
    traj = af.load(out)
    assert traj.integrator["kernel"] == "blocked" and traj.states.dtype == np.float32
    refused = CliRunner().invoke(app, [*args, "--memory-budget", "1e-5"])
    assert refused.exit_code == 2 and "--memory-budget: expected a run within 10 kB" in \
        refused.output
    bad = CliRunner().invoke(app, [*args, "--backend", "fast"])
    assert bad.exit_code == 2 and "--backend: expected one of" in bad.output


def test_hardmax_with_q_equal_k_identity_warns_that_nothing_moves():
    x0 = af.sphere.uniform(6, 2, seed=0)
    with pytest.warns(UserWarning, match="left every token still up to t = 1 \\(each token "
                                         "is its own leader"):
        traj = af.simulate(af.Attention(beta=np.inf), x0, 1.0, method="events")
    np.testing.assert_allclose(traj.final, x0, rtol=0, atol=1e-15)  # the warning is true
    Q = np.array([[0.0, -1.0], [1.0, 0.0]])  # a rotation: the leaders are others
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        moved = af.simulate(af.Attention(Q=Q, beta=np.inf), x0, 1.0, method="events")
    assert not np.array_equal(moved.final, x0)
