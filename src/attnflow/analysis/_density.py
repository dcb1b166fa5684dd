"""Densities on the circle given by Fourier coefficients: the checks and the distribution
function's table shared by `kinetic.inverse_cdf`, `moments` and `modes`.

Coefficients c (K + 1,) mean rho(theta) = sum_{|k| <= K} c_k e^{i k theta}, c_{-k} =
conj(c_k), c_0 = 1 / (2 pi) for mass 1 (the mean-field solver's convention).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from attnflow._checks import fail


class CdfTable(NamedTuple):
    """F(theta_j) (M + 1,) and h rho(theta_j) (M + 1,) at theta_j = j h, h = 2 pi / M."""

    F: np.ndarray
    slope: np.ndarray
    h: float


def one_density(c: Any, name: str = "c") -> np.ndarray:
    """Coefficients (K + 1,) of one density of mass 1 (to 1e-12) from (K + 1,) or
    (1, K + 1) (the solver's shape for one density)."""
    arr = np.asarray(c)
    if arr.ndim == 2 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim != 1 or arr.size < 2 or not np.issubdtype(arr.dtype, np.number) or not np.all(
            np.isfinite(arr)):
        raise fail(name, "finite coefficients (K + 1,) or (1, K + 1) of one density (for label "
                   "cells (S, K + 1), one row c[j])", f"an array of shape {arr.shape}")
    arr = arr.astype(complex)
    if not np.isclose(2 * np.pi * arr[0].real, 1.0, rtol=0, atol=1e-12):
        raise fail(name, "a density of mass 1 (c_0 = 1 / (2 pi))",
                   f"mass 2 pi c_0 = {2 * np.pi * arr[0].real:.15g}")
    return arr


def cdf_table(c: np.ndarray) -> CdfTable:
    """The exact F and rho (by FFT) on M = max(2^16, 2^ceil(log2(256 (K + 1)))) equal steps
    of [0, 2 pi] (both ends), for coefficients c (K + 1,) of mass 1."""
    K = len(c) - 1
    M = max(1 << 16, 1 << int(np.ceil(np.log2(256 * (K + 1)))))
    h = 2 * np.pi / M
    rho = np.fft.irfft(c * M, n=M)
    periodic = np.fft.irfft(np.concatenate([[0.0], c[1:] / (1j * np.arange(1, K + 1))]) * M,
                            n=M)
    F = np.arange(M + 1) / M + np.append(periodic - periodic[0], 0.0)
    return CdfTable(F, np.append(rho, rho[0]) * h, h)


def hermite(table: CdfTable, j: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cubic Hermite interpolant of F on step j at s in [0, 1] (theta = (j + s) h) and its
    derivative in s: error at most h^4 max|rho'''| / 384."""
    F0, F1, m0, m1 = table.F[j], table.F[j + 1], table.slope[j], table.slope[j + 1]
    s2, s3 = s * s, s * s * s
    H = (2 * s3 - 3 * s2 + 1) * F0 + (s3 - 2 * s2 + s) * m0 + (3 * s2 - 2 * s3) * F1 \
        + (s3 - s2) * m1
    dH = (6 * s2 - 6 * s) * (F0 - F1) + (3 * s2 - 4 * s + 1) * m0 + (3 * s2 - 2 * s) * m1
    return H, dH


def cdf_at(table: CdfTable, theta: np.ndarray) -> np.ndarray:
    """F at angles theta in [0, 2 pi] (any shape), from the table."""
    u = np.clip(np.asarray(theta, dtype=float) / table.h, 0.0, len(table.F) - 1.0)
    j = np.minimum(np.floor(u).astype(np.intp), len(table.F) - 2)
    return hermite(table, j, u - j)[0]
