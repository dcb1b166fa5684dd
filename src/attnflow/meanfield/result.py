"""The result of a mean-field run: Fourier coefficients of the densities at the save times,
with the record of how they were made; to xarray, saved and loaded like a `Trajectory`
(``.nc`` via h5netcdf or ``.zarr``, atomically).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from attnflow._checks import fail, integer
from attnflow._datafiles import (
    MAX_BYTES,
    check_exists,
    first_line,
    open_dataset,
    parse_record,
    save_dataset,
)
from attnflow._files import recover
from attnflow._version import __version__, git_commit
from attnflow.errors import CorruptFileError
from attnflow.family import Block, model_from_record
from attnflow.meanfield import sphere, zonal
from attnflow.meanfield.labels import Labels, label_nodes
from attnflow.meanfield.spectral import to_grid

if TYPE_CHECKING:
    import xarray as xr

__all__ = ["MeanFieldResult", "check_path", "load"]

FORMATS = {".nc": "netcdf", ".zarr": "zarr"}
KIND = "attnflow.meanfield"


@dataclass
class MeanFieldResult:
    """Densities of a mean-field run at its save times.

    Attributes
    ----------
    times : (T,) save times (one unit = one layer, as for particles).
    coefficients : (T, S, K + 1) complex Fourier coefficients of the label densities,
        rho_s(theta) = sum_{|k| <= K} c[s, k] e^{i k theta} (per unit angle, mass 1 each);
        on S^2 (settings["d"] = 3) (T, S, L + 1, L + 1) spherical-harmonic coefficients
        (`attnflow.meanfield.sphere`: rows l, columns m = 0..l, per unit area).
    model : the attnflow block whose mean field this is.
    settings : the solver's record: modes K, labels S (None: full mask) and their scheme,
        ALiBi's slope per unit label `alibi`, noise sigma, dt,
        steps, the tail bound `tol`, the collocation points.
    resolution_lost_at : None, or the time of the first step whose density was no longer
        resolved (tail above `tol` or a negative value): the run stopped there and the
        last saved state is the last resolved step (at `times[-1]`).
    wall_time : seconds spent solving.
    version, commit : attnflow's version and git commit.
    """

    times: np.ndarray
    coefficients: np.ndarray
    model: Block
    settings: dict[str, Any]
    resolution_lost_at: float | None = None
    wall_time: float = 0.0
    version: str = __version__
    commit: str | None = field(default_factory=git_commit)

    @property
    def d(self) -> int:
        """2 (densities on the circle), 3 (on S^2) or more (zonal, on S^{d-1})."""
        return int(self.settings.get("d", 2))

    @property
    def labels(self) -> np.ndarray | None:
        """The labels s (S,) (causal mask: the label cells' midpoints or the Chebyshev-Lobatto
        nodes, settings["scheme"]), None for the full mask."""
        S = self.settings["labels"]
        return None if S is None else label_nodes(self.settings.get("scheme") or "cells", S)

    def at_labels(self, s: Any) -> np.ndarray:
        """The coefficients (T, P, K + 1) (S^2: (T, P, L + 1, L + 1)) at labels s (P,) in
        [0, 1] (causal mask): the cell holding s (cells), the polynomial interpolant in s
        (chebyshev)."""
        S = self.settings["labels"]
        if S is None:
            raise fail("s", "a causal run (the full mask has no labels)", repr(s))
        scheme = Labels.of(self.settings.get("scheme") or "cells", S)
        return np.einsum("ps,ts...->tp...", scheme.interpolation(s), self.coefficients)

    def moments(self, k: int) -> np.ndarray:
        """The Fourier moments int e^{i k theta} rho(theta) dtheta (T, S) = 2 pi conj(c_k):
        the n -> infinity limit of the particles' (1/n) sum_j e^{i k theta_j}; k in 0..K."""
        if self.d != 2:
            raise fail("k", "a result on the circle (on S^2 the moments are the coefficients "
                       "themselves: int conj(Y_lm) rho = coefficients[..., l, m])",
                       f"a result on S^{self.d - 1}")
        K = self.coefficients.shape[-1] - 1
        k = integer("k", k, 0, K, expected=f"a mode 0 <= k <= K = {K} (for k < 0: "
                    "conj(moments(-k)))")
        return 2 * np.pi * np.conj(self.coefficients[..., k])

    def density(self, points: int = 256) -> np.ndarray:
        """The densities (T, S, points) at theta_j = 2 pi j / points (points > 2 K); on S^2
        (T, S, points // 2, points) at the centres of `sphere.lat_lon(points)` (polar angle
        down the rows, longitude along the columns), per unit area; zonal on S^{d-1}, d > 3,
        (T, S, points) at the polar angles (j + 1/2) pi / points from the axis."""
        if self.d > 3:  # zonal: rho(cos theta) at theta_j = (j + 1/2) pi / points
            theta = (np.arange(points) + 0.5) * np.pi / points
            return zonal.values(self.coefficients.real, self.d, np.cos(theta))
        if self.d == 3:
            grid = sphere.lat_lon(points)
            return sphere.values(self.coefficients, grid.reshape(-1, 3)).reshape(
                *self.coefficients.shape[:2], *grid.shape[:2])
        return to_grid(self.coefficients, points)

    def record(self) -> dict[str, Any]:
        """Everything but the arrays, as JSON-friendly data."""
        meta, _ = self.model.to_record()
        return {"kind": KIND, "model": meta, "settings": self.settings,
                "resolution_lost_at": self.resolution_lost_at, "wall_time": self.wall_time,
                "version": self.version, "commit": self.commit}

    def to_xarray(self) -> xr.Dataset:
        """A Dataset: `real` and `imag` parts of the coefficients on dims (time, label, mode),
        the model's matrices as variables, the record as the JSON attribute
        ``attnflow_meanfield``."""
        import xarray as xr

        c = self.coefficients
        dims = ("time", "label", "mode") if c.ndim == 3 else ("time", "label", "degree",
                                                                "order")
        data = {"real": (dims, c.real), "imag": (dims, c.imag)}
        _, arrays = self.model.to_record()
        for name, arr in arrays.items():
            data[name] = (tuple(f"{name}_dim{i}" for i in range(arr.ndim)), arr)
        labels = self.labels
        return xr.Dataset(
            data,
            coords={"time": self.times, "label": labels if labels is not None else np.ones(1),
                    **({"mode": np.arange(c.shape[-1])} if c.ndim == 3 else {
                        "degree": np.arange(c.shape[-1]), "order": np.arange(c.shape[-1])})},
            attrs={"attnflow_meanfield": json.dumps(self.record())},
        )

    def save(self, path: str | os.PathLike) -> Path:
        """Write to ``.nc`` (netCDF4 via h5netcdf) or ``.zarr`` atomically (a temporary name
        beside the target, a completeness marker last, renamed into place when complete:
        `attnflow._datafiles.save_dataset`)."""
        path = Path(path)
        return save_dataset(self.to_xarray(), path, _kind(path), "attnflow_meanfield")


def load(path: str | os.PathLike, max_bytes: int | None = MAX_BYTES) -> MeanFieldResult:
    """Read a result written by `MeanFieldResult.save`, with the checks of `attnflow.load`
    (nothing but the file read, declared sizes within `max_bytes`, complete, times finite and
    increasing, one per saved density, finite coefficients); ValueError naming the file for
    anything else, FileNotFoundError for a missing path."""
    path = Path(path)
    kind = _kind(path)
    recover(path)
    check_exists(path, "mean-field result")
    expected = f"a mean-field result written by attnflow (MeanFieldResult.save) as {kind}"
    ds = open_dataset(path, kind, "attnflow_meanfield", expected, max_bytes)
    if "attnflow_meanfield" not in ds.attrs:
        raise fail("path", expected, f"{path}, a dataset without the 'attnflow_meanfield' "
                   "record")
    rec = parse_record(path, ds, "attnflow_meanfield")
    for name in ("real", "imag", "time"):
        if name not in ds.variables:
            raise CorruptFileError(path, name, "a variable of the result", "none")
    try:
        arrays = {str(k): ds[k].values for k in ds.data_vars if k not in ("real", "imag")}
        times = np.asarray(ds["time"].values, dtype=float)
        coefficients = ds["real"].values + 1j * ds["imag"].values
        result = MeanFieldResult(
            times=times, coefficients=coefficients,
            model=model_from_record(rec["model"], arrays), settings=rec["settings"],
            resolution_lost_at=rec["resolution_lost_at"], wall_time=rec["wall_time"],
            version=rec["version"], commit=rec["commit"])
    except Exception as err:  # a record that does not build a result: name the field
        raise CorruptFileError(path, "attnflow_meanfield", "a record matching the file's "
                               "arrays", first_line(err)) from None
    if (times.ndim != 1 or times.size != coefficients.shape[0]
            or not np.all(np.isfinite(times)) or np.any(np.diff(times) <= 0)):
        raise CorruptFileError(path, "time", f"{coefficients.shape[0]} finite, increasing "
                               "save times (one per density)", f"{times.size} times")
    if not np.all(np.isfinite(coefficients)):
        raise CorruptFileError(path, "real, imag", "finite coefficients",
                               f"{int(np.sum(~np.isfinite(coefficients)))} non-finite")
    return result


def check_path(path: str | os.PathLike) -> str:
    """The format ("netcdf" or "zarr") of a result's file name; ValueError otherwise."""
    return _kind(Path(path))


def _kind(path: Path) -> str:
    kind = FORMATS.get(path.suffix)
    if kind is None:
        raise fail("path", f"a file name ending in one of {sorted(FORMATS)}", str(path))
    return kind
