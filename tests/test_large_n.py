"""Honest defaults at large n (issue 42): a run of 10^5 tokens with the default save times
takes the steps it records, and the record names the kernel that ran."""

from __future__ import annotations

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
    mp.setattr(harmonic, "attend", lambda *a, **k: calls.append(1) or original(*a, **k))
    try:
        traj = af.simulate(af.Attention(beta=64.0, mask="causal"),
                           af.sphere.uniform(N, 2, seed=0), t_end=0.2)
    finally:
        mp.undo()
    return traj, len(calls)


def test_the_recorded_step_is_the_step_taken(counted):
    traj, calls = counted
    steps = round(0.2 / traj.integrator["dt"])  # 4 steps of the default dt = 0.05
    assert traj.integrator["dt"] == 0.05 and calls == 4 * steps  # RK4: 4 evaluations a step
    assert traj.integrator["n_steps"] == steps and traj.n_evals == calls
    assert traj.integrator["dt_min"] == pytest.approx(0.05, rel=1e-12)
    np.testing.assert_allclose(traj.times, 0.05 * np.arange(steps + 1), atol=1e-15)


def test_the_record_names_the_kernel_that_ran(counted):
    traj, _ = counted
    K = harmonic.order(64.0, 2, harmonic.DEFAULT_TOL)
    assert traj.integrator["kernel"].startswith(f"harmonic (tol 1e-12, order {K})")
    assert f"order {K}" in repr(traj)


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
