"""Densities carry their label scheme (`attnflow.meanfield.density`): `solve` reads it, a
contradicting scheme is one line, plain arrays keep the default "cells"."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import attnflow as af
from attnflow.meanfield import Density, density_at, from_coefficients, from_function, solve

MODEL = af.Attention(beta=2.0, mask="causal")


def start(s, theta):
    return np.exp((0.5 + s) * np.cos(theta))


@pytest.fixture(scope="module")
def chebyshev():
    return from_function(start, 32, labels=16, scheme="chebyshev")


def test_solve_reads_the_scheme_the_density_carries(chebyshev):
    assert isinstance(chebyshev, Density) and chebyshev.scheme == "chebyshev"
    carried = solve(MODEL, chebyshev, 1.0, save_at=[1.0])
    explicit = solve(MODEL, chebyshev, 1.0, save_at=[1.0], scheme="chebyshev")
    assert carried.settings["scheme"] == "chebyshev" and carried.resolution_lost_at is None
    np.testing.assert_array_equal(carried.coefficients, explicit.coefficients)
    # the same numbers as a plain array are read in the default cells: another state
    plain = solve(MODEL, np.asarray(chebyshev), 1.0, save_at=[1.0])
    assert plain.settings["scheme"] == "cells" and plain.resolution_lost_at is None
    assert np.max(np.abs(plain.coefficients[-1] - explicit.coefficients[-1])) > 1e-3
    cells = solve(MODEL, np.asarray(chebyshev), 1.0, save_at=[1.0], scheme="cells")
    np.testing.assert_array_equal(plain.coefficients, cells.coefficients)


def test_a_contradicting_scheme_is_one_line(chebyshev):
    with pytest.raises(ValueError, match=r"^scheme: expected None or 'chebyshev', the scheme "
                       r"rho0 was made with \(its labels sit at the chebyshev scheme's "
                       r"nodes\), received 'cells'$"):
        solve(MODEL, chebyshev, 1.0, scheme="cells")
    tokens = af.meanfield.from_tokens(af.sphere.uniform(64, 2, seed=0), 16, 1.0, labels=4)
    assert tokens.scheme == "cells"
    with pytest.raises(ValueError, match=r"^scheme: expected None or 'cells'"):
        solve(MODEL, tokens, 1.0, scheme="chebyshev")
    with pytest.raises(ValueError, match=r"^scheme: expected one of \('cells', 'chebyshev'\) "
                       r"or None"):
        solve(MODEL, np.asarray(chebyshev), 1.0, scheme="legendre")


def test_the_scheme_survives_what_keeps_the_labels(chebyshev):
    assert (2 * chebyshev).scheme == chebyshev.copy().scheme == "chebyshev"
    assert chebyshev[:, :8].scheme == "chebyshev"  # fewer modes, the same labels
    assert chebyshev[:5].scheme is None  # five of sixteen Chebyshev nodes are not a scheme
    assert type(np.asarray(chebyshev)) is np.ndarray
    again = pickle.loads(pickle.dumps(chebyshev))
    assert again.scheme == "chebyshev"
    np.testing.assert_array_equal(again, chebyshev)
    assert repr(chebyshev).endswith("scheme='chebyshev')")
    assert from_function(lambda t: np.exp(np.cos(t)), 16).scheme is None  # no labels
    assert from_coefficients(np.asarray(chebyshev), scheme="chebyshev").scheme == "chebyshev"
    assert from_coefficients(chebyshev).scheme == "chebyshev"
    with pytest.raises(ValueError, match=r"^scheme: expected None or 'chebyshev'"):
        from_coefficients(chebyshev, scheme="cells")
    s2 = from_function(lambda s, x: 2 + (0.5 + s) * x[..., 2], 4, labels=8,
                       scheme="chebyshev", d=3)
    assert s2.scheme == "chebyshev" and s2.ndim == 3


def test_a_run_continues_from_its_saved_state_in_its_labels(chebyshev):
    whole = solve(MODEL, chebyshev, 1.0, save_at=[0.5, 1.0])
    assert whole.resolution_lost_at is None
    half = density_at(whole, 0.5)
    assert half.scheme == "chebyshev"
    rest = solve(MODEL, half, 0.5, save_at=[0.5])
    np.testing.assert_allclose(rest.coefficients[-1], whole.coefficients[-1], rtol=0,
                               atol=1e-15)
