"""Fitting B = beta Q^T K and V to a trajectory (`attnflow.fit`) and the `inverse` recipe:
noiseless recovery from a start away from the truth, the misfit's reverse-mode gradient
against central differences of the numpy engine, the Fisher information against the
Gauss-Newton identity, the recipe at a tiny size. The fit against the Cramér-Rao bound, its
convergence test, warnings and bad input: tests/test_fit.py."""

from __future__ import annotations

import numpy as np
import pytest

from attnflow.fit import fisher, fit, misfit, observe, split, states
from attnflow.sphere import uniform

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

B2 = np.array([[1.5, 0.6], [-0.4, 1.2]])  # a tiny truth on the circle (d = 2)
V2 = np.array([[1.0, -0.7], [0.3, 0.8]])
TIMES = np.array([0.5, 1.0, 1.5, 2.0])
DT = 0.05


def tokens(n: int = 8, d: int = 2, seed: int = 3) -> np.ndarray:
    return uniform((n,), d, seed=seed)


def test_noiseless_fit_recovers_the_truth_from_a_start_away_from_it():
    x0 = tokens()
    exact = np.asarray(states(B2, V2, x0, TIMES, DT))
    B0, V0 = B2 + 0.2 * np.array([[1, -1], [0.5, 1]]), V2 - 0.2 * np.array([[0.5, 1], [1, -1]])
    result = fit(x0, TIMES, exact, (B0, V0), DT, metric=fisher(B0, V0, x0, TIMES, dt=DT))
    assert result.converged
    assert np.abs(B0 - B2).max() >= 0.1
    assert np.abs(result.B - B2).max() < 1e-7
    assert np.abs(result.V - V2).max() < 1e-7


def test_misfit_gradient_matches_central_differences_of_the_numpy_engine():
    x0 = tokens(seed=5)
    observed = observe(states(B2, V2, x0, TIMES, DT), 0.05, seed=1)  # a non-zero residual
    B, V = B2 + 0.1, V2 - 0.1
    Bt, Vt = (torch.tensor(a, requires_grad=True) for a in (B, V))
    misfit(Bt, Vt, torch.from_numpy(x0), TIMES, torch.from_numpy(observed), DT).backward()
    rng = np.random.default_rng(0)
    eps = 1e-6
    for name, grad in (("B", Bt.grad.numpy()), ("V", Vt.grad.numpy())):
        direction = rng.standard_normal((2, 2))
        shift = {"B": (direction, 0), "V": (0, direction)}[name]
        plus = misfit(B + eps * shift[0], V + eps * shift[1], x0, TIMES, observed, DT)
        minus = misfit(B - eps * shift[0], V - eps * shift[1], x0, TIMES, observed, DT)
        assert isinstance(plus, float)  # the numpy engine, no autograd
        numeric = (plus - minus) / (2 * eps)
        analytic = float((grad * direction).sum())
        assert abs(analytic - numeric) <= 1e-6 * abs(numeric), (name, analytic, numeric)


def test_fisher_is_the_misfit_hessian_at_zero_residual():
    """At the truth with exact data, grad L(theta + delta) = F delta / (m n) + O(delta^2)."""
    x0 = tokens(seed=7)
    exact = np.asarray(states(B2, V2, x0, TIMES, DT))
    F = fisher(B2, V2, x0, TIMES, dt=DT)
    assert np.allclose(F, F.T) and np.linalg.eigvalsh(F).min() > 0
    delta = 1e-5 * np.random.default_rng(2).standard_normal(8)
    theta = torch.tensor(np.concatenate([B2.ravel(), V2.ravel()]) + delta, requires_grad=True)
    misfit(theta[:4].reshape(2, 2), theta[4:].reshape(2, 2), torch.from_numpy(x0), TIMES,
           torch.from_numpy(exact), DT).backward()
    expected = F @ delta / (len(TIMES) * len(x0))
    assert np.allclose(theta.grad.numpy(), expected, rtol=0, atol=1e-4 * np.abs(expected).max())


def test_split_separates_beta_under_the_frobenius_convention():
    beta, A = split(2.5 * np.eye(3))
    assert beta == pytest.approx(2.5) and np.allclose(A, np.eye(3))
    beta, A = split(B2)
    assert np.linalg.norm(A) == pytest.approx(np.sqrt(2)) and np.allclose(beta * A, B2)


def test_the_recipe_runs_at_a_tiny_size(tmp_path, monkeypatch):
    from attnflow.experiments import inverse

    monkeypatch.setattr(inverse, "DT", 0.1)  # 10 steps instead of 40: the test's time

    params = {**inverse.QUICK, "n0": 8, "m0": 5, "ns": [6, 8], "ms": [4, 5],
              "sigmas": [1e-4, 1e-3], "noiseless_n": 8, "noiseless_m": 5, "start_offset": 0.01}
    out = inverse.run(params, 0, tmp_path, lambda f: None)
    assert [c.id for c in out.claims] == ["inverse.noiseless", "inverse.sigma_slope",
                                          "inverse.n_slope", "inverse.m_slope",
                                          "inverse.efficiency"]
    assert all(c.verdict in ("reproduced", "partly", "not reproduced") for c in out.claims)
    assert (tmp_path / "inverse.png").is_file() and out.figures == ["inverse.png"]
    assert out.numbers["noiseless"]["errors"]["theta"] < 1e-6
    assert out.numbers["slopes"]["sigma"]["fisher_slope"] == pytest.approx(1.0)
