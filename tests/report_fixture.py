"""A small reproduction output for the report tests: two suites, real recipe and figure names
(so captions and citations are the real ones), real PNG figures and a real GIF animation,
claims with every verdict. Writing it takes about a second (no recipe runs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

import attnflow as af
from attnflow.plot import animate


def _png(path: Path, k: int) -> None:
    fig = Figure(figsize=(4, 3))
    ax = fig.subplots()
    t = np.linspace(0, 1, 50)
    ax.plot(t, np.sin((k + 1) * 3 * t))
    fig.savefig(path, dpi=60)


def _claims(verdicts: list[str]) -> list[dict[str, str]]:
    return [{"claim": f"claim {i} | with a bar", "paper": "the paper says <b>so</b>",
             "measured": f"measured {i}", "verdict": v,
             "why": f"reproduced if x{i} >= 1; measured x{i} = 0.5" + ("; because" if i % 2
                                                                      else ""),
             "id": f"r.c{i}", "criterion": f"reproduced if x{i} >= 1"}
            for i, v in enumerate(verdicts)]


RECIPES: list[tuple[str, str, list[str], list[str]]] = [
    # name, suite, figures, verdicts
    ("fig2", "paper", ["fig2_snapshots.png", "fig2_counts.png", "fig2.gif"],
     ["reproduced", "partly", "reproduced"]),
    ("thm41", "paper", ["thm41_distance.png"], ["reproduced", "not reproduced"]),
    ("spectra", "paper", ["spectra.png"], ["not run"]),
    ("longcontext", "followups", ["longcontext.png"], ["reproduced", "partly", "not run"]),
]


def write_results(out: Path) -> list[dict[str, Any]]:
    """Write the recipe folders (figures and result.json) under `out`; return the results."""
    traj = af.simulate(af.Attention(beta=9.0), af.sphere.uniform(12, d=2, seed=0), t_end=4.0,
                       save_at=np.linspace(0, 4, 9), dt=0.1)
    results = []
    for k, (name, suite, figures, verdicts) in enumerate(RECIPES):
        folder = out / name
        folder.mkdir(parents=True)
        for j, fig in enumerate(figures):
            if fig.endswith(".gif"):
                animate(traj, folder / fig, size=96)
            else:
                _png(folder / fig, k + j)
        res = {"name": name, "title": f"{name} title", "suite": suite, "size": "quick",
               "seed": k, "params": {"n": 10 + k, "beta": 4.0}, "version": af.__version__,
               "commit": "0123456789abcdef0123456789abcdef01234567+dirty",
               "machine": "test machine", "wall_time": 1.5 + k, "numbers": {},
               "claims": _claims(verdicts), "figures": figures, "notes": [f"note of {name}"]}
        (folder / "result.json").write_text(json.dumps(res))
        results.append(res)
    return results
