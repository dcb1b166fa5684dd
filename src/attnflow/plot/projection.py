"""Projections: the orthonormal directions in which tokens of dimension d are drawn."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from attnflow._checks import fail
from attnflow.plot._input import _layer
from attnflow.trajectory import Trajectory


@dataclass(frozen=True)
class Frame:
    """Orthonormal directions to draw tokens in: coordinates are X @ basis.T.

    basis : (k, d) orthonormal rows; names : short names of the k directions; labels : the
    k axis labels (name and what it is); note : how the directions were chosen ("" when the
    picture is the sphere itself, d = k).
    """

    basis: np.ndarray
    names: tuple[str, ...]
    labels: tuple[str, ...]
    note: str

    def __call__(self, X: np.ndarray) -> np.ndarray:
        return X @ self.basis.T


def frame(traj: Trajectory, X: np.ndarray, k: int, basis: Any = None, *,
          layer: int = 0) -> Frame:
    """The k directions in which to draw tokens of dimension d = traj.d.

    basis : None (identity when d == k, else "pca"); "pca": the top k principal directions
        of the points X (..., d), i.e. eigenvectors of the uncentred second moment
        mean x x^T, whose eigenvalues are the shares of |x|^2 = 1 they carry; "V": the
        eigenvectors of the value matrix V with the k eigenvalues of largest real part
        (docs/science.md §3; a complex pair gives its real and imaginary parts), or ("V", [i, j])
        with indices into the eigenvalues sorted by decreasing real part; a (k, d) array
        of directions, orthonormalised in order (Gram-Schmidt); or a `Frame` of k directions
        (e.g. one made by this function), used as it is.
    layer : whose V "V" means: the index of a layer of traj.model (default 0, the first;
        a tied-weight model has only that one).
    """
    d = traj.d
    if d < k:
        raise fail("traj", f"tokens of dimension d >= {k} for this picture", f"d = {d}")
    if basis is None:
        if d == k:
            names = tuple(f"x{i + 1}" for i in range(d))
            return Frame(np.eye(d), names, names, "")
        basis = "pca"
    if isinstance(basis, Frame):
        if basis.basis.shape != (k, d):
            raise fail("basis", f"a Frame of {k} directions in R^{d}",
                       f"a Frame of shape {basis.basis.shape}")
        return basis
    if isinstance(basis, str) and basis == "pca":
        flat = X.reshape(-1, d)
        eigval, eigvec = np.linalg.eigh(flat.T @ flat / len(flat))
        order = np.argsort(eigval)[::-1][:k]
        share = eigval[order] / eigval.sum()
        names = tuple(f"PC{i + 1}" for i in range(k))
        labels = tuple(f"{nm} ({100 * s:.0f}% of |x|²)" for nm, s in zip(names, share))
        return Frame(eigvec[:, order].T, names, labels,
                     f"projection onto the top {k} principal directions")
    if isinstance(basis, str) and basis == "V" or (
            isinstance(basis, (tuple, list)) and len(basis) == 2 and basis[0] == "V"):
        return _value_frame(traj, k, None if isinstance(basis, str) else basis[1], layer)
    try:
        B = np.asarray(basis, dtype=float)
    except (TypeError, ValueError) as err:
        raise fail("basis", f"None, 'pca', 'V', ('V', indices), a Frame or a ({k}, {d}) array",
                   repr(basis)) from err
    if B.shape != (k, d) or not np.all(np.isfinite(B)):
        raise fail("basis", f"a finite ({k}, {d}) array of directions", f"shape {B.shape}")
    names = tuple(f"b{i + 1}" for i in range(k))
    return Frame(_orthonormal("basis", B), names, tuple(f"{nm} (given direction)" for nm in names),
                 f"projection onto {k} given directions")


def _value_frame(traj: Trajectory, k: int, picks: Any, layer: int) -> Frame:
    """Directions from eigenvectors of V of one layer (see `frame`)."""
    i_layer, model = _layer(traj, layer)
    stacked = len(traj.model.layers) > 1
    of = f" of layer {i_layer}" if stacked else ""
    heads = model.heads
    if len(heads) != 1:
        raise fail("basis", "'pca' or explicit directions for a multi-head layer ('V' is "
                   "ambiguous)", f"'V' with {len(heads)} heads{of}")
    V = heads[0][2]
    if V is None:
        raise fail("basis", "'pca' or explicit directions (V is the identity: every direction "
                   "is an eigenvector)", f"'V'{of}")
    eigval, eigvec = np.linalg.eig(V)
    order = np.argsort(-eigval.real, kind="stable")
    eigval, eigvec = eigval[order], eigvec[:, order]
    if picks is None:  # each complex pair once, through its eigenvalue with Im > 0
        picks = np.flatnonzero(eigval.imag >= 0)
    try:
        picks = [int(i) for i in picks]
    except (TypeError, ValueError) as err:
        raise fail("basis", "('V', indices) with integer indices", repr(picks)) from err
    if any(not 0 <= i < len(eigval) for i in picks):
        raise fail("basis", f"eigenvalue indices in [0, {len(eigval)})", repr(picks))
    vectors, labels = [], []
    for i in picks:
        lam = eigval[i]
        name = f"λ{i + 1} = {lam.real:.3g}" + (f"{lam.imag:+.3g}i" if lam.imag else "")
        parts = [("", eigvec[:, i].real)] if lam.imag == 0 else [
            ("Re ", eigvec[:, i].real), ("Im ", eigvec[:, i].imag)]
        for prefix, v in parts:
            if len(vectors) < k:
                vectors.append(v)
                labels.append(f"{prefix}eigvec {name}")
    if len(vectors) < k:
        raise fail("basis", f"eigenvalue indices giving {k} real directions", repr(picks))
    return Frame(_orthonormal("basis", np.array(vectors)),
                 tuple(f"v{i + 1}" for i in range(k)), tuple(labels),
                 f"projection onto eigenvectors of V{of} (orthonormalised)")


def _orthonormal(name: str, B: np.ndarray) -> np.ndarray:
    """Gram-Schmidt on the rows of B (k, d), through QR; an error if they are dependent."""
    q, r = np.linalg.qr(B.T)
    diag = np.abs(np.diag(r))
    if diag.min() <= 1e-10 * max(diag.max(), 1e-300):
        raise fail(name, "linearly independent directions", "dependent directions")
    return (q * np.sign(np.diag(r))).T
