"""Pictures: images of the requested size, the right things drawn where they belong, clear
errors for bad input. Small trajectories in d = 2, 3 and 8."""

from __future__ import annotations

import matplotlib as mpl
import numpy as np
import pytest
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure
from PIL import Image
from typer.testing import CliRunner

import attnflow as af
from attnflow import plot
from attnflow.cli import app
from attnflow.plot._input import _delta, _tol
from attnflow.plot.movies import _time_format
from attnflow.plot.series import _series
from attnflow.plot.sphere import _camera
from attnflow.trajectory import Trajectory

FUNCTIONS = {
    "circle": lambda tr: plot.plot_circle(tr, figsize=(4, 3)),
    "sphere": lambda tr: plot.plot_sphere(tr, figsize=(4, 3)),
    "timeseries": lambda tr: plot.plot_timeseries(tr, figsize=(4, 3)),
    "attention": lambda tr: plot.plot_attention(tr, figsize=(4, 3)),
    "angles": lambda tr: plot.plot_angles(tr, figsize=(4, 3)),
}
# Pictures that need a minimum dimension: the circle d >= 2, the sphere d >= 3, angles d = 2.
APPLIES = {"circle": lambda d: d >= 2, "sphere": lambda d: d >= 3, "angles": lambda d: d == 2,
           "timeseries": lambda d: True, "attention": lambda d: True}


@pytest.fixture(scope="module")
def runs() -> dict[int, Trajectory]:
    """Short causal runs, n = 12, 11 saved times; d = 8 is a batch of 2 runs."""
    rng = np.random.default_rng(7)
    out = {}
    for d, batch in ((2, ()), (3, ()), (8, (2,))):
        V = np.eye(d) + 0.3 * rng.standard_normal((d, d)) / np.sqrt(d)
        x0 = af.sphere.uniform((*batch, 12), d, seed=d)
        out[d] = af.simulate(af.Attention(V=V, beta=4.0), x0, t_end=5.0,
                             save_at=np.linspace(0, 5, 11), method="euler", dt=0.1)
    return out


def synthetic(states: np.ndarray, beta: float = 64.0) -> Trajectory:
    """A Trajectory with the given states (T, n, d) at times 0, 1, ..., T-1."""
    return Trajectory(times=np.arange(len(states), dtype=float), states=states,
                      model=af.Attention(beta=beta), integrator={"method": "none"})


def on_circle(phi: np.ndarray) -> np.ndarray:
    return np.stack([np.cos(phi), np.sin(phi)], axis=-1)


# ----------------------------------------------------------------------------- images
@pytest.mark.parametrize("d", [2, 3, 8])
@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_every_picture_writes_an_image_of_the_requested_size(runs, tmp_path, name, d):
    if not APPLIES[name](d):
        with pytest.raises(ValueError, match="traj: expected .*d"):
            FUNCTIONS[name](runs[d])
        return
    fig = FUNCTIONS[name](runs[d])
    assert isinstance(fig, Figure)
    path = tmp_path / f"{name}{d}.png"
    fig.savefig(path, dpi=50)
    with Image.open(path) as im:
        assert im.size == (200, 150)
        pixels = np.asarray(im.convert("L"))
    assert pixels.std() > 10  # something was drawn, not a blank canvas


def test_pictures_compose_into_given_axes(runs):
    fig = Figure(figsize=(6, 4))
    a, b, c, e = fig.subplots(1, 4)
    assert plot.plot_circle(runs[2], ax=a, colorbar=False) is fig
    assert plot.plot_sphere(runs[3], ax=b, colorbar=False) is fig
    assert plot.plot_attention(runs[2], ax=c) is fig
    outer = Figure(figsize=(6, 3))
    snapshots = outer.subfigures(1, 2)[1].subplots(1, 2)
    assert plot.plot_circle(runs[2], t=[0, 5], ax=snapshots, colorbar=False) is outer
    with pytest.raises(ValueError, match="ax: expected 2 matplotlib Axes"):
        plot.plot_circle(runs[2], t=[0, 5], ax=e)


# ----------------------------------------------------------------------------- content
def scatter_offsets(ax) -> list[np.ndarray]:
    return [np.asarray(c.get_offsets()) for c in ax.collections if isinstance(c, PathCollection)]


def test_circle_draws_tokens_at_their_angles_and_centers_on_outer_rings():
    # Three clumps far apart (> delta = 4 / sqrt(64) = 0.5), four tokens each, in arrival
    # order clump by clump: Rényi centers = strong centers = the first token of each clump.
    phi = np.repeat([0.0, 2.0, 4.0], 4) + np.tile([0.0, 0.01, 0.02, 0.03], 3)
    X = on_circle(phi)
    fig = plot.plot_circle(synthetic(np.stack([X, X])), t=1)
    offsets = scatter_offsets(fig.axes[0])
    tokens = next(o for o in offsets if len(o) == 12)
    np.testing.assert_allclose(tokens, X[::-1])  # drawn latest first, earliest on top
    rings = {round(float(np.linalg.norm(o, axis=1).mean()), 2): o for o in offsets
             if len(o) == 3}
    assert set(rings) == {1.13, 1.24}  # Rényi centers, strong centers
    for r, o in rings.items():
        np.testing.assert_allclose(o, r * X[[0, 4, 8]], atol=1e-12)


def test_circle_centers_are_chosen_at_start_and_followed_by_index():
    # At t = 0 two clumps (centers: tokens 0 and 2); at t = 1 token 2 has moved to angle 1.
    X0 = on_circle(np.array([0.0, 0.01, 3.0, 3.01]))
    X1 = on_circle(np.array([0.0, 0.01, 1.0, 3.01]))
    fig = plot.plot_circle(synthetic(np.stack([X0, X1])), t=1)
    rings = [o for o in scatter_offsets(fig.axes[0]) if len(o) == 2]
    for o in rings:  # marked where tokens 0 and 2 are now
        np.testing.assert_allclose(o / np.linalg.norm(o, axis=1, keepdims=True), X1[[0, 2]],
                                   atol=1e-12)
    fig = plot.plot_circle(synthetic(np.stack([X0, X1])), t=1, centers_from=None)
    counts = sorted(len(o) for o in scatter_offsets(fig.axes[0]))
    assert counts == [3, 3, 4]  # recomputed at t = 1: three clumps (0-1, 2, 3)
    fig = plot.plot_circle(synthetic(np.stack([X0, X1, X1])), t=2, centers_from=1.2)
    counts = sorted(len(o) for o in scatter_offsets(fig.axes[0]))
    assert counts == [3, 3, 4]  # chosen at the saved time nearest 1.2
    late = Trajectory(times=np.array([10.0, 11.0]), states=np.stack([X0, X1]),
                      model=af.Attention(beta=64), integrator={})
    rings = [o for o in scatter_offsets(plot.plot_circle(late).axes[0]) if len(o) == 2]
    assert len(rings) == 2  # "start" is the first saved time, here t = 10


def test_memory_tokens_are_drawn_where_they_are():
    M = on_circle(np.array([0.5, 2.5]))
    model = af.Attention(beta=16, memory=(M, np.array([1.0, 3.0])))
    X = on_circle(np.linspace(0, 6, 7))
    tr = Trajectory(times=np.zeros(1), states=X[None], model=model, integrator={})
    fig = plot.plot_circle(tr, centers=False)
    drawn = [o for o in scatter_offsets(fig.axes[0]) if len(o) == 2]
    assert len(drawn) == 1
    np.testing.assert_allclose(drawn[0], M)


def test_cluster_disks_have_area_proportional_to_size():
    X = on_circle(np.repeat([0.0, 2.0], [9, 3]))
    fig = plot.plot_circle(synthetic(np.stack([X])), t=0, color="cluster", centers=False)
    disks = next(c for c in fig.axes[0].collections if isinstance(c, PathCollection))
    np.testing.assert_allclose(disks.get_offsets(), X[[0, 9]])
    np.testing.assert_allclose(disks.get_sizes(), 700 * np.array([9, 3]) / 12)


def test_sphere_marks_final_points_in_red_and_hides_nothing():
    rng = np.random.default_rng(0)
    states = af.sphere.uniform((3, 20), 3, seed=rng)
    fig = plot.plot_sphere(synthetic(states), view=(90, 0))  # looking down the z axis
    ax = fig.axes[0]
    red = mpl.colors.to_rgba(plot.RED)
    finals = [c for c in ax.collections if isinstance(c, PathCollection) and len(c.get_offsets())
              and np.allclose(c.get_facecolors()[:, :3], red[:3])]
    drawn = np.concatenate([c.get_offsets() for c in finals])
    assert len(drawn) == 20
    C = _camera((90, 0))
    expected = (states[-1] @ C.T)[:, :2]
    key = np.lexsort(drawn.T)
    np.testing.assert_allclose(drawn[key], expected[np.lexsort(expected.T)], atol=1e-12)
    # Those behind the sphere (z < 0 seen from above) are the faint ones.
    faint = [c for c in finals if c.get_alpha() < 1]
    assert sum(len(c.get_offsets()) for c in faint) == int((states[-1, :, 2] < 0).sum())


def test_camera_is_orthonormal_and_right_handed():
    for view in [(0, 0), (25, -60), (90, 30), (-40, 200)]:
        C = _camera(view)
        np.testing.assert_allclose(C @ C.T, np.eye(3), atol=1e-12)
        assert np.isclose(np.linalg.det(C), 1.0)
    np.testing.assert_allclose(_camera((90, 0))[2], [0, 0, 1], atol=1e-12)
    np.testing.assert_allclose(_camera((0, 0))[2], [1, 0, 0], atol=1e-12)


def test_principal_frame_finds_the_plane_of_a_great_circle(rng):
    # Tokens on the great circle through e3 and e6 of R^8: the top two principal directions
    # span that plane, so the projection keeps every norm (= 1) and carries 100% of |x|^2.
    phi = rng.uniform(0, 2 * np.pi, (4, 30))
    X = np.zeros((4, 30, 8))
    X[..., 2], X[..., 5] = np.cos(phi), np.sin(phi)
    fr = plot.frame(synthetic(X), X, 2)
    np.testing.assert_allclose(fr.basis @ fr.basis.T, np.eye(2), atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(fr(X), axis=-1), 1.0, atol=1e-12)
    assert "principal" in fr.note


def test_value_frame_uses_eigenvectors_of_V_and_complex_pairs(rng):
    d = 6
    P = np.linalg.qr(rng.standard_normal((d, d)))[0]
    block = np.diag([0.0, 0.0, 0.2, 0.1, -1.0, -2.0])
    block[:2, :2] = [[2.0, -1.5], [1.5, 2.0]]  # eigenvalues 2 +- 1.5i first
    V = P @ block @ P.T
    tr = Trajectory(times=np.zeros(1), states=af.sphere.uniform((1, 5), d, seed=1),
                    model=af.Attention(V=V), integrator={})
    fr = plot.frame(tr, tr.states, 3, "V")
    # The rotation plane of the complex pair, then the eigenvector of 0.2.
    proj = fr.basis[:2] @ P[:, :2]
    np.testing.assert_allclose(np.abs(np.linalg.det(proj)), 1.0, atol=1e-10)
    np.testing.assert_allclose(np.abs(fr.basis[2] @ P[:, 2]), 1.0, atol=1e-10)
    assert "2+1.5i" in fr.labels[0] and "Im" in fr.labels[1]
    chosen = plot.frame(tr, tr.states, 2, ("V", [5, 4]))  # the two most negative
    np.testing.assert_allclose(np.abs(chosen.basis @ P[:, [5, 4]]), np.eye(2), atol=1e-10)
    with pytest.raises(ValueError, match="basis: expected 'pca' or explicit directions"):
        plot.frame(synthetic(tr.states), tr.states, 2, "V")  # V = identity


def test_given_directions_are_orthonormalised_and_dependent_ones_refused(rng):
    X = af.sphere.uniform((2, 10), 5, seed=3)
    B = np.array([[1.0, 1, 0, 0, 0], [1.0, 0, 0, 0, 0]])
    fr = plot.frame(synthetic(X), X, 2, B)
    np.testing.assert_allclose(fr.basis, [[2**-0.5, 2**-0.5, 0, 0, 0],
                                          [2**-0.5, -(2**-0.5), 0, 0, 0]], atol=1e-12)
    with pytest.raises(ValueError, match="basis: expected linearly independent"):
        plot.frame(synthetic(X), X, 2, np.ones((2, 5)))
    with pytest.raises(ValueError, match=r"basis: expected a finite \(2, 5\) array"):
        plot.frame(synthetic(X), X, 2, np.ones((3, 5)))


def test_attention_image_is_the_attention_matrix_with_the_causal_triangle_masked(runs):
    tr = runs[3]
    fig = plot.plot_attention(tr, t=2.5, floor=1e-8)
    shown = fig.axes[0].images[0].get_array()
    A = tr.model.attention_matrix(tr.at(2.5))
    upper = np.triu(np.ones_like(A, dtype=bool), 1)
    assert np.array_equal(np.ma.getmaskarray(shown), upper)
    np.testing.assert_allclose(shown.data[~upper], np.maximum(A[~upper], 1e-8))
    np.testing.assert_allclose(A.sum(axis=1), 1.0)


def test_timeseries_counts_known_clumps_and_spread():
    # Time 1: three clumps, time 2: two, time 3: one at x_1(0). Times 0 (left out: log axis).
    phi = {0: [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], 1: [0.0, 0.0, 2.0, 2.0, 4.0, 4.0],
           2: [0.0, 0.0, 0.0, 2.5, 2.5, 2.5], 3: [0.0] * 6}
    tr = synthetic(np.stack([on_circle(np.array(phi[i])) for i in range(4)]))
    data = _series(tr, None, None, tol=0.1, delta=0.5)
    np.testing.assert_array_equal(data["t"], [1, 2, 3])
    for key in ("clusters", "renyi", "strong"):
        np.testing.assert_array_equal(data[key][:, 0], [3, 2, 1])
    np.testing.assert_allclose(data["spread"][:, 0], [2 * np.pi - 4.0, 2.5, 0.0], atol=1e-7)
    fig = plot.plot_timeseries(tr, tol=0.1, delta=0.5)
    top = fig.axes[0]
    np.testing.assert_array_equal(top.lines[0].get_ydata(), [3, 2, 1])
    assert top.get_xscale() == "log"


def test_timeseries_of_a_batch_shows_mean_and_percentile_band(runs):
    fig = plot.plot_timeseries(runs[8])
    beta = 4.0  # the runs' model
    data = _series(runs[8], None, None, _tol(beta, None), _delta(beta, None))
    np.testing.assert_allclose(fig.axes[0].lines[0].get_ydata(), data["clusters"].mean(axis=1))
    assert len(fig.axes[0].collections) == 3  # one band per count
    assert "2 runs" in fig.axes[0].get_legend().get_title().get_text()


def test_angles_are_measured_from_the_first_token_and_unwrapped():
    # Token 1 turns steadily through +2.5 pi; its angle keeps growing instead of jumping.
    T = 11
    turn = np.linspace(0, 2.5 * np.pi, T)
    states = np.stack([on_circle(np.array([0.3, 0.3 + s])) for s in turn])
    fig = plot.plot_angles(synthetic(states), log_time=False, colorbar=False)
    paths = fig.axes[0].collections[0].get_segments()
    np.testing.assert_allclose(paths[0][:, 1], turn)  # token 1 (drawn first, under token 0)
    np.testing.assert_allclose(paths[1][:, 1], 0.0, atol=1e-12)


# ----------------------------------------------------------------------------- movies
@pytest.mark.parametrize("d", [2, 3, 8])
def test_gif_has_the_requested_frames_and_size(runs, tmp_path, d):
    path = plot.animate(runs[d], tmp_path / "m.gif", frames=7, size=96)
    with Image.open(path) as im:
        assert im.n_frames == 7
        assert im.size == (96, 96)
        assert im.info["loop"] == 0


def test_movie_frames_are_evenly_spaced_saved_times_with_distinct_labels():
    times = np.array([0.0, 0.1, 0.2, 0.3, 1.0])
    assert f"{0.1:{_time_format(times)}}" != f"{0.2:{_time_format(times)}}"
    assert _time_format(np.arange(0.0, 1000.0, 1.0)) == ".0f"


def test_mp4_has_the_requested_frames(runs, tmp_path):
    imageio_ffmpeg = pytest.importorskip("imageio_ffmpeg")
    path = plot.animate(runs[3], tmp_path / "m.mp4", frames=6, size=97)  # odd side: padded
    frames, _ = imageio_ffmpeg.count_frames_and_secs(str(path))
    assert frames == 6


def test_movie_over_the_size_bound_is_refused_and_not_written(runs, tmp_path):
    with pytest.raises(ValueError, match="max_bytes: expected room for the movie"):
        plot.animate(runs[2], tmp_path / "m.gif", frames=5, size=96, max_bytes=1000)
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- errors
def with_nan(tr: Trajectory) -> Trajectory:
    states = tr.states.copy()
    states[4, ..., 0, 0] = np.nan
    return Trajectory(times=tr.times, states=states, model=tr.model, integrator={})


CALLS = {
    "circle": lambda tr, **kw: plot.plot_circle(tr, **kw),
    "sphere": lambda tr, **kw: plot.plot_sphere(tr, **kw),
    "angles": lambda tr, **kw: plot.plot_angles(tr, **kw),
    "timeseries": lambda tr, **kw: plot.plot_timeseries(tr, **kw),
    "attention": lambda tr, **kw: plot.plot_attention(tr, **kw),
    "animate": lambda tr, **kw: plot.animate(tr, "/nonexistent/never.gif", **kw),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_nan_in_the_trajectory_is_a_clear_error(runs, name):
    tr = with_nan(runs[3] if name == "sphere" else runs[2])
    with pytest.raises(ValueError, match=r"traj: expected finite token positions, received "
                                         r"1 non-finite entries, the first at t = 2"):
        CALLS[name](tr, **({"t": 2.0} if name in ("circle", "attention") else {}))


@pytest.mark.parametrize("name", ["angles", "timeseries", "animate"])
def test_empty_time_range_is_a_clear_error(runs, name):
    with pytest.raises(ValueError, match=r"t_range: expected an interval containing a saved "
                                         r"time \(saved: 11 times in \[0, 5\]\)"):
        CALLS[name](runs[2], t_range=(6, 9))


@pytest.mark.parametrize("name", ["circle", "sphere", "attention"])
def test_time_outside_the_run_is_a_clear_error(runs, name):
    with pytest.raises(ValueError, match=r"t: expected a time in the saved range \[0, 5\]"):
        CALLS[name](runs[3], t=7.5)


def test_other_bad_arguments_name_themselves(runs):
    with pytest.raises(ValueError, match=r"t: expected a time or a non-empty sequence"):
        plot.plot_circle(runs[2], t=[])
    with pytest.raises(ValueError, match=r"run: expected a run index in \[0, 2\)"):
        plot.plot_circle(runs[8], run=2)
    with pytest.raises(ValueError, match="color: expected 'index' or 'cluster'"):
        plot.plot_circle(runs[2], color="red")
    with pytest.raises(ValueError, match=r"frames: expected a number of frames in \[1, 11\]"):
        plot.animate(runs[2], "x.gif", frames=12)
    with pytest.raises(ValueError, match="path: expected a file name ending in .gif or .mp4"):
        plot.animate(runs[2], "x.avi")
    with pytest.raises(ValueError, match="view: expected"):
        plot.plot_sphere(runs[3], view="top")
    with pytest.raises(ValueError, match="t_start: expected a time <= t = 1"):
        plot.plot_sphere(runs[3], t=1.0, t_start=3.0)
    with pytest.raises(TypeError, match="traj: expected an attnflow.Trajectory"):
        plot.plot_circle(np.zeros((3, 2)))
    with pytest.raises(ValueError, match=r"delta: expected a radius \(the default"):
        plot.plot_circle(synthetic(on_circle(np.zeros((1, 3))), beta=0.0))


# ----------------------------------------------------------------------------- CLI
def test_cli_plot_and_animate(runs, tmp_path):
    run_file = runs[2].save(tmp_path / "run.nc")
    cli = CliRunner()
    for args in (["--t", "0", "--t", "5"], ["--kind", "timeseries"], ["--kind", "attention"]):
        out = tmp_path / f"{len(args)}{args[-1]}.png"
        result = cli.invoke(app, ["plot", str(run_file), *args, "--out", str(out), "--dpi", "40"])
        assert result.exit_code == 0, result.output
        assert out.stat().st_size > 0
    result = cli.invoke(app, ["animate", str(run_file), "--out", str(tmp_path / "m.gif"),
                              "--frames", "3", "--size", "80"])
    assert result.exit_code == 0, result.output
    with Image.open(tmp_path / "m.gif") as im:
        assert im.n_frames == 3
    result = cli.invoke(app, ["plot", str(run_file), "--t", "9", "--out", str(tmp_path / "x.png")])
    assert result.exit_code == 2
    assert "t: expected a time in the saved range" in result.output


# ----------------------------------------------------------------------------- full attention
def _full(states: np.ndarray) -> Trajectory:
    return Trajectory(times=np.arange(len(states), dtype=float), states=states,
                      model=af.Attention(beta=64.0, mask="full"), integrator={"method": "none"})


def _texts(fig) -> str:
    labels = [a.get_xlabel() for a in fig.axes]
    legends = [t.get_text() for a in fig.axes if a.get_legend() for t in a.get_legend().texts]
    return " ".join(labels + legends)


def test_full_attention_pictures_carry_no_causal_annotations():
    X = on_circle(np.array([0.0, 0.02, 2.0, 2.02, 4.0]))
    full, causal = _full(np.stack([X, X])), synthetic(np.stack([X, X]))
    fig = plot.plot_circle(full)
    assert "arrival order" not in _texts(fig) and "Rényi" not in _texts(fig)
    assert "token index k" in _texts(fig)
    assert "arrival order" in _texts(plot.plot_circle(causal))
    assert "Rényi" in _texts(plot.plot_circle(causal))
    assert "Rényi" in _texts(plot.plot_circle(full, centers=True))  # when asked, drawn
    series = plot.plot_timeseries(full, tol=0.1, delta=0.5)
    assert [ln.get_label() for ln in series.axes[0].lines] == ["clusters (tol = 0.1)"]
    assert len(plot.plot_timeseries(causal, tol=0.1, delta=0.5).axes[0].lines) == 3
    angles = plot.plot_angles(full, log_time=False)
    assert "arrival order" not in _texts(angles)


def test_centers_must_be_a_bool_or_none():
    with pytest.raises(ValueError, match=r"centers: expected True, False or None"):
        plot.plot_circle(_full(np.stack([on_circle(np.zeros(2))])), centers="yes")
