"""What the memory-profile recipes (causalprofile, lostmiddle) share: particles on the circle
from iid uniform starts, cut into label cells, and the regression of the last cell's Fourier
moments at time t on every cell's initial moments (docs/science.md §9, "Memory").

Token i (1-based) of n carries the label i/n and lies in the cell (e_{b-1}, e_b] of the label
edges 0 = e_0 < ... < e_S = 1 (S equal cells: e_b = b/S); the last cell stands for "the last
tokens". For mode k, A_b = (1/M_b)
sum_{j in b} e^{ik theta_j(0)} and B(t) = (1/M_S) sum_{i in S} e^{ik theta_i(t)}; the real
least-squares coefficients G_b of B on the A_b (both parts of every run: 2 runs equations, S
unknowns) estimate the covariances, so C_b = n G_b / M_b estimates n E[cos k(theta_i(t) -
theta_j(0))] averaged over the two cells, with the other cells' contributions regressed out
instead of left as noise. Standard errors: ordinary least squares (residual variance).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnflow.experiments._recipe import Progress
from attnflow.family import Attention
from attnflow.simulate import simulate
from attnflow.sphere import uniform


@dataclass(frozen=True)
class CellMoments:
    """The moments of `runs` particle runs of n tokens in S cells.

    A : (runs, modes, S) complex: the cells' initial mean e^{ik theta}.
    B : (runs, modes, T) complex: the last cell's mean e^{ik theta} at the T times.
    sizes : (S,) the number of tokens per cell.
    """

    A: np.ndarray
    B: np.ndarray
    sizes: np.ndarray

    @property
    def n(self) -> int:
        return int(self.sizes.sum())

    def take(self, runs: np.ndarray) -> CellMoments:
        """The moments of the runs with these indices."""
        return CellMoments(self.A[runs], self.B[runs], self.sizes)


def cell_moments(model: Attention, n: int, runs: int, edges: np.ndarray, modes: list[int],
                 times: list[float], dt: float, chunk: int, rng: np.random.Generator,
                 progress: Progress) -> CellMoments:
    """Simulate `runs` iid uniform starts of n tokens on the circle under `model` (RK4, step
    dt, `chunk` runs at a time) to the last of `times` (attnflow time) and keep the moments
    of the given `modes` in the cells of the label `edges` (S + 1,) (module docstring)."""
    cells = len(edges) - 1
    cell = np.searchsorted(edges, np.arange(1, n + 1) / n * (1 - 1e-12)) - 1
    sizes = np.bincount(cell, minlength=cells)
    k = np.asarray(modes)[:, None, None]
    A, B = [], []
    for first in range(0, runs, chunk):
        x0 = uniform((min(chunk, runs - first), n), 2, rng)
        traj = simulate(model, x0, times[-1], save_at=[0.0, *times], method="rk4", dt=dt)
        theta = np.arctan2(traj.states[..., 1], traj.states[..., 0])  # (1 + T, r, n)
        start = np.exp(1j * k * theta[0][None])  # (modes, r, n)
        A.append(np.stack([start[..., cell == b].mean(axis=-1) for b in range(cells)], -1))
        last = theta[1:][..., cell == cells - 1]  # (T, r, M_S)
        B.append(np.exp(1j * k[..., None] * last[None]).mean(axis=-1))  # (modes, T, r)
        progress(min(first + chunk, runs) / runs)
    return CellMoments(np.concatenate(A, axis=1).transpose(1, 0, 2),
                       np.concatenate(B, axis=2).transpose(2, 0, 1), sizes)


def regress(m: CellMoments) -> tuple[np.ndarray, np.ndarray]:
    """(C, se), both (modes, T, S - 1): the memory of the last cell at each time of each earlier
    cell, C_b = n G_b / M_b, and its ordinary least-squares standard error (module
    docstring)."""
    R, K, S = m.A.shape
    T = m.B.shape[-1]
    est, se = np.zeros((K, T, S - 1)), np.zeros((K, T, S - 1))
    for q in range(K):
        X = np.concatenate([m.A[:, q].real, m.A[:, q].imag])  # (2R, S)
        inverse = np.linalg.inv(X.T @ X)
        for i in range(T):
            y = np.concatenate([m.B[:, q, i].real, m.B[:, q, i].imag])
            G = inverse @ (X.T @ y)
            resid = float(np.sum((y - X @ G) ** 2))
            cov = resid / (X.shape[0] - S) * inverse
            est[q, i] = (m.n * G / m.sizes)[:-1]
            se[q, i] = (m.n * np.sqrt(np.diag(cov)) / m.sizes)[:-1]
    return est, se
