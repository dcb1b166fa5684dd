"""Where the members of issue 37 meet (found by reading the merged branches together): hardmax
with the flat scheme and large batches, options the blocked kernel lacks under auto, beta =
+-inf in the explorer, the mean-field solver and the Rényi radius, a strength that a scheme
would cancel, numbers on a sweep's text axes."""

from __future__ import annotations

import json

import numpy as np
import pytest

import attnflow as af
from attnflow.analysis import clusters
from attnflow.explorer.pack import pack
from attnflow.sphere import uniform


def _plain_hardmax_field(X: np.ndarray) -> np.ndarray:
    """Full-mask hardmax with Q = K = V = I and no normalisation: each token moves with the
    mean of the tokens of largest <x_i, x_j> (ties within 1e-12 share)."""
    S = X @ X.T
    top = S.max(axis=1, keepdims=True)
    W = (S >= top - 1e-12).astype(float)
    return (W / W.sum(axis=1, keepdims=True)) @ X


def test_hardmax_with_the_flat_scheme_at_sizes_where_auto_picks_fast_kernels():
    X = np.random.default_rng(0).normal(size=(120, 2))
    model = af.Attention(beta=np.inf, norm="flat", mask="full")
    np.testing.assert_allclose(model.field(X), _plain_hardmax_field(X), atol=1e-12)
    batch = np.random.default_rng(1).normal(size=(16, 40, 2))  # where auto picks fused
    traj = af.simulate(model, batch, 0.05, method="rk4", dt=0.05)
    assert np.all(np.isfinite(traj.states))


@pytest.mark.parametrize("attention", ["unnormalised", "positional"])
def test_options_the_blocked_kernel_lacks_fall_back_to_dense_under_auto(attention):
    rng = np.random.default_rng(2)
    X = uniform(400, 2, 3)
    Q = rng.normal(size=(2, 2))  # not a multiple of an orthogonal matrix: no harmonic kernel
    auto = af.Attention(Q=Q, beta=1.0, attention=attention).field(X)
    dense = af.Attention(Q=Q, beta=1.0, attention=attention, backend="dense").field(X)
    np.testing.assert_allclose(auto, dense, rtol=1e-10, atol=1e-12)


def test_a_hardmax_run_packs_into_strict_json_without_an_attention_matrix():
    traj = af.simulate(af.Attention(beta=np.inf), uniform(10, 2, 0), 0.5, method="events")
    data = pack(traj)
    json.dumps(data, allow_nan=False)  # a page reads it with JSON.parse: no Infinity
    assert data["beta"][0] is None and data["delta"] == pytest.approx(np.pi)
    with pytest.raises(ValueError, match="beta: expected a finite beta"):
        af.explore_live(n=8, beta=float("inf"))


def test_no_length_scale_at_infinite_beta():
    length_scale = clusters.length_scale
    assert length_scale(np.inf) == length_scale(-np.inf) == length_scale(0.0) == np.inf
    assert clusters.length_scale(-4.0) == clusters.length_scale(4.0) == 0.5
    traj = af.simulate(af.Attention(beta=np.inf), uniform(10, 2, 0), 0.5, method="events")
    with pytest.raises(ValueError, match="delta: expected a radius"):
        af.plot.plot_timeseries(traj)


def test_the_mean_field_solver_refuses_hardmax():
    rho0 = af.meanfield.from_function(lambda th: 1 + 0.3 * np.cos(th), modes=16)
    with pytest.raises(ValueError, match="beta: expected .*a finite beta"):
        af.meanfield.solve(af.Attention(beta=np.inf, mask="full"), rho0, 0.5)


@pytest.mark.parametrize("norm", ["peri", "ngpt"])
def test_a_strength_the_scheme_would_cancel_is_refused(norm):
    with pytest.raises(ValueError, match=f"strength: expected 1 with norm '{norm}'"):
        af.Attention(beta=1.0, norm=norm, strength=3.0)


def test_a_sweep_takes_numbers_on_the_strength_axis():
    store = af.sweep({"beta": 1.0, "n": 6, "d": 2, "t_end": 0.5, "seeds": 1,
                      "strength": [1, 3.0]}, scheduler="serial", progress=False)
    assert list(store["strength"].values) == ["1.0", "3.0"]
