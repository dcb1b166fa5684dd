"""The explorer widget (`af.explore`) on the Python side: the state it syncs with the front end,
messages from the front end moving its traits, and checks on what is set (no browser)."""

from __future__ import annotations

import numpy as np
import pytest

import attnflow as af

pytest.importorskip("anywidget")


@pytest.fixture(scope="module")
def traj():
    return af.Trajectory(times=np.linspace(0.0, 3.0, 4),
                         states=af.sphere.uniform(24, 3, seed=1)[None].repeat(4, axis=0),
                         model=af.Attention(beta=9.0, mask="causal"),
                         integrator={"method": "none"})


def test_the_synced_state_is_the_packed_run_and_the_controls(traj):
    w = af.explore(traj)
    state = w.get_state()
    assert state["data"] == af.explorer.pack(traj) and state["view"] == "sphere"
    assert (state["frame"], state["color"], state["camera"]) == (0, "index", [20.0, -60.0])
    assert "export function render" in state["_esm"]
    assert {"frame", "color", "camera", "view", "data"} <= set(w.keys)


def test_the_front_end_moves_the_traits(traj):
    w = af.explore(traj)
    w.set_state({"frame": 2, "color": "cluster", "camera": [10.0, 35.0]})  # as a comm message
    assert (w.frame, w.color, w.camera) == (2, "cluster", [10.0, 35.0])
    assert w.time == 2.0 and w.cluster_count == w.data["clusters"][2]


def test_python_moves_the_front_end(traj):
    w = af.explore(traj)
    sent = []
    w.observe(lambda change: sent.append((change["name"], change["new"])), names="frame")
    w.show(2.9)
    assert w.frame == 3 and sent == [("frame", 3)] and w.get_state("frame") == {"frame": 3}


def test_what_is_set_is_checked(traj):
    w = af.explore(traj)
    with pytest.raises(ValueError, match=r"^frame: expected a frame index in \[0, 4\), "
                       r"received 4$"):
        w.frame = 4
    with pytest.raises(ValueError, match=r"^color: expected one of index, cluster, "
                       r"received 'rainbow'$"):
        w.color = "rainbow"
    with pytest.raises(ValueError, match=r"^view: expected a view that fits the run"):
        w.view = "circle"
    assert (w.frame, w.color, w.view) == (0, "index", "sphere")


def test_live_mode_simulates_again_and_streams_the_frames():
    w = af.explore_live(n=12, d=2, beta=4.0, t_end=2.0, frames=9, dt=0.1)
    assert w.live == {"beta": 4.0, "mask": "causal", "n": 12, "seed": 0}
    assert w.data["n"] == 12 and w.data["times"] == pytest.approx(np.linspace(0, 2, 9))
    sent = []
    w.observe(lambda change: sent.append(len(change["new"]["times"])), names="data")
    w.set_state({"live": {"beta": 16.0, "mask": "full", "n": 20, "seed": 3}})  # the page's inputs
    assert sent == [3, 5, 7, 9]  # the frames done after each of 4 pieces of time
    assert (w.data["n"], w.data["beta"][0], w.data["causal"]) == (20, 16.0, False)
    x0 = af.sphere.uniform(20, 2, seed=3)  # the tokens drawn from the seed, then simulated
    run = af.simulate(af.Attention(beta=16.0, mask="full"), x0, 2.0, method="rk4", dt=0.1,
                      save_at=np.linspace(0, 2, 9))
    _, X = af.explorer.unpack(w.data)
    np.testing.assert_allclose(X, run.states, atol=1e-4)
    with pytest.raises(ValueError, match=r"^n: expected an integer number of tokens in "
                       r"\[1, 20000\], received 0$"):
        w.live = {"beta": 16.0, "mask": "full", "n": 0, "seed": 3}
    assert w.data["n"] == 20
