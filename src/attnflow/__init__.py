"""attnflow: self-attention dynamics of tokens on the sphere.

Simulate causal (decoder-style), full and windowed attention as interacting particles on
S^{d-1}, and analyse what deep attention stacks do to tokens. The science is that of
Karagodin, Polyanskiy & Rigollet, *Clustering in Causal Attention Masking* (NeurIPS 2024).

    >>> import attnflow as af
    >>> x0 = af.sphere.uniform(200, d=2, seed=0)
    >>> traj = af.simulate(af.Attention(beta=64), x0, t_end=150)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from attnflow._version import __version__

# Public name -> the module that defines it. Loaded on first use, so `import attnflow` stays
# fast (scipy.stats, xarray, zarr, dask and matplotlib load only when needed). Analysis names
# live in the subjects of `attnflow.analysis` (clusters, renyi, energy, moments, ...).
_EXPORTS: dict[str, str] = {
    "sweep": "attnflow.sweeps",
    "explore": "attnflow.explorer",
    "explore_html": "attnflow.explorer",
    "explore_live": "attnflow.explorer",
    "influence": "attnflow.sensitivity",
}
_SUBMODULES = ("analysis", "explorer", "family", "kernels", "manifolds", "meanfield", "plot",
               "pretrained", "sphere", "sweeps")

# The core is imported eagerly (numpy only). `simulate` must be: the submodule of the same name
# would otherwise shadow the function once anything imports it.
from attnflow.brownian import BrownianPath  # noqa: E402
from attnflow.errors import CorruptFileError  # noqa: E402
from attnflow.family import (  # noqa: E402
    MLP,
    ALiBi,
    Attention,
    Block,
    LayerNorm,
    ProjectionBias,
    QKNorm,
    RMSNorm,
    RoPE,
    Stack,
)
from attnflow.fit import fit  # noqa: E402
from attnflow.integrate import NonFiniteStateError  # noqa: E402
from attnflow.savetimes import log_times  # noqa: E402
from attnflow.simulate import estimate_run, simulate  # noqa: E402
from attnflow.trajectory import Trajectory, load  # noqa: E402

__all__ = ["__version__", "MLP", "ALiBi", "Attention", "Block", "BrownianPath", "CorruptFileError",
           "LayerNorm", "NonFiniteStateError", "ProjectionBias", "QKNorm", "RMSNorm", "RoPE",
           "Stack", "Trajectory", "estimate_run", "fit", "load", "log_times", "simulate",
           *sorted(_EXPORTS), *_SUBMODULES]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"attnflow.{name}")
    else:
        raise AttributeError(f"module 'attnflow' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    # the public names only: the internal modules the core imports are attributes too
    return sorted(__all__)


if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from attnflow import (  # noqa: F401
        analysis,
        explorer,
        family,
        kernels,
        manifolds,
        meanfield,
        plot,
        pretrained,
        sphere,
        sweeps,
    )
    from attnflow.explorer import explore, explore_html, explore_live  # noqa: F401
    from attnflow.sensitivity import influence  # noqa: F401
    from attnflow.sweeps import sweep  # noqa: F401
