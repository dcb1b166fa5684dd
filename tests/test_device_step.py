"""A tensor run's step never waits on the host: host reads do not grow with the save times or
the steps (counted by wrapping torch's host reads), finiteness is a device flag whose error
names the earliest save time and its runs, the field traces into one torch.compile graph;
and torch's thread count follows its rule (`attnflow.torchthreads`), restored after a run."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import attnflow as af
from attnflow import torchthreads
from attnflow.errors import NonFiniteStateError
from attnflow.integrate import Drift, integrate
from attnflow.sphere import uniform

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

HOST_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__")


def host_reads(monkeypatch, run) -> int:
    """How many times `run()` reads a tensor's value on the host."""
    count = [0]
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, original=original, **kwargs):
            count[0] += 1
            return original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    try:
        run()
    finally:
        monkeypatch.undo()
    return count[0]


@pytest.mark.parametrize("method", ["euler", "rk4", "geodesic"])
def test_host_reads_do_not_grow_with_save_times_or_steps(monkeypatch, method):
    model = af.Attention(beta=2.0, mask="causal", alibi=0.3)
    x0 = torch.from_numpy(uniform((3, 12), 4, seed=1))

    def reads(t_end, saves):
        return host_reads(monkeypatch, lambda: af.simulate(
            model, x0, t_end, dt=0.05, method=method, save_at=np.linspace(0, t_end, saves)))

    few = reads(1.0, 3)
    assert reads(1.0, 21) == few  # 20 steps, 21 save times against 3
    assert reads(2.0, 3) == few  # twice the steps


def counting_field(bad_from: dict[int, int]):
    """F = 0 (the state stays put) except that run r becomes NaN from the bad_from[r]-th call."""
    calls = [0]

    def field(x):
        calls[0] += 1
        out = torch.zeros_like(x)
        for run, k in bad_from.items():
            if calls[0] >= k:
                out[run] = torch.nan
        return out

    return field


def test_a_non_finite_state_names_the_earliest_save_time_and_its_runs():
    x0 = torch.from_numpy(uniform((3, 4), 3, seed=2))
    times = np.array([0.0, 0.2, 0.4, 0.6, 0.8])
    # euler, one call per step of 0.1: run 1 is NaN after the step to 0.3 (its third call),
    # run 0 after the step to 0.5: the first save time with a non-finite state is 0.4
    with pytest.raises(NonFiniteStateError) as err:
        integrate(Drift(counting_field({0: 5, 1: 3})), x0, times, method="euler", dt=0.1)
    assert err.value.t == pytest.approx(0.4) and err.value.runs == [(1,)]
    with pytest.raises(NonFiniteStateError) as err:
        integrate(Drift(counting_field({0: 3, 2: 3})), x0, times, method="euler", dt=0.1)
    assert err.value.t == pytest.approx(0.4) and err.value.runs == [(0,), (2,)]
    sol = integrate(Drift(counting_field({})), x0, times, method="euler", dt=0.1)
    torch.testing.assert_close(sol.states[-1], x0, rtol=0, atol=1e-15)  # F = 0: still


def test_the_field_traces_into_one_graph():
    Q = np.random.default_rng(1).standard_normal((4, 4)) / 2
    model = af.Attention(Q, None, None, beta=2.0,
                         mask="causal", alibi=0.5, mlp=af.MLP.random(4, 8, "gelu", seed=2))
    x = torch.from_numpy(uniform((2, 8), 4, seed=3))
    kernel = model.kernel_for(x)
    explained = torch._dynamo.explain(lambda X: model.tangent_field(X, kernel=kernel))(x)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


@pytest.mark.slow  # two compilations: minutes on a loaded CPU
@pytest.mark.parametrize("step", ["rk4_step", "geodesic_step"])
def test_the_fixed_step_loop_traces_into_one_graph(step):
    from functools import partial

    from attnflow import integrate as integrators
    from attnflow.checkpointing import run_steps
    from attnflow.manifolds import SPHERE

    model = af.Attention(beta=2.0, mask="causal", alibi=0.5,
                         mlp=af.MLP.random(4, 8, "gelu", seed=1))
    x = torch.from_numpy(uniform((2, 16), 4, seed=0))
    field = partial(model.tangent_field, kernel=model.kernel_for(x))
    one_step = partial(getattr(integrators, step), field, manifold=SPHERE)
    explained = torch._dynamo.explain(
        lambda X: run_steps(one_step, X, 0.0, 0.05, 3, None, None))(x)
    assert explained.graph_break_count == 0, explained.break_reasons


def test_the_thread_rule_by_size():
    rule = torchthreads.threads_for
    small = torchthreads.MIN_WORK_PER_THREAD - 1
    assert rule(small, requested=2, usable=2) == 1
    assert rule(2 * torchthreads.MIN_WORK_PER_THREAD, requested=2, usable=2) == 2
    assert rule(8 * torchthreads.MIN_WORK_PER_THREAD, requested=16, usable=2) == 2
    assert rule(8 * torchthreads.MIN_WORK_PER_THREAD, requested=1, usable=2) == 1
    assert rule(0, requested=4, usable=4) == 1
    x = torch.zeros((32, 200, 64))
    # 2 x 32 runs x 200^2 x 64 per head: 1.6e8 multiply-adds, one thread
    assert torchthreads.field_work(af.Attention(), x) == 2 * 32 * 200**2 * 64


def test_a_run_uses_the_rule_and_restores_the_callers_setting(monkeypatch):
    monkeypatch.setattr(torchthreads, "usable_cpus", lambda: 4)
    seen = []
    torch.set_num_threads(2)
    try:
        af.simulate(af.Attention(beta=2.0), torch.from_numpy(uniform((2, 8), 3, seed=4)), 0.2,
                    progress=lambda t: seen.append(torch.get_num_threads()))
        assert set(seen) == {1}  # a small problem steps on one thread
        assert torch.get_num_threads() == 2  # the caller's setting back
    finally:
        torch.set_num_threads(1)


def test_more_torch_threads_than_usable_cpus_warn_once(monkeypatch):
    monkeypatch.setattr(torchthreads, "usable_cpus", lambda: 1)
    monkeypatch.setattr(torchthreads, "_warned", False)
    x0 = torch.from_numpy(uniform((2, 8), 3, seed=5))
    torch.set_num_threads(2)
    try:
        with pytest.warns(RuntimeWarning, match=r"torch uses 2 threads but this process may "
                          r"run on 1 CPU\(s\)"):
            af.simulate(af.Attention(), x0, 0.1)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            af.simulate(af.Attention(), x0, 0.1)  # once per process
    finally:
        torch.set_num_threads(1)

