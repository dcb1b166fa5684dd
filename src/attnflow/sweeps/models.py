"""Where a run's model comes from: built from the grid's text options, or a saved model file.

* Without ``grid.model``, each run builds one `Attention` from its grid point's options
  (`attnflow.family.text`, `attnflow.presets`), drawing the random matrix presets from its seed.
* ``grid.model = "run.nc"`` (or ``.zarr``): the model in a saved Trajectory's record
  (`attnflow.load(path).model`: an Attention or a Stack, several heads included), as it is.
* ``grid.model = "weights.npz"``: a `Stack` of per-layer weights
  (`attnflow.family.text.layers_from_npz`), the grid's options applied to every layer.

Model files are read by the driver (relative paths against the spec's folder), so the
workers need no access to them; the runs of a grid point share its model.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from attnflow._checks import fail
from attnflow.family import Attention
from attnflow.family.stack import Model
from attnflow.family.text import layers_from_npz
from attnflow.kernels.masks import mask_from_text
from attnflow.presets import matrix_from_spec
from attnflow.sweeps.axes import MATRICES, family_axes, family_model_options, model_kind, owned

Stream = Any  # a callable name -> np.random.SeedSequence: a run's seed stream of one draw


def resolve(path: str, base: Path) -> Path:
    """A file named in the spec, relative paths taken against the spec's folder."""
    return Path(path) if Path(path).is_absolute() else base / path


def read_model(path: str, base: Path, name: str = "grid.model") -> Model:
    """The model a model file holds (per-layer weights with the default options)."""
    file = resolve(path, base)
    if model_kind(path) == "weights":
        if not file.is_file():
            raise fail(name, "an existing .npz file of per-layer weights", path)
        return layers_from_npz(file, name=name)
    from attnflow.trajectory import load

    try:
        return load(file).model
    except FileNotFoundError:
        raise fail(name, "an existing Trajectory file (.nc, .zarr)", path) from None
    except ValueError as err:
        raise fail(name, "a Trajectory file (Trajectory.save, attnflow simulate)",
                   f"{path} ({err})") from None


def digest(model: Model) -> str:
    """SHA-256 of the model's record (meta and arrays): equal digests, the same model."""
    meta, arrays = model.to_record()
    h = hashlib.sha256(json.dumps(meta, sort_keys=True).encode())
    for key in sorted(arrays):
        a = np.ascontiguousarray(arrays[key])
        h.update(f"{key}:{a.dtype.str}:{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _options(p: dict[str, Any]) -> dict[str, Any]:
    """The Attention options of a grid point (beta, mask, backend, the family's)."""
    backend = {} if p["backend"] is None else {"backend": p["backend"]}
    return dict(beta=p["beta"], mask=mask_from_text(p["mask"]), **backend,
                **family_model_options(p))


class PointModels:
    """The models shared by the runs of each grid point, built once per distinct combination
    of the fields in `fields` (the model file and the options applied to its layers)."""

    def __init__(self, base: Path, read: dict[str, Model]) -> None:
        self.base = base
        self.read = read  # {path: model} of the model files (`read_model`)
        self.built: dict[tuple, Model] = {}
        self.fields = ("model", "beta", "mask", "backend", "d", *family_axes())

    def get(self, p: dict[str, Any]) -> Model | None:
        """The model of grid point p (a dict with at least `fields`): None when each run builds
        its own, the file's model for a Trajectory, the weights with p's options for .npz."""
        path = p["model"]
        if path is None:
            return None
        if model_kind(path) == "trajectory":
            return self.read[path]
        key = tuple(p[k] for k in self.fields)
        if key not in self.built:
            self.built[key] = layers_from_npz(resolve(path, self.base), name="grid.model",
                                              **_options(p))
        return self.built[key]


def run_model(p: dict[str, Any], stream: Stream) -> Attention:
    """The model of one run built from the grid point's text options; Q, K, V are preset
    text or arrays (read from .npy by the driver), the random presets drawn from `stream`."""
    matrices = {name: p[name] if isinstance(p[name], np.ndarray) or p[name] is None
                else matrix_from_spec(p[name], p["d"], name, stream(name))
                for name in MATRICES}
    return Attention(**matrices, **_options(p))


def owned_by(path: str) -> tuple[str, ...]:
    """The grid fields the model file at `path` holds itself (the spec must omit them)."""
    return owned()[model_kind(path)]
