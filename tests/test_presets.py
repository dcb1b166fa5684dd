"""Matrix presets: each family has the spectrum and structure its spec names."""

from __future__ import annotations

import numpy as np

from attnflow.presets import matrix_from_spec


def test_eig_has_the_eigenvalues_in_a_random_non_orthogonal_basis():
    lam = [2.0, -1.0, 0.5, 0.25]
    V = matrix_from_spec("eig:2,-1,0.5,0.25:3", 4, "V")
    w, P = np.linalg.eig(V)
    np.testing.assert_allclose(np.sort(w.real), np.sort(lam), atol=1e-12)
    assert np.abs(w.imag).max() < 1e-12
    # not symmetric, eigenvectors not orthogonal (cosines of the unit eigenvectors)
    assert np.abs(V - V.T).max() > 0.1
    assert np.abs(P.T @ P - np.eye(4)).max() > 0.1
    # the seed in the spec fixes the basis; another seed gives another one
    np.testing.assert_array_equal(V, matrix_from_spec("eig:2,-1,0.5,0.25:3", 4, "V"))
    assert np.abs(V - matrix_from_spec("eig:2,-1,0.5,0.25:4", 4, "V")).max() > 0.1
    # without a seed in the spec, the `seed` argument decides
    np.testing.assert_array_equal(V, matrix_from_spec("eig:2,-1,0.5,0.25", 4, "V", seed=3))


def test_orth_is_symmetric_with_the_eigenvalues_and_diag_is_diagonal():
    V = matrix_from_spec("orth:1,0.5,0.2:7", 3, "V")
    np.testing.assert_allclose(V, V.T, atol=1e-14)
    np.testing.assert_allclose(np.linalg.eigvalsh(V), [0.2, 0.5, 1.0], atol=1e-12)
    np.testing.assert_array_equal(matrix_from_spec("diag:1,2", 2, "V"), np.diag([1.0, 2.0]))
    assert matrix_from_spec("identity", 5, "V") is None
