"""Integrators: invariants, causality, accuracy against scipy, orders, Theorem 4.1 in small."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from conftest import random_matrix
from scipy.integrate import solve_ivp

import attnflow as af
from attnflow.methods import METHODS as ALL_METHODS
from attnflow.sphere import geodesic_distance, normalize, uniform

METHODS = tuple(m for m in ALL_METHODS if m != "events")  # hardmax only: test_hardmax.py

FIXED = ["euler", "rk4", "geodesic"]


def small_problem(seed=0, n=16, d=3, beta=4.0, mask="causal", V="random"):
    rng = np.random.default_rng(seed)
    Q, K = random_matrix(rng, d), random_matrix(rng, d)
    V = random_matrix(rng, d) if V == "random" else V
    return af.Attention(Q, K, V, beta=beta, mask=mask), uniform(n, d, rng)


def kwargs_for(method):
    return {"dt": 0.05} if method in FIXED else {"rtol": 1e-8, "atol": 1e-10}


@pytest.mark.parametrize("method", METHODS)
def test_norms_stay_one(method):
    model, x0 = small_problem()
    traj = af.simulate(model, x0, 5.0, method=method, **kwargs_for(method))
    np.testing.assert_allclose(np.linalg.norm(traj.states, axis=-1), 1.0, atol=1e-12)


@pytest.mark.parametrize("method", METHODS)
def test_first_token_is_fixed_when_V_is_identity(method):
    model, x0 = small_problem(V=None)
    traj = af.simulate(model, x0, 5.0, method=method, **kwargs_for(method))
    assert np.max(np.abs(traj.states[:, 0] - x0[0])) <= 1e-15


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("mask", ["causal", ("window", 4)], ids=str)
def test_causality_perturbing_token_k_leaves_earlier_tokens(method, mask):
    model, x0 = small_problem(mask=mask)
    k = 7
    x1 = x0.copy()
    x1[k:] = normalize(x1[k:] + 0.1)
    a = af.simulate(model, x0, 4.0, method=method, **kwargs_for(method)).states
    b = af.simulate(model, x1, 4.0, method=method, **kwargs_for(method)).states
    assert not np.allclose(a[-1, k:], b[-1, k:])
    if method in FIXED:
        assert np.array_equal(a[:, :k], b[:, :k])  # bit-identical
    else:  # adaptive steps depend on all tokens: equal within the tolerance
        np.testing.assert_allclose(a[:, :k], b[:, :k], atol=1e-6)


def reference_solution(model, x0, t_end):
    """scipy's DOP853 at rtol 1e-11 on the flattened ODE: the independent truth."""
    shape = x0.shape
    sol = solve_ivp(lambda t, y: model.field(y.reshape(shape)).ravel(), (0, t_end), x0.ravel(),
                    method="DOP853", rtol=1e-11, atol=1e-13)
    return sol.y[:, -1].reshape(shape)


@pytest.fixture(scope="module")
def accuracy_case():
    model, x0 = small_problem(seed=1, n=16, d=3, beta=4.0)
    return model, x0, reference_solution(model, x0, 10.0)


@pytest.mark.parametrize("method,opts", [("rk4", {"dt": 0.02}), ("geodesic", {"dt": 0.02}),
                                         ("dopri5", {"rtol": 1e-9, "atol": 1e-11}),
                                         ("bdf", {"rtol": 1e-10, "atol": 1e-12}),
                                         ("radau", {"rtol": 1e-9, "atol": 1e-11}),
                                         ("lsoda", {"rtol": 1e-10, "atol": 1e-12})])
def test_agrees_with_scipy_dop853(accuracy_case, method, opts):
    model, x0, ref = accuracy_case
    got = af.simulate(model, x0, 10.0, save_at=[10.0], method=method, **opts).final
    assert np.max(np.abs(got - ref)) < 1e-7


@pytest.mark.parametrize("method,order,dt", [("euler", 1, 0.02), ("rk4", 4, 0.1),
                                             ("geodesic", 4, 0.1)])
def test_order_of_convergence(accuracy_case, method, order, dt):
    model, x0, ref = accuracy_case
    errors = [np.max(np.abs(af.simulate(model, x0, 10.0, save_at=[10.0], method=method,
                                        dt=h).final - ref)) for h in (dt, dt / 2)]
    ratio = errors[0] / errors[1]
    assert 2 ** order * 0.8 < ratio < 2 ** order * 1.25, (errors, ratio)


@pytest.mark.parametrize("method", ["dopri5", "bdf", "radau"])
def test_dense_output_matches_reference_at_save_times(accuracy_case, method):
    model, x0, _ = accuracy_case
    save = np.linspace(0, 3, 31)
    traj = af.simulate(model, x0, 3.0, save_at=save, method=method, rtol=1e-9, atol=1e-11)
    sol = solve_ivp(lambda t, y: model.field(y.reshape(x0.shape)).ravel(), (0, 3), x0.ravel(),
                    method="DOP853", rtol=1e-11, atol=1e-13, t_eval=save)
    ref = sol.y.T.reshape(len(save), *x0.shape)
    assert np.max(np.abs(traj.states - ref)) < 1e-7
    # Dense output: save times do not force extra steps.
    alone = af.simulate(model, x0, 3.0, save_at=[3.0], method=method, rtol=1e-9, atol=1e-11)
    assert traj.integrator["n_steps"] == alone.integrator["n_steps"]


def test_euler_with_dt_one_is_a_post_ln_transformer_layer(rng):
    d, n, beta = 4, 6, 1.5
    Q, K, V = (random_matrix(rng, d) for _ in range(3))
    X = uniform(n, d, rng)
    traj = af.simulate(af.Attention(Q, K, V, beta=beta), X, 3.0, save_at=[1, 2, 3],
                       method="euler", dt=1.0)
    x = X
    for layer in range(3):  # textbook layer: causal softmax attention, residual, normalise
        scores = beta * (x @ Q.T) @ (x @ K.T).T
        scores[np.triu_indices(n, 1)] = -np.inf
        A = np.exp(scores - scores.max(axis=1, keepdims=True))
        A /= A.sum(axis=1, keepdims=True)
        x = normalize(x + A @ (x @ V.T))
        np.testing.assert_allclose(traj.states[layer], x, atol=1e-14)


def test_theorem41_small():
    """V = I, Gaussian Q, K (variance 1/d), n = 32, d = 3, beta = 1, 20 seeds: every token
    ends within 1e-3 of x_1(0) by t = 300 (dopri5, rtol 1e-8)."""
    d, n = 3, 32
    rng = np.random.default_rng(2024)
    worst = []
    for _ in range(20):
        Q, K = random_matrix(rng, d), random_matrix(rng, d)
        x0 = uniform(n, d, rng)
        traj = af.simulate(af.Attention(Q, K, beta=1.0), x0, 300.0, save_at=[300.0],
                           method="dopri5", rtol=1e-8, atol=1e-10)
        worst.append(geodesic_distance(traj.final, x0[0]).max())
    assert max(worst) < 1e-3, worst


def test_heavy_memory_point_pulls_every_token(rng):
    d = 3
    center = normalize(np.array([1.0, 2.0, -0.5]))
    x0 = uniform((4, 10), d, rng)
    model = af.Attention(beta=1.0, mask="full", memory=(center[None], np.array([1e8])))
    traj = af.simulate(model, x0, 40.0, save_at=[40.0], method="dopri5")
    assert geodesic_distance(traj.final, center).max() < 1e-6


@pytest.mark.parametrize("backend", ["auto", "fused"])
def test_nonfinite_state_stops_with_time_and_run(backend):
    """A NaN stage reaches the kernel inside the step (the fused kernel once raised
    ZeroDivisionError there): the error names the time and the run."""
    class Exploding(af.Attention):
        def tangent_field(self, X, kernel=None):
            F = super().tangent_field(X, kernel)
            F[1] = np.nan  # run 1 blows up
            return F

    x0 = uniform((3, 5), 2, 0)
    with pytest.raises(af.NonFiniteStateError, match=r"t = 0\.1 in 1 run.*\(1,\)"):
        af.simulate(Exploding(beta=1.0, backend=backend), x0, 1.0, save_at=[1.0],
                    method="rk4", dt=0.1)


def test_implicit_methods_solve_each_run_on_its_own():
    model, _ = small_problem()
    x0 = uniform((3, 16), 3, 5)
    batch = af.simulate(model, x0, 4.0, save_at=[1.0, 4.0], method="bdf", rtol=1e-8)
    for r in range(3):
        alone = af.simulate(model, x0[r], 4.0, save_at=[1.0, 4.0], method="bdf", rtol=1e-8)
        assert np.array_equal(batch.states[:, r], alone.states)
    assert batch.integrator["n_jacobians"] >= 1


def test_implicit_method_reports_the_failing_run():
    class Exploding(af.Attention):
        def tangent_field(self, X, kernel=None):
            F = super().tangent_field(X, kernel)
            if np.allclose(X, Y0[1], atol=1e-12):  # the solver reads x / |x|
                F[:] = np.nan  # run 1 blows up at once
            return F

    Y0 = uniform((2, 5), 2, 0)
    with pytest.raises(af.NonFiniteStateError, match=r"non-finite at t = 0 .*\(1,\)") as err:
        af.simulate(Exploding(beta=1.0), Y0, 1.0, method="bdf")
    assert err.value.runs == [(1,)]


@pytest.mark.parametrize("method", FIXED)
def test_stepping_shares_of_the_runs_in_parallel_changes_nothing(method):
    """simulate steps shares of independent runs on the kernel threads; the states must be
    bit-identical to stepping the whole batch at once."""
    from attnflow.integrate import Drift, integrate

    model = af.Attention(beta=9.0)
    # Big enough for the threads; "auto" picks the fused kernel for the batch, the blocked
    # one for a share: simulate keeps the batch's choice for every share.
    x0 = uniform((4, 64, 64), 2, 3)
    times = np.array([0.0, 0.5])
    field, drift = (partial(f, kernel=model.kernel_for(x0))
                    for f in (model.tangent_field, model.attention_output))
    whole = integrate(Drift(field, euler=drift), x0, times, method, 0.1)
    shares = integrate(Drift(field, euler=drift, runs_independent=True), x0, times, method, 0.1)
    assert np.array_equal(whole.states, shares.states)
    assert np.array_equal(af.simulate(model, x0, 0.5, save_at=[0.5], method=method,
                                      dt=0.1).final, whole.states[-1])


@pytest.mark.parametrize("threads", ["1", "2"])
@pytest.mark.parametrize("method", FIXED)
def test_ensemble_in_many_pieces_equals_stepping_the_whole_batch(method, threads,
                                                                 monkeypatch):
    """Independent runs are stepped as pieces, each on its own from start to end, the
    threads taking chunks of steps from a queue: with pieces of one tile each (PIECE_BYTES
    made tiny), save intervals of different step counts and (2, 5) leading axes, the states
    are bit-identical to stepping the whole batch at once, on one thread and on two."""
    from attnflow import ensembles
    from attnflow.integrate import Drift, integrate
    from attnflow.kernels.fused import tile_runs

    monkeypatch.setenv("ATTNFLOW_THREADS", threads)
    monkeypatch.setattr(ensembles, "PIECE_BYTES", 1)
    model = af.Attention(beta=9.0, backend="fused")
    x0 = uniform((2, 5 * tile_runs(np.float64, 10), 12), 2, 4)
    times = np.array([0.0, 0.05, 0.35, 0.4, 1.0])
    field, drift = (partial(f, kernel=model.kernel_for(x0))
                    for f in (model.tangent_field, model.attention_output))
    grain = tile_runs(np.float64, x0.shape[0] * x0.shape[1])
    whole = integrate(Drift(field, euler=drift), x0, times, method, 0.05)
    pieces = integrate(Drift(field, euler=drift, runs_independent=True), x0, times, method,
                       0.05, grain=grain)
    assert pieces.states.shape == whole.states.shape == (5, *x0.shape)
    assert np.array_equal(pieces.states, whole.states)
    assert (pieces.n_steps, pieces.n_evals) == (whole.n_steps, whole.n_evals) == (
        20, 20 * (1 if method == "euler" else 4))


def _growth(threshold: float):
    """A field in R^d that grows each run (x' = x) and turns NaN where |x| passes
    threshold: runs of larger starting norm fail earlier."""

    def field(x: np.ndarray) -> np.ndarray:
        big = np.linalg.norm(x, axis=(-1, -2), keepdims=True) > threshold
        return np.where(big, np.nan, x)

    return field


@pytest.mark.parametrize("threads", ["1", "2"])
def test_ensemble_error_names_the_earliest_time_and_its_runs(threads, monkeypatch):
    """The pieces of a batch fail at different times: the error is the whole batch's, the
    earliest time and every run non-finite then (batch indices), however the pieces ran."""
    from attnflow import ensembles
    from attnflow.integrate import Drift, integrate

    monkeypatch.setenv("ATTNFLOW_THREADS", threads)
    monkeypatch.setattr(ensembles, "PIECE_BYTES", 1)
    scale = np.ones((4, 8, 1, 1))
    scale[3, 5] = scale[1, 2] = 3.0  # fail first, at the same step
    scale[0, 1] = 2.9  # a few steps later, found first (an earlier piece, the same chunk)
    x0 = scale * np.random.default_rng(0).uniform(0.9, 1.1, (4, 8, 16, 2))
    times = np.array([0.0, 2.0])
    errors = []
    for independent in (False, True):
        with pytest.raises(af.NonFiniteStateError) as err:
            integrate(Drift(_growth(30.0), runs_independent=independent), x0, times, "euler",
                      0.01, manifold="euclidean", grain=1)
        errors.append((err.value.t, err.value.runs))
    assert errors[0] == errors[1]
    assert errors[1][1] == [(1, 2), (3, 5)] and 0 < errors[1][0] < 2.0


def test_ensemble_progress_reports_times_every_run_has_reached(monkeypatch):
    """progress is called from the calling thread with increasing step times that end at
    the final time."""
    import threading

    from attnflow import ensembles
    from attnflow.integrate import Drift, integrate

    monkeypatch.setenv("ATTNFLOW_THREADS", "2")
    monkeypatch.setattr(ensembles, "PIECE_BYTES", 1)
    seen, callers = [], set()

    def progress(t):
        seen.append(t)
        callers.add(threading.get_ident())

    x0 = np.random.default_rng(1).uniform(-1, 1, (64, 32, 3))
    integrate(Drift(lambda x: -x, runs_independent=True), x0, np.array([0.0, 0.5, 1.0]),
              "euler", 0.01, manifold="euclidean", grain=1, progress=progress)
    assert seen and seen == sorted(set(seen))
    assert seen[-1] == pytest.approx(1.0) and callers == {threading.get_ident()}


def test_ensemble_error_in_one_piece_stops_the_others(monkeypatch):
    """A field that raises in one piece ends the call with that error, and the other
    thread stops too: the steps taken beside it stay a few, not the rest of the run (each
    call sleeps 1 ms, so both threads are stepping when the error comes)."""
    import time

    from attnflow import ensembles
    from attnflow.integrate import Drift, integrate

    monkeypatch.setenv("ATTNFLOW_THREADS", "2")
    monkeypatch.setattr(ensembles, "PIECE_BYTES", 1)
    calls = {"first": 0, "others": 0}

    def field(x):
        time.sleep(1e-3)
        first = x[0, 0, 0] > 5
        calls["first" if first else "others"] += 1
        if first and calls["first"] > 30:
            raise ValueError("boom")
        return -x

    x0 = np.random.default_rng(2).uniform(0, 1, (16, 64, 3))
    x0[0] += 10  # the first piece raises at its 31st step
    with pytest.raises(ValueError, match="boom"):
        integrate(Drift(field, runs_independent=True), x0, np.array([0.0, 10.0]), "euler",
                  0.01, manifold="euclidean", grain=1)
    assert 0 < calls["others"] < 100  # 15 pieces x 1000 steps without the stop


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("d", [2, 3, 9])
def test_rk4_step_on_the_sphere_matches_the_formula(d, dtype):
    """The fused RK4 finish (d fixed at compile time up to sphere.SMALL_D) against
    normalize(x + h/6 (k1 + 2 k2 + 2 k3 + k4)) written out with numpy, for a linear field."""
    from attnflow.integrate import rk4_step

    rng = np.random.default_rng(d)
    A = rng.standard_normal((d, d))
    x = normalize(rng.standard_normal((6, 5, d))).astype(dtype)
    h = 0.1

    def field(y):
        return (y @ A.T).astype(dtype)

    k1 = field(x)
    k2 = field(x + h / 2 * k1)
    k3 = field(x + h / 2 * k2)
    k4 = field(x + h * k3)
    want = normalize(x.astype(np.float64) + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4))
    got = rk4_step(field, x, h)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, want, rtol=0, atol=50 * np.finfo(dtype).eps)


def test_the_step_count_is_bounded_before_a_run():
    """At most MAX_STEPS steps: t_end / dt for the fixed-step methods (the error names dt
    when the step is what is too small), t_end <= MAX_STEPS * DEFAULT_DT for the others."""
    from attnflow.methods import DEFAULT_DT, MAX_STEPS, check_solver_args

    top = MAX_STEPS * DEFAULT_DT
    for method in ("rk4", "dopri5", "bdf"):
        assert check_solver_args(method, top, None, None, None, None)[0] == top
        with pytest.raises(ValueError, match=r"^t_end: expected at most 5e\+06 \(1e\+08 steps"):
            check_solver_args(method, top * 1.01, None, None, None, None)
    assert check_solver_args("euler", 10.0, None, 1e-7, None, None)[2] == 1e-7
    with pytest.raises(ValueError, match=r"^dt: expected a step >= t_end / 1e\+08 = 1e-07"):
        check_solver_args("euler", 10.0, None, 9e-8, None, None)
    with pytest.raises(ValueError, match=r"^t_end: expected at most 1e\+07 \(1e\+08 steps of "
                       r"dt = 0\.1\), received 1e\+08"):
        check_solver_args("rk4", 1e8, None, 0.1, None, None)
    # the adaptive methods' dt is a first step: their bound is the default step's
    assert check_solver_args("dopri5", top, None, 1e-9, None, None)[0] == top
