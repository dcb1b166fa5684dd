"""The explorer's packing (attnflow.explorer.pack): round trips within the stated quantisation
error, the sizes, and the series beside the frames (cluster counts, order parameter, Rényi
centers, the attention the page computes)."""

from __future__ import annotations

import base64

import numpy as np
import pytest

import attnflow as af
from attnflow.explorer import pack, unpack
from attnflow.explorer.pack import ANGLE_ERROR, ATTENTION_MAX_N, COORD_ERROR


def _run(n, d, T=5, mask="causal", beta=9.0, seed=0, **options):
    """A Trajectory of random tokens (no integration: packing reads only the states)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(T, n, d))
    X[1:] += 3 * rng.normal(size=(1, 4, d))[:, rng.integers(0, 4, n)]  # some clustering
    X /= np.linalg.norm(X, axis=-1, keepdims=True)
    return af.Trajectory(times=np.linspace(0.0, 2.0, T), states=X,
                         model=af.Attention(beta=beta, mask=mask, **options),
                         integrator={"method": "none"})


def test_circle_round_trip_within_half_a_step_of_the_angle():
    traj = _run(300, 2)
    times, X = unpack(pack(traj))
    np.testing.assert_array_equal(times, traj.times)
    theta = np.arctan2(traj.states[..., 1], traj.states[..., 0])
    back = np.arctan2(X[..., 1], X[..., 0])
    err = np.abs((back - theta + np.pi) % (2 * np.pi) - np.pi)
    assert err.max() <= ANGLE_ERROR * (1 + 1e-9)
    assert err.max() > ANGLE_ERROR / 2  # the bound is tight, not loose by orders of magnitude


def test_sphere_round_trip_within_half_a_step_of_each_coordinate():
    traj = _run(200, 3)
    _, X = unpack(pack(traj))
    err = np.abs(X - traj.states).max()
    assert err <= COORD_ERROR * (1 + 1e-9) and err > COORD_ERROR / 2


def test_higher_dimensions_are_projected_onto_the_principal_directions():
    traj = _run(60, 5)
    packed = pack(traj)
    assert packed["view"] == "sphere" and packed["k"] == 3
    assert "principal" in packed["projection"] and packed["attention"] is None
    fr = af.plot.frame(traj, traj.states, 3)
    _, X = unpack(packed)
    assert np.abs(X - fr(traj.states)).max() <= COORD_ERROR * (1 + 1e-9)


def test_two_bytes_per_coordinate_and_frame():
    # 1000 tokens x 3 coordinates: 6000 bytes a frame, so 200 frames are 1.2 MB (20 here)
    packed = pack(_run(1000, 3, T=20))
    assert len(base64.b64decode(packed["frames"])) == 2 * 1000 * 3 * 20
    assert len(packed["frames"]) == 4 * 2 * 1000 * 3 * 20 // 3


def test_a_page_of_ten_thousand_tokens_stays_within_its_budget(tmp_path):
    # the budget: 8/3 characters per token and frame on the circle, plus 64 kB
    n, T = 10_000, 12
    path = af.explore_html(_run(n, 2, T=T), tmp_path / "big.html")
    assert path.stat().st_size <= 8 / 3 * n * T + 64_000


def test_series_match_the_analysis_functions():
    traj = _run(150, 3, T=4)
    packed = pack(traj)
    tol = af.analysis.clusters.default_cluster_tol(9.0)
    assert packed["tol"] == [tol] * 4 and packed["beta"] == [9.0] * 4
    np.testing.assert_array_equal(packed["clusters"],
                                  af.analysis.clusters.cluster_count(traj.states, tol))
    assert packed["clusters"][0] > packed["clusters"][-1]
    np.testing.assert_allclose(packed["order"], np.linalg.norm(traj.states.mean(axis=1), axis=-1))
    delta = 4 / 3
    assert packed["causal"] and packed["delta"] == pytest.approx(delta)
    assert packed["renyi"] == af.analysis.renyi.renyi_centers(traj.states[0], delta).tolist()
    strong = af.analysis.renyi.strong_renyi_centers(traj.states[0], delta)
    assert packed["strong"] == strong.tolist()


def test_full_attention_has_no_renyi_centers():
    packed = pack(_run(40, 2, mask="full"))
    assert not packed["causal"] and packed["renyi"] is None and packed["strong"] is None


@pytest.mark.parametrize("mask", ["causal", "full"])
def test_the_attention_the_page_computes_is_the_models(mask):
    rng = np.random.default_rng(3)
    traj = _run(30, 3, mask=mask, Q=np.eye(3) + 0.3 * rng.normal(size=(3, 3)))
    spec = pack(traj)["attention"]
    assert spec is not None and spec["causal"] == (mask == "causal")
    # explorer.js: softmax_j(beta x_i^T M x_j), masked for causal runs
    X = traj.states[2]
    S = 9.0 * X @ np.asarray(spec["M"]) @ X.T
    if spec["causal"]:
        S = np.where(np.tri(30, dtype=bool), S, -np.inf)
    A = np.exp(S - S.max(axis=1, keepdims=True))
    A /= A.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(A, traj.model.layers[0].attention_matrix(X), atol=1e-12)


def test_no_attention_matrix_beyond_its_size_or_for_layers_it_does_not_describe():
    assert pack(_run(ATTENTION_MAX_N + 1, 2))["attention"] is None
    traj = _run(20, 2)
    traj.model = af.Stack([af.Attention(beta=9.0, mask="causal"),
                           af.Attention(beta=4.0, mask="causal")])
    packed = pack(traj)
    assert packed["attention"] is None
    # each frame takes the beta of the layer acting then (layer L on [L, L + 1))
    assert packed["beta"] == [9.0, 9.0, 4.0, 4.0, 4.0]  # times 0, 0.5, 1, 1.5, 2


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"^view: expected a view that fits the run .*d = 2.*"
                       r"received 'sphere'$"):
        pack(_run(10, 2), view="sphere")
    with pytest.raises(ValueError, match=r"^view: .*'circle' needs d = 2.*received 'circle'$"):
        pack(_run(10, 3), view="circle")
    with pytest.raises(ValueError, match=r"^run: expected a run index in \[0, 1\), received 3$"):
        pack(_run(10, 2), run=3)
    with pytest.raises(TypeError, match=r"^traj: expected an attnflow.Trajectory, received "
                       r"ndarray$"):
        pack(np.zeros((2, 3, 2)))
    with pytest.raises(ValueError, match=r"^packed: expected a dict made by"):
        unpack({"format": "other"})


def test_one_run_of_a_batch_and_the_directions_of_pre_ln_states():
    traj = _run(30, 3)
    batch = af.Trajectory(times=traj.times, states=np.stack([traj.states, -traj.states], axis=1),
                          model=traj.model, integrator={})
    _, X = unpack(pack(batch, run=1))
    assert np.abs(X + traj.states).max() <= COORD_ERROR * (1 + 1e-9)
    pre = af.Trajectory(times=traj.times, states=3.0 * traj.states,  # pre-LN: off the sphere
                        model=af.Attention(beta=9.0, mask="causal", norm="pre"), integrator={})
    assert pack(pre)["frames"] == pack(traj)["frames"]


def test_the_page_data_block_holds_no_character_that_can_end_or_open_a_script(tmp_path):
    import json
    import re

    from attnflow.explorer.page import page_html

    packed = pack(_run(8, 2))
    hostile = "<!--<script></script>&>\u2028\u2029é"
    packed["model"] = hostile
    page = page_html(packed, title=hostile)
    block = re.search(r'<script type="application/json" id="af-data">(.*?)</script>', page,
                      re.S).group(1)
    assert not set(block) & set("<>&\u2028\u2029")
    assert json.loads(block)["data"]["model"] == hostile
    assert page.count("<script") == 2 and "<!--" not in page


# ----- binned densities for large n (issue 42)


def _million(d, T=2, seed=0):
    """10^6 tokens: uniform, then gathered into three clusters (no integration)."""
    rng = np.random.default_rng(seed)
    X = np.empty((T, 1_000_000, d))
    X[0] = af.sphere.uniform(1_000_000, d, seed=seed)
    centers = af.sphere.uniform(3, d, seed=seed + 1)
    for i in range(1, T):
        X[i] = centers[rng.integers(0, 3, 1_000_000)] + 0.3 / i * rng.normal(size=(1_000_000, d))
    X /= np.linalg.norm(X, axis=-1, keepdims=True)
    return af.Trajectory(times=np.arange(T, dtype=float), states=X,
                         model=af.Attention(beta=9.0, mask="causal"), integrator={})


@pytest.mark.parametrize("d", [2, 3])
def test_a_million_tokens_make_a_small_page_of_binned_densities(d):
    from attnflow.explorer import unpack_density
    from attnflow.explorer.pack import CIRCLE_BINS, SPHERE_BANDS, SPHERE_SECTORS

    traj = _million(d)
    packed = pack(traj)
    assert packed["frames"] == "" and packed["clusters"] is None and packed["renyi"] is None
    times, counts = unpack_density(packed)
    np.testing.assert_array_equal(times, traj.times)
    X = traj.states
    for i in range(len(times)):  # the counts are numpy's histogram of the tokens
        if d == 2:
            ref, _ = np.histogram(np.arctan2(X[i, :, 1], X[i, :, 0]),
                                  bins=np.linspace(-np.pi, np.pi, CIRCLE_BINS + 1))
        else:  # equal-area cells: bands of z, sectors of the azimuth
            ref, _, _ = np.histogram2d(X[i, :, 2], np.arctan2(X[i, :, 1], X[i, :, 0]),
                                       bins=[SPHERE_BANDS, SPHERE_SECTORS],
                                       range=[(-1, 1), (-np.pi, np.pi)])
        np.testing.assert_array_equal(counts[i], ref)
    assert counts.reshape(len(times), -1).sum(axis=1).tolist() == [1_000_000] * len(times)
    np.testing.assert_allclose(packed["order"], np.linalg.norm(X.mean(axis=1), axis=-1))
    from attnflow.explorer.page import page_html

    page = page_html(packed).encode()  # explore_html's text
    points = 8 / 3 * 1_000_000 * (1 if d == 2 else 3) * len(times)  # as points
    assert len(page) < 500_000 < points / 10
    with pytest.raises(ValueError, match=r"^packed: expected a packed run holding points"):
        unpack(packed)


def test_densities_from_the_threshold_on_or_when_asked():
    from attnflow.explorer import unpack_density
    from attnflow.explorer.pack import DENSITY_N

    assert pack(_run(DENSITY_N, 2, T=2))["density"] is None
    assert pack(_run(DENSITY_N + 1, 2, T=2))["density"]["kind"] == "circle"
    small = pack(_run(50, 3, T=2), density=True)
    assert small["density"]["kind"] == "sphere"
    assert unpack_density(small)[1].sum() == 100
    with pytest.raises(ValueError, match=r"^packed: expected a packed run holding binned"):
        unpack_density(pack(_run(50, 3, T=2)))
    with pytest.raises(ValueError, match=r"^density: expected None \(by n\), True or False"):
        pack(_run(5, 2), density="yes")
