"""Live mode of the explorer widget: tokens drawn from a seed and simulated in the kernel;
changing beta, the mask, n or the seed (from the page's controls or from Python) simulates
again and streams the frames to the page a piece of time at a time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import traitlets

from attnflow._checks import fail, integer, inverse_temperature, positive
from attnflow.explorer.pack import pack
from attnflow.explorer.widget import Explorer
from attnflow.family import Attention
from attnflow.simulate import simulate
from attnflow.sphere import uniform
from attnflow.trajectory import Trajectory

__all__ = ["LiveExplorer", "explore_live"]

MASKS = ("causal", "full")
PIECES = 4  # the run is simulated and sent in this many pieces of time


class LiveExplorer(Explorer):
    """An `Explorer` whose run is simulated in the kernel from `live` = {"beta", "mask", "n",
    "seed"} (synced: the page shows inputs for them); setting `live` simulates again,
    sending the frames as each of 4 pieces of time is done."""

    live = traitlets.Dict().tag(sync=True)

    def __init__(self, *, n: int, d: int, beta: float, mask: str, seed: int, t_end: float,
                 frames: int, dt: float) -> None:
        self._d, self._t_end, self._frames = d, positive("t_end", t_end), frames
        self._dt = positive("dt", dt)
        integer("frames", frames, 2, expected="an integer >= 2 (saved times)")
        integer("d", d, 2)
        settings = _settings({"n": n, "beta": beta, "mask": mask, "seed": seed})
        pieces = self._pieces(settings)
        super().__init__(next(pieces))
        self.live = settings
        self._send_pieces(pieces)

    @traitlets.validate("live")
    def _check_live(self, proposal: dict[str, Any]) -> dict[str, Any]:
        return _settings(proposal["value"])

    @traitlets.observe("live")
    def _simulate_again(self, change: dict[str, Any]) -> None:
        if change["old"] and change["new"] != change["old"]:
            self._stream(change["new"])

    def _stream(self, settings: dict[str, Any]) -> None:
        """Simulate from the settings, sending the frames done so far after each piece."""
        self._send_pieces(self._pieces(settings))

    def _send_pieces(self, pieces: Iterator[Trajectory]) -> None:
        """Pack and send each trajectory of `pieces` (the run so far) as it comes."""
        for traj in pieces:
            self._traj = traj
            packed = pack(traj)
            self.frame = min(self.frame, len(packed["times"]) - 1)
            self.data = packed

    def _pieces(self, settings: dict[str, Any]) -> Iterator[Trajectory]:
        """Trajectories of the run so far, after each of PIECES pieces of time."""
        model = Attention(beta=settings["beta"], mask=settings["mask"])
        x = uniform(settings["n"], self._d, seed=settings["seed"])
        times = np.linspace(0.0, self._t_end, self._frames)
        bounds = np.linspace(0.0, self._t_end, PIECES + 1)
        saved_t, saved_x = [0.0], [x]
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            inside = times[(times > lo) & (times <= hi)]
            save_at = np.unique(np.concatenate([[0.0], inside - lo, [hi - lo]]))
            piece = simulate(model, x, hi - lo, save_at=save_at, method="rk4", dt=self._dt)
            x = piece.final
            saved_t += list(inside)
            saved_x += list(piece.states[1:1 + len(inside)])
            yield Trajectory(times=np.array(saved_t), states=np.array(saved_x), model=model,
                             integrator=piece.integrator, seed=settings["seed"])


def _settings(value: Any) -> dict[str, Any]:
    """The live settings {"beta", "mask", "n", "seed"}, checked (errors name the key)."""
    if not isinstance(value, dict) or set(value) != {"beta", "mask", "n", "seed"}:
        raise fail("live", "a dict with the keys beta, mask, n, seed", repr(value))
    n, seed = value["n"], value["seed"]
    integer("n", n, 1, 20_000, expected="an integer number of tokens in [1, 20000]")
    integer("seed", seed, 0)
    if value["mask"] not in MASKS:
        raise fail("mask", f"one of {', '.join(MASKS)}", repr(value["mask"]))
    beta = inverse_temperature("beta", value["beta"])
    if not np.isfinite(beta):
        raise fail("beta", "a finite beta (the live explorer simulates with RK4; hardmax "
                   "runs need method 'events': simulate them and explore the Trajectory)",
                   repr(value["beta"]))
    return {"beta": beta, "mask": value["mask"], "n": int(n),
            "seed": int(seed)}


def explore_live(*, n: int = 64, d: int = 2, beta: float = 9.0, mask: str = "causal",
                 seed: int = 0, t_end: float = 20.0, frames: int = 81,
                 dt: float = 0.1) -> LiveExplorer:
    """The explorer widget in live mode: n tokens uniform on S^{d-1} from `seed`, one
    attention layer (Q = K = V = I, `beta`, `mask` "causal" or "full") integrated with RK4
    at step `dt` to `t_end`, `frames` saved times. The page shows inputs for beta, the mask,
    n and the seed; changing one (or `widget.live` from Python) simulates again in the
    kernel and streams the frames in 4 pieces of time."""
    return LiveExplorer(n=n, d=d, beta=beta, mask=mask, seed=seed, t_end=t_end,
                        frames=frames, dt=dt)
