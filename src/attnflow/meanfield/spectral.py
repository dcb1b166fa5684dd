"""The transport term of the mean-field equation, pseudo-spectral in theta.

State: Fourier coefficients c (S, K + 1) complex of S label densities, rho_s(theta) =
sum_{|k| <= K} c[s, k] e^{i k theta} with c[s, -k] = conj(c[s, k]) (rho real) and
c[s, 0] = 1 / (2 pi) (mass 1). Without labels (full attention) S = 1.

What label s sees is the measure sigma_s: rho itself for the full mask; for the causal mask
the (ALiBi-decayed) prefix integral over labels, sigma_s = int_0^s e^{-lambda (s - s')}
rho_{s'} ds', scaled by the weighting (`attnflow.meanfield.labels`: label cells or
Chebyshev-Lobatto labels, a matrix from the labels' densities to what each sees). With
kernel E(u) = e^{b cos u} (coefficients I_k(b)) the moments

    Z(theta) = int E(theta - alpha - phi) sigma(phi) dphi,
    N(theta) = int E(theta - alpha - phi) e^{i phi} sigma(phi) dphi     (N_x + i N_y)

are convolutions, diagonal in Fourier (Z_k = 2 pi e_k G_k, N_k = 2 pi e_k G_{k-1},
e_k = I_|k|(b) e^{-i k alpha}, G the coefficients of sigma); a reflection Q^T K reflects
sigma first and conjugates N. The velocity of a token at theta is the tangential component
of V N, divided by Z for softmax weights:

    v(theta) = <(-sin theta, cos theta), V (N_x, N_y)> [/ Z(theta)],

and d c_k / dt = -i k (rho v)_k. The product rho v is formed on M >= 3 K + 3 points, so the
modes |k| <= K of rho v are alias-free whenever v has bandwidth K + 2 (unnormalised weights:
exact; softmax: the usual dealiased truncation of a quotient). Mode 0 has derivative exactly
0: mass is conserved to round-off by construction.
"""

from __future__ import annotations

import numpy as np
import scipy.fft as sfft
from scipy.special import iv, ive

from attnflow.meanfield.labels import Labels, see
from attnflow.meanfield.model import MeanFieldModel

__all__ = ["TransportField", "grid_size", "to_grid"]


def grid_size(modes: int) -> int:
    """The number of collocation points M >= 3 K + 3 (a fast FFT length)."""
    return sfft.next_fast_len(3 * modes + 3, real=True)


def to_grid(c: np.ndarray, points: int) -> np.ndarray:
    """Values (..., points) of the real functions with coefficients c (..., K + 1) at theta_j
    = 2 pi j / points (points > 2 K)."""
    return np.fft.irfft(c * points, n=points, axis=-1)


class TransportField:
    """F(c) = d c / dt of the transport term -d_theta(rho v[rho]) for states c (S, K + 1).

    model : the `MeanFieldModel`.
    labels : the causal mask's `Labels`, or S, the number of label cells (1 for the full
        mask).
    modes : K, the highest Fourier mode.
    """

    def __init__(self, model: MeanFieldModel, labels: int | Labels, modes: int) -> None:
        self.model = model
        if not isinstance(labels, Labels):
            labels = Labels.of("cells", labels, model.slope)
        self.labels = labels
        self._seen = labels.seen(model.weighting) if model.causal else None
        self.modes = modes
        self.points = M = grid_size(modes)
        theta = 2 * np.pi * np.arange(M) / M
        self._sin, self._cos = np.sin(theta), np.cos(theta)
        # Kernel coefficients e_k, k = -K-1..K+1, times 2 pi; softmax: the factor e^{-b}
        # of ive cancels between N and Z, unnormalised weights need I_k(b) itself.
        k = np.arange(-modes - 1, modes + 2)
        bessel = ive if model.weighting == "softmax" else iv
        self._kernel = 2 * np.pi * bessel(np.abs(k), model.b) * np.exp(-1j * k * model.alpha)
        self._k = np.arange(modes + 1)

    def seen(self, c: np.ndarray) -> np.ndarray:
        """Coefficients (S, K + 1) of what each label sees (module docstring)."""
        return c if self._seen is None else see(self._seen, c)

    def velocity(self, c: np.ndarray) -> np.ndarray:
        """The velocity v (S, M) at the collocation points theta_j = 2 pi j / M.

        With V acting on N = N_x + i N_y as V N = p N + q conj(N) and the unit tangent
        i e^{i theta}, the tangential component is Im(u), u = e^{-i theta}(p N + q conj(N)),
        formed in Fourier (u_k = p N_{k+1} + q conj(N_{-k-1})): the part of N along x itself
        (e.g. N_1 e^{i theta} at the uniform state) cancels exactly, not to round-off."""
        K = self.modes
        G = self.seen(c)
        if self.model.reflect:  # sigma(-phi): coefficients conj(G_k)
            G = np.conj(G)
        e = self._kernel  # e[K + 1 + k] = 2 pi e_k, k = -K-1..K+1
        full = np.concatenate([np.conj(G[:, :0:-1]), G], axis=1)  # G_j, j = -K..K
        Np = np.zeros((G.shape[0], 2 * K + 5), dtype=complex)  # N_j at j + K + 2
        Np[:, 3:2 * K + 4] = e[2:] * full  # N_j = 2 pi e_j G_{j-1}, j = -K+1..K+1
        if self.model.reflect:  # N(theta) -> conj(N(theta)): N_j -> conj(N_{-j})
            Np = np.conj(Np[:, ::-1])
        V = self.model.V
        p = ((V[0, 0] + V[1, 1]) + 1j * (V[1, 0] - V[0, 1])) / 2
        q = ((V[0, 0] - V[1, 1]) + 1j * (V[1, 0] + V[0, 1])) / 2
        # u spans the modes -K-2..K (q conj(N_{K+1}) reaches -K-2), so v = Im u has
        # bandwidth K + 2: u_k and u_{-k} for k = 0..K+2 (u_{K+1} = u_{K+2} = 0 from p).
        u_plus = np.zeros((G.shape[0], K + 3), dtype=complex)
        u_plus[:, :K + 2] = p * Np[:, K + 3:] + q * np.conj(Np[:, K + 1::-1])  # k = 0..K+1
        u_minus = p * Np[:, K + 3:0:-1] + q * np.conj(Np[:, K + 1:2 * K + 4])  # u_{-k}
        v = to_grid((u_plus - np.conj(u_minus)) / 2j, self.points)
        if self.model.weighting == "softmax":
            v /= to_grid(e[K + 1:2 * K + 2] * G, self.points)
        return v

    def __call__(self, c: np.ndarray) -> np.ndarray:
        """d c / dt (S, K + 1) of the transport term."""
        flux = to_grid(c, self.points) * self.velocity(c)
        return -1j * self._k * (np.fft.rfft(flux, axis=-1)[:, :self.modes + 1] / self.points)

    def speed_bound(self) -> float:
        """An upper bound of |v| over states of mass 1 per label: |V|_2 for softmax (|N| <=
        Z), |V|_2 e^|b| for unnormalised and positional weights (Z <= e^|b|, b of either sign:
        what a label sees has mass at most 1)."""
        norm = float(np.linalg.norm(self.model.V, 2))
        if self.model.weighting == "softmax":
            return norm
        return norm * float(np.exp(abs(self.model.b)))
