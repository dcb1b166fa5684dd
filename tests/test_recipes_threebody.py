"""The threebody recipe (docs/science.md §11.3) at a tiny size, and its closed forms against
independent truth: the triangle's rates against the eigenvalues of a finite-difference
Jacobian of the model's own velocity, the sign change at -2/3, the classifier on hand-made
configurations."""

from __future__ import annotations

import numpy as np
import pytest

from attnflow.analysis.closedforms import three_token_state, triangle_rates, triangle_threshold
from attnflow.analysis.threebody import OTHER, SYNCHRONISED, TRIANGLE
from attnflow.experiments import SUITE_OF
from attnflow.family import Attention
from attnflow.reproduce import reproduce

TRI = np.array([0.0, 2 * np.pi / 3, 4 * np.pi / 3])


def _angular_velocity(model: Attention, theta: np.ndarray) -> np.ndarray:
    """theta_i' from the model's field: the tangent component at each token."""
    x = np.stack([np.cos(theta), np.sin(theta)], axis=-1)
    F = model.field(x)
    return -np.sin(theta) * F[..., 0] + np.cos(theta) * F[..., 1]


@pytest.mark.parametrize("attention", ["softmax", "unnormalised"])
@pytest.mark.parametrize("beta", [-4.0, -1.0, -0.5, 0.0, 0.7, 3.0])
def test_triangle_rates_are_the_eigenvalues_of_the_models_linearisation(beta, attention):
    model = Attention(beta=beta, mask="full", attention=attention)
    h = 1e-6
    J = np.stack([(_angular_velocity(model, TRI + h * e) - _angular_velocity(model, TRI - h * e))
                  / (2 * h) for e in np.eye(3)], axis=1)
    eig = np.sort(np.linalg.eigvals(J).real)
    lam = float(triangle_rates(beta, attention))
    # one eigenvalue 0 (rotation), the other two equal to the closed form
    rotation = int(np.argmin(np.abs(eig)))
    rest = np.delete(eig, rotation)
    assert abs(eig[rotation]) < 1e-8
    np.testing.assert_allclose(rest, lam, rtol=1e-7, atol=1e-8)
    # the rotation mode's partner modes: J maps zero-sum perturbations to lambda times them
    v = np.array([1.0, -2.0, 1.0])
    np.testing.assert_allclose(J @ v, lam * v, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("attention", ["softmax", "unnormalised"])
def test_triangle_rate_changes_sign_at_minus_two_thirds(attention):
    c = triangle_threshold(attention)
    assert c == pytest.approx(-2 / 3, abs=1e-15)
    assert triangle_rates(c - 1e-6, attention) < 0 < triangle_rates(c + 1e-6, attention)
    assert abs(triangle_rates(c, attention)) < 1e-15
    grid = np.linspace(-5, 5, 1001)
    lam = triangle_rates(grid, attention)
    assert np.all((lam > 0) == (grid > c))
    # at beta = 0 every weight is 1/3 for both weightings: the rate is 1/2
    assert triangle_rates(0.0, attention) == pytest.approx(0.5)
    assert np.all(np.isfinite(triangle_rates([-700.0, 700.0], attention)))


def test_three_token_state_classifies_and_refuses_bad_input():
    theta = np.array([[0.1, 0.1 + 1e-4, 0.1 - 1e-4], [*(TRI + 1.0)], [0.0, 0.0, np.pi],
                      [2 * np.pi - 1e-4, 1e-4, 0.0]])
    np.testing.assert_array_equal(three_token_state(theta, 1e-3),
                                  [SYNCHRONISED, TRIANGLE, OTHER, SYNCHRONISED])
    with pytest.raises(ValueError, match="theta"):
        three_token_state(np.zeros((2, 4)), 1e-3)
    with pytest.raises(ValueError, match="tol"):
        three_token_state(TRI, 0.0)
    with pytest.raises(ValueError, match="attention"):
        triangle_rates(1.0, "sinkhorn")


def test_recipe_quick_run_produces_claims(tmp_path):
    (res,) = reproduce(["threebody"], out=tmp_path,
                       overrides={"threebody": {"runs": 30, "betas": [-0.1, -0.5, -2.0],
                                                "t_end": 60.0, "rate_t": 3.0,
                                                "paths_t": 10.0}})
    assert res["suite"] == "closedforms" == SUITE_OF["threebody"]
    ids = [c["id"] for c in res["claims"]]
    assert ids == ["threebody.rates", "threebody.threshold", "threebody.sync_above",
                   "threebody.between", "threebody.nosync_below"]
    assert all(c["verdict"] in ("reproduced", "partly", "not reproduced") and c["measured"]
               for c in res["claims"])
    for fig in res["figures"]:
        assert (tmp_path / "threebody" / fig).stat().st_size > 10_000
    nums = res["numbers"]
    # measured rates against the closed form computed here (not by the recipe's helper)
    b = np.array(nums["rate_betas"])
    soft = 0.75 * (2 + 3 * b) / (np.exp(1.5 * b) + 2)
    unnorm = 0.25 * (2 + 3 * b) * np.exp(-0.5 * b)
    np.testing.assert_allclose(nums["rates_measured"], [soft, unnorm], rtol=1e-3, atol=1e-5)
    sync = np.array(nums["synchronised"])
    assert sync.shape == (2, 3) and np.all(sync[:, :2] == 1.0)  # beta = -0.1, -0.5
    assert np.all(np.array(nums["triangle"])[:, 2] > 0)  # beta = -2: some end at the triangle
    assert res["claims"][0]["verdict"] == res["claims"][1]["verdict"] == "reproduced"


def test_recipe_refuses_a_grid_missing_a_band_of_its_claims(tmp_path):
    import attnflow.experiments.threebody as recipe

    with pytest.raises(ValueError, match="betas: expected values in each band"):
        recipe.run({**recipe.QUICK, "betas": [-0.1, -2.0]}, 0, tmp_path, lambda f: None)
