"""analysis.kinetic against independent computations: the causal linear system integrated by
scipy (never the closed form), quadrature, Bessel functions summed term by term."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.integrate import dblquad, quad, solve_ivp
from scipy.special import iv

from attnflow.analysis.closedforms import (
    causal_memory,
    cell_memory,
    hardy_kernel,
    inverse_cdf,
)


def test_hardy_kernel_is_its_series():
    tau, y = 1.7, np.array([0.0, 1e-12, 0.3, 2.0, 9.0])
    series = [sum(tau ** (m + 1) * v**m / (math.factorial(m) * math.factorial(m + 1))
                  for m in range(80)) for v in y]
    assert np.allclose(hardy_kernel(tau, y), series, rtol=1e-13)


def test_causal_memory_solves_the_discretised_volterra_system():
    """d eps_j / dt = lambda (1/j) sum_{i <= j} eps_i on N labels (the particles' own Hardy
    sum), from a unit mass at label j0 (eps_j0 = N), integrated by solve_ivp: the last label's
    value is the closed form (1/u) psi_{lambda t}(log(u / s0)), up to O(1 / N) (2.6e-3 here)."""
    N, j0, beta, t = 2000, 200, 1.0, 4.0
    lam = 1 * iv(1, beta) / (beta * iv(0, beta))  # lambda_1, k^2 I_k / (beta I_0)
    j = np.arange(1, N + 1)

    def rhs(_t, eps):
        return lam * np.cumsum(eps) / j

    eps0 = np.zeros(N)
    eps0[j0 - 1] = N
    sol = solve_ivp(rhs, (0.0, t), eps0, rtol=1e-10, atol=1e-10, method="RK45")
    for u_index in (N, N // 2):
        expected = causal_memory(j0 / N, t, beta, 1, u=u_index / N)
        assert sol.y[u_index - 1, -1] == pytest.approx(float(expected), rel=5e-3)


def test_cell_memory_is_the_double_integral():
    tau = 1.8
    for s_cell, u_cell in [((0.0, 0.05), (0.95, 1.0)), ((0.4, 0.45), (0.9, 1.0))]:
        ref = dblquad(lambda s, u: float(hardy_kernel(tau, np.log(u / s))) / u,
                      *u_cell, *s_cell, epsabs=1e-12)[0]
        ref /= (s_cell[1] - s_cell[0]) * (u_cell[1] - u_cell[0])
        assert cell_memory(s_cell, u_cell, tau) == pytest.approx(ref, rel=1e-8)
    with pytest.raises(ValueError, match="s_hi <= u_lo"):
        cell_memory((0.5, 0.7), (0.6, 1.0), tau)


def test_inverse_cdf_inverts_the_quadrature_cdf():
    c = np.zeros(17, dtype=complex)
    c[0], c[1], c[3] = 1 / (2 * np.pi), 0.3 / (2 * np.pi), 0.1j / (2 * np.pi)

    def rho(x):
        return float(np.real(c[0] + 2 * sum(c[k] * np.exp(1j * k * x) for k in range(1, 17))))

    q = np.array([0.0, 0.1, 0.5, 0.77, 0.999])
    theta = inverse_cdf(c, q)
    got = [quad(rho, 0.0, th, epsabs=1e-14)[0] for th in theta]
    assert np.allclose(got, q, atol=1e-12)
    with pytest.raises(ValueError, match="levels in"):
        inverse_cdf(c, [1.0])
