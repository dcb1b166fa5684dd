"""Pictures of any model: a Stack of different layers (pre-LN, one head at beta = 4 on [0, 1),
two heads at beta = 1 on [1, 2)) goes through every picture and a movie; the attention map is
the acting layer's, checked against softmax weights computed here by hand."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure
from PIL import Image
from typer.testing import CliRunner

import attnflow as af
from attnflow import plot
from attnflow.cli import app
from attnflow.trajectory import Trajectory

BETAS = (4.0, 1.0)  # layer 0, layer 1


def mixed_stack() -> af.Stack:
    return af.Stack([af.Attention(beta=BETAS[0], norm="pre"),
                     af.Attention(beta=BETAS[1], norm="pre",
                                  heads=[(None, None, None), (None, None, None)])])


@pytest.fixture(scope="module")
def runs() -> dict[int, Trajectory]:
    """The mixed stack from 10 tokens in d = 2 and d = 3, saved at t = 0, 0.25, ..., 2."""
    return {d: af.simulate(mixed_stack(), af.sphere.uniform(10, d, seed=d), t_end=2.0,
                           save_at=np.linspace(0, 2, 9), method="euler", dt=0.05)
            for d in (2, 3)}


def causal_softmax(X: np.ndarray, beta: float) -> np.ndarray:
    """w_kj = exp(beta <th_k, th_j>) / sum_{i <= k} exp(beta <th_k, th_i>) for j <= k, else 0,
    with th = x / |x| (attention of a pre-LN layer with Q = K = identity, causal mask)."""
    th = X / np.linalg.norm(X, axis=-1, keepdims=True)
    S = np.where(np.tril(np.ones((len(X), len(X)), dtype=bool)), beta * th @ th.T, -np.inf)
    W = np.exp(S - S.max(axis=1, keepdims=True))
    return W / W.sum(axis=1, keepdims=True)


def drawn_matrix(fig: Figure) -> np.ndarray:
    """The attention image's values, 0 where masked."""
    shown = fig.axes[0].images[0].get_array()
    return np.where(np.ma.getmaskarray(shown), 0.0, shown.data)


PICTURES = {
    "circle": lambda tr: plot.plot_circle(tr, figsize=(4, 3)),
    "snapshots": lambda tr: plot.plot_circle(tr, t=[0.5, 1.5, 2.0], color="cluster"),
    "sphere": lambda tr: plot.plot_sphere(tr, figsize=(4, 3)),
    "timeseries": lambda tr: plot.plot_timeseries(tr, figsize=(4, 3)),
    "attention": lambda tr: plot.plot_attention(tr, figsize=(4, 3)),
    "angles": lambda tr: plot.plot_angles(tr, figsize=(4, 3)),
}


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("name", list(PICTURES))
def test_every_picture_of_a_mixed_stack_draws(runs, name, d):
    if (name == "sphere" and d < 3) or (name == "angles" and d != 2):
        return  # the dimension checks are test_plot's
    fig = PICTURES[name](runs[d])
    assert isinstance(fig, Figure)
    fig.canvas.draw()


@pytest.mark.parametrize("d", [2, 3])
def test_gif_of_a_mixed_stack(runs, tmp_path, d):
    path = plot.animate(runs[d], tmp_path / "m.gif", frames=5, size=80)
    with Image.open(path) as im:
        assert im.n_frames == 5 and im.size == (80, 80)


@pytest.mark.parametrize("t, layer", [(0.5, 0), (1.0, 1), (1.5, 1), (2.0, 1)])
def test_attention_map_is_the_acting_layers(runs, t, layer):
    tr = runs[3]
    X = tr.at(t)
    mine, other = causal_softmax(X, BETAS[layer]), causal_softmax(X, BETAS[1 - layer])
    assert np.abs(mine - other).max() > 0.05  # the two layers' maps differ visibly
    fig = plot.plot_attention(tr, t=t, floor=1e-12)
    np.testing.assert_allclose(drawn_matrix(fig), mine, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(drawn_matrix(fig), tr.model.layers[layer].attention_matrix(X),
                               rtol=1e-12, atol=1e-15)
    assert f"layer {layer}" in fig.axes[0].get_title()


def test_attention_of_a_chosen_layer_and_its_heads(runs):
    tr = runs[3]
    X = tr.at(1.5)
    fig = plot.plot_attention(tr, t=1.5, layer=0, floor=1e-12)  # layer 0 at a time of layer 1
    np.testing.assert_allclose(drawn_matrix(fig), causal_softmax(X, BETAS[0]), rtol=1e-10,
                               atol=1e-14)
    fig = plot.plot_attention(tr, t=1.5, head=1, floor=1e-12)
    np.testing.assert_allclose(drawn_matrix(fig), causal_softmax(X, BETAS[1]), rtol=1e-10,
                               atol=1e-14)
    assert "layer 1, head 1" in fig.axes[0].get_title()
    with pytest.raises(ValueError, match=r"head: expected a head index in \[0, 1\), received 1"):
        plot.plot_attention(tr, t=0.5, head=1)  # layer 0 has one head
    with pytest.raises(ValueError, match=r"layer: expected a layer index in \[0, 2\), "
                                         r"received 2"):
        plot.plot_attention(tr, layer=2)


def scatter_offsets(ax) -> list[np.ndarray]:
    return [np.asarray(c.get_offsets()) for c in ax.collections if isinstance(c, PathCollection)]


def test_pre_ln_states_are_drawn_as_directions(runs):
    tr = runs[2]
    assert np.abs(tr.radii[-1] - 1).max() > 0.5  # the states left the sphere
    fig = plot.plot_circle(tr, centers=False)
    tokens = next(o for o in scatter_offsets(fig.axes[0]) if len(o) == tr.n)
    X = tr.states[-1]
    np.testing.assert_allclose(tokens, (X / np.linalg.norm(X, axis=1, keepdims=True))[::-1],
                               atol=1e-12)


def test_default_radii_come_from_the_layer_acting_at_the_first_time_shown(runs):
    tr = runs[2]
    for t_range, beta in ((None, BETAS[0]), ((1.0, 2.0), BETAS[1])):
        fig = plot.plot_timeseries(tr, t_range=t_range)
        labels = " ".join(x.get_text() for x in fig.axes[0].get_legend().get_texts())
        delta = min(np.pi, 4 / np.sqrt(beta))
        assert f"tol = {0.25 / np.sqrt(beta):.2g}" in labels and f"δ = {delta:.2g}" in labels
    for t, beta in ((0.5, BETAS[0]), (1.5, BETAS[1])):
        title = plot.plot_circle(tr, t=t).axes[0].get_legend().get_title().get_text()
        assert title.startswith(f"δ = {min(np.pi, 4 / np.sqrt(beta)):.3g},")


def test_each_snapshot_shows_the_memory_of_its_layer():
    M0, M1 = af.sphere.uniform(2, 2, seed=1), af.sphere.uniform(3, 2, seed=2)
    model = af.Stack([af.Attention(beta=16, memory=(M0, np.ones(2))),
                      af.Attention(beta=16, memory=(M1, np.ones(3)))])
    X = af.sphere.uniform(7, 2, seed=3)
    tr = Trajectory(times=np.array([0.0, 1.5]), states=np.stack([X, X]), model=model,
                    integrator={})
    fig = plot.plot_circle(tr, t=[0.0, 1.5], centers=False, colorbar=False)
    for a, M in zip(fig.axes, (M0, M1)):
        memory = [o for o in scatter_offsets(a) if len(o) != tr.n]
        assert len(memory) == 1
        np.testing.assert_allclose(memory[0], M)


def test_eigenvectors_of_V_come_from_the_chosen_layer(tmp_path):
    d = 4
    model = af.Stack([af.Attention(beta=4.0), af.Attention(beta=4.0, V=np.diag([3.0, 2, 1, 0.5]))])
    X = af.sphere.uniform(6, d, seed=5)
    tr = Trajectory(times=np.array([0.0, 1.5]), states=np.stack([X, X]), model=model,
                    integrator={})
    with pytest.raises(ValueError, match=r"basis: expected 'pca' or explicit directions .*, "
                                         r"received 'V' of layer 0"):
        plot.frame(tr, X, 3, "V")
    fr = plot.frame(tr, X, 3, "V", layer=1)
    np.testing.assert_allclose(np.abs(fr.basis), np.eye(d)[:3], atol=1e-12)
    assert "of layer 1" in fr.note
    fig = plot.plot_sphere(tr, basis=fr)  # a Frame is used as it is
    assert "of layer 1" in fig.axes[0].get_xlabel()
    plot.animate(tr, tmp_path / "v.gif", basis=fr, size=64)
    with pytest.raises(ValueError, match=r"basis: expected a Frame of 2 directions in R\^4"):
        plot.plot_circle(tr, basis=fr)
    with pytest.raises(ValueError, match=r"layer: expected a layer index in \[0, 2\)"):
        plot.frame(tr, X, 3, "V", layer=-1)


def test_small_beta_caps_the_default_radius_at_pi():
    # 4 beta^{-1/2} = 4 > pi at beta = 1: the ball is the whole circle, one Rényi center.
    X = np.stack([np.cos(np.arange(6.0)), np.sin(np.arange(6.0))], axis=-1)
    tr = Trajectory(times=np.zeros(1), states=X[None], model=af.Attention(beta=1.0),
                    integrator={})
    fig = plot.plot_circle(tr)
    assert fig.axes[0].get_legend().get_title().get_text().startswith("δ = 3.14,")
    rings = [o for o in scatter_offsets(fig.axes[0]) if len(o) == 1]
    assert len(rings) == 2  # token 1 is the Rényi and the strong Rényi center


def test_cli_draws_a_saved_stack_run(runs, tmp_path):
    run_file = runs[3].save(tmp_path / "stack.nc")
    out = tmp_path / "a.png"
    result = CliRunner().invoke(app, ["plot", str(run_file), "--kind", "attention", "--t", "1.5",
                                      "--out", str(out), "--dpi", "40"])
    assert result.exit_code == 0, result.output
    assert out.stat().st_size > 0
