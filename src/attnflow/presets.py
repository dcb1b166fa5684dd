"""Named families of (d, d) matrices for Q, K and V, from short text specs.

A spec is one of (SEED is an optional integer; eigenvalues are comma-separated reals):

* ``identity``: I_d.
* ``gaussian[:SEED]``: i.i.d. N(0, 1/d) entries.
* ``diag:l1,...,ld``: diag(l1, ..., ld).
* ``orth:l1,...,ld[:SEED]``: O diag(l) O^T with O a Haar-random orthogonal matrix (symmetric).
* ``eig:l1,...,ld[:SEED]``: P diag(l) P^{-1} with P Gaussian (a random, non-orthogonal
  eigenbasis; not symmetric in general).
* a path ending in ``.npy``: the array in that file (loaded with allow_pickle=False).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from scipy.stats import ortho_group

from attnflow._checks import as_generator, describe, fail, integer, square_matrix
from attnflow._memory import check_allocation

__all__ = ["matrix_from_spec", "SPEC_HELP"]

SPEC_HELP = ("identity | gaussian[:SEED] | diag:l1,..,ld | orth:l1,..,ld[:SEED] | "
             "eig:l1,..,ld[:SEED] | FILE.npy")


def matrix_from_spec(spec: str, d: int, name: str = "matrix", seed: int | None = None
                     ) -> np.ndarray | None:
    """The (d, d) matrix a spec names (see module docstring); None for ``identity``.

    `name` is the argument named in errors (e.g. "V"); `seed` is used when the spec has none.
    """
    d = integer("d", d, 1)
    check_allocation("d", 8 * d * d, f"a ({d}, {d}) float64 matrix {name}")
    spec = spec.strip()
    if spec.endswith(".npy"):
        path = Path(spec)
        if not path.exists():
            raise fail(name, "an existing .npy file", spec)
        try:
            matrix = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as err:
            raise fail(name, "a readable .npy file of numbers", f"{spec} ({err})") from None
        return square_matrix(name, matrix, d)
    kind, _, rest = spec.partition(":")
    if kind == "identity" and not rest:
        return None
    if kind == "gaussian":
        rng = as_generator(_seed(name, rest) if rest else seed)
        return rng.standard_normal((d, d)) / np.sqrt(d)
    if kind in ("diag", "orth", "eig"):
        values, _, seed_text = rest.partition(":")
        lam = _eigenvalues(name, values, d)
        if kind == "diag":
            return np.diag(lam)
        rng = as_generator(_seed(name, seed_text) if seed_text else seed)
        if kind == "orth":
            O = ortho_group.rvs(d, random_state=rng) if d > 1 else np.ones((1, 1))
            return (O * lam) @ O.T
        P = rng.standard_normal((d, d))
        return (P * lam) @ np.linalg.inv(P)
    raise fail(name, SPEC_HELP, repr(spec))


def _eigenvalues(name: str, text: str, d: int) -> np.ndarray:
    try:
        lam = np.array([float(v) for v in text.split(",")])
    except ValueError:
        raise fail(name, "comma-separated real eigenvalues", repr(text)) from None
    if lam.shape != (d,):
        raise fail(name, f"{d} eigenvalues for d = {d}", describe(lam))
    if not np.all(np.isfinite(lam)):
        raise fail(name, "finite eigenvalues", repr(text))
    return lam


def _seed(name: str, text: str) -> int:
    """The SEED of a spec: a non-negative integer (numpy's seeds)."""
    expected = "a non-negative integer seed after ':'"
    try:
        value = int(text)
    except ValueError:
        raise fail(name, expected, repr(text)) from None
    return integer(name, value, 0, expected=expected)
